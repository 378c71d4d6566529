"""Frontier rules shared by inject, generate and update: when generate may start a segment (backpressure), ranking
score, per-host cap, per-domain budgets, discovery keys, depth and priority, index event kinds (scope itself:
`crawler/scope.py`). Pure: no Spark, no network.

Rules that generate evaluates on every due URL also exist as Spark SQL text (`*_sql`), next to their
Python form; tests/test_rule_twins.py checks that both agree.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

from crawler import traps, urls
from crawler.bucketing import Bucketing
from crawler.scope import Scope
from crawler.settings import Settings
from crawler.sitemaps import SITEMAP_FILE_PRIORITY, SitemapEntry, first_schedule
from crawler.status import FetchOutcome, IndexEventKind, UrlSource, is_gone, is_gone_sql, is_unchanged, is_unchanged_sql

# A discovered URL inherits the best priority among the pages linking to it, damped by this factor per hop,
# so pages near the seeds are fetched first and a deep chain fades out instead of crowding the segment.
DISCOVERY_PRIORITY_FACTOR = 0.8
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class UrlKeys:
    url: str
    url_id: str
    host_key: str
    bucket: int
    domain: str  # the host's registered domain (hosts.domain)


@dataclass(frozen=True)
class Discovery:
    """A discovered link's canonical keys, its template, and why it is rejected (None: accepted so far)."""

    keys: UrlKeys
    template: str
    reject_reason: str | None


def classify_discovery(raw_url: str, scope: Scope, rules: traps.TrapRules, bucketing: Bucketing) -> Discovery | None:
    """Keys and verdict of a discovered URL under the scope and per-URL trap rules; None when it is not a
    valid http(s) URL at all (no host to count it against)."""
    try:
        canonical = scope.stored_url(urls.canonicalize(raw_url))
    except ValueError:
        return None
    host = urls.parts(canonical)[0]
    keys = UrlKeys(canonical, urls.url_id(canonical), host, bucketing.bucket(host), urls.host_domain(host))
    reason = scope.reject_reason(canonical) or traps.trap_reason(canonical, rules)
    return Discovery(keys, traps.url_template(canonical), reason)


def backpressure(unmerged: Mapping[str, bool], max_unmerged: int,
                 merging: Collection[str] = frozenset()) -> str | None:
    """Why generate must not start a new segment now (None: it may). `unmerged`: every earlier segment that is
    neither merged nor given up -> whether its fetch is over (every listed bucket done, or the segment closed).
    `merging`: segments the caller itself is merging right now (`crawl run`'s own queue).

    A segment whose fetch is over but which is not merged is stalled unless it is being merged: the steps after
    the fetch failed or never ran (the DAG and `crawl cycle` run them right after it), and until it is repaired or
    given up every new segment would lease URLs for fetches that are not merged either. Otherwise segments being
    fetched or merged may pile up to `max_unmerged` (generate.max_unmerged_segments) before generate waits for
    them, which is what bounds a continuous crawl whose merges fall behind its cadence."""
    stalled = sorted(segment for segment, fetch_over in unmerged.items() if fetch_over and segment not in merging)
    if stalled:
        first = stalled[0]
        more = f" (and {len(stalled) - 1} more: {', '.join(stalled[1:4])})" if len(stalled) > 1 else ""
        return (f"segment {first} finished fetching but is not merged{more}: its parse, dedup or update failed or "
                f"did not run; repair it (crawl parse, dedup and update --segment {first}) or give it up "
                f"(crawl close-segment --segment {first})")
    if len(unmerged) > max_unmerged:
        return (f"{len(unmerged)} earlier segments are not merged yet ({', '.join(sorted(unmerged)[:4])}), more "
                f"than generate.max_unmerged_segments = {max_unmerged}: let their fetches finish and merge them, or "
                f"give one up (crawl close-segment)")
    return None


