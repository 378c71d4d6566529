"""Frontier figures into `cycle_metrics`: one row per generate or update run of a segment, for the cycle report,
the DAG and on-call (docs/deploy.md "On call").

Generate records the frontier it chose the segment from: URLs due (not leased elsewhere, in any host state), the
oldest due URL's age, due high-priority URLs (priority >= generate.high_priority) and how many of them this
segment did not take, the URLs it leased, the other segments not merged yet, and the hot domains (the
generate.hot_domains registered domains with the most due URLs, with what the segment leased of each). Update
records what the segment brought: results, applied and stale, new URLs, the change rate of refetched pages — read
from the segment's index events, changed / (changed + not_modified); a changed page that dedup marked as a
duplicate counts as neither — and the segments still not merged after it (those two in one Spark job). Both record
their service level (crawler/service_levels.py): generate the lease outcomes of the eligible due high-priority URLs,
update the fetch -> durable lags of the segment's pages with outlinks (durable: the time of the `links` commit,
from the Delta log). Hosts by state (`hosts_by_state`, crawler.politeness.host_state) are counted where they are
shown, by the report and `crawl stats`, at that moment.

A row is an idempotent Delta append (writer options txnAppId = cycle_metrics:<segment>:<step>, txnVersion 0): a
re-run of a step writes nothing, keeps the first run's figures and changes no table, and a first run costs one
commit, no MERGE. Every figure is a small aggregate; generate's due figures are one more pass over the due URLs
generate read (and cached) for its selection, aggregated per host so the hot domains come from the same pass;
generate's lease level one aggregate over the eligible due high-priority URLs, read from the ranking select_due
cached (the fetch list is cut from the same ranking), and what the segment took from its counts per bucket;
update's read one segment's index events, links and fetches, and the `links` log commits since parse.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.config import Config
from crawler.politeness import PolitenessRules
from crawler.service_levels import (
    LeaseOutcome,
    is_high_priority_sql,
    lag_s_sql,
    lease_outcome_sql,
    percentile_sql,
    share_within,
)
from crawler.status import IndexEventKind, MetricsStep
from delta_tables import tables
from jobs.base import SMALL_INPUT, pinned_table, session_settings


def hosts_by_state(spark: SparkSession, conf: Config, root: str, now: datetime) -> dict[str, int]:
    """crawler.politeness.host_state -> hosts, at `now` (what the report shows)."""
    state = PolitenessRules.from_config(conf).host_state_sql("robots_state", "backoff_until", "failing_since", "t_now")
    rows = (tables.table_df(spark, root, "hosts").withColumn("t_now", F.lit(now))
            .groupBy(F.expr(state).alias("state")).count().collect())
    return {row["state"]: int(row["count"]) for row in rows}


def high_priority_count(conf: Config) -> Column:
    """The aggregate of the rows whose priority is high (crawler.service_levels): what the due backlog and the
    segment's counts per bucket (generate) both count."""
    return F.count(F.when(F.expr(is_high_priority_sql("priority", conf.generate.high_priority)), 1))


def generate_figures(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime, due: DataFrame,
                     selected: DataFrame, per_bucket: list, eligible_high: DataFrame,
                     unmerged: int) -> dict[str, Any]:
    """Generate's row: the `due` backlog (generate.due_urls, at the pinned `urls` version), what `selected` (the
    fetch list, counted per bucket in `per_bucket`: url_count, high_priority_count) took, the `unmerged` other
    segments generate found open, and the lease level over `eligible_high` (lease_level)."""
    # One pass over the due URLs: per host, then the totals and the hot domains from those (few) rows.
    per_host = due.groupBy("host_key").agg(
        F.count("*").alias("due_urls"),
        F.min("next_fetch_at").alias("oldest"),
        high_priority_count(conf).alias("due_high_priority"),
    ).localCheckpoint()
    backlog = per_host.agg(
        F.coalesce(F.sum("due_urls"), F.lit(0)).alias("due_urls"),
        F.min("oldest").alias("oldest"),
        F.coalesce(F.sum("due_high_priority"), F.lit(0)).alias("due_high_priority"),
    ).first()
    leased = sum(row["url_count"] for row in per_bucket)
    leased_high = sum(row["high_priority_count"] for row in per_bucket)
    oldest = backlog["oldest"]
    return {
        "segment_id": segment_id,
        "step": MetricsStep.GENERATE.value,
        "run_at": now,
        "due_urls": backlog["due_urls"],
        "oldest_due_age_s": None if oldest is None else max(0.0, (now - _aware(oldest, now)).total_seconds()),
        "due_high_priority": backlog["due_high_priority"],
        "high_priority_not_leased": max(0, backlog["due_high_priority"] - leased_high),
        "leased_urls": leased,
        "unmerged_segments": unmerged,
        "hot_domains": hot_domains(spark, root, per_host, selected, int(conf.generate.hot_domains)),
        **lease_level(conf, now, selected, eligible_high),
    }


