"""What the farm serves, written out: one Resource per URL, the HTML page and sitemap file writers every host
shares, the words of its pages, and how a host of each validator role answers a conditional request
(`conditional_answer`). Every farm host is a name under DOMAIN."""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import html
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crawler.urls import resolve

DOMAIN = "farm.test"
HTML_TYPE = "text/html; charset=utf-8"
WORDS = (
    "crawl", "fetch", "parse", "index", "frontier", "segment", "host", "robots", "politeness", "delay", "bucket",
    "lease", "merge", "delta", "table", "spark", "daemon", "warc", "record", "digest", "link", "anchor", "title",
    "section", "page", "farm", "site", "query", "fragment", "redirect", "sitemap", "canonical", "duplicate",
    "simhash", "shingle", "revisit", "interval", "backoff", "budget", "scope", "depth", "seed",
)
SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
# The farm's "today" for lastmod values: fixed, so the farm stays deterministic and takes no clock.
SITEMAP_DATE = datetime.datetime(2026, 1, 15, tzinfo=datetime.UTC)
CHANGEFREQS = ("always", "hourly", "daily", "weekly", "monthly", "yearly", "never")


@dataclass(frozen=True)
class Resource:
    """One URL the farm answers: its response and the canonical outlinks a correct parser finds in it."""

    status: int
    body: bytes
    content_type: str = HTML_TYPE
    location: str | None = None
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sitemap:
    """One sitemap file as the farm wrote it: how a crawler finds it and its entries (parsed values)."""

    found_via: str  # "robots", "index" or "probe"
    kind: str  # "sitemapindex" or "urlset"
    entries: tuple[dict[str, Any], ...]


def filler_text(size: int, rng: random.Random) -> str:
    """`size` characters of filler words, drawn once and sliced by `html_page` for pages of a chosen size (text as
    compressible as the pages' own words, without drawing a word at a time for every kilobyte)."""
    return " ".join(rng.choice(WORDS) for _ in range(size // 6 + 1))[:size]


def html_page(url: str, title: str, hrefs: list[str], rng: random.Random, size: int = 0,
              filler: str = "") -> Resource:
    """An HTML page of filler words from `rng` linking to `hrefs`, with the canonical outlinks they resolve to;
    with `size`, padded to about that many bytes with a slice of `filler` from a random place (wrapping)."""
    paragraphs = []
    for _ in range(3):
        paragraphs.append("<p>" + " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 90))) + "</p>")
    if size and filler:
        start, left = rng.randrange(len(filler)), size
        while left > 0:
            piece = filler[start:start + min(left, 4096)] or filler[:min(left, 4096)]
            paragraphs.append(f"<p>{piece}</p>")
            start, left = (start + len(piece)) % len(filler), left - len(piece) - 7
    anchors = "\n".join(f'<li><a href="{html.escape(href)}">link {n}</a></li>' for n, href in enumerate(hrefs))
    title = html.escape(title)
    document = (
        f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n"
        f"<body><h1 id=\"top\">{title}</h1>\n{''.join(paragraphs)}\n<ul>\n{anchors}\n</ul></body></html>\n"
    )
    links = dict.fromkeys(link for link in (resolve(url, href) for href in hrefs) if link is not None)
    return Resource(200, document.encode("utf-8"), links=tuple(links))


def listings(locs: list[str], rng: random.Random) -> list[dict[str, Any]]:
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


def sitemap_xml(kind: str, entries: list[dict[str, Any]]) -> bytes:
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


# ---- validators: how a host answers a conditional request (FarmSpec.validators) ----------------------------

HONOURS = "honours"   # ETag and Last-Modified sent; a matching If-None-Match (else If-Modified-Since) gets a 304
IGNORES = "ignores"   # the same headers sent, but every request gets a 200 with the whole body
NO_VALIDATORS = "none"  # no validators sent; every request gets a 200 with the whole body
VALIDATOR_ROLES = (HONOURS, IGNORES, NO_VALIDATORS)
LAST_MODIFIED = "Thu, 15 Jan 2026 00:00:00 GMT"  # SITEMAP_DATE: an unchanging page's Last-Modified


def revised(resource: Resource, revision: int) -> Resource:
    """A changing page's answer at its `revision`-th request: the same page and links with a line that differs."""
    marker = b"</body>"
    body = resource.body.replace(marker, f"<p>revision {revision}</p>{marker.decode()}".encode(), 1)
    return Resource(resource.status, body, resource.content_type, resource.location, resource.links)


def conditional_answer(resource: Resource, role: str, changing: bool, request_headers: Mapping[str, str],
                       now: float) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, validator headers) of a 200 resource for a host of `role`: a HONOURS host answers 304 when
    the request's If-None-Match names the body's ETag (or, without one, when If-Modified-Since is not before the
    Last-Modified of a page that does not change); a changing page's Last-Modified is `now`."""
    if resource.status != 200 or role == NO_VALIDATORS:
        return resource.status, resource.body, {}
    etag = '"' + hashlib.sha1(resource.body).hexdigest()[:20] + '"'  # noqa: S324 - a tag, not security
    modified = email.utils.formatdate(now, usegmt=True) if changing else LAST_MODIFIED
    headers = {"ETag": etag, "Last-Modified": modified}
    if role == HONOURS:
        if_none_match = request_headers.get("If-None-Match")
        if if_none_match is not None:
            if etag in (tag.strip() for tag in if_none_match.split(",")):
                return 304, b"", headers
        elif not changing and _not_before(request_headers.get("If-Modified-Since"), LAST_MODIFIED):
            return 304, b"", headers
    return 200, resource.body, headers


def _not_before(value: str | None, reference: str) -> bool:
    try:
        return value is not None and (email.utils.parsedate_to_datetime(value)
                                      >= email.utils.parsedate_to_datetime(reference))
    except (TypeError, ValueError):
        return False
