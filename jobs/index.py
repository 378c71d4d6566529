"""index: a segment's closed WARC files -> the `records` table (Common Crawl's cc-index columns) and one CDXJ
file per WARC file for replay tools (`crawler/ccindex.py` holds every rule; this is plumbing).

Distributed by WARC file: one task streams one file with `index_warc` (headers parsed, bodies skipped in chunks),
emits its rows in batches and writes the file's CDXJ (a temporary name, then rename: a re-run or a retried task
replaces it whole). A torn or damaged file yields its complete records and a stop reason, counted per reason in
the result; a file that cannot be read at all is an error. Neither fails the job.

Idempotent: the segment's `records` partition is replaced as a whole (`replaceWhere warc_segment = ...`), like
parse does for `links`, rather than a MERGE insert-if-absent on (warc_filename, warc_record_offset): the
partition is a pure function of the segment's closed WARC files (and of its `pages` rows, for `content_languages`
and the CDXJ `languages` field), so a rewrite needs no join against a growing table (of `pages` it reads the
segment's rows alone), and a re-run after a rule change (the SURT form, a column) or after parse rewrites the old
rows instead of keeping them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from crawler import layout
from crawler.ccindex import RECORD_INDEX, cdxj_lines, index_warc
from crawler.config import Config
from delta_tables import tables
from jobs.base import arrow_batches, step
from jobs.storage import LOCAL, Storage

_OUTPUT_BATCH_ROWS = 1000
_ERROR_MAX_CHARS = 500
WARC_SUFFIXES = (".warc.gz", ".warc")

# What a task emits: the index rows of a file, then one summary row for the file (`file_summary` true, the
# record columns null but warc_filename and warc_segment).
INDEXED = pa.schema(
    [
        *RECORD_INDEX,
        ("file_summary", pa.bool_()),
        ("stop_reason", pa.string()),   # why a file's indexing ended before its end (torn, damaged)
        ("error", pa.string()),         # why a file could not be indexed at all
        ("cdxj_lines", pa.int64()),
    ]
)


@dataclass(frozen=True)
class IndexResult:
    files: int                                   # closed WARC files of the segment
    records: int                                 # rows written to `records`
    by_type: dict[str, int]                      # rows per warc_record_type
    cdxj_lines: int                              # lines in the segment's CDXJ files
    errors: int                                  # files that could not be indexed at all
    stop_reasons: dict[str, int] = field(default_factory=dict)  # damaged files per reason (offsets as N)
    damaged: tuple[tuple[str, str], ...] = ()    # (warc_filename, stop reason or error) of every such file
    # Revisits of the segment with a digest (identical payloads; 304s whose stored capture the crawl knew) whose
    # original (a response record of the same URL with the same digest, what replay looks up) is in no indexed
    # segment: its segment was removed, or is not indexed yet.
    unresolved_revisits: int = 0

    def summary(self) -> str:
        types = ", ".join(f"{kind}={count}" for kind, count in sorted(self.by_type.items())) or "none"
        text = f"{self.files} WARC files: {self.records} records ({types}), {self.cdxj_lines} CDXJ lines, " \
               f"{self.errors} errors"
        if self.stop_reasons:
            text += "; stopped early: " + ", ".join(f"{reason} x{n}" for reason, n in self.stop_reasons.items())
        if self.unresolved_revisits:
            text += f"; {self.unresolved_revisits} revisits without their original in the index"
        return text


def reason_kind(reason: str) -> str:
    """A stop reason without its offsets and sizes, so reasons of the same kind count together."""
    return re.sub(r"\d+", "N", reason)


def closed_warc_files(root: str, segment_id: str, storage: Storage = LOCAL) -> list[str]:
    """The segment's closed WARC files, relative to the root (a `*.open` file is still being written)."""
    found = []
    for relative in storage.list_files(layout.warc_dir(root, segment_id)):
        parts = relative.split("/")
        if len(parts) == 2 and layout.parse_bucket_dirname(parts[0]) is not None and parts[1].endswith(WARC_SUFFIXES):
            found.append(layout.join("segments", segment_id, "warc", relative))
    return sorted(found)


def index_file(root: str, warc_filename: str, segment_id: str, storage: Storage = LOCAL,
               languages: dict[int, str] | None = None) -> Iterator[dict]:
    """The index rows of one WARC file, then its summary row; writes its CDXJ file on the way (one pass over
    the file). The CDXJ lines of a file are held until its end: they must be sorted (see `cdxj_lines`). A WARC
    file under an s3:// root is indexed from a temporary local copy: one streaming read of the object.
    `languages` (record offset -> Common Crawl's comma-separated codes, from the pages parse wrote) fills
    `content_languages` and the CDXJ `languages` field of the records at those offsets."""
    languages = languages or {}
    summary = dict.fromkeys(INDEXED.names)
    summary.update(warc_filename=warc_filename, warc_segment=segment_id, file_summary=True, cdxj_lines=0)
    lines: list[str] = []
    try:
        with storage.local_copy(layout.join(root, warc_filename)) as local_path:
            indexed = index_warc(local_path, warc_filename, segment_id)
            for row in indexed:
                row["content_languages"] = languages.get(row["warc_record_offset"])
                lines.extend(cdxj_lines([row]))
                row["file_summary"] = False
                yield row
        lines.sort()
        storage.write_bytes(layout.join(root, layout.cdxj_filename(warc_filename)),
                            "".join(line + "\n" for line in lines).encode("ascii"))
        summary.update(stop_reason=indexed.stop_reason, cdxj_lines=len(lines))
    except Exception as exc:  # a missing or unreadable file is counted, never fails the job
        summary["error"] = f"{type(exc).__name__}: {exc}"[:_ERROR_MAX_CHARS]
    yield summary


