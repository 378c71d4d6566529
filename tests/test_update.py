"""update on real Delta tables: completion conditional on (url_id, state_version) and the lease, stale results
counted not applied, deferred back to due without a failure, discoveries inserted once, one index event per
version, host counters and robots folded once, and a re-run that leaves every table unchanged."""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from delta.tables import DeltaTable
from pyspark.sql.types import StructType

from crawler import layout, urls
from crawler.records import FETCHED, ROBOTS
from crawler.service_levels import ServiceLevels
from delta_tables import tables
from jobs import cycle_metrics, generate, inject, update
from tests.support.fetchlists import result_row, write_parquet
from tests.support.tables import append_rows, table_versions, unchanged_tables


@pytest.fixture
def root(tables_root) -> str:
    """Every test here starts with the tables created (`tests/conftest.py::tables_root`)."""
    return tables_root


BUCKETS = 4
SEG = "seg-u1"
SEEDS = "\n".join([
    "http://a.test/1\tpriority=2",
    "http://a.test/2",
    "http://a.test/3",
    "http://a.test/4",
    "http://a.test/5",
    "http://b.test/1",
])


def uid(url: str) -> str:
    return urls.url_id(url)


def bucket(url: str) -> int:
    return urls.bucket_of(urls.host_key(url), BUCKETS)


def fetched(url: str, at: datetime, outcome: str, code: int | None, version: int = 1, **extra) -> dict:
    return result_row(SEG, url, at, outcome, code, version, BUCKETS, **extra)


