"""Sitemaps (sitemaps.org protocol 0.9): one fetched sitemap's bytes in, its URLs and child sitemaps out.

Pure and streaming: the parse job hands over a WARC payload (bytes or a file-like object) and gets a
`SitemapResult`; nothing here touches the network or Spark, and nothing raises on hostile input — every
refusal is a counted reason.

Formats: XML `urlset` and `sitemapindex` (sitemaps.org 0.9 namespace, the legacy Google namespaces, or no
namespace; any other namespace is refused), plain-text sitemaps (one URL per line, UTF-8 unless the
Content-Type names a charset). gzip is recognised by its magic bytes, never by the file name. RSS/Atom feeds
are not read (their root is refused as "not a sitemap").

Safety and limits (a sitemap is attacker-controlled input):
* gzip is inflated in bounded steps; the uncompressed total is capped (`max_uncompressed_bytes`, 50 MB by the
  protocol). Past the cap reading stops: "gzip bomb" when the compression ratio at that point exceeds
  `BOMB_RATIO` (no sitemap text compresses that well), else "too large uncompressed".
* XML is parsed incrementally by expat; any DOCTYPE is refused before its content is read, so there are no
  entity declarations (no billion laughs) and no external entities (no XXE); parameter entities are off.
  An undeclared entity reference is then a syntax error ("malformed xml").
* At most `max_urls` (50,000) entries per file; the rest are refused ("too many urls") and counted.
* A loc longer than `max_loc_length` is refused without being held in memory whole.
When reading stops early (cap, malformed XML, truncated gzip), the entries completed before that point are
kept and `SitemapResult.error` says why the rest was not read.

Scope (the protocol's "Sitemap file location" and "Sitemaps & Cross Submits" sections), for entries:
* A sitemap at http://host/path/sitemap.xml may list URLs with the same scheme and host (and port) whose path
  starts with /path/. Pass the URL the sitemap was finally fetched from (after redirects).
* Cross-submission: a sitemap listed in host A's robots.txt (`Sitemap:` line) may also list any URL of A
  (same scheme, host and port as that robots.txt), wherever the sitemap itself lives: control of A's
  robots.txt proves ownership of A. The proof is inherited by the children of a sitemap index listed there.
* Children of a sitemap index must be on the index's own site (scheme, host, port) or the robots host.
* A sitemap found by probing /sitemap.xml or by a link gets the location rule only.
Everything else is refused as "outside sitemap scope".

`first_schedule` is the one place where a sitemap entry's priority, lastmod and changefreq become the first
schedule of a newly discovered URL.
"""

from __future__ import annotations

import codecs
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import BinaryIO
from xml.parsers import expat

from crawler import urls
from crawler.robots import RobotsPolicy
from crawler.settings import Settings

READ_CHUNK = 64 * 1024           # compressed bytes read per step
INFLATE_CHUNK = 256 * 1024       # most uncompressed bytes produced per inflate call
SNIFF_BYTES = 64                 # bytes looked at to tell XML from text
BOMB_RATIO = 200                 # uncompressed/compressed ratio past which an oversized gzip is called a bomb
GZIP_MAGIC = b"\x1f\x8b"

SITEMAP_NAMESPACES = frozenset({
    "http://www.sitemaps.org/schemas/sitemap/0.9",
    "http://www.google.com/schemas/sitemap/0.9",
    "http://www.google.com/schemas/sitemap/0.84",
    "",
})


class Reason(str, Enum):
    """Why a sitemap, one of its entries, or one field of an entry was refused."""

    # the file (SitemapResult.error): reading stopped here
    BAD_SITEMAP_URL = "invalid sitemap url"
    EMPTY = "empty"
    NOT_A_SITEMAP = "not a sitemap"             # HTML, a feed, binary junk, undecodable text
    MALFORMED_XML = "malformed xml"
    DOCTYPE = "doctype refused"                 # DTDs carry entities: XXE and billion laughs
    WRONG_NAMESPACE = "wrong namespace"
    GZIP_BOMB = "gzip bomb"
    TOO_LARGE = "too large uncompressed"
    BAD_GZIP = "bad gzip"
    TRUNCATED_GZIP = "truncated gzip"
    UNREADABLE = "unreadable payload"
    # an entry or child sitemap (SitemapResult.refused)
    MISSING_LOC = "missing loc"
    LOC_TOO_LONG = "loc too long"
    INVALID_LOC = "invalid loc"
    OUT_OF_SCOPE = "outside sitemap scope"
    DUPLICATE = "duplicate loc"
    TOO_MANY_URLS = "too many urls"
    INDEX_TOO_DEEP = "index too deep"
    # one field of a kept entry (SitemapResult.ignored_fields)
    BAD_LASTMOD = "bad lastmod"
    BAD_CHANGEFREQ = "bad changefreq"
    BAD_PRIORITY = "bad priority"


