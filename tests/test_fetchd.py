"""The fetch daemon against real loopback servers: the site farm, and a small server for the edge cases.

Politeness and robots are judged from the servers' own request logs; WARC output is read back with fastwarc,
an independent reader. Only farm names mapped to 127.0.0.1 (static_hosts) and IP literals are used.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType

from crawler import layout, records, urls
from crawler.robots import RobotsPolicy, handed_over
from fetchd import cli
from fetchd import daemon as fetchd_daemon
from fetchd.commands import fetch_segment, serve
from fetchd.hostprep import forget_hosts
from fetchd.output import recover_bucket_output
from fetchd.ownership import LeaseStore
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support import virtual
from tests.support.fetchlists import by_url, files_under, read_results, record_at, write_fetchlist
from tests.support.servers import EdgeServer, edge_conf, gaps

SEGMENT = "seg-test"
MIN_DELAY = 0.2


@pytest.fixture
def edge():
    server = EdgeServer()
    yield server
    server.stop()


# ---- the farm crawl (run once, judged many ways) -----------------------------------------------------


@pytest.fixture(scope="module")
def farm_crawl(tmp_path_factory, base_conf):
    root = str(tmp_path_factory.mktemp("farm-root"))
    farm = SiteFarm(FarmSpec(hosts=4, pages_per_host=15), os.path.join(root, "farm.jsonl"))
    farm.start()
    try:
        conf = base_conf.with_overrides({
            "politeness.min_delay_s": MIN_DELAY,
            "fetch.static_hosts": farm.static_hosts(),
            "fetch.warc_max_bytes": 20_000,  # force rotation: results must follow their own WARC file
        })
        fetchlist = write_fetchlist(root, SEGMENT, [{"url": u} for u in sorted(farm.page_urls())],
                                    conf.crawl.buckets)
        summary = fetch_segment(conf, root, SEGMENT)
        yield {"root": root, "farm": farm, "conf": conf, "fetchlist": fetchlist, "summary": summary,
               "log": read_request_log(farm.log_path)}
    finally:
        farm.stop()


def test_every_fetchlist_url_has_exactly_one_result(farm_crawl):
    wanted = Counter(row["url_id"] for rows in farm_crawl["fetchlist"].values() for row in rows)
    results = read_results(farm_crawl["root"], SEGMENT)
    assert Counter(row["url_id"] for row in results) == wanted
    assert farm_crawl["summary"]["urls"] == len(wanted)
    assert sorted(farm_crawl["summary"]["buckets"]) == sorted(farm_crawl["fetchlist"])
    outcomes = Counter(row["outcome"] for row in results)
    assert outcomes["success"] > 40 and outcomes["robots_denied"] > 0
    for row in results:
        assert row["bucket"] == urls.bucket_of(row["host_key"], farm_crawl["conf"].crawl.buckets)
        assert row["segment_id"] == SEGMENT and row["state_version"] == 1 and row["daemon_id"]


def test_politeness_has_zero_violations_in_the_farm_log(farm_crawl):
    farm, log = farm_crawl["farm"], farm_crawl["log"]
    violations = politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY))
    assert violations == []
    assert len(log) >= 40
    # the crawl-delayed host really was slower than the minimum
    delayed = [h for h in farm.host_names() if farm.crawl_delay(h)]
    assert delayed and all(farm.crawl_delay(h) > MIN_DELAY for h in delayed)


def test_robots_first_and_disallowed_urls_never_requested(farm_crawl):
    farm, log, root, conf = farm_crawl["farm"], farm_crawl["log"], farm_crawl["root"], farm_crawl["conf"]
    token = conf.crawl.robots_token
    by_host: dict[str, list[dict]] = {}
    for record in sorted(log, key=lambda r: r["start"]):
        by_host.setdefault(record["host"], []).append(record)
    assert len(by_host) == 4
    for records_of_host in by_host.values():
        assert records_of_host[0]["path"] == "/robots.txt"
        assert sum(r["path"] == "/robots.txt" for r in records_of_host) == 1
    requested = {f"http://{r['host']}{r['path']}" for r in log}
    denied = {row["url"] for row in read_results(root, SEGMENT) if row["outcome"] == "robots_denied"}
    policies = {
        f"http://{name}:{farm.port}": RobotsPolicy.parse(farm.robots_txt(name), token)
        if farm.robots_txt(name) is not None else RobotsPolicy.allow_all()
        for name in farm.host_names()
    }
    expected_denied = {u for u in map(urls.canonicalize, farm.page_urls()) if not policies[urls.host_key(u)].allowed(u)}
    assert denied == expected_denied and denied
    assert not denied & requested
    assert not farm.disallowed_urls(token) & requested
    assert {r["user_agent"] for r in log} == {conf.crawl.user_agent}
    robots_rows = read_results(root, SEGMENT, kind="robots")
    assert len(robots_rows) == 4
    assert {r["state"] for r in robots_rows} == {"rules", "allow_all"}


def test_results_point_into_closed_warc_files(farm_crawl):
    root = farm_crawl["root"]
    results = read_results(root, SEGMENT)
    assert not [f for f in files_under(layout.segment_dir(root, SEGMENT)) if f.endswith((".open", ".tmp"))]
    warc_files = {row["warc_filename"] for row in results if row["warc_filename"]}
    assert len(warc_files) > 2  # rotated at fetch.warc_max_bytes
    requested = [row for row in results if row["outcome"] in ("success", "redirect", "http_error")]
    assert requested
    for row in requested:
        stem = re.sub(r"-(r\d{4}|recovered)\.parquet$", "", Path(row["_file"]).name)
        assert Path(row["warc_filename"]).name == stem + ".warc.gz"  # only rows of that closed file
        assert row["warc_filename"].startswith(f"segments/{SEGMENT}/warc/bucket=")
        record = record_at(root, row["warc_filename"], row["warc_offset"])
        assert record.record_type == WarcRecordType.response
        # a followed same-host redirect points at the last hop's response; redirect_to names that URL
        followed = row["outcome"] != "redirect" and row["redirect_to"]
        assert record.headers["WARC-Target-URI"] == (row["redirect_to"] if followed else row["url"])
        assert record.http_headers.status_code == row["status_code"]
        assert record.headers["WARC-Payload-Digest"] == row["payload_digest"]
        assert record.headers["WARC-IP-Address"] == row["remote_ip"] == "127.0.0.1"
        assert row["warc_length"] > 0 and row["content_length"] >= 0
        if row["outcome"] == "redirect":
            location = record.http_headers["Location"]
            assert row["redirect_to"] and row["redirect_to"] == urls.resolve(row["url"], location)
    for row in results:
        if row["outcome"] == "robots_denied":
            assert row["warc_filename"] is None and row["status_code"] is None
    manifests = [json.loads(Path(layout.done_manifest(root, SEGMENT, b)).read_text())
                 for b in farm_crawl["fetchlist"]]
    assert sum(m["urls"] for m in manifests) == len(results)
    assert sum(m["warc_files"] for m in manifests) == len(warc_files)
    for manifest in manifests:
        assert sum(manifest["outcomes"].values()) == manifest["urls"]
        assert manifest["warc_bytes"] > 0 and manifest["started_at"] <= manifest["finished_at"]


def test_warc_files_are_well_formed(farm_crawl):
    root = farm_crawl["root"]
    warc_paths = [os.path.join(root, f) for f in {r["warc_filename"] for r in read_results(root, SEGMENT)} if f]
    for path in warc_paths:
        with open(path, "rb") as fh:
            recs = []
            for record in ArchiveIterator(fh, parse_http=False):
                assert record.verify_block_digest()
                recs.append((record.record_type, dict(record.headers)))
        assert recs[0][0] == WarcRecordType.warcinfo
        assert all(h["WARC-Warcinfo-ID"] == recs[0][1]["WARC-Record-ID"] for _, h in recs[1:])
        assert all(h.get("WARC-Type") != "warcinfo" for _, h in recs[1:])
        by_id = {h["WARC-Record-ID"]: (t, h) for t, h in recs}
        responses = [h for t, h in recs if t == WarcRecordType.response]
        assert responses
        for response in responses:
            kind, request = by_id[response["WARC-Concurrent-To"]]
            assert kind == WarcRecordType.request
            assert request["WARC-Target-URI"] == response["WARC-Target-URI"]
            assert request["WARC-Concurrent-To"] == response["WARC-Record-ID"]


def test_rerunning_a_finished_segment_is_a_no_op(farm_crawl):
    root, conf = farm_crawl["root"], farm_crawl["conf"]
    before = {f: os.path.getmtime(os.path.join(layout.segment_dir(root, SEGMENT), f))
              for f in files_under(layout.segment_dir(root, SEGMENT))}
    requests_before = len(read_request_log(farm_crawl["farm"].log_path))
    summary = fetch_segment(conf, root, SEGMENT)
    assert summary["buckets"] == [] and summary["urls"] == 0
    assert sorted(summary["skipped_buckets"]) == sorted(farm_crawl["fetchlist"])
    after = {f: os.path.getmtime(os.path.join(layout.segment_dir(root, SEGMENT), f))
             for f in files_under(layout.segment_dir(root, SEGMENT))}
    assert after == before
    assert len(read_request_log(farm_crawl["farm"].log_path)) == requests_before


# ---- edge cases against the small server ---------------------------------------------------------------


def test_not_modified_is_a_revisit_record(edge, base_conf, root):
    conf = edge_conf(base_conf)
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/etag"), "etag": '"v1"',
                                     "last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"}], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    [row] = read_results(root, SEGMENT)
    assert row["outcome"] == "not_modified" and row["status_code"] == 304
    seen = [r for r in edge.requests("edge.test") if r["path"] == "/etag"][0]["headers"]
    assert seen["If-None-Match"] == '"v1"' and seen["If-Modified-Since"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.record_type == WarcRecordType.revisit
    assert record.headers["WARC-Profile"] == "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
    assert record.headers["WARC-Refers-To-Target-URI"] == row["url"]
    assert record.http_headers.status_code == 304


def test_retry_after_slows_the_host(edge, base_conf, root):
    conf = edge_conf(base_conf)
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in ("/busy", "/after", "/later")],
                    conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = by_url(read_results(root, SEGMENT))
    busy = rows[edge.url("edge.test", "/busy")]
    assert busy["outcome"] == "http_error" and busy["status_code"] == 429 and busy["retry_after_s"] == 1.0
    log = sorted(edge.requests("edge.test"), key=lambda r: r["start"])
    paths = [r["path"] for r in log]
    assert paths == ["/robots.txt", "/busy", "/after", "/later"]
    assert log[2]["start"] - log[1]["end"] >= 1.0  # Retry-After honoured, counted from the 429's end
    assert log[3]["start"] - log[2]["end"] >= 0.5  # a success halves the backoff (exactly: the virtual twin below)


@pytest.mark.parametrize(("retry_after", "expected"), [
    ("1", [0.1, 1.0, 0.5, 0.25, 0.125, 0.1, 0.1]),
    ("date", [0.1, 1.9, 0.95, 0.475, 0.2375, 0.11875, 0.1]),
], ids=["seconds", "http-date"])
def test_retry_after_slows_the_host_and_successes_halve_it_exactly_on_the_virtual_clock(base_conf, root,
                                                                                         retry_after, expected):
    """The same host fetched by the daemon on the virtual clock (`virtual.fetch_virtually`): the request
    after the 429 starts exactly the Retry-After (seconds, or an HTTP date) after the 429's end; each success then
    halves the backoff until it is no longer above the minimum delay, which is back from then on."""
    conf = edge_conf(base_conf)
    assert conf.politeness.min_delay_s == 0.1 and conf.politeness.backoff_recovery_factor == 0.5

    def answer(host: str, path: str, earlier: int) -> virtual.Answer:
        if path == "/busy":  # it starts at 0.1 s (robots.txt answered at once): the date is 1.9 s after its end
            value = formatdate(virtual.EPOCH + 2.0, usegmt=True) if retry_after == "date" else "1"
            return virtual.Answer(429, 0.0, value)
        return virtual.Answer(404 if path == "/robots.txt" else 200, 0.0)

    paths = ["/busy", "/after", "/p2", "/p3", "/p4", "/p5", "/p6"]
    run = virtual.fetch_virtually(conf, root, [{"url": f"http://edge.test{p}"} for p in paths], answer)
    log = run.requests("http://edge.test")
    assert [r.path for r in log] == ["/robots.txt", *paths]
    assert gaps(log) == pytest.approx(expected)


def test_body_cap_truncates(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"fetch.max_body_bytes": 10_000, "fetch.accept_content_types": []})
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/big")}], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    [row] = read_results(root, SEGMENT)
    assert row["outcome"] == "success" and row["truncated"] and row["content_length"] == 10_000
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.headers["WARC-Truncated"] == "length"
    assert len(record.reader.read()) == 10_000


def test_redirect_is_reported_not_followed(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"fetch.max_redirects": 0})  # following: tests/test_fetch_limits.py
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/moved")}], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    [row] = read_results(root, SEGMENT)
    assert row["outcome"] == "redirect" and row["status_code"] == 301
    assert row["redirect_to"] == edge.url("edge.test", "/target?x=1")
    assert [r["path"] for r in edge.requests("edge.test")] == ["/robots.txt", "/moved"]


def test_loopback_literal_is_blocked_without_allow_list(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"fetch.allow_networks": []})
    write_fetchlist(root, SEGMENT, [{"url": edge.url("127.0.0.1", "/a")}, {"url": edge.url("127.0.0.1", "/b")}],
                    conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = read_results(root, SEGMENT)
    assert {r["outcome"] for r in rows} == {"blocked"} and len(rows) == 2
    assert all(r["warc_filename"] is None and "refused address" in r["error"] for r in rows)
    assert edge.log == []


def test_static_host_on_private_address_is_blocked_before_connecting(edge, base_conf, root):
    conf = edge_conf(base_conf)  # private.test -> 10.0.0.1, allow list 127.0.0.0/8 only
    write_fetchlist(root, SEGMENT, [{"url": "http://private.test/"}, {"url": "http://private.test/x"}],
                    conf.crawl.buckets)
    started = time.monotonic()
    fetch_segment(conf, root, SEGMENT)
    rows = read_results(root, SEGMENT)
    assert {r["outcome"] for r in rows} == {"blocked"} and len(rows) == 2
    assert all("refused address for private.test: 10.0.0.1" in r["error"] for r in rows)  # the guard said no
    assert read_results(root, SEGMENT, kind="robots") == []  # not even robots.txt was attempted
    assert time.monotonic() - started < conf.fetch.connect_timeout_s  # no connect attempt timed out
    assert not [f for f in files_under(layout.warc_dir(root, SEGMENT)) if f.endswith(".warc.gz")]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting to it is refused."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_robots_5xx_or_a_refused_connection_defers_the_host(edge, base_conf, root):
    """An unreachable robots.txt — a 503, or a host that refuses connections — defers the host's URLs without a
    request and is recorded as a disallow_all robots row (update counts it as a host failure)."""
    conf = edge_conf(base_conf, **{"fetch.static_hosts": {
        **edge_conf(base_conf).fetch.static_hosts, "down.test": "127.0.0.1"}})
    down = f"http://down.test:{_closed_port()}"
    write_fetchlist(root, SEGMENT, [{"url": edge.url("broken.test", p)} for p in ("/", "/a", "/b")]
                    + [{"url": edge.url("edge.test", "/ok")}, {"url": f"{down}/x"}], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = by_url(read_results(root, SEGMENT))
    assert {rows[edge.url("broken.test", p)]["outcome"] for p in ("/", "/a", "/b")} == {"deferred"}
    assert rows[f"{down}/x"]["outcome"] == "deferred"
    assert rows[edge.url("edge.test", "/ok")]["outcome"] == "success"
    assert [r["path"] for r in edge.requests("broken.test")] == ["/robots.txt"]
    robots = {r["host_key"]: r for r in read_results(root, SEGMENT, kind="robots")}
    broken = robots[f"http://broken.test:{edge.port}"]
    assert broken["status_code"] == 503 and broken["state"] == "disallow_all"
    refused = robots[down]
    assert (refused["status_code"], refused["state"], refused["warc_filename"]) == (None, "disallow_all", None)
    assert refused["error"]
    assert record_at(root, broken["warc_filename"], broken["warc_offset"]).http_headers.status_code == 503


def test_repeated_failures_pause_the_host_and_defer_the_rest(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"politeness.max_consecutive_failures": 2, "politeness.backoff_base_s": 0.3})
    paths = [f"/p{i}" for i in range(5)]
    write_fetchlist(root, SEGMENT, [{"url": edge.url("flaky.test", p)} for p in paths], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = by_url(read_results(root, SEGMENT))
    assert [rows[edge.url("flaky.test", p)]["outcome"] for p in paths] == ["http_error"] * 2 + ["deferred"] * 3
    log = sorted(edge.requests("flaky.test"), key=lambda r: r["start"])
    assert [r["path"] for r in log] == ["/robots.txt", "/p0", "/p1"]
    assert log[2]["start"] - log[1]["end"] >= 0.3  # exponential backoff after the first 500


def test_robots_denied_urls_are_reported_and_never_requested(edge, base_conf, root):
    conf = edge_conf(base_conf)
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in ("/secret/1", "/open", "/secret")],
                    conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    outcomes = {row["url"].rsplit(str(edge.port), 1)[1]: row["outcome"] for row in read_results(root, SEGMENT)}
    assert outcomes == {"/secret/1": "robots_denied", "/open": "success", "/secret": "robots_denied"}
    assert [r["path"] for r in edge.requests("edge.test")] == ["/robots.txt", "/open"]


def test_unfinished_bucket_is_resumed_from_what_was_published(edge, base_conf, root):
    conf = edge_conf(base_conf)
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in ("/a", "/b")],
                                conf.crawl.buckets)
    [bucket] = fetchlist
    done, todo = fetchlist[bucket][0], fetchlist[bucket][1]
    # what a killed daemon leaves behind: a torn open WARC, a temp file and a published results file
    stale_warc = Path(layout.warc_dir(root, SEGMENT, bucket), "old.warc.gz.open")
    stale_warc.parent.mkdir(parents=True)
    stale_warc.write_bytes(b"partial")
    fetched = Path(layout.fetched_dir(root, SEGMENT, bucket))
    fetched.mkdir(parents=True)
    Path(fetched, ".old.parquet.tmp").write_bytes(b"partial")
    published = {name: None for name in records.FETCHED.names}
    published.update(url_id=done["url_id"], state_version=done["state_version"], url=done["url"],
                     host_key=done["host_key"], outcome="network_error")
    pq.write_table(pa.Table.from_pylist([published], schema=records.FETCHED), fetched / "old-r0000.parquet")
    summary = fetch_segment(conf, root, SEGMENT)
    assert summary["buckets"] == [bucket]
    leftovers = files_under(layout.segment_dir(root, SEGMENT))
    assert not [f for f in leftovers if f.endswith((".open", ".tmp"))]  # torn WARC discarded, temp file removed
    assert [r["path"] for r in edge.requests("edge.test")] == ["/robots.txt", "/b"]  # only what was not reported
    rows = read_results(root, SEGMENT)
    assert sorted((r["url"], r["outcome"]) for r in rows) == [(done["url"], "network_error"), (todo["url"], "success")]
    manifest = json.loads(Path(layout.done_manifest(root, SEGMENT, bucket)).read_text())
    assert manifest["urls"] == 2 and manifest["resumed"] == 1
    assert manifest["outcomes"] == {"network_error": 1, "success": 1}


def test_a_slow_recovery_does_not_hold_up_the_lease_heartbeat(edge, base_conf, root, monkeypatch):
    """Recovering a bucket's torn WARC (seconds for a large one; here a recovery that takes longer than the whole
    lease) runs off the event loop, so the heartbeat renews the lease meanwhile: the bucket is fetched under its
    first epoch, never fenced and taken again."""
    # A renewal every 0.5 s with 3 s to land in before the fence: a loaded machine delays one by over a second.
    conf = edge_conf(base_conf, **{"ownership.lease_ttl_s": 4.0, "ownership.renew_interval_s": 0.5,
                                   "ownership.fence_margin_s": 1.0, "ownership.takeover_grace_s": 0.2})
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/a")}], conf.crawl.buckets)
    [bucket] = fetchlist
    recoveries = []

    def slow_recovery(*args):
        recoveries.append(time.monotonic())
        time.sleep(5.0)  # longer than lease_ttl_s: on the event loop, no renewal could happen in time
        return recover_bucket_output(*args)

    monkeypatch.setattr(fetchd_daemon, "recover_bucket_output", slow_recovery)
    summary = fetch_segment(conf, root, SEGMENT)
    assert summary["buckets"] == [bucket] and len(recoveries) == 1
    lease = LeaseStore(conf, root, "observer").latest(bucket)
    assert (lease.epoch, lease.released) == (1, True)
    assert [r["path"] for r in edge.requests("edge.test")] == ["/robots.txt", "/a"]


def test_a_renewal_stuck_in_storage_does_not_stall_the_fetches(edge, base_conf, root, monkeypatch):
    """A lease renewal is a durable write (fsync, or an S3 PUT) and runs off the event loop: while the first one is
    stuck in storage, the daemon goes on fetching (the server's log shows requests during it), the renewal then
    completes in time, and the bucket ends under its first epoch, released. On the event loop, the stuck write
    would wait for requests that could not come."""
    conf = edge_conf(base_conf, **{"ownership.lease_ttl_s": 8.0, "ownership.renew_interval_s": 0.3,
                                   "ownership.fence_margin_s": 1.0})
    pages = [f"/stuck-{n}" for n in range(12)]
    [bucket] = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in pages],
                               conf.crawl.buckets)
    write = LeaseStore._write
    seen_while_stuck: list[int] = []

    def stuck_first_renewal(store, record, exclusive):
        if not exclusive and not record.released and not seen_while_stuck:
            before = len(edge.requests("edge.test"))
            deadline = time.monotonic() + 4.0
            while len(edge.requests("edge.test")) < before + 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen_while_stuck.append(len(edge.requests("edge.test")) - before)
        return write(store, record, exclusive)

    monkeypatch.setattr(LeaseStore, "_write", stuck_first_renewal)
    summary = fetch_segment(conf, root, SEGMENT)
    assert seen_while_stuck and seen_while_stuck[0] >= 3, seen_while_stuck
    assert summary["buckets"] == [bucket]
    lease = LeaseStore(conf, root, "observer").latest(bucket)
    assert (lease.epoch, lease.released) == (1, True)
    assert sorted(r["path"] for r in edge.requests("edge.test")) == sorted(["/robots.txt", *pages])


def test_serve_picks_up_new_fetch_lists_and_stops(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"fetch.poll_interval_s": 0.2})
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(conf, root, stop), daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        fetchlist = write_fetchlist(root, "seg-late", [{"url": edge.url("edge.test", "/late")}], conf.crawl.buckets)
        [bucket] = fetchlist
        done = Path(layout.done_manifest(root, "seg-late", bucket))
        deadline = time.monotonic() + 20
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.exists()
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive()
    assert [r["outcome"] for r in read_results(root, "seg-late")] == ["success"]


def test_cli_fetch_and_config_errors(edge, base_conf, root, capsys):
    assert cli.main(["fetch", "--segment", SEGMENT, "--root", root, "--set", "fetch.concurrency=0"]) == 2
    assert "fetch.concurrency" in capsys.readouterr().err
    assert cli.main(["serve", "--root", root, "--set", "fetch.no_such_key=1"]) == 2
    assert "fetch.no_such_key" in capsys.readouterr().err
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/cli")}], base_conf.crawl.buckets)
    args = ["fetch", "--segment", SEGMENT, "--root", root, "--set", "fetch.allow_networks=[127.0.0.0/8]",
            "--set", "politeness.min_delay_s=0.1", "--set", f"crawl.buckets={base_conf.crawl.buckets}",
            "--set", "fetch.static_hosts={edge.test: 127.0.0.1}"]
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["outcomes"] == {"success": 1} and summary["buckets"] == list(fetchlist)


def test_back_to_back_segments_stay_polite_and_reuse_robots(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"politeness.min_delay_s": 0.5})
    write_fetchlist(root, "seg-a", [{"url": edge.url("edge.test", "/one")}], conf.crawl.buckets)
    write_fetchlist(root, "seg-b", [{"url": edge.url("edge.test", "/two")}], conf.crawl.buckets)
    fetch_segment(conf, root, "seg-a")
    fetch_segment(conf, root, "seg-b")
    log = sorted(edge.requests("edge.test"), key=lambda r: r["start"])
    assert [r["path"] for r in log] == ["/robots.txt", "/one", "/two"]  # robots cached within its TTL
    assert log[2]["start"] - log[1]["end"] >= 0.5


def test_robots_redirect_is_followed_and_gzip_body_decoded(edge, base_conf, root):
    conf = edge_conf(base_conf)
    write_fetchlist(root, SEGMENT, [{"url": edge.url("moved.test", p)} for p in ("/yes", "/no")],
                    conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    outcomes = {row["url"]: row["outcome"] for row in read_results(root, SEGMENT)}
    assert outcomes == {edge.url("moved.test", "/yes"): "success", edge.url("moved.test", "/no"): "robots_denied"}
    log = sorted(edge.requests("moved.test"), key=lambda r: r["start"])
    assert [r["path"] for r in log] == ["/robots.txt", "/real-robots.txt", "/yes"]
    assert log[1]["start"] - log[0]["end"] >= 0.1  # each hop goes through the politeness gate
    [robots] = read_results(root, SEGMENT, kind="robots")
    assert robots["state"] == "rules" and "Disallow: /no" in robots["body"]


def test_a_cross_host_robots_redirect_goes_through_the_target_hosts_gate(edge, base_conf, root):
    """elsewhere.test's robots.txt redirects to edge.test, whose pages are in the segment too: the robots.txt
    request to edge.test takes edge.test's gate, so the farm's log shows every edge.test request a delay apart."""
    conf = edge_conf(base_conf, **{"politeness.min_delay_s": 0.2})
    write_fetchlist(root, SEGMENT, [{"url": edge.url("elsewhere.test", p)} for p in ("/yes", "/no")]
                    + [{"url": edge.url("edge.test", p)} for p in ("/a", "/b")], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    outcomes = {row["url"]: row["outcome"] for row in read_results(root, SEGMENT)}
    assert outcomes[edge.url("elsewhere.test", "/yes")] == "success"
    assert outcomes[edge.url("elsewhere.test", "/no")] == "robots_denied"  # the rules edge.test served
    served = sorted(edge.requests("edge.test"), key=lambda r: r["start"])
    assert "/shared-robots" in [r["path"] for r in served]
    assert min(gaps(served)) >= 0.2


def test_a_bucket_taken_over_obeys_the_robots_txt_generate_handed_over(edge, base_conf, root):
    """A daemon new to a host whose bucket another process fetched until a moment ago, with the host's stored
    robots.txt on its first fetch-list row: it obeys that copy (no robots.txt request; the URL it denies is not
    fetched) and its first request waits one delay after the previous owner's last, not the longest Crawl-delay
    that owner may have obeyed (what it must wait when it knows no robots.txt for the host)."""
    conf = edge_conf(base_conf, **{"politeness.min_delay_s": 0.5, "politeness.max_crawl_delay_s": 5.0})
    now = datetime.now(UTC)
    handed = {"status_code": 200, "body": "User-agent: *\nDisallow: /denied\n", "fetched_at": now - timedelta(hours=1),
              "expires_at": now + timedelta(hours=1)}
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/a"), "robots": handed},
                                                {"url": edge.url("edge.test", "/denied")}], conf.crawl.buckets)
    [bucket] = fetchlist
    previous = LeaseStore(conf, root, "previous-owner")
    released_at = time.time()
    previous.release(previous.try_acquire(bucket), released_at)
    fetch_segment(conf, root, SEGMENT)
    served = edge.requests("edge.test")
    assert [r["path"] for r in served] == ["/a"]
    assert served[0]["start"] >= released_at + 0.5
    assert {row["url"]: row["outcome"] for row in read_results(root, SEGMENT)} == {
        edge.url("edge.test", "/a"): "success", edge.url("edge.test", "/denied"): "robots_denied"}
    assert read_results(root, SEGMENT, kind="robots") == []  # nothing fetched, nothing to publish


def test_a_robots_redirect_into_a_bucket_another_daemon_owns_is_not_followed(edge, base_conf, root):
    """The same redirect while another daemon holds edge.test's bucket: this daemon sends edge.test nothing (only
    the owner may), and elsewhere.test's robots.txt counts as unreachable: its URLs wait, deferred."""
    from fetchd.ownership import LeaseStore

    conf = edge_conf(base_conf)
    target, source = f"http://edge.test:{edge.port}", f"http://elsewhere.test:{edge.port}"
    buckets = next(n for n in range(conf.crawl.buckets, 64) if urls.bucket_of(target, n) != urls.bucket_of(
        source, n))  # the two hosts in different buckets, whatever the port
    conf = conf.with_overrides({"crawl.buckets": buckets})
    rival = LeaseStore(conf, root, "rival-daemon")
    held = rival.try_acquire(urls.bucket_of(target, buckets))
    assert held is not None
    try:
        write_fetchlist(root, SEGMENT, [{"url": edge.url("elsewhere.test", "/yes")}], buckets)
        fetch_segment(conf, root, SEGMENT)
    finally:
        rival.release(held, time.time())
    assert edge.requests("edge.test") == []
    assert [r["path"] for r in edge.requests("elsewhere.test")] == ["/robots.txt"]
    assert {row["outcome"] for row in read_results(root, SEGMENT)} == {"deferred"}
    [robots] = read_results(root, SEGMENT, kind="robots")
    assert (robots["state"], robots["status_code"]) == ("disallow_all", None)
    assert "another daemon owns" in robots["error"]


