"""The site farm: many deterministic virtual web sites on one loopback aiohttp server, for tests and `crawl demo`.

Virtual hosts are chosen by the Host header; the crawler reaches them through `fetch.static_hosts`. The farm
knows its own link graph and robots files, so a test can compute what a correct crawl must fetch
(`expected_fetches`). The server writes its own request log, and `politeness_violations` judges politeness
from that log alone — never from the crawler's account of itself.

Opt-in extra hosts (FarmSpec.trap_hosts, FarmSpec.large_host_pages) test the frontier's trap rules: two crawler
traps whose pages are generated on the fly for any valid URL (an infinite calendar, a faceted search), and
ordinary large news-like hosts that the trap rules must not cut.

Sitemaps (FarmSpec.sitemaps, on by default) on the ordinary sites, by host index (`_sitemap_role`): hosts
0, 3, 6, ... that serve a robots.txt name a sitemap index there (a gzip child and a plain child), hosts 1, 4,
7, ... serve only /sitemap.xml (found by probing), the rest have none (404). Their urlsets list existing
pages, orphan pages no HTML page links to, one URL on the neighbour host (outside the sitemap's scope), one
malformed loc and, where robots.txt disallows something, one disallowed URL. `sitemap_urls`,
`sitemap_entries`, `orphan_urls`, `out_of_scope_sitemap_urls` and `expected_fetches(..., with_sitemaps=True)`
say what a correct crawl makes of them.
"""

from __future__ import annotations

import asyncio
import calendar
import datetime
import gzip
import html
import json
import math
import random
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from crawler.robots import RobotsPolicy
from crawler.urls import canonicalize, host_key, resolve

DOMAIN = "farm.test"
PAGES_PER_SECTION = 10
CRAWL_DELAY_S = 0.5
OUTSIDE_LINKS = ("http://outside.example/", "https://www.outside.example/about?from=farm")
HTML_TYPE = "text/html; charset=utf-8"
_WORDS = (
    "crawl", "fetch", "parse", "index", "frontier", "segment", "host", "robots", "politeness", "delay", "bucket",
    "lease", "merge", "delta", "table", "spark", "daemon", "warc", "record", "digest", "link", "anchor", "title",
    "section", "page", "farm", "site", "query", "fragment", "redirect", "sitemap", "canonical", "duplicate",
    "simhash", "shingle", "revisit", "interval", "backoff", "budget", "scope", "depth", "seed",
)
CALENDAR_HOST = f"calendar.{DOMAIN}"
FACETS_HOST = f"facets.{DOMAIN}"
CALENDAR_YEARS = (2026, 2027)  # the calendar's home page links to every month of these years
# The faceted search's filters in their one canonical query order; `page` (2, 3, ...) always comes last.
FACETS = (
    ("color", ("red", "green", "blue", "black", "white")),
    ("size", ("s", "m", "l", "xl")),
    ("brand", ("acme", "globex", "initech", "umbrella", "hooli")),
    ("sort", ("price", "rating", "new")),
)
ARTICLES_PER_TOPIC = 50  # a large host's articles are grouped in topics of this many
MAX_LARGE_HOST_PAGES = len(_WORDS) ** 2 * ARTICLES_PER_TOPIC  # one distinct word or word pair per topic
LATEST_ARTICLES = 10  # a large host's home page also links to its newest articles
EXTRA_ROBOTS = "User-agent: *\nAllow: /\n"  # trap and large hosts allow everything: only trap rules bound them
SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
# The farm's "today" for lastmod values: fixed, so the farm stays deterministic and takes no clock.
SITEMAP_DATE = datetime.datetime(2026, 1, 15, tzinfo=datetime.timezone.utc)
PROBE_PATH = "/sitemap.xml"
SITEMAP_INDEX_PATH = "/sitemaps/index.xml"
SITEMAP_GZ_PATH = "/sitemaps/pages.xml.gz"
SITEMAP_EXTRA_PATH = "/sitemaps/extra.xml"
MALFORMED_LOC = "ht!tp://bad"
SITEMAP_LISTED_PAGES = 6  # existing pages each host's urlsets list
CHANGEFREQS = ("always", "hourly", "daily", "weekly", "monthly", "yearly", "never")


@dataclass
class FarmSpec:
    """Shape of the farm. With the defaults every page of a host is within 2 hops of its home page."""

    hosts: int = 24
    pages_per_host: int = 60
    seed: int = 7
    cross_host_links: bool = True
    latency_s: float = 0.01  # server think time per request, so overlapping requests show up in the log
    # Adds calendar.farm.test (an infinite calendar) and facets.farm.test (an unbounded faceted search).
    trap_hosts: bool = False
    # One ordinary large host per entry, large-<i>.farm.test, with that many articles in topics of
    # ARTICLES_PER_TOPIC (home -> topic index -> article: every page within 2 hops of the home page).
    large_host_pages: tuple[int, ...] = ()
    # Sitemaps on the ordinary sites (see the module docstring); HTML pages are the same with or without them.
    sitemaps: bool = True
    # Paths (with query) at which every host reads the request and closes the connection without an answer.
    # Such a request is logged like any other (status None, "dropped": true): the politeness judge counts
    # every request the server saw, answered or not.
    dropped_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Resource:
    """One URL the farm answers: its response and the canonical outlinks a correct parser finds in it."""

    status: int
    body: bytes
    content_type: str = HTML_TYPE
    location: str | None = None
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Sitemap:
    """One sitemap file as the farm wrote it: how a crawler finds it and its entries (parsed values)."""

    found_via: str  # "robots", "index" or "probe"
    kind: str  # "sitemapindex" or "urlset"
    entries: tuple[dict[str, Any], ...]


