"""Delta table helpers for tests: hand-built rows appended with the table's own schema, whole-table snapshots for
comparing two roots, `unchanged_tables` for "this re-run changes no table", and `replace_root` for tests that start
from one root built once per module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql.types import DoubleType, FloatType, MapType, StringType, StructType, TimestampType

from delta_tables import tables

FILLER_TIME = datetime(2026, 1, 1, tzinfo=UTC)  # a required timestamp a hand-built row leaves out


def full_row(schema: StructType, values: dict, when: datetime = FILLER_TIME) -> tuple:
    """A whole row of `schema`: the given values; for a required column left out zero, "", {} or `when`; null for
    an optional one."""
    def default(field):
        if field.nullable:
            return None
        if isinstance(field.dataType, TimestampType):
            return when
        if isinstance(field.dataType, (DoubleType, FloatType)):
            return 0.0
        if isinstance(field.dataType, StringType):
            return ""
        if isinstance(field.dataType, MapType):
            return {}
        return 0
    return tuple(values[f.name] if f.name in values else default(f) for f in schema.fields)


def append_rows(spark, root: str, name: str, rows: list[dict], when: datetime = FILLER_TIME) -> None:
    """Append hand-built rows to a table (see `full_row` for the columns they leave out)."""
    schema = tables.TABLES[name].schema
    df = spark.createDataFrame([full_row(schema, row, when) for row in rows], schema)
    tables.conform(df, name).write.format("delta").mode("append").save(tables.table_path(root, name))


def table_rows(spark, root: str | Path, name: str, excluded: set[str] = frozenset(),
               version: int | None = None) -> list[str]:
    """A table's whole contents (at its Delta `version`, or the latest) as sorted `column=value` lines per row,
    without the `excluded` columns."""
    df = tables.table_df(spark, str(root), name) if version is None else spark.read.format("delta").option(
        "versionAsOf", version).load(tables.table_path(str(root), name))
    columns = sorted(c for c in df.columns if c not in excluded)
    return sorted(" ".join(f"{c}={row[c]}" for c in columns) for row in df.select(*columns).collect())


def snapshot(spark, root: str | Path, excluded: dict[str, set[str]] | None = None) -> dict[str, list[str]]:
    """Every table's whole contents (`table_rows`), for comparing two roots or one root before and after."""
    excluded = excluded or {}
    return {name: table_rows(spark, root, name, excluded.get(name, set())) for name in tables.TABLES}


def table_versions(root: str | Path) -> dict[str, int]:
    """Each table's latest Delta version (its newest commit file), for counting the commits a job makes."""
    versions = {}
    for name in tables.TABLES:
        log = Path(tables.table_path(str(root), name)) / "_delta_log"
        versions[name] = max(int(p.name.removesuffix(".json")) for p in log.glob("*.json"))
    return versions


@contextmanager
def unchanged_tables(spark, root: str | Path) -> Iterator[None]:
    """Asserts that what runs inside changes no table's contents. A table without a new commit is unchanged by
    definition; one with new commits is read as it was before (Delta time travel) and as it is now, and the two
    compared, so only what a re-run committed is read."""
    before = table_versions(root)
    yield
    for name, version in table_versions(root).items():
        if version != before[name]:
            assert table_rows(spark, root, name) == table_rows(spark, root, name, version=before[name]), (
                f"table {name} changed (versions {before[name]} -> {version})")


def replace_root(root: str, template: str) -> str:
    """`root` replaced by a copy of `template` (a root a module built once, e.g. its seeds injected: an inject costs
    a few CPU-s, a copy of its files a few ms). A Delta table's log names its files relative to the table."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(template, root)
    return root
