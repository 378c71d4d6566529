"""HTML extraction for parse: title, base, outlinks, canonical hint, meta robots, visible text, language.

Pure (no Spark, no network) so parse jobs and tests call the same rules. Hostile input is the normal case:
undecodable bytes are replaced, never raised; outlinks are resolved and canonicalized through
`crawler.urls.resolve` (anything that is not an http(s) URL is dropped) and capped.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from crawler.urls import resolve

TITLE_MAX_CHARS = 1000
ANCHOR_MAX_CHARS = 500
LANGUAGE_MAX_CHARS = 35
CHARSET_PRESCAN_BYTES = 4096
HTML_TYPES = ("text/html", "application/xhtml+xml")

_SPACE = re.compile(r"\s+")
_CHARSET_PARAM = re.compile(r"""charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE)
_ROBOTS_WORD = re.compile(r"[a-z_\-]+")
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# Labels browsers decode differently from Python's codec of the same name (WHATWG Encoding Standard).
_CHARSET_ALIASES = {"iso-8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "us-ascii": "cp1252",
                    "ascii": "cp1252", "x-user-defined": "cp1252"}
_HIDDEN_TAGS = ["script", "style", "noscript", "template"]


@dataclass(frozen=True)
class Outlink:
    url: str                      # canonical absolute URL
    anchor_text: str | None
    nofollow: bool
    rel: tuple[str, ...]          # rel tokens, lowercased, in document order


@dataclass(frozen=True)
class ParsedPage:
    title: str | None
    base_href: str | None         # the resolved <base href> in force, None if the page has none
    outlinks: list[Outlink]
    canonical_url: str | None     # link rel=canonical, resolved; a hint only
    meta_noindex: bool
    meta_nofollow: bool
    text: str                     # visible text (no script/style), whitespace-collapsed, for SimHash
    language: str | None
    charset: str | None           # codec used to decode the bytes (None when given text)


def is_html(content_type: str | None, payload: bytes = b"") -> bool:
    """HTML by media type; without one, by a cheap sniff of the first bytes."""
    if content_type:
        return content_type.split(";", 1)[0].strip().lower() in HTML_TYPES
    head = payload[:512].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _codec(label: str | bytes | None) -> str | None:
    """A Python codec name for a charset label, or None if unknown."""
    if not label:
        return None
    if isinstance(label, bytes):
        label = label.decode("ascii", "replace")
    label = label.strip().strip("\"'").lower()
    label = _CHARSET_ALIASES.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return None


def detect_charset(payload: bytes, content_type: str | None = None) -> str:
    """BOM, then the HTTP Content-Type charset, then <meta charset>/http-equiv in the first bytes, else utf-8."""
    for bom, name in _BOMS:
        if payload.startswith(bom):
            return name
    if content_type:
        match = _CHARSET_PARAM.search(content_type)
        codec = _codec(match.group(1)) if match else None
        if codec:
            return codec
    match = _META_CHARSET.search(payload[:CHARSET_PRESCAN_BYTES])
    codec = _codec(match.group(1)) if match else None
    # A page cannot really be UTF-16 if its bytes let us read an ASCII meta tag (HTML spec: use UTF-8 then).
    if codec and not codec.startswith("utf-16"):
        return codec
    return "utf-8"


def decode_html(payload: bytes, content_type: str | None = None) -> tuple[str, str]:
    """(text, codec): never raises on undecodable bytes."""
    charset = detect_charset(payload, content_type)
    data = payload
    for bom, name in _BOMS:
        if name == charset and payload.startswith(bom):
            data = payload[len(bom):]
    return data.decode(charset, errors="replace"), charset


def robots_directives(value: str | None) -> tuple[bool, bool]:
    """(noindex, nofollow) from a meta robots content or X-Robots-Tag value ("none" means both)."""
    if not value:
        return False, False
    words = set(_ROBOTS_WORD.findall(value.lower()))
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


def _collapse(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    collapsed = _SPACE.sub(" ", text).strip()
    return collapsed[:limit] or None


def _rel_tokens(value: str | None) -> tuple[str, ...]:
    return tuple(value.lower().split()) if value else ()


def extract(
    html: bytes | str,
    base_url: str,
    *,
    max_outlinks: int,
    headers: Mapping[str, str] | None = None,
) -> ParsedPage:
    """Parse one HTML document fetched from `base_url` (canonical). `headers`: HTTP response headers, if any."""
    if isinstance(html, bytes):
        text, charset = decode_html(html, _header(headers, "content-type"))
    else:
        text, charset = html, None
    tree = LexborHTMLParser(text)

    title_node = tree.css_first("title")
    title = _collapse(title_node.text(deep=True), TITLE_MAX_CHARS) if title_node is not None else None

    base_href = None
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        base_href = resolve(base_url, (base_node.attributes.get("href") or "").strip())
    link_base = base_href or base_url

    noindex, nofollow = False, False
    for meta in tree.css("meta[name]"):
        if (meta.attributes.get("name") or "").strip().lower() == "robots":
            meta_noindex, meta_nofollow = robots_directives(meta.attributes.get("content"))
            noindex, nofollow = noindex or meta_noindex, nofollow or meta_nofollow
    header_noindex, header_nofollow = robots_directives(_header(headers, "x-robots-tag"))
    noindex, nofollow = noindex or header_noindex, nofollow or header_nofollow

    canonical_url = None
    for link in tree.css("link[rel][href]"):
        if "canonical" in _rel_tokens(link.attributes.get("rel")):
            canonical_url = resolve(link_base, (link.attributes.get("href") or "").strip())
            if canonical_url:
                break

    outlinks = _outlinks(tree, link_base, max_outlinks, nofollow)

    html_node = tree.css_first("html")
    language = _collapse(html_node.attributes.get("lang"), LANGUAGE_MAX_CHARS) if html_node is not None else None

    tree.strip_tags(_HIDDEN_TAGS)
    body = tree.body if tree.body is not None else tree.root
    visible = _SPACE.sub(" ", body.text(deep=True, separator=" ")).strip() if body is not None else ""

    return ParsedPage(
        title=title,
        base_href=base_href,
        outlinks=outlinks,
        canonical_url=canonical_url,
        meta_noindex=noindex,
        meta_nofollow=nofollow,
        text=visible,
        language=language.lower() if language else None,
        charset=charset,
    )


def _outlinks(tree: LexborHTMLParser, base: str, max_outlinks: int, page_nofollow: bool) -> list[Outlink]:
    """a[href] and area[href], resolved, deduplicated by URL (first wins; nofollow only if every one is)."""
    found: dict[str, Outlink] = {}
    for node in tree.css("a[href], area[href]"):
        url = resolve(base, (node.attributes.get("href") or "").strip())
        if url is None:
            continue
        rel = _rel_tokens(node.attributes.get("rel"))
        nofollow = page_nofollow or "nofollow" in rel
        raw_anchor = node.text(deep=True) if node.tag == "a" else node.attributes.get("alt")
        anchor = _collapse(raw_anchor, ANCHOR_MAX_CHARS)
        previous = found.get(url)
        if previous is not None:
            found[url] = Outlink(
                url=url,
                anchor_text=previous.anchor_text or anchor,
                nofollow=previous.nofollow and nofollow,
                rel=previous.rel + tuple(r for r in rel if r not in previous.rel),
            )
            continue
        if len(found) >= max_outlinks:
            break
        found[url] = Outlink(url=url, anchor_text=anchor, nofollow=nofollow, rel=rel)
    return list(found.values())
