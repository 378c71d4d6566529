"""`crawl report --segment S`: aggregate one segment's tables and write ROOT/reports/<segment>.html.

Only aggregates reach the driver (counts per outcome, histogram bins, the top hosts); the inter-request gaps
are computed with a window per host over the segment's fetches. Hosts by state are counted now, and the frontier
figures are the last FRONTIER_ROWS rows of `cycle_metrics` (jobs/cycle_metrics.py). The drawing is
crawler/report.py's.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.errors import UnknownSegment, UserError
from crawler.politeness import PolitenessRules
from crawler.report import (
    BYTES_EDGES,
    ELAPSED_EDGES_MS,
    GAP_EDGES_S,
    HostStats,
    ReportData,
    render_html,
    terminal_summary,
)
from crawler.service_levels import ServiceLevels
from crawler.status import FetchOutcome, made_request_sql
from delta_tables import tables
from jobs import cycle_metrics
from jobs.storage import LOCAL, Storage

TOP_HOSTS = 20
FRONTIER_ROWS = 16  # cycle_metrics rows the report shows: the last eight cycles (generate and update each)


def report_path(root: str, segment_id: str) -> str:
    return layout.join(root, "reports", f"{segment_id}.html")


def bin_column(column: Column, edges: tuple[float, ...]) -> Column:
    """The histogram bin of `column`, equal to crawler.report.bin_index: how many edges are <= the value."""
    return sum((F.when(column >= F.lit(edge), 1).otherwise(0) for edge in edges), F.lit(0))


def _bins(df: DataFrame, column: Column, edges: tuple[float, ...]) -> list[int]:
    counts = [0] * (len(edges) + 1)
    for row in df.where(column.isNotNull()).groupBy(bin_column(column, edges).alias("bin")).count().collect():
        counts[row["bin"]] = int(row["count"])
    return counts


def _host_delays(conf: Config, hosts: DataFrame, host_keys: DataFrame) -> DataFrame:
    """(host_key, delay_s): the politeness delay each host was owed at least, the delay generate planned with
    (crawler.politeness.PolitenessRules.host_delay); a host without a `hosts` row gets the configured one."""
    delay = PolitenessRules.from_config(conf).host_delay_sql("crawl_delay_s", "min_delay_s")
    return host_keys.join(hosts.select("host_key", "min_delay_s", "crawl_delay_s"), "host_key", "left").select(
        "host_key", F.expr(delay).alias("delay_s"))


def _gaps(fetches: DataFrame) -> DataFrame:
    """(host_key, gap_s) between consecutive requests to a host: next start - (previous start + elapsed). Only
    attempts that made a request count (crawler.status.made_request); robots denials and blocks did not."""
    requested = fetches.where(made_request_sql("outcome"))
    by_host = Window.partitionBy("host_key").orderBy("start_s", "url_id")
    return (
        requested.select("host_key", "url_id", F.col("fetched_at").cast("double").alias("start_s"),
                         (F.coalesce(F.col("elapsed_ms"), F.lit(0)) / 1000.0).alias("elapsed_s"))
        .withColumn("gap_s", F.col("start_s") - (F.lag("start_s").over(by_host) + F.lag("elapsed_s").over(by_host)))
        .where(F.col("gap_s").isNotNull())
        .select("host_key", "gap_s")
    )


def _host_stats(rows, bins: dict[str, list[int]] | None = None) -> list[HostStats]:
    return [HostStats(host_key=r["host_key"], fetches=int(r["fetches"] or 0), robots_denied=int(r["denied"] or 0),
                      delay_s=float(r["delay_s"] or 0.0), gaps=int(r["gaps"] or 0),
                      under_delay=int(r["under"] or 0), min_gap_s=r["min_gap_s"],
                      gap_bins=(bins or {}).get(r["host_key"], [0] * (len(GAP_EDGES_S) + 1)))
            for r in rows]


def build(spark: SparkSession, conf: Config, root: str, segment_id: str, top: int = TOP_HOSTS) -> ReportData:
    """The report's aggregates for one segment (its `fetches`, `segments`, `pages`, new `urls`, `hosts`)."""
    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    fetches = tables.table_df(spark, root, "fetches").where(F.col("segment_id") == segment_id).persist()
    try:
        outcomes = {r["outcome"]: int(r["count"]) for r in fetches.groupBy("outcome").count().collect()}
        if not outcomes:
            existing = [r[0] for r in tables.table_df(spark, root, "segments").select("segment_id").distinct()
                        .collect()]
            if segment_id not in existing:
                raise UnknownSegment(segment_id, root, existing)
            raise UserError(f"segment {segment_id} has no fetches")
        per_host = fetches.groupBy("host_key").agg(
            F.count(F.lit(1)).alias("fetches"),
            F.sum((F.col("outcome") == FetchOutcome.ROBOTS_DENIED.value).cast("long")).alias("denied"))
        delays = _host_delays(conf, tables.table_df(spark, root, "hosts"), per_host.select("host_key"))
        gaps = (_gaps(fetches).join(delays, "host_key", "left")
                .withColumn("under", (F.col("gap_s") < F.col("delay_s")).cast("long"))
                .withColumn("bin", bin_column(F.col("gap_s"), GAP_EDGES_S))).persist()
        try:
            gap_per_host = gaps.groupBy("host_key").agg(
                F.count(F.lit(1)).alias("gaps"), F.sum("under").alias("under"), F.min("gap_s").alias("min_gap_s"))
            hosts = (per_host.join(gap_per_host, "host_key", "left").join(delays, "host_key", "left")
                     .persist())
            try:
                top_rows = hosts.orderBy(F.desc("fetches"), "host_key").limit(top).collect()
                top_keys = [r["host_key"] for r in top_rows]
                host_bins = {k: [0] * (len(GAP_EDGES_S) + 1) for k in top_keys}
                for r in gaps.where(F.col("host_key").isin(top_keys)).groupBy("host_key", "bin").count().collect():
                    host_bins[r["host_key"]][r["bin"]] = int(r["count"])
                under_rows = (hosts.where(F.col("under") > 0).orderBy(F.desc("under"), "host_key").limit(top)
                              .collect())
                host_count = hosts.count()
                denied_rows = (hosts.where(F.col("denied") > 0).orderBy(F.desc("denied"), "host_key").limit(top)
                               .collect())
            finally:
                hosts.unpersist()
            gap_bins = [0] * (len(GAP_EDGES_S) + 1)
            for r in gaps.groupBy("bin").count().collect():
                gap_bins[r["bin"]] = int(r["count"])
            under_total, min_gap = gaps.agg(F.coalesce(F.sum("under"), F.lit(0)), F.min("gap_s")).first()
        finally:
            gaps.unpersist()
        requested = fetches.where(made_request_sql("outcome"))
        elapsed = requested.agg(F.percentile_approx("elapsed_ms", [0.5, 0.95]).alias("p")).first()["p"]
        sizes = fetches.agg(F.coalesce(F.sum("content_length"), F.lit(0)).alias("total"),
                            F.count(F.when(F.col("truncated"), 1)).alias("truncated")).first()
        elapsed_bins = _bins(requested, F.col("elapsed_ms"), ELAPSED_EDGES_MS)
        addresses = (fetches.where(F.col("remote_ip").isNotNull()).groupBy("remote_ip")
                     .agg(F.countDistinct("host_key").alias("names"), F.count(F.lit(1)).alias("requests"))
                     .orderBy(F.desc("names"), F.desc("requests"), "remote_ip").limit(top).collect())
        bytes_bins = _bins(fetches, F.col("content_length"), BYTES_EDGES)
    finally:
        fetches.unpersist()

    segment_rows = (tables.table_df(spark, root, "segments").where(F.col("segment_id") == segment_id)
                    .orderBy("bucket").collect())  # one row per bucket: bounded by crawl.buckets
    counters: dict[str, int] = {}
    for row in segment_rows:
        for key, value in (row["counters"] or {}).items():
            counters[key] = counters.get(key, 0) + int(value or 0)
    pages = _page_counts(tables.table_df(spark, root, "pages").where(F.col("segment_id") == segment_id))
    new_urls = {r["source"]: int(r["count"]) for r in tables.table_df(spark, root, "urls")
                .where(F.col("discovered_in") == segment_id).groupBy("source").count().collect()}
    traps = _traps(tables.table_df(spark, root, "hosts"), segment_id, top)
    frontier = cycle_metrics.recent(spark, root, FRONTIER_ROWS)
    return ReportData(
        segment_id=segment_id,
        min_delay_s=float(conf.politeness.min_delay_s),
        fetches=sum(outcomes.values()),
        hosts=host_count,
        outcomes=outcomes,
        top_hosts=_host_stats(top_rows, host_bins),
        gaps=sum(gap_bins),
        under_delay=int(under_total),
        min_gap_s=min_gap,
        gap_bins=gap_bins,
        under_delay_hosts=_host_stats(under_rows),
        elapsed_bins=elapsed_bins,
        elapsed_p50_ms=None if elapsed is None or elapsed[0] is None else float(elapsed[0]),
        elapsed_p95_ms=None if elapsed is None or elapsed[1] is None else float(elapsed[1]),
        bytes_bins=bytes_bins,
        bytes_total=int(sizes["total"]),
        truncated=int(sizes["truncated"]),
        buckets=[{k: row[k] for k in ("bucket", "state", "results", "applied", "stale", "discovered")}
                 for row in segment_rows],
        counters=counters,
        new_urls=new_urls,
        robots_denied_hosts=[(r["host_key"], int(r["denied"])) for r in denied_rows],
        shared_addresses=[(r["remote_ip"], int(r["names"]), int(r["requests"])) for r in addresses],
        trap_hosts=traps[0],
        trap_reasons=traps[1],
        host_states=cycle_metrics.hosts_by_state(spark, conf, root, datetime.now(UTC)),
        frontier=frontier,
        levels=ServiceLevels.from_config(conf),
        **pages,
    )