@pytest.mark.slow
def test_update_completes_discovers_and_reruns_idempotently(spark, base_conf, root, tmp_path):
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(SEEDS)
    inject.run(spark, base_conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, base_conf, root, SEG, now).url_count == 6
    at = now + timedelta(seconds=10)

    results = [
        fetched("http://a.test/1", at, "success", 200, etag='"e1"'),
        fetched("http://a.test/2", at + timedelta(seconds=1), "success", 200),
        fetched("http://a.test/3", at + timedelta(seconds=2), "deferred", None),
        fetched("http://a.test/4", at + timedelta(seconds=3), "redirect", 301, redirect_to="http://c.test/landing"),
        fetched("http://a.test/5", at + timedelta(seconds=4), "http_error", 404),
        fetched("http://b.test/1", at + timedelta(seconds=5), "http_error", 503, version=0, retry_after_s=120.0),
    ]
    for b in {bucket(r["url"]) for r in results}:
        write_parquet(layout.fetched_dir(root, SEG, b), [r for r in results if r["bucket"] == b], FETCHED)
        with open(layout.done_manifest(root, SEG, b), "w") as handle:
            handle.write("{}")
    write_parquet(layout.robots_dir(root, SEG, bucket("http://a.test/")), [{
        "segment_id": SEG, "bucket": bucket("http://a.test/"), "host_key": "http://a.test", "fetched_at": now,
        "status_code": 200, "state": "rules", "body": "User-agent: *\nDisallow: /private\n", "crawl_delay_s": 2.0,
        "expires_at": now + timedelta(days=1)}], ROBOTS)
    append_rows(spark, root, "pages", [
        {"url_id": uid("http://a.test/1"), "state_version": 1, "url": "http://a.test/1", "segment_id": SEG,
         "fetched_at": at, "content_hash": "h1", "simhash": 11},
        {"url_id": uid("http://a.test/2"), "state_version": 1, "url": "http://a.test/2", "segment_id": SEG,
         "fetched_at": at, "content_hash": "h2", "simhash": 22},
    ])
    link_targets = [
        ("http://a.test/1", "http://a.test/new", False),
        ("http://a.test/1", "http://b.test/1", False),
        ("http://a.test/1", "http://a.test/nofollow", True),
        ("http://a.test/2", "http://a.test/new", False),
        ("http://a.test/2", "http://a.test/1", False),
    ]
    append_rows(spark, root, "links", [
        {"segment_id": SEG, "from_url_id": uid(src), "from_state_version": 1, "to_url_id": uid(dst), "to_url": dst,
         "rel_nofollow": nofollow} for src, dst, nofollow in link_targets])

    versions = table_versions(root)
    result = update.run(spark, base_conf, root, SEG)
    assert (result.results, result.applied, result.stale, result.discovered, result.index_events) == (6, 5, 1, 2, 3)
    # One commit each to fetches, index_events, urls (completion and discoveries), hosts (counters, tallies and new
    # hosts), segments and cycle_metrics; nothing else written.
    commits = {name: version - versions[name] for name, version in table_versions(root).items()}
    assert commits == {name: int(name in {"fetches", "index_events", "urls", "hosts", "segments", "cycle_metrics"})
                       for name in commits}
    assert result.hosts_updated == 3  # a and b (results), c (host of a new URL)

    rows = {r["url"]: r for r in tables.table_df(spark, root, "urls").collect()}
    assert len(rows) == 8 and "http://a.test/nofollow" not in rows
    a1, a3, a4, a5, b1 = (rows[u] for u in ("http://a.test/1", "http://a.test/3", "http://a.test/4",
                                            "http://a.test/5", "http://b.test/1"))
    default = base_conf.revisit.default_interval_s
    assert (a1.status, a1.content_hash, a1.simhash, a1.etag, a1.lease_segment, a1.last_segment) == (
        "fetched", "h1", 11, '"e1"', None, SEG)
    assert a1.next_fetch_at == (at + timedelta(seconds=default)).replace(tzinfo=None) and a1.last_status_code == 200
    assert (a3.status, a3.failure_count, a3.lease_segment, a3.last_fetch_at) == ("unfetched", 0, None, None)
    assert a3.next_fetch_at == (at + timedelta(seconds=2)).replace(tzinfo=None)
    assert (a4.status, a4.redirect_to) == ("redirect", "http://c.test/landing")
    assert (a5.status, a5.fetch_interval_s) == ("gone", base_conf.revisit.gone_interval_s)
    assert (b1.status, b1.state_version, b1.lease_segment) == ("unfetched", 1, SEG)  # stale result not applied

    new = rows["http://a.test/new"]
    assert (new.status, new.source, new.depth, new.state_version, new.discovered_in) == ("unfetched", "link", 1, 0, SEG)
    assert new.priority == 2 * 0.8 and new.next_fetch_at == at.replace(tzinfo=None)
    landing = rows["http://c.test/landing"]
    assert (landing.source, landing.depth, landing.url_id) == ("redirect", 1, uid("http://c.test/landing"))

    events = {(r["url"], r["state_version"]): r for r in tables.table_df(spark, root, "index_events").collect()}
    assert {k: e.kind for k, e in events.items()} == {
        ("http://a.test/1", 1): "fetched", ("http://a.test/2", 1): "fetched", ("http://a.test/5", 1): "gone"}
    assert events[("http://a.test/1", 1)].created_at == at.replace(tzinfo=None)
    assert events[("http://a.test/1", 1)].content_hash == "h1"

    hosts = {r["host_key"]: r for r in tables.table_df(spark, root, "hosts").collect()}
    a, b = hosts["http://a.test"], hosts["http://b.test"]
    assert (a.fetches, a.status_2xx, a.status_3xx, a.status_4xx, a.status_5xx) == (4, 2, 1, 1, 0)
    assert (a.policy_version, a.crawl_delay_s, a.robots_state, a.backoff_level) == (1, 2.0, "rules", 0)
    assert (b.fetches, b.status_5xx, b.backoff_level) == (1, 1, 1)
    assert b.backoff_until == (at + timedelta(seconds=125)).replace(tzinfo=None)
    # Every host row carries its registered domain: c.test's row is new (host of a discovered URL), a's and b's
    # gain theirs if they were written without it.
    assert {h: r.domain for h, r in hosts.items()} == {"http://a.test": "a.test", "http://b.test": "b.test",
                                                       "http://c.test": "c.test"}

    segments = tables.table_df(spark, root, "segments").collect()
    assert {r.state for r in segments} == {"merged"}
    assert sum(r.results for r in segments) == 6 and sum(r.applied for r in segments) == 5
    assert sum(r.stale for r in segments) == 1 and sum(r.discovered for r in segments) == 2
    fetch_rows = tables.table_df(spark, root, "fetches").collect()
    assert len(fetch_rows) == 6 and {r.segment_id for r in fetch_rows} == {SEG}

    with unchanged_tables(spark, root):
        again = update.run(spark, base_conf, root, SEG)
    # A re-run reports what the segment did (so a crashed-and-re-run update records the same segment counts)
    # but changes nothing.
    assert (again.results, again.applied, again.stale, again.discovered, again.index_events) == (6, 5, 1, 2, 0)

    # The two service levels in cycle_metrics (crawler/service_levels.py). Generate: all six seeds are high priority
    # and eligible, leased about a minute after inject made them due. Update: a/1 and a/2 have outlinks, durable at
    # the `links` commit (its time as Delta's history has it) minus their fetch times.
    figures = {m.step: m for m in tables.table_df(spark, root, "cycle_metrics").where(f"segment_id = '{SEG}'")
               .collect()}
    chosen, merged = figures["generate"], figures["update"]
    assert (chosen.hp_eligible, chosen.hp_leased_within, chosen.hp_leased_late, chosen.hp_waiting_late) == (6, 6, 0, 0)
    assert chosen.lease_share_within == 1.0
    assert 60 <= chosen.hp_lease_lag_p99_s <= base_conf.service_levels.lease_within_s
    [committed] = (DeltaTable.forPath(spark, tables.table_path(root, "links")).history()
                   .where("operation = 'WRITE'").collect())
    durable = committed.timestamp.replace(tzinfo=UTC)
    assert merged.discovery_pages == 2
    # Nearest rank over two lags: p50 the smaller (a/2, fetched a second later), p99 the larger.
    assert merged.discovery_durable_p50_s == pytest.approx((durable - at - timedelta(seconds=1)).total_seconds(), abs=1)
    assert merged.discovery_durable_p99_s == pytest.approx((durable - at).total_seconds(), abs=1)


