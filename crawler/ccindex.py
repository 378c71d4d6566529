"""A record index of WARC files with Common Crawl's cc-index column names, and a CDXJ file per WARC file for replay.

Rows: one per WARC record that has a target URI: response, revisit and resource records (the captures), and also
request and metadata records, so the Delta index covers every record of a file and a
consumer selects captures with `warc_record_type`. warcinfo records have no URL and are left out. CDXJ lines are
written for captures only: replay tools (pywb) serve those, never a request or a metadata record.

Column meanings follow Common Crawl's cc-index table where a name is shared: `content_digest` is the base32 SHA-1
of WARC-Payload-Digest without its `sha1:` prefix (null where the record has none: a 304 revisit, metadata),
`content_mime_type` is the media type of the HTTP Content-Type (of the WARC Content-Type for records without
HTTP headers), `content_charset` is the charset parameter of that header (Common Crawl detects it from the content;
reading bodies is the parse job's work, so the declared one is what we have), `content_truncated` is the
WARC-Truncated value. `content_languages` (up to three ISO-639-3 codes, comma-separated, most of the text first, as
Common Crawl writes it from CLD2) is not read from the WARC file: the index job fills it from the languages parse
detected (`pages.languages`), so it is null in the rows built here; a CDXJ line carries it as Common Crawl's CDX
`languages` field (same form) where the row has it. Not provided: `content_mime_detected` (it needs
the payload). Added: `url_protocol`, `url_port` (Common Crawl names; the SURT key drops both) and `warc_record_type`.

Indexing streams a file record by record with warcio: headers are parsed, the body is skipped in chunks, so memory
does not depend on record size. A torn or damaged file yields the records before the damage and then stops with a
reason (`IndexedWarc.stop_reason`), never an exception.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from urllib.parse import quote_from_bytes, unquote_to_bytes

import pyarrow as pa
from warcio.archiveiterator import ArchiveIterator

from crawler import urls
from crawler.records import TS
from crawler.urls import registered_domain

# Captures: what a CDXJ file lists for replay.
CAPTURE_TYPES = frozenset({"response", "revisit", "resource"})
REVISIT_MIME = "warc/revisit"  # pywb's mime for revisit records in CDX(J)

RECORD_INDEX = pa.schema(
    [
        ("url_surtkey", pa.string()),
        ("url", pa.string()),                  # WARC-Target-URI as written
        ("url_host_name", pa.string()),
        ("url_host_tld", pa.string()),         # last host label (null for an IP address)
        ("url_host_registered_domain", pa.string()),
        ("url_protocol", pa.string()),
        ("url_port", pa.int32()),              # null for the scheme's default port
        ("url_path", pa.string()),
        ("url_query", pa.string()),            # without "?", null if none
        ("fetch_time", TS),                    # WARC-Date
        ("fetch_status", pa.int16()),          # HTTP status (null for request and metadata records)
        ("fetch_redirect", pa.string()),       # Location of a 3xx, resolved against the URL
        ("content_digest", pa.string()),
        ("content_mime_type", pa.string()),
        ("content_charset", pa.string()),
        ("content_truncated", pa.string()),
        ("warc_filename", pa.string()),
        ("warc_record_offset", pa.int64()),
        ("warc_record_length", pa.int64()),    # bytes of the record in the file (its gzip member)
        ("warc_segment", pa.string()),
        ("warc_record_type", pa.string()),
        ("content_languages", pa.string()),    # filled by jobs/index.py from pages.languages
    ]
)

# ---- SURT -------------------------------------------------------------------------------------------------------
# The rules of the `surt` package's default canonicalizer (Google's, then the Internet Archive's), which Common Crawl
# and pywb use, applied to the URL as crawler.urls parses it: host lowercase and IDNA, IPv4 forms normalized,
# default port dropped, fragment and user info dropped (ada and canonicalize do these); then percent-decoding
# repeated until stable and one re-encoding, dot segments and empty segments removed, path and query lowercased,
# session ids removed (the package's patterns below), trailing slash removed unless the path is "/", query
# arguments sorted, empty query dropped, leading `www`/`wwwN.` label dropped, scheme dropped, host labels reversed
# and joined by commas (IP addresses too, as the package does), ")" before the path.
# Left out: the package's handling of non-http(s) URIs (`dns:`, `filedesc:`...); such a URI is its own key.

_ESCAPE_SAFE = b"!\"$&'()*+,-./:;<=>?@[\\]^_`{|}~"
_WWW = re.compile(r"^www\d*\.")
_PATH_SESSION_IDS = (
    re.compile(r"^(.*/)(\((?:[a-z]\([0-9a-z]{24}\))+\)/)([^?]+\.aspx.*)$", re.I),
    re.compile(r"^(.*/)(\([0-9a-z]{24}\)/)([^?]+\.aspx.*)$", re.I),
)
_QUERY_SESSION_IDS = (
    re.compile(r"^(.*)(?:jsessionid=[0-9a-z]{32})(?:&(.*))?$", re.I),
    re.compile(r"^(.*)(?:phpsessid=[0-9a-z]{32})(?:&(.*))?$", re.I),
    re.compile(r"^(.*)(?:sid=[0-9a-z]{32})(?:&(.*))?$", re.I),
    re.compile(r"^(.*)(?:aspsessionid[a-z]{8}=[a-z]{24})(?:&(.*))?$", re.I),
    re.compile(r"^(.*)(?:cfid=[^&]+&cftoken=[^&]+)(?:&(.*))?$", re.I),
)


def surt(url: str) -> str:
    """The SURT key of a URL as Common Crawl's url_surtkey and pywb write it: `com,example)/path?a=1&b=2`."""
    try:
        parts = _url_parts(url)
    except ValueError:
        return url
    _, host, port, path, query = parts
    return _surt_of_parts(host, port, path, query)