def lease_level(conf: Config, now: datetime, selected: DataFrame, eligible_high: DataFrame) -> dict[str, Any]:
    """The lease level at this generate (crawler.service_levels): each eligible due high-priority URL (`eligible_high`:
    url_id, due_at) is leased now when `selected` holds it, else still waiting; its outcome at `now`, and the p99
    due -> lease lag of those leased now. One aggregate over (at most) the due high-priority URLs."""
    within_s = float(conf.service_levels.lease_within_s)
    leased = F.col("leased_at").isNotNull()
    outcome = F.expr(lease_outcome_sql("due_at", "leased_at", "gen_now", within_s))
    marked = (eligible_high.join(selected.select("url_id", F.lit(now).alias("leased_at")), "url_id", "left")
              .withColumn("gen_now", F.lit(now))
              .withColumn("outcome", outcome)
              .withColumn("lease_lag_s", F.when(leased, F.expr(lag_s_sql("leased_at", "due_at")))))
    row = marked.agg(
        F.count("*").alias("eligible"),
        F.count(F.when(outcome == LeaseOutcome.WITHIN.value, 1)).alias("within"),
        F.count(F.when(leased & (outcome == LeaseOutcome.LATE.value), 1)).alias("leased_late"),
        F.count(F.when(~leased & (outcome == LeaseOutcome.LATE.value), 1)).alias("waiting_late"),
        F.expr(percentile_sql("lease_lag_s", 0.99)).alias("p99"),
    ).first()
    return {
        "hp_eligible": row["eligible"],
        "hp_leased_within": row["within"],
        "hp_leased_late": row["leased_late"],
        "hp_waiting_late": row["waiting_late"],
        "hp_lease_lag_p99_s": row["p99"],
        "lease_share_within": share_within(row["within"], row["leased_late"] + row["waiting_late"]),
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
        **discovery_level(spark, conf, root, segment_id),
    }


def discovery_level(spark: SparkSession, conf: Config, root: str, segment_id: str) -> dict[str, Any]:
    """The discovery level of the segment (crawler.service_levels): for each of its pages with outlinks, the time of
    the `links` commit that added the file holding them (the latest such commit, if they span several) minus the
    page's `fetches.fetched_at`; their count, p50 and p99. Commit times come from the Delta log (links_commit_times),
    not from a clock read now, so a re-run or a late update measures what parse committed."""
    links = (tables.table_df(spark, root, "links").where(F.col("segment_id") == segment_id)
             .select("from_url_id", "from_state_version", F.col("_metadata.file_path").alias("file_path")))
    latest = tables.table_version(spark, root, "links")
    files = [row["file_path"] for row in links.select("file_path").distinct().collect()]
    committed = links_commit_times(conf, root, files, latest)
    empty = {"discovery_pages": 0, "discovery_durable_p50_s": None, "discovery_durable_p99_s": None}
    if not committed:
        return empty
    commits = spark.createDataFrame(list(committed.items()), "file_path string, durable_at timestamp")
    fetched = (tables.table_df(spark, root, "fetches").where(F.col("segment_id") == segment_id)
               .select(F.col("url_id").alias("from_url_id"), F.col("state_version").alias("from_state_version"),
                       "fetched_at"))
    pages = (links.join(F.broadcast(commits), "file_path")
             .groupBy("from_url_id", "from_state_version").agg(F.max("durable_at").alias("durable_at"))
             .join(fetched, ["from_url_id", "from_state_version"])
             .withColumn("lag_s", F.expr(lag_s_sql("durable_at", "fetched_at"))))
    row = pages.agg(F.count("*").alias("pages"), F.expr(percentile_sql("lag_s", 0.5)).alias("p50"),
                    F.expr(percentile_sql("lag_s", 0.99)).alias("p99")).first()
    return {"discovery_pages": row["pages"], "discovery_durable_p50_s": row["p50"],
            "discovery_durable_p99_s": row["p99"]}


