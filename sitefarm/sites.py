"""The farm's sites: their shape (FarmSpec), host names and roles, robots files, and every resource each host
answers — the ordinary sites and their sitemaps, plus the trap and large hosts of `sitefarm.traps` — built once
the server's port is known, since the URLs in pages and sitemaps carry it.

Sitemaps (FarmSpec.sitemaps, on by default) on the ordinary sites, by host index (`_sitemap_role`): hosts
0, 3, 6, ... that serve a robots.txt name a sitemap index there (a gzip child and a plain child), hosts 1, 4,
7, ... serve only /sitemap.xml (found by probing), the rest have none (404). Their urlsets list existing
pages, orphan pages no HTML page links to, one URL on the neighbour host (outside the sitemap's scope), one
malformed loc and, where robots.txt disallows something, one disallowed URL. `sitemap_urls`,
`sitemap_entries`, `orphan_urls`, `out_of_scope_sitemap_urls` and `expected_fetches(..., with_sitemaps=True)`
(`sitefarm.truth`) say what a correct crawl makes of them.
"""

from __future__ import annotations

import datetime
import gzip
import math
import random
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from crawler.robots import RobotsPolicy
from crawler.urls import canonicalize, host_key
from sitefarm.fresh import FreshSchedule, fresh_host_name, fresh_page, fresh_robots
from sitefarm.resources import (
    DOMAIN,
    NO_VALIDATORS,
    SITEMAP_DATE,
    VALIDATOR_ROLES,
    Resource,
    Sitemap,
    conditional_answer,
    filler_text,
    html_page,
    listings,
    revised,
    sitemap_xml,
)
from sitefarm.traps import (
    CALENDAR_HOST,
    EXTRA_ROBOTS,
    FACETS_HOST,
    MAX_LARGE_HOST_PAGES,
    calendar_page,
    facets_page,
    large_site,
    trap_home,
)

PAGES_PER_SECTION = 10
CRAWL_DELAY_S = 0.5
OUTSIDE_LINKS = ("http://outside.example/", "https://www.outside.example/about?from=farm")
PROBE_PATH = "/sitemap.xml"
SITEMAP_INDEX_PATH = "/sitemaps/index.xml"
SITEMAP_GZ_PATH = "/sitemaps/pages.xml.gz"
SITEMAP_EXTRA_PATH = "/sitemaps/extra.xml"
MALFORMED_LOC = "ht!tp://bad"
SITEMAP_LISTED_PAGES = 6  # existing pages each host's urlsets list


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
    # traps.ARTICLES_PER_TOPIC (home -> topic index -> article: every page within 2 hops of the home page).
    large_host_pages: tuple[int, ...] = ()
    # Sitemaps on the ordinary sites (see the module docstring); HTML pages are the same with or without them.
    sitemaps: bool = True
    # Ordinary pages padded to a size drawn from [low, high] KB (the bench's realistic pages); (0, 0): unpadded.
    page_kb: tuple[int, int] = (0, 0)
    # Paths (with query) at which every host reads the request and closes the connection without an answer.
    # Such a request is logged like any other (status None, "dropped": true): the politeness judge counts
    # every request the server saw, answered or not.
    dropped_paths: tuple[str, ...] = ()
    # Fresh hosts, fresh-<i>.farm.test (sitefarm.fresh): a new article in the sitemap every fresh_interval_s,
    # counted from the farm's start, and a home page that changes with it.
    fresh_hosts: int = 0
    fresh_interval_s: float = 60.0
    # Validators on the ordinary sites (`validator_role`): each host honours them (ETag and Last-Modified, a 304
    # for a match), ignores them (the same headers, always a 200 with the whole body) or sends none. Off, no host
    # sends validators (every host "none"). Other hosts never send them.
    validators: bool = False
    # The share of the ordinary sites' HTML pages (chosen by a hash of host name and path) whose body changes at
    # every request (`revised`), whatever their host's role.
    changing_share: float = 0.0


