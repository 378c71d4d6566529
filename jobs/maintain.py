"""`crawl maintain`: compact small files (OPTIMIZE), delete unreferenced ones (VACUUM), report table figures.

Every MERGE and append of a cycle adds small files (and, where tables have them, deletion vectors); left alone,
reads slow down with the file count. OPTIMIZE works per partition: `urls`/`hosts` stay bucketed and
`fetches`/`links` stay per segment, so generate and update keep pruning by partition. Every table but `urls` gets
plain bin-packing compaction, which only rewrites the small files, so a second run costs next to nothing.

`urls` is clustered by its due time instead (OPTIMIZE ZORDER BY next_fetch_at, one column: each bucket's rows sorted
by it and cut into about maintain.urls_files_per_bucket files), so each file covers a narrow slice of due times and
generate, whose filter `next_fetch_at <= now` Delta checks against every file's min/max statistics, reads only the
files that can hold due URLs (docs/architecture.md, "Table layout and why"). The clustering does not decay where it
matters: a cycle's MERGEs rewrite the files they change rows of with the same rows (or, with deletion vectors, move
the changed rows into the few files the cycle writes), and a clustered file whose slice has not come due yet is
still skipped. It costs a rewrite of the whole table each run, which is why maintain runs on a slower schedule than
the cycle, and it is done one bucket at a time under the crawl's writer lock (cluster_by_bucket).

Before compaction, `hosts.known_urls` is recounted from `urls` (one scan): update keeps it by increments
and inject by recounting its seeds' hosts, so this recount only repairs drift (e.g. rows written by hand). Hosts
rows older than `hosts.domain` get their registered domain (per-domain budgets count them as their own domain
until then).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from delta_tables.tables import TABLES, table_path, table_version
from jobs.base import merge_counts, merge_into, pinned_table, recount_known_urls, session_settings
from jobs.writelock import writer_lock

log = logging.getLogger("jobs.maintain")

# Delta refuses VACUUM below the tables' default deleted-file retention (7 days) unless this check is off.
DELTA_SAFE_RETENTION_HOURS = 168.0
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
# VACUUM lists a table's files in this many tasks (Delta reads Spark's partition discovery setting, default 10000).
LISTING_PARALLELISM_CONF = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
VACUUM_LOGGING_CONF = "spark.databricks.delta.vacuum.logging.enabled"
MAX_FILE_SIZE_CONF = "spark.databricks.delta.optimize.maxFileSize"
# `urls` is clustered by due time (module docstring), each bucket cut into maintain.urls_files_per_bucket files of at
# least maintain.urls_min_file_mb.
CLUSTERED_BY = {"urls": "next_fetch_at"}
BUCKET_FOLDER = re.compile(r"/bucket=(\d+)/")  # a Delta partition folder of `bucket` in a data file's path


@dataclass
class TableMaintenance:
    """Figures for one table; `*_before` are read before OPTIMIZE, the rest after VACUUM."""

    name: str
    files_before: int
    bytes_before: int
    files_after: int = 0
    bytes_after: int = 0
    rows: int = 0
    version: int = 0
    files_compacted: int = 0      # files OPTIMIZE replaced
    files_written: int = 0        # files OPTIMIZE wrote in their place
    vacuum_removed: int = 0       # files VACUUM deleted from storage
    seconds: float = 0.0


@dataclass
class MaintainResult:
    retention_hours: float
    vacuumed: bool
    tables: list[TableMaintenance] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)   # asked for but not created yet under the root
    known_urls_corrected: int = 0                      # hosts whose known_urls the recount changed
    domains_filled: int = 0                            # hosts rows older than hosts.domain that got it

    def summary(self) -> str:
        files_before = sum(t.files_before for t in self.tables)
        files_after = sum(t.files_after for t in self.tables)
        vacuum = (f"vacuum removed {sum(t.vacuum_removed for t in self.tables)} files "
                  f"(retention {self.retention_hours:g} h)" if self.vacuumed else "no vacuum")
        missing = f", missing: {', '.join(self.missing)}" if self.missing else ""
        return (f"{len(self.tables)} tables: files {files_before} -> {files_after}, "
                f"{_size(sum(t.bytes_after for t in self.tables))}, "
                f"{sum(t.rows for t in self.tables)} rows, {vacuum}, "
                f"{self.known_urls_corrected} hosts.known_urls corrected, {self.domains_filled} hosts.domain filled"
                f"{missing}")

    def render(self) -> str:
        header = (f"{'table':<14}{'files':>14}{'size':>20}{'rows':>12}{'compacted':>11}"
                  f"{'vacuumed':>10}{'version':>9}{'secs':>7}")
        lines = [header]
        for t in self.tables:
            lines.append(
                f"{t.name:<14}{f'{t.files_before} -> {t.files_after}':>14}"
                f"{f'{_size(t.bytes_before)} -> {_size(t.bytes_after)}':>20}{t.rows:>12}"
                f"{f'{t.files_compacted}->{t.files_written}':>11}{t.vacuum_removed:>10}{t.version:>9}{t.seconds:>7.1f}"
            )
        lines.extend(f"{name:<14}{'missing':>14}" for name in self.missing)
        lines.append(self.summary())
        return "\n".join(lines)


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def vacuum_settings(retention_hours: float, listing_tasks: int) -> dict[str, str]:
    """Session confs VACUUM needs: its metrics in the table history, the tasks its file listing runs in, and the
    safety check off only when asked for."""
    settings = {VACUUM_LOGGING_CONF: "true", LISTING_PARALLELISM_CONF: str(listing_tasks)}
    if retention_hours < DELTA_SAFE_RETENTION_HOURS:
        log.warning("maintain.vacuum_retention_hours=%g is below Delta's safe %g h: turning off %s for VACUUM; "
                    "readers of versions older than that may fail", retention_hours, DELTA_SAFE_RETENTION_HOURS,
                    RETENTION_CHECK_CONF)
        settings[RETENTION_CHECK_CONF] = "false"
    return settings


def _detail(spark: SparkSession, path: str) -> tuple[int, int]:
    """(files, bytes) of the current snapshot, from the log (DESCRIBE DETAIL), without reading data."""
    row = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return int(row["numFiles"] or 0), int(row["sizeInBytes"] or 0)


def _vacuum_removed(delta_table, after_version: int) -> int:
    """Files deleted by the VACUUM committed after `after_version` (its VACUUM END history metrics)."""
    rows = (delta_table.history(4).where(f"version > {after_version} AND operation = 'VACUUM END'")
            .select("operationMetrics").collect())
    return sum(int((row["operationMetrics"] or {}).get("numDeletedFiles", 0)) for row in rows)


def clustered_file_bytes(conf: Config, table_bytes: int, partitions: int) -> int:
    """The file size a clustering OPTIMIZE aims at: each partition's share of the table cut into
    maintain.urls_files_per_bucket files, none under maintain.urls_min_file_mb (at least a byte)."""
    floor = max(1, int(conf.maintain.urls_min_file_mb * 1024 * 1024))
    return max(floor, table_bytes // (max(partitions, 1) * conf.maintain.urls_files_per_bucket))


def stored_buckets(delta_table) -> list[int]:
    """The buckets that hold files in the table's current version, from the paths its log lists (no data read;
    the table's own, whatever the config says)."""
    return sorted({int(match.group(1)) for path in delta_table.toDF().inputFiles()
                   if (match := BUCKET_FOLDER.search(path))})


