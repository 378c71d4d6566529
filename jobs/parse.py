"""parse: a segment's WARC response records -> `pages` and `links`, and its buckets -> state `parsed`.

Distributed by WARC file: the successful fetched results are hash-partitioned by file and sorted by offset, so
each task opens a WARC file once and reads its records in order by seeking (never the whole file, never
through the driver). One bad record yields a `pages` row with `parse_error` set instead of failing the job.

Idempotent: the segment's `links` partition is replaced as a whole; `pages` is MERGE insert-if-absent on
(url_id, state_version); a bucket moves to `parsed` only from generated/fetching/fetched, after the other two.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from crawler import layout
from crawler.config import Config
from crawler.leases import latest_result_rank_sql
from crawler.pages import analyze_record, analyze_sitemap
from crawler.records import FETCHED, TS
from crawler.scope import Scope
from crawler.sitemaps import DEFAULT_LIMITS, SitemapLimits
from crawler.status import FetchOutcome, SegmentState
from crawler.warcread import read_record_at
from delta_tables import tables
from jobs.base import (
    SOURCE_HELD,
    arrow_batches,
    insert_if_absent,
    read_segment_files,
    segment_rows,
    session_settings,
    sized_to_input,
    step,
    table_turn,
)
from jobs.storage import LOCAL, Storage

_OUTPUT_BATCH_ROWS = 256
_ERROR_MAX_CHARS = 500
# The fetched rows are small, so adaptive execution would coalesce the parse tasks into one and leave the other
# cores idle while that one task parses the whole segment. The MERGE into `segments` reads the segment's fetched
# files, which no daemon writes once parse runs (SOURCE_HELD).
_PARSE_SETTINGS = {"spark.sql.adaptive.coalescePartitions.enabled": "false", **SOURCE_HELD}

OUTLINK = pa.struct(
    [
        ("to_url_id", pa.string()),
        ("to_url", pa.string()),
        ("anchor_text", pa.string()),
        ("rel_nofollow", pa.bool_()),
        ("rel_flags", pa.list_(pa.string())),
        ("sitemap_lastmod", TS),
        ("sitemap_changefreq", pa.string()),
        ("sitemap_priority", pa.float64()),
        ("sitemap_origin", pa.string()),
    ]
)

# A detected language of a page's text (crawler.languages.Language).
LANGUAGE = pa.struct([("code", pa.string()), ("share", pa.float64())])

# What the per-partition parser emits: a `pages` row (plus bucket) with the page's outlinks nested.
PARSED = pa.schema(
    [
        ("url_id", pa.string()),
        ("state_version", pa.int64()),
        ("url", pa.string()),
        ("segment_id", pa.string()),
        ("bucket", pa.int32()),
        ("fetched_at", TS),
        ("warc_filename", pa.string()),
        ("warc_offset", pa.int64()),
        ("warc_length", pa.int64()),
        ("content_type", pa.string()),
        ("title", pa.string()),
        ("canonical_url", pa.string()),
        ("meta_noindex", pa.bool_()),
        ("meta_nofollow", pa.bool_()),
        ("language", pa.string()),
        ("languages", pa.list_(LANGUAGE)),
        ("outlink_count", pa.int32()),
        ("content_hash", pa.string()),
        ("simhash", pa.int64()),
        ("parse_error", pa.string()),
        ("outlinks_skipped", pa.int32()),
        ("parse_time_limited", pa.bool_()),
        ("sitemap_urls", pa.int32()),
        ("sitemap_refused", pa.map_(pa.string(), pa.int64())),
        ("outlinks", pa.list_(OUTLINK)),
    ]
)


@dataclass(frozen=True)
class ParseResult:
    records: int          # successful fetched results with a WARC location that were read
    pages: int            # pages rows produced (one per record, errors included)
    links: int            # links rows written for the segment
    errors: int           # records that could not be parsed (pages rows with parse_error)
    pages_inserted: int   # pages rows new to the table (0 on a re-run)
    sitemaps: int = 0     # of the pages rows, sitemaps read as such
    sitemap_urls: int = 0  # URLs and child sitemaps those sitemaps listed (kept; also counted in links)

    def summary(self) -> str:
        text = f"{self.records} records: {self.pages} pages, {self.links} links, {self.errors} errors"
        if self.sitemaps:
            text += f"; {self.sitemaps} sitemaps listing {self.sitemap_urls} URLs"
        return text


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_MAX_CHARS]


def parse_partition(batches: Iterator[pa.RecordBatch], **settings: Any) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: `parsed_pages` (same settings) in Arrow batches of PARSED rows."""
    return arrow_batches(parsed_pages(batches, **settings), PARSED, _OUTPUT_BATCH_ROWS)


