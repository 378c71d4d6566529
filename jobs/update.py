"""update: fold a segment's fetch results, robots observations, pages and links into the tables.

update completes the URLs the segment fetched, writes their index events and the hosts' counters, robots and
backoff; what the segment discovered (outlinks, redirect targets, sitemap entries, robots `Sitemap:` lines) is
jobs/discover.py's part of the same `urls` and `hosts` MERGEs. Every write is a Delta MERGE and idempotent, so
re-running update for a segment changes no table. Six commits:
1. `fetches`       insert-if-absent on (segment_id, url_id, state_version)
2. `index_events`  insert-if-absent on (url_id, state_version), from the pre-completion `urls` row
3. `urls`          one MERGE: completion, only where (url_id, url, state_version) match and the lease is this
                   segment's; from discover: new URLs inserted, known ones get inlinks/depth (guarded by
                   urls.inlink_segment)
4. `hosts`         one MERGE (jobs/update_hosts.py): counters, robots and backoff (guarded by
                   hosts.last_segment); from discover: accepted and rejected discoveries -> `known_urls` /
                   `trap_rejections` (guarded by hosts.discovery_segment), hosts of new URLs inserted
5. `segments`      per bucket -> merged with counts (new URLs per bucket from discover), only if not merged yet
6. `cycle_metrics` insert-if-absent: the update's frontier figures (jobs/cycle_metrics.py)

All reads of `urls`, `hosts`, `pages` and `links` are pinned to the Delta version at the start of the job (and
handed to discover), so every step sees the same pre-update state however often Spark evaluates a plan; the
segment's results and their pre-completion rows are read once and cached. Per-record rules come from
crawler.politeness (host backoff), applied as a Python UDF, and crawler.revisit (status, interval, next fetch,
failures), crawler.payloads (the stored payload a URL keeps), crawler.frontier (index event kind), crawler.leases
(the latest result, current, completes), crawler.status (requests, failures) and crawler.dedup (the duplicate
verdict) as their SQL twins, so each rule exists once and a completion needs no Python worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.dedup import representative_of_sql
from crawler.frontier import index_event_kind_sql
from crawler.leases import completes_sql, is_current_sql, latest_result_rank_sql
from crawler.payloads import STORED_COLUMNS, stored_after_sql
from crawler.records import FETCHED
from crawler.revisit import RevisitPolicy
from crawler.status import FINISHED_SEGMENT_STATES, FetchOutcome, SegmentState, is_unchanged_sql, made_request_sql
from delta_tables import tables
from jobs import cycle_metrics, discover
from jobs.base import (
    check_bucketing,
    insert_if_absent,
    latest_per_key,
    merge_counts,
    merge_into,
    pinned_table,
    read_segment_files,
    segment_rows,
    sized_to_input,
    step,
    table_turn,
)
from jobs.update_hosts import host_fetch_counts, merge_hosts, segment_robots
from jobs.writelock import holding_writer_lock

log = logging.getLogger("jobs.update")


@dataclass
class UpdateResult:
    segment_id: str
    results: int = 0          # distinct (url_id, state_version) results read
    applied: int = 0          # results that completed their URL
    stale: int = 0            # results ignored: version no longer current or lease not this segment's
    discovered: int = 0       # new rows in `urls`
    index_events: int = 0     # new rows in `index_events`
    hosts_updated: int = 0    # `hosts` rows updated or inserted: counters, discovery tallies, hosts of new URLs

    def summary(self) -> str:
        return (f"{self.results} results: {self.applied} applied, {self.stale} stale, {self.discovered} new URLs, "
                f"{self.index_events} index events, {self.hosts_updated} hosts")


@holding_writer_lock("update")
def run(spark: SparkSession, conf: Config, root: str, segment_id: str) -> UpdateResult:
    """Fold segment `segment_id` into the tables under `root`."""
    layout.check_segment_id(segment_id)
    tables.ensure_tables(spark, root)
    check_bucketing(conf, root)
    result = UpdateResult(segment_id)
    with sized_to_input(spark, conf, lambda: segment_rows(conf, layout.fetched_dir(root, segment_id))):
        return _update(spark, conf, root, segment_id, result)


def _update(spark: SparkSession, conf: Config, root: str, segment_id: str, result: UpdateResult) -> UpdateResult:
    fetched = read_segment_files(spark, layout.fetched_dir(root, segment_id), FETCHED)
    now = datetime.now(UTC)
    if fetched is None:
        log.info("update %s: no fetched results; nothing to merge", segment_id)
        record_merged(spark, root, segment_id, {}, {}, now)
    else:
        seg = F.lit(segment_id)
        # Every later step reads the results: one read, one dedup of repeated results, kept for the job.
        results = (fetched.withColumn("segment_id", seg).withColumn("_n", F.expr(latest_result_rank_sql()))
                   .where("_n = 1").drop("_n")).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            _fold(spark, conf, root, segment_id, results, now, result)
        finally:
            results.unpersist()
    with step(f"update {segment_id}: frontier figures"):
        cycle_metrics.record(spark, root, cycle_metrics.update_figures(
            spark, conf, root, segment_id, now, result.results, result.applied, result.stale, result.discovered))
    return result


def _fold(spark: SparkSession, conf: Config, root: str, segment_id: str, results: DataFrame, now: datetime,
          result: UpdateResult) -> UpdateResult:
    seg = F.lit(segment_id)
    urls_snap = pinned_table(spark, root, "urls")
    hosts_snap = pinned_table(spark, root, "hosts")
    pages = latest_per_key(pinned_table(spark, root, "pages").where(F.col("segment_id") == seg),
                    ["url_id", "state_version"], [F.desc("fetched_at")])
    links = pinned_table(spark, root, "links").where(F.col("segment_id") == seg)
    previous = urls_snap.select(
        "url_id", "url", F.col("bucket").alias("u_bucket"), F.col("status").alias("prev_status"),
        F.col("state_version").alias("prev_version"), F.col("lease_segment").alias("prev_lease"),
        F.col("fetch_interval_s").alias("prev_interval"), F.col("failure_count").alias("prev_failures"),
        F.col("content_hash").alias("prev_hash"), F.col("simhash").alias("prev_simhash"),
        F.col("etag").alias("prev_etag"), F.col("last_modified").alias("prev_last_modified"),
        F.col("last_changed_at").alias("prev_changed_at"), F.col("redirect_to").alias("prev_redirect_to"),
        F.col("last_fetch_at").alias("prev_last_fetch_at"), F.col("last_status_code").alias("prev_status_code"),
        F.col("depth").alias("prev_depth"), F.col("priority").alias("prev_priority"),
        F.col("last_segment").alias("prev_last_segment"),
        *[F.col(name).alias(f"prev_{name}") for name in STORED_COLUMNS],
    )
    # Each result with its URL's row when that row is still at the result's version (else the result is stale).
    with_previous = results.join(previous, ["url_id", "url"], "left").withColumn(
        "current", F.expr(is_current_sql("state_version", "prev_version"))).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # Applied = completes now, or completed by an earlier run of this update that died before the end: a re-run
        # then records the same counts as an uninterrupted run.
        applied = F.expr(completes_sql("state_version", "prev_version", "prev_lease", "prev_last_segment", segment_id))
        per_bucket = {r["bucket"]: r for r in with_previous.groupBy("bucket").agg(
            F.count("*").alias("results"), F.countDistinct("host_key").alias("hosts"),
            F.count(F.when(applied, 1)).alias("applied")).collect()}
        result.results = sum(r["results"] for r in per_bucket.values())
        if not result.results:
            log.info("update %s: fetched results are empty; nothing to merge", segment_id)
            record_merged(spark, root, segment_id, {}, {}, now)
            return result
        result.applied = sum(r["applied"] for r in per_bucket.values())
        result.stale = result.results - result.applied

        with step(f"update {segment_id}: fetches"):
            # The segment named as a literal: the MERGE reads its partition of `fetches` only.
            insert_if_absent(spark, root, "fetches", tables.conform(results, "fetches"),
                             f"t.segment_id = '{segment_id}' AND t.url_id = s.url_id "
                             "AND t.state_version = s.state_version")

        live = with_previous.where(F.col("current") & (F.col("prev_lease") == seg)).join(
            pages.select("url_id", "state_version", F.col("content_hash").alias("new_hash"),
                         F.col("simhash").alias("new_simhash"),
                         F.expr(representative_of_sql("url_id", "duplicate_of", "near_duplicate_cluster"))
                         .alias("duplicate_of")),
            ["url_id", "state_version"], "left",
        ).withColumn("kind", F.expr(index_event_kind_sql("outcome", "status_code", "prev_hash", "new_hash",
                                                         "duplicate_of", "sitemap_origin")))
        with step(f"update {segment_id}: index events"):
            events = live.where(F.col("kind").isNotNull()).select(
                "url_id", "state_version", "url", "kind", "segment_id", "status_code", "warc_filename", "warc_offset",
                "warc_length", F.coalesce("new_hash", "prev_hash").alias("content_hash"), "duplicate_of",
                F.col("fetched_at").alias("created_at"),
            )
            # A (url_id, state_version) is only ever this segment's (each lease bumps the version): naming the
            # segment lets the MERGE skip the files of every other segment's events.
            result.index_events = insert_if_absent(spark, root, "index_events",
                                                   tables.conform(events, "index_events"),
                                                   f"t.segment_id = '{segment_id}' AND t.url_id = s.url_id "
                                                   "AND t.state_version = s.state_version")

        robots = segment_robots(spark, root, segment_id)
        with discover.discoveries(conf, segment_id, results, links, urls_snap, hosts_snap, robots) as found:
            result.discovered = sum(found.accepted.values())
            with step(f"update {segment_id}: urls"):
                # The host's robots expiry: this segment's observation, else the one stored (robots_denied waits
                # for it).
                observed = robots.select("host_key", F.col("robots_expires_at").alias("r"))
                robots_expiry = hosts_snap.select("host_key", F.col("robots_expires_at").alias("h")).join(
                    observed, "host_key", "full_outer").select(
                    "host_key", F.coalesce("r", "h").alias("robots_expires_at"))
                completed = completion_rows(live.join(robots_expiry, "host_key", "left"),
                                            RevisitPolicy.from_config(conf))
                merge_urls(spark, conf, root, segment_id, completed, found.targets, now)

            with step(f"update {segment_id}: hosts"):
                fetch_counts = host_fetch_counts(conf, segment_id, results, robots, hosts_snap)
                tally = discover.discovery_tally(found.fresh)
                result.hosts_updated = merge_hosts(spark, root, segment_id, fetch_counts, tally, now)

        with step(f"update {segment_id}: segments"):
            record_merged(spark, root, segment_id, per_bucket, found.accepted, now)
    finally:
        with_previous.unpersist()
    log.info(
        "update %s: %d results, %d applied, %d stale, %d discovered, %d index events, %d hosts updated",
        segment_id, result.results, result.applied, result.stale, result.discovered, result.index_events,
        result.hosts_updated,
    )
    return result


def completion_rows(live: DataFrame, policy: RevisitPolicy) -> DataFrame:
    """Each live result's new URL state (`n_*` columns) by its URL's keys, bucket and version (`c_version`): the
    revisit decision (crawler.revisit, in SQL) and what the result replaces."""
    outcome = F.col("outcome")
    # not_modified: a 304 or the stored payload again (a revisit record): the validators it carried, else the old
    success, not_modified = outcome == FetchOutcome.SUCCESS.value, F.expr(is_unchanged_sql("outcome"))
    requested = F.expr(made_request_sql("outcome"))
    has_new = success & F.col("new_hash").isNotNull()
    changed = has_new & ~F.col("prev_hash").eqNullSafe(F.col("new_hash"))
    decision = policy.decide_sql("outcome", "status_code", "prev_status", "prev_interval", "prev_failures",
                                 "prev_hash", "new_hash", "(unix_micros(robots_expires_at) - unix_micros(fetched_at))",
                                 "(sitemap_origin is not null)", "url_id")
    d = F.struct(*[F.expr(sql).alias(name) for name, sql in decision.items()])
    stored = stored_after_sql("outcome", "truncated", "payload_digest", "warc_filename", "url", "redirect_to",
                              "fetched_at", {name: f"prev_{name}" for name in STORED_COLUMNS})
    return live.withColumn("d", d).select(
        "url_id", "url", F.col("state_version").alias("c_version"), F.col("u_bucket").alias("bucket"),
        F.col("d.status").alias("n_status"),
        F.col("d.fetch_interval_s").alias("n_interval"),
        F.timestamp_micros(F.unix_micros("fetched_at") + F.col("d.wait_us")).alias("n_next_fetch_at"),
        F.col("d.failure_count").alias("n_failures"),
        F.when(requested, F.col("fetched_at")).otherwise(F.col("prev_last_fetch_at")).alias("n_last_fetch_at"),
        F.when(requested, F.col("status_code")).otherwise(F.col("prev_status_code")).alias("n_status_code"),
        F.when(success, F.col("etag")).when(not_modified, F.coalesce("etag", "prev_etag"))
        .otherwise(F.col("prev_etag")).alias("n_etag"),
        F.when(success, F.col("last_modified")).when(not_modified, F.coalesce("last_modified", "prev_last_modified"))
        .otherwise(F.col("prev_last_modified")).alias("n_last_modified"),
        F.when(has_new, F.col("new_hash")).otherwise(F.col("prev_hash")).alias("n_hash"),
        F.when(has_new, F.col("new_simhash")).otherwise(F.col("prev_simhash")).alias("n_simhash"),
        F.when(changed, F.col("fetched_at")).otherwise(F.col("prev_changed_at")).alias("n_changed_at"),
        F.when(outcome == FetchOutcome.REDIRECT.value, F.col("redirect_to"))
        .when(success | not_modified, F.lit(None)).otherwise(F.col("prev_redirect_to")).alias("n_redirect_to"),
        *[F.expr(stored[name]).alias(f"n_{name}") for name in STORED_COLUMNS],
    )


def merge_urls(spark: SparkSession, conf: Config, root: str, segment_id: str, completed: DataFrame,
               targets: DataFrame, now: datetime) -> None:
    """One MERGE into `urls` of the live results' completions (completion_rows: only the current version under
    this segment's lease completes) and the discovered targets (discover.url_rows, discover.urls_part)."""
    found = discover.urls_part(segment_id)
    keys = ["bucket", "url_id", "url"]
    source = completed.withColumn("completes", F.lit(True)).join(
        discover.url_rows(conf, segment_id, targets), keys, "full_outer")
    seg = F.lit(segment_id)
    completes = (F.col("s.completes").isNotNull() & (F.col("t.state_version") == F.col("s.c_version"))
                 & (F.col("t.lease_segment") == seg))
    completion = {
        **{c: F.col(f"s.{n}") for c, n in (
            ("status", "n_status"), ("fetch_interval_s", "n_interval"), ("next_fetch_at", "n_next_fetch_at"),
            ("failure_count", "n_failures"), ("last_fetch_at", "n_last_fetch_at"),
            ("last_status_code", "n_status_code"), ("etag", "n_etag"), ("last_modified", "n_last_modified"),
            ("content_hash", "n_hash"), ("simhash", "n_simhash"), ("last_changed_at", "n_changed_at"),
            ("redirect_to", "n_redirect_to"), *((name, f"n_{name}") for name in STORED_COLUMNS))},
        "lease_segment": F.lit(None),
        "lease_expires_at": F.lit(None),
        "last_segment": seg,
        "updated_at": F.lit(now),
    }
    updates = {
        **{c: F.when(completes, v).otherwise(F.col(f"t.{c}")) for c, v in completion.items()},
        **found.set,
    }
    (
        merge_into(spark, root, "urls", source, "t.bucket = s.bucket AND t.url_id = s.url_id AND t.url = s.url")
        .whenMatchedUpdate(condition=completes | found.updates, set=updates)
        .whenNotMatchedInsert(condition=found.inserts, values=found.values)
        .execute()
    )


