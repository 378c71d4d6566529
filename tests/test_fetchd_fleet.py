"""Three `fetchd serve` daemons sharing two overlapping segments through bucket leases.

One daemon is frozen (SIGSTOP) until its leases lapse and another daemon has taken its buckets, then woken: it
must find itself fenced and send nothing more to those hosts. Another is killed with SIGKILL mid-way; its
buckets are taken over and resumed. The third ends with SIGTERM. Politeness is judged from the farm's own log
over all daemons together; every URL must end with exactly one result, and the only repeated requests are the
ones the frozen and the killed daemon had in flight.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from crawler import config, layout, urls
from fetchd.ownership import LeaseStore, leases_dir
from fetchd.progress import pending_work
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.config import TEST_OVERRIDES
from tests.support.fetchlists import files_under, read_results, write_fetchlist

pytestmark = pytest.mark.slow

BUCKETS = 6
MIN_BUSY_BUCKETS = 5  # buckets with work: more than one daemon's max_buckets_per_daemon (3)
MIN_DELAY = 0.2
PROJECT = Path(__file__).resolve().parents[1]
# A daemon's log lines saying it lost a bucket's lease (fetchd.ownership, and the fetch that stopped for it).
LOST_BUCKET = re.compile(r"lost bucket (\d+)|bucket (\d+) of \S+: lease lost")


def _conf_file(tmp: Path, name: str, farm: SiteFarm) -> str:
    data = {
        "crawl": {"buckets": BUCKETS, "user_agent": f"cyclecrawl-test/{name} (+http://127.0.0.1/contact)"},
        # The test config's takeover wait (tests/support/config.py), not the 60 s default.
        "politeness": {"min_delay_s": MIN_DELAY, "max_crawl_delay_s": TEST_OVERRIDES["politeness.max_crawl_delay_s"]},
        "fetch": {"daemon_id": name, "static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"],
                  "poll_interval_s": 0.3, "progress_interval_s": 2.0, "total_timeout_s": 5.0,
                  "processes": 1},  # one process per daemon: SIGSTOP and kill act on a whole daemon
        # Short leases, so a freeze is taken over while b still has work left to be killed in (a longer lease let b
        # finish its buckets first).
        "ownership": {"lease_ttl_s": 3.0, "renew_interval_s": 0.5, "fence_margin_s": 1.0, "takeover_grace_s": 0.3,
                      "max_buckets_per_daemon": 3, "shutdown_grace_s": 2.0, "results_batch_rows": 3},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _start(root: str, conf: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fetchd.cli", "serve", "--root", root, "--config", conf],
                            cwd=str(PROJECT), stdout=subprocess.DEVNULL, stderr=log.open("w"))


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _by_agent(farm: SiteFarm, name: str) -> list[dict]:
    return [r for r in read_request_log(farm.log_path) if f"/{name} " in r["user_agent"]]


def _owned_by(root: str, owner: str) -> list[int]:
    store = LeaseStore(config.load(), root, "observer")
    return [b for b in range(BUCKETS) if (rec := store.latest(b)) and rec.owner == owner and not rec.released]


def _spread_farm(tmp_path: Path, attempts: int = 20) -> tuple[SiteFarm, list[str]]:
    """A started farm whose pages fill at least MIN_BUSY_BUCKETS buckets, and those pages: a daemon holds at most 3,
    so the later daemons must find work the first cannot hold. A host key carries its port, so the buckets a farm
    fills change with the ports it gets. Only pages that answer 200: a followed redirect would fetch its target
    twice across the two segments by design (once as a hop, once as a listed URL), which is not what this test
    counts."""
    for attempt in range(attempts):
        farm = SiteFarm(FarmSpec(hosts=12, pages_per_host=16, cross_host_links=False),
                        tmp_path / f"farm-{attempt}.jsonl")
        farm.start()
        pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
        if len({urls.bucket_of(urls.host_key(u), BUCKETS) for u in pages}) >= MIN_BUSY_BUCKETS:
            return farm, pages
        farm.stop()
    raise AssertionError(f"no farm in {attempts} attempts filled {MIN_BUSY_BUCKETS} buckets")


def test_three_daemons_share_buckets_survive_a_freeze_and_a_kill_and_stay_polite(tmp_path):
    root = str(tmp_path / "root")
    os.makedirs(root)
    farm, pages = _spread_farm(tmp_path)
    processes: dict[str, subprocess.Popen] = {}
    try:
        segments = {"seg-1": pages[0::2], "seg-2": pages[1::2]}  # both pending at once: the same buckets in each
        for segment_id, items in segments.items():
            write_fetchlist(root, segment_id, [{"url": u} for u in items], BUCKETS)
        confs = {name: _conf_file(tmp_path, name, farm) for name in ("a", "b", "c")}
        logs = {name: tmp_path / f"{name}.log" for name in confs}

        processes["a"] = _start(root, confs["a"], logs["a"])
        _wait(lambda: len(_by_agent(farm, "a")) >= 6, 60, "daemon a to fetch")
        processes["b"] = _start(root, confs["b"], logs["b"])
        _wait(lambda: len(_by_agent(farm, "b")) >= 6, 60, "daemon b to fetch")
        a_buckets = _owned_by(root, "a")
        assert a_buckets  # a owns buckets with work left
        processes["c"] = _start(root, confs["c"], logs["c"])

        # Freeze a: its leases lapse, c (the daemon with room) takes them over, then a wakes up fenced.
        processes["a"].send_signal(signal.SIGSTOP)
        frozen_at = time.time()
        _wait(lambda: all(b not in _owned_by(root, "a") for b in a_buckets), 30, "a's buckets to be taken over")
        processes["a"].send_signal(signal.SIGCONT)
        woke_at = time.time()

        # Kill b mid-way: its buckets are taken at once (its process is gone) and resumed.
        b_buckets = [b for b in _owned_by(root, "b") if b in pending_work(root)]
        assert b_buckets  # b is killed holding unfinished buckets
        processes["b"].kill()
        processes["b"].wait(10)
        killed_at = time.time()

        _wait(lambda: not pending_work(root), 120, "every bucket of both segments to finish")
        for name in ("a", "c"):
            processes[name].send_signal(signal.SIGTERM)
        for name in ("a", "c"):
            assert processes[name].wait(15) == 0  # SIGTERM: a clean exit within the bound
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        farm.stop()

    log = read_request_log(farm.log_path)
    # Politeness over the whole fleet, from the server's log: no host ever had two requests at once or too close.
    violations = politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY))
    assert violations == []

    # Every URL of both segments: exactly one result, pointing into a closed WARC file.
    for segment_id, items in segments.items():
        rows = read_results(root, segment_id)
        assert Counter(r["url"] for r in rows) == Counter(items)
        assert not [f for f in files_under(layout.segment_dir(root, segment_id)) if f.endswith((".open", ".tmp"))]
        for row in rows:
            if row["warc_filename"]:
                assert os.path.exists(os.path.join(root, row["warc_filename"]))

    # Repeated page requests: only pages whose first request the frozen daemon (before the freeze), the killed one
    # (before the kill) or a daemon that lost the bucket's lease (its own log says so: on a loaded machine a renewal
    # can come too late) made and whose result it never published, so the bucket's next owner fetched them again:
    # the URL's one published result is the second fetch's (its fetch time is the second request's, not the
    # first's). A page whose result was published is never requested again, however long before a signal it ended.
    lost = {name: {int(a or b) for a, b in LOST_BUCKET.findall(path.read_text())} for name, path in logs.items()}
    requests: dict[tuple[str, str], list[dict]] = {}
    for r in sorted((r for r in log if r["path"] != "/robots.txt"), key=lambda r: r["start"]):
        requests.setdefault((r["host"], r["path"]), []).append(r)
    repeated = {key: made for key, made in requests.items() if len(made) > 1}
    published = {(u.netloc, u.path + (f"?{u.query}" if u.query else "")): row["fetched_at"].timestamp()
                 for segment_id in segments for row in read_results(root, segment_id)
                 for u in [urlsplit(row["url"])]}
    for key, made in repeated.items():
        first, second = made[:2]
        assert len(made) == 2, (key, made)
        first_by = first["user_agent"].split("/")[1].split(" ")[0]
        assert ((first_by == "a" and first["start"] <= frozen_at) or (first_by == "b" and first["start"] <= killed_at)
                or urls.bucket_of(f"http://{key[0]}", BUCKETS) in lost[first_by]), (key, made, lost)
        assert abs(published[key] - second["start"]) < abs(published[key] - first["start"]), (key, made)
    print(f"\nrepeated page requests (results lost with the frozen, the killed or a fenced daemon): {len(repeated)}")
    hosts_of = {b: {h for h in farm.host_keys() if urls.bucket_of(h, BUCKETS) == b} for b in range(BUCKETS)}

    # The woken daemon was fenced: nothing from a to the buckets it lost after it woke, until it may have
    # legitimately taken one again; and it said so in its log.
    a_log = logs["a"].read_text()
    assert "lease lost" in a_log or "lost bucket" in a_log
    for bucket in a_buckets:  # per bucket: a request after the wake-up needs a lease a took after it
        hosts = {h.removeprefix("http://") for h in hosts_of[bucket]}
        retaken = _spans_held(root, bucket, "a", since=woke_at)
        unowned = [r for r in log if "/a " in r["user_agent"] and r["start"] >= woke_at and r["host"] in hosts
                   and not any(acquired <= r["start"] <= until for acquired, until in retaken)]
        assert unowned == [], (bucket, retaken, unowned[:3])
    assert not [r for r in log if "/a " in r["user_agent"] and frozen_at + 0.5 < r["start"] < woke_at]
    assert not [r for r in log if "/b " in r["user_agent"] and r["start"] > killed_at]

    # b's unfinished buckets were taken over (at once: its process was gone) and finished by another daemon.
    assert all(_epoch_owners(root, b)[-1] != "b" for b in b_buckets)

    # SIGTERM released every lease: a new daemon could start on any bucket at once.
    store = LeaseStore(config.load(), root, "observer")
    for bucket in range(BUCKETS):
        record = store.latest(bucket)
        assert record is None or record.released or record.owner == "b"  # b was killed: its leases just lapse


def _epochs(root: str, bucket: int) -> list[dict]:
    """The bucket's lease records still on disk (the last few epochs), oldest first."""
    folder = leases_dir(root, bucket)
    names = sorted(n for n in os.listdir(folder) if n.startswith("epoch-"))
    return [json.loads(Path(folder, n).read_text()) for n in names]


def _spans_held(root: str, bucket: int, owner: str, since: float) -> list[tuple[float, float]]:
    """Wall-clock spans (acquired, expiry or release) of the leases on the bucket that `owner` took at or after
    `since`."""
    return [(e["acquired_at"], e["expires_at"]) for e in _epochs(root, bucket)
            if e["owner"] == owner and e["acquired_at"] >= since]


def _epoch_owners(root: str, bucket: int) -> list[str]:
    return [e["owner"] for e in _epochs(root, bucket)]
