"""SIGTERM: a `fetchd serve` daemon, or a `crawl fetch` (the DAG's task-mode fetch, stopped by `timeout`), lets
its requests in flight finish (within `ownership.shutdown_grace_s`), publishes its results, closes its WARC files
and releases its buckets; a new daemon takes them at once and fetches only what is left, so nothing is requested
twice (judged from the farm's own log). How soon it stops is checked exactly with the daemon's own loop on the
virtual clock; the real processes are only held to a generous bound on the test itself."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from crawler import config, layout, urls
from fetchd.daemon import Daemon
from fetchd.hostprep import thread_memory
from fetchd.ownership import LeaseStore
from fetchd.progress import pending_work
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support import virtual
from tests.support.config import TEST_OVERRIDES
from tests.support.fetchlists import files_under, read_results, record_at, write_fetchlist

BUCKETS = 2
MIN_DELAY = 0.2
PROJECT = Path(__file__).resolve().parents[1]
SEGMENT = "seg-term"
STOP_POLL_S = 0.5  # how often a bucket run and its drain look whether to stop (fetchd.exchange.STOP_POLL_S)


def _slow_farm(log_path: Path) -> SiteFarm:
    """4 hosts whose responses take 0.15 s, so a stop always finds requests in flight."""
    return SiteFarm(FarmSpec(hosts=4, pages_per_host=12, cross_host_links=False, latency_s=0.15), log_path)


def _segment_and_config(farm: SiteFarm, root: str, segment: str, conf_path: Path, fetch: dict) -> list[str]:
    """Write the fetch list of every page of the farm and the daemon's config; the pages, sorted."""
    pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
    write_fetchlist(root, segment, [{"url": u} for u in pages], BUCKETS)
    conf_path.write_text(yaml.safe_dump({
        "crawl": {"buckets": BUCKETS},
        # The test config's takeover wait (tests/support/config.py), not the 60 s default.
        "politeness": {"min_delay_s": MIN_DELAY, "max_crawl_delay_s": TEST_OVERRIDES["politeness.max_crawl_delay_s"]},
        "fetch": {"static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"], **fetch},
        "ownership": {"lease_ttl_s": 30.0, "renew_interval_s": 5.0, "shutdown_grace_s": 5.0, "fence_margin_s": 10.0},
    }))
    return pages


