"""The host scheduler on a virtual clock: a simulated crawl of thousands of URLs over hosts with different delays,
robots rules and failures, judged from the simulated servers' own log, plus unit tests of single decisions.

The simulation (`tests/support/virtual.py::VirtualBucketRun`) drives `HostScheduler` as `fetchd.bucketrun.BucketRun`
does (prepare = robots.txt through the gate, dispatch = `start` then one request, `HostGate.finished` at the
response's end), but every response time and status comes from a seeded script. The per-IP guard and the domain
gate are judged on the daemon itself on the virtual clock (`virtual.fetch_virtually`). The checks recompute the
rules from the server's side independently.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import pytest

from crawler.politeness import HostGate, SharedGate
from crawler.robots import RobotsPolicy
from crawler.scheduling import Dispatch, HostScheduler, Prepare, Report
from crawler.status import FetchOutcome
from fetchd.hostprep import thread_memory
from tests.support.virtual import EPOCH, Answer, Request, VirtualBucketRun, VirtualClock, fetch_virtually

TOKEN = "cyclecrawl"
MAX_CRAWL_DELAY_S = 3.0
BACKOFF_BASE_S = 1.0
MAX_BACKOFF_S = 60.0
MAX_FAILURES = 5
EPS = 1e-6  # HTTP dates pass through epoch seconds (~1e-7 s float resolution)


@dataclass
class HostSpec:
    key: str
    min_delay_s: float
    robots_status: int
    robots_body: str
    pages: int
    private_every: int = 0       # every n-th URL is under /private/ (the robots body disallows it, if it says so)
    fail_run_from: int | None = None  # page requests from this index on fail with a 500 (until the host pauses)
    delay_s: float = 0.0         # the delay the rule gives after a success, computed by the test


class Server:
    """The hosts' side: a seeded response time per request and a scripted status; logs every request."""

    def __init__(self, specs: dict[str, HostSpec], rng: random.Random):
        self.specs, self.rng = specs, rng
        self.log: list[Request] = []
        self.page_requests: Counter[str] = Counter()

    def serve(self, host: str, path: str, start: float) -> Request:
        spec = self.specs[host]
        end = start + self.rng.uniform(0.02, 3.0)
        request = Request(host, path, start, end, 200)
        if path == "/robots.txt":
            request.status, request.body = spec.robots_status, spec.robots_body
        else:
            index = self.page_requests[host]
            self.page_requests[host] += 1
            roll = self.rng.random()
            if spec.fail_run_from is not None and index >= spec.fail_run_from:
                request.status = 500
            elif roll < 0.03:
                seconds = self.rng.randint(1, 20)
                request.status, request.retry_after, request.hold_until = 429, str(seconds), end + seconds
            elif roll < 0.05:
                when = math.ceil(EPOCH + end + self.rng.randint(1, 30))
                request.status, request.retry_after = 503, formatdate(when, usegmt=True)
                request.hold_until = when - EPOCH
            elif roll < 0.08:
                request.status = None  # connection reset
            elif roll < 0.10:
                request.status = 404
        self.log.append(request)
        return request


def _simulation(specs: dict[str, HostSpec], concurrency: int, seed: int) -> VirtualBucketRun:
    rows = []
    for spec in specs.values():
        for i in range(spec.pages):
            private = spec.private_every and i % spec.private_every == 0
            rows.append({"url": f"{spec.key}/{'private' if private else 'page'}/{i}", "host_key": spec.key, "rank": i})

    def gate_for(host_key: str) -> HostGate:
        return HostGate(specs[host_key].min_delay_s, MAX_CRAWL_DELAY_S, concurrency, BACKOFF_BASE_S, MAX_BACKOFF_S,
                        MAX_FAILURES)

    return VirtualBucketRun(rows, gate_for, Server(specs, random.Random(seed + 1)), seed)


def _specs() -> dict[str, HostSpec]:
    hosts = [
        HostSpec("http://a.test", 0.5, 200, "User-agent: *\nDisallow: /private/\nCrawl-delay: 2\n", 1500,
                 private_every=5, delay_s=2.0),
        HostSpec("http://b.test", 0.5, 503, "", 500, delay_s=0.5),  # robots unreachable: nothing is requested
        HostSpec("http://c.test", 1.0, 404, "", 1500, fail_run_from=900, delay_s=1.0),  # no robots: allow all
        HostSpec("http://d.test", 0.2, 200, "User-agent: other\nDisallow: /\n\nUser-agent: *\nCrawl-delay: 30\n",
                 400, delay_s=MAX_CRAWL_DELAY_S),  # Crawl-delay beyond the cap
    ]
    return {h.key: h for h in hosts}