class ChangeFreq(str, Enum):
    ALWAYS = "always"
    HOURLY = "hourly"
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"
    YEARLY = "yearly"
    NEVER = "never"


class FoundVia(str, Enum):
    """Where the crawler learnt of a sitemap; decides which URLs it may list."""

    ROBOTS = "robots"    # a `Sitemap:` line of a robots.txt
    INDEX = "index"      # a child of a sitemap index
    PROBE = "probe"      # the /sitemap.xml guess
    LINK = "link"        # any other reference (seed, link)


@dataclass(frozen=True)
class SitemapOrigin:
    """How a sitemap was found: `robots_host_key` is the scheme://host[:port] whose robots.txt listed it (or
    listed an index above it); `index_depth` counts the sitemap indexes above it."""

    via: FoundVia
    robots_host_key: str | None = None
    index_depth: int = 0

    @classmethod
    def from_robots(cls, robots_url: str) -> SitemapOrigin:
        return cls(FoundVia.ROBOTS, urls.host_key(urls.canonicalize(robots_url)))

    def child(self) -> SitemapOrigin:
        return SitemapOrigin(FoundVia.INDEX, self.robots_host_key, self.index_depth + 1)

    def encode(self) -> str:
        """The origin as stored in `urls.sitemap_origin` and carried by fetch lists and results:
        "via index_depth [robots_host_key]", e.g. "robots 0 https://a.example". A non-null value marks the
        URL as a sitemap to fetch and parse as one."""
        parts = [self.via.value, str(self.index_depth)]
        if self.robots_host_key is not None:
            parts.append(self.robots_host_key)
        return " ".join(parts)

    @classmethod
    def decode(cls, text: str) -> SitemapOrigin:
        """The inverse of `encode`; raises ValueError on anything else (a hand-edited table)."""
        parts = text.split(" ")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise ValueError(f"not a sitemap origin: {text[:200]!r}")
        return cls(FoundVia(parts[0]), parts[2] if len(parts) == 3 else None, int(parts[1]))


@dataclass(frozen=True)
class SitemapLimits:
    max_urls: int = 50_000
    max_uncompressed_bytes: int = 52_428_800
    max_index_depth: int = 1        # the protocol forbids an index listing an index
    max_loc_length: int = 2048      # the protocol's "less than 2,048 characters"

    @classmethod
    def from_config(cls, conf: Settings) -> SitemapLimits:
        return cls(**{name: getattr(conf.sitemaps, name) for name in cls.__dataclass_fields__})


DEFAULT_LIMITS = SitemapLimits()


@dataclass(frozen=True, slots=True)
class SitemapEntry:
    loc: str                        # canonical URL
    lastmod: datetime | None = None  # UTC
    changefreq: ChangeFreq | None = None
    priority: float | None = None   # 0..1


@dataclass(frozen=True, slots=True)
class ChildSitemap:
    loc: str
    lastmod: datetime | None = None


@dataclass
class SitemapResult:
    url: str
    kind: str = ""                  # "urlset", "sitemapindex", "text", or "" when unrecognised
    entries: list[SitemapEntry] = field(default_factory=list)
    sitemaps: list[ChildSitemap] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)         # dropped entries / children, by reason
    ignored_fields: Counter[str] = field(default_factory=Counter)  # fields dropped from kept entries
    error: str | None = None        # why reading stopped early; None when the whole file was read
    gzipped: bool = False
    uncompressed_bytes: int = 0


class _Stop(Exception):
    """Ends reading with a file-level reason (raised inside expat handlers and the byte pump)."""

    def __init__(self, reason: Reason):
        super().__init__(reason.value)
        self.reason = reason


