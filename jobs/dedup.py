"""dedup: mark a segment's pages that duplicate another page, and lower those URLs' priority.

Incremental: the cost follows the segment, not the corpus. Two Delta tables index every URL's current document
(`delta_tables`: `dedup_hashes`, content hash -> representative, one row per URL; `dedup_bands`, SimHash band ->
(url_id, SimHash, cluster), k + 1 rows per URL). A run reads the segment's pages and fetched results, probes the
indexes with the segment's hashes and band keys only, and writes back the rows that changed. The rule it runs is
`crawler/dedup.py`'s "incremental rule" (stable representatives, who leaves the indexes); its steps:

* Changed URLs: the segment's documents (its pages with a content hash that are not sitemaps) and the URLs that
  leave (`crawler.dedup.leaves_index`: gone or redirected; or a page of this segment that is no document).
* Exact: the touched hashes (the segment's, and the old hashes of changed URLs) are looked up; each one's
  representative is the first of its holders in representative order (the Spark form of
  `crawler.dedup.exact_representative`), holders whose representative changed are relabelled.
* Near: the segment's band keys (`crawler.dedup.band_values_sql`) select the index rows of the buckets they hit;
  rows of a band and a key shard meet in one `applyInPandas` call running `crawler.dedup.band_pairs` (the bucket
  cap and its counts included), which keeps the verified pairs with a segment page. A segment page takes the
  earliest cluster among the index rows it matched; pages of the segment that matched each other share the
  earliest label among them: their groups are the connected components of their pairs, found in Spark in a number
  of rounds that grows with the logarithm of a group's size (`connected_components`; nothing is collected on the
  driver). A cluster whose representative left or changed its SimHash
  while it had members is retired: its members' rows fall back to themselves.
* Marks on the segment's `pages` rows, priority (`urls.priority *= dedup.duplicate_priority_factor` when the
  verdict becomes "duplicate" against the URL's previous marks, kept in `dedup_hashes.marked_duplicate`; `/=` when
  it stops, or when the URL leaves), then the two indexes (`jobs/dedup_index.py`): one MERGE per table, four
  commits in all (five on a crawl's first dedup, which records the band index's definition).

The band index holds one definition (`crawler.dedup.IndexDefinition`: the SimHash's and the key layout), recorded
in its table property `cyclecrawl.dedup.index`: a run whose config differs, or that finds rows and no record, is
refused (`IndexRefused`, one line naming `crawl dedup --rebuild`, `rebuild_index`), and the record is looked at
again under the writer lock before the first commit (`IndexRebuilt` when a rebuild landed meanwhile).

The index tables are streamed, never shuffled: every join of one with a segment-sized set (the segment's URLs,
the touched hashes, the hit band keys, representatives gaining members) broadcasts the set. Left to itself the
optimizer pushed the anti-join with the segment's URLs below the band probe and ran it as a sort-merge join, which
shuffled and sorted all of `dedup_bands` every cycle.

Idempotent: every MERGE runs as a Delta idempotent write (txnAppId `cyclecrawl.dedup.<segment>`, txnVersion 1),
so each table takes this segment's dedup commit at most once. The indexes are written last and every input is
read before any write, so a re-run after a crash between two MERGEs computes the same answer from the same index
and commits only what is missing. Segments are deduplicated in the order they were generated (the cycle's order).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.dedup import (
    IndexDefinition,
    band_pairs,
    band_values_sql,
    leaves_index_sql,
    representative_of_sql,
    representative_rank,
)
from crawler.errors import TryLater, UserError
from crawler.leases import latest_result_rank_sql
from crawler.records import FETCHED
from delta_tables import tables
from jobs import dedup_index
from jobs.base import (
    NOT_ADAPTIVE,
    SOURCE_HELD,
    merge_counts,
    merge_into,
    pinned_table,
    read_segment_files,
    segment_rows,
    session_settings,
    sized_to_input,
    step,
    table_rows,
    table_turn,
)
from jobs.writelock import writer_lock

log = logging.getLogger("jobs.dedup")

HASHES, BANDS = "dedup_hashes", "dedup_bands"
# The table property of `dedup_bands` that records its definition (crawler.dedup.IndexDefinition.identity).
INDEX_PROPERTY = "cyclecrawl.dedup.index"
# A page with no fetch time sorts after every fetched one (crawler.dedup does the same with None).
_NO_TIME_US = int(np.iinfo(np.int64).max)
# Connected components stop after this many rounds with an error. Their rounds grow with the logarithm of a
# group's size (measured: 5, 8 and 12 for chains of 57, 1,000 and 20,000 pages, bench/components.py).
MAX_COMPONENT_ROUNDS = 64

BUCKET_ROWS = ("url_id string, seen_us bigint, simhash bigint, band int, band_key bigint, label string, "
               "label_us bigint, is_new boolean")
EDGE_ROWS = ("node string, other string, other_us bigint, other_new boolean, capped_buckets int, "
             "skipped_comparisons bigint")


@dataclass
class DedupResult:
    segment_id: str
    examined: int = 0             # this segment's documents (pages with a content hash, not sitemaps)
    left: int = 0                 # URLs that left the indexes (gone, redirected, no document any more)
    exact_duplicates: int = 0     # this segment's pages whose payload another page represents
    near_duplicates: int = 0      # this segment's pages in a near cluster represented by another page
    near_clusters: int = 0        # clusters (of two or more) the segment's near-clustered pages belong to
    pairs: int = 0                # verified pairs with a segment page, over all bands (a pair in two bands: 2)
    rounds: int = 0               # connected-component rounds over pairs of segment pages
    capped_buckets: int = 0       # band buckets compared only within the max_bucket_size window
    skipped_comparisons: int = 0  # candidate pairs in those buckets never compared
    relabelled: int = 0           # index rows of other URLs given a new representative or cluster
    marked: int = 0               # pages rows whose marks this run wrote (0 on a re-run)
    priority_lowered: int = 0     # urls rows whose priority this run lowered (0 on a re-run)
    priority_restored: int = 0    # urls rows raised back: their page stopped being a duplicate (0 on a re-run)
    commits: int = 0              # Delta commits this run made (0 on a re-run)

    def summary(self) -> str:
        return (f"{self.examined} pages examined, {self.left} left the index: {self.exact_duplicates} exact and "
                f"{self.near_duplicates} near duplicates; {self.near_clusters} near clusters from {self.pairs} "
                f"pairs ({self.rounds} component rounds), {self.capped_buckets} capped buckets; "
                f"{self.relabelled} index rows relabelled; {self.priority_lowered} priorities lowered, "
                f"{self.priority_restored} restored; {self.commits} commits")


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


def _order(seen_us: str, url_id: str) -> Column:
    """Representative order as one comparable value: earliest `seen` (none: last), then lowest url_id."""
    return F.struct(F.coalesce(F.col(seen_us), F.lit(_NO_TIME_US)).alias("us"), F.col(url_id).alias("id"))


def segment_changes(spark: SparkSession, root: str, segment_id: str) -> tuple[DataFrame, DataFrame]:
    """(documents, leavers) of the segment. documents: url_id, bucket, state_version, fetched_at, content_hash,
    simhash of each URL's page in the segment that is a document; leavers: url_id, bucket of URLs that hold no
    document after it (a gone or redirected result, or a page that is no document)."""
    fetched = read_segment_files(spark, layout.fetched_dir(root, segment_id), FETCHED)
    if fetched is None:
        empty = spark.createDataFrame([], "url_id string, bucket int")
        return empty.select("url_id", "bucket", F.lit(None).cast("bigint").alias("state_version"),
                            F.lit(None).cast("timestamp").alias("fetched_at"),
                            F.lit(None).cast("string").alias("content_hash"),
                            F.lit(None).cast("bigint").alias("simhash")), empty
    results = fetched.withColumn("_rank", F.expr(latest_result_rank_sql())).where("_rank = 1")
    buckets = results.select("url_id", "bucket").distinct()
    latest = Window.partitionBy("url_id").orderBy(F.desc("state_version"))
    pages = (
        pinned_table(spark, root, "pages").where(F.col("segment_id") == segment_id)
        .withColumn("_n", F.row_number().over(latest)).where("_n = 1")
        .select("url_id", "state_version", "fetched_at", "content_hash", "simhash",
                (F.col("content_hash").isNotNull() & F.col("sitemap_urls").isNull()).alias("is_document"))
        .join(buckets, "url_id")
    )
    documents = pages.where("is_document").drop("is_document")
    leavers = (
        results.where(leaves_index_sql("outcome", "status_code")).select("url_id", "bucket")
        .join(documents.select("url_id"), "url_id", "left_anti")
        .unionByName(pages.where(~F.col("is_document")).select("url_id", "bucket"))
        .distinct()
    )
    return documents, leavers


def exact_marks(hashes: DataFrame, previous: DataFrame, documents: DataFrame,
                changed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(documents with `seen`, `representative`, and the URL's previous row's `old_marked` / `old_near_members`;
    existing rows of other URLs whose representative changes, with the new one). `previous`: the index rows of
    the changed URLs."""
    old = previous.select(
        "url_id", F.col("content_hash").alias("old_hash"), F.col("seen").alias("old_seen"),
        F.col("marked_duplicate").alias("old_marked"), F.col("near_members").alias("old_near_members"))
    docs = documents.join(old, "url_id", "left").withColumn(
        "seen", F.when(F.col("old_hash") == F.col("content_hash"), F.col("old_seen")).otherwise(F.col("fetched_at")))
    touched = docs.select("content_hash").union(
        old.where(F.col("old_hash").isNotNull()).select(F.col("old_hash").alias("content_hash"))).distinct()
    others = hashes.join(F.broadcast(touched), "content_hash").join(F.broadcast(changed.select("url_id")), "url_id",
                                                                      "left_anti")
    others = others.localCheckpoint()
    holders = others.select("content_hash", "url_id", "seen").unionByName(
        docs.select("content_hash", "url_id", "seen"))
    representatives = holders.withColumn("seen_us", F.unix_micros("seen")).groupBy("content_hash").agg(
        F.min(_order("seen_us", "url_id")).getField("id").alias("new_representative"))
    docs = docs.join(representatives, "content_hash").withColumnRenamed("new_representative", "representative")
    relabelled = (
        others.join(representatives, "content_hash")
        .where(F.col("new_representative") != F.col("representative"))
        .withColumn("representative", F.col("new_representative")).drop("new_representative")
    )
    return docs, relabelled


