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
* freshness: for high-priority URLs, fetched - due (p50, p99).
* the two service levels, on crawler/service_levels.py's definitions and the config's targets, under the engine's
  names: `leased_10min`, the lease level summed over every generate as the engine's cycle_metrics rows hold it
  (eligible due high-priority URLs leased within service_levels.lease_within_s / those decided: leased, or waiting
  past it), with `lease_lag_p99_s`; `discovery_durable_p50_s` / `discovery_durable_p99_s`, each parsed page's
  fetch -> the end of its segment's parse (the `links` commit). `slo_10min_healthy`: every high-priority lease
  handed out on the hosts that never fail, leased within the target of falling due.
* merges: a segment's fetch ends when the next one opens; its parse, dedup and update then take the time the batch
  benchmark measured (MergeCost), one segment after another, and the URLs its pages revealed are due only when its
  update ends. Generate waits (crawler.frontier.backpressure) while more than generate.max_unmerged_segments earlier
  segments are not merged: slow merges stretch the cadence, as in the engine.
* starvation: the oldest due URL's age at each segment start, over every host and over the hosts whose due URLs
  fit their per-host cap.
* giant hosts: each giant's answered requests over its politeness bound for the run (run seconds / delay).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from bench.sim.fleet import Fleet
from bench.sim.frontier import Backlog, Frontier
from bench.sim.world import SimServer, draw_hosts
from crawler import config as config_mod
from crawler import urls
from crawler.config import Config
from crawler.frontier import backpressure
from crawler.politeness import HostGate, PolitenessRules
from crawler.service_levels import ServiceLevels, percentile, share_within
from sitefarm.judge import politeness_violations

ROBOTS_PATHS = ("/robots.txt", "/robots-moved.txt")
# The engine's cadence: a new segment every cycle.interval_s of the defaults file.
ENGINE_SEGMENT_MINUTES = config_mod.load(None).cycle.interval_s / 60


@dataclass(frozen=True)
class MergeCost:
    """What merging a segment of `pages` parsed pages costs, in seconds: parse (its end is the `links` commit), then
    dedup and update. Fixed parts: the smallest per-cycle walls of a fresh-clone `make demo` on the 2-core reference
    machine in December 2026 (segments of 18 pages: parse 4 s, dedup 11 s, update 29 s); per page: bench.cycle's walls
    at 20 k pages (bench/README.md, figures of 2026-12-02: parse 50.8 s, dedup 48.5 s, update 132.5 s over 20,000
    pages). Today's engine, not a goal: the options of the run change them."""

    parse_fixed_s: float = 4.0
    parse_per_page_s: float = 50.8 / 20_000
    rest_fixed_s: float = 11.0 + 29.0
    rest_per_page_s: float = (48.5 + 132.5) / 20_000

    def parse_s(self, pages: int) -> float:
        return self.parse_fixed_s + self.parse_per_page_s * pages

    def total_s(self, pages: int) -> float:
        return self.parse_s(pages) + self.rest_fixed_s + self.rest_per_page_s * pages


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
    segment_minutes: float = ENGINE_SEGMENT_MINUTES  # the engine's cycle.interval_s
    segment_max_urls: int = 30_000
    giant_hosts: int = 3
    giant_urls: int = 1_000_000
    due_spread_days: float = 7.0  # known URLs fall due uniformly over this span (the default revisit interval)
    new_share: float = 0.1        # share of each host's URLs unknown at the start, revealed by links from fetched pages
    new_links_per_fetch: float = 0.2  # mean unknown URLs of its host a fetched page reveals (Poisson)
    budget_split: bool = False    # generate.budget_split: divide each segment between revisits and never-fetched URLs
    refresh_share: float = 0.45   # generate.refresh_share (with budget_split)
    adaptive_share: bool = False  # generate.refresh_share_adaptive (with budget_split)
    merge_parse_fixed_s: float = MergeCost.parse_fixed_s      # MergeCost: where these come from
    merge_parse_per_page_s: float = MergeCost.parse_per_page_s
    merge_rest_fixed_s: float = MergeCost.rest_fixed_s
    merge_rest_per_page_s: float = MergeCost.rest_per_page_s

    def merge_cost(self) -> MergeCost:
        return MergeCost(self.merge_parse_fixed_s, self.merge_parse_per_page_s, self.merge_rest_fixed_s,
                         self.merge_rest_per_page_s)


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
    number: int = 0
    answered: int = 0
    fetch_end: float = math.inf  # the next segment opened (or the run ended)
    merge_start: float = math.inf  # its fetch ended and the merge before it finished
    durable_at: float = math.inf   # its parse ended: the `links` commit
    merged_at: float = math.inf    # its update ended


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
    leased_10min: float        # the lease level over the run (crawler/service_levels.py; nan: none decided)
    lease_lag_p99_s: float     # due -> lease of the eligible high-priority URLs leased
    slo_10min_healthy: float   # every high-priority lease on hosts that never fail (alive, steady, robots reachable)
    discovery_pages: int       # parsed pages measured for the discovery level
    discovery_durable_p50_s: float
    discovery_durable_p99_s: float
    segments: int              # segments generated
    refused: int               # segment starts generate refused (backpressure: merges behind)
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
                f"fresh_p99_s={self.fresh_p99_s:.0f} leased_10min={self.leased_10min:.3f} "
                f"discovery_durable_p99_s={self.discovery_durable_p99_s:.0f} "
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
                        settings.new_share, settings.new_links_per_fetch, hold_discoveries=True)
    fleet = Fleet(conf, server, frontier, settings.daemons, settings.buckets, random.Random(settings.seed + 3),
                  gate_factory)
    fleet.start()
    end = settings.hours * 3600
    segment_s = settings.segment_minutes * 60
    cost = settings.merge_cost()
    faults = _faults(settings, rng, end)
    segments: list[SegmentFigures] = []
    refused = 0
    for number in range(math.ceil(end / segment_s)):
        start = number * segment_s
        fleet.loop.run_until(start)
        if progress is not None and number and start % 3600 < segment_s:
            progress(f"sim: {start / 3600:.0f} h of {settings.hours:g}, {len(server.log)} requests")
        for fault in faults:
            if start <= fault.at < start + segment_s:
                fleet.loop.at(fault.at, lambda f=fault: _inject(fleet, f))
        # The driver merges each segment as soon as its fetch ends: none is stalled, their count holds generate back.
        if backpressure({f"seg-{s.number}": False for s in segments if s.merged_at > start},
                        conf.generate.max_unmerged_segments):
            refused += 1
            continue
        if segments:
            _merge(segments, frontier, fleet, cost, start)
        frontier.update_hosts(number)
        rows, backlog = frontier.generate(number, start, settings.segment_max_urls,
                                          conf.generate.per_host_max_urls, segment_s,
                                          conf.generate.lease_seconds)
        fleet.open_segment(number, rows, lambda key: urls.bucket_of(key, settings.buckets))
        segments.append(SegmentFigures(start, backlog, _bound(rows, server, frontier, min(segment_s, end - start)),
                                       number))
    fleet.loop.run_until(end)
    _merge(segments, frontier, fleet, cost, end)
    return _finish(settings, hosts, server, frontier, fleet, segments, faults, end, refused)


