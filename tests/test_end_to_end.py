"""End to end on the embedded default: real farm on loopback, real daemon, real Spark + Delta.

Judged from the farm's own request log (politeness, robots) and by an independent WARC reader (fastwarc).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator

from delta_tables import TABLES, table_df
from fetchd.sitefarm import FarmSpec, SiteFarm, politeness_violations, read_request_log, requested_url
from jobs import cycle, demo, events, inject, update

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CYCLES = 3


def table_snapshot(spark, root: str) -> dict[str, list[tuple]]:
    """Every table's full contents, sorted, for before/after comparisons."""
    snapshot = {}
    for name in TABLES:
        rows = table_df(spark, root, name).collect()
        snapshot[name] = sorted(tuple(str(v) for v in row) for row in rows)
    return snapshot


@pytest.fixture(scope="module")
def crawled(spark, base_conf, tmp_path_factory):
    """A 3-cycle crawl of a small farm; yields what the tests inspect."""
    root = str(tmp_path_factory.mktemp("e2e") / "root")
    Path(root).mkdir()
    log_path = Path(root) / "sitefarm" / "requests.jsonl"
    farm = SiteFarm(FarmSpec(hosts=6, pages_per_host=20), log_path=log_path)
    farm.start()
    try:
        conf = demo.demo_config(base_conf.with_overrides({"demo.min_delay_s": 0.2}), root, farm)
        seeds = Path(root) / "seeds.txt"
        lines = [*farm.seed_urls(), "this is not a url", "ftp://site-000.farm.test/file", "http://"]
        seeds.write_text("\n".join(lines) + "\n")
        reports = []
        inject_result = inject.run(spark, conf, root, str(seeds))
        for _ in range(CYCLES):
            reports.append(cycle.run_cycle(spark, conf, root))
    finally:
        farm.stop()
    yield {
        "root": root,
        "conf": conf,
        "farm": farm,
        "log": read_request_log(log_path),
        "reports": reports,
        "inject": inject_result,
    }


def test_bad_seed_lines_reported_rest_injected(crawled):
    result = crawled["inject"]
    assert result.injected == len(crawled["farm"].seed_urls())
    assert result.rejected == 3
    assert len(result.errors) == 3


def test_every_reachable_allowed_page_fetched(spark, crawled):
    farm, conf, root = crawled["farm"], crawled["conf"], crawled["root"]
    expected = farm.expected_fetches(conf["crawl.robots_token"], max_depth=CYCLES - 1)
    assert len(expected) > 50
    requested = set(map(requested_url, crawled["log"]))
    missing = expected - requested
    assert not missing, f"{len(missing)} reachable pages never requested, e.g. {sorted(missing)[:5]}"
    fetched = {r["url"] for r in table_df(spark, root, "fetches").where("status_code is not null").collect()}
    assert expected <= fetched


def test_no_disallowed_url_requested(crawled):
    disallowed = crawled["farm"].disallowed_urls(crawled["conf"]["crawl.robots_token"])
    assert disallowed, "the farm must have robots-disallowed pages for this test to mean anything"
    assert demo.robots_violations(crawled["log"], disallowed) == []


def test_zero_politeness_violations_from_farm_log(crawled):
    farm, conf = crawled["farm"], crawled["conf"]
    min_delay = conf["politeness.min_delay_s"]

    def delay_for(host: str) -> float:
        return max(min_delay, farm.crawl_delay(host.split(":")[0]) or 0.0)

    log = crawled["log"]
    assert len(log) > 50
    assert politeness_violations(log, delay_for) == []
    assert all(r["user_agent"] == conf["crawl.user_agent"] for r in log)


def test_warc_records_match_fetches_rows(spark, crawled):
    root = crawled["root"]
    rows = table_df(spark, root, "fetches").where("warc_filename is not null").collect()
    assert rows
    for row in rows:
        with open(Path(root) / row["warc_filename"], "rb") as stream:
            stream.seek(row["warc_offset"])
            record = next(iter(ArchiveIterator(stream, parse_http=True)))
            assert record.headers["WARC-Target-URI"] == row["url"]
            if row["outcome"] == "not_modified":
                assert record.headers["WARC-Type"] == "revisit"
            else:
                assert record.headers["WARC-Type"] == "response"
                assert record.http_headers.status_code == row["status_code"]
            assert record.headers["WARC-Payload-Digest"] or row["status_code"] >= 300


