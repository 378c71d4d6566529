"""The freshness benchmark's judges on small hand-made inputs: the Delta log and its files, the farm log's fetch
times, due episodes, leases and the printed line. No crawling, no Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.freshness import (
    DueEpisode,
    HostStates,
    LeaseFigures,
    added_rows,
    batch_fixed_s,
    delta_commits,
    discovered_durable_lags,
    due_episodes,
    fetch_time,
    fixed_cost_cycles,
    lease_figures,
    lease_times,
    link_commit_times,
    pending_lags,
    progress_steps,
    render_line,
    request_ends,
)
from crawler.politeness import PolitenessRules

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def write_commit(table: Path, version: int, committed_at: float, files: dict[str, dict]) -> None:
    """A Delta commit adding one Parquet file per entry (path -> {"rows": ..., "partition": ...})."""
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    actions = [{"commitInfo": {"timestamp": int(committed_at * 1000), "operation": "WRITE"}}]
    for path, spec in files.items():
        (table / path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(spec["rows"]), table / path)
        quoted = path.replace(":", "%3A")
        actions.append({"add": {"path": quoted, "partitionValues": spec.get("partition", {}), "size": 1}})
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_the_delta_log_gives_each_added_row_its_commit_and_partition(tmp_path: Path) -> None:
    links = tmp_path / "links"
    write_commit(links, 0, T0.timestamp() + 5, {
        "segment_id=seg:a/p0.parquet": {"rows": [{"from_url_id": "u1", "to_url": "x"}, {"from_url_id": "u2",
                                                                                       "to_url": "y"}],
                                        "partition": {"segment_id": "seg:a"}}})
    write_commit(links, 1, T0.timestamp() + 9, {
        "segment_id=seg:a/p1.parquet": {"rows": [{"from_url_id": "u1", "to_url": "z"}],
                                        "partition": {"segment_id": "seg:a"}},
        "segment_id=seg:b/p2.parquet": {"rows": [{"from_url_id": "u3", "to_url": "w"}],
                                        "partition": {"segment_id": "seg:b"}}})
    commits = delta_commits(links)
    assert [(c.version, c.committed_at) for c in commits] == [(0, T0.timestamp() + 5), (1, T0.timestamp() + 9)]
    rows = added_rows(links, commits, ["segment_id", "from_url_id"])
    assert sorted((r["segment_id"], r["from_url_id"], r["version"]) for r in rows) == [
        ("seg:a", "u1", 0), ("seg:a", "u1", 1), ("seg:a", "u2", 0), ("seg:b", "u3", 1)]
    # a page's links are durable at the first commit that holds any of them
    assert link_commit_times(rows) == {("seg:a", "u1"): T0.timestamp() + 5, ("seg:a", "u2"): T0.timestamp() + 5,
                                       ("seg:b", "u3"): T0.timestamp() + 9}
    only_u3 = added_rows(links, commits, ["from_url_id"], where=lambda t: pa.compute.equal(t["from_url_id"], "u3"))
    assert [r["from_url_id"] for r in only_u3] == ["u3"]


def test_a_page_is_timed_by_its_last_answered_request_in_the_farm_log() -> None:
    log = [
        {"host": "a:1", "path": "/", "start": 100.0, "end": 100.2, "status": 200},
        {"host": "a:1", "path": "/", "start": 160.0, "end": 160.3, "status": 200},
        {"host": "a:1", "path": "/gone", "start": 50.0, "end": 50.1, "status": None, "dropped": True},
    ]
    requests = request_ends(log, lambda r: f"http://{r['host']}{r['path']}")
    assert requests == {"http://a:1/": [(100.0, 100.2), (160.0, 160.3)]}  # a dropped request answered nothing
    assert fetch_time(requests["http://a:1/"], 100.25) == 100.2
    assert fetch_time(requests["http://a:1/"], 159.5) == 160.3  # the daemon's clock may read a little early
    assert fetch_time(requests["http://a:1/"], 500.0) == 160.3
    assert fetch_time(requests["http://a:1/"], 90.0) is None
    lags = discovered_durable_lags(
        {("s1", "u1"): 130.0, ("s2", "u1"): 170.0, ("s2", "u9"): 999.0, ("s3", "u2"): 200.0},
        {("s1", "u1"): ("http://a:1/", 100.3), ("s2", "u1"): ("http://a:1/", 160.4),
         ("s3", "u2"): ("http://b:1/", 150.0)},
        requests)
    # u9 has no fetched result, u2 no request in the farm's log: neither is judged
    assert lags == pytest.approx([29.8, 9.7])


def state(url_id: str, version: int, committed: float, next_fetch: float, discovered: float,
          priority: float = 1.2, host: str = "http://h:1") -> dict:
    return {"url_id": url_id, "url": f"{host}/{url_id}", "host_key": host, "priority": priority,
            "next_fetch_at": at(next_fetch).replace(tzinfo=None), "discovered_at": at(discovered).replace(tzinfo=None),
            "version": version, "committed_at": at(committed).timestamp()}


def test_due_episodes_follow_every_state_a_url_had() -> None:
    states = [
        # discovered by a fetch at 10 (next fetch = the parent's fetch time), merged at 40; leased at 50 (same due,
        # a copy); fetched and given a next fetch at 400, merged at 120: a second episode
        state("new", 3, 40, 10, 10), state("new", 5, 50, 10, 10), state("new", 7, 120, 400, 10),
        # its next fetch at 300 was replaced at 200 (before it fell due) by one at 900: only 900 falls due
        state("moved", 1, 100, 300, -1000), state("moved", 4, 200, 900, -1000),
        state("low", 1, 40, 60, 10, priority=0.5),         # not high priority
        state("before", 1, 5, -50, -3600),                 # fell due before the run
        state("after", 1, 5, 5000, -3600),                 # falls due after it
    ]
    episodes = due_episodes(reversed(states), 1.0, at(0), at(1000))
    assert sorted((e.url_id, e.due) for e in episodes) == [("moved", at(900)), ("new", at(10)), ("new", at(400))]
    # a URL discovered with a next fetch time in the past fell due when it became known (service_levels.due_since)
    assert [e.due for e in due_episodes([state("late", 1, 40, 5, 20)], 1.0, at(0), at(100))] == [at(20)]


def test_lease_figures_take_the_first_lease_at_or_after_the_due_time() -> None:
    created = {"s1": at(30), "s2": at(400), "s3": at(1300)}
    leases = lease_times([("s2", "a"), ("s1", "a"), ("s3", "b"), ("s1", "c"), ("s9", "d")], created)
    assert leases == {"a": [at(30), at(400)], "b": [at(1300)], "c": [at(30)]}
    episodes = [
        DueEpisode("a", "u", "http://h:1", at(30)),     # leased at its due time: 0 s
        DueEpisode("a", "u", "http://h:1", at(100)),    # leased by s2, 300 s later: within
        DueEpisode("b", "u", "http://h:1", at(100)),    # leased 1200 s later: late
        DueEpisode("c", "u", "http://h:1", at(200)),    # never leased after due, waited past 600 s: late
        DueEpisode("d", "u", "http://h:1", at(1500)),   # waiting 100 s at the end: undecided
        DueEpisode("a", "u", "http://sick:1", at(10)),  # its host was backing off: not counted
    ]
    figures = lease_figures(episodes, leases, at(1600), 600.0, lambda host, _: host != "http://sick:1")
    assert (figures.within, figures.late, figures.waiting, figures.ineligible) == (2, 2, 1, 1)
    assert figures.lags_s == [0.0, 300.0, 1200.0]
    assert figures.share == 0.5


def test_host_states_as_of_a_moment() -> None:
    rules = PolitenessRules(min_delay_s=1.0, max_crawl_delay_s=60.0, max_concurrency_per_host=1, backoff_base_s=30.0,
                            max_backoff_s=900.0, max_consecutive_failures=5, backoff_recovery_factor=0.5,
                            response_time_factor=0.0, max_response_time_delay_s=60.0, dead_after_days=7.0)
    row = {"host_key": "http://h:1", "robots_state": None, "failing_since": None}
    hosts = HostStates([{**row, "backoff_until": None, "version": 1, "committed_at": at(0).timestamp()},
                        {**row, "backoff_until": at(200).replace(tzinfo=None), "version": 2,
                         "committed_at": at(100).timestamp()}], rules)
    assert hosts.ok("http://h:1", at(50))
    assert not hosts.ok("http://h:1", at(150))   # backing off until 200
    assert hosts.ok("http://h:1", at(250))
    assert hosts.ok("http://new:1", at(150))     # not in `hosts` yet


def test_batch_fixed_cost_is_the_median_over_the_smallest_segments() -> None:
    lines = ["run: generate seg-1 4.0s: 10 URLs", "run: parse seg-1 3.0s: x", "run: dedup seg-1 2.0s: x",
             "run: update seg-1 6.0s: x", "run: fetch seg-1 30.0s: x", "run: generate seg-2 5.0s: x",
             "run: parse seg-2 4.5s: x", "noise", "run: generate - 1.0s: nothing due"]
    steps = progress_steps(lines)
    assert steps["seg-1"] == {"generate": 4.0, "parse": 3.0, "dedup": 2.0, "update": 6.0}  # fetch is no batch step
    assert fixed_cost_cycles(steps, {"seg-1": 10, "seg-2": 5}) == [(10, 15.0)]  # seg-2 has not been merged
    cycles = [(20, 14.0), (900, 80.0), (25, 18.0), (400, 50.0), (30, 30.0), (600, 60.0), (35, 40.0), (500, 55.0)]
    assert batch_fixed_s(cycles) == 16.0  # the quarter with the fewest URLs: 20 and 25
    assert batch_fixed_s([(5, 9.0)]) == 9.0 and batch_fixed_s([]) is None


def test_the_line_has_every_figure_in_order() -> None:
    leases = LeaseFigures(within=99, late=1, lags_s=[10.0, 20.0, 700.0])
    line = render_line(15.02, 31, [1.0, 2.0, 3.0, 50.0], leases, 21.44, 0)
    assert line == ("freshness: minutes=15.0 cycles=31 discovered_durable_p50_s=2.0 discovered_durable_p99_s=50.0 "
                    "leased_10min=0.990 due_to_leased_p99_s=700.0 batch_fixed_s=21.4 violations=0")
    assert "discovered_durable_p99_s=- leased_10min=-" in render_line(1, 0, [], LeaseFigures(), None, 0)


def test_pages_not_durable_at_the_end_count_with_a_lower_bound() -> None:
    requests = {"http://a:1/": [(100.0, 100.2)], "http://a:1/leaf": [(101.0, 101.1)], "http://a:1/x": [(102.0, 102.5)]}
    fetched = {("parsed", "u1"): ("http://a:1/", 100.3), ("open", "u2"): ("http://a:1/leaf", 101.2),
               ("open", "u3"): ("http://a:1/x", 102.6), ("open", "u4"): ("http://b:1/", 103.0)}
    lags = pending_lags({("parsed", "u1"): 130.0}, fetched, requests, lambda url: not url.endswith("/leaf"), 200.0)
    # u1's segment has links committed; u2 has no outlinks; u4 is not in the farm's log
    assert lags == [97.5]
