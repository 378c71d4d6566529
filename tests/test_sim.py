"""The fleet simulator (`bench/sim`): a small crawl on the virtual clock — two daemons, kill -9 and a freeze, robots
variants, throttling and dead hosts — keeps the fleet's invariants exactly, judged from the simulation's own
server log; and the same run with a deliberately broken politeness rule (the delay counted from a request's start)
reports violations, so the measure can fail."""

from __future__ import annotations

import pytest

from bench.sim.run import SimSettings, broken_gate, simulate

SMALL = SimSettings(hosts=120, urls=6000, daemons=2, hours=1.0, kills=2, freezes=1, seed=1)


@pytest.fixture(scope="module")
def figures():
    return simulate(SMALL)


def test_a_small_fleet_keeps_every_invariant(figures):
    assert figures.fetches > 3000 and figures.urls > 5000
    assert figures.violations == 0
    assert figures.lost == 0
    assert figures.in_flight_at_faults > 0  # the kills hit daemons with requests in flight
    assert figures.dup_fetches <= figures.in_flight_at_faults  # only what was in flight at a kill or freeze is repeated
    assert 0.8 < figures.bound_ratio <= 1.0
    assert figures.slo_10min == 1.0 and figures.fresh_p99_s <= 10 * 60 + 30  # ten-minute segments


def test_a_frozen_daemon_loses_its_buckets_and_the_successor_stays_polite():
    """A daemon stalled past its lease (no kill): the other takes its buckets, the frozen one sends nothing when it
    wakes, and the only repeats are what it had in flight."""
    frozen = simulate(SimSettings(hosts=120, urls=6000, daemons=2, hours=1.0, kills=0, freezes=2, seed=2))
    assert frozen.takeovers > 0 and frozen.violations == 0 and frozen.lost == 0
    assert frozen.dup_fetches <= frozen.in_flight_at_faults


def test_the_same_run_is_the_same_figures():
    assert simulate(SMALL) == simulate(SMALL)


def test_a_broken_politeness_rule_is_caught_by_the_log():
    assert simulate(SMALL, broken_gate).violations > 100