def _surt_of_parts(host: str, port: int | None, path: str, query: str | None) -> str:
    """The SURT key from parsed parts (the scheme is not part of it)."""
    host = _WWW.sub("", host.strip(".").replace("..", "."))
    key = ",".join(reversed(host.split("."))) + (f":{port}" if port is not None else "") + ")"
    key += _surt_path(path)
    query = _surt_query(query) if query else ""
    return f"{key}?{query}" if query else key


def _unescape_repeatedly(data: bytes) -> bytes:
    while True:
        decoded = unquote_to_bytes(data)
        if decoded == data:
            return data
        data = decoded


def _escape_once(data: bytes) -> str:
    return quote_from_bytes(data, safe=_ESCAPE_SAFE)


def _surt_path(path: str) -> str:
    raw = _unescape_repeatedly(path.encode("utf-8"))
    kept: list[bytes] = []
    for segment in raw.split(b"/")[1:]:
        if segment == b".":
            continue
        if segment == b".." and kept:
            kept.pop()
        else:
            kept.append(segment)
    normalized = b"/" + b"".join(seg + b"/" for seg in kept[:-1] if seg) + (kept[-1] if kept else b"")
    text = _escape_once(normalized).lower()
    for pattern in _PATH_SESSION_IDS:
        match = pattern.match(text)
        if match:
            text = match.group(1) + match.group(3)
    return text[:-1] if len(text) > 1 and text.endswith("/") else text


def _surt_query(query: str) -> str:
    text = _escape_once(_unescape_repeatedly(query.encode("utf-8")))
    for pattern in _QUERY_SESSION_IDS:
        match = pattern.match(text)
        if match:
            text = match.group(1) + (match.group(2) or "")
    text = text.lower()
    if len(text) <= 1:
        return text
    return "&".join(sorted(text.split("&"), key=lambda arg: tuple(arg.split("=", 1))))


def _url_parts(url: str) -> tuple[str, str, int | None, str, str | None]:
    """(scheme, host, explicit port, path, query without "?") of an http(s) URL, through crawler.urls; raises
    ValueError for anything else."""
    canonical = urls.canonicalize(url)
    host = urls.host_name(canonical)
    scheme, _, authority = urls.host_key(canonical).partition("://")
    port_text = authority[len(host) + 1:]
    path, sep, query = urls.path_and_query(canonical).partition("?")
    return scheme, host, int(port_text) if port_text else None, path, query if sep else None


# ---- rows -------------------------------------------------------------------------------------------------------