def index_partition(batches: Iterator[pa.RecordBatch], *, root: str, segment_id: str,
                    storage: Storage = LOCAL) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: rows of WARC file names (and their `languages` by record offset) in, index rows out in
    batches of at most _OUTPUT_BATCH_ROWS."""
    files = (row for batch in batches for row in batch.to_pylist())
    rows = (row for file in files for row in index_file(root, file["warc_filename"], segment_id, storage,
                                                          dict(file.get("languages") or ())))
    return arrow_batches(rows, INDEXED, _OUTPUT_BATCH_ROWS)


def _with_languages(spark: SparkSession, root: str, segment_id: str, files: DataFrame) -> DataFrame:
    """`files` with each file's `languages`: the segment's `pages.languages` in Common Crawl's form by the response
    record's offset (parse stores both file and offset), which the file's task puts in `content_languages` and the
    CDXJ lines. A record parse did not read, or a segment not parsed yet, gets none, and indexing the segment again
    after parse fills them in. Of `pages` only the segment's rows are read."""
    by_offset = (
        tables.table_df(spark, root, "pages")
        .where(F.col("segment_id") == segment_id)
        .where(F.size("languages") > 0)
        .select("warc_filename", "warc_offset",
                F.array_join(F.transform("languages", lambda language: language["code"]), ",").alias("codes"))
        .groupBy("warc_filename", "warc_offset").agg(F.first("codes").alias("codes"))  # one entry per offset
    )
    by_file = by_offset.groupBy("warc_filename").agg(
        F.map_from_entries(F.collect_list(F.struct("warc_offset", "codes"))).alias("languages"))
    return files.join(by_file, "warc_filename", "left")


def unresolved_revisits(spark: SparkSession, root: str, segment_id: str) -> int:
    """The segment's revisits with a digest (identical payloads, 304s with their stored capture's) that no response
    row of the same URL and digest in `records` resolves: what a replay tool's lookup (pywb: URL, then digest) would
    not find. Reads the response rows of the URLs the segment revisited."""
    records = tables.table_df(spark, root, "records")
    revisits = records.where((F.col("warc_segment") == segment_id) & (F.col("warc_record_type") == "revisit")
                             & F.col("content_digest").isNotNull()).select("url", "content_digest")
    originals = (records.where(F.col("warc_record_type") == "response").select("url", "content_digest")
                 .join(revisits.select("url").distinct(), "url", "left_semi").distinct())
    return revisits.join(originals, ["url", "content_digest"], "left_anti").count()


def run(spark: SparkSession, conf: Config, root: str, segment_id: str) -> IndexResult:
    """Index one segment's closed WARC files into `records` and CDXJ files; safe to re-run."""
    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    tables.ensure_tables(spark, root)
    storage = Storage.from_conf(conf)
    names = closed_warc_files(root, segment_id, storage)
    if not names:
        return IndexResult(files=0, records=0, by_type={}, cdxj_lines=0, errors=0)
    with step(f"index {segment_id}"):
        files = _with_languages(spark, root, segment_id, spark.createDataFrame(
            [(name,) for name in names], "warc_filename string")).repartition(len(names))
        indexed = files.mapInArrow(lambda batches: index_partition(batches, root=root, segment_id=segment_id,
                                                                   storage=storage),
                                   from_arrow_schema(INDEXED)).persist()
        try:
            rows = indexed.filter(~F.col("file_summary"))
            by_type = {r["warc_record_type"]: int(r["count"])
                       for r in rows.groupBy("warc_record_type").count().collect()}
            summaries = indexed.filter(F.col("file_summary")).select(
                "warc_filename", "stop_reason", "error", "cdxj_lines").collect()
            (
                tables.conform(rows, "records")
                .write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", f"warc_segment = '{segment_id}'")
                .save(tables.table_path(root, "records"))
            )
        finally:
            indexed.unpersist()
        unresolved = unresolved_revisits(spark, root, segment_id) if by_type.get("revisit") else 0
    damaged = tuple(sorted((s["warc_filename"], s["error"] or s["stop_reason"])
                           for s in summaries if s["error"] or s["stop_reason"]))
    return IndexResult(
        files=len(names),
        records=sum(by_type.values()),
        by_type=by_type,
        cdxj_lines=sum(s["cdxj_lines"] for s in summaries),
        errors=sum(1 for s in summaries if s["error"]),
        stop_reasons=dict(Counter(reason_kind(s["stop_reason"]) for s in summaries if s["stop_reason"])),
        damaged=damaged,
        unresolved_revisits=unresolved,
    )


def run_command(spark: SparkSession, conf: Config, root: str, segment: str) -> int:
    """`crawl index`: the segment's closed WARC files indexed, in one summary line."""
    print(f"index: {run(spark, conf, root, segment).summary()}")
    return 0
