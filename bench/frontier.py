"""Frontier benchmark: scan, generate and update times on synthetic `urls`/`hosts` tables.

Run on demand, never as a test:

    .venv/bin/python -m bench.frontier [--urls 1000000,10000000] [--hosts 100000] [--results 100000]
                                       [--links 1] [--root /tmp/cyclecrawl-bench]

For each size it builds fresh tables under ROOT/urls-<N> with Spark alone (spark.range + expressions, no
driver-side rows), then times
  scan      a full read of `urls`: sum of xxhash64 over every column (best of two runs, so it is warm);
  generate  jobs.generate.run with generate.segment_max_urls = --results;
  update    jobs.update.run on a synthetic segment: one fetched result (success, 200) for every URL generate
            leased, its `pages` row (a new content hash, so index events are written) and --links new-URL
            outlinks per result in `links`, so discovery runs for real.
and prints the figures with its targets: generate and update within 3x a scan, and
update(largest)/update(smallest) < 2.

With --due COUNT, about COUNT rows of each size are due and the rest come due over the next 30 days (a running
crawl's frontier); update is not run. Generate runs twice on the same rows: on `urls` as built (every file spans
the whole 30 days), then, with the tables restored to before that run, after `crawl maintain`'s clustering of
`urls` by next_fetch_at (timed too). For each it reports the wall and JVM CPU time and the `urls` files its scans
read (Spark's scan metrics) against the files the table holds; the target is
generate(largest)/generate(smallest) <= 2 on the clustered layout, at the same due count.

Synthetic data: host h gets URLs with a Zipf-like skew (host = floor(hosts * u^skew), u uniform), every URL is
due now and unfetched; bucket is crawler.urls.bucket_of(host_key) (a UDF over the distinct hosts only, then a
join). url_id is md5(url), a deterministic 32-hex key of the engine's shape, not the engine's mmh3: the jobs
never recompute the id of a stored URL, and URLs discovered by update get real mmh3 ids from crawler.urls. A
benchmark whose pages link to stored URLs (bench.cycle) builds with `engine_ids`: discovery keys a link with the
engine's id, and an md5-keyed row would not be the URL it links to.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import config as config_mod
from crawler import layout, urls
from crawler.payloads import STORED_COLUMNS
from crawler.status import FetchOutcome, UrlSource, UrlStatus
from delta_tables import tables
from jobs import generate, maintain, update
from jobs.base import spark_session

TARGET_JOB_OVER_SCAN = 3.0
TARGET_UPDATE_GROWTH = 2.0
TARGET_DUE_GENERATE_GROWTH = 2.0
RANGE_PARTITIONS = 8  # fixed, so F.rand(seed) draws the same values on every run


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class StepTimes(logging.Handler):
    """Collects the durations jobs.base.step logs ("<name>: done in <s>s"), to show which step dominates."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.steps: list[tuple[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "%s: done in %.1fs" and isinstance(record.args, tuple):
            name, seconds = record.args
            self.steps.append((str(name), float(seconds)))
            progress(f"  {name}: {seconds:.1f}s")

    def take(self) -> list[tuple[str, float]]:
        taken, self.steps = self.steps, []
        return taken


@dataclass
class Figures:
    urls: int
    build_s: float = 0.0
    table_mb: float = 0.0
    table_files: int = 0
    scan_s: float = 0.0
    generate_s: float = 0.0
    update_s: float = 0.0
    leased: int = 0
    applied: int = 0
    discovered: int = 0
    generate_steps: list[tuple[str, float]] = field(default_factory=list)
    generate_cpu_s: float = 0.0
    generate_files_read: int = 0
    due: int = 0                          # --due: rows due at `now` (counted)
    as_built: ScanCost | None = None      # --due: generate on `urls` as built, before clustering
    cluster_s: float = 0.0                # --due: maintain's clustering of `urls`
    clustered_files: int = 0
    update_steps: list[tuple[str, float]] = field(default_factory=list)


def timed(action) -> tuple[float, object]:
    started = time.monotonic()
    value = action()
    return time.monotonic() - started, value


