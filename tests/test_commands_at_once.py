"""Commands at the same time on one root (docs/architecture.md, "Commands on one root at the same time"): the
crawl's writer lock lets one of generate, rebucket, update and inject run at a time, and a segment is published
only once its leases are committed.

The races are made deterministic: the first command is stopped at a known point while it holds the lock (a
function of its job module patched to wait), the second is started in a thread of its own (its own SparkSession on
the shared SparkContext), and the test goes on once the second logs that it waits. No sleeping on guesses."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crawler import layout
from crawler.errors import CrawlBusy, UserError
from delta_tables import tables
from fetchd.progress import pending_buckets, pending_work, segment_progress, unfinished_buckets
from fetchd.storage import open_store
from jobs import cli, generate, inject, rebucket
from jobs.storage import Storage
from tests.support.config import SPARK_CLI_SETTINGS
from tests.support.s3 import moto_server
from tests.support.tables import replace_root

# Hosts some of which `politeness.key: domain` puts in another bucket than `host` does (4 buckets).
SEEDS = [f"http://{name}/{page}" for name in ("a.news.test", "b.news.test", "c.news.test", "www.shop.test",
                                               "shop.test", "solo.test") for page in ("x", "y", "z")]
WAITING = "waiting up to"  # what a command waiting for the writer lock logs


class Pause:
    """`module.name` patched to stop (before doing its work) until `go` is set, when `only(*args)` holds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
                 only: Callable[..., bool] = lambda *args, **kwargs: True):
        self.reached, self.go = threading.Event(), threading.Event()
        original = getattr(module, name)

        def paused(*args: Any, **kwargs: Any) -> Any:
            if only(*args, **kwargs):
                self.reached.set()
                assert self.go.wait(600), "never let go"
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, paused)


class Running(threading.Thread):
    """`work()` in a thread of its own; `outcome()` is its result, or raises what it raised."""

    def __init__(self, work: Callable[[], Any]):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # handed to the test by outcome()
            self.error = exc

    def outcome(self, timeout: float = 900) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.result


