"""The Prometheus alert rules (docs/prometheus-alerts.yml) and the Grafana dashboards (docs/grafana-*.json): every
expression parses as PromQL (promql-parser, the Rust parser of GreptimeDB: promtool is not installable here without
building Prometheus), and every series it names is one the engine exports (the daemon's families, process and build
series included, and the driver's registry), so a rename cannot leave a rule or a panel querying nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from crawler.service_levels import ServiceLevels
from fetchd.metrics import exported_families
from jobs.run_metrics import RunMetrics

DOCS = Path(__file__).resolve().parents[1] / "docs"
RULES = DOCS / "prometheus-alerts.yml"
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# Grafana's variables, replaced by what they stand for before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": ".*", "$daemon": ".*"}
# The nodes of promql-parser's tree that hold sub-expressions, by attribute.
_CHILDREN = ("lhs", "rhs", "expr", "param", "vector_selector")


def metric_names(node: Any) -> set[str]:
    """The metric names an expression's selectors name (`up` included)."""
    names = {node.name} if type(node).__name__ == "VectorSelector" and node.name else set()
    for attribute in _CHILDREN:
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (str, int, float)):
            names |= metric_names(child)
    for argument in getattr(node, "args", None) or ():
        names |= metric_names(argument)
    return names


def exported() -> set[str]:
    """Every series name the engine serves: a daemon's `/metrics` and the driver's, plus Prometheus's own `up`."""
    driver = RunMetrics(0, ServiceLevels(discovery_durable_s=60.0, lease_within_s=600.0, lease_share=0.99,
                                         high_priority=1.0))
    driver.observe_step("update", "seg-1", 1.0)  # a labelled series has samples once it has a child
    names = {sample.name for family in driver.registry.collect() for sample in family.samples}
    return exported_families() | names | {"up"}


def test_the_walker_finds_every_selector():
    expr = ('sum by (d) (rate(a_total{x="1"}[5m])) / clamp_min(sum(rate(b_total[5m])), 1e-9) > 0.05 '
            'or absent(up{job="j"} == 1) or histogram_quantile(0.9, sum by (le) (rate(c_bucket[5m])))')
    assert metric_names(promql_parser.parse(expr)) == {"a_total", "b_total", "up", "c_bucket"}
    with pytest.raises(ValueError):
        promql_parser.parse("rate(a_total[5m)")


def test_alert_rules_parse_and_query_only_exported_series():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len({group["name"] for group in groups}) == len(groups)
    assert len({rule["alert"] for rule in rules}) == len(rules) >= 5
    known = exported()
    queried: set[str] = set()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"Cyclecrawl[A-Z][A-Za-z]+", rule["alert"])
        assert "for" not in rule or DURATION.match(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        names = metric_names(promql_parser.parse(rule["expr"]))
        assert names and names <= known, (rule["alert"], sorted(names - known))
        queried |= names
    # What the issue asked to alert on: daemon down, self-violations, throttling, storage, the oldest due URL.
    assert {"up", "fetchd_politeness_self_violations_total", "fetchd_throttled_responses_total",
            "fetchd_storage_paused_buckets", "crawl_frontier_oldest_due_age_seconds"} <= queried


@pytest.mark.parametrize("dashboard", ["grafana-fetchd.json", "grafana-crawl.json"])
def test_dashboards_parse_with_the_rate_interval_and_query_only_exported_series(dashboard):
    panels = json.loads((DOCS / dashboard).read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    known = exported()
    for expr in exprs:
        if dashboard == "grafana-fetchd.json":  # the crawl's keeps its longer windows: a step runs once a minute
            assert not re.search(r"\[\d+[smh]\]", expr) or "increase(" in expr, f"a fixed rate window: {expr}"
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        names = metric_names(promql_parser.parse(expr))
        assert names <= known, (expr, sorted(names - known))


def test_the_daemon_dashboard_filters_by_daemon_and_shows_daemons_down():
    board = json.loads((DOCS / "grafana-fetchd.json").read_text())
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert "fetchd_build_info" in variables["daemon"]["definition"] and variables["daemon"]["includeAll"]
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    assert all('daemon=~"$daemon"' in expr for expr in exprs if "fetchd_" in expr)
    down = [panel for panel in board["panels"] if "down" in panel["title"].lower()]
    assert down and any("up{" in target["expr"] for panel in down for target in panel["targets"])