def _check_politeness(sim: VirtualBucketRun, specs: dict[str, HostSpec]) -> dict[str, int]:
    """The delay rule and the concurrency allowance, recomputed from the server's log; returns what it saw.
    Every start is also held to each earlier Retry-After, not only the last end's."""
    seen: Counter[str] = Counter()
    by_host: dict[str, list[Request]] = defaultdict(list)
    for request in sim.server.log:
        by_host[request.host].append(request)
    for host, log in by_host.items():
        spec = specs[host]
        starts = sorted(log, key=lambda r: r.start)
        ends = sorted(log, key=lambda r: r.end)
        # The hold each end imposes on the next start: the delay (stretched by backoff after a failure).
        required: dict[int, float] = {}
        failures = 0
        pause_at = math.inf
        for r in ends:
            if r.status is None or r.status == 429 or r.status >= 500:
                failures += 1
                if r.hold_until is not None:
                    backoff = min(r.hold_until - r.end, MAX_BACKOFF_S)
                    seen["retry_after"] += 1
                else:
                    backoff = min(BACKOFF_BASE_S * 2 ** (failures - 1), MAX_BACKOFF_S)
                required[id(r)] = max(spec.delay_s, backoff)
                if failures >= MAX_FAILURES and pause_at == math.inf:
                    pause_at = r.end
            else:
                failures = 0
                required[id(r)] = spec.delay_s
        tight = gaps = 0
        for i, r in enumerate(starts):
            earlier = [e for e in ends if e.end <= r.start + EPS and e is not r]
            if earlier:
                last = earlier[-1]
                assert r.start >= last.end + required[id(last)] - EPS, (host, last, r)
                gaps += 1
                tight += r.start <= last.end + required[id(last)] + 1e-5
            for e in earlier:  # never cut short, whatever ended after it
                if e.hold_until is not None:
                    assert r.start >= min(e.hold_until, e.end + MAX_BACKOFF_S) - EPS, (host, e, r)
            if i:
                assert r.start >= starts[i - 1].start + spec.delay_s - EPS, (host, starts[i - 1], r)
        if pause_at < math.inf:
            assert all(r.start <= pause_at for r in log), f"{host} requested after it paused"
            seen["paused"] += 1
        # Not vacuous: most requests start the moment the rule allows.
        assert gaps == 0 or tight >= 0.5 * gaps, (host, tight, gaps)
        # In flight never above the allowance.
        points = sorted([(r.start, 1) for r in log] + [(r.end, -1) for r in log], key=lambda p: (p[0], p[1]))
        in_flight = peak = 0
        for _, step in points:
            in_flight += step
            peak = max(peak, in_flight)
        assert peak <= sim.gate(host).concurrency_cap, (host, peak)
        seen[f"peak:{host}"] = peak
    seen["network_errors"] = sum(1 for r in sim.server.log if r.status is None)
    return seen


@pytest.mark.parametrize("concurrency, seed", [(1, 7), (2, 11)])
def test_simulated_crawl_is_polite_and_reports_every_url_once(concurrency: int, seed: int) -> None:
    specs = _specs()
    sim = _simulation(specs, concurrency, seed)
    sim.run()

    # The run ended with nothing left.
    assert not sim.events and not sim.sched.unfinished()
    assert all(h.left == 0 and not h.queue for h in sim.sched.hosts.values())

    # Every URL reported exactly once: handed out for a request, or reported without one.
    reported = Counter(r.item["url"] for r in sim.reports)
    handed = Counter(item["url"] for item in sim.handed_out)
    assert not set(reported) & set(handed)
    assert reported + handed == Counter(row["url"] for row in sim.rows)
    assert max((reported + handed).values()) == 1

    # Each handed-out URL was requested exactly once; no disallowed path and nothing at b.test reached a server.
    pages = [f"{r.host}{r.path}" for r in sim.server.log if r.path != "/robots.txt"]
    assert Counter(pages) == handed
    assert not [p for p in pages if "/private/" in p or p.startswith("http://b.test")]
    assert Counter(r.host for r in sim.server.log if r.path == "/robots.txt") == Counter(list(specs))

    outcomes = Counter((r.item["host_key"], r.outcome) for r in sim.reports)
    assert outcomes[("http://a.test", FetchOutcome.ROBOTS_DENIED)] == 300
    assert {r.item["url"] for r in sim.reports if r.outcome is FetchOutcome.ROBOTS_DENIED} == {
        row["url"] for row in sim.rows if "/private/" in row["url"]}
    assert outcomes[("http://b.test", FetchOutcome.DEFERRED)] == 500
    assert 0 < outcomes[("http://c.test", FetchOutcome.DEFERRED)] < 600  # paused during its failure run
    assert set(outcomes) == {("http://a.test", FetchOutcome.ROBOTS_DENIED), ("http://b.test", FetchOutcome.DEFERRED),
                             ("http://c.test", FetchOutcome.DEFERRED)}
    assert sim.gate("http://c.test").paused and not sim.gate("http://a.test").paused

    seen = _check_politeness(sim, specs)
    assert seen["retry_after"] >= 20 and seen["network_errors"] >= 20 and seen["paused"] == 1
    assert seen["peak:http://a.test"] == concurrency  # the allowance is used, not just respected


