"""Per-bucket host scheduling, pure and synchronous so a virtual clock can drive it in tests.

Two levels: a heap of hosts keyed by the time their politeness gate (`crawler.politeness.HostGate`, the one
place of the delay rule) opens, over per-host URL queues in fetch-list order. The caller asks `next_ready()`
what to do: prepare a host (SSRF check + robots.txt, once per host), dispatch a host's head URL (then
`start()` it once a global slot is held), or wait. It takes the gate of every request itself
(`HostGate.started`/`finished`) and tells the scheduler when a host's preparation or a dispatched URL is
over. URLs that cannot be requested are reported without a request through the `report` callback.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crawler import urls
from crawler.politeness import HostGate, PolitenessRules
from crawler.robots import RobotsPolicy, RobotsState
from crawler.status import FetchOutcome, LiveHostState

RECHECK_S = 0.5  # a host whose gate is full is looked at again this soon (a request we do not own may hold it)


@dataclass
class HostWork:
    """One host of a bucket: its URL queue, gate, and what we learned before its first URL."""

    host_key: str
    hostname: str
    gate: HostGate
    queue: deque[dict[str, Any]] = field(default_factory=deque)
    prepared: bool = False      # address checked and robots policy known
    preparing: bool = False
    blocked: str | None = None  # why the SSRF guard refused the host, if it did
    policy: RobotsPolicy | None = None
    heap_at: float | None = None  # ready time of the host's live heap entry (older entries are stale)
    left: int = 0               # URLs not reported yet: queued or in flight (an active host for the metrics)
    listed: int = 0             # URLs ever queued in this bucket run (the host's size class in the metrics)
    head_allowed: bool = False  # robots.txt already said yes to the head of the queue (checked once per URL)

    def wants_dispatch(self) -> bool:
        return not self.preparing and (not self.prepared or bool(self.queue))

    def state(self) -> str:
        """What holds the host now (`LiveHostState`): blocked by the SSRF guard, nothing allowed because its
        robots.txt is unreachable, paused after repeated failures, backing off, or nothing (ok)."""
        if self.blocked:
            return LiveHostState.BLOCKED.value
        if self.policy is not None and self.policy.state is RobotsState.DISALLOW_ALL:
            return LiveHostState.ROBOTS_UNREACHABLE.value
        if self.gate.paused:
            return LiveHostState.PAUSED.value
        return (LiveHostState.BACKING_OFF if self.gate.backoff_s > 0 else LiveHostState.OK).value


@dataclass(frozen=True)
class Report:
    """A URL reported without a request, and why."""

    item: dict[str, Any]
    outcome: FetchOutcome
    error: str | None = None


@dataclass(frozen=True)
class Prepare:
    """Check the host's address and learn its robots policy, then call `HostScheduler.prepared`."""

    host: HostWork


@dataclass(frozen=True)
class Dispatch:
    """The host's gate is open and its head URL allowed: take a global slot, then call `HostScheduler.start`."""

    host: HostWork


