"""A closed segment (`_CLOSED.json`, written when the cycle stops waiting for it): a daemon fetching one of its
buckets stops within a bounded time, as on SIGTERM (results so far published, WARC closed, lease released, no
`_DONE.json`), and no daemon starts its buckets again. Judged from the farm's own request log, on a local root
(`serve`) and on moto's S3 server (`fetch_segment`); the time bound itself is checked exactly with the daemon's own
loop on the virtual clock (the real-clock runs only check what happened in which order)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from crawler import layout
from fetchd.commands import fetch_segment, serve
from fetchd.ownership import LeaseStore
from fetchd.progress import close_segment, pending_buckets, pending_work, segment_progress
from fetchd.storage import S3Store
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support import virtual
from tests.support.fetchlists import files_under, read_results, record_at, write_fetchlist
from tests.support.s3 import moto_server, objects, put_fetchlist, result_rows

SEGMENT = "seg-closed"
S3_SEGMENT = "seg-closed-s3"
POLL_S = 0.3
GRACE_S = 2.0
STOP_POLL_S = 0.5  # how often a bucket run and its drain look whether to stop (fetchd.exchange.STOP_POLL_S)


def slow_farm(tmp_path: Path) -> SiteFarm:
    """Two hosts of 40 pages at a 0.3 s politeness delay: about 12 s of fetching for one bucket."""
    return SiteFarm(FarmSpec(hosts=2, pages_per_host=40, cross_host_links=False), tmp_path / "farm.jsonl")


def close_mid_bucket(farm: SiteFarm, root: str, segment_id: str, conf) -> None:
    """Wait until the bucket is well under way, then close its segment."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(read_request_log(farm.log_path)) < 6:
        time.sleep(0.02)
    assert len(read_request_log(farm.log_path)) >= 6, "the daemon never got going"
    progress = close_segment(root, segment_id, "test: fetch deadline", conf)
    assert progress.closed and progress.unfinished == [0]


def check_stopped(farm: SiteFarm, released_at: float, pages: list[str]) -> None:
    """Every request started before the bucket was released (wall clock of this machine, the lease record's),
    each page was asked for once, and the bucket stopped well before its end."""
    log = read_request_log(farm.log_path)
    late = [r for r in log if r["start"] >= released_at]
    assert late == [], late
    page_requests = [r for r in log if r["path"] != "/robots.txt"]
    assert 0 < len(page_requests) < len(pages) - 10  # stopped well before the end
    assert max(Counter((r["host"], r["path"]) for r in page_requests).values()) == 1


def farm_conf(base_conf, farm: SiteFarm, **overrides):
    return base_conf.with_overrides({
        "crawl.buckets": 1, "politeness.min_delay_s": 0.3, "fetch.static_hosts": farm.static_hosts(),
        "fetch.poll_interval_s": POLL_S, "ownership.shutdown_grace_s": GRACE_S,
        "ownership.lease_ttl_s": 60.0, "ownership.renew_interval_s": 5.0, "ownership.fence_margin_s": 10.0,
        **overrides})


