"""HTML extraction for parse: title, base, outlinks, meta refresh, canonical hint, robots, visible text, language.

Pure (no Spark, no network) so parse jobs and tests call the same rules. Hostile input is the normal case:
undecodable bytes are replaced, never raised; outlinks are resolved and canonicalized through
`crawler.urls.resolve` (anything that is not an http(s) URL is dropped) and capped.

Work per document is bounded without interrupting native code (a Spark Python worker has no safe way to stop a
running C call): the caller caps the input bytes (`parse.max_html_bytes`); element nesting is capped before lexbor
sees the markup, because its tree builder is quadratic in depth (100 k nested divs take ~15 s); and an optional
wall-clock budget (`parse.max_parse_seconds`) is checked between stages and inside the Python outlink loop, the
only stage whose cost grows with more than the byte count. A page cut by a limit says so in its result.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from crawler.urls import resolve

TITLE_MAX_CHARS = 1000
ANCHOR_MAX_CHARS = 500
LANGUAGE_MAX_CHARS = 35
CHARSET_PRESCAN_BYTES = 4096
HTML_TYPES = ("text/html", "application/xhtml+xml")

_CHARSET_PARAM = re.compile(r"""charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE)
_ROBOTS_WORD = re.compile(r"[a-z_\-]+")
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# Labels browsers decode differently from Python's codec of the same name (WHATWG Encoding Standard).
_CHARSET_ALIASES = {"iso-8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "us-ascii": "cp1252",
                    "ascii": "cp1252", "x-user-defined": "cp1252"}
_HIDDEN_TAGS = ["script", "style", "noscript", "template"]
# Chromium stops nesting at 512 levels too; real pages stay far below it.
MAX_ELEMENT_DEPTH = 512
_DEADLINE_CHECK_EVERY = 256  # link elements between two clock reads
_TAG_OPEN = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)|<!--")
_VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                        "track", "wbr", "param", "keygen", "frame", "basefont", "bgsound"})
_RAW_TEXT_TAGS = frozenset({"script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes"})
_RAW_TEXT_END = {name: re.compile(f"</{name}", re.IGNORECASE) for name in _RAW_TEXT_TAGS}
_KEPT_DEEP_TAGS = frozenset({"a", "area"})  # still parsed past the depth cap: they carry the links
# X-Robots-Tag directives that take a value after a colon (anything else before a colon is a user agent).
_VALUED_ROBOTS_DIRECTIVES = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})
_ROBOTS_AGENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*:(.*)$", re.DOTALL)
_ASCII_SPACE = "\t\n\f\r "


@dataclass(frozen=True)
class Outlink:
    url: str                      # canonical absolute URL
    anchor_text: str | None
    nofollow: bool
    rel: tuple[str, ...]          # rel tokens, lowercased, in document order
    kind: str = "a"               # the element that gave the link first: "a", "area" or "refresh" (meta refresh)


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
    refresh_url: str | None       # meta refresh target, resolved (also the first outlink); None if none or self
    refresh_seconds: int | None   # meta refresh delay; set whenever a valid refresh is present
    outlinks_skipped: int         # a/area elements never examined: max_outlinks reached or the time budget spent
    time_limited: bool            # max_parse_seconds ran out: outlinks and/or text are cut (text may be empty)
    deep_tags_dropped: int        # start tags removed past MAX_ELEMENT_DEPTH (their text and links are kept)


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


def robots_directives(value: str | None, robots_token: str | None = None) -> tuple[bool, bool]:
    """(noindex, nofollow) from a meta robots content or X-Robots-Tag value ("none" means both).

    `googlebot: noindex` applies only to that agent: to us when it names `robots_token` (case-insensitive),
    else to nobody. An agent prefix covers the comma-separated directives after it until the next prefix, which is
    Google's reading of one header; repeated headers joined with ", " (as crawler.warcread does) keep that order,
    so an unprefixed header after a prefixed one is read as belonging to that agent.
    """
    if not value:
        return False, False
    wanted = robots_token.strip().lower() if robots_token else None
    words: set[str] = set()
    agent: str | None = None
    for part in value.lower().split(","):
        match = _ROBOTS_AGENT.match(part)
        if match and match.group(1) not in _VALUED_ROBOTS_DIRECTIVES:
            agent, part = match.group(1), match.group(2)
        if agent is None or agent == wanted:
            words.update(_ROBOTS_WORD.findall(part))
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


