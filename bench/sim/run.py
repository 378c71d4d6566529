"""One simulated crawl: hosts, a frontier, a fleet, cycles and faults on one virtual clock, and the figures the
invariants are judged by — each computed from the simulation's own logs (the server's request log, the leases
handed out, the results that arrived), never from the crawler's counters.

* violations: `sitefarm.judge.politeness_violations` over the server's log (end of one request to a host to the
  start of the next, every daemon counted), against each host's known delay (minimum, capped Crawl-delay).
* lost: leased URLs with no result that `crawler.leases.is_due` would never hand out again.
* dup_fetches: page requests for a (URL, version) already requested; bounded by the requests in flight at the
  faults (`in_flight_at_faults`: kills, freezes, storage outages), since results publish when a response ends.
* bound_ratio: page requests answered inside their segment over the politeness bound of the hosts that could be
  fetched (robots.txt not failing, alive): per segment and host, min(URLs listed, segment seconds / delay).
* freshness: for high-priority URLs, fetched - due (p50, p99), and the share leased within 10 minutes of
  becoming due (leased at the first segment start after it; the service level's goal is 99 %), over every host
  and over the hosts that never fail (generate holds failing hosts back on purpose: backoff, dead hosts' probe).
* starvation: the oldest due URL's age at each segment start, over every host and over the hosts whose due URLs
  fit their per-host cap.
* giant hosts: each giant's answered requests over its politeness bound for the run (run seconds / delay).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from bench.sim.fleet import Fleet
from bench.sim.frontier import HIGH_PRIORITY, Backlog, Frontier
from bench.sim.world import SimServer, draw_hosts
from crawler import config as config_mod
from crawler import urls
from crawler.config import Config
from crawler.politeness import HostGate, PolitenessRules
from sitefarm.judge import politeness_violations

ROBOTS_PATHS = ("/robots.txt", "/robots-moved.txt")
SLO_LAG_S = 600.0


@dataclass(frozen=True)
class SimSettings:
    """One run; the defaults are the default run of `make sim` (docs/simulation.md)."""

    hosts: int = 10_000
    urls: int = 10_000_000      # known URLs, about (the host draw decides the exact count)
    daemons: int = 4
    hours: float = 24.0
    seed: int = 1
    kills: int = 3              # kill -9 of a random daemon at a random moment, restarted 2 minutes later
    freezes: int = 2            # a random daemon stalls for 30 s to 3 minutes at a random moment
    sigterms: int = 2           # a random daemon stops cleanly at a random moment, restarted 30 s later (a deploy)
    outages: int = 1            # the storage fails for 2 to 10 minutes at a random moment
    buckets: int = 64
    segment_minutes: float = 10.0
    segment_max_urls: int = 30_000
    giant_hosts: int = 3
    giant_urls: int = 1_000_000
    due_spread_days: float = 7.0  # known URLs fall due uniformly over this span (the default revisit interval)
    new_share: float = 0.1        # share of each host's URLs unknown at the start, revealed by links from fetched pages
    new_links_per_fetch: float = 0.2  # mean unknown URLs of its host a fetched page reveals (Poisson)
    budget_split: bool = False    # generate.budget_split: divide each segment between revisits and never-fetched URLs
    refresh_share: float = 0.45   # generate.refresh_share (with budget_split)
    adaptive_share: bool = False  # generate.refresh_share_adaptive (with budget_split)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    daemon: int | None
    seconds: float


@dataclass
class SegmentFigures:
    """One segment as the figures and charts see it."""

    start: float
    backlog: Backlog
    bound: float
    answered: int = 0
    slo_leased: int = 0   # high-priority URLs leased in it
    slo_within: int = 0   # of which within 10 minutes of falling due


@dataclass(frozen=True)
class SimFigures:
    hosts: int
    urls: int
    daemons: int
    hours: float
    fetches: int
    violations: int
    lost: int
    dup_fetches: int
    in_flight_at_faults: int
    takeovers: int
    bound_ratio: float
    fresh_p50_s: float
    fresh_p99_s: float
    slo_10min: float
    slo_10min_healthy: float   # the same over hosts that never fail (alive, steady, robots.txt reachable)
    stale: int
    oldest_due_age_s: float
    oldest_due_age_within_cap_s: float
    giant_share: float
    tail_fresh_p99_s: float
    change_rate: float
    dead_hosts: int
    lost_to_storage: int
    refresh_listed: int      # URLs listed that were fetched before (revisits)
    discovery_listed: int    # URLs listed that were never fetched (discovered during the run)
    discovered: int          # unknown URLs revealed by fetched pages
    refresh_share_used: float  # mean share the budget split gave revisits (nan: generate.budget_split off)

    def line(self) -> str:
        return (f"sim: hosts={self.hosts} urls={self.urls} daemons={self.daemons} hours={self.hours:g} "
                f"fetches={self.fetches} violations={self.violations} lost={self.lost} "
                f"dup_fetches={self.dup_fetches} bound_ratio={self.bound_ratio:.3f} "
                f"fresh_p99_s={self.fresh_p99_s:.0f} slo_10min={self.slo_10min:.3f} "
                f"refresh/discovery={self.refresh_listed}/{self.discovery_listed} "
                f"refresh_share_used={self.refresh_share_used:.2f}")


@dataclass
class SimRun:
    """A finished run: its figures and what the report draws them from."""

    settings: SimSettings
    figures: SimFigures
    segments: list[SegmentFigures]
    faults: list[Fault]
    gap_ratios: np.ndarray          # end-to-start gap / the host's delay, every consecutive pair of requests
    lags: np.ndarray                # fetched - due of answered high-priority page requests
    fault_log: list[tuple[Fault, int]]  # each fault and the requests in flight it caught
    server_log: list[dict]              # every request as the simulated servers saw it
    giants: list[tuple[str, int, float]] = field(default_factory=list)  # (host, answered, bound)


def sim_config(settings: SimSettings) -> Config:
    """The defaults file, with the segment cadence, budget and lease of the run (a lease spans two segments, as
    the hourly default's 7,200 s spans two hours)."""
    segment_s = round(settings.segment_minutes * 60)
    return config_mod.load(None).with_overrides({
        "crawl.buckets": settings.buckets,
        "generate.segment_seconds": segment_s,
        "generate.segment_max_urls": settings.segment_max_urls,
        "generate.lease_seconds": 2 * segment_s,
        "generate.budget_split": settings.budget_split,
        "generate.refresh_share": settings.refresh_share,
        "generate.refresh_share_adaptive": settings.adaptive_share,
    })


def _faults(settings: SimSettings, rng: random.Random, end: float) -> list[Fault]:
    def at() -> float:
        return rng.uniform(0.1, 0.9) * end

    faults = [Fault(at(), "kill", rng.randrange(settings.daemons), 120.0) for _ in range(settings.kills)]
    faults += [Fault(at(), "freeze", rng.randrange(settings.daemons), rng.uniform(30, 180))
               for _ in range(settings.freezes)]
    faults += [Fault(at(), "sigterm", rng.randrange(settings.daemons), 30.0) for _ in range(settings.sigterms)]
    faults += [Fault(at(), "outage", None, rng.uniform(120, 600)) for _ in range(settings.outages)]
    return sorted(faults, key=lambda f: f.at)


def simulate(settings: SimSettings, gate_factory=None, progress=None) -> SimRun:
    """Run the simulation; `gate_factory` replaces how a daemon makes a host's gate (a broken rule, in tests);
    `progress(text)` gets a line per simulated hour."""
    rng = random.Random(settings.seed)
    conf = sim_config(settings)
    tail_urls = max(0, settings.urls - settings.giant_hosts * settings.giant_urls)
    max_urls = max(1, round(tail_urls / max(1, settings.hosts - settings.giant_hosts) * 5))  # mean of 1 + m u^4: m / 5
    hosts = draw_hosts(settings.hosts, max_urls, settings.giant_hosts, settings.giant_urls, settings.hours, rng)
    server = SimServer({h.key: h for h in hosts}, random.Random(settings.seed + 1))
    frontier = Frontier(hosts, conf, np.random.default_rng(settings.seed + 2), settings.due_spread_days * 86400,
                        settings.new_share, settings.new_links_per_fetch)
    fleet = Fleet(conf, server, frontier, settings.daemons, settings.buckets, random.Random(settings.seed + 3),
                  gate_factory)
    fleet.start()
    end = settings.hours * 3600
    segment_s = settings.segment_minutes * 60
    faults = _faults(settings, rng, end)
    segments: list[SegmentFigures] = []
    for number in range(math.ceil(end / segment_s)):
        start = number * segment_s
        fleet.loop.run_until(start)
        if progress is not None and number and start % 3600 < segment_s:
            progress(f"sim: {start / 3600:.0f} h of {settings.hours:g}, {len(server.log)} requests")
        frontier.update_hosts(number)
        rows, backlog = frontier.generate(number, start, settings.segment_max_urls,
                                          conf.generate.per_host_max_urls, segment_s,
                                          conf.generate.lease_seconds)
        fleet.open_segment(number, rows, lambda key: urls.bucket_of(key, settings.buckets))
        segments.append(SegmentFigures(start, backlog, _bound(rows, server, frontier, min(segment_s, end - start))))
        for fault in faults:
            if start <= fault.at < start + segment_s:
                fleet.loop.at(fault.at, lambda f=fault: _inject(fleet, f))
    fleet.loop.run_until(end)
    return _finish(settings, hosts, server, frontier, fleet, segments, faults, end)


def _bound(rows: list[dict], server: SimServer, frontier: Frontier, window: float) -> float:
    """The segment's politeness bound: per host that can be fetched, min(URLs listed, window / delay)."""
    listed: dict[int, int] = {}
    for row in rows:
        listed[row["host"]] = listed.get(row["host"], 0) + 1
    bound = 0.0
    for number, count in listed.items():
        host = frontier.hosts[number]
        if not host.dead and host.robots in ("rules", "none", "crawl_delay", "redirect", "forbidden"):
            bound += min(count, window / max(frontier.host_delay(number), 1e-9))
    return bound


def _inject(fleet: Fleet, fault: Fault) -> None:
    before = fleet.in_flight_at_faults
    _apply_fault(fleet, fault)
    fleet.fault_log.append((fault, fleet.in_flight_at_faults - before))


def _apply_fault(fleet: Fleet, fault: Fault) -> None:
    if fault.kind == "kill":
        fleet.kill(fault.daemon, fault.seconds)
    elif fault.kind == "freeze":
        fleet.freeze(fault.daemon, fault.seconds)
    elif fault.kind == "sigterm":
        fleet.terminate(fault.daemon, fault.seconds)
    else:
        fleet.storage_outage(fault.seconds)


def _quantile(values: np.ndarray, q: float) -> float:
    return float(np.sort(values)[min(len(values) - 1, int(q * len(values)))]) if len(values) else math.nan


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _gap_ratios(log: list[dict], delays: dict[str, float]) -> np.ndarray:
    """End-to-start gap over the host's delay for every request after a host's first (the judge's rule)."""
    ratios = []
    by_host: dict[str, list[dict]] = {}
    for record in log:
        by_host.setdefault(record["host"], []).append(record)
    for host, records in by_host.items():
        records.sort(key=lambda r: r["start"])
        latest_end = records[0]["end"]
        for current in records[1:]:
            ratios.append((current["start"] - latest_end) / max(delays[host], 1e-9))
            latest_end = max(latest_end, current["end"])
    return np.array(ratios)


def _finish(settings: SimSettings, hosts, server: SimServer, frontier: Frontier, fleet: Fleet,
            segments: list[SegmentFigures], faults: list[Fault], end: float) -> SimRun:
    rules = frontier.rules
    delays = {h.key: rules.host_delay(h.crawl_delay_s if h.robots == "crawl_delay" else None, None) for h in hosts}
    violations = politeness_violations(server.log, lambda host: delays[host], tolerance_s=1e-6)  # float rounding
    segment_s = settings.segment_minutes * 60
    answered = 0
    giant_answered = [0] * settings.giant_hosts
    for record in server.log:
        if record["path"] in ROBOTS_PATHS or record["status"] is None or record["end"] > end:
            continue
        answered += 1
        number = fleet.host_number[record["host"]]
        if number < settings.giant_hosts:
            giant_answered[number] += 1
        segments[min(int(record["start"] // segment_s), len(segments) - 1)].answered += 1
    fetches = np.array([(url, due, at) for url, due, at in fleet.fetches]) if fleet.fetches else np.zeros((0, 3))
    url_of = fetches[:, 0].astype(np.int64)
    high = frontier.priority[url_of] >= HIGH_PRIORITY
    late = fetches[:, 2] >= fetches[:, 1]
    lags = fetches[high & late, 2] - fetches[high & late, 1]
    tail = frontier.host_of[url_of] >= settings.giant_hosts
    tail_lags = fetches[high & late & tail, 2] - fetches[high & late & tail, 1]
    leased_lags = frontier.lease_lags()
    healthy_hosts = np.array([not (h.dead or h.flaky or h.throttle_share or h.robots in ("timeout", "outage"))
                              for h in hosts])
    healthy_lags = frontier.lease_lags(healthy_hosts)
    for segment, (_number, chosen, _versions, at, due) in zip(segments, frontier.leases, strict=True):
        high_priority = frontier.priority[chosen] >= HIGH_PRIORITY
        segment.slo_leased = int(high_priority.sum())
        segment.slo_within = int((at - due[high_priority] <= SLO_LAG_S).sum())
    giants = [(hosts[n].key, giant_answered[n], end / max(frontier.host_delay(n), 1e-9))
              for n in range(settings.giant_hosts)]
    bound = sum(s.bound for s in segments)
    figures = SimFigures(
        hosts=len(hosts), urls=len(frontier.next_due), daemons=settings.daemons, hours=settings.hours,
        fetches=sum(1 for r in server.log if r["path"] not in ROBOTS_PATHS), violations=len(violations),
        lost=frontier.lost(end), dup_fetches=sum(count - 1 for count in fleet.starts.values() if count > 1),
        in_flight_at_faults=fleet.in_flight_at_faults, takeovers=fleet.takeovers,
        bound_ratio=answered / bound if bound else math.nan,
        fresh_p50_s=_quantile(lags, 0.5), fresh_p99_s=_quantile(lags, 0.99),
        slo_10min=float((leased_lags <= SLO_LAG_S).mean()) if len(leased_lags) else math.nan,
        slo_10min_healthy=float((healthy_lags <= SLO_LAG_S).mean()) if len(healthy_lags) else math.nan,
        stale=frontier.stale,
        oldest_due_age_s=max(s.backlog.oldest_due_age_s for s in segments),
        oldest_due_age_within_cap_s=max(s.backlog.oldest_due_age_within_cap_s for s in segments),
        giant_share=max((a / b for _, a, b in giants), default=0.0),
        tail_fresh_p99_s=_quantile(tail_lags, 0.99),
        change_rate=frontier.changed / frontier.refetched if frontier.refetched else math.nan,
        dead_hosts=sum(frontier.is_dead(n, end) for n in range(len(hosts))),
        lost_to_storage=fleet.lost_to_storage,
        refresh_listed=sum(s.backlog.refresh_listed for s in segments),
        discovery_listed=sum(s.backlog.discovery_listed for s in segments),
        discovered=frontier.discovered,
        refresh_share_used=_mean([s.backlog.refresh_share for s in segments if s.backlog.refresh_share is not None]),
    )
    return SimRun(settings, figures, segments, faults, _gap_ratios(server.log, delays), lags, fleet.fault_log,
                  server.log, giants)


class FromDispatchGate(HostGate):
    """A deliberately broken politeness rule for the tests: the delay counts from the request's start (dispatch),
    not from its end, so a slow response leaves less than the delay before the next request."""

    def finished(self, now, status_code, retry_after_s, rng, elapsed_s=None):
        super().finished(now, status_code, retry_after_s, rng, elapsed_s)
        start = self.last_start_at if self.last_start_at is not None else now
        self.next_allowed_at = max(start + self.delay_s(), self.hold_until)


def broken_gate(rules: PolitenessRules) -> HostGate:
    gate = rules.gate()
    return FromDispatchGate(**{name: getattr(gate, name) for name in HostGate.__dataclass_fields__})
