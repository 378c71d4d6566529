"""Page analysis: the content fields and outlinks of one fetched WARC record, a page or a sitemap. Pure (no
Spark, no I/O): parse calls these per record in its tasks, and bench/parse.py times them alone.

Every outlink and sitemap entry is keyed by the URL the crawl stores for it (`crawler.scope.Scope.stored_url`),
so a `links.to_url_id` is the `urls.url_id` that discovery gives the same target.
"""

from __future__ import annotations

from typing import Any

from crawler.fingerprints import content_hash, simhash
from crawler.languages import detect_languages
from crawler.links import Outlink, extract, is_html, robots_directives
from crawler.scope import Scope
from crawler.sitemaps import SitemapLimits, SitemapOrigin, parse_sitemap
from crawler.urls import canonicalize, url_id
from crawler.warcread import WarcHttpRecord


def analyze_record(
    record: WarcHttpRecord,
    url: str,
    content_type: str | None,
    *,
    max_outlinks: int,
    shingle: int,
    scope: Scope | None = None,
    robots_token: str | None = None,
    max_parse_seconds: float | None = None,
    language_max_chars: int = 0,
) -> dict[str, Any]:
    """The content fields of one fetched page from its WARC record (no Spark, no I/O). A page whose extraction ran
    out of `max_parse_seconds` keeps what was extracted but gets no SimHash (its text may be cut or empty); its
    languages come from what was extracted. Languages are detected on the first `language_max_chars` characters of
    the visible text (0: not detected); a page that is not HTML has no text, so no languages. `text` is the visible
    text (None: not HTML), which parse writes to the WET file and takes out of the row (`pages` does not keep it).

    Raises ValueError when the record is not the response for `url` (a wrong offset).
    """
    if record.record_type != "response":
        raise ValueError(f"WARC record at offset is a {record.record_type!r} record, not a response")
    if record.target_uri is None or canonicalize(record.target_uri) != url:
        raise ValueError(f"WARC record is for {str(record.target_uri)[:200]!r}, not for this URL")
    content_type = content_type or record.content_type
    fields: dict[str, Any] = {"content_type": content_type, "content_hash": content_hash(record.payload)}
    if not is_html(content_type, record.payload):
        noindex, nofollow = robots_directives(record.headers.get("x-robots-tag"), robots_token)
        fields.update(meta_noindex=noindex, meta_nofollow=nofollow, outlinks=[], text=None)
        return fields
    page = extract(record.payload, url, max_outlinks=max_outlinks, headers=record.headers, robots_token=robots_token,
                   max_parse_seconds=max_parse_seconds)
    fields.update(
        title=page.title,
        canonical_url=page.canonical_url,
        meta_noindex=page.meta_noindex,
        meta_nofollow=page.meta_nofollow,
        language=page.language,
        languages=detect_languages(page.text, language_max_chars),
        outlink_count=len(page.outlinks),
        outlinks_skipped=page.outlinks_skipped,
        parse_time_limited=page.time_limited,
        simhash=None if page.time_limited else simhash(page.text, shingle),
        outlinks=outlink_rows(page.outlinks, scope),
        text=page.text,
    )
    return fields


def analyze_sitemap(record: WarcHttpRecord, url: str, content_type: str | None, origin: str,
                    limits: SitemapLimits, scope: Scope | None = None) -> dict[str, Any]:
    """The content fields of one fetched sitemap (no Spark, no I/O): its entries and child sitemaps become
    outlinks carrying lastmod/changefreq/priority (entries) or their own origin (children). Refused entries are
    counted by reason in `sitemap_refused`; a file read only in part (a cap, malformed XML, a bomb) keeps the
    entries before that point and says why in `parse_error`. Raises ValueError on a wrong record, as
    `analyze_record` does."""
    if record.record_type != "response":
        raise ValueError(f"WARC record at offset is a {record.record_type!r} record, not a response")
    if record.target_uri is None or canonicalize(record.target_uri) != url:
        raise ValueError(f"WARC record is for {str(record.target_uri)[:200]!r}, not for this URL")
    found_via = SitemapOrigin.decode(origin)
    result = parse_sitemap(url, record.payload, found_via, limits, content_type or record.content_type)
    child_origin = found_via.child().encode()
    rows: dict[str, dict[str, Any]] = {}  # by stored URL: entries that become one URL once stripped are one row
    for entry in result.entries:
        target = _stored(entry.loc, scope)
        rows.setdefault(target, {
            "to_url_id": url_id(target), "to_url": target, "rel_nofollow": False, "rel_flags": ["sitemap"],
            "sitemap_lastmod": entry.lastmod, "sitemap_changefreq": entry.changefreq and entry.changefreq.value,
            "sitemap_priority": entry.priority})
    for child in result.sitemaps:
        target = _stored(child.loc, scope)
        rows.setdefault(target, {
            "to_url_id": url_id(target), "to_url": target, "rel_nofollow": False, "rel_flags": ["sitemapindex"],
            "sitemap_lastmod": child.lastmod, "sitemap_origin": child_origin})
    outlinks = list(rows.values())
    error = result.error
    if record.truncated and error is None:
        error = "truncated at sitemaps.max_fetch_bytes"
    return {
        "content_type": content_type or record.content_type,
        "content_hash": content_hash(record.payload),
        "outlink_count": len(outlinks),
        "sitemap_urls": len(outlinks),
        "sitemap_refused": sorted(result.refused.items()),
        "parse_error": f"sitemap ({result.kind or 'unrecognised'}): {error}" if error else None,
        "outlinks": outlinks,
    }


def _stored(canonical_url: str, scope: Scope | None) -> str:
    return canonical_url if scope is None else scope.stored_url(canonical_url)


def outlink_rows(outlinks: list[Outlink], scope: Scope | None) -> list[dict[str, Any]]:
    """links rows keyed by the URL the crawl stores (`Scope.stored_url`); links that become the same URL once
    stripped are one row (the first)."""
    rows: dict[str, dict[str, Any]] = {}
    for link in outlinks:
        target = _stored(link.url, scope)
        if target in rows:
            rows[target]["rel_nofollow"] &= link.nofollow  # nofollow only if every link to it is
            continue
        rows[target] = {
            "to_url_id": url_id(target),
            "to_url": target,
            "anchor_text": link.anchor_text,
            "rel_nofollow": link.nofollow,
            "rel_flags": list(link.rel),
        }
    return list(rows.values())
