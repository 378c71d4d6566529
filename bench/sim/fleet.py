"""A fleet of fetch daemons and the cycles that feed them, on one virtual clock: no sleeping, no sockets.

What runs is the project's own rule code: each daemon's buckets are `crawler.scheduling.HostScheduler`s over
`crawler.politeness.HostGate`s made by `PolitenessRules.gate` (one gate per host per daemon, as a daemon's host
memory), robots.txt read by `crawler.robots.policy_for_status`, Retry-After by `parse_retry_after`, bucket
ownership by `crawler.ownership` (`may_take`, `previous_last_end`, epochs, fencing at
renewed + ttl - fence_margin), a successor's gates by `HostGate.ended_elsewhere`, due URLs by
`crawler.leases.is_due`, and what a daemon remembers of robots.txt by `crawler.robots.remember` (the last good
copy through an outage, the retry escalation); the frontier's rules are in `bench.sim.frontier`.

What this module adds is the driving: a discrete-event loop (the work `fetchd.bucketrun.BucketRun` does with
asyncio, without its files and tasks), the cycle (generate -> fetch -> results applied as they arrive) and faults.
Why a second driver and not the daemon itself on the virtual clock (`tests/support/virtual.py`, which the tests
use): through the daemon every request costs a WARC write and a thread round trip (about 2 ms of real time), so a
simulated day of a million requests over a fleet would take most of an hour instead of minutes, and the faults
(kill -9, a frozen process, a storage outage) would need a fleet of daemons and a failing store on one loop. The
driving is held to the daemon's own:
`tests/test_sim.py` runs one fetch list through this fleet and through `fetchd.commands.serve_async` on the virtual
clock (tests/support/virtual.py) against the same server, and requires every host to get the same requests at
the same moments. The faults: kill -9 and restart of a daemon, a daemon frozen for minutes, SIGTERM (a clean
stop: in-flight requests finish, leases are released with the last request's end, the successor takes over at
once) and a storage outage (no lease can be renewed or taken and no result written: every bucket stops at once,
the results of responses that end during it are lost and fetched again after).

Simplifications, each named so a figure is read with it: results are published the moment a response ends (the
daemon publishes in batches after a WARC sync, so a real kill repeats a few more fetches); a segment's fetch
stops at the next cycle's start (the DAG's fetch deadline), and its unfinished URLs come back when their leases
expire; DNS resolution and the SSRF check take no time.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.sim.frontier import Frontier
from bench.sim.world import EPOCH, Answer, SimServer
from crawler.config import Config
from crawler.ownership import LeaseRecord, may_take, previous_last_end
from crawler.politeness import THROTTLE_STATUSES, HostGate, PolitenessRules, parse_retry_after
from crawler.robots import (
    ROBOTS_PATH,
    CachedRobots,
    RobotsCacheRules,
    RobotsPolicy,
    is_unreachable,
    policy_for_status,
    remember,
)
from crawler.scheduling import Dispatch, HostScheduler, HostWork, Prepare
from crawler.status import FetchOutcome, outcome_for_status

ROBOTS_TOKEN = "cyclecrawl"


class EventLoop:
    """Callbacks at virtual times, in order (ties in the order they were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, action))

    def run_until(self, end: float) -> None:
        while self._events and self._events[0][0] <= end:
            when, _, action = heapq.heappop(self._events)
            self.now = when
            action()
        self.now = end


@dataclass
class Lease:
    """A bucket lease as its holder sees it: the record and the fence deadline of its last renewal."""

    record: LeaseRecord
    fence_at: float


@dataclass
class SimBucketRun:
    """One daemon's run of one bucket of a segment: the real host scheduler over the daemon's gates."""

    segment: int
    bucket: int
    scheduler: HostScheduler
    lease: Lease
    in_flight: int = 0
    stopped: bool = False


@dataclass
class SimDaemon:
    """One fetch daemon: its host memory (gates, robots copies), leases, bucket runs and request slots."""

    name: str
    rules: PolitenessRules
    gate_factory: Callable[[PolitenessRules], HostGate]
    slots: int
    alive: bool = True
    gates: dict[str, HostGate] = field(default_factory=dict)
    robots: dict[str, CachedRobots] = field(default_factory=dict)  # what it remembers of each host's robots.txt
    leases: dict[int, Lease] = field(default_factory=dict)
    runs: dict[int, SimBucketRun] = field(default_factory=dict)
    in_flight: int = 0
    open_requests: list[dict] = field(default_factory=list)    # server log records of its requests in flight
    wake_at: float = math.inf                                  # the pending wake-up of its pump
    frozen_until: float = -math.inf                            # a stalled process (SIGSTOP, a long GC) does nothing
    stopping: bool = False                                     # SIGTERM: finish what is in flight, release, exit
    last_end: dict[int, float] = field(default_factory=dict)  # bucket -> end of this daemon's last request there

    def gate_for(self, host_key: str) -> HostGate:
        gate = self.gates.get(host_key)
        if gate is None:
            gate = self.gates[host_key] = self.gate_factory(self.rules)
        return gate


