"""jobs/run_metrics.py: the continuous driver's Prometheus series, scraped from its endpoint on loopback, and the
Grafana dashboard docs/grafana-crawl.json, which must query only series the endpoint exports."""

from __future__ import annotations

import json
import math
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawler.service_levels import ServiceLevels
from jobs.run_metrics import RunMetrics

LEVELS = ServiceLevels(discovery_durable_s=60.0, lease_within_s=600.0, lease_share=0.99, high_priority=1.0)
DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-crawl.json"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from a real HTTP scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture
def served() -> Iterator[RunMetrics]:
    metrics = RunMetrics(free_port(), LEVELS)
    yield metrics
    metrics.close()


def test_steps_segments_and_service_levels_are_served(served):
    before = scrape(served.port)
    # Nothing measured yet: the figures are NaN (a gap in a panel), the targets are there from the start.
    assert math.isnan(before[("crawl_discovery_durable_p99_seconds", ())])
    assert math.isnan(before[("crawl_service_level_met", (("level", "lease"),))])
    assert before[("crawl_discovery_durable_target_seconds", ())] == 60.0
    assert before[("crawl_lease_within_target_seconds", ())] == 600.0
    assert before[("crawl_lease_share_target_ratio", ())] == 0.99
    assert before[("crawl_segments_merged_total", ())] == 0

    for step, seconds in (("generate", 1.5), ("parse", 3.0), ("update", 7.0), ("update", 4.0)):
        served.observe_step(step, "seg-1", seconds)
    served.observe_cycle_metrics({"segment_id": "seg-2", "step": "generate", "hp_eligible": 10,
                                  "hp_leased_within": 8, "hp_leased_late": 1, "hp_waiting_late": 1,
                                  "hp_lease_lag_p99_s": 720.0, "lease_share_within": 0.8, "due_urls": 99,
                                  "oldest_due_age_s": 3600.0})
    served.observe_cycle_metrics({"segment_id": "seg-1", "step": "update", "discovery_pages": 12,
                                  "discovery_durable_p50_s": 9.0, "discovery_durable_p99_s": 31.0})
    after = scrape(served.port)
    assert after[("crawl_step_last_duration_seconds", (("step", "update"),))] == 4.0
    assert after[("crawl_step_duration_seconds_count", (("step", "update"),))] == 2
    assert after[("crawl_step_duration_seconds_sum", (("step", "update"),))] == 11.0
    assert after[("crawl_step_duration_seconds_bucket", (("le", "5.0"), ("step", "update")))] == 1
    assert after[("crawl_segments_merged_total", ())] == 2  # two updates ended
    assert after[("crawl_lease_share_within_ratio", ())] == 0.8
    assert (after[("crawl_lease_eligible_high_priority_urls", ())], after[("crawl_lease_leased_within_urls", ())],
            after[("crawl_lease_leased_late_urls", ())], after[("crawl_lease_waiting_late_urls", ())]) == (10, 8, 1, 1)
    assert after[("crawl_lease_lag_p99_seconds", ())] == 720.0
    assert (after[("crawl_frontier_due_urls", ())], after[("crawl_frontier_oldest_due_age_seconds", ())]) == (99, 3600)
    assert (after[("crawl_discovery_pages", ())], after[("crawl_discovery_durable_p50_seconds", ())],
            after[("crawl_discovery_durable_p99_seconds", ())]) == (12, 9.0, 31.0)
    assert after[("crawl_service_level_met", (("level", "lease"),))] == 0.0  # 80 % < 99 %
    assert after[("crawl_service_level_met", (("level", "discovery"),))] == 1.0  # 31 s <= 60 s

    # A segment whose pages had no outlinks measured nothing: back to NaN, not the previous segment's figure.
    served.observe_cycle_metrics({"segment_id": "seg-3", "step": "update", "discovery_pages": 0,
                                  "discovery_durable_p50_s": None, "discovery_durable_p99_s": None})
    last = scrape(served.port)
    assert math.isnan(last[("crawl_discovery_durable_p99_seconds", ())])
    assert math.isnan(last[("crawl_service_level_met", (("level", "discovery"),))])


def test_port_zero_serves_nothing_and_close_stops_serving(base_conf):
    metrics = RunMetrics.from_config(base_conf)
    assert base_conf.cycle.metrics_port == 0 and metrics.port is None
    metrics.observe_step("parse", "seg-1", 1.0)  # kept, not served
    metrics.close()
    served = RunMetrics(free_port(), LEVELS)
    port = served.port
    assert scrape(port)
    served.close()
    with pytest.raises(OSError):
        scrape(port)


def test_the_grafana_dashboard_queries_only_what_the_driver_exports(served):
    """docs/grafana-crawl.json: every crawl_* series a panel queries is in a real scrape, and both levels are drawn
    beside their targets."""
    served.observe_step("update", "seg-1", 2.0)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queried = {name for expr in exprs for name in re.findall(r"\bcrawl_[a-z0-9_]+", expr)}
    scraped = {name for name, _ in scrape(served.port)}
    assert len(exprs) >= 10 and queried and queried <= scraped, sorted(queried - scraped)
    panels = {panel["title"]: " ".join(t["expr"] for t in panel["targets"]) for panel in dashboard["panels"]}
    assert any("crawl_discovery_durable_p99_seconds" in q and "crawl_discovery_durable_target_seconds" in q
               for q in panels.values())
    assert any("crawl_lease_share_within_ratio" in q and "crawl_lease_share_target_ratio" in q
               for q in panels.values())
