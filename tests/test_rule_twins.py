"""Every rule that Spark evaluates as SQL text agrees with its Python form (the rule's one home in `crawler/`).

Each test builds a small frame of cases, evaluates the `*_sql` twin on the shared session and compares row by row
with the Python function over the same values: status outcomes, the revisit decision and the index event kind,
the stored payload a URL keeps and whether generate hands it out, politeness delays, the per-host cap and score,
leases (due, version, current, completes, latest result), the duplicate verdict, discovery depth/priority, backing
off, robots rules in force, the segment order, the depth scope, the per-cycle caps on new URLs and the service
levels' rules.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from crawler import frontier, leases, payloads, service_levels
from crawler.dedup import (
    band_values,
    band_values_sql,
    leaves_index,
    leaves_index_sql,
    representative_of,
    representative_of_sql,
)
from crawler.politeness import PolitenessRules, is_backing_off, is_backing_off_sql
from crawler.revisit import PreviousState, RevisitPolicy
from crawler.robots import (
    RobotsState,
    handed_over,
    handed_over_sql,
    observation_reusable,
    observation_reusable_sql,
    rules_in_force,
    rules_in_force_sql,
)
from crawler.scope import DEPTH_BEYOND_SCOPE, Scope
from crawler.status import (
    FetchOutcome,
    HostState,
    is_gone,
    is_gone_sql,
    is_transient,
    is_transient_sql,
    is_unchanged,
    is_unchanged_sql,
    made_request,
    made_request_sql,
)
from crawler.traps import (
    HOST_KNOWN_URL_CAP,
    HOST_NEW_URL_CAP,
    TEMPLATE_NEW_URL_CAP,
    NewUrlTarget,
    TrapRules,
    capped_reasons,
    capped_reasons_sql,
)

STATUSES = [None, 200, 204, 301, 304, 404, 410, 429, 500, 503, 599]
T0 = datetime(2024, 5, 10, tzinfo=UTC)


def _rules(min_delay_s: float, max_crawl_delay_s: float) -> PolitenessRules:
    return PolitenessRules(min_delay_s=min_delay_s, max_crawl_delay_s=max_crawl_delay_s, max_concurrency_per_host=1,
                           backoff_base_s=30.0, max_backoff_s=900.0, max_consecutive_failures=5,
                           backoff_recovery_factor=0.5, response_time_factor=0.0, max_response_time_delay_s=60.0,
                           dead_after_days=7.0)


def test_status_rules_agree(spark):
    cases = [(o.value, s) for o, s in itertools.product(FetchOutcome, STATUSES)]
    frame = spark.createDataFrame(cases, "outcome string, status_code int")
    got = frame.selectExpr("outcome", "status_code", f"{made_request_sql('outcome')} as requested",
                           f"{is_transient_sql('outcome', 'status_code')} as transient",
                           f"{is_gone_sql('outcome', 'status_code')} as gone",
                           f"{is_unchanged_sql('outcome')} as unchanged",
                           f"{leaves_index_sql('outcome', 'status_code')} as leaves").collect()
    assert len(got) == len(cases)
    for row in got:
        assert row.requested == made_request(row.outcome), row
        assert row.transient == is_transient(row.outcome, row.status_code), row
        assert row.gone == is_gone(row.outcome, row.status_code), row
        assert row.unchanged == is_unchanged(row.outcome), row
        assert row.leaves == leaves_index(row.outcome, row.status_code), row


def test_stored_payload_rules_agree(spark):
    """What a result leaves of a URL's stored payload (every outcome, truncated or not, with a digest and a record
    or without, a redirect followed or not), and whether its record's segment keeps it handed out."""
    before = ("sha1:OLD", "http://a.test/old", T0 - timedelta(days=3), "segments/s0/warc/bucket=00001/f.warc.gz")
    cases = [(o.value, truncated, digest, warc, redirect, i)
             for i, (o, truncated, digest, warc, redirect) in enumerate(itertools.product(
                 FetchOutcome, (None, False, True), (None, "sha1:NEW"),
                 (None, "segments/s1/warc/bucket=00002/g.warc.gz"), (None, "http://a.test/final")))]
    frame = spark.createDataFrame([(*case, *before) for case in cases],
                                  "outcome string, truncated boolean, digest string, warc string, redirect string, "
                                  "i int, p_digest string, p_uri string, p_date timestamp, p_file string")
    frame = frame.withColumn("url", F.lit("http://a.test/1")).withColumn("at", F.lit(T0))
    prev = dict(zip(payloads.STORED_COLUMNS, ("p_digest", "p_uri", "p_date", "p_file"), strict=True))
    sql = payloads.stored_after_sql("outcome", "truncated", "digest", "warc", "url", "redirect", "at", prev)
    got = frame.selectExpr("*", *[f"{expr} as n_{name}" for name, expr in sql.items()]).collect()
    assert len(got) == len(cases) > 100
    for row in got:
        expected = payloads.stored_after(row.outcome, row.truncated, row.digest, row.warc, row.url, row.redirect,
                                         T0, payloads.StoredRecord(*before))
        assert (row.n_stored_payload_digest, row.n_stored_target_uri, row.n_stored_warc_date.astimezone(UTC),
                row.n_stored_warc_filename) == dataclasses.astuple(expected), row
    files = [None, "", "segments/s1/warc/bucket=00002/g.warc.gz", "segments/gone/warc/bucket=00002/g.warc.gz",
             "elsewhere/s1/warc/x.warc.gz", "segments/s1/fetched/x.parquet"]
    present = ["s1", "s2"]
    segments = spark.createDataFrame([(s,) for s in present], "p_segment string")
    files_frame = spark.createDataFrame([(i, f) for i, f in enumerate(files)], "i int, f string")
    joined = files_frame.join(segments, F.expr(payloads.record_segment_sql("f")) == F.col("p_segment"), "left")
    got = {r.i: (r.segment, r.in_force) for r in joined.selectExpr(
        "i", f"{payloads.record_segment_sql('f')} as segment",
        f"{payloads.reference_in_force_sql('p_segment')} as in_force").collect()}
    for i, name in enumerate(files):
        assert got[i] == (payloads.record_segment(name), payloads.reference_in_force(name, present)), name