@dataclass
class ScanCost:
    """One job run's wall and JVM CPU seconds, and the `urls` files its scans read (summed over its queries)."""

    wall_s: float
    cpu_s: float
    files_read: int
    table_files: int


def jvm_cpu_s(spark: SparkSession) -> float:
    """CPU seconds the driver JVM (the local executors' threads included) has used so far, from /proc (Linux)."""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def sql_executions(spark: SparkSession) -> list[int]:
    """The ids of the SQL executions the session's status store holds (it keeps them with the UI off)."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList().iterator()
    ids = []
    while executions.hasNext():
        ids.append(executions.next().executionId())
    return ids


def files_read(spark: SparkSession, table_dir: str, since_execution: int) -> int:
    """`number of files read` of every Spark scan of the table under `table_dir` in the SQL executions from
    `since_execution` on."""
    store = spark._jsparkSession.sharedState().statusStore()
    total = 0
    for execution_id in sql_executions(spark):
        if execution_id < since_execution:
            continue
        values = store.executionMetrics(execution_id)
        nodes = store.planGraph(execution_id).allNodes()
        for i in range(nodes.size()):
            node = nodes.apply(i)
            if not node.name().startswith("Scan parquet") or table_dir not in node.desc():
                continue
            metrics = node.metrics()
            for j in range(metrics.size()):
                metric = metrics.apply(j)
                value = values.get(metric.accumulatorId())
                if metric.name() == "number of files read" and value.isDefined():
                    total += int(value.get().replace(",", ""))
    return total


def measured(spark: SparkSession, root: str, action) -> tuple[ScanCost, object]:
    """Run `action`, with what it cost and the `urls` files it read."""
    urls_dir = tables.table_path(root, "urls")  # no other table's name starts with "urls"
    table_files = table_detail(spark, urls_dir)[1]
    since = max(sql_executions(spark), default=-1) + 1
    cpu = jvm_cpu_s(spark)
    wall, value = timed(action)
    return ScanCost(wall, jvm_cpu_s(spark) - cpu, files_read(spark, urls_dir, since), table_files), value


def _as_table(df: DataFrame, name: str) -> DataFrame:
    """`df` as rows of table `name`: its columns, and null for every other (nullable) column of the table, so the
    synthetic rows keep up with columns added to the schema."""
    fields = tables.TABLES[name].schema.fields
    missing = [F.lit(None).cast(f.dataType).alias(f.name) for f in fields if f.nullable and f.name not in df.columns]
    return tables.conform(df.select("*", *missing), name)


def build_hosts(spark: SparkSession, root: str, host_count: int, buckets: int, now: datetime) -> DataFrame:
    """Write `hosts` (zero counters, no robots yet) and return (host_index, host_key, bucket) read back from it."""

    @F.udf("int")
    def bucket_of(host_key):  # no type hints: pyspark would try to read them as a pandas UDF's
        return urls.bucket_of(host_key, buckets)

    keys = spark.range(host_count, numPartitions=RANGE_PARTITIONS).select(
        F.col("id").alias("host_index"),
        F.concat(F.lit("http://host"), F.col("id").cast("string"), F.lit(".example")).alias("host_key"),
    ).withColumn("bucket", bucket_of("host_key"))
    zero = F.lit(0).cast("bigint")
    nulls = ("robots_state", "robots_body", "robots_status_code", "robots_fetched_at", "robots_expires_at",
             "crawl_delay_s", "min_delay_s", "max_concurrency", "backoff_until", "last_fetch_at", "last_segment",
             "trap_rejections", "trap_sample", "discovery_segment", "failing_since")
    rows = keys.select(
        "host_key", "bucket", *[F.lit(None).alias(c) for c in nulls],
        F.expr("substring(host_key, 8)").alias("domain"),  # hostN.example: its own registered domain
        F.lit(0).alias("backoff_level"), zero.alias("policy_version"),
        *[zero.alias(c) for c in ("known_urls", "fetches", "status_2xx", "status_3xx", "status_4xx", "status_5xx",
                                  "status_429", "network_errors", "robots_denied")],
        F.lit(now).alias("updated_at"),
    )
    tables.conform(rows, "hosts").repartition("bucket").write.format("delta").mode("append").save(
        tables.table_path(root, "hosts"))
    # Host index back from the stored key, so the UDF ran once (at the write), never per URL.
    return tables.table_df(spark, root, "hosts").select(
        F.regexp_extract("host_key", r"^http://host(\d+)\.example$", 1).cast("bigint").alias("host_index"),
        "host_key", "bucket")


def build_urls(spark: SparkSession, root: str, url_count: int, hosts: DataFrame, host_count: int, skew: float,
               default_interval_s: int, now: datetime, due_count: int | None = None, engine_ids: bool = False) -> None:
    """Write `urls`: rows spread over the hosts with a Zipf-like skew. With `due_count` None every row is due and
    unfetched; otherwise about `due_count` of them are (drawn at random), and the others were fetched before and
    come due over the next 30 days, as a running crawl's frontier does. `engine_ids`: url_id is
    crawler.urls.url_id (a pandas UDF) instead of md5."""
    host_index = F.least(F.floor(F.pow(F.rand(11), F.lit(skew)) * host_count).cast("bigint"),
                         F.lit(host_count - 1))
    overdue_s = (F.rand(13) * 30 * 86400 + 60).cast("bigint")  # due between 1 minute and 30 days ago
    due_share = 1.0 if due_count is None else min(1.0, due_count / url_count)
    # Not due: between 1 minute and 30 days from now (a negative overdue).
    overdue_s = F.when(F.rand(14) < due_share, overdue_s).otherwise(-overdue_s)
    drawn = spark.range(url_count, numPartitions=RANGE_PARTITIONS).select(
        F.col("id"), host_index.alias("host_index"), F.rand(12).alias("priority"), overdue_s.alias("overdue_s"),
    )
    nulls = ("discovered_in", "last_status_code", "etag", "last_modified", "content_hash", "simhash",
             "last_changed_at", "redirect_to", "lease_segment", "lease_expires_at", "last_segment", "inlink_segment",
             "sitemap_origin", *STORED_COLUMNS)
    next_fetch_at = F.timestamp_seconds(F.lit(int(now.timestamp())) - F.col("overdue_s"))
    fetched = F.col("overdue_s") < 0
    rows = drawn.join(F.broadcast(hosts), "host_index").select(
        F.concat("host_key", F.lit("/page/"), F.col("id").cast("string")).alias("url"),
        "host_key", "bucket", "priority", next_fetch_at.alias("next_fetch_at"),
        F.when(F.col("id") % 100 == 0, UrlSource.SEED.value).otherwise(UrlSource.LINK.value).alias("source"),
        (F.col("id") % 4).alias("depth"),
        fetched.alias("fetched"),
    ).select(
        (_engine_url_id("url") if engine_ids else F.md5("url")).alias("url_id"), "*",
        F.when(F.col("fetched"), UrlStatus.FETCHED.value).otherwise(UrlStatus.UNFETCHED.value).alias("status"),
        F.when(F.col("fetched"), 1).otherwise(0).alias("state_version"),
        (F.col("next_fetch_at") - F.expr("INTERVAL 31 DAYS")).alias("discovered_at"),
        F.when(F.col("fetched"), F.col("next_fetch_at") - F.make_dt_interval(secs=F.lit(default_interval_s)))
        .alias("last_fetch_at"),
        F.lit(default_interval_s).alias("fetch_interval_s"),
        F.lit(0).alias("failure_count"),
        F.lit(0).alias("inlinks"),
        F.lit(now).alias("updated_at"),
        *[F.lit(None).alias(c) for c in nulls],
    )
    tables.conform(rows, "urls").repartition("bucket").write.format("delta").mode("append").save(
        tables.table_path(root, "urls"))


def _engine_url_id(url: str) -> Column:
    """crawler.urls.url_id of a URL column, in Arrow batches."""
    return F.pandas_udf(lambda url_column: url_column.map(urls.url_id), "string")(url)


def table_detail(spark: SparkSession, path: str) -> tuple[float, int]:
    """(size in MB, file count) of a Delta table's current version."""
    row = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("sizeInBytes", "numFiles").first()
    return row["sizeInBytes"] / 1e6, row["numFiles"]


