"""Revisit policy: adaptive intervals, clamps, retries with backoff, tombstones, deferred results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crawler import config as config_mod
from crawler.frontier import index_event_kind
from crawler.revisit import PreviousState, RevisitPolicy

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
DAY = 86400


@pytest.fixture(scope="module")
def policy() -> RevisitPolicy:
    return RevisitPolicy.from_config(config_mod.load())


def prev(status="fetched", interval=4 * DAY, failures=0, content_hash="h1") -> PreviousState:
    return PreviousState(status, interval, failures, content_hash)


def test_from_config_reads_every_revisit_key(policy):
    assert policy.default_interval_s == 604800
    assert (policy.min_interval_s, policy.max_interval_s) == (86400, 2592000)
    assert policy.max_failures == 4


def test_a_sitemap_is_reread_within_minutes_while_it_changes_and_backs_off_to_a_day_when_it_does_not(policy):
    assert (policy.sitemap_min_interval_s, policy.sitemap_max_interval_s) == (900, DAY)
    first = policy.decide("success", 200, PreviousState("unfetched", 604800, 0, None, is_sitemap=True), T0, "h1")
    assert (first.status, first.fetch_interval_s, first.next_fetch_at) == ("fetched", 900, T0 + timedelta(minutes=15))
    state, intervals = PreviousState("fetched", first.fetch_interval_s, 0, "h1", is_sitemap=True), []
    for outcome, code, new_hash in [("success", 200, "h1"), ("not_modified", 304, None)] * 4:
        d = policy.decide(outcome, code, state, T0, new_hash)
        intervals.append(d.fetch_interval_s)
        state = PreviousState(d.status, d.fetch_interval_s, 0, "h1", is_sitemap=True)
    assert intervals == [1350, 2025, 3037, 4555, 6832, 10248, 15372, 23058]  # unchanged: x1.5 each time (whole s)
    assert policy.decide("not_modified", 304, PreviousState("fetched", 20 * DAY, 0, "h1", True), T0).fetch_interval_s \
        == DAY  # its upper clamp, not a page's 30 days (a row fetched before the sitemap was known as one: 1 day)
    changed = policy.decide("success", 200, PreviousState("fetched", 1000, 0, "h1", True), T0, "h2")
    assert changed.fetch_interval_s == 900  # halved, held at its lower clamp, far under a page's 1-day floor
    page = policy.decide("success", 200, PreviousState("fetched", 1000, 0, "h1"), T0, "h2")
    assert page.fetch_interval_s == DAY  # the same row as a page: a page's clamps


def test_first_fetch_gets_default_interval(policy):
    d = policy.decide("success", 200, prev("unfetched", 604800, 0, None), T0, "h1")
    assert (d.status, d.fetch_interval_s, d.failure_count) == ("fetched", 604800, 0)
    assert d.next_fetch_at == T0 + timedelta(seconds=604800)


def test_changed_shortens_unchanged_lengthens(policy):
    changed = policy.decide("success", 200, prev(), T0, "h2")
    same = policy.decide("success", 200, prev(), T0, "h1")
    not_modified = policy.decide("not_modified", 304, prev(), T0)
    assert changed.fetch_interval_s == 2 * DAY
    assert same.fetch_interval_s == 6 * DAY
    assert (not_modified.status, not_modified.fetch_interval_s) == ("not_modified", 6 * DAY)


def test_intervals_are_clamped(policy):
    assert policy.decide("success", 200, prev(interval=DAY), T0, "other").fetch_interval_s == DAY
    assert policy.decide("not_modified", 304, prev(interval=29 * DAY), T0).fetch_interval_s == 30 * DAY


def test_transient_failures_back_off_then_fail(policy):
    state = PreviousState("fetched", 4 * DAY, 0, "h1", url_id="u1")
    waits = []
    for code in (503, 429, None):
        outcome = "network_error" if code is None else "http_error"
        d = policy.decide(outcome, code, state, T0)
        assert d.status == "retry" and d.fetch_interval_s == 4 * DAY
        waits.append((d.next_fetch_at - T0).total_seconds())
        state = PreviousState(d.status, d.fetch_interval_s, d.failure_count, "h1", url_id="u1")
    # retry_base_s doubled per failure, stretched by up to retry_jitter (0.25) of it
    assert [int(w // 3600) for w in waits] == [1, 2, 4]
    assert all(base <= w < 1.25 * base for w, base in zip(waits, (3600, 7200, 14400), strict=True))
    final = policy.decide("http_error", 500, state, T0)
    assert (final.status, final.failure_count, final.fetch_interval_s) == ("failed", 4, 2592000)


def test_retries_spread_over_the_jitter_window_and_repeat_for_a_url_and_attempt(policy):
    """A host's URLs failing together do not come due together: their waits spread over [base, 1.25 base); the
    same URL at the same attempt always waits the same (a re-run of update decides the same)."""
    def wait_us(url_id: str, failures: int = 0) -> int:
        d = policy.decide("http_error", 503, PreviousState("fetched", 4 * DAY, failures, "h1", url_id=url_id), T0)
        return (d.next_fetch_at - T0) // timedelta(microseconds=1)

    waits = [wait_us(f"{n:032x}") for n in range(2000)]
    base = 3600 * 1_000_000
    assert base <= min(waits) < 1.01 * base and 1.24 * base < max(waits) < 1.25 * base
    assert len(set(waits)) > 1900
    quarter = [sum(base * (1 + q / 16) <= w < base * (1 + (q + 1) / 16) for w in waits) for q in range(4)]
    assert all(400 < count < 600 for count in quarter), quarter  # about evenly spread
    assert wait_us("abc", 1) == wait_us("abc", 1) != wait_us("abc", 2)
    assert RevisitPolicy.from_config(config_mod.load().with_overrides({"revisit.retry_jitter": 0})).retry_wait_us(
        "abc", 2) == 7200 * 1_000_000


def test_success_resets_failures(policy):
    assert policy.decide("success", 200, prev("retry", 4 * DAY, 3), T0, "h1").failure_count == 0


@pytest.mark.parametrize(
    ("outcome", "code", "status", "interval"),
    [
        ("http_error", 404, "gone", 7776000),
        ("http_error", 410, "gone", 7776000),
        ("http_error", 403, "excluded", 2592000),
        ("redirect", 301, "redirect", 604800),
        ("robots_denied", None, "robots_denied", 86400),
        ("blocked", None, "excluded", 2592000),
    ],
)
def test_terminal_outcomes(policy, outcome, code, status, interval):
    d = policy.decide(outcome, code, prev(failures=2), T0)
    assert (d.status, d.fetch_interval_s) == (status, interval)
    assert d.next_fetch_at == T0 + timedelta(seconds=interval)


def test_robots_denied_is_rechecked_when_the_hosts_policy_expires(policy):
    expires = T0 + timedelta(hours=5)
    d = policy.decide("robots_denied", None, prev(failures=1), T0, robots_expires_at=expires)
    assert (d.status, d.next_fetch_at, d.failure_count) == ("robots_denied", expires, 1)
    stale_policy = policy.decide("robots_denied", None, prev(), T0, robots_expires_at=T0 - timedelta(hours=1))
    assert stale_policy.next_fetch_at == T0  # already expired: due again at once, the daemon refetches robots


def test_deferred_is_due_again_without_a_failure(policy):
    d = policy.decide("deferred", None, prev("unfetched", 604800, 1, None), T0)
    assert (d.status, d.fetch_interval_s, d.failure_count, d.next_fetch_at) == ("unfetched", 604800, 1, T0)


def test_unknown_outcome_is_an_error(policy):
    with pytest.raises(ValueError):
        policy.decide("teleported", None, prev(), T0)


def test_index_event_kinds():
    assert index_event_kind("success", 200, None, "a") == "fetched"
    assert index_event_kind("success", 200, "a", "b") == "changed"
    assert index_event_kind("success", 200, "a", "a") == "not_modified"
    assert index_event_kind("success", 200, "a", None) is None
    assert index_event_kind("not_modified", 304, "a", None) == "not_modified"
    assert index_event_kind("http_error", 404, "a", None) == "gone"
    assert index_event_kind("http_error", 500, "a", None) is None
    assert index_event_kind("deferred", None, None, None) is None


def test_duplicate_index_events():
    rep = "0" * 32
    assert index_event_kind("success", 200, None, "a", rep) == "duplicate"
    assert index_event_kind("success", 200, "a", "b", rep) == "duplicate"
    assert index_event_kind("success", 200, "a", "a", rep) == "not_modified"  # nothing new to index
    assert index_event_kind("not_modified", 304, "a", None, rep) == "not_modified"
    assert index_event_kind("http_error", 410, "a", None, rep) == "gone"
