"""Revisit policy: what a fetch result does to a URL's status, interval, next fetch time and failure count.

One function, `RevisitPolicy.decide`, maps (outcome, status code, previous state) to the new state; the
update job evaluates its SQL twin, `RevisitPolicy.decide_sql`, for every completed URL (tests/test_rule_twins.py
holds the two to the same answers). Pure: time is passed in.

* success: first content -> default interval; changed -> interval * changed_factor; unchanged ->
  interval * unchanged_factor; clamped to [min_interval_s, max_interval_s].
* 304, or a 200 whose payload is the stored one (identical_payload, written as a revisit record): status
  not_modified, interval * unchanged_factor (clamped).
* A sitemap (the row has a sitemap origin) adapts the same way between its own clamps,
  [sitemap_min_interval_s, sitemap_max_interval_s], and starts at the lower one: a sitemap is where a site lists
  what it published, so one that keeps changing is re-read within minutes, not after the days a page waits.
* 3xx: status redirect, default interval (the target is a URL of its own).
* 404/410: tombstone `gone`, revisited after gone_interval_s. Other 4xx (but 429): `excluded`, failed_interval_s.
* 5xx, 429, network error: transient. The n-th failure in a row retries after retry_base_s * 2^(n-1), stretched
  by up to retry_jitter of it (`retry_wait_us`: a hash of the URL and n, so a re-run decides the same), with
  status retry; the max_failures-th marks the URL failed, revisited after failed_interval_s.
* robots_denied: status robots_denied, rechecked when the host's robots policy expires (a new robots.txt may
  allow it), or after robots_denied_interval_s when the expiry is unknown (no failure counted).
* blocked (SSRF guard): excluded, failed_interval_s (no failure counted).
* deferred: not attempted this segment; due again at once, status, interval and failures unchanged.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from crawler.settings import Settings
from crawler.status import (
    FetchOutcome,
    UrlStatus,
    is_gone,
    is_gone_sql,
    is_transient,
    is_transient_sql,
    is_unchanged,
    is_unchanged_sql,
)

# The jitter's resolution: its share in thousandths, its hash in 16 bits (products stay far inside a bigint).
_JITTER_SCALE = 1000
_HASH_BITS = 16


def _jitter_key(url_id: str, failures: int) -> bytes:
    return f"{url_id}:{failures}".encode()


@dataclass(frozen=True)
class PreviousState:
    """The URL's row before this result: what the policy adapts from."""

    status: str
    fetch_interval_s: int
    failure_count: int
    content_hash: str | None       # hash of the last content seen (None: never had content)
    is_sitemap: bool = False       # the row has a sitemap origin: a sitemap file, read for its entries
    url_id: str = ""               # the URL's id: keys its retries' jitter (one URL's retries spread like any other's)


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
    retry_jitter: float
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

    def retry_wait_us(self, url_id: str, failures: int) -> int:
        """Microseconds to wait after the `failures`-th transient failure in a row: retry_base_s * 2^(failures-1),
        plus up to `retry_jitter` of that, chosen by a CRC-32 of the URL's id and `failures` (the same in SQL)."""
        base_us = self.retry_base_s * 2 ** (failures - 1) * 1_000_000
        share = zlib.crc32(_jitter_key(url_id, failures)) >> (32 - _HASH_BITS)
        permille = round(self.retry_jitter * _JITTER_SCALE)
        return base_us + (base_us // _JITTER_SCALE) * permille * share // (1 << _HASH_BITS)

    def retry_wait_us_sql(self, url_id: str, failures: str) -> str:
        """`retry_wait_us` over columns (`failures`: the failure count after this one)."""
        base_us = f"({self.retry_base_s} * shiftleft(cast(1 as bigint), {failures} - 1) * 1000000)"
        key = f"cast(concat({url_id}, ':', cast({failures} as string)) as binary)"
        share = f"shiftright(crc32({key}), {32 - _HASH_BITS})"
        permille = round(self.retry_jitter * _JITTER_SCALE)
        return f"({base_us} + ({base_us} div {_JITTER_SCALE}) * {permille} * {share} div {1 << _HASH_BITS})"

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

        def after(status: str, stored_interval: int, wait_s: float, failures: int = 0, wait_us: int | None = None
                  ) -> Decision:
            wait = timedelta(seconds=wait_s) if wait_us is None else timedelta(microseconds=wait_us)
            return Decision(status, int(stored_interval), fetched_at + wait, failures)

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
        if is_unchanged(outcome):
            new_interval = self.clamp(interval * self.unchanged_factor, sitemap)
            return after(UrlStatus.NOT_MODIFIED.value, new_interval, new_interval)
        if outcome == FetchOutcome.REDIRECT:
            return after(UrlStatus.REDIRECT.value, self.default_interval_s, self.default_interval_s)
        if is_transient(outcome, status_code):
            failures = previous.failure_count + 1
            if failures >= self.max_failures:
                return after(UrlStatus.FAILED.value, self.failed_interval_s, self.failed_interval_s, failures)
            return after(UrlStatus.RETRY.value, interval, 0, failures, self.retry_wait_us(previous.url_id, failures))
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

    def decide_sql(self, outcome: str, status_code: str, prev_status: str, prev_interval: str, prev_failures: str,
                   prev_hash: str, new_hash: str, robots_wait_us: str, is_sitemap: str, url_id: str
                   ) -> dict[str, str]:
        """`decide` over columns, one SQL expression per field of the decision: `status`, `fetch_interval_s`,
        `failure_count`, and `wait_us`, the microseconds from the fetch to the next one (`robots_wait_us`: from
        the fetch to the expiry of the host's robots policy, null when unknown). An unknown outcome fails the
        query, as `decide` raises."""
        lower = f"(case when {is_sitemap} then {self.sitemap_min_interval_s} else {self.min_interval_s} end)"
        upper = f"(case when {is_sitemap} then {self.sitemap_max_interval_s} else {self.max_interval_s} end)"

        def clamp(seconds: str) -> str:
            return f"cast(least(greatest({seconds}, {lower}), {upper}) as bigint)"

        first = f"(case when {is_sitemap} then {self.sitemap_min_interval_s} else {self.default_interval_s} end)"

        def scaled(factor: float) -> str:
            # A double literal (`D`): a bare 0.7 is a decimal in Spark SQL, whose exact product (60480 for
            # 86400 * 0.7) `int()` of Python's float product (60479.99...) would not match.
            return clamp(f"{prev_interval} * {float(factor)!r}D")

        fetched = (f"(case when {prev_hash} is null then {first} when {new_hash} is null then {clamp(prev_interval)}"
                   f" when {new_hash} <> {prev_hash} then {scaled(self.changed_factor)}"
                   f" else {scaled(self.unchanged_factor)} end)")
        unchanged = scaled(self.unchanged_factor)
        failures = f"({prev_failures} + 1)"
        gives_up = f"{failures} >= {self.max_failures}"
        retry_wait_us = self.retry_wait_us_sql(url_id, failures)
        robots_wait = (f"(case when {robots_wait_us} is null then {self.robots_denied_interval_s * 1_000_000}"
                       f" else greatest({robots_wait_us}, 0) end)")

        def status(value: UrlStatus) -> str:
            return f"'{value.value}'"

        # (condition, status, stored interval, wait in microseconds, failure count), in `decide`'s order.
        branches = [
            (f"{outcome} = '{FetchOutcome.SUCCESS.value}'", status(UrlStatus.FETCHED), fetched,
             f"{fetched} * 1000000", "0"),
            (is_unchanged_sql(outcome), status(UrlStatus.NOT_MODIFIED), unchanged,
             f"{unchanged} * 1000000", "0"),
            (f"{outcome} = '{FetchOutcome.REDIRECT.value}'", status(UrlStatus.REDIRECT),
             str(self.default_interval_s), str(self.default_interval_s * 1_000_000), "0"),
            (is_transient_sql(outcome, status_code),
             f"case when {gives_up} then {status(UrlStatus.FAILED)} else {status(UrlStatus.RETRY)} end",
             f"case when {gives_up} then {self.failed_interval_s} else {prev_interval} end",
             f"case when {gives_up} then {self.failed_interval_s * 1_000_000} else {retry_wait_us} end",
             failures),
            (is_gone_sql(outcome, status_code), status(UrlStatus.GONE), str(self.gone_interval_s),
             str(self.gone_interval_s * 1_000_000), "0"),
            (f"{outcome} = '{FetchOutcome.HTTP_ERROR.value}'", status(UrlStatus.EXCLUDED),
             str(self.failed_interval_s), str(self.failed_interval_s * 1_000_000), "0"),
            (f"{outcome} = '{FetchOutcome.ROBOTS_DENIED.value}'", status(UrlStatus.ROBOTS_DENIED),
             str(self.robots_denied_interval_s), robots_wait, prev_failures),
            (f"{outcome} = '{FetchOutcome.BLOCKED.value}'", status(UrlStatus.EXCLUDED), str(self.failed_interval_s),
             str(self.failed_interval_s * 1_000_000), prev_failures),
            (f"{outcome} = '{FetchOutcome.DEFERRED.value}'", prev_status, prev_interval, "0", prev_failures),
        ]
        unknown = f"raise_error(concat('unknown fetch outcome ', coalesce({outcome}, 'null')))"

        def field(index: int, kind: str) -> str:
            cases = " ".join(f"when {branch[0]} then {branch[index]}" for branch in branches)
            return f"cast(case {cases} else {unknown} end as {kind})"

        return {"status": field(1, "string"), "fetch_interval_s": field(2, "bigint"), "wait_us": field(3, "bigint"),
                "failure_count": field(4, "int")}