def test_warc_files_are_closed_and_start_with_warcinfo(crawled):
    root = Path(crawled["root"])
    assert not list(root.glob("segments/*/warc/*/*.open"))
    files = list(root.glob("segments/*/warc/*/*.warc.gz"))
    assert files
    for path in files:
        with open(path, "rb") as stream:
            first = next(iter(ArchiveIterator(stream)))
            assert first.headers["WARC-Type"] == "warcinfo"


def test_index_events_one_per_version(spark, crawled):
    events = table_df(spark, crawled["root"], "index_events")
    assert events.count() > 0
    assert events.count() == events.select("url_id", "state_version").distinct().count()


def test_rerun_update_leaves_every_table_unchanged(spark, crawled):
    root, conf = crawled["root"], crawled["conf"]
    last_segment = [r.segment_id for r in crawled["reports"] if r.segment_id][-1]
    before = table_snapshot(spark, root)
    update.run(spark, conf, root, last_segment)
    after = table_snapshot(spark, root)
    for name in TABLES:
        assert before[name] == after[name], f"table {name} changed on re-running update"


def test_demo_command_end_to_end(tmp_path):
    """`crawl demo` on a tiny farm: exit 0 and the machine-readable last line."""
    root = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "demo", "--root", str(root), "--cycles", "2",
         "--set", "demo.hosts=3", "--set", "demo.pages_per_host=8", "--set", "spark.master=local[2]",
         "--set", "spark.shuffle_partitions=2", "--set", "demo.min_delay_s=0.1"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("demo: fetched=")
    fields = dict(part.split("=") for part in last.split()[1:])
    assert set(fields) == {"fetched", "hosts", "warc_files", "delay", "violations"}
    assert int(fields["fetched"]) > 3 and int(fields["hosts"]) == 3 and fields["violations"] == "0"
    assert (root / "sitefarm" / "requests.jsonl").exists()
    assert "validate: passed" in result.stdout  # every table's expectations hold after a real crawl
    assert len(list((root / "validation").glob("*/data_docs/index.html"))) == 1
    reports = list((root / "reports").glob("*.html"))
    assert len(reports) == 2 and all("<svg" in path.read_text() for path in reports)


def test_stats_counts_every_table_by_status(spark, crawled):
    from jobs.stats import render_stats, table_counts

    counts = table_counts(spark, crawled["root"])
    assert set(counts) == set(TABLES)
    total, by_status = counts["urls"]
    assert total == table_df(spark, crawled["root"], "urls").count()
    assert dict(by_status)["fetched"] > 0
    text = render_stats(spark, crawled["root"])
    for name in TABLES:
        assert name in text


def test_index_events_are_read_incrementally_from_the_change_feed(spark, crawled):
    """The outbox contract of docs/outputs.md: inserts only; a consumer that stores the version it reached and
    asks again gets every (url_id, state_version) exactly once; each event's WARC record is where it says."""
    root = crawled["root"]
    path = str(Path(root) / "tables" / "index_events")
    change_types = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(path)
    assert {r[0] for r in change_types.select("_change_type").distinct().collect()} == {"insert"}

    everything, latest = events.index_events_since(spark, root, None)
    rows = everything.collect()
    keys = [(r["url_id"], r["state_version"]) for r in rows]
    assert len(keys) == len(set(keys)) == table_df(spark, root, "index_events").count() > 0
    versions = sorted({r["_commit_version"] for r in rows})
    assert len(versions) >= 2  # events of more than one cycle's update

    first, reached = events.index_events_since(spark, root, None, up_to_version=versions[0])
    second, reached_again = events.index_events_since(spark, root, reached)
    first_keys = {(r["url_id"], r["state_version"]) for r in first.collect()}
    second_keys = {(r["url_id"], r["state_version"]) for r in second.collect()}
    assert first_keys and second_keys and not first_keys & second_keys
    assert first_keys | second_keys == set(keys) and reached_again == latest
    nothing, still = events.index_events_since(spark, root, latest)
    assert nothing.count() == 0 and still == latest

    for row in [r for r in rows if r["warc_filename"]][:20]:
        with open(Path(root) / row["warc_filename"], "rb") as stream:
            stream.seek(row["warc_offset"])
            record = next(iter(ArchiveIterator(stream, parse_http=True)))
            assert record.headers["WARC-Target-URI"] == row["url"]