def freshness_alert(oldest_due_age_s: float | None, max_oldest_due_hours: float) -> str | None:
    """Why on-call should look at the frontier (None: no reason): the oldest due URL had waited longer than
    `max_oldest_due_hours` when the segment was generated (0 = never alert) — fetching falls behind the schedule."""
    if not max_oldest_due_hours or oldest_due_age_s is None or oldest_due_age_s <= max_oldest_due_hours * 3600:
        return None
    return (f"the oldest due URL had waited {oldest_due_age_s / 3600:.1f} h when the segment was generated, more "
            f"than {max_oldest_due_hours:g} h: fetching falls behind (see docs/deploy.md, On call)")


def score(priority: float, next_fetch_at: datetime, now: datetime, age_boost_per_day: float) -> float:
    """Generate's ranking score: priority plus a boost per day overdue, so low priorities never starve."""
    days_overdue = max(0.0, (now - next_fetch_at).total_seconds() / SECONDS_PER_DAY)
    return priority + age_boost_per_day * days_overdue


def score_sql(priority: str, next_fetch_at: str, now: str, age_boost_per_day: float) -> str:
    overdue = f"greatest(0D, (unix_micros({now}) - unix_micros({next_fetch_at})) / 1000000D / {SECONDS_PER_DAY!r})"
    return f"({priority} + {float(age_boost_per_day)!r} * {overdue})"


def host_order(score: float, url_id: str) -> tuple[float, str]:
    """The order of one host's due URLs, lowest key first: the higher score, then url_id (total, so a re-run ranks
    the same URLs). A URL's place in it is its `rank`, which `per_host_cap` cuts at and `segment_order` reads."""
    return -score, url_id


def host_order_sql(score: str, url_id: str) -> str:
    """`host_order` as one Spark SQL sort key, ascending."""
    return f"struct(-({score}), {url_id})"


def segment_order(rank: int, score: float, url_id: str) -> tuple[int, float, str]:
    """The order in which URLs that passed their host's cap (`rank` among the host's due URLs by score) go into a
    segment, lowest key first: every host's first URL, then every host's second, each rank by the higher score, then
    by url_id, so the order is total and a re-run cuts the same URLs. Generate cuts by it per registered domain, per
    side of the refresh/discovery split and at the segment budget."""
    return rank, -score, url_id


def segment_order_sql(rank: str, score: str, url_id: str) -> str:
    """`segment_order` as one Spark SQL sort key, ascending (a struct sorts field by field)."""
    return f"struct({rank}, -({score}), {url_id})"


@dataclass(frozen=True)
class RefreshShare:
    """How generate divides a segment's budget between revisits (known URLs fetched before: `last_fetch_at` set)
    and discovery (URLs never fetched): `generate.refresh_share`, or with `generate.refresh_share_adaptive` that
    share moved by the last update's figures within [`refresh_share_min`, `refresh_share_max`]."""

    share: float
    adaptive: bool
    min_share: float
    max_share: float
    gain: float

    @classmethod
    def from_config(cls, conf: Settings) -> RefreshShare:
        return cls(float(conf.generate.refresh_share), bool(conf.generate.refresh_share_adaptive),
                   float(conf.generate.refresh_share_min), float(conf.generate.refresh_share_max),
                   float(conf.generate.refresh_share_gain))

    def current(self, change_rate: float | None, new_urls_per_fetch: float | None) -> float:
        """The share for the next segment. Adaptive: the configured share plus `gain` x (change rate of refetched
        pages - new-URL yield per fetch mapped to [0, 1) as y / (1 + y)), clamped: revisits gain while known pages
        change more than fetching finds new ones, discovery gains in the reverse case; without both figures (no
        update yet) the configured share."""
        if not self.adaptive or change_rate is None or new_urls_per_fetch is None:
            return self.share
        discovery_signal = max(0.0, new_urls_per_fetch) / (1.0 + max(0.0, new_urls_per_fetch))
        moved = self.share + self.gain * (change_rate - discovery_signal)
        return min(self.max_share, max(self.min_share, moved))