# --- single decisions ------------------------------------------------------------------------------------------


def _gate(min_delay_s: float = 1.0, concurrency: int = 1) -> HostGate:
    return HostGate(min_delay_s, MAX_CRAWL_DELAY_S, concurrency, BACKOFF_BASE_S, MAX_BACKOFF_S, MAX_FAILURES)


def _scheduler(clock: VirtualClock, gates: dict[str, HostGate] | None = None) -> tuple[HostScheduler, list[Report]]:
    gates = {} if gates is None else gates
    reports: list[Report] = []
    return HostScheduler(lambda key: gates.setdefault(key, _gate()), clock, reports.append), reports


def _row(url: str, host: str = "http://h.test") -> dict[str, Any]:
    return {"url": url, "host_key": host}


def test_a_host_is_prepared_once_before_any_dispatch() -> None:
    sched, _ = _scheduler(VirtualClock())
    sched.add(_row("http://h.test/1"))
    sched.add(_row("http://h.test/2"))
    action = sched.next_ready()
    assert isinstance(action, Prepare) and action.host.hostname == "h.test"
    assert sched.next_ready() is None  # preparing: nothing else to do until it is over
    sched.add(_row("http://h.test/3"))
    assert sched.next_ready() is None  # a new row does not prepare the host a second time
    action.host.policy = RobotsPolicy.allow_all()
    sched.prepared(action.host)
    dispatch = sched.next_ready()
    assert isinstance(dispatch, Dispatch)
    assert sched.start(dispatch.host)["url"] == "http://h.test/1"


def _prepared(sched: HostScheduler, policy: RobotsPolicy | None, blocked: str | None = None) -> Any:
    action = sched.next_ready()
    assert isinstance(action, Prepare)
    action.host.policy, action.host.blocked = policy, blocked
    sched.prepared(action.host)
    return action.host


@pytest.mark.parametrize("policy, blocked, outcome", [
    (None, "10.0.0.1 is private", FetchOutcome.BLOCKED),
    (RobotsPolicy.disallow_all(), None, FetchOutcome.DEFERRED),
    (None, None, FetchOutcome.DEFERRED),
])
def test_a_host_that_cannot_be_fetched_reports_every_url(policy: RobotsPolicy | None, blocked: str | None,
                                                           outcome: FetchOutcome) -> None:
    sched, reports = _scheduler(VirtualClock())
    for i in range(3):
        sched.add(_row(f"http://h.test/{i}"))
    host = _prepared(sched, policy, blocked)
    assert [(r.item["url"], r.outcome, r.error) for r in reports] == [
        (f"http://h.test/{i}", outcome, blocked) for i in range(3)]
    assert host.left == 0 and sched.next_ready() is None and not sched.unfinished()


def test_robots_denies_only_the_urls_it_disallows_in_fetch_list_order() -> None:
    clock = VirtualClock()
    sched, reports = _scheduler(clock)
    for path in ("/no/1", "/no/2", "/yes/1", "/no/3", "/yes/2"):
        sched.add(_row("http://h.test" + path))
    host = _prepared(sched, RobotsPolicy.parse("User-agent: *\nDisallow: /no/\n", TOKEN))
    assert [r.item["url"] for r in reports] == ["http://h.test/no/1", "http://h.test/no/2"]  # the head run only
    assert sched.start(sched.next_ready().host)["url"] == "http://h.test/yes/1"
    host.gate.finished(clock.now + 0.5, 200, None, random.Random(0))
    sched.finished(host)
    assert [r.outcome for r in reports] == [FetchOutcome.ROBOTS_DENIED] * 3
    clock.now = 1.49
    assert not isinstance(sched.next_ready(), Dispatch)  # the delay counts from the response's end
    clock.now = 1.5
    assert sched.start(sched.next_ready().host)["url"] == "http://h.test/yes/2"


