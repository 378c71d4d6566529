"""Table definitions: a crawl root written by an older version gains the columns added since; jobs create and
upgrade a root's tables once per process, then only check that they are still there."""

from __future__ import annotations

import shutil
from datetime import datetime

import pytest
from delta.tables import DeltaTable
from pyspark.sql.types import StructType

from delta_tables import tables
from tests.support.tables import append_rows, unchanged_tables


def test_create_all_adds_missing_nullable_columns_to_an_existing_table(spark, root):
    # A root from before the last two columns were added (columns are only ever added at the end).
    old_schema = StructType(tables.URLS.schema.fields[:-2])
    added = [f.name for f in tables.URLS.schema.fields[-2:]]
    path = tables.table_path(root, "urls")
    DeltaTable.createIfNotExists(spark).location(path).addColumns(old_schema).partitionedBy("bucket").execute()
    row = {f.name: None for f in old_schema.fields}
    row.update(url_id="0" * 32, url="http://a.test/", host_key="http://a.test", bucket=1, status="unfetched",
               state_version=0, priority=1.0, depth=0, source="seed", failure_count=0, inlinks=0,
               fetch_interval_s=60)
    for name in ("discovered_at", "next_fetch_at", "updated_at"):
        row[name] = datetime(2026, 1, 1)
    spark.createDataFrame([row], old_schema).write.format("delta").mode("append").save(path)

    created = tables.create_all(spark, root)
    assert "urls" not in created and "pages" in created
    df = tables.table_df(spark, root, "urls")
    assert df.columns == [f.name for f in tables.URLS.schema.fields]
    [stored] = df.collect()
    assert stored.url == "http://a.test/" and all(stored[name] is None for name in added)
    assert tables.create_all(spark, root) == []  # nothing left to add or create


def _counting_create_all(monkeypatch, watched: str) -> list[str]:
    """Each time ensure_tables ran the full create_all for the root `watched`. Only that root: the session's
    background work (the shared crawl, the crash tests' roots) runs jobs in other threads of this process, and
    their create_all calls for their own roots go through the same patched function."""
    calls: list[str] = []
    create_all = tables.create_all

    def counted(spark, root: str) -> list[str]:
        if root == watched:
            calls.append(root)
        return create_all(spark, root)

    monkeypatch.setattr(tables, "create_all", counted)
    return calls


def test_ensure_tables_creates_once_then_reads_no_delta_log(spark, tables_root, monkeypatch):
    calls = _counting_create_all(monkeypatch, tables_root)
    tables.ensure_tables(spark, tables_root)
    tables.ensure_tables(spark, tables_root)
    tables.ensure_tables(spark, tables_root)
    assert calls == [tables_root]


def test_ensure_tables_recreates_a_deleted_table_or_root(spark, tables_root, monkeypatch):
    calls = _counting_create_all(monkeypatch, tables_root)
    tables.ensure_tables(spark, tables_root)
    shutil.rmtree(tables.table_path(tables_root, "links"))
    tables.ensure_tables(spark, tables_root)
    assert calls == [tables_root, tables_root]
    assert DeltaTable.isDeltaTable(spark, tables.table_path(tables_root, "links"))

    shutil.rmtree(tables_root)
    tables.ensure_tables(spark, tables_root)
    assert len(calls) == 3
    assert all(DeltaTable.isDeltaTable(spark, tables.table_path(tables_root, name)) for name in tables.TABLES)


def test_unchanged_tables_passes_a_no_op_commit_and_catches_a_changed_row(spark, tables_root):
    """The helper the re-run tests use: a new commit with the same contents passes, a changed row fails."""
    row = {"host_key": "http://a.test", "bucket": 1}
    append_rows(spark, tables_root, "hosts", [row])
    hosts = DeltaTable.forPath(spark, tables.table_path(tables_root, "hosts"))
    with unchanged_tables(spark, tables_root):
        hosts.update(set={"bucket": "bucket"})  # a commit that rewrites the row as it was
    with pytest.raises(AssertionError, match="table hosts changed"), unchanged_tables(spark, tables_root):
        hosts.update(set={"bucket": "bucket + 1"})
