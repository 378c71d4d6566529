"""Observability of the fetch daemon: counters, scheduler gauges, a Prometheus `/metrics` and a JSON `/status`.

One `snapshot` of a daemon's state feeds all three views (the exposition text, the status document and the
periodic progress log line), so they never disagree; the daemon fills that state (`DaemonState`) when asked, and
this module reads nothing else of it. Counters live in `Metrics` and only grow while the daemon
lives; gauges are read from the buckets being fetched at the moment of the snapshot:

* active hosts: hosts with URLs not reported yet (queued, waiting for robots.txt, or in flight);
* ready hosts: hosts that have something to dispatch and whose politeness gate is open now;
* ready lag: now - the time a ready host's gate opened (never before its bucket started). Its max and sum
  grow when the scheduler (slots, event loop) falls behind what politeness would allow.

A politeness wait is counted when a request is due on a host whose gate holds it: after one of its requests
ended with URLs still queued, or when a robots.txt request or a redirect hop must wait for the gate; its
seconds are the hold the gate imposed. Time past the gate's opening is ready lag, not a wait. `/metrics` is
rendered by prometheus_client from the snapshots (`SnapshotCollector`), in the format the scraper asks for.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
import socket
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from crawler.commandline import engine_version
from crawler.politeness import THROTTLE_STATUSES
from crawler.status import LiveHostState

if TYPE_CHECKING:
    from crawler.config import Config
    from crawler.scheduling import HostWork

log = logging.getLogger("fetchd")

FETCH_SECONDS_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RESOLVE_SECONDS_BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
# Reported on their own, beside their class: the servers asking us to slow down (crawler.politeness's statuses).
THROTTLE_CODES = tuple(sorted(THROTTLE_STATUSES))


@dataclass
class Histogram:
    """A Prometheus histogram: observations counted under each upper bound (non-cumulative here; cumulative when
    exposed), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.bounds) + 1)  # the last slot is +Inf

    def observe(self, value: float) -> None:
        self.counts[next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))] += 1
        self.total += value

    def cumulative(self) -> dict[str, int]:
        """le label -> observations at or under it, +Inf last."""
        running, out = 0, {}
        for bound, count in zip([*map(repr, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out[bound] = running
        return out


# A host's size class, from the URLs a bucket run has listed for it: the bounds of "1", "2-10", "11-100", "101-1000"
# and ">1000". Throttling by class tells on-call whether the giant hosts or the long tail push back.
HOST_CLASS_BOUNDS = (1, 10, 100, 1000)


def host_class(listed: int) -> str:
    """The size class of a host with `listed` fetch-list URLs in its bucket run (robots.txt first: 0 or more)."""
    lower = 1
    for bound in HOST_CLASS_BOUNDS:
        if listed <= bound:
            return str(bound) if lower == bound else f"{lower}-{bound}"
        lower = bound + 1
    return f">{HOST_CLASS_BOUNDS[-1]}"


def status_class(status: int | None) -> str:
    """"2xx" ... "5xx" for a status code, "none" for no response (network error, timeout)."""
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else "none"


@dataclass
class Metrics:
    """Counters of one daemon since it started; updated from the event loop only."""

    outcomes: Counter[str] = field(default_factory=Counter)  # fetch-list URLs finished, by outcome
    urls_listed: int = 0           # fetch-list URLs taken on
    responses: int = 0             # HTTP responses received (pages, robots.txt, redirect hops)
    bytes_downloaded: int = 0      # response body bytes as received (still content-encoded)
    warc_bytes: int = 0            # bytes written to WARC files (compressed, warcinfo records included)
    robots_denials: int = 0        # URLs not requested because robots.txt disallows them
    politeness_waits: int = 0      # times a host with URLs queued was held by its gate
    politeness_wait_s: float = 0.0  # seconds of those holds
    politeness_violations: int = 0  # requests sent sooner than the rules allow (crawler.politeness.PolitenessAudit)
    storage_errors: int = 0        # times a bucket paused because its files could not be written
    storage_paused: int = 0        # buckets paused now, waiting for storage to work again
    started: float = 0.0           # the daemon's clock (monotonic) when it started
    by_class: Counter[str] = field(default_factory=Counter)   # requests by status class ("none": no response)
    throttled: Counter[int] = field(default_factory=Counter)  # 429 and 503 responses, by code
    by_host_class: Counter[str] = field(default_factory=Counter)         # requests, by host size class
    throttled_by_host_class: Counter[str] = field(default_factory=Counter)  # 429/503 responses, by host size class
    fetch_seconds: Histogram = field(default_factory=lambda: Histogram(FETCH_SECONDS_BOUNDS))
    resolve_seconds: Histogram = field(default_factory=lambda: Histogram(RESOLVE_SECONDS_BOUNDS))

    def response(self, body_bytes: int) -> None:
        self.responses += 1
        self.bytes_downloaded += body_bytes

    def request(self, status: int | None, seconds: float, host_size_class: str) -> None:
        """A request ended (answered or not): its class, whether it was a throttle (by code, and by the size class
        of the host it went to), how long it took."""
        self.by_class[status_class(status)] += 1
        self.by_host_class[host_size_class] += 1
        self.throttled_by_host_class[host_size_class] += 0  # every class with requests has a series, 0 or more
        if status in THROTTLE_CODES:
            self.throttled[status] += 1
            self.throttled_by_host_class[host_size_class] += 1
        self.fetch_seconds.observe(seconds)

    def warc_written(self, record_bytes: int) -> None:
        self.warc_bytes += record_bytes

    def politeness_wait(self, seconds: float) -> None:
        self.politeness_waits += 1
        self.politeness_wait_s += seconds


@dataclass(frozen=True)
class BucketState:
    """What the figures read of one bucket run (`fetchd.bucketrun.BucketRun.state`); `outcomes` and `hosts` are
    the run's own, read at once."""

    bucket: int
    urls: int                   # URLs the run fetches (not reported by an earlier run)
    outcomes: Counter[str]      # of those, finished so far, by outcome
    hosts: Collection[HostWork]
    begun: float | None         # monotonic start of the run's scheduler; None before it started
    tasks: int                  # requests and host preparations in flight
    warc_files_closed: int


@dataclass(frozen=True)
class DaemonState:
    """What the figures read of a daemon at one instant (`fetchd.daemon.Daemon.state`)."""

    daemon_id: str
    segment_id: str | None  # the segment being (or last) fetched
    now: float              # the daemon's clock (monotonic)
    metrics: Metrics
    buckets: list[BucketState]
    label: str = ""         # the `daemon` label of its series (`metrics_label`); empty = daemon_id
    process: dict[str, dict[str, Any]] = field(default_factory=dict)  # `process_figures()` of its process
    robots_ages: list[float] = field(default_factory=list)  # seconds since each cached robots copy in force was fetched
    robots_unreachable: int = 0  # hosts whose last robots.txt fetch found it unreachable


@dataclass
class HostFigures:
    """Scheduler gauges over a set of hosts at one instant."""

    active: int = 0
    ready: int = 0
    ready_lag_max_s: float = 0.0
    ready_lag_sum_s: float = 0.0
    queued: int = 0

    def add(self, other: HostFigures) -> None:
        self.active += other.active
        self.ready += other.ready
        self.ready_lag_max_s = max(self.ready_lag_max_s, other.ready_lag_max_s)
        self.ready_lag_sum_s += other.ready_lag_sum_s
        self.queued += other.queued


def host_figures(hosts: Iterable[HostWork], begun: float, now: float) -> HostFigures:
    """Gauges of one bucket's hosts; `begun` is when the bucket's scheduler started (monotonic)."""
    figures = HostFigures()
    for host in hosts:
        figures.queued += len(host.queue)
        if host.left:
            figures.active += 1
        if host.queue and host.wants_dispatch() and host.gate.can_start(now):
            lag = now - max(host.gate.opens_at(), begun)
            figures.ready += 1
            figures.ready_lag_max_s = max(figures.ready_lag_max_s, lag)
            figures.ready_lag_sum_s += lag
    return figures


def _bucket_status(run: BucketState, now: float) -> tuple[dict[str, Any], HostFigures]:
    figures = host_figures(run.hosts, run.begun, now) if run.begun is not None else HostFigures()
    results = sum(run.outcomes.values())
    status = {
        "bucket": run.bucket,
        "state": "done" if results == run.urls else ("fetching" if run.begun is not None else "waiting"),
        "urls": run.urls,
        "results": results,
        "outcomes": dict(sorted(run.outcomes.items())),
        "hosts": len(run.hosts),
        "active_hosts": figures.active,
        "ready_hosts": figures.ready,
        "queued": figures.queued,
        "tasks": run.tasks,
        "warc_files_closed": run.warc_files_closed,
    }
    return status, figures


def snapshot(state: DaemonState) -> dict[str, Any]:
    """Every figure the daemon reports, at one instant."""
    now = state.now
    m = state.metrics
    totals = HostFigures()
    buckets = []
    for run in state.buckets:
        status, figures = _bucket_status(run, now)
        buckets.append(status)
        totals.add(figures)
    done = sum(m.outcomes.values())
    uptime = max(now - m.started, 1e-9)
    hosts_by_state = Counter({state.value: 0 for state in LiveHostState})
    hosts_by_state.update(host.state() for run in state.buckets for host in run.hosts if host.left)
    return {
        "daemon_id": state.daemon_id,
        "daemon": state.label or state.daemon_id,
        "build": build_info(),
        "process": state.process,
        "segment_id": state.segment_id,
        "uptime_s": round(uptime, 3),
        "counters": {
            "urls_listed": m.urls_listed,
            "urls_done": done,
            "outcomes": dict(sorted(m.outcomes.items())),
            "responses": m.responses,
            "bytes_downloaded": m.bytes_downloaded,
            "warc_bytes": m.warc_bytes,
            "robots_denials": m.robots_denials,
            "politeness_waits": m.politeness_waits,
            "politeness_wait_s": round(m.politeness_wait_s, 6),
            "politeness_violations": m.politeness_violations,
            "storage_errors": m.storage_errors,
            "responses_by_class": dict(sorted(m.by_class.items())),
            "throttled": {str(code): m.throttled[code] for code in THROTTLE_CODES},
            "requests_by_host_class": dict(sorted(m.by_host_class.items())),
            "throttled_by_host_class": dict(sorted(m.throttled_by_host_class.items())),
        },
        "histograms": {
            "fetch_seconds": {"buckets": m.fetch_seconds.cumulative(), "sum": round(m.fetch_seconds.total, 6)},
            "resolve_seconds": {"buckets": m.resolve_seconds.cumulative(), "sum": round(m.resolve_seconds.total, 6)},
        },
        "gauges": {
            "active_hosts": totals.active,
            "ready_hosts": totals.ready,
            "ready_lag_max_s": round(totals.ready_lag_max_s, 6),
            "ready_lag_sum_s": round(totals.ready_lag_sum_s, 6),
            "urls_queued": totals.queued,
            "storage_paused_buckets": m.storage_paused,
            "urls_per_s": round(done / uptime, 3),
            "hosts_by_state": dict(hosts_by_state),
            "robots_cached": len(state.robots_ages),
            "robots_cache_age_max_s": round(max(state.robots_ages, default=0.0), 3),
            "robots_unreachable_hosts": state.robots_unreachable,
        },
        "buckets": buckets,
    }


def progress_line(snap: dict[str, Any]) -> str:
    """The periodic log line: the same figures as `/metrics` and `/status`."""
    c, g = snap["counters"], snap["gauges"]
    outcomes = " ".join(f"{k}={v}" for k, v in c["outcomes"].items()) or "-"
    return (
        f"{c['urls_done']}/{c['urls_listed']} urls, {outcomes}, {g['urls_per_s']:.1f} urls/s, "
        f"hosts active={g['active_hosts']} ready={g['ready_hosts']} lag_max={g['ready_lag_max_s']:.2f}s, "
        f"queued={g['urls_queued']}, downloaded={c['bytes_downloaded']}B warc={c['warc_bytes']}B, "
        f"politeness waits={c['politeness_waits']} ({c['politeness_wait_s']:.1f}s), "
        f"robots denials={c['robots_denials']}"
    )


# --- Prometheus exposition (prometheus_client) -------------------------------------------------------------

# name, type, help, where the value comes from ("counters.x" / "gauges.x"). Names follow Prometheus's conventions
# (base unit last, `_total` on counters only); docs/changelog.md lists the names they replaced.
_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("fetchd_urls_listed_total", "counter", "Fetch-list URLs taken on.", "counters.urls_listed"),
    ("fetchd_responses_total", "counter", "HTTP responses received (pages, robots.txt).", "counters.responses"),
    ("fetchd_downloaded_bytes_total", "counter", "Response body bytes received, as encoded on the wire.",
     "counters.bytes_downloaded"),
    ("fetchd_warc_written_bytes_total", "counter", "Bytes written to WARC files.", "counters.warc_bytes"),
    ("fetchd_robots_denials_total", "counter", "URLs not requested because robots.txt disallows them.",
     "counters.robots_denials"),
    ("fetchd_politeness_waits_total", "counter", "Times a host with URLs queued was held by its politeness gate.",
     "counters.politeness_waits"),
    ("fetchd_politeness_wait_seconds_total", "counter", "Seconds hosts with URLs queued were held by their gate.",
     "counters.politeness_wait_s"),
    ("fetchd_politeness_self_violations_total", "counter", "Requests this daemon sent sooner than its own politeness "
     "rules allow, as its request log judges them (crawler.politeness.PolitenessAudit); anything above 0 is a bug.",
     "counters.politeness_violations"),
    ("fetchd_storage_errors_total", "counter", "Times a bucket paused because its files could not be written.",
     "counters.storage_errors"),
    ("fetchd_storage_paused_buckets", "gauge", "Buckets paused until storage works again.",
     "gauges.storage_paused_buckets"),
    ("fetchd_hosts_active", "gauge", "Hosts with URLs left in the buckets being fetched.", "gauges.active_hosts"),
    ("fetchd_hosts_ready", "gauge", "Hosts with URLs queued whose politeness gate is open.", "gauges.ready_hosts"),
    ("fetchd_ready_lag_max_seconds", "gauge", "Largest now - gate opening time over ready hosts.",
     "gauges.ready_lag_max_s"),
    ("fetchd_ready_hosts_lag_seconds", "gauge", "Now - gate opening time, summed over ready hosts (over "
     "fetchd_hosts_ready: the mean lag).", "gauges.ready_lag_sum_s"),
    ("fetchd_urls_queued", "gauge", "URLs queued in the buckets being fetched.", "gauges.urls_queued"),
    ("fetchd_robots_cached_hosts", "gauge", "Hosts whose robots.txt copy is cached.", "gauges.robots_cached"),
    ("fetchd_robots_cache_max_age_seconds", "gauge", "Age of the oldest robots.txt copy cached.",
     "gauges.robots_cache_age_max_s"),
    ("fetchd_robots_unreachable_hosts", "gauge", "Hosts whose last robots.txt fetch found it unreachable.",
     "gauges.robots_unreachable_hosts"),
)
# name, type, help, label, where the labelled values come from ("counters.x" / "gauges.x": {label value: number})
_LABELLED: tuple[tuple[str, str, str, str, str], ...] = (
    ("fetchd_fetches_total", "counter", "Fetch-list URLs finished, by outcome (robots_denied, deferred and blocked "
     "were not requested).", "outcome", "counters.outcomes"),
    ("fetchd_requests_total", "counter", "Requests ended, by status class (none: no response).", "class",
     "counters.responses_by_class"),
    ("fetchd_throttled_responses_total", "counter", "429 and 503 responses (servers asking to slow down).", "code",
     "counters.throttled"),
    ("fetchd_hosts", "gauge", "Hosts with URLs left in the buckets being fetched, by what holds them.", "state",
     "gauges.hosts_by_state"),
    ("fetchd_host_class_requests_total", "counter", "Requests ended, by the size class of the host (fetch-list URLs "
     "in its bucket run).", "host_class", "counters.requests_by_host_class"),
    ("fetchd_host_class_throttled_total", "counter", "429 and 503 responses, by the size class of the host: over "
     "fetchd_host_class_requests_total, the throttle ratio per class.", "host_class",
     "counters.throttled_by_host_class"),
)
_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("fetchd_fetch_seconds", "Seconds from a request's start to its response's end (or its failure).",
     "fetch_seconds"),
    ("fetchd_resolve_seconds", "Seconds a host name took to resolve (the static map included).", "resolve_seconds"),
)
BUILD_INFO = "fetchd_build"  # exposed as fetchd_build_info{daemon,version,python_version} 1


def metrics_label(conf: Config) -> str:
    """The `daemon` label of a daemon's series: `fetch.metrics_label`, else `fetch.daemon_id`, else the host name.
    Never the pid (the default daemon_id has it): a restarted daemon carries on its series instead of starting new
    ones, and Prometheus's `instance` label tells daemons on one machine apart."""
    return conf.fetch.metrics_label or conf.fetch.daemon_id or socket.gethostname()


@functools.cache
def build_info() -> dict[str, str]:
    """What `fetchd_build_info` labels a daemon's series with."""
    return {"version": engine_version(), "python_version": platform.python_version()}


def process_figures() -> dict[str, dict[str, Any]]:
    """This process's CPU, memory, file descriptors and start time, as prometheus_client's process collector reads
    them (its names, types and help), kept in the snapshot so a command's processes each report their own."""
    return {family.name: {"type": family.type, "help": family.documentation, "value": family.samples[0].value}
            for family in ProcessCollector(registry=None).collect() if family.samples}


def _family(kind: str, name: str, help_text: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


class SnapshotCollector(Collector):
    """The figures of daemons' snapshots as prometheus_client metric families, one series per daemon (its `daemon`
    label): a custom collector, so the snapshots of a command's other processes (`fetch.processes`), read from the
    files they leave, are served at one endpoint beside this process's."""

    def __init__(self, snaps: Iterable[dict[str, Any]]):
        self.snaps = list(snaps)

    def collect(self) -> Iterable[Metric]:
        for name, kind, help_text, source in _FAMILIES:
            section, key = source.split(".")
            family = _family(kind, name, help_text, ["daemon"])
            for snap in self.snaps:
                family.add_metric([snap["daemon"]], snap[section][key])
            yield family
        for name, kind, help_text, value_label, source in _LABELLED:
            section, key = source.split(".")
            family = _family(kind, name, help_text, ["daemon", value_label])
            for snap in self.snaps:
                for value, count in snap[section][key].items():
                    family.add_metric([snap["daemon"], value], count)
            yield family
        for name, help_text, key in _HISTOGRAMS:
            histogram = HistogramMetricFamily(name, help_text, labels=["daemon"])
            for snap in self.snaps:
                figures = snap["histograms"][key]
                histogram.add_metric([snap["daemon"]], list(figures["buckets"].items()), figures["sum"])
            yield histogram
        build = InfoMetricFamily(BUILD_INFO, "The engine version and Python of each daemon (value 1).",
                                 labels=["daemon"])
        for snap in self.snaps:
            build.add_metric([snap["daemon"]], snap["build"])
        yield build
        yield from self._process_families()

    def _process_families(self) -> Iterable[Metric]:
        """process_* (CPU, memory, file descriptors, start time), per daemon process."""
        families: dict[str, Metric] = {}
        for snap in self.snaps:
            for name, figure in snap["process"].items():
                if name not in families:
                    families[name] = _family(figure["type"], name, figure["help"], ["daemon"])
                families[name].add_metric([snap["daemon"]], figure["value"])
        yield from families.values()


def _registry(snaps: Iterable[dict[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snaps))
    return registry


def render_prometheus(*snaps: dict[str, Any]) -> str:
    """Snapshots in Prometheus's text format 0.0.4: each family once, with a series per daemon."""
    return generate_latest(_registry(snaps)).decode("utf-8")


def exported_families() -> set[str]:
    """Every metric name `/metrics` exposes (histograms also as _bucket/_sum/_count series; process_* as this
    platform has them)."""
    names = {*(f[0] for f in _FAMILIES), *(f[0] for f in _LABELLED), f"{BUILD_INFO}_info"}
    names |= {family.samples[0].name for family in ProcessCollector(registry=None).collect() if family.samples}
    for name, _, _ in _HISTOGRAMS:
        names |= {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


class MetricsServer:
    """`/metrics` and `/status` over HTTP, served from the daemon's own event loop; `state` gives the daemon's
    state at each request, `peers` the latest snapshots of the command's other processes (`fetch.processes`)."""

    def __init__(self, state: Callable[[], DaemonState], peers: Callable[[], list[dict[str, Any]]] = list):
        self.state = state
        self.peers = peers
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        # a scrape takes milliseconds: a stopping daemon waits at most this long for one in progress
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        self.port = self.runner.addresses[0][1]
        log.info("fetchd metrics on http://%s:%d/metrics and /status", host, self.port)

    async def close(self) -> None:
        await self.runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        """The text format the scraper asks for (`Accept`: OpenMetrics or Prometheus 0.0.4)."""
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(_registry([snapshot(self.state()), *self.peers()]))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _status(self, _request: web.Request) -> web.Response:
        status = snapshot(self.state())
        peers = self.peers()
        if peers:
            status["processes"] = peers
        return web.Response(text=json.dumps(status, sort_keys=True), content_type="application/json")
