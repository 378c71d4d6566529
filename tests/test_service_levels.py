"""crawler/service_levels.py: the two service levels' definitions and targets, in plain Python (their SQL twins are
held equal to these in tests/test_rule_twins.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crawler.service_levels import (
    LeaseOutcome,
    ServiceLevels,
    due_since,
    is_eligible,
    is_high_priority,
    lag_s,
    lease_decided,
    lease_outcome,
    percentile,
    share_within,
)
from crawler.status import HostState

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
LEVELS = ServiceLevels(discovery_durable_s=60.0, lease_within_s=600.0, lease_share=0.99, high_priority=1.0)


def test_targets_and_threshold_come_from_the_config(base_conf):
    conf = base_conf.with_overrides({"service_levels.lease_share": 0.95, "generate.high_priority": 2.5})
    levels = ServiceLevels.from_config(conf)
    assert (levels.discovery_durable_s, levels.lease_within_s) == (conf.service_levels.discovery_durable_s,
                                                                   conf.service_levels.lease_within_s)
    assert (levels.lease_share, levels.high_priority) == (0.95, 2.5)


def test_high_priority_is_at_or_above_the_threshold():
    assert is_high_priority(1.0, 1.0) and is_high_priority(1.5, 1.0) and not is_high_priority(0.99, 1.0)


def test_a_url_falls_due_at_its_next_fetch_time_or_when_it_became_known():
    assert due_since(T0, T0 - timedelta(hours=1)) == T0
    assert due_since(T0 - timedelta(days=3), T0) == T0  # discovered with a next fetch time in the past


@pytest.mark.parametrize(("state", "rank", "cap", "eligible"), [
    (HostState.OK.value, 0, 1, True), (HostState.OK.value, 1, 1, False), (HostState.OK.value, 4, 5, True),
    (HostState.BACKING_OFF.value, 0, 5, False), (HostState.DEAD.value, 0, 1, False),
    (HostState.ROBOTS_UNREACHABLE.value, 0, 5, False)])
def test_eligible_means_a_host_in_state_ok_and_a_rank_within_its_cap(state, rank, cap, eligible):
    assert is_eligible(state, rank, cap) is eligible


def test_lease_outcome_at_the_target_boundary():
    due = T0 - timedelta(seconds=900)
    assert lease_outcome(due, due + timedelta(seconds=600), T0, 600) is LeaseOutcome.WITHIN  # exactly the target
    assert lease_outcome(due, due + timedelta(seconds=601), T0, 600) is LeaseOutcome.LATE
    assert lease_outcome(due, None, T0, 600) is LeaseOutcome.LATE  # waiting past it: a miss already
    assert lease_outcome(T0 - timedelta(seconds=600), None, T0, 600) is LeaseOutcome.WAITING  # not decided yet
    assert lag_s(T0, due) == 900.0


def test_share_within_counts_decided_urls_only():
    assert share_within(0, 0) is None
    assert share_within(99, 1) == 0.99 and share_within(0, 3) == 0.0


def test_percentile_is_the_nearest_rank():
    lags = [float(v) for v in range(1, 101)]
    assert percentile(lags, 0.99) == 99.0 and percentile(lags, 0.5) == 50.0 and percentile(lags, 1.0) == 100.0
    assert percentile([3.0, 1.0], 0.5) == 1.0 and percentile([3.0, 1.0], 0.99) == 3.0
    assert percentile([], 0.99) is None and percentile([7.0], 0.0) == 7.0


def test_met_is_none_when_nothing_was_measured():
    assert LEVELS.discovery_met(None) is None and LEVELS.lease_met(None) is None
    assert LEVELS.discovery_met(60.0) is True and LEVELS.discovery_met(60.5) is False
    assert LEVELS.lease_met(0.99) is True and LEVELS.lease_met(0.989) is False


def test_misses_name_each_level_missed_with_its_figures_and_target():
    chosen = {"hp_leased_within": 90, "hp_leased_late": 4, "hp_waiting_late": 6, "lease_share_within": 0.9}
    merged = {"discovery_pages": 40, "discovery_durable_p99_s": 75.2}
    assert lease_decided(chosen) == 100
    assert LEVELS.misses({"generate": chosen, "update": merged}) == [
        "discovery: p99 of 40 pages' fetch-to-durable lags is 75 s, over the 60 s target",
        "leases: 90 of 100 eligible high-priority URLs leased within 600 s (90.0 %), under the 99 % target",
    ]
    met = {"generate": {**chosen, "lease_share_within": 1.0}, "update": {**merged, "discovery_durable_p99_s": 20.0}}
    assert LEVELS.misses(met) == []
    # Nothing measured (no page with outlinks, no URL decided) or a row missing: nothing to alert on.
    assert LEVELS.misses({"generate": {"lease_share_within": None}, "update": None}) == []
    assert LEVELS.misses({}) == []
