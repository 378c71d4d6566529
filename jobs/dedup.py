"""dedup: mark a segment's pages that duplicate another page, and lower those URLs' priority (DESIGN §5).

The corpus is the current page of every URL (its highest `state_version` in `pages`), so a representative is
chosen among all pages crawled so far, not only this segment's. The rules are crawler.dedup's; this job runs them
set-based:

* Exact: one representative per `content_hash`, the earliest fetched, then the lowest url_id (the Spark window
  orders as `crawler.dedup.exact_representative` does). "Fetched" is when the URL was first seen with its current
  content (the earliest `fetched_at` of its pages rows with that hash), so refetching an unchanged representative
  does not hand its role to another page.
* Near: every page with a SimHash other than 0 (0 = no text; null = not HTML or cut by the parse time limit) is
  exploded into its k + 1 band keys (`crawler.dedup.band_values`); rows are grouped by (band, a hash shard of the
  key), so one `applyInPandas` call receives every row of many whole buckets and runs `crawler.dedup.band_pairs`
  on them. The verified pairs are gathered to the driver (at most MAX_DRIVER_PAIRS distinct pairs, else the job
  fails loudly rather than run out of memory) and joined into clusters by `crawler.dedup.cluster_representatives`.
  `near_duplicate_cluster` is the cluster representative's url_id on every member, the representative included;
  a page is a near duplicate when it names another page.

Only this segment's rows of `pages` are marked; older versions keep the verdict of their own segment. A URL whose
page became a duplicate (exact or near) in this segment, while its previous version was not one, gets
`priority *= dedup.duplicate_priority_factor` in `urls`: a URL that stays a duplicate is not lowered again each
time it is refetched. One whose page stops being a duplicate gets `priority /= factor`, the lowering undone.
Nothing in `links` changes, so a duplicate's outlinks are still followed by update (new URLs it discovers inherit
its lowered priority times the discovery factor).

Idempotent: both MERGEs run as Delta idempotent writes (txnAppId `cyclecrawl.dedup.<segment>`, txnVersion 1), so
each table takes this segment's dedup commit at most once; a re-run, even after a crash between the two MERGEs or
after later segments, changes nothing that was committed. Each run recomputes the whole corpus: its cost grows
with the number of current pages, not with the segment.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.dedup import (
    band_pairs,
    band_values,
    cluster_representatives,
    representative_of_sql,
    representative_rank,
)
from delta_tables import tables
from jobs.base import merge_counts, merge_into, pinned_table, step

log = logging.getLogger("jobs.dedup")

# Distinct verified pairs gathered to the driver for union-find: ~100 bytes each in pandas, so 5 M pairs stay
# under 1 GB. A corpus with more near-duplicate pairs needs label propagation in Spark instead.
MAX_DRIVER_PAIRS = 5_000_000
# A page with no fetch time sorts after every fetched one (crawler.dedup does the same with None).
_NO_TIME_US = np.iinfo(np.int64).max

BAND_ROWS = "url_id string, seen_us bigint, simhash bigint, band int, band_key bigint"
PAIR_ROWS = ("left string, left_us bigint, right string, right_us bigint, capped_buckets int, "
             "skipped_comparisons bigint")


@dataclass
class DedupResult:
    segment_id: str
    corpus: int = 0               # current pages (one per URL) with a content hash, all segments
    examined: int = 0             # of them, this segment's pages
    exact_duplicates: int = 0     # this segment's pages whose payload another page represents
    near_duplicates: int = 0      # this segment's pages in a near cluster represented by another page
    near_clusters: int = 0        # near clusters (more than one member) in the corpus
    pairs: int = 0                # verified near pairs over all bands (a pair found in two bands counts twice)
    capped_buckets: int = 0       # band buckets compared only within the max_bucket_size window
    skipped_comparisons: int = 0  # candidate pairs in those buckets never compared
    marked: int = 0               # pages rows whose marks this run wrote (0 on a re-run)
    priority_lowered: int = 0     # urls rows whose priority this run lowered (0 on a re-run)
    priority_restored: int = 0    # urls rows raised back: their page stopped being a duplicate (0 on a re-run)

    def summary(self) -> str:
        return (f"{self.examined} of {self.corpus} pages examined: {self.exact_duplicates} exact and "
                f"{self.near_duplicates} near duplicates; {self.near_clusters} near clusters from {self.pairs} pairs, "
                f"{self.capped_buckets} capped buckets; {self.priority_lowered} priorities lowered, "
                f"{self.priority_restored} restored")


@contextmanager
def _once_per_segment(spark: SparkSession, segment_id: str) -> Iterator[None]:
    """Delta idempotent writes: a table commits the DML run inside at most once for this segment's dedup."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", f"cyclecrawl.dedup.{segment_id}")
    spark.conf.set("spark.databricks.delta.write.txnVersion", "1")
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def current_pages(pages: DataFrame) -> DataFrame:
    """The latest version of each URL if it has a content hash, and `seen`: when it was first fetched with that hash.
    Sitemaps (`sitemap_urls` set) are not documents: two sites' identical sitemaps are not duplicates of anything."""
    latest = Window.partitionBy("url_id").orderBy(F.desc("state_version"))
    first_seen = pages.where(F.col("content_hash").isNotNull()).groupBy("url_id", "content_hash").agg(
        F.min("fetched_at").alias("seen"))
    return (
        pages.withColumn("_n", F.row_number().over(latest)).where("_n = 1").where(F.col("sitemap_urls").isNull())
        .select("url_id", "state_version", "segment_id", "content_hash", "simhash")
        .join(first_seen, ["url_id", "content_hash"])  # drops a latest version with no hash (a parse error)
    )