def links_commit_times(conf: Config, root: str, files: list[str], latest: int) -> dict[str, datetime]:
    """Each of `files` (data files of `links`, as Spark names them) -> the time of the commit that added it, read from
    the table's Delta log from commit `latest` backwards until every file is found (parse commits just before update,
    so a few commits are read). A file whose commit is no longer in the log (cleaned up after a checkpoint) is left
    out."""
    from jobs.storage import Storage

    by_name = {file.rsplit("/", 1)[-1]: file for file in files}
    storage, log = Storage.from_conf(conf), layout.join(tables.table_path(root, "links"), "_delta_log")
    found: dict[str, datetime] = {}
    for version in range(latest, -1, -1):
        commit = layout.join(log, f"{version:020d}.json")
        if len(found) == len(by_name) or not storage.exists(commit):
            break
        with storage.open_input(commit) as handle:
            actions = [json.loads(line) for line in handle.read().decode("utf-8").splitlines() if line.strip()]
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        millis = info.get("inCommitTimestamp", info.get("timestamp"))
        for action in actions:
            file = by_name.get(unquote(action.get("add", {}).get("path", "")).rsplit("/", 1)[-1])
            if file is not None and millis is not None and file not in found:
                found[file] = datetime.fromtimestamp(millis / 1000, UTC)
    return found


def record(spark: SparkSession, root: str, figures: dict[str, Any]) -> None:
    """Append a step run's row unless its (segment_id, step) was written before (an idempotent Delta write)."""
    schema = tables.TABLES["cycle_metrics"].schema
    row = spark.createDataFrame([tuple(figures.get(name) for name in schema.names)], schema)
    (row.write.format("delta").mode("append")
     .option("txnAppId", f"cycle_metrics:{figures['segment_id']}:{figures['step']}").option("txnVersion", 0)
     .save(tables.table_path(root, "cycle_metrics")))


def _last_row(spark: SparkSession, root: str, step: MetricsStep) -> Row | None:
    """The latest row of `step` (None before any). One row per step run: a small table, read on the small-input
    plan."""
    with session_settings(spark, SMALL_INPUT):
        rows = (tables.table_df(spark, root, "cycle_metrics").where(F.col("step") == step.value)
                .orderBy(F.desc("run_at")).limit(1).collect())
    return rows[0] if rows else None


def update_signals(spark: SparkSession, root: str) -> tuple[float | None, float | None]:
    """The last update's (change rate of refetched pages, new URLs per result): what the adaptive refresh share
    moves by (crawler.frontier.RefreshShare); (None, None) before any update."""
    row = _last_row(spark, root, MetricsStep.UPDATE)
    if row is None or not row["results"]:
        return None, None
    return row["change_rate"], (row["new_urls"] or 0) / row["results"]


def last_due_urls(spark: SparkSession, root: str) -> int | None:
    """The due URLs the last generate found (None before any): what the next generate will read about as many of,
    known before it reads `urls` (jobs.base.sized_to_input)."""
    row = _last_row(spark, root, MetricsStep.GENERATE)
    return int(row["due_urls"]) if row is not None and row["due_urls"] is not None else None


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
