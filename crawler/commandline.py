"""What every command line of the engine shares: `--version`, one-line argument errors, argument types for
user-given names and times, and the one place a `UserError` becomes a line on stderr and exit 2
(`crawler/errors.py`)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import NoReturn

from crawler import layout
from crawler.errors import EXIT_GATE_CLOSED, EXIT_TRY_LATER, EXIT_USER_ERROR, GateClosed, TryLater, UserError

# What every command's exit status means (crawler/errors.py), at the end of each command's --help.
EXIT_CODES = """exit codes:
  0   done
  1   a bug: the traceback says where
  2   a mistake in what was asked (argument, config key, file, segment): one line on stderr names it
  3   crawl validate (or the validation of crawl cycle): an expectation failed (the report says which); the
      quality gate is closed until a validation passes
  4   the quality gate is closed: generate (crawl run, crawl cycle) makes no new segment; one line names the table
      and expectation (crawl generate --override-gate REASON lets one run through)
  75  try later: another command holds the crawl, backpressure, a lost Delta commit, a daemon whose crawl's
      settings changed under it"""


def engine_version() -> str:
    """The installed distribution's version (pyproject.toml), as `--version` prints it."""
    try:
        return importlib.metadata.version("cyclecrawl")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """argparse, with `--version` and a mistake on the command line reported as one line (argparse prints the
    usage first)."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.add_argument("--version", action="version", version=f"%(prog)s {engine_version()}")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def segment_id(text: str) -> str:
    """A --segment value: a checked segment id (`crawler/layout.py::check_segment_id`)."""
    try:
        return layout.check_segment_id(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def iso_time(text: str) -> datetime:
    """A --now value: an ISO-8601 time, UTC when it names no zone."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time such as 2026-01-31T12:00:00Z: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def positive_int(text: str) -> int:
    """A count that must be at least 1 (--cycles)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
        command: Callable[[argparse.Namespace], int]) -> int:
    """Parse `argv` and run `command` on it; a UserError it raises is one line on stderr and exit 2 (TryLater, e.g.
    backpressure: exit 75; GateClosed: exit 4). Any other exception is a bug and keeps its traceback."""
    args = parser.parse_args(argv)
    try:
        return command(args)
    except BrokenPipeError:  # the reader of stdout went away (`crawl config show | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 0
    except (UserError, TryLater, GateClosed) as exc:
        name = " ".join(filter(None, (parser.prog, getattr(args, "command", None))))
        print(f"{name}: {exc}", file=sys.stderr)
        if isinstance(exc, GateClosed):
            return EXIT_GATE_CLOSED
        return EXIT_TRY_LATER if isinstance(exc, TryLater) else EXIT_USER_ERROR
