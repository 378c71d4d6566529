"""parse: a segment's WARC response records -> `pages`, `links` and WET files, and its buckets -> state `parsed`.

Distributed by WARC file: the successful fetched results are hash-partitioned by file and sorted by offset, so
each task opens a WARC file once and reads its records in order by seeking (never the whole file, never
through the driver). One bad record yields a `pages` row with `parse_error` set instead of failing the job.

WET files (`parse.wet_enabled`; crawler/wet.py makes the records): each task writes the conversion records of its
pages as it parses them, one part file per WARC file it reads (`crawler.layout.wet_part_filename`: a task's range may
start or end inside a file); once `pages` is committed, one task per WARC file joins its parts in offset order behind
a warcinfo record into `segments/<id>/wet/bucket=NNNNN/<name>.warc.wet.gz` (replaced as a whole), and the parts are
removed. So no task holds more than one record's text, and the driver only lists names.

Idempotent: the segment's `links` partition is replaced as a whole; `pages` is MERGE insert-if-absent on
(url_id, state_version); a bucket moves to `parsed` only from generated/fetching/fetched, after the other two. A
WET file is a function of its WARC file's records (fixed record ids and dates, no time stamps): a re-run writes the
same bytes under the same name, and the parts a killed run left are removed before its re-run writes any.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from crawler import layout, wet
from crawler.config import Config
from crawler.leases import latest_result_rank_sql
from crawler.pages import analyze_record, analyze_sitemap
from crawler.records import FETCHED, TS
from crawler.scope import Scope
from crawler.sitemaps import DEFAULT_LIMITS, SitemapLimits
from crawler.status import FetchOutcome, SegmentState, WetOutcome
from crawler.warcread import WarcHttpRecord, read_record_at
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
from jobs.storage import LOCAL, AtomicOutput, Storage

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
        ("wet", pa.string()),  # crawler.status.WetOutcome (null: WET off, a sitemap, a parse error)
    ]
)

# One WET file, what the task that writes it emits.
WET_WRITTEN = pa.schema([("wet_filename", pa.string()), ("wet_bytes", pa.int64())])


@dataclass(frozen=True)
class ParseResult:
    records: int          # successful fetched results with a WARC location that were read
    pages: int            # pages rows produced (one per record, errors included)
    links: int            # links rows written for the segment
    errors: int           # records that could not be parsed (pages rows with parse_error)
    pages_inserted: int   # pages rows new to the table (0 on a re-run)
    sitemaps: int = 0     # of the pages rows, sitemaps read as such
    sitemap_urls: int = 0  # URLs and child sitemaps those sitemaps listed (kept; also counted in links)
    wet_files: int = 0    # WET files written (one per WARC file read; 0: parse.wet_enabled off)
    wet_records: int = 0  # conversion records in them (pages with outcome `written`)
    wet_outcomes: dict[str, int] = field(default_factory=dict)  # pages by crawler.status.WetOutcome

    def summary(self) -> str:
        text = f"{self.records} records: {self.pages} pages, {self.links} links, {self.errors} errors"
        if self.sitemaps:
            text += f"; {self.sitemaps} sitemaps listing {self.sitemap_urls} URLs"
        if self.wet_files:
            skipped = ", ".join(f"{kind} {count}" for kind, count in sorted(self.wet_outcomes.items())
                                if kind != WetOutcome.WRITTEN.value)
            text += f"; WET: {self.wet_records} text records in {self.wet_files} files"
            if skipped:
                text += f" (none for {skipped})"
        return text


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_MAX_CHARS]


def parse_partition(batches: Iterator[pa.RecordBatch], **settings: Any) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: `parsed_pages` (same settings) in Arrow batches of PARSED rows."""
    return arrow_batches(parsed_pages(batches, **settings), PARSED, _OUTPUT_BATCH_ROWS)


class WetParts:
    """A parse task's WET output: the conversion records of each WARC file it reads, in offset order, in one part
    file named by the WARC file and the offset of the task's first row in it (`crawler.layout.wet_part_filename`),
    opened at its first record. A part is kept (`next_file`, `finish`) only once the task read all its rows of
    that file; a task that fails or is abandoned leaves none (`abort`)."""

    def __init__(self, root: str, storage: Storage) -> None:
        self._root, self._storage = root, storage
        self._part: str | None = None
        self._out: AtomicOutput | None = None

    def next_file(self, warc_filename: str, first_offset: int) -> None:
        self.finish()
        try:
            self._part = layout.wet_part_filename(warc_filename, first_offset)
        except ValueError:  # not a segment's WARC path: no WET file can name it
            self._part = None

    def add(self, page: dict[str, Any], record: WarcHttpRecord, text: str | None) -> None:
        """Sets the page's `wet` outcome and writes its conversion record if it gets one."""
        if self._part is None:  # no WET file for this WARC file
            return
        outcome = wet.wet_outcome(text is not None, text)
        if outcome is WetOutcome.WRITTEN:
            data = wet.conversion_record(text or "", target_uri=record.target_uri or page["url"],
                                         date=record.date or wet.warc_date(page["fetched_at"]),
                                         refers_to=record.record_id,
                                         languages=wet.language_codes(page.get("languages")))
            if self._out is None:
                self._out = self._storage.open_output(layout.join(self._root, self._part))
            self._out.write(data)
        page["wet"] = outcome.value

    def finish(self) -> None:
        if self._out is not None:
            self._out.commit()
            self._out = None

    def abort(self) -> None:
        if self._out is not None:
            self._out.abort()
            self._out = None


