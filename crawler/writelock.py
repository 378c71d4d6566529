"""The crawl's writer lock, as a rule: one command at a time rewrites `urls` or decides leases on a root.

Generate (selects and leases), rebucket (rewrites `urls` and `hosts` whole), update and inject (MERGE into
`urls`) hold it for their whole run. Two of them at once break an invariant or lose a Delta write conflict:
rebucket's overwrite commits blind, so it drops a lease or a result committed after it read the table; two
generates pick the same due URLs; update and inject against generate lose a conflict half way. Under the lock
the second comer waits (`writer_lock.wait_s`) and then refuses (`crawler.errors.CrawlBusy`, exit 75).

The lock is a lease with an epoch, like a bucket lease (crawler.ownership, whose `may_take` and fence it uses):
taking it creates epoch N+1 exclusively, so exactly one command holds an epoch and the highest epoch is the
holder. The holder renews it every `ttl / RENEWALS_PER_TTL` seconds (a thread), so a holder that crashed blocks
the crawl at most one ttl (plus the takeover grace, for clock skew). A holder that could not renew in time has
lost the lock and must not commit: before each commit it checks its fence, counted on its own monotonic clock
from the start of its last successful renewal.

Pure: wall and monotonic times are passed in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from crawler import ownership

# Renewals per ttl: with the fence at 3/4 of it, a renewal may fail (a slow storage answer) and the next one
# still comes before the fence.
RENEWALS_PER_TTL = 4
# The holder stops committing this share of a ttl before its lease would expire unrenewed.
FENCE_SHARE = 0.25
# A waiting command looks at the lock this often (seconds), or sooner when less time is left.
POLL_S = 1.0


@dataclass(frozen=True)
class LockRecord:
    """What the lock file of an epoch says: who holds it (its command, host and pid), since when, until when."""

    epoch: int
    command: str
    owner: str          # unique per holding: host, pid and a random token
    hostname: str
    pid: int
    acquired_at: float  # wall clock
    expires_at: float   # wall clock; renewed by the holder
    released: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockRecord:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def renew_interval(ttl_s: float) -> float:
    """How often the holder renews."""
    return ttl_s / RENEWALS_PER_TTL


def fence_deadline(renew_started_mono: float, ttl_s: float) -> float:
    """Monotonic time after which the holder must not commit: the bucket leases' fence (crawler.ownership) with
    `FENCE_SHARE` of the ttl as its margin, which covers a commit under way."""
    return ownership.fence_deadline(renew_started_mono, ttl_s, ttl_s * FENCE_SHARE)


def next_look(now_mono: float, give_up_mono: float) -> float:
    """Seconds a waiting command sleeps before it looks at the lock again."""
    return max(0.0, min(POLL_S, give_up_mono - now_mono))


def holder(record: LockRecord) -> str:
    """The holder, for a person: its command, host/pid and since when (UTC)."""
    since = datetime.fromtimestamp(record.acquired_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"`crawl {record.command}` ({record.hostname}/{record.pid}, since {since})"


def refusal(record: LockRecord, waited_s: float, root: str) -> str:
    """The one line a command that waited in vain refuses with."""
    expires = datetime.fromtimestamp(record.expires_at, UTC).strftime("%H:%M:%SZ")
    return (f"the crawl under {root} is busy: {holder(record)} holds its writer lock (lease until {expires}, "
            f"renewed while it runs); waited {waited_s:.0f} s (writer_lock.wait_s); run again when it is done")
