"""`fetch.processes`: one fetch as several daemon processes sharing the buckets through leases. Every URL is
requested once, every host by one process only (its bucket's lease holder), politeness holds across them (judged
from the farm's own log), the results name each process's daemon; and a fetch killed outright takes its child
processes with it (nothing more reaches the farm), as a single killed daemon would."""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from crawler import urls
from fetchd.commands import exit_status, fetch_segment, serve, stop_on_signals
from fetchd.processes import run_in_processes, shares
from fetchd.progress import pending_work
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.fetchlists import read_results, write_fetchlist
from tests.support.servers import free_port

BUCKETS = 4
MIN_DELAY = 0.2
PROJECT = Path(__file__).resolve().parents[1]


# Pages per host for the tests where both processes must fetch: each process holds at most two of the four
# buckets at once, so the first would take all four if it could finish its first two before the spawned second
# process is up (seconds on a loaded machine: a fresh clone's suite once took longer than 3.5 s); at 40 pages every
# host keeps its bucket busy for 8 s or more.
OUTLASTS_A_SPAWN = 40


def _farm(log_path: Path, latency_s: float = 0.02, pages_per_host: int = 6) -> SiteFarm:
    return SiteFarm(FarmSpec(hosts=8, pages_per_host=pages_per_host, cross_host_links=False, latency_s=latency_s),
                    log_path)


def _pages(farm: SiteFarm) -> list[str]:
    return sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)


def test_shares_deal_every_bucket_once():
    assert shares([3, 5, 8, 9, 11], 2) == [[3, 8, 11], [5, 9]]
    assert shares([7], 4) == [[7]]
    assert shares([], 3) == [[]]


def test_two_processes_fetch_each_url_once_and_each_host_from_one_process(base_conf, root, tmp_path):
    farm = _farm(tmp_path / "farm.jsonl", pages_per_host=OUTLASTS_A_SPAWN)
    farm.start()
    try:
        pages = _pages(farm)
        listed = write_fetchlist(root, "seg-procs", [{"url": u} for u in pages], BUCKETS)
        conf = base_conf.with_overrides({
            "crawl.buckets": BUCKETS, "politeness.min_delay_s": MIN_DELAY, "fetch.processes": 2,
            "fetch.static_hosts": farm.static_hosts(), "fetch.daemon_id": "multi"})
        summary = fetch_segment(conf, root, "seg-procs")
    finally:
        farm.stop()
    assert exit_status(summary) == 0 and "failed_processes" not in summary
    assert len(listed) >= 2 and sorted(summary["buckets"]) == sorted(listed) and summary["held_buckets"] == []
    rows = read_results(root, "seg-procs")
    assert Counter(r["url"] for r in rows) == Counter(pages)
    daemons_per_host: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        daemons_per_host[urls.host_key(row["url"])].add(row["daemon_id"])
    assert all(len(daemons) == 1 for daemons in daemons_per_host.values()), daemons_per_host
    assert {d for ds in daemons_per_host.values() for d in ds} == {"multi", "multi.1"}
    log = read_request_log(farm.log_path)
    assert max(Counter((r["host"], r["path"]) for r in log if r["path"] != "/robots.txt").values()) == 1
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []


def test_a_killed_fetch_takes_its_processes_with_it(tmp_path):
    root = str(tmp_path / "root")
    farm = _farm(tmp_path / "farm.jsonl", latency_s=0.15)
    farm.start()
    try:
        pages = _pages(farm)
        write_fetchlist(root, "seg-kill", [{"url": u} for u in pages], BUCKETS)
        conf_path = tmp_path / "crawl.yaml"
        conf_path.write_text(yaml.safe_dump({
            "crawl": {"buckets": BUCKETS}, "politeness": {"min_delay_s": 1.0},
            "fetch": {"static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"], "processes": 2}}))
        process = subprocess.Popen([sys.executable, "-m", "fetchd.cli", "fetch", "--segment", "seg-kill", "--root",
                                    root, "--config", str(conf_path)], cwd=str(PROJECT),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len({r["host"] for r in read_request_log(farm.log_path)}) < 8:
            time.sleep(0.05)  # both processes are fetching (every host has been asked something)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        time.sleep(0.5)  # responses in flight at the kill end (0.15 s each)
        seen = len(read_request_log(farm.log_path))
        time.sleep(2 * 1.0 + 0.5)  # past two delays: a surviving process would have asked again by now
        after = read_request_log(farm.log_path)
    finally:
        farm.stop()
    assert len({r["host"] for r in after}) == 8
    assert len(after) == seen < len(pages)


def test_one_endpoint_serves_every_process_and_a_stop_ends_them_all(base_conf, root, tmp_path):
    """`serve` with two processes and `fetch.metrics_port`: the first process's /metrics carries both daemons'
    series (the other leaves its figures for it), their fetch counters add up to the published results, and a
    stop ends both (the caller returns only once its child has). The fetch list is published only once both
    daemons report, so each takes its share of the buckets however long the second one took to start (the
    first would otherwise take all four if it finished its two before the second was up)."""
    farm = _farm(tmp_path / "farm.jsonl", pages_per_host=OUTLASTS_A_SPAWN)
    farm.start()
    port = free_port()
    conf = base_conf.with_overrides({
        "crawl.buckets": BUCKETS, "politeness.min_delay_s": MIN_DELAY, "fetch.processes": 2,
        "fetch.static_hosts": farm.static_hosts(), "fetch.daemon_id": "scraped", "fetch.metrics_port": port,
        "fetch.poll_interval_s": 0.2})
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(conf, root, stop), daemon=True)
    thread.start()
    listed: dict[int, list[dict]] = {}
    try:
        deadline = time.monotonic() + 90
        totals: dict[str, float] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                if not listed and set(re.findall(r'daemon="([^"]+)"', text)) == {"scraped", "scraped.1"}:
                    listed = write_fetchlist(root, "seg-metrics", [{"url": u} for u in _pages(farm)], BUCKETS)
                elif listed:
                    totals = defaultdict(float)
                    for daemon, value in re.findall(r'^fetchd_fetches_total\{daemon="([^"]+)",[^}]*\} (\S+)$', text,
                                                    re.M):
                        totals[daemon] += float(value)
                    if not pending_work(root) and sum(totals.values()) == len(read_results(root, "seg-metrics")):
                        break
            time.sleep(0.3)
    finally:
        stop.set()
        thread.join(60)
        farm.stop()
    assert not thread.is_alive()
    assert not pending_work(root) and len(listed) >= 3  # more buckets than one process's share
    assert set(totals) == {"scraped", "scraped.1"} and all(totals.values())
    # Each process reports its own process figures and build under its own label.
    for series in ("process_cpu_seconds_total", "process_resident_memory_bytes", "fetchd_build_info"):
        assert set(re.findall(rf'^{series}\{{daemon="([^"]+)"', text, re.M)) == {"scraped", "scraped.1"}, series
    assert sum(totals.values()) == len(read_results(root, "seg-metrics"))
    assert not multiprocessing.active_children()


def _stopped_in_its_work(start_after_s: float) -> tuple[bool, list[int]]:
    """A child's work (module level, for `spawn`) that handles the stop signals only after `start_after_s`: as a
    daemon process does once it is up."""
    time.sleep(start_after_s)
    stop = threading.Event()
    with stop_on_signals(stop) as received:
        stopped = stop.wait(60)
    return stopped, list(received)


def test_a_stop_forwarded_while_a_child_starts_reaches_its_work_instead_of_killing_it():
    """The stop is set before the children start, so the forwarder sends SIGTERM as soon as each has a pid, long
    before its work handles the signal: the child must still stop through its work and report, not die of the
    signal's default action with nothing reported."""
    stop = threading.Event()
    stop.set()
    mine, returned, failures = run_in_processes(stop, lambda: "first", [(_stopped_in_its_work, (1.0,))] * 2)
    assert (mine, failures) == ("first", [])
    assert returned == [(True, [signal.SIGTERM])] * 2