def exact_representatives(current: DataFrame) -> DataFrame:
    """url_id -> exact_rep: the first page of its content hash in representative order."""
    order = Window.partitionBy("content_hash").orderBy(F.asc_nulls_last("seen"), F.asc("url_id"))
    return current.select("url_id", F.first("url_id").over(order).alias("exact_rep"))


def explode_bands(batches: Iterator[pd.DataFrame], max_hamming: int) -> Iterator[pd.DataFrame]:
    """mapInPandas body: each page once per band, with that band's key (uint64 bits carried as int64)."""
    for batch in batches:
        keys = band_values(batch["simhash"].to_numpy(), max_hamming)
        bands = keys.shape[1]
        yield pd.DataFrame({
            "url_id": np.repeat(batch["url_id"].to_numpy(), bands),
            "seen_us": np.repeat(batch["seen_us"].to_numpy(), bands),
            "simhash": np.repeat(batch["simhash"].to_numpy(), bands),
            "band": np.tile(np.arange(bands, dtype=np.int32), len(batch)),
            "band_key": keys.reshape(-1).view(np.int64),
        })


def shard_pairs(rows: pd.DataFrame, max_hamming: int, max_bucket_size: int) -> pd.DataFrame:
    """applyInPandas body for the rows of one band and one key shard (whole buckets): the verified pairs, and one
    row with no pair carrying the cap counts when a bucket was capped."""
    url_ids, seen = rows["url_id"].to_numpy(), rows["seen_us"].to_numpy()
    rank = representative_rank(url_ids, seen)
    found = band_pairs(rows["band_key"].to_numpy().view(np.uint64), rows["simhash"].to_numpy(), rank,
                       max_hamming, max_bucket_size)
    pairs = found.left.shape[0]
    out = pd.DataFrame({
        "left": url_ids[found.left], "left_us": pd.array(seen[found.left], dtype="Int64"),
        "right": url_ids[found.right], "right_us": pd.array(seen[found.right], dtype="Int64"),
        "capped_buckets": pd.array(np.zeros(pairs), dtype="Int32"),
        "skipped_comparisons": pd.array(np.zeros(pairs), dtype="Int64"),
    })
    if found.capped_buckets:
        counts = pd.DataFrame({"left": [None], "left_us": pd.array([None], dtype="Int64"), "right": [None],
                               "right_us": pd.array([None], dtype="Int64"),
                               "capped_buckets": pd.array([found.capped_buckets], dtype="Int32"),
                               "skipped_comparisons": pd.array([found.skipped_comparisons], dtype="Int64")})
        out = pd.concat([out, counts], ignore_index=True)
    return out