REVISIT = RevisitPolicy(default_interval_s=86_400, min_interval_s=3_600, max_interval_s=2_592_000, changed_factor=0.5,
                        unchanged_factor=1.5, retry_base_s=300, retry_jitter=0.25, max_failures=3,
                        failed_interval_s=604_800, gone_interval_s=1_209_600, robots_denied_interval_s=86_400,
                        sitemap_min_interval_s=900, sitemap_max_interval_s=86_400)


# Factors whose products are not exact in binary (86400 * 0.7 = 60479.99... as a float, which the rule truncates).
@pytest.mark.parametrize("factors", [(0.5, 1.5), (0.7, 1.1)])
def test_revisit_decision_and_index_event_kind_agree(spark, factors):
    """Every outcome and status code against previous states that reach each branch: first, changed, unchanged and
    missing content, clamps at both ends (pages and sitemaps), failure streaks below and at the limit, robots
    expiries known (past and future) and unknown."""
    policy = dataclasses.replace(REVISIT, changed_factor=factors[0], unchanged_factor=factors[1])
    previous = [("unfetched", 86_400, 0, None), ("fetched", 86_400, 0, "h1"), ("fetched", 4_000, 1, "h1"),
                ("retry", 2_000_000, 2, "h1"), ("not_modified", 100, 0, "h1"), ("fetched", 86_400, 1, None)]
    contents = [None, "h1", "h2"]
    robots_waits = [None, -5_000_000, 0, 123_456_789]
    cases = [(o.value, code, *prev, new, wait, sitemap, duplicate, f"{code}{prev}{new}")
             for o, code in itertools.product(FetchOutcome, STATUSES)
             for prev, new, wait, sitemap, duplicate in itertools.product(
                 previous, contents, robots_waits, (False, True), (None, "rep"))
             if o in (FetchOutcome.SUCCESS, FetchOutcome.ROBOTS_DENIED) or (wait is None and new in (None, "h2"))]
    frame = spark.createDataFrame(cases, "outcome string, status_code int, prev_status string, prev_interval long, "
                                         "prev_failures int, prev_hash string, new_hash string, robots_wait_us long, "
                                         "sitemap boolean, duplicate_of string, url_id string")
    decision = policy.decide_sql("outcome", "status_code", "prev_status", "prev_interval", "prev_failures",
                                 "prev_hash", "new_hash", "robots_wait_us", "sitemap", "url_id")
    kind = frontier.index_event_kind_sql("outcome", "status_code", "prev_hash", "new_hash", "duplicate_of",
                                         "case when sitemap then 'robots' end")
    got = frame.selectExpr("*", *[f"{sql} as d_{name}" for name, sql in decision.items()], f"{kind} as kind").collect()
    assert len(got) == len(cases) > 1000
    for row in got:
        robots_expiry = None if row.robots_wait_us is None else T0 + timedelta(microseconds=row.robots_wait_us)
        expected = policy.decide(row.outcome, row.status_code, PreviousState(
            row.prev_status, row.prev_interval, row.prev_failures, row.prev_hash, row.sitemap, row.url_id), T0,
            row.new_hash,
            robots_expiry)
        wait_us = (expected.next_fetch_at - T0) // timedelta(microseconds=1)
        assert (row.d_status, row.d_fetch_interval_s, row.d_wait_us, row.d_failure_count) == (
            expected.status, expected.fetch_interval_s, wait_us, expected.failure_count), row
        assert row.kind == frontier.index_event_kind(row.outcome, row.status_code, row.prev_hash, row.new_hash,
                                                     row.duplicate_of, "robots" if row.sitemap else None), row


