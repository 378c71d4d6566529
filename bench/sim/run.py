"""One simulated crawl: hosts, a frontier, a fleet, cycles and faults on one virtual clock, and the figures the
invariants are judged by — each computed from the simulation's own logs (the server's request log, the leases
handed out, the results that arrived), never from the crawler's counters.

* violations: `sitefarm.judge.politeness_violations` over the server's log (end of one request to a host to the
  start of the next, every daemon counted), against each host's known delay (minimum, capped Crawl-delay).
* lost: leased URLs with no result that `crawler.leases.is_due` would never hand out again.
* dup_fetches: page requests for a (URL, version) already requested; bounded by the requests in flight at the
  kills (`in_flight_at_faults`), since results publish when a response ends.
* bound_ratio: page requests answered inside their segment over the politeness bound of the hosts that could be
  fetched (allowed robots.txt, alive): per segment and host, min(URLs listed, segment seconds / delay).
* freshness: for high-priority URLs, fetched - due (p50, p99), and the share leased within 10 minutes of
  becoming due (leased at the first segment start after it; the reference design's SLO is 99 %).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.sim.fleet import HIGH_PRIORITY, Fleet, Frontier
from bench.sim.world import SimServer, draw_hosts
from crawler import config as config_mod
from crawler import urls
from crawler.config import Config
from crawler.politeness import HostGate, PolitenessRules
from sitefarm.judge import politeness_violations


@dataclass(frozen=True)
class SimSettings:
    hosts: int = 200
    urls: int = 20_000          # known URLs, about (the host draw decides the exact count)
    daemons: int = 2
    hours: float = 1.0
    seed: int = 1
    kills: int = 1              # kill -9 of a random daemon at a random moment, restarted 2 minutes later
    freezes: int = 1            # a random daemon stalls for 30 s to 3 minutes at a random moment
    buckets: int = 16
    segment_minutes: float = 10.0
    segment_max_urls: int = 20_000
    giant_hosts: int = 0
    giant_urls: int = 0


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
    stale: int

    def line(self) -> str:
        return (f"sim: hosts={self.hosts} urls={self.urls} daemons={self.daemons} hours={self.hours:g} "
                f"fetches={self.fetches} violations={self.violations} lost={self.lost} "
                f"dup_fetches={self.dup_fetches} bound_ratio={self.bound_ratio:.3f} "
                f"fresh_p99_s={self.fresh_p99_s:.0f} slo_10min={self.slo_10min:.3f}")


def sim_config(settings: SimSettings) -> Config:
    """The defaults file, with the segment cadence and budget of the run."""
    return config_mod.load(None).with_overrides({
        "crawl.buckets": settings.buckets,
        "generate.segment_seconds": round(settings.segment_minutes * 60),
        "generate.segment_max_urls": settings.segment_max_urls,
    })


def simulate(settings: SimSettings, gate_factory=None) -> SimFigures:
    """Run the simulation; `gate_factory` replaces how a daemon makes a host's gate (a broken rule, in tests)."""
    rng = random.Random(settings.seed)
    conf = sim_config(settings)
    max_urls = max(1, round(settings.urls / max(1, settings.hosts) * 5))  # mean of 1 + m * u^4 is about m / 5
    hosts = draw_hosts(settings.hosts, max_urls, settings.giant_hosts, settings.giant_urls, settings.hours, rng)
    server = SimServer({h.key: h for h in hosts}, random.Random(settings.seed + 1))
    frontier = Frontier(hosts, conf, random.Random(settings.seed + 2), settings.hours)
    fleet = Fleet(conf, server, frontier, settings.daemons, settings.buckets, random.Random(settings.seed + 3),
                  gate_factory)
    fleet.start()
    end = settings.hours * 3600
    segment_s = settings.segment_minutes * 60
    kills = sorted((rng.uniform(0.1, 0.9) * end, rng.randrange(settings.daemons)) for _ in range(settings.kills))
    freezes = sorted((rng.uniform(0.1, 0.9) * end, rng.randrange(settings.daemons), rng.uniform(30, 180))
                     for _ in range(settings.freezes))
    starts = [n * segment_s for n in range(math.ceil(end / segment_s))]
    bound = 0.0
    for number, start in enumerate(starts):
        fleet.loop.run_until(start)
        segment = f"seg-{number:04d}"
        rows = frontier.generate(segment, start, settings.segment_max_urls, conf["generate.per_host_max_urls"],
                                 segment_s, conf["generate.lease_seconds"])
        fleet.open_segment(segment, rows, lambda key: urls.bucket_of(key, settings.buckets))
        listed: dict[str, int] = {}
        for row in rows:
            listed[row["host_key"]] = listed.get(row["host_key"], 0) + 1
        window = min(segment_s, end - start)
        for key, count in listed.items():
            host = server.hosts[key]
            if not host.dead and host.robots in ("rules", "none", "crawl_delay", "redirect", "forbidden"):
                bound += min(count, window / max(frontier.host_delay(int(key.rsplit("h", 1)[1].split(".")[0])),
                                                 1e-9))
        for at, daemon in kills:
            if start <= at < start + segment_s:
                fleet.loop.at(at, lambda d=daemon: fleet.kill(d, 120.0))
        for at, daemon, seconds in freezes:
            if start <= at < start + segment_s:
                fleet.loop.at(at, lambda d=daemon, s=seconds: fleet.freeze(d, s))
    fleet.loop.run_until(end)
    return _figures(settings, hosts, server, frontier, fleet, bound, end)


def _figures(settings: SimSettings, hosts, server: SimServer, frontier: Frontier, fleet: Fleet, bound: float,
             end: float) -> SimFigures:
    rules = frontier.rules
    delays = {h.key: rules.host_delay(h.crawl_delay_s if h.robots == "crawl_delay" else None, None) for h in hosts}
    log = [r for r in server.log if r["end"] <= end or r["start"] <= end]
    violations = politeness_violations(log, lambda host: delays[host], tolerance_s=1e-6)  # float rounding only
    pages = [r for r in server.log if r["path"] not in ("/robots.txt", "/robots-moved.txt")]
    answered = [r for r in pages if r["status"] is not None and r["end"] <= end]
    lags = sorted(fetched - due for url, due, fetched in fleet.fetches
                  if frontier.priority[url] >= HIGH_PRIORITY and fetched >= due)
    leased_lags = [leased - due for _, url, _, leased, due in frontier.leases
                   if frontier.priority[url] >= HIGH_PRIORITY]

    def quantile(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else math.nan

    return SimFigures(
        hosts=len(hosts), urls=len(frontier.next_due), daemons=settings.daemons, hours=settings.hours,
        fetches=len(pages), violations=len(violations), lost=frontier.lost(end),
        dup_fetches=sum(count - 1 for count in fleet.starts.values() if count > 1),
        in_flight_at_faults=fleet.in_flight_at_faults, takeovers=fleet.takeovers,
        bound_ratio=len(answered) / bound if bound else math.nan,
        fresh_p50_s=quantile(lags, 0.5), fresh_p99_s=quantile(lags, 0.99),
        slo_10min=(sum(1 for lag in leased_lags if lag <= 600) / len(leased_lags)) if leased_lags else math.nan,
        stale=frontier.stale,
    )


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