def parse_sitemap(url: str, payload: bytes | BinaryIO, origin: SitemapOrigin,
                  limits: SitemapLimits = DEFAULT_LIMITS, content_type: str | None = None) -> SitemapResult:
    """Parse one fetched sitemap. `url` is where it was fetched from (the final URL after redirects); never
    raises on bad input: refusals are counted in the result."""
    result = SitemapResult(url=url)
    try:
        sitemap_url = urls.canonicalize(url)
    except ValueError:
        result.error = Reason.BAD_SITEMAP_URL.value
        return result
    collector = _Collector(sitemap_url, origin, limits, result)
    sink = _Sink(collector, _charset(content_type))
    try:
        for chunk in _uncompressed_chunks(_raw_chunks(payload), limits.max_uncompressed_bytes, result):
            sink.feed(chunk)
        sink.close()
    except _Stop as stop:
        result.error = stop.reason.value
    return result


def _raw_chunks(payload: bytes | BinaryIO) -> Iterator[bytes]:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        view = memoryview(payload)
        for start in range(0, len(view), READ_CHUNK):
            yield bytes(view[start:start + READ_CHUNK])
        return
    while True:
        try:
            chunk = payload.read(READ_CHUNK)
        except (OSError, ValueError, EOFError):
            raise _Stop(Reason.UNREADABLE) from None
        if not chunk:
            return
        yield chunk


def _uncompressed_chunks(raw: Iterator[bytes], cap: int, result: SitemapResult) -> Iterator[bytes]:
    """The payload's bytes, gunzipped when it starts with the gzip magic (members in sequence), never more than
    `cap` of them: a bomb is stopped after producing at most cap + INFLATE_CHUNK bytes."""
    first = b""
    for chunk in raw:
        first += chunk
        if len(first) >= len(GZIP_MAGIC):
            break
    if not first:
        raise _Stop(Reason.EMPTY)
    if not first.startswith(GZIP_MAGIC):
        yield from _capped(_prepend(first, raw), cap, result, compressed_in=None)
        return
    result.gzipped = True
    consumed = [0]
    yield from _capped(_inflate(_prepend(first, raw), consumed), cap, result, compressed_in=consumed)


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _inflate(raw: Iterator[bytes], consumed: list[int]) -> Iterator[bytes]:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        for chunk in raw:
            consumed[0] += len(chunk)
            data = chunk
            while data:
                out = inflater.decompress(data, INFLATE_CHUNK)
                if out:
                    yield out
                if inflater.eof:  # a member ended: the rest is another member (or trailing junk)
                    data = inflater.unused_data
                    if data and not data.startswith(GZIP_MAGIC):
                        return
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if data else inflater
                else:
                    data = inflater.unconsumed_tail
    except zlib.error:
        raise _Stop(Reason.BAD_GZIP) from None
    if not inflater.eof:
        raise _Stop(Reason.TRUNCATED_GZIP)


def _capped(chunks: Iterator[bytes], cap: int, result: SitemapResult, compressed_in: list[int] | None,
            ) -> Iterator[bytes]:
    for chunk in chunks:
        room = cap - result.uncompressed_bytes
        if len(chunk) > room:
            result.uncompressed_bytes += room
            if room:
                yield chunk[:room]
            ratio = (result.uncompressed_bytes / max(compressed_in[0], 1)) if compressed_in else 0.0
            raise _Stop(Reason.GZIP_BOMB if ratio > BOMB_RATIO else Reason.TOO_LARGE)
        result.uncompressed_bytes += len(chunk)
        yield chunk


def _charset(content_type: str | None) -> str:
    """The charset a Content-Type names, if Python knows it; UTF-8 otherwise (the protocol's encoding)."""
    match = re.search(r"charset\s*=\s*\"?([A-Za-z0-9._:-]+)", content_type or "")
    if match:
        try:
            return codecs.lookup(match.group(1)).name
        except LookupError:
            pass
    return "utf-8"


class _Sink:
    """Looks at the first bytes to pick the XML or the text reader, then streams everything into it."""

    def __init__(self, collector: _Collector, text_charset: str):
        self.collector = collector
        self.text_charset = text_charset
        self.head = b""
        self.reader: _XmlReader | _TextReader | None = None

    def feed(self, chunk: bytes) -> None:
        if self.reader is None:
            self.head += chunk
            if len(self.head) < SNIFF_BYTES:
                return
            self._choose()
            chunk, self.head = self.head, b""
        self.reader.feed(chunk)

    def close(self) -> None:
        if self.reader is None:
            if not self.head.strip():
                raise _Stop(Reason.EMPTY)
            self._choose()
            self.reader.feed(self.head)
        self.reader.close()

    def _choose(self) -> None:
        if self.head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
            raise _Stop(Reason.NOT_A_SITEMAP)
        if _looks_like_xml(self.head):
            self.reader = _XmlReader(self.collector)
        else:
            self.collector.result.kind = "text"
            self.reader = _TextReader(self.collector, self.text_charset)