def cluster_by_bucket(spark: SparkSession, conf: Config, root: str, delta_table, column: str,
                      table_bytes: int) -> tuple[int, int]:
    """ZORDER a bucketed table by `column` one bucket at a time, each under the crawl's writer lock; returns (files
    removed, files written). The rewrite replaces every file, so against a cycle's MERGE into the same files Delta
    would fail whichever commits second; one bucket at a time, a cycle waits for seconds, not the whole table."""
    removed = written = 0
    buckets = stored_buckets(delta_table)
    with session_settings(spark, {MAX_FILE_SIZE_CONF: str(clustered_file_bytes(conf, table_bytes, len(buckets)))}):
        for bucket in buckets:
            with writer_lock(conf, root, "maintain"):
                metrics = (delta_table.optimize().where(f"bucket = {bucket}").executeZOrderBy(column)
                           .select("metrics.numFilesRemoved", "metrics.numFilesAdded").first())
            removed += int(metrics["numFilesRemoved"] or 0)
            written += int(metrics["numFilesAdded"] or 0)
    return removed, written


def maintain_table(spark: SparkSession, conf: Config, root: str, name: str,
                   retention_hours: float | None) -> TableMaintenance:
    """OPTIMIZE one table (clustered by its CLUSTERED_BY column if it has one, else compacted), then VACUUM it
    unless `retention_hours` is None, then read its figures."""
    from delta.tables import DeltaTable

    started = time.monotonic()
    path = table_path(root, name)
    delta_table = DeltaTable.forPath(spark, path)
    files, size = _detail(spark, path)
    figures = TableMaintenance(name, files_before=files, bytes_before=size)

    if name in CLUSTERED_BY:
        figures.files_compacted, figures.files_written = cluster_by_bucket(spark, conf, root, delta_table,
                                                                           CLUSTERED_BY[name], size)
    else:
        compacted = (delta_table.optimize().executeCompaction()
                     .select("metrics.numFilesRemoved", "metrics.numFilesAdded").first())
        figures.files_compacted = int(compacted["numFilesRemoved"] or 0)
        figures.files_written = int(compacted["numFilesAdded"] or 0)

    if retention_hours is not None:
        version = table_version(spark, root, name)
        delta_table.vacuum(float(retention_hours))
        figures.vacuum_removed = _vacuum_removed(delta_table, version)

    figures.files_after, figures.bytes_after = _detail(spark, path)
    # COUNT(*) on a Delta table is answered from the per-file statistics in the log, not by a scan.
    figures.rows = spark.read.format("delta").load(path).count()
    figures.version = table_version(spark, root, name)
    figures.seconds = time.monotonic() - started
    log.info("maintain %s: files %d -> %d (compacted %d into %d), vacuum removed %d, %d rows, version %d, %.1fs",
             name, figures.files_before, figures.files_after, figures.files_compacted, figures.files_written,
             figures.vacuum_removed, figures.rows, figures.version, figures.seconds)
    return figures


