"""inject and generate on real Delta tables: bad seed lines, idempotent re-inject, due selection, per-host and
global caps, bucketed sorted fetch lists, leases with state_version + 1, lease expiry, idempotent re-run."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from crawler import frontier, layout, urls
from crawler.errors import Backpressure, UserError
from crawler.records import FETCHLIST
from crawler.status import MetricsStep
from delta_tables import tables
from fetchd.fetchlist import FetchList, KeySet, handed_over_robots
from jobs import cycle_metrics, generate, inject, update
from tests.support.due_files import remove_files_due_after, url_rows
from tests.support.tables import append_rows, replace_root, unchanged_tables


@pytest.fixture
def root(tables_root) -> str:
    """Every test here starts with the tables created (`tests/conftest.py::tables_root`)."""
    return tables_root


SEEDS = """# test seeds
http://a.test/1\tpriority=5
http://a.test/2\tpriority=4
http://a.test/3\t3
http://a.test/4\tpriority=2\tinterval=3600
http://a.test/5\tpriority=1
ftp://a.test/nope
http://b.test/1\tpriority=2
http://b.test/2\tpriority=1
http://a.test/1
http://c.test/only\tpriority=oops
http://c.test/

"""


def table_rows(spark, root, name) -> list[str]:
    return sorted(str(r) for r in tables.table_df(spark, root, name).collect())


def fetchlist_rows(root: str, segment_id: str) -> dict[int, list[dict]]:
    """Each bucket directory's rows, in file order, read with pyarrow (as the daemon does)."""
    base = layout.fetchlist_dir(root, segment_id)
    found = {}
    for name in sorted(os.listdir(base)):
        bucket = layout.parse_bucket_dirname(name)
        if bucket is None:
            continue
        files = sorted(f for f in os.listdir(os.path.join(base, name)) if f.endswith(".parquet"))
        rows = []
        for f in files:
            table = pq.read_table(os.path.join(base, name, f))
            assert set(FETCHLIST.names) <= set(table.column_names)
            rows.extend(table.to_pylist())
        found[bucket] = rows
    return found


@pytest.fixture(scope="module")
def _seeded_root(spark, base_conf, new_tables_root, tmp_path_factory) -> tuple[str, inject.InjectResult, str]:
    """SEEDS injected once for the module: (the root, inject's result, the seeds file)."""
    base = tmp_path_factory.mktemp("seeded")
    seeds = base / "seeds.txt"
    seeds.write_text(SEEDS)
    root = new_tables_root(base / "root")
    return root, inject.run(spark, base_conf, root, str(seeds)), str(seeds)


@pytest.fixture
def seeded(_seeded_root, root):
    """The test's root as inject left it after SEEDS (a copy of `_seeded_root`'s): (inject's result, seeds file)."""
    template, result, seeds = _seeded_root
    replace_root(root, template)
    return result, seeds


def test_inject_takes_a_bom_and_skips_a_line_that_is_not_utf8(spark, base_conf, root, tmp_path):
    """A UTF-8 byte-order mark does not spoil the first seed; a line that is not UTF-8 is a bad line, not a failed
    inject (it was a traceback)."""
    seeds = tmp_path / "seeds.txt"
    seeds.write_bytes(b"\xef\xbb\xbfhttp://d.test/first\nhttp://d.test/\xe9t\xe9\nhttp://d.test/last\r\n")
    result = inject.run(spark, base_conf, root, str(seeds))
    assert (result.lines, result.injected, result.rejected) == (3, 2, 1)
    assert result.errors == [(2, "http://d.test/\\xe9t\\xe9", "not valid UTF-8")]
    assert {r.url for r in tables.table_df(spark, root, "urls").collect()} == {"http://d.test/first",
                                                                               "http://d.test/last"}