def _eventually(condition: Callable[[], bool], timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def _waiting(caplog: pytest.LogCaptureFixture) -> Callable[[], bool]:
    return lambda: any(WAITING in record.getMessage() for record in list(caplog.records))


def _listed(root: str, segment_id: str) -> dict[str, int]:
    """URL -> bucket of every row of a segment's fetch list (none for a segment without one)."""
    import pyarrow.parquet as pq

    folder, found = layout.fetchlist_dir(root, segment_id), {}
    if not os.path.isdir(folder):
        return found
    for name in os.listdir(folder):
        bucket = layout.parse_bucket_dirname(name)
        for file in os.listdir(os.path.join(folder, name)) if bucket is not None else ():
            if file.endswith(".parquet"):
                found.update((url, bucket) for url in pq.read_table(os.path.join(folder, name, file))
                             .column("url").to_pylist())
    return found


def _urls(spark, root: str) -> dict[str, Any]:
    return {row.url: row for row in tables.table_df(spark, root, "urls").collect()}


def _segment_rows(spark, root: str) -> set[str]:
    return {row.segment_id for row in tables.table_df(spark, root, "segments").collect()}


def _assert_leased_as_listed(spark, root: str, segment_id: str) -> dict[str, int]:
    """Every URL of the segment's fetch list is leased to it, in the bucket its list has it in: no lease lost."""
    listed, rows = _listed(root, segment_id), _urls(spark, root)
    assert listed
    assert {url: (rows[url].lease_segment, rows[url].bucket) for url in listed} == {
        url: (segment_id, bucket) for url, bucket in listed.items()}
    return listed


@pytest.fixture(scope="module")
def _injected(spark, base_conf, new_tables_root, tmp_path_factory) -> str:
    """A root with SEEDS injected, built once for the module."""
    base = tmp_path_factory.mktemp("injected")
    seeds = base / "seeds.txt"
    seeds.write_text("\n".join(SEEDS) + "\n")
    root = new_tables_root(base / "root")
    inject.run(spark, base_conf, root, str(seeds))
    return root


@pytest.fixture
def crawl(_injected, tables_root) -> str:
    """The test's root: a copy of `_injected`."""
    return replace_root(tables_root, _injected)


def _soon() -> datetime:
    """A generate's `now` at which the crawl's seeds, just injected, are due."""
    return datetime.now(UTC) + timedelta(minutes=1)


def test_a_segment_generate_has_not_published_is_no_segment_to_the_daemons(tmp_path):
    """No Spark: fetch lists laid out by hand, one segment still marked `_GENERATING.json`."""
    root = str(tmp_path)
    for segment_id in ("seg-1", "seg-2"):
        for bucket in (0, 2):
            os.makedirs(layout.fetchlist_dir(root, segment_id, bucket))
    marker = layout.generating_marker(root, "seg-2")
    with open(marker, "w", encoding="utf-8") as handle:
        handle.write("{}")
    assert pending_work(root) == {0: ["seg-1"], 2: ["seg-1"]}
    assert segment_progress(root, "seg-2").listed == [] and unfinished_buckets(root, "seg-2") == []
    assert pending_buckets(root, "seg-2") == [] and segment_progress(root, "seg-1").listed == [0, 2]
    os.remove(marker)  # published
    assert pending_work(root) == {0: ["seg-1", "seg-2"], 2: ["seg-1", "seg-2"]}


def test_on_s3_too_the_marker_hides_a_segment_and_generate_can_write_and_remove_it(base_conf, tmp_path):
    """The daemons' S3 store looks for the marker with a HEAD; the jobs' storage (pyarrow) writes, finds and
    removes it and a segment's folder."""
    with moto_server() as s3:
        s3.make_bucket("unpublished")
        root, client = "s3://unpublished/crawl", s3.client()
        for segment_id in ("seg-1", "seg-2"):
            client.put_object(Bucket="unpublished", Body=b"rows",
                              Key=f"crawl/segments/{segment_id}/fetchlist/bucket=00001/part-0.parquet")
        storage = Storage(endpoint_url=s3.endpoint, path_style_access=True)
        marker = layout.generating_marker(root, "seg-2")
        storage.write_bytes(marker, b"{}")
        assert storage.exists(marker)
        conf = base_conf.with_overrides({"s3.endpoint_url": s3.endpoint, "s3.path_style_access": True,
                                         "fetch.staging_dir": str(tmp_path / "staging")})
        store = open_store(conf, root)
        try:
            assert pending_work(store) == {1: ["seg-1"]}
            storage.delete_file(marker)
            assert not storage.exists(marker) and pending_work(store) == {1: ["seg-1", "seg-2"]}
            storage.delete_folder(layout.segment_dir(root, "seg-2"))
            assert pending_work(store) == {1: ["seg-1"]}
        finally:
            store.close()


@pytest.mark.slow
def test_two_generates_at_once_never_list_a_url_twice(spark, base_conf, crawl, monkeypatch, caplog, capsys):
    """The second generate waits for the first: refused (exit 75, one line naming the first) when the first takes
    longer than `writer_lock.wait_s`, leaving nothing a daemon or backpressure would see; else it generates a
    segment of other URLs once the first is done."""
    root, now = crawl, _soon()
    conf = base_conf.with_overrides({"generate.segment_max_urls": 6, "writer_lock.wait_s": 1.0})
    pause = Pause(monkeypatch, generate, "write_fetchlist", lambda selected, path: "/seg-a/" in path)
    first = Running(lambda: generate.run(spark.newSession(), conf, root, "seg-a", now))
    assert pause.reached.wait(300)

    with pytest.raises(CrawlBusy, match=r"busy: `crawl generate` \(.*/\d+, since .*\) holds its writer lock"):
        generate.run(spark, conf, root, "seg-b", now)
    code = cli.main(["generate", "--root", root, "--segment", "seg-c", "--set", "writer_lock.wait_s=0",
                     "--set", "crawl.buckets=4", *SPARK_CLI_SETTINGS])
    err = capsys.readouterr().err.strip()
    assert code == 75 and len(err.splitlines()) == 1 and "`crawl generate`" in err, err
    for refused in ("seg-b", "seg-c"):
        assert not os.path.exists(layout.segment_dir(root, refused))
    assert not any(lease for lease in (row.lease_segment for row in _urls(spark, root).values())
                   if lease in ("seg-b", "seg-c"))

    caplog.clear()  # seg-b's wait was logged
    patient = conf.with_overrides({"writer_lock.wait_s": 600.0})
    second = Running(lambda: generate.run(spark.newSession(), patient, root, "seg-d", now))
    assert _eventually(_waiting(caplog))
    # While seg-a is mid-way it is no segment to anyone: its fetch list is being written, its leases are not.
    assert "seg-a" not in _segment_rows(spark, root) and not segment_progress(root, "seg-a").listed
    pause.go.set()
    assert first.outcome().url_count == 6 and second.outcome().url_count == 6
    listed_a = _assert_leased_as_listed(spark, root, "seg-a")
    listed_d = _assert_leased_as_listed(spark, root, "seg-d")
    assert not set(listed_a) & set(listed_d)
    assert _segment_rows(spark, root) == {"seg-a", "seg-d"}
    assert sorted({s for segments in pending_work(root).values() for s in segments}) == ["seg-a", "seg-d"]


@pytest.mark.slow
def test_a_generate_that_fails_its_lease_leaves_nothing_and_a_crashed_ones_leftovers_are_removed(
        spark, base_conf, crawl, monkeypatch, capsys):
    """A lease commit lost to a write conflict (or anything else) removes the fetch list written before it; what a
    generate killed mid-way left (marked `_GENERATING.json`) is seen by no reader and removed by the next."""
    root, now = crawl, _soon()

    def conflict(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("ConcurrentAppendException: Files were added to the root of the table")

    with monkeypatch.context() as patched:
        patched.setattr(generate, "lease", conflict)
        with pytest.raises(RuntimeError, match="ConcurrentAppendException"):
            generate.run(spark, base_conf, root, "seg-lost", now)
    assert not os.path.exists(layout.segment_dir(root, "seg-lost"))
    assert "seg-lost" not in _segment_rows(spark, root) and not pending_work(root)

    # A generate killed after writing its fetch list: the folder and its marker stay behind.
    crashed = layout.fetchlist_dir(root, "seg-crashed", 1)
    os.makedirs(crashed)
    with open(os.path.join(crashed, "part-0.parquet"), "wb"):
        pass
    with open(layout.generating_marker(root, "seg-crashed"), "w", encoding="utf-8") as marker:
        json.dump({"segment_id": "seg-crashed"}, marker)
    assert not pending_work(root) and segment_progress(root, "seg-crashed").listed == []
    code = cli.main(["parse", "--root", root, "--segment", "seg-crashed", *SPARK_CLI_SETTINGS])
    assert code == 2 and "unknown segment 'seg-crashed'" in capsys.readouterr().err  # to every command

    assert generate.run(spark, base_conf, root, "seg-next", now).url_count == len(SEEDS)
    assert not os.path.exists(layout.segment_dir(root, "seg-crashed"))
    assert set(map(tuple, pending_work(root).values())) == {("seg-next",)}


@pytest.mark.slow
def test_rebucket_started_while_a_generate_runs_waits_and_loses_no_lease(spark, base_conf, crawl, monkeypatch,
                                                                          caplog):
    """Rebucket waits for the generate holding the lock, then finds its segment open and refuses (exit 2)."""
    root, now = crawl, _soon()
    pause = Pause(monkeypatch, generate, "lease")
    running = Running(lambda: generate.run(spark.newSession(), base_conf, root, "seg-g", now))
    assert pause.reached.wait(300)
    by_domain = base_conf.with_overrides({"politeness.key": "domain", "writer_lock.wait_s": 600.0})
    waiting = Running(lambda: rebucket.run(spark.newSession(), by_domain, root))
    assert _eventually(_waiting(caplog))
    pause.go.set()
    assert running.outcome().url_count == len(SEEDS)
    with pytest.raises(UserError, match="segments are open: seg-g"):
        waiting.outcome()
    assert len(_assert_leased_as_listed(spark, root, "seg-g")) == len(SEEDS)
    assert generate.run(spark, base_conf, root, "seg-after", now).empty  # no URL goes into a second segment


@pytest.mark.slow
def test_a_generate_started_while_rebucket_runs_waits_and_leases_in_the_new_buckets(spark, base_conf, crawl,
                                                                                   monkeypatch, caplog):
    """Generate waits for rebucket to finish, then selects and leases from the rewritten table: every URL it
    lists is leased to it, in its new bucket."""
    root, now = crawl, _soon()
    by_domain = base_conf.with_overrides({"politeness.key": "domain", "writer_lock.wait_s": 600.0})
    pause = Pause(monkeypatch, rebucket, "_rewrite")
    running = Running(lambda: rebucket.run(spark.newSession(), by_domain, root))
    assert pause.reached.wait(300)
    waiting = Running(lambda: generate.run(spark.newSession(), by_domain, root, "seg-w", now))
    assert _eventually(_waiting(caplog))
    pause.go.set()
    assert running.outcome().rewritten == ("urls", "hosts")
    assert waiting.outcome().url_count == len(SEEDS)
    listed = _assert_leased_as_listed(spark, root, "seg-w")
    with open(layout.crawl_record(root), encoding="utf-8") as record:
        assert json.load(record)["politeness.key"] == "domain"
    from crawler.bucketing import Bucketing

    placing = Bucketing(4, "domain")
    assert listed == {url: placing.bucket(_urls(spark, root)[url].host_key) for url in listed}
