"""The continuous driver's Prometheus series (`crawl run`, `cycle.metrics_port`; 0 = none served): how long each
batch step takes, how many segments were merged, and the two service levels as the latest `cycle_metrics` rows hold
them, beside their targets (crawler/service_levels.py). docs/grafana-crawl.json draws them.

The figures come from the rows the steps wrote (the tables), never from counters of the driver's own: a restarted
driver shows the same levels as soon as it reads the next row. Served with prometheus_client on a registry of its
own (not the process-wide default), so several drivers or tests in one process do not share series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from crawler.config import Config
from crawler.service_levels import ServiceLevels
from crawler.status import MetricsStep

# A batch step of a small segment takes seconds; a slow one minutes (the cycle's interval is 30 s by default).
STEP_SECONDS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# (cycle_metrics column, series name, help) of the lease level, from generate's row ...
LEASE_SERIES = (
    ("hp_eligible", "crawl_lease_eligible_high_priority_urls",
     "eligible due high-priority URLs at the last generate, leased or not"),
    ("hp_leased_within", "crawl_lease_leased_within_urls", "of those, leased within the target at that generate"),
    ("hp_leased_late", "crawl_lease_leased_late_urls", "of those, leased later than the target at that generate"),
    ("hp_waiting_late", "crawl_lease_waiting_late_urls", "of those, not leased and waiting past the target"),
    ("hp_lease_lag_p99_s", "crawl_lease_lag_p99_seconds", "p99 due -> lease lag of those leased at that generate"),
    ("lease_share_within", "crawl_lease_share_within_ratio",
     "leased within the target / (within + leased late + waiting late) at the last generate"),
    ("due_urls", "crawl_frontier_due_urls", "URLs due at the last generate, leased or not"),
    ("oldest_due_age_s", "crawl_frontier_oldest_due_age_seconds",
     "now - the earliest next_fetch_at among the URLs due at the last generate"),
)
# ... and of the discovery level, from update's row.
DISCOVERY_SERIES = (
    ("discovery_pages", "crawl_discovery_pages", "pages with outlinks the last merged segment measured"),
    ("discovery_durable_p50_s", "crawl_discovery_durable_p50_seconds",
     "median fetch -> durable (links commit) lag of the last merged segment's pages"),
    ("discovery_durable_p99_s", "crawl_discovery_durable_p99_seconds",
     "p99 fetch -> durable (links commit) lag of the last merged segment's pages"),
)


class RunMetrics:
    """The driver's series, served on `port` (0: kept, not served) at `host` until `close`."""

    def __init__(self, port: int, levels: ServiceLevels, host: str = "127.0.0.1") -> None:
        self.levels = levels
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.step_last = Gauge("crawl_step_last_duration_seconds", "duration of the last run of each batch step",
                               ["step"], registry=registry)
        self.step_seconds = Histogram("crawl_step_duration_seconds", "durations of the batch steps' runs", ["step"],
                                      buckets=STEP_SECONDS_BUCKETS, registry=registry)
        self.merged = Counter("crawl_segments_merged", "segments merged (their update step ended) by this driver",
                              registry=registry)
        self.levels_met = Gauge("crawl_service_level_met", "1 when the last measurement of the level met its target, "
                                "0 when it missed, NaN when nothing was measured", ["level"], registry=registry)
        self.figures = {column: Gauge(name, doc, registry=registry)
                        for column, name, doc in (*LEASE_SERIES, *DISCOVERY_SERIES)}
        for name, doc, value in (
            ("crawl_discovery_durable_target_seconds", "service_levels.discovery_durable_s: the p99 target",
             levels.discovery_durable_s),
            ("crawl_lease_within_target_seconds", "service_levels.lease_within_s", levels.lease_within_s),
            ("crawl_lease_share_target_ratio", "service_levels.lease_share: the share that must be leased in time",
             levels.lease_share),
        ):
            Gauge(name, doc, registry=registry).set(value)
        for gauge in (*self.figures.values(), self.levels_met.labels("discovery"), self.levels_met.labels("lease")):
            gauge.set(math.nan)  # nothing measured yet: a gap in the panels, not a zero
        self._server = None
        if port:
            self._server, _ = start_http_server(port, host, registry=registry)

    @classmethod
    def from_config(cls, conf: Config) -> RunMetrics:
        return cls(conf.cycle.metrics_port, ServiceLevels.from_config(conf), conf.cycle.metrics_host)

    @property
    def port(self) -> int | None:
        """The port served, None when not served."""
        return None if self._server is None else self._server.server_address[1]

    def observe_step(self, step: str, segment_id: str, seconds: float) -> None:
        """A batch step (generate, parse, dedup, update) of `segment_id` ran for `seconds`; an update ending merges
        the segment."""
        self.step_last.labels(step).set(seconds)
        self.step_seconds.labels(step).observe(seconds)
        if step == MetricsStep.UPDATE.value:
            self.merged.inc()

    def observe_cycle_metrics(self, row: Mapping[str, Any]) -> None:
        """A `cycle_metrics` row just written (jobs/cycle_metrics.py): generate's sets the lease level, update's the
        discovery level; a figure not measured (null) is NaN."""
        series = LEASE_SERIES if row["step"] == MetricsStep.GENERATE.value else DISCOVERY_SERIES
        for column, _, _ in series:
            value = row.get(column)
            self.figures[column].set(math.nan if value is None else float(value))
        if row["step"] == MetricsStep.GENERATE.value:
            met, level = self.levels.lease_met(row.get("lease_share_within")), "lease"
        else:
            met, level = self.levels.discovery_met(row.get("discovery_durable_p99_s")), "discovery"
        self.levels_met.labels(level).set(math.nan if met is None else float(met))

    def close(self) -> None:
        """Stop serving (the series stay readable through `registry`)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
