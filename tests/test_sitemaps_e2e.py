"""Sitemaps end to end, read from the shared crawl (`tests/support/crawl.py`): discovered from robots.txt `Sitemap:`
lines and the /sitemap.xml probe, fetched by the daemon through the politeness gates, parsed by the parse job, and
folded into `urls` by update with their first schedule. Judged from the farm's own request log and the tables.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, timedelta

import pytest
from pyspark.sql import functions as F

from crawler.sitemaps import SITEMAP_FILE_PRIORITY, ChangeFreq, SitemapEntry, first_schedule
from crawler.urls import canonicalize, host_key
from delta_tables import table_df
from sitefarm.judge import requested_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def crawled(shared_crawl):
    """What the sitemap tests read of the shared crawl (four cycles: probe and robots.txt -> index -> children ->
    listed pages reach everything a sitemap lists)."""
    farm, conf = shared_crawl.farm, shared_crawl.conf
    assert conf.sitemaps.probe_default_location and conf.sitemaps.from_robots
    sitemap_urls = farm.sitemap_urls()
    return {"root": str(shared_crawl.root), "conf": conf, "farm": farm, "log": shared_crawl.log,
            "requested": set(map(requested_url, shared_crawl.log)), "reports": shared_crawl.reports,
            "inject": shared_crawl.inject, "sitemap_urls": sitemap_urls,
            "entries": {url: farm.sitemap_entries(url) for url in sitemap_urls},
            "expected": farm.expected_fetches_sitemaps_only(conf.crawl.robots_token),
            "never": farm.out_of_scope_sitemap_urls() | farm.disallowed_urls(conf.crawl.robots_token),
            "orphans": farm.orphan_urls()}


def _rows(spark, root: str, table: str) -> dict[str, object]:
    return {r["url"]: r for r in table_df(spark, root, table).collect()}


def test_probe_added_for_every_seed_host(crawled):
    seeds_hosts = {host_key(u) for u in crawled["farm"].seed_urls()}
    assert crawled["inject"].probes == len(seeds_hosts)
    assert {h + "/sitemap.xml" for h in seeds_hosts} <= crawled["requested"]


def test_every_sitemap_and_listed_page_fetched_and_nothing_out_of_scope(crawled):
    expected, requested = crawled["expected"], crawled["requested"]
    assert crawled["orphans"] and crawled["orphans"] <= expected  # only a sitemap leads to these
    assert {u for u, via in crawled["sitemap_urls"].items() if via == "index"}, "the farm has index children"
    assert expected - requested == set()
    assert crawled["never"] & requested == set()


def test_sitemap_files_stored_with_their_origin(spark, crawled):
    rows = _rows(spark, crawled["root"], "urls")
    for url, via in crawled["sitemap_urls"].items():
        row = rows[url]
        assert row.sitemap_origin is not None and row.sitemap_origin.split(" ")[0] == via, url
        assert row.depth == 0 and row.source == "sitemap"
        if via == "robots":
            assert row.sitemap_origin == f"robots 0 {host_key(url)}"
        elif via == "index":
            assert row.sitemap_origin == f"index 1 {host_key(url)}"
    # Fetched once, each has a sitemap's first interval (crawler/revisit.py), not a page's.
    fetched = [rows[url] for url in crawled["sitemap_urls"] if rows[url].status == "fetched"]
    assert fetched and {r.fetch_interval_s for r in fetched} == {crawled["conf"].revisit.sitemap_min_interval_s}
    assert all(r.next_fetch_at == r.last_fetch_at + timedelta(seconds=r.fetch_interval_s) for r in fetched)
    # A 404 probe is a sitemap that is gone, revisited rarely like any 404.
    missing = [r for u, r in rows.items() if u.endswith("/sitemap.xml") and u not in crawled["sitemap_urls"]]
    assert missing and all(r.status == "gone" and r.sitemap_origin == "probe 0" for r in missing)


def test_listed_pages_get_their_first_schedule(spark, crawled):
    root = crawled["root"]
    rows = _rows(spark, root, "urls")
    fetched_at = {r["url"]: r["fetched_at"] for r in table_df(spark, root, "fetches").groupBy("url").agg(
        F.min("fetched_at").alias("fetched_at")).collect()}
    listed_by: dict[str, list[tuple[str, dict]]] = {}
    for sitemap, entries in crawled["entries"].items():
        for entry in entries:
            with contextlib.suppress(ValueError):
                listed_by.setdefault(canonicalize(entry["loc"]), []).append((sitemap, entry))
    checked = 0
    for orphan in crawled["orphans"]:
        (sitemap, entry), = listed_by[orphan]
        row = rows[orphan]
        assert (row.source, row.depth, row.discovered_in is not None) == ("sitemap", 0, True)
        changefreq = ChangeFreq(entry["changefreq"]) if entry["changefreq"] else None
        # Spark hands back naive local times; the farm's lastmod is UTC.
        expected = first_schedule(SitemapEntry(orphan, entry["lastmod"], changefreq, entry["priority"]),
                                  fetched_at[sitemap].astimezone(UTC))[0]
        assert row.priority == pytest.approx(expected), orphan
        checked += 1
    assert checked >= 6
    assert len({round(rows[o].priority, 6) for o in crawled["orphans"]}) > 1, "priorities follow the entries"
    assert all(r.priority == SITEMAP_FILE_PRIORITY for u, r in rows.items() if u in crawled["sitemap_urls"])


def test_sitemap_pages_rows_count_refusals_and_no_index_events(spark, crawled):
    root = crawled["root"]
    pages = table_df(spark, root, "pages")
    sitemap_pages = {r["url"]: r for r in pages.where(F.col("sitemap_urls").isNotNull()).collect()}
    assert set(sitemap_pages) == set(crawled["sitemap_urls"])
    urlsets = [p for p in sitemap_pages.values() if "sitemaps/index.xml" not in p.url]
    assert urlsets
    refused = {}
    for page in urlsets:
        for reason, count in (page.sitemap_refused or {}).items():
            refused[reason] = refused.get(reason, 0) + count
        assert page.simhash is None and page.parse_error is None
    assert refused.get("invalid loc", 0) >= 1 and refused.get("outside sitemap scope", 0) >= 1
    html_pages = pages.where(F.col("sitemap_urls").isNull()).count()
    assert html_pages > 0
    events = {r["url"] for r in table_df(spark, root, "index_events").collect()}
    assert events and not events & set(crawled["sitemap_urls"])
    assert not {u for u in events if u.endswith("/sitemap.xml")}
