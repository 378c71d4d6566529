"""Revisit policy: what a fetch result does to a URL's status, interval, next fetch time and failure count.

One function, `RevisitPolicy.decide`, maps (outcome, status code, previous state) to the new state; the
update job calls it for every completed URL, so the rule is written once. Pure: time is passed in.

* success: first content -> default interval; changed -> interval * changed_factor; unchanged ->
  interval * unchanged_factor; clamped to [min_interval_s, max_interval_s].
* 304: status not_modified, interval * unchanged_factor (clamped).
* A sitemap (the row has a sitemap origin) adapts the same way between its own clamps,
  [sitemap_min_interval_s, sitemap_max_interval_s], and starts at the lower one: a sitemap is where a site lists
  what it published, so one that keeps changing is re-read within minutes, not after the days a page waits.
* 3xx: status redirect, default interval (the target is a URL of its own).
* 404/410: tombstone `gone`, revisited after gone_interval_s. Other 4xx (but 429): `excluded`, failed_interval_s.
* 5xx, 429, network error: transient. The n-th failure in a row retries after retry_base_s * 2^(n-1) with
  status retry; the max_failures-th marks the URL failed, revisited after failed_interval_s.
* robots_denied: status robots_denied, rechecked when the host's robots policy expires (a new robots.txt may
  allow it), or after robots_denied_interval_s when the expiry is unknown (no failure counted).
* blocked (SSRF guard): excluded, failed_interval_s (no failure counted).
* deferred: not attempted this segment; due again at once, status, interval and failures unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from crawler.settings import Settings
from crawler.status import FetchOutcome, UrlStatus, is_gone, is_transient


@dataclass(frozen=True)
class PreviousState:
    """The URL's row before this result: what the policy adapts from."""

    status: str
    fetch_interval_s: int
    failure_count: int
    content_hash: str | None       # hash of the last content seen (None: never had content)
    is_sitemap: bool = False       # the row has a sitemap origin: a sitemap file, read for its entries


@dataclass(frozen=True)
class Decision:
    status: str
    fetch_interval_s: int
    next_fetch_at: datetime
    failure_count: int


@dataclass(frozen=True)
class RevisitPolicy:
    default_interval_s: int
    min_interval_s: int
    max_interval_s: int
    changed_factor: float
    unchanged_factor: float
    retry_base_s: int
    max_failures: int
    failed_interval_s: int
    gone_interval_s: int
    robots_denied_interval_s: int
    sitemap_min_interval_s: int
    sitemap_max_interval_s: int

    @classmethod
    def from_config(cls, conf: Settings) -> RevisitPolicy:
        return cls(**{name: getattr(conf.revisit, name) for name in cls.__dataclass_fields__})

    def clamp(self, seconds: float, sitemap: bool = False) -> int:
        lower, upper = ((self.sitemap_min_interval_s, self.sitemap_max_interval_s) if sitemap
                        else (self.min_interval_s, self.max_interval_s))
        return int(min(max(seconds, lower), upper))

    def decide(
        self,
        outcome: str,
        status_code: int | None,
        previous: PreviousState,
        fetched_at: datetime,
        new_content_hash: str | None = None,
        robots_expires_at: datetime | None = None,
    ) -> Decision:
        """The URL's new (status, interval, next fetch time, failure count) after one result;
        `robots_expires_at` is when the host's robots policy in force expires (robots_denied only)."""
        interval = previous.fetch_interval_s

        def after(status: str, stored_interval: int, wait_s: float, failures: int = 0) -> Decision:
            return Decision(status, int(stored_interval), fetched_at + timedelta(seconds=wait_s), failures)

        sitemap = previous.is_sitemap
        if outcome == FetchOutcome.SUCCESS:
            if previous.content_hash is None:
                new_interval = self.sitemap_min_interval_s if sitemap else self.default_interval_s
            elif new_content_hash is None:
                new_interval = self.clamp(interval, sitemap)
            elif new_content_hash != previous.content_hash:
                new_interval = self.clamp(interval * self.changed_factor, sitemap)
            else:
                new_interval = self.clamp(interval * self.unchanged_factor, sitemap)
            return after(UrlStatus.FETCHED.value, new_interval, new_interval)
        if outcome == FetchOutcome.NOT_MODIFIED:
            new_interval = self.clamp(interval * self.unchanged_factor, sitemap)
            return after(UrlStatus.NOT_MODIFIED.value, new_interval, new_interval)
        if outcome == FetchOutcome.REDIRECT:
            return after(UrlStatus.REDIRECT.value, self.default_interval_s, self.default_interval_s)
        if is_transient(outcome, status_code):
            failures = previous.failure_count + 1
            if failures >= self.max_failures:
                return after(UrlStatus.FAILED.value, self.failed_interval_s, self.failed_interval_s, failures)
            return after(UrlStatus.RETRY.value, interval, self.retry_base_s * 2 ** (failures - 1), failures)
        if is_gone(outcome, status_code):
            return after(UrlStatus.GONE.value, self.gone_interval_s, self.gone_interval_s)
        if outcome == FetchOutcome.HTTP_ERROR:
            return after(UrlStatus.EXCLUDED.value, self.failed_interval_s, self.failed_interval_s)
        if outcome == FetchOutcome.ROBOTS_DENIED:
            wait_s = (self.robots_denied_interval_s if robots_expires_at is None
                      else max(0.0, (robots_expires_at - fetched_at).total_seconds()))
            return after(UrlStatus.ROBOTS_DENIED.value, self.robots_denied_interval_s, wait_s, previous.failure_count)
        if outcome == FetchOutcome.BLOCKED:
            failures = previous.failure_count
            return after(UrlStatus.EXCLUDED.value, self.failed_interval_s, self.failed_interval_s, failures)
        if outcome == FetchOutcome.DEFERRED:
            return after(previous.status, interval, 0, previous.failure_count)
        raise ValueError(f"unknown fetch outcome {outcome!r}")
