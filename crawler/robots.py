"""robots.txt policy (RFC 9309): parse a body into a policy and match URLs against it. Pure: no network.

The daemon fetches robots.txt and turns the HTTP outcome into a policy with `policy_for_status`; the jobs
store the body in `hosts` and re-parse it with `RobotsPolicy.parse`, so both sides obey the same rules.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from crawler.settings import Settings
from crawler.urls import normalize_percent_encoding, path_and_query

_PRODUCT_TOKEN = re.compile(r"[A-Za-z_-]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Directive spellings accepted for each key (a few common variants are tolerated, as major crawlers do).
_USER_AGENT_KEYS = frozenset({"user-agent", "useragent", "user agent"})
_ALLOW_KEYS = frozenset({"allow"})
_DISALLOW_KEYS = frozenset({"disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"})
_CRAWL_DELAY_KEYS = frozenset({"crawl-delay", "crawldelay", "crawl delay"})
_SITEMAP_KEYS = frozenset({"sitemap", "site-map"})
ROBOTS_PATH = "/robots.txt"


class RobotsState(str, Enum):
    """Which policy is in force for a host: parsed rules, or a blanket answer from the HTTP outcome."""

    RULES = "rules"                # 2xx: the parsed rules of the selected group
    ALLOW_ALL = "allow_all"        # 3xx loop / 4xx: robots.txt unavailable, everything allowed
    DISALLOW_ALL = "disallow_all"  # 5xx / network failure: unreachable, nothing allowed (except /robots.txt)


def _product_token(value: str) -> str:
    """The product token of a User-agent value or a full User-Agent header: `Foo-Bot/2.1 (+x)` -> `foo-bot`."""
    match = _PRODUCT_TOKEN.match(value.strip())
    return match.group(0).lower() if match else ""


def _pattern_matches(pattern: str, path: str) -> bool:
    """RFC 9309 matching of one normalized pattern (`*` any run, trailing `$` end anchor) against the start
    of a normalized path. Tracks the set of reachable positions: O(len(pattern) * len(path)), no backtracking."""
    positions = [0]
    last = len(pattern) - 1
    for index, char in enumerate(pattern):
        if char == "$" and index == last:
            return positions[-1] == len(path)
        if char == "*":
            positions = list(range(positions[0], len(path) + 1))
            continue
        positions = [p + 1 for p in positions if p < len(path) and path[p] == char]
        if not positions:
            return False
    return True


def _path_of(url: str) -> str:
    """Path plus query of an absolute URL (or of a bare path), in the normal form rules are compared in."""
    if url.startswith("/"):
        return normalize_percent_encoding(url)
    return normalize_percent_encoding(path_and_query(url))


def _parse_crawl_delay(value: str) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if math.isfinite(delay) and delay >= 0 else None


@dataclass(frozen=True)
class RobotsPolicy:
    """The robots policy in force for one host and one product token."""

    state: RobotsState
    crawl_delay_s: float | None = None
    sitemaps: tuple[str, ...] = ()
    rules: tuple[tuple[str, bool], ...] = ()  # (normalized pattern, allow) of the selected group(s)

    @classmethod
    def allow_all(cls) -> RobotsPolicy:
        return cls(RobotsState.ALLOW_ALL)

    @classmethod
    def disallow_all(cls) -> RobotsPolicy:
        return cls(RobotsState.DISALLOW_ALL)

    @classmethod
    def parse(cls, text: str, token: str, max_bytes: int = 512000) -> RobotsPolicy:
        """Parse a robots.txt body (only its first `max_bytes` bytes) for the crawler's product token.

        Groups naming the token (case-insensitive) are merged; the `*` groups are used only when none does.
        Malformed lines and unknown directives are skipped, never fatal.
        """
        body = text.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore").lstrip("\ufeff")
        wanted = _product_token(token)
        sitemaps: list[str] = []
        # Each group: (agents, rules, crawl delays); consecutive User-agent lines share one group.
        groups: list[tuple[set[str], list[tuple[str, bool]], list[float]]] = []
        in_agent_lines = False
        for raw_line in _LINE_BREAK.split(body):
            line = raw_line.split("#", 1)[0].strip()
            if ":" not in line:
                continue
            key, value = (part.strip() for part in line.split(":", 1))
            key = key.lower()
            if key in _SITEMAP_KEYS:
                if value:
                    sitemaps.append(value)
                continue
            if key in _USER_AGENT_KEYS:
                agent = "*" if value.startswith("*") else _product_token(value)
                if not in_agent_lines:
                    groups.append((set(), [], []))
                    in_agent_lines = True
                if agent:
                    groups[-1][0].add(agent)
                continue
            if not groups:
                continue  # rules before any User-agent line belong to no group
            if key in _ALLOW_KEYS or key in _DISALLOW_KEYS:
                in_agent_lines = False
                if value.startswith(("/", "*")):  # an empty pattern (or one that is not a path) matches nothing
                    groups[-1][1].append((normalize_percent_encoding(value), key in _ALLOW_KEYS))
            elif key in _CRAWL_DELAY_KEYS:
                in_agent_lines = False
                delay = _parse_crawl_delay(value)
                if delay is not None:
                    groups[-1][2].append(delay)
        selected = [g for g in groups if wanted and wanted in g[0]] or [g for g in groups if "*" in g[0]]
        rules = tuple(rule for group in selected for rule in group[1])
        delays = [delay for group in selected for delay in group[2]]
        return cls(RobotsState.RULES, delays[0] if delays else None, tuple(sitemaps), rules)

    def allowed(self, url: str) -> bool:
        """Whether the URL may be fetched: longest matching pattern wins, Allow wins a tie, no match allows."""
        path = _path_of(url)
        if path == ROBOTS_PATH:
            return True
        if self.state is not RobotsState.RULES:
            return self.state is RobotsState.ALLOW_ALL
        best_length = -1
        best_allow = True
        for pattern, allow in self.rules:
            if len(pattern) < best_length or (len(pattern) == best_length and best_allow):
                continue
            if _pattern_matches(pattern, path):
                best_length, best_allow = len(pattern), allow
        return best_allow


def is_allowed(robots_txt: str, user_agent: str, url: str) -> bool:
    """Convenience: parse `robots_txt` for the product token of `user_agent` and match `url`."""
    return RobotsPolicy.parse(robots_txt, user_agent).allowed(url)


@functools.lru_cache(maxsize=1024)  # generate sees each host's stored robots.txt once per URL: parse it once
def _stored_policy(robots_txt: str, token: str, max_bytes: int) -> RobotsPolicy:
    return RobotsPolicy.parse(robots_txt, token, max_bytes)


def allowed_by_stored_rules(robots_txt: str | None, token: str, max_bytes: int, url: str) -> bool:
    """Generate's check against the robots.txt body stored in `hosts` (None: no rules in force, allowed), so a
    URL the host's current policy denies never takes a place in a fetch list; the daemon re-checks anyway."""
    if robots_txt is None:
        return True
    return _stored_policy(robots_txt, token, max_bytes).allowed(url)


