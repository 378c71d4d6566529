"""The fetch daemon on an s3:// root, against moto's S3 server and the site farm, all on loopback.

What is checked is what a reader of the bucket sees: every WARC object read back with fastwarc (an independent
reader), result objects that only name WARC objects uploaded before them, `_DONE.json` uploaded last (from the
store's upload log), multipart uploads past the threshold, leases taken and lost through conditional writes, and
a daemon killed mid-bucket whose successor uploads what it recovered.
"""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from fastwarc.warc import ArchiveIterator, WarcRecordType

from crawler import layout
from crawler.clock import SYSTEM_CLOCK
from fetchd.commands import fetch_segment
from fetchd.ownership import S3LeaseStore
from fetchd.progress import pending_work
from fetchd.storage import S3Store
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec
from tests.support.s3 import moto_server, objects
from tests.support.s3 import put_fetchlist as put_segment_fetchlist
from tests.support.s3 import result_rows as segment_result_rows
from tests.support.servers import EdgeServer
from tests.support.virtual import EPOCH, VirtualClock

PROJECT = Path(__file__).resolve().parents[1]
SEGMENT = "seg-s3"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def s3():
    with moto_server() as server:
        yield server


@pytest.fixture
def s3_root(s3, request) -> str:
    """A fresh S3 bucket per test (names: 3-63 lower-case characters)."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-b"
    s3.make_bucket(name)
    return f"s3://{name}/crawl"


def s3_conf(base_conf, s3, tmp_path: Path, **overrides):
    return base_conf.with_overrides({"s3.endpoint_url": s3.endpoint, "fetch.staging_dir": str(tmp_path / "staging"),
                                     **overrides})


def put_fetchlist(s3, root: str, tmp_path: Path, urls: list[str], buckets: int) -> dict[int, list[dict]]:
    return put_segment_fetchlist(s3, root, tmp_path, SEGMENT, urls, buckets)


def result_rows(s3, root: str, kind: str = "fetched") -> list[dict]:
    return segment_result_rows(s3, root, SEGMENT, kind)


def responses(warc: bytes) -> dict[int, str]:
    """Offset -> target URI of every response record, read by fastwarc."""
    return {record.stream_pos: record.headers["WARC-Target-URI"]
            for record in ArchiveIterator(io.BytesIO(warc), record_types=WarcRecordType.response)}


def upload_log(caplog) -> list[str]:
    return [r.args[0] for r in caplog.records if r.name == "fetchd.storage" and r.msg == "uploaded %s"]


def check_upload_order(keys: list[str], rows: list[dict], manifests: list[str]) -> None:
    """Every results object after the WARC objects its rows name; each manifest after every other key of its
    bucket."""
    position = {key: i for i, key in enumerate(keys)}
    assert len(position) == len(keys), "an object was uploaded twice"
    for row in rows:
        if row["warc_filename"]:
            assert position[row["warc_filename"]] < position[row["_key"]], row["_key"]
    for manifest in manifests:
        bucket_dir = manifest.rsplit("/", 1)[0].split("/")[-1]
        assert position[manifest] == max(i for k, i in position.items() if f"/{bucket_dir}/" in k)


# ---- one segment fetched onto S3 ---------------------------------------------------------------------


def test_a_segment_fetched_to_s3_uploads_warc_then_results_then_the_manifest(s3, s3_root, tmp_path, base_conf,
                                                                            caplog):
    caplog.set_level(logging.DEBUG, logger="fetchd.storage")
    farm = SiteFarm(FarmSpec(hosts=3, pages_per_host=8, cross_host_links=False), tmp_path / "farm.jsonl")
    farm.start()
    try:
        conf = s3_conf(base_conf, s3, tmp_path, **{
            "crawl.buckets": 2, "politeness.min_delay_s": 0.05, "fetch.static_hosts": farm.static_hosts(),
            "fetch.warc_max_bytes": 20_000,    # several WARC files per bucket
            "ownership.results_batch_rows": 3,  # rows published while their WARC is still open
        })
        pages = sorted(farm.page_urls())
        lists = put_fetchlist(s3, s3_root, tmp_path, pages, 2)
        summary = fetch_segment(conf, s3_root, SEGMENT)
    finally:
        farm.stop()
    assert sorted(summary["buckets"]) == sorted(lists)

    rows = result_rows(s3, s3_root)
    assert Counter(r["url"] for r in rows) == Counter(pages)  # every listed URL reported exactly once
    warcs = {k: v for k, v in objects(s3, s3_root, f"segments/{SEGMENT}/warc/").items()}
    assert len(warcs) > len(lists)  # rotation happened
    found = {k: responses(v) for k, v in warcs.items()}
    successes = [r for r in rows if r["outcome"] == "success"]
    assert successes
    for row in successes:  # every success row points at its response record, in an uploaded object
        assert found[row["warc_filename"]][row["warc_offset"]] == row["url"]
    page_responses = [u for by_offset in found.values() for u in by_offset.values() if not u.endswith("/robots.txt")]
    assert sorted(page_responses) == sorted(r["url"] for r in rows if r["status_code"] is not None)

    keys = upload_log(caplog)
    manifests = [layout.join("segments", SEGMENT, "fetched", layout.bucket_dirname(b), layout.DONE_MANIFEST)
                 for b in lists]
    check_upload_order(keys, rows + result_rows(s3, s3_root, "robots"), manifests)
    assert set(keys) == set(objects(s3, s3_root, f"segments/{SEGMENT}/")) - {
        k for k in objects(s3, s3_root, f"segments/{SEGMENT}/fetchlist/")}
    store = S3Store(conf, s3_root)
    try:
        assert pending_work(store) == {}
        assert sum(store.warc_sizes(SEGMENT, b) != [] for b in lists) == len(lists)
    finally:
        store.close()
    staged = [f for _, _, names in os.walk(tmp_path / "staging") for f in names]
    assert staged == []  # a finished bucket leaves nothing in the staging folder


class HugeServer(EdgeServer):
    """The edge server plus one page too big for a single upload part."""

    def respond(self, host: str, request: web.Request) -> web.StreamResponse:
        if request.path == "/huge":
            return web.Response(body=os.urandom(6 * MIB), content_type="text/html")  # incompressible
        return super().respond(host, request)


def test_a_warc_file_past_the_threshold_is_uploaded_in_parts(s3, s3_root, tmp_path, base_conf):
    server = HugeServer()
    try:
        conf = s3_conf(base_conf, s3, tmp_path, **{
            "crawl.buckets": 1, "fetch.static_hosts": {"edge.test": "127.0.0.1"},
            "fetch.max_body_bytes": 8 * MIB, "s3.multipart_threshold_bytes": 5 * MIB,
            "s3.multipart_chunk_bytes": 5 * MIB,
        })
        put_fetchlist(s3, s3_root, tmp_path, [server.url("edge.test", "/huge"), server.url("edge.test", "/small")], 1)
        fetch_segment(conf, s3_root, SEGMENT)
    finally:
        server.stop()
    [(key, data)] = objects(s3, s3_root, f"segments/{SEGMENT}/warc/").items()
    assert len(data) > 6 * MIB
    bucket, prefix = s3_root.removeprefix("s3://").split("/", 1)
    head = s3.client().head_object(Bucket=bucket, Key=f"{prefix}/{key}", PartNumber=1)
    assert head["PartsCount"] == 2
    assert sorted(responses(data).values()) == sorted(server.url("edge.test", p) for p in ("/huge", "/robots.txt",
                                                                                            "/small"))


def test_a_staging_copy_behind_s3_is_dropped_and_one_ahead_is_kept(s3, s3_root, tmp_path, base_conf):
    store = S3Store(s3_conf(base_conf, s3, tmp_path), s3_root)
    try:
        fetched = Path(layout.fetched_dir(store.local_root, SEGMENT, 0))
        warc = Path(layout.warc_dir(store.local_root, SEGMENT, 0))
        fetched.mkdir(parents=True)
        warc.mkdir(parents=True)
        Path(fetched, "mine-r0000.parquet").write_bytes(b"mine")
        Path(warc, "mine.warc.gz.open").write_bytes(b"partial")
        theirs = layout.join("segments", SEGMENT, "fetched", layout.bucket_dirname(0), "theirs-r0000.parquet")
        store.client.put_object(Bucket=store.bucket, Key=store.key(theirs), Body=b"theirs")

        store.prepare_bucket(SEGMENT, 0)  # another machine published since: this copy is stale
        assert sorted(p.name for p in Path(store.local_root).rglob("*") if p.is_file()) == ["theirs-r0000.parquet"]
        assert Path(store.local_root, theirs).read_bytes() == b"theirs"

        Path(warc, "next.warc.gz.open").parent.mkdir(parents=True)
        Path(warc, "next.warc.gz.open").write_bytes(b"partial")
        store.prepare_bucket(SEGMENT, 0)  # holds everything S3 has: this machine was the last writer, kept
        assert Path(warc, "next.warc.gz.open").exists()
    finally:
        store.close()


# ---- leases through conditional writes ----------------------------------------------------------------


def lease_conf(base_conf, s3, tmp_path):
    return s3_conf(base_conf, s3, tmp_path, **{"ownership.lease_ttl_s": 2.0, "ownership.renew_interval_s": 0.25,
                                               "ownership.fence_margin_s": 0.5, "ownership.takeover_grace_s": 0.25})


def lease_store(conf, root: str, owner: str, clock=SYSTEM_CLOCK) -> S3LeaseStore:
    store = S3Store(conf, root)
    store.close()  # only its client and lease store are used
    lease = store.lease_store(conf, owner, clock)
    assert isinstance(lease, S3LeaseStore)
    return lease


def test_exactly_one_daemon_wins_each_epoch_race(s3, s3_root, tmp_path, base_conf):
    conf = lease_conf(base_conf, s3, tmp_path)
    stores = [lease_store(conf, s3_root, f"d{i}") for i in range(6)]
    for bucket in range(4):
        barrier = threading.Barrier(len(stores))
        won: list = []

        def take(store, bucket=bucket, barrier=barrier, won=won):
            barrier.wait()
            won.append(store.try_acquire(bucket))

        threads = [threading.Thread(target=take, args=(store,)) for store in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        winners = [lease for lease in won if lease is not None]
        assert len(won) == len(stores) and len(winners) == 1
        assert stores[0].latest(bucket).owner == winners[0].record.owner and winners[0].record.epoch == 1


def test_takeover_after_expiry_fences_the_old_owner(s3, s3_root, tmp_path, base_conf):
    """On the virtual clock: the expiry, the grace and the fence deadline are checked at their boundaries."""
    conf = lease_conf(base_conf, s3, tmp_path)
    clock = VirtualClock()
    old, new = lease_store(conf, s3_root, "old", clock), lease_store(conf, s3_root, "new", clock)
    lease = old.try_acquire(3)
    assert lease is not None and old.renew(lease)
    assert new.try_acquire(3) is None  # held and renewed
    expires = lease.record.expires_at
    clock.now = lease.deadline - 2 ** -20
    assert not lease.fenced()
    clock.now = lease.deadline
    assert lease.fenced()  # the old owner stops on its own clock, ttl - fence margin after its renewal
    clock.now = expires + conf.ownership.takeover_grace_s - EPOCH - 2 ** -20
    assert new.try_acquire(3) is None  # expired, but within the takeover grace
    clock.now = expires + conf.ownership.takeover_grace_s - EPOCH
    taken = new.try_acquire(3)
    assert taken is not None and taken.record.epoch == 2
    assert not old.renew(lease) and lease.lost
    assert new.renew(taken) and new.latest(3).owner == "new"
    # a renewal is a conditional overwrite of the writer's own version: a replaced epoch object is not renewed
    s3.client().put_object(Bucket=new.s3_bucket, Key=new._key(3, 2), Body=b"{}")
    assert not new.renew(taken) and taken.lost


def test_latest_lists_again_when_the_highest_epoch_it_listed_was_pruned_before_its_read(s3, s3_root, tmp_path,
                                                                                         base_conf, monkeypatch):
    """The local store's race on S3: a reader that listed epoch 1 as the highest and paused while later epochs came
    and pruned it reads the highest epoch now (the missing object is a 404, not an unreachable store). A long lease:
    on a loaded machine a 2-s one was fenced between its take and its release, the release was skipped (as it must
    be) and the next take found the bucket held."""
    conf = s3_conf(base_conf, s3, tmp_path, **{"ownership.lease_ttl_s": 60.0})
    writer, reader = lease_store(conf, s3_root, "writer"), lease_store(conf, s3_root, "reader")
    for _ in range(5):
        writer.release(writer.try_acquire(2), time.time())
    assert 1 not in writer._epochs(2)
    listings = iter([[1]])  # the paused reader's listing, then the real ones
    real = reader._epochs
    monkeypatch.setattr(reader, "_epochs", lambda bucket: next(listings, None) or real(bucket))
    assert reader.latest(2) == writer.latest(2) and reader.latest(2).epoch == 5


# ---- a daemon killed mid-bucket ------------------------------------------------------------------------


def test_a_killed_daemon_is_resumed_and_its_recovered_files_uploaded(s3, s3_root, tmp_path, base_conf, caplog):
    caplog.set_level(logging.DEBUG, logger="fetchd.storage")
    farm = SiteFarm(FarmSpec(hosts=2, pages_per_host=12, cross_host_links=False), tmp_path / "farm.jsonl")
    farm.start()
    process = None
    try:
        pages = sorted(farm.page_urls())
        put_fetchlist(s3, s3_root, tmp_path, pages, 1)
        staging = tmp_path / "staging"
        settings = {"crawl": {"buckets": 1}, "politeness": {"min_delay_s": 0.2},
                    "s3": {"endpoint_url": s3.endpoint},
                    "fetch": {"static_hosts": farm.static_hosts(), "allow_networks": ["127.0.0.0/8"],
                              "poll_interval_s": 0.3, "staging_dir": str(staging)},
                    "ownership": {"results_batch_rows": 1000,  # nothing published before the kill
                                  "results_publish_s": 3600.0}}
        conf_path = tmp_path / "daemon.yaml"
        conf_path.write_text(yaml.safe_dump(settings))
        process = subprocess.Popen(
            [sys.executable, "-m", "fetchd.cli", "serve", "--root", s3_root, "--config", str(conf_path)],
            cwd=str(PROJECT), env={**os.environ, **s3.client_env()}, stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "daemon.log").open("w"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            open_files = [p for p in staging.rglob("*.warc.gz.open") if p.stat().st_size > 12_000]
            if open_files:
                break
            time.sleep(0.05)
        assert open_files, (tmp_path / "daemon.log").read_text()[-2000:]
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        assert not objects(s3, s3_root, f"segments/{SEGMENT}/fetched/")  # nothing had gone up yet

        conf = base_conf.with_overrides({"crawl.buckets": 1, "politeness.min_delay_s": 0.2,
                                         "s3.endpoint_url": s3.endpoint, "fetch.staging_dir": str(staging),
                                         "fetch.static_hosts": farm.static_hosts()})
        summary = fetch_segment(conf, s3_root, SEGMENT)  # same machine: the dead holder's lease is taken at once
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        farm.stop()
    assert summary["buckets"] == [0]
    rows = result_rows(s3, s3_root)
    assert Counter(r["url"] for r in rows) == Counter(pages)
    recovered = [r for r in rows if r["_key"].endswith("-recovered.parquet")]
    assert recovered  # the killed daemon's fetches were kept, not fetched again
    warcs = objects(s3, s3_root, f"segments/{SEGMENT}/warc/")
    for row in [r for r in rows if r["outcome"] == "success"]:
        assert responses(warcs[row["warc_filename"]])[row["warc_offset"]] == row["url"]
    manifest = layout.join("segments", SEGMENT, "fetched", layout.bucket_dirname(0), layout.DONE_MANIFEST)
    check_upload_order(upload_log(caplog), rows + result_rows(s3, s3_root, "robots"), [manifest])