@pytest.mark.slow
def test_generate_records_each_eligible_high_priority_urls_lease_outcome(spark, base_conf, root, tmp_path):
    """Three high-priority seeds on one host, a segment budget of one URL: the two left out are eligible (within the
    host's cap) and wait. A minute after they fell due the wait is within the target (undecided); an hour after, a
    lease is late and so is every URL still waiting, and the level is missed."""
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/1\tpriority=3\nhttp://a.test/2\tpriority=2\nhttp://a.test/3\n")
    inject.run(spark, base_conf, root, str(seeds))
    due_at = max(r.next_fetch_at for r in tables.table_df(spark, root, "urls").collect()).replace(tzinfo=UTC)
    one = base_conf.with_overrides({"generate.segment_max_urls": 1})
    generate.run(spark, one, root, "seg-l1", due_at + timedelta(minutes=1))
    generate.run(spark, one, root, "seg-l2", due_at + timedelta(hours=1))  # a/1 is still leased to seg-l1
    rows = {m.segment_id: m for m in tables.table_df(spark, root, "cycle_metrics").collect()}
    first, second = rows["seg-l1"], rows["seg-l2"]
    assert (first.hp_eligible, first.hp_leased_within, first.hp_leased_late, first.hp_waiting_late) == (3, 1, 0, 0)
    assert first.lease_share_within == 1.0 and first.hp_lease_lag_p99_s == pytest.approx(60, abs=1)
    assert (second.hp_eligible, second.hp_leased_within, second.hp_leased_late, second.hp_waiting_late) == (2, 0, 1, 1)
    assert second.lease_share_within == 0.0 and second.hp_lease_lag_p99_s == pytest.approx(3600, abs=1)
    levels = ServiceLevels.from_config(base_conf)
    assert levels.misses({"generate": first.asDict()}) == []
    [missed] = levels.misses({"generate": second.asDict()})
    assert missed.startswith("leases: 0 of 2 eligible high-priority URLs leased within 600 s (0.0 %)")