def with_domain(df: DataFrame) -> DataFrame:
    """`df` with a `domain` column, the registered domain of each row's `host_key` (crawler.urls.host_domain), as
    a `hosts` row stores it. Python per row: only for the rows that lack one."""
    from crawler.urls import host_domain

    @F.pandas_udf("string")
    def domain(host_keys: pd.Series) -> pd.Series:
        return pd.Series([host_domain(h) for h in host_keys], dtype=object)

    return df.withColumn("domain", domain("host_key"))


def fill_host_domains(spark: SparkSession, root: str) -> int:
    """Set `hosts.domain` on rows written before the column existed (inject and update set it on the rows they
    create); the registered domain is computed for those rows only. Returns the rows filled."""
    missing = pinned_table(spark, root, "hosts").where(F.col("domain").isNull()).select("host_key", "bucket")
    if not missing.limit(1).count():  # the usual case once filled: no MERGE, no commit
        return 0
    metrics = (
        merge_into(spark, root, "hosts", with_domain(missing), "t.bucket = s.bucket AND t.host_key = s.host_key")
        .whenMatchedUpdate(condition="t.domain IS NULL", set={"domain": "s.domain"})
        .execute()
    )
    return merge_counts(metrics).get("num_updated_rows", 0)


def run(spark: SparkSession, conf: Config, root: str, tables: list[str] | None = None,
        vacuum: bool = True) -> MaintainResult:
    """Compact, vacuum and measure `tables` (default: every table); tables not created yet are listed as missing."""
    from delta.tables import DeltaTable

    names = list(TABLES) if tables is None else [layout.check_table_name(name) for name in tables]
    retention_hours = float(conf.maintain.vacuum_retention_hours)
    result = MaintainResult(retention_hours=retention_hours, vacuumed=vacuum)
    settings = {MAX_FILE_SIZE_CONF: str(conf.maintain.target_file_mb * 1024 * 1024)}
    if vacuum:
        listing_tasks = conf.maintain.vacuum_listing_tasks or 4 * spark.sparkContext.defaultParallelism
        settings.update(vacuum_settings(retention_hours, listing_tasks))
    if all(DeltaTable.isDeltaTable(spark, table_path(root, name)) for name in ("urls", "hosts")):
        result.known_urls_corrected = recount_known_urls(spark, root)
        result.domains_filled = fill_host_domains(spark, root)
    with session_settings(spark, settings):
        for name in names:
            if not DeltaTable.isDeltaTable(spark, table_path(root, name)):
                log.warning("maintain %s: no table under %s (run `crawl init`)", name, root)
                result.missing.append(name)
                continue
            result.tables.append(maintain_table(spark, conf, root, name, retention_hours if vacuum else None))
    log.info("maintain: %s", result.summary())
    return result


def run_command(spark: SparkSession, conf: Config, root: str, tables: list[str] | None, vacuum: bool) -> int:
    """`crawl maintain`: what each table looked like before and after."""
    print(run(spark, conf, root, tables=tables, vacuum=vacuum).render())
    return 0