def _host_role(index: int) -> str:
    """Robots variant of a host, cycling through the four kinds the crawl must handle."""
    return ("cgi", "private", "no_robots", "query")[index % 4]


def _sitemap_role(index: int) -> str | None:
    """How a site's sitemaps are found: "robots" (a `Sitemap:` line, so only hosts that serve a robots.txt),
    "probe" (only /sitemap.xml), or None (no sitemap)."""
    if index % 3 == 0 and _host_role(index) != "no_robots":
        return "robots"
    return "probe" if index % 3 == 1 else None


def _sitemap_disallowed_path(index: int) -> str | None:
    """A path robots.txt disallows that only the host's sitemap lists (None: its robots.txt disallows nothing)."""
    return {"cgi": "/cgi-bin/listed.html", "private": "/private/listed.html",
            "query": "/private/listed.html"}.get(_host_role(index))


class SiteFarm:
    """A loopback web server with `spec.hosts` generated sites; also the ground truth about them."""

    def __init__(self, spec: FarmSpec, log_path: str | Path):
        if spec.hosts < 1 or spec.pages_per_host < 1:
            raise ValueError("a farm needs at least one host and one page per host")
        if not all(1 <= pages <= MAX_LARGE_HOST_PAGES for pages in spec.large_host_pages):
            raise ValueError(f"a large host has 1 to {MAX_LARGE_HOST_PAGES} articles")
        self.spec = spec
        self.log_path = Path(log_path)
        self.port = 0
        self._sites: dict[str, dict[str, _Resource]] = {}
        # what only sitemaps lead to (sitemap files, orphan pages), kept apart so page_urls stays the link graph
        self._sitemap_pages: dict[str, dict[str, _Resource]] = {}
        self._sitemap_files: dict[str, _Sitemap] = {}
        self._orphans: set[str] = set()
        self._out_of_scope: set[str] = set()
        self._log: IO[str] | None = None
        self._log_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port, build the sites for that port, serve from a background thread."""
        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._sites = {name: self._build_site(index, name) for index, name in enumerate(self._site_names())}
        self._sites.update({name: self._build_trap_home(name) for name in self.trap_host_names()})
        self._sites.update(
            {name: self._build_large_site(name, pages)
             for name, pages in zip(self.large_host_names(), self.spec.large_host_pages, strict=True)}
        )
        if self.spec.sitemaps:
            self._build_sitemaps()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failures: list[BaseException] = []

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._open(sock))
            except BaseException as error:  # surfaced to start()'s caller
                failures.append(error)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="sitefarm", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failures:
            self.stop()
            raise RuntimeError(f"site farm did not start: {failures[:1]}")

    async def _open(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()

    def stop(self) -> None:
        """Stop serving and close the log. Safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None and self._loop is not None:
            if self._loop.is_running():
                self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(30)
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> SiteFarm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- serving ---------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        start = time.time()
        host_header = request.headers.get("Host", "")
        if request.raw_path in self.spec.dropped_paths:
            self._write_log({"host": host_header, "path": request.raw_path, "method": request.method, "start": start,
                             "end": time.time(), "status": None, "dropped": True,
                             "user_agent": request.headers.get("User-Agent", "")})
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError  # aiohttp's way for a handler to end with no response at all
        name = host_header.rpartition(":")[0].lower() or host_header.lower()
        resource = self._answer(name, request.raw_path) or _Resource(404, b"<html><title>Not found</title></html>")
        if self.spec.latency_s > 0:
            await asyncio.sleep(self.spec.latency_s)
        headers = {"Content-Type": resource.content_type}
        if resource.location:
            headers["Location"] = resource.location
        response = web.Response(status=resource.status, body=resource.body, headers=headers)
        await response.prepare(request)
        # `end` is taken before the body's last byte leaves, so a client that waits for the whole response
        # always starts its next request after `end`: an overlap in the log is a real one.
        self._write_log(
            {
                "host": host_header,
                "path": request.raw_path,
                "method": request.method,
                "start": start,
                "end": time.time(),
                "status": resource.status,
                "user_agent": request.headers.get("User-Agent", ""),
            }
        )
        await response.write_eof()
        return response

    def _write_log(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._log_lock:
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    # ---- site generation -------------------------------------------------------------------------------

    def _answer(self, name: str, path: str) -> _Resource | None:
        """The resource at path + query on a host: built at start, or generated now on a trap host."""
        resource = self._sites.get(name, {}).get(path)
        if resource is None:
            resource = self._sitemap_pages.get(name, {}).get(path)
        if resource is None and name == CALENDAR_HOST:
            return self._calendar_page(path)
        if resource is None and name == FACETS_HOST:
            return self._facets_page(path)
        return resource

    def _sections(self) -> int:
        return max(1, math.ceil(self.spec.pages_per_host / PAGES_PER_SECTION))

    def _base(self, name: str) -> str:
        return f"http://{name}:{self.port}"

    def _build_site(self, index: int, name: str) -> dict[str, _Resource]:
        """Every resource of one host, keyed by path + query exactly as a canonical URL spells it."""
        rng = random.Random(f"{self.spec.seed}:{index}")
        base = self._base(name)
        role = _host_role(index)
        sections = self._sections()
        pages = self.spec.pages_per_host
        site: dict[str, _Resource] = {}

        def page(path: str, title: str, hrefs: list[str]) -> None:
            site[path] = self._html_page(base + path, title, hrefs, rng)

        home_links = [f"/section/{s}/" for s in range(sections)]
        home_links += ["section/0/#intro", "#top", "/search?q=farm&page=1", "mailto:webmaster@farm.test"]
        home_links += ["javascript:void(0)", *OUTSIDE_LINKS]
        if role in ("private", "no_robots", "query"):
            home_links += ["/private/secret-1.html", "private/secret-2.html"]
            page("/private/secret-1.html", f"{name} secret one", ["/"])
            page("/private/secret-2.html", f"{name} secret two", ["../"])
        if role == "private":
            home_links.append("/private/open.html")
            page("/private/open.html", f"{name} open exception", ["/", "secret-1.html"])
        if role == "cgi":
            home_links.append("/cgi-bin/search?q=1")
            page("/cgi-bin/search?q=1", f"{name} cgi search", ["/"])
        if index % 2 == 0:
            home_links.append("/old/page-0.html")
            site["/old/page-0.html"] = _Resource(
                301, b"", location="/section/0/page-0.html", links=(base + "/section/0/page-0.html",)
            )
        if self.spec.cross_host_links and self.spec.hosts > 1:
            neighbour = self.host_names()[(index + 1) % self.spec.hosts]
            far = self.host_names()[(index + 7) % self.spec.hosts]
            home_links += [f"{self._base(neighbour)}/", f"{self._base(far)}/section/0/page-0.html"]
        page("/", f"{name} home", home_links)
        page("/search?q=farm&page=1", f"{name} search", ["/section/0/page-0.html", "./", "?q=farm&page=1#r"])

        for s in range(sections):
            members = range(s, pages, sections)
            hrefs = []
            for position, k in enumerate(members):
                form = position % 4
                if form == 0:
                    hrefs.append(f"page-{k}.html")
                elif form == 1:
                    hrefs.append(f"./page-{k}.html#top")
                elif form == 2:
                    hrefs.append(f"/section/{s}/page-{k}.html")
                else:
                    hrefs.append(f"{base}/section/{s}/page-{k}.html")
            hrefs += ["../../", f"../{(s + 1) % sections}/", "#nav"]
            page(f"/section/{s}/", f"{name} section {s}", hrefs)

        for k in range(pages):
            s = k % sections
            sibling = (k + sections) % pages
            other = rng.randrange(pages)
            hrefs = ["./", "../../", f"page-{sibling}.html", f"/section/{other % sections}/page-{other}.html"]
            hrefs.append(f"page-{k}.html#part-2")
            if role == "query" and k % 5 == 0:
                hrefs.append(f"page-{k}.html?print=1")
                site[f"/section/{s}/page-{k}.html?print=1"] = self._html_page(
                    f"{base}/section/{s}/page-{k}.html?print=1", f"{name} page {k} (print)", ["./"], rng
                )
            if self.spec.cross_host_links and self.spec.hosts > 1 and k % 7 == 3:
                target = self.host_names()[rng.randrange(self.spec.hosts)]
                hrefs.append(f"{self._base(target)}/section/0/")
            if k % 11 == 5:
                hrefs.append(OUTSIDE_LINKS[0] + f"page-{k}")
            page(f"/section/{s}/page-{k}.html", f"{name} page {k}", hrefs)

        robots = self.robots_txt(name)
        site["/robots.txt"] = (
            _Resource(200, robots.encode("utf-8"), content_type="text/plain; charset=utf-8")
            if robots is not None
            else _Resource(404, b"not found", content_type="text/plain; charset=utf-8")
        )
        return site

    def _generated(self, name: str, path: str, title: str, hrefs: list[str]) -> _Resource:
        """A page made on request, its words seeded by its URL so every answer for it is the same."""
        rng = random.Random(f"{self.spec.seed}:{name}:{path}")
        return self._html_page(self._base(name) + path, title, hrefs, rng)

    def _build_trap_home(self, name: str) -> dict[str, _Resource]:
        """A trap host's two fixed resources; every other page of it is generated by `_answer`."""
        if name == CALENDAR_HOST:
            hrefs = [_month_path(datetime.date(year, month, 1)) for year in CALENDAR_YEARS for month in range(1, 13)]
        else:
            hrefs = ["/search", *(_facet_path({facet: value}) for facet, values in FACETS for value in values)]
        return {
            "/": self._generated(name, "/", f"{name} home", hrefs),
            "/robots.txt": _Resource(200, EXTRA_ROBOTS.encode("utf-8"), content_type="text/plain; charset=utf-8"),
        }

    def _calendar_page(self, path: str) -> _Resource | None:
        """A calendar with month, ISO-week and day views, each linking to the previous and next one of its kind:
        `/calendar/2026/11` (its weeks and days), `/calendar/2026/w48` (its seven days), `/calendar/2026/11/30`
        (its month and week). Any date of years 1-9999 answers 200: an endless chain of new URLs."""
        parts = path.split("/")
        if "?" in path or len(parts) not in (4, 5) or parts[:2] != ["", "calendar"]:
            return None
        try:
            if len(parts) == 5:
                kind, date = "day", datetime.date(int(parts[2]), int(parts[3]), int(parts[4]))
            elif parts[3].startswith("w"):
                kind, date = "week", datetime.date.fromisocalendar(int(parts[2]), int(parts[3][1:]), 1)
            else:
                kind, date = "month", datetime.date(int(parts[2]), int(parts[3]), 1)
        except ValueError:
            return None
        spelled = {"day": _day_path, "week": _week_path, "month": _month_path}[kind]
        if spelled(date) != path:  # one spelling per page: /calendar/2026/1 is not one
            return None
        hrefs = ["/"]
        if kind == "month":
            last = date.replace(day=calendar.monthrange(date.year, date.month)[1])
            days = [date + datetime.timedelta(days=n) for n in range(last.day)]
            hrefs += [_month_path(d) for d in (_shift(date, -1), _shift(last, 1)) if d is not None]
            hrefs += list(dict.fromkeys(_week_path(d) for d in days)) + [_day_path(d) for d in days]
        elif kind == "week":
            days = [d for d in (_shift(date, n) for n in range(7)) if d is not None]
            hrefs += [_week_path(d) for d in (_shift(date, -7), _shift(date, 7)) if d is not None]
            hrefs += [_day_path(d) for d in days]
        else:
            hrefs += [_month_path(date), _week_path(date)]
            hrefs += [_day_path(d) for d in (_shift(date, -1), _shift(date, 1)) if d is not None]
        title = "calendar " + path.removeprefix("/calendar/").replace("/", "-")
        return self._generated(CALENDAR_HOST, path, title, hrefs)

    def _facets_page(self, path: str) -> _Resource | None:
        """`/search?color=red&size=m&page=3`: any valid filter set (facets in FACETS order, at most one value
        each, `page` >= 2 last) answers 200 and links to every filter set one step away — one facet added,
        changed or removed, and the next page: about 20 new URLs per page, without end."""
        filters = _parse_facets(path)
        if filters is None:
            return None
        page = int(filters.pop("page", "1"))
        hrefs = ["/"]
        for facet, values in FACETS:
            for value in values:
                if filters.get(facet) != value:
                    hrefs.append(_facet_path({**filters, facet: value}))
            if facet in filters:
                hrefs.append(_facet_path({k: v for k, v in filters.items() if k != facet}))
        hrefs.append(_facet_path(filters, page + 1))
        title = "search " + (", ".join(f"{k} {v}" for k, v in filters.items()) or "everything") + f" page {page}"
        return self._generated(FACETS_HOST, path, title, hrefs)

    def _build_large_site(self, name: str, articles: int) -> dict[str, _Resource]:
        """An ordinary news-like host: home -> topic indexes -> articles, every article linking to the others of
        its topic (a "more in this topic" list). Finite and fully allowed: the trap rules must not cut it."""
        topics = [_topic_slug(t) for t in range(math.ceil(articles / ARTICLES_PER_TOPIC))]
        site: dict[str, _Resource] = {}

        def members(t: int) -> range:
            return range(t * ARTICLES_PER_TOPIC, min(articles, (t + 1) * ARTICLES_PER_TOPIC))

        def article_path(n: int) -> str:
            return f"/topics/{topics[n // ARTICLES_PER_TOPIC]}/{n}.html"

        latest = [article_path(n) for n in range(articles - 1, max(-1, articles - 1 - LATEST_ARTICLES), -1)]
        site["/"] = self._generated(name, "/", f"{name} home", [*(f"/topics/{t}/" for t in topics), *latest])
        for t, slug in enumerate(topics):
            following = topics[(t + 1) % len(topics)]
            hrefs = [f"{n}.html" for n in members(t)] + ["../../", f"../{following}/"]
            site[f"/topics/{slug}/"] = self._generated(name, f"/topics/{slug}/", f"{name} topic {slug}", hrefs)
            for n in members(t):
                hrefs = ["./", "/", *(f"{m}.html" for m in members(t) if m != n)]
                hrefs.append(article_path((n * 7 + 3) % articles))
                path = article_path(n)
                site[path] = self._generated(name, path, f"{name} article {n}", hrefs)
        site["/robots.txt"] = _Resource(200, EXTRA_ROBOTS.encode("utf-8"), content_type="text/plain; charset=utf-8")
        return site

    def _build_sitemaps(self) -> None:
        """Sitemap files and the pages only they lead to, for every site with a sitemap role. Seeded apart from
        `_build_site`, so turning sitemaps on or off leaves every HTML page as it was."""
        names = self._site_names()
        for index, name in enumerate(names):
            role = _sitemap_role(index)
            if role is None:
                continue
            rng = random.Random(f"{self.spec.seed}:{index}:sitemaps")
            base = self._base(name)
            own = self._sitemap_pages.setdefault(name, {})
            pages = [path for path in self._sites[name] if path.startswith("/section/") and path.endswith(".html")]
            listed = [base + path for path in rng.sample(pages, min(SITEMAP_LISTED_PAGES, len(pages)))]
            listed.append(MALFORMED_LOC)
            blocked = _sitemap_disallowed_path(index)
            if blocked is not None:
                own[blocked] = self._generated(name, blocked, f"{name} listed but disallowed", ["/"])
                listed.append(base + blocked)
            orphans = [f"{base}/orphans/page-{n}.html" for n in range(rng.randint(2, 4))]
            for url in orphans:
                own[url[len(base):]] = self._generated(name, url[len(base):], f"{name} orphan", ["/"])
            self._orphans.update(orphans)
            unlinked = list(orphans)
            if len(names) > 1:  # a page of the neighbour, linked from nowhere: only this (wrong) listing names it
                neighbour = names[(index + 1) % len(names)]
                path = f"/orphans/foreign-{index}.html"
                self._sitemap_pages.setdefault(neighbour, {})[path] = self._generated(
                    neighbour, path, f"{neighbour} foreign orphan", ["/"])
                unlinked.append(self._base(neighbour) + path)
                self._out_of_scope.add(self._base(neighbour) + path)
            if role == "probe":
                self._add_sitemap(base + PROBE_PATH, "probe", "urlset", _listings(listed + unlinked, rng))
                continue
            children = (base + SITEMAP_GZ_PATH, base + SITEMAP_EXTRA_PATH)
            self._add_sitemap(children[0], "index", "urlset", _listings(listed, rng))
            self._add_sitemap(children[1], "index", "urlset", _listings(unlinked, rng))
            index_entries = [
                {"loc": url, "lastmod": SITEMAP_DATE - datetime.timedelta(days=n + 1, hours=3),
                 "changefreq": None, "priority": None}
                for n, url in enumerate(children)
            ]
            self._add_sitemap(base + SITEMAP_INDEX_PATH, "robots", "sitemapindex", index_entries)

    def _add_sitemap(self, url: str, found_via: str, kind: str, entries: list[dict[str, Any]]) -> None:
        """Serve one sitemap file (gzip bytes, not a Content-Encoding, when its name ends in .gz)."""
        body = _sitemap_xml(kind, entries)
        content_type = "application/xml"
        if url.endswith(".gz"):
            body, content_type = gzip.compress(body, mtime=0), "application/gzip"
        key = host_key(url)
        name = key.split("://", 1)[1].rpartition(":")[0]
        self._sitemap_pages.setdefault(name, {})[url[len(key):]] = _Resource(200, body, content_type=content_type)
        self._sitemap_files[url] = _Sitemap(found_via, kind, tuple(entries))

    @staticmethod
    def _html_page(url: str, title: str, hrefs: list[str], rng: random.Random) -> _Resource:
        paragraphs = []
        for _ in range(3):
            paragraphs.append("<p>" + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(40, 90))) + "</p>")
        anchors = "\n".join(f'<li><a href="{html.escape(href)}">link {n}</a></li>' for n, href in enumerate(hrefs))
        title = html.escape(title)
        document = (
            f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n"
            f"<body><h1 id=\"top\">{title}</h1>\n{''.join(paragraphs)}\n<ul>\n{anchors}\n</ul></body></html>\n"
        )
        links = dict.fromkeys(link for link in (resolve(url, href) for href in hrefs) if link is not None)
        return _Resource(200, document.encode("utf-8"), links=tuple(links))

    # ---- ground truth ----------------------------------------------------------------------------------

    def _site_names(self) -> list[str]:
        return [f"site-{i:03d}.{DOMAIN}" for i in range(self.spec.hosts)]

    def host_names(self) -> list[str]:
        """Every host: the `spec.hosts` sites first, then the trap hosts, then the large hosts."""
        return [*self._site_names(), *self.trap_host_names(), *self.large_host_names()]

    def trap_host_names(self) -> list[str]:
        return [CALENDAR_HOST, FACETS_HOST] if self.spec.trap_hosts else []

    def large_host_names(self) -> list[str]:
        return [f"large-{i}.{DOMAIN}" for i in range(len(self.spec.large_host_pages))]

    def static_hosts(self) -> dict[str, str]:
        """The `fetch.static_hosts` map that routes every farm host to the loopback server."""
        return {name: "127.0.0.1" for name in self.host_names()}

    def host_keys(self) -> set[str]:
        self._require_started()
        return {self._base(name) for name in self.host_names()}

    def seed_urls(self) -> list[str]:
        self._require_started()
        return [canonicalize(self._base(name) + "/") for name in self.host_names()]

    def robots_txt(self, host_name: str) -> str | None:
        """The robots.txt body a host serves, or None when it answers 404 (allow all) or is not a farm host.
        A `Sitemap:` line needs the port, so a farm not yet started leaves it out (its rules are the same)."""
        if host_name in self.trap_host_names() or host_name in self.large_host_names():
            return EXTRA_ROBOTS
        names = self._site_names()
        if host_name not in names:
            return None
        index = names.index(host_name)
        role = _host_role(index)
        if role == "no_robots":
            return None
        if role == "cgi":
            body = "# farm robots\nUser-agent: *\nDisallow: /cgi-bin/\n\nUser-agent: otherbot\nDisallow: /\n"
        elif role == "private":
            body = "User-agent: *\nDisallow: /private/\nAllow: /private/open.html\n"
        else:
            delay = f"Crawl-delay: {CRAWL_DELAY_S}\n" if index == 3 else ""
            body = f"User-agent: *\n{delay}Disallow: /private/\nDisallow: /*?print=1$\n"
        if self.spec.sitemaps and self.port and _sitemap_role(index) == "robots":
            body += f"\nSitemap: {self._base(host_name)}{SITEMAP_INDEX_PATH}\n"
        return body

    def crawl_delay(self, host_name: str) -> float | None:
        robots = self.robots_txt(host_name)
        return RobotsPolicy.parse(robots, "*").crawl_delay_s if robots is not None else None

    def politeness_delay(self, host: str, min_delay_s: float) -> float:
        """The delay a polite crawler keeps for a host (a name or a Host header with port)."""
        return max(min_delay_s, self.crawl_delay(host.rpartition(":")[0] or host) or 0.0)

    def page_urls(self) -> set[str]:
        """Every URL of the link graph the farm answers with a page or a redirect (robots.txt excluded; sitemap
        files and the pages only sitemaps list are in `sitemap_urls`, `orphan_urls`, `out_of_scope_sitemap_urls`
        and `disallowed_urls`). Trap hosts are left out: they answer infinitely many URLs (`links_of` still
        knows their links, page by page)."""
        self._require_started()
        traps = self.trap_host_names()
        return {
            self._base(name) + path
            for name, site in self._sites.items()
            if name not in traps
            for path in site
            if path != "/robots.txt"
        }

    def is_trap_url(self, url: str) -> bool:
        """Whether a URL is on one of the farm's trap hosts."""
        self._require_started()
        return host_key(canonicalize(url)) in {self._base(name) for name in self.trap_host_names()}

    def links_of(self, url: str) -> list[str]:
        """Canonical absolute outlinks of a farm URL (a redirect's one link is its target); [] if unknown."""
        resource = self._resource(url)
        return list(resource.links) if resource is not None else []

    def _resource(self, url: str) -> _Resource | None:
        self._require_started()
        canonical = canonicalize(url)
        key = host_key(canonical)
        if key not in self.host_keys():
            return None
        name = key.split("://", 1)[1].rpartition(":")[0]
        return self._answer(name, canonical[len(key):])

    def _policies(self, token: str) -> dict[str, RobotsPolicy]:
        return {
            self._base(name): RobotsPolicy.parse(body, token) if body is not None else RobotsPolicy.allow_all()
            for name, body in ((name, self.robots_txt(name)) for name in self.host_names())
        }

    def expected_fetches(self, token: str, max_depth: int, with_sitemaps: bool = False) -> set[str]:
        """Farm URLs a correct crawl fetches within max_depth hops of the seeds (seeds are depth 0): BFS over
        the link graph, stopping at robots-disallowed URLs and at hosts outside the farm. Trap hosts are left
        out: how much of a trap a correct crawl fetches is set by the trap rules, not by the graph.

        with_sitemaps: also what sitemap discovery fetches at depth 0 — the /sitemap.xml probe of every seed
        host (404s too: a fetch is a request), the sitemaps robots.txt names, their index children, and the
        in-scope pages they list — each only where robots.txt allows it; listed pages' links follow at +1.
        A cycle-based crawl reaches sitemap-listed pages cycles later than depth 0 suggests: see
        `expected_fetches_sitemaps_only`."""
        policies = self._policies(token)
        for name in self.trap_host_names():
            del policies[self._base(name)]
        seen = set(self.seed_urls())
        frontier = list(seen)
        fetched: set[str] = set()
        if with_sitemaps:
            requests, listed = self._sitemap_discovery(policies)
            fetched |= requests
            frontier += [url for url in dict.fromkeys(listed) if url not in seen]
            seen.update(listed)
        for depth in range(max_depth + 1):
            next_frontier = []
            for url in frontier:
                policy = policies.get(host_key(url))
                if policy is None or not policy.allowed(url):
                    continue
                fetched.add(url)
                if depth == max_depth:
                    continue
                for link in self.links_of(url):
                    if link not in seen:
                        seen.add(link)
                        next_frontier.append(link)
            frontier = next_frontier
        return fetched

    def disallowed_urls(self, token: str) -> set[str]:
        """Farm URLs that some farm page links to or some farm sitemap lists, and robots.txt forbids: a correct
        crawl never requests them."""
        policies = self._policies(token)
        linked = {link for url in self.page_urls() for link in self.links_of(url)}
        linked |= {canonicalize(loc) for loc in self._listed_locs() if _is_url(loc)}
        return {url for url in linked if host_key(url) in policies and not policies[host_key(url)].allowed(url)}

    # ---- sitemap ground truth --------------------------------------------------------------------------

    def sitemap_urls(self) -> dict[str, str]:
        """Every sitemap file the farm serves -> how a crawler finds it: "robots", "index" or "probe"."""
        self._require_started()
        return {url: sitemap.found_via for url, sitemap in self._sitemap_files.items()}

    def sitemap_entries(self, url: str) -> list[dict[str, Any]]:
        """The entries of one sitemap file as the farm wrote them, refused ones included: loc (as written),
        lastmod (UTC datetime), changefreq, priority (None when absent). KeyError for a URL that is none."""
        self._require_started()
        return [dict(entry) for entry in self._sitemap_files[canonicalize(url)].entries]

    def orphan_urls(self) -> set[str]:
        """Pages no farm page links to that their own host's sitemap lists: only sitemap discovery finds them."""
        self._require_started()
        return set(self._orphans)

    def out_of_scope_sitemap_urls(self) -> set[str]:
        """Pages a sitemap lists outside its scope (on the neighbour host, linked from nowhere): never fetched."""
        self._require_started()
        return set(self._out_of_scope)

    def expected_fetches_sitemaps_only(self, token: str) -> set[str]:
        """The sitemap files and in-scope listed pages a crawl with sitemap discovery fetches, robots
        permitting, however many cycles that takes (404 probes left out: not sitemap files)."""
        policies = self._policies(token)
        requests, listed = self._sitemap_discovery(policies)
        allowed = {url for url in listed if policies[host_key(url)].allowed(url)}
        return (requests & self._sitemap_files.keys()) | allowed

    def _listed_locs(self) -> set[str]:
        """The loc, as written, of every urlset entry."""
        return {entry["loc"] for sitemap in self._sitemap_files.values() if sitemap.kind == "urlset"
                for entry in sitemap.entries}

    def _sitemap_discovery(self, policies: dict[str, RobotsPolicy]) -> tuple[set[str], list[str]]:
        """(sitemap requests, listed in-scope pages) of a crawl with sitemap discovery: the probe of every
        host in `policies` and the robots-named sitemaps, then index children, each fetched only if allowed.
        The farm lists nothing out of scope on a sitemap's own host (role-"robots" urlsets under /sitemaps/
        list the host's pages through robots.txt cross-submission), so "in scope" is "on the same host"."""
        self._require_started()
        roots = [key + PROBE_PATH for key in policies]
        roots += [url for url, sitemap in self._sitemap_files.items()
                  if sitemap.found_via == "robots" and host_key(url) in policies]
        requests: set[str] = set()
        listed: list[str] = []
        while roots:
            url = roots.pop(0)
            policy = policies.get(host_key(url))
            if url in requests or policy is None or not policy.allowed(url):
                continue
            requests.add(url)
            sitemap = self._sitemap_files.get(url)
            if sitemap is None:
                continue
            in_scope = [entry["loc"] for entry in sitemap.entries
                        if _is_url(entry["loc"]) and host_key(canonicalize(entry["loc"])) == host_key(url)]
            if sitemap.kind == "sitemapindex":
                roots += in_scope
            else:
                listed += in_scope
        return requests, listed

    def _require_started(self) -> None:
        if not self.port:
            raise RuntimeError("the site farm is not started: its URLs depend on its port")


