"""`crawl maintain` on real Delta tables: compaction keeps contents, VACUUM deletes old files, figures add up."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from crawler.config import ConfigError
from delta_tables.tables import table_df, table_path
from jobs import generate, maintain
from tests.support.due_files import remove_files_due_after, url_rows
from tests.support.tables import append_rows, table_rows, table_versions

APPENDS = 5
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _fill(spark, root: str) -> None:
    """Five small appends to `segments` (unpartitioned) and `hosts` (4 bucket partitions)."""
    for i in range(APPENDS):
        append_rows(spark, root, "segments", [
            {"segment_id": f"seg-{i}", "bucket": b, "state": "generated", "url_count": 10 * i + b,
             "counters": {"x": i}} for b in range(3)
        ], WHEN)
        append_rows(spark, root, "hosts", [
            {"host_key": f"http://h{i}-{b}.test", "bucket": b, "fetches": i * b, "domain": f"h{i}-{b}.test"}
            for b in range(4)
        ], WHEN)


def _snapshot(spark, root: str, name: str) -> list:
    return sorted(table_df(spark, root, name).collect(), key=lambda r: (r["bucket"], str(r[0])))


def _files_per_partition(spark, root: str, name: str) -> dict[int, int]:
    rows = (table_df(spark, root, name).groupBy("bucket")
            .agg(F.countDistinct("_metadata.file_path").alias("files")).collect())
    return {r["bucket"]: r["files"] for r in rows}


def _parquet_on_disk(root: str, name: str) -> int:
    count = 0
    for _folder, dirs, files in os.walk(table_path(root, name)):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if f.endswith(".parquet"))
    return count


def test_hosts_rows_older_than_the_domain_column_get_their_registered_domain_once(spark, base_conf, tables_root):
    append_rows(spark, tables_root, "hosts", [
        {"host_key": "http://a.b.example.co.uk", "bucket": 1},
        {"host_key": "https://www.example.com:8443", "bucket": 2},
        {"host_key": "http://127.0.0.1:8080", "bucket": 3},
        {"host_key": "http://set.test", "bucket": 0, "domain": "kept.test"}])
    assert maintain.run(spark, base_conf, tables_root, tables=["hosts"], vacuum=False).domains_filled == 3
    assert {r.host_key: r.domain for r in table_df(spark, tables_root, "hosts").collect()} == {
        "http://a.b.example.co.uk": "example.co.uk", "https://www.example.com:8443": "example.com",
        "http://127.0.0.1:8080": "127.0.0.1", "http://set.test": "kept.test"}
    versions = table_versions(tables_root)
    assert maintain.fill_host_domains(spark, tables_root) == 0
    assert table_versions(tables_root) == versions  # nothing left to fill: no MERGE, no commit


@pytest.mark.slow
def test_optimize_compacts_to_one_file_per_partition_and_keeps_contents(spark, base_conf, tables_root):
    root = tables_root
    _fill(spark, root)
    before = {name: _snapshot(spark, root, name) for name in ("segments", "hosts")}
    assert sum(_files_per_partition(spark, root, "segments").values()) >= APPENDS
    assert all(files >= APPENDS for files in _files_per_partition(spark, root, "hosts").values())

    result = maintain.run(spark, base_conf, root, tables=["segments", "hosts"], vacuum=False)

    figures = {t.name: t for t in result.tables}
    assert set(figures) == {"segments", "hosts"} and result.missing == []
    assert _files_per_partition(spark, root, "hosts") == {0: 1, 1: 1, 2: 1, 3: 1}
    assert _files_per_partition(spark, root, "segments") == {0: 1, 1: 1, 2: 1}  # one file holds every bucket
    assert figures["hosts"].files_after == 4 and figures["segments"].files_after == 1
    assert figures["hosts"].files_compacted == figures["hosts"].files_before >= 4 * APPENDS
    assert figures["hosts"].files_written == 4
    assert figures["segments"].rows == 3 * APPENDS and figures["hosts"].rows == 4 * APPENDS
    assert figures["hosts"].vacuum_removed == 0 and result.domains_filled == 0
    for name, rows in before.items():
        assert _snapshot(spark, root, name) == rows

    on_disk = _parquet_on_disk(root, "hosts")
    again = maintain.run(spark, base_conf, root, tables=["segments", "hosts"])  # default 168 h retention
    for t in again.tables:
        assert (t.files_before, t.files_after) == (figures[t.name].files_after, figures[t.name].files_after)
        assert (t.files_compacted, t.files_written, t.vacuum_removed) == (0, 0, 0)
    assert _parquet_on_disk(root, "hosts") == on_disk  # replaced files younger than 7 days stay for time travel
    for name, rows in before.items():
        assert _snapshot(spark, root, name) == rows
    rendered = again.render()
    assert len(rendered.splitlines()) == 4 and "hosts" in rendered and "segments" in rendered
    assert again.summary().startswith("2 tables: files 5 -> 5")


@pytest.mark.slow
def test_vacuum_with_zero_retention_deletes_replaced_files(spark, base_conf, tables_root, caplog):
    root = tables_root
    _fill(spark, root)
    before = _snapshot(spark, root, "segments")
    on_disk = _parquet_on_disk(root, "segments")
    assert on_disk >= APPENDS
    conf = base_conf.with_overrides({"maintain.vacuum_retention_hours": 0})

    context = spark.sparkContext
    context.setJobGroup("vacuum-test", "maintain with vacuum")
    try:
        with caplog.at_level(logging.WARNING, logger="jobs.maintain"):
            result = maintain.run(spark, conf, root, tables=["segments"])
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    # Each job's and stage's info asked once: the status store may drop old entries between two asks (it keeps
    # spark.ui.retainedStages of them, and the session's background cycles add more meanwhile).
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup("vacuum-test")]
    stages = [tracker.getStageInfo(stage) for job in jobs if job is not None for stage in job.stageIds]
    tasks = [stage.numTasks for stage in stages if stage is not None]
    # VACUUM lists files in maintain.vacuum_listing_tasks (0: 4 x the default parallelism), not Delta's 10000.
    assert tasks and max(tasks) <= 4 * context.defaultParallelism, tasks

    assert "maintain.vacuum_retention_hours=0" in caplog.text
    (segments,) = result.tables
    assert _parquet_on_disk(root, "segments") == 1
    assert segments.vacuum_removed == on_disk  # every appended file was replaced by the one compacted file
    assert segments.files_after == 1 and segments.rows == 3 * APPENDS
    assert _snapshot(spark, root, "segments") == before
    # The safety check is back on for everyone else once maintain returns.
    assert spark.conf.get(maintain.RETENTION_CHECK_CONF, None) in (None, "true")
    assert spark.conf.get(maintain.LISTING_PARALLELISM_CONF, None) in (None, "10000")
    assert "vacuum removed" in result.summary()


def test_missing_and_unknown_tables(spark, base_conf, root):
    result = maintain.run(spark, base_conf, root, tables=["urls"])
    assert result.tables == [] and result.missing == ["urls"]
    with pytest.raises(ValueError, match="nope"):
        maintain.run(spark, base_conf, root, tables=["nope"])


@pytest.mark.parametrize("value", [-1, "a week", True])
def test_bad_retention_is_a_config_error_naming_the_key(base_conf, value):
    with pytest.raises(ConfigError) as info:
        base_conf.with_overrides({"maintain.vacuum_retention_hours": value})
    assert info.value.key == "maintain.vacuum_retention_hours"


@pytest.mark.parametrize(("key", "value"), [("maintain.target_file_mb", 0), ("maintain.urls_files_per_bucket", 0),
                                          ("maintain.urls_min_file_mb", -1), ("maintain.urls_files_per_bucket", "x")])
def test_bad_file_sizes_are_a_config_error_naming_the_key(base_conf, key, value):
    with pytest.raises(ConfigError) as info:
        base_conf.with_overrides({key: value})
    assert info.value.key == key


def test_clustered_files_are_a_bucket_cut_into_the_configured_count_above_the_floor(base_conf):
    mb = 1024 * 1024
    assert maintain.clustered_file_bytes(base_conf, 4 * 32 * 10 * mb, 4) == 10 * mb  # 32 files a bucket of 4
    assert maintain.clustered_file_bytes(base_conf, 4 * 32 * mb // 2, 4) == mb  # never under the 1 MB floor
    finer = base_conf.with_overrides({"maintain.urls_files_per_bucket": 8, "maintain.urls_min_file_mb": 0})
    assert maintain.clustered_file_bytes(finer, 80, 1) == 10 and maintain.clustered_file_bytes(finer, 0, 0) == 1


def test_urls_clustered_by_due_time_so_generate_skips_the_files_not_due_yet(spark, base_conf, tables_root):
    """maintain cuts each bucket of `urls` into files of disjoint slices of next_fetch_at (contents unchanged);
    then a generate opens only the files whose slice has begun (the others are deleted from storage here, so
    reading one would fail it)."""
    # A handful of rows: small files, several a bucket.
    conf = base_conf.with_overrides({"maintain.urls_files_per_bucket": 4, "maintain.urls_min_file_mb": 0})
    now, buckets = WHEN, base_conf.crawl.buckets
    rows = []
    for host in ("http://a.test", "http://b.test"):  # one append: each bucket's one file spans every due time
        for day in range(40):
            rows += url_rows(host, range(5 * day, 5 * day + 5), now + timedelta(days=day, hours=-1), buckets)
    append_rows(spark, tables_root, "urls", rows, now)
    before = table_rows(spark, tables_root, "urls")

    figures = maintain.run(spark, conf, tables_root, tables=["urls"], vacuum=False).tables[0]

    assert table_rows(spark, tables_root, "urls") == before
    slices = (table_df(spark, tables_root, "urls").groupBy("bucket", "_metadata.file_path")
              .agg(F.min("next_fetch_at").alias("first"), F.max("next_fetch_at").alias("last"))
              .orderBy("bucket", "first").collect())
    assert figures.files_after == len(slices) > 2 * len({r["bucket"] for r in slices})
    for earlier, later in zip(slices, slices[1:], strict=False):
        if earlier["bucket"] == later["bucket"]:
            assert earlier["last"] <= later["first"]
    assert len(remove_files_due_after(spark, tables_root, now))

    result = generate.run(spark, base_conf, tables_root, "seg-clustered", now)

    assert result.url_count == 10  # day 0's five pages of each host
