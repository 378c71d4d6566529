"""A fleet of fetch daemons and the cycles that feed them, on one virtual clock: no sleeping, no sockets.

What runs is the project's own rule code: each daemon's buckets are `crawler.scheduling.HostScheduler`s over
`crawler.politeness.HostGate`s made by `PolitenessRules.gate` (one gate per host per daemon, as a daemon's host
memory), robots.txt read by `crawler.robots.policy_for_status`, Retry-After by `parse_retry_after`, bucket
ownership by `crawler.ownership` (`may_take`, `previous_last_end`, epochs, fencing at
renewed + ttl - fence_margin), a successor's gates by `HostGate.ended_elsewhere`, due URLs by
`crawler.leases.is_due`, per-host caps by `crawler.frontier.per_host_cap` and revisits by
`crawler.revisit.RevisitPolicy`. What this module adds is the driving: a discrete-event loop (the work
`fetchd.bucketrun.BucketRun` does with asyncio), the cycle (generate -> fetch -> results applied as they arrive),
and faults (kill -9 and restart of a daemon, a daemon frozen for minutes).

Simplifications, each named so a figure is read with it: results are published the moment a response ends (the
daemon publishes in batches after a WARC sync, so a real kill repeats a few more fetches); robots.txt answers are
cached per daemon for `robots.cache_ttl_s` without the outage rule's retry escalation; a segment's fetch stops at
the next cycle's start (the DAG's fetch deadline), and its unfinished URLs come back when their leases expire.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.sim.world import EPOCH, ROBOTS_RULES, SimHost, SimServer
from crawler.config import Config
from crawler.frontier import per_host_cap, score
from crawler.leases import is_due
from crawler.ownership import LeaseRecord, may_take, previous_last_end
from crawler.politeness import THROTTLE_STATUSES, HostGate, PolitenessRules, parse_retry_after
from crawler.revisit import PreviousState, RevisitPolicy
from crawler.robots import ROBOTS_PATH, RobotsPolicy, RobotsState, policy_for_status
from crawler.scheduling import Dispatch, HostScheduler, HostWork, Prepare, Report
from crawler.status import FetchOutcome, outcome_for_status

HIGH_PRIORITY = 2.0        # priority of the high-priority URLs (the rest have 1.0)
HIGH_PRIORITY_SHARE = 0.1  # share of URLs that are high priority
ROBOTS_TOKEN = "cyclecrawl"


def _moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(EPOCH + seconds, UTC)


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


class Frontier:
    """Every URL's schedule and lease, and the generate and update rules applied to them."""

    def __init__(self, hosts: list[SimHost], conf: Config, rng: random.Random, hours: float):
        self.hosts = hosts
        self.conf = conf
        self.rules = PolitenessRules.from_config(conf)
        self.revisit = RevisitPolicy.from_config(conf)
        self.host_of: list[int] = []
        self.index_in_host: list[int] = []
        self.next_due: list[float] = []
        self.priority: list[float] = []
        self.interval: list[int] = []
        self.failures: list[int] = []
        self.version: list[int] = []
        self.lease_segment: list[str | None] = []
        self.lease_expires: list[float] = []
        for number, host in enumerate(hosts):
            for index in range(host.urls):
                self.host_of.append(number)
                self.index_in_host.append(index)
                self.next_due.append(rng.uniform(0.0, hours * 3600 / 2))  # seeds become due over the first half
                self.priority.append(HIGH_PRIORITY if rng.random() < HIGH_PRIORITY_SHARE else 1.0)
                self.interval.append(self.revisit.default_interval_s)
                self.failures.append(0)
                self.version.append(0)
                self.lease_segment.append(None)
                self.lease_expires.append(math.inf)
        self.crawl_delay: dict[int, float | None] = {}  # host -> Crawl-delay the last robots.txt said (the hosts table)
        self.leases: list[tuple[str, int, int, float, float]] = []  # (segment, url, version, leased at, due)
        self.results: dict[tuple[int, int], float] = {}  # (url, version) -> when its result arrived
        self.stale = 0

    def host_delay(self, host: int) -> float:
        return self.rules.host_delay(self.crawl_delay.get(host), None)

    def generate(self, segment: str, now: float, budget: int, per_host_max: int, segment_seconds: float,
                 lease_seconds: float) -> list[dict[str, Any]]:
        """The segment's fetch-list rows: due URLs ranked by score per host, cut per host, then round-robin over
        hosts up to the budget; each leased (its version bumped)."""
        at = _moment(now)
        boost = self.conf["generate.age_boost_per_day"]
        by_host: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for url, due in enumerate(self.next_due):
            if due <= now and is_due(_moment(due), self.lease_segment[url], _moment(min(self.lease_expires[url],
                                                                                        1e11)), at, segment):
                by_host[self.host_of[url]].append((-score(self.priority[url], _moment(due), at, boost), url))
        ranked = []
        for host, candidates in by_host.items():
            candidates.sort()
            cap = per_host_cap(per_host_max, segment_seconds, self.host_delay(host))
            ranked += [(rank, key, url) for rank, (key, url) in enumerate(candidates[:cap])]
        ranked.sort()
        rows = []
        for rank, _, url in ranked[:budget]:
            host = self.hosts[self.host_of[url]]
            self.version[url] += 1
            self.lease_segment[url] = segment
            self.lease_expires[url] = now + lease_seconds
            self.leases.append((segment, url, self.version[url], now, self.next_due[url]))
            rows.append({"url": host.key + host.path(self.index_in_host[url]), "host_key": host.key, "rank": rank,
                         "url_index": url, "state_version": self.version[url], "due": self.next_due[url],
                         "priority": self.priority[url], "delay_s": self.host_delay(self.host_of[url])})
        return rows

    def apply(self, url: int, version: int, segment: str, outcome: str, status: int | None, at: float) -> None:
        """A result, as update folds it: completes the URL when current and under this segment's lease."""
        self.results.setdefault((url, version), at)
        if version != self.version[url] or self.lease_segment[url] != segment:
            self.stale += 1
            return
        previous = PreviousState("fetched", self.interval[url], self.failures[url], None)
        decision = self.revisit.decide(outcome, status, previous, _moment(at))
        self.interval[url], self.failures[url] = decision.fetch_interval_s, decision.failure_count
        self.next_due[url] = (decision.next_fetch_at - _moment(0)).total_seconds()
        self.lease_segment[url], self.lease_expires[url] = None, math.inf

    def lost(self, end: float) -> int:
        """Leased URLs with no result that would never be handed out again (far in the future, `is_due` says
        no): 0 is the invariant."""
        later = _moment(end + 10 * 365 * 86400)
        return sum(1 for _segment, url, version, _at, _due in self.leases
                   if (url, version) not in self.results and self.version[url] == version
                   and not is_due(_moment(self.next_due[url]), self.lease_segment[url],
                                  _moment(min(self.lease_expires[url], 1e11)), later, "seg-later"))