def refresh_quota(budget: int, share: float, refresh_available: int, discovery_available: int) -> tuple[int, int]:
    """(revisits, discoveries) a segment of `budget` URLs takes: revisits round(budget x share) and discoveries the
    rest, and what one side cannot fill goes to the other."""
    refresh = min(refresh_available, max(round(budget * share), budget - discovery_available))
    return refresh, min(discovery_available, budget - refresh)


def refresh_quota_sql(budget: int, share: float, refresh_available: str, discovery_available: str) -> tuple[str, str]:
    """`refresh_quota` over two count expressions: (revisits, discoveries)."""
    refresh = (f"least({refresh_available}, greatest(cast({round(budget * share)} as bigint),"
               f" {int(budget)}L - {discovery_available}))")
    return refresh, f"least({discovery_available}, {int(budget)}L - {refresh})"


def per_host_cap(per_host_max_urls: int, segment_seconds: float, delay_s: float, dead: bool = False) -> int:
    """URLs of one host in one segment: the configured cap, and no more than the segment's time allows; a dead
    host (crawler.politeness: nothing but failures for a while) gets one, a probe, so its backlog takes no
    fetch-list slots."""
    if dead:
        return min(1, per_host_max_urls)
    if delay_s <= 0:
        return per_host_max_urls
    return max(0, min(per_host_max_urls, math.floor(segment_seconds / delay_s)))


def per_host_cap_sql(per_host_max_urls: int, segment_seconds: float, delay: str, dead: str = "false") -> str:
    by_time = f"cast(floor({float(segment_seconds)!r} / ({delay})) as bigint)"
    return (
        f"(case when {dead} then {min(1, int(per_host_max_urls))}L"
        f" when ({delay}) <= 0D then {int(per_host_max_urls)}L"
        f" else greatest(0L, least({int(per_host_max_urls)}L, {by_time})) end)"
    )


@dataclass(frozen=True)
class DomainBudgets:
    """URLs one registered domain (`crawler.urls.registered_domain`: public-suffix aware, so every subdomain of
    example.co.uk is example.co.uk's) may have, across all its hosts, in one segment (`per_segment`:
    `generate.per_domain_max_urls`, 0: no budget) or in one UTC day (`per_day`: `generate.per_domain_daily_max_urls`),
    each overridden by the first pattern of its map (`generate.domain_budgets`, `generate.domain_daily_budgets`) that
    matches the domain (a glob, `*` any run of characters, `?` one; a known hot domain gets more, a known trap less).
    A domain's budget is taken round-robin over its hosts, after each host's own cap (`per_host_cap`); what a segment
    may take of a domain is `domain_cap`."""

    default: int
    patterns: tuple[tuple[str, int], ...] = ()

    @classmethod
    def per_segment(cls, conf: Settings) -> DomainBudgets:
        return cls._from(conf.generate.per_domain_max_urls, conf.generate.domain_budgets)

    @classmethod
    def per_day(cls, conf: Settings) -> DomainBudgets:
        return cls._from(conf.generate.per_domain_daily_max_urls, conf.generate.domain_daily_budgets)

    @classmethod
    def _from(cls, default: int, patterns: Mapping[str, int]) -> DomainBudgets:
        return cls(int(default), tuple((str(p).lower(), int(n)) for p, n in patterns.items()))

    @property
    def active(self) -> bool:
        return bool(self.default or self.patterns)

    def cap(self, domain: str) -> int | None:
        """The domain's budget per segment (None: unlimited)."""
        for pattern, budget in self.patterns:
            if fnmatch.fnmatchcase(domain.lower(), pattern):
                return budget
        return self.default or None

    def cap_sql(self, domain: str) -> str:
        """`cap` in Spark SQL over the string column `domain` (a bigint; null: unlimited)."""
        cases = "".join(f" when lower({domain}) like '{_glob_like(p)}' escape '!' then {n}L" for p, n in self.patterns)
        fallback = f"{self.default}L" if self.default else "cast(null as bigint)"
        return f"(case{cases} else {fallback} end)" if cases else f"({fallback})"


