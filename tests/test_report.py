"""The cycle report: aggregates of a small hand-built segment on real Delta tables (gaps with known values, one
under the delay), the HTML page (parses, one <svg> per chart, attacker host names escaped), the terminal summary,
`crawl report` in-process, and the rendering alone without Spark."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from crawler import report as render
from crawler.errors import UnknownSegment, UserError
from crawler.report import GAP_EDGES_S, HostStats, ReportData, bin_index
from jobs import cli
from jobs import report as report_job
from tests.support.config import SPARK_CLI_SETTINGS
from tests.support.tables import append_rows

SEG, OTHER = "seg-r1", "seg-r0"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
A, B, EVIL = "http://a.test", "http://b.test", "http://<script>alert(1)</script>.test"
CHARTS_PER_REPORT = 8  # outcomes, top hosts, all-host gaps, response times, sizes, new URLs, host states, due backlog
#                        (+ one per top host)

# (host, seconds after T0, elapsed_ms, outcome, status_code, content_length)
FETCHES = [
    (A, 0.0, 100, "success", 200, 500),
    (A, 1.6, 300, "success", 200, 20_000),        # gap 1.6 - 0.1 = 1.5
    (A, 2.3, 50, "http_error", 404, 100),         # gap 2.3 - 1.9 = 0.4: under A's Crawl-delay of 1 s
    (A, 2.5, None, "robots_denied", None, None),  # no request: no gap
    (A, 5.0, 2000, "network_error", None, None),  # gap 5.0 - 2.35 = 2.65
    (B, 0.0, 20, "redirect", 301, 0),
    (B, 0.5, 600, "success", 200, 2_000_000),     # gap 0.48, truncated
    (B, 1.25, 12_000, "http_error", 503, 50),     # gap 0.15: under the 0.2 s minimum delay
    (B, 2.0, None, "robots_denied", None, None),
    (EVIL, 0.0, 10, "success", 200, 2048),
    (EVIL, 10.0, 10, "success", 200, 2048),       # gap 9.99
]
GAPS = {A: [1.5, 0.4, 2.65], B: [0.48, 0.15], EVIL: [9.99]}
ADDRESSES = {A: "192.0.2.7", B: "192.0.2.7", EVIL: "192.0.2.9"}  # A and B: two names on one server


def _bins(values: list[float]) -> list[int]:
    counts = [0] * (len(GAP_EDGES_S) + 1)
    for value in values:
        counts[bin_index(value, GAP_EDGES_S)] += 1
    return counts


@pytest.fixture(scope="module")
def crawled(spark, new_tables_root, tmp_path_factory) -> str:
    root = new_tables_root(tmp_path_factory.mktemp("report") / "root")
    fetches = [{"segment_id": SEG, "url_id": f"u{i}", "url": f"{host}/{i}", "host_key": host,
                "fetched_at": T0 + timedelta(seconds=at), "elapsed_ms": elapsed, "outcome": outcome,
                "status_code": code, "content_length": length, "truncated": length == 2_000_000,
                "remote_ip": ADDRESSES[host] if code is not None else None}
               for i, (host, at, elapsed, outcome, code, length) in enumerate(FETCHES)]
    # Another segment's fetch 50 ms after A's first one must not make a gap in this segment.
    fetches.append({"segment_id": OTHER, "url_id": "o1", "url": A + "/o", "host_key": A,
                    "fetched_at": T0 + timedelta(seconds=0.05), "elapsed_ms": 5, "outcome": "success",
                    "status_code": 200, "content_length": 1})
    append_rows(spark, root, "fetches", fetches)
    append_rows(spark, root, "hosts", [
        {"host_key": A, "crawl_delay_s": 1.0, "discovery_segment": SEG, "trap_rejections": {"depth": 4, "path": 2}},
        {"host_key": B, "discovery_segment": SEG, "trap_rejections": {"depth": 1}},
        {"host_key": "http://old.test", "discovery_segment": OTHER, "trap_rejections": {"depth": 9}},
        # One host per other state (crawler.politeness.host_state), counted when the report is built.
        {"host_key": "http://dead.test", "failing_since": datetime(2020, 1, 1, tzinfo=UTC)},
        {"host_key": "http://slow.test", "backoff_until": datetime(2999, 1, 1, tzinfo=UTC)},
        {"host_key": "http://norobots.test", "robots_state": "disallow_all"},
    ])
    append_rows(spark, root, "cycle_metrics", [
        {"segment_id": OTHER, "step": "generate", "run_at": T0 - timedelta(hours=1), "due_urls": 40,
         "hot_domains": [{"domain": "big.test", "due": 30, "leased": 3}]},
        {"segment_id": SEG, "step": "generate", "run_at": T0, "due_urls": 30, "oldest_due_age_s": 7200.0,
         "due_high_priority": 12, "high_priority_not_leased": 2, "leased_urls": 11, "unmerged_segments": 1,
         "hot_domains": [{"domain": "big.test", "due": 20, "leased": 5}, {"domain": "a.test", "due": 8, "leased": 6}],
         "hp_eligible": 12, "hp_leased_within": 9, "hp_leased_late": 0, "hp_waiting_late": 1,
         "hp_lease_lag_p99_s": 310.0, "lease_share_within": 0.9},
        {"segment_id": SEG, "step": "update", "run_at": T0 + timedelta(minutes=5), "results": 11, "applied": 8,
         "stale": 3, "new_urls": 5, "refetched": 4, "changed": 1, "change_rate": 0.25, "discovery_pages": 4,
         "discovery_durable_p50_s": 20.0, "discovery_durable_p99_s": 41.5},
    ])
    append_rows(spark, root, "segments", [
        {"segment_id": SEG, "bucket": 0, "state": "merged", "results": 5, "applied": 4, "stale": 1,
         "discovered": 3, "counters": {"x": 2}},
        {"segment_id": SEG, "bucket": 1, "state": "merged", "results": 6, "applied": 4, "stale": 2,
         "discovered": 1, "counters": {"x": 1, "y": 5}},
        {"segment_id": OTHER, "bucket": 0, "state": "merged", "results": 9, "stale": 9, "counters": {"x": 100}},
    ])
    append_rows(spark, root, "pages", [
        {"url_id": "p1", "url": "p1", "segment_id": SEG, "near_duplicate_cluster": "p1"},  # a representative
        {"url_id": "p2", "url": "p2", "segment_id": SEG, "duplicate_of": "p1", "near_duplicate_cluster": "p1"},
        {"url_id": "p3", "url": "p3", "segment_id": SEG, "near_duplicate_cluster": "p1"},
        {"url_id": "p4", "url": "p4", "segment_id": SEG, "sitemap_urls": 7, "sitemap_refused": {"off_host": 2}},
        {"url_id": "p5", "url": "p5", "segment_id": SEG, "parse_error": "boom"},
        {"url_id": "p6", "url": "p6", "segment_id": OTHER, "duplicate_of": "p1", "sitemap_urls": 3},
    ])
    append_rows(spark, root, "urls", [
        {"url_id": f"n{i}", "url": f"n{i}", "host_key": A, "source": source, "discovered_in": segment}
        for i, (source, segment) in enumerate([("link", SEG), ("link", SEG), ("link", SEG), ("redirect", SEG),
                                                ("sitemap", SEG), ("link", OTHER), ("seed", None)])
    ])
    return root


@pytest.fixture(scope="module")
def data(spark, base_conf, crawled) -> ReportData:
    return report_job.build(spark, base_conf, crawled, SEG)


def test_gaps_per_host_and_under_the_delay(data):
    assert [(h.host_key, h.fetches, h.robots_denied, h.gaps, h.under_delay, h.delay_s) for h in data.top_hosts] == [
        (A, 5, 1, 3, 1, 1.0), (B, 4, 1, 2, 1, 0.2), (EVIL, 2, 0, 1, 0, 0.2)]
    for host in data.top_hosts:
        assert host.gap_bins == _bins(GAPS[host.host_key]), host.host_key
        assert host.min_gap_s == pytest.approx(min(GAPS[host.host_key]))
    assert data.gap_bins == [0, 0, 1, 2, 0, 1, 1, 1, 0, 0, 0] == _bins(sum(GAPS.values(), []))
    assert (data.gaps, data.under_delay, data.min_gap_s) == (6, 2, pytest.approx(0.15))
    assert [(h.host_key, h.under_delay) for h in data.under_delay_hosts] == [(A, 1), (B, 1)]


def test_outcomes_times_sizes_and_other_tables(data):
    assert (data.fetches, data.hosts) == (11, 3)
    assert data.outcomes == {"success": 5, "http_error": 2, "robots_denied": 2, "network_error": 1, "redirect": 1}
    assert data.elapsed_bins == [0, 3, 0, 1, 1, 1, 1, 1, 0, 0, 1]
    assert data.bytes_bins == [4, 2, 1, 0, 1, 0]
    assert (data.bytes_total, data.truncated) == (2_024_746, 1)
    assert data.elapsed_p50_ms == 100 and data.elapsed_p95_ms == 12_000
    assert data.robots_denied_hosts == [(A, 1), (B, 1)]
    assert data.shared_addresses == [("192.0.2.7", 2, 6), ("192.0.2.9", 1, 2)]  # (address, names, requests)
    assert [(b["bucket"], b["stale"]) for b in data.buckets] == [(0, 1), (1, 2)]
    assert data.counters == {"x": 3, "y": 5}
    assert data.new_urls == {"link": 3, "redirect": 1, "sitemap": 1}
    assert (data.pages, data.exact_duplicates, data.near_duplicates, data.parse_errors) == (5, 1, 1, 1)
    assert (data.sitemaps, data.sitemap_urls, data.sitemap_refused) == (1, 7, {"off_host": 2})
    assert data.trap_hosts == [(A, {"depth": 4, "path": 2}), (B, {"depth": 1})]
    assert data.trap_reasons == {"depth": 5, "path": 2}


def test_host_states_now_and_the_recent_frontier_figures(data):
    assert data.host_states == {"ok": 3, "dead": 1, "backing_off": 1, "robots_unreachable": 1}
    assert [(row["segment_id"], row["step"]) for row in data.frontier] == [
        (OTHER, "generate"), (SEG, "generate"), (SEG, "update")]
    assert data.figures("generate")["high_priority_not_leased"] == 2 and data.figures("update")["stale"] == 3
    summary = render.terminal_summary(data)
    assert ("frontier:        30 due when generated, oldest due 2.0 h; 12 high-priority due, 2 of them not leased; "
            "1 other segments not merged") in summary
    assert "change:          5 new URLs; 1 of 4 refetched pages changed (25%)" in summary
    assert "host states:     ok=3, backing_off=1, dead=1, robots_unreachable=1" in summary


def test_both_service_levels_with_their_targets_and_verdicts(data):
    """Discovery met (p99 41.5 s against 60 s), leases missed (9 of 10 decided in time against 99 %): in the summary,
    and per segment on the page (the older segment has a generate row without figures: not measured)."""
    summary = render.terminal_summary(data).splitlines()
    assert summary[1] == ("discovery SLO:   p99 42 s, p50 20 s fetch -> durable over 4 pages with outlinks; "
                          "target p99 <= 60 s: MET")
    assert summary[2] == ("lease SLO:       9 of 10 eligible high-priority URLs leased in time (90%; 0 leased late, "
                          "1 waiting past), p99 due -> lease 310 s; target >= 99% within 600 s: MISSED")
    assert render.service_level_rows(data) == [
        (OTHER, "-", "-", "-", "-", "0", "not measured"), (SEG, "42 s", "4", "MET", "90%", "10", "MISSED")]
    text = " ".join(_parse(render.render_html(data)).text)
    assert "This segment: leases: 9 of 10 eligible high-priority URLs leased within 600 s (90.0 %)" in text


def test_hot_domains_with_what_this_cycle_and_earlier_ones_took(data):
    assert render.hot_domain_rows(data) == [("big.test", 20, 5, "25.0%", "10.0%"), ("a.test", 8, 6, "75.0%", "-")]
    assert ("hot domains:     big.test 5 of 20 due (25.0%); a.test 6 of 8 due (75.0%)"
            in render.terminal_summary(data))


class _Page(HTMLParser):
    """Tags seen and the text, to check the page parses and what it shows."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.open: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in ("meta", "rect", "br"):
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open.pop() == tag, f"</{tag}> does not close the last open tag"

    def handle_data(self, data):
        self.text.append(data)


