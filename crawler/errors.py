"""How an error reaches a person.

A `UserError` is a mistake in what was asked: an argument, a file, a name, a segment that does not exist. Every
command line (`crawl`, `crawl-submit`, `fetchd`) prints its message as one line on stderr and exits with
`EXIT_USER_ERROR`, with no traceback. Any other exception is a bug: its traceback is printed (Spark's Java one
included) and the exit code is 1. Input is checked before Spark starts wherever it can be, so a user mistake never
costs a JVM start or leaves a file behind.
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_USER_ERROR = 2
# The command cannot go on now but may later (`TryLater`): generate's backpressure, another command holding the
# crawl's writer lock, a concurrent Delta commit that won, daemons holding bucket leases a rebucket waits for, a
# daemon whose crawl's settings changed under it. Nothing is wrong with what was asked. 75 is sysexits' EX_TEMPFAIL
# ("try again later"); the DAG skips its generate on it instead of failing and retrying.
EXIT_TRY_LATER = 75
# Generate refuses a new segment because the data failed its validation (crawler.gate): nothing a retry or a wait
# fixes, and no mistake in what was asked; an operator fixes the data (then `crawl validate` reopens the gate) or
# overrides it. The DAG skips its generate on it, with the line as the reason.
EXIT_GATE_CLOSED = 4
# How many existing segments an UnknownSegment message names (the latest ones, by id).
NAMED_SEGMENTS = 5


class UserError(Exception):
    """A mistake in the input, reported as one line: the message must say what was wrong and with what."""


class TryLater(Exception):
    """The command cannot go on now but may later; the message says why and what to wait for. One line on stderr
    and `EXIT_TRY_LATER`, like a UserError but not the user's mistake."""


class GateClosed(Exception):
    """The quality gate is closed (crawler.gate): the message names the table and expectation that failed and what
    reopens it. One line on stderr and `EXIT_GATE_CLOSED`."""


class Backpressure(TryLater):
    """Generate will not start a new segment until earlier ones are merged (or given up): the message says which
    and what to do."""


class WriteConflict(TryLater):
    """Another command committed to the same table first and this command's commit lost (a Delta concurrent
    modification: two `crawl update` of one segment at once). Delta commits are whole or nothing, so the lost
    commit wrote nothing; the command's earlier commits stand, and running it again finishes it."""

    def __init__(self, table: str | None, conflict: str):
        where = f"table {table}" if table else "one of its tables"
        super().__init__(f"another command committed to {where} at the same time and this command's commit lost "
                         f"({conflict}); that commit was not made (Delta commits are whole or nothing) and its "
                         "earlier commits stand: run it again once the other has finished")
        self.table = table


class CrawlBusy(TryLater):
    """Another command holds the crawl's writer lock (crawler.writelock) and did not let go within
    `writer_lock.wait_s`: the message names it (command, host/pid, since when)."""


class BadName(UserError, ValueError):
    """A user-given name that becomes part of a path (segment id, table name) is not allowed."""


class UnknownSegment(UserError):
    """A command names a segment the root does not hold."""

    def __init__(self, segment_id: str, root: str, existing: Sequence[str]):
        if not existing:
            there = "no segment exists there yet"
        else:
            latest = sorted(existing)[-NAMED_SEGMENTS:]
            more = f" and {len(existing) - len(latest)} earlier" if len(existing) > len(latest) else ""
            there = f"segments there: {', '.join(latest)}{more}"
        super().__init__(f"unknown segment {segment_id!r} under {root} ({there})")
        self.segment_id = segment_id