def explode_bands(frame: DataFrame, definition: IndexDefinition) -> DataFrame:
    """Each row once per index key: `band` (the key's index) and `band_key` (crawler.dedup.band_values_sql)
    beside the row's columns."""
    keys = F.array(*[F.expr(expr) for expr in band_values_sql("simhash", definition.max_hamming,
                                                                definition.blocks_per_key)])
    return frame.select("*", F.posexplode(keys).alias("band", "band_key")).withColumn("band", F.col("band").cast("int"))


def bucket_edges(rows: pd.DataFrame, max_hamming: int, max_bucket_size: int) -> pd.DataFrame:
    """applyInPandas body for one band and key shard: the segment's rows and the index rows of the buckets they
    hit. Verified pairs with a segment page as edges: (segment page, other segment page) both ways, or (segment
    page, the index row's cluster); plus one row with no node carrying the cap counts when a bucket was capped."""
    url_ids, seen = rows["url_id"].to_numpy(), rows["seen_us"].to_numpy()
    found = band_pairs(rows["band_key"].to_numpy().view(np.uint64), rows["simhash"].to_numpy(),
                       representative_rank(url_ids, seen), max_hamming, max_bucket_size)
    is_new = rows["is_new"].to_numpy(dtype=bool)
    labels, label_us = rows["label"].to_numpy(), rows["label_us"].to_numpy()
    left, right = found.left, found.right
    keep = is_new[left] | is_new[right]
    left, right = left[keep], right[keep]
    # Each side that is a segment page is a node; its neighbour is a segment page (by url_id) or an index row
    # (by its fixed cluster label).
    nodes, others = np.concatenate([left, right]), np.concatenate([right, left])
    from_new = is_new[nodes]
    nodes, others = nodes[from_new], others[from_new]
    other_new = is_new[others]
    out = pd.DataFrame({
        "node": url_ids[nodes],
        "other": np.where(other_new, url_ids[others], labels[others]),
        "other_us": pd.array(np.where(other_new, seen[others], label_us[others]), dtype="Int64"),
        "other_new": other_new,
        "capped_buckets": pd.array(np.zeros(nodes.shape[0]), dtype="Int32"),
        "skipped_comparisons": pd.array(np.zeros(nodes.shape[0]), dtype="Int64"),
    })
    if found.capped_buckets:
        counts = pd.DataFrame({"node": [None], "other": [None], "other_us": pd.array([None], dtype="Int64"),
                               "other_new": [None], "capped_buckets": pd.array([found.capped_buckets], dtype="Int32"),
                               "skipped_comparisons": pd.array([found.skipped_comparisons], dtype="Int64")})
        out = pd.concat([out, counts], ignore_index=True)
    return out