def test_an_unknown_outcome_fails_the_revisit_decision_as_in_python(spark):
    decision = REVISIT.decide_sql("outcome", "code", "'fetched'", "86400", "0", "null", "null", "null", "false",
                                  "'u'")
    with pytest.raises(ValueError, match="unknown fetch outcome 'teleported'"):
        REVISIT.decide("teleported", None, PreviousState("fetched", 86_400, 0, None), T0)
    with pytest.raises(Exception, match="unknown fetch outcome teleported"):
        spark.sql(f"select {decision['status']} from values ('teleported', 200) as t(outcome, code)").collect()


@pytest.mark.parametrize("max_hamming", [0, 3, 7])
def test_band_values_agree(spark, max_hamming):
    hashes = [0, 1, -1, 2**63 - 1, -(2**63), 0x5A5A_F0F0_1234_8765, -0x0123_4567_89AB_CDEF]
    frame = spark.createDataFrame([(h,) for h in hashes], "simhash bigint")
    got = [list(r) for r in frame.select(*[F.expr(e) for e in band_values_sql("simhash", max_hamming)]).collect()]
    assert got == band_values(hashes, max_hamming).view("int64").tolist()


def test_politeness_delay_cap_and_score_agree(spark):
    cases = [(0.2, None, 60.0, None), (5.0, 12.0, 60.0, None), (5.0, 600.0, 60.0, None), (1.0, 2.0, 60.0, 9.0),
             (0.0, None, 60.0, None), (0.0, 0.0, 60.0, 7000.0), (5.0, None, 60.0, 0.5)]
    frame = spark.createDataFrame([(i, crawl, host_min) for i, (_, crawl, _, host_min) in enumerate(cases)],
                                  "i int, cd double, hm double")
    for i, (min_delay, crawl, max_crawl, host_min) in enumerate(cases):
        rules = _rules(min_delay, max_crawl)
        sql_delay = rules.host_delay_sql("cd", "hm")
        sql_cap = frontier.per_host_cap_sql(1000, 3600, sql_delay)
        sql_probe = frontier.per_host_cap_sql(1000, 3600, sql_delay, "i >= 0")
        row = frame.where(f"i = {i}").selectExpr(f"{sql_delay} as d", f"{sql_cap} as c", f"{sql_probe} as p").first()
        delay = rules.host_delay(crawl, host_min)
        assert row.d == pytest.approx(delay)
        assert row.c == frontier.per_host_cap(1000, 3600, delay)
        assert row.p == frontier.per_host_cap(1000, 3600, delay, dead=True) == 1
    due = datetime(2024, 5, 1, 6, tzinfo=UTC)
    times = spark.createDataFrame([(1.5, due, T0), (1.5, T0, due)], "p double, due timestamp, now timestamp")
    got = [r.s for r in times.selectExpr(f"{frontier.score_sql('p', 'due', 'now', 0.1)} as s").collect()]
    assert got == pytest.approx([frontier.score(1.5, due, T0, 0.1), 1.5])