def scan_urls(spark: SparkSession, root: str) -> float:
    """Best of two full scans of `urls` (every column read and hashed); the first one also warms the caches."""
    df = tables.table_df(spark, root, "urls")
    total = F.sum(F.xxhash64(*df.columns) % 1000)
    return min(timed(lambda: df.agg(F.count("*"), total).collect())[0] for _ in range(2))


def write_segment_results(spark: SparkSession, root: str, segment_id: str, links_per_result: int,
                          fetched_at: datetime) -> None:
    """Fetched results for every URL in the segment's fetch list, as the daemon would write them (Parquet with
    crawler.records.FETCHED columns, one directory per bucket), plus what parse would add: one `pages` row per
    result (new content hash) and outlinks to new URLs in `links`."""
    fetchlist = spark.read.parquet(layout.fetchlist_dir(root, segment_id)).withColumn(
        "bucket", F.col("bucket").cast("int"))
    results = fetchlist.select(
        F.lit(segment_id).alias("segment_id"), "bucket", "url_id", "state_version", "url", "host_key",
        F.lit(fetched_at).alias("fetched_at"),
        F.lit(FetchOutcome.SUCCESS.value).alias("outcome"),
        F.lit(200).cast("int").alias("status_code"),
        F.lit(None).cast("string").alias("redirect_to"),
        F.concat(F.lit('"'), F.substring("url_id", 1, 12), F.lit('"')).alias("etag"),
        F.lit(None).cast("string").alias("last_modified"),
        F.lit("text/html").alias("content_type"),
        F.lit(20000).cast("bigint").alias("content_length"),
        F.lit(False).alias("truncated"),
        F.concat(F.lit("sha1:"), F.upper(F.substring(F.sha1("url"), 1, 32))).alias("payload_digest"),
        F.concat(F.lit(f"segments/{segment_id}/warc/bucket="), F.format_string("%05d", "bucket"),
                 F.lit("/bench.warc.gz")).alias("warc_filename"),
        F.lit(0).cast("bigint").alias("warc_offset"),
        F.lit(1000).cast("bigint").alias("warc_length"),
        F.lit(150).cast("bigint").alias("elapsed_ms"),
        F.lit(None).cast("double").alias("retry_after_s"),
        F.lit("127.0.0.1").alias("remote_ip"),
        F.lit(None).cast("string").alias("error"),
        F.lit("bench").alias("daemon_id"),
    ).persist()
    buckets = sorted(r[0] for r in results.select("bucket").distinct().collect())
    for bucket in buckets:  # one directory per bucket (bucket=NNNNN), the bucket column kept inside the files
        results.where(F.col("bucket") == bucket).coalesce(1).write.mode("overwrite").parquet(
            layout.fetched_dir(root, segment_id, bucket))
    pages = results.select(
        "url_id", "state_version", "url", "segment_id", "fetched_at", "warc_filename", "warc_offset", "warc_length",
        "content_type", F.lit("Bench page").alias("title"),
        *[F.lit(None).alias(c) for c in ("canonical_url", "language", "duplicate_of", "near_duplicate_cluster",
                                         "parse_error", "sitemap_urls", "sitemap_refused")],
        F.lit(False).alias("meta_noindex"), F.lit(False).alias("meta_nofollow"),
        F.lit(links_per_result).alias("outlink_count"),
        F.sha1("url").alias("content_hash"), F.xxhash64("url").alias("simhash"),
    )
    _as_table(pages, "pages").write.format("delta").mode("append").save(tables.table_path(root, "pages"))
    if links_per_result:
        link = F.explode(F.sequence(F.lit(1), F.lit(links_per_result))).alias("link_no")
        to_url = F.concat("host_key", F.lit("/new/"), F.col("url_id"), F.lit("-"), F.col("link_no").cast("string"))
        links = results.select("url_id", "state_version", "host_key", link).select(
            F.lit(segment_id).alias("segment_id"),
            F.col("url_id").alias("from_url_id"),
            F.col("state_version").alias("from_state_version"),
            F.md5(to_url).alias("to_url_id"),
            to_url.alias("to_url"),
            F.lit("more").alias("anchor_text"),
            F.lit(False).alias("rel_nofollow"),
            F.lit(None).cast("array<string>").alias("rel_flags"),
            *[F.lit(None).alias(c) for c in ("sitemap_lastmod", "sitemap_changefreq", "sitemap_priority",
                                             "sitemap_origin")],
        )
        _as_table(links, "links").write.format("delta").mode("append").save(tables.table_path(root, "links"))
    results.unpersist()


