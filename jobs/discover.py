"""discover: the URLs a segment's fetches found, and what they change in `urls` and `hosts` (update's
discovery half, docs/architecture.md#data-flow).

Candidates are the segment's outlinks (not rel=nofollow), redirect targets, sitemap entries and child sitemaps
(from `links`) and the `Sitemap:` lines of the robots.txt files it fetched. A link to a URL the crawl knows keeps
the keys of its `urls` row (parse keyed the link already); every other target is keyed and judged by scope and the
per-URL trap rules once (crawler.frontier.classify_discovery), then by depth (crawler.scope.Scope.
depth_reject_reason), the per-template and per-host caps on new URLs per cycle and the host's allowance under the
known-URL cap (crawler.traps.capped_reasons).

Nothing here commits: update runs each MERGE with discover's part beside its own, so a segment's update stays
six commits. In the `urls` MERGE new URLs are inserted and known ones get inlinks, a lower depth and a sitemap
origin (guarded by urls.inlink_segment); in the `hosts` MERGE accepted URLs add to `known_urls`, rejected ones
to `trap_rejections`/`trap_sample` (guarded by hosts.discovery_segment), and hosts of new URLs get a row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from crawler.bucketing import Bucketing
from crawler.config import Config
from crawler.frontier import (
    classify_discovery,
    discovery_depth_sql,
    discovery_priority,
    discovery_priority_sql,
    listed_by_sitemap_sql,
)
from crawler.payloads import STORED_COLUMNS
from crawler.scope import Scope
from crawler.sitemaps import SITEMAP_FILE_PRIORITY, ChangeFreq, SitemapEntry, robots_sitemaps
from crawler.status import FetchOutcome, UrlSource, UrlStatus
from crawler.traps import TrapRules, capped_reasons_sql, new_url_allowance_sql
from delta_tables import tables
from jobs.base import step

log = logging.getLogger("jobs.discover")

TRAP_SAMPLE_SIZE = 5  # rejected URLs kept per host in hosts.trap_sample
CLASSIFIED = "url string, url_id string, host_key string, bucket int, domain string, template string, reason string"
CLASSIFIED_STRUCT = "struct<" + ", ".join(field.replace(" ", ":") for field in CLASSIFIED.split(", ")) + ">"


@dataclass(frozen=True)
class Discoveries:
    """What update's MERGEs and its `segments` counts take of this segment's discoveries."""

    targets: DataFrame          # discovery_targets, cached while the MERGEs read it
    fresh: DataFrame            # the targets not in `urls` before this segment, accepted or rejected
    accepted: dict[int, int]    # new URLs per bucket of the parents that found them (segments.discovered)


@dataclass(frozen=True)
class MergePart:
    """Discover's share of a MERGE that update runs (`s` the source, `t` the table): the source rows it inserts,
    the matched rows it updates, the columns it sets on a matched row (each keeping its value where `updates` is
    false, so they sit beside update's own) and the columns of an inserted row."""

    inserts: Column
    updates: Column
    set: dict[str, Column]
    values: dict[str, Column]

    @classmethod
    def guarded(cls, inserts: Column, updates: Column, changes: dict[str, Column],
                values: dict[str, Column]) -> MergePart:
        return cls(inserts, updates, {c: F.when(updates, v).otherwise(F.col(f"t.{c}")) for c, v in changes.items()},
                   values)


@contextmanager
def discoveries(conf: Config, segment_id: str, results: DataFrame, links: DataFrame, urls_snap: DataFrame,
                hosts_snap: DataFrame, robots: DataFrame) -> Iterator[Discoveries]:
    """This segment's discovery targets, counted per parent bucket, cached for the MERGEs of the `with` block."""
    targets: DataFrame | None = None
    try:
        with step(f"update {segment_id}: discoveries"):
            targets = discovery_targets(conf, segment_id, results, links, urls_snap, hosts_snap, robots).persist(
                StorageLevel.MEMORY_AND_DISK)  # the classifying UDF runs once
            fresh = targets.where(~F.col("known"))  # includes rows a crashed earlier run of this update stored
            tally = {r["parent_bucket"]: r for r in fresh.groupBy("parent_bucket").agg(
                F.count(F.when(F.col("reason").isNull(), 1)).alias("accepted"),
                F.count(F.when(F.col("reason").isNotNull(), 1)).alias("rejected")).collect()}
        accepted = {b: r["accepted"] for b, r in tally.items() if r["accepted"]}
        log.info("update %s: %d discovered URLs (new), %d rejected by scope and trap rules", segment_id,
                 sum(accepted.values()), sum(r["rejected"] for r in tally.values()))
        yield Discoveries(targets, fresh, accepted)
    finally:
        if targets is not None:
            targets.unpersist()


def discovery_targets(conf: Config, segment_id: str, results: DataFrame, links: DataFrame, urls_snap: DataFrame,
                      hosts_snap: DataFrame, robots: DataFrame) -> DataFrame:
    """Outlinks, redirect targets, sitemap entries and robots.txt `Sitemap:` URLs of this segment, one row per
    target (_classified_targets): what url_rows stores and discovery_tally counts.

    A new URL is inserted with discovered_at = next_fetch_at = the parent's fetch time, and depth and priority
    by how it was found (crawler.sitemaps for the sitemap rules): a link or redirect target gets depth =
    parent depth + 1 and priority = parent priority * DISCOVERY_PRIORITY_FACTOR; a URL a sitemap lists gets the
    sitemap's depth and `first_schedule` of its entry; a sitemap file (a child of an index, or listed in
    robots.txt at depth 0) gets SITEMAP_FILE_PRIORITY and `sitemap_origin`. Several parents: the smallest depth
    and the best priority, so a re-run computes identical rows. A known URL gets `inlinks` += distinct pages
    linking to it in this segment and its depth lowered if a shallower path appeared, once per segment (guarded
    by urls.inlink_segment); a known page found to be a sitemap gains its `sitemap_origin`. URLs that scope or
    trap rules reject are not stored: they are counted per host and reason in `hosts`, and accepted ones add to
    `hosts.known_urls` (guarded by hosts.discovery_segment)."""
    parents = results.select(
        F.col("url_id").alias("from_url_id"), F.col("state_version").alias("from_state_version"),
        F.col("url").alias("from_url"), "fetched_at", F.col("bucket").alias("parent_bucket"), "outcome",
        "redirect_to", F.col("sitemap_origin").alias("parent_origin"),
    )
    link_columns = ["from_url_id", "from_state_version", "to_url", "to_url_id", "sitemap_lastmod",
                    "sitemap_changefreq", "sitemap_priority", "sitemap_origin"]
    from_links = links.where(~F.col("rel_nofollow")).select(link_columns).join(
        parents, ["from_url_id", "from_state_version"]).withColumn("source", F.when(
            F.col("parent_origin").isNotNull(), UrlSource.SITEMAP.value).otherwise(UrlSource.LINK.value))
    from_redirects = parents.where(
        (F.col("outcome") == FetchOutcome.REDIRECT.value) & F.col("redirect_to").isNotNull()
    ).withColumn("to_url", F.col("redirect_to")).withColumn("source", F.lit(UrlSource.REDIRECT.value))
    for name, kind in zip(link_columns[3:], ("string", "timestamp", "string", "double", "string"), strict=True):
        from_redirects = from_redirects.withColumn(name, F.lit(None).cast(kind))
    # A redirected sitemap is still a sitemap: its target keeps the origin.
    from_redirects = from_redirects.withColumn("sitemap_origin", F.col("parent_origin"))
    columns = ["to_url", "from_url_id", "from_url", "fetched_at", "parent_bucket", "source", *link_columns[3:]]
    # The parents' rows only (a segment's worth, joined by broadcast), so the candidates are never shuffled
    # against the whole of `urls`.
    parent_state = urls_snap.select(
        F.col("url_id").alias("from_url_id"), F.col("url").alias("from_url"), F.col("depth").alias("parent_depth"),
        F.col("priority").alias("parent_priority"),
    ).join(F.broadcast(parents.select("from_url_id").distinct()), "from_url_id").localCheckpoint()
    candidates = from_links.select(columns).unionByName(from_redirects.select(columns)).join(
        parent_state, ["from_url_id", "from_url"])
    candidates = _candidate_rank(candidates)
    if conf.sitemaps.from_robots:
        candidates = candidates.unionByName(_robots_sitemap_candidates(robots, conf.robots.max_bytes))

    return _classified_targets(conf, segment_id, candidates, urls_snap, hosts_snap)


def _candidate_rank(candidates: DataFrame) -> DataFrame:
    """Each candidate's own depth and priority (`cand_depth`, `cand_priority`) by how it was found
    (crawler.frontier.discovery_depth / discovery_priority; first_schedule as a UDF on the rows a sitemap listed
    as pages, only those)."""
    listed = F.expr(listed_by_sitemap_sql("source", "sitemap_origin"))

    @F.udf("double")
    def entry_priority(source, sitemap_origin, loc, lastmod, changefreq, priority, fetched_at):
        entry = SitemapEntry(loc, lastmod, ChangeFreq(changefreq) if changefreq else None, priority)
        return discovery_priority(source, sitemap_origin, None, entry, fetched_at)

    depth = discovery_depth_sql("source", "sitemap_origin", "parent_depth")
    ranked = candidates.withColumn("cand_depth", F.expr(depth))
    by_entry = ranked.where(listed).withColumn("cand_priority", entry_priority(
        "source", "sitemap_origin", "to_url", "sitemap_lastmod", "sitemap_changefreq", "sitemap_priority",
        "fetched_at"))
    others = ranked.where(~listed).withColumn("cand_priority", F.expr(
        discovery_priority_sql("sitemap_origin", "parent_priority")))
    return by_entry.unionByName(others)


def _robots_sitemap_candidates(robots: DataFrame, max_bytes: int) -> DataFrame:
    """The `Sitemap:` URLs of this segment's robots.txt observations as discovery candidates: depth 0,
    SITEMAP_FILE_PRIORITY, origin "robots" of the host (crawler.sitemaps.robots_sitemaps)."""

    @F.udf("array<struct<url:string, origin:string>>")
    def listed(host_key, body):
        return robots_sitemaps(host_key, body, max_bytes)

    nothing = [F.lit(None).cast(t).alias(c) for c, t in (
        ("from_url_id", "string"), ("from_url", "string"), ("to_url_id", "string"), ("sitemap_lastmod", "timestamp"),
        ("sitemap_changefreq", "string"), ("sitemap_priority", "double"), ("parent_priority", "double"))]
    return robots.where(F.col("robots_body").isNotNull()).select(
        F.explode(listed("host_key", "robots_body")).alias("s"), F.col("robots_fetched_at").alias("fetched_at"),
        F.col("r_bucket").alias("parent_bucket"),
    ).select(
        F.col("s.url").alias("to_url"), "fetched_at", "parent_bucket", F.lit(UrlSource.SITEMAP.value).alias("source"),
        F.col("s.origin").alias("sitemap_origin"), F.lit(0).alias("parent_depth"), F.lit(0).alias("cand_depth"),
        F.lit(SITEMAP_FILE_PRIORITY).alias("cand_priority"), *nothing,
    )


def _classified_targets(conf: Config, segment_id: str, candidates: DataFrame, urls_snap: DataFrame,
                        hosts_snap: DataFrame) -> DataFrame:
    """One row per link target with a canonical URL: its keys, `inlinks` (distinct linking pages other than
    itself), `known` (in `urls` before this segment) and `reason` null (stored) or the rule that rejects it.
    Known targets are never rejected and keep the keys of their `urls` row (_keyed_targets). New ones go through
    scope, the per-URL trap rules, depth, then the per-template and per-host caps on new URLs per cycle and the
    host's allowance under the known-URL cap.
    "Known" excludes rows this segment inserted (discovered_in = segment), so a re-run ranks the same set and
    keeps the same URLs; for the same reason the allowance adds back what this segment already counted."""
    scope, rules, bucketing = Scope.from_config(conf), TrapRules.from_config(conf), Bucketing.from_config(conf)

    @F.pandas_udf(CLASSIFIED)
    def classify(raw_urls: pd.Series) -> pd.DataFrame:
        # Arrow batches in and out (no per-row pickling); a URL with no keys gets a null `url`, dropped below.
        found = [classify_discovery(raw, scope, rules, bucketing) for raw in raw_urls]
        return pd.DataFrame({
            "url": [f and f.keys.url for f in found], "url_id": [f and f.keys.url_id for f in found],
            "host_key": [f and f.keys.host_key for f in found],
            "bucket": pd.array([f.keys.bucket if f else None for f in found], dtype="Int32"),
            "domain": [f and f.keys.domain for f in found],
            "template": [f and f.template for f in found], "reason": [f and f.reject_reason for f in found]})

    # Marked nondeterministic only so that the optimizer never moves a filter on its result below the filter that
    # chooses the rows it runs on: that would run it on every target, the known ones too.
    classify = classify.asNondeterministic()
    candidates = candidates.localCheckpoint()  # read twice: its distinct targets are keyed, then joined back
    targets = (
        candidates.join(_keyed_targets(segment_id, candidates, urls_snap, classify), "to_url")
        .groupBy("k.url_id", "k.url")
        .agg(
            # A target's keys and verdict are one URL's (a known one's domain, template and reason are null).
            *[F.max(f"k.{c}").alias(c) for c in ("host_key", "bucket", "domain", "template", "reason")],
            F.max("known").alias("known"),
            F.max("known_origin").alias("known_origin"),
            F.min("cand_depth").alias("depth"),
            F.max("cand_priority").alias("priority"),
            F.min("fetched_at").alias("discovered_at"),
            F.min("parent_bucket").alias("parent_bucket"),
            F.max((F.col("source") == UrlSource.REDIRECT.value).cast("int")).alias("via_redirect"),
            F.max((F.col("source") == UrlSource.SITEMAP.value).cast("int")).alias("via_sitemap"),
            F.min("sitemap_origin").alias("sitemap_origin"),
            F.countDistinct(F.when(F.col("from_url_id") != F.col("k.url_id"), F.col("from_url_id"))).alias(
                "inlinks"),
        )
        .withColumn("reason", F.when(F.col("known"), F.lit(None)).otherwise(F.coalesce(
            "reason", F.expr(scope.depth_reject_reason_sql("depth")))))
    )
    # What this segment already stored (a re-run after the tally merge) counts as not yet known.
    stored_here = urls_snap.where(F.col("discovered_in") == F.lit(segment_id)).groupBy("host_key").agg(
        F.count("*").alias("stored_here"))
    allowance = hosts_snap.select(
        "host_key", "known_urls", F.col("discovery_segment").eqNullSafe(F.lit(segment_id)).alias("tallied")
    ).join(stored_here, "host_key", "left").select(
        "host_key",
        F.expr(new_url_allowance_sql(
            "known_urls - case when tallied then coalesce(stored_here, 0L) else 0L end",
            rules.max_known_urls_per_host)).alias("allowance"),
    )
    targets = targets.join(allowance, "host_key", "left").withColumn(
        "allowance", F.coalesce("allowance", F.lit(rules.max_known_urls_per_host)))
    for capped in capped_reasons_sql(rules, "allowance"):
        targets = targets.withColumn("reason", F.expr(capped))
    return targets.drop("allowance")


def _keyed_targets(segment_id: str, candidates: DataFrame, urls_snap: DataFrame,
                   classify: Callable[[str], Column]) -> DataFrame:
    """One row per distinct raw target (`to_url`): `k` its keys and verdict (crawler.frontier.classify_discovery's
    fields), `known` (a `urls` row before this segment) and that row's `known_origin`; targets with no URL are left
    out. A link's target is keyed in parse already (links.to_url_id of the stored URL: crawler.scope), so a link to
    a URL the crawl knows takes its keys from its `urls` row and is never classified again; only targets not in
    `urls` and the targets parse did not key (redirects, robots.txt Sitemap: lines) run the classifying UDF. One
    join with `urls` serves both: the unkeyed targets are classified first and looked up by their keys."""
    distinct = candidates.groupBy("to_url").agg(F.max("to_url_id").alias("link_id"))
    unkeyed = distinct.where(F.col("link_id").isNull()).select("to_url", classify("to_url").alias("k")).where(
        F.col("k.url").isNotNull())
    lookup = distinct.where(F.col("link_id").isNotNull()).select(
        "to_url", F.col("link_id").alias("key_id"), F.col("to_url").alias("key_url"),
        F.lit(None).cast(CLASSIFIED_STRUCT).alias("k")).unionByName(
        unkeyed.select("to_url", F.col("k.url_id").alias("key_id"), F.col("k.url").alias("key_url"), "k"))
    # "Known" excludes rows this segment inserted, so a re-run ranks and caps the same new URLs again.
    in_table = urls_snap.where(~F.col("discovered_in").eqNullSafe(F.lit(segment_id))).select(
        F.col("url_id").alias("key_id"), F.col("url").alias("key_url"), "host_key", "bucket",
        F.col("sitemap_origin").alias("known_origin"), F.lit(True).alias("known"))
    looked_up = lookup.join(in_table, ["key_id", "key_url"], "left").withColumn(
        "known", F.coalesce("known", F.lit(False))).localCheckpoint()  # one join with `urls` for three branches
    nothing = F.lit(None).cast("string")
    from_table = looked_up.where("known").select(
        "to_url", F.struct(F.col("key_url").alias("url"), F.col("key_id").alias("url_id"), "host_key", "bucket",
                           nothing.alias("domain"), nothing.alias("template"), nothing.alias("reason")).alias("k"),
        "known", "known_origin")
    new_keyed = looked_up.where(~F.col("known") & F.col("k").isNotNull()).select("to_url", "k", "known",
                                                                                 "known_origin")
    new_links = looked_up.where(~F.col("known") & F.col("k").isNull()).select(
        "to_url", classify("to_url").alias("k"), "known", "known_origin").where(F.col("k.url").isNotNull())
    return from_table.unionByName(new_keyed).unionByName(new_links)


def discovery_tally(fresh: DataFrame) -> DataFrame:
    """Per host of this segment's new link targets (`fresh`): `accepted` URLs (and the host's `domain`, for its row
    if it gets one), `rejections` (reason -> count) and
    a `sample` of at most TRAP_SAMPLE_SIZE rejected URLs, for `hosts.known_urls`, `trap_rejections` and
    `trap_sample` (hosts_part), `has_tally` true. A host the crawl never accepted a URL of gets no row just for
    being rejected."""
    rejected = fresh.where(F.col("reason").isNotNull())
    accepted = fresh.where(F.col("reason").isNull()).groupBy("host_key", "bucket").agg(
        F.count("*").alias("accepted"), F.first("domain").alias("domain"))
    counts = rejected.groupBy("host_key", "bucket", "reason").agg(F.count("*").alias("n")).groupBy(
        "host_key", "bucket").agg(F.map_from_entries(F.collect_list(F.struct("reason", "n"))).alias("rejections"))
    sample_rank = F.row_number().over(Window.partitionBy("host_key").orderBy("url"))
    samples = rejected.withColumn("_r", sample_rank).where(F.col("_r") <= TRAP_SAMPLE_SIZE).groupBy(
        "host_key").agg(F.array_sort(F.collect_list("url")).alias("sample"))
    return accepted.join(counts, ["host_key", "bucket"], "full_outer").join(samples, "host_key", "left").withColumn(
        "has_tally", F.lit(True))




def url_rows(conf: Config, segment_id: str, targets: DataFrame) -> DataFrame:
    """The `urls` rows of the discovered targets (discovery_targets) that change the table, `discovers` true:
    new ones with status unfetched, known ones with inlinks to add or a sitemap origin to gain."""
    becomes_sitemap = F.col("known_origin").isNull() & F.col("sitemap_origin").isNotNull()
    stored = targets.where(F.col("reason").isNull() & (~F.col("known") | (F.col("inlinks") > 0) | becomes_sitemap))
    nulls = ("last_fetch_at", "last_status_code", "etag", "last_modified", "content_hash", "simhash",
             "last_changed_at", "redirect_to", "lease_segment", "lease_expires_at", "last_segment", *STORED_COLUMNS)
    rows = tables.conform(
        stored.select(
            "url_id", "url", "host_key", "bucket", "depth", "priority", "discovered_at", "inlinks",
            F.lit(UrlStatus.UNFETCHED.value).alias("status"),
            F.lit(0).alias("state_version"),
            F.when(F.col("via_redirect") == 1, UrlSource.REDIRECT.value).when(
                F.col("via_sitemap") == 1, UrlSource.SITEMAP.value).otherwise(UrlSource.LINK.value).alias("source"),
            "sitemap_origin",
            F.lit(segment_id).alias("discovered_in"),
            F.col("discovered_at").alias("next_fetch_at"),
            F.lit(conf.revisit.default_interval_s).alias("fetch_interval_s"),
            F.lit(0).alias("failure_count"),
            F.lit(segment_id).alias("inlink_segment"),
            F.col("discovered_at").alias("updated_at"),
            *[F.lit(None).alias(c) for c in nulls],
        ),
        "urls",
    )
    return rows.withColumn("discovers", F.lit(True))


def urls_part(segment_id: str) -> MergePart:
    """Discover's part of the `urls` MERGE over url_rows: new URLs inserted; a known one gets `inlinks` +=
    distinct linking pages, the lower depth and a sitemap origin, once per segment (urls.inlink_segment)."""
    seg = F.lit(segment_id)
    discovered = F.col("s.discovers").isNotNull()
    return MergePart.guarded(
        inserts=discovered,
        updates=discovered & ~F.col("t.inlink_segment").eqNullSafe(seg),
        changes={
            "inlinks": F.col("t.inlinks") + F.col("s.inlinks"),
            "depth": F.least("t.depth", "s.depth"),
            "inlink_segment": seg,
            "sitemap_origin": F.coalesce("t.sitemap_origin", "s.sitemap_origin"),
        },
        values={c: F.col(f"s.{c}") for c in tables.TABLES["urls"].schema.fieldNames()},
    )


def hosts_part(segment_id: str) -> MergePart:
    """Discover's part of the `hosts` MERGE over discovery_tally: `known_urls` += accepted URLs, rejections added
    to `trap_rejections` and `trap_sample`, once per segment (hosts.discovery_segment); a host without a row gets
    one when it has accepted URLs."""
    seg = F.lit(segment_id)
    counted = F.col("s.has_tally").isNotNull()
    no_counts = F.create_map().cast("map<string,bigint>")
    no_urls = F.array().cast("array<string>")
    has_rejections = F.col("s.rejections").isNotNull()
    return MergePart.guarded(
        inserts=F.coalesce("s.accepted", F.lit(0)) > 0,
        updates=counted & ~F.col("t.discovery_segment").eqNullSafe(seg),
        changes={
            "known_urls": F.col("t.known_urls") + F.coalesce("s.accepted", F.lit(0)),
            "trap_rejections": F.when(has_rejections, F.map_zip_with(
                F.coalesce("t.trap_rejections", no_counts), F.col("s.rejections"),
                lambda _, old, new: F.coalesce(old, F.lit(0)) + F.coalesce(new, F.lit(0)))).otherwise(
                F.col("t.trap_rejections")),
            "trap_sample": F.when(has_rejections, F.slice(
                F.array_distinct(F.concat(F.coalesce("t.trap_sample", no_urls), F.col("s.sample"))), 1,
                TRAP_SAMPLE_SIZE)).otherwise(F.col("t.trap_sample")),
            "discovery_segment": seg,
        },
        values={
            "known_urls": F.coalesce("s.accepted", F.lit(0)).cast("bigint"),
            "trap_rejections": F.col("s.rejections"),
            "trap_sample": F.when(has_rejections, F.col("s.sample")),
            "discovery_segment": F.when(counted, seg),
        },
    )