def test_inject_reports_bad_lines_injects_the_rest_and_is_idempotent(spark, base_conf, root, seeded):
    result, seeds = seeded
    assert (result.lines, result.injected, result.already_known, result.rejected, result.duplicates) == (11, 8, 0, 2, 1)
    assert [line_no for line_no, _, _ in result.errors] == [7, 11]
    assert "scheme" in result.errors[0][2] and "priority" in result.errors[1][2]
    rows = {r["url"]: r for r in tables.table_df(spark, root, "urls").collect()}
    assert len(rows) == 8
    a4 = rows["http://a.test/4"]
    assert (a4.status, a4.source, a4.depth, a4.state_version, a4.priority, a4.fetch_interval_s) == (
        "unfetched", "seed", 0, 0, 2.0, 3600)
    assert a4.url_id == urls.url_id("http://a.test/4") and a4.bucket == urls.bucket_of("http://a.test", 4)
    assert rows["http://c.test/"].fetch_interval_s == base_conf.revisit.default_interval_s
    hosts = {r["host_key"]: r for r in tables.table_df(spark, root, "hosts").collect()}
    assert set(hosts) == {"http://a.test", "http://b.test", "http://c.test"}
    assert hosts["http://b.test"].fetches == 0 and hosts["http://b.test"].policy_version == 0
    assert {h: r.known_urls for h, r in hosts.items()} == {"http://a.test": 5, "http://b.test": 2, "http://c.test": 1}

    with unchanged_tables(spark, root):
        again = inject.run(spark, base_conf, root, seeds)
    assert (again.injected, again.already_known, again.rejected) == (0, 8, 2)


@pytest.mark.slow
def test_generate_caps_sorts_leases_and_reruns_idempotently(spark, base_conf, root, seeded):
    # delay 10 s, 30 s segment: at most 3 URLs per host.
    conf = base_conf.with_overrides({"politeness.min_delay_s": 10.0, "generate.segment_seconds": 30})
    now = datetime.now(UTC) + timedelta(minutes=1)
    first = generate.run(spark, conf, root, "seg-1", now)
    assert (first.url_count, first.host_count) == (6, 3)
    expected_buckets = sorted({urls.bucket_of(h, 4) for h in ("http://a.test", "http://b.test", "http://c.test")})
    assert first.buckets == expected_buckets
    listed = fetchlist_rows(root, "seg-1")
    assert sorted(listed) == expected_buckets
    for rows in listed.values():
        assert [(r["rank"], r["host_key"]) for r in rows] == sorted((r["rank"], r["host_key"]) for r in rows)
    by_url = {r["url"]: r for rows in listed.values() for r in rows}
    assert {u for u in by_url if u.startswith("http://a.test")} == {"http://a.test/1", "http://a.test/2",
                                                                     "http://a.test/3"}
    assert [by_url[f"http://a.test/{i}"]["rank"] for i in (1, 2, 3)] == [1, 2, 3]
    assert all(r["state_version"] == 1 and r["segment_id"] == "seg-1" and r["delay_s"] == 10.0
               for r in by_url.values())
    leased = {r["url"]: r for r in tables.table_df(spark, root, "urls").collect() if r["lease_segment"] == "seg-1"}
    assert set(leased) == set(by_url) and all(r.state_version == 1 for r in leased.values())
    assert all(r.lease_expires_at.replace(tzinfo=None) > now.replace(tzinfo=None) for r in leased.values())
    segments = {r["bucket"]: r for r in tables.table_df(spark, root, "segments").collect()}
    assert sorted(segments) == expected_buckets and sum(r.url_count for r in segments.values()) == 6
    assert {r.state for r in segments.values()} == {"generated"}

    with unchanged_tables(spark, root):
        rerun = generate.run(spark, conf, root, "seg-1", now)
    assert (rerun.url_count, rerun.buckets) == (6, expected_buckets)
    assert fetchlist_rows(root, "seg-1") == listed

    second = generate.run(spark, conf, root, "seg-2", now)
    assert second.url_count == 2
    assert {r["url"] for rows in fetchlist_rows(root, "seg-2").values() for r in rows} == {
        "http://a.test/4", "http://a.test/5"}
    third = generate.run(spark, conf, root, "seg-3", now)
    assert third.empty and not os.path.exists(layout.fetchlist_dir(root, "seg-3"))
    # Every URL is leased: none comes due before the two segments' leases expire, unless `urls` changes first.
    assert third.next_due_at == now + timedelta(seconds=conf.generate.lease_seconds)
    assert third.urls_version == tables.table_version(spark, root, "urls")

    later = now + timedelta(seconds=conf.generate.lease_seconds + 1)
    generate.run(spark, conf, root, "seg-4", later)
    versions = {r["url"]: r["state_version"] for rows in fetchlist_rows(root, "seg-4").values() for r in rows}
    assert len(versions) == 6 and set(versions.values()) == {2}