def test_lease_rules_agree(spark):
    segment = "seg-b"
    moments = [None, T0 - timedelta(hours=1), T0, T0 + timedelta(hours=1)]
    cases = [(i, nxt, lease, expires, version, url_version, last)
             for i, (nxt, lease, expires, version, url_version, last) in enumerate(itertools.product(
                 moments, [None, "seg-a", segment], moments, [3], [None, 2, 3], [None, "seg-a", segment]))]
    frame = spark.createDataFrame(
        cases, "i int, next_fetch_at timestamp, lease_segment string, lease_expires_at timestamp, "
               "state_version long, url_version long, last_segment string")
    got = frame.withColumn("now", F.lit(T0)).selectExpr(
        "i", f"{leases.is_due_sql('now', segment)} as due",
        f"{leases.leased_version_sql(segment)} as version",
        f"{leases.is_current_sql('state_version', 'url_version')} as current",
        f"{leases.completes_sql('state_version', 'url_version', 'lease_segment', 'last_segment', segment)} as done",
        f"{leases.due_from_sql()} as due_from",
    ).collect()
    by_i = {c[0]: c for c in cases}
    for row in got:
        _, nxt, lease, expires, version, url_version, last = by_i[row.i]
        assert bool(row.due) == leases.is_due(nxt, lease, expires, T0, segment), by_i[row.i]
        assert row.version == leases.leased_version(version, lease, segment)
        assert row.current == leases.is_current(version, url_version)
        assert row.done == leases.completes(version, url_version, lease, last, segment), by_i[row.i]
        expected_from = leases.due_from(nxt, lease, expires)
        assert (row.due_from and row.due_from.replace(tzinfo=UTC)) == expected_from, by_i[row.i]


def test_latest_result_order_agrees(spark):
    """Several results for one (url_id, state_version): the window keeps the row `latest_result` picks."""
    later = T0 + timedelta(seconds=5)
    groups = {
        "a": [(T0, "w1", 10, "success"), (later, "w1", 99, "network_error")],
        "b": [(T0, "w1", 10, "success"), (T0, "w2", 5, "success")],
        "c": [(T0, "w1", 10, "success"), (T0, "w1", 20, "success"), (T0, None, None, "robots_denied")],
        "d": [(T0, None, None, "network_error"), (T0, None, None, "http_error")],
        "e": [(None, "w1", 1, "success"), (T0, "w1", 0, "success")],
    }
    rows = [(key, 1, *result) for key, results in groups.items() for result in results]
    frame = spark.createDataFrame(rows, "url_id string, state_version long, fetched_at timestamp, "
                                        "warc_filename string, warc_offset long, outcome string")
    kept = {r.url_id: (r.fetched_at and r.fetched_at.replace(tzinfo=UTC), r.warc_filename, r.warc_offset, r.outcome)
            for r in frame.selectExpr("*", f"{leases.latest_result_rank_sql()} as n").where("n = 1").collect()}
    columns = ("fetched_at", "warc_filename", "warc_offset", "outcome")
    for key, results in groups.items():
        expected = leases.latest_result([dict(zip(columns, result, strict=True)) for result in results])
        assert kept[key] == tuple(expected[c] for c in columns), key
    assert kept["a"][3] == "network_error"  # the later fetch counts, whatever its outcome


def test_duplicate_verdict_agrees(spark):
    cases = [("u", None, None), ("u", "r", None), ("u", None, "u"), ("u", None, "r"), ("u", "r", "q"), ("u", "r", "u")]
    got = spark.createDataFrame(cases, "url_id string, duplicate_of string, cluster string").selectExpr(
        "url_id", "duplicate_of", "cluster",
        f"{representative_of_sql('url_id', 'duplicate_of', 'cluster')} as rep").collect()
    assert len(got) == len(cases)
    for row in got:
        assert row.rep == representative_of(row.url_id, row.duplicate_of, row.cluster)


def test_discovery_depth_and_priority_agree(spark):
    cases = [(source, origin, depth, priority) for source, origin, depth, priority in itertools.product(
        ["link", "redirect", "sitemap"], [None, "index 1 http://a.test"], [0, 3], [None, 0.5])]
    got = spark.createDataFrame(cases, "source string, origin string, depth int, priority double").selectExpr(
        "source", "origin", "depth", "priority",
        f"{frontier.discovery_depth_sql('source', 'origin', 'depth')} as d",
        f"{frontier.listed_by_sitemap_sql('source', 'origin')} as listed",
        f"{frontier.discovery_priority_sql('origin', 'priority')} as p").collect()
    for row in got:
        assert row.d == frontier.discovery_depth(row.source, row.origin, row.depth)
        assert row.listed == frontier.listed_by_sitemap(row.source, row.origin)
        if not row.listed:  # listed pages take first_schedule of their entry (a UDF of the Python form)
            assert row.p == frontier.discovery_priority(row.source, row.origin, row.priority)