def _merge(segments: list[SegmentFigures], frontier: Frontier, fleet: Fleet, cost: MergeCost, at: float) -> None:
    """The last segment's fetch ends at `at`: its merge starts when the one before it ends, its parse commits the
    links (durable) and its update releases the URLs its pages revealed."""
    last = segments[-1]
    before = segments[-2].merged_at if len(segments) > 1 else 0.0
    pages = len(frontier.pages[last.number])
    last.fetch_end = at
    last.merge_start = max(at, before)
    last.durable_at = last.merge_start + cost.parse_s(pages)
    last.merged_at = last.merge_start + cost.total_s(pages)
    fleet.loop.at(last.merged_at, lambda n=last.number, t=last.merged_at: frontier.release(n, t))


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
            segments: list[SegmentFigures], faults: list[Fault], end: float, refused: int) -> SimRun:
    rules = frontier.rules
    levels = ServiceLevels.from_config(frontier.conf)
    delays = {h.key: rules.host_delay(h.crawl_delay_s if h.robots == "crawl_delay" else None, None) for h in hosts}
    violations = politeness_violations(server.log, lambda host: delays[host], tolerance_s=1e-6)  # float rounding
    starts = [segment.start for segment in segments]
    answered = 0
    giant_answered = [0] * settings.giant_hosts
    for record in server.log:
        if record["path"] in ROBOTS_PATHS or record["status"] is None or record["end"] > end:
            continue
        answered += 1
        number = fleet.host_number[record["host"]]
        if number < settings.giant_hosts:
            giant_answered[number] += 1
        segments[max(0, bisect_right(starts, record["start"]) - 1)].answered += 1
    fetches = np.array([(url, due, at) for url, due, at in fleet.fetches]) if fleet.fetches else np.zeros((0, 3))
    url_of = fetches[:, 0].astype(np.int64)
    high = frontier.priority[url_of] >= levels.high_priority
    late = fetches[:, 2] >= fetches[:, 1]
    lags = fetches[high & late, 2] - fetches[high & late, 1]
    tail = frontier.host_of[url_of] >= settings.giant_hosts
    tail_lags = fetches[high & late & tail, 2] - fetches[high & late & tail, 1]
    healthy_hosts = np.array([not (h.dead or h.flaky or h.throttle_share or h.robots in ("timeout", "outage"))
                              for h in hosts])
    healthy_lags = frontier.lease_lags(healthy_hosts)
    within = sum(s.backlog.hp_leased_within for s in segments)
    late = sum(s.backlog.hp_leased_late + s.backlog.hp_waiting_late for s in segments)
    lease_lags = np.concatenate(frontier.hp_lease_lags) if frontier.hp_lease_lags else np.zeros(0)
    discovery = _discovery_lags(segments, frontier)
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
        leased_10min=_nan_if_none(share_within(within, late)),
        lease_lag_p99_s=_nan_if_none(percentile(lease_lags.tolist(), 0.99)),
        slo_10min_healthy=(float((healthy_lags <= levels.lease_within_s).mean()) if len(healthy_lags)
                           else math.nan),
        discovery_pages=len(discovery),
        discovery_durable_p50_s=_nan_if_none(percentile(discovery, 0.5)),
        discovery_durable_p99_s=_nan_if_none(percentile(discovery, 0.99)),
        segments=len(segments), refused=refused,
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


def _discovery_lags(segments: list[SegmentFigures], frontier: Frontier) -> list[float]:
    """Each parsed page's fetch -> its segment's links commit (the end of its parse), for the pages its parse read
    (fetched before the merge started; a straggler after it belongs to no parse here)."""
    return [segment.durable_at - at for segment in segments if math.isfinite(segment.durable_at)
            for at in frontier.pages.get(segment.number, []) if at <= segment.merge_start]


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


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