def test_backoff_host_skipped_and_global_cap_keeps_lowest_ranks(spark, base_conf, root, seeded):
    from delta.tables import DeltaTable

    now = datetime.now(UTC) + timedelta(minutes=1)
    DeltaTable.forPath(spark, tables.table_path(root, "hosts")).update(
        "host_key = 'http://a.test'", {"backoff_until": f"timestamp'{(now + timedelta(hours=1)).isoformat()}'"})
    conf = base_conf.with_overrides({"generate.segment_max_urls": 2})
    result = generate.run(spark, conf, root, "seg-cap", now)
    rows = [r for rows in fetchlist_rows(root, "seg-cap").values() for r in rows]
    assert result.url_count == 2
    assert {(r["host_key"], r["rank"]) for r in rows} == {("http://b.test", 1), ("http://c.test", 1)}


def test_generate_reads_only_the_urls_files_that_can_hold_due_rows(spark, base_conf, root):
    """generate's due filter reaches the `urls` scans (the selection, the frontier figures, the lease) as a plain
    predicate on next_fetch_at, which Delta checks against each file's min/max statistics: a file whose rows all
    come due later is never opened. Those files are deleted from storage here (still in the table's log), so a job
    that read one would fail."""
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    buckets = base_conf.crawl.buckets
    for day in (1, 2, 3):  # rows due later, a file per bucket and append
        append_rows(spark, root, "urls", url_rows("http://later.test", range(10 * day, 10 * day + 10),
                                                  now + timedelta(days=day), buckets)
                    + url_rows("http://other.test", range(day), now + timedelta(minutes=day), buckets), now)
    due = url_rows("http://due.test", range(3), now - timedelta(hours=1), buckets)
    append_rows(spark, root, "urls", due, now)
    assert len(remove_files_due_after(spark, root, now)) >= 3

    result = generate.run(spark, base_conf, root, "seg-due-files", now)

    assert result.url_count == 3
    assert sorted(r["url"] for rows in fetchlist_rows(root, "seg-due-files").values() for r in rows) == sorted(
        r["url"] for r in due)
    leased = tables.table_df(spark, root, "urls").where((F.col("next_fetch_at") <= F.lit(now))
                                                      & (F.col("lease_segment") == "seg-due-files"))
    assert sorted(r["url"] for r in leased.collect()) == sorted(r["url"] for r in due)