def near_labels(spark: SparkSession, conf: Config, definition: IndexDefinition, bands: DataFrame, docs: DataFrame,
                changed: DataFrame, result: DedupResult) -> tuple[DataFrame, DataFrame]:
    """(label per segment page that has a verified pair: url_id, cluster, cluster_us; the segment pages'
    candidates exploded into bands: url_id, seen_us, simhash, band, band_key)."""
    max_hamming, max_bucket_size = conf.dedup.max_hamming, conf.dedup.max_bucket_size
    shards = conf.spark.shuffle_partitions
    candidates = docs.where(F.col("simhash").isNotNull() & (F.col("simhash") != 0)).select(
        "url_id", F.unix_micros("seen").alias("seen_us"), "simhash")
    new_rows = explode_bands(candidates, definition).localCheckpoint()
    hit = new_rows.select("band", "band_key").distinct()
    existing = (
        bands.join(F.broadcast(hit), ["band", "band_key"]).join(F.broadcast(changed.select("url_id")), "url_id",
                                                                "left_anti")
        .select("url_id", F.unix_micros("seen").alias("seen_us"), "simhash", "band", "band_key",
                F.col("cluster").alias("label"), F.unix_micros("cluster_seen").alias("label_us"),
                F.lit(False).alias("is_new"))
        .localCheckpoint()
    )
    rows = new_rows.select("url_id", "seen_us", "simhash", "band", "band_key", F.col("url_id").alias("label"),
                           F.col("seen_us").alias("label_us"), F.lit(True).alias("is_new")).unionByName(existing)
    edges = (
        rows.withColumn("shard", F.pmod(F.xxhash64("band_key"), F.lit(shards)))
        .groupBy("band", "shard")
        .applyInPandas(lambda group: bucket_edges(group, max_hamming, max_bucket_size), EDGE_ROWS)
        .localCheckpoint()
    )
    totals = edges.agg(F.count(F.when(~F.col("other_new"), 1)).alias("fixed"),
                       F.count(F.when(F.col("other_new"), 1)).alias("mutual"),
                       F.sum("capped_buckets").alias("capped"), F.sum("skipped_comparisons").alias("skipped")).first()
    result.pairs = int(totals["fixed"]) + int(totals["mutual"]) // 2
    result.capped_buckets = int(totals["capped"] or 0)
    result.skipped_comparisons = int(totals["skipped"] or 0)
    linked = edges.where(F.col("node").isNotNull())
    own = linked.select("node").distinct().join(
        candidates.select(F.col("url_id").alias("node"), F.col("seen_us").alias("other_us")), "node"
    ).select("node", F.col("node").alias("other"), "other_us", F.lit(False).alias("kept"))
    # kept: the page matched an index row of the cluster it represented, so that cluster still has it.
    fixed = linked.where(~F.col("other_new")).select("node", "other", "other_us",
                                                     (F.col("other") == F.col("node")).alias("kept"))
    labels = (
        own.unionByName(fixed)
        .groupBy("node").agg(F.min(_order("other_us", "other")).alias("label"), F.max("kept").alias("kept"))
        .localCheckpoint()
    )
    mutual = linked.where(F.col("other_new")).select("node", "other").distinct().localCheckpoint()
    if totals["mutual"]:
        labels = _spread_earliest(labels, mutual, result)
    return labels.select(F.col("node").alias("url_id"), F.col("label.id").alias("cluster"),
                         F.col("label.us").alias("cluster_us"), "kept"), new_rows


