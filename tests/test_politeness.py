"""The politeness rule (crawler/politeness.py): delay, Retry-After, backoff, pausing — pure, no clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from crawler.politeness import (
    HostBackoff,
    HostGate,
    PolitenessRules,
    SendAudit,
    backoff_seconds,
    effective_delay,
    parse_retry_after,
)
from crawler.status import is_transient_status


def _gate(**overrides) -> HostGate:
    values = dict(min_delay_s=1.0, max_crawl_delay_s=10.0, max_concurrency=1, backoff_base_s=2.0,
                  max_backoff_s=60.0, max_failures=3)
    values.update(overrides)
    return HostGate(**values)


def test_delay_is_the_largest_of_minimum_capped_crawl_delay_and_backoff():
    assert effective_delay(1.0, None, 10.0, 0.0) == 1.0
    assert effective_delay(1.0, 4.0, 10.0, 0.0) == 4.0
    assert effective_delay(1.0, 400.0, 10.0, 0.0) == 10.0  # Crawl-delay capped
    assert effective_delay(1.0, 4.0, 10.0, 30.0) == 30.0   # backoff wins
    assert effective_delay(5.0, 0.5, 10.0, 0.0) == 5.0     # a small Crawl-delay never lowers the minimum


def test_retry_after_seconds_and_http_date():
    now = 1_700_000_000.0
    assert parse_retry_after("120", now) == 120.0
    future = format_datetime(datetime.fromtimestamp(now + 90, UTC), usegmt=True)
    assert parse_retry_after(future, now) == pytest.approx(90.0, abs=1.0)
    past = format_datetime(datetime.fromtimestamp(now - 90, UTC), usegmt=True)
    assert parse_retry_after(past, now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("", now) is None
    assert parse_retry_after(None, now) is None
    assert parse_retry_after("-5", now) is None


def test_backoff_uses_retry_after_capped_else_exponential_with_jitter():
    rng = random.Random(1)
    assert backoff_seconds(1, 2.0, 60.0, 5.0, rng) == 5.0
    assert backoff_seconds(1, 2.0, 60.0, 3600.0, rng) == 60.0
    first = backoff_seconds(1, 2.0, 60.0, None, rng)
    third = backoff_seconds(3, 2.0, 60.0, None, rng)
    assert 2.0 <= first < 2.5
    assert 8.0 <= third < 10.0
    assert backoff_seconds(20, 2.0, 60.0, None, rng) == 60.0
    jittered = {backoff_seconds(2, 2.0, 60.0, None, random.Random(seed)) for seed in range(5)}
    assert len(jittered) > 1


def test_failures_are_network_errors_429_and_5xx():
    assert is_transient_status(None) and is_transient_status(429) and is_transient_status(500)
    assert is_transient_status(503)
    assert not any(is_transient_status(code) for code in (200, 301, 304, 404, 410))


def test_gate_counts_delay_from_the_end_of_the_previous_request():
    gate = _gate()
    rng = random.Random(0)
    assert gate.can_start(0.0)
    gate.started(0.0)
    assert not gate.can_start(0.5)  # one in flight
    gate.finished(5.0, 200, None, rng)  # slow response: ended at t=5
    assert not gate.can_start(5.9)  # 1 s after the END, not after dispatch
    assert gate.can_start(6.0)
    with pytest.raises(RuntimeError):
        _gate(next_allowed_at=3.0).started(1.0)  # starting against a closed gate is a bug


def test_abandoned_requests_release_the_gate_one_delay_from_now():
    gate = _gate()
    gate.started(0.0)
    gate.abandoned(5.0)  # cancelled in flight: never `finished`
    assert gate.in_flight == 0
    assert not gate.can_start(5.9)  # the server may have seen it: one delay from the abandonment
    assert gate.can_start(6.0)
    gate.abandoned(20.0)  # nothing in flight: no new hold
    assert gate.can_start(20.0)


def test_one_abandoned_request_releases_only_its_own_place():
    gate = _gate(max_concurrency=2)
    gate.started(0.0)
    gate.started(1.0)
    gate.abandoned(2.0, requests=1)  # one cancelled; the other is still in flight and will call `finished`
    assert gate.in_flight == 1
    gate.abandoned(2.5, requests=3)  # never more than are counted
    assert gate.in_flight == 0
    assert not gate.can_start(3.4) and gate.can_start(3.5)  # one delay after the last release


def test_gate_starts_are_spaced_even_with_more_concurrency():
    gate = _gate(max_concurrency=2)
    gate.started(0.0)
    assert not gate.can_start(0.5)  # starts at least one delay apart
    assert gate.can_start(1.0)
    gate.started(1.0)
    assert not gate.can_start(2.5)  # two in flight


def test_gate_backs_off_on_retry_after_and_recovers_slowly_on_success():
    gate = _gate()  # recovery_factor 0.5 by default
    rng = random.Random(0)
    gate.started(0.0)
    gate.finished(1.0, 429, 20.0, rng)
    assert gate.backoff_s == 20.0
    assert not gate.can_start(20.9) and gate.can_start(21.0)
    gaps = []
    now = 21.0
    for _ in range(6):
        gate.started(now)
        gate.finished(now + 0.5, 200, None, rng)
        assert gate.failures == 0  # the pause rule still counts consecutive failures only
        gaps.append(gate.next_allowed_at - (now + 0.5))
        now = gate.next_allowed_at
    assert gaps == [10.0, 5.0, 2.5, 1.25, 1.0, 1.0]  # halved per success; under the 1 s minimum it is over
    assert gate.backoff_s == 0.0


def test_recovery_factor_zero_ends_the_backoff_at_the_first_success():
    gate = _gate(recovery_factor=0.0)
    gate.started(0.0)
    gate.finished(1.0, 503, 20.0, random.Random(0))
    gate.started(21.0)
    gate.finished(21.5, 200, None, random.Random(0))
    assert gate.backoff_s == 0.0 and gate.can_start(22.5)


def test_a_failure_while_recovering_never_shortens_the_backoff():
    gate = _gate()
    rng = random.Random(0)
    gate.started(0.0)
    gate.finished(1.0, 429, 40.0, rng)
    gate.started(41.0)
    gate.finished(41.0, 200, None, rng)
    assert gate.backoff_s == 20.0 and gate.failures == 0
    gate.started(61.0)
    gate.finished(61.0, 500, None, rng)  # a first failure again: exponential gives ~2 s, the 20 s stays
    assert gate.backoff_s == 20.0 and gate.failures == 1


def test_response_time_term_follows_the_last_response_clamped_and_never_below_minimum():
    gate = _gate(response_time_factor=2.0, max_response_time_delay_s=5.0)
    rng = random.Random(0)
    gate.started(0.0)
    gate.finished(1.5, 200, None, rng, elapsed_s=1.5)
    assert gate.delay_s() == 3.0 and not gate.can_start(4.4) and gate.can_start(4.5)
    gate.started(4.5)
    gate.finished(14.5, 200, None, rng, elapsed_s=10.0)
    assert gate.delay_s() == 5.0  # clamped at max_response_time_delay_s
    gate.started(19.5)
    gate.finished(19.51, 200, None, rng, elapsed_s=0.01)
    assert gate.delay_s() == 1.0  # a fast response never takes the delay below the minimum
    off = _gate()
    off.started(0.0)
    off.finished(9.0, 200, None, rng, elapsed_s=9.0)
    assert off.delay_s() == 1.0  # k = 0: response time ignored
    assert effective_delay(1.0, 4.0, 10.0, 2.0, 7.0) == 7.0


def test_a_failure_drops_the_host_to_one_request_until_the_backoff_is_over():
    gate = _gate(max_concurrency=3, min_delay_s=0.0)
    rng = random.Random(0)
    gate.started(0.0)
    gate.started(0.0)
    gate.finished(1.0, 503, 4.0, rng)
    assert gate.max_concurrency == 1 and gate.concurrency_cap == 3
    assert not gate.can_start(10.0)  # the other request is still in flight: the allowance is 1 now
    gate.finished(10.0, 200, None, rng)  # backoff 4 -> 2
    assert gate.max_concurrency == 1 and gate.backoff_s == 2.0
    for _ in range(8):
        now = gate.next_allowed_at
        gate.started(now)
        gate.finished(now, 200, None, rng)
    assert gate.backoff_s == 0.0 and gate.max_concurrency == 3


def test_crawl_delay_above_the_cap_is_reported_once():
    gate = _gate(max_crawl_delay_s=10.0)
    assert gate.set_crawl_delay(999.0) is True
    assert gate.delay_s() == 10.0
    assert gate.set_crawl_delay(999.0) is False  # the same robots.txt again (cache): no second report
    assert gate.set_crawl_delay(5.0) is False and gate.set_crawl_delay(None) is False


def test_retry_after_ignored_for_statuses_that_do_not_direct_backoff():
    gate = _gate()
    gate.started(0.0)
    gate.finished(1.0, 500, 50.0, random.Random(0))
    assert 2.0 <= gate.backoff_s < 2.5  # exponential, not the 500's header


def test_consecutive_failures_pause_the_host():
    gate = _gate(max_failures=3)
    rng = random.Random(0)
    now = 0.0
    for _ in range(3):
        now = gate.next_allowed_at
        gate.started(now)
        gate.finished(now + 0.1, None, None, rng)
    assert gate.paused
    assert not gate.can_start(now + 10_000)


def test_crawl_delay_learned_later_applies_to_the_gap_after_robots():
    gate = _gate(min_delay_s=0.1)
    gate.started(0.0)
    gate.finished(1.0, 200, None, random.Random(0))
    assert gate.can_start(1.1)
    gate.set_crawl_delay(0.5)
    assert not gate.can_start(1.4) and gate.can_start(1.5)


def test_a_takeover_before_robots_is_known_waits_for_the_largest_crawl_delay():
    """A previous owner may have obeyed any Crawl-delay up to the cap: until this process has the host's
    robots.txt, its first request (that robots.txt) waits as if the host asked for the cap."""
    unknown, known = _gate(max_crawl_delay_s=10.0), _gate(max_crawl_delay_s=10.0)
    unknown.ended_elsewhere(100.0, crawl_delay_known=False)
    known.ended_elsewhere(100.0)
    assert not unknown.can_start(109.9) and unknown.can_start(110.0)
    assert known.next_allowed_at == 100.0 + known.delay_s() < 110.0
    # Learning a shorter Crawl-delay later never brings the held start forward.
    unknown.set_crawl_delay(0.5)
    assert not unknown.can_start(109.9)


T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
RULES = PolitenessRules(min_delay_s=1.0, max_crawl_delay_s=10.0, max_concurrency_per_host=2, backoff_base_s=30.0,
                        max_backoff_s=900.0, max_consecutive_failures=3, backoff_recovery_factor=0.5,
                        response_time_factor=0.0, max_response_time_delay_s=60.0, dead_after_days=7.0)


def test_rules_read_every_politeness_key_from_config(base_conf):
    rules = PolitenessRules.from_config(base_conf)
    assert rules.min_delay_s == base_conf.politeness.min_delay_s
    assert rules.max_consecutive_failures == base_conf.politeness.max_consecutive_failures
    gate = rules.gate()
    assert (gate.min_delay_s, gate.max_concurrency) == (rules.min_delay_s, rules.max_concurrency_per_host)


def test_host_delay_is_the_longest_of_minimum_capped_crawl_delay_and_host_override():
    assert RULES.host_delay(None, None) == 1.0
    assert RULES.host_delay(4.0, None) == 4.0
    assert RULES.host_delay(400.0, None) == 10.0  # Crawl-delay capped
    assert RULES.host_delay(4.0, 7.5) == 7.5      # the host's own override is not capped
    assert RULES.host_delay(None, 0.1) == 1.0     # and never lowers the minimum


def test_a_per_host_delay_and_concurrency_only_make_the_gate_stricter():
    gate = RULES.gate(floor_delay_s=7.5, host_max_concurrency=1)
    assert gate.min_delay_s == 7.5 and gate.max_concurrency == 1 and gate.concurrency_cap == 1
    assert RULES.gate(floor_delay_s=0.2).min_delay_s == 1.0
    assert RULES.gate(host_max_concurrency=5).max_concurrency == 2
    gate.started(0.0)
    gate.finished(0.5, 200, None, random.Random(1))
    assert gate.next_allowed_at == 0.5 + 7.5  # counted from the end, with the host's floor


def test_host_backoff_rises_with_failing_segments_and_resets_on_success():
    first = RULES.host_backoff(HostBackoff(0, None), 1, 0, T0, None, "seed")
    assert first.level == 1 and T0 + timedelta(seconds=30) <= first.until < T0 + timedelta(seconds=38)
    assert first == RULES.host_backoff(HostBackoff(0, None), 1, 0, T0, None, "seed")  # deterministic per seed
    directed = RULES.host_backoff(HostBackoff(1, first.until), 2, 5, T0, 120.0, "seed")
    assert directed == HostBackoff(2, T0 + timedelta(seconds=120))
    assert RULES.host_backoff(HostBackoff(3, None), 1, 0, T0, 5000.0, "s").until == T0 + timedelta(seconds=900)
    assert RULES.host_backoff(HostBackoff(2, first.until), 0, 3, T0, None, "s") == HostBackoff(0, first.until)
    assert RULES.host_backoff(HostBackoff(2, first.until), 0, 0, T0, None, "s") == HostBackoff(2, first.until)
    assert RULES.host_backoff(HostBackoff(2, first.until), 1, 0, None, None, "s") == HostBackoff(2, first.until)



def test_a_streak_of_failing_segments_makes_a_host_dead_and_one_answer_revives_it():
    day = timedelta(days=1)
    state = HostBackoff(0, None)
    for n in range(8):  # one failing segment a day, nothing answered: the streak starts at the first failure
        state = RULES.host_backoff(state, 1, 0, T0 + n * day, None, f"s{n}")
        assert state.failing_since == T0 and state.level == n + 1
    assert not RULES.is_dead(state.failing_since, T0 + 7 * day - timedelta(seconds=1))
    assert RULES.is_dead(state.failing_since, T0 + 7 * day)
    assert RULES.host_state(None, None, state.failing_since, T0 + 8 * day) == "dead"
    assert RULES.host_state(None, T0 + 9 * day, state.failing_since, T0 + 8 * day) == "dead"  # dead over backing off
    assert RULES.host_backoff(state, 0, 0, None, None, "quiet") == state  # a segment that never tried it: no change
    # Failures with an answer in the same segment back off but end the streak; answers alone reset everything.
    mixed = RULES.host_backoff(state, 2, 1, T0 + 8 * day, None, "m")
    assert mixed.level == state.level + 1 and mixed.failing_since is None
    revived = RULES.host_backoff(state, 0, 1, None, None, "r")
    assert (revived.level, revived.failing_since) == (0, None)
    assert RULES.host_state(None, None, revived.failing_since, T0 + 9 * day) == "ok"


def test_send_audit_counts_a_request_sent_sooner_than_the_floor_or_past_the_concurrency():
    """`SendAudit` judges requests as sent: after an end, nothing before the floor; never more in flight than the
    host allows; starts are not judged against each other (a request may wait for a slot after its gate)."""
    audit = SendAudit()
    assert audit.sent(0.0, 1.0, 1) is None          # the first request: nothing to be sooner than
    audit.ended(0.5)
    assert audit.sent(1.5, 1.0, 1) is None          # exactly the floor after the end
    audit.ended(2.0)
    assert "0.900s after the last request ended" in audit.sent(2.9, 1.0, 1)
    audit.ended(3.0)
    assert audit.sent(4.0, 1.0, 2) is None and audit.sent(4.0, 1.0, 2) is None  # two in flight allowed
    assert "3 requests in flight, at most 2" in audit.sent(4.0, 1.0, 2)
    for _ in range(3):
        audit.ended(4.5)
    assert audit.in_flight == 0 and audit.sent(5.5, 1.0, 1) is None


def test_the_audit_floor_is_the_delay_without_backoff_or_response_time():
    """Backoff and response-time terms only add; the floor is min delay or the capped Crawl-delay."""
    gate = HostGate(min_delay_s=2.0, max_crawl_delay_s=30.0, max_concurrency=1, backoff_base_s=1.0,
                    max_backoff_s=60.0, max_failures=5, crawl_delay_s=50.0, backoff_s=100.0, response_delay_s=40.0)
    assert gate.floor_delay_s() == 30.0
    gate.crawl_delay_s = None
    assert gate.floor_delay_s() == 2.0