def _sigterm_mid_fetch(process: subprocess.Popen, farm: SiteFarm) -> str:
    """SIGTERM once the farm has logged 12 requests; the process's stderr (it must end: 60 s bound the test, the
    rule's bound is the virtual-clock twin's)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(read_request_log(farm.log_path)) < 12:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    return stderr


def _left_cleanly(root: str, segment: str, pages: list[str]) -> list[dict]:
    """What a stopped fetch leaves: closed files only, some rows published, the segment unfinished (no
    _DONE.json), every lease released; the published rows."""
    assert not [f for f in files_under(layout.segment_dir(root, segment)) if f.endswith((".open", ".tmp"))]
    partial = read_results(root, segment)
    assert 0 < len(partial) < len(pages)
    assert pending_work(root)
    store = LeaseStore(config.load(), root, "observer")
    assert all(store.latest(b).released for b in range(BUCKETS) if store.latest(b))
    return partial


def test_sigterm_drains_publishes_releases_and_a_successor_repeats_nothing(tmp_path):
    root = str(tmp_path / "root")
    farm = _slow_farm(tmp_path / "farm.jsonl")
    farm.start()
    try:
        conf_path = tmp_path / "daemon.yaml"
        pages = _segment_and_config(farm, root, SEGMENT, conf_path, {"daemon_id": "first", "poll_interval_s": 0.3})
        args = [sys.executable, "-m", "fetchd.cli", "serve", "--root", root, "--config", str(conf_path)]
        process = subprocess.Popen(args, cwd=str(PROJECT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        stderr = _sigterm_mid_fetch(process, farm)
        assert process.returncode == 0
        assert "stopped before finishing" in stderr
        _left_cleanly(root, SEGMENT, pages)

        # A new daemon takes the buckets at once (no lease expiry to wait for) and fetches only what is left.
        conf_path.write_text(conf_path.read_text().replace("daemon_id: first", "daemon_id: second"))
        second = subprocess.Popen(args, cwd=str(PROJECT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and pending_work(root):
                time.sleep(0.1)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(20) == 0
    finally:
        farm.stop()
    assert not pending_work(root)
    rows = read_results(root, SEGMENT)
    assert Counter(r["url"] for r in rows) == Counter(pages)
    log = read_request_log(farm.log_path)
    pages_requested = Counter((r["host"], r["path"]) for r in log if r["path"] != "/robots.txt")
    assert max(pages_requested.values()) == 1  # in-flight requests finished before the stop: nothing repeated
    assert sum(1 for r in log if r["path"] == "/robots.txt") == len(farm.host_keys())  # published robots reused
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []


def test_crawl_fetch_stops_cleanly_on_sigterm_and_the_next_fetch_completes_the_segment(tmp_path):
    root = str(tmp_path / "root")
    segment = "seg-fetch-term"
    farm = _slow_farm(tmp_path / "farm.jsonl")
    farm.start()
    try:
        conf_path = tmp_path / "crawl.yaml"
        pages = _segment_and_config(farm, root, segment, conf_path, {})
        args = [sys.executable, "-m", "jobs.cli", "fetch", "--segment", segment, "--root", root,
                "--config", str(conf_path)]
        process = subprocess.Popen(args, cwd=str(PROJECT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr = _sigterm_mid_fetch(process, farm)
        assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert "stopped by SIGTERM" in stderr and "stopped before finishing" in stderr
        for row in [r for r in _left_cleanly(root, segment, pages) if r["warc_filename"]]:
            # published rows point into closed WARC files
            assert record_at(root, row["warc_filename"], row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]

        again = subprocess.run(args, cwd=str(PROJECT), capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        farm.stop()
    assert not pending_work(root)
    assert Counter(r["url"] for r in read_results(root, segment)) == Counter(pages)  # no URL reported twice
    log = read_request_log(farm.log_path)
    assert max(Counter((r["host"], r["path"]) for r in log if r["path"] != "/robots.txt").values()) == 1


@pytest.mark.parametrize(("answer_s", "grace_s"), [(0.15, 5.0), (4.0, 1.0)], ids=["drained", "grace-ran-out"])
def test_a_stopped_daemon_starts_nothing_more_and_ends_within_the_grace_on_the_virtual_clock(base_conf, root,
                                                                                            answer_s, grace_s):
    """`serve_async` on the virtual clock, stopped (what SIGTERM does) at time T: no request starts after T; the
    daemon has ended by T + the bucket run's stop poll + what is left of the requests in flight, or, when they
    outlast `ownership.shutdown_grace_s`, the grace and the drain's next look (then they are cancelled and their
    URLs stay unreported); every lease is released and every finished request's result is published."""
    clock = virtual.VirtualClock()
    names = [f"h{i}.test" for i in range(4)]
    pages = virtual.list_pages(root, SEGMENT, names, 12, BUCKETS)
    conf = base_conf.with_overrides({
        "crawl.buckets": BUCKETS, "politeness.min_delay_s": MIN_DELAY,
        "fetch.static_hosts": dict.fromkeys(names, "127.0.0.1"), "fetch.poll_interval_s": 0.3,
        "ownership.lease_ttl_s": 30.0, "ownership.renew_interval_s": 5.0, "ownership.shutdown_grace_s": grace_s,
        "ownership.fence_margin_s": 10.0, "fetch.daemon_id": "virtual"})
    transport = virtual.ScriptedTransport(virtual.every_page_after(answer_s), clock)
    seen: dict = {}

    async def stop_mid_fetch(stop: threading.Event) -> None:
        await virtual.wait_until(lambda: len(transport.log) >= 12)
        seen["stopped_at"] = clock.now
        stop.set()

    virtual.serve_virtually(conf, root, clock, transport, stop_mid_fetch)
    seen["ended_at"] = clock.now
    stopped_at, took = seen["stopped_at"], seen["ended_at"] - seen["stopped_at"]

    def answered(request: virtual.Request) -> bool:  # got its whole answer (the clock steps past a timer by 1 ulp)
        return request.end - request.start >= answer_s - 1e-9
    assert max(r.start for r in transport.log) <= stopped_at
    in_flight = [r for r in transport.log if r.start <= stopped_at < r.start + answer_s]
    assert in_flight  # the stop found requests in flight
    if answer_s < grace_s:
        assert took <= STOP_POLL_S + answer_s
        assert all(map(answered, in_flight))  # waited for
    else:
        assert grace_s <= took <= STOP_POLL_S + grace_s + STOP_POLL_S
        assert not any(map(answered, in_flight))  # cut at the end of the grace
    published = {r["url"] for r in _left_cleanly(root, SEGMENT, pages)}
    assert published == {r.host + r.path for r in transport.log if r.path != "/robots.txt" and answered(r)}


