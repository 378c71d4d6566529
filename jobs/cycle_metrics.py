"""Frontier figures into `cycle_metrics`: one row per generate or update run of a segment, for the cycle report,
the DAG and on-call (docs/deploy.md "On call").

Generate records the frontier it chose the segment from: URLs due (not leased elsewhere, in any host state), the
oldest due URL's age, due high-priority URLs (priority >= generate.high_priority) and how many of them this
segment did not take, the URLs it leased, the other segments not merged yet, and the hot domains (the
generate.hot_domains registered domains with the most due URLs, with what the segment leased of each). Update
records what the segment brought: results, applied and stale, new URLs, the change rate of refetched pages — read
from the segment's index events, changed / (changed + not_modified); a changed page that dedup marked as a
duplicate counts as neither — and the segments still not merged after it (those two in one Spark job). Hosts by
state (`hosts_by_state`, crawler.politeness.host_state) are counted where they are shown, by the report and `crawl
stats`, at that moment.

A row is an idempotent Delta append (writer options txnAppId = cycle_metrics:<segment>:<step>, txnVersion 0): a
re-run of a step writes nothing, keeps the first run's figures and changes no table, and a first run costs one
commit, no MERGE. Every figure is a small aggregate; generate's due figures are one more pass over `urls` at its
pinned version (the price of a backlog figure), aggregated per host so the hot domains come from the same pass;
update's read one segment's index events.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.leases import is_due_sql
from crawler.politeness import PolitenessRules
from crawler.status import IndexEventKind, MetricsStep
from delta_tables import tables
from jobs.base import pinned_table


def hosts_by_state(spark: SparkSession, conf: Config, root: str, now: datetime) -> dict[str, int]:
    """crawler.politeness.host_state -> hosts, at `now` (what the report shows)."""
    state = PolitenessRules.from_config(conf).host_state_sql("robots_state", "backoff_until", "failing_since", "t_now")
    rows = (tables.table_df(spark, root, "hosts").withColumn("t_now", F.lit(now))
            .groupBy(F.expr(state).alias("state")).count().collect())
    return {row["state"]: int(row["count"]) for row in rows}


def generate_figures(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime,
                     selected: DataFrame, unmerged: int) -> dict[str, Any]:
    """Generate's row: the due backlog at the pinned `urls` version, what `selected` (the fetch list) took, and the
    `unmerged` other segments generate found open."""
    high = float(conf.generate.high_priority)
    due = pinned_table(spark, root, "urls").withColumn("gen_now", F.lit(now)).where(is_due_sql("gen_now", segment_id))
    # One pass over `urls`: per host, then the totals and the hot domains from those (few) rows.
    per_host = due.groupBy("host_key").agg(
        F.count("*").alias("due_urls"),
        F.min("next_fetch_at").alias("oldest"),
        F.count(F.when(F.col("priority") >= high, 1)).alias("due_high_priority"),
    ).localCheckpoint()
    backlog = per_host.agg(
        F.coalesce(F.sum("due_urls"), F.lit(0)).alias("due_urls"),
        F.min("oldest").alias("oldest"),
        F.coalesce(F.sum("due_high_priority"), F.lit(0)).alias("due_high_priority"),
    ).first()
    taken = selected.agg(F.count("*").alias("leased"),
                         F.count(F.when(F.col("priority") >= high, 1)).alias("high")).first()
    oldest = backlog["oldest"]
    return {
        "segment_id": segment_id,
        "step": MetricsStep.GENERATE.value,
        "run_at": now,
        "due_urls": backlog["due_urls"],
        "oldest_due_age_s": None if oldest is None else max(0.0, (now - _aware(oldest, now)).total_seconds()),
        "due_high_priority": backlog["due_high_priority"],
        "high_priority_not_leased": max(0, backlog["due_high_priority"] - taken["high"]),
        "leased_urls": taken["leased"],
        "unmerged_segments": unmerged,
        "hot_domains": hot_domains(spark, root, per_host, selected, int(conf.generate.hot_domains)),
    }


def hot_domains(spark: SparkSession, root: str, per_host: DataFrame, selected: DataFrame,
                top: int) -> list[dict[str, Any]]:
    """The `top` registered domains by due URLs (`per_host`: host_key, due_urls), each with the URLs `selected` (the
    fetch list, with its `domain` column) leased of it: how much of a hot domain's backlog this cycle takes."""
    if not top:
        return []
    domains = pinned_table(spark, root, "hosts").select("host_key", "domain")
    rows = (per_host.join(domains, "host_key", "left")
            .groupBy(F.coalesce("domain", "host_key").alias("domain")).agg(F.sum("due_urls").alias("due"))
            .orderBy(F.desc("due"), "domain").limit(top).collect())
    names = [row["domain"] for row in rows]
    leased = {row["domain"]: int(row["count"])
              for row in selected.where(F.col("domain").isin(names)).groupBy("domain").count().collect()}
    return [{"domain": name, "due": int(row["due"]), "leased": leased.get(name, 0)} for name, row in zip(
        names, rows, strict=True)]