def test_repeated_kill_9_loses_nothing_and_repeats_only_in_flight_fetches(edge, base_conf, root):
    """`kill -9` of the daemon three times at seeded moments, then a clean run: one result per URL, every
    published row points at a readable record, no `*.open` left, and each kill repeated at most the one request
    it had in flight (one host, one request at a time), judged from the server's log."""
    paths = [f"/k{i}" for i in range(24)]
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in paths],
                                base_conf.crawl.buckets)
    [bucket] = fetchlist
    sets = {"fetch.allow_networks": "[127.0.0.0/8]", "politeness.min_delay_s": "0.1", "fetch.warc_max_bytes": "3000",
            "ownership.results_batch_rows": "2", "crawl.buckets": str(base_conf.crawl.buckets),
            "fetch.static_hosts": "{edge.test: 127.0.0.1}"}
    args = [sys.executable, "-m", "fetchd.cli", "fetch", "--segment", SEGMENT, "--root", root]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    rng = random.Random(4)
    kills = 3
    for _ in range(kills):
        wanted = len(edge.requests("edge.test")) + rng.randint(2, 5)
        process = subprocess.Popen(args, cwd=str(Path(__file__).resolve().parents[1]),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(edge.requests("edge.test")) < wanted:
            time.sleep(0.01)
        process.kill()
        process.wait(10)
        assert not Path(layout.done_manifest(root, SEGMENT, bucket)).exists()
        for row in read_results(root, SEGMENT):  # published rows point at records written before the kill
            if row["warc_filename"]:
                name = row["warc_filename"]
                if not os.path.exists(os.path.join(root, name)):
                    name += ".open"  # not closed yet: the next owner recovers it
                assert record_at(root, name, row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]
    assert 0 < len({r["url"] for r in read_results(root, SEGMENT)}) < len(paths)
    summary = fetch_segment(edge_conf(base_conf), root, SEGMENT)
    assert summary["buckets"] == [bucket]
    rows = read_results(root, SEGMENT)
    assert Counter(r["url"] for r in rows) == Counter(edge.url("edge.test", p) for p in paths)
    assert {r["outcome"] for r in rows} == {"success"}
    for row in rows:
        assert record_at(root, row["warc_filename"], row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]
    assert not [f for f in files_under(layout.segment_dir(root, SEGMENT)) if f.endswith((".open", ".tmp"))]
    requested = Counter(r["path"] for r in edge.requests("edge.test") if r["path"] != "/robots.txt")
    assert set(requested) == set(paths)
    repeats = sum(n - 1 for n in requested.values())
    assert repeats <= kills, requested


def test_a_dropped_connection_is_one_request_and_a_recorded_network_error(base_conf, root):
    """A host that reads a request and closes the connection without answering: aiohttp would send the request
    again at once on its own (the host would see two, about 1 ms apart, one in no WARC). Judged from the farm's
    log, which counts unanswered requests too: each URL asked once, the delay kept around the dropped ones, and
    the drop a network error in the results, with no WARC record."""
    dropped = ("/drop.html", "/drop.html?again=1")
    farm = SiteFarm(FarmSpec(hosts=1, pages_per_host=4, sitemaps=False, dropped_paths=dropped),
                    os.path.join(root, "farm.jsonl"))
    farm.start()
    try:
        conf = base_conf.with_overrides({"politeness.min_delay_s": MIN_DELAY, "politeness.backoff_base_s": 0.5,
                                         "politeness.backoff_recovery_factor": 0.0,
                                         "fetch.static_hosts": farm.static_hosts()})
        (home,) = farm.seed_urls()
        pages = [home + f"section/0/page-{n}.html" for n in range(3)]  # plain pages: no redirect, robots allows
        wanted = [pages[0], home + dropped[0][1:], pages[1], home + dropped[1][1:], pages[2]]
        write_fetchlist(root, SEGMENT, [{"url": u} for u in wanted], conf.crawl.buckets)
        fetch_segment(conf, root, SEGMENT)
        log = read_request_log(farm.log_path)
    finally:
        farm.stop()
    requested = Counter(r["path"] for r in log)
    assert [r.get("dropped", False) for r in log].count(True) == 2
    assert requested == Counter(["/robots.txt"] + [urls.path_and_query(u) for u in wanted])
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []
    after_drops = [log[i + 1]["start"] - log[i]["end"] for i, r in enumerate(log[:-1]) if r.get("dropped")]
    assert len(after_drops) == 2 and min(after_drops) >= 0.5  # a drop backs the host off, like any network error
    rows = by_url(read_results(root, SEGMENT))
    assert len(rows) == len(wanted)
    for url in wanted[1::2]:
        assert rows[url]["outcome"] == "network_error" and "ServerDisconnected" in rows[url]["error"]
        assert rows[url]["warc_filename"] is None
    assert all(rows[url]["outcome"] == "success" and rows[url]["warc_filename"] for url in wanted[::2])


class OutageServer(EdgeServer):
    """outage.test: robots.txt answers with rules the first time, then 503 for good."""

    def __init__(self) -> None:
        self.robots_calls = 0
        super().__init__()

    def paths(self) -> list[str]:
        """The paths outage.test was asked for, in order (its own log)."""
        return [r["path"] for r in sorted(self.requests("outage.test"), key=lambda r: r["start"])]

    @staticmethod
    def outcomes(root: str, segments: Iterable[str]) -> dict[str, dict[str, str]]:
        """segment -> last path segment of each URL -> its outcome."""
        return {s: {u.rsplit("/", 1)[1]: r["outcome"] for u, r in by_url(read_results(root, s)).items()}
                for s in segments}

    def respond(self, host, request):
        from aiohttp import web

        if host == "outage.test" and request.path == "/robots.txt":
            self.robots_calls += 1
            if self.robots_calls > 1:
                return web.Response(status=503, text="down")
        return super().respond(host, request)


def test_robots_is_fetched_again_after_its_ttl_and_an_outage_keeps_the_last_good_copy_for_a_while(base_conf, root):
    """At the daemon, real clock and loopback server: robots.txt is fetched again once `robots.cache_ttl_s` is over;
    the 503 it then gets keeps the rules fetched before in force (/secret denied, /two fetched) while the copy is
    younger than `robots.unreachable_use_cached_days`; past that the host is disallowed (deferred)."""
    server = OutageServer()
    copy_s = 6.0
    # The 503 backs the host off too (politeness): briefly here, so the page after it comes soon.
    conf = edge_conf(base_conf, **{"fetch.static_hosts": {"outage.test": "127.0.0.1"}, "robots.cache_ttl_s": 1,
                                   "robots.unreachable_retry_s": 0.2, "politeness.backoff_base_s": 0.2,
                                   "robots.unreachable_use_cached_days": copy_s / 86400})
    try:
        segments = {"seg-a": ["/one"], "seg-b": ["/two", "/secret"], "seg-c": ["/three"]}
        for segment, paths in segments.items():
            items = [{"url": server.url("outage.test", p)} for p in paths]
            write_fetchlist(root, segment, items, conf.crawl.buckets)
        fetch_segment(conf, root, "seg-a")
        good_at = time.time()
        time.sleep(1.1)  # past the TTL
        fetch_segment(conf, root, "seg-b")
        assert time.time() - good_at < copy_s, "too slow to judge the cached copy"
        time.sleep(max(0.0, copy_s + 0.2 - (time.time() - good_at)))  # past the copy's age limit and the retry
        fetch_segment(conf, root, "seg-c")
    finally:
        server.stop()
    assert OutageServer.paths(server) == ["/robots.txt", "/one", "/robots.txt", "/two", "/robots.txt"]
    outcomes = OutageServer.outcomes(root, segments)
    assert outcomes == {"seg-a": {"one": "success"}, "seg-b": {"two": "success", "secret": "robots_denied"},
                        "seg-c": {"three": "deferred"}}
    kept = read_results(root, "seg-b", kind="robots")[0]
    assert kept["status_code"] == 503 and "the copy fetched" in kept["error"]


def test_a_daemon_restarted_during_an_outage_keeps_the_stored_copy_in_force(base_conf, root):
    """A daemon restarted (its host memory gone) while robots.txt answers 503 keeps the last good copy in force, as
    a running one does: generate hands it over from `hosts` (crawler.robots.handed_over: the row after update
    merged the 503, whose body and good-copy columns still hold the rules) and the daemon adopts it. Judged from
    the server's log: /two fetched, /secret never requested. The control, a restart with nothing handed over,
    defers the host's URLs (disallow all)."""
    server = OutageServer()
    conf = edge_conf(base_conf, **{"fetch.static_hosts": {"outage.test": "127.0.0.1"},
                                   "robots.unreachable_retry_s": 0.2, "politeness.backoff_base_s": 0.2})
    try:
        write_fetchlist(root, "seg-a", [{"url": server.url("outage.test", "/one")}], conf.crawl.buckets)
        fetch_segment(conf, root, "seg-a")
        good = read_results(root, "seg-a", kind="robots")[0]
        assert good["status_code"] == 200 and "/secret" in good["body"]
        # `hosts` once update merged a later 503 (the last observation) over that answer (the last good copy).
        now = datetime.now(UTC)
        status, body, fetched_at, expires_at = handed_over(503, good["body"], now, now + timedelta(days=1), 200,
                                                           good["fetched_at"], now)
        copy = {"status_code": status, "body": body, "fetched_at": fetched_at, "expires_at": expires_at}
        forget_hosts()  # the restart
        write_fetchlist(root, "seg-b", [{"url": server.url("outage.test", "/two"), "robots": copy},
                                        {"url": server.url("outage.test", "/secret")}], conf.crawl.buckets)
        fetch_segment(conf, root, "seg-b")
        forget_hosts()
        write_fetchlist(root, "seg-c", [{"url": server.url("outage.test", "/three")}], conf.crawl.buckets)
        fetch_segment(conf, root, "seg-c")
    finally:
        server.stop()
    assert OutageServer.paths(server) == ["/robots.txt", "/one", "/robots.txt", "/two", "/robots.txt"]
    outcomes = OutageServer.outcomes(root, ("seg-b", "seg-c"))
    assert outcomes == {"seg-b": {"two": "success", "secret": "robots_denied"}, "seg-c": {"three": "deferred"}}


def test_rows_are_published_within_results_publish_s_of_their_fetch_exactly_on_the_virtual_clock(base_conf, root):
    """`ownership.results_publish_s` bounds how long a fetched row waits to be published when results come slowly
    (here one every 2 s, a host's delay; the batch of 5,000 rows would hold them all to the bucket's end): each
    row has waited 1 s, less than the next result's arrival, so each is published alone, in order."""
    conf = edge_conf(base_conf, **{"politeness.min_delay_s": 2.0, "ownership.results_publish_s": 1.0})
    assert conf.ownership.results_batch_rows == 5000
    paths = ["/a", "/b", "/c", "/d"]
    virtual.fetch_virtually(conf, root, [{"url": f"http://edge.test{p}"} for p in paths],
                            lambda host, path, earlier: virtual.Answer(404 if path == "/robots.txt" else 200, 0.0))
    [fetched] = [folder for folder in Path(root).glob("virtual-*/segments/*/fetched/bucket=*")]
    files = sorted(fetched.glob("*.parquet"))
    assert [[row["url"] for row in pq.read_table(f).to_pylist()] for f in files] == \
        [[f"http://edge.test{p}"] for p in paths]


def test_a_request_whose_lease_lapsed_while_it_waited_is_never_sent(edge, base_conf, root, monkeypatch):
    """A page whose task was handed out under epoch 1 and whose lease lapsed before the request went out (a wait for
    a global slot, or the process frozen: here, the moment it is handed out) is not sent; the next epoch fetches it.
    Judged from the server's log: one request for the page."""
    from fetchd.exchange import Exchange
    from fetchd.ownership import Lease

    conf = edge_conf(base_conf, **{"ownership.lease_ttl_s": 1.0, "ownership.renew_interval_s": 0.25,
                                   "ownership.fence_margin_s": 0.25, "ownership.takeover_grace_s": 0.0})
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", "/a")}], conf.crawl.buckets)
    [bucket] = fetchlist
    lapsed: list[int] = []  # epochs whose lease lapsed while their request waited
    real_first_request, real_fenced = Exchange.first_request, Lease.fenced

    async def lapse_then_request(self, item):
        if not lapsed:
            lapsed.append(1)
        return await real_first_request(self, item)

    monkeypatch.setattr(Exchange, "first_request", lapse_then_request)
    monkeypatch.setattr(Lease, "fenced", lambda self, now_mono=None: self.record.epoch in lapsed
                        or real_fenced(self, now_mono))
    assert fetch_segment(conf, root, SEGMENT)["buckets"] == [] and lapsed == [1]  # stopped, nothing sent
    assert [r["path"] for r in edge.requests("edge.test")] == ["/robots.txt"] and not read_results(root, SEGMENT)
    time.sleep(1.2)  # epoch 1 expires: the next run takes the bucket over
    assert fetch_segment(conf, root, SEGMENT)["buckets"] == [bucket]
    assert [r["path"] for r in edge.requests("edge.test") if r["path"] == "/a"] == ["/a"]
    [row] = read_results(root, SEGMENT)
    assert row["outcome"] == "success"
    assert LeaseStore(conf, root, "observer").latest(bucket).epoch == 2
