"""WET records: the extracted text of a segment's HTML pages as WARC `conversion` records, as Common Crawl publishes
them beside its WARC files. Pure (no Spark, no I/O): parse builds each page's record in its tasks and writes the
bytes; these functions only make them.

A WET file is a `warcinfo` record, then one `conversion` record per HTML page with visible text, each its own gzip
member. A conversion record carries the page's visible text (`crawler.links.extract`: the text the SimHash and the
language detector read, whitespace collapsed, one line, UTF-8) as `Content-Type: text/plain`, names the response
record it was made from (`WARC-Refers-To`: its WARC-Record-ID; `WARC-Target-URI` and `WARC-Date` are the response's)
and the languages found in it (`WARC-Identified-Content-Language`: ISO-639-3 codes, comma-separated, most of the text
first, Common Crawl's header and codes). A page with no text, or whose languages are unsure, is an outcome, not an
error (`crawler.status.WetOutcome`): no record for a page without text or a body that is not HTML, no language
header when none was detected.

Every field is a function of the response record and the text, so parsing a segment again writes the same bytes:
the record ids are name-based UUIDs (uuid5) of the response's id (of the WET file's name for its warcinfo), and
the gzip members carry no time stamp. Records are serialised here rather than through warcio's record builder and
gzip writer (it compresses at zlib level 9: 0.8 ms for a page's 22 KB of text, against 0.06 ms here with ISA-L at
level 1, the daemon's own compressor and level); warcio and fastwarc read them back, and `warcio check` verifies
their digests (tests/test_wet.py).
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from isal import isal_zlib

from crawler.status import WetOutcome

WARC_VERSION = "WARC/1.1"
LANGUAGE_HEADER = "WARC-Identified-Content-Language"
GZIP_LEVEL = 1
_GZIP_WBITS = 31  # a gzip member (header and trailer), not a raw deflate stream
# The namespace of WET record ids: uuid5(this, the response's WARC-Record-ID) is its conversion record's id.
_NAMESPACE = uuid.UUID("8a7c9a52-6d0e-5b5a-9c3e-2f1d7b0e4c61")


def record_id(name: str) -> str:
    """A WARC-Record-ID that is the same each time for the same name."""
    return f"<urn:uuid:{uuid.uuid5(_NAMESPACE, name)}>"


def block_digest(block: bytes) -> str:
    """`sha1:` + base32 of the SHA-1 of `block`, as WARC-Block-Digest (and warcio) write it."""
    return "sha1:" + base64.b32encode(hashlib.sha1(block).digest()).decode("ascii")


def language_codes(languages: Iterable[Mapping[str, object]] | None) -> str | None:
    """`pages.languages` in Common Crawl's form: the codes comma-separated, most of the text first (None: none)."""
    codes = [str(language["code"]) for language in languages or ()]
    return ",".join(codes) or None


def wet_outcome(is_html: bool, text: str | None) -> WetOutcome:
    """What becomes of a page in the WET file: not HTML (binary or another type), no text, or a record."""
    if not is_html:
        return WetOutcome.NOT_HTML
    if text is None or not text.strip():
        return WetOutcome.NO_TEXT
    return WetOutcome.WRITTEN


def _header_value(value: str) -> str:
    """A header value on one line: CR and LF (never in a URI or date the daemon wrote) become spaces."""
    return value.replace("\r", " ").replace("\n", " ")


def _record(headers: list[tuple[str, str]], block: bytes) -> bytes:
    """One WARC record, its own gzip member: the header lines, WARC-Block-Digest, Content-Length, the block."""
    lines = [WARC_VERSION]
    lines.extend(f"{name}: {_header_value(value)}" for name, value in headers)
    lines.append(f"WARC-Block-Digest: {block_digest(block)}")
    lines.append(f"Content-Length: {len(block)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + block + b"\r\n\r\n"
    compressor = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, _GZIP_WBITS)
    return compressor.compress(raw) + compressor.flush()


def conversion_record(text: str, *, target_uri: str, date: str, refers_to: str | None,
                      languages: str | None) -> bytes:
    """The conversion record of a page's text, one gzip member. `refers_to` is the response record's
    WARC-Record-ID (its own id is derived from it; without one, from the URI and date), `date` its WARC-Date,
    `languages` Common Crawl's comma-separated codes (None: no language header)."""
    headers = [
        ("WARC-Type", "conversion"),
        ("WARC-Target-URI", target_uri),
        ("WARC-Date", date),
        ("WARC-Record-ID", record_id(f"conversion {refers_to or target_uri + ' ' + date}")),
    ]
    if refers_to:
        headers.append(("WARC-Refers-To", refers_to))
    if languages:
        headers.append((LANGUAGE_HEADER, languages))
    headers.append(("Content-Type", "text/plain"))
    # "replace": a lone surrogate the HTML decoder let through cannot be UTF-8
    return _record(headers, text.encode("utf-8", "replace"))


def warcinfo_record(wet_filename: str, date: datetime, fields: Mapping[str, str]) -> bytes:
    """The WET file's first record: its name, the time of its oldest capture (so a re-run writes the same), and
    `fields` as application/warc-fields lines."""
    block = "".join(f"{name}: {_header_value(value)}\r\n" for name, value in fields.items()).encode("utf-8")
    headers = [
        ("WARC-Type", "warcinfo"),
        ("WARC-Date", warc_date(date)),
        ("WARC-Filename", wet_filename.rsplit("/", 1)[-1]),
        ("WARC-Record-ID", record_id(f"warcinfo {wet_filename}")),
        ("Content-Type", "application/warc-fields"),
    ]
    return _record(headers, block)


def warc_date(moment: datetime) -> str:
    """A WARC-Date (UTC, to the second); a naive datetime is taken as UTC."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
