"""Frontier rules shared by inject, generate and update: scope, ranking score, per-host cap, discovery
keys and priority, index event kinds and host backoff. Pure: no Spark, no network.

Rules that generate evaluates on every due URL also exist as Spark SQL text (`*_sql`), next to their
Python form; tests/test_inject_generate.py checks that both agree.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from publicsuffixlist import PublicSuffixList

from crawler import politeness, traps, urls
from crawler.config import Config
from crawler.status import FetchOutcome, IndexEventKind

# A discovered URL inherits the best priority among the pages linking to it, damped by this factor per hop,
# so pages near the seeds are fetched first and a deep chain fades out instead of crowding the segment.
DISCOVERY_PRIORITY_FACTOR = 0.8
SECONDS_PER_DAY = 86400.0
GONE_CODES = frozenset({404, 410})


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    # The list bundled with the publicsuffixlist package: loaded once per process, never downloaded.
    return PublicSuffixList()


@functools.lru_cache(maxsize=65536)  # a link batch repeats few hosts; bounded for workers seeing millions
def registered_domain(host: str) -> str:
    """The registrable domain of a host name, public-suffix aware: "a.b.example.co.uk" -> "example.co.uk".
    An IP address, a bare public suffix or a single-label name is its own registered domain."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host
    except ValueError:
        pass
    return _public_suffixes().privatesuffix(host) or host


def _domain_listed(domain: str, listed: tuple[str, ...]) -> bool:
    return domain in {d.lower().lstrip(".").rstrip(".") for d in listed}


@functools.cache
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


@dataclass(frozen=True)
class Scope:
    """The `scope.*` settings: which URLs the crawl accepts at injection and discovery, and the opt-in
    per-host query-parameter stripping applied to them first (`rewrite`)."""

    schemes: tuple[str, ...]
    host_suffixes: tuple[str, ...]
    max_url_length: int
    max_depth: int
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    deny_patterns: tuple[str, ...] = ()
    strip_query_params: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (host glob, parameter globs)

    @classmethod
    def from_config(cls, conf: Config) -> Scope:
        return cls(
            tuple(conf["scope.schemes"]),
            tuple(conf["scope.host_suffixes"]),
            conf["scope.max_url_length"],
            conf["scope.max_depth"],
            tuple(conf["scope.allow_domains"]),
            tuple(conf["scope.deny_domains"]),
            tuple(conf["scope.deny_patterns"]),
            tuple((host, tuple(names)) for host, names in conf["scope.strip_query_params"].items()),
        )

    def rewrite(self, canonical_url: str) -> str:
        """The URL the crawl stores for a canonical URL: configured query parameters stripped (none by default)."""
        return urls.strip_query_params(canonical_url, dict(self.strip_query_params))

    def reject_reason(self, canonical_url: str) -> str | None:
        """Why a canonical URL is out of scope, or None if it is in scope."""
        if len(canonical_url) > self.max_url_length:
            return f"URL longer than scope.max_url_length ({self.max_url_length})"
        if not urls.in_scope(canonical_url, list(self.schemes), list(self.host_suffixes), self.max_url_length):
            return "out of scope (scope.schemes / scope.host_suffixes)"
        if self.allow_domains or self.deny_domains:
            domain = registered_domain(urls.host_name(canonical_url))
            if _domain_listed(domain, self.deny_domains):
                return "denied domain (scope.deny_domains)"
            if self.allow_domains and not _domain_listed(domain, self.allow_domains):
                return "domain not allowed (scope.allow_domains)"
        if any(pattern.search(canonical_url) for pattern in _compiled(self.deny_patterns)):
            return "denied pattern (scope.deny_patterns)"
        return None


@dataclass(frozen=True)
class UrlKeys:
    url: str
    url_id: str
    host_key: str
    bucket: int


@dataclass(frozen=True)
class Discovery:
    """A discovered link's canonical keys, its template, and why it is rejected (None: accepted so far)."""

    keys: UrlKeys
    template: str
    reject_reason: str | None


def classify_discovery(raw_url: str, scope: Scope, rules: traps.TrapRules, buckets: int) -> Discovery | None:
    """Keys and verdict of a discovered URL under the scope and per-URL trap rules; None when it is not a
    valid http(s) URL at all (no host to count it against)."""
    try:
        canonical = scope.rewrite(urls.canonicalize(raw_url))
    except ValueError:
        return None
    host = urls.host_key(canonical)
    keys = UrlKeys(canonical, urls.url_id(canonical), host, urls.bucket_of(host, buckets))
    reason = scope.reject_reason(canonical) or traps.trap_reason(canonical, rules)
    return Discovery(keys, traps.url_template(canonical), reason)