def test_host_state_agrees(spark):
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    rules = _rules(1.0, 60.0)
    span = timedelta(days=rules.dead_after_days)
    moments = (None, now - timedelta(seconds=1), now, now + timedelta(hours=1))
    cases = [(state, until, since) for state in (None, *(s.value for s in RobotsState)) for until in moments
             for since in (None, now - span, now - span + timedelta(microseconds=1), now - 2 * span)]
    frame = spark.createDataFrame(cases, "robots_state string, backoff_until timestamp, failing_since timestamp")
    at = f"timestamp'{now.strftime('%Y-%m-%d %H:%M:%S')}'"
    got = frame.selectExpr("robots_state", "backoff_until", "failing_since", rules.host_state_sql(
        "robots_state", "backoff_until", "failing_since", at) + " as state").collect()
    assert len(got) == len(cases)

    def aware(moment: datetime | None) -> datetime | None:
        return moment.replace(tzinfo=UTC) if moment else None

    for row in got:
        assert row.state == rules.host_state(row.robots_state, aware(row.backoff_until), aware(row.failing_since),
                                             now), row
    assert {row.state for row in got} == {s.value for s in HostState}


def test_refresh_quota_agrees(spark):
    cases = [(100, 0.45, r, d) for r, d in itertools.product((0, 10, 45, 60, 100, 5000), (0, 20, 55, 100, 5000))]
    cases += [(7, 0.5, 3, 9), (7, 0.5, 9, 3), (1, 0.0, 5, 5), (1, 1.0, 5, 5), (10, 1.0, 0, 4)]
    frame = spark.createDataFrame([(i, r, d) for i, (_, _, r, d) in enumerate(cases)], "i int, r long, d long")
    for i, (budget, share, refresh, discovery) in enumerate(cases):
        sql_refresh, sql_discovery = frontier.refresh_quota_sql(budget, share, "r", "d")
        row = frame.where(f"i = {i}").selectExpr(f"{sql_refresh} as a", f"{sql_discovery} as b").first()
        expected = frontier.refresh_quota(budget, share, refresh, discovery)
        assert (row.a, row.b) == expected, cases[i]
        assert sum(expected) == min(budget, refresh + discovery)  # a side's unused quota goes to the other


@pytest.mark.parametrize("budgets", [
    frontier.DomainBudgets(40, (("wikipedia.org", 2000), ("*.blogspot.com", 5), ("a_b?.org", 7), ("100%.net", 1))),
    frontier.DomainBudgets(0, (("hot.*", 90),)),
    frontier.DomainBudgets(12),
    frontier.DomainBudgets(0),
])
def test_domain_budget_agrees(spark, budgets):
    domains = ["wikipedia.org", "WikiPedia.org", "en.wikipedia.org", "x.blogspot.com", "blogspot.com", "a_b1.org",
               "axb1.org", "a_b12.org", "100%.net", "1000.net", "hot.test", "hot", "example.co.uk", "127.0.0.1",
               "[::1]", "o'brien.ie"]
    got = spark.createDataFrame([(d,) for d in domains], "domain string").selectExpr(
        "domain", f"{budgets.cap_sql('domain')} as cap").collect()
    assert {row.domain: row.cap for row in got} == {d: budgets.cap(d) for d in domains}


def test_daily_domain_budget_rules_agree(spark):
    segment, midnight, now = "seg-b", T0, T0 + timedelta(hours=15)
    moments = [None, midnight - timedelta(seconds=1), midnight, now - timedelta(seconds=1), now,
               now + timedelta(hours=1)]
    cases = list(itertools.product(moments, [None, "seg-a", segment], moments))
    frame = spark.createDataFrame([(i, *case) for i, case in enumerate(cases)],
                                  "i int, last_fetch_at timestamp, lease_segment string, lease_expires_at timestamp")
    got = frame.withColumn("now", F.lit(now)).withColumn("day_start", F.lit(midnight)).selectExpr(
        "i", f"{frontier.spends_the_day_sql('day_start', 'now', segment)} as spends").collect()
    for row in got:
        last, lease, expires = cases[row.i]
        assert row.spends == frontier.spends_the_day(last, lease, expires, midnight, now, segment), cases[row.i]
    assert {row.spends for row in got} == {True, False}

    caps = list(itertools.product([None, 0, 40], [None, 0, 30, 100], [0, 30, 75, 130]))
    frame = spark.createDataFrame(caps, "s long, d long, spent long")
    got = frame.selectExpr("s", "d", "spent", f"{frontier.domain_cap_sql('s', 'd', 'spent')} as cap").collect()
    assert [(r.s, r.d, r.spent, r.cap) for r in got] == [(*c, frontier.domain_cap(*c)) for c in caps]


