"""The site farm: many deterministic virtual web sites on one loopback aiohttp server, for tests and `crawl demo`.

Virtual hosts are chosen by the Host header; the crawler reaches them through `fetch.static_hosts`. The farm
knows its own link graph and robots files, so a test can compute what a correct crawl must fetch
(`expected_fetches`). The server writes its own request log, and `politeness_violations` judges politeness
from that log alone — never from the crawler's account of itself.
"""

from __future__ import annotations

import asyncio
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


@dataclass
class FarmSpec:
    """Shape of the farm. With the defaults every page of a host is within 2 hops of its home page."""

    hosts: int = 24
    pages_per_host: int = 60
    seed: int = 7
    cross_host_links: bool = True
    latency_s: float = 0.01  # server think time per request, so overlapping requests show up in the log


@dataclass(frozen=True)
class _Resource:
    """One URL the farm answers: its response and the canonical outlinks a correct parser finds in it."""

    status: int
    body: bytes
    content_type: str = HTML_TYPE
    location: str | None = None
    links: tuple[str, ...] = ()


def _host_role(index: int) -> str:
    """Robots variant of a host, cycling through the four kinds the crawl must handle."""
    return ("cgi", "private", "no_robots", "query")[index % 4]


class SiteFarm:
    """A loopback web server with `spec.hosts` generated sites; also the ground truth about them."""

    def __init__(self, spec: FarmSpec, log_path: str | Path):
        if spec.hosts < 1 or spec.pages_per_host < 1:
            raise ValueError("a farm needs at least one host and one page per host")
        self.spec = spec
        self.log_path = Path(log_path)
        self.port = 0
        self._sites: dict[str, dict[str, _Resource]] = {}
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
        self._sites = {name: self._build_site(index, name) for index, name in enumerate(self.host_names())}
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
        site = self._sites.get(host_header.rpartition(":")[0].lower() or host_header.lower(), {})
        resource = site.get(request.raw_path) or _Resource(404, b"<html><title>Not found</title></html>")
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

    def host_names(self) -> list[str]:
        return [f"site-{i:03d}.{DOMAIN}" for i in range(self.spec.hosts)]

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
        """The robots.txt body a host serves, or None when it answers 404 (allow all) or is not a farm host."""
        names = self.host_names()
        if host_name not in names:
            return None
        index = names.index(host_name)
        role = _host_role(index)
        if role == "no_robots":
            return None
        if role == "cgi":
            return "# farm robots\nUser-agent: *\nDisallow: /cgi-bin/\n\nUser-agent: otherbot\nDisallow: /\n"
        if role == "private":
            return "User-agent: *\nDisallow: /private/\nAllow: /private/open.html\n"
        delay = f"Crawl-delay: {CRAWL_DELAY_S}\n" if index == 3 else ""
        return f"User-agent: *\n{delay}Disallow: /private/\nDisallow: /*?print=1$\n"

    def crawl_delay(self, host_name: str) -> float | None:
        robots = self.robots_txt(host_name)
        return RobotsPolicy.parse(robots, "*").crawl_delay_s if robots is not None else None

    def politeness_delay(self, host: str, min_delay_s: float) -> float:
        """The delay a polite crawler keeps for a host (a name or a Host header with port)."""
        return max(min_delay_s, self.crawl_delay(host.rpartition(":")[0] or host) or 0.0)

    def page_urls(self) -> set[str]:
        """Every URL the farm answers with a page or a redirect (robots.txt excluded)."""
        self._require_started()
        return {
            self._base(name) + path for name, site in self._sites.items() for path in site if path != "/robots.txt"
        }

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
        return self._sites[name].get(canonical[len(key):])

    def _policies(self, token: str) -> dict[str, RobotsPolicy]:
        return {
            self._base(name): RobotsPolicy.parse(body, token) if body is not None else RobotsPolicy.allow_all()
            for name, body in ((name, self.robots_txt(name)) for name in self.host_names())
        }

    def expected_fetches(self, token: str, max_depth: int) -> set[str]:
        """Farm URLs a correct crawl fetches within max_depth hops of the seeds (seeds are depth 0): BFS over
        the link graph, stopping at robots-disallowed URLs and at hosts outside the farm."""
        policies = self._policies(token)
        seen = set(self.seed_urls())
        frontier = list(seen)
        fetched: set[str] = set()
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
        """Farm URLs that some farm page links to and robots.txt forbids: a correct crawl never requests them."""
        policies = self._policies(token)
        linked = {link for url in self.page_urls() for link in self.links_of(url)}
        return {url for url in linked if host_key(url) in policies and not policies[host_key(url)].allowed(url)}

    def _require_started(self) -> None:
        if not self.port:
            raise RuntimeError("the site farm is not started: its URLs depend on its port")


def read_request_log(path: str | Path) -> list[dict]:
    """The server's request log; a last line still being written is skipped."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.endswith("\n"):
                records.append(json.loads(line))
    return records


def politeness_violations(
    log: list[dict], delay_for_host: Callable[[str], float], tolerance_s: float = 0.0
) -> list[dict]:
    """Politeness judged from the server's log alone, per Host header (host and port):
    `concurrent` — a request started before an earlier one to that host ended;
    `too_soon` — consecutive request starts closer than delay_for_host(host) - tolerance_s."""
    by_host: dict[str, list[dict]] = defaultdict(list)
    for record in log:
        by_host[record["host"]].append(record)
    violations = []
    for host, records in sorted(by_host.items()):
        records.sort(key=lambda r: r["start"])
        required = delay_for_host(host)
        latest_end = records[0]["end"]
        latest_end_path = records[0]["path"]
        for previous, current in zip(records, records[1:], strict=False):
            if current["start"] < latest_end:
                violations.append(
                    {"kind": "concurrent", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": latest_end_path, "previous_end": latest_end}
                )
            gap = current["start"] - previous["start"]
            if gap < required - tolerance_s:
                violations.append(
                    {"kind": "too_soon", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": previous["path"], "gap_s": gap, "required_s": required}
                )
            if current["end"] > latest_end:
                latest_end, latest_end_path = current["end"], current["path"]
    return violations