async def _fetch_until(conf, root: str, clock: virtual.VirtualClock, transport: virtual.ScriptedTransport,
                       segment_id: str, bucket: int, stop_at: float) -> list:
    """One daemon's fetch of a bucket on the virtual clock, stopped as by SIGTERM at `stop_at` unless it ended
    first (requests in flight get the grace, then are cancelled): the manifests of the buckets it finished."""
    stop = threading.Event()
    daemon = Daemon(conf, root, stop, clock=clock, transport=transport)
    await daemon.open()
    try:
        assert daemon.owned.acquire(bucket)
        run = asyncio.ensure_future(daemon.fetch_buckets(segment_id, [bucket]))
        await virtual.wait_until(lambda: run.done() or clock.now >= stop_at, 0.1)
        stop.set()
        return await run
    finally:
        await daemon.close()


def test_a_stop_that_cuts_a_robots_request_leaves_the_bucket_unfinished_for_its_next_run(base_conf, root):
    """A stop whose grace ends while a host's robots.txt is in flight: the host's URLs are neither requested nor
    reported (no `deferred` row, no `_DONE.json`), so the bucket's next run fetches them in this segment."""
    site = "http://slow-robots.test"
    conf = base_conf.with_overrides({"crawl.buckets": BUCKETS, "ownership.shutdown_grace_s": 1.0,
                                     "politeness.min_delay_s": 0.1,
                                     "fetch.static_hosts": {"slow-robots.test": "127.0.0.1"}})
    clock = virtual.VirtualClock()
    transport = virtual.ScriptedTransport(lambda host, path, _earlier: virtual.Answer(
        404 if path == "/robots.txt" else 200, 30.0 if path == "/robots.txt" else 0.01), clock)
    [bucket] = write_fetchlist(root, SEGMENT, [{"url": f"{site}/a"}, {"url": f"{site}/b"}], BUCKETS)

    async def main() -> None:
        assert await _fetch_until(conf, root, clock, transport, SEGMENT, bucket, stop_at=clock.now + 5.0) == []
        assert [r["outcome"] for r in read_results(root, SEGMENT)] == []
        assert pending_work(root) == {bucket: [SEGMENT]}
        [manifest] = await _fetch_until(conf, root, clock, transport, SEGMENT, bucket, stop_at=clock.now + 300.0)
        assert manifest["outcomes"] == {"success": 2}
        assert [r.path for r in transport.log] == ["/robots.txt", "/robots.txt", "/a", "/b"]

    virtual.run_virtual(clock, main)