def test_a_paused_host_defers_what_is_left() -> None:
    clock = VirtualClock()
    sched, reports = _scheduler(clock)
    for i in range(MAX_FAILURES + 3):
        sched.add(_row(f"http://h.test/{i}"))
    host = _prepared(sched, RobotsPolicy.allow_all())
    for i in range(MAX_FAILURES):
        clock.now = host.gate.next_allowed_at
        assert sched.start(sched.next_ready().host)["url"] == f"http://h.test/{i}"
        host.gate.finished(clock.now, None, None, random.Random(0))
        sched.finished(host)
    assert host.gate.paused
    assert [(r.item["url"], r.outcome) for r in reports] == [
        (f"http://h.test/{i}", FetchOutcome.DEFERRED) for i in range(MAX_FAILURES, MAX_FAILURES + 3)]
    assert sched.next_ready() is None and not sched.unfinished()


def test_waits_until_the_gate_opens_and_rechecks_a_gate_held_elsewhere() -> None:
    clock = VirtualClock()
    gates = {"http://h.test": _gate(min_delay_s=2.0)}
    sched, _ = _scheduler(clock, gates)
    sched.add(_row("http://h.test/1"))
    host = _prepared(sched, RobotsPolicy.allow_all())
    gates["http://h.test"].started(0.0)  # a request this scheduler does not own (another bucket, a redirect hop)
    assert sched.next_ready() == pytest.approx(2.0)
    clock.now = 2.0
    assert sched.next_ready() == pytest.approx(sched.recheck_s)  # gate full: looked at again soon
    host.gate.finished(3.0, 200, None, random.Random(0))
    clock.now = 4.9
    sched.next_ready()
    clock.now = 5.0
    assert isinstance(sched.next_ready(), Dispatch)


def test_start_hands_out_nothing_when_the_gate_closed_while_waiting_for_a_slot() -> None:
    clock = VirtualClock()
    sched, _ = _scheduler(clock)
    sched.add(_row("http://h.test/1"))
    host = _prepared(sched, RobotsPolicy.allow_all())
    dispatch = sched.next_ready()
    assert isinstance(dispatch, Dispatch)
    host.gate.started(clock.now)  # someone else took the gate meanwhile
    assert sched.start(host) is None
    assert list(host.queue) == [_row("http://h.test/1")] and host.gate.in_flight == 1
    host.gate.finished(1.0, 200, None, random.Random(0))
    clock.now = 2.0
    assert sched.start(sched.next_ready().host) == _row("http://h.test/1")


def test_rows_added_later_are_scheduled_and_a_new_host_starts_unpaused() -> None:
    clock = VirtualClock()
    gates = {"http://h.test": _gate()}
    gates["http://h.test"].paused = True  # paused in an earlier run
    sched, reports = _scheduler(clock, gates)
    sched.add(_row("http://h.test/1"))
    assert not gates["http://h.test"].paused
    host = _prepared(sched, RobotsPolicy.allow_all())
    sched.start(sched.next_ready().host)
    host.gate.finished(0.5, 200, None, random.Random(0))
    sched.finished(host)
    assert sched.next_ready() is None and not sched.unfinished()
    sched.add(_row("http://h.test/2"))
    assert sched.unfinished() and sched.next_ready() == pytest.approx(1.5)
    clock.now = 1.5
    assert sched.start(sched.next_ready().host)["url"] == "http://h.test/2"
    assert not reports


# --- the per-IP guard ----------------------------------------------------------------------------------------------


def _every_page_once(conf, folder: str, hosts: list[str], pages: int, seed: int) -> list[Request]:
    """`pages` URLs of each host fetched by the daemon itself on the virtual clock (`virtual.fetch_virtually`, the
    hosts' names on one address), every request answered after a seeded response time (robots.txt 404): the
    server's log in start order, after checking that every URL was requested once."""
    conf = conf.with_overrides({"fetch.static_hosts": {key.removeprefix("http://"): "127.0.0.1" for key in hosts}})
    items = [{"url": f"{key}/page/{i}"} for key in hosts for i in range(pages)]
    rng = random.Random(seed)

    def answer(_host: str, path: str, _earlier: int) -> Answer:
        return Answer(404 if path == "/robots.txt" else 200, rng.uniform(0.05, 1.0))

    log = sorted(fetch_virtually(conf, folder, items, answer).log, key=lambda r: r.start)
    assert Counter(f"{r.host}{r.path}" for r in log if r.path != "/robots.txt") == Counter(i["url"] for i in items)
    return log