def run_size(spark: SparkSession, conf: config_mod.Config, root: str, url_count: int, args: argparse.Namespace,
             steps: StepTimes) -> Figures:
    figures = Figures(url_count)
    shutil.rmtree(root, ignore_errors=True)
    now = datetime.now(UTC).replace(microsecond=0)
    progress(f"{url_count:,} URLs: building tables under {root}")

    def build() -> None:
        tables.create_all(spark, root)
        hosts = build_hosts(spark, root, args.hosts, conf.crawl.buckets, now)
        build_urls(spark, root, url_count, hosts, args.hosts, args.skew, conf.revisit.default_interval_s, now,
                   args.due)

    figures.build_s, _ = timed(build)
    figures.table_mb, figures.table_files = table_detail(spark, tables.table_path(root, "urls"))
    progress(f"{url_count:,} URLs: built in {figures.build_s:.1f}s ({figures.table_mb:.0f} MB in "
             f"{figures.table_files} files)")

    figures.scan_s = scan_urls(spark, root)
    progress(f"{url_count:,} URLs: scan {figures.scan_s:.1f}s")

    segment_id = f"seg-bench-{url_count}"
    if args.due is not None:
        return due_generates(spark, conf, root, segment_id, now, figures, steps, args.keep)
    steps.take()
    figures.generate_s, generated = timed(lambda: generate.run(spark, conf, root, segment_id, now=now))
    figures.generate_steps = steps.take()
    figures.leased = generated.url_count
    progress(f"{url_count:,} URLs: generate {figures.generate_s:.1f}s ({generated.summary()})")

    progress(f"{url_count:,} URLs: writing {figures.leased:,} synthetic fetched results (not timed)")
    write_segment_results(spark, root, segment_id, args.links, now + timedelta(minutes=10))

    steps.take()
    figures.update_s, updated = timed(lambda: update.run(spark, conf, root, segment_id))
    figures.update_steps = steps.take()
    figures.applied, figures.discovered = updated.applied, updated.discovered
    progress(f"{url_count:,} URLs: update {figures.update_s:.1f}s ({updated.summary()})")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def due_generates(spark: SparkSession, conf: config_mod.Config, root: str, segment_id: str, now: datetime,
                  figures: Figures, steps: StepTimes, keep: bool) -> Figures:
    """--due: generate on `urls` as built, then (tables restored) after maintain's clustering of `urls`."""
    from delta.tables import DeltaTable

    url_count = figures.urls
    figures.due = tables.table_df(spark, root, "urls").where(F.col("next_fetch_at") <= F.lit(now)).count()
    built = {name: tables.table_version(spark, root, name) for name in ("urls", "segments", "cycle_metrics")}
    figures.as_built, generated = measured(spark, root, lambda: generate.run(spark, conf, root, segment_id, now=now))
    progress(f"{url_count:,} URLs: generate as built {figures.as_built.wall_s:.1f}s "
             f"({figures.as_built.files_read} files read of {figures.as_built.table_files}; {generated.summary()})")
    steps.take()
    for name, version in built.items():  # as before that generate: nothing leased, no segment
        DeltaTable.forPath(spark, tables.table_path(root, name)).restoreToVersion(version)
    shutil.rmtree(layout.segment_dir(root, segment_id))
    figures.cluster_s, _ = timed(lambda: maintain.maintain_table(spark, conf, root, "urls", None))
    figures.clustered_files = table_detail(spark, tables.table_path(root, "urls"))[1]
    progress(f"{url_count:,} URLs: clustered by next_fetch_at in {figures.cluster_s:.1f}s "
             f"({figures.clustered_files} files)")
    steps.take()
    clustered, generated = measured(spark, root, lambda: generate.run(spark, conf, root, segment_id, now=now))
    figures.generate_steps = steps.take()
    figures.generate_s, figures.generate_cpu_s = clustered.wall_s, clustered.cpu_s
    figures.generate_files_read, figures.leased = clustered.files_read, generated.url_count
    progress(f"{url_count:,} URLs: generate clustered {clustered.wall_s:.1f}s ({clustered.files_read} files read "
             f"of {clustered.table_files}; {generated.summary()})")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def verdict(value: float, limit: float) -> str:
    return "met" if value < limit or abs(value - limit) < 1e-9 else "NOT met"