def _spread_earliest(labels: DataFrame, mutual: DataFrame, result: DedupResult) -> DataFrame:
    """Every page of a connected group of segment pages (pairs in `mutual`) takes the earliest label any of them
    holds: the groups are found by `connected_components`, then each takes its least label."""
    groups = connected_components(mutual.select(F.col("node").alias("a"), F.col("other").alias("b")), result)
    grouped = labels.join(groups, "node", "left").withColumn("group", F.coalesce("group", "node"))
    earliest = F.min("label").over(Window.partitionBy("group"))
    return grouped.select("node", "kept", earliest.alias("label")).localCheckpoint()


def connected_components(edges: DataFrame, result: DedupResult) -> DataFrame:
    """(node, group) for every node of the undirected `edges` (columns a, b): group is the least node of its
    connected component. The large-star / small-star alternation (Kiveris, Lattanzi, Mirrokni, Rastogi,
    Vassilvitskii, "Connected Components in MapReduce and Beyond", SoCC 2014): each round turns every component
    nearer to a star around its least node, and the rounds grow with the logarithm of a component's size, not its
    diameter (a chain of n pages, which the bucket cap's window makes of a family of near-identical pages, took n
    rounds of label propagation). It stops when the edges, each from a node to a lesser one, form stars: every
    node points at one node at most, and no node both points and is pointed at. Pairs that form stars already (lone
    pairs) need no round."""
    down = (edges.where(F.col("a") != F.col("b"))
            .select(F.greatest("a", "b").alias("node"), F.least("a", "b").alias("to")).distinct().localCheckpoint())
    for rounds in range(MAX_COMPONENT_ROUNDS + 1):
        if not _not_star_nodes(down).limit(1).count():
            result.rounds = rounds
            return down.withColumnRenamed("to", "group").unionByName(
                down.select(F.col("to").alias("node"), F.col("to").alias("group")).distinct())
        down = _small_star(_large_star(down)).localCheckpoint()
    raise RuntimeError(f"dedup: near-duplicate groups not formed after {MAX_COMPONENT_ROUNDS} rounds")