def parsed_pages(
    batches: Iterator[pa.RecordBatch], *, root: str, max_bytes: int, max_outlinks: int, shingle: int,
    scope: Scope | None = None, robots_token: str | None = None, max_parse_seconds: float | None = None,
    language_max_chars: int = 0, sitemap_limits: SitemapLimits = DEFAULT_LIMITS,
    sitemap_max_bytes: int = DEFAULT_LIMITS.max_uncompressed_bytes,
    storage: Storage = LOCAL,
) -> Iterator[dict[str, Any]]:
    """One PARSED row per fetched-results row, in order; rows sorted by (warc_filename, warc_offset), so each
    WARC file is opened once."""
    current_name: str | None = None
    handle: BinaryIO | None = None
    open_error: str | None = None
    try:
        for batch in batches:
            for row in batch.to_pylist():
                name = row["warc_filename"]
                if name != current_name:
                    if handle is not None:
                        handle.close()
                    handle, open_error, current_name = None, None, name
                    try:
                        handle = storage.open_input(layout.join(root, name))
                    except Exception as exc:  # a missing or unreadable file fails its rows, not the job
                        open_error = _error_text(exc)
                page = {column: row.get(column) for column in PARSED.names if column in row}
                page["outlinks"] = []
                try:
                    if handle is None:
                        raise OSError(open_error)
                    # A followed same-host redirect stores the final hop's response: it is the record of
                    # `redirect_to`, and relative links resolve against that URL.
                    captured_url = row.get("redirect_to") or row["url"]
                    if row.get("sitemap_origin") is not None:
                        record = read_record_at(handle, row["warc_offset"], max_bytes=sitemap_max_bytes)
                        page.update(analyze_sitemap(record, captured_url, row["content_type"], row["sitemap_origin"],
                                                    sitemap_limits, scope))
                    else:
                        record = read_record_at(handle, row["warc_offset"], max_bytes=max_bytes)
                        page.update(analyze_record(
                            record, captured_url, row["content_type"], max_outlinks=max_outlinks, shingle=shingle,
                            scope=scope, robots_token=robots_token, max_parse_seconds=max_parse_seconds,
                            language_max_chars=language_max_chars,
                        ))
                except Exception as exc:  # one bad record never fails the job
                    page["parse_error"] = _error_text(exc)
                yield page
    finally:
        if handle is not None:
            handle.close()


def _parse(fetched: DataFrame, root: str, segment_id: str, conf: Config) -> DataFrame:
    # A result written twice (a daemon re-run) gives one pages row per (url_id, state_version): the result that
    # update completes the URL with (crawler.leases), read only when it is a success with a WARC record.
    latest = fetched.withColumn("_n", F.expr(latest_result_rank_sql())).where("_n = 1").drop("_n")
    unique = latest.withColumn("segment_id", F.lit(segment_id)).filter(
        (F.col("outcome") == FetchOutcome.SUCCESS.value)
        & F.col("warc_filename").isNotNull()
        & F.col("warc_offset").isNotNull()
    )
    settings = {
        "root": root,
        "storage": Storage.from_conf(conf),
        "max_bytes": conf.parse.max_html_bytes,
        "max_outlinks": conf.parse.max_outlinks,
        "shingle": conf.parse.simhash_shingle,
        "scope": Scope.from_config(conf),
        "robots_token": conf.crawl.robots_token,
        "max_parse_seconds": conf.parse.max_parse_seconds,
        "language_max_chars": conf.parse.language_max_chars,
        "sitemap_limits": SitemapLimits.from_config(conf),
        # A sitemap's payload is stored decoded: gzip as served (at most max_fetch_bytes) or XML already inflated
        # from a Content-Encoding (at most max_uncompressed_bytes); parse_sitemap caps what it inflates.
        "sitemap_max_bytes": max(conf.sitemaps.max_fetch_bytes, conf.sitemaps.max_uncompressed_bytes),
    }
    # Ranges of (file, offset): tasks of about equal record counts, each reading its files' records in order
    # (one file per task would leave cores idle when a segment has few, unequal files).
    tasks = 2 * fetched.sparkSession.sparkContext.defaultParallelism
    return (
        unique.repartitionByRange(tasks, "warc_filename", "warc_offset")
        .sortWithinPartitions("warc_filename", "warc_offset")
        .mapInArrow(lambda batches: parse_partition(batches, **settings), from_arrow_schema(PARSED))
    )


