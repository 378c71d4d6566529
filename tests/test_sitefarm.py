"""The site farm serves the right virtual host, logs every request itself, has the promised link graph and
robots variants; the politeness judge finds both kinds of violation and none in a polite log."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import threading
import time
from collections import Counter, deque
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from selectolax.lexbor import LexborHTMLParser

from crawler.robots import RobotsPolicy
from crawler.sitemaps import ChangeFreq, FoundVia, SitemapEntry, SitemapOrigin, SitemapResult, parse_sitemap
from crawler.urls import canonicalize, host_key, resolve
from sitefarm.judge import politeness_violations
from sitefarm.resources import SITEMAP_DATE, SITEMAP_NS
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import MALFORMED_LOC, FarmSpec

TOKEN = "cyclecrawl"
UA = "cyclecrawl/0.1 (+https://cyclecrawl.invalid/bot)"
LOG_FIELDS = {"host", "path", "start", "end", "status", "user_agent"}


@pytest.fixture(scope="module")
def farm(tmp_path_factory) -> SiteFarm:
    """The default farm (24 hosts x 60 pages), shared by the read-only graph and serving tests."""
    site_farm = SiteFarm(FarmSpec(latency_s=0.0), tmp_path_factory.mktemp("farm") / "requests.jsonl")
    site_farm.start()
    yield site_farm
    site_farm.stop()


def get(farm: SiteFarm, host: str, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request to the farm with the given Host header (host name without port gets the farm port)."""
    connection = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=10)
    try:
        host_header = host if ":" in host else f"{host}:{farm.port}"
        connection.request(method, path, headers={"Host": host_header, "User-Agent": UA})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def title_of(body: bytes) -> str:
    return LexborHTMLParser(body.decode("utf-8")).css_first("title").text()


def path_of(url: str) -> str:
    return url[len(host_key(url)):]


# ---- serving -------------------------------------------------------------------------------------------


def test_virtual_hosts_are_chosen_by_the_host_header(farm: SiteFarm) -> None:
    for name in farm.host_names()[:3]:
        status, headers, body = get(farm, name, "/")
        assert status == 200
        assert headers["content-type"] == "text/html; charset=utf-8"
        assert title_of(body) == f"{name} home"
    status, _, body = get(farm, "site-001.farm.test", "/section/1/page-7.html")
    assert status == 200 and title_of(body) == "site-001.farm.test page 7"
    assert 1000 <= len(body) <= 3500


def test_unknown_hosts_and_paths_are_404(farm: SiteFarm) -> None:
    assert get(farm, "nobody.farm.test", "/")[0] == 404
    assert get(farm, "site-000.farm.test", "/no/such/page.html")[0] == 404
    assert get(farm, "site-000.farm.test", "/section/0/page-1.html")[0] == 404  # page 1 lives in section 1
    assert get(farm, "site-000.farm.test", "/search?q=other")[0] == 404


def test_redirect_page(farm: SiteFarm) -> None:
    status, headers, _ = get(farm, "site-000.farm.test", "/old/page-0.html")
    assert status == 301
    assert headers["location"] == "/section/0/page-0.html"
    url = farm.seed_urls()[0] + "old/page-0.html"
    assert farm.links_of(url) == [farm.seed_urls()[0] + "section/0/page-0.html"]
    assert get(farm, "site-001.farm.test", "/old/page-0.html")[0] == 404  # only even hosts have one


def test_robots_txt_served_as_declared(farm: SiteFarm) -> None:
    for name in farm.host_names()[:8]:
        status, headers, body = get(farm, name, "/robots.txt")
        expected = farm.robots_txt(name)
        if expected is None:
            assert status == 404
        else:
            assert status == 200
            assert headers["content-type"].startswith("text/plain")
            assert body.decode("utf-8") == expected


def test_served_html_links_are_the_ground_truth_graph(farm: SiteFarm) -> None:
    """A correct parser (selectolax + urls.resolve) finds exactly links_of() in every sampled page."""
    sample = [url for url in sorted(farm.page_urls()) if "/old/" not in url][::37]
    assert len(sample) > 30
    for url in sample:
        status, _, body = get(farm, url.split("://")[1].split("/")[0], path_of(url))
        assert status == 200, url
        hrefs = [node.attributes.get("href") for node in LexborHTMLParser(body.decode()).css("a[href]")]
        parsed = list(dict.fromkeys(link for link in (resolve(url, h) for h in hrefs) if link is not None))
        assert parsed == farm.links_of(url), url


def test_every_request_is_logged_with_its_fields(tmp_path: Path) -> None:
    log_path = tmp_path / "log.jsonl"
    with SiteFarm(FarmSpec(hosts=4, pages_per_host=12), log_path) as small:
        requests = [("site-000.farm.test", "/"), ("site-002.farm.test", "/robots.txt"),
                    ("site-001.farm.test", "/nothing"), ("site-003.farm.test", "/search?q=farm&page=1")]
        before = time.time()
        statuses = [get(small, host, path)[0] for host, path in requests]
        after = time.time()
        port = small.port
    log = read_request_log(log_path)
    assert statuses == [200, 404, 404, 200]
    assert len(log) == len(requests)
    for record, (host, path), status in zip(log, requests, statuses, strict=True):
        assert record.keys() >= LOG_FIELDS
        assert record["host"] == f"{host}:{port}"
        assert record["path"] == path
        assert record["status"] == status
        assert record["user_agent"] == UA
        assert before <= record["start"] <= record["end"] <= after


