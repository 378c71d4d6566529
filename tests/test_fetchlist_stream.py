"""The daemon streams a bucket's fetch list: rows are read in record batches and taken on only while the host
queues hold fewer than `fetch.max_queued_urls`. Run against the loopback site farm; politeness is judged from
the farm's own log, the queue bound from the scheduler's own count (never from timing)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawler import layout, records, urls
from crawler.scheduling import HostScheduler
from fetchd import daemon as daemon_mod
from fetchd.bucketrun import BucketRun
from fetchd.commands import fetch_segment
from fetchd.fetchlist import FetchList, KeySet, handed_over_robots, result_key
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.fetchlists import read_results

SEGMENT = "seg-stream"
MIN_DELAY = 0.1
WATERMARK = 10
HOSTS = 8


def fetchlist_rows(page_urls: set[str]) -> list[dict]:
    """FETCHLIST rows, rank = position within the host in URL order."""
    by_host: dict[str, list[str]] = {}
    for url in sorted(map(urls.canonicalize, page_urls)):
        by_host.setdefault(urls.host_key(url), []).append(url)
    return [
        {"segment_id": SEGMENT, "url_id": urls.url_id(url), "url": url, "host_key": key, "state_version": 1,
         "rank": rank, "priority": 1.0, "depth": 0, "delay_s": MIN_DELAY}
        for key, host_urls in by_host.items() for rank, url in enumerate(host_urls, 1)
    ]


def order(rows: list[dict], how: str) -> list[dict]:
    if how == "generate":  # what jobs/generate.py writes: hosts interleaved
        return sorted(rows, key=lambda r: (r["rank"], r["host_key"]))
    if how == "host-major":
        return sorted(rows, key=lambda r: (r["host_key"], r["rank"]))
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)
    return shuffled


def write_fetchlist(root: str, rows: list[dict]) -> None:
    """One bucket (crawl.buckets 1) in two part files, rows in the given order."""
    folder = layout.fetchlist_dir(root, SEGMENT, 0)
    os.makedirs(folder)
    half = len(rows) // 2
    for part, chunk in enumerate((rows[:half], rows[half:])):
        pq.write_table(pa.Table.from_pylist(chunk, schema=records.FETCHLIST), f"{folder}/part-{part:05d}.parquet")
    Path(folder, "_SUCCESS").touch()


@pytest.fixture
def farm(tmp_path):
    farm = SiteFarm(FarmSpec(hosts=HOSTS, pages_per_host=8), tmp_path / "farm.jsonl")
    farm.start()
    yield farm
    farm.stop()


@pytest.fixture
def conf(base_conf, farm):
    return base_conf.with_overrides({
        "politeness.min_delay_s": MIN_DELAY,
        "fetch.static_hosts": farm.static_hosts(),
        "crawl.buckets": 1,
        "fetch.max_queued_urls": WATERMARK,
    })


@pytest.fixture
def intake(monkeypatch):
    """The scheduler's own count after every row taken on, checked against its queues; and small read batches,
    so the list is read in many batches over two files."""
    seen = {"added": 0, "peak": 0, "hosts_when_full": None}
    original = HostScheduler.add

    def add(self: HostScheduler, row: dict) -> None:
        original(self, row)
        assert self.queued == sum(len(h.queue) for h in self.hosts.values())
        seen["added"] += 1
        seen["peak"] = max(seen["peak"], self.queued)
        if self.queued == WATERMARK and seen["hosts_when_full"] is None:
            seen["hosts_when_full"] = sum(bool(h.queue) for h in self.hosts.values())

    monkeypatch.setattr(HostScheduler, "add", add)
    monkeypatch.setattr(daemon_mod, "read_fetchlist", lambda root, seg, bucket: FetchList(root, seg, bucket, 3))
    return seen


def page_requests(log: list[dict]) -> Counter[str]:
    return Counter(f"http://{r['host']}{r['path']}" for r in log if r["path"] != "/robots.txt")


@pytest.mark.parametrize("how", ["generate", "host-major", "shuffled"])
def test_streamed_list_gives_one_result_per_url_politely_within_the_watermark(farm, conf, intake, root, how):
    rows = order(fetchlist_rows(farm.page_urls()), how)
    assert len(rows) > 4 * WATERMARK
    write_fetchlist(root, rows)
    summary = fetch_segment(conf, root, SEGMENT)
    assert summary["buckets"] == [0] and summary["urls"] == len(rows)
    results = read_results(root, SEGMENT)
    assert Counter(r["url_id"] for r in results) == Counter(r["url_id"] for r in rows)
    assert Counter(r["outcome"] for r in results)["success"] > len(rows) // 2
    log = read_request_log(farm.log_path)
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []
    listed = {r["url"] for r in rows}
    assert max(c for u, c in page_requests(log).items() if u in listed) == 1
    assert intake["added"] == len(rows) and intake["peak"] == WATERMARK  # the bound was reached, never passed
    if how == "generate":  # interleaved hosts: a full window spans every host
        assert intake["hosts_when_full"] == HOSTS
    elif how == "host-major":
        assert intake["hosts_when_full"] < HOSTS


def test_stopped_stream_is_not_done_and_resumes_with_only_what_was_not_reported(farm, conf, intake, root,
                                                                                 monkeypatch):
    rows = order(fetchlist_rows(farm.page_urls()), "generate")
    write_fetchlist(root, rows)
    emit = BucketRun._emit

    def emit_then_stop(self: BucketRun, row: dict) -> None:
        emit(self, row)
        if sum(self.outcomes.values()) >= 5:
            self.stop_signal.daemon_stop.set()  # as SIGTERM sets it

    monkeypatch.setattr(BucketRun, "_emit", emit_then_stop)
    first = fetch_segment(conf, root, SEGMENT)
    assert first["buckets"] == [] and not os.path.exists(layout.done_manifest(root, SEGMENT, 0))
    assert intake["added"] < len(rows)  # stopped with rows still unread
    reported = {r["url_id"] for r in read_results(root, SEGMENT)}
    assert 5 <= len(reported) < len(rows)
    first_log_lines = len(read_request_log(farm.log_path))

    monkeypatch.setattr(BucketRun, "_emit", emit)
    intake["added"] = 0
    second = fetch_segment(conf, root, SEGMENT)
    assert second["buckets"] == [0]
    results = read_results(root, SEGMENT)
    assert Counter(r["url_id"] for r in results) == Counter(r["url_id"] for r in rows)
    assert intake["added"] == len(rows) - len(reported)  # reported rows were skipped while streaming
    log = read_request_log(farm.log_path)
    again = page_requests(log[first_log_lines:])
    assert not {r["url"] for r in rows if r["url_id"] in reported} & set(again)
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, MIN_DELAY)) == []
    manifest = json.loads(Path(layout.done_manifest(root, SEGMENT, 0)).read_text())
    assert manifest["urls"] == len(rows) and manifest["resumed"] == len(reported)
    assert sum(manifest["outcomes"].values()) == len(rows)


def test_fetchlist_reader_skips_reported_rows_across_batches_and_files(root):
    rows = fetchlist_rows({f"http://h{i % 3}.test/p{i}" for i in range(20)})
    write_fetchlist(root, rows)
    reported = rows[::4]
    done = KeySet.of(result_key(r["url_id"], r["state_version"]) for r in reported)
    done_other_version = KeySet.of(result_key(r["url_id"], 2) for r in reported)
    fetchlist = FetchList(root, SEGMENT, 0, batch_rows=3)
    listed, todo = fetchlist.scan(done)
    assert len(fetchlist) == 20 and todo == 15 and len(listed) == 20
    assert all(r["url"] in listed for r in rows) and "http://h0.test/elsewhere" not in listed
    assert [r["url_id"] for r in fetchlist.rows(done)] == [r["url_id"] for r in rows if r not in reported]
    assert len(list(fetchlist.rows(done_other_version))) == 20  # a result for another lease does not count
    assert list(FetchList(root, SEGMENT, 0).rows(KeySet()))[0] == {
        **rows[0], "etag": None, "last_modified": None, "max_concurrency": None, "last_fetch_at": None,
        "sitemap_origin": None, **dict.fromkeys(records.FETCHLIST_ROBOTS), **dict.fromkeys(records.FETCHLIST_STORED)}


def test_a_hosts_first_row_hands_over_its_robots_txt_as_stored(root):
    """The rows as the daemon reads them: the host's first carries the observation (its times UTC-aware, as
    generate's Spark writer leaves them naive), the others none."""
    rows = fetchlist_rows({f"http://h{i % 3}.test/p{i}" for i in range(9)})
    at = datetime(2026, 12, 1, tzinfo=UTC)
    handed = {"status_code": 200, "body": "User-agent: *\nDisallow: /x\n", "fetched_at": at,
              "expires_at": at + timedelta(days=1)}
    carriers = [r for r in rows if r["rank"] == 1][:2]
    for row in carriers:
        row.update({f"robots_{k}": v for k, v in handed.items()})
    write_fetchlist(root, order(rows, "generate"))
    read = {r["url_id"]: handed_over_robots(r) for r in FetchList(root, SEGMENT, 0, batch_rows=2).rows(KeySet())}
    assert {url_id for url_id, robots in read.items() if robots is not None} == {r["url_id"] for r in carriers}
    assert all(robots == handed for robots in read.values() if robots is not None)


