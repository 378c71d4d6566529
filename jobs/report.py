"""`crawl report --segment S`: aggregate one segment's tables and write ROOT/reports/<segment>.html.

Only aggregates reach the driver (counts per outcome, histogram bins, the top hosts); the inter-request gaps
are computed with a window per host over the segment's fetches. `build_many` makes several segments' reports in
the same jobs (`crawl demo`: each merged segment's), every aggregate keyed by segment. Hosts by state are
counted now, and the frontier figures are the last FRONTIER_ROWS rows of `cycle_metrics` (jobs/cycle_metrics.py).
The drawing is crawler/report.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
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


def _bins(df: DataFrame, column: Column, edges: tuple[float, ...]) -> dict[str, list[int]]:
    """Per segment, how many of its rows' `column` fall in each bin."""
    return _bin_counts(df.where(column.isNotNull()).groupBy("segment_id", bin_column(column, edges).alias("bin"))
                       .count().collect(), lambda row: row["segment_id"], edges)


def _no_bins(edges: tuple[float, ...]) -> list[int]:
    return [0] * (len(edges) + 1)


def _bin_counts(rows: list[Row], key: Callable[[Row], Hashable], edges: tuple[float, ...]) -> dict[Any, list[int]]:
    """Per `key` of the rows of a `groupBy(..., "bin").count()`, the count in each bin of `edges`."""
    counts: dict[Any, list[int]] = {}
    for row in rows:
        counts.setdefault(key(row), _no_bins(edges))[row["bin"]] = int(row["count"])
    return counts


def _host_delays(conf: Config, hosts: DataFrame, host_keys: DataFrame) -> DataFrame:
    """(host_key, delay_s): the politeness delay each host was owed at least, the delay generate planned with
    (crawler.politeness.PolitenessRules.host_delay); a host without a `hosts` row gets the configured one."""
    delay = PolitenessRules.from_config(conf).host_delay_sql("crawl_delay_s", "min_delay_s")
    return host_keys.join(hosts.select("host_key", "min_delay_s", "crawl_delay_s"), "host_key", "left").select(
        "host_key", F.expr(delay).alias("delay_s"))


def _gaps(fetches: DataFrame) -> DataFrame:
    """(segment_id, host_key, gap_s) between consecutive requests to a host in a segment: next start - (previous
    start + elapsed). Only attempts that made a request count (crawler.status.made_request); robots denials and
    blocks did not."""
    requested = fetches.where(made_request_sql("outcome"))
    by_host = Window.partitionBy("segment_id", "host_key").orderBy("start_s", "url_id")
    return (
        requested.select("segment_id", "host_key", "url_id", F.col("fetched_at").cast("double").alias("start_s"),
                         (F.coalesce(F.col("elapsed_ms"), F.lit(0)) / 1000.0).alias("elapsed_s"))
        .withColumn("gap_s", F.col("start_s") - (F.lag("start_s").over(by_host) + F.lag("elapsed_s").over(by_host)))
        .where(F.col("gap_s").isNotNull())
        .select("segment_id", "host_key", "gap_s")
    )


def _top(df: DataFrame, top: int, *order: Column | str) -> dict[str, list[Row]]:
    """Each segment's first `top` rows of `df` in `order`."""
    ranked = df.withColumn("_n", F.row_number().over(Window.partitionBy("segment_id").orderBy(*order)))
    return _per_segment(ranked.where(F.col("_n") <= top).orderBy("segment_id", "_n").collect())


def _per_segment(rows: list[Row]) -> dict[str, list[Row]]:
    """`rows` grouped by their segment_id, each group in the order given."""
    found: dict[str, list[Row]] = {}
    for row in rows:
        found.setdefault(row["segment_id"], []).append(row)
    return found


def _host_stats(rows: list[Row], bins: dict[tuple[str, str], list[int]] | None = None) -> list[HostStats]:
    """The rows' hosts, with their gap histograms by (segment_id, host_key) when `bins` are given."""
    return [HostStats(host_key=r["host_key"], fetches=int(r["fetches"] or 0), robots_denied=int(r["denied"] or 0),
                      delay_s=float(r["delay_s"] or 0.0), gaps=int(r["gaps"] or 0),
                      under_delay=int(r["under"] or 0), min_gap_s=r["min_gap_s"],
                      gap_bins=(bins or {}).get((r["segment_id"], r["host_key"]), _no_bins(GAP_EDGES_S)))
            for r in rows]


def build(spark: SparkSession, conf: Config, root: str, segment_id: str, top: int = TOP_HOSTS) -> ReportData:
    """The report's aggregates for one segment (its `fetches`, `segments`, `pages`, new `urls`, `hosts`)."""
    return build_many(spark, conf, root, [segment_id], top)[segment_id]


