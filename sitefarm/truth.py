"""The ground truth about the farm's sites: the farm knows its own link graph, robots files and sitemaps, so a
test can compute what a correct crawl must fetch (`expected_fetches`) and must never request (`disallowed_urls`),
and which answers a recrawl finds unchanged (`served_unchanged_without_validators`, `served_not_modified`) or
changed (`changing_urls`)."""

from __future__ import annotations

from typing import Any

from crawler.robots import RobotsPolicy
from crawler.urls import canonicalize, host_key
from sitefarm.fresh import article_path
from sitefarm.resources import HONOURS, Resource
from sitefarm.sites import PROBE_PATH, FarmSpec, Sites


class FarmTruth(Sites):
    """What a correct crawl of the farm's sites fetches, never requests, and finds in sitemaps."""

    @classmethod
    def served_at(cls, spec: FarmSpec, port: int) -> FarmTruth:
        """The truth about a farm of `spec` that another process serves on `port` (`crawl demo`'s, say): the same
        sites, built for that port, with no server here."""
        truth = cls(spec)
        truth.port = port
        truth._build_sites()
        return truth

    # ---- ground truth ----------------------------------------------------------------------------------

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

    def _resource(self, url: str) -> Resource | None:
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

    def fresh_listings(self, until: float) -> dict[str, float]:
        """Every article the fresh hosts have listed in their sitemaps by `until` (Unix seconds) -> when it was
        listed: the moment a crawler could first learn of it."""
        self._require_started()
        schedule = self.fresh_schedule
        return {self._base(name) + article_path(n): schedule.listed_at(n)
                for name in self.fresh_host_names() for n in range(schedule.listed(until))}

    # ---- validators and changing pages (FarmSpec.validators, FarmSpec.changing_share) ---------------------

    def _stored_answers(self) -> dict[str, tuple[str, str, Resource]]:
        """Every URL the farm answers from what it built (the link graph's pages, sitemap files and the pages only
        sitemaps list; not robots.txt, not the trap and fresh hosts' generated answers) -> (host, path, resource)."""
        self._require_started()
        answers = {}
        for table in (self._sites, self._sitemap_pages):
            for name, site in table.items():
                if name in self.trap_host_names():
                    continue
                for path, resource in site.items():
                    if path != "/robots.txt":
                        answers[self._base(name) + path] = (name, path, resource)
        return answers

    def changing_urls(self) -> set[str]:
        """The pages whose body changes at every request (FarmSpec.changing_share): never the same bytes twice."""
        return {url for url, (name, path, _) in self._stored_answers().items()
                if self.changes_between_fetches_at(name, path)}

    def served_unchanged_without_validators(self) -> set[str]:
        """The URLs the farm answers with a 200 of the same bytes at every request and never with a 304: pages,
        sitemap files and orphans that do not change, on hosts that ignore validators or send none. A recrawl
        stores each again as a revisit record (identical payload), never as a second response record."""
        return {url for url, (name, path, resource) in self._stored_answers().items()
                if resource.status == 200 and not self.changes_between_fetches_at(name, path)
                and self.validator_role(name) != HONOURS}

    def served_not_modified(self) -> set[str]:
        """The URLs a host that honours validators answers with a 304 when asked with the validators of its last
        answer: its 200 pages that do not change."""
        return {url for url, (name, path, resource) in self._stored_answers().items()
                if resource.status == 200 and not self.changes_between_fetches_at(name, path)
                and self.validator_role(name) == HONOURS}

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


def _is_url(text: str) -> bool:
    try:
        canonicalize(text)
    except ValueError:
        return False
    return True
