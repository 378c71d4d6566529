"""update's `hosts` part: a segment's fetch counts, robots.txt observations and backoff folded into `hosts` in one
MERGE with what discover found (`jobs.discover.hosts_part`). Applied where `hosts.last_segment` is not this segment,
so re-running update changes nothing; the backoff decision is crawler.politeness's, applied as a Python UDF.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.politeness import THROTTLE_STATUSES, HostBackoff, PolitenessRules
from crawler.records import ROBOTS
from crawler.robots import RobotsState
from crawler.status import FetchOutcome, is_transient_sql, made_request_sql
from jobs.base import (
    from_micros,
    latest_per_key,
    merge_counts,
    merge_into,
    read_segment_files,
    to_micros,
)
from jobs.discover import hosts_part

# The last good copy's columns (hosts: the robots_body's fetch time and status), from a reachable observation's.
GOOD_COPY_COLUMNS = {"robots_good_at": "robots_fetched_at", "robots_good_status_code": "robots_status_code"}
ROBOTS_COLUMNS = ["robots_state", "robots_body", "robots_status_code", "robots_fetched_at", "robots_expires_at",
                  "robots_crawl_delay_s"]


def segment_robots(spark: SparkSession, root: str, segment_id: str) -> DataFrame:
    """The latest robots.txt observation per host in this segment: host_key, r_bucket and ROBOTS_COLUMNS."""
    robots_files = read_segment_files(spark, layout.robots_dir(root, segment_id), ROBOTS)
    if robots_files is None:
        return spark.createDataFrame([], "host_key string, r_bucket int, " + ", ".join(
            f"{c} {t}" for c, t in zip(ROBOTS_COLUMNS, ("string", "string", "int", "timestamp", "timestamp", "double"),
                                       strict=True)))
    return latest_per_key(robots_files, ["host_key"], [F.desc("fetched_at")]).select(
        "host_key", F.col("bucket").alias("r_bucket"), F.col("state").alias("robots_state"),
        F.col("body").alias("robots_body"), F.col("status_code").alias("robots_status_code"),
        F.col("fetched_at").alias("robots_fetched_at"), F.col("expires_at").alias("robots_expires_at"),
        F.col("crawl_delay_s").alias("robots_crawl_delay_s"),
    )


HOST_COUNTERS = ["fetches", "status_2xx", "status_3xx", "status_4xx", "status_5xx", "status_429", "network_errors",
                 "robots_denied"]


def host_fetch_counts(conf: Config, segment_id: str, results: DataFrame, robots: DataFrame,
                      hosts_snap: DataFrame) -> DataFrame:
    """Per host of this segment's results or robots observations (`robots` = segment_robots): HOST_COUNTERS,
    last_fetch_at, the robots columns (`has_robots` when observed) and the backoff and failing streak decided from
    the stored ones (crawler.politeness.PolitenessRules.host_backoff: a failure is crawler.status.is_transient, or
    a robots.txt observed unreachable; any other answer, page or robots.txt, counts as answered)."""
    code = F.col("status_code")
    requested = F.expr(made_request_sql("outcome"))
    transient = F.expr(is_transient_sql("outcome", "status_code"))
    throttled = code.isin(sorted(THROTTLE_STATUSES))

    def count_if(condition: Column) -> Column:
        return F.count(F.when(condition, 1))

    counters = results.groupBy("host_key").agg(
        F.min("bucket").alias("bucket"),
        count_if(requested).alias("fetches"),
        count_if(requested & code.between(200, 299)).alias("status_2xx"),
        count_if(requested & code.between(300, 399)).alias("status_3xx"),
        count_if(requested & code.between(400, 499)).alias("status_4xx"),
        count_if(requested & code.between(500, 599)).alias("status_5xx"),
        count_if(code == 429).alias("status_429"),
        count_if(F.col("outcome") == FetchOutcome.NETWORK_ERROR.value).alias("network_errors"),
        count_if(F.col("outcome") == FetchOutcome.ROBOTS_DENIED.value).alias("robots_denied"),
        F.max(F.when(requested, F.col("fetched_at"))).alias("last_fetch_at"),
        count_if(transient).alias("failed"),
        F.max(F.when(transient, F.col("fetched_at"))).alias("failed_at"),
        count_if(requested & ~transient).alias("answered"),
        F.max(F.when(throttled, F.col("retry_after_s"))).alias("retry_after_s"),
    )
    robots = robots.withColumn("has_robots", F.lit(True))
    robots_failed = F.col("has_robots") & (F.col("robots_state") == RobotsState.DISALLOW_ALL.value)
    counter_cols = [*HOST_COUNTERS, "failed", "answered"]
    rules = PolitenessRules.from_config(conf)

    @F.udf("struct<level:int, until_us:bigint, since_us:bigint>")
    def backoff(host, level, until_us, since_us, failed, answered, failed_at_us, retry_after_s):
        decided = rules.host_backoff(HostBackoff(level, from_micros(until_us), from_micros(since_us)), failed, answered,
                                     from_micros(failed_at_us), retry_after_s, f"{host}|{segment_id}")
        return (decided.level, to_micros(decided.until), to_micros(decided.failing_since))

    snap = hosts_snap.select("host_key", F.col("backoff_level").alias("h_level"),
                             F.col("backoff_until").alias("h_until"), F.col("failing_since").alias("h_since"))
    return (
        counters.join(robots, "host_key", "full_outer")
        .withColumn("bucket", F.coalesce("bucket", "r_bucket"))
        .withColumn("has_robots", F.coalesce("has_robots", F.lit(False)))
        .fillna(0, subset=counter_cols)
        .withColumn("failed", F.col("failed") + F.when(robots_failed, 1).otherwise(0))
        .withColumn("failed_at", F.greatest("failed_at", F.when(robots_failed, F.col("robots_fetched_at"))))
        .withColumn("answered", F.col("answered") + F.when(F.col("has_robots") & ~robots_failed, 1).otherwise(0))
        .join(snap, "host_key", "left")
        .withColumn("bo", backoff("host_key", F.coalesce("h_level", F.lit(0)), F.unix_micros("h_until"),
                                  F.unix_micros("h_since"), "failed", "answered", F.unix_micros("failed_at"),
                                  "retry_after_s"))
        .withColumn("backoff_level", F.col("bo.level"))
        .withColumn("backoff_until", F.timestamp_micros("bo.until_us"))
        .withColumn("failing_since", F.timestamp_micros("bo.since_us"))
    )


def merge_hosts(spark: SparkSession, root: str, segment_id: str, fetch_counts: DataFrame, tally: DataFrame,
                now: datetime) -> int:
    """One MERGE into `hosts` of this segment's fetch counts (host_fetch_counts; applied where last_segment is
    not this segment) and discovery tally (jobs.discover.discovery_tally, hosts_part); a host without a row
    gets one when it has results or accepted URLs. Returns the rows updated or inserted."""
    found = hosts_part(segment_id)
    source = fetch_counts.withColumn("has_fetch", F.lit(True)).join(tally, ["host_key", "bucket"], "full_outer")
    seg = F.lit(segment_id)
    fetched = F.col("s.has_fetch").isNotNull()
    fetch = fetched & ~F.col("t.last_segment").eqNullSafe(seg)
    # An unreachable robots.txt (5xx, network) disallows all for now, but the last good copy stays stored (its body,
    # when and with what status it was fetched): it is what the host said; generate's rules ignore it while the
    # state is disallow_all, and generate hands it to the daemons (crawler.robots.adopt keeps it in force through
    # an outage as RFC 9309 allows).
    has_robots = F.coalesce("s.has_robots", F.lit(False))
    new_body = has_robots & (F.col("s.robots_state") != RobotsState.DISALLOW_ALL.value)
    robots_changed = new_body & ~F.col("t.robots_body").eqNullSafe(F.col("s.robots_body"))

    def when_fetch(name: str, value: Column) -> Column:
        return F.when(fetch, value).otherwise(F.col(f"t.{name}"))

    def from_robots(name: str, source_name: str | None = None) -> Column:
        return F.when(has_robots, F.col(f"s.{source_name or name}")).otherwise(F.col(f"t.{name}"))

    updates = {
        **{c: when_fetch(c, F.col(f"t.{c}") + F.col(f"s.{c}")) for c in HOST_COUNTERS},
        "last_fetch_at": when_fetch("last_fetch_at", F.greatest("t.last_fetch_at", "s.last_fetch_at")),
        **{c: when_fetch(c, from_robots(c)) for c in ROBOTS_COLUMNS[:5] if c != "robots_body"},
        "robots_body": when_fetch("robots_body", F.when(new_body, F.col("s.robots_body")).otherwise(
            F.col("t.robots_body"))),
        **{c: when_fetch(c, F.when(new_body, F.col(f"s.{source}")).otherwise(F.col(f"t.{c}")))
           for c, source in GOOD_COPY_COLUMNS.items()},
        "crawl_delay_s": when_fetch("crawl_delay_s", from_robots("crawl_delay_s", "robots_crawl_delay_s")),
        "policy_version": when_fetch("policy_version", F.col("t.policy_version") + F.when(robots_changed, 1).otherwise(
            0)),
        "backoff_level": when_fetch("backoff_level", F.col("s.backoff_level")),
        "backoff_until": when_fetch("backoff_until", F.col("s.backoff_until")),
        "failing_since": when_fetch("failing_since", F.col("s.failing_since")),
        "last_segment": when_fetch("last_segment", seg),
        **found.set,
        "domain": F.coalesce("t.domain", "s.domain"),  # a row older than the column gains it when touched
        "updated_at": F.lit(now),
    }
    inserts = {
        "host_key": F.col("s.host_key"),
        "bucket": F.col("s.bucket"),
        **{c: F.coalesce(f"s.{c}", F.lit(0)).cast("bigint") for c in HOST_COUNTERS},
        **{c: F.col(f"s.{c}") for c in ROBOTS_COLUMNS[:5] if c != "robots_body"},
        "robots_body": F.when(new_body, F.col("s.robots_body")),
        **{c: F.when(new_body, F.col(f"s.{source}")) for c, source in GOOD_COPY_COLUMNS.items()},
        "crawl_delay_s": F.col("s.robots_crawl_delay_s"),
        "last_fetch_at": F.col("s.last_fetch_at"),
        "policy_version": F.when(new_body, 1).otherwise(0).cast("bigint"),
        "backoff_level": F.coalesce("s.backoff_level", F.lit(0)),
        "backoff_until": F.col("s.backoff_until"),
        "failing_since": F.col("s.failing_since"),
        "last_segment": F.when(fetched, seg),
        "domain": F.col("s.domain"),
        "updated_at": F.lit(now),
        **found.values,
    }
    metrics = (
        merge_into(spark, root, "hosts", source, "t.bucket = s.bucket AND t.host_key = s.host_key")
        .whenMatchedUpdate(condition=fetch | found.updates, set=updates)
        .whenNotMatchedInsert(condition=fetched | found.inserts, values=inserts)
        .execute()
    )
    counts = merge_counts(metrics)
    return counts.get("num_updated_rows", 0) + counts.get("num_inserted_rows", 0)