def _looks_like_xml(head: bytes) -> bool:
    """True when the first non-blank character is "<" in UTF-8, UTF-16 (either order, BOM or not)."""
    for bom, encoding in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                          (codecs.BOM_UTF16_BE, "utf-16-be")):
        if head.startswith(bom):
            return head[len(bom):].decode(encoding, "ignore").lstrip().startswith("<")
    if head.startswith((b"<\x00", b"\x00<")):
        return True
    return head.lstrip().startswith(b"<")


class _XmlReader:
    """expat, fed chunk by chunk, DOCTYPE refused, namespaces split as "uri local"."""

    def __init__(self, collector: _Collector):
        self.collector = collector
        self.parser = expat.ParserCreate(namespace_separator=" ")
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.StartElementHandler = collector.start
        self.parser.EndElementHandler = collector.end
        self.parser.CharacterDataHandler = collector.text

    @staticmethod
    def _doctype(name: str, *_: object) -> None:
        raise _Stop(Reason.NOT_A_SITEMAP if name.lower() == "html" else Reason.DOCTYPE)

    def feed(self, chunk: bytes) -> None:
        self._parse(chunk, False)

    def close(self) -> None:
        self._parse(b"", True)

    def _parse(self, data: bytes, final: bool) -> None:
        try:
            self.parser.Parse(data, final)
        except expat.ExpatError:
            raise _Stop(Reason.MALFORMED_XML) from None


class _TextReader:
    """One URL per line; a line longer than the loc limit is refused without being kept whole."""

    def __init__(self, collector: _Collector, charset: str):
        self.collector = collector
        self.decoder = codecs.getincrementaldecoder("utf-8-sig" if charset == "utf-8" else charset)("strict")
        self.pending = ""
        self.overflow = False

    def feed(self, chunk: bytes) -> None:
        self._lines(self._decode(chunk, False))

    def close(self) -> None:
        self._lines(self._decode(b"", True) + "\n")

    def _decode(self, chunk: bytes, final: bool) -> str:
        try:
            text = self.decoder.decode(chunk, final)
        except UnicodeDecodeError:
            raise _Stop(Reason.NOT_A_SITEMAP) from None
        if "\x00" in text:
            raise _Stop(Reason.NOT_A_SITEMAP)
        return text

    def _lines(self, text: str) -> None:
        limit = self.collector.limits.max_loc_length
        *complete, rest = text.split("\n")
        for part in complete:
            line = (self.pending + part).strip()
            if self.overflow or line:
                self.collector.url_entry({"loc": line}, self.overflow or len(line) > limit)
            self.pending, self.overflow = "", False
        if not self.overflow:
            self.pending += rest
            if len(self.pending) > limit:
                self.pending, self.overflow = "", True


_FIELDS = frozenset({"loc", "lastmod", "changefreq", "priority"})
_ROOTS = {"urlset": "url", "sitemapindex": "sitemap"}


