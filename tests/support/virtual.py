"""Timing rules on a virtual clock: checked exactly, with no sleeping and no sockets.

`VirtualTimeLoop` with a `ScriptedTransport` runs the daemon itself on the virtual clock: an asyncio event loop
whose time is the clock's, which jumps to its next timer whenever it has nothing to run and no thread work (file
I/O, WARC writes) is pending. `fetch_virtually` fetches one segment with a `fetchd.daemon.Daemon` (its bucket runs,
host preparation, gates, files), `serve_virtually` runs `fetchd.commands.serve_async` (its own loop, leases, stop
and close handling) beside a scenario that acts at virtual moments.

`VirtualBucketRun` is a second, bare driver of `crawler.scheduling.HostScheduler`, kept for one use only (its
docstring says why).

Either way the server logs every request as it saw it, so tests judge the rules from the server's side, as the
real-clock tests do from a loopback server's log.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import selectors
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from crawler.bucketing import Bucketing
from crawler.politeness import THROTTLE_STATUSES, HostGate, parse_retry_after
from crawler.robots import policy_for_status
from crawler.scheduling import Dispatch, HostScheduler, HostWork, Prepare, Report
from crawler.urls import host_key
from fetchd.fetcher import FetchResponse
from fetchd.warc import writes_pending

EPOCH = 1_800_000_000.0  # wall-clock seconds at virtual time 0 (HTTP-date Retry-After values are absolute)
ROBOTS_TOKEN = "cyclecrawl"
ROBOTS_MAX_BYTES = 512_000


@dataclass
class VirtualClock:
    """Monotonic seconds since the start of a run; the wall clock is EPOCH later."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH + self.now


@dataclass
class Request:
    """One request as the virtual server saw it."""

    host: str
    path: str
    start: float
    end: float | None                  # None while in flight
    status: int | None                 # None: no response (connection reset)
    retry_after: str | None = None     # the Retry-After header it answered with
    hold_until: float | None = None    # virtual time before which the server asked not to be contacted again
    body: str = ""


class VirtualServer(Protocol):
    log: list[Request]

    def serve(self, host: str, path: str, start: float) -> Request:
        """Answer a request to `host` (a host key) for `path` starting at virtual time `start`; log it."""


@dataclass
class Answer:
    """What a scripted host answers: a status after `seconds`, with a Retry-After or Location header or a body."""

    status: int | None
    seconds: float = 0.01
    retry_after: str | None = None
    body: str = ""
    location: str | None = None


Script = Callable[[str, str, int], Answer]  # (host key, path, how many requests that host had before) -> Answer


@dataclass
class VirtualBucketRun:
    """One bucket's hosts driven through the real `crawler.scheduling.HostScheduler` and the gates `gate_for` makes
    as `fetchd.bucketrun.BucketRun` drives them — prepare = robots.txt through the host's gate, dispatch = `start`
    then one request, `HostGate.finished` at the response's end with its Retry-After (read against the wall clock)
    and response time — against a `VirtualServer` whose response times and statuses come from a script.

    Why a second driver beside the daemon on the virtual clock (`fetch_virtually`): the randomized politeness
    simulation of `tests/test_scheduling.py` sends thousands of requests per case through gates the test makes
    itself (each host its own minimum delay, which the daemon only takes from config and fetch-list floors), and
    judges the scheduler's own reports; through the daemon every request also costs a WARC write and a thread round
    trip (seconds per case instead of milliseconds). Everything else drives the daemon itself, which the same rules
    hold exactly (`tests/test_fetchd.py`, `tests/test_fetchd_adaptive.py`, the per-IP and domain cases of
    `tests/test_scheduling.py`)."""

    rows: Iterable[dict[str, Any]]
    gate_for: Callable[[str], HostGate]
    server: VirtualServer
    seed: int = 0
    clock: VirtualClock = field(default_factory=VirtualClock)
    reports: list[Report] = field(default_factory=list)
    handed_out: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.rows = list(self.rows)
        self.sched = HostScheduler(self.gate_for, self.clock, self.reports.append)
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        for row in self.rows:  # fetch-list order: by host, then rank
            self.sched.add(row)

    def gate(self, host_key: str) -> HostGate:
        return self.sched.hosts[host_key].gate

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, action))

    def request(self, host: HostWork, path: str, done: Callable[[Request], None]) -> None:
        """One request (gate already taken): the response arrives at its end, which closes the gate."""
        request = self.server.serve(host.host_key, path, self.clock.now)

        def end() -> None:
            retry_after = None
            if request.status in THROTTLE_STATUSES:
                retry_after = parse_retry_after(request.retry_after, self.clock.wall())
            host.gate.finished(self.clock.now, request.status, retry_after, self.rng, request.end - request.start)
            done(request)

        self.at(request.end, end)

    def prepare(self, host: HostWork) -> None:
        """robots.txt through the host's gate, as `fetchd.hostprep.HostPreparer` does: the gate is open for a new host
        unless the per-IP guard of its address holds it, which is waited out (as `Exchange.gated_get` does)."""
        if not host.gate.can_start(self.clock.now):
            self.at(max(host.gate.opens_at(), self.clock.now + 0.01), lambda: self.prepare(host))
            return
        host.gate.started(self.clock.now)

        def done(request: Request) -> None:
            host.policy = policy_for_status(request.status, request.body, ROBOTS_TOKEN, ROBOTS_MAX_BYTES)
            host.gate.set_crawl_delay(host.policy.crawl_delay_s)
            self.sched.prepared(host)

        self.request(host, "/robots.txt", done)

    def run(self, max_steps: int = 200_000) -> None:
        """Until every URL is handed out or reported and every response has arrived."""
        for _ in range(max_steps):
            action = self.sched.next_ready()
            if isinstance(action, Prepare):
                self.prepare(action.host)
                continue
            if isinstance(action, Dispatch):
                item = self.sched.start(action.host)
                if item is not None:
                    self.handed_out.append(item)
                    path = item["url"][len(action.host.host_key):]
                    self.request(action.host, path, lambda _r, h=action.host: self.sched.finished(h))
                continue
            wake = self.clock.now + action if action is not None else math.inf
            when = min(wake, self.events[0][0] if self.events else math.inf)
            if when == math.inf:
                return
            self.clock.now = max(self.clock.now, when)
            while self.events and self.events[0][0] <= self.clock.now:
                heapq.heappop(self.events)[2]()
        raise AssertionError("the virtual run did not end")