def rules_in_force(robots_state: str | None, robots_expires_at: datetime | None, now: datetime) -> bool:
    """Whether the robots.txt body stored for a host (`hosts.robots_state`, `robots_expires_at`) decides for generate
    (`allowed_by_stored_rules`): parsed rules that have not expired. An expired, missing or unreachable robots.txt is
    the daemon's to fetch and decide, so generate lets the host's URLs through."""
    return robots_state == RobotsState.RULES.value and robots_expires_at is not None and robots_expires_at > now


def rules_in_force_sql(robots_state: str, robots_expires_at: str, now: str) -> str:
    """`rules_in_force` over the `hosts` columns and a timestamp expression for now."""
    return f"coalesce({robots_state} = '{RobotsState.RULES.value}' and {robots_expires_at} > {now}, false)"


def policy_for_status(status_code: int | None, body: str | None, token: str, max_bytes: int) -> RobotsPolicy:
    """The policy implied by the final outcome of fetching robots.txt (after redirects), per RFC 9309 §2.3.1:
    2xx -> the parsed body; 3xx (redirect limit exceeded) and 4xx -> unavailable, allow all;
    429, 5xx, anything else, or None (network failure) -> unreachable, disallow all."""
    if is_unreachable(status_code):
        return RobotsPolicy.disallow_all()
    if 200 <= status_code < 300:
        return RobotsPolicy.parse(body or "", token, max_bytes)
    return RobotsPolicy.allow_all()