def _merge_pages(spark: SparkSession, root: str, segment_id: str, parsed: DataFrame) -> int:
    """Insert-if-absent on (url_id, state_version). A URL's state_version is bumped by every lease, so the pair
    is only ever this segment's: the condition names the segment too, and the MERGE reads only the files whose
    segment_id range holds it (Delta's data skipping) instead of every page the crawl stored."""
    pages = parsed.withColumn("duplicate_of", F.lit(None)).withColumn("near_duplicate_cluster", F.lit(None))
    with table_turn(root, "pages"):
        return insert_if_absent(spark, root, "pages", tables.conform(pages, "pages"),
                                f"t.segment_id = '{segment_id}' AND t.url_id = s.url_id "
                                "AND t.state_version = s.state_version")


def _write_links(root: str, segment_id: str, parsed: DataFrame) -> None:
    links = (
        parsed.select(
            F.col("segment_id"),
            F.col("url_id").alias("from_url_id"),
            F.col("state_version").alias("from_state_version"),
            F.explode("outlinks").alias("link"),
        )
        .select("segment_id", "from_url_id", "from_state_version", "link.*")
    )
    (
        tables.conform(links, "links")
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"segment_id = '{segment_id}'")
        .save(tables.table_path(root, "links"))
    )


def _mark_parsed(spark: SparkSession, root: str, segment_id: str, fetched: DataFrame) -> None:
    """Buckets present in the results move to `parsed`; a bucket already parsed or merged is left alone."""
    from delta.tables import DeltaTable

    buckets = fetched.select(F.lit(segment_id).alias("segment_id"), F.col("bucket")).distinct()
    movable = ", ".join(f"'{s.value}'" for s in (SegmentState.GENERATED, SegmentState.FETCHING, SegmentState.FETCHED))
    with table_turn(root, "segments"):
        (
            DeltaTable.forPath(spark, tables.table_path(root, "segments"))
            .alias("t")
            .merge(buckets.alias("s"), "t.segment_id = s.segment_id AND t.bucket = s.bucket")
            .whenMatchedUpdate(
                condition=f"t.state IN ({movable})",
                set={"state": F.lit(SegmentState.PARSED.value), "updated_at": F.current_timestamp()},
            )
            .execute()
        )


def run(spark: SparkSession, conf: Config, root: str, segment_id: str) -> ParseResult:
    """Parse one segment's fetched WARC records into `pages` and `links`; safe to re-run. `links` is committed
    first: that commit makes the segment's discoveries durable (`crawler.service_levels`)."""
    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    tables.ensure_tables(spark, root)
    fetched_dir = layout.fetched_dir(root, segment_id)
    fetched = read_segment_files(spark, fetched_dir, FETCHED)
    if fetched is None:
        return ParseResult(records=0, pages=0, links=0, errors=0, pages_inserted=0)
    with (step(f"parse {segment_id}"), session_settings(spark, _PARSE_SETTINGS),
          sized_to_input(spark, conf, lambda: segment_rows(conf, fetched_dir))):
        parsed = _parse(fetched, root, segment_id, conf).persist()
        try:
            totals = parsed.agg(
                F.count(F.lit(1)).alias("pages"),
                F.count("parse_error").alias("errors"),
                F.coalesce(F.sum(F.size("outlinks")), F.lit(0)).alias("links"),
                F.count("sitemap_urls").alias("sitemaps"),
                F.coalesce(F.sum("sitemap_urls"), F.lit(0)).alias("sitemap_urls"),
            ).first()
            _write_links(root, segment_id, parsed)
            inserted = _merge_pages(spark, root, segment_id, parsed)
            _mark_parsed(spark, root, segment_id, fetched)
        finally:
            parsed.unpersist()
    return ParseResult(
        records=int(totals["pages"]),
        pages=int(totals["pages"]),
        links=int(totals["links"]),
        errors=int(totals["errors"]),
        pages_inserted=inserted,
        sitemaps=int(totals["sitemaps"]),
        sitemap_urls=int(totals["sitemap_urls"]),
    )


def run_command(spark: SparkSession, conf: Config, root: str, segment: str) -> int:
    """`crawl parse`: the segment's pages and links, in one summary line."""
    print(f"parse: {run(spark, conf, root, segment).summary()}")
    return 0