class Fleet:
    """D daemons sharing the buckets of each segment through leases, on the event loop."""

    def __init__(self, conf: Config, server: SimServer, frontier: Frontier, daemons: int, buckets: int,
                 rng: random.Random, gate_factory: Callable[[PolitenessRules], HostGate] | None = None):
        self.conf = conf
        self.server = server
        self.frontier = frontier
        self.loop = EventLoop()
        self.rng = rng
        self.buckets = buckets
        self.rules = PolitenessRules.from_config(conf)
        self.gate_factory = gate_factory or (lambda rules: rules.gate())
        self.store: dict[int, LeaseRecord] = {}
        self.daemons = [self._new_daemon(n) for n in range(daemons)]
        self.work: dict[int, list[dict[str, Any]]] = {}  # bucket -> rows of the current segment
        self.pending: dict[int, int] = {}                 # bucket -> its rows not reported yet
        self.segment: int | None = None
        self.robots_rules = RobotsCacheRules.from_config(conf)
        self.host_number = {host.key: number for number, host in enumerate(frontier.hosts)}
        self.storage_down_until = -math.inf
        self.reported: set[tuple[int, int]] = set()
        self.in_flight_at_faults = 0
        self.takeovers = 0
        self.fault_log: list[tuple[Any, int]] = []           # (fault, requests in flight it caught)
        self.lost_to_storage = 0                             # results of requests whose output could not be written
        self.starts: dict[tuple[int, int], int] = Counter()  # (url, version) -> page requests sent
        self.fetches: list[tuple[int, float, float]] = []   # (url, due, fetched at) of page requests answered
        # ownership.max_buckets_per_daemon: a fair share and two more, so a survivor can take over a stalled peer's
        self.max_buckets = math.ceil(buckets / max(1, daemons)) + 2

    def _new_daemon(self, number: int) -> SimDaemon:
        return SimDaemon(f"d{number}-{self.rng.randrange(1 << 30):x}", self.rules, self.gate_factory,
                         self.conf.fetch.concurrency)

    # --- ownership -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for number, daemon in enumerate(self.daemons):
            self._every(self.conf.ownership.renew_interval_s, lambda d=daemon: self._renew(d),
                        offset=number * 0.37)
            self._every(self.conf.fetch.poll_interval_s, lambda d=daemon: self._look_for_work(d),
                        offset=number * 0.53)

    def _every(self, period: float, action: Callable[[], bool], offset: float = 0.0) -> None:
        def tick() -> None:
            if action():
                self.loop.at(self.loop.now + period, tick)
        self.loop.at(self.loop.now + offset, tick)

    def _frozen(self, daemon: SimDaemon) -> bool:
        return self.loop.now < daemon.frozen_until

    def _storage_down(self) -> bool:
        return self.loop.now < self.storage_down_until

    def _renew(self, daemon: SimDaemon) -> bool:
        if not daemon.alive:
            return False
        if self._frozen(daemon) or self._storage_down():
            return True  # a renewal that cannot be written: the lease runs towards its fence
        now, ttl = self.loop.now, self.conf.ownership.lease_ttl_s
        for bucket, lease in daemon.leases.items():
            record = lease.record
            if self.store.get(bucket) is record:
                lease.record = self.store[bucket] = LeaseRecord(**{**record.to_json(), "expires_at": now + ttl})
                lease.fence_at = now + ttl - self.conf.ownership.fence_margin_s
        return True

    def _take(self, daemon: SimDaemon, bucket: int) -> Lease | None:
        now = self.loop.now
        previous = self.store.get(bucket)
        if not may_take(previous, now, self.conf.ownership.takeover_grace_s):
            return None
        ttl = self.conf.ownership.lease_ttl_s
        record = LeaseRecord(bucket, (previous.epoch if previous else 0) + 1, daemon.name, "sim", 0, now, now + ttl)
        self.store[bucket] = record
        lease = daemon.leases[bucket] = Lease(record, now + ttl - self.conf.ownership.fence_margin_s)
        if previous is not None and not previous.released and previous.owner != daemon.name:
            self.takeovers += 1  # after a kill or a freeze: the lapsed lease of another daemon
        end = previous_last_end(previous, now, holder_is_dead=False)
        if end is not None:  # carried onto every gate of the bucket's hosts as the daemon meets them
            daemon.last_end[bucket] = max(daemon.last_end.get(bucket, -math.inf), end - EPOCH)
        return lease

    def _release(self, daemon: SimDaemon, bucket: int) -> None:
        lease = daemon.leases.pop(bucket)
        if self.store.get(bucket) is lease.record:
            end = daemon.last_end.get(bucket)
            self.store[bucket] = LeaseRecord(**{**lease.record.to_json(), "released": True,
                                                "last_request_end": None if end is None else EPOCH + end})

    def _look_for_work(self, daemon: SimDaemon) -> bool:
        if not daemon.alive:
            return False
        if self._frozen(daemon):
            return True
        for bucket in [b for b, run in daemon.runs.items() if run.stopped and not run.in_flight]:
            del daemon.runs[bucket]
        if daemon.stopping:
            if not daemon.in_flight:  # SIGTERM: everything in flight is over; release and exit
                for bucket in list(daemon.leases):
                    self._release(daemon, bucket)
                daemon.alive = False
                return False
            return True
        if self._storage_down():  # nothing can be prepared, taken or released
            return True
        # the buckets it holds first (a bucket's hosts stay with one daemon across segments), then any other
        waiting = (b for b, left in self.pending.items() if left)
        for bucket in sorted(waiting, key=lambda b: (b not in daemon.leases, b)):
            if bucket in daemon.runs or len(daemon.runs) >= self.max_buckets:
                continue
            lease = daemon.leases.get(bucket)
            if lease is None or self.store.get(bucket) is not lease.record or self.loop.now >= lease.fence_at:
                daemon.leases.pop(bucket, None)  # lost, or past its fence unrenewed: taken again like anyone
                lease = self._take(daemon, bucket)
            if lease is not None:
                self._start_run(daemon, bucket, lease, self.pending_rows(bucket))
        for bucket in [b for b in daemon.leases if b not in daemon.runs]:  # no more than it runs
            self._release(daemon, bucket)
        self._pump(daemon)
        return True

    # --- fetching ------------------------------------------------------------------------------------------

    def _start_run(self, daemon: SimDaemon, bucket: int, lease: Lease, rows: list[dict[str, Any]]) -> None:
        assert self.segment is not None
        scheduler = HostScheduler(daemon.gate_for, lambda: self.loop.now,
                                  lambda report: self._result(run, report.item, report.outcome.value, None),
                                  rules=self.rules)
        run = daemon.runs[bucket] = SimBucketRun(self.segment, bucket, scheduler, lease)
        previous_end = daemon.last_end.get(bucket)
        for row in rows:
            fresh = row["host_key"] not in scheduler.hosts
            scheduler.add(row)
            if fresh and previous_end is not None:
                cached = daemon.robots.get(row["host_key"])
                scheduler.hosts[row["host_key"]].gate.ended_elsewhere(
                    previous_end, crawl_delay_known=cached is not None and cached.expires > self.loop.now)
        assert run.scheduler is scheduler

    def _fenced(self, daemon: SimDaemon, run: SimBucketRun) -> bool:
        return (not daemon.alive or daemon.stopping or run.stopped or self.loop.now >= run.lease.fence_at
                or self.store.get(run.bucket) is not run.lease.record)

    def _pump(self, daemon: SimDaemon) -> None:
        """Start everything the daemon's bucket runs have ready now; wake up when the next gate opens."""
        if not daemon.alive:
            return
        if self._frozen(daemon):
            self.loop.at(daemon.frozen_until, lambda: self._pump(daemon))
            return
        daemon.wake_at = math.inf
        wake = math.inf
        for run in list(daemon.runs.values()):
            if self._fenced(daemon, run):
                run.stopped = True
                continue
            while daemon.in_flight < daemon.slots:
                action = run.scheduler.next_ready()
                if isinstance(action, Prepare):
                    self._prepare(daemon, run, action.host)
                elif isinstance(action, Dispatch):
                    item = run.scheduler.start(action.host)
                    if item is not None:
                        self._page(daemon, run, action.host, item)
                else:
                    if action is not None:
                        wake = min(wake, self.loop.now + action)
                    break
        if wake < daemon.wake_at:  # one wake-up pending per daemon: the earliest
            daemon.wake_at = wake
            self.loop.at(wake, lambda: self._pump(daemon) if daemon.wake_at == wake else None)

    def _request(self, daemon: SimDaemon, run: SimBucketRun, host: HostWork, path: str,
                 done: Callable[[Answer], None], tag: tuple[int, int] | None = None) -> None:
        """One request through the host's gate (already taken); its response arrives at its end."""
        start = self.loop.now
        answer = self.server.answer(host.host_key, path, start)
        end = start + answer.seconds
        record = {"host": host.host_key, "path": path, "start": start, "end": end, "daemon": daemon.name,
                  "status": answer.status}
        self.server.log.append(record)
        daemon.in_flight += 1
        daemon.open_requests.append(record)
        run.in_flight += 1

        def finish() -> None:
            if daemon.alive and self._frozen(daemon):  # the response waits in the kernel until the process runs
                self.loop.at(daemon.frozen_until, finish)
                return
            daemon.in_flight -= 1
            daemon.open_requests.remove(record)
            run.in_flight -= 1
            daemon.last_end[run.bucket] = max(daemon.last_end.get(run.bucket, -math.inf), end)
            if not daemon.alive:
                return
            retry_after = None
            if answer.status in THROTTLE_STATUSES:
                retry_after = parse_retry_after(answer.retry_after, EPOCH + self.loop.now)
            host.gate.finished(self.loop.now, answer.status, retry_after, self.rng, answer.seconds)
            if tag is not None and self._storage_down():  # its record cannot be written: it is fetched again
                self.lost_to_storage += 1
            else:
                done(answer)
            self._pump(daemon)

        self.loop.at(end, finish)
        if tag is not None:
            self.starts[tag] += 1

    def _when_open(self, daemon: SimDaemon, run: SimBucketRun, host: HostWork, action: Callable[[], None]) -> None:
        """Take the host's gate as soon as it opens (as `fetchd.exchange.Exchange.gated_get` waits), then act; a
        run fenced or stopped meanwhile gives up: robots.txt unknown counts as unreachable."""
        if not daemon.alive:
            return
        if self._frozen(daemon):
            self.loop.at(daemon.frozen_until, lambda: self._when_open(daemon, run, host, action))
            return
        if self._fenced(daemon, run):
            self._robots_known(run, host, RobotsPolicy.disallow_all())
            return
        if not host.gate.can_start(self.loop.now):
            self.loop.at(max(host.gate.next_allowed_at, self.loop.now + 0.01),
                          lambda: self._when_open(daemon, run, host, action))
            return
        host.gate.started(self.loop.now)
        action()

    def _prepare(self, daemon: SimDaemon, run: SimBucketRun, host: HostWork) -> None:
        """robots.txt, as `fetchd.hostprep.HostPreparer` learns it: the daemon's copy while in force, else fetched
        through the host's gate (a redirect to another path followed through the gate again) and remembered by
        `crawler.robots.remember`; the observation counts for the host's backoff (update's host counts)."""
        cached = daemon.robots.get(host.host_key)
        if cached is not None and cached.expires > self.loop.now:
            self._robots_known(run, host, cached.policy)
            return

        def fetch(path: str) -> None:
            def done(answer: Answer) -> None:
                status = answer.status
                if status in (301, 302) and path == ROBOTS_PATH and answer.location:
                    self._when_open(daemon, run, host, lambda: fetch(answer.location))
                    return
                fetched = policy_for_status(status, answer.body, ROBOTS_TOKEN, 512_000)
                entry = daemon.robots[host.host_key] = remember(daemon.robots.get(host.host_key), fetched, status,
                                                                 self.loop.now, self.robots_rules)
                number = self.host_number[host.host_key]
                self.frontier.count(run.segment, number, is_unreachable(status), self.loop.now)
                if not is_unreachable(status):
                    self.frontier.crawl_delay[number] = fetched.crawl_delay_s
                self._robots_known(run, host, entry.policy)

            self._request(daemon, run, host, path, done)

        self._when_open(daemon, run, host, lambda: fetch(ROBOTS_PATH))

    def _robots_known(self, run: SimBucketRun, host: HostWork, policy: RobotsPolicy) -> None:
        if host.prepared:
            return
        host.policy = policy
        host.gate.set_crawl_delay(policy.crawl_delay_s)
        run.scheduler.prepared(host)

    def _page(self, daemon: SimDaemon, run: SimBucketRun, host: HostWork, item: dict[str, Any]) -> None:
        tag = (item["url_index"], item["state_version"])

        def done(answer: Answer) -> None:
            status = answer.status
            run.scheduler.finished(host)
            outcome = outcome_for_status(status).value if status is not None else FetchOutcome.NETWORK_ERROR.value
            self._result(run, item, outcome, status)
            if status is not None and status < 400:
                self.fetches.append((item["url_index"], item["due"], self.loop.now))

        self._request(daemon, run, host, item["url"][len(host.host_key):], done, tag)

    def _result(self, run: SimBucketRun, item: dict[str, Any], outcome: str, status: int | None) -> None:
        key = (item["url_index"], item["state_version"])
        if key in self.reported:
            return
        self.reported.add(key)
        if run.segment == self.segment and run.bucket in self.pending:
            self.pending[run.bucket] -= 1
        self.frontier.apply(item["url_index"], item["state_version"], run.segment, outcome, status, self.loop.now)

    # --- cycles and faults ---------------------------------------------------------------------------------

    def open_segment(self, segment: int, rows: list[dict[str, Any]], bucket_of: Callable[[str], int]) -> None:
        """A new segment's fetch list: the previous one stops (its fetch deadline), its buckets' runs end."""
        for daemon in self.daemons:
            for run in daemon.runs.values():
                run.stopped = True
        self.segment = segment
        self.work = defaultdict(list)
        for row in rows:
            self.work[bucket_of(row["host_key"])].append(row)
        for rows_of_bucket in self.work.values():
            rows_of_bucket.sort(key=lambda r: (r["rank"], r["host_key"]))
        self.pending = {bucket: len(rows_of_bucket) for bucket, rows_of_bucket in self.work.items()}

    def pending_rows(self, bucket: int) -> list[dict[str, Any]]:
        return [r for r in self.work.get(bucket, []) if (r["url_index"], r["state_version"]) not in self.reported]

    def freeze(self, number: int, seconds: float) -> None:
        """The daemon's process stalls for `seconds`: no renewal, no request, responses wait; its leases may lapse
        and be taken, and after it it must notice (fencing) before sending anything."""
        daemon = self.daemons[number]
        self.in_flight_at_faults += daemon.in_flight  # its results wait: a successor may send them again
        daemon.frozen_until = self.loop.now + seconds

    def terminate(self, number: int, restart_after: float) -> None:
        """SIGTERM (a deploy): the daemon sends nothing new, lets what is in flight finish and publish, releases its
        leases with the end of its last request (`_look_for_work`) and exits; a new process starts later."""
        daemon = self.daemons[number]
        if not daemon.alive:
            return
        daemon.stopping = True
        self.loop.at(self.loop.now + restart_after, lambda: self._restart(number, daemon))

    def storage_outage(self, seconds: float) -> None:
        """The lease store and the output folder fail for `seconds`: every bucket stops at once, no lease is
        renewed or taken, and the results of responses that end meanwhile cannot be written."""
        for daemon in self.daemons:
            if daemon.alive:
                self.in_flight_at_faults += daemon.in_flight
                for run in daemon.runs.values():
                    run.stopped = True
        self.storage_down_until = self.loop.now + seconds
        for daemon in self.daemons:  # when it is back, each daemon looks for work at once
            self.loop.at(self.storage_down_until, lambda d=daemon: self._look_for_work(d) and None)

    def _restart(self, number: int, previous: SimDaemon) -> None:
        if self.daemons[number] is not previous:
            return
        if previous.alive:  # still finishing its in-flight requests: look again soon
            self.loop.at(self.loop.now + 1.0, lambda: self._restart(number, previous))
            return
        fresh = self.daemons[number] = self._new_daemon(number)
        self._every(self.conf.ownership.renew_interval_s, lambda: self._renew(fresh))
        self._every(self.conf.fetch.poll_interval_s, lambda: self._look_for_work(fresh))

    def kill(self, number: int, restart_after: float) -> None:
        daemon = self.daemons[number]
        if not daemon.alive:
            return
        self.in_flight_at_faults += daemon.in_flight
        daemon.alive = False
        for record in daemon.open_requests:  # the kernel closes a killed process's connections at once
            record["end"] = min(record["end"], self.loop.now)
            record["status"] = None

        self.loop.at(self.loop.now + restart_after, lambda: self._restart(number, daemon))