def update_figures(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime, results: int,
                   applied: int, stale: int, new_urls: int) -> dict[str, Any]:
    """Update's row: its counts and the change rate of refetched pages (one read of the segment's index events,
    which a re-run after a crash finds as the first run wrote them)."""
    kinds = Counter({row["kind"]: int(row["count"]) for row in tables.table_df(spark, root, "index_events")
                     .where(F.col("segment_id") == segment_id).groupBy("kind").count().collect()})
    changed = kinds[IndexEventKind.CHANGED.value]
    refetched = changed + kinds[IndexEventKind.NOT_MODIFIED.value]
    return {
        "segment_id": segment_id,
        "step": MetricsStep.UPDATE.value,
        "run_at": now,
        "results": results,
        "applied": applied,
        "stale": stale,
        "new_urls": new_urls,
        "refetched": refetched,
        "changed": changed,
        "change_rate": changed / refetched if refetched else None,
    }


def record(spark: SparkSession, root: str, figures: dict[str, Any]) -> None:
    """Append a step run's row unless its (segment_id, step) was written before (an idempotent Delta write)."""
    schema = tables.TABLES["cycle_metrics"].schema
    row = spark.createDataFrame([tuple(figures.get(name) for name in schema.names)], schema)
    (row.write.format("delta").mode("append")
     .option("txnAppId", f"cycle_metrics:{figures['segment_id']}:{figures['step']}").option("txnVersion", 0)
     .save(tables.table_path(root, "cycle_metrics")))


def update_signals(spark: SparkSession, root: str) -> tuple[float | None, float | None]:
    """The last update's (change rate of refetched pages, new URLs per result): what the adaptive refresh share
    moves by (crawler.frontier.RefreshShare); (None, None) before any update."""
    rows = (tables.table_df(spark, root, "cycle_metrics").where(F.col("step") == MetricsStep.UPDATE.value)
            .orderBy(F.desc("run_at")).limit(1).collect())
    if not rows or not rows[0]["results"]:
        return None, None
    row = rows[0]
    return row["change_rate"], (row["new_urls"] or 0) / row["results"]


def recent(spark: SparkSession, root: str, limit: int) -> list[dict[str, Any]]:
    """The last `limit` rows by run time (newest last): the history the report draws."""
    rows = tables.table_df(spark, root, "cycle_metrics").orderBy(F.desc("run_at"), F.desc("step")).limit(limit)
    return [row.asDict() for row in reversed(rows.collect())]


def read_figures(conf: Config, segment_id: str) -> dict[str, dict[str, Any]]:
    """This segment's rows by step, read with delta-rs, without Spark: what the DAG's frontier task reads (the table
    is insert-only and has no deletion vectors, so delta-rs opens it)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from jobs.storage import Storage

    uri, options = Storage.from_conf(conf).delta_rs(
        layout.table_path(layout.normalize_root(conf.storage.root), "cycle_metrics"))
    # One thread: a threaded pyarrow dataset scan leaves readahead threads that abort the interpreter at exit about one
    # run in five ("terminate called without an active exception", delta-rs#2184, arrow#34314), which fails an
    # Airflow task that already returned. (delta-rs's QueryBuilder holds the GIL while it reads: it never answers
    # when the object store is served from the same process, as the S3 test's is.)
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_dataset().to_table(
        filter=pc.field("segment_id") == segment_id, use_threads=False).to_pylist()
    return {row["step"]: row for row in rows}


def _aware(moment: datetime, like: datetime) -> datetime:
    """Spark returns naive UTC timestamps: give `moment` the time zone of `like`."""
    return moment.replace(tzinfo=like.tzinfo) if moment.tzinfo is None and like.tzinfo is not None else moment