# ---- the daemon itself on the virtual clock --------------------------------------------------------------------

REAL_WAIT_S = 0.002      # how long the loop looks for real events (a thread's result) before letting time pass
REAL_TIMEOUT_S = 120.0   # a virtual run that needs this much real time is stuck


class _VirtualSelector(selectors.BaseSelector):
    """A real selector whose `select(timeout)` lets virtual time pass instead of blocking, once the loop is idle."""

    def __init__(self, loop: VirtualTimeLoop):
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            events = self._real.select(0)
            if not events and self._loop.timer_due_now():
                self._loop.advance(0.0)  # asyncio runs a timer once the clock is past it: step past it
            return events
        give_up = time.monotonic() + REAL_TIMEOUT_S
        while time.monotonic() < give_up:
            if self._loop.idle():  # no thread work: nothing real can arrive but what already has
                events = self._real.select(0)  # a result delivered just before the work count dropped
                if events:
                    return events
                if timeout is None:
                    raise RuntimeError("the virtual loop has nothing scheduled and nothing pending: it would hang")
                self._loop.advance(timeout)
                return []
            events = self._real.select(REAL_WAIT_S)
            if events:
                return events
        raise RuntimeError(f"the virtual loop waited {REAL_TIMEOUT_S}s of real time for thread work")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a `VirtualClock`: its `time()` is the clock's, and when nothing is ready and no thread work
    (executor jobs, WARC writes) is pending, the clock jumps to the next timer. Thread work takes no virtual time."""

    def __init__(self, clock: VirtualClock):
        self.clock = clock
        self._executor_jobs = 0
        super().__init__(_VirtualSelector(self))
        self._clock_resolution = 0.0  # a timer runs once the clock is past it (by the least amount: `advance`)

    def time(self) -> float:
        return self.clock.now

    def timer_due_now(self) -> bool:
        """Nothing is ready to run but the next timer is at the clock's time exactly."""
        return not self._ready and bool(self._scheduled) and self._scheduled[0]._when <= self.clock.now

    def advance(self, timeout: float) -> None:
        """Let time pass to just past the next timer (its own time, so no rounding drift), at most `timeout`."""
        target = self.clock.now + timeout
        if self._scheduled:
            target = min(target, self._scheduled[0]._when)
        self.clock.now = math.nextafter(max(target, self.clock.now), math.inf)

    def run_in_executor(self, executor, func, *args):
        future = super().run_in_executor(executor, func, *args)
        self._executor_jobs += 1
        future.add_done_callback(self._executor_job_done)
        return future

    def _executor_job_done(self, _future: asyncio.Future) -> None:
        self._executor_jobs -= 1

    async def shutdown_default_executor(self, *args: Any) -> None:
        """Its thread joins the executor's threads: thread work the clock waits for, like an executor job."""
        self._executor_jobs += 1
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self._executor_jobs -= 1

    def idle(self) -> bool:
        return self._executor_jobs == 0 and writes_pending() == 0


def every_page_after(seconds: float) -> Script:
    """A script: robots.txt answers 404 (allow all) and every page 200, each after `seconds`."""
    return lambda _host, path, _earlier: Answer(404 if path == "/robots.txt" else 200, seconds)


