"""The simulated frontier: every URL's schedule, lease and state in numpy arrays (10 M URLs fit, and a generate
over them takes a fraction of a second), and the cycle's batch rules applied to them.

The rules are the project's: due URLs (`crawler.leases.is_due`) and their ranking score (`crawler.frontier.score`)
in array form — `due_mask` and `scores` below, which `tests/test_sim.py` holds equal to the Python forms on random
rows, as the rule-twin tests hold the SQL forms —, per-host caps (`crawler.frontier.per_host_cap`, dead hosts get
a probe), host delays, backoff across segments and dead hosts (`crawler.politeness.PolitenessRules`), and revisits
(`crawler.revisit.RevisitPolicy.decide`, with content that changes at each host's rate), and, with
`generate.budget_split`, the division of each segment between revisits and never-fetched URLs
(`crawler.frontier.refresh_quota`, the share from `crawler.frontier.RefreshShare`).

Discovery: a share of each host's URLs (`new_share`) is unknown at the start (never due); each page fetched for the
first time or again reveals a Poisson number (mean `new_links_per_fetch`) of its host's unknown URLs, which are due
at once and have never been fetched: the discovery side of the budget.

The service levels are crawler/service_levels.py's: high priority is `generate.high_priority` of the config; at each
generate the eligible due high-priority URLs (host ok: not backing off, not dead, robots.txt reachable; rank within
the host's cap) and their lease outcomes (`lease_outcomes`, the array form of `lease_outcome`, held equal to it by
tests/test_sim.py), as the engine's generate records them in `cycle_metrics`. With `hold_discoveries` (the run
charges merge time) revealed URLs are known, and due, only when their segment's update ends (`release`); the pages
parsed per segment are kept for the discovery level (`pages`).

Segments are numbered (segment n is `seg-<n>` for the rules that take an id).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench.sim.world import EPOCH, SimHost
from crawler.config import Config
from crawler.frontier import RefreshShare, per_host_cap, refresh_quota
from crawler.politeness import HostBackoff, PolitenessRules
from crawler.revisit import PreviousState, RevisitPolicy
from crawler.service_levels import LeaseOutcome
from crawler.status import is_transient, made_request

HIGH_PRIORITY = 2.0        # priority of the high-priority URLs (>= generate.high_priority, 1.0 by default)
# The others': below the default generate.high_priority, as a link's target one hop from a seed is (priority x 0.8).
ORDINARY_PRIORITY = 0.8
HIGH_PRIORITY_SHARE = 0.1  # share of URLs that are high priority
SECONDS_PER_DAY = 86400.0
NO_SEGMENT = -1


def moment(seconds: float) -> datetime:
    """A virtual time as the wall-clock moment the rules take."""
    return datetime.fromtimestamp(EPOCH + seconds, UTC)


def due_mask(next_due: np.ndarray, lease_segment: np.ndarray, lease_expires: np.ndarray, now: float,
             segment: int) -> np.ndarray:
    """`crawler.leases.is_due` over arrays (lease_segment NO_SEGMENT: not leased)."""
    return (next_due <= now) & ((lease_segment == NO_SEGMENT) | (lease_segment == segment) | (lease_expires < now))


def lease_outcomes(due: np.ndarray, leased_at: np.ndarray, now: float, within_s: float) -> np.ndarray:
    """`crawler.service_levels.lease_outcome` over arrays (leased_at NaN: not leased), as LeaseOutcome values."""
    leased = ~np.isnan(leased_at)
    late = np.where(leased, leased_at - due > within_s, now - due > within_s)
    return np.where(leased & ~late, LeaseOutcome.WITHIN.value,
                    np.where(late, LeaseOutcome.LATE.value, LeaseOutcome.WAITING.value))


def scores(priority: np.ndarray, next_due: np.ndarray, now: float, age_boost_per_day: float) -> np.ndarray:
    """`crawler.frontier.score` over arrays."""
    return priority + age_boost_per_day * np.maximum(0.0, (now - next_due) / SECONDS_PER_DAY)


@dataclass(frozen=True)
class Backlog:
    """What generate saw at a segment's start: due URLs not leased, and the oldest one's age (over every host, and
    over the hosts whose due URLs fit their per-host cap: the giants and other over-capacity hosts left out)."""

    due: int
    oldest_due_age_s: float
    oldest_due_age_within_cap_s: float
    listed: int
    open_leases: int  # URLs leased and not completed (no result for their version yet)
    refresh_listed: int = 0    # of the listed URLs, revisits (fetched before)
    discovery_listed: int = 0  # and URLs never fetched
    refresh_share: float | None = None  # the share the budget split used (None: generate.budget_split off)
    # The lease level at this generate (crawler/service_levels.py), as the engine's cycle_metrics row has it.
    hp_eligible: int = 0
    hp_leased_within: int = 0
    hp_leased_late: int = 0
    hp_waiting_late: int = 0


class Frontier:
    """Every URL's schedule and lease, every host's cross-segment state, and the generate and update rules."""

    def __init__(self, hosts: list[SimHost], conf: Config, rng: np.random.Generator, due_spread_s: float,
                 new_share: float = 0.0, new_links_per_fetch: float = 0.0, hold_discoveries: bool = False):
        self.hosts = hosts
        self.conf = conf
        self.rng = rng
        self.rules = PolitenessRules.from_config(conf)
        self.revisit = RevisitPolicy.from_config(conf)
        self.refresh_share = RefreshShare.from_config(conf)
        self.new_links_per_fetch = new_links_per_fetch
        counts = np.array([h.urls for h in hosts], dtype=np.int64)
        size = int(counts.sum())
        self.host_of = np.repeat(np.arange(len(hosts), dtype=np.int32), counts)
        first_of_host = np.cumsum(counts) - counts
        self.index_in_host = (np.arange(size) - np.repeat(first_of_host, counts)).astype(np.int32)
        # Known URLs were fetched before: each is due once in its revisit interval, spread over `due_spread_s`.
        self.next_due = rng.uniform(0.0, due_spread_s, size)
        self.priority = np.where(rng.random(size) < HIGH_PRIORITY_SHARE, HIGH_PRIORITY, ORDINARY_PRIORITY)
        self.high_priority = conf.generate.high_priority
        self.lease_within_s = conf.service_levels.lease_within_s
        self.interval = np.full(size, self.revisit.default_interval_s, dtype=np.int64)
        self.failures = np.zeros(size, dtype=np.int32)
        self.version = np.zeros(size, dtype=np.int32)
        self.lease_segment = np.full(size, NO_SEGMENT, dtype=np.int32)
        self.lease_expires = np.full(size, np.inf)
        self.result_version = np.zeros(size, dtype=np.int32)  # the latest version a result arrived for
        self.change_s = np.array([h.change_interval_s for h in hosts])
        self.change_phase = rng.uniform(0.0, 1.0, size) * self.change_s[self.host_of]
        self.seen_content = self.content_at(np.arange(size), self.next_due - self.interval)
        # A host's last `new_share` of URLs are unknown (never due) until fetched pages reveal them, in order.
        self.fetched_before = np.ones(size, dtype=bool)
        self.next_unknown = first_of_host + counts - np.floor(counts * new_share).astype(np.int64)
        self.host_end = first_of_host + counts
        unknown = self.index_in_host >= (self.next_unknown - first_of_host)[self.host_of]
        self.next_due[unknown] = np.inf
        self.fetched_before[unknown] = False
        self.crawl_delay: dict[int, float | None] = {}   # host -> Crawl-delay of its last robots.txt (hosts table)
        self.backoff = [HostBackoff(0, None, moment(-h.dead_for_days * SECONDS_PER_DAY) if h.dead_for_days else None)
                        for h in hosts]
        self.backoff_until = np.full(len(hosts), -np.inf)
        self.host_counts: dict[int, dict[int, list]] = defaultdict(dict)  # segment -> host -> [failed, answered, at]
        # per generate: (segment, URLs, their versions, leased at, their due times)
        self.leases: list[tuple[int, np.ndarray, np.ndarray, float, np.ndarray]] = []
        self.stale = 0
        self.changed = 0
        self.refetched = 0
        self.first_fetches = 0  # fetches of URLs never fetched before
        self.discovered = 0     # unknown URLs revealed by fetched pages
        self._signals_from = (0, 0, 0, 0)  # (refetched, changed, fetches, discovered) at the last generate
        self.hold_discoveries = hold_discoveries
        self.held: dict[int, list[slice]] = defaultdict(list)  # segment -> URLs its pages revealed, not merged yet
        self.pages: dict[int, list[float]] = defaultdict(list)  # segment -> fetch times of the pages parse reads
        self.hp_lease_lags: list[np.ndarray] = []  # per generate: due -> lease of the eligible URLs it leased

    def content_at(self, url: np.ndarray | int, at: np.ndarray | float) -> np.ndarray:
        """The content version of URLs at virtual times: it changes every `change_interval_s` of its host."""
        return np.floor((at + self.change_phase[url]) / self.change_s[self.host_of[url]]).astype(np.int64)

    def host_delay(self, host: int) -> float:
        return self.rules.host_delay(self.crawl_delay.get(host), None)

    def is_dead(self, host: int, now: float) -> bool:
        return self.rules.is_dead(self.backoff[host].failing_since, moment(now))

    # --- update: host state across segments -----------------------------------------------------------------

    def count(self, segment: int, host: int, failed: bool, at: float) -> None:
        """A result or robots.txt observation of `host` in `segment`, for its backoff (update's host counts)."""
        counts = self.host_counts[segment].setdefault(host, [0, 0, None])
        if failed:
            counts[0] += 1
            counts[2] = at if counts[2] is None else max(counts[2], at)
        else:
            counts[1] += 1

    def update_hosts(self, before_segment: int) -> None:
        """Fold the host counts of every segment before `before_segment` into the hosts' backoff (update)."""
        for segment in sorted(s for s in self.host_counts if s < before_segment):
            for host, (failed, answered, failed_at) in self.host_counts.pop(segment).items():
                decided = self.rules.host_backoff(self.backoff[host], failed, answered,
                                                  None if failed_at is None else moment(failed_at), None,
                                                  f"{self.hosts[host].key}|seg-{segment}")
                self.backoff[host] = decided
                if decided.until is not None:
                    self.backoff_until[host] = (decided.until - moment(0)).total_seconds()

    # --- generate -----------------------------------------------------------------------------------------

    def generate(self, segment: int, now: float, budget: int, per_host_max: int, segment_seconds: float,
                 lease_seconds: float) -> tuple[list[dict[str, Any]], Backlog]:
        """The segment's fetch-list rows: due URLs of hosts not backing off, ranked by score per host, cut per host
        (a dead host gets a probe), then round-robin over hosts up to the budget; each leased (its version
        bumped)."""
        boost = self.conf.generate.age_boost_per_day
        candidates = np.flatnonzero(self.next_due <= now)
        candidates = candidates[due_mask(self.next_due[candidates], self.lease_segment[candidates],
                                         self.lease_expires[candidates], now, segment)]
        candidates = candidates[~(self.backoff_until[self.host_of[candidates]] > now)]
        host = self.host_of[candidates]
        score = scores(self.priority[candidates], self.next_due[candidates], now, boost)
        order = np.lexsort((candidates, -score, host))
        candidates, host, score = candidates[order], host[order], score[order]
        first = np.ones(len(candidates), dtype=bool)
        first[1:] = host[1:] != host[:-1]
        positions = np.arange(len(candidates))
        rank = positions - np.maximum.accumulate(np.where(first, positions, 0))
        caps = np.zeros(len(self.hosts), dtype=np.int64)
        for number in host[first].tolist():
            caps[number] = per_host_cap(per_host_max, segment_seconds, self.host_delay(number),
                                        self.is_dead(number, now))
        due_per_host = np.bincount(host, minlength=len(self.hosts))
        over_cap = due_per_host > caps
        age = now - self.next_due[candidates]
        within = ~over_cap[host]
        backlog_due, oldest = len(candidates), float(age.max()) if len(candidates) else 0.0
        oldest_within = float(age[within].max()) if within.any() else 0.0
        keep = rank < caps[host]
        eligible = keep & (self.priority[candidates] >= self.high_priority)
        eligible[eligible] = self.hosts_ok(host[eligible], now)
        counted = candidates[eligible]  # judged once the segment is chosen, below
        candidates, rank, score = candidates[keep], rank[keep], score[keep]
        ordered = candidates[np.lexsort((candidates, -score, rank))]
        share = None
        if self.conf.generate.budget_split:  # jobs/generate.py::within_budget: each side in the same order
            share = self.refresh_share.current(*self._update_signals()) if self.refresh_share.adaptive \
                else self.refresh_share.share
            revisits, new = ordered[self.fetched_before[ordered]], ordered[~self.fetched_before[ordered]]
            quota_refresh, quota_new = refresh_quota(budget, share, len(revisits), len(new))
            chosen = np.concatenate([revisits[:quota_refresh], new[:quota_new]])
        else:
            chosen = ordered[:budget]
        ranks = dict(zip(candidates.tolist(), rank.tolist(), strict=True))
        open_leases = int(((self.lease_segment != NO_SEGMENT) & (self.result_version != self.version)).sum())
        refreshes = int(self.fetched_before[chosen].sum())
        backlog = Backlog(backlog_due, oldest, oldest_within, int(len(chosen)), open_leases, refreshes,
                          int(len(chosen)) - refreshes, share, **self._lease_level(counted, chosen, now))
        self.version[chosen] += 1
        self.lease_segment[chosen] = segment
        self.lease_expires[chosen] = now + lease_seconds
        self.leases.append((segment, chosen, self.version[chosen].copy(), now, self.next_due[chosen].copy()))
        rows = []
        for url in chosen.tolist():
            number = int(self.host_of[url])
            sim_host = self.hosts[number]
            rows.append({"url": sim_host.key + sim_host.path(int(self.index_in_host[url])), "host_key": sim_host.key,
                         "host": number, "rank": ranks[url], "url_index": url,
                         "state_version": int(self.version[url]), "due": float(self.next_due[url]),
                         "priority": float(self.priority[url]), "delay_s": self.host_delay(number)})
        return rows, backlog

    def hosts_ok(self, numbers: np.ndarray, now: float) -> np.ndarray:
        """Whether each of these hosts is in state ok (crawler.politeness.host_state) as generate sees it now: not
        dead and its robots.txt reachable (hosts backing off are left out before). A host whose robots.txt times out
        never gets one; an `outage` host has none during its outage."""
        distinct, where = np.unique(numbers, return_inverse=True)
        ok = np.array([not self.is_dead(int(n), now) and self.hosts[n].robots != "timeout"
                       and not self.hosts[n].outage[0] <= now < self.hosts[n].outage[1] for n in distinct.tolist()],
                      dtype=bool)
        return ok[where] if len(distinct) else np.zeros(0, dtype=bool)

    def _lease_level(self, eligible: np.ndarray, chosen: np.ndarray, now: float) -> dict[str, int]:
        """Each eligible due high-priority URL's lease outcome at this generate (leased now when chosen): the
        Backlog's hp_* counts."""
        due = np.maximum(self.next_due[eligible], 0.0)  # crawler.service_levels.due_since: known from the start
        leased_at = np.where(np.isin(eligible, chosen), now, np.nan)
        outcome = lease_outcomes(due, leased_at, now, self.lease_within_s)
        leased = ~np.isnan(leased_at)
        late = outcome == LeaseOutcome.LATE.value
        self.hp_lease_lags.append(now - due[leased])
        within = int((outcome == LeaseOutcome.WITHIN.value).sum())
        return {"hp_eligible": int(len(eligible)), "hp_leased_within": within,
                "hp_leased_late": int((late & leased).sum()), "hp_waiting_late": int((late & ~leased).sum())}

    def release(self, segment: int, at: float) -> None:
        """The segment's update ended at `at`: the URLs its pages revealed are known, and due, from then."""
        for revealed in self.held.pop(segment, []):
            self.next_due[revealed] = at

    def _update_signals(self) -> tuple[float | None, float | None]:
        """(change rate of refetched pages, new URLs per fetch) since the last generate: what the adaptive share
        moves by, as `jobs/cycle_metrics.py::update_signals` reads them from the last update."""
        refetched, changed, fetches, discovered = (self.refetched, self.changed,
                                                   self.refetched + self.first_fetches, self.discovered)
        before = self._signals_from
        self._signals_from = (refetched, changed, fetches, discovered)
        if fetches == before[2]:
            return None, None
        change_rate = (changed - before[1]) / (refetched - before[0]) if refetched > before[0] else None
        return change_rate, (discovered - before[3]) / (fetches - before[2])

    def discover(self, url: int, at: float, segment: int) -> None:
        """A fetched page's links to its host's unknown URLs: a Poisson number of them become known, due now (or,
        with `hold_discoveries`, when the segment's update ends: `release`)."""
        host = int(self.host_of[url])
        left = int(self.host_end[host] - self.next_unknown[host])
        count = min(int(self.rng.poisson(self.new_links_per_fetch)), left) if left else 0
        if count > 0:
            revealed = slice(int(self.next_unknown[host]), int(self.next_unknown[host]) + count)
            if self.hold_discoveries:
                self.held[segment].append(revealed)
            else:
                self.next_due[revealed] = at
            self.next_unknown[host] += count
            self.discovered += count

    # --- update: results ----------------------------------------------------------------------------------

    def apply(self, url: int, version: int, segment: int, outcome: str, status: int | None, at: float) -> None:
        """A result, as update folds it: completes the URL when current and under this segment's lease (else
        stale), with the revisit decision on whether its content changed since it was last seen."""
        if version > self.result_version[url]:
            self.result_version[url] = version
        if version != self.version[url] or self.lease_segment[url] != segment:
            self.stale += 1
            return
        if made_request(outcome):
            self.count(segment, int(self.host_of[url]), is_transient(outcome, status), at)
        seen = int(self.seen_content[url])
        now_content = int(self.content_at(url, at))
        before = bool(self.fetched_before[url])
        previous = PreviousState("fetched" if before else "unfetched", int(self.interval[url]),
                                 int(self.failures[url]), str(seen) if before else None, url_id=str(url))
        decision = self.revisit.decide(outcome, status, previous, moment(at), str(now_content))
        if decision.status == "fetched":
            if before:
                self.refetched += 1
                self.changed += now_content != seen
            else:
                self.first_fetches += 1
                self.fetched_before[url] = True
            self.seen_content[url] = now_content
            self.pages[segment].append(at)
            self.discover(url, at, segment)
        self.interval[url], self.failures[url] = decision.fetch_interval_s, decision.failure_count
        self.next_due[url] = (decision.next_fetch_at - moment(0)).total_seconds()
        self.lease_segment[url], self.lease_expires[url] = NO_SEGMENT, np.inf

    def lost(self, end: float) -> int:
        """Leased URLs with no result for their current version that `is_due` would never hand out again (ten
        years on): 0 is the invariant."""
        later = end + 10 * 365 * SECONDS_PER_DAY
        leased = np.flatnonzero(self.lease_segment != NO_SEGMENT)
        unanswered = leased[self.result_version[leased] != self.version[leased]]
        return int((~due_mask(self.next_due[unanswered], self.lease_segment[unanswered],
                              self.lease_expires[unanswered], later, np.iinfo(np.int32).max)).sum())

    def lease_lags(self, of_hosts: np.ndarray | None = None) -> np.ndarray:
        """Leased at - due, for every lease of a high-priority URL handed out (of the hosts `of_hosts` marks)."""
        lags = []
        for _segment, chosen, _versions, at, due in self.leases:
            keep = self.priority[chosen] >= self.high_priority
            if of_hosts is not None:
                keep &= of_hosts[self.host_of[chosen]]
            lags.append((at - due)[keep])
        return np.concatenate(lags) if lags else np.zeros(0)