def parsed_pages(
    batches: Iterator[pa.RecordBatch], *, root: str, max_bytes: int, max_outlinks: int, shingle: int,
    scope: Scope | None = None, robots_token: str | None = None, max_parse_seconds: float | None = None,
    language_max_chars: int = 0, sitemap_limits: SitemapLimits = DEFAULT_LIMITS,
    sitemap_max_bytes: int = DEFAULT_LIMITS.max_uncompressed_bytes,
    storage: Storage = LOCAL, wet_enabled: bool = False,
) -> Iterator[dict[str, Any]]:
    """One PARSED row per fetched-results row, in order; rows sorted by (warc_filename, warc_offset), so each
    WARC file is opened once. With `wet_enabled`, each page's conversion record goes to the task's WET parts
    (`WetParts`) as it is parsed."""
    current_name: str | None = None
    handle: BinaryIO | None = None
    open_error: str | None = None
    parts = WetParts(root, storage) if wet_enabled else None
    done = False
    try:
        for batch in batches:
            for row in batch.to_pylist():
                name = row["warc_filename"]
                if name != current_name:
                    if handle is not None:
                        handle.close()
                    handle, open_error, current_name = None, None, name
                    if parts is not None:
                        parts.next_file(name, row["warc_offset"])
                    try:
                        handle = storage.open_input(layout.join(root, name))
                    except Exception as exc:  # a missing or unreadable file fails its rows, not the job
                        open_error = _error_text(exc)
                page = {column: row.get(column) for column in PARSED.names if column in row}
                page["outlinks"] = []
                analyzed: WarcHttpRecord | None = None  # a page's response record, once analyzed
                text: str | None = None
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
                        fields = analyze_record(
                            record, captured_url, row["content_type"], max_outlinks=max_outlinks, shingle=shingle,
                            scope=scope, robots_token=robots_token, max_parse_seconds=max_parse_seconds,
                            language_max_chars=language_max_chars,
                        )
                        text = fields.pop("text")
                        page.update(fields)
                        analyzed = record
                except Exception as exc:  # one bad record never fails the job
                    page["parse_error"] = _error_text(exc)
                if parts is not None and analyzed is not None:  # outside the try: a failed write fails the task
                    parts.add(page, analyzed, text)
                yield page
        done = True
    finally:
        if handle is not None:
            handle.close()
        if parts is not None and done:
            parts.finish()
        elif parts is not None:
            parts.abort()


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
        "wet_enabled": conf.parse.wet_enabled,
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


