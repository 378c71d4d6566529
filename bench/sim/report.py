"""`docs/simulation.md` from a finished run: the settings, the figures against their goals, and one chart per
figure (SVG drawn with the cycle report's chart helpers, `crawler.report`)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from bench.sim.run import SimRun
from crawler.report import bar_chart_svg, histogram_svg

GAP_EDGES = (0.5, 1.0, 1.1, 1.5, 2.0, 5.0, 20.0)       # end-to-start gap over the host's delay
LAG_EDGES_MIN = (5, 10, 20, 30, 60, 120, 360)          # due -> fetched, minutes


def _bins(values: np.ndarray, edges: Sequence[float]) -> list[int]:
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1).tolist()


def _labels(edges: Sequence[float], unit: str = "") -> list[str]:
    return ([f"<{edges[0]:g}{unit}"] + [f"{a:g}-{b:g}{unit}" for a, b in zip(edges, edges[1:], strict=False)]
            + [f"≥{edges[-1]:g}{unit}"])


def _hourly(run: SimRun, value) -> tuple[list[str], list[int]]:
    """One bar per simulated hour: `value(segments of that hour)`, rounded."""
    hours = math.ceil(run.settings.hours)
    groups: list[list] = [[] for _ in range(hours)]
    for segment in run.segments:
        groups[min(int(segment.start // 3600), hours - 1)].append(segment)
    return [f"{h}" for h in range(hours)], [round(value(g)) if g else 0 for g in groups]


def _clock(seconds: float) -> str:
    return f"{int(seconds // 3600):02d}:{int(seconds % 3600 // 60):02d}"


def charts(run: SimRun) -> dict[str, tuple[str, str]]:
    """name -> (title, svg), one per figure."""
    f = run.figures
    out: dict[str, tuple[str, str]] = {}

    def add(name: str, title: str, svg: str) -> None:
        out[name] = (title, svg)

    add("politeness", f"End-to-start gap over the host's delay, every pair of requests ({f.violations} below 1)",
        histogram_svg("gap / delay", _labels(GAP_EDGES, "x"), _bins(run.gap_ratios, GAP_EDGES), warn_bins=2))
    add("throughput", "Answered page requests per hour, % of the politeness bound",
        histogram_svg("% of bound", *_hourly(run, lambda g: 100 * sum(s.answered for s in g)
                                             / max(sum(s.bound for s in g), 1e-9))))
    add("open_leases", f"URLs leased and not completed, at each hour's first segment start (lost at the end: "
        f"{f.lost})", histogram_svg("open leases", *_hourly(run, lambda g: g[0].backlog.open_leases)))
    items = [(f"{fault.kind} {'' if fault.daemon is None else f'd{fault.daemon} '}{_clock(fault.at)}", caught)
             for fault, caught in run.fault_log]
    add("duplicates", f"Requests in flight caught by each fault (duplicate fetches in all: {f.dup_fetches})",
        bar_chart_svg("in flight at the fault", items))
    add("freshness", f"Due -> fetched, high-priority URLs, minutes (p50 {f.fresh_p50_s / 60:.1f}, "
        f"p99 {f.fresh_p99_s / 60:.1f})",
        histogram_svg("lag", _labels(LAG_EDGES_MIN), _bins(run.lags / 60, LAG_EDGES_MIN)))
    add("slo", f"Eligible high-priority URLs leased within 10 minutes of falling due, % of those decided per hour "
        f"(leased_10min, the whole run: {100 * f.leased_10min:.1f} %)", histogram_svg("% within 10 min", *_hourly(
            run, lambda g: 100 * sum(s.backlog.hp_leased_within for s in g) / max(sum(
                s.backlog.hp_leased_within + s.backlog.hp_leased_late + s.backlog.hp_waiting_late for s in g), 1))))
    add("discovery", f"Segment start -> its links durable (parse's end), the longest per hour, seconds: a bound on "
        f"fetch -> durable (p99 over the run: {f.discovery_durable_p99_s:.0f} s)", histogram_svg("s", *_hourly(
            run, lambda g: max(
            (s.durable_at - s.start for s in g if s.durable_at < float("inf")), default=0.0))))
    add("starvation", "Oldest due URL's age at each hour's first segment start, minutes: hosts within their cap",
        histogram_svg("minutes", *_hourly(run, lambda g: g[0].backlog.oldest_due_age_within_cap_s / 60)))
    add("starvation_all", "Oldest due URL's age at each hour's first segment start, hours: every host (giants "
        "included)", histogram_svg("hours", *_hourly(run, lambda g: g[0].backlog.oldest_due_age_s / 3600)))
    add("giants", "Giant hosts: answered requests, % of their politeness bound (run seconds / delay)",
        bar_chart_svg("% of bound", [(host, round(100 * answered / bound)) for host, answered, bound in run.giants]))
    return out


def _share(refresh: int, discovery: int) -> str:
    return f"{refresh / (refresh + discovery):.1%}" if refresh + discovery else "n/a"


def _split(settings, figures) -> str:
    """What divided each segment between the two: generate's budget split (fixed or adaptive share), or nothing."""
    if not settings.budget_split:
        return ("`generate.budget_split` was off (the default): one ranking for both, so the split is what the due "
                "URLs' scores gave.")
    how = "adaptive (moved by each cycle's change rate and new URLs per fetch)" if settings.adaptive_share else "fixed"
    return (f"`generate.budget_split` was on with a {how} revisit share of {settings.refresh_share:g}: the share used "
            f"averaged {figures.refresh_share_used:.2f}, and a side that could not fill its share left it to the "
            "other.")