def parse_refresh(content: str | None) -> tuple[int, str | None] | None:
    """(delay seconds, raw URL or None for "reload this page") from a meta refresh content; None if invalid.

    The HTML standard's declarative refresh steps: `5; url=/next`, `0;URL='/next'`, `3, "/next"`, `1.5` (1 s).
    """
    if not content:
        return None
    text = content.lstrip(_ASCII_SPACE)
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0 and not text.startswith("."):
        return None
    delay = int(text[:digits]) if digits else 0
    rest = text[digits:].lstrip("0123456789.")
    if rest:
        if rest[0] not in ";," + _ASCII_SPACE:
            return None
        rest = rest.lstrip(_ASCII_SPACE)
        if rest[:1] in (";", ","):
            rest = rest[1:]
        rest = rest.lstrip(_ASCII_SPACE)
    if not rest:
        return delay, None
    url = rest
    after_url = rest[3:].lstrip(_ASCII_SPACE)
    if rest[:3].lower() == "url" and after_url.startswith("="):
        url = after_url[1:].lstrip(_ASCII_SPACE)
    if url[:1] in ("'", '"'):
        url = url[1:].split(url[0], 1)[0]
    return delay, url.strip() or None


def cap_nesting(html: str, max_depth: int = MAX_ELEMENT_DEPTH) -> tuple[str, int]:
    """(markup, start tags removed) so that no element nests deeper than max_depth (an estimate, linear time).

    Start tags past the cap are removed (their content stays, at the cap's depth), except a/area. Comments and
    raw-text elements are skipped with str.find so unclosed ones cost one scan, not one per tag.
    """
    if html.count("<") <= max_depth:
        return html, 0
    pieces: list[str] = []
    kept_from = 0
    removed = 0
    depth = 0
    position = 0
    while (match := _TAG_OPEN.search(html, position)) is not None:
        position = match.end()
        if match.group(2) is None:  # a comment runs to "-->" or to the end
            end = html.find("-->", position)
            position = len(html) if end < 0 else end + 3
            continue
        name = match.group(2).lower()
        if match.group(1):
            depth = max(depth - 1, 0)
            continue
        if name in _VOID_TAGS:
            continue
        if depth >= max_depth and name not in _KEPT_DEEP_TAGS:
            end = html.find(">", position)
            end = len(html) if end < 0 else end + 1
            pieces.append(html[kept_from:match.start()])
            kept_from = position = end
            removed += 1
            continue
        depth += 1
        if name in _RAW_TEXT_TAGS:
            closing = _RAW_TEXT_END[name].search(html, position)
            if closing is None:
                break  # the rest of the document is this element's text
            position = closing.start()
    if not removed:
        return html, 0
    pieces.append(html[kept_from:])
    return "".join(pieces), removed