def report_due(all_figures: list[Figures], args: argparse.Namespace) -> None:
    print()
    print(f"Frontier benchmark, --due {args.due:,}: {args.hosts:,} hosts (Zipf-like skew {args.skew}), segment budget "
          f"{args.results:,}; the rest of the rows come due over 30 days")
    header = (f"{'URLs':>12} {'due':>8} {'table MB':>9} {'scan s':>7} | {'as built: gen s':>15} {'CPU s':>6} "
              f"{'files':>11} | {'cluster s':>9} | {'clustered: gen s':>16} {'CPU s':>6} {'files':>11} {'leased':>8}")
    print(header)
    print("-" * len(header))
    for f in all_figures:
        b = f.as_built
        print(f"{f.urls:>12,} {f.due:>8,} {f.table_mb:>9.0f} {f.scan_s:>7.1f} | {b.wall_s:>15.1f} {b.cpu_s:>6.1f} "
              f"{f'{b.files_read}/{b.table_files}':>11} | {f.cluster_s:>9.1f} | {f.generate_s:>16.1f} "
              f"{f.generate_cpu_s:>6.1f} {f'{f.generate_files_read}/{f.clustered_files}':>11} {f.leased:>8,}")
    print("(files: `urls` files read by generate's scans, summed over its queries / files in the table)")
    if len(all_figures) > 1:
        small, large = all_figures[0], all_figures[-1]
        for name, before, after in (("as built", small.as_built.wall_s, large.as_built.wall_s),
                                    ("clustered", small.generate_s, large.generate_s)):
            growth = after / before
            print(f"  generate {name}: {large.urls:,}/{small.urls:,} URLs = {growth:.2f} "
                  f"{verdict(growth, TARGET_DUE_GENERATE_GROWTH)} (target <= {TARGET_DUE_GENERATE_GROWTH:g})")
    print()
    print("Step times of the clustered generate (jobs.base.step):")
    for f in all_figures:
        listed = ", ".join(f"{name.split(': ', 1)[-1]} {s:.1f}" for name, s in f.generate_steps)
        print(f"  {f.urls:>12,} {listed}, other {f.generate_s - sum(s for _, s in f.generate_steps):.1f}")