@dataclass
class BucketRun:
    """One daemon's run of one bucket of a segment: the real host scheduler over the daemon's gates."""

    segment: str
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
    robots: dict[str, tuple[RobotsPolicy, float]] = field(default_factory=dict)  # host -> (policy, expires)
    leases: dict[int, Lease] = field(default_factory=dict)
    runs: dict[int, BucketRun] = field(default_factory=dict)
    in_flight: int = 0
    open_requests: list[dict] = field(default_factory=list)    # server log records of its requests in flight
    wake_at: float = math.inf                                  # the pending wake-up of its pump
    frozen_until: float = -math.inf                            # a stalled process (SIGSTOP, a long GC) does nothing
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
        self.segment: str | None = None
        self.reported: set[tuple[int, int]] = set()
        self.in_flight_at_faults = 0
        self.takeovers = 0
        self.starts: dict[tuple[int, int], int] = Counter()  # (url, version) -> page requests sent
        self.fetches: list[tuple[int, float, float]] = []   # (url, due, fetched at) of page requests answered
        # ownership.max_buckets_per_daemon: a fair share and two more, so a survivor can take over a stalled peer's
        self.max_buckets = math.ceil(buckets / max(1, daemons)) + 2

    def _new_daemon(self, number: int) -> SimDaemon:
        return SimDaemon(f"d{number}-{self.rng.randrange(1 << 30):x}", self.rules, self.gate_factory,
                         self.conf["fetch.concurrency"])

    # --- ownership -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for number, daemon in enumerate(self.daemons):
            self._every(self.conf["ownership.renew_interval_s"], lambda d=daemon: self._renew(d),
                        offset=number * 0.37)
            self._every(self.conf["fetch.poll_interval_s"], lambda d=daemon: self._look_for_work(d),
                        offset=number * 0.53)

    def _every(self, period: float, action: Callable[[], bool], offset: float = 0.0) -> None:
        def tick() -> None:
            if action():
                self.loop.at(self.loop.now + period, tick)
        self.loop.at(self.loop.now + offset, tick)

    def _frozen(self, daemon: SimDaemon) -> bool:
        return self.loop.now < daemon.frozen_until

    def _renew(self, daemon: SimDaemon) -> bool:
        if not daemon.alive:
            return False
        if self._frozen(daemon):
            return True
        now, ttl = self.loop.now, self.conf["ownership.lease_ttl_s"]
        for bucket, lease in daemon.leases.items():
            record = lease.record
            if self.store.get(bucket) is record:
                lease.record = self.store[bucket] = LeaseRecord(**{**record.to_json(), "expires_at": now + ttl})
                lease.fence_at = now + ttl - self.conf["ownership.fence_margin_s"]
        return True

    def _take(self, daemon: SimDaemon, bucket: int) -> Lease | None:
        now = self.loop.now
        previous = self.store.get(bucket)
        if not may_take(previous, now, self.conf["ownership.takeover_grace_s"]):
            return None
        ttl = self.conf["ownership.lease_ttl_s"]
        record = LeaseRecord(bucket, (previous.epoch if previous else 0) + 1, daemon.name, "sim", 0, now, now + ttl)
        self.store[bucket] = record
        lease = daemon.leases[bucket] = Lease(record, now + ttl - self.conf["ownership.fence_margin_s"])
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
        for bucket in [b for b in daemon.leases if b not in daemon.runs and not self.pending.get(b)]:
            self._release(daemon, bucket)
        for bucket in sorted(b for b, left in self.pending.items() if left):
            if bucket in daemon.runs or len(daemon.runs) >= self.max_buckets:
                continue
            rows = self.pending_rows(bucket)
            lease = daemon.leases.get(bucket)
            if lease is None or self.store.get(bucket) is not lease.record or self.loop.now >= lease.fence_at:
                daemon.leases.pop(bucket, None)  # lost, or past its fence unrenewed: taken again like anyone
                lease = self._take(daemon, bucket)
            if lease is not None:
                self._start_run(daemon, bucket, lease, rows)
        self._pump(daemon)
        return True

    # --- fetching ------------------------------------------------------------------------------------------

    def _start_run(self, daemon: SimDaemon, bucket: int, lease: Lease, rows: list[dict[str, Any]]) -> None:
        assert self.segment is not None
        scheduler = HostScheduler(daemon.gate_for, lambda: self.loop.now,
                                  lambda report, d=daemon, b=bucket: self._reported(d, b, report), rules=self.rules)
        run = daemon.runs[bucket] = BucketRun(self.segment, bucket, scheduler, lease)
        previous_end = daemon.last_end.get(bucket)
        for row in rows:
            fresh = row["host_key"] not in scheduler.hosts
            scheduler.add(row)
            if fresh and previous_end is not None:
                cached = daemon.robots.get(row["host_key"])
                scheduler.hosts[row["host_key"]].gate.ended_elsewhere(
                    previous_end, crawl_delay_known=cached is not None and cached[1] > self.loop.now)
        assert run.scheduler is scheduler

    def _fenced(self, daemon: SimDaemon, run: BucketRun) -> bool:
        return (not daemon.alive or run.stopped or self.loop.now >= run.lease.fence_at
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

    def _request(self, daemon: SimDaemon, run: BucketRun, host: HostWork, path: str,
                 done: Callable[[int | None, float], None], tag: tuple[int, int] | None = None) -> None:
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
            done(answer.status, answer.seconds)
            self._pump(daemon)

        self.loop.at(end, finish)
        if tag is not None:
            self.starts[tag] += 1

    def _when_open(self, daemon: SimDaemon, run: BucketRun, host: HostWork, action: Callable[[], None]) -> None:
        """Take the host's gate as soon as it opens (as `fetchd.exchange.Exchange.gated_get` waits), then act; a
        run fenced or stopped meanwhile gives up: robots.txt unknown counts as unreachable."""
        if not daemon.alive:
            return
        if self._frozen(daemon):
            self.loop.at(daemon.frozen_until, lambda: self._when_open(daemon, run, host, action))
            return
        if self._fenced(daemon, run):
            self._robots_known(daemon, run, host, RobotsPolicy.disallow_all(), remember=False)
            return
        if not host.gate.can_start(self.loop.now):
            self.loop.at(max(host.gate.next_allowed_at, self.loop.now + 0.01),
                          lambda: self._when_open(daemon, run, host, action))
            return
        host.gate.started(self.loop.now)
        action()

    def _prepare(self, daemon: SimDaemon, run: BucketRun, host: HostWork) -> None:
        """robots.txt, as `fetchd.hostprep.HostPreparer` learns it: the daemon's copy while in force, else fetched
        through the host's gate, following a redirect to another path through the gate again."""
        cached = daemon.robots.get(host.host_key)
        if cached is not None and cached[1] > self.loop.now:
            self._robots_known(daemon, run, host, cached[0], remember=False)
            return

        def fetch(path: str) -> None:
            def done(status: int | None, _seconds: float) -> None:
                if status in (301, 302) and path == ROBOTS_PATH:
                    self._when_open(daemon, run, host, lambda: fetch("/robots-moved.txt"))
                    return
                body = self.server_body(host.host_key, path, status)
                self._robots_known(daemon, run, host, policy_for_status(status, body, ROBOTS_TOKEN, 512_000))

            self._request(daemon, run, host, path, done)

        self._when_open(daemon, run, host, lambda: fetch(ROBOTS_PATH))

    def server_body(self, host_key: str, path: str, status: int | None) -> str | None:
        """The body the server sent with `status` for a robots path (the world's answers are deterministic in
        body for a given status)."""
        if status != 200:
            return None
        host = self.server.hosts[host_key]
        if path == ROBOTS_PATH and host.robots == "crawl_delay":
            return f"{ROBOTS_RULES}Crawl-delay: {host.crawl_delay_s}\n"
        return ROBOTS_RULES

    def _robots_known(self, daemon: SimDaemon, run: BucketRun, host: HostWork, policy: RobotsPolicy,
                      remember: bool = True) -> None:
        if host.prepared:
            return
        if remember:
            ttl = self.conf["robots.cache_ttl_s"] if policy.state is not RobotsState.DISALLOW_ALL else \
                self.conf["robots.unreachable_retry_s"]
            daemon.robots[host.host_key] = (policy, self.loop.now + ttl)
        index = int(host.host_key.rsplit("h", 1)[1].split(".")[0])
        self.frontier.crawl_delay[index] = policy.crawl_delay_s
        host.policy = policy
        host.gate.set_crawl_delay(policy.crawl_delay_s)
        run.scheduler.prepared(host)

    def _page(self, daemon: SimDaemon, run: BucketRun, host: HostWork, item: dict[str, Any]) -> None:
        tag = (item["url_index"], item["state_version"])

        def done(status: int | None, _seconds: float) -> None:
            run.scheduler.finished(host)
            outcome = outcome_for_status(status).value if status is not None else FetchOutcome.NETWORK_ERROR.value
            self._result(run, item, outcome, status)
            if status is not None and status < 400:
                self.fetches.append((item["url_index"], item["due"], self.loop.now))

        self._request(daemon, run, host, item["url"][len(host.host_key):], done, tag)

    def _reported(self, daemon: SimDaemon, bucket: int, report: Report) -> None:
        run = daemon.runs.get(bucket)
        if run is not None:
            self._result(run, report.item, report.outcome.value, None)

    def _result(self, run: BucketRun, item: dict[str, Any], outcome: str, status: int | None) -> None:
        key = (item["url_index"], item["state_version"])
        if key in self.reported:
            return
        self.reported.add(key)
        if run.segment == self.segment and run.bucket in self.pending:
            self.pending[run.bucket] -= 1
        self.frontier.apply(item["url_index"], item["state_version"], run.segment, outcome, status, self.loop.now)

    # --- cycles and faults ---------------------------------------------------------------------------------

    def open_segment(self, segment: str, rows: list[dict[str, Any]], bucket_of: Callable[[str], int]) -> None:
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

    def kill(self, number: int, restart_after: float) -> None:
        daemon = self.daemons[number]
        self.in_flight_at_faults += daemon.in_flight
        daemon.alive = False
        for record in daemon.open_requests:  # the kernel closes a killed process's connections at once
            record["end"] = min(record["end"], self.loop.now)
            record["status"] = None

        def restart() -> None:
            fresh = self.daemons[number] = self._new_daemon(number)
            self._every(self.conf["ownership.renew_interval_s"], lambda: self._renew(fresh))
            self._every(self.conf["fetch.poll_interval_s"], lambda: self._look_for_work(fresh))

        self.loop.at(self.loop.now + restart_after, restart)
