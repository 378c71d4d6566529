"""Generate's budget split between revisits and never-fetched URLs (crawler.frontier.refresh_quota), the
adaptive refresh share (RefreshShare) and the per-domain budgets (DomainBudgets, domain_cap, spends_the_day): pure
rules; their SQL twins are in tests/test_rule_twins.py and generate's use of them in tests/test_inject_generate.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crawler import frontier


def test_refresh_quota_gives_each_side_its_share_and_the_rest_to_the_other():
    assert frontier.refresh_quota(100, 0.45, 500, 500) == (45, 55)
    assert frontier.refresh_quota(100, 0.45, 10, 500) == (10, 90)     # few revisits: discovery takes the rest
    assert frontier.refresh_quota(100, 0.45, 500, 20) == (80, 20)     # few new URLs: revisits take the rest
    assert frontier.refresh_quota(100, 0.45, 30, 20) == (30, 20)      # both short: everything
    assert frontier.refresh_quota(100, 0.0, 500, 500) == (0, 100)


def test_the_adaptive_refresh_share_moves_toward_what_pays():
    rule = frontier.RefreshShare(share=0.45, adaptive=True, min_share=0.2, max_share=0.8, gain=0.5)
    # refetched pages change a lot and fetches find few new URLs: more revisits
    assert rule.current(change_rate=0.6, new_urls_per_fetch=0.1) > 0.45
    # pages rarely change and every fetch finds several new URLs: more discovery
    assert rule.current(change_rate=0.05, new_urls_per_fetch=4.0) < 0.45
    # bounded both ways, and no figures (no update yet) keep the configured share
    assert rule.current(change_rate=1.0, new_urls_per_fetch=0.0) == 0.8
    assert rule.current(change_rate=0.0, new_urls_per_fetch=1000.0) == 0.2
    assert rule.current(None, 3.0) == rule.current(0.3, None) == 0.45
    fixed = frontier.RefreshShare(share=0.45, adaptive=False, min_share=0.2, max_share=0.8, gain=0.5)
    assert fixed.current(change_rate=1.0, new_urls_per_fetch=0.0) == 0.45


def test_domain_budgets_first_matching_pattern_else_the_default():
    budgets = frontier.DomainBudgets(40, (("wikipedia.org", 2000), ("*.blogspot.com", 5), ("*.org", 10)))
    assert budgets.cap("wikipedia.org") == 2000 and budgets.cap("WIKIPEDIA.org") == 2000
    assert budgets.cap("me.blogspot.com") == 5 and budgets.cap("blogspot.com") == 40
    assert budgets.cap("gnu.org") == 10 and budgets.cap("example.com") == 40
    assert frontier.DomainBudgets(0).cap("example.com") is None and not frontier.DomainBudgets(0).active
    assert frontier.DomainBudgets(0, (("x.com", 0),)).cap("x.com") == 0  # a known trap can be shut out
    assert frontier.DomainBudgets(0, (("x.com", 3),)).cap("y.com") is None


def test_a_segment_takes_the_smaller_of_a_domains_segment_budget_and_what_its_day_has_left():
    assert frontier.domain_cap(40, 100, 0) == 40 and frontier.domain_cap(40, 100, 75) == 25
    assert frontier.domain_cap(40, 100, 100) == 0 and frontier.domain_cap(40, 100, 130) == 0  # overspent: nothing
    assert frontier.domain_cap(None, 100, 30) == 70 and frontier.domain_cap(40, None, 30) == 40
    assert frontier.domain_cap(None, None, 30) is None


def test_what_spends_a_domains_day_fetched_since_midnight_or_out_on_another_segments_live_lease():
    now = datetime(2026, 5, 2, 15, 0, tzinfo=UTC)
    midnight = datetime(2026, 5, 2, tzinfo=UTC)

    def spends(last_fetch_at=None, lease_segment=None, lease_expires_at=None):
        return frontier.spends_the_day(last_fetch_at, lease_segment, lease_expires_at, midnight, now, "seg-b")

    assert spends(last_fetch_at=midnight) and spends(last_fetch_at=now - timedelta(hours=1))
    assert not spends(last_fetch_at=midnight - timedelta(seconds=1)) and not spends()
    assert spends(lease_segment="seg-a", lease_expires_at=now + timedelta(hours=1))
    assert not spends(lease_segment="seg-a", lease_expires_at=now - timedelta(seconds=1))  # expired: due again
    assert not spends(lease_segment="seg-b", lease_expires_at=now + timedelta(hours=1))  # this segment's own (re-run)
    assert spends(last_fetch_at=now, lease_segment="seg-b", lease_expires_at=now + timedelta(hours=1))


@pytest.mark.parametrize(("pattern", "accepted"), [
    ("example.com", True), ("*.blogspot.com", True), ("hot?.test", True), ("", False), ("  ", False),
    ("a[bc].com", False), ("a\\.com", False), ("a b.com", False), (3, False),
])
def test_domain_patterns_are_globs_of_star_and_question_mark_only(pattern, accepted):
    assert frontier.is_domain_pattern(pattern) is accepted