class HostScheduler:
    """The hosts of one bucket run. `clock` gives monotonic seconds (the clock the gates are driven with)."""

    def __init__(self, gate_for: Callable[[str], HostGate], clock: Callable[[], float],
                 report: Callable[[Report], None], recheck_s: float = RECHECK_S,
                 rules: PolitenessRules | None = None):
        self.gate_for = gate_for
        self.rules = rules  # when set, each host's fetch-list limits (delay_s, max_concurrency) apply to its gate
        self.clock = clock
        self.report = report
        self.recheck_s = recheck_s
        self.hosts: dict[str, HostWork] = {}
        self.heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self.queued = 0  # URLs in host queues (not yet handed out or reported): the daemon's intake watermark

    def add(self, row: dict[str, Any]) -> None:
        """Queue one fetch-list row (rows of a host arrive in fetch-list order)."""
        host = self.hosts.get(row["host_key"])
        if host is None:
            gate = self.gate_for(row["host_key"])
            gate.paused, gate.failures = False, 0  # a pause lasts for one bucket run only
            if self.rules is not None:
                self.rules.limit(gate, row.get("delay_s"), row.get("max_concurrency"))
            host = HostWork(row["host_key"], urls.host_name(row["url"]), gate)
            self.hosts[row["host_key"]] = host
        host.queue.append(row)
        host.left += 1
        host.listed += 1
        self.queued += 1
        self._schedule(host)

    def next_ready(self) -> Prepare | Dispatch | float | None:
        """The next thing to do now, or the seconds until a host's gate opens (None: nothing is scheduled until a
        preparation or request ends). Settles every host it looks at."""
        while self.heap:
            ready_at, _, key = self.heap[0]
            host = self.hosts[key]
            if host.heap_at != ready_at or not host.wants_dispatch():  # superseded, or nothing left to hand out:
                heapq.heappop(self.heap)                               # never wait for it
                if host.heap_at == ready_at:
                    host.heap_at = None
                continue
            now = self.clock()
            if ready_at > now:
                return ready_at - now
            heapq.heappop(self.heap)
            host.heap_at = None
            if not host.prepared:
                if not host.preparing:
                    host.preparing = True
                    return Prepare(host)
                continue
            self._settle(host)
            if not host.queue:
                continue
            if not host.gate.can_start(now):
                self._schedule(host)
                continue
            return Dispatch(host)
        return None

    def start(self, host: HostWork) -> dict[str, Any] | None:
        """Take the host's gate now for its head URL and hand that URL out; None if, while the caller waited for a
        slot, the host stopped being dispatchable (it is rescheduled)."""
        self._settle(host)
        now = self.clock()
        if not host.queue or not host.gate.can_start(now):
            self._schedule(host)
            return None
        host.gate.started(now)
        item = host.queue.popleft()
        host.head_allowed = False
        self.queued -= 1
        self._schedule(host)
        return item

    def prepared(self, host: HostWork) -> None:
        """The host's preparation is over (`blocked` or `policy` set on it; neither means robots unknown)."""
        host.prepared, host.preparing = True, False
        self._refresh(host)

    def finished(self, host: HostWork) -> None:
        """A URL handed out by `start` was reported by the caller (its gate already closed)."""
        host.left -= 1
        self._refresh(host)

    def unfinished(self) -> bool:
        """Some host still has URLs queued or is not prepared."""
        return any(h.queue or not h.prepared for h in self.hosts.values())

    def _refresh(self, host: HostWork) -> None:
        self._settle(host)
        self._schedule(host)

    def _schedule(self, host: HostWork) -> None:
        """Put the host on the heap at the time its gate opens, if it has something to dispatch. A host whose
        gate is full is looked at again later as well, in case a request this bucket does not own holds it (or,
        under the per-IP guard, a request to another host of its address)."""
        if not host.wants_dispatch():
            return
        if not host.prepared:
            ready_at = 0.0
        elif host.gate.full():
            ready_at = max(host.gate.opens_at(), self.clock() + self.recheck_s)
        else:
            ready_at = host.gate.opens_at()
        if host.heap_at is not None and host.heap_at <= ready_at:
            return
        self._seq += 1
        heapq.heappush(self.heap, (ready_at, self._seq, host.host_key))
        host.heap_at = ready_at

    def _settle(self, host: HostWork) -> None:
        """Report, without a request, the host's queued URLs that cannot be requested now: all of them if the
        host is blocked, paused or its robots.txt is unreachable; the head of the queue while robots denies it."""
        if not host.prepared:
            return
        if host.blocked:
            self._report_all(host, FetchOutcome.BLOCKED, host.blocked)
        elif host.gate.paused or host.policy is None or host.policy.state is RobotsState.DISALLOW_ALL:
            self._report_all(host, FetchOutcome.DEFERRED)
        else:
            while host.queue and not host.head_allowed:
                if host.policy.allowed(host.queue[0]["url"]):
                    host.head_allowed = True
                else:
                    self._report_one(host, FetchOutcome.ROBOTS_DENIED)

    def _report_all(self, host: HostWork, outcome: FetchOutcome, error: str | None = None) -> None:
        while host.queue:
            self._report_one(host, outcome, error)

    def _report_one(self, host: HostWork, outcome: FetchOutcome, error: str | None = None) -> None:
        host.left -= 1
        self.queued -= 1
        host.head_allowed = False
        self.report(Report(host.queue.popleft(), outcome, error))
