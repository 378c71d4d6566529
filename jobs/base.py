"""The shared base of every Spark job: session, config, table and segment-file access, the MERGEs several jobs
run (insert-if-absent, the `hosts.known_urls` recount), timing.

Per-record logic lives in `crawler/` as plain functions; jobs here are set-based plumbing around it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import Config, ConfigError, bundled
from delta_tables import tables
from jobs.storage import Storage

log = logging.getLogger("jobs")

IVY_SETTINGS = bundled("ivysettings.xml")
SCHEDULER_POOLS = bundled("fairscheduler.xml")
# The AWS SDK's default chain, as boto3 uses it (env vars, profile, web identity, container, instance role).
AWS_DEFAULT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def s3a_settings(conf: Config, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The Spark settings that make s3:// and s3a:// paths go through S3A with the configured endpoint; none for
    a local root. `s3://` is mapped to S3A so every job uses the root's paths unchanged (Delta logs included:
    Delta picks its S3 LogStore by scheme)."""
    if not layout.is_s3(conf.storage.root):
        return {}
    settings = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.s3a.endpoint.region": conf.s3.region,
        "spark.hadoop.fs.s3a.path.style.access": str(conf.s3.path_style_access).lower(),
        "spark.hadoop.fs.s3a.aws.credentials.provider": AWS_DEFAULT_CREDENTIALS,
    }
    endpoint = Storage.from_conf(conf, environ).endpoint_url
    if endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(not endpoint.startswith("http://")).lower()
    return settings


