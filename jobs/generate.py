"""generate: due URLs -> a host-bucketed, priority-ordered fetch list, then lease them (docs/architecture.md#data-flow).

Due = next_fetch_at <= now, no live lease (or a lease by this very segment: a re-run), host not backing off
(crawler.politeness.is_backing_off), not denied by the robots.txt rules stored for its host while they are in force
(crawler.robots.rules_in_force: an expired, missing or unreachable robots.txt is the daemon's to fetch and decide).
Rank per host by score (priority + age boost), cut per host at min(per_host_max_urls, segment_seconds /
delay) — one probe URL for a dead host (crawler.politeness.is_dead) — then per registered domain at its budget
(crawler.frontier.DomainBudgets and domain_cap, when configured: per segment, and what the domain's daily budget has
left; round-robin over the domain's hosts), then keep the lowest ranks across hosts up to the segment budget
(round-robin over hosts), each cut after the per-host one in crawler.frontier.segment_order; with
`generate.budget_split`, revisits and never-fetched URLs each take their share of it (`generate.refresh_share`,
crawler.frontier.RefreshShare and refresh_quota).
The fetch list goes to segments/<id>/fetchlist/bucket=NNNNN, each bucket's file sorted by rank then host, so
hosts are interleaved: a daemon streaming the list (fetch.max_queued_urls) keeps many hosts busy.
Leasing bumps state_version, so only a result carrying the new version can complete the URL. The frontier's
figures at this moment (backlog, oldest due URL, high-priority URLs left out) go to `cycle_metrics`.

Before any of that, backpressure (crawler.frontier.backpressure): no new segment while an earlier one has
finished fetching without being merged, or while more than generate.max_unmerged_segments are still open; the
refusal is `crawler.errors.Backpressure` (a `TryLater`: exit 75), which the DAG turns into a skipped run. Before
backpressure, the quality gate (crawler.gate): no new segment while a table failed its validation and has not passed
one since (`crawler.errors.GateClosed`, exit 4, naming the table and expectation), unless the operator overrides it
for this run (`override_gate`: the reason, recorded in the segment's `cycle_metrics` row).

The whole job holds the crawl's writer lock (crawler.writelock), so no other command rewrites `urls` or leases
meanwhile. The segment is published only once its leases are committed: its folder carries `_GENERATING.json`
(crawler.layout) from before the fetch list is written until after the lease commit, and every reader takes a
marked segment for absent; a lease that fails removes the folder, and the next generate removes any left by one
that crashed.

The whole job reads `urls` and `hosts` at one pinned Delta version, so every evaluation of the selection
(counts, fetch list, lease) sees the same rows; a re-run for the same segment selects the same URLs, keeps the
fetch list its first run published (or writes it, if that run never published it) and changes no table.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from crawler import gate as crawler_gate
from crawler import layout
from crawler.config import Config
from crawler.errors import Backpressure, UserError
from crawler.frontier import (
    DomainBudgets,
    RefreshShare,
    backpressure,
    domain_cap_sql,
    host_order_sql,
    per_host_cap_sql,
    refresh_quota_sql,
    score_sql,
    segment_order_sql,
    spends_the_day_sql,
)
from crawler.leases import due_from_sql, is_due_sql, leased_version_sql
from crawler.payloads import record_segment_sql, reference_in_force_sql
from crawler.politeness import PolitenessRules, is_backing_off_sql
from crawler.records import FETCHLIST_ROBOTS, FETCHLIST_STORED
from crawler.robots import allowed_by_stored_rules, handed_over_sql, rules_in_force_sql
from crawler.service_levels import due_since_sql, is_eligible_sql, is_high_priority_sql
from crawler.status import FINISHED_SEGMENT_STATES, SegmentState
from crawler.writelock import holder
from delta_tables import tables
from jobs import cycle_metrics, gate
from jobs.base import check_bucketing, merge_counts, pinned_table, sized_to_input, step, table_turn
from jobs.storage import Storage
from jobs.writelock import HeldLock, writer_lock

log = logging.getLogger("jobs.generate")


@dataclass
class GenerateResult:
    segment_id: str
    url_count: int = 0
    host_count: int = 0
    buckets: list[int] = field(default_factory=list)
    refresh_count: int = 0     # URLs fetched before (revisits); the others were never fetched
    refresh_share: float = 0.0  # with generate.budget_split: the share revisits were given (frontier.RefreshShare)
    # When nothing was due: the `urls` version read, and the first moment a URL comes due unless that version changes
    # (crawler.leases.due_from; None: no URL comes due by time alone). What `crawl run` waits on between merges.
    urls_version: int | None = None
    next_due_at: datetime | None = None
    gate_override: str | None = None  # the operator's reason for generating while the quality gate was closed

    @property
    def empty(self) -> bool:
        """Nothing was due: no fetch list and no segment rows were written."""
        return self.url_count == 0

    def summary(self) -> str:
        return (f"{self.url_count} URLs from {self.host_count} hosts in {len(self.buckets)} buckets "
                f"({self.refresh_count} revisits, {self.url_count - self.refresh_count} never fetched)")


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime (a naive one is taken as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def default_segment_id(now: datetime) -> str:
    return as_utc(now).strftime("seg-%Y%m%dT%H%M%SZ")


def segment_order() -> Column:
    """The sort key of the ranked rows (`crawler.frontier.segment_order`): every cut after the per-host one takes
    the lowest first."""
    return F.expr(segment_order_sql("rank", "score", "url_id"))


def within_budget(ranked: DataFrame, budget: int, share: float) -> DataFrame:
    """The segment's rows among `ranked` (per-host caps applied): revisits (`last_fetch_at` set) and URLs never
    fetched each in `segment_order`, as many of each as `crawler.frontier.refresh_quota` gives them.
    Each side is cut to the budget first, so what the quota is counted over stays small."""
    order = segment_order()
    known = F.col("last_fetch_at").isNotNull()
    top = (ranked.where(known).orderBy(order).limit(budget).withColumn("is_refresh", F.lit(True))
           .unionByName(ranked.where(~known).orderBy(order).limit(budget).withColumn("is_refresh", F.lit(False))))
    counts = top.agg(F.count(F.when(F.col("is_refresh"), 1)).alias("n_refresh"),
                     F.count(F.when(~F.col("is_refresh"), 1)).alias("n_discovery"))
    refresh_quota, discovery_quota = refresh_quota_sql(budget, share, "n_refresh", "n_discovery")
    return (
        top.withColumn("kind_index", F.row_number().over(Window.partitionBy("is_refresh").orderBy(order)))
        .crossJoin(counts)
        .where(F.col("kind_index") <= F.when(F.col("is_refresh"), F.expr(refresh_quota))
               .otherwise(F.expr(discovery_quota)))
    )


def next_due(spark: SparkSession, root: str) -> tuple[int, datetime | None]:
    """(the current `urls` version, the first moment one of its URLs comes due: crawler.leases.due_from's minimum).
    One aggregate over the whole table (a due time can be in any file), run only when nothing is due."""
    version = tables.table_version(spark, root, "urls")
    first = (pinned_table(spark, root, "urls", version)
             .agg(F.min(F.expr(due_from_sql())).alias("due_from")).first()["due_from"])
    return version, None if first is None else as_utc(first)


def due_urls(spark: SparkSession, root: str, segment_id: str, now: datetime) -> DataFrame:
    """The `urls` rows due at `now` (crawler.leases.is_due), with `gen_now`: what select_due ranks and the frontier
    figures count, read once."""
    return pinned_table(spark, root, "urls").withColumn("gen_now", F.lit(now)).where(is_due_sql("gen_now", segment_id))


def select_due(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime,
               refresh_share: float, due: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """From the `due` URLs (due_urls): the due URLs generate may take, ranked per host and cached (the caller
    unpersists it), from which both others are read; the due high-priority URLs that were eligible
    (crawler.service_levels.is_eligible: a host without a row is ok), taken or not, with when each fell due (url_id,
    due_at): what cycle_metrics measures the lease level on; and the fetch-list rows of this segment (FETCHLIST
    columns + bucket int + old_state_version + the host's registered domain), set-based."""
    now_col = F.lit(now)
    rules_in_force = F.expr(rules_in_force_sql("robots_state", "robots_expires_at", "gen_now"))
    politeness = PolitenessRules.from_config(conf)
    hosts = pinned_table(spark, root, "hosts").withColumn("gen_now", now_col).select(
        "host_key",
        F.col("crawl_delay_s").alias("h_crawl_delay_s"),
        F.col("min_delay_s").alias("h_min_delay_s"),
        F.col("max_concurrency").alias("h_max_concurrency"),
        F.col("backoff_until").alias("h_backoff_until"),
        F.when(rules_in_force, F.col("robots_body")).alias("h_robots_rules"),
        F.expr(handed_over_sql("robots_status_code", "robots_body", "robots_fetched_at", "robots_expires_at",
                               "robots_good_status_code", "robots_good_at", "gen_now")).alias("h_robots"),
        F.expr(politeness.is_dead_sql("failing_since", "gen_now")).alias("h_dead"),
        F.col("domain").alias("h_domain"),
        F.expr(politeness.host_state_sql("robots_state", "backoff_until", "failing_since", "gen_now")).alias("h_state"),
    )
    token, max_bytes = conf.crawl.robots_token, conf.robots.max_bytes

    @F.udf("boolean")
    def robots_allow(robots_txt, url):
        return allowed_by_stored_rules(robots_txt, token, max_bytes, url)

    delay = politeness.host_delay_sql("h_crawl_delay_s", "h_min_delay_s")
    candidates = due.join(hosts, "host_key", "left").where(~F.expr(is_backing_off_sql("h_backoff_until", "gen_now")))
    # A Python UDF runs on every row it sees, whatever a surrounding condition says: only rows of hosts with
    # rules in force go through it.
    has_rules = F.col("h_robots_rules").isNotNull()
    allowed = candidates.where(~has_rules).unionByName(
        candidates.where(has_rules).where(robots_allow("h_robots_rules", "url")))
    ranked = (
        allowed
        .withColumn("h_domain", F.coalesce("h_domain", "host_key"))  # no row, or one older than hosts.domain: its own
        .withColumn("delay_s", F.expr(delay))
        .withColumn("host_cap", F.expr(per_host_cap_sql(conf.generate.per_host_max_urls,
                                                        conf.generate.segment_seconds, "delay_s",
                                                        "coalesce(h_dead, false)")))
        .withColumn("score", F.expr(score_sql("priority", "next_fetch_at", "gen_now",
                                              conf.generate.age_boost_per_day)))
        .withColumn("rank", F.row_number().over(
            Window.partitionBy("host_key").orderBy(F.expr(host_order_sql("score", "url_id")))))
    ).persist()  # read twice: the fetch list's rows and the lease level's eligible ones (joined and ranked once)
    eligible_high = ranked.where(
        F.expr(is_eligible_sql("coalesce(h_state, 'ok')", "rank - 1", "host_cap"))
        & F.expr(is_high_priority_sql("priority", conf.generate.high_priority))
    ).select("url_id", F.expr(due_since_sql("next_fetch_at", "discovered_at")).alias("due_at"))
    capped = ranked.where(F.col("rank") <= F.col("host_cap"))
    per_segment, per_day = DomainBudgets.per_segment(conf), DomainBudgets.per_day(conf)
    if per_segment.active or per_day.active:  # round-robin over a domain's hosts: every host's first URL first
        spent = "cast(0 as bigint)"
        if per_day.active:
            capped = capped.join(spent_today(pinned_table(spark, root, "urls"), hosts, segment_id, now), "h_domain",
                                 "left")
            spent = "coalesce(spent_today, 0L)"
        capped = (
            capped.withColumn("domain_cap", F.expr(domain_cap_sql(per_segment.cap_sql("h_domain"),
                                                                  per_day.cap_sql("h_domain"), spent)))
            .withColumn("domain_rank", F.row_number().over(
                Window.partitionBy("h_domain").orderBy(segment_order())))
            .where(F.col("domain_cap").isNull() | (F.col("domain_rank") <= F.col("domain_cap")))
        )
    budget = conf.generate.segment_max_urls
    chosen = (within_budget(capped, budget, refresh_share) if conf.generate.budget_split
              else capped.orderBy(segment_order()).limit(budget))
    chosen = with_stored_payload(spark, chosen, present_segments(conf, root))
    # The host's stored robots.txt rides on its first row in the list (records.FETCHLIST): the cuts above may have
    # left out its rank 1.
    first_of_host = F.col("rank") == F.min("rank").over(Window.partitionBy("host_key"))
    handed_over = [F.when(first_of_host, F.col(f"h_robots.{name}")).alias(name) for name in FETCHLIST_ROBOTS]
    return ranked, eligible_high, chosen.select(
        F.lit(segment_id).alias("segment_id"),
        "url_id",
        "url",
        "host_key",
        F.expr(leased_version_sql(segment_id)).alias("state_version"),
        F.col("rank").cast("int").alias("rank"),
        "priority",
        "depth",
        "etag",
        "last_modified",
        "delay_s",
        F.col("h_max_concurrency").alias("max_concurrency"),
        "last_fetch_at",
        "sitemap_origin",
        *handed_over,
        *FETCHLIST_STORED,
        "bucket",
        F.col("state_version").alias("old_state_version"),
        F.col("h_domain").alias("domain"),
    )


def present_segments(conf: Config, root: str) -> list[str]:
    """The segments whose folders are under the root now (one listing): where stored records can still be."""
    return layout.segment_ids(Storage.from_conf(conf).list_folders(layout.segments_dir(root)))


def with_stored_payload(spark: SparkSession, chosen: DataFrame, present: list[str]) -> DataFrame:
    """The chosen rows with the stored payload each hands to the daemon (records.FETCHLIST_STORED): the URL's,
    while its record's segment is among the `present` ones (crawler.payloads.reference_in_force), else none."""
    segments = F.broadcast(spark.createDataFrame([(s,) for s in present], "p_segment string"))
    joined = chosen.join(segments, F.expr(record_segment_sql("stored_warc_filename")) == F.col("p_segment"), "left")
    in_force = F.expr(reference_in_force_sql("p_segment"))
    return joined.select(
        *[c for c in chosen.columns if c not in FETCHLIST_STORED],
        *[F.when(in_force, F.col(name)).alias(name) for name in FETCHLIST_STORED],
    )


def spent_today(urls: DataFrame, hosts: DataFrame, segment_id: str, now: datetime) -> DataFrame:
    """(h_domain, spent_today): per registered domain, the URLs that spent its daily budget so far
    (crawler.frontier.spends_the_day), counted per host and then per domain (a host without a row or a domain is its
    own)."""
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    per_host = (urls.withColumn("gen_now", F.lit(now)).withColumn("day_start", F.lit(day_start))
                .where(spends_the_day_sql("day_start", "gen_now", segment_id))
                .groupBy("host_key").agg(F.count("*").alias("spent")))
    return (per_host.join(hosts.select("host_key", "h_domain"), "host_key", "left")
            .groupBy(F.coalesce("h_domain", "host_key").alias("h_domain"))
            .agg(F.sum("spent").alias("spent_today")))


def write_fetchlist(selected: DataFrame, path: str) -> None:
    """One directory per bucket (bucket=NNNNN), its rows sorted by rank then host: every host's first URL, then
    every host's second... (a host's own rows stay in rank order)."""
    from crawler.records import FETCHLIST, FETCHLIST_ROW_GROUP_BYTES

    columns = [name for name in FETCHLIST.names]
    (
        selected.select(*columns, F.format_string("%05d", "bucket").alias("bucket"))
        .repartition("bucket")
        .sortWithinPartitions("bucket", "rank", "host_key")
        .write.mode("overwrite")
        .option("parquet.block.size", FETCHLIST_ROW_GROUP_BYTES)
        .partitionBy("bucket")
        .parquet(path)
    )


def lease(spark: SparkSession, root: str, selected: DataFrame, segment_id: str, now: datetime, lease_s: int) -> int:
    """Bump state_version and lease each selected URL to this segment; rows already leased here are skipped."""
    from delta.tables import DeltaTable

    t, s = F.col, F.col
    condition = (
        (t("t.bucket") == s("s.bucket"))
        & (t("t.next_fetch_at") <= F.lit(now))  # true of every selected row; Delta skips the files holding none
        & (t("t.url_id") == s("s.url_id"))
        & (t("t.url") == s("s.url"))
        & (t("t.state_version") == s("s.old_state_version"))
        & ~t("t.lease_segment").eqNullSafe(F.lit(segment_id))
    )
    metrics = (
        DeltaTable.forPath(spark, tables.table_path(root, "urls"))
        .alias("t")
        .merge(selected.alias("s"), condition)
        .whenMatchedUpdate(set={
            "state_version": F.col("s.state_version"),
            "lease_segment": F.lit(segment_id),
            "lease_expires_at": F.lit(now + timedelta(seconds=lease_s)),
            "updated_at": F.lit(now),
        })
        .execute()
    )
    return merge_counts(metrics).get("num_updated_rows", 0)


def record_segment(spark: SparkSession, root: str, segment_id: str, per_bucket: list, now: datetime) -> None:
    """One `segments` row per bucket, state generated: an append (a MERGE would join against every segment's rows),
    made idempotent by Delta's writer transaction (txnAppId generate:<segment>), so a re-run whose first run
    committed it writes nothing. Called only when the segment has no rows yet (`run`)."""
    state = SegmentState.GENERATED.value
    rows = [(segment_id, r["bucket"], state, r["url_count"], r["host_count"]) for r in per_bucket]
    counts = spark.createDataFrame(rows, "segment_id string, bucket int, state string, url_count bigint, "
                                         "host_count bigint")
    source = tables.conform(
        counts.select(
            "*",
            F.lit(None).alias("owner"),
            F.lit(0).alias("epoch"),
            *[F.lit(None).alias(c) for c in ("results", "applied", "stale", "discovered", "counters")],
            F.lit(now).alias("created_at"),
            F.lit(now).alias("updated_at"),
            F.lit(None).alias("wet_files"),
            F.lit(None).alias("wet_records"),
        ),
        "segments",
    )
    with table_turn(root, "segments"):
        (source.write.format("delta").mode("append").option("txnAppId", f"generate:{segment_id}")
         .option("txnVersion", 0).save(tables.table_path(root, "segments")))


def segment_states(spark: SparkSession, root: str, segment_id: str) -> tuple[set[str], list[str], set[str]]:
    """(this segment's bucket states, the other segments with a bucket neither merged nor closed, every segment
    with rows): one small read of `segments` for all of generate's checks and remove_unpublished."""
    rows = tables.table_df(spark, root, "segments").groupBy("segment_id").agg(
        F.collect_set("state").alias("states"))
    own, others, recorded = set(), set(), set()
    for row in rows.collect():
        recorded.add(row["segment_id"])
        if row["segment_id"] == segment_id:
            own.update(row["states"])
        elif set(row["states"]) - set(FINISHED_SEGMENT_STATES):
            others.add(row["segment_id"])
    return own, sorted(others), recorded


def unmerged_segments(conf: Config, root: str, open_ids: list[str]) -> dict[str, bool]:
    """Each open segment -> whether its fetch is over (`fetchd.progress.SegmentProgress.fetch_over`, a folder
    listing per segment)."""
    from fetchd.progress import segment_progress

    return {open_id: segment_progress(root, open_id, conf).fetch_over for open_id in open_ids}


def run(spark: SparkSession, conf: Config, root: str, segment_id: str | None = None,
        now: datetime | None = None, merging: frozenset[str] = frozenset(),
        override_gate: str | None = None) -> GenerateResult:
    """Select, write and lease the next segment's fetch list, holding the crawl's writer lock (crawler.writelock:
    no other generate, rebucket, update, inject or dedup commit runs meanwhile). `merging`: the segments the caller
    is merging itself (`crawl run`), which backpressure does not take for stalled. `override_gate`: the operator's
    reason for going through a closed quality gate (crawler.gate) this once."""
    now = as_utc(now or datetime.now(UTC))
    segment_id = layout.check_segment_id(segment_id or default_segment_id(now))
    tables.ensure_tables(spark, root)
    # Its work follows the due URLs it reads: sized by as many as the last generate found.
    with writer_lock(conf, root, "generate") as lock, sized_to_input(
            spark, conf, lambda: cycle_metrics.last_due_urls(spark, root)):
        return _generate(spark, conf, root, segment_id, now, lock, merging, override_gate)


def _generate(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime,
              lock: HeldLock, merging: frozenset[str], override_gate: str | None) -> GenerateResult:
    # Asked again under the lock: a rebucket this generate waited for may have changed the crawl's bucketing.
    check_bucketing(conf, root, record=False)
    storage = Storage.from_conf(conf)
    result = GenerateResult(segment_id, gate_override=crawler_gate.check(gate.read(storage, root), override_gate))
    if result.gate_override is not None:
        log.warning("generate %s: the quality gate is closed and overridden: %s", segment_id, result.gate_override)
    own_states, open_ids, recorded = segment_states(spark, root, segment_id)
    if own_states - {SegmentState.GENERATED.value}:
        raise UserError(f"segment {segment_id} is past the generated state; generate a new segment instead")
    refusal = backpressure(unmerged_segments(conf, root, open_ids), conf.generate.max_unmerged_segments, merging)
    if refusal:
        log.warning("generate %s refused: %s", segment_id, refusal)
        raise Backpressure(f"no new segment: {refusal}")
    remove_unpublished(storage, root, recorded)
    # The due URLs are read once, for the selection, its second look at the eligible ones, and the figures.
    due = due_urls(spark, root, segment_id, now).persist()
    try:
        if due.isEmpty():  # an idle round (`crawl run` between merges): no selection planned or run
            result.urls_version, result.next_due_at = next_due(spark, root)
            return _nothing_due(result, now)
        return _select_and_lease(spark, conf, root, segment_id, now, lock, due, own_states, open_ids, result)
    finally:
        due.unpersist()


def _nothing_due(result: GenerateResult, now: datetime) -> GenerateResult:
    """No URL to list (none due, or none the selection may take): no fetch list, lease or row is written."""
    upcoming = "" if result.next_due_at is None else f" (the next URL comes due at {result.next_due_at.isoformat()})"
    log.info("generate %s: nothing due at %s; no segment written%s", result.segment_id, now.isoformat(), upcoming)
    return result


def _select_and_lease(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime, lock: HeldLock,
                      due: DataFrame, own_states: set[str], open_ids: list[str],
                      result: GenerateResult) -> GenerateResult:
    with step(f"generate {segment_id}: select"):
        # At most segment_max_urls rows, read three times (counts, fetch list, lease): select once.
        share = RefreshShare.from_config(conf)
        if conf.generate.budget_split:
            result.refresh_share = share.current(*cycle_metrics.update_signals(spark, root)) if share.adaptive \
                else share.share
        ranked, eligible_high, selected = select_due(spark, conf, root, segment_id, now, result.refresh_share, due)
        selected = selected.persist()
        per_bucket = (
            selected.groupBy("bucket")
            .agg(F.count("*").alias("url_count"), F.countDistinct("host_key").alias("host_count"),
                 F.count("last_fetch_at").alias("refresh_count"),
                 cycle_metrics.high_priority_count(conf).alias("high_priority_count"))
            .orderBy("bucket")
            .collect()
        )
    try:
        return _write_and_lease(spark, conf, root, segment_id, now, lock, due, eligible_high, selected, per_bucket,
                                own_states, open_ids, result)
    finally:
        selected.unpersist()
        ranked.unpersist()


def _write_and_lease(spark: SparkSession, conf: Config, root: str, segment_id: str, now: datetime, lock: HeldLock,
                     due: DataFrame, eligible_high: DataFrame, selected: DataFrame, per_bucket: list,
                     own_states: set[str], open_ids: list[str], result: GenerateResult) -> GenerateResult:
    """Publish the selection (`selected`, counted in `per_bucket`) as the segment's fetch list, its frontier figures
    and its leases, then its `segments` rows."""
    storage = Storage.from_conf(conf)
    if not per_bucket:
        return _nothing_due(result, now)
    # A re-run finds its first run's fetch list published (the same rows: the selection of a segment is
    # stable) and leaves it alone under the daemons that may be reading it.
    published = storage.exists(layout.fetchlist_dir(root, segment_id))
    try:
        if not published:
            with step(f"generate {segment_id}: write fetch list"):
                storage.write_bytes(layout.generating_marker(root, segment_id), json.dumps(
                    {"segment_id": segment_id, "generate": holder(lock.record)}).encode("utf-8"))
                write_fetchlist(selected, layout.fetchlist_dir(root, segment_id))
        with step(f"generate {segment_id}: frontier figures"):
            figures = cycle_metrics.generate_figures(spark, conf, root, segment_id, now, due, selected, per_bucket,
                                                     eligible_high, len(open_ids))
            figures["gate_override"] = result.gate_override
        with step(f"generate {segment_id}: lease"):
            lock.check(f"leasing segment {segment_id}")
            leased = lease(spark, root, selected, segment_id, now, conf.generate.lease_seconds)
    except BaseException:
        if not published:  # nothing leased (the lease is one commit): nothing of the segment may stay
            storage.delete_folder(layout.segment_dir(root, segment_id))
        raise
    storage.delete_file(layout.generating_marker(root, segment_id))  # published: its leases are committed
    if not own_states:  # a re-run finds the rows its first run wrote (all buckets in one commit)
        record_segment(spark, root, segment_id, per_bucket, now)
    cycle_metrics.record(spark, root, figures)
    result.url_count = sum(r["url_count"] for r in per_bucket)
    result.host_count = sum(r["host_count"] for r in per_bucket)
    result.buckets = [r["bucket"] for r in per_bucket]
    result.refresh_count = sum(r["refresh_count"] for r in per_bucket)
    split = f", refresh share {result.refresh_share:.2f}" if conf.generate.budget_split else ""
    log.info("generate %s: %s%s (%d newly leased)", segment_id, result.summary(), split, leased)
    return result


def remove_unpublished(storage: Storage, root: str, recorded: set[str]) -> None:
    """Remove what a generate that crashed or lost left: segment folders still marked `_GENERATING.json`. Only
    folders of segments without `segments` rows (`recorded`: those with rows) can be (rows are written after the
    publication), so only those are looked at. Safe under the writer lock: no other generate is writing one."""
    for segment_id in layout.segment_ids(storage.list_folders(layout.segments_dir(root))):
        if segment_id not in recorded and storage.exists(layout.generating_marker(root, segment_id)):
            log.warning("generate: removing segment %s, left unpublished by a generate that did not finish",
                        segment_id)
            storage.delete_folder(layout.segment_dir(root, segment_id))


def run_command(spark: SparkSession, conf: Config, root: str, segment: str | None, now: datetime | None,
                override_gate: str | None) -> int:
    """`crawl generate`: the new segment's id (the next steps need it) and what it holds."""
    result = run(spark, conf, root, segment_id=segment, now=now, override_gate=override_gate)
    print(f"generate: segment {result.segment_id}: {result.summary()}")
    return 0