def _parse(html_text: str) -> _Page:
    page = _Page()
    page.feed(html_text)
    page.close()
    assert page.open == []
    return page


def test_report_page_parses_has_its_charts_and_escapes_hosts(spark, base_conf, crawled):
    path = report_job.run(spark, base_conf, crawled, SEG)
    assert str(path) == os.path.join(crawled, "reports", f"{SEG}.html")
    page = _parse(Path(path).read_text(encoding="utf-8"))
    assert page.tags.count("svg") == CHARTS_PER_REPORT + 3
    assert "script" not in page.tags
    text = "".join(page.text)
    assert EVIL in text  # shown, as text
    assert "daemon's clock" in text and "cumulative, hosts touched by this segment" in text


def test_cli_prints_the_summary_and_the_path(crawled, tmp_path, capsys):
    out = tmp_path / "r.html"
    # The configured minimum delay (5 s by default) is what "under the delay" is measured against.
    assert cli.main(["report", "--root", crawled, "--segment", SEG, "--out", str(out), *SPARK_CLI_SETTINGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"segment:         {SEG}: 11 fetches from 3 hosts"
    assert lines[1].startswith("discovery SLO:") and lines[2].startswith("lease SLO:")
    assert lines[4].startswith("politeness:      6 gaps, 5 under the delay (min_delay_s 5)")
    assert lines[-1] == f"report: {out}"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_reports_of_several_segments_at_once_are_each_segments_own(spark, base_conf, crawled, data):
    """What `crawl demo` builds at its end: one set of jobs for every merged segment, each report the one `build`
    gives alone (OTHER's fetch 50 ms after A's first makes no gap in either)."""
    both = report_job.build_many(spark, base_conf, crawled, [OTHER, SEG])
    assert list(both) == [OTHER, SEG]
    assert both[SEG] == replace(data, host_states=both[SEG].host_states)  # host states are counted as it runs
    other = both[OTHER]
    assert (other.fetches, other.hosts, other.gaps, other.min_gap_s, other.outcomes) == (1, 1, 0, None,
                                                                                       {"success": 1})
    assert [(h.host_key, h.fetches, h.gaps) for h in other.top_hosts] == [(A, 1, 0)]
    assert (other.new_urls, other.trap_hosts, other.counters) == ({"link": 1}, [("http://old.test", {"depth": 9})],
                                                                  {"x": 100})
    assert (other.pages, other.exact_duplicates, other.sitemap_urls) == (1, 1, 3)
    with pytest.raises(UnknownSegment):
        report_job.build_many(spark, base_conf, crawled, [SEG, "seg-typo"])


def test_a_segment_without_fetches_is_an_error(spark, base_conf, tables_root):
    root = tables_root
    with pytest.raises(UnknownSegment, match=r"^unknown segment 'seg-none' under .* \(no segment exists there yet\)$"):
        report_job.build(spark, base_conf, root, "seg-none")
    append_rows(spark, root, "segments", [{"segment_id": "seg-empty", "bucket": 0, "state": "generated"}])
    with pytest.raises(UserError, match="^segment seg-empty has no fetches$"):
        report_job.build(spark, base_conf, root, "seg-empty")
    with pytest.raises(UnknownSegment, match=r"\(segments there: seg-empty\)$"):
        report_job.build(spark, base_conf, root, "seg-typo")
    with pytest.raises(ValueError, match="invalid segment id"):
        report_job.build(spark, base_conf, root, "../x")


# --- rendering alone --------------------------------------------------------------------------------------------

def sample(**changes) -> ReportData:
    host = HostStats(A, fetches=3, robots_denied=1, delay_s=0.2, gaps=2, under_delay=1, min_gap_s=0.05,
                     gap_bins=_bins([0.05, 1.5]))
    values = dict(
        segment_id="seg-x", min_delay_s=0.2, fetches=4, hosts=1, outcomes={"success": 3, "robots_denied": 1},
        top_hosts=[host], gaps=2, under_delay=1, min_gap_s=0.05, gap_bins=_bins([0.05, 1.5]), under_delay_hosts=[host],
        elapsed_bins=[0, 1, 2] + [0] * 8, elapsed_p50_ms=30.0, elapsed_p95_ms=48.0, bytes_bins=[3, 0, 0, 0, 0, 0],
        bytes_total=1500, truncated=0,
        buckets=[{"bucket": 0, "state": "merged", "results": 3, "applied": 2, "stale": 1, "discovered": 2}],
        counters={}, new_urls={"link": 2}, pages=3, exact_duplicates=1, near_duplicates=0, parse_errors=0,
        sitemaps=0, sitemap_urls=0, sitemap_refused={}, robots_denied_hosts=[(A, 1)],
        trap_hosts=[(A, {"depth": 2})], trap_reasons={"depth": 2})
    values.update(changes)
    return ReportData(**values)


def test_terminal_summary_reads_at_a_glance():
    assert render.terminal_summary(sample()).splitlines() == [
        "segment:         seg-x: 4 fetches from 1 hosts",
        "outcomes:        success=3, robots_denied=1",
        "politeness:      2 gaps, 1 under the delay (min_delay_s 0.2), smallest 0.050 s [daemon clock]",
        "response time:   p50 30 ms, p95 48 ms",
        "bytes:           1.50 kB, 0 truncated",
        "revisits:        0 not modified (304), 0 identical payload (stored once)",
        "update:          3 results, 2 applied, 1 stale, 2 discovered",
        "new URLs:        2 (link=2)",
        "pages:           3, 1 duplicates (1 exact, 0 near), 0 sitemaps, 0 parse errors",
        "robots denied:   1 on 1 hosts",
        "trap rejections: 2 on 1 hosts (cumulative) (depth=2)",
        "host states:     -",
    ]


def test_terminal_summary_counts_the_two_kinds_of_revisit_apart():
    lines = render.terminal_summary(sample(outcomes={"success": 1, "not_modified": 2, "identical_payload": 3}))
    assert "revisits:        2 not modified (304), 3 identical payload (stored once)" in lines.splitlines()


def test_every_crawl_string_is_escaped():
    hostile = '"><script>alert(1)</script>'
    host = HostStats(hostile, fetches=1, gap_bins=_bins([]))
    page = render.render_html(sample(
        segment_id="seg-x", top_hosts=[host], under_delay_hosts=[host], outcomes={hostile: 1},
        robots_denied_hosts=[(hostile, 1)], shared_addresses=[(hostile, 2, 3)], trap_hosts=[(hostile, {hostile: 1})],
        trap_reasons={hostile: 1},
        new_urls={hostile: 1}, sitemap_refused={hostile: 1}, counters={hostile: 1}, host_states={hostile: 1},
        frontier=[{"segment_id": hostile, "step": "generate", "due_urls": 3},
                  {"segment_id": "seg-x", "step": "generate", "due_urls": 3, "oldest_due_age_s": None,
                   "due_high_priority": 0, "high_priority_not_leased": 0, "unmerged_segments": 0,
                   "hot_domains": [{"domain": hostile, "due": 3, "leased": 1}]}]))
    parsed = _parse(page)
    assert "script" not in parsed.tags
    assert hostile in "".join(parsed.text)
    assert parsed.tags.count("svg") == CHARTS_PER_REPORT + 1


def test_histogram_draws_one_bar_per_bin_and_marks_bins_under_the_delay():
    labels = render.bin_labels(GAP_EDGES_S, " s")
    assert labels[:3] == ["<0 s", "0-0.1 s", "0.1-0.25 s"] and labels[-1] == ">=60 s"
    assert len(labels) == len(GAP_EDGES_S) + 1
    assert render.bins_under(0.2) == 2 and render.bins_under(1.0) == 5 and render.bins_under(-1) == 0
    svg = render.histogram_svg("t", labels, _bins([0.05, 0.3, 0.3, 70]), warn_bins=2)
    assert svg.count("<rect") == len(labels)
    assert svg.count(render.WARN) == 2
    assert [bin_index(v, GAP_EDGES_S) for v in (-0.1, 0.0, 0.1, 59.9, 60)] == [0, 1, 2, 9, 10]


def test_empty_bar_chart_is_a_note_not_an_empty_svg():
    assert render.bar_chart_svg("new URLs", []) == '<p class="note">new URLs: none</p>'
    svg = render.bar_chart_svg("hosts", [("a", 4), ("b", 2)])
    assert svg.count("<rect") == 2 and ">4<" in svg and ">2<" in svg