def _is_url(text: str) -> bool:
    try:
        canonicalize(text)
    except ValueError:
        return False
    return True


def _month_path(date: datetime.date) -> str:
    return f"/calendar/{date.year:04d}/{date.month:02d}"


def _week_path(date: datetime.date) -> str:
    year, week, _ = date.isocalendar()
    return f"/calendar/{year:04d}/w{week:02d}"


def _day_path(date: datetime.date) -> str:
    return f"/calendar/{date.year:04d}/{date.month:02d}/{date.day:02d}"


def _shift(date: datetime.date, days: int) -> datetime.date | None:
    """The date `days` away, or None beyond the calendar's ends (years 1 and 9999)."""
    ordinal = date.toordinal() + days
    return datetime.date.fromordinal(ordinal) if 1 <= ordinal <= datetime.date.max.toordinal() else None


def _facet_path(filters: dict[str, str], page: int = 1) -> str:
    """The one canonical spelling of a filter set: facets in FACETS order, `page` last and only from 2 on."""
    params = [f"{facet}={filters[facet]}" for facet, _ in FACETS if facet in filters]
    if page > 1:
        params.append(f"page={page}")
    return "/search" + ("?" + "&".join(params) if params else "")


def _parse_facets(path: str) -> dict[str, str] | None:
    """The filters (and `page`) of a canonical faceted-search path, or None if the farm has no such page."""
    route, _, query = path.partition("?")
    if route != "/search":
        return None
    filters = dict(param.partition("=")[::2] for param in query.split("&") if param)
    allowed = dict(FACETS)
    if any(key != "page" and value not in allowed.get(key, ()) for key, value in filters.items()):
        return None
    page = filters.get("page", "1")
    if not (page.isascii() and page.isdigit() and len(page) <= 9):  # no absurd page numbers
        return None
    rest = {key: value for key, value in filters.items() if key != "page"}
    if path != _facet_path(rest, int(page)):  # one spelling per page: no page=1, no other order, no repeats
        return None
    return filters


