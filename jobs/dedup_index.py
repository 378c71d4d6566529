"""dedup's writes to its two indexes (`dedup_hashes`, `dedup_bands`): the MERGE source of each — the segment's
rows (upsert), other URLs relabelled because their representative or cluster changed (relabel), the URLs that left
(delete) — and the MERGE that applies it. `jobs.dedup` decides the marks; this module only turns them into rows.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from delta_tables import tables
from jobs.base import merge_counts, merge_into


def retired_clusters(marks: DataFrame, leaving: DataFrame) -> DataFrame:
    """url_id of each representative that has had members and whose cluster ends here: it left the index, or
    its new page no longer matched its cluster's rows, or it joined an earlier cluster."""
    changed = marks.where(F.col("old_near_members") & ~(F.coalesce(F.col("kept"), F.lit(False))
                                                        & (F.col("cluster") == F.col("url_id"))))
    return changed.select(F.col("url_id").alias("retired")).unionByName(
        leaving.where("near_members").select(F.col("url_id").alias("retired")))


def band_relabels(bands: DataFrame, retired: DataFrame, changed: DataFrame) -> DataFrame:
    """Index rows of other URLs in a retired cluster, each falling back to itself."""
    return (
        bands.join(F.broadcast(retired), F.col("cluster") == F.col("retired"))
        .join(F.broadcast(changed.select("url_id")), "url_id", "left_anti")
        .select("band", "band_key", "url_id", "simhash", "seen", F.col("url_id").alias("cluster"),
                F.col("seen").alias("cluster_seen"))
    )


def hash_rows(segment_id: str, marks: DataFrame, relabelled: DataFrame, leavers: DataFrame,
               hashes: DataFrame) -> DataFrame:
    """The MERGE source for dedup_hashes: the segment's documents (upsert), other URLs' new representatives,
    URLs that left (delete), and representatives that gained near members (their flag)."""
    seg = F.lit(segment_id)
    upserts = marks.select(
        "url_id", "content_hash", "seen", "representative", F.col("is_duplicate").alias("marked_duplicate"),
        (F.coalesce(F.col("cluster") == F.col("url_id"), F.lit(False))
         | (F.coalesce(F.col("old_near_members"), F.lit(False)) & (F.col("old_hash") == F.col("content_hash"))
            & F.col("cluster").isNull())).alias("near_members"),
        seg.alias("segment_id"), F.lit("upsert").alias("_op"))
    relabels = relabelled.select("url_id", "content_hash", "seen", "representative", "marked_duplicate",
                                 "near_members", seg.alias("segment_id"), F.lit("relabel").alias("_op"))
    gainers = (marks.where(F.col("cluster") != F.col("url_id")).select(F.col("cluster").alias("url_id")).distinct()
               .join(marks.select("url_id"), "url_id", "left_anti"))
    # A representative relabelled and gaining members in one run: the relabel row carries both.
    relabels = relabels.join(gainers.select("url_id", F.lit(True).alias("gained")), "url_id", "left").withColumn(
        "near_members", F.col("near_members") | F.coalesce(F.col("gained"), F.lit(False))).drop("gained")
    gained = (
        hashes.where(~F.col("near_members"))
        .join(F.broadcast(gainers.join(relabelled.select("url_id"), "url_id", "left_anti")), "url_id").localCheckpoint()
        .select("url_id", "content_hash", "seen", "representative", "marked_duplicate",
                F.lit(True).alias("near_members"), seg.alias("segment_id"), F.lit("members").alias("_op"))
    )
    deletes = leavers.select("url_id", *[F.lit(None).cast(t).alias(c) for c, t in (
        ("content_hash", "string"), ("seen", "timestamp"), ("representative", "string"),
        ("marked_duplicate", "boolean"), ("near_members", "boolean"))], seg.alias("segment_id"),
        F.lit("delete").alias("_op"))
    return upserts.unionByName(relabels).unionByName(gained).unionByName(deletes)


def band_rows(segment_id: str, key_count: int, marks: DataFrame, new_bands: DataFrame,
               relabelled: DataFrame | None, changed: DataFrame) -> DataFrame:
    """The MERGE source for dedup_bands: the segment's band rows (upsert), retired clusters' members (relabel),
    and every band of a changed URL not upserted (delete: it left, or has no SimHash now; absent rows match
    nothing, so the old rows need not be read)."""
    seg = F.lit(segment_id)
    upserts = new_bands.join(marks.select("url_id", "seen", "cluster", "cluster_us"), "url_id").select(
        "band", "band_key", "url_id", "simhash", "seen",
        F.coalesce(F.col("cluster"), F.col("url_id")).alias("cluster"),
        F.coalesce(F.timestamp_micros("cluster_us"), F.col("seen")).alias("cluster_seen"),
        seg.alias("segment_id"), F.lit("upsert").alias("_op"))
    every_band = F.explode(F.sequence(F.lit(0), F.lit(key_count - 1))).alias("band")
    deletes = changed.select("url_id", every_band).join(upserts.select("url_id", "band"), ["url_id", "band"],
                                                        "left_anti").select(
        F.col("band").cast("int").alias("band"), F.lit(None).cast("bigint").alias("band_key"), "url_id",
        F.lit(None).cast("bigint").alias("simhash"), F.lit(None).cast("timestamp").alias("seen"),
        F.lit(None).cast("string").alias("cluster"), F.lit(None).cast("timestamp").alias("cluster_seen"),
        seg.alias("segment_id"), F.lit("delete").alias("_op"))
    rows = upserts.unionByName(deletes)
    if relabelled is not None:
        rows = rows.unionByName(relabelled.select("*", seg.alias("segment_id"), F.lit("relabel").alias("_op")))
    return rows


def merge_index(spark: SparkSession, root: str, name: str, source: DataFrame, condition: str) -> bool:
    """One MERGE of a dedup index: delete rows marked `delete`, upsert the others; True when it committed."""
    columns = tables.TABLES[name].schema.fieldNames()
    values = {c: F.col(f"s.{c}") for c in columns}
    metrics = merge_counts(
        merge_into(spark, root, name, source, condition)
        .whenMatchedDelete(condition="s._op = 'delete'")
        .whenMatchedUpdate(condition="s._op <> 'delete'", set=values)
        .whenNotMatchedInsert(condition="s._op <> 'delete'", values=values)
        .execute()
    )
    return any(metrics.get(key, 0) for key in ("num_affected_rows", "num_inserted_rows", "num_updated_rows",
                                               "num_deleted_rows"))
