"""Crawler-trap rules applied to discovered URLs (by update's discovery). Pure: no Spark, no network.

A trap is a site that generates unbounded URLs: calendars with a "next day" link forever, paths that repeat
(`/a/b/a/b/...` from relative links on a misconfigured 404 page), faceted search with every filter
combination in the query. The per-URL rules here see one canonical URL at a time; the per-cycle caps on new URLs
per host and per `url_template` (`capped_reasons`) see all of one segment's discoveries at once, and discover
evaluates them as windows (`capped_reasons_sql`). Defaults are generous: they must never cut an ordinary site.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from crawler import urls
from crawler.settings import Settings

# Rejection reasons: they are the keys of `hosts.trap_rejections`, so they are short, stable and name the rule.
URL_TOO_LONG = "url too long"
PATH_TOO_DEEP = "path too deep"
REPEATED_SEGMENT = "repeated path segment"
TOO_MANY_PARAMS = "too many query parameters"
HOST_NEW_URL_CAP = "host new-URL cap"
TEMPLATE_NEW_URL_CAP = "template new-URL cap"
HOST_KNOWN_URL_CAP = "host known-URL cap"

# Which new URLs a per-cycle cap keeps first: the shallowest, then by key (a total order: a re-run keeps the same).
NEW_URL_ORDER = ("depth", "url_id", "url")

_UUID = re.compile(r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
                   r"(?![0-9A-Za-z])")
# A hex token of 16+ characters with at least one digit: content hashes, session and object ids.
_HEX_ID = re.compile(r"(?<![0-9A-Za-z])(?=[A-Fa-f]*[0-9])[0-9A-Fa-f]{16,}(?![0-9A-Za-z])")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class TrapRules:
    """The `traps.*` settings."""

    max_url_length: int
    max_path_depth: int
    max_segment_repeats: int
    max_query_params: int
    max_new_urls_per_host_per_cycle: int
    max_new_urls_per_template_per_cycle: int
    max_known_urls_per_host: int

    @classmethod
    def from_config(cls, conf: Settings) -> TrapRules:
        return cls(
            conf.traps.max_url_length,
            conf.traps.max_path_depth,
            conf.traps.max_segment_repeats,
            conf.traps.max_query_params,
            conf.traps.max_new_urls_per_host_per_cycle,
            conf.traps.max_new_urls_per_template_per_cycle,
            conf.traps.max_known_urls_per_host,
        )


def _path_segments(path: str) -> list[str]:
    return [segment for segment in path.split("/") if segment]


def _query_params(query: str) -> list[str]:
    return [param for param in query.split("&") if param]


def trap_reason(canonical_url: str, rules: TrapRules) -> str | None:
    """Which per-URL trap rule a canonical URL breaks, or None if it breaks none."""
    if len(canonical_url) > rules.max_url_length:
        return URL_TOO_LONG
    _, _, path, query = urls.parts(canonical_url)
    segments = _path_segments(path)
    if len(segments) > rules.max_path_depth:
        return PATH_TOO_DEEP
    if segments and max(Counter(segments).values()) > rules.max_segment_repeats:
        return REPEATED_SEGMENT
    if len(_query_params(query)) > rules.max_query_params:
        return TOO_MANY_PARAMS
    return None


def _mask(text: str) -> str:
    return _DIGITS.sub("{n}", _HEX_ID.sub("{id}", _UUID.sub("{id}", text)))


def url_template(canonical_url: str) -> str:
    """The URL's shape: host + path with digit runs as `{n}` and uuid/long hex ids as `{id}`, then the sorted
    distinct query keys without values. `/cal/2026/01/31?view=day` and `/cal/2031/12/01?view=week` share one
    template, so a calendar's growth shows up as one template growing."""
    origin, _, path, query = urls.parts(canonical_url)
    keys = sorted({param.split("=", 1)[0] for param in _query_params(query)})
    return origin + _mask(path) + ("?" + "&".join(keys) if keys else "")


def new_url_allowance(known_urls: int, max_known_urls_per_host: int) -> int:
    """New URLs a host may still add: a host never holds more than max_known_urls_per_host rows in `urls`, so an
    unbounded site (calendar, faceted search) stops growing there while every other host keeps its full cap."""
    return max(0, max_known_urls_per_host - known_urls)


def new_url_allowance_sql(known_urls: str, max_known_urls_per_host: int) -> str:
    """`new_url_allowance` as Spark SQL over a column (tests check that both agree)."""
    return f"greatest(0L, {int(max_known_urls_per_host)}L - coalesce({known_urls}, 0L))"


@dataclass(frozen=True)
class NewUrlTarget:
    """One discovery target of a segment as the per-cycle caps see it (discover's target columns): `reason` is the
    verdict of scope, the per-URL trap rules and depth (None: accepted so far), `known` whether it was in `urls`
    before the segment (a known URL is never capped), `allowance` its host's `new_url_allowance`."""

    host_key: str
    template: str
    depth: int
    url_id: str
    url: str
    allowance: int
    known: bool = False
    reason: str | None = None


def _cap_stages(rules: TrapRules) -> tuple[tuple[tuple[str, ...], int | None, str], ...]:
    """The per-cycle caps in the order they apply: (the columns of a group, its cap (None: the host's allowance),
    the reason of a URL past it)."""
    return (
        (("host_key", "template"), rules.max_new_urls_per_template_per_cycle, TEMPLATE_NEW_URL_CAP),
        (("host_key",), rules.max_new_urls_per_host_per_cycle, HOST_NEW_URL_CAP),
        (("host_key",), None, HOST_KNOWN_URL_CAP),
    )


def capped_reasons(targets: Sequence[NewUrlTarget], rules: TrapRules) -> list[str | None]:
    """Each target's reason after the per-cycle caps on new URLs: per host and template at most
    `max_new_urls_per_template_per_cycle`, then per host at most `max_new_urls_per_host_per_cycle`, then per host no
    more than its allowance under `max_known_urls_per_host`. Each cap counts only the new URLs still accepted after
    the one before, in NEW_URL_ORDER, so one runaway template is cut before it eats the host's cap."""
    reasons = [target.reason for target in targets]
    order = sorted(range(len(targets)), key=lambda i: tuple(getattr(targets[i], c) for c in NEW_URL_ORDER))
    for columns, cap, reason in _cap_stages(rules):
        taken: Counter[tuple[object, ...]] = Counter()
        for i in order:
            target = targets[i]
            if reasons[i] is not None or target.known:
                continue
            group = tuple(getattr(target, c) for c in columns)
            taken[group] += 1
            if taken[group] > (target.allowance if cap is None else cap):
                reasons[i] = reason
    return reasons


def capped_reasons_sql(rules: TrapRules, allowance: str) -> list[str]:
    """`capped_reasons` as Spark SQL over discover's target columns (host_key, template, depth, url_id, url, known,
    reason) and an `allowance` expression: one new `reason` expression per cap, each to be applied (as the
    `reason` column) before the next is evaluated, since each window counts the URLs the caps before it kept."""
    open_new = "(reason is null and not known)"
    return [
        f"(case when {open_new} and row_number() over (partition by {', '.join(columns)}, {open_new}"
        f" order by {', '.join(NEW_URL_ORDER)}) > {allowance if cap is None else int(cap)}"
        f" then '{reason}' else reason end)"
        for columns, cap, reason in _cap_stages(rules)
    ]