def _collapse(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    collapsed = " ".join(text.split())  # runs of whitespace (str.isspace, as regex \s) -> one space, ends cut
    return collapsed[:limit] or None


def _rel_tokens(value: str | None) -> tuple[str, ...]:
    return tuple(value.lower().split()) if value else ()


def extract(
    html: bytes | str,
    base_url: str,
    *,
    max_outlinks: int,
    headers: Mapping[str, str] | None = None,
    robots_token: str | None = None,
    max_parse_seconds: float | None = None,
) -> ParsedPage:
    """Parse one HTML document fetched from `base_url` (canonical). `headers`: HTTP response headers, if any;
    `robots_token`: the crawler's product token, for agent-specific robots directives; `max_parse_seconds`: the
    wall-clock budget after which remaining stages are skipped and the result is flagged `time_limited`."""
    deadline = None if max_parse_seconds is None else time.monotonic() + max_parse_seconds
    if isinstance(html, bytes):
        text, charset = decode_html(html, _header(headers, "content-type"))
    else:
        text, charset = html, None
    text, deep_tags_dropped = cap_nesting(text)
    tree = LexborHTMLParser(text)

    title_node = tree.css_first("title")
    title = _collapse(title_node.text(deep=True), TITLE_MAX_CHARS) if title_node is not None else None

    base_href = None
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        base_href = resolve(base_url, (base_node.attributes.get("href") or "").strip())
    link_base = base_href or base_url

    noindex, nofollow = _meta_robots(tree, robots_token)
    header_noindex, header_nofollow = robots_directives(_header(headers, "x-robots-tag"), robots_token)
    noindex, nofollow = noindex or header_noindex, nofollow or header_nofollow

    canonical_url = None
    for link in tree.css("link[rel][href]"):
        if "canonical" in _rel_tokens(link.attributes.get("rel")):
            canonical_url = resolve(link_base, (link.attributes.get("href") or "").strip())
            if canonical_url:
                break

    refresh_seconds, refresh_url = _meta_refresh(tree, link_base, base_url)
    outlinks, outlinks_skipped, time_limited = _outlinks(
        tree, link_base, max_outlinks, nofollow, refresh_url, deadline
    )

    html_node = tree.css_first("html")
    language = _collapse(html_node.attributes.get("lang"), LANGUAGE_MAX_CHARS) if html_node is not None else None

    visible = ""
    if deadline is not None and time.monotonic() > deadline:
        time_limited = True
    else:
        tree.strip_tags(_HIDDEN_TAGS)
        body = tree.body if tree.body is not None else tree.root
        visible = " ".join(body.text(deep=True, separator=" ").split()) if body is not None else ""

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
        refresh_url=refresh_url,
        refresh_seconds=refresh_seconds,
        outlinks_skipped=outlinks_skipped,
        time_limited=time_limited,
        deep_tags_dropped=deep_tags_dropped,
    )


def _meta_robots(tree: LexborHTMLParser, robots_token: str | None) -> tuple[bool, bool]:
    """<meta name=robots> and <meta name=TOKEN> (our own product token), all of them combined."""
    names = {"robots", robots_token.strip().lower()} if robots_token else {"robots"}
    noindex, nofollow = False, False
    for meta in tree.css("meta[name]"):
        if (meta.attributes.get("name") or "").strip().lower() in names:
            meta_noindex, meta_nofollow = robots_directives(meta.attributes.get("content"))
            noindex, nofollow = noindex or meta_noindex, nofollow or meta_nofollow
    return noindex, nofollow


def _meta_refresh(tree: LexborHTMLParser, link_base: str, page_url: str) -> tuple[int | None, str | None]:
    """(delay, resolved target) of the first valid meta refresh; a target equal to the page itself is None."""
    for meta in tree.css("meta[http-equiv]"):
        if (meta.attributes.get("http-equiv") or "").strip().lower() != "refresh":
            continue
        parsed = parse_refresh(meta.attributes.get("content"))
        if parsed is None:
            continue
        delay, raw_url = parsed
        target = resolve(link_base, raw_url) if raw_url else None
        return delay, target if target != page_url else None
    return None, None


def _outlinks(
    tree: LexborHTMLParser, base: str, max_outlinks: int, page_nofollow: bool, refresh_url: str | None,
    deadline: float | None,
) -> tuple[list[Outlink], int, bool]:
    """(outlinks, link elements not examined, out of time): the refresh target first, then a[href] and area[href],
    resolved, deduplicated by URL (first wins; nofollow only if every one is)."""
    found: dict[str, Outlink] = {}
    if refresh_url is not None:
        found[refresh_url] = Outlink(url=refresh_url, anchor_text=None, nofollow=page_nofollow, rel=(), kind="refresh")
    nodes = tree.css("a[href], area[href]")
    for index, node in enumerate(nodes):
        if deadline is not None and index % _DEADLINE_CHECK_EVERY == 0 and time.monotonic() > deadline:
            return list(found.values()), len(nodes) - index, True
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
                kind=previous.kind,
            )
            continue
        if len(found) >= max_outlinks:
            return list(found.values()), len(nodes) - index, False
        found[url] = Outlink(url=url, anchor_text=anchor, nofollow=nofollow, rel=rel, kind=node.tag)
    return list(found.values()), 0, False