def near_clusters(spark: SparkSession, conf: Config, current: DataFrame, result: DedupResult) -> DataFrame:
    """url_id -> near_rep for every page in a near cluster of two or more (counts go into `result`)."""
    max_hamming, max_bucket_size = conf["dedup.max_hamming"], conf["dedup.max_bucket_size"]
    shards = conf["spark.shuffle_partitions"]
    candidates = current.where(F.col("simhash").isNotNull() & (F.col("simhash") != 0)).select(
        "url_id", F.coalesce(F.unix_micros("seen"), F.lit(int(_NO_TIME_US))).alias("seen_us"), "simhash")
    banded = candidates.mapInPandas(lambda batches: explode_bands(batches, max_hamming), BAND_ROWS)
    found = (
        banded.withColumn("shard", F.pmod(F.xxhash64("band_key"), F.lit(shards)))
        .groupBy("band", "shard")
        .applyInPandas(lambda rows: shard_pairs(rows, max_hamming, max_bucket_size), PAIR_ROWS)
        .persist()
    )
    try:
        totals = found.agg(F.count("left").alias("pairs"), F.sum("capped_buckets").alias("capped"),
                           F.sum("skipped_comparisons").alias("skipped")).first()
        result.pairs = int(totals["pairs"])
        result.capped_buckets = int(totals["capped"] or 0)
        result.skipped_comparisons = int(totals["skipped"] or 0)
        distinct = found.where(F.col("left").isNotNull()).drop("capped_buckets", "skipped_comparisons").distinct()
        count = distinct.count()
        if count > MAX_DRIVER_PAIRS:
            raise RuntimeError(f"dedup: {count} distinct near-duplicate pairs exceed the driver union-find limit of "
                               f"{MAX_DRIVER_PAIRS}; lower dedup.max_hamming or dedup.max_bucket_size")
        pairs = distinct.toPandas() if count else pd.DataFrame(columns=["left", "left_us", "right", "right_us"])
    finally:
        found.unpersist()
    nodes = pd.concat([
        pairs[["left", "left_us"]].set_axis(["url_id", "seen_us"], axis=1),
        pairs[["right", "right_us"]].set_axis(["url_id", "seen_us"], axis=1),
    ]).drop_duplicates("url_id").reset_index(drop=True)
    index = pd.Index(nodes["url_id"])
    representative = cluster_representatives(
        len(nodes), index.get_indexer(pairs["left"]), index.get_indexer(pairs["right"]),
        representative_rank(nodes["url_id"].to_numpy(), nodes["seen_us"].to_numpy(dtype=np.int64)))
    result.near_clusters = int(np.unique(representative).shape[0])
    ids = nodes["url_id"].to_numpy()
    return spark.createDataFrame(pd.DataFrame({"url_id": ids, "near_rep": ids[representative]}),
                                 "url_id string, near_rep string")


def _is_duplicate(exact: str, near: str) -> F.Column:
    """The duplicate verdict (crawler.dedup.representative_of) on a page's marks."""
    return F.expr(f"{representative_of_sql('url_id', exact, near)} is not null")