def list_pages(root: str, segment_id: str, names: list[str], pages_per_host: int, buckets: int) -> list[str]:
    """Write a fetch list of `pages_per_host` pages on each host name; the URLs."""
    from tests.support.fetchlists import write_fetchlist

    pages = [f"http://{name}/page/{n}" for name in names for n in range(pages_per_host)]
    write_fetchlist(root, segment_id, [{"url": u} for u in pages], buckets)
    return pages


async def wait_until(predicate: Callable[[], bool], step_s: float = 0.01) -> None:
    """Look every `step_s` of virtual time until `predicate()` holds."""
    while not predicate():
        await asyncio.sleep(step_s)


def serve_virtually(conf: Any, root: str, clock: VirtualClock, transport: ScriptedTransport,
                    scenario: Callable[[threading.Event], Coroutine[Any, Any, None]]) -> None:
    """`fetchd.commands.serve_async` (its own loop, leases, files) on the virtual clock beside `scenario(stop)`, which
    acts at virtual moments (it may set `stop`, as SIGTERM does); `stop` is set when it ends, and this returns once
    the daemon has stopped."""
    from fetchd.commands import serve_async

    stop = threading.Event()

    async def main() -> None:
        daemon = asyncio.create_task(serve_async(conf, root, stop, clock, transport))
        try:
            await scenario(stop)
        finally:
            stop.set()
        await daemon

    run_virtual(clock, main)


def fetch_virtually(conf: Any, folder: str, items: list[dict[str, Any]], script: Script, seed: int = 0
                    ) -> ScriptedTransport:
    """Fetch a segment of `items` (fetch-list items, `fetchlists.write_fetchlist`) with the daemon itself
    (`fetchd.daemon.Daemon`: its bucket runs, host preparation, gates from `conf`, files in a new crawl root under
    `folder`) on a new virtual clock, against `script`; the transport, whose log is the server's view. The gates'
    jitter is drawn from `random.Random(seed)`, and the daemon starts with no host memory (each call is a fresh
    process)."""
    from fetchd.daemon import Daemon
    from fetchd.hostprep import forget_hosts
    from tests.support.fetchlists import write_fetchlist

    segment_id = "seg-virtual"
    root = tempfile.mkdtemp(prefix="virtual-", dir=folder)
    buckets = sorted(write_fetchlist(root, segment_id, items, conf.crawl.buckets, Bucketing.from_config(conf)))
    clock = VirtualClock()
    transport = ScriptedTransport(script, clock)
    forget_hosts()

    async def main() -> None:
        daemon = Daemon(conf, root, clock=clock, transport=transport)
        daemon.services.rng.seed(seed)
        await daemon.open()
        try:
            assert all(daemon.owned.acquire(bucket) for bucket in buckets)
            manifests = await daemon.fetch_buckets(segment_id, buckets)
            assert [m["bucket"] for m in manifests] == buckets, "a bucket was left unfinished"
        finally:
            await daemon.close()

    run_virtual(clock, main)
    return transport


def run_virtual(clock: VirtualClock, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run `main()` to its end on a new `VirtualTimeLoop` over `clock`."""
    loop = VirtualTimeLoop(clock)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


@dataclass
class ScriptedTransport:
    """A `fetchd.fetcher.Transport` answering from a script on the virtual clock: a request takes its answer's
    seconds of virtual time (a cancelled one ends when it is cancelled). The log is the server's view."""

    script: Script
    clock: VirtualClock
    log: list[Request] = field(default_factory=list)

    async def get(self, url: str, headers: dict[str, str] | None = None, max_bytes: int | None = None, *,
                  page: bool = False) -> FetchResponse:
        key = host_key(url)
        path = url[len(key):] or "/"
        answer = self.script(key, path, sum(1 for r in self.log if r.host == key))
        request = Request(key, path, self.clock.now, None, answer.status, answer.retry_after, body=answer.body)
        self.log.append(request)
        started_at = self.clock.wall()
        try:
            await asyncio.sleep(answer.seconds)
        finally:
            request.end = self.clock.now
        if answer.status is None:
            return FetchResponse(url=url, started_at=started_at, elapsed_ms=round(answer.seconds * 1000),
                                 error="ConnectionResetError: scripted")
        response_headers = [("Content-Type", "text/plain" if path == "/robots.txt" else "text/html")]
        if answer.retry_after is not None:
            response_headers.append(("Retry-After", answer.retry_after))
        if answer.location is not None:
            response_headers.append(("Location", answer.location))
        body = (answer.body or f"<html><title>{path}</title></html>").encode()
        return FetchResponse(url=url, started_at=started_at, elapsed_ms=round(answer.seconds * 1000),
                             status=answer.status, reason="scripted", headers=response_headers, body=body,
                             remote_ip="127.0.0.1", request_path=path,
                             request_headers=[("Host", key.removeprefix("http://")), *(headers or {}).items()])

    async def close(self) -> None:
        return None

    def requests(self, host: str, pages_only: bool = False) -> list[Request]:
        return [r for r in self.log if r.host == host and not (pages_only and r.path == "/robots.txt")]