def test_a_robots_request_on_another_buckets_host_cut_by_a_stop_leaves_that_hosts_gate_open(base_conf, root):
    """a.test's robots.txt redirects to b.test's (another bucket, free, so the daemon follows it); the daemon is
    stopped while that request is in flight and its grace runs out. Gates outlive bucket runs (the thread's host
    memory), so b.test's gate must not count the cancelled request: b.test's own bucket, run next in this process,
    fetches its page instead of waiting for a gate that never opens while it renews its lease."""
    a, b = "http://a.test", "http://b.test"
    buckets = next(n for n in range(4, 64) if urls.bucket_of(a, n) != urls.bucket_of(b, n))
    conf = base_conf.with_overrides({"crawl.buckets": buckets, "ownership.shutdown_grace_s": 1.0,
                                     "politeness.min_delay_s": 0.1,
                                     "fetch.static_hosts": {"a.test": "127.0.0.1", "b.test": "127.0.0.1"}})

    def script(host: str, path: str, _earlier: int) -> virtual.Answer:
        if (host, path) == (a, "/robots.txt"):
            return virtual.Answer(301, 0.01, location=f"{b}/robots.txt")
        if (host, path) == (b, "/robots.txt"):
            return virtual.Answer(404, 30.0)  # still in flight when the stop's grace ends
        return virtual.Answer(200, 0.01)

    clock = virtual.VirtualClock()
    transport = virtual.ScriptedTransport(script, clock)
    [bucket_a] = write_fetchlist(root, "seg-1", [{"url": f"{a}/page"}], buckets)
    [bucket_b] = write_fetchlist(root, "seg-2", [{"url": f"{b}/page"}], buckets)

    async def main() -> None:
        assert await _fetch_until(conf, root, clock, transport, "seg-1", bucket_a, stop_at=clock.now + 5.0) == []
        assert [r.path for r in transport.log if r.host == b] == ["/robots.txt"]  # the hop was made, then cut
        assert thread_memory().gates[b].in_flight == 0
        start = clock.now
        manifests = await _fetch_until(conf, root, clock, transport, "seg-2", bucket_b, stop_at=start + 120.0)
        assert [m["bucket"] for m in manifests] == [bucket_b]
        assert [r.path for r in transport.log if r.host == b and r.start >= start] == ["/robots.txt", "/page"]

    virtual.run_virtual(clock, main)


def test_a_stop_while_waiting_for_a_request_slot_sends_nothing_more_and_cuts_the_slot_holder_at_its_grace(
        base_conf, root):
    """One request slot (fetch.concurrency 1), two hosts of one bucket with a 30 s page each: one page holds the
    slot, the other host waits for it. A stop then must not wait for the slot: the bucket run stops dispatching at
    once, the page in flight is cut at the end of its grace, and no request starts after the stop."""
    grace_s = 1.0
    a = "http://a.test"
    b = next(h for h in (f"http://{n}.test" for n in range(64))
             if urls.bucket_of(h, BUCKETS) == urls.bucket_of(a, BUCKETS))
    conf = base_conf.with_overrides({"crawl.buckets": BUCKETS, "fetch.concurrency": 1,
                                     "ownership.shutdown_grace_s": grace_s, "politeness.min_delay_s": 0.1,
                                     "fetch.static_hosts": {h.removeprefix("http://"): "127.0.0.1" for h in (a, b)}})
    clock = virtual.VirtualClock()
    transport = virtual.ScriptedTransport(lambda host, path, _earlier: virtual.Answer(
        404 if path == "/robots.txt" else 200, 0.01 if path == "/robots.txt" else 30.0), clock)
    [bucket] = write_fetchlist(root, SEGMENT, [{"url": f"{a}/page"}, {"url": f"{b}/page"}], BUCKETS)
    stop_at = clock.now + 5.0

    async def main() -> None:
        assert await _fetch_until(conf, root, clock, transport, SEGMENT, bucket, stop_at=stop_at) == []
        took = clock.now - stop_at
        assert grace_s <= took <= STOP_POLL_S + grace_s + STOP_POLL_S
        pages = [r for r in transport.log if r.path == "/page"]
        assert len(pages) == 1 and max(r.start for r in transport.log) < stop_at

    virtual.run_virtual(clock, main)