def write_report(run: SimRun, folder: str, wall_s: float) -> str:
    """Write `folder`/simulation.md and `folder`/simulation/*.svg; returns the Markdown file's path."""
    images = os.path.join(folder, "simulation")
    os.makedirs(images, exist_ok=True)
    f, s = run.figures, run.settings
    drawn = charts(run)
    for name, (_title, svg) in drawn.items():
        with open(os.path.join(images, f"{name}.svg"), "w", encoding="utf-8") as fh:
            fh.write(svg + "\n")
    args = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in dataclasses.asdict(s).items())
    goals = [
        ("politeness violations (end to start, every daemon)", "0", f"{f.violations}", f.violations == 0),
        ("URLs lost", "0", f"{f.lost}", f.lost == 0),
        ("duplicate fetches", f"<= in flight at faults ({f.in_flight_at_faults})", f"{f.dup_fetches}",
         f.dup_fetches <= f.in_flight_at_faults),
        ("throughput / politeness bound", ">= 0.95", f"{f.bound_ratio:.3f}", f.bound_ratio >= 0.95),
        ("high-priority due -> fetched p50 / p99", "reported", f"{f.fresh_p50_s:.0f} s / {f.fresh_p99_s:.0f} s",
         None),
        ("leased_10min: eligible high-priority URLs leased within 10 min", ">= 0.99", f"{f.leased_10min:.3f}",
         f.leased_10min >= 0.99),
        ("every high-priority lease within 10 min, hosts that never fail", ">= 0.99", f"{f.slo_10min_healthy:.3f}",
         f.slo_10min_healthy >= 0.99),
        ("discovery_durable_p50_s / discovery_durable_p99_s", "p99 <= 60 s",
         f"{f.discovery_durable_p50_s:.0f} s / {f.discovery_durable_p99_s:.0f} s", f.discovery_durable_p99_s <= 60),
        ("segments generated / starts refused (merges behind)", "reported", f"{f.segments} / {f.refused}", None),
        ("oldest due age, hosts within their cap", "bounded", f"{f.oldest_due_age_within_cap_s / 3600:.2f} h", None),
        ("oldest due age, every host", "reported", f"{f.oldest_due_age_s / 3600:.1f} h", None),
        ("giant hosts: answered / politeness bound (max)", "<= 1", f"{f.giant_share:.3f}", f.giant_share <= 1.0),
        ("tail hosts' high-priority due -> fetched p99", "reported", f"{f.tail_fresh_p99_s:.0f} s", None),
    ]
    rows = "\n".join(f"| {name} | {goal} | {value} | {'' if met is None else ('met' if met else '**not met**')} |"
                     for name, goal, value, met in goals)
    sections = "\n\n".join(f"### {title}\n\n![{title}](simulation/{name}.svg)" for name, (title, _) in drawn.items())
    text = f"""# The fleet simulator: a simulated day

`make sim` (or `python -m bench.sim`) runs the project's scheduling, politeness, robots.txt, lease and frontier
rules for a fleet of fetch daemons on one virtual clock — no sleeping, no sockets — against simulated hosts, and
judges the invariants from the simulation's own logs (the servers' request log, the leases handed out, the
results that arrived), never from the crawler's counters. `python -m bench.sim --report docs` rewrites this page.
What runs is the real code; what the simulator adds (the event loop, the cycle, the faults) and its
simplifications are listed in `bench/sim/fleet.py`; the simulated web's distributions in `bench/sim/world.py`;
the frontier's array forms of the rules (held equal to the Python forms by `tests/test_sim.py`) in
`bench/sim/frontier.py`; how each figure is computed in `bench/sim/run.py`.

## The default run

`python -m bench.sim {args}`

{f.hosts:,} hosts, {f.urls:,} known URLs, {f.daemons} daemons, {f.hours:g} simulated hours; a segment every
{60 * s.segment_minutes:g} s (the engine's cycle.interval_s by default) of at most {s.segment_max_urls:,} URLs, each
merged after its fetch in {s.merge_cost().total_s(0):g} s plus {1000 * s.merge_cost().total_s(1) -
1000 * s.merge_cost().total_s(0):.1f} ms a page (bench/sim/run.py, MergeCost: today's batch steps); {s.kills} kill -9,
{s.freezes} freezes, {s.sigterms} SIGTERM and
{s.outages} storage outage at random moments. It took {wall_s:.0f} s wall on this machine (2 cores).

    {f.line()}

| figure | goal | measured | |
|---|---|---|---|
{rows}

Also: {f.fetches:,} page requests, {f.takeovers} takeovers, {f.stale} stale results, {f.lost_to_storage}
results lost to the storage outage (fetched again), change rate of refetched pages {f.change_rate:.3f},
{f.dead_hosts} hosts dead at the end.

Refresh and discovery: {s.new_share:.0%} of each host's URLs start unknown and each fetched page reveals
{s.new_links_per_fetch:g} of them on average ({f.discovered:,} revealed). Generate listed {f.refresh_listed:,}
revisits and {f.discovery_listed:,} never-fetched URLs ({_share(f.refresh_listed, f.discovery_listed)} revisits; a
URL listed again after an attempt that did not complete it, such as on a host whose robots.txt times out, counts
each time); {_split(s, f)}

## Reading the figures

* **Politeness** holds exactly: no request to a host starts sooner than its delay after the end of the previous
  one, whichever daemon sent either, through takeovers, freezes (fencing) and restarts.
* **Freshness and the SLO** are bounded by politeness while the merges keep up with the cadence: a host's
  high-priority URLs that fall due faster than its delay allows (a giant host at 5 s between requests does at most
  about 115 requests in ten minutes) wait their turn, and hosts backing off, dead or without a reachable robots.txt
  are left out by generate on purpose. Tail hosts (every host but the giants) show the fleet's own lag. When a
  segment's merge takes longer than the cadence (segment starts refused, above), generate's backpressure stretches
  the cadence, fewer URLs are leased than politeness allows, and the throughput, freshness and lease figures then
  measure the batch side's cost per segment (MergeCost), not the fleet.
* **Starvation**: on a host whose due URLs fit its per-host cap, every due URL is listed in the next segment, so
  the oldest due age stays within a segment plus a lease (URLs not finished in their segment come back when
  their lease expires). On a host over its cap (the giants) equal priorities go oldest first, and the age boost
  (`generate.age_boost_per_day`, 0.1 a day) lets a priority-0.8 URL overtake fresh priority-2 URLs after
  (2 - 0.8) / 0.1 = 12 days overdue: its backlog ages only as fast as its due rate exceeds its politeness rate.
* **The service levels** are the engine's (crawler/service_levels.py) and so are their names. Discovery is bounded
  by the merge: a page's links are durable only when its segment's parse ends, after the fetch window and any merge
  still running before it; merges slower than the cadence queue up until generate's backpressure stretches it.

## Charts

{sections}
"""
    path = os.path.join(folder, "simulation.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path