def is_unreachable(status_code: int | None) -> bool:
    """The outcomes RFC 9309 §2.3.1.4 calls unreachable: no response (network failure, timeout, no address),
    429, 5xx or any status outside 2xx-4xx."""
    return status_code is None or status_code == 429 or not 200 <= status_code < 500


def is_reachable_sql(status_code: str) -> str:
    """`not is_unreachable` over a status code column (null: no response, unreachable), never null."""
    return f"coalesce({status_code} between 200 and 499 and {status_code} != 429, false)"


def observation_reusable(status_code: int | None, expires_at: datetime | None, now: datetime) -> bool:
    """Whether a stored robots.txt observation may stand in for a fetch by a daemon new to the host (a resumed
    bucket's own earlier fetch, or the `hosts` copy generate hands over in the fetch list): a definite answer
    (rules, or unavailable: allow all) that has not expired. An unreachable one is fetched again, so the daemon
    applies its own rules for an outage (`remember`)."""
    return expires_at is not None and expires_at > now and not is_unreachable(status_code)


def observation_reusable_sql(status_code: str, expires_at: str, now: str) -> str:
    """`observation_reusable` over the `hosts` columns and a timestamp expression for now."""
    return f"coalesce({expires_at} > {now}, false) and {is_reachable_sql(status_code)}"


def handed_over(status_code: int | None, body: str | None, fetched_at: datetime | None,
                expires_at: datetime | None, good_status_code: int | None, good_at: datetime | None,
                now: datetime) -> tuple[int | None, str | None, datetime | None, datetime | None] | None:
    """The robots.txt a host's `hosts` row hands the daemons (generate puts it on the host's first fetch-list row,
    as status code, body, fetched at, expires at): the last observation while it may stand in for a fetch
    (`observation_reusable`), else the last good copy, expired (the daemon fetches again and keeps the copy through
    an outage: `adopt`), else nothing. A row older than the good-copy columns: its last observation if reachable."""
    if observation_reusable(status_code, expires_at, now):
        return status_code, body, fetched_at, expires_at
    if good_at is None and fetched_at is not None and not is_unreachable(status_code):
        good_status_code, good_at = status_code, fetched_at
    return None if good_at is None else (good_status_code, body, good_at, good_at)


def handed_over_sql(status_code: str, body: str, fetched_at: str, expires_at: str, good_status_code: str,
                    good_at: str, now: str) -> str:
    """`handed_over` over the `hosts` columns: a struct of the fetch list's robots_* names, or null."""
    good = f"coalesce({good_at}, case when {is_reachable_sql(status_code)} then {fetched_at} end)"

    def copy(status: str, at: str, until: str) -> str:
        return (f"named_struct('robots_status_code', {status}, 'robots_body', {body}, 'robots_fetched_at', {at}, "
                f"'robots_expires_at', {until})")

    return (f"case when {observation_reusable_sql(status_code, expires_at, now)} "
            f"then {copy(status_code, fetched_at, expires_at)} "
            f"when {good} is not null then {copy(f'coalesce({good_status_code}, {status_code})', good, good)} end")