def _not_star_nodes(down: DataFrame) -> DataFrame:
    """The nodes that keep the edges from forming stars: those pointing at more than one node, and those that both
    point and are pointed at (one aggregation over both ends of every edge)."""
    ends = down.select("node", F.lit(1).alias("points"), F.lit(False).alias("pointed_at")).unionByName(
        down.select(F.col("to").alias("node"), F.lit(0).alias("points"), F.lit(True).alias("pointed_at")))
    degrees = ends.groupBy("node").agg(F.sum("points").alias("points"), F.max("pointed_at").alias("pointed_at"))
    return degrees.where((F.col("points") > 1) | ((F.col("points") > 0) & F.col("pointed_at"))).select("node")


def _large_star(down: DataFrame) -> DataFrame:
    """Each node's greater neighbours are linked to the least of its neighbourhood (itself included)."""
    both = down.unionByName(down.select(F.col("to").alias("node"), F.col("node").alias("to")))
    least = F.least(F.min("to").over(Window.partitionBy("node")), F.col("node"))
    return both.withColumn("least", least).where(F.col("to") > F.col("node")).select(
        F.col("to").alias("node"), F.col("least").alias("to")).distinct()


def _small_star(down: DataFrame) -> DataFrame:
    """Each node and its lesser neighbours are linked to the least of them (every edge points down already)."""
    least = F.min("to").over(Window.partitionBy("node"))
    linked = down.withColumn("least", least)
    return linked.select(F.col("to").alias("node"), "least").unionByName(
        linked.select("node", "least")).where(F.col("node") != F.col("least")).select(
        "node", F.col("least").alias("to")).distinct()


