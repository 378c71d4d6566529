"""Scope: which URLs the crawl accepts (the `scope.*` settings) and the one URL it stores for each.

`Scope.stored_url` is the crawl's URL identity after canonicalization (`crawler/urls.py`): the opt-in per-host
query-parameter stripping (`scope.strip_query_params`). Seeds, outlinks, redirect targets, sitemap entries and
sitemap children all pass through it before their url_id is taken, so `links.to_url_id` and `urls.url_id` agree
for every page however it was found.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from crawler import urls
from crawler.settings import Settings
from crawler.urls import registered_domain

# The rejection of a discovered URL deeper than scope.max_depth: a key of `hosts.trap_rejections`, like the trap rules'.
DEPTH_BEYOND_SCOPE = "depth beyond scope.max_depth"


def _domain_listed(domain: str, listed: tuple[str, ...]) -> bool:
    return domain in {d.lower().lstrip(".").rstrip(".") for d in listed}


@functools.cache
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


@dataclass(frozen=True)
class Scope:
    """The `scope.*` settings: which URLs the crawl accepts at injection and discovery, and the opt-in
    per-host query-parameter stripping applied to them first (`stored_url`)."""

    schemes: tuple[str, ...]
    host_suffixes: tuple[str, ...]
    max_url_length: int
    max_depth: int
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    deny_patterns: tuple[str, ...] = ()
    strip_query_params: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (host glob, parameter globs)

    @classmethod
    def from_config(cls, conf: Settings) -> Scope:
        return cls(
            tuple(conf.scope.schemes),
            tuple(conf.scope.host_suffixes),
            conf.scope.max_url_length,
            conf.scope.max_depth,
            tuple(conf.scope.allow_domains),
            tuple(conf.scope.deny_domains),
            tuple(conf.scope.deny_patterns),
            tuple((host, tuple(names)) for host, names in conf.scope.strip_query_params.items()),
        )

    def stored_url(self, canonical_url: str) -> str:
        """The URL the crawl stores (and keys by url_id) for a canonical URL: the configured query parameters
        stripped (none by default). Every way a URL enters the crawl goes through here — seeds, outlinks, redirect
        targets, sitemap entries and children — so a page has one url_id wherever it was found."""
        return urls.strip_query_params(canonical_url, dict(self.strip_query_params))

    def reject_reason(self, canonical_url: str) -> str | None:
        """Why a canonical URL is out of scope, or None if it is in scope."""
        if len(canonical_url) > self.max_url_length:
            return f"URL longer than scope.max_url_length ({self.max_url_length})"
        if not urls.in_scope(canonical_url, list(self.schemes), list(self.host_suffixes), self.max_url_length):
            return "out of scope (scope.schemes / scope.host_suffixes)"
        if self.allow_domains or self.deny_domains:
            domain = registered_domain(urls.parts(canonical_url)[1])
            if _domain_listed(domain, self.deny_domains):
                return "denied domain (scope.deny_domains)"
            if self.allow_domains and not _domain_listed(domain, self.allow_domains):
                return "domain not allowed (scope.allow_domains)"
        if any(pattern.search(canonical_url) for pattern in _compiled(self.deny_patterns)):
            return "denied pattern (scope.deny_patterns)"
        return None

    def depth_reject_reason(self, depth: int | None) -> str | None:
        """Why a discovered URL at `depth` link hops from its seed is out of scope (deeper than `max_depth`), or
        None if its depth is in scope."""
        return DEPTH_BEYOND_SCOPE if depth is not None and depth > self.max_depth else None

    def depth_reject_reason_sql(self, depth: str) -> str:
        """`depth_reject_reason` over an integer column `depth`."""
        return f"(case when {depth} > {int(self.max_depth)} then '{DEPTH_BEYOND_SCOPE}' end)"