def wet_file_partition(batches: Iterator[pa.RecordBatch], *, root: str, segment_id: str,
                       storage: Storage = LOCAL) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: for each WARC file (its name, its oldest capture's time and its WET parts in offset order),
    its WET file: a warcinfo record, then the parts' bytes, replacing the file as a whole."""
    for batch in batches:
        written = []
        for row in batch.to_pylist():
            wet_filename = layout.wet_filename(row["warc_filename"])
            info = wet.warcinfo_record(wet_filename, row["fetched_at"], {
                "software": "cyclecrawl parse (crawler/wet.py)",
                "format": "WARC file of extracted text (WET): a conversion record of each HTML page's visible text",
                "isPartOf": segment_id,
                "sourceWarc": row["warc_filename"],
            })
            with storage.open_output(layout.join(root, wet_filename)) as out:
                out.write(info)
                for part in row["parts"] or ():
                    storage.append_file(layout.join(root, part), out.stream)
                size = out.stream.tell()
            written.append({"wet_filename": wet_filename, "wet_bytes": size})
        yield pa.RecordBatch.from_pylist(written, schema=WET_WRITTEN)


def _wet_parts_dir(root: str, segment_id: str) -> str:
    return layout.join(layout.wet_dir(root, segment_id), layout.WET_PARTS)


def _write_wet_files(spark: SparkSession, conf: Config, root: str, segment_id: str, files: list) -> int:
    """Each WARC file's WET file from its parts (one task per file; `files`: rows of warc_filename and the oldest
    fetched_at), then the parts removed. Returns the bytes written."""
    storage = Storage.from_conf(conf)
    parts_dir = _wet_parts_dir(root, segment_id)
    parts: dict[str, list[str]] = {}
    for relative in storage.list_files(parts_dir):  # <bucket folder>/<warc name>.<offset, 15 digits>
        bucket, _, name = relative.partition("/")
        warc_name, _, offset = name.rpartition(".")
        if warc_name and offset.isdigit() and len(offset) == 15:
            warc = layout.join("segments", segment_id, "warc", bucket, warc_name)
            parts.setdefault(warc, []).append(layout.wet_part_filename(warc, int(offset)))
    rows = [(f["warc_filename"], f["fetched_at"], sorted(parts.get(f["warc_filename"], [])))
            for f in files if _is_segment_warc(f["warc_filename"])]
    if not rows:
        return 0
    wet_files = spark.createDataFrame(rows, "warc_filename string, fetched_at timestamp, parts array<string>")
    written = wet_files.repartition(len(rows)).mapInArrow(
        lambda batches: wet_file_partition(batches, root=root, segment_id=segment_id, storage=storage),
        from_arrow_schema(WET_WRITTEN)).collect()
    storage.delete_folder(parts_dir)
    return sum(int(r["wet_bytes"]) for r in written)


def _is_segment_warc(warc_filename: str) -> bool:
    try:
        layout.wet_filename(warc_filename)
    except ValueError:
        return False
    return True


def _mark_parsed(spark: SparkSession, root: str, segment_id: str, fetched: DataFrame,
                 wet_by_bucket: list | None) -> None:
    """Buckets present in the results move to `parsed`; a bucket already parsed or merged is left alone. With WET
    files written (`wet_by_bucket`: rows of bucket, wet_files, wet_records), every bucket's row lists its own, a
    re-run of a parsed or merged segment's parse included (none read: an empty list and 0)."""
    from delta.tables import DeltaTable

    buckets = fetched.select(F.lit(segment_id).alias("segment_id"), F.col("bucket")).distinct()
    columns = {"state": F.lit(SegmentState.PARSED.value), "updated_at": F.current_timestamp()}
    wet_columns = {}
    if wet_by_bucket is not None:
        wet_rows = spark.createDataFrame([(r["bucket"], r["wet_files"], r["wet_records"]) for r in wet_by_bucket],
                                         "bucket int, wet_files array<string>, wet_records bigint")
        buckets = buckets.join(wet_rows, "bucket", "left").select(
            "segment_id", "bucket", F.coalesce("wet_files", F.array().cast("array<string>")).alias("wet_files"),
            F.coalesce("wet_records", F.lit(0).cast("bigint")).alias("wet_records"))
        wet_columns = {"wet_files": F.col("s.wet_files"), "wet_records": F.col("s.wet_records")}
    movable = ", ".join(f"'{s.value}'" for s in (SegmentState.GENERATED, SegmentState.FETCHING, SegmentState.FETCHED))
    with table_turn(root, "segments"):
        merge = (
            DeltaTable.forPath(spark, tables.table_path(root, "segments"))
            .alias("t")
            .merge(buckets.alias("s"), "t.segment_id = s.segment_id AND t.bucket = s.bucket")
            .whenMatchedUpdate(condition=f"t.state IN ({movable})", set={**columns, **wet_columns})
        )
        if wet_columns:
            merge = merge.whenMatchedUpdate(set=wet_columns)
        merge.execute()


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
    wet_enabled = conf.parse.wet_enabled
    if wet_enabled:  # what a killed run left: its tasks' parts are not this run's
        Storage.from_conf(conf).delete_folder(_wet_parts_dir(root, segment_id))
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
            wet_outcomes: dict[str, int] = {}
            files: list = []
            if wet_enabled:  # one small query: per WARC file its oldest capture and pages by WET outcome
                files = parsed.groupBy("bucket", "warc_filename").agg(
                    F.min("fetched_at").alias("fetched_at"),
                    *[F.count(F.when(F.col("wet") == outcome.value, 1)).alias(outcome.value) for outcome in WetOutcome],
                ).collect()
                wet_outcomes = {outcome.value: total for outcome in WetOutcome
                                if (total := sum(int(f[outcome.value]) for f in files))}
            _write_links(root, segment_id, parsed)
            inserted = _merge_pages(spark, root, segment_id, parsed)
        finally:
            parsed.unpersist()
        wet_by_bucket = None
        if wet_enabled:
            _write_wet_files(spark, conf, root, segment_id, files)
            written = [f for f in files if _is_segment_warc(f["warc_filename"])]
            wet_by_bucket = [
                {"bucket": bucket,
                 "wet_files": sorted(layout.wet_filename(f["warc_filename"]) for f in written if f["bucket"] == bucket),
                 "wet_records": sum(int(f[WetOutcome.WRITTEN.value]) for f in written if f["bucket"] == bucket)}
                for bucket in sorted({f["bucket"] for f in written})]
        _mark_parsed(spark, root, segment_id, fetched, wet_by_bucket)
    return ParseResult(
        records=int(totals["pages"]),
        pages=int(totals["pages"]),
        links=int(totals["links"]),
        errors=int(totals["errors"]),
        pages_inserted=inserted,
        sitemaps=int(totals["sitemaps"]),
        sitemap_urls=int(totals["sitemap_urls"]),
        wet_files=sum(len(b["wet_files"]) for b in wet_by_bucket or ()),
        wet_records=sum(b["wet_records"] for b in wet_by_bucket or ()),
        wet_outcomes=wet_outcomes,
    )


def run_command(spark: SparkSession, conf: Config, root: str, segment: str) -> int:
    """`crawl parse`: the segment's pages and links, in one summary line."""
    print(f"parse: {run(spark, conf, root, segment).summary()}")
    return 0