def spark_session(conf: Config, app_name: str = "cyclecrawl") -> SparkSession:
    """The one SparkSession of a process, bound to loopback in local mode, with Delta enabled.

    Delta's jars (and hadoop-aws's for an s3:// root) come through Spark's package resolution (Maven Central,
    cached in spark.ivy_dir), or from `spark.extra_jars` when given (which must then hold hadoop-aws and the AWS
    SDK bundle for an s3:// root).
    """
    submitted = submitted_by_spark_submit()
    master = conf.spark.master
    if master.startswith("local") and not submitted:
        # The machine's hostname may not resolve to a usable address: bind everything to loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (mapInArrow in parse) must run this interpreter, with this venv's packages.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(conf.spark.shuffle_partitions))
        # Delta rebuilds a table's snapshot from its log in 50 partitions unless told otherwise; on a few cores
        # that is about half the time of a small job (update of 21 URLs: 111 s -> 58 s). The shuffle width fits.
        .config("spark.databricks.delta.snapshotPartitions", str(conf.spark.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", conf.spark.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        # Tables created by this session (delta_tables.create_all) get deletion vectors or not (tables.*).
        .config("spark.databricks.delta.properties.defaults.enableDeletionVectors",
                str(conf.tables.deletion_vectors).lower())
        .config("spark.sql.sources.partitionOverwriteMode", "static")
        # pyspark's DataFrame debugging records the Python call site of every Column function (F.col, alias,
        # cast...) in the JVM, five py4j round trips and a stack walk each: 1.8 ms an F.col instead of 0.4 ms, and
        # the jobs build their plans from thousands of them. Errors still name the failing expression.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # Every query execution renders its physical plan as text for the SQL listener (what the UI and event logs
        # show), "formatted" by default: a walk of the whole plan with its operators' details. The UI is off here,
        # and a cycle's steps are hundreds of small queries: "simple" is a one-line-per-operator tree. Measured on
        # four injects and eight generates of small roots, A B A B: JVM 61.3/62.2 -> 56.7/56.6 CPU-s.
        .config("spark.sql.ui.explainMode", "simple")
        # Jobs share the executors fairly between scheduler pools (each pool first in, first out): `crawl run`'s
        # parse lane runs in a pool of its own (jobs.run.PARSE_POOL), so its jobs are not queued behind every task
        # of the main lane's larger scans. Everything else is in the default pool, scheduled as before.
        .config("spark.scheduler.mode", "FAIR")
    )
    if SCHEDULER_POOLS.exists():  # else Spark makes the pools as they are named, with a warning
        builder = builder.config("spark.scheduler.allocation.file", str(SCHEDULER_POOLS))
    if not submitted:
        # Under spark-submit the master, the jars and the driver's address come from its command line.
        builder = _launch_settings(builder, conf)
    for key, value in {**s3a_settings(conf), **conf.spark.conf}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(conf.spark.log_level)
    return spark


def _launch_settings(builder: SparkSession.Builder, conf: Config) -> SparkSession.Builder:
    """Master, driver address and jars of a session this process launches itself (not spark-submit's)."""
    master = conf.spark.master
    builder = builder.master(master)
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    extra_jars = conf.spark.extra_jars.strip()
    if extra_jars:
        return builder.config("spark.jars", extra_jars)
    from delta import configure_spark_with_delta_pip

    builder = builder.config("spark.jars.ivy", os.path.expanduser(conf.spark.ivy_dir))
    builder = builder.config("spark.jars.ivySettings", str(IVY_SETTINGS))
    builder = builder.config("spark.jars.excludes", ",".join(SHIPPED_WITH_PYSPARK))
    return configure_spark_with_delta_pip(builder, extra_packages=extra_packages(conf))


# Artifacts that the dependency trees of Delta (delta-kernel-defaults: Hadoop 3.4, Parquet 1.16, ...) and hadoop-aws
# pull in at other versions than the ones pyspark ships in its jars/ folder. The JVM never loads those copies (the
# class loader of an application's packages asks its parent, which holds pyspark's jars, first), yet every
# application resolves them and every executor downloads them (about 70 MB; one small cluster step: 50 -> 43
# CPU-s). They are left out of package resolution; tests/test_spark_cluster.py checks pyspark ships each one.
SHIPPED_WITH_PYSPARK = (
    "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.parquet:parquet-column", "org.apache.parquet:parquet-common", "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures", "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson",
    "org.apache.logging.log4j:log4j-api", "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl", "org.slf4j:slf4j-api",
    "com.fasterxml.jackson.core:jackson-annotations", "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.github.luben:zstd-jni", "org.xerial.snappy:snappy-java", "io.airlift:aircompressor",
    "com.google.code.findbugs:jsr305", "commons-pool:commons-pool", "org.locationtech.jts:jts-core",
    "org.roaringbitmap:RoaringBitmap",
)


def extra_packages(conf: Config) -> list[str]:
    """Maven packages resolved beside Delta's: hadoop-aws for an s3:// root, at the version of the Hadoop
    that pyspark ships (it pulls the AWS SDK bundle that version was built with)."""
    if not layout.is_s3(conf.storage.root):
        return []
    return [f"org.apache.hadoop:hadoop-aws:{pyspark_hadoop_version()}"]


def pyspark_hadoop_version() -> str:
    """The Hadoop version of pyspark's bundled client jars (hadoop-client-api-<version>.jar)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise RuntimeError("pyspark ships no hadoop-client-api jar: cannot choose the hadoop-aws version")
    return jars[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def submitted_by_spark_submit() -> bool:
    """True in a driver that spark-submit started (jobs/submit.py): its JVM is already running, so the master and
    the jars were set on spark-submit's command line and setting them here would be ignored or wrong."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def read_table(spark: SparkSession, root: str, name: str) -> DataFrame:
    return tables.table_df(spark, root, name)


def table_path(root: str, name: str) -> str:
    return layout.table_path(root, name)


def pinned_table(spark: SparkSession, root: str, name: str, version: int | None = None) -> DataFrame:
    """A table at `version` (its current Delta version when None), so repeated evaluations of a plan read the same
    snapshot."""
    if version is None:
        version = tables.table_version(spark, root, name)
    return spark.read.format("delta").option("versionAsOf", version).load(tables.table_path(root, name))


def check_bucketing(conf: Config, root: str, record: bool = True) -> None:
    """Refuse (ConfigError, exit 2) a config whose `crawl.buckets` or `politeness.key` is not the crawl's, as
    recorded in `ROOT/_crawl.json` (crawler.bucketing). The command line asks it before Spark starts for every
    command that reads or writes bucketed rows (`jobs/cli.py`, `Command.checks_bucketing`), with `record` off: a
    command that only reads leaves a root as it found it. The jobs that assign buckets (inject, update) ask it
    again with `record` on, so that the first of them on a root records this config's, wherever they are called
    from (the cycle, the demo, a test)."""
    bucketing, storage = Bucketing.from_config(conf), Storage.from_conf(conf)
    path = layout.crawl_record(root)
    filesystem, local = storage.filesystem(path)
    recorded = None
    if filesystem.get_file_info(local).type != pafs.FileType.NotFound:
        with storage.open_input(path) as handle:
            recorded = json.loads(handle.read())
    problem = bucketing.refusal(recorded)
    if problem is not None:
        raise ConfigError(*problem)
    if recorded is None and record:
        storage.write_bytes(path, json.dumps(bucketing.identity(), sort_keys=True).encode("utf-8"))


def latest_per_key(df: DataFrame, keys: list[str], order: list[Column]) -> DataFrame:
    """The first row of each `keys` group in `order` (e.g. the latest observation per host)."""
    return df.withColumn("_rn", F.row_number().over(Window.partitionBy(*keys).orderBy(*order))).where("_rn = 1").drop(
        "_rn")


def to_micros(moment: datetime | None) -> int | None:
    """A timestamp as Spark's microseconds since the epoch, for UDFs that return times (`F.timestamp_micros`)."""
    return None if moment is None else (moment - EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int | None) -> datetime | None:
    """`to_micros` undone: what a UDF gets from `F.unix_micros` as a timestamp."""
    return None if micros is None else EPOCH + timedelta(microseconds=micros)


def read_segment_files(spark: SparkSession, path: str, arrow_schema: pa.Schema) -> DataFrame | None:
    """All Parquet files under every bucket directory of a segment folder (names starting with `_` or `.` are
    ignored), or None when the folder does not exist."""
    if not tables.path_exists(spark, path):
        return None
    return (
        spark.read.schema(from_arrow_schema(arrow_schema))
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.parquet")
        .parquet(path)
    )


STEP_STARTED = ": started"  # the end of the line `step` logs when a step starts (tests read it)


@contextmanager
def step(name: str) -> Iterator[None]:
    """Log the start and duration of a job step (a periodic progress line for long work)."""
    started = time.monotonic()
    log.info("%s" + STEP_STARTED, name)
    try:
        yield
    finally:
        log.info("%s: done in %.1fs", name, time.monotonic() - started)


@contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Spark SQL settings for the work inside, the session's own restored after (also on an error)."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


# Adaptive execution re-plans every shuffle and broadcast as a job of its own; on a segment's few rows that is
# planning and scheduling for nothing (dedup of a test segment: 41 s with it, 10 s without).
NOT_ADAPTIVE = {"spark.sql.adaptive.enabled": "false"}
# A step over a few rows is all fixed cost, and much of that is Spark compiling: every plan's operators and
# expressions are generated as Java source, formatted and compiled by Janino (a cycle's steps on a 20-page segment
# spent over a third of their CPU there, and the compiled classes are rarely reused: a new segment's timestamps
# are new literals in the code). Interpreted, those rows cost a little more each and nothing up front. Adaptive
# execution is off (NOT_ADAPTIVE), and a shuffle's tasks (and those that rebuild a Delta table's snapshot from its
# log) are as many as the cluster would use on a large input: one per core is plenty for a few thousand rows.
SMALL_INPUT = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    **NOT_ADAPTIVE,
}


