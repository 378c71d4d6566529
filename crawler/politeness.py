"""Politeness rule (DESIGN §2.1) in one place: the per-host delay, server-directed backoff and host pausing.

Pure: time is passed in, randomness comes from a caller's `random.Random`. The fetch daemon keeps one
`HostGate` per host; the rule it enforces is

    delay = max(politeness.min_delay_s, min(robots Crawl-delay, politeness.max_crawl_delay_s), backoff,
                min(politeness.response_time_factor * last response time, politeness.max_response_time_delay_s))

counted from the END of the previous request to the host (or its failure), never from its dispatch, with
request starts at least `delay` apart and at most `politeness.max_concurrency_per_host` requests in flight.
Adaptive: a failure (network error, 429, 5xx) sets the backoff (Retry-After, else exponential) and drops the
host to one request in flight; each later success multiplies the backoff by `politeness.backoff_recovery_factor`
instead of clearing it, and once it no longer exceeds the delay without it, it is over and the host gets its
full concurrency back. No response lowers the delay below the minimum: every term only adds to it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from crawler.config import Config

BACKOFF_JITTER = 0.25  # exponential backoff is stretched by a random factor in [1, 1 + this)
BACKOFF_STATUSES = frozenset({429, 503})  # statuses whose Retry-After header directs our backoff
NEGLIGIBLE_BACKOFF_S = 0.01  # a recovering backoff this small is over even when the minimum delay is 0


def effective_delay(
    min_delay_s: float, crawl_delay_s: float | None, max_crawl_delay_s: float, backoff_s: float,
    response_delay_s: float = 0.0,
) -> float:
    """Seconds between the end of one request to a host and the start of the next."""
    robots = min(crawl_delay_s, max_crawl_delay_s) if crawl_delay_s is not None else 0.0
    return max(min_delay_s, robots, backoff_s, response_delay_s)


def response_time_delay(elapsed_s: float | None, factor: float, cap_s: float) -> float:
    """The delay a response time asks for: `factor` x elapsed, at most `cap_s`; 0 when off or unknown."""
    if not factor or elapsed_s is None or not math.isfinite(elapsed_s):
        return 0.0
    return min(factor * max(0.0, elapsed_s), cap_s)


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
    """Politeness state of one host inside one daemon: when it may start its next request.

    `max_concurrency` is the host's allowance now: 1 while a backoff is in force, the configured
    `concurrency_cap` again once it is over (schedulers read it, so it always holds what `can_start` uses)."""

    min_delay_s: float
    max_crawl_delay_s: float
    max_concurrency: int
    backoff_base_s: float
    max_backoff_s: float
    max_failures: int
    recovery_factor: float = 0.5        # each success multiplies the backoff by this (0: a success ends it)
    response_time_factor: float = 0.0   # k in the k x response time delay term (0: off)
    max_response_time_delay_s: float = 60.0
    crawl_delay_s: float | None = None
    backoff_s: float = 0.0
    response_delay_s: float = 0.0
    failures: int = 0
    in_flight: int = 0
    next_allowed_at: float = 0.0
    hold_until: float = 0.0             # a server's Retry-After: nothing starts before it, whatever ends later
    last_start_at: float | None = None
    last_end_at: float | None = None
    paused: bool = False
    concurrency_cap: int = 0            # the configured concurrency (defaults to max_concurrency)

    def __post_init__(self) -> None:
        self.concurrency_cap = self.concurrency_cap or self.max_concurrency

    @classmethod
    def from_config(cls, conf: Config) -> HostGate:
        """A new host's gate under the `politeness.*` settings."""
        return cls(
            min_delay_s=conf["politeness.min_delay_s"],
            max_crawl_delay_s=conf["politeness.max_crawl_delay_s"],
            max_concurrency=conf["politeness.max_concurrency_per_host"],
            backoff_base_s=conf["politeness.backoff_base_s"],
            max_backoff_s=conf["politeness.max_backoff_s"],
            max_failures=conf["politeness.max_consecutive_failures"],
            recovery_factor=conf["politeness.backoff_recovery_factor"],
            response_time_factor=conf["politeness.response_time_factor"],
            max_response_time_delay_s=conf["politeness.max_response_time_delay_s"],
        )

    def _delay_without_backoff(self) -> float:
        return effective_delay(self.min_delay_s, self.crawl_delay_s, self.max_crawl_delay_s, 0.0,
                               self.response_delay_s)

    def delay_s(self) -> float:
        return max(self._delay_without_backoff(), self.backoff_s)

    def can_start(self, now: float) -> bool:
        return not self.paused and self.in_flight < self.max_concurrency and now >= self.next_allowed_at

    def started(self, now: float) -> None:
        """A request to the host starts now; the next start is at least one delay later."""
        if not self.can_start(now):
            raise RuntimeError("request started against the host's politeness gate")
        self.in_flight += 1
        self.last_start_at = now
        self.next_allowed_at = max(self.next_allowed_at, now + self.delay_s())

    def abandoned(self, now: float) -> None:
        """Every request still counted in flight was cancelled (its bucket run stopped) and will never call
        `finished`: release them all, holding the host for one delay from now, since the server may have seen
        them. Only for a host none of whose requests is still running."""
        if self.in_flight:
            self.in_flight = 0
            self.next_allowed_at = max(self.next_allowed_at, now + self.delay_s())

    def finished(self, now: float, status_code: int | None, retry_after_s: float | None, rng: random.Random,
                 elapsed_s: float | None = None) -> None:
        """A request ended (response read or failure) at `now` after `elapsed_s`: update the response-time
        term and backoff, maybe pause, and hold the host for one delay (as it now stands) counted from now,
        or from a later start still in flight."""
        self.in_flight -= 1
        self.response_delay_s = response_time_delay(elapsed_s, self.response_time_factor,
                                                    self.max_response_time_delay_s)
        if is_failure(status_code):
            self.failures += 1
            directed = retry_after_s if status_code in BACKOFF_STATUSES else None
            fresh = backoff_seconds(self.failures, self.backoff_base_s, self.max_backoff_s, directed, rng)
            if directed is not None:
                self.hold_until = max(self.hold_until, now + fresh)
            self.backoff_s = max(self.backoff_s, fresh)  # a failure while recovering never shortens the backoff
            self.max_concurrency = 1
            if self.failures >= self.max_failures:
                self.paused = True
        else:
            self.failures = 0
            self._recover()
        self.last_end_at = now
        self.next_allowed_at = max(max(now, self.last_start_at or now) + self.delay_s(), self.hold_until)

    def _recover(self) -> None:
        """A success shrinks the backoff by `recovery_factor`; once it no longer adds to the delay it is over
        and the host gets its configured concurrency back."""
        self.backoff_s *= self.recovery_factor
        if self.backoff_s <= max(self._delay_without_backoff(), NEGLIGIBLE_BACKOFF_S):
            self.backoff_s = 0.0
            self.max_concurrency = self.concurrency_cap

    def set_crawl_delay(self, crawl_delay_s: float | None) -> bool:
        """Adopt a robots.txt Crawl-delay; it already applies to the gap after the request that fetched it.
        True when it asks for more than `max_crawl_delay_s` and differs from the one held before, so the caller
        reports the cap once per host (not again for the same cached robots.txt)."""
        newly_capped = (crawl_delay_s is not None and crawl_delay_s > self.max_crawl_delay_s
                        and crawl_delay_s != self.crawl_delay_s)
        self.crawl_delay_s = crawl_delay_s
        if self.last_end_at is not None:
            self.next_allowed_at = max(self.next_allowed_at, self.last_end_at + self.delay_s())
        return newly_capped

    def ended_elsewhere(self, at: float, crawl_delay_known: bool = True) -> None:
        """Another process's request to the host ended at `at` (at the latest): the previous owner of its
        bucket. The delay counts from there too, as if this gate had seen that request. When this process does
        not know the host's robots.txt yet (`crawl_delay_known` False), the previous owner may have been obeying
        any Crawl-delay up to `max_crawl_delay_s`, and the next request here is the robots.txt fetch that would
        tell: it waits as if the host asked for the cap."""
        self.last_end_at = at if self.last_end_at is None else max(self.last_end_at, at)
        owed = self.delay_s()
        if not crawl_delay_known:
            owed = max(owed, effective_delay(self.min_delay_s, self.max_crawl_delay_s, self.max_crawl_delay_s, 0.0))
        self.next_allowed_at = max(self.next_allowed_at, at + owed)