def test_backing_off_agrees_and_ends_at_backoff_until(spark):
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    moments = [None, now - timedelta(hours=1), now - timedelta(microseconds=1), now, now + timedelta(microseconds=1),
               now + timedelta(hours=1)]
    frame = spark.createDataFrame([(i, until) for i, until in enumerate(moments)], "i int, backoff_until timestamp")
    got = {row.i: row.off for row in frame.withColumn("now", F.lit(now)).selectExpr(
        "i", f"{is_backing_off_sql('backoff_until', 'now')} as off").collect()}
    assert got == {i: is_backing_off(until, now) for i, until in enumerate(moments)}
    assert got[moments.index(now)] is False  # at backoff_until itself the backoff is over, in both forms
    assert [got[i] for i in range(len(moments))] == [False, False, False, False, True, True]


ROBOTS_NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
ROBOTS_EXPIRIES = [None, ROBOTS_NOW - timedelta(hours=1), ROBOTS_NOW, ROBOTS_NOW + timedelta(microseconds=1)]


def _robots_sql_per_case(spark, cases: list[tuple], first_column: str, sql: str) -> dict[int, bool]:
    """The `sql` twin over (first_column, robots_expires_at) cases at ROBOTS_NOW (`now`), by case index."""
    frame = spark.createDataFrame([(i, *case) for i, case in enumerate(cases)],
                                  f"i int, {first_column}, robots_expires_at timestamp")
    return {row.i: row.got for row in frame.withColumn("now", F.lit(ROBOTS_NOW)).selectExpr(
        "i", f"{sql} as got").collect()}


def test_robots_rules_in_force_agree(spark):
    cases = list(itertools.product([None, *(s.value for s in RobotsState)], ROBOTS_EXPIRIES))
    got = _robots_sql_per_case(spark, cases, "robots_state string",
                               rules_in_force_sql("robots_state", "robots_expires_at", "now"))
    assert got == {i: rules_in_force(state, expires, ROBOTS_NOW) for i, (state, expires) in enumerate(cases)}
    assert [cases[i] for i, in_force in got.items() if in_force] == [(RobotsState.RULES.value,
                                                                      ROBOTS_NOW + timedelta(microseconds=1))]


def test_robots_observation_reusable_agrees(spark):
    cases = list(itertools.product([None, 199, 200, 301, 404, 429, 499, 500, 503, 600], ROBOTS_EXPIRIES))
    got = _robots_sql_per_case(spark, cases, "robots_status_code int",
                               observation_reusable_sql("robots_status_code", "robots_expires_at", "now"))
    assert got == {i: observation_reusable(status, expires, ROBOTS_NOW) for i, (status, expires) in enumerate(cases)}
    assert sorted(cases[i][0] for i, reusable in got.items() if reusable) == [200, 301, 404, 499]


def test_robots_handed_over_agrees(spark):
    hour = timedelta(hours=1)
    cases = [case for case in itertools.product(
        [None, 200, 404, 503], ["b", None], [None, ROBOTS_NOW - hour], [None, ROBOTS_NOW - hour, ROBOTS_NOW + hour],
        [None, 200], [None, ROBOTS_NOW - 48 * hour]) if (case[4] is None) == (case[5] is None)]
    frame = spark.createDataFrame([(i, *case) for i, case in enumerate(cases)],
                                  "i int, sc int, body string, fa timestamp, ea timestamp, gsc int, ga timestamp")
    sql = handed_over_sql("sc", "body", "fa", "ea", "gsc", "ga", "now")
    got = {row.i: None if row.got is None else tuple(row.got)
           for row in frame.withColumn("now", F.lit(ROBOTS_NOW)).selectExpr("i", f"{sql} as got").collect()}
    expected = {i: handed_over(*case, ROBOTS_NOW) for i, case in enumerate(cases)}
    def aware(moment: datetime | None) -> datetime | None:  # collected naive, in this process's time zone
        return None if moment is None else moment.astimezone(UTC)

    assert {i: None if v is None else (v[0], v[1], aware(v[2]), aware(v[3])) for i, v in got.items()} == expected
    assert sum(v is not None for v in expected.values()) > len(cases) // 3