@pytest.mark.slow
def test_generate_skips_urls_the_stored_robots_rules_deny_until_they_expire(spark, base_conf, root, seeded):
    from delta.tables import DeltaTable

    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    expires = now + timedelta(hours=1)
    hosts = DeltaTable.forPath(spark, tables.table_path(root, "hosts"))
    rules = "User-agent: *\nDisallow: /2\nDisallow: /4$\n"
    fetched = now - timedelta(hours=2)
    times = {"robots_fetched_at": f"timestamp'{fetched.isoformat()}'",
             "robots_expires_at": f"timestamp'{expires.isoformat()}'"}
    hosts.update("host_key = 'http://a.test'", {
        "robots_state": "'rules'", "robots_body": f"'{rules}'", "robots_status_code": "200", **times})
    hosts.update("host_key = 'http://c.test'", {  # a 404: unavailable, allow all (a definite answer too)
        "robots_state": "'allow_all'", "robots_body": "'not found'", "robots_status_code": "404", **times})
    generate.run(spark, base_conf, root, "seg-r1", now)
    rows = [r for rows in fetchlist_rows(root, "seg-r1").values() for r in rows]
    assert {r["url"] for r in rows} == {"http://a.test/1", "http://a.test/3", "http://a.test/5", "http://b.test/1",
                                        "http://b.test/2", "http://c.test/"}
    # Each host's stored robots.txt in force rides on its first row only, for a daemon new to the host, which
    # reads it as the stored one.
    assert sorted((r["host_key"], r["rank"]) for r in rows if r["robots_expires_at"] is not None) == [
        ("http://a.test", 1), ("http://c.test", 1)]
    assert all(r["robots_body"] is None and r["robots_status_code"] is None for r in rows
               if r["robots_expires_at"] is None)
    handed = {row["host_key"]: robots for bucket in fetchlist_rows(root, "seg-r1")
              for row in FetchList(root, "seg-r1", bucket).rows(KeySet())
              if (robots := handed_over_robots(row)) is not None}
    assert handed == {
        "http://a.test": {"status_code": 200, "body": rules, "fetched_at": fetched, "expires_at": expires},
        "http://c.test": {"status_code": 404, "body": "not found", "fetched_at": fetched, "expires_at": expires}}
    # Once the stored policy has expired the daemon fetches robots.txt again, so the URLs go out with it, and with
    # the stored copy as the last good one (expired: fetched_at = expires_at), which keeps its rules in force should
    # robots.txt be unreachable (crawler.robots.handed_over, adopt).
    generate.run(spark, base_conf, root, "seg-r2", expires + timedelta(minutes=1))
    rows = [r for rows in fetchlist_rows(root, "seg-r2").values() for r in rows]
    assert {r["url"] for r in rows} == {"http://a.test/2", "http://a.test/4"}
    handed = [handed_over_robots(row) for bucket in fetchlist_rows(root, "seg-r2")
              for row in FetchList(root, "seg-r2", bucket).rows(KeySet())]
    assert [robots for robots in handed if robots is not None] == [
        {"status_code": 200, "body": rules, "fetched_at": fetched, "expires_at": fetched}]


@pytest.mark.slow
def test_low_priority_url_is_fetched_within_bounded_cycles_under_constant_high_priority_load(spark, base_conf, root):
    """Each cycle brings exactly a host's cap of fresh priority-1.0 URLs; a 0.15 URL waiting since cycle 0
    must win a place as soon as its age boost lifts it above them (0.15 + 0.1/day * 9 days > 1.0), not never."""
    from delta.tables import DeltaTable

    # Segments are generated and never fetched or merged here: backpressure must not stop the ranking under test.
    conf = base_conf.with_overrides({"generate.per_host_max_urls": 2, "generate.age_boost_per_day": 0.1,
                                     "generate.max_unmerged_segments": 10})
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    step = timedelta(days=3)

    low = "http://busy.test/low"
    # Each cycle's new URLs are known from the start and come due at their cycle (not due before it, so not listed).
    append_rows(spark, root, "urls", [_url_row(low, 0.15, t0, source="seed")] + [
        _url_row(f"http://busy.test/high-{cycle}-{n}", 1.0, t0 + cycle * step, source="seed")
        for cycle in range(4) for n in range(2)])
    chosen_in = []
    for cycle in range(4):
        now = t0 + cycle * step
        generate.run(spark, conf, root, f"seg-s{cycle}", now)
        listed = {r["url"] for rows in fetchlist_rows(root, f"seg-s{cycle}").values() for r in rows}
        assert len(listed) == 2
        chosen_in.append(low in listed)
        # The fetch happened: what was leased is done until far in the future.
        DeltaTable.forPath(spark, tables.table_path(root, "urls")).update(
            f"lease_segment = 'seg-s{cycle}'", {"lease_segment": "null", "lease_expires_at": "null",
                                                "next_fetch_at": "timestamp'2030-01-01 00:00:00'"})
    assert chosen_in == [False, False, False, True]
    assert frontier.score(0.15, t0, t0 + 3 * step, 0.1) > 1.0 >= frontier.score(0.15, t0, t0 + 2 * step, 0.1)