def test_a_resumed_bucket_still_hands_over_the_robots_txt_of_a_host_whose_first_row_was_reported(root):
    """The first row carried the host's stored robots.txt and its result was reported before the restart: the
    host's first row left carries it instead (across read batches), so the resumed run still adopts it."""
    rows = fetchlist_rows({f"http://h{i % 3}.test/p{i}" for i in range(12)})
    at = datetime(2026, 12, 1, tzinfo=UTC)
    handed = {"status_code": 200, "body": "User-agent: *\nDisallow: /x\n", "fetched_at": at, "expires_at": at}
    first_of = {r["host_key"]: r for r in sorted(rows, key=lambda r: -r["rank"])}
    for row in first_of.values():
        row.update({f"robots_{k}": v for k, v in handed.items()})
    write_fetchlist(root, order(rows, "generate"))
    reported = [first_of["http://h0.test"], first_of["http://h1.test"]]
    done = KeySet.of(result_key(r["url_id"], r["state_version"]) for r in reported)
    read = list(FetchList(root, SEGMENT, 0, batch_rows=2).rows(done))
    carriers = {r["host_key"]: r["rank"] for r in read if handed_over_robots(r) is not None}
    assert carriers == {"http://h0.test": 2, "http://h1.test": 2, "http://h2.test": 1}
    assert all(handed_over_robots(r) == handed for r in read if r["host_key"] in carriers and r["rank"] ==
               carriers[r["host_key"]])
    assert len(read) == len(rows) - 2


def test_a_fetch_list_from_before_a_column_existed_reads_as_null(root):
    """A segment generated by the previous version (no sitemap_origin column) is still fetched after an upgrade."""
    rows = fetchlist_rows({f"http://h{i}.test/p" for i in range(4)})
    folder = layout.fetchlist_dir(root, SEGMENT, 0)
    os.makedirs(folder)
    old_schema = pa.schema([f for f in records.FETCHLIST if f.name != "sitemap_origin"])
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema), f"{folder}/part-00000.parquet")
    read = list(FetchList(root, SEGMENT, 0).rows(KeySet()))
    assert [r["url_id"] for r in read] == [r["url_id"] for r in rows]
    assert all(r["sitemap_origin"] is None and r["host_key"] for r in read)