def run(spark: SparkSession, conf: Config, root: str, segment_id: str) -> DedupResult:
    """Mark segment `segment_id`'s pages as exact / near duplicates and lower duplicates' priority; safe to re-run."""
    root = layout.normalize_root(root)
    layout.check_segment_id(segment_id)
    tables.ensure_tables(spark, root)
    result = DedupResult(segment_id)
    seg = F.lit(segment_id)
    pages = pinned_table(spark, root, "pages")
    with step(f"dedup {segment_id}"):
        current = current_pages(pages).persist()
        try:
            result.corpus = current.count()
            result.examined = current.where(F.col("segment_id") == seg).count()
            if not result.examined:
                return result
            near = near_clusters(spark, conf, current, result)
            marks = (
                current.where(F.col("segment_id") == seg)
                .join(exact_representatives(current), "url_id")
                .join(near, "url_id", "left")
                .select("url_id", "state_version",
                        F.when(F.col("exact_rep") != F.col("url_id"), F.col("exact_rep")).alias("duplicate_of"),
                        F.col("near_rep").alias("near_duplicate_cluster"))
                .persist()
            )
            try:
                counts = marks.agg(
                    F.count("duplicate_of").alias("exact"),
                    F.count(F.when(F.col("near_duplicate_cluster") != F.col("url_id"), 1)).alias("near"),
                ).first()
                result.exact_duplicates, result.near_duplicates = int(counts["exact"]), int(counts["near"])
                with _once_per_segment(spark, segment_id):
                    result.marked = _write_marks(spark, root, marks)
                    result.priority_lowered, result.priority_restored = _adjust_priority(spark, conf, root, pages,
                                                                                         marks)
            finally:
                marks.unpersist()
        finally:
            current.unpersist()
    log.info("dedup %s: %s", segment_id, result.summary())
    return result


def _write_marks(spark: SparkSession, root: str, marks: DataFrame) -> int:
    changed = ~(F.col("t.duplicate_of").eqNullSafe(F.col("s.duplicate_of"))
                & F.col("t.near_duplicate_cluster").eqNullSafe(F.col("s.near_duplicate_cluster")))
    metrics = (
        merge_into(spark, root, "pages", marks, "t.url_id = s.url_id AND t.state_version = s.state_version")
        .whenMatchedUpdate(condition=changed, set={"duplicate_of": "s.duplicate_of",
                                                   "near_duplicate_cluster": "s.near_duplicate_cluster"})
        .execute()
    )
    return merge_counts(metrics).get("num_updated_rows", 0)


def _adjust_priority(spark: SparkSession, conf: Config, root: str, pages: DataFrame,
                     marks: DataFrame) -> tuple[int, int]:
    """urls whose page's duplicate verdict flipped in this segment (against the URL's previous page version):
    became a duplicate -> priority *= the factor; stopped being one -> priority /= the factor, undoing the
    lowering. Returns (lowered, restored)."""
    factor = conf["dedup.duplicate_priority_factor"]
    verdicts = marks.select("url_id", F.col("state_version").alias("version"),
                            _is_duplicate("duplicate_of", "near_duplicate_cluster").alias("is_duplicate"))
    earlier = Window.partitionBy("url_id").orderBy(F.desc("state_version"))
    previous = (
        pages.join(verdicts.select("url_id", "version"), "url_id").where(F.col("state_version") < F.col("version"))
        .withColumn("_n", F.row_number().over(earlier)).where("_n = 1")
        .select("url_id", _is_duplicate("duplicate_of", "near_duplicate_cluster").alias("was_duplicate"))
    )
    flipped = verdicts.join(previous, "url_id", "left").withColumn(
        "was_duplicate", F.coalesce("was_duplicate", F.lit(False))).where(
        F.col("is_duplicate") != F.col("was_duplicate"))
    source = flipped.join(pinned_table(spark, root, "urls").select("url_id", "bucket"), "url_id").select(
        "bucket", "url_id", "is_duplicate",
        F.when(F.col("is_duplicate"), F.lit(factor)).otherwise(F.lit(1.0 / factor)).alias("multiplier")).persist()
    try:  # counted and merged from one computation of the flips
        counts = {bool(r["is_duplicate"]): int(r["count"]) for r in source.groupBy("is_duplicate").count().collect()}
        metrics = (
            merge_into(spark, root, "urls", source, "t.bucket = s.bucket AND t.url_id = s.url_id")
            .whenMatchedUpdate(set={"priority": F.col("t.priority") * F.col("s.multiplier")})
            .execute()
        )
    finally:
        source.unpersist()
    if not merge_counts(metrics).get("num_updated_rows", 0):  # nothing flipped, or this segment's commit was done
        return 0, 0
    return counts.get(True, 0), counts.get(False, 0)