def _open_segment(spark, root: str, segment_id: str, fetch_over: bool, buckets=(0, 1)) -> None:
    """A segment as generate leaves it (rows `generated`, fetch lists), its fetch over or still running."""
    append_rows(spark, root, "segments", [{"segment_id": segment_id, "bucket": b, "state": "generated",
                                           "url_count": 1, "host_count": 1, "epoch": 0} for b in buckets])
    for bucket in buckets:
        os.makedirs(layout.fetchlist_dir(root, segment_id, bucket))
        if fetch_over:
            os.makedirs(layout.fetched_dir(root, segment_id, bucket))
            with open(layout.done_manifest(root, segment_id, bucket), "w") as manifest:
                manifest.write("{}")


@pytest.mark.slow
def test_generate_waits_for_stalled_segments_and_lets_open_fetches_pile_up_to_the_limit(spark, base_conf, root,
                                                                                         seeded):
    """Backpressure (crawler.frontier.backpressure): a segment whose fetch is over but which is not merged stops
    generate with Backpressure (exit 75) and leases nothing; giving it up (`record_closed`, crawl close-segment)
    or merging it (update, here of a segment with no results) lets generate go on. Segments still being fetched
    may pile up to generate.max_unmerged_segments."""
    urls_before = table_rows(spark, root, "urls")
    _open_segment(spark, root, "seg-stalled", fetch_over=True)
    _open_segment(spark, root, "seg-empty", fetch_over=True, buckets=(3,))
    with pytest.raises(Backpressure, match="segment seg-empty finished fetching but is not merged .and 1 more"):
        generate.run(spark, base_conf, root, "seg-next")
    assert table_rows(spark, root, "urls") == urls_before  # nothing leased
    assert not os.path.exists(layout.fetchlist_dir(root, "seg-next"))

    assert update.record_closed(spark, root, "seg-stalled", datetime.now(UTC)) == 2
    assert update.record_closed(spark, root, "seg-stalled", datetime.now(UTC)) == 0  # given up once
    update.run(spark, base_conf, root, "seg-empty")  # fetched nothing: merged with nothing
    states = {(r.segment_id, r.state) for r in tables.table_df(spark, root, "segments").collect()}
    assert states == {("seg-stalled", "closed"), ("seg-empty", "merged")}

    for number in range(3):
        _open_segment(spark, root, f"seg-open-{number}", fetch_over=False)
    with pytest.raises(Backpressure, match="3 earlier segments are not merged yet .*max_unmerged_segments = 2"):
        generate.run(spark, base_conf, root, "seg-next")
    roomier = base_conf.with_overrides({"generate.max_unmerged_segments": 3})
    assert generate.run(spark, roomier, root, "seg-next").url_count > 0
    # A re-run of that generate is not held back by itself, nor by the limit it passed; a merged one is refused.
    assert generate.run(spark, roomier, root, "seg-next").url_count > 0
    with pytest.raises(UserError, match="seg-empty is past the generated state"):
        generate.run(spark, roomier, root, "seg-empty")


def _url_row(url: str, priority: float, due: datetime, fetched_at: datetime | None = None,
             source: str = "link") -> dict:
    """A `urls` row due at `due`, fetched once at `fetched_at` (None: never fetched)."""
    host = urls.host_key(url)
    return {"url_id": urls.url_id(url), "url": url, "host_key": host, "bucket": urls.bucket_of(host, 4),
            "status": "fetched" if fetched_at else "unfetched", "state_version": 1 if fetched_at else 0,
            "priority": priority, "depth": 0, "source": source, "discovered_at": due, "next_fetch_at": due,
            "fetch_interval_s": 86400, "failure_count": 0, "inlinks": 0, "updated_at": due,
            "last_fetch_at": fetched_at}


def _due_urls(spark, root: str, rows: list[tuple[str, float, datetime | None]], due: datetime) -> None:
    """Due URLs (url, priority, last fetch time: None for a URL never fetched) in `urls`."""
    append_rows(spark, root, "urls", [_url_row(url, priority, due, fetched_at) for url, priority, fetched_at in rows])


