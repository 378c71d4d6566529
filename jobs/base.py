"""The shared base of every Spark job: session, config, table access, timing.

Per-record logic lives in `crawler/` as plain functions; jobs here are set-based plumbing around it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from crawler import layout
from crawler.config import Config
from delta_tables import tables

log = logging.getLogger("jobs")

IVY_SETTINGS = Path(__file__).resolve().parents[1] / "conf" / "ivysettings.xml"


def spark_session(conf: Config, app_name: str = "cyclecrawl") -> SparkSession:
    """The one SparkSession of a process, bound to loopback in local mode, with Delta enabled.

    Delta's jars come through Spark's package resolution (Maven Central, cached in spark.ivy_dir), or
    from `spark.extra_jars` when given.
    """
    master = conf["spark.master"]
    if master.startswith("local"):
        # The machine's hostname may not resolve to a usable address: bind everything to loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (mapInArrow in parse) must run this interpreter, with this venv's packages.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(conf["spark.shuffle_partitions"]))
        # Delta rebuilds a table's snapshot from its log in 50 partitions unless told otherwise; on a few cores
        # that is about half the time of a small job (update of 21 URLs: 111 s -> 58 s). The shuffle width fits.
        .config("spark.databricks.delta.snapshotPartitions", str(conf["spark.shuffle_partitions"]))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", conf["spark.driver_memory"])
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    extra_jars = conf["spark.extra_jars"].strip()
    if extra_jars:
        builder = builder.config("spark.jars", extra_jars)
    else:
        from delta import configure_spark_with_delta_pip

        builder = builder.config("spark.jars.ivy", os.path.expanduser(conf["spark.ivy_dir"]))
        builder = builder.config("spark.jars.ivySettings", str(IVY_SETTINGS))
        builder = configure_spark_with_delta_pip(builder)
    for key, value in conf["spark.conf"].items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(conf["spark.log_level"])
    return spark


def read_table(spark: SparkSession, root: str, name: str) -> DataFrame:
    return tables.table_df(spark, root, name)


def table_path(root: str, name: str) -> str:
    return layout.table_path(root, name)


def pinned_table(spark: SparkSession, root: str, name: str) -> DataFrame:
    """A table at its current Delta version, so repeated evaluations of a plan read the same snapshot."""
    from delta.tables import DeltaTable

    path = tables.table_path(root, name)
    version = DeltaTable.forPath(spark, path).history(1).select("version").first()[0]
    return spark.read.format("delta").option("versionAsOf", version).load(path)


@contextmanager
def step(name: str) -> Iterator[None]:
    """Log the start and duration of a job step (a periodic progress line for long work)."""
    started = time.monotonic()
    log.info("%s: started", name)
    try:
        yield
    finally:
        log.info("%s: done in %.1fs", name, time.monotonic() - started)


def merge_into(spark: SparkSession, root: str, name: str, source: DataFrame, condition):
    """A Delta MERGE builder of `source` (alias `s`) into table `name` (alias `t`) on `condition`."""
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, tables.table_path(root, name)).alias("t").merge(source.alias("s"), condition)


def merge_counts(metrics: DataFrame | None) -> dict[str, int]:
    """The one-row metrics DataFrame a Delta MERGE returns, as a dict (num_inserted_rows, ...)."""
    row = metrics.first() if metrics is not None else None
    return {key: int(value or 0) for key, value in row.asDict().items()} if row else {}


def insert_if_absent(spark: SparkSession, root: str, name: str, source: DataFrame, condition) -> int:
    """MERGE insert-if-absent (the idempotent append every job uses); returns the rows inserted."""
    metrics = merge_into(spark, root, name, source, condition).whenNotMatchedInsertAll().execute()
    return merge_counts(metrics).get("num_inserted_rows", 0)


def arrow_batches(rows: Iterable[dict], schema: pa.Schema, size: int) -> Iterator[pa.RecordBatch]:
    """A mapInArrow body's output: rows (dicts of `schema`'s columns) in record batches of at most `size`, so
    a task holds one batch of output at a time however many rows its input makes."""
    out: list[dict] = []
    for row in rows:
        out.append(row)
        if len(out) >= size:
            yield pa.RecordBatch.from_pylist(out, schema=schema)
            out = []
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=schema)
