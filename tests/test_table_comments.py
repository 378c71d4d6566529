"""Column comments: every column of every table has a description in delta_tables/tables.py, and that description is
the column's Delta comment on disk, on a new root (read by Spark and by delta-rs) and on a root written before a
column or a comment existed (create_all sets them); comments never make conform cast."""

from __future__ import annotations

import shutil

import deltalake
from delta.tables import DeltaTable
from pyspark.sql.types import StructField, StructType

from delta_tables import tables


def _comments(schema: StructType) -> dict[str, str | None]:
    return {f.name: f.metadata.get("comment") for f in schema.fields}


def _uncommented(schema: StructType) -> StructType:
    return StructType([StructField(f.name, f.dataType, f.nullable) for f in schema.fields])


def test_every_column_has_a_description():
    blank = [f"{t.name}.{f.name}" for t in tables.TABLES.values() for f in t.schema.fields
             if not f.metadata.get("comment", "").strip()]
    assert blank == []


def test_new_tables_carry_the_comments_for_spark_and_delta_rs(spark, tables_root):
    """`tables_root` is a copy of the session's template: create_all's tables on a fresh root."""
    for name, table in tables.TABLES.items():
        assert _comments(tables.table_df(spark, tables_root, name).schema) == _comments(table.schema), name
    # Insert-only tables have no deletion vectors whatever the session says, so delta-rs opens them.
    for name in ("index_events", "records"):
        fields = deltalake.DeltaTable(tables.table_path(tables_root, name)).schema().fields
        assert {f.name: f.metadata.get("comment") for f in fields} == _comments(tables.TABLES[name].schema), name

    versions = {name: tables.table_version(spark, tables_root, name) for name in tables.TABLES}
    assert tables.create_all(spark, tables_root) == []
    assert {name: tables.table_version(spark, tables_root, name) for name in tables.TABLES} == versions


def test_create_all_sets_missing_and_stale_comments_and_comments_added_columns(spark, tables_root):
    """A `pages` table from before comments (one stale, with quotes and a backslash) and before its last column:
    create_all adds the column with its comment and replaces every comment, keeping types and nullability."""
    definition = tables.PAGES.schema
    old_fields = list(_uncommented(StructType(definition.fields[:-1])).fields)
    old_fields[0] = StructField(old_fields[0].name, old_fields[0].dataType, old_fields[0].nullable,
                                {"comment": "an 'older' \\ text"})
    path = tables.table_path(tables_root, "pages")
    shutil.rmtree(path)
    DeltaTable.createIfNotExists(spark).location(path).addColumns(StructType(old_fields)).execute()

    assert tables.create_all(spark, tables_root) == []
    stored = tables.table_df(spark, tables_root, "pages").schema
    assert [(f.name, f.dataType, f.nullable) for f in stored.fields] == [
        (f.name, f.dataType, f.nullable) for f in definition.fields]
    assert _comments(stored) == _comments(definition)
    version = tables.table_version(spark, tables_root, "pages")
    assert tables.create_all(spark, tables_root) == []
    assert tables.table_version(spark, tables_root, "pages") == version

    text = "an 'older' \\ text, it's \\'"
    assert spark.sql(f"SELECT {tables._sql_string(text)} AS s").first().s == text


def test_conform_casts_no_column_for_a_comment(spark):
    """conform compares data types only: a DataFrame whose columns carry no comments is selected, not cast."""
    for name in ("cycle_metrics", "hosts"):  # a nested struct, a map and an array
        df = spark.createDataFrame([], _uncommented(tables.TABLES[name].schema))
        plan = tables.conform(df, name)._jdf.queryExecution().analyzed().toString().lower()
        assert "cast(" not in plan, name
