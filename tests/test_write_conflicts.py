"""Through the real `crawl` dispatch on real Delta tables: a seed line out of range is one skipped line, not a failed
inject; two `crawl update` of one segment at once end with both done, or the loser's one line and exit 75, and
the tables as one update leaves them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from crawler import layout, urls
from crawler.errors import EXIT_TRY_LATER
from crawler.records import FETCHED
from delta_tables import tables
from jobs import cli, generate
from tests.support.fetchlists import result_row, write_parquet
from tests.support.tables import unchanged_tables

SEG = "seg-w1"
SEEDS = ["http://a.test/1", "http://a.test/2", "http://b.test/1", "http://c.test/1", "http://d.test/1"]


@pytest.fixture
def dispatch(spark, base_conf, tables_root, monkeypatch):
    """`cli.main` on `tables_root` with the test config and the test's session (as `crawl` would build them)."""
    conf = base_conf.with_overrides({"storage.root": tables_root})
    monkeypatch.setattr("jobs.cli.config_mod.from_arguments", lambda args: conf)
    monkeypatch.setattr("jobs.base.spark_session", lambda conf, app_name: spark)
    return conf


@pytest.mark.slow
def test_a_seed_line_out_of_range_is_skipped_and_the_rest_injected(spark, dispatch, tables_root, tmp_path, capsys):
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/1\tinterval=1e30\nhttp://a.test/2\tpriority=1e400\nhttp://a.test/3\t2\t3600\n")
    assert cli.main(["inject", "--root", tables_root, "--seeds", str(seeds)]) == 0
    out = capsys.readouterr().out
    assert f"inject: {seeds}:1: skipped: interval must be at most 3155760000 seconds (a century)" in out
    assert f"inject: {seeds}:2: skipped: priority must be a finite number >= 0" in out
    rows = tables.table_df(spark, tables_root, "urls").collect()
    assert [(r.url, r.fetch_interval_s) for r in rows] == [("http://a.test/3", 3600)]


@pytest.mark.slow
def test_two_updates_of_one_segment_at_once(spark, dispatch, tables_root, tmp_path, capsys):
    conf, root = dispatch, tables_root
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(f"{url}\n" for url in SEEDS))
    assert cli.main(["inject", "--root", root, "--seeds", str(seeds)]) == 0
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, conf, root, SEG, now).url_count == len(SEEDS)
    at = now + timedelta(seconds=10)
    results = [result_row(SEG, url, at, "success", 200, 1, conf.crawl.buckets) for url in SEEDS]
    for bucket in {row["bucket"] for row in results}:
        write_parquet(layout.fetched_dir(root, SEG, bucket), [r for r in results if r["bucket"] == bucket], FETCHED)
    capsys.readouterr()

    codes: list[int] = []
    start = threading.Barrier(2)

    def update() -> None:
        start.wait()
        codes.append(cli.main(["update", "--root", root, "--segment", SEG]))

    threads = [threading.Thread(target=update) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    err = capsys.readouterr().err
    assert sorted(codes) in ([0, 0], [0, EXIT_TRY_LATER]), (codes, err)
    assert "Traceback" not in err
    lost = [line for line in err.splitlines() if line.startswith("crawl update: ")]
    assert len(lost) == codes.count(EXIT_TRY_LATER), err
    assert all("this command's commit lost" in line and "run it again" in line for line in lost), lost

    # The tables are as one update leaves them: every URL completed once, each result recorded once, the segment
    # merged; an update run now changes nothing.
    rows = tables.table_df(spark, root, "urls").collect()
    assert sorted((r.url, r.status, r.lease_segment) for r in rows) == [(url, "fetched", None) for url in sorted(SEEDS)]
    fetches = tables.table_df(spark, root, "fetches").collect()
    assert sorted(r.url_id for r in fetches) == sorted(urls.url_id(url) for url in SEEDS)
    assert {r.state for r in tables.table_df(spark, root, "segments").collect()} == {"merged"}
    events = [(r.url, r.state_version) for r in tables.table_df(spark, root, "index_events").collect()]
    assert len(events) == len(set(events))
    with unchanged_tables(spark, root):
        assert cli.main(["update", "--root", root, "--segment", SEG]) == 0