@contextmanager
def sized_to_input(spark: SparkSession, conf: Config, count_rows: Callable[[], int | None]) -> Iterator[None]:
    """The work inside on Spark's small-input plan (SMALL_INPUT, one shuffle partition per core) when the step works
    on at most `spark.small_input_rows` rows, else (or when that is not known: None) on the session's own settings.
    `count_rows` is asked only when the answer can change a setting: a session already on the small-input plan (a
    config that sets it, the tests') skips the count, which for generate is a read of `cycle_metrics`."""
    partitions = str(min(conf.spark.shuffle_partitions, spark.sparkContext.defaultParallelism))
    small = {**SMALL_INPUT, "spark.sql.shuffle.partitions": partitions,
             "spark.databricks.delta.snapshotPartitions": partitions}
    if all(spark.conf.get(key, None) == value for key, value in small.items()):
        yield
        return
    rows = count_rows()
    if rows is None or rows > conf.spark.small_input_rows:
        yield
        return
    with session_settings(spark, small):
        yield


def table_rows(spark: SparkSession, root: str, name: str) -> int:
    """The rows of a table at its current version. Delta answers a bare count from its log's file statistics, with
    no data read (one small job over the table's snapshot, on the small-input plan)."""
    with session_settings(spark, SMALL_INPUT):
        return pinned_table(spark, root, name).count()