def record_closed(spark: SparkSession, root: str, segment_id: str, now: datetime) -> int:
    """`crawl close-segment`: the segment's buckets that are not merged -> state closed (given up: not merged,
    and no longer holding generate back); how many buckets changed."""
    targets = tables.table_df(spark, root, "segments").where(
        (F.col("segment_id") == segment_id) & ~F.col("state").isin(*FINISHED_SEGMENT_STATES)
    ).select("segment_id", "bucket")
    with table_turn(root, "segments"):
        metrics = (
            merge_into(spark, root, "segments", targets, "t.segment_id = s.segment_id AND t.bucket = s.bucket")
            .whenMatchedUpdate(condition=~F.col("t.state").isin(*FINISHED_SEGMENT_STATES),
                               set={"state": F.lit(SegmentState.CLOSED.value), "updated_at": F.lit(now)})
            .execute()
        )
    return merge_counts(metrics).get("num_updated_rows", 0)


def record_merged(spark: SparkSession, root: str, segment_id: str, per_bucket: dict[int, Row],
                  discovered: dict[int, int], now: datetime) -> None:
    """Each bucket of the segment -> state merged with its counts (`per_bucket`: results, hosts, applied per
    bucket), unless it is merged already. A segment fetched with no result at all is merged too (with nothing):
    its leased URLs come back when their leases expire, and it holds generate back no longer."""
    schema = ("segment_id string, bucket int, state string, url_count bigint, host_count bigint, results bigint, "
              "applied bigint, stale bigint, discovered bigint")
    rows = []
    for bucket in sorted(set(per_bucket) | set(discovered)):
        counts = per_bucket.get(bucket)
        count, hosts, done = (counts["results"], counts["hosts"], counts["applied"]) if counts else (0, 0, 0)
        rows.append((segment_id, bucket, SegmentState.MERGED.value, count, hosts, count, done, count - done,
                     discovered.get(bucket, 0)))
    # The segment's other buckets (generated, no result) are merged with nothing: joined in the MERGE's source
    # rather than collected first, unless there is nothing else to merge (then nothing may be committed either).
    generated = pinned_table(spark, root, "segments").where(F.col("segment_id") == segment_id).select("bucket")
    if not rows:
        if not generated.limit(1).count():
            return
        source = spark.createDataFrame([], schema)
    else:
        source = spark.createDataFrame(rows, schema)
    zero = F.lit(0).cast("bigint")
    source = source.unionByName(generated.distinct().join(source.select("bucket"), "bucket", "left_anti").select(
        F.lit(segment_id).alias("segment_id"), "bucket", F.lit(SegmentState.MERGED.value).alias("state"),
        *[zero.alias(c) for c in ("url_count", "host_count", "results", "applied", "stale", "discovered")]))
    source = tables.conform(source.select("*", F.lit(None).alias("owner"), F.lit(0).alias("epoch"),
                                          F.lit(None).alias("counters"), F.lit(now).alias("created_at"),
                                          F.lit(now).alias("updated_at"), F.lit(None).alias("wet_files"),
                                          F.lit(None).alias("wet_records")), "segments")
    with table_turn(root, "segments"):
        (
            merge_into(spark, root, "segments", source, "t.segment_id = s.segment_id AND t.bucket = s.bucket")
            .whenMatchedUpdate(
                condition=F.col("t.state") != SegmentState.MERGED.value,
                set={c: F.col(f"s.{c}") for c in ("state", "results", "applied", "stale", "discovered",
                                                  "updated_at")},
            )
            .whenNotMatchedInsertAll()
            .execute()
        )


def run_command(spark: SparkSession, conf: Config, root: str, segment: str) -> int:
    """`crawl update`: the segment merged into the tables, in one summary line."""
    print(f"update: {run(spark, conf, root, segment).summary()}")
    return 0