class _Collector:
    """Turns parser events (or text lines) into checked entries; the scope and limit rules live here."""

    def __init__(self, sitemap_url: str, origin: SitemapOrigin, limits: SitemapLimits, result: SitemapResult):
        self.origin = origin
        self.limits = limits
        self.result = result
        self.site = urls.host_key(sitemap_url)
        path = urls.path_and_query(sitemap_url).split("?", 1)[0]
        self.directory = path[: path.rfind("/") + 1]
        self.seen: set[str] = set()
        self.depth = 0
        self.namespace = ""
        self.item_tag = ""
        self.fields: dict[str, str] | None = None
        self.capture: str | None = None
        self.buffer: list[str] = []
        self.buffered = 0
        self.too_long = False

    # XML events
    def start(self, name: str, _attrs: dict[str, str]) -> None:
        self.depth += 1
        namespace, _, local = name.rpartition(" ")
        if self.depth == 1:
            self._root(namespace, local)
        elif self.depth == 2 and namespace == self.namespace and local == self.item_tag:
            self.fields, self.too_long = {}, False
        elif self.depth == 3 and self.fields is not None and namespace == self.namespace and local in _FIELDS:
            self.capture, self.buffer, self.buffered = local, [], 0

    def text(self, data: str) -> None:
        if self.capture is None:
            return
        room = self.limits.max_loc_length + 1 - self.buffered
        if room > 0:
            self.buffer.append(data[:room])
            self.buffered += min(len(data), room)

    def end(self, _name: str) -> None:
        if self.depth == 3 and self.capture is not None:
            if self.buffered > self.limits.max_loc_length and self.capture == "loc":
                self.too_long = True
            self.fields[self.capture] = "".join(self.buffer).strip()
            self.capture = None
        elif self.depth == 2 and self.fields is not None:
            if self.result.kind == "urlset":
                self.url_entry(self.fields, self.too_long)
            else:
                self.child_entry(self.fields, self.too_long)
            self.fields = None
        self.depth -= 1

    def _root(self, namespace: str, local: str) -> None:
        if local not in _ROOTS:
            raise _Stop(Reason.NOT_A_SITEMAP)
        if namespace not in SITEMAP_NAMESPACES:
            raise _Stop(Reason.WRONG_NAMESPACE)
        self.result.kind, self.namespace, self.item_tag = local, namespace, _ROOTS[local]

    # entries
    def url_entry(self, fields: dict[str, str], too_long: bool) -> None:
        loc = self._checked_loc(fields, too_long, self.result.entries, self._url_in_scope)
        if loc is None:
            return
        self.result.entries.append(SitemapEntry(
            loc,
            self._field(fields, "lastmod", parse_lastmod, Reason.BAD_LASTMOD),
            self._field(fields, "changefreq", _changefreq, Reason.BAD_CHANGEFREQ),
            self._field(fields, "priority", _priority, Reason.BAD_PRIORITY),
        ))

    def child_entry(self, fields: dict[str, str], too_long: bool) -> None:
        if self.origin.index_depth + 1 > self.limits.max_index_depth:
            self.result.refused[Reason.INDEX_TOO_DEEP.value] += 1
            return
        loc = self._checked_loc(fields, too_long, self.result.sitemaps, self._child_in_scope)
        if loc is not None:
            self.result.sitemaps.append(ChildSitemap(loc, self._field(fields, "lastmod", parse_lastmod,
                                                                      Reason.BAD_LASTMOD)))

    def _checked_loc(self, fields: dict[str, str], too_long: bool, kept: list,
                     in_scope: Callable[[str], bool]) -> str | None:
        reason: Reason | None = None
        loc = ""
        if len(kept) >= self.limits.max_urls:
            reason = Reason.TOO_MANY_URLS
        elif too_long:
            reason = Reason.LOC_TOO_LONG
        elif not fields.get("loc"):
            reason = Reason.MISSING_LOC
        else:
            try:
                loc = urls.canonicalize(fields["loc"])
            except ValueError:
                reason = Reason.INVALID_LOC
            else:
                if not in_scope(loc):
                    reason = Reason.OUT_OF_SCOPE
                elif loc in self.seen:
                    reason = Reason.DUPLICATE
        if reason is not None:
            self.result.refused[reason.value] += 1
            return None
        self.seen.add(loc)
        return loc

    def _field(self, fields: dict[str, str], name: str, convert: Callable[[str], object], reason: Reason):
        raw = fields.get(name)
        if not raw:
            return None
        value = convert(raw)
        if value is None:
            self.result.ignored_fields[reason.value] += 1
        return value

    def _on_robots_host(self, loc_host: str) -> bool:
        return self.origin.robots_host_key is not None and loc_host == self.origin.robots_host_key

    def _url_in_scope(self, loc: str) -> bool:
        host = urls.host_key(loc)
        if host == self.site and urls.path_and_query(loc).startswith(self.directory):
            return True
        return self._on_robots_host(host)

    def _child_in_scope(self, loc: str) -> bool:
        host = urls.host_key(loc)
        return host == self.site or self._on_robots_host(host)


_W3C_DATETIME = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?\s*(Z|z|[+-]\d{2}:?\d{2})?)?)?)?"
)