def score(priority: float, next_fetch_at: datetime, now: datetime, age_boost_per_day: float) -> float:
    """Generate's ranking score: priority plus a boost per day overdue, so low priorities never starve."""
    days_overdue = max(0.0, (now - next_fetch_at).total_seconds() / SECONDS_PER_DAY)
    return priority + age_boost_per_day * days_overdue


def score_sql(priority: str, next_fetch_at: str, now: str, age_boost_per_day: float) -> str:
    overdue = f"greatest(0D, (unix_micros({now}) - unix_micros({next_fetch_at})) / 1000000D / {SECONDS_PER_DAY!r})"
    return f"({priority} + {float(age_boost_per_day)!r} * {overdue})"


def host_delay_s(min_delay_s: float, crawl_delay_s: float | None, max_crawl_delay_s: float,
                 host_min_delay_s: float | None) -> float:
    """The host's delay known at generate time: the politeness rule plus the host's own minimum override."""
    delay = politeness.effective_delay(min_delay_s, crawl_delay_s, max_crawl_delay_s, 0.0)
    return max(delay, host_min_delay_s or 0.0)


def host_delay_sql(min_delay_s: float, crawl_delay: str, max_crawl_delay_s: float, host_min_delay: str) -> str:
    # Spark's least() skips nulls, so a missing Crawl-delay is handled before it.
    robots = f"(case when {crawl_delay} is null then 0D else least({crawl_delay}, {float(max_crawl_delay_s)!r}) end)"
    return f"greatest({float(min_delay_s)!r}, {robots}, coalesce({host_min_delay}, 0D))"


def per_host_cap(per_host_max_urls: int, segment_seconds: float, delay_s: float) -> int:
    """URLs of one host in one segment: the configured cap, and no more than the segment's time allows."""
    if delay_s <= 0:
        return per_host_max_urls
    return max(0, min(per_host_max_urls, math.floor(segment_seconds / delay_s)))


def per_host_cap_sql(per_host_max_urls: int, segment_seconds: float, delay: str) -> str:
    by_time = f"cast(floor({float(segment_seconds)!r} / ({delay})) as bigint)"
    return (
        f"(case when ({delay}) <= 0D then {int(per_host_max_urls)}L"
        f" else greatest(0L, least({int(per_host_max_urls)}L, {by_time})) end)"
    )


def index_event_kind(outcome: str, status_code: int | None, previous_hash: str | None,
                     new_hash: str | None, duplicate_of: str | None = None) -> str | None:
    """The index event a completing result produces (None: nothing for an indexer to do). New or changed
    content that dedup marked as a duplicate of another URL (`duplicate_of`, exact or near) is `duplicate`:
    the indexer keeps the representative. Unchanged content stays `not_modified` whatever its duplicate mark."""
    if outcome == FetchOutcome.SUCCESS and new_hash is not None:
        if previous_hash is not None and new_hash == previous_hash:
            return IndexEventKind.NOT_MODIFIED.value
        if duplicate_of is not None:
            return IndexEventKind.DUPLICATE.value
        return (IndexEventKind.FETCHED if previous_hash is None else IndexEventKind.CHANGED).value
    if outcome == FetchOutcome.NOT_MODIFIED:
        return IndexEventKind.NOT_MODIFIED.value
    if outcome == FetchOutcome.HTTP_ERROR and status_code in GONE_CODES:
        return IndexEventKind.GONE.value
    return None


@dataclass(frozen=True)
class HostBackoff:
    level: int
    until: datetime | None


def host_backoff(level: int, until: datetime | None, throttled: int, responded_ok: int, last_fetch_at: datetime | None,
                 retry_after_s: float | None, base_s: float, cap_s: float, seed: str) -> HostBackoff:
    """A host's backoff after a segment: each segment with 429/503 answers raises the level and keeps the host
    out of generate for Retry-After (or base * 2^(level-1) with seeded jitter, so a re-run agrees), capped;
    a segment with successful answers and no throttling resets the level."""
    if throttled > 0 and last_fetch_at is not None:
        new_level = level + 1
        wait = politeness.backoff_seconds(new_level, base_s, cap_s, retry_after_s, random.Random(seed))
        return HostBackoff(new_level, last_fetch_at + timedelta(seconds=wait))
    if responded_ok > 0:
        return HostBackoff(0, until)
    return HostBackoff(level, until)
