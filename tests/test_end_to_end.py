"""End to end on the embedded default, read from the shared crawl (`tests/support/crawl.py`): real farm on loopback,
real daemon, real Spark + Delta, four cycles.

Judged from the farm's own request log (politeness, robots) and by an independent WARC reader (fastwarc). The
`crawl demo` command gets its own small crawl: it is the README's main command, run as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from fastwarc.warc import ArchiveIterator

from crawler import dedup as rules
from crawler.urls import host_key
from delta_tables import TABLES, table_df
from jobs import events, update
from sitefarm.judge import politeness_violations, requested_url, robots_violations
from tests.support.crawl import BAD_SEED_LINES, CYCLES
from tests.support.tables import unchanged_tables

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def site_keys(farm) -> set[str]:
    """The ordinary sites (not the trap or large hosts, whose share of a crawl the trap rules set)."""
    return {f"http://{name}:{farm.port}" for name in farm.host_names() if name.startswith("site-")}


def test_bad_seed_lines_reported_rest_injected(shared_crawl):
    result = shared_crawl.inject
    assert result.injected == len(shared_crawl.farm.seed_urls())
    assert result.rejected == len(BAD_SEED_LINES) == 3
    assert len(result.errors) == 3


def test_every_reachable_allowed_page_fetched(spark, shared_crawl):
    """Every page of the ordinary sites within reach of the seeds is fetched: the trap and large hosts beside them
    do not starve them."""
    farm, conf, root = shared_crawl.farm, shared_crawl.conf, str(shared_crawl.root)
    sites = site_keys(farm)
    expected = {url for url in farm.expected_fetches(conf.crawl.robots_token, max_depth=CYCLES - 1)
                if host_key(url) in sites}
    assert len(expected) > 100
    requested = set(map(requested_url, shared_crawl.log))
    missing = expected - requested
    assert not missing, f"{len(missing)} reachable pages never requested, e.g. {sorted(missing)[:5]}"
    fetched = {r["url"] for r in table_df(spark, root, "fetches").where("status_code is not null").collect()}
    assert expected <= fetched


def test_no_disallowed_url_requested(shared_crawl):
    disallowed = shared_crawl.farm.disallowed_urls(shared_crawl.conf.crawl.robots_token)
    assert disallowed, "the farm must have robots-disallowed pages for this test to mean anything"
    assert robots_violations(shared_crawl.log, disallowed) == []


def test_zero_politeness_violations_from_farm_log(shared_crawl):
    """Over the whole crawl (every page, robots.txt, sitemap file and probe, trap and large host): one request at a
    time per host, and from the end of one to the start of the next at least the host's delay."""
    farm, conf, log = shared_crawl.farm, shared_crawl.conf, shared_crawl.log
    min_delay = conf.politeness.min_delay_s
    assert len(log) > 250
    assert politeness_violations(log, lambda host: farm.politeness_delay(host, min_delay)) == []
    assert all(r["user_agent"] == conf.crawl.user_agent for r in log)


def test_warc_records_match_fetches_rows(spark, shared_crawl):
    root = shared_crawl.root
    rows = table_df(spark, str(root), "fetches").where("warc_filename is not null").collect()
    assert rows
    for row in rows:
        with open(root / row["warc_filename"], "rb") as stream:
            stream.seek(row["warc_offset"])
            record = next(iter(ArchiveIterator(stream, parse_http=True)))
            assert record.headers["WARC-Target-URI"] == row["url"]
            if row["outcome"] == "not_modified":
                assert record.headers["WARC-Type"] == "revisit"
            else:
                assert record.headers["WARC-Type"] == "response"
                assert record.http_headers.status_code == row["status_code"]
            assert record.headers["WARC-Payload-Digest"] or row["status_code"] >= 300


def test_warc_files_are_closed_and_start_with_warcinfo(shared_crawl):
    root = shared_crawl.root
    assert not list(root.glob("segments/*/warc/*/*.open"))
    files = list(root.glob("segments/*/warc/*/*.warc.gz"))
    assert files
    for path in files:
        with open(path, "rb") as stream:
            first = next(iter(ArchiveIterator(stream)))
            assert first.headers["WARC-Type"] == "warcinfo"


def test_index_events_one_per_version(spark, shared_crawl):
    events = table_df(spark, str(shared_crawl.root), "index_events")
    assert events.count() > 0
    assert events.count() == events.select("url_id", "state_version").distinct().count()


def test_rerun_update_leaves_every_table_unchanged(spark, shared_crawl, tmp_path):
    root = shared_crawl.copy(CYCLES, "update", tmp_path / "root")
    with unchanged_tables(spark, root):
        update.run(spark, shared_crawl.conf, str(root), shared_crawl.segment(CYCLES))