@pytest.mark.parametrize("ip_concurrency, ip_delay_s", [(3, 0.0), (1, 0.5), (2, 0.25)])
def test_hosts_on_one_address_share_its_guard_judged_from_the_servers_log(base_conf, root, ip_concurrency: int,
                                                                          ip_delay_s: float) -> None:
    """Ten host names on one address (a shared server), each allowed two requests in flight and no delay: under
    the per-IP guard the address never has more than its concurrency in flight, a start never follows another
    start or an end at the address sooner than its delay, and every URL is still requested once."""
    hosts = [f"http://name{i}.test" for i in range(10)]
    conf = base_conf.with_overrides({
        "politeness.min_delay_s": 0.0, "politeness.max_concurrency_per_host": 2,
        "politeness.max_concurrency_per_ip": ip_concurrency, "politeness.min_delay_per_ip_s": ip_delay_s})
    log = _every_page_once(conf, root, hosts, 12, seed=5)
    assert thread_memory().addresses["127.0.0.1"].in_flight == 0
    peak = 0
    for request in log:  # what was in flight at the address when each request started (the server's view)
        in_flight = sum(1 for other in log if other.start <= request.start < other.end)
        peak = max(peak, in_flight)
        earlier = [other for other in log if other is not request and other.start <= request.start]
        assert all(request.start >= other.start + ip_delay_s - EPS for other in earlier)
        assert all(request.start >= other.end + ip_delay_s - EPS for other in earlier if other.end <= request.start)
    assert peak == ip_concurrency  # the address's allowance is used, not just respected


def test_with_the_domain_as_key_the_hosts_of_one_domain_share_one_gate(base_conf, root) -> None:
    """`politeness.key: domain`: six hosts of big.test and two of other.test, each host's own gate open to them
    side by side. Each domain's gate (crawler.politeness.PolitenessRules.domain_gate) holds all its hosts to one
    request in flight and `min_delay_s` from the end of one to the start of the next; the two domains do not hold
    each other; every URL is requested once."""
    conf = base_conf.with_overrides({"politeness.key": "domain", "politeness.min_delay_s": 0.5,
                                     "politeness.max_concurrency_per_host": 1})
    hosts = [f"http://p{i}.big.test" for i in range(6)] + ["http://a.other.test", "http://b.other.test"]
    log = _every_page_once(conf, root, hosts, 4, seed=7)
    assert set(thread_memory().domains) == {"big.test", "other.test"}
    for domain in ("big.test", "other.test"):
        mine = [r for r in log if r.host.endswith(domain)]
        for before, after in zip(mine, mine[1:], strict=False):
            assert after.start >= before.end + 0.5 - EPS, (before, after)  # one at a time, the delay between
    overlapping = [(a, b) for a in log for b in log if a.host.endswith("big.test") and b.host.endswith("other.test")
                   and a.start < b.end and b.start < a.end]
    assert overlapping  # one gate per domain, not one for the whole daemon


def test_a_full_address_holds_a_host_whose_own_gate_is_open_until_a_request_there_ends() -> None:
    """Single decisions: a host bound to a full address cannot start though its own gate is open, and the scheduler
    waits (the recheck) instead of spinning; a host keeps the address its requests were counted on until they end;
    an abandoned request gives its address slot back."""
    clock = VirtualClock()
    address = SharedGate(0.0, 1)
    gates = {key: _gate(0.0, 2) for key in ("http://a.test", "http://b.test")}
    for gate in gates.values():
        gate.bind_address(address)
    sched, _reports = _scheduler(clock, gates)
    for key in gates:
        sched.add(_row(f"{key}/1", key))
        sched.hosts[key].policy = RobotsPolicy.allow_all()
        sched.prepared(sched.hosts[key])
    first = sched.next_ready()
    assert isinstance(first, Dispatch) and sched.start(first.host) is not None
    other = next(gate for gate in gates.values() if gate is not first.host.gate)
    assert other.in_flight == 0 and other.full() and not other.can_start(clock.now)
    wait = sched.next_ready()
    assert isinstance(wait, float) and wait > 0  # looked at again later, not handed out
    first.host.gate.bind_address(None)  # ignored: a request is in flight on its address
    assert first.host.gate.address is address
    first.host.gate.abandoned(clock.now)
    assert address.in_flight == 0 and other.can_start(clock.now)
