"""Crawler traps end to end, read from the shared crawl (`tests/support/crawl.py`): an infinite calendar
and an unbounded faceted search in the farm stay bounded by the trap rules, while ordinary large hosts are not cut
below the known-URL cap.

Real farm on loopback, real daemon, real Spark + Delta; caps small enough that the second cycle takes every trap
to its cap and the later ones show it stays there. Every seed host also gets a /sitemap.xml probe (404 on these
hosts), which is one of its known URLs. Judged from the `urls` and `hosts` tables and from the farm's own
request log.
"""

from __future__ import annotations

from collections import Counter

import pytest

from crawler.sitemaps import probe_url
from crawler.traps import HOST_KNOWN_URL_CAP, TEMPLATE_NEW_URL_CAP, url_template
from crawler.urls import canonicalize, host_key
from delta_tables import table_df
from sitefarm.server import SiteFarm
from sitefarm.sites import PROBE_PATH
from sitefarm.traps import CALENDAR_HOST, FACETS_HOST
from tests.support.crawl import CYCLES, FARM, KNOWN_URL_CAP, TEMPLATE_CAP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CAP = KNOWN_URL_CAP
LARGE, SMALL_LARGE = FARM.large_host_pages  # 307 pages (> CAP) and 63 pages (< CAP)


@pytest.fixture(scope="module")
def crawled(spark, shared_crawl):
    """The tables and log of the shared crawl as these tests read them."""
    root = str(shared_crawl.root)
    urls = [row.asDict() for row in table_df(spark, root, "urls").select(
        "url", "host_key", "discovered_in").collect()]
    hosts = {row["host_key"]: row.asDict() for row in table_df(spark, root, "hosts").select(
        "host_key", "known_urls", "trap_rejections", "trap_sample").collect()}
    return {"root": root, "conf": shared_crawl.conf, "farm": shared_crawl.farm, "log": shared_crawl.log,
            "reports": shared_crawl.reports, "urls": urls, "hosts": hosts}


def key_of(farm: SiteFarm, name: str) -> str:
    return f"http://{name}:{farm.port}"


def rows_of(crawled, name: str) -> list[dict]:
    key = key_of(crawled["farm"], name)
    return [row for row in crawled["urls"] if row["host_key"] == key]


def test_every_cycle_fetched_something(crawled):
    assert [bool(report.segment_id) for report in crawled["reports"]] == [True] * CYCLES


@pytest.mark.parametrize("name", [CALENDAR_HOST, FACETS_HOST])
def test_trap_host_is_held_at_the_known_url_cap(crawled, name):
    """The trap fills its allowance and then stops growing: exactly CAP rows, none added by the last cycle,
    and the URLs it kept offering were counted under the known-URL cap, not stored."""
    rows = rows_of(crawled, name)
    host = crawled["hosts"][key_of(crawled["farm"], name)]
    assert len(rows) == CAP
    assert host["known_urls"] == CAP
    last_segment = crawled["reports"][-1].segment_id
    assert not [row for row in rows if row["discovered_in"] == last_segment]
    rejections = host["trap_rejections"]
    assert rejections.get(HOST_KNOWN_URL_CAP, 0) > 0, rejections
    assert set(rejections) <= {HOST_KNOWN_URL_CAP, TEMPLATE_NEW_URL_CAP}, rejections
    assert host["trap_sample"] and all(host_key(url) == key_of(crawled["farm"], name) for url in host["trap_sample"])
    assert not set(host["trap_sample"]) & {row["url"] for row in rows}  # a sample is of rejected URLs


def test_the_calendar_grows_at_most_one_template_cap_per_template_and_cycle(crawled):
    """Its 24 month pages lead to 700+ day and 100+ week pages in one cycle; each template adds at most
    TEMPLATE_CAP of them per cycle and the rest are counted under the template cap."""
    rows = rows_of(crawled, CALENDAR_HOST)
    per_cycle = Counter((row["discovered_in"], url_template(row["url"])) for row in rows)
    assert max(per_cycle.values()) <= TEMPLATE_CAP
    base = key_of(crawled["farm"], CALENDAR_HOST)
    templates = {template for _, template in per_cycle}
    assert {base + "/calendar/{n}/{n}/{n}", base + "/calendar/{n}/w{n}", base + "/calendar/{n}/{n}"} <= templates
    assert crawled["hosts"][base]["trap_rejections"][TEMPLATE_NEW_URL_CAP] > 500


@pytest.mark.parametrize("name", [CALENDAR_HOST, FACETS_HOST])
def test_the_crawler_requests_only_what_it_kept(crawled, name):
    """Requests to a trap host (from the farm's log) are its robots.txt, its sitemap probe (a 404 here) and at most
    one per kept URL, and every one of them was a real page: the bound is the crawler's, not the site running
    out."""
    header = f"{name}:{crawled['farm'].port}"
    requests = [record for record in crawled["log"] if record["host"] == header]
    assert [r["path"] for r in requests].count("/robots.txt") == 1 and requests[0]["path"] == "/robots.txt"
    [probe] = [record for record in requests if record["path"] == PROBE_PATH]
    assert probe["status"] == 404
    pages = [record for record in requests if record["path"] not in ("/robots.txt", PROBE_PATH)]
    assert 60 < len(pages) < CAP  # the probe is one of the CAP known URLs
    assert len({record["path"] for record in pages}) == len(pages)
    assert all(record["status"] == 200 for record in pages)
    kept = {row["url"] for row in rows_of(crawled, name)}
    assert {canonicalize(f"http://{header}{record['path']}") for record in pages} <= kept


def test_large_host_is_cut_at_its_cap_not_below(crawled):
    """307 ordinary pages: the host holds exactly CAP of them, all real pages of the site."""
    farm = crawled["farm"]
    name = farm.large_host_names()[0]
    pages = {url for url in farm.page_urls() if host_key(url) == key_of(farm, name)}
    assert len(pages) > CAP
    rows = rows_of(crawled, name)
    assert len(rows) == CAP
    assert {row["url"] for row in rows} <= pages | {probe_url(key_of(farm, name))}
    assert crawled["hosts"][key_of(farm, name)]["known_urls"] == CAP
    assert crawled["hosts"][key_of(farm, name)]["trap_rejections"].get(HOST_KNOWN_URL_CAP, 0) > 0


def test_large_host_under_the_cap_is_fully_known(crawled):
    """63 pages, 50 articles in the first topic's template: the template cap delays ten of them by a cycle (they
    are rediscovered from the topic's other articles), and in the end every page is known and nothing else."""
    farm = crawled["farm"]
    name = farm.large_host_names()[1]
    pages = {url for url in farm.page_urls() if host_key(url) == key_of(farm, name)}
    assert len(pages) == 1 + 2 + SMALL_LARGE < CAP
    known = pages | {probe_url(key_of(farm, name))}
    assert {row["url"] for row in rows_of(crawled, name)} == known
    host = crawled["hosts"][key_of(farm, name)]
    assert host["known_urls"] == len(known)
    assert host["trap_rejections"].get(TEMPLATE_NEW_URL_CAP, 0) > 0
    assert HOST_KNOWN_URL_CAP not in (host["trap_rejections"] or {})