def spends_the_day(last_fetch_at: datetime | None, lease_segment: str | None, lease_expires_at: datetime | None,
                   day_start: datetime, now: datetime, segment_id: str) -> bool:
    """Whether a URL counts against its domain's daily budget when generate builds `segment_id` at `now`: it was
    fetched since the UTC day began (`day_start`), or it is out on a live lease of another segment (handed out, not
    merged yet: it is being fetched). Counted from `urls` itself, so there is no counter to keep in step; a URL
    fetched today and leased again counts once, and this segment's own leases (a re-run) are not spent yet."""
    if last_fetch_at is not None and last_fetch_at >= day_start:
        return True
    return (lease_segment is not None and lease_segment != segment_id
            and lease_expires_at is not None and lease_expires_at >= now)


def spends_the_day_sql(day_start: str, now: str, segment_id: str) -> str:
    """`spends_the_day` over the `urls` columns; `day_start` and `now` SQL timestamp expressions, `segment_id` a
    checked id."""
    return (f"(coalesce(last_fetch_at >= {day_start}, false) or (lease_segment is not null"
            f" and lease_segment != '{segment_id}' and coalesce(lease_expires_at >= {now}, false)))")


def domain_cap(segment_cap: int | None, daily_cap: int | None, spent_today: int) -> int | None:
    """What one segment may take of a domain: its per-segment budget, and what its daily budget has left after the
    URLs that already spent the day (`spends_the_day`); None: unlimited."""
    caps = [cap for cap in (segment_cap, None if daily_cap is None else max(daily_cap - spent_today, 0))
            if cap is not None]
    return min(caps) if caps else None


def domain_cap_sql(segment_cap: str, daily_cap: str, spent_today: str) -> str:
    """`domain_cap` in Spark SQL (bigint expressions, a null cap unlimited: `least` skips nulls, and so would
    `greatest`, hence the CASE)."""
    left_today = f"(case when {daily_cap} is null then null else greatest({daily_cap} - {spent_today}, 0L) end)"
    return f"least({segment_cap}, {left_today})"


def _glob_like(pattern: str) -> str:
    """A glob of `*` and `?` as a SQL LIKE pattern (escape character `!`)."""
    escaped = "".join("!" + c if c in "%_!" else c for c in pattern).replace("'", "''")
    return escaped.replace("*", "%").replace("?", "_")


def is_domain_pattern(pattern: object) -> bool:
    """What `generate.domain_budgets` accepts as a key: a non-empty glob of `*` and `?` only ([...] classes have
    no SQL LIKE form, so they are refused rather than read two ways)."""
    return isinstance(pattern, str) and bool(pattern.strip()) and not set(pattern) & set("[]\\ ")


def index_event_kind(outcome: str, status_code: int | None, previous_hash: str | None,
                     new_hash: str | None, duplicate_of: str | None = None,
                     sitemap_origin: str | None = None) -> str | None:
    """The index event a completing result produces (None: nothing for an indexer to do). New or changed
    content that dedup marked as a duplicate of another URL (`duplicate_of`, exact or near) is `duplicate`:
    the indexer keeps the representative. Unchanged content stays `not_modified` whatever its duplicate mark.
    A sitemap file (`sitemap_origin` set) is crawl machinery, not a document: indexers never hear of it."""
    if sitemap_origin is not None:
        return None
    if outcome == FetchOutcome.SUCCESS and new_hash is not None:
        if previous_hash is not None and new_hash == previous_hash:
            return IndexEventKind.NOT_MODIFIED.value
        if duplicate_of is not None:
            return IndexEventKind.DUPLICATE.value
        return (IndexEventKind.FETCHED if previous_hash is None else IndexEventKind.CHANGED).value
    if is_unchanged(outcome):  # a 304, or the stored payload again
        return IndexEventKind.NOT_MODIFIED.value
    if is_gone(outcome, status_code):
        return IndexEventKind.GONE.value
    return None