def test_many_concurrent_requests_are_all_served_and_logged(tmp_path: Path) -> None:
    log_path = tmp_path / "log.jsonl"
    total = 400

    async def blast(small: SiteFarm) -> list[int]:
        urls = [(name, f"/section/{k % 2}/page-{k}.html") for name in small.host_names() for k in range(10)]
        jobs = (urls * (total // len(urls) + 1))[:total]
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def one(name: str, path: str) -> int:
                async with session.get(f"http://127.0.0.1:{small.port}{path}",
                                       headers={"Host": f"{name}:{small.port}"}) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(one(name, path) for name, path in jobs))

    with SiteFarm(FarmSpec(hosts=6, pages_per_host=20, latency_s=0.0), log_path) as small:
        statuses = asyncio.run(blast(small))
    assert statuses == [200] * total
    log = read_request_log(log_path)
    assert len(log) == total
    assert all(record.keys() >= LOG_FIELDS for record in log)


def test_stop_is_idempotent_and_closes_the_port(tmp_path: Path) -> None:
    small = SiteFarm(FarmSpec(hosts=2, pages_per_host=5), tmp_path / "log.jsonl")
    small.start()
    port = small.port
    assert get(small, "site-000.farm.test", "/")[0] == 200
    small.stop()
    small.stop()
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()


def test_urls_need_a_started_farm(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        SiteFarm(FarmSpec(), tmp_path / "log.jsonl").seed_urls()


def test_content_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    def home_and_page(seed: int, name: str) -> list[bytes]:
        with SiteFarm(FarmSpec(hosts=3, pages_per_host=10, seed=seed), tmp_path / f"{name}.jsonl") as one:
            port = str(one.port).encode()
            paths = ("/", "/section/0/page-3.html")
            return [get(one, "site-001.farm.test", path)[2].replace(port, b"PORT") for path in paths]

    assert home_and_page(7, "a") == home_and_page(7, "b")
    assert home_and_page(7, "c") != home_and_page(8, "d")


# ---- graph and robots ground truth ---------------------------------------------------------------------


def test_seeds_static_hosts_and_canonical_urls(farm: SiteFarm) -> None:
    names = farm.host_names()
    assert len(names) == 24 and names[0] == "site-000.farm.test"
    assert farm.static_hosts() == {name: "127.0.0.1" for name in names}
    assert farm.seed_urls()[3] == f"http://site-003.farm.test:{farm.port}/"
    assert all(canonicalize(url) == url for url in farm.page_urls())
    assert all(canonicalize(link) == link for url in farm.page_urls() for link in farm.links_of(url))


def test_link_forms_are_mixed(farm: SiteFarm) -> None:
    status, _, body = get(farm, "site-001.farm.test", "/")
    hrefs = [node.attributes["href"] for node in LexborHTMLParser(body.decode()).css("a[href]")]
    assert any(h.startswith("mailto:") for h in hrefs)
    assert any(h.startswith("javascript:") for h in hrefs)
    assert any(h.startswith("#") for h in hrefs)
    assert any("?" in h for h in hrefs)
    assert any(h.startswith("http://outside.example") for h in hrefs)
    assert any(h.startswith("http://site-002.farm.test") for h in hrefs)  # cross-host
    _, _, body = get(farm, "site-001.farm.test", "/section/2/")
    section_hrefs = [node.attributes["href"] for node in LexborHTMLParser(body.decode()).css("a[href]")]
    assert any(h.startswith("../") for h in section_hrefs)
    assert any(h.startswith("./") and "#" in h for h in section_hrefs)
    assert any(h.startswith("http://") for h in section_hrefs)
    assert any(not h.startswith(("/", ".", "#", "http")) for h in section_hrefs)


def test_every_allowed_page_is_within_two_hops_of_its_home(farm: SiteFarm) -> None:
    for name, seed in zip(farm.host_names(), farm.seed_urls(), strict=True):
        body = farm.robots_txt(name)
        policy = RobotsPolicy.parse(body, TOKEN) if body is not None else RobotsPolicy.allow_all()
        depth = {seed: 0}
        queue = deque([seed])
        while queue:
            url = queue.popleft()
            for link in farm.links_of(url):
                if host_key(link) == host_key(seed) and link not in depth:
                    depth[link] = depth[url] + 1
                    queue.append(link)
        own_pages = {url for url in farm.page_urls() if host_key(url) == host_key(seed) and policy.allowed(url)}
        assert own_pages <= depth.keys(), name
        assert max(depth[url] for url in own_pages) == 2


def test_expected_fetches(farm: SiteFarm) -> None:
    everything = farm.expected_fetches(TOKEN, 2)
    disallowed = farm.disallowed_urls(TOKEN)
    assert farm.expected_fetches(TOKEN, 0) == set(farm.seed_urls())
    depth_one = farm.expected_fetches(TOKEN, 1)
    assert set(farm.seed_urls()) < depth_one < everything
    assert everything == farm.page_urls() - disallowed
    assert everything.isdisjoint(disallowed)
    assert all(host_key(url) in farm.host_keys() for url in everything)
    assert not any("outside.example" in url for url in everything)
    # the graph does link out of the farm: expected_fetches dropped those links
    assert any("outside.example" in link for url in everything for link in farm.links_of(url))


def test_robots_variants(farm: SiteFarm) -> None:
    names = farm.host_names()
    base = {name: f"http://{name}:{farm.port}" for name in names}
    assert farm.robots_txt(names[2]) is None  # 404: allow all
    assert base[names[2]] + "/private/secret-1.html" in farm.expected_fetches(TOKEN, 1)
    disallowed = farm.disallowed_urls(TOKEN)
    # Allow exception inside a disallowed folder
    assert base[names[1]] + "/private/secret-1.html" in disallowed
    assert base[names[1]] + "/private/open.html" not in disallowed
    assert base[names[1]] + "/private/open.html" in farm.expected_fetches(TOKEN, 1)
    assert base[names[0]] + "/cgi-bin/search?q=1" in disallowed
    assert base[names[7]] + "/section/0/page-0.html?print=1" in disallowed
    # Crawl-delay on exactly one host
    assert farm.crawl_delay(names[3]) == 0.5
    assert [name for name in names if farm.crawl_delay(name)] == [names[3]]
    assert farm.politeness_delay(f"{names[3]}:{farm.port}", 0.2) == 0.5
    assert farm.politeness_delay(f"{names[4]}:{farm.port}", 0.2) == 0.2
    # a group for another agent shuts that agent out of every cgi host
    other = farm.expected_fetches("otherbot", 2)
    assert not any(host_key(url) == base[names[0]] for url in other)
    assert any(host_key(url) == base[names[1]] for url in other)


def test_no_cross_host_links_when_disabled(tmp_path: Path) -> None:
    with SiteFarm(FarmSpec(hosts=4, pages_per_host=30, cross_host_links=False), tmp_path / "log.jsonl") as small:
        for url in small.page_urls():
            assert all(host_key(link) == host_key(url) or "outside.example" in link for link in small.links_of(url))


# ---- politeness judge ----------------------------------------------------------------------------------


def entry(host: str, start: float, end: float, path: str = "/") -> dict:
    return {"host": host, "path": path, "start": start, "end": end, "status": 200, "user_agent": UA}


def test_judge_finds_nothing_in_a_polite_log() -> None:
    log = [entry("a:1", t, t + 0.25) for t in (0.0, 1.25, 2.5, 4.0)]  # 1 s or more from each end to the next start
    log += [entry("b:1", t, t + 0.5) for t in (0.25, 1.75, 3.25)]  # interleaved with host a: independent
    assert politeness_violations(log, lambda host: 1.0) == []


def test_judge_finds_concurrency() -> None:
    log = [entry("a:1", 0.0, 5.0, "/long"), entry("a:1", 6.0, 6.2, "/b"), entry("a:1", 7.0, 7.1, "/c")]
    log.append(entry("a:1", 2.0, 2.1, "/inside"))  # starts while /long is in flight
    log.append(entry("a:1", 3.0, 3.1, "/inside-too"))  # /inside ended, but /long still has not
    violations = politeness_violations(log, lambda host: 0.0)
    assert [(v["kind"], v["path"]) for v in violations] == [("concurrent", "/inside"), ("concurrent", "/inside-too")]
    assert violations[1]["previous_path"] == "/long"


def test_judge_finds_starts_too_close() -> None:
    log = [entry("a:1", 0.0, 0.1), entry("a:1", 0.9, 1.0, "/early"), entry("b:1", 0.0, 0.1)]
    log.append(entry("b:1", 0.5, 0.6, "/slow-host"))
    delays = {"a:1": 1.0, "b:1": 0.4}
    violations = politeness_violations(log, delays.__getitem__)
    assert [(v["kind"], v["host"], v["path"]) for v in violations] == [("too_soon", "a:1", "/early")]
    assert violations[0]["gap_s"] == pytest.approx(0.8)  # from the end of the previous request
    assert violations[0]["required_s"] == 1.0
    assert politeness_violations(log, delays.__getitem__, tolerance_s=0.25) == []


def test_judge_counts_the_delay_from_the_end_of_the_previous_request() -> None:
    """Starts 1.5 s apart satisfy a 1 s delay start to start, but the first request took 0.8 s: from its end to the
    next start is only 0.7 s, which the daemon promises never to do."""
    log = [entry("a:1", 0.0, 0.8, "/slow"), entry("a:1", 1.5, 1.6, "/next"), entry("a:1", 2.6, 2.7, "/polite")]
    violations = politeness_violations(log, lambda host: 1.0)
    assert [(v["kind"], v["path"], v["previous_path"]) for v in violations] == [("too_soon", "/next", "/slow")]
    assert violations[0]["gap_s"] == pytest.approx(0.7)


def test_judge_measures_from_the_latest_end_of_any_earlier_request() -> None:
    """After an overlap (reported once, as concurrent), the next request is measured from the end of the one that
    ended last, not from the start of its predecessor."""
    log = [entry("a:1", 0.0, 3.0, "/long"), entry("a:1", 1.0, 1.1, "/inside"), entry("a:1", 3.5, 3.6, "/after")]
    violations = politeness_violations(log, lambda host: 1.0)
    assert [(v["kind"], v["path"]) for v in violations] == [("concurrent", "/inside"), ("too_soon", "/after")]
    assert violations[1]["previous_path"] == "/long" and violations[1]["gap_s"] == pytest.approx(0.5)


def test_judge_on_the_real_server_log(tmp_path: Path) -> None:
    """Two simultaneous requests to one host, then one right after, are caught from the server's own log; spaced
    ones are not."""
    log_path = tmp_path / "log.jsonl"
    with SiteFarm(FarmSpec(hosts=2, pages_per_host=5, latency_s=0.2), log_path) as small:
        threads = [threading.Thread(target=get, args=(small, "site-000.farm.test", p)) for p in ("/", "/section/0/")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        get(small, "site-000.farm.test", "/robots.txt")  # at once after both ended: too soon
        for path in ("/", "/robots.txt"):
            get(small, "site-001.farm.test", path)
            time.sleep(0.3)
        port = small.port
    log = read_request_log(log_path)
    violations = politeness_violations(log, lambda host: 0.3)
    assert {v["host"] for v in violations} == {f"site-000.farm.test:{port}"}
    assert sorted((v["kind"], v["path"]) for v in violations)[-1] == ("too_soon", "/robots.txt")
    assert {v["kind"] for v in violations} == {"concurrent", "too_soon"}


# ---- trap hosts and large hosts (opt-in) ---------------------------------------------------------------

CALENDAR = "calendar.farm.test"
FACETS_NAME = "facets.farm.test"


@pytest.fixture(scope="module")
def extra_farm(tmp_path_factory) -> SiteFarm:
    """Two small ordinary sites plus both trap hosts and two large hosts (400 and 100 articles)."""
    spec = FarmSpec(hosts=2, pages_per_host=10, latency_s=0.0, trap_hosts=True, large_host_pages=(400, 100))
    site_farm = SiteFarm(spec, tmp_path_factory.mktemp("extra") / "requests.jsonl")
    site_farm.start()
    yield site_farm
    site_farm.stop()


def parsed_links(url: str, body: bytes) -> list[str]:
    hrefs = [node.attributes.get("href") for node in LexborHTMLParser(body.decode()).css("a[href]")]
    return list(dict.fromkeys(link for link in (resolve(url, h) for h in hrefs) if link is not None))


def test_extra_hosts_are_off_by_default_and_leave_the_sites_unchanged(farm: SiteFarm, extra_farm: SiteFarm) -> None:
    assert all(name.startswith("site-") for name in farm.host_names())
    assert farm.trap_host_names() == [] and farm.large_host_names() == []
    assert extra_farm.host_names() == ["site-000.farm.test", "site-001.farm.test", CALENDAR, FACETS_NAME,
                                       "large-0.farm.test", "large-1.farm.test"]
    assert set(extra_farm.static_hosts()) == set(extra_farm.host_names())
    assert len(extra_farm.seed_urls()) == 6
    with SiteFarm(FarmSpec(hosts=2, pages_per_host=10, latency_s=0.0), farm.log_path.with_name("plain.jsonl")) as plain:
        for name in plain.host_names():
            for path in ("/", "/section/1/page-3.html", "/robots.txt"):
                assert get(plain, name, path)[2].replace(str(plain.port).encode(), b"P") == get(
                    extra_farm, name, path)[2].replace(str(extra_farm.port).encode(), b"P")
        plain_paths = {path_of(url) + host_key(url).split(":")[1] for url in plain.page_urls()}
    site_urls = {url for url in extra_farm.page_urls() if "//site-" in url}
    assert {path_of(url) + host_key(url).split(":")[1] for url in site_urls} == plain_paths


def test_calendar_answers_every_valid_date_on_the_fly(extra_farm: SiteFarm) -> None:
    cases = {
        "/calendar/2026/11": (200, "calendar 2026-11"),
        "/calendar/2026/11/30": (200, "calendar 2026-11-30"),
        "/calendar/2931/02/28": (200, "calendar 2931-02-28"),  # nobody precomputed this one
        "/calendar/0001/01/01": (200, "calendar 0001-01-01"),
        "/calendar/2028/02/29": (200, "calendar 2028-02-29"),
        "/calendar/2026/w48": (200, "calendar 2026-w48"),
        "/calendar/2026/w53": (200, "calendar 2026-w53"),  # 2026 has 53 ISO weeks
        "/calendar/2027/w53": (404, None),
        "/calendar/2026/w8": (404, None),
        "/calendar/2931/02/29": (404, None),  # not a leap year
        "/calendar/2026/13": (404, None),
        "/calendar/2026/1": (404, None),  # one spelling per date
        "/calendar/10000/01": (404, None),
        "/calendar/2026/11?view=day": (404, None),
        "/calendar/": (404, None),
    }
    for path, (status, title) in cases.items():
        got_status, _, body = get(extra_farm, CALENDAR, path)
        assert got_status == status, path
        if title:
            assert title_of(body) == title
    base = f"http://{CALENDAR}:{extra_farm.port}"
    month = [path_of(link) for link in extra_farm.links_of(base + "/calendar/2026/11")]
    assert month[:3] == ["/", "/calendar/2026/10", "/calendar/2026/12"]
    assert month[3:9] == [f"/calendar/2026/w{week}" for week in range(44, 50)]  # Nov 1 is a Sunday, Nov 30 a Monday
    assert month[9:] == [f"/calendar/2026/11/{day:02d}" for day in range(1, 31)]
    week = [path_of(link) for link in extra_farm.links_of(base + "/calendar/2026/w53")]
    assert week == ["/", "/calendar/2026/w52", "/calendar/2027/w01", "/calendar/2026/12/28", "/calendar/2026/12/29",
                    "/calendar/2026/12/30", "/calendar/2026/12/31", "/calendar/2027/01/01", "/calendar/2027/01/02",
                    "/calendar/2027/01/03"]
    day = [path_of(link) for link in extra_farm.links_of(base + "/calendar/2026/12/31")]
    assert day == ["/", "/calendar/2026/12", "/calendar/2026/w53", "/calendar/2026/12/30", "/calendar/2027/01/01"]
    first = [path_of(link) for link in extra_farm.links_of(base + "/calendar/0001/01/01")]
    assert first == ["/", "/calendar/0001/01", "/calendar/0001/w01", "/calendar/0001/01/02"]  # the calendar's start


def test_faceted_search_answers_every_filter_set_on_the_fly(extra_farm: SiteFarm) -> None:
    ok = ["/search", "/search?color=red", "/search?color=red&size=m&brand=acme&sort=new&page=987654"]
    bad = ["/search?size=m&color=red", "/search?color=red&color=blue", "/search?color=purple", "/search?page=1",
           "/search?page=0", "/search?page=02", "/search?q=x", "/search/?color=red", "/search?color=red&"]
    for path in ok:
        assert get(extra_farm, FACETS_NAME, path)[0] == 200, path
    for path in bad:
        assert get(extra_farm, FACETS_NAME, path)[0] == 404, path
    base = f"http://{FACETS_NAME}:{extra_farm.port}"
    links = {path_of(link) for link in extra_farm.links_of(base + "/search?color=red&page=2")}
    assert "/search?color=red&page=3" in links  # next page
    assert "/search?color=blue" in links and "/search" in links  # changed and removed facet
    assert "/search?color=red&size=xl" in links and "/search?color=red&sort=price" in links  # added facet
    assert len(links) == 19


def test_trap_pages_are_served_as_the_ground_truth_and_are_deterministic(extra_farm: SiteFarm) -> None:
    paths = {CALENDAR: ["/", "/calendar/2026/02", "/calendar/2026/w09", "/calendar/2026/03/01"],
             FACETS_NAME: ["/", "/search?size=s&sort=rating", "/search?brand=hooli&page=4"]}
    for name, host_paths in paths.items():
        for path in host_paths:
            url = f"http://{name}:{extra_farm.port}{path}"
            status, headers, body = get(extra_farm, name, path)
            assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
            assert parsed_links(url, body) == extra_farm.links_of(url)
            assert get(extra_farm, name, path)[2] == body
        status, _, body = get(extra_farm, name, "/robots.txt")
        assert status == 200 and body.decode() == extra_farm.robots_txt(name)
        assert RobotsPolicy.parse(body.decode(), TOKEN).allowed(f"http://{name}:{extra_farm.port}/anything")


@pytest.mark.parametrize("name", [CALENDAR, FACETS_NAME])
def test_trap_hosts_never_run_out_of_new_urls(extra_farm: SiteFarm, name: str) -> None:
    """Breadth-first from the home page, every hop finds new URLs of the trap host — it never closes."""
    start = f"http://{name}:{extra_farm.port}/"
    seen = {start}
    frontier = [start]
    growth = []
    for _ in range(6):
        frontier = [link for url in frontier for link in extra_farm.links_of(url) if link not in seen]
        frontier = list(dict.fromkeys(frontier))
        seen.update(frontier)
        growth.append(len(frontier))
        frontier = frontier[:300]  # bounded work per hop; the trap itself is not
    assert all(n > 0 for n in growth), growth
    assert len(seen) > 400
    assert all(host_key(url) == host_key(start) and extra_farm.is_trap_url(url) for url in seen)
    assert not extra_farm.is_trap_url(extra_farm.seed_urls()[0])


def test_trap_hosts_are_left_out_of_the_finite_ground_truth(extra_farm: SiteFarm) -> None:
    trap_keys = {f"http://{name}:{extra_farm.port}" for name in (CALENDAR, FACETS_NAME)}
    assert trap_keys <= extra_farm.host_keys()
    assert not any(host_key(url) in trap_keys for url in extra_farm.page_urls())
    assert not any(host_key(url) in trap_keys for url in extra_farm.expected_fetches(TOKEN, 3))


def test_large_hosts_are_ordinary_finite_sites(extra_farm: SiteFarm) -> None:
    from crawler.traps import url_template

    for name, articles in zip(extra_farm.large_host_names(), (400, 100), strict=True):
        key = f"http://{name}:{extra_farm.port}"
        pages = {url for url in extra_farm.page_urls() if host_key(url) == key}
        topics = -(-articles // 50)
        assert len(pages) == 1 + topics + articles
        assert extra_farm.robots_txt(name) is not None and extra_farm.crawl_delay(name) is None
        # every page within two hops of the home page, and a correct crawl fetches them all
        assert {url for url in extra_farm.expected_fetches(TOKEN, 2) if host_key(url) == key} == pages
        assert {url for url in extra_farm.expected_fetches(TOKEN, 1) if host_key(url) == key} < pages
        # digit-free topic names: one URL template per topic, ARTICLES_PER_TOPIC articles each
        articles_by_template: dict[str, int] = {}
        for url in pages:
            if url.endswith(".html"):
                articles_by_template[url_template(url)] = articles_by_template.get(url_template(url), 0) + 1
        assert len(articles_by_template) == topics and max(articles_by_template.values()) == 50
        status, _, body = get(extra_farm, name, "/topics/crawl/7.html")
        assert status == 200 and title_of(body) == f"{name} article 7"
        url = key + "/topics/crawl/7.html"
        assert parsed_links(url, body) == extra_farm.links_of(url)
    assert get(extra_farm, "large-1.farm.test", "/topics/crawl/100.html")[0] == 404


def test_large_host_size_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SiteFarm(FarmSpec(large_host_pages=(10, 0)), tmp_path / "log.jsonl")
    with pytest.raises(ValueError):
        SiteFarm(FarmSpec(large_host_pages=(10**9,)), tmp_path / "log.jsonl")


# ---- sitemaps ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_sitemaps(farm: SiteFarm) -> dict[str, tuple[dict[str, str], bytes, SitemapResult]]:
    """Every sitemap file of the default farm: fetched over loopback, parsed as the crawler would find it."""
    origins: dict[str, SitemapOrigin] = {}
    for url, via in farm.sitemap_urls().items():
        if via == "probe":
            origins[url] = SitemapOrigin(FoundVia.PROBE)
        elif via == "robots":
            origins[url] = SitemapOrigin.from_robots(host_key(url) + "/robots.txt")
            for child in farm.sitemap_entries(url):
                origins[canonicalize(child["loc"])] = origins[url].child()
    assert origins.keys() == farm.sitemap_urls().keys()  # every "index" file is a child of a robots-named index
    served = {}
    for url, origin in origins.items():
        status, headers, body = get(farm, url.split("://")[1].split("/")[0], path_of(url))
        assert status == 200, url
        served[url] = (headers, body, parse_sitemap(url, body, origin, content_type=headers["content-type"]))
    return served


def urlset_locs(farm: SiteFarm) -> dict[str, list[str]]:
    """The locs each urlset lists, as written."""
    return {url: [entry["loc"] for entry in farm.sitemap_entries(url)]
            for url in farm.sitemap_urls() if url.endswith((".xml.gz", "/extra.xml", "/sitemap.xml"))}


def test_sitemaps_are_found_through_robots_or_by_probing(farm: SiteFarm) -> None:
    found = farm.sitemap_urls()
    assert Counter(found.values()) == {"robots": 6, "index": 12, "probe": 8}
    roles = Counter()
    for name, seed in zip(farm.host_names(), farm.seed_urls(), strict=True):
        key = host_key(seed)
        own = {path_of(url): via for url, via in found.items() if host_key(url) == key}
        robots = farm.robots_txt(name)
        named = RobotsPolicy.parse(robots, TOKEN).sitemaps if robots is not None else ()
        status, headers, _ = get(farm, name, "/sitemap.xml")
        if own == {"/sitemap.xml": "probe"}:
            roles["probe"] += 1
            assert status == 200 and headers["content-type"] == "application/xml" and named == ()
            continue
        assert status == 404, name
        if own:
            roles["robots"] += 1
            assert own == {"/sitemaps/index.xml": "robots", "/sitemaps/pages.xml.gz": "index",
                           "/sitemaps/extra.xml": "index"}
            assert named == (key + "/sitemaps/index.xml",)
            assert get(farm, name, "/robots.txt")[2].decode() == robots
        else:
            roles["none"] += 1
            assert named == () and get(farm, name, "/sitemaps/index.xml")[0] == 404
    assert roles == {"robots": 6, "probe": 8, "none": 10}


def test_sitemap_files_parse_to_the_ground_truth(farm: SiteFarm, served_sitemaps) -> None:
    out_of_scope = farm.out_of_scope_sitemap_urls()
    refused_by_host: dict[str, Counter] = {}
    for url, (headers, body, result) in served_sitemaps.items():
        assert result.error is None and not result.ignored_fields, url
        assert "content-encoding" not in headers
        if url.endswith(".gz"):
            assert headers["content-type"] == "application/gzip" and body[:2] == b"\x1f\x8b" and result.gzipped
            assert gzip.decompress(body).startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset')
        else:
            assert headers["content-type"] == "application/xml" and not result.gzipped
        assert f'xmlns="{SITEMAP_NS}"'.encode() in (gzip.decompress(body) if result.gzipped else body)
        truth = farm.sitemap_entries(url)
        if url.endswith("/index.xml"):
            assert result.kind == "sitemapindex" and not result.refused
            assert [(child.loc, child.lastmod) for child in result.sitemaps] == [
                (entry["loc"], entry["lastmod"]) for entry in truth]
            continue
        assert result.kind == "urlset"
        kept = [entry for entry in truth if entry["loc"] != MALFORMED_LOC and entry["loc"] not in out_of_scope]
        assert result.entries == [
            SitemapEntry(canonicalize(entry["loc"]), entry["lastmod"],
                         ChangeFreq(entry["changefreq"]) if entry["changefreq"] else None, entry["priority"])
            for entry in kept
        ]
        refused_by_host.setdefault(host_key(url), Counter()).update(result.refused)
    # per host: the malformed loc and the neighbour's page, each refused once, for its own reason
    assert len(refused_by_host) == 14
    assert all(refused == {"invalid loc": 1, "outside sitemap scope": 1} for refused in refused_by_host.values())


def test_urlset_fields_are_a_mix(farm: SiteFarm) -> None:
    entries = [entry for url in urlset_locs(farm) for entry in farm.sitemap_entries(url)]
    ages = [SITEMAP_DATE - entry["lastmod"] for entry in entries if entry["lastmod"] is not None]
    assert any(entry["lastmod"] is None for entry in entries)
    assert any(timedelta(0) <= age <= timedelta(days=7) for age in ages)
    assert any(age > timedelta(days=365) for age in ages)
    assert all(age >= timedelta(0) for age in ages)
    priorities = [entry["priority"] for entry in entries]
    assert None in priorities and {p for p in priorities if p is not None} == {n / 10 for n in range(1, 11)}
    changefreqs = {entry["changefreq"] for entry in entries}
    assert None in changefreqs and len(changefreqs) >= 6


def test_orphans_are_served_and_linked_from_nowhere(farm: SiteFarm) -> None:
    orphans, foreign = farm.orphan_urls(), farm.out_of_scope_sitemap_urls()
    linked = {link for url in farm.page_urls() | orphans | foreign for link in farm.links_of(url)}
    assert orphans and foreign and linked.isdisjoint(orphans | foreign)
    assert (orphans | foreign).isdisjoint(farm.page_urls())
    listings = urlset_locs(farm)
    per_host = Counter(host_key(url) for url in orphans)
    assert len(per_host) == 14 and set(per_host.values()) <= {2, 3, 4} and len(set(per_host.values())) > 1
    listed = [(sitemap, loc) for sitemap, locs in listings.items() for loc in locs if loc != MALFORMED_LOC]
    own_listed = {loc for sitemap, loc in listed if host_key(loc) == host_key(sitemap)}
    assert orphans == own_listed - farm.page_urls() - farm.disallowed_urls(TOKEN)
    assert foreign == {loc for sitemap, loc in listed if host_key(loc) != host_key(sitemap)}
    for url in sorted(orphans | foreign):
        status, _, body = get(farm, url.split("://")[1].split("/")[0], path_of(url))
        assert status == 200, url
        assert parsed_links(url, body) == farm.links_of(url) == [host_key(url) + "/"]


def test_a_sitemap_may_list_a_disallowed_url(farm: SiteFarm) -> None:
    disallowed = farm.disallowed_urls(TOKEN)
    fetched = farm.expected_fetches(TOKEN, 2, with_sitemaps=True)
    linked = {link for url in farm.page_urls() for link in farm.links_of(url)}
    listed_disallowed = set()
    for sitemap, locs in urlset_locs(farm).items():
        name = sitemap.split("://")[1].split(":")[0]
        robots = farm.robots_txt(name)
        policy = RobotsPolicy.parse(robots, TOKEN) if robots is not None else RobotsPolicy.allow_all()
        blocked = [loc for loc in locs
                   if loc != MALFORMED_LOC and host_key(loc) == host_key(sitemap) and not policy.allowed(loc)]
        listed_disallowed.update(blocked)
        if sitemap.endswith("/extra.xml"):
            assert blocked == []
        else:
            assert len(blocked) == (robots is not None), sitemap
    assert listed_disallowed and listed_disallowed <= disallowed
    assert listed_disallowed.isdisjoint(linked)  # only the sitemap names it
    assert listed_disallowed.isdisjoint(fetched | farm.expected_fetches_sitemaps_only(TOKEN))
    for url in listed_disallowed:
        assert get(farm, url.split("://")[1].split("/")[0], path_of(url))[0] == 200  # a crawler fetching it shows


@pytest.mark.parametrize("token", [TOKEN, "otherbot"])
def test_expected_fetches_with_sitemaps_follow_the_parsed_sitemaps(farm: SiteFarm, served_sitemaps,
                                                                   token: str) -> None:
    """Recomputed from the served robots files and the parser's results: probes of every seed host, the
    robots-named indexes, their children, the listed pages — each only where robots.txt allows."""
    policies = {}
    for name, seed in zip(farm.host_names(), farm.seed_urls(), strict=True):
        robots = farm.robots_txt(name)
        policies[host_key(seed)] = RobotsPolicy.parse(robots, token) if robots is not None else RobotsPolicy.allow_all()

    def allowed(url: str) -> bool:
        return policies[host_key(url)].allowed(url)

    seeds = {url for url in farm.seed_urls() if allowed(url)}
    probes = {url + "sitemap.xml" for url in farm.seed_urls() if allowed(url + "sitemap.xml")}
    indexes = {url for name in farm.host_names() if farm.robots_txt(name)
               for url in RobotsPolicy.parse(farm.robots_txt(name), token).sitemaps if allowed(url)}
    children = {child.loc for url in indexes for child in served_sitemaps[url][2].sitemaps if allowed(child.loc)}
    files = indexes | children | (probes & served_sitemaps.keys())
    listed = {entry.loc for url in files for entry in served_sitemaps[url][2].entries if allowed(entry.loc)}
    depth_zero = seeds | probes | files | listed
    assert farm.expected_fetches(token, 0, with_sitemaps=True) == depth_zero
    assert farm.expected_fetches_sitemaps_only(token) == files | listed
    assert farm.orphan_urls() & listed  # orphans are found, through sitemaps only
    # listed pages' links follow at +1
    next_hop = {link for url in listed for link in farm.links_of(url)
                if host_key(link) in policies and allowed(link)}
    plain = farm.expected_fetches(token, 1)
    assert farm.expected_fetches(token, 1, with_sitemaps=True) == plain | depth_zero | next_hop
    assert next_hop - plain - depth_zero
    everything = farm.expected_fetches(token, 2, with_sitemaps=True)
    assert everything == farm.expected_fetches(token, 2) | probes | files | listed
    assert everything.isdisjoint(farm.out_of_scope_sitemap_urls() | farm.disallowed_urls(token))
    if token == "otherbot":  # site-000 (cgi) shuts otherbot out: not even its sitemaps are fetched
        assert not any(host_key(url) == host_key(farm.seed_urls()[0]) for url in everything)
    else:
        assert len(indexes) == 6 and len(children) == 12 and len(probes) == 24


def test_sitemaps_can_be_turned_off_and_leave_the_pages_unchanged(farm: SiteFarm, tmp_path: Path) -> None:
    never_started = SiteFarm(FarmSpec(), tmp_path / "unused.jsonl")
    assert "Sitemap" not in never_started.robots_txt("site-000.farm.test")  # the line needs the port
    with SiteFarm(FarmSpec(latency_s=0.0, sitemaps=False), tmp_path / "log.jsonl") as plain:
        assert plain.sitemap_urls() == {} and plain.orphan_urls() == plain.out_of_scope_sitemap_urls() == set()
        for name in plain.host_names()[:6]:
            assert plain.robots_txt(name) == never_started.robots_txt(name)
            if farm.robots_txt(name) is not None:
                assert farm.robots_txt(name).split("\nSitemap: ")[0] == plain.robots_txt(name)
            for path in ("/sitemap.xml", "/sitemaps/index.xml", "/orphans/page-0.html"):
                assert get(plain, name, path)[0] == 404
            for path in ("/", "/section/1/page-7.html", "/section/2/"):
                assert get(plain, name, path)[2].replace(str(plain.port).encode(), b"P") == get(
                    farm, name, path)[2].replace(str(farm.port).encode(), b"P")
        assert {path_of(url) for url in plain.page_urls()} == {path_of(url) for url in farm.page_urls()}
        probes = {url + "sitemap.xml" for url in plain.seed_urls()}
        assert plain.expected_fetches(TOKEN, 1, with_sitemaps=True) == plain.expected_fetches(TOKEN, 1) | probes
        assert plain.expected_fetches_sitemaps_only(TOKEN) == set()


# ---- fresh hosts: new high-priority sitemap entries on a schedule, pages that change ---------------------------

def test_fresh_hosts_list_a_new_article_each_interval_and_their_home_page_changes(tmp_path: Path) -> None:
    moment = [1_000_000.0]
    spec = FarmSpec(hosts=2, pages_per_host=10, latency_s=0.0, fresh_hosts=2, fresh_interval_s=60.0)
    fresh = SiteFarm(spec, tmp_path / "requests.jsonl")
    fresh.clock = lambda: moment[0]
    with fresh:
        name = "fresh-1.farm.test"
        assert fresh.host_names()[-2:] == ["fresh-0.farm.test", name]
        assert set(fresh.static_hosts()) == set(fresh.host_names())
        base = f"http://{name}:{fresh.port}"
        sitemap = f"{base}/sitemap.xml"
        assert RobotsPolicy.parse(get(fresh, name, "/robots.txt")[2].decode(), TOKEN).sitemaps == (sitemap,)

        def listed_now() -> tuple[list[SitemapEntry], bytes]:
            status, headers, body = get(fresh, name, "/sitemap.xml")
            assert status == 200
            origin = SitemapOrigin(FoundVia.ROBOTS, base).encode()
            return parse_sitemap(sitemap, body, origin, content_type=headers["content-type"]).entries, get(
                fresh, name, "/")[2]

        entries, home = listed_now()
        assert [e.loc for e in entries] == [f"{base}/news/item-0.html"]
        assert get(fresh, name, "/news/item-1.html")[0] == 404  # not listed yet: not there
        moment[0] += 59.9
        assert listed_now() == (entries, home)  # nothing new within the interval
        moment[0] += 0.1
        entries, later_home = listed_now()
        assert [e.loc for e in entries] == [f"{base}/news/item-1.html", f"{base}/news/item-0.html"]
        assert later_home != home and f"{base}/news/item-1.html" in parsed_links(base + "/", later_home)
        assert all(e.priority == 1.0 and e.changefreq is ChangeFreq.ALWAYS for e in entries)
        assert [e.lastmod.timestamp() for e in entries] == [1_000_060.0, 1_000_000.0]
        assert get(fresh, name, "/news/item-1.html")[0] == 200
        moment[0] += 3 * 60
        assert fresh.fresh_listings(moment[0]) == {
            f"http://{host}:{fresh.port}/news/item-{n}.html": 1_000_000.0 + 60 * n
            for host in ("fresh-0.farm.test", name) for n in range(5)}
        assert [e.loc for e in listed_now()[0]] == [f"{base}/news/item-{n}.html" for n in (4, 3, 2, 1, 0)]
        # an article once listed stays the same page
        assert get(fresh, name, "/news/item-1.html")[2] == get(fresh, name, "/news/item-1.html")[2]
        assert fresh.politeness_delay(f"{name}:{fresh.port}", 0.25) == 0.25


def test_fresh_hosts_are_off_by_default_and_leave_the_other_hosts_unchanged(farm: SiteFarm, tmp_path: Path) -> None:
    assert farm.fresh_host_names() == [] and farm.fresh_listings(time.time()) == {}
    with SiteFarm(FarmSpec(latency_s=0.0, fresh_hosts=1), tmp_path / "log.jsonl") as fresh:
        for name in farm.host_names()[:4]:
            for path in ("/", "/robots.txt", "/sitemap.xml", "/section/1/page-7.html"):
                assert get(fresh, name, path)[2].replace(str(fresh.port).encode(), b"P") == get(
                    farm, name, path)[2].replace(str(farm.port).encode(), b"P")
        assert {path_of(url) for url in fresh.page_urls()} == {path_of(url) for url in farm.page_urls()}
    with pytest.raises(ValueError):
        SiteFarm(FarmSpec(fresh_interval_s=0), tmp_path / "never.jsonl")