def run(spark: SparkSession, conf: Config, root: str, segment_id: str) -> DedupResult:
    """Mark segment `segment_id`'s pages as exact / near duplicates and lower duplicates' priority; safe to re-run."""
    root = layout.normalize_root(root)
    layout.check_segment_id(segment_id)
    tables.ensure_tables(spark, root)
    definition = IndexDefinition.from_config(conf)
    refusal = definition.refusal(*_recorded_definition(spark, root))
    if refusal is not None:
        raise IndexRefused(refusal)
    result = DedupResult(segment_id)
    # Adaptive query execution re-plans each of this job's many small joins against cached and broadcast inputs:
    # on a test segment it took 34 s of the run's 41, 10 s with it off (the plans are static, the inputs segment-sized).
    # Every MERGE source is a localCheckpoint (SOURCE_HELD).
    # Its work follows the segment's pages and the band index it scans for their candidates (not counted when the
    # segment alone is over the small-input threshold: the count would not change the plan).
    def input_rows() -> int:
        rows = segment_rows(conf, layout.fetched_dir(root, segment_id))
        return rows + table_rows(spark, root, BANDS) if rows <= conf.spark.small_input_rows else rows

    with (step(f"dedup {segment_id}"), session_settings(spark, {**NOT_ADAPTIVE, **SOURCE_HELD}),
          sized_to_input(spark, conf, input_rows)):
        # Every table is read once, filtered to what the segment touches, and checkpointed: later plans hold no
        # Delta scan to plan again (planning one costs more than the work at a segment's size).
        documents, leavers = segment_changes(spark, root, segment_id)
        changes = documents.withColumn("leaves", F.lit(False)).unionByName(
            leavers.withColumn("leaves", F.lit(True)), allowMissingColumns=True).localCheckpoint()
        documents, leavers = changes.where(~F.col("leaves")).drop("leaves"), changes.where("leaves").select(
            "url_id", "bucket")
        counts = changes.agg(F.count(F.when(~F.col("leaves"), 1)).alias("docs"),
                             F.count(F.when(F.col("leaves"), 1)).alias("left")).first()
        result.examined, result.left = int(counts["docs"]), int(counts["left"])
        if not (result.examined or result.left):
            return result
        changed = changes.select("url_id", "bucket")
        hashes, bands = pinned_table(spark, root, HASHES), pinned_table(spark, root, BANDS)
        previous = hashes.join(F.broadcast(changed.select("url_id")), "url_id").localCheckpoint()
        docs, exact_relabelled = exact_marks(hashes, previous, documents, changed)
        docs, exact_relabelled = docs.localCheckpoint(), exact_relabelled.localCheckpoint()
        labels, new_bands = near_labels(spark, conf, definition, bands, docs, changed, result)
        marks = (
            docs.join(labels, "url_id", "left")
            .withColumn("duplicate_of", F.when(F.col("representative") != F.col("url_id"), F.col("representative")))
            .withColumn("is_duplicate",
                        F.expr(f"{representative_of_sql('url_id', 'duplicate_of', 'cluster')} is not null"))
            .localCheckpoint()
        )
        counts = marks.agg(F.count("duplicate_of").alias("exact"),
                           F.count(F.when(F.col("cluster") != F.col("url_id"), 1)).alias("near"),
                           F.countDistinct("cluster").alias("clusters")).first()
        result.exact_duplicates, result.near_duplicates = int(counts["exact"]), int(counts["near"])
        result.near_clusters = int(counts["clusters"])
        leaving = leavers.join(previous.select("url_id", "marked_duplicate", "near_members"), "url_id")
        retired = dedup_index.retired_clusters(marks, leaving).localCheckpoint()
        band_relabelled = dedup_index.band_relabels(bands, retired, changed) if retired.limit(1).count() else None
        hash_rows = dedup_index.hash_rows(segment_id, marks, exact_relabelled, leavers, hashes).localCheckpoint()
        band_rows = dedup_index.band_rows(segment_id, definition.key_count(), marks, new_bands, band_relabelled,
                                          changed).localCheckpoint()
        result.relabelled = hash_rows.where("_op = 'relabel'").select("_op").unionByName(
            band_rows.where("_op = 'relabel'").select("_op")).count()
        # Its commits hold the crawl's writer lock: the priority MERGE into `urls` must not land under a rebucket's
        # rewrite of the table (which would drop it) or between a generate's selection and its lease.
        with writer_lock(conf, root, "dedup"):
            _hold_definition(spark, root, definition)  # outside the idempotent writes: its commit is no MERGE's
            with _once_per_segment(spark, segment_id):
                result.marked = _write_marks(spark, root, segment_id, marks)
                result.priority_lowered, result.priority_restored = _adjust_priority(spark, root, conf, marks,
                                                                                     leaving)
                committed = [dedup_index.merge_index(spark, root, HASHES, hash_rows, "t.url_id = s.url_id"),
                             dedup_index.merge_index(spark, root, BANDS, band_rows,
                                                     "t.url_id = s.url_id AND t.band = s.band")]
        result.commits = (result.marked > 0) + (result.priority_lowered + result.priority_restored > 0) + sum(
            committed)
    log.info("dedup %s: %s", segment_id, result.summary())
    return result