def _topic_slug(index: int) -> str:
    """A large host's topic name: one word, then word pairs — no digits, so each topic is its own template."""
    words = len(_WORDS)
    return _WORDS[index] if index < words else f"{_WORDS[index % words]}-{_WORDS[index // words]}"


def _listings(locs: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """Urlset entries with a mix of fields: by position a recent, an old or no lastmod; a changefreq or none;
    a priority 0.1..1.0 or none."""
    entries = []
    for position, loc in enumerate(locs):
        lastmod = None
        if position % 3 == 0:  # within a week of SITEMAP_DATE
            lastmod = SITEMAP_DATE - datetime.timedelta(days=rng.randint(0, 5), hours=rng.randint(1, 23))
        elif position % 3 == 1:  # over a year old
            lastmod = SITEMAP_DATE - datetime.timedelta(days=rng.randint(400, 1500))
        entries.append({"loc": loc, "lastmod": lastmod, "changefreq": rng.choice((None, *CHANGEFREQS)),
                        "priority": None if position % 4 == 3 else rng.randint(1, 10) / 10})
    return entries


def _w3c(moment: datetime.datetime) -> str:
    """A lastmod as sitemaps write them: a bare date at midnight UTC, else a time in a +02:00 zone."""
    if moment.time() == datetime.time(0):
        return moment.date().isoformat()
    return moment.astimezone(datetime.timezone(datetime.timedelta(hours=2))).isoformat(timespec="seconds")


def _sitemap_xml(kind: str, entries: list[dict[str, Any]]) -> bytes:
    item = "url" if kind == "urlset" else "sitemap"
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f'<{kind} xmlns="{SITEMAP_NS}">']
    for entry in entries:
        fields = [f"<loc>{html.escape(entry['loc'])}</loc>"]
        if entry["lastmod"] is not None:
            fields.append(f"<lastmod>{_w3c(entry['lastmod'])}</lastmod>")
        if entry["changefreq"] is not None:
            fields.append(f"<changefreq>{entry['changefreq']}</changefreq>")
        if entry["priority"] is not None:
            fields.append(f"<priority>{entry['priority']:.1f}</priority>")
        lines.append(f"  <{item}>{''.join(fields)}</{item}>")
    lines.append(f"</{kind}>\n")
    return "\n".join(lines).encode("utf-8")