def index_event_kind_sql(outcome: str, status_code: str, previous_hash: str, new_hash: str, duplicate_of: str,
                         sitemap_origin: str) -> str:
    """`index_event_kind` over six columns (null: no event), so that update derives its events in Spark's SQL
    instead of shipping every completing row to a Python worker."""
    success = f"{outcome} = '{FetchOutcome.SUCCESS.value}' and {new_hash} is not null"
    return (f"(case when {sitemap_origin} is not null then null"
            f" when {success} then case"
            f" when {previous_hash} is not null and {new_hash} = {previous_hash}"
            f" then '{IndexEventKind.NOT_MODIFIED.value}'"
            f" when {duplicate_of} is not null then '{IndexEventKind.DUPLICATE.value}'"
            f" when {previous_hash} is null then '{IndexEventKind.FETCHED.value}'"
            f" else '{IndexEventKind.CHANGED.value}' end"
            f" when {is_unchanged_sql(outcome)} then '{IndexEventKind.NOT_MODIFIED.value}'"
            f" when {is_gone_sql(outcome, status_code)} then '{IndexEventKind.GONE.value}' end)")


def listed_by_sitemap(source: str, sitemap_origin: str | None) -> bool:
    """A candidate a sitemap listed as a page (not a child sitemap): its sitemap entry sets its schedule."""
    return source == UrlSource.SITEMAP and sitemap_origin is None


def listed_by_sitemap_sql(source: str, sitemap_origin: str) -> str:
    return f"({source} = '{UrlSource.SITEMAP.value}' and {sitemap_origin} is null)"


def discovery_depth(source: str, sitemap_origin: str | None, parent_depth: int) -> int:
    """A discovered URL's depth: a link or redirect target is one hop deeper than its parent; a sitemap's
    entries and child sitemaps stay at the sitemap's depth (a sitemap lists pages, it is not a hop)."""
    sitemap = sitemap_origin is not None or listed_by_sitemap(source, sitemap_origin)
    return parent_depth + (0 if sitemap else 1)


def discovery_depth_sql(source: str, sitemap_origin: str, parent_depth: str) -> str:
    return (f"({parent_depth} + case when {sitemap_origin} is not null"
            f" or {listed_by_sitemap_sql(source, sitemap_origin)} then 0 else 1 end)")


def discovery_priority(source: str, sitemap_origin: str | None, parent_priority: float | None,
                       entry: SitemapEntry | None = None, fetched_at: datetime | None = None) -> float | None:
    """A discovered URL's priority: a sitemap file gets SITEMAP_FILE_PRIORITY, a page a sitemap listed the
    priority `first_schedule` gives its entry (fetched at `fetched_at`), any other target its parent's priority
    damped by DISCOVERY_PRIORITY_FACTOR."""
    if sitemap_origin is not None:
        return SITEMAP_FILE_PRIORITY
    if listed_by_sitemap(source, sitemap_origin):
        if entry is None or fetched_at is None:
            raise ValueError("a sitemap-listed candidate needs its entry and the sitemap's fetch time")
        return first_schedule(entry, fetched_at)[0]
    return None if parent_priority is None else parent_priority * DISCOVERY_PRIORITY_FACTOR


def discovery_priority_sql(sitemap_origin: str, parent_priority: str) -> str:
    """`discovery_priority` for a candidate no sitemap listed as a page (those go through `first_schedule`)."""
    return (f"(case when {sitemap_origin} is not null then {SITEMAP_FILE_PRIORITY!r}D"
            f" else {parent_priority} * {DISCOVERY_PRIORITY_FACTOR!r}D end)")