def test_segment_order_agrees(spark):
    """Sorting and a window's row numbers by the SQL key give the order the Python key gives, ties included."""
    rows = [(rank, score, url_id) for rank in (1, 2, 10) for score in (0.0, 0.5, 1.5, 12.25)
            for url_id in ("0a", "0b", "f1")]
    random.Random(5).shuffle(rows)
    frame = spark.createDataFrame([(i % 3, *row) for i, row in enumerate(rows)],
                                  "domain int, rank int, score double, url_id string")
    order = F.expr(frontier.segment_order_sql("rank", "score", "url_id"))
    assert [tuple(r) for r in frame.orderBy(order).select("rank", "score", "url_id").collect()] == sorted(
        rows, key=lambda r: frontier.segment_order(*r))
    assert sorted(rows, key=lambda r: frontier.segment_order(*r))[:3] == [(1, 12.25, "0a"), (1, 12.25, "0b"),
                                                                        (1, 12.25, "f1")]
    numbered = frame.withColumn("n", F.expr(
        f"row_number() over (partition by domain order by {frontier.segment_order_sql('rank', 'score', 'url_id')})"))
    for domain in range(3):
        mine = sorted((row for i, row in enumerate(rows) if i % 3 == domain), key=lambda r: frontier.segment_order(*r))
        got = numbered.where(f"domain = {domain}").orderBy("n").select("rank", "score", "url_id").collect()
        assert [tuple(r) for r in got] == mine


def test_host_order_agrees(spark):
    """A host's rank by the SQL key is its place in the Python order: the higher score first, ties by url_id."""
    rows = [(host, score, url_id) for host in ("a", "b") for score in (0.0, 0.5, 12.25) for url_id in ("0a", "f1")]
    random.Random(7).shuffle(rows)
    frame = spark.createDataFrame(rows, "host string, score double, url_id string").withColumn("rank", F.expr(
        f"row_number() over (partition by host order by {frontier.host_order_sql('score', 'url_id')})"))
    got = {(r.host, r.score, r.url_id): r.rank for r in frame.collect()}
    for host in ("a", "b"):
        mine = sorted((r for r in rows if r[0] == host), key=lambda r: frontier.host_order(r[1], r[2]))
        assert [got[r] for r in mine] == list(range(1, len(mine) + 1))
    first_of_a = sorted((r for r in rows if r[0] == "a"), key=lambda r: frontier.host_order(r[1], r[2]))[:2]
    assert first_of_a == [("a", 12.25, "0a"), ("a", 12.25, "f1")]


@pytest.mark.parametrize("max_depth", [0, 3])
def test_depth_scope_agrees(spark, max_depth):
    scope = Scope(schemes=("http", "https"), host_suffixes=(), max_url_length=2048, max_depth=max_depth)
    depths = [None, 0, 1, 2, 3, 4, 40]
    got = {row.depth: row.reason for row in spark.createDataFrame([(d,) for d in depths], "depth int").selectExpr(
        "depth", f"{scope.depth_reject_reason_sql('depth')} as reason").collect()}
    assert got == {d: scope.depth_reject_reason(d) for d in depths}
    assert {d for d, reason in got.items() if reason == DEPTH_BEYOND_SCOPE} == {
        d for d in depths if d is not None and d > max_depth}


def _new_url_targets() -> list[NewUrlTarget]:
    """Three hosts' discoveries of one segment: runaway templates, depth ties, known URLs, rejected ones, a host
    with little room left under the known-URL cap and one with none."""
    pick = random.Random(11)
    allowance = {"http://a.test": 100, "http://b.test": 4, "http://c.test": 0}
    targets = []
    for n in range(90):
        host = pick.choice(sorted(allowance))
        template = pick.choice(["/cal/{n}", "/p/{n}", "/tag/{id}", "/"])
        url = f"{host}{template.replace('{n}', str(n)).replace('{id}', f'{n:x}')}/{n}"
        known = pick.random() < 0.15  # a known URL has no reason: discover never rejects one
        targets.append(NewUrlTarget(
            host_key=host, template=host + template, depth=pick.choice([1, 1, 2, 3]),
            url_id=pick.choice(["00", "7f", "ff"]) + f"{n:030x}", url=url, allowance=allowance[host], known=known,
            reason="repeated path segment" if not known and pick.random() < 0.1 else None))
    return targets


@pytest.mark.parametrize(("per_template", "per_host"), [(3, 8), (1, 100), (100, 2), (100, 100)])
def test_new_url_caps_agree(spark, per_template, per_host):
    rules = TrapRules(max_url_length=2048, max_path_depth=16, max_segment_repeats=3, max_query_params=20,
                      max_new_urls_per_host_per_cycle=per_host, max_new_urls_per_template_per_cycle=per_template,
                      max_known_urls_per_host=100)
    targets = _new_url_targets()
    frame = spark.createDataFrame(
        [(t.host_key, t.template, t.depth, t.url_id, t.url, t.allowance, t.known, t.reason) for t in targets],
        "host_key string, template string, depth int, url_id string, url string, allowance bigint, known boolean, "
        "reason string")
    for capped in capped_reasons_sql(rules, "allowance"):
        frame = frame.withColumn("reason", F.expr(capped))
    got = {row.url: row.reason for row in frame.select("url", "reason").collect()}
    expected = dict(zip((t.url for t in targets), capped_reasons(targets, rules), strict=True))
    assert got == expected
    assert {url for url, reason in expected.items() if reason is None} >= {t.url for t in targets if t.known}
    caps = set(expected.values()) & {TEMPLATE_NEW_URL_CAP, HOST_NEW_URL_CAP, HOST_KNOWN_URL_CAP}
    assert caps == ({TEMPLATE_NEW_URL_CAP} if per_template < 100 else set()) | (
        {HOST_NEW_URL_CAP} if per_host < 100 else set()) | {HOST_KNOWN_URL_CAP}