def record_index_row(warc_headers: Mapping[str, str], http_status: int | None,
                     http_headers: Mapping[str, str] | None, *, warc_filename: str, offset: int, length: int,
                     segment: str) -> dict | None:
    """The index row of one record from its headers (WARC header names and HTTP header names lowercased), or
    None for a record without a target URI (warcinfo)."""
    url = warc_headers.get("warc-target-uri")
    if not url:
        return None
    row: dict = dict.fromkeys(RECORD_INDEX.names)
    row.update(url_surtkey=url, url=url, warc_filename=warc_filename, warc_record_offset=offset,
               warc_record_length=length, warc_segment=segment, warc_record_type=warc_headers.get("warc-type"))
    try:
        scheme, host, port, path, query = _url_parts(url)
    except ValueError:
        pass
    else:
        tld = None if _is_ip(host) else host.rstrip(".").rsplit(".", 1)[-1]
        row.update(url_surtkey=_surt_of_parts(host, port, path, query), url_host_name=host, url_host_tld=tld,
                   url_host_registered_domain=registered_domain(host), url_protocol=scheme, url_port=port,
                   url_path=path, url_query=query)
    row["fetch_time"] = _warc_date(warc_headers.get("warc-date"))
    row["fetch_status"] = http_status
    location = (http_headers or {}).get("location")
    if http_status is not None and 300 <= http_status < 400 and location:
        row["fetch_redirect"] = urls.resolve(url, location) or location
    digest = warc_headers.get("warc-payload-digest")
    row["content_digest"] = digest.split(":", 1)[-1] if digest else None
    content_type = warc_headers.get("content-type") if http_headers is None else http_headers.get("content-type")
    row["content_mime_type"], row["content_charset"] = _media_type(content_type)
    row["content_truncated"] = warc_headers.get("warc-truncated")
    return row


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _warc_date(text: str | None) -> datetime | None:
    """WARC-Date (ISO 8601, UTC, optional fraction) as an aware datetime; None when absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _media_type(content_type: str | None) -> tuple[str | None, str | None]:
    """(media type, charset) of a Content-Type value, lowercased; (None, None) when absent."""
    if not content_type:
        return None, None
    media, *params = content_type.split(";")
    charset = None
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip("\"'"):
            charset = value.strip().strip("\"'").lower()
    return media.strip().lower() or None, charset


# ---- streaming a WARC file --------------------------------------------------------------------------------------


class IndexedWarc:
    """The rows of one WARC file, streamed by iterating. After iteration `stop_reason` says why it ended before the
    end of the file (a torn or damaged record), or is None when every record was read."""

    def __init__(self, path: str, warc_filename: str, segment: str) -> None:
        self.path = path
        self.warc_filename = warc_filename
        self.segment = segment
        self.stop_reason: str | None = None

    def __iter__(self) -> Iterator[dict]:
        self.stop_reason = None
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            records = ArchiveIterator(fh, check_digests=False)
            end = 0
            while True:
                try:
                    record = next(records, None)
                    if record is None:
                        self.stop_reason = _trailing_bytes(fh, end, size)
                        return
                    offset = records.get_record_offset()
                    length = records.get_record_length()  # reads the rest of the record (the body) in chunks
                except Exception as exc:  # warcio raises several types for damaged input
                    self.stop_reason = f"unreadable record at offset {end}: {type(exc).__name__}: {str(exc)[:120]!r}"
                    return
                torn = _torn(record, records, fh, offset, length, size)
                if torn:
                    self.stop_reason = f"record at offset {offset} is {torn}"
                    return
                end = offset + length
                row = record_index_row(*_record_headers(record), warc_filename=self.warc_filename, offset=offset,
                                       length=length, segment=self.segment)
                if row is not None:
                    yield row


def index_warc(path: str, warc_filename: str, segment: str) -> IndexedWarc:
    """Index one WARC file (a stream of rows; see IndexedWarc for how it reports damage)."""
    return IndexedWarc(path, warc_filename, segment)


def _record_headers(record) -> tuple[dict[str, str], int | None, dict[str, str] | None]:
    warc_headers = {name.lower(): value for name, value in record.rec_headers.headers}
    if record.http_headers is None or record.rec_type not in ("response", "revisit", "request"):
        return warc_headers, None, None
    http_headers: dict[str, str] = {}
    for name, value in record.http_headers.headers:
        key = name.lower()
        http_headers[key] = f"{http_headers[key]}, {value}" if key in http_headers else value
    status = None
    if record.rec_type != "request":
        code = record.http_headers.get_statuscode()
        status = int(code) if code and code.isdigit() else None
    return warc_headers, status, http_headers


def _torn(record, records: ArchiveIterator, fh, offset: int, length: int, size: int) -> str | None:
    """Why a record that warcio read without complaint is incomplete, or None: its block is shorter than its
    Content-Length, or (for the last gzip member of a file) the member was cut before its gzip trailer."""
    remaining = getattr(record.raw_stream, "limit", None)
    if remaining is None:
        return "without a Content-Length"
    if remaining > 0:
        return f"cut short ({remaining} bytes of its block missing)"
    if records.reader.decompressor is not None and offset + length >= size and not _whole_gzip_member(fh, offset):
        return "cut inside its gzip member"
    return None


def _trailing_bytes(fh, end: int, size: int) -> str | None:
    """Why the bytes after the last whole record are not just its blank lines (warcio ends quietly at a record
    header cut short), or None."""
    fh.seek(end)
    tail = fh.read(16)
    if size - end > 16 or tail.strip(b"\r\n"):
        return f"{size - end} bytes after the last whole record (ending at offset {end}) are not a record"
    return None


def _whole_gzip_member(fh, offset: int) -> bool:
    """Whether a complete gzip member (with its CRC trailer) starts at `offset`; reads it in chunks."""
    position = fh.tell()
    fh.seek(offset)
    inflater = zlib.decompressobj(wbits=31)
    try:
        while not inflater.eof:
            data = fh.read(1 << 16)
            if not data:
                return False
            while data and not inflater.eof:  # output bounded per call: a member may inflate enormously
                inflater.decompress(data, 1 << 20)
                data = inflater.unconsumed_tail
        return True
    except zlib.error:
        return False
    finally:
        fh.seek(position)


# ---- CDXJ -------------------------------------------------------------------------------------------------------


def cdxj_lines(rows: Iterable[dict]) -> Iterator[str]:
    """CDXJ lines (no newline) as pywb reads them, for the capture rows that have a WARC-Date, sorted as the
    file must be (byte order of the lines: by SURT key, then timestamp). Sorting holds the lines of one file in
    memory: one WARC file is bounded by fetch.warc_max_bytes, and a line is ~250 bytes per capture. A row's
    `content_languages` becomes the `languages` field, as in Common Crawl's CDX files (absent where null)."""
    lines = []
    for row in rows:
        if row["warc_record_type"] not in CAPTURE_TYPES or row["fetch_time"] is None:
            continue
        fields = {"url": row["url"],
                  "mime": REVISIT_MIME if row["warc_record_type"] == "revisit" else row["content_mime_type"],
                  "status": None if row["fetch_status"] is None else str(row["fetch_status"]),
                  "digest": row["content_digest"], "length": str(row["warc_record_length"]),
                  "offset": str(row["warc_record_offset"]), "filename": row["warc_filename"],
                  "languages": row.get("content_languages")}
        block = json.dumps({name: value for name, value in fields.items() if value is not None})
        lines.append(f"{row['url_surtkey']} {row['fetch_time']:%Y%m%d%H%M%S} {block}")
    lines.sort()
    return iter(lines)


def write_cdxj(warc_path: str, out_path: str, warc_filename: str | None = None, segment: str = "") -> IndexedWarc:
    """Write the CDXJ file of one WARC file (atomically: a temporary name, then rename); `warc_filename` is the
    name the lines give (default: the file's base name). Returns the indexer, whose stop_reason says whether
    the whole file was indexed."""
    indexed = index_warc(warc_path, warc_filename or os.path.basename(warc_path), segment)
    partial = out_path + ".partial"
    with open(partial, "w", encoding="ascii") as out:
        for line in cdxj_lines(indexed):
            out.write(line + "\n")
    os.replace(partial, out_path)
    return indexed