def build_many(spark: SparkSession, conf: Config, root: str, segment_ids: list[str],
               top: int = TOP_HOSTS) -> dict[str, ReportData]:
    """Each segment's report, from one set of Spark jobs however many segments there are (every aggregate is keyed
    by segment too): what `crawl demo` writes at its end. A segment without fetches is an error, as in `build`."""
    for segment_id in segment_ids:
        layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    ours = F.col("segment_id").isin(*segment_ids)
    fetches = tables.table_df(spark, root, "fetches").where(ours).persist()
    try:
        outcomes: dict[str, dict[str, int]] = {}
        for r in fetches.groupBy("segment_id", "outcome").count().collect():
            outcomes.setdefault(r["segment_id"], {})[r["outcome"]] = int(r["count"])
        _check_fetched(spark, root, segment_ids, outcomes)
        per_host = fetches.groupBy("segment_id", "host_key").agg(
            F.count(F.lit(1)).alias("fetches"),
            F.sum((F.col("outcome") == FetchOutcome.ROBOTS_DENIED.value).cast("long")).alias("denied"))
        delays = _host_delays(conf, tables.table_df(spark, root, "hosts"), per_host.select("host_key").distinct())
        gaps = (_gaps(fetches).join(delays, "host_key", "left")
                .withColumn("under", (F.col("gap_s") < F.col("delay_s")).cast("long"))
                .withColumn("bin", bin_column(F.col("gap_s"), GAP_EDGES_S))).persist()
        try:
            gap_per_host = gaps.groupBy("segment_id", "host_key").agg(
                F.count(F.lit(1)).alias("gaps"), F.sum("under").alias("under"), F.min("gap_s").alias("min_gap_s"))
            hosts = (per_host.join(gap_per_host, ["segment_id", "host_key"], "left").join(delays, "host_key", "left")
                     .persist())
            try:
                top_rows = _top(hosts, top, F.desc("fetches"), "host_key")
                top_keys = spark.createDataFrame(
                    [(s, r["host_key"]) for s, rows in top_rows.items() for r in rows],
                    "segment_id string, host_key string")
                host_bins = _bin_counts(
                    gaps.join(top_keys, ["segment_id", "host_key"]).groupBy("segment_id", "host_key", "bin").count()
                    .collect(), lambda row: (row["segment_id"], row["host_key"]), GAP_EDGES_S)
                under_rows = _top(hosts.where(F.col("under") > 0), top, F.desc("under"), "host_key")
                host_count = {r["segment_id"]: int(r["count"]) for r in hosts.groupBy("segment_id").count().collect()}
                denied_rows = _top(hosts.where(F.col("denied") > 0), top, F.desc("denied"), "host_key")
            finally:
                hosts.unpersist()
            gap_bins = _bin_counts(gaps.groupBy("segment_id", "bin").count().collect(), lambda row: row["segment_id"],
                                   GAP_EDGES_S)
            gap_totals = {r["segment_id"]: r for r in gaps.groupBy("segment_id").agg(
                F.coalesce(F.sum("under"), F.lit(0)).alias("under"), F.min("gap_s").alias("min_gap")).collect()}
        finally:
            gaps.unpersist()
        requested = fetches.where(made_request_sql("outcome"))
        elapsed = {r["segment_id"]: r["p"] for r in requested.groupBy("segment_id").agg(
            F.percentile_approx("elapsed_ms", [0.5, 0.95]).alias("p")).collect()}
        sizes = {r["segment_id"]: r for r in fetches.groupBy("segment_id").agg(
            F.coalesce(F.sum("content_length"), F.lit(0)).alias("total"),
            F.count(F.when(F.col("truncated"), 1)).alias("truncated")).collect()}
        elapsed_bins = _bins(requested, F.col("elapsed_ms"), ELAPSED_EDGES_MS)
        addresses = _top(fetches.where(F.col("remote_ip").isNotNull()).groupBy("segment_id", "remote_ip")
                         .agg(F.countDistinct("host_key").alias("names"), F.count(F.lit(1)).alias("requests")),
                         top, F.desc("names"), F.desc("requests"), "remote_ip")
        bytes_bins = _bins(fetches, F.col("content_length"), BYTES_EDGES)
    finally:
        fetches.unpersist()

    segment_rows = _per_segment(tables.table_df(spark, root, "segments").where(ours)
                                .orderBy("segment_id", "bucket").collect())  # a row per bucket: crawl.buckets
    pages = _page_counts(tables.table_df(spark, root, "pages").where(ours), segment_ids)
    new_urls: dict[str, dict[str, int]] = {}
    for r in (tables.table_df(spark, root, "urls").where(F.col("discovered_in").isin(*segment_ids))
              .groupBy("discovered_in", "source").count().collect()):
        new_urls.setdefault(r["discovered_in"], {})[r["source"]] = int(r["count"])
    traps = _traps(tables.table_df(spark, root, "hosts"), segment_ids, top)
    frontier = cycle_metrics.recent(spark, root, FRONTIER_ROWS)
    host_states = cycle_metrics.hosts_by_state(spark, conf, root, datetime.now(UTC))
    levels = ServiceLevels.from_config(conf)
    reports = {}
    for s in segment_ids:
        counters: dict[str, int] = {}
        for row in segment_rows.get(s, []):
            for key, value in (row["counters"] or {}).items():
                counters[key] = counters.get(key, 0) + int(value or 0)
        p = elapsed.get(s)
        totals = gap_totals.get(s)
        reports[s] = ReportData(
            segment_id=s,
            min_delay_s=float(conf.politeness.min_delay_s),
            fetches=sum(outcomes[s].values()),
            hosts=host_count.get(s, 0),
            outcomes=outcomes[s],
            top_hosts=_host_stats(top_rows.get(s, []), host_bins),
            gaps=sum(gap_bins.get(s, [])),
            under_delay=int(totals["under"]) if totals else 0,
            min_gap_s=totals["min_gap"] if totals else None,
            gap_bins=gap_bins.get(s, _no_bins(GAP_EDGES_S)),
            under_delay_hosts=_host_stats(under_rows.get(s, [])),
            elapsed_bins=elapsed_bins.get(s, _no_bins(ELAPSED_EDGES_MS)),
            elapsed_p50_ms=None if p is None or p[0] is None else float(p[0]),
            elapsed_p95_ms=None if p is None or p[1] is None else float(p[1]),
            bytes_bins=bytes_bins.get(s, _no_bins(BYTES_EDGES)),
            bytes_total=int(sizes[s]["total"]),
            truncated=int(sizes[s]["truncated"]),
            buckets=[{k: row[k] for k in ("bucket", "state", "results", "applied", "stale", "discovered")}
                     for row in segment_rows.get(s, [])],
            counters=counters,
            new_urls=new_urls.get(s, {}),
            robots_denied_hosts=[(r["host_key"], int(r["denied"])) for r in denied_rows.get(s, [])],
            shared_addresses=[(r["remote_ip"], int(r["names"]), int(r["requests"])) for r in addresses.get(s, [])],
            trap_hosts=traps[s][0],
            trap_reasons=traps[s][1],
            host_states=host_states,
            frontier=frontier,
            levels=levels,
            **pages[s],
        )
    return reports