@pytest.mark.slow
@pytest.mark.parametrize(("burst", "refresh_priority", "new_priority", "expected"), [
    ("discovery", 1.0, 5.0, (9, 11)),   # a burst of high-priority new URLs: revisits still get 45 % of 20
    ("refresh", 5.0, 1.0, (9, 11)),     # the reverse: new URLs still get the other 55 %
    ("few revisits", 5.0, 1.0, (4, 16)),  # only 4 revisits due: discovery takes what they leave
])
def test_a_burst_on_one_side_leaves_the_other_its_share(spark, base_conf, root, burst, refresh_priority,
                                                        new_priority, expected):
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    revisits = 4 if burst == "few revisits" else 60
    fetched_at = t0 - timedelta(days=8)
    known = [(f"http://known-{n % 12}.test/page-{n}", refresh_priority, fetched_at) for n in range(revisits)]
    new = [(f"http://new-{n % 12}.test/page-{n}", new_priority, None) for n in range(60)]
    _due_urls(spark, root, known + new, t0)
    conf = base_conf.with_overrides({"generate.segment_max_urls": 20, "generate.budget_split": True,
                                     "generate.refresh_share": 0.45})
    result = generate.run(spark, conf, root, f"seg-share-{burst.replace(' ', '-')}", t0 + timedelta(minutes=1))
    listed = [r for rows in fetchlist_rows(root, result.segment_id).values() for r in rows]
    revisited = [r for r in listed if r["last_fetch_at"] is not None]
    assert (len(revisited), len(listed) - len(revisited)) == expected
    assert (result.refresh_count, result.url_count) == (expected[0], sum(expected))
    # within each side the usual order holds: every host's first URL before any host's second
    for side in (revisited, [r for r in listed if r["last_fetch_at"] is None]):
        assert max(r["rank"] for r in side) <= 2


def test_the_adaptive_share_is_moved_by_the_last_update_row_of_cycle_metrics(spark, base_conf, root):
    """The wiring from the tables to the split: update's last `cycle_metrics` row (change rate of refetched pages,
    new URLs per fetch) moves the share generate gives revisits (crawler.frontier.RefreshShare), and the segment
    follows it."""
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    fetched_at = t0 - timedelta(days=8)
    known = [(f"http://known-{n % 12}.test/page-{n}", 0.5, fetched_at) for n in range(60)]
    new = [(f"http://new-{n % 12}.test/page-{n}", 0.5, None) for n in range(60)]
    _due_urls(spark, root, known + new, t0)
    cycle_metrics.record(spark, root, {"segment_id": "seg-before", "step": MetricsStep.UPDATE.value, "run_at": t0,
                                       "results": 40, "new_urls": 4, "change_rate": 0.7})
    conf = base_conf.with_overrides({"generate.segment_max_urls": 20, "generate.budget_split": True,
                                     "generate.refresh_share": 0.45, "generate.refresh_share_adaptive": True})
    share = frontier.RefreshShare.from_config(conf).current(0.7, 4 / 40)
    assert share == pytest.approx(0.45 + conf.generate.refresh_share_gain * (0.7 - 0.1 / 1.1)) and share > 0.6
    result = generate.run(spark, conf, root, "seg-adaptive", t0 + timedelta(minutes=1))
    assert result.refresh_share == pytest.approx(share)
    listed = [r for rows in fetchlist_rows(root, result.segment_id).values() for r in rows]
    revisits = sum(r["last_fetch_at"] is not None for r in listed)
    assert (revisits, len(listed) - revisits) == frontier.refresh_quota(20, share, 60, 60) == (15, 5)


