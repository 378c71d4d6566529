"""SIGTERM: a `fetchd serve` daemon, or a `crawl fetch` (the DAG's task-mode fetch, stopped by `timeout`), lets
its requests in flight finish (within `ownership.shutdown_grace_s`), publishes its results, closes its WARC files
and releases its buckets; a new daemon takes them at once and fetches only what is left, so nothing is requested
twice (judged from the farm's own log)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from crawler import config, layout
from fetchd.daemon import pending_work
from fetchd.ownership import LeaseStore
from fetchd.sitefarm import FarmSpec, SiteFarm, politeness_violations, read_request_log
from tests.test_fetchd import files_under, read_results, record_at, write_fetchlist

BUCKETS = 2
MIN_DELAY = 0.2
PROJECT = Path(__file__).resolve().parents[1]
SEGMENT = "seg-term"


def _slow_farm(log_path: Path) -> SiteFarm:
    """4 hosts whose responses take 0.15 s, so a stop always finds requests in flight."""
    return SiteFarm(FarmSpec(hosts=4, pages_per_host=12, cross_host_links=False, latency_s=0.15), log_path)


def _segment_and_config(farm: SiteFarm, root: str, segment: str, conf_path: Path, fetch: dict) -> list[str]:
    """Write the fetch list of every page of the farm and the daemon's config; the pages, sorted."""
    pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
    write_fetchlist(root, segment, [{"url": u} for u in pages], BUCKETS)
    conf_path.write_text(yaml.safe_dump({
        "crawl": {"buckets": BUCKETS},
        "politeness": {"min_delay_s": MIN_DELAY},
        "fetch": {"static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"], **fetch},
        "ownership": {"lease_ttl_s": 30.0, "renew_interval_s": 5.0, "shutdown_grace_s": 5.0, "fence_margin_s": 10.0},
    }))
    return pages


def _sigterm_mid_fetch(process: subprocess.Popen, farm: SiteFarm) -> str:
    """SIGTERM once the farm has logged 12 requests; the process's stderr. It must end within the grace (5 s)
    plus the time to close its files."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(read_request_log(farm.log_path)) < 12:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    _, stderr = process.communicate(timeout=20)
    assert time.monotonic() - stopped_at < 5.0 + 3.0
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
