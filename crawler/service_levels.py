"""The engine's two service levels, defined once: which URLs and pages count, what is measured, what the target is.
Generate and update compute them from the tables, the report and the driver's metrics show them, the simulator and
the freshness benchmark judge by the same functions. Pure: no Spark, no network.

* **Discovery is durable** when the `links` commit that holds a fetched page's outlinks is (parse commits a segment's
  links in one commit, and update consumes `links`). A page's lag is that commit's time minus the page's fetch time;
  the level holds when the 99th percentile of the lags is at most `service_levels.discovery_durable_s`.
* **Leases**: a due URL counts when it is high priority (priority >= `generate.high_priority`) and eligible: its host
  is in state ok (not backing off, not dead, its robots.txt reachable: `PolitenessRules.host_state`) and the URL is
  within its host's allowance for the segment (its rank in the host's order is below the per-host cap, so the host's
  politeness budget was not spent on URLs ranked before it). It fell due at `due_since` (its next fetch time, or when
  it became known if that is later); its lag is its lease time minus that. The level holds when at least
  `service_levels.lease_share` of the counted URLs were leased within `service_levels.lease_within_s`; a counted URL
  still waiting past the target is a miss, as a late lease is.

Each rule evaluated on every due URL in Spark also exists as SQL text (`*_sql`); tests/test_rule_twins.py holds both
forms equal.

Where they land: generate's `cycle_metrics` row holds the lease level at that generate (`hp_*`, `lease_share_within`:
every eligible high-priority URL due then, leased by it or still waiting), update's row the discovery level of its
segment (`discovery_*`); `misses` turns a segment's rows into what on-call is told (the report, the DAG's alert).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from crawler.settings import Settings
from crawler.status import HostState


@dataclass(frozen=True)
class ServiceLevels:
    """The targets, and the priority from which a URL is high priority."""

    discovery_durable_s: float
    lease_within_s: float
    lease_share: float
    high_priority: float

    @classmethod
    def from_config(cls, conf: Settings) -> ServiceLevels:
        levels = conf.service_levels
        return cls(levels.discovery_durable_s, levels.lease_within_s, levels.lease_share,
                   conf.generate.high_priority)

    def discovery_met(self, p99_lag_s: float | None) -> bool | None:
        """Whether the discovery level holds for lags whose 99th percentile is `p99_lag_s` (None: no page measured)."""
        return None if p99_lag_s is None else p99_lag_s <= self.discovery_durable_s

    def lease_met(self, share_within: float | None) -> bool | None:
        """Whether the lease level holds for this share of counted URLs leased in time (None: none counted)."""
        return None if share_within is None else share_within >= self.lease_share

    def misses(self, figures: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
        """The levels a segment missed, one sentence each (none: met, or nothing measured), from its `cycle_metrics`
        rows by step (`generate`, `update`): what the DAG alerts on and the report shows."""
        found = []
        merged, chosen = figures.get("update") or {}, figures.get("generate") or {}
        p99 = merged.get("discovery_durable_p99_s")
        if self.discovery_met(p99) is False:
            found.append(f"discovery: p99 of {merged.get('discovery_pages')} pages' fetch-to-durable lags is "
                         f"{p99:.0f} s, over the {self.discovery_durable_s:g} s target")
        share = chosen.get("lease_share_within")
        if self.lease_met(share) is False:
            found.append(f"leases: {chosen.get('hp_leased_within')} of {lease_decided(chosen)} eligible high-priority "
                         f"URLs leased within {self.lease_within_s:g} s ({100 * share:.1f} %), under the "
                         f"{100 * self.lease_share:g} % target")
        return found


def lease_decided(generate_row: Mapping[str, Any]) -> int:
    """The counted URLs whose outcome a generate's row decided: leased within the target, leased late, or waiting
    past it."""
    return sum(int(generate_row.get(name) or 0) for name in ("hp_leased_within", "hp_leased_late", "hp_waiting_late"))


def is_high_priority(priority: float, threshold: float) -> bool:
    return priority >= threshold


def is_high_priority_sql(priority: str, threshold: float) -> str:
    return f"({priority} >= {float(threshold)!r})"


def due_since(next_fetch_at: datetime, discovered_at: datetime) -> datetime:
    """When a due URL fell due: its next fetch time, or when it became known to the frontier if that is later (a URL
    discovered with a next fetch time in the past cannot have been due before anyone knew it)."""
    return max(next_fetch_at, discovered_at)


def due_since_sql(next_fetch_at: str, discovered_at: str) -> str:
    return f"greatest({next_fetch_at}, {discovered_at})"


def is_eligible(host_state: str, rank: int, host_cap: int) -> bool:
    """Whether a due URL had capacity: its host is ok and the URL is within the host's allowance for the segment
    (`rank`: its place in the host's order, 0 first; `host_cap`: the host's per-segment cap)."""
    return host_state == HostState.OK.value and rank < host_cap


def is_eligible_sql(host_state: str, rank: str, host_cap: str) -> str:
    return f"({host_state} = '{HostState.OK.value}' and {rank} < {host_cap})"


class LeaseOutcome(str, Enum):
    """What became of a counted URL, as of a given time."""

    WITHIN = "within"    # leased within the target
    LATE = "late"        # leased after the target, or still waiting past it
    WAITING = "waiting"  # not leased yet, and its wait is still within the target: not decided


def lease_outcome(due_at: datetime, leased_at: datetime | None, now: datetime, within_s: float) -> LeaseOutcome:
    """A counted URL's outcome at `now`, from when it fell due and when (if yet) it was leased."""
    if leased_at is not None:
        return LeaseOutcome.WITHIN if lag_s(leased_at, due_at) <= within_s else LeaseOutcome.LATE
    return LeaseOutcome.LATE if lag_s(now, due_at) > within_s else LeaseOutcome.WAITING


def lease_outcome_sql(due_at: str, leased_at: str, now: str, within_s: float) -> str:
    within = float(within_s)
    return (f"(case when {leased_at} is not null then (case when {lag_s_sql(leased_at, due_at)} <= {within!r} "
            f"then '{LeaseOutcome.WITHIN.value}' else '{LeaseOutcome.LATE.value}' end)"
            f" when {lag_s_sql(now, due_at)} > {within!r} then '{LeaseOutcome.LATE.value}'"
            f" else '{LeaseOutcome.WAITING.value}' end)")


def lag_s(later: datetime, earlier: datetime) -> float:
    """Seconds from `earlier` to `later`: a page's fetch to the commit that made its links durable, a URL's falling
    due to its lease."""
    return (later - earlier).total_seconds()


def lag_s_sql(later: str, earlier: str) -> str:
    return f"((unix_micros({later}) - unix_micros({earlier})) / 1000000D)"


def share_within(within: int, late: int) -> float | None:
    """The share of decided URLs leased in time (None: none decided yet)."""
    decided = within + late
    return within / decided if decided else None


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (`fraction` 0.99 for p99): the smallest value at least that share of the values
    are at or below; None for no values. Nearest rank, not interpolation, so p99 of 100 lags is a lag that happened."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def percentile_sql(column: str, fraction: float) -> str:
    """`percentile` as a Spark aggregate over a column (nulls left out): `percentile_disc` is the nearest rank."""
    return f"percentile_disc({float(fraction)!r}) within group (order by {column})"