def test_cycle_metrics_of_an_older_root_gains_the_service_level_columns(spark, base_conf, root):
    """A root whose cycle_metrics predates the service-level columns: ensuring the tables adds them (nullable, at
    the end), its old rows read them as null, a new row records them, and the DAG's delta-rs reader reads both."""
    names = tables.CYCLE_METRICS.schema.names
    new = names[names.index("hp_eligible"):]  # the service levels' columns and every column added after them
    assert len([name for name in new if name.startswith(("hp_", "lease_", "discovery_"))]) == 9
    path = tables.table_path(root, "cycle_metrics")
    shutil.rmtree(path)
    old_schema = StructType([f for f in tables.CYCLE_METRICS.schema.fields if f.name not in new])
    DeltaTable.createIfNotExists(spark).location(path).addColumns(old_schema).property(
        "delta.enableDeletionVectors", "false").execute()
    at = datetime(2026, 3, 1, tzinfo=UTC)
    old_row = {"segment_id": "seg-old", "step": "update", "run_at": at, "results": 5}
    spark.createDataFrame([tuple(old_row.get(name) for name in old_schema.names)], old_schema).write.format(
        "delta").mode("append").save(path)
    assert tables.create_all(spark, root) == []
    assert tables.table_df(spark, root, "cycle_metrics").columns == tables.CYCLE_METRICS.schema.names
    cycle_metrics.record(spark, root, {"segment_id": "seg-new", "step": "update", "run_at": at, "results": 3,
                                       "discovery_pages": 3, "discovery_durable_p99_s": 12.5})
    conf = base_conf.with_overrides({"storage.root": root})
    old, fresh = (cycle_metrics.read_figures(conf, segment)["update"] for segment in ("seg-old", "seg-new"))
    assert (old["results"], old["discovery_pages"], old["discovery_durable_p99_s"]) == (5, None, None)
    assert (fresh["results"], fresh["discovery_pages"], fresh["discovery_durable_p99_s"]) == (3, 3, 12.5)


@pytest.mark.slow
def test_a_segment_merged_after_its_leases_expired_applies_what_is_current_and_counts_the_rest_stale(
        spark, base_conf, root, tmp_path):
    """s1's update runs after its leases expired and s2 re-leased one of its URLs: s1's result for that URL is stale
    (s2 holds a newer version), its other results are still current and complete their URLs; the segment's rows
    and its cycle_metrics row show both counts (the report draws them)."""
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/1\tpriority=2\nhttp://a.test/2\nhttp://a.test/3\n")
    inject.run(spark, base_conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, base_conf, root, "seg-s1", now).url_count == 3
    expired = now + timedelta(seconds=base_conf.generate.lease_seconds + 60)
    one = base_conf.with_overrides({"generate.per_host_max_urls": 1})
    assert generate.run(spark, one, root, "seg-s2", expired).url_count == 1  # a.test/1, the highest priority
    at = now + timedelta(seconds=30)
    write_parquet(layout.fetched_dir(root, "seg-s1", bucket("http://a.test/")), [
        {**result_row("seg-s1", f"http://a.test/{n}", at, "success", 200, 1, BUCKETS)} for n in (1, 2, 3)], FETCHED)
    result = update.run(spark, base_conf, root, "seg-s1")
    assert (result.results, result.applied, result.stale) == (3, 2, 1)
    rows = {r.url: r for r in tables.table_df(spark, root, "urls").collect()}
    assert (rows["http://a.test/1"].status, rows["http://a.test/1"].lease_segment) == ("unfetched", "seg-s2")
    assert {rows[f"http://a.test/{n}"].status for n in (2, 3)} == {"fetched"}
    [segment] = tables.table_df(spark, root, "segments").where("segment_id = 'seg-s1'").collect()
    [figures] = tables.table_df(spark, root, "cycle_metrics").where(
        "segment_id = 'seg-s1' and step = 'update'").collect()
    assert (segment.applied, segment.stale) == (figures.applied, figures.stale) == (2, 1)


def test_update_without_fetched_results_does_nothing(spark, base_conf, root):
    result = update.run(spark, base_conf, root, "seg-none")
    assert (result.results, result.applied, result.discovered) == (0, 0, 0)
    assert tables.table_df(spark, root, "urls").count() == 0