def read_request_log(path: str | Path) -> list[dict]:
    """The server's request log; a last line still being written is skipped."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.endswith("\n"):
                records.append(json.loads(line))
    return records


def requested_url(record: dict) -> str | None:
    """The canonical URL one logged request asked for; None when the request line does not make one."""
    try:
        return canonicalize(f"http://{record['host']}{record['path']}")
    except ValueError:
        return None


def politeness_violations(
    log: list[dict], delay_for_host: Callable[[str], float], tolerance_s: float = 0.0
) -> list[dict]:
    """Politeness judged from the server's log alone, per Host header (host and port), by the rule the daemon
    promises (DESIGN §2.1): from the end of one request to a host to the start of the next, at least its delay.
    `concurrent` — a request started before an earlier one to that host ended;
    `too_soon` — any other request that started less than delay_for_host(host) - tolerance_s after the latest
    end of an earlier request to that host (end to start: stricter than spacing the starts)."""
    by_host: dict[str, list[dict]] = defaultdict(list)
    for record in log:
        by_host[record["host"]].append(record)
    violations = []
    for host, records in sorted(by_host.items()):
        records.sort(key=lambda r: r["start"])
        required = delay_for_host(host)
        latest_end = records[0]["end"]
        latest_end_path = records[0]["path"]
        for current in records[1:]:
            gap = current["start"] - latest_end
            if gap < 0:
                violations.append(
                    {"kind": "concurrent", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": latest_end_path, "previous_end": latest_end}
                )
            elif gap < required - tolerance_s:
                violations.append(
                    {"kind": "too_soon", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": latest_end_path, "gap_s": gap, "required_s": required}
                )
            if current["end"] > latest_end:
                latest_end, latest_end_path = current["end"], current["path"]
    return violations