def _write_marks(spark: SparkSession, root: str, segment_id: str, marks: DataFrame) -> int:
    source = marks.select("url_id", "state_version", "duplicate_of",
                          F.col("cluster").alias("near_duplicate_cluster"))
    changed = ~(F.col("t.duplicate_of").eqNullSafe(F.col("s.duplicate_of"))
                & F.col("t.near_duplicate_cluster").eqNullSafe(F.col("s.near_duplicate_cluster")))
    with table_turn(root, "pages"):
        metrics = (
            merge_into(spark, root, "pages", source,
                       f"t.segment_id = '{segment_id}' AND t.url_id = s.url_id AND t.state_version = s.state_version")
            .whenMatchedUpdate(condition=changed, set={"duplicate_of": "s.duplicate_of",
                                                       "near_duplicate_cluster": "s.near_duplicate_cluster"})
            .execute()
        )
    return merge_counts(metrics).get("num_updated_rows", 0)


def _adjust_priority(spark: SparkSession, root: str, conf: Config, marks: DataFrame,
                     leaving: DataFrame) -> tuple[int, int]:
    """urls whose verdict flipped against the marks of their previous page (dedup_hashes.marked_duplicate):
    became a duplicate -> priority *= the factor; stopped being one, or left the index -> priority /= the factor,
    undoing the lowering. Returns (lowered, restored)."""
    factor = conf.dedup.duplicate_priority_factor
    verdicts = marks.select("url_id", "bucket", "is_duplicate",
                            F.coalesce(F.col("old_marked"), F.lit(False)).alias("was_duplicate")).unionByName(
        leaving.where("marked_duplicate").select(
            "url_id", "bucket", F.lit(False).alias("is_duplicate"), F.lit(True).alias("was_duplicate")))
    source = verdicts.where(F.col("is_duplicate") != F.col("was_duplicate")).select(
        "bucket", "url_id", "is_duplicate",
        F.when(F.col("is_duplicate"), F.lit(factor)).otherwise(F.lit(1.0 / factor)).alias("multiplier")
    ).localCheckpoint()
    per_bucket = source.groupBy("is_duplicate", "bucket").count().collect()  # the counts and the buckets: one job
    counts = {flag: sum(int(r["count"]) for r in per_bucket if bool(r["is_duplicate"]) == flag)
              for flag in (True, False)}
    if not per_bucket:
        return 0, 0
    buckets = ", ".join(str(b) for b in sorted({r["bucket"] for r in per_bucket}))
    metrics = (
        merge_into(spark, root, "urls", source, f"t.bucket IN ({buckets}) AND t.bucket = s.bucket "
                                                "AND t.url_id = s.url_id")
        .whenMatchedUpdate(set={"priority": F.col("t.priority") * F.col("s.multiplier")})
        .execute()
    )
    if not merge_counts(metrics).get("num_updated_rows", 0):  # nothing flipped, or this segment's commit was done
        return 0, 0
    return counts.get(True, 0), counts.get(False, 0)


class IndexRefused(UserError):
    """`dedup_bands` holds an index of another definition than the config's (crawler.dedup.IndexDefinition)."""


class IndexRebuilt(TryLater):
    """`crawl dedup --rebuild` re-keyed the index while this dedup computed its rows under the old keys."""