def test_a_serving_daemon_releases_a_closed_segments_bucket_and_leaves_it(base_conf, root, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fetchd")
    farm = slow_farm(tmp_path)
    farm.start()
    stop = threading.Event()
    thread = None
    try:
        conf = farm_conf(base_conf, farm, **{"fetch.daemon_id": "first"})
        pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
        write_fetchlist(root, SEGMENT, [{"url": u} for u in pages], 1)
        thread = threading.Thread(target=serve, args=(conf, root, stop), daemon=True)
        thread.start()
        close_mid_bucket(farm, root, SEGMENT, None)

        leases = LeaseStore(conf, root, "observer")
        deadline = time.monotonic() + 60  # a bound on the test, not the rule (that is the virtual-clock twin's)
        while time.monotonic() < deadline and not leases.latest(0).released:
            time.sleep(0.05)
        assert leases.latest(0).released, "the bucket was not released"
        released_at, released_epoch = leases.latest(0).expires_at, leases.latest(0).epoch
        time.sleep(4 * POLL_S)  # the daemon goes on looking for work: it must not take the closed bucket again
        assert thread.is_alive() and leases.latest(0).epoch == released_epoch
        assert LeaseStore(conf, root, "second").try_acquire(0) is not None  # free at once, no expiry to wait for
    finally:
        stop.set()
        if thread is not None:
            thread.join(15)
        farm.stop()
    check_stopped(farm, released_at, pages)

    assert not os.path.exists(layout.done_manifest(root, SEGMENT, 0))
    assert not [f for f in files_under(layout.segment_dir(root, SEGMENT)) if f.endswith((".open", ".tmp"))]
    rows = read_results(root, SEGMENT)
    assert rows and max(Counter(r["url"] for r in rows).values()) == 1
    for row in rows:
        if row["warc_filename"]:
            assert record_at(root, row["warc_filename"], row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]
    assert pending_buckets(root, SEGMENT) == [] and pending_work(root) == {}
    progress = segment_progress(root, SEGMENT)
    assert progress.closed and progress.unfinished == [0]
    marker = json.loads(Path(layout.closed_marker(root, SEGMENT)).read_text())
    assert marker["reason"] == "test: fetch deadline" and marker["unfinished_buckets"] == [0]
    released = [r.getMessage() for r in caplog.records if "because the segment was closed" in r.getMessage()]
    assert len(released) == 1 and "bucket 00000" in released[0]


def test_a_closed_segment_is_not_fetched(base_conf, root):
    write_fetchlist(root, SEGMENT, [{"url": "http://closed.test/a"}], 1)
    close_segment(root, SEGMENT, "test")
    first = json.loads(Path(layout.closed_marker(root, SEGMENT)).read_text())
    close_segment(root, SEGMENT, "again")  # a retried close keeps the first marker
    assert json.loads(Path(layout.closed_marker(root, SEGMENT)).read_text()) == first
    summary = fetch_segment(base_conf.with_overrides({"crawl.buckets": 1}), root, SEGMENT)
    assert summary["buckets"] == [] and summary["skipped_buckets"] == [0]
    assert not os.path.exists(layout.fetched_dir(root, SEGMENT, 0))


@pytest.fixture(scope="module")
def s3():
    with moto_server() as server:
        yield server


def test_a_closed_segment_on_s3_stops_its_bucket(s3, base_conf, tmp_path):
    s3_root = f"s3://{s3.make_bucket('closed-segment')}/crawl"
    farm = slow_farm(tmp_path)
    farm.start()
    found: dict = {}
    try:
        conf = farm_conf(base_conf, farm, **{"s3.endpoint_url": s3.endpoint,
                                             "fetch.staging_dir": str(tmp_path / "staging")})
        pages = sorted(u for u in farm.page_urls() if farm._resource(u).status == 200)
        put_fetchlist(s3, s3_root, tmp_path, S3_SEGMENT, pages, 1)
        thread = threading.Thread(target=lambda: found.update(fetch_segment(conf, s3_root, S3_SEGMENT)), daemon=True)
        thread.start()
        close_mid_bucket(farm, s3_root, S3_SEGMENT, conf)
        thread.join(60)  # a bound on the test, not the rule (that is the virtual-clock twin's)
        assert not thread.is_alive(), "fetch_segment did not stop"
    finally:
        farm.stop()
    assert found["buckets"] == [] and found["stopped_by"] is None

    keys = objects(s3, s3_root, f"segments/{S3_SEGMENT}/")
    assert f"segments/{S3_SEGMENT}/_CLOSED.json" in keys
    assert not [k for k in keys if k.endswith(layout.DONE_MANIFEST)]
    rows = result_rows(s3, s3_root, S3_SEGMENT)
    assert rows and max(Counter(r["url"] for r in rows).values()) == 1, sorted(keys)
    assert all(r["warc_filename"] in keys for r in rows if r["warc_filename"])  # closed and uploaded
    store = S3Store(conf, s3_root)
    try:
        assert pending_buckets(store, S3_SEGMENT) == []
        lease = store.lease_store(conf, "observer").latest(0)
    finally:
        store.close()
    assert lease.released
    check_stopped(farm, lease.expires_at, pages)
    assert segment_progress(s3_root, S3_SEGMENT, conf).closed


# ---- the same rule, exactly, with the daemon's own loop on the virtual clock --------------------------------------


@pytest.mark.parametrize(("answer_s", "bound_s"), [
    (0.05, POLL_S + STOP_POLL_S + 0.05),            # in-flight requests end soon: they are waited for
    (5.0, POLL_S + STOP_POLL_S + GRACE_S + STOP_POLL_S),  # they outlast the grace: cancelled at its first look after
], ids=["drained", "cancelled-after-the-grace"])
def test_a_closed_segments_bucket_stops_within_the_rule_on_the_virtual_clock(base_conf, root, answer_s, bound_s):
    """`serve_async` on the virtual clock: after the marker is written, no request starts later than the daemon's next
    look for it (`fetch.poll_interval_s`), and the bucket is released within that look, the bucket run's stop poll,
    and what is left of the requests in flight (at most `ownership.shutdown_grace_s`, seen at the drain's next
    look). No slack: the clock only moves when the daemon waits."""
    clock = virtual.VirtualClock()
    names = ["a.test", "b.test"]
    pages = virtual.list_pages(root, SEGMENT, names, 40, buckets=1)
    conf = base_conf.with_overrides({
        "crawl.buckets": 1, "politeness.min_delay_s": 0.3, "fetch.static_hosts": dict.fromkeys(names, "127.0.0.1"),
        "fetch.poll_interval_s": POLL_S, "ownership.shutdown_grace_s": GRACE_S, "ownership.lease_ttl_s": 60.0,
        "ownership.renew_interval_s": 5.0, "ownership.fence_margin_s": 10.0, "fetch.daemon_id": "virtual"})
    transport = virtual.ScriptedTransport(virtual.every_page_after(answer_s), clock)
    seen: dict = {}

    async def close_mid_bucket(_stop: threading.Event) -> None:
        await virtual.wait_until(lambda: len(transport.log) >= 6)
        seen["closed_at"] = clock.now
        close_segment(root, SEGMENT, "test: fetch deadline")
        leases = LeaseStore(conf, root, "observer", clock)
        await virtual.wait_until(lambda: leases.latest(0).released)
        seen["released_at"], seen["epoch"] = clock.now, leases.latest(0).epoch
        await asyncio.sleep(4 * POLL_S)  # the daemon goes on looking for work: it must not take the bucket again
        seen["epoch_later"] = leases.latest(0).epoch

    virtual.serve_virtually(conf, root, clock, transport, close_mid_bucket)
    closed_at = seen["closed_at"]
    assert max(r.start for r in transport.log) < closed_at + POLL_S
    assert 0 < seen["released_at"] - closed_at <= bound_s
    assert seen["epoch_later"] == seen["epoch"]
    assert len(transport.log) < len(pages)  # stopped well before the end
    assert not os.path.exists(layout.done_manifest(root, SEGMENT, 0))
    rows = read_results(root, SEGMENT)
    assert max(Counter(r["url"] for r in rows).values()) == 1
    reported = {r["url"] for r in rows}
    cut = [r for r in transport.log if r.path != "/robots.txt" and r.host + r.path not in reported]
    assert all(r.end - r.start < answer_s - 1e-9 for r in cut)  # only requests cut short went unreported
    if answer_s > GRACE_S:
        assert cut  # the grace ran out on some