@pytest.mark.slow
def test_robots_denied_url_waits_for_the_hosts_robots_expiry(spark, base_conf, root, tmp_path):
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/private/x\nhttp://a.test/open\n")
    inject.run(spark, base_conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    generate.run(spark, base_conf, root, SEG, now)
    at, expires = now + timedelta(seconds=5), now + timedelta(hours=5)
    results = [fetched("http://a.test/private/x", at, "robots_denied", None),
               fetched("http://a.test/open", at, "success", 200)]
    write_parquet(layout.fetched_dir(root, SEG, bucket("http://a.test/")), results, FETCHED)
    write_parquet(layout.robots_dir(root, SEG, bucket("http://a.test/")), [{
        "segment_id": SEG, "bucket": bucket("http://a.test/"), "host_key": "http://a.test", "fetched_at": now,
        "status_code": 200, "state": "rules", "body": "User-agent: *\nDisallow: /private\n",
        "expires_at": expires}], ROBOTS)
    update.run(spark, base_conf, root, SEG)
    rows = {r.url: r for r in tables.table_df(spark, root, "urls").collect()}
    denied = rows["http://a.test/private/x"]
    assert (denied.status, denied.next_fetch_at) == ("robots_denied", expires.replace(tzinfo=None))
    assert rows["http://a.test/open"].status == "fetched"


@pytest.mark.slow
def test_failures_back_hosts_off_across_segments_and_a_long_streak_makes_a_host_dead_until_it_answers(
        spark, base_conf, root, tmp_path):
    """The failures that back a host off inside a segment (crawler.status.is_transient) carry over to the next
    segments alike — network errors, a 500, and a robots.txt that cannot be reached (the host's URLs come back
    deferred, with no request) — a 404 is no failure. A host with nothing but failures for
    politeness.dead_after_days is dead: generate gives it one probe URL (not its backlog), and the probe's answer
    revives it. (Network errors and unreachable robots.txt used to carry no backoff across segments.) An
    unreachable robots.txt keeps the host's last good copy stored (generate ignores it while disallow_all)."""
    from crawler.politeness import PolitenessRules

    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://n.test/1\nhttp://f.test/1\nhttp://g.test/1\nhttp://r.test/1\nhttp://d.test/1\n"
                     "http://d.test/2\nhttp://d.test/3\n")
    inject.run(spark, base_conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, base_conf, root, SEG, now).url_count == 7
    good = "User-agent: *\nDisallow: /private\n"

    def write_segment(segment: str, results: list[dict], robots: dict[str, tuple[int | None, str, str | None]],
                      at: datetime):
        for b in {r["bucket"] for r in results} | {bucket(h) for h in robots}:
            write_parquet(layout.fetched_dir(root, segment, b), [r for r in results if r["bucket"] == b], FETCHED)
            write_parquet(layout.robots_dir(root, segment, b), [{
                "segment_id": segment, "bucket": b, "host_key": host, "fetched_at": at, "status_code": code,
                "state": state, "body": body, "expires_at": at + timedelta(days=1)}
                for host, (code, state, body) in robots.items() if bucket(host) == b], ROBOTS)

    def hosts() -> dict:
        return {r["host_key"]: r for r in tables.table_df(spark, root, "hosts").collect()}

    at = now + timedelta(seconds=10)
    write_segment(SEG, [fetched("http://n.test/1", at, "network_error", None, error="connection refused"),
                        fetched("http://f.test/1", at, "http_error", 500),
                        fetched("http://g.test/1", at, "http_error", 404),
                        fetched("http://r.test/1", at, "success", 200),
                        *[fetched(f"http://d.test/{n}", at, "deferred", None) for n in (1, 2, 3)]],
                  {"http://d.test": (None, "disallow_all", None), "http://r.test": (200, "rules", good)}, at)
    update.run(spark, base_conf, root, SEG)
    rows = hosts()
    base = timedelta(seconds=base_conf.politeness.backoff_base_s)
    naive = at.replace(tzinfo=None)
    for failing in ("http://n.test", "http://f.test", "http://d.test"):
        row = rows[failing]
        assert row.backoff_level == 1, failing
        assert naive + base <= row.backoff_until <= naive + 1.25 * base
        assert row.failing_since == naive, failing
    assert rows["http://d.test"].fetches == 0  # no request was made: the robots.txt fetch failed
    assert (rows["http://g.test"].backoff_level, rows["http://g.test"].backoff_until) == (0, None)
    assert rows["http://g.test"].failing_since is None
    assert (rows["http://r.test"].robots_body, rows["http://r.test"].policy_version) == (good, 1)

    # Eight days later: the three failing hosts are dead; the dead host with a backlog of 3 gets one probe URL.
    later = now + timedelta(days=8)
    rules = PolitenessRules.from_config(base_conf)
    states = {key: rules.host_state(r.robots_state, r.backoff_until and r.backoff_until.replace(tzinfo=UTC),
                                    r.failing_since and r.failing_since.replace(tzinfo=UTC), later)
              for key, r in rows.items()}
    assert states == {"http://n.test": "dead", "http://f.test": "dead", "http://d.test": "dead", "http://g.test": "ok",
                      "http://r.test": "ok"}
    assert cycle_metrics.hosts_by_state(spark, base_conf, root, later) == {"dead": 3, "ok": 2}  # its SQL twin
    probe_seg = "seg-u2"
    generate.run(spark, base_conf, root, probe_seg, later)
    listed = {r.url: r for r in spark.read.parquet(layout.fetchlist_dir(root, probe_seg)).collect()}
    by_host = Counter(r.host_key for r in listed.values())
    assert by_host == {"http://n.test": 1, "http://f.test": 1, "http://d.test": 1, "http://r.test": 1}
    probe = next(r for r in listed.values() if r.host_key == "http://d.test")

    # The probe is answered (and robots.txt is a 404: allow all): the host is alive again. r.test's robots.txt
    # now answers 503: a failing streak starts, and its last good copy stays stored.
    at2 = later + timedelta(seconds=10)
    again = listed["http://r.test/1"]
    write_segment(probe_seg, [result_row(probe_seg, probe.url, at2, "success", 200, probe.state_version, BUCKETS),
                              result_row(probe_seg, again.url, at2, "deferred", None, again.state_version, BUCKETS)],
                  {"http://d.test": (404, "allow_all", None), "http://r.test": (503, "disallow_all", "<h1>busy</h1>")},
                  at2)
    update.run(spark, base_conf, root, probe_seg)
    rows = hosts()
    assert (rows["http://d.test"].backoff_level, rows["http://d.test"].failing_since) == (0, None)
    assert rows["http://n.test"].failing_since == naive  # untouched by a segment that got no result from it
    r = rows["http://r.test"]
    assert (r.robots_state, r.robots_status_code, r.robots_body, r.policy_version) == ("disallow_all", 503, good, 1)
    assert (r.robots_good_at, r.robots_good_status_code) == (naive, 200)  # the last good copy's, for the daemons
    assert rows["http://d.test"].robots_good_status_code == 404  # a 404 is a good copy too: allow all
    assert (r.backoff_level, r.failing_since) == (1, at2.replace(tzinfo=None))

    # The frontier figures of both steps (jobs/cycle_metrics.py), from the tables as each step saw them.
    figures = {(m.segment_id, m.step): m for m in tables.table_df(spark, root, "cycle_metrics").collect()}
    chosen = figures[(probe_seg, "generate")]
    # Due: n/1 and f/1 (retries), d/1-3 (deferred), r/1 (its interval passed); g/1 is gone. All seeds: priority 1.
    assert (chosen.due_urls, chosen.leased_urls, chosen.due_high_priority, chosen.high_priority_not_leased) == (
        6, 4, 6, 2)
    assert chosen.oldest_due_age_s == pytest.approx((later - at).total_seconds())  # d's deferred URLs, due since `at`
    assert chosen.unmerged_segments == 0
    merged = figures[(probe_seg, "update")]
    assert (merged.results, merged.applied, merged.stale, merged.new_urls, merged.refetched) == (2, 2, 0, 0, 0)
    assert merged.change_rate is None