def parse_lastmod(text: str) -> datetime | None:
    """A W3C Datetime (YYYY, YYYY-MM, YYYY-MM-DD, with hh:mm[:ss[.s]] and a zone) as a UTC datetime; None if
    invalid. A time without a zone is read as UTC (common in the wild, forbidden by the format)."""
    match = _W3C_DATETIME.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        offset = timedelta(0)
        if zone and zone not in "Zz":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            hours, minutes = int(digits[:2]), int(digits[2:])
            if hours > 14 or minutes > 59:
                return None
            offset = sign * timedelta(hours=hours, minutes=minutes)
        micro = int((fraction or "0")[:6].ljust(6, "0"))
        local = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                         int(second or 0), micro, tzinfo=timezone(offset))
        return local.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _changefreq(text: str) -> ChangeFreq | None:
    try:
        return ChangeFreq(text.strip().lower())
    except ValueError:
        return None


def _priority(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


# Sitemap files themselves. The default location is probed once per seed host at inject (when
# `sitemaps.probe_default_location` is on); every sitemap file (probed, listed in robots.txt, a child of an index,
# or seeded) enters `urls` with SITEMAP_FILE_PRIORITY, ahead of ordinary links, because it may list many URLs.
# A sitemap and the URLs it lists keep the depth of the sitemap that listed them: a site's own sitemap is as
# close to the seeds as its robots.txt or home page, not one hop further per file.
DEFAULT_LOCATION = "/sitemap.xml"
SITEMAP_FILE_PRIORITY = 1.0


def probe_url(host_key: str) -> str:
    """The default-location sitemap URL of a host (scheme://host[:port])."""
    return host_key + DEFAULT_LOCATION


def robots_sitemaps(host_key: str, robots_body: str | None, max_bytes: int) -> list[tuple[str, str]]:
    """(sitemap URL as written, encoded origin) for each `Sitemap:` line of a host's robots.txt. The lines hold
    for every user agent, so no product token is involved; the URLs are canonicalised by discovery's scope rules
    later, like any discovered URL."""
    if not robots_body:
        return []
    origin = SitemapOrigin(FoundVia.ROBOTS, host_key).encode()
    return [(url, origin) for url in RobotsPolicy.parse(robots_body, "*", max_bytes).sitemaps]


# first_schedule: the mapping from a sitemap entry to a new URL's priority (urls.priority; seeds default 1.0,
# a link from a seed 0.8). The sitemap priority p (default 0.5) scales linearly: p=0 -> 0.4, 0.5 -> 0.8,
# 1 -> 1.2. A lastmod within FRESH_DAYS adds FRESH_BONUS (recent change: worth fetching first); one older
# than STALE_DAYS subtracts STALE_PENALTY; a lastmod in the future is ignored (a clock error or a lie).
# changefreq always/hourly/daily adds FREQUENT_BONUS, yearly/never subtracts it. The result is clamped to
# [MIN_PRIORITY, MAX_PRIORITY]. next_fetch_at is always `now`: a URL never fetched is due at once, and the
# priority decides its place in the queue. The revisit interval after the first fetch is the revisit policy's.
SITEMAP_PRIORITY_SCALE = 0.8
DEFAULT_SITEMAP_PRIORITY = 0.5
FRESH_DAYS, FRESH_BONUS = 7, 0.2
STALE_DAYS, STALE_PENALTY = 365, 0.2
FREQUENT_BONUS = 0.1
MIN_PRIORITY, MAX_PRIORITY = 0.1, 1.5
_FREQUENT = frozenset({ChangeFreq.ALWAYS, ChangeFreq.HOURLY, ChangeFreq.DAILY})
_RARE = frozenset({ChangeFreq.YEARLY, ChangeFreq.NEVER})


def first_schedule(entry: SitemapEntry, now: datetime) -> tuple[float, datetime]:
    """(priority, next_fetch_at) of a URL first discovered through this sitemap entry (mapping above)."""
    p = DEFAULT_SITEMAP_PRIORITY if entry.priority is None else entry.priority
    priority = SITEMAP_PRIORITY_SCALE * (0.5 + p)
    if entry.lastmod is not None and entry.lastmod <= now:
        age = now - entry.lastmod
        if age <= timedelta(days=FRESH_DAYS):
            priority += FRESH_BONUS
        elif age > timedelta(days=STALE_DAYS):
            priority -= STALE_PENALTY
    if entry.changefreq in _FREQUENT:
        priority += FREQUENT_BONUS
    elif entry.changefreq in _RARE:
        priority -= FREQUENT_BONUS
    return min(max(priority, MIN_PRIORITY), MAX_PRIORITY), now