def _check_fetched(spark: SparkSession, root: str, segment_ids: list[str], outcomes: dict[str, dict]) -> None:
    """A segment without fetches: unknown (UnknownSegment, naming those the root holds), or not fetched yet."""
    for segment_id in segment_ids:
        if segment_id not in outcomes:
            existing = [r[0] for r in tables.table_df(spark, root, "segments").select("segment_id").distinct()
                        .collect()]
            if segment_id not in existing:
                raise UnknownSegment(segment_id, root, existing)
            raise UserError(f"segment {segment_id} has no fetches")


def _page_counts(pages: DataFrame, segment_ids: list[str]) -> dict[str, dict]:
    """Per segment: its pages, duplicates, parse errors and sitemaps (zeros for a segment without pages)."""
    exact = F.col("duplicate_of").isNotNull()
    near = ~exact & F.col("near_duplicate_cluster").isNotNull() & (F.col("near_duplicate_cluster") != F.col("url_id"))
    names = ("pages", "exact_duplicates", "near_duplicates", "parse_errors", "sitemaps", "sitemap_urls")
    counts = {s: {**dict.fromkeys(names, 0), "sitemap_refused": {}} for s in segment_ids}
    for r in pages.groupBy("segment_id").agg(
        F.count(F.lit(1)).alias("pages"),
        F.count(F.when(exact, 1)).alias("exact_duplicates"),
        F.count(F.when(near, 1)).alias("near_duplicates"),
        F.count("parse_error").alias("parse_errors"),
        F.count("sitemap_urls").alias("sitemaps"),
        F.coalesce(F.sum("sitemap_urls"), F.lit(0)).alias("sitemap_urls"),
    ).collect():
        counts[r["segment_id"]].update({k: int(r[k]) for k in names})
    for r in (pages.select("segment_id", F.explode("sitemap_refused")).groupBy("segment_id", "key")
              .agg(F.sum("value").alias("count")).collect()):
        counts[r["segment_id"]]["sitemap_refused"][r["key"]] = int(r["count"])
    return counts


def _traps(hosts: DataFrame, segment_ids: list[str],
           top: int) -> dict[str, tuple[list[tuple[str, dict[str, int]]], dict[str, int]]]:
    """Trap rejections are cumulative per host: per segment, the hosts whose discovery_segment is that one, their
    maps (the top ones by total) and the maps summed."""
    touched = hosts.where(F.col("discovery_segment").isin(*segment_ids) & (F.size("trap_rejections") > 0)) \
        .withColumnRenamed("discovery_segment", "segment_id")
    total = F.aggregate(F.map_values("trap_rejections"), F.lit(0).cast("long"), lambda acc, x: acc + x)
    top_rows = _top(touched.select("segment_id", "host_key", "trap_rejections", total.alias("total")), top,
                    F.desc("total"), "host_key")
    found: dict[str, tuple[list[tuple[str, dict[str, int]]], dict[str, int]]] = {
        s: ([(r["host_key"], {k: int(v) for k, v in r["trap_rejections"].items()}) for r in top_rows.get(s, [])], {})
        for s in segment_ids}
    for r in (touched.select("segment_id", F.explode("trap_rejections")).groupBy("segment_id", "key")
              .agg(F.sum("value").alias("count")).collect()):
        found[r["segment_id"]][1][r["key"]] = int(r["count"])
    return found


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