def report(all_figures: list[Figures], args: argparse.Namespace) -> None:
    if args.due is not None:
        report_due(all_figures, args)
        return
    print()
    print(f"Frontier benchmark: {args.hosts:,} hosts (Zipf-like skew {args.skew}), segment budget "
          f"{args.results:,}, {args.links} new-URL link(s) per result; url_id = md5(url) for the synthetic rows")
    header = (f"{'URLs':>12} {'table MB':>9} {'build s':>8} {'scan s':>7} {'generate s':>10} {'update s':>9} "
              f"{'gen/scan':>9} {'upd/scan':>9} {'leased':>8} {'applied':>8} {'new URLs':>8}")
    print(header)
    print("-" * len(header))
    for f in all_figures:
        print(f"{f.urls:>12,} {f.table_mb:>9.0f} {f.build_s:>8.1f} {f.scan_s:>7.1f} {f.generate_s:>10.1f} "
              f"{f.update_s:>9.1f} {f.generate_s / f.scan_s:>9.1f} {f.update_s / f.scan_s:>9.1f} {f.leased:>8,} "
              f"{f.applied:>8,} {f.discovered:>8,}")
    print()
    print(f"Targets: generate and update within {TARGET_JOB_OVER_SCAN:g}x a scan; "
          f"update(largest)/update(smallest) < {TARGET_UPDATE_GROWTH:g}")
    for f in all_figures:
        print(f"  {f.urls:>12,} URLs: generate/scan {f.generate_s / f.scan_s:.1f} "
              f"{verdict(f.generate_s / f.scan_s, TARGET_JOB_OVER_SCAN)}; "
              f"update/scan {f.update_s / f.scan_s:.1f} {verdict(f.update_s / f.scan_s, TARGET_JOB_OVER_SCAN)}")
    if len(all_figures) > 1:
        small, large = all_figures[0], all_figures[-1]
        growth = large.update_s / small.update_s
        status = "met" if growth < TARGET_UPDATE_GROWTH else "NOT met"
        print(f"  update({large.urls:,})/update({small.urls:,}) = {growth:.2f} {status} "
              f"(table grew {large.urls / small.urls:.0f}x)")
    print()
    print("Step times (jobs.base.step; the rest of a job's time is its counts and snapshot reads):")
    for f in all_figures:
        for job, total, job_steps in (("generate", f.generate_s, f.generate_steps), ("update", f.update_s,
                                                                                      f.update_steps)):
            listed = ", ".join(f"{name.split(': ', 1)[-1]} {s:.1f}" for name, s in job_steps)
            other = total - sum(s for _, s in job_steps)
            print(f"  {f.urls:>12,} {job:<8} {listed}, other {other:.1f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", default="1000000,10000000", help="comma-separated table sizes, smallest first")
    parser.add_argument("--hosts", type=int, default=100_000, help="distinct hosts")
    parser.add_argument("--results", type=int, default=100_000, help="segment budget = fetched results per segment")
    parser.add_argument("--links", type=int, default=1, help="new-URL outlinks per fetched result (0 = none)")
    parser.add_argument("--due", type=int, default=None,
                        help="about this many rows due, the rest due over the next 30 days (default: every row due); "
                             "compares generate before and after maintain's clustering, without update")
    parser.add_argument("--skew", type=float, default=3.0, help="host = floor(hosts * u^skew); 1 = uniform")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench", help="scratch storage root (wiped per size)")
    parser.add_argument("--keep", action="store_true", help="keep each size's tables instead of deleting them")
    parser.add_argument("--master", default="local[2]", help="spark.master")
    parser.add_argument("--driver-memory", default="8g", help="spark.driver.memory")
    parser.add_argument("--shuffle-partitions", type=int, default=8, help="spark.sql.shuffle.partitions")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a config key for the jobs (YAML value), e.g. generate.per_domain_max_urls=50; repeatable")
    args = parser.parse_args(argv)
    args.sizes = [int(s.replace("_", "")) for s in args.urls.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) <= 0 or args.hosts <= 0 or args.results <= 0 or args.links < 0:
        parser.error("--urls, --hosts and --results must be positive, --links not negative")
    if args.due is not None and args.due <= 0:
        parser.error("--due must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = config_mod.load(None, args.settings).with_overrides({
        "spark.master": args.master,
        "spark.shuffle_partitions": args.shuffle_partitions,
        "spark.driver_memory": args.driver_memory,
        "spark.log_level": "ERROR",
        "generate.segment_max_urls": args.results,
    })
    steps = StepTimes()
    jobs_log = logging.getLogger("jobs")
    jobs_log.setLevel(logging.INFO)
    jobs_log.addHandler(steps)
    root = layout.normalize_root(args.root)
    progress(f"starting Spark ({args.master}, driver memory {args.driver_memory}, "
             f"{args.shuffle_partitions} shuffle partitions, {conf.crawl.buckets} buckets)")
    spark = spark_session(conf, app_name="cyclecrawl-bench")
    started = time.monotonic()
    try:
        all_figures = [run_size(spark, conf, layout.join(root, f"urls-{n}"), n, args, steps) for n in args.sizes]
    finally:
        spark.stop()
    report(all_figures, args)
    print(f"\nTotal benchmark time {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
