"""A full disk under a running daemon: the storage root lives on a small tmpfs that a filler file fills up.

The daemon must stop fetching the moment it cannot write (nothing is fetched that cannot be stored), say so in
`/status`, retry on its own, and once space is freed resume from what is durable: every URL ends with exactly one
result pointing at a readable record, and the only repeated requests are the few in flight when the disk filled.
Needs permission to mount a tmpfs: runs as root (as CI does), is skipped otherwise with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from crawler import layout
from fetchd.progress import pending_work
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.fetchlists import files_under, read_results, record_at, write_fetchlist
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[1]
SEGMENT = "seg-disk"
MIN_DELAY = 0.1


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs. As root (CI runs as root) a failed mount fails the test; without root it is skipped, saying
    why."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = f"cannot mount a tmpfs here ({done.stderr.strip() or f'mount exited {done.returncode}'})"
        if os.geteuid() == 0:
            pytest.fail(f"{why} although this process runs as root")
        pytest.skip(f"{why}: mounting needs root, and this process runs as uid {os.geteuid()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        return json.loads(response.read())


def _fill(path: Path, leave_bytes: int) -> None:
    stats = os.statvfs(path.parent)
    size = max(0, stats.f_bavail * stats.f_frsize - leave_bytes)
    with path.open("wb") as fh:
        fh.truncate(0)
        chunk = b"\0" * (1 << 16)
        while size > 0:
            try:
                fh.write(chunk[:size])
                fh.flush()
            except OSError:
                break
            size -= len(chunk)


def test_a_full_disk_pauses_fetching_and_the_daemon_resumes_when_space_returns(tmp_path, small_disk):
    root = small_disk / "root"
    farm = SiteFarm(FarmSpec(hosts=4, pages_per_host=30, cross_host_links=False), tmp_path / "farm.jsonl")
    farm.start()
    port = free_port()
    process = None
    try:
        pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
        write_fetchlist(str(root), SEGMENT, [{"url": u} for u in pages], 2)
        conf_path = tmp_path / "daemon.yaml"
        conf_path.write_text(yaml.safe_dump({
            "crawl": {"buckets": 2},
            "politeness": {"min_delay_s": MIN_DELAY},
            "fetch": {"static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"], "poll_interval_s": 0.3,
                      "warc_max_bytes": 20000, "storage_retry_s": 0.2, "storage_retry_max_s": 0.5,
                      "metrics_port": port, "processes": 1},  # one daemon: its own gauges say when it paused
            "ownership": {"results_batch_rows": 2},
        }))
        filler = small_disk / "filler"
        _fill(filler, leave_bytes=120_000)  # room for a few pages' WARC records and result files, not for all
        process = subprocess.Popen(
            [sys.executable, "-m", "fetchd.cli", "serve", "--root", str(root), "--config", str(conf_path)],
            cwd=str(PROJECT), stdout=subprocess.DEVNULL, stderr=(tmp_path / "daemon.log").open("w"))

        deadline = time.monotonic() + 60
        status: dict = {}
        while time.monotonic() < deadline:
            try:
                status = _status(port)
            except OSError:
                status = {}
            paused = status.get("gauges", {}).get("storage_paused_buckets", 0)
            # Each bucket pauses when its own write fails: wait until every bucket with work left has.
            if paused >= 1 and paused >= len(pending_work(str(root))):
                break
            time.sleep(0.1)
        assert status["gauges"]["storage_paused_buckets"] >= 1, "the disk never filled"
        assert status["gauges"]["storage_paused_buckets"] >= len(pending_work(str(root))), "a bucket never paused"
        paused_seen = time.time()
        assert pending_work(str(root))

        time.sleep(3.0)  # several probe writes fail meanwhile; nothing may be fetched
        still = _status(port)
        assert still["gauges"]["storage_paused_buckets"] >= 1 and still["counters"]["storage_errors"] >= 1
        freed_at = time.time()
        filler.unlink()

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and pending_work(str(root)):
            time.sleep(0.2)
        assert not pending_work(str(root))
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        farm.stop()

    log = read_request_log(farm.log_path)
    # Nothing was fetched while the daemon could not store it (a request already in flight may end just after).
    assert not [r for r in log if paused_seen + 0.5 < r["start"] < freed_at]
    rows = read_results(str(root), SEGMENT)
    assert Counter(r["url"] for r in rows) == Counter(pages)
    assert {r["outcome"] for r in rows} <= {"success", "robots_denied"}
    for row in [r for r in rows if r["outcome"] == "success"]:
        assert record_at(str(root), row["warc_filename"], row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]
    assert not [f for f in files_under(layout.segment_dir(str(root), SEGMENT)) if f.endswith((".open", ".tmp"))]
    requested = Counter((r["host"], r["path"]) for r in log if r["path"] != "/robots.txt")
    repeats_by_host = Counter(host for (host, _path), n in requested.items() for _ in range(n - 1))
    # Per host, at most two fetches were not durable when writing failed: the request in flight, and the one
    # before it, whose result record (written after its exchange, and not awaited) may not have reached the
    # disk yet: its next request starts without waiting for that write. Both are fetched again.
    assert max(repeats_by_host.values(), default=0) <= 2, repeats_by_host
    repeats = sum(repeats_by_host.values())
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []
    print(f"\nrepeated requests after the disk filled: {repeats}")