def test_new_url_caps_keep_the_shallowest_then_by_key():
    """The Python form's own cut, by hand: what the windows keep."""
    rules = TrapRules(max_url_length=2048, max_path_depth=16, max_segment_repeats=3, max_query_params=20,
                      max_new_urls_per_host_per_cycle=3, max_new_urls_per_template_per_cycle=2,
                      max_known_urls_per_host=100)

    def target(url_id: str, template: str, depth: int, **more) -> NewUrlTarget:
        return NewUrlTarget("http://a.test", template, depth, url_id, f"http://a.test/{url_id}", 2 if
                            more.pop("tight", False) else 50, **more)

    loose = [target("e", "t1", 2), target("d", "t1", 1), target("c", "t1", 1), target("b", "t2", 3),
             target("a", "t2", 3), target("k", "t1", 0, known=True), target("r", "t2", 0, reason="url too long"),
             target("f", "t3", 5)]
    assert capped_reasons(loose, rules) == [TEMPLATE_NEW_URL_CAP, None, None, HOST_NEW_URL_CAP, None, None,
                                            "url too long", HOST_NEW_URL_CAP]
    tight = [target("b", "t1", 1, tight=True), target("a", "t2", 1, tight=True), target("c", "t3", 0, tight=True)]
    assert capped_reasons(tight, rules) == [HOST_KNOWN_URL_CAP, None, None]


def test_service_level_rules_agree(spark):
    """crawler/service_levels.py: high priority, due since, eligibility, lease outcome and lag per case, and the
    nearest-rank percentile as Spark's percentile_disc over the same values (nulls left out)."""
    moments = [T0 - timedelta(seconds=s) for s in (0, 599, 600, 601, 7200)]
    cases = [(i, priority, due, leased, state, rank, cap)
             for i, (priority, due, leased, state, (rank, cap)) in enumerate(itertools.product(
                 [0.5, 1.0, 2.0], moments, [None, T0], [s.value for s in HostState], [(0, 1), (1, 1), (2, 5)]))]
    frame = spark.createDataFrame(cases, "i int, priority double, due timestamp, leased timestamp, state string, "
                                         "rank int, cap int")
    got = frame.withColumn("now", F.lit(T0)).withColumn("known", F.lit(T0 - timedelta(seconds=600))).selectExpr(
        "i", f"{service_levels.is_high_priority_sql('priority', 1.0)} as high",
        f"{service_levels.due_since_sql('due', 'known')} as since",
        f"{service_levels.is_eligible_sql('state', 'rank', 'cap')} as eligible",
        f"{service_levels.lease_outcome_sql('due', 'leased', 'now', 600.0)} as outcome",
        f"{service_levels.lag_s_sql('now', 'due')} as lag").collect()
    assert len(got) == len(cases)
    for row in got:
        _, priority, due, leased, state, rank, cap = cases[row.i]
        assert row.high == service_levels.is_high_priority(priority, 1.0), row
        assert row.since.replace(tzinfo=UTC) == service_levels.due_since(due, T0 - timedelta(seconds=600)), row
        assert row.eligible == service_levels.is_eligible(state, rank, cap), row
        assert row.outcome == service_levels.lease_outcome(due, leased, T0, 600.0).value, row
        assert row.lag == service_levels.lag_s(T0, due), row
    rng = random.Random(7)
    values = [rng.uniform(0, 100) for _ in range(201)] + [None, None]
    lags = spark.createDataFrame([(v,) for v in values], "lag double")
    for fraction in (0.0, 0.01, 0.5, 0.9, 0.99, 1.0):
        [row] = lags.selectExpr(f"{service_levels.percentile_sql('lag', fraction)} as p").collect()
        assert row.p == service_levels.percentile([v for v in values if v is not None], fraction), fraction