def segment_rows(conf: Config, path: str) -> int:
    """The rows of the Parquet files under a segment folder (as read_segment_files reads them), from the files'
    footers: what sizes a step's plan before Spark reads anything. 0 when the folder does not exist."""
    storage = Storage.from_conf(conf)
    rows = 0
    for name in storage.list_files(path):
        if name.endswith(".parquet") and not any(part[:1] in "_." for part in name.split("/")):
            with storage.open_input(layout.join(path, name)) as handle:
                rows += pq.ParquetFile(handle).metadata.num_rows
    return rows


# Delta materializes a MERGE's source (a cached copy, written before the MERGE reads it twice) unless the source
# reads only Delta tables: a source that changed between the two passes would corrupt the MERGE. A source given
# inside `session_settings(spark, SOURCE_HELD)` is already still: a localCheckpoint, or a read of a segment's
# files (which no daemon writes once the step runs), through deterministic functions; materializing it again is
# one more job and copy per MERGE. Not for a source holding a persisted frame: Delta refuses to run such a source
# unmaterialized when the frame's cache changes under the MERGE (DELTA_MERGE_SOURCE_CACHED_DURING_EXECUTION).
SOURCE_HELD = {"spark.databricks.delta.merge.materializeSource": "none"}


_TURNS: dict[str, threading.Lock] = {}
_TURNS_GUARD = threading.Lock()


@contextmanager
def table_turn(root: str, name: str) -> Iterator[None]:
    """Commits to one table from the threads of this process take turns. Delta judges a commit's conflicts with the
    commits that landed since its snapshot by partition values only, so two commits to an unpartitioned table at
    once (`crawl run`'s parse lane and main lane both write `pages` and `segments`) would fail one another; the
    turn keeps the loser from ever starting its snapshot before the winner's commit. Held around one write (a MERGE
    from its start, when it takes its snapshot, to its commit), never around a step. Commands in other processes
    can still conflict (`crawler.errors.WriteConflict`, exit 75)."""
    path = tables.table_path(root, name)
    with _TURNS_GUARD:
        turn = _TURNS.setdefault(path, threading.Lock())
    with turn:
        yield


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


def known_url_counts(spark: SparkSession, root: str, hosts: DataFrame | None = None) -> DataFrame:
    """(host_key, bucket, known_urls): each host's row count in `urls`, what `hosts.known_urls` holds (of the hosts in
    `hosts`, a DataFrame of host_key and bucket, when given)."""
    urls = pinned_table(spark, root, "urls")
    if hosts is not None:
        urls = urls.join(hosts.select("host_key", "bucket"), ["host_key", "bucket"])
    return urls.groupBy("host_key", "bucket").agg(F.count("*").alias("known_urls"))


def recount_known_urls(spark: SparkSession, root: str) -> int:
    """Set `hosts.known_urls` to each host's row count in `urls` where they differ; returns hosts corrected. An
    absolute count, so a re-run after a crash repairs what an increment would have lost."""
    hosts = pinned_table(spark, root, "hosts").select("host_key", "bucket")
    source = hosts.join(known_url_counts(spark, root), ["host_key", "bucket"], "left").fillna(
        0, subset=["known_urls"])
    metrics = (
        merge_into(spark, root, "hosts", source, "t.bucket = s.bucket AND t.host_key = s.host_key")
        .whenMatchedUpdate(condition="t.known_urls <> s.known_urls", set={"known_urls": "s.known_urls"})
        .execute()
    )
    return merge_counts(metrics).get("num_updated_rows", 0)


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