def _page_counts(pages: DataFrame) -> dict:
    exact = F.col("duplicate_of").isNotNull()
    near = ~exact & F.col("near_duplicate_cluster").isNotNull() & (F.col("near_duplicate_cluster") != F.col("url_id"))
    row = pages.agg(
        F.count(F.lit(1)).alias("pages"),
        F.count(F.when(exact, 1)).alias("exact_duplicates"),
        F.count(F.when(near, 1)).alias("near_duplicates"),
        F.count("parse_error").alias("parse_errors"),
        F.count("sitemap_urls").alias("sitemaps"),
        F.coalesce(F.sum("sitemap_urls"), F.lit(0)).alias("sitemap_urls"),
    ).first()
    refused = {r["key"]: int(r["count"]) for r in pages.select(F.explode("sitemap_refused"))
               .groupBy("key").agg(F.sum("value").alias("count")).collect()}
    return {**{k: int(row[k]) for k in row.asDict()}, "sitemap_refused": refused}


def _traps(hosts: DataFrame, segment_id: str, top: int) -> tuple[list[tuple[str, dict[str, int]]], dict[str, int]]:
    """Trap rejections are cumulative per host: the hosts whose discovery_segment is this one, their maps (the
    top ones by total) and the maps summed."""
    touched = hosts.where((F.col("discovery_segment") == segment_id) & (F.size("trap_rejections") > 0))
    total = F.aggregate(F.map_values("trap_rejections"), F.lit(0).cast("long"), lambda acc, x: acc + x)
    rows = touched.select("host_key", "trap_rejections", total.alias("total")) \
        .orderBy(F.desc("total"), "host_key").limit(top).collect()
    reasons = {r["key"]: int(r["count"]) for r in touched.select(F.explode("trap_rejections"))
               .groupBy("key").agg(F.sum("value").alias("count")).collect()}
    return [(r["host_key"], {k: int(v) for k, v in r["trap_rejections"].items()}) for r in rows], reasons


def write_report(data: ReportData, root: str, out_path: str | None = None, storage: Storage = LOCAL) -> str:
    """Write the page to `out_path` (default ROOT/reports/<segment>.html; a local path or an s3:// URI, reached
    through `storage`) and return its path."""
    path = out_path or report_path(layout.normalize_root(root), data.segment_id)
    storage.write_bytes(path, render_html(data).encode("utf-8"))
    return path


def run(spark: SparkSession, conf: Config, root: str, segment_id: str, out_path: str | None = None) -> str:
    """Aggregate the segment and write its report; the report's path."""
    return write_report(build(spark, conf, root, segment_id), root, out_path, Storage.from_conf(conf))


def run_command(spark: SparkSession, conf: Config, root: str, segment: str, out: str | None) -> int:
    """`crawl report`: the summary on the terminal, and where the HTML page went."""
    data = build(spark, conf, root, segment)
    print(terminal_summary(data))
    print(f"report: {write_report(data, root, out, Storage.from_conf(conf))}")
    return 0