def _validator_role(index: int) -> str:
    """How an ordinary site answers conditional requests (with FarmSpec.validators), mixed apart from its robots
    and sitemap roles."""
    return VALIDATOR_ROLES[(index + index // 3) % 3]


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


class Sites:
    """The farm's hosts for one spec and every resource they answer; built by `_build_sites` once the port is known."""

    def __init__(self, spec: FarmSpec):
        if spec.hosts < 1 or spec.pages_per_host < 1:
            raise ValueError("a farm needs at least one host and one page per host")
        if spec.fresh_hosts < 0 or spec.fresh_interval_s <= 0:
            raise ValueError("fresh hosts: a count of 0 or more and an interval above 0")
        if not 0.0 <= spec.changing_share <= 1.0:
            raise ValueError("changing_share: a share from 0 to 1")
        if not all(1 <= pages <= MAX_LARGE_HOST_PAGES for pages in spec.large_host_pages):
            raise ValueError(f"a large host has 1 to {MAX_LARGE_HOST_PAGES} articles")
        self.spec = spec
        self.port = 0
        self._sites: dict[str, dict[str, Resource]] = {}
        # what only sitemaps lead to (sitemap files, orphan pages), kept apart so page_urls stays the link graph
        self._sitemap_pages: dict[str, dict[str, Resource]] = {}
        self._sitemap_files: dict[str, Sitemap] = {}
        self._orphans: set[str] = set()
        self._out_of_scope: set[str] = set()
        self._filler = filler_text(256 * 1024, random.Random(spec.seed)) if spec.page_kb[1] else ""
        # The fresh hosts' clock (Unix seconds; a test may set another) and their schedule, from the farm's start.
        self.clock: Callable[[], float] = time.time
        self.fresh_schedule = FreshSchedule(0.0, spec.fresh_interval_s)
        self._revisions: dict[tuple[str, str], int] = {}  # requests so far of each changing page (the server's)

    # ---- site generation -------------------------------------------------------------------------------

    def _build_sites(self) -> None:
        """Every host's resources, for the port just bound."""
        self._sites = {name: self._build_site(index, name) for index, name in enumerate(self._site_names())}
        self._sites.update({name: trap_home(name, self._generated) for name in self.trap_host_names()})
        self._sites.update(
            {name: large_site(name, pages, self._generated)
             for name, pages in zip(self.large_host_names(), self.spec.large_host_pages, strict=True)}
        )
        if self.spec.sitemaps:
            self._build_sitemaps()
        self.fresh_schedule = FreshSchedule(self.clock(), self.spec.fresh_interval_s)

    def _answer(self, name: str, path: str) -> Resource | None:
        """The resource at path + query on a host: built at start, or generated now on a trap host."""
        resource = self._sites.get(name, {}).get(path)
        if resource is None:
            resource = self._sitemap_pages.get(name, {}).get(path)
        if resource is None and name == CALENDAR_HOST:
            return calendar_page(path, self._generated)
        if resource is None and name == FACETS_HOST:
            return facets_page(path, self._generated)
        if resource is None and name in self.fresh_host_names():
            if path == "/robots.txt":
                return Resource(200, fresh_robots(self._base(name)).encode("utf-8"),
                                content_type="text/plain; charset=utf-8")
            return fresh_page(name, self._base(name), path, self.clock(), self.fresh_schedule, self.spec.seed)
        return resource

    def respond(self, name: str, path: str, request_headers: Mapping[str, str]) -> tuple[Resource, int, bytes,
                                                                                     dict[str, str]]:
        """What the farm answers at path + query on a host, as (resource, status, body, validator headers): the
        resource as built, a changing page revised at each request, and the host's validator role applied."""
        resource = self._answer(name, path) or Resource(404, b"<html><title>Not found</title></html>")
        changing = self.changes_between_fetches_at(name, path)
        if changing:
            revision = self._revisions[(name, path)] = self._revisions.get((name, path), 0) + 1
            resource = revised(resource, revision)
        status, body, headers = conditional_answer(resource, self.validator_role(name), changing, request_headers,
                                                   self.clock())
        return resource, status, body, headers

    def validator_role(self, name: str) -> str:
        """How a host answers conditional requests: `resources.HONOURS`, `IGNORES` or `NO_VALIDATORS` (every host
        without FarmSpec.validators, and every host but the ordinary sites)."""
        names = self._site_names()
        if not self.spec.validators or name not in names:
            return NO_VALIDATORS
        return _validator_role(names.index(name))

    def changes_between_fetches_at(self, name: str, path: str) -> bool:
        """Whether the page at path + query on a host changes at every request (FarmSpec.changing_share): an HTML
        page of an ordinary site, chosen by a hash of host name and path (not the port: the same pages each run)."""
        share = self.spec.changing_share
        if not share:
            return False
        resource = self._sites.get(name, {}).get(path)
        if resource is None or resource.status != 200 or path == "/robots.txt":
            return False
        return zlib.crc32(f"{self.spec.seed}:{name}{path}".encode()) % 10_000 < share * 10_000

    def _sections(self) -> int:
        return max(1, math.ceil(self.spec.pages_per_host / PAGES_PER_SECTION))

    def _base(self, name: str) -> str:
        return f"http://{name}:{self.port}"

    def _build_site(self, index: int, name: str) -> dict[str, Resource]:
        """Every resource of one host, keyed by path + query exactly as a canonical URL spells it."""
        rng = random.Random(f"{self.spec.seed}:{index}")
        base = self._base(name)
        role = _host_role(index)
        sections = self._sections()
        pages = self.spec.pages_per_host
        site: dict[str, Resource] = {}

        low, high = self.spec.page_kb

        def page(path: str, title: str, hrefs: list[str]) -> None:
            size = rng.randint(low * 1024, high * 1024) if high else 0
            site[path] = html_page(base + path, title, hrefs, rng, size, self._filler)

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
            site["/old/page-0.html"] = Resource(
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
                site[f"/section/{s}/page-{k}.html?print=1"] = html_page(
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
            Resource(200, robots.encode("utf-8"), content_type="text/plain; charset=utf-8")
            if robots is not None
            else Resource(404, b"not found", content_type="text/plain; charset=utf-8")
        )
        return site

    def _generated(self, name: str, path: str, title: str, hrefs: list[str]) -> Resource:
        """A page made on request, its words seeded by its URL so every answer for it is the same."""
        rng = random.Random(f"{self.spec.seed}:{name}:{path}")
        return html_page(self._base(name) + path, title, hrefs, rng)

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
                self._add_sitemap(base + PROBE_PATH, "probe", "urlset", listings(listed + unlinked, rng))
                continue
            children = (base + SITEMAP_GZ_PATH, base + SITEMAP_EXTRA_PATH)
            self._add_sitemap(children[0], "index", "urlset", listings(listed, rng))
            self._add_sitemap(children[1], "index", "urlset", listings(unlinked, rng))
            index_entries = [
                {"loc": url, "lastmod": SITEMAP_DATE - datetime.timedelta(days=n + 1, hours=3),
                 "changefreq": None, "priority": None}
                for n, url in enumerate(children)
            ]
            self._add_sitemap(base + SITEMAP_INDEX_PATH, "robots", "sitemapindex", index_entries)

    def _add_sitemap(self, url: str, found_via: str, kind: str, entries: list[dict[str, Any]]) -> None:
        """Serve one sitemap file (gzip bytes, not a Content-Encoding, when its name ends in .gz)."""
        body = sitemap_xml(kind, entries)
        content_type = "application/xml"
        if url.endswith(".gz"):
            body, content_type = gzip.compress(body, mtime=0), "application/gzip"
        key = host_key(url)
        name = key.split("://", 1)[1].rpartition(":")[0]
        self._sitemap_pages.setdefault(name, {})[url[len(key):]] = Resource(200, body, content_type=content_type)
        self._sitemap_files[url] = Sitemap(found_via, kind, tuple(entries))

    # ---- hosts and robots ------------------------------------------------------------------------------

    def _site_names(self) -> list[str]:
        return [f"site-{i:03d}.{DOMAIN}" for i in range(self.spec.hosts)]

    def host_names(self) -> list[str]:
        """Every host: the `spec.hosts` sites first, then the trap hosts, the large hosts, the fresh hosts."""
        return [*self._site_names(), *self.trap_host_names(), *self.large_host_names(), *self.fresh_host_names()]

    def trap_host_names(self) -> list[str]:
        return [CALENDAR_HOST, FACETS_HOST] if self.spec.trap_hosts else []

    def large_host_names(self) -> list[str]:
        return [f"large-{i}.{DOMAIN}" for i in range(len(self.spec.large_host_pages))]

    def fresh_host_names(self) -> list[str]:
        return [fresh_host_name(i) for i in range(self.spec.fresh_hosts)]

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
        if host_name in self.fresh_host_names():
            return fresh_robots(self._base(host_name))
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

    def _require_started(self) -> None:
        if not self.port:
            raise RuntimeError("the site farm is not started: its URLs depend on its port")