def test_demo_command_end_to_end(run_crawls):
    """`crawl demo` on a tiny farm, its command line run in a process of its own like `make demo`, in the background
    (the clean crawl of `tests/support/run_crawls.py`, which `tests/test_run.py` also judges): exit 0, the report on
    stdout and the machine-readable last line."""
    demo_run = run_crawls[0].demo
    root, out = demo_run.root, demo_run.out
    assert demo_run.returncode == 0, out[-3000:] + demo_run.err[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("demo: fetched=")
    fields = dict(part.split("=") for part in last.split()[1:])
    assert set(fields) == {"fetched", "hosts", "warc_files", "delay", "violations"}
    assert int(fields["fetched"]) > 3 and int(fields["hosts"]) == 3 and fields["violations"] == "0"
    assert (root / "sitefarm" / "requests.jsonl").exists()
    assert "validate: passed" in out  # every table's expectations hold after a real crawl
    assert len(list((root / "validation").glob("*/data_docs/index.html"))) == 1
    reports = list((root / "reports").glob("*.html"))
    assert len(reports) >= 2 and all("<svg" in path.read_text() for path in reports)  # one per merged segment
    assert all("Hosts by state" in path.read_text() and "Frontier figures" in path.read_text() for path in reports)


def test_cycle_metrics_hold_one_row_per_step_run_agreeing_with_the_segments(spark, shared_crawl):
    """generate and update each write their frontier figures (jobs/cycle_metrics.py) once per segment, and those
    figures agree with what the `segments` table recorded of the same runs."""
    from pyspark.sql import functions as F

    root = str(shared_crawl.root)
    figures = {(r.segment_id, r.step): r for r in table_df(spark, root, "cycle_metrics").collect()}
    segments = {r.segment_id: r for r in table_df(spark, root, "segments").groupBy("segment_id").agg(
        F.sum("url_count").alias("urls"), F.sum("results").alias("results"), F.sum("applied").alias("applied"),
        F.sum("stale").alias("stale")).collect()}
    assert set(figures) == {(segment, step) for segment in segments for step in ("generate", "update")}
    for segment, seg in segments.items():
        chosen, merged = figures[(segment, "generate")], figures[(segment, "update")]
        assert chosen.leased_urls == seg.urls <= chosen.due_urls
        assert 0 <= chosen.high_priority_not_leased <= chosen.due_high_priority <= chosen.due_urls
        assert chosen.oldest_due_age_s >= 0 and chosen.unmerged_segments == 0 and merged.unmerged_segments is None
        assert (merged.results, merged.applied, merged.stale) == (seg.results, seg.applied, seg.stale)
        assert merged.changed <= merged.refetched and merged.run_at > chosen.run_at
    assert figures[(shared_crawl.segment(1), "update")].new_urls > 0
    for segment in segments:
        chosen = figures[(segment, "generate")]
        hot = [(d.domain, d.due, d.leased) for d in chosen.hot_domains]
        assert 0 < len(hot) <= shared_crawl.conf.generate.hot_domains
        assert [due for _, due, _ in hot] == sorted((due for _, due, _ in hot), reverse=True)
        assert all(0 <= leased <= due for _, due, leased in hot) and sum(due for _, due, _ in hot) <= chosen.due_urls


def test_every_host_row_carries_its_registered_domain(spark, shared_crawl):
    """Inject (seed hosts) and update (hosts of fetches and of discovered URLs) store `hosts.domain` on the rows they
    create: what per-domain budgets and the hot-domain figures group by."""
    from crawler.urls import host_domain

    rows = table_df(spark, str(shared_crawl.root), "hosts").select("host_key", "domain").collect()
    assert {r.host_key: r.domain for r in rows} == {r.host_key: host_domain(r.host_key) for r in rows}


def test_stats_counts_every_table_by_status(spark, shared_crawl):
    from jobs.stats import render_stats, table_counts

    root = str(shared_crawl.root)
    counts = table_counts(spark, shared_crawl.conf, root)
    assert set(counts) == set(TABLES)
    total, by_status = counts["urls"]
    assert total == table_df(spark, root, "urls").count()
    assert dict(by_status)["fetched"] > 0
    _, host_states = counts["hosts"]
    assert {state for state, _ in host_states} <= {"ok", "backing_off", "robots_unreachable", "dead"}
    assert sum(n for _, n in host_states) == table_df(spark, root, "hosts").count()
    text = render_stats(spark, shared_crawl.conf, root)
    for name in TABLES:
        assert name in text


def test_index_events_are_read_incrementally_from_the_change_feed(spark, shared_crawl):
    """The outbox contract of docs/outputs.md: inserts only; a consumer that stores the version it reached and
    asks again gets every (url_id, state_version) exactly once; each event's WARC record is where it says."""
    root = str(shared_crawl.root)
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


def test_incremental_dedup_finds_no_duplicate_among_distinct_pages(spark, shared_crawl):
    """The farm's pages are all distinct: every cycle's incremental dedup (which probed only the indexes with its
    segment) marked none of them, as the full recompute over each cycle's corpus says (no false positive among
    hundreds of real pages), and the hash index holds exactly the current documents. The agreement on a corpus
    with duplicates is tests/test_dedup_job.py's."""
    pages = table_df(spark, str(shared_crawl.root), "pages").toPandas()
    latest = pages.sort_values("state_version").groupby("url_id").tail(1)
    current = latest[latest["content_hash"].notna() & latest["sitemap_urls"].isna()]
    assert len(current) > 200
    assert set(rules.exact_representative(
        {"url_id": u, "fetched_at": t, "content_hash": h}
        for u, t, h in zip(current["url_id"], current["fetched_at"], current["content_hash"], strict=True)
    ).values()) == set(current["url_id"])
    texts = current[current["simhash"].notna() & (current["simhash"] != 0)]
    near = rules.near_duplicate_clusters(texts["url_id"].to_numpy(), texts["fetched_at"].to_numpy(),
                                         texts["simhash"].to_numpy(dtype="int64"))
    assert near.clusters() == 0
    assert pages["duplicate_of"].isna().all() and pages["near_duplicate_cluster"].isna().all()
    hashes = table_df(spark, str(shared_crawl.root), "dedup_hashes").toPandas()
    assert sorted(hashes["url_id"]) == sorted(current["url_id"])


def test_an_independent_reader_opens_every_table_and_deletion_vectors_come_only_when_asked(spark, shared_crawl,
                                                                                             tmp_path):
    """`tables.deletion_vectors` (off by default): the shared crawl's tables carry no deletionVectors reader feature
    and its MERGEs wrote no vectors, so delta-rs reads every table, row for row as Spark counts. Tables created with
    it on carry the feature (but the insert-only outbox tables never do), and a DELETE or an UPDATE into them writes
    vectors that Spark applies."""
    from delta.tables import DeltaTable
    from deltalake import DeltaTable as RustTable

    from delta_tables import create_all, table_path
    from jobs.base import session_settings

    crawled = str(shared_crawl.root)
    assert not any("deletionVectors" in (RustTable(table_path(crawled, name)).protocol().reader_features or [])
                   for name in TABLES)
    assert not list(Path(crawled).rglob("deletion_vector_*.bin"))
    counts = {name: table_df(spark, crawled, name).count() for name in TABLES}
    assert counts["urls"] and counts["pages"] and counts["links"]
    # One thread, as jobs/cycle_metrics.read_figures: a threaded scan can abort the interpreter at exit.
    read = {name: RustTable(table_path(crawled, name)).to_pyarrow_dataset().to_table(use_threads=False).num_rows
            for name in TABLES}
    assert read == counts

    root = str(tmp_path / "root")
    with session_settings(spark, {"spark.databricks.delta.properties.defaults.enableDeletionVectors": "true"}):
        create_all(spark, root)

    def reader_features(name: str) -> list[str]:
        return RustTable(table_path(root, name)).protocol().reader_features or []

    assert "deletionVectors" in reader_features("urls")
    # The tables only appended to (the outbox among them) never take the feature: delta-rs reads index_events'
    # Change Data Feed on this root.
    assert not any("deletionVectors" in reader_features(name)
                   for name in ("index_events", "fetches", "links", "records", "cycle_metrics"))
    table_df(spark, crawled, "index_events").write.format("delta").mode("append").save(
        table_path(root, "index_events"))
    changes = pa.RecordBatchReader.from_stream(RustTable(table_path(root, "index_events")).load_cdf()).read_all()
    assert changes.num_rows == counts["index_events"] > 0
    assert set(changes.column("_change_type").to_pylist()) == {"insert"}
    assert sorted(changes.column("url_id").to_pylist()) == sorted(
        r["url_id"] for r in table_df(spark, crawled, "index_events").select("url_id").collect())
    for name in ("urls", "hosts"):
        table_df(spark, crawled, name).write.format("delta").mode("append").save(table_path(root, name))
    kept = table_df(spark, crawled, "urls").where("status != 'unfetched'").count()
    assert 0 < kept < counts["urls"]
    DeltaTable.forPath(spark, table_path(root, "urls")).delete("status = 'unfetched'")
    DeltaTable.forPath(spark, table_path(root, "hosts")).update("bucket = 0", {"robots_body": "NULL"})
    assert list(Path(root).rglob("deletion_vector_*.bin"))
    assert table_df(spark, root, "urls").count() == kept
    assert table_df(spark, root, "hosts").count() == counts["hosts"]


def test_the_cycle_indexes_its_segment_when_index_is_enabled(spark, shared_crawl):
    """index.enabled (on in the shared crawl's last cycle only): `crawl cycle` runs `crawl index` after update, so
    the segment's closed WARC files are in `records` and each has its CDXJ file; earlier cycles indexed nothing."""
    from crawler import layout
    from jobs.index import closed_warc_files

    root = str(shared_crawl.root)
    assert ["index" in report.steps for report in shared_crawl.reports] == [False] * (CYCLES - 1) + [True]
    last = shared_crawl.reports[-1].segment_id
    indexed = {r["warc_segment"]: r["n"] for r in table_df(spark, root, "records").groupBy("warc_segment").agg(
        {"*": "count"}).withColumnRenamed("count(1)", "n").collect()}
    assert set(indexed) == {last} and indexed[last] > 0
    files = closed_warc_files(root, last)
    assert files and all(Path(layout.join(root, layout.cdxj_filename(name))).stat().st_size > 0 for name in files)


def test_each_url_keeps_the_stored_payload_of_its_last_complete_response(spark, shared_crawl):
    """update keeps, per URL, the digest, target URI, WARC-Date and file of its last complete response record
    (crawler.payloads.stored_after), read back against the `fetches` rows and the records themselves."""
    root = str(shared_crawl.root)
    urls = {r["url_id"]: r for r in table_df(spark, root, "urls").where("last_segment is not null").collect()}
    latest = {r["url_id"]: r for r in table_df(spark, root, "fetches").collect()
              if r["url_id"] in urls and r["segment_id"] == urls[r["url_id"]]["last_segment"]}
    stored = [row for row in latest.values() if row["outcome"] == "success" and not row["truncated"]]
    assert len(stored) > 100
    for fetch in stored:
        row = urls[fetch["url_id"]]
        assert (row["stored_payload_digest"], row["stored_target_uri"], row["stored_warc_date"],
                row["stored_warc_filename"]) == (fetch["payload_digest"], fetch["redirect_to"] or fetch["url"],
                                                 fetch["fetched_at"], fetch["warc_filename"])
    for url_id in set(urls) - {fetch["url_id"] for fetch in stored}:  # no complete response: nothing to refer to
        if latest.get(url_id) is not None and latest[url_id]["outcome"] != "success":
            assert urls[url_id]["stored_payload_digest"] is None or urls[url_id]["status"] != "fetched"
    some = stored[0]
    with open(Path(root) / some["warc_filename"], "rb") as fh:
        fh.seek(some["warc_offset"])
        record = next(iter(ArchiveIterator(fh)))
        assert record.headers["WARC-Payload-Digest"] == some["payload_digest"]
        assert record.headers["WARC-Target-URI"] == urls[some["url_id"]]["stored_target_uri"]


def test_generate_hands_out_a_stored_payload_only_while_its_segment_is_there(spark, shared_crawl, tmp_path):
    """A generate long after the crawl (every URL due) on a copy of its root whose first segment was removed: the
    fetch list names the stored payload of every URL whose record is in a segment still there, and none of those
    whose record went with the first segment (crawler.payloads.reference_in_force); they are stored in full."""
    import shutil
    from datetime import UTC, datetime, timedelta

    import pyarrow.parquet as pq

    from crawler import layout
    from jobs import generate

    root = shared_crawl.copy(CYCLES, "update", tmp_path / "root")
    gone = shared_crawl.segment(1)
    shutil.rmtree(layout.segment_dir(str(root), gone))
    urls = {r["url_id"]: r for r in table_df(spark, str(root), "urls").where("stored_payload_digest is not null")
            .collect()}
    conf = shared_crawl.conf.with_overrides({"generate.segment_max_urls": 100_000,
                                             "generate.per_host_max_urls": 100_000})
    result = generate.run(spark, conf, str(root), segment_id="seg-late",
                          now=datetime.now(UTC) + timedelta(days=400))
    listed = pq.read_table(layout.fetchlist_dir(str(root), result.segment_id)).to_pylist()
    handed = [row for row in listed if row["url_id"] in urls]
    in_gone = [row for row in handed if urls[row["url_id"]]["stored_warc_filename"].startswith(f"segments/{gone}/")]
    kept = [row for row in handed if row not in in_gone]
    assert in_gone and kept
    assert all(row["stored_payload_digest"] is None and row["stored_target_uri"] is None
               and row["stored_warc_date"] is None for row in in_gone)
    for row in kept:
        url = urls[row["url_id"]]
        assert (row["stored_payload_digest"], row["stored_target_uri"], row["stored_warc_date"]) == (
            url["stored_payload_digest"], url["stored_target_uri"], url["stored_warc_date"])
    assert all(row["stored_payload_digest"] is None for row in listed if row["url_id"] not in urls)
