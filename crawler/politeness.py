"""Politeness rule (DESIGN §2.1) in one place: the per-host delay, server-directed backoff and host pausing.

Pure: time is passed in, randomness comes from a caller's `random.Random`. The fetch daemon keeps one
`HostGate` per host; the rule it enforces is

    delay = max(politeness.min_delay_s, min(robots Crawl-delay, politeness.max_crawl_delay_s), backoff)

counted from the END of the previous request to the host (or its failure), never from its dispatch, with at
most `politeness.max_concurrency_per_host` requests in flight and request starts at least `delay` apart.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

BACKOFF_JITTER = 0.25  # exponential backoff is stretched by a random factor in [1, 1 + this)
BACKOFF_STATUSES = frozenset({429, 503})  # statuses whose Retry-After header directs our backoff


def effective_delay(
    min_delay_s: float, crawl_delay_s: float | None, max_crawl_delay_s: float, backoff_s: float
) -> float:
    """Seconds between the end of one request to a host and the start of the next."""
    robots = min(crawl_delay_s, max_crawl_delay_s) if crawl_delay_s is not None else 0.0
    return max(min_delay_s, robots, backoff_s)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date (RFC 9110 §10.2.3).
    A date in the past gives 0; anything unreadable gives None (the caller falls back to exponential)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def is_failure(status_code: int | None) -> bool:
    """A response that tells us to slow down: none at all (network error), 429 or a 5xx."""
    return status_code is None or status_code == 429 or status_code >= 500


def backoff_seconds(
    failures: int, base_s: float, cap_s: float, retry_after_s: float | None, rng: random.Random
) -> float:
    """Backoff after the `failures`-th consecutive failure: the server's Retry-After if it gave one, else
    base * 2^(failures-1) stretched by jitter; capped at `cap_s` either way."""
    if retry_after_s is not None:
        return min(max(0.0, retry_after_s), cap_s)
    exponential = base_s * (2 ** max(0, failures - 1)) * (1.0 + BACKOFF_JITTER * rng.random())
    return min(exponential, cap_s)


@dataclass
class HostGate:
    """Politeness state of one host inside one daemon: when it may start its next request."""

    min_delay_s: float
    max_crawl_delay_s: float
    max_concurrency: int
    backoff_base_s: float
    max_backoff_s: float
    max_failures: int
    crawl_delay_s: float | None = None
    backoff_s: float = 0.0
    failures: int = 0
    in_flight: int = 0
    next_allowed_at: float = 0.0
    last_start_at: float | None = None
    last_end_at: float | None = None
    paused: bool = False

    def delay_s(self) -> float:
        return effective_delay(self.min_delay_s, self.crawl_delay_s, self.max_crawl_delay_s, self.backoff_s)

    def can_start(self, now: float) -> bool:
        return not self.paused and self.in_flight < self.max_concurrency and now >= self.next_allowed_at

    def started(self, now: float) -> None:
        """A request to the host starts now; the next start is at least one delay later."""
        if not self.can_start(now):
            raise RuntimeError("request started against the host's politeness gate")
        self.in_flight += 1
        self.last_start_at = now
        self.next_allowed_at = max(self.next_allowed_at, now + self.delay_s())

    def finished(self, now: float, status_code: int | None, retry_after_s: float | None, rng: random.Random) -> None:
        """A request ended (response read or failure) at `now`: update backoff, maybe pause, and hold the
        host for one delay (as it now stands) counted from now, or from a later start still in flight."""
        self.in_flight -= 1
        if is_failure(status_code):
            self.failures += 1
            directed = retry_after_s if status_code in BACKOFF_STATUSES else None
            self.backoff_s = backoff_seconds(self.failures, self.backoff_base_s, self.max_backoff_s, directed, rng)
            if self.failures >= self.max_failures:
                self.paused = True
        else:
            self.failures = 0
            self.backoff_s = 0.0
        self.last_end_at = now
        self.next_allowed_at = max(now, self.last_start_at or now) + self.delay_s()

    def set_crawl_delay(self, crawl_delay_s: float | None) -> None:
        """Adopt a robots.txt Crawl-delay; it already applies to the gap after the request that fetched it."""
        self.crawl_delay_s = crawl_delay_s
        if self.last_end_at is not None:
            self.next_allowed_at = max(self.next_allowed_at, self.last_end_at + self.delay_s())
