"""`crawl run`, the continuous driver, judged from what its crawls left (`tests/support/run_crawls.py`: a clean
crawl to idle, by `crawl demo`, and one on a farm of its own with the same pages killed with SIGKILL at three
points, stopped with SIGTERM during a step and run to idle): both end with the same URLs and statuses, every
reachable page fetched, no result, index event or link twice, every segment merged once, and no politeness violation
in either farm's own log. The tables are read with delta-rs (no JVM here).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from crawler import config as config_mod
from sitefarm.judge import politeness_violations
from sitefarm.server import read_request_log
from tests.support.run_crawls import DELAY_S, MAX_DEPTH, SIGTERM_BOUND_S

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def table(root: Path, name: str):
    from deltalake import DeltaTable

    return DeltaTable(str(root / "tables" / name)).to_pyarrow_table().to_pylist()


def test_sigterm_stops_the_driver_and_its_daemon_cleanly(run_crawls):
    """SIGTERM during a step: exit 0 within the bound, the step finished, nothing of the process group left (the
    daemon child, the JVM), every bucket lease the daemon held released; the restart to idle finishes the crawl
    (checked with the rest below)."""
    _, killed = run_crawls
    stop = killed.sigterm
    assert stop["code"] == 0, stop["output"]
    assert stop["seconds"] < SIGTERM_BOUND_S
    assert stop["group_left"] == []
    assert stop["held"] == []
    assert "run: update" in stop["output"] and "run: stopped:" in stop["output"]


def test_kill_9_at_any_step_loses_nothing_and_merges_nothing_twice(run_crawls):
    clean, killed = run_crawls
    assert clean.demo.returncode == 0, clean.demo.out[-3000:] + clean.demo.err[-3000:]
    token = config_mod.load().crawl.robots_token
    summaries = {}
    for crawl in (clean, killed):
        reachable = crawl.farm.expected_fetches(token, max_depth=MAX_DEPTH)
        urls = table(crawl.root, "urls")
        fetches = table(crawl.root, "fetches")
        fetched = {r["url"] for r in fetches if r["status_code"] is not None}
        assert reachable <= fetched, sorted(reachable - fetched)[:5]
        results = Counter((r["url_id"], r["state_version"]) for r in fetches)
        assert max(results.values()) == 1, [k for k, n in results.items() if n > 1][:5]
        events = Counter((r["url_id"], r["state_version"]) for r in table(crawl.root, "index_events"))
        assert not events or max(events.values()) == 1
        links = Counter(repr(sorted(r.items())) for r in table(crawl.root, "links"))
        assert max(links.values()) == 1
        segments = table(crawl.root, "segments")
        assert {r["state"] for r in segments} == {"merged"}
        assert len({(r["segment_id"], r["bucket"]) for r in segments}) == len(segments)
        assert sum(r["stale"] or 0 for r in segments) == 0  # no result was merged after its URL moved on
        log = read_request_log(crawl.log_path)
        assert len(log) > len(reachable)
        assert politeness_violations(log, lambda host, farm=crawl.farm: farm.politeness_delay(host, DELAY_S)) == []
        port = f":{crawl.farm.port}/"  # the two farms serve the same pages on ports of their own
        summaries[crawl.root.name] = sorted((r["url"].replace(port, "/"), r["status"]) for r in urls)
        summaries[crawl.root.name + " applied"] = sum(r["applied"] or 0 for r in segments)
    assert summaries["killed"] == summaries["clean"]
    assert summaries["killed applied"] == summaries["clean applied"]


def test_the_driver_serves_its_steps_and_the_service_levels_from_the_tables(run_crawls):
    """`cycle.metrics_port`: the driver's /metrics, scraped after its first merge, times each batch step and shows
    the levels measured from the segment's `cycle_metrics` rows (generate's lease figures, update's discovery lags)."""
    clean, _ = run_crawls
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in clean.scrape.splitlines()
               if line and not line.startswith("#")}
    assert samples["crawl_segments_merged_total"] == 1.0
    for step in ("generate", "parse", "dedup", "update"):
        assert samples[f'crawl_step_last_duration_seconds{{step="{step}"}}'] > 0
    assert samples["crawl_discovery_pages"] >= 1  # the homes link to the pages of the second segment
    assert 0 <= samples["crawl_discovery_durable_p99_seconds"] < 3600
    assert samples["crawl_lease_eligible_high_priority_urls"] >= 0  # measured (NaN until a generate wrote it)
