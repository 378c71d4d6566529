"""Bucket ownership rule in one place: who may fetch a bucket's hosts, and from when.

A bucket (and so every host in it, across all segments) has at most one owning daemon. Ownership is a lease
with an epoch: taking a bucket creates epoch N+1 exclusively, so two daemons can never hold the same epoch and
the highest epoch is the owner. The owner renews its lease by heartbeat. Fencing keeps the old and new owner
apart in time:

    the owner stops every request at   renewed_at + ttl - fence_margin   (its own monotonic clock)
    a successor may take over at       expires_at + takeover_grace       (wall clock; expires_at = renewed + ttl)

so, with clocks that agree within `fence_margin + takeover_grace`, the old owner's last request has ended before
the new owner's first. A renewal counts only if it completed before the owner's current fence deadline: a daemon
that stalled past it has lost the bucket and must take it again like anyone else. A released lease (a clean
stop) may be taken at once. Politeness carries across owners: the successor treats `previous_last_end` below as
the end of the last request to each of the bucket's hosts.

Pure: wall and monotonic times are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

LEASES_FOLDER = "leases"  # ROOT/leases/bucket=NNNNN/epoch-NNNNNNNNNN.json


def epoch_filename(epoch: int) -> str:
    return f"epoch-{epoch:010d}.json"


def epoch_of(filename: str) -> int | None:
    """The epoch a lease file's name holds; None for any other file (a temp file being written)."""
    if filename.startswith("epoch-") and filename.endswith(".json") and filename[6:-5].isdigit():
        return int(filename[6:-5])
    return None


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease file says. `last_request_end` (wall clock) is set on release: the end of the owner's last
    request to any host of the bucket, so the successor keeps the politeness delay across the handover."""

    bucket: int
    epoch: int
    owner: str
    hostname: str
    pid: int
    acquired_at: float
    expires_at: float
    released: bool = False
    last_request_end: float | None = None
    process_space: str = ""  # boot id + pid namespace of the holder: its pid means something only there

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaseRecord:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


class HeldRecord(Protocol):
    """What `may_take` reads of a lease's latest epoch: a bucket lease, or the crawl's writer lock
    (crawler.writelock)."""

    released: bool
    expires_at: float


def may_take(record: HeldRecord | None, now: float, takeover_grace_s: float, holder_is_dead: bool = False) -> bool:
    """May a daemon take the bucket (or a command the writer lock) whose latest epoch is `record` at wall time
    `now`? Yes if nobody ever held it, its holder released it, its lease expired more than the grace ago, or its
    holder is known dead (a process of this machine that no longer exists: it cannot be fetching)."""
    return (record is None or record.released or holder_is_dead
            or now >= record.expires_at + takeover_grace_s)


def live_holders(latest: Iterable[LeaseRecord], now: float, takeover_grace_s: float) -> list[LeaseRecord]:
    """Of each bucket's latest lease, those whose holder may still be fetching at wall time `now`: no other daemon
    may take the bucket yet (`may_take`). Asked by a command that must not run beside a fetching daemon; it cannot
    tell a dead holder from a live one, so a crashed daemon's lease counts until it lapses."""
    return [record for record in latest if not may_take(record, now, takeover_grace_s)]


def fence_deadline(renew_started_mono: float, ttl_s: float, fence_margin_s: float) -> float:
    """Monotonic time at which an owner must have stopped every request to the bucket, counted from the start of
    its last successful renewal (the lease file it wrote then expires no earlier than start + ttl)."""
    return renew_started_mono + ttl_s - fence_margin_s


def previous_last_end(record: LeaseRecord | None, now: float, holder_is_dead: bool) -> float | None:
    """Wall time the previous owner's last request to the bucket's hosts ended, at the latest: what its release
    said; now, if its process is known dead; else its lease expiry (fencing stopped it before then)."""
    if record is None:
        return None
    if record.released:
        return record.last_request_end
    return min(now, record.expires_at) if holder_is_dead else record.expires_at


def check_timing(ttl_s: float, renew_interval_s: float, fence_margin_s: float) -> tuple[str, str] | None:
    """(key, why) when these lease settings cannot work, else None: renewals must come well before the fence."""
    if fence_margin_s >= ttl_s:
        return "ownership.fence_margin_s", "must be less than ownership.lease_ttl_s"
    if renew_interval_s * 2 > ttl_s - fence_margin_s:
        return "ownership.renew_interval_s", "must be at most (lease_ttl_s - fence_margin_s) / 2: two tries per lease"
    return None