@pytest.mark.slow
def test_a_domain_of_many_subdomains_gets_no_more_than_its_budget(spark, base_conf, root, tmp_path):
    """Per-domain budgets (crawler.frontier.DomainBudgets): 500 subdomains of one registered domain share its
    budget (round-robin: each of 40 hosts gives its first URL), a pattern gives a known domain more, a domain under
    its budget keeps everything; the hot domains are recorded with what the segment took of each. Then the daily
    budgets: later segments of the same UTC day take what the day has left (leased to an open segment or fetched
    since midnight: crawler.frontier.spends_the_day), a re-run takes the same, and the next day starts afresh."""
    big = [f"http://h{n}.bigsite.co.uk/{page}" for n in range(500) for page in ("a", "b")]
    hot = [f"http://h{n}.hot.test/{page}" for n in range(30) for page in ("a", "b", "c")]
    small = [f"http://s{n}.small.test/{page}" for n in range(3) for page in ("a", "b")]
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(big + hot + small) + "\n")
    conf = base_conf.with_overrides({"generate.per_domain_max_urls": 40, "generate.domain_budgets": {"hot.t*": 75},
                                     "generate.per_domain_daily_max_urls": 100,
                                     "generate.domain_daily_budgets": {"hot.t*": 80},
                                     "generate.hot_domains": 2, "generate.segment_max_urls": 10000,
                                     "generate.max_unmerged_segments": 5,
                                     "sitemaps.probe_default_location": False})
    inject.run(spark, conf, root, str(seeds))
    domains = {r.host_key: r.domain for r in tables.table_df(spark, root, "hosts").collect()}
    assert len(domains) == 533 and domains["http://h7.bigsite.co.uk"] == "bigsite.co.uk"
    assert {domains[urls.host_key(u)] for u in hot + small} == {"hot.test", "small.test"}

    noon = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) + timedelta(days=1)

    def listed_per_domain(segment_id: str) -> dict[str, list[dict]]:
        by_domain: dict[str, list[dict]] = {}
        for rows in fetchlist_rows(root, segment_id).values():
            for row in rows:
                by_domain.setdefault(domains[row["host_key"]], []).append(row)
        return by_domain

    result = generate.run(spark, conf, root, "seg-domains", noon)
    by_domain = listed_per_domain("seg-domains")
    assert {d: len(rows) for d, rows in by_domain.items()} == {"bigsite.co.uk": 40, "hot.test": 75,
                                                               "small.test": 6}
    assert len({r["host_key"] for r in by_domain["bigsite.co.uk"]}) == 40  # one URL from each of 40 hosts
    assert len({r["host_key"] for r in by_domain["hot.test"]}) == 30  # every host's first and second URL first
    assert sorted(r["rank"] for r in by_domain["hot.test"]).count(3) == 15
    assert result.url_count == 121

    figures = tables.table_df(spark, root, "cycle_metrics").where("segment_id = 'seg-domains'").first()
    assert [hot.asDict() for hot in figures.hot_domains] == [
        {"domain": "bigsite.co.uk", "due": 1000, "leased": 40}, {"domain": "hot.test", "due": 90, "leased": 75}]
    assert figures.due_urls == 1096 and figures.leased_urls == 121

    # Same day: the first segment's live leases spent 40 of bigsite's 100 and 75 of hot.test's 80.
    generate.run(spark, conf, root, "seg-domains-2", noon + timedelta(minutes=1))
    second = {d: len(rows) for d, rows in listed_per_domain("seg-domains-2").items()}
    assert second == {"bigsite.co.uk": 40, "hot.test": 5}
    generate.run(spark, conf, root, "seg-domains-2", noon + timedelta(minutes=1))  # its own leases are not spent
    assert {d: len(rows) for d, rows in listed_per_domain("seg-domains-2").items()} == second
    # The first segment merged (as update leaves a fetched URL): fetched today still spends the day.
    DeltaTable.forPath(spark, tables.table_path(root, "urls")).update(
        "lease_segment = 'seg-domains'",
        {"lease_segment": "null", "lease_expires_at": "null", "last_fetch_at": F.lit(noon + timedelta(seconds=30)),
         "next_fetch_at": F.lit(noon + timedelta(days=1))})
    generate.run(spark, conf, root, "seg-domains-3", noon + timedelta(minutes=2))
    assert {d: len(rows) for d, rows in listed_per_domain("seg-domains-3").items()} == {"bigsite.co.uk": 20}
    # The next day: yesterday's fetches and the expired leases spend nothing; only the per-segment budgets hold.
    generate.run(spark, conf, root, "seg-domains-4", noon + timedelta(days=1))
    assert {d: len(rows) for d, rows in listed_per_domain("seg-domains-4").items()} == {
        "bigsite.co.uk": 40, "hot.test": 75, "small.test": 6}