def _recorded_definition(spark: SparkSession, root: str) -> tuple[str | None, bool]:
    """(the index's recorded definition, whether it has rows). Rows are looked for (a Spark job) only when none is
    recorded and the table has a commit after its creation: a new root's first dedups need no job for it."""
    recorded = tables.table_property(spark, root, BANDS, INDEX_PROPERTY)
    if recorded is not None or tables.table_version(spark, root, BANDS) == 0:
        return recorded, False
    return None, bool(pinned_table(spark, root, BANDS).limit(1).count())


def _hold_definition(spark: SparkSession, root: str, definition: IndexDefinition) -> None:
    """Under the writer lock, before the first commit: the index is still of `definition` (a rebuild may have
    re-keyed it since the run began: IndexRebuilt, nothing committed), recorded now if it was not yet."""
    recorded = tables.table_property(spark, root, BANDS, INDEX_PROPERTY)
    if recorded is None:
        tables.set_table_property(spark, root, BANDS, INDEX_PROPERTY, definition.identity())
    elif recorded != definition.identity():
        raise IndexRebuilt(f"dedup_bands was rebuilt while this dedup ran (its definition is now {recorded}); "
                           "nothing was committed: run it again")


@dataclass
class RebuildResult:
    definition: str
    previous: str | None      # the definition the index was recorded with (None: not recorded)
    urls: int = 0             # URLs in the index
    rows: int = 0             # index rows written (0: it held this config's definition already)

    def summary(self) -> str:
        if self.previous == self.definition:
            return f"dedup_bands already holds {self.definition}: nothing to rebuild"
        return (f"{self.urls} URLs re-keyed into {self.rows} rows of {self.definition} "
                f"(was {self.previous or 'not recorded'})")


def rebuild_index(spark: SparkSession, conf: Config, root: str) -> RebuildResult:
    """Rewrite `dedup_bands` under the config's index definition: each URL's row (SimHash, seen, cluster) exploded
    into the config's keys, in one overwrite, then the definition recorded. Clusters are kept as they are. A crash
    between the two commits leaves the old record on the new rows: dedup refuses them and a second rebuild makes
    the same rows (it reads one row per URL, whatever the keys). SimHashes of another fingerprint cannot be
    re-keyed into this one: that index is refused."""
    root = layout.normalize_root(root)
    tables.ensure_tables(spark, root)
    definition = IndexDefinition.from_config(conf)
    with step("dedup --rebuild"), writer_lock(conf, root, "dedup --rebuild"):
        recorded = tables.table_property(spark, root, BANDS, INDEX_PROPERTY)
        result = RebuildResult(definition.identity(), recorded)
        if recorded == definition.identity():
            return result
        held = IndexDefinition.parse(recorded).fingerprint if recorded is not None else definition.fingerprint
        if held != definition.fingerprint:
            raise IndexRefused(f"dedup_bands holds SimHashes of fingerprint {held!r} and this version computes "
                               f"{definition.fingerprint!r}: keys cannot convert one into the other; the pages must "
                               "be parsed again")
        documents = (pinned_table(spark, root, BANDS).dropDuplicates(["url_id"])
                     .select("url_id", "simhash", "seen", "cluster", "cluster_seen", "segment_id").localCheckpoint())
        rows = tables.conform(explode_bands(documents, definition), BANDS).localCheckpoint()
        result.urls, result.rows = documents.count(), rows.count()
        rows.write.format("delta").mode("overwrite").save(tables.table_path(root, BANDS))
        tables.set_table_property(spark, root, BANDS, INDEX_PROPERTY, definition.identity())
    log.info("dedup --rebuild: %s", result.summary())
    return result


def check_arguments(conf: Config, root: str, segment: str | None, rebuild: bool) -> None:
    """`crawl dedup` takes a segment or `--rebuild`, one of the two (checked before Spark starts)."""
    if (segment is None) == (not rebuild):
        raise UserError("crawl dedup takes --segment SEGMENT or --rebuild (one of the two)")


def run_command(spark: SparkSession, conf: Config, root: str, segment: str | None, rebuild: bool) -> int:
    """`crawl dedup`: the segment's duplicates marked, or the index rebuilt, in one summary line."""
    if rebuild:
        print(f"dedup --rebuild: {rebuild_index(spark, conf, root).summary()}")
        return 0
    print(f"dedup: {run(spark, conf, root, segment).summary()}")
    return 0