# RFC 9309 2.3.1.4: while robots.txt is unreachable, a cached copy may stand in for at most 30 days (the config
# cannot raise it: robots.unreachable_use_cached_days).
MAX_USE_CACHED_DAYS = 30


@dataclass(frozen=True)
class RobotsCacheRules:
    """How long a daemon trusts what it learned of a host's robots.txt (`robots.*`)."""

    ttl_s: float           # a reachable answer is trusted this long, then fetched again (RFC 9309 §2.4)
    use_cached_s: float    # while unreachable, the last reachable answer stays in force while younger than this
    retry_s: float         # first re-fetch after an unreachable answer; doubles per unreachable answer in a row

    @classmethod
    def from_config(cls, conf: Settings) -> RobotsCacheRules:
        return cls(float(conf.robots.cache_ttl_s), float(conf.robots.unreachable_use_cached_days) * 86400.0,
                   float(conf.robots.unreachable_retry_s))


@dataclass(frozen=True)
class CachedRobots:
    """What a daemon remembers of one host's robots.txt: the policy in force until `expires` (then it fetches
    again), the last reachable answer and when it was fetched, and the unreachable answers since, in a row.
    Times are on one clock of the caller's (the daemon's monotonic clock)."""

    policy: RobotsPolicy
    expires: float
    good: RobotsPolicy | None = None
    good_at: float | None = None
    unreachable: int = 0


def adopt(cached: CachedRobots | None, stored: RobotsPolicy, stored_at: float, stored_until: float, now: float,
          rules: RobotsCacheRules) -> CachedRobots | None:
    """What a daemon knows of a host's robots.txt once it meets a stored reachable copy it did not fetch itself (the
    bucket's earlier run's, or the `hosts` copy generate handed over): `stored`, fetched at `stored_at` and in
    force until `stored_until`, on the daemon's clock. The copy decides while in force, and after that it is the
    last good copy, so an outage keeps it in force as long as `remember` allows (up to `use_cached_s` after
    `stored_at`) instead of disallowing all: a restarted daemon keeps the rules a running one would. A good copy
    the daemon holds that is as recent wins (None: keep `cached`)."""
    if cached is not None and cached.good_at is not None and cached.good_at >= stored_at:
        return None
    streak = cached.unreachable if cached is not None else 0
    if cached is None or cached.expires <= now:
        return CachedRobots(stored, stored_until, stored, stored_at, streak)
    if streak and now - stored_at < rules.use_cached_s:  # disallowing all for an outage: the copy stands in
        return CachedRobots(stored, cached.expires, stored, stored_at, streak)
    return CachedRobots(cached.policy, cached.expires, stored, stored_at, streak)


def remember(previous: CachedRobots | None, fetched: RobotsPolicy, status_code: int | None, now: float,
             rules: RobotsCacheRules) -> CachedRobots:
    """The cache entry after a robots.txt fetch at `now` (RFC 9309 §2.3.1.4 and §2.4).

    A reachable answer (2xx rules, 3xx/4xx allow all) is in force for `ttl_s` and becomes the last good copy. An
    unreachable one keeps the last good copy in force while that copy is younger than `use_cached_s`, and means
    disallow all once it is older or when there is none; either way the next fetch comes after `retry_s`, doubled
    for each unreachable answer in a row, never later than `ttl_s`."""
    if not is_unreachable(status_code):
        return CachedRobots(fetched, now + rules.ttl_s, fetched, now, 0)
    streak = (previous.unreachable if previous is not None else 0) + 1
    retry = min(rules.retry_s * 2.0 ** (streak - 1), rules.ttl_s)
    good, good_at = (previous.good, previous.good_at) if previous is not None else (None, None)
    if good is not None and good_at is not None and now - good_at < rules.use_cached_s:
        return CachedRobots(good, now + retry, good, good_at, streak)
    return CachedRobots(RobotsPolicy.disallow_all(), now + retry, None, None, streak)
