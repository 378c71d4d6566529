"""Golden bytes of every kind of WARC record the fetch daemon writes, spelled out by hand from WARC 1.1.

The records are built through `WarcFile` as the daemon builds them (fixed record ids, dates and payloads) and
written by its writer thread with either compressor; each gzip member must inflate to exactly the bytes below.
WARC 1.1 §4: `WARC/1.1` CRLF, named fields each ending CRLF, a blank line, the block, then CRLF CRLF; the writer
puts WARC-Block-Digest (and, on request and response records, WARC-Payload-Digest: the entity-body's) and
Content-Length (the block's octets) after the fields the record was built with. The digests are labelled base32
SHA-1 computed here with hashlib, never taken from the writer, and `test_goldens_are_well_formed` checks the
goldens themselves against the spec's rules, so a wrong golden fails there and a wrong writer fails here.
warcio and fastwarc then read every record back: headers in order, HTTP status, payload, digests.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import warcio.archiveiterator
from fastwarc.warc import ArchiveIterator as FastArchiveIterator
from fastwarc.warc import WarcRecordType

from fetchd.warc import Record, WarcFile, http_request_headers, http_response_headers


def sha1_label(data: bytes) -> bytes:
    """A WARC labelled digest: `sha1:` and the base32 (RFC 4648) SHA-1 of `data`."""
    return b"sha1:" + base64.b32encode(hashlib.sha1(data).digest())  # noqa: S324 - the WARC convention


EMPTY_SHA1 = b"sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ"  # SHA-1 of no octets (da39a3ee...): a request's payload

WARCINFO_ID = "<urn:uuid:00000000-0000-4000-8000-000000000001>"
REQUEST_ID = "<urn:uuid:00000000-0000-4000-8000-000000000002>"
RESPONSE_ID = "<urn:uuid:00000000-0000-4000-8000-000000000003>"
FETCH_METADATA_ID = "<urn:uuid:00000000-0000-4000-8000-000000000004>"
RESULT_ID = "<urn:uuid:00000000-0000-4000-8000-000000000005>"
REVISIT_ID = "<urn:uuid:00000000-0000-4000-8000-000000000006>"
REVISIT_REQUEST_ID = "<urn:uuid:00000000-0000-4000-8000-000000000007>"
BARE_REVISIT_ID = "<urn:uuid:00000000-0000-4000-8000-000000000008>"
ODD_ID = "<urn:uuid:00000000-0000-4000-8000-000000000009>"
ODD_REQUEST_ID = "<urn:uuid:00000000-0000-4000-8000-00000000000a>"
ODD_METADATA_ID = "<urn:uuid:00000000-0000-4000-8000-00000000000b>"
BIG_ID = "<urn:uuid:00000000-0000-4000-8000-00000000000c>"
BIG_REQUEST_ID = "<urn:uuid:00000000-0000-4000-8000-00000000000d>"

FILENAME = "golden-20240102030400000-00001-test.warc.gz"
WARCINFO_DATE = "2024-01-02T03:04:00.000000Z"
DATE = "2024-01-02T03:04:05.123456Z"  # a fetch's WARC-Date: W3CDTF with a decimal fraction (WARC 1.1 §5.4)
EARLIER_DATE = "2023-12-01T00:00:00Z"  # the capture a 304 refers to
URL = "http://example.test/caf%C3%A9?q=1&lang=en"
IP = "192.0.2.7"
USER_AGENT = "cyclecrawl-test (+http://example.test/bot)"

# ---- the goldens ---------------------------------------------------------------------------------------------

# warcinfo (§6.2): no WARC-Target-URI, no WARC-Warcinfo-ID; WARC-Filename; an application/warc-fields block in
# UTF-8, an empty field left out.
WARCINFO_FIELDS = {
    "software": "cyclecrawl-fetchd/0.1",
    "format": "WARC File Format 1.1",
    "conformsTo": "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/",
    "robots": "obey",
    "http-header-user-agent": USER_AGENT,
    "operator": "Zo\u00eb Ops",
    "hostname": "",
}
WARCINFO_BLOCK = (b"software: cyclecrawl-fetchd/0.1\r\n"
                  b"format: WARC File Format 1.1\r\n"
                  b"conformsTo: http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/\r\n"
                  b"robots: obey\r\n"
                  b"http-header-user-agent: cyclecrawl-test (+http://example.test/bot)\r\n"
                  b"operator: Zo\xc3\xab Ops\r\n")
WARCINFO = (b"WARC/1.1\r\n"
            b"WARC-Type: warcinfo\r\n"
            b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
            b"WARC-Filename: golden-20240102030400000-00001-test.warc.gz\r\n"
            b"WARC-Date: 2024-01-02T03:04:00.000000Z\r\n"
            b"Content-Type: application/warc-fields\r\n"
            b"WARC-Block-Digest: " + sha1_label(WARCINFO_BLOCK) + b"\r\n"
            b"Content-Length: 257\r\n"
            b"\r\n" + WARCINFO_BLOCK + b"\r\n\r\n")

# request (§6.5): the HTTP request's header block; its payload (entity-body) is empty, digest of no octets.
REQUEST_HTTP = (b"GET /caf%C3%A9?q=1&lang=en HTTP/1.1\r\n"
                b"Host: example.test\r\n"
                b"User-Agent: cyclecrawl-test (+http://example.test/bot)\r\n"
                b"Accept: */*\r\n"
                b"Accept-Encoding: gzip, deflate\r\n"
                b"\r\n")
REQUEST = (b"WARC/1.1\r\n"
           b"WARC-Type: request\r\n"
           b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000002>\r\n"
           b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
           b"WARC-Target-URI: http://example.test/caf%C3%A9?q=1&lang=en\r\n"
           b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
           b"WARC-IP-Address: 192.0.2.7\r\n"
           b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000003>\r\n"
           b"Content-Type: application/http; msgtype=request\r\n"
           b"WARC-Block-Digest: " + sha1_label(REQUEST_HTTP) + b"\r\n"
           b"WARC-Payload-Digest: sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ\r\n"
           b"Content-Length: 160\r\n"
           b"\r\n" + REQUEST_HTTP + b"\r\n\r\n")

# response (§6.3): HTTP header block (Transfer-Encoding left out: the body is stored de-chunked) and the body;
# the body holds a CRLF CRLF, a NUL and bytes that are not UTF-8: the block is octets, Content-Length counts them.
RESPONSE_HEADERS = [("Date", "Tue, 02 Jan 2024 03:04:05 GMT"), ("Content-Type", "text/html; charset=utf-8"),
                    ("Transfer-Encoding", "chunked"), ("ETag", '"v1"'),
                    ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")]
RESPONSE_HTTP = (b"HTTP/1.1 200 OK\r\n"
                 b"Date: Tue, 02 Jan 2024 03:04:05 GMT\r\n"
                 b"Content-Type: text/html; charset=utf-8\r\n"
                 b'ETag: "v1"\r\n'
                 b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
                 b"\r\n")
BODY = b"<html><body>caf\xc3\xa9 \xff\xfe\x00\r\n\r\nnot the end</body></html>\n"
RESPONSE = (b"WARC/1.1\r\n"
            b"WARC-Type: response\r\n"
            b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000003>\r\n"
            b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
            b"WARC-Target-URI: http://example.test/caf%C3%A9?q=1&lang=en\r\n"
            b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
            b"WARC-IP-Address: 192.0.2.7\r\n"
            b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000002>\r\n"
            b"Content-Type: application/http; msgtype=response\r\n"
            b"WARC-Block-Digest: " + sha1_label(RESPONSE_HTTP + BODY) + b"\r\n"
            b"WARC-Payload-Digest: " + sha1_label(BODY) + b"\r\n"
            b"Content-Length: 205\r\n"
            b"\r\n" + RESPONSE_HTTP + BODY + b"\r\n\r\n")

# metadata about the fetch (§6.6): application/warc-fields, concurrent to the response; no payload digest.
FETCH_FIELDS = b"fetchTimeMs: 153\r\nip: 192.0.2.7\r\noutcome: success\r\n"
FETCH_METADATA = (b"WARC/1.1\r\n"
                  b"WARC-Type: metadata\r\n"
                  b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000004>\r\n"
                  b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
                  b"WARC-Target-URI: http://example.test/caf%C3%A9?q=1&lang=en\r\n"
                  b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
                  b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000003>\r\n"
                  b"Content-Type: application/warc-fields\r\n"
                  b"WARC-Block-Digest: " + sha1_label(FETCH_FIELDS) + b"\r\n"
                  b"Content-Length: 51\r\n"
                  b"\r\n" + FETCH_FIELDS + b"\r\n\r\n")

# a result row as a metadata record of the project's own media type.
RESULT_ROW = '{"url":"http://example.test/caf%C3%A9?q=1&lang=en","status_code":200}'
RESULT_BLOCK = b'{"kind":"fetched","row":{"url":"http://example.test/caf%C3%A9?q=1&lang=en","status_code":200}}'
RESULT = (b"WARC/1.1\r\n"
          b"WARC-Type: metadata\r\n"
          b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000005>\r\n"
          b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
          b"WARC-Target-URI: http://example.test/caf%C3%A9?q=1&lang=en\r\n"
          b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
          b"Content-Type: application/vnd.cyclecrawl.result+json\r\n"
          b"WARC-Block-Digest: " + sha1_label(RESULT_BLOCK) + b"\r\n"
          b"Content-Length: 94\r\n"
          b"\r\n" + RESULT_BLOCK + b"\r\n\r\n")

# revisit, profile server-not-modified (§6.7.3): the 304's header block only, no WARC-Payload-Digest (the payload
# is the earlier capture's); WARC-Refers-To-Target-URI and WARC-Refers-To-Date name that capture.
NOT_MODIFIED_URL = "http://example.test/page"
NOT_MODIFIED_HEADERS = [("Date", "Tue, 02 Jan 2024 03:04:05 GMT"), ("ETag", '"v1"')]
NOT_MODIFIED_HTTP = (b"HTTP/1.1 304 Not Modified\r\n"
                     b"Date: Tue, 02 Jan 2024 03:04:05 GMT\r\n"
                     b'ETag: "v1"\r\n'
                     b"\r\n")
REVISIT = (b"WARC/1.1\r\n"
           b"WARC-Type: revisit\r\n"
           b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000006>\r\n"
           b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
           b"WARC-Target-URI: http://example.test/page\r\n"
           b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
           b"WARC-IP-Address: 192.0.2.7\r\n"
           b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000007>\r\n"
           b"WARC-Profile: http://netpreserve.org/warc/1.1/revisit/server-not-modified\r\n"
           b"WARC-Refers-To-Target-URI: http://example.test/page\r\n"
           b"WARC-Refers-To-Date: 2023-12-01T00:00:00Z\r\n"
           b"Content-Type: application/http; msgtype=response\r\n"
           b"WARC-Block-Digest: " + sha1_label(NOT_MODIFIED_HTTP) + b"\r\n"
           b"Content-Length: 78\r\n"
           b"\r\n" + NOT_MODIFIED_HTTP + b"\r\n\r\n")

# the same without an earlier fetch time or a remote address: those two fields are left out, not left empty.
BARE_REVISIT = (b"WARC/1.1\r\n"
                b"WARC-Type: revisit\r\n"
                b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000008>\r\n"
                b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
                b"WARC-Target-URI: http://example.test/page\r\n"
                b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
                b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000007>\r\n"
                b"WARC-Profile: http://netpreserve.org/warc/1.1/revisit/server-not-modified\r\n"
                b"WARC-Refers-To-Target-URI: http://example.test/page\r\n"
                b"Content-Type: application/http; msgtype=response\r\n"
                b"WARC-Block-Digest: " + sha1_label(NOT_MODIFIED_HTTP) + b"\r\n"
                b"Content-Length: 78\r\n"
                b"\r\n" + NOT_MODIFIED_HTTP + b"\r\n\r\n")

# The odd response. Its target is not ASCII: the writer puts it into the field as UTF-8 (WARC 1.1 §4 allows
# UTF-8 in field values; §5.14 asks for the RFC 3986 form, `caf%C3%A9`, which is what the daemon hands the
# writer: only canonical URLs are fetched). Its IP is IPv6. Its HTTP header values hold octets that are not ASCII,
# as the fetcher gives them (each octet read as Latin-1): the block is made ASCII the way warcio does it, a value
# percent-encoded as the UTF-8 of that reading, a `name="value"` parameter rewritten as `name*=UTF-8''value`
# (RFC 8187). So the wire octets E9 74 E9 are stored as `%C3%A9t%C3%A9`, and a UTF-8 value (C3 A9) as
# `%C3%83%C2%A9`. The empty reason phrase leaves the status line without its trailing space. A truncation
# reason WARC 1.1 does not define is written `unspecified`; the metadata record keeps the exact one.
ODD_URL = "http://example.test/caf\u00e9"
ODD_IP = "2001:db8::7"
ODD_HEADERS = [("X-Latin1", "\u00e9t\u00e9"), ("X-Utf8", "caf\u00c3\u00a9"),
               ("Content-Disposition", 'attachment; filename="\u00e9.txt"'), ("Content-Type", "text/plain")]
ODD_HTTP = (b"HTTP/1.1 200\r\n"
            b"X-Latin1: %C3%A9t%C3%A9\r\n"
            b"X-Utf8: caf%C3%83%C2%A9\r\n"
            b"Content-Disposition: attachment; filename*=UTF-8''%C3%A9.txt\r\n"
            b"Content-Type: text/plain\r\n"
            b"\r\n")
ODD_BODY = b"partial"
ODD_RESPONSE = (b"WARC/1.1\r\n"
                b"WARC-Type: response\r\n"
                b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-000000000009>\r\n"
                b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
                b"WARC-Target-URI: http://example.test/caf\xc3\xa9\r\n"
                b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
                b"WARC-IP-Address: 2001:db8::7\r\n"
                b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-00000000000a>\r\n"
                b"WARC-Truncated: unspecified\r\n"
                b"Content-Type: application/http; msgtype=response\r\n"
                b"WARC-Block-Digest: " + sha1_label(ODD_HTTP + ODD_BODY) + b"\r\n"
                b"WARC-Payload-Digest: " + sha1_label(ODD_BODY) + b"\r\n"
                b"Content-Length: 161\r\n"
                b"\r\n" + ODD_HTTP + ODD_BODY + b"\r\n\r\n")
ODD_FIELDS = b"fetchTimeMs: 7\r\nip: 2001:db8::7\r\ntruncated: decoded-length\r\noutcome: success\r\n"
ODD_METADATA = (b"WARC/1.1\r\n"
                b"WARC-Type: metadata\r\n"
                b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-00000000000b>\r\n"
                b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
                b"WARC-Target-URI: http://example.test/caf\xc3\xa9\r\n"
                b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
                b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-000000000009>\r\n"
                b"Content-Type: application/warc-fields\r\n"
                b"WARC-Block-Digest: " + sha1_label(ODD_FIELDS) + b"\r\n"
                b"Content-Length: 78\r\n"
                b"\r\n" + ODD_FIELDS + b"\r\n\r\n")

# A body of 1 MiB and more takes the writer's streaming path (headers, body and end compressed in turn).
BIG_URL = "http://example.test/big.bin"
BIG_BODY = bytes(range(256)) * 4096 + b"tail"
BIG_HTTP = (b"HTTP/1.1 200 OK\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: 1048580\r\n"
            b"\r\n")
BIG_RESPONSE = (b"WARC/1.1\r\n"
                b"WARC-Type: response\r\n"
                b"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-00000000000c>\r\n"
                b"WARC-Date: 2024-01-02T03:04:05.123456Z\r\n"
                b"WARC-Target-URI: http://example.test/big.bin\r\n"
                b"WARC-Warcinfo-ID: <urn:uuid:00000000-0000-4000-8000-000000000001>\r\n"
                b"WARC-IP-Address: 192.0.2.7\r\n"
                b"WARC-Concurrent-To: <urn:uuid:00000000-0000-4000-8000-00000000000d>\r\n"
                b"Content-Type: application/http; msgtype=response\r\n"
                b"WARC-Block-Digest: " + sha1_label(BIG_HTTP + BIG_BODY) + b"\r\n"
                b"WARC-Payload-Digest: " + sha1_label(BIG_BODY) + b"\r\n"
                b"Content-Length: 1048664\r\n"
                b"\r\n" + BIG_HTTP + BIG_BODY + b"\r\n\r\n")


class Golden(NamedTuple):
    """One record: how the daemon's code builds it, its exact bytes, and what a reader should find in it."""

    name: str
    build: Callable[[WarcFile], Record] | None  # None: the warcinfo record, written by the WarcFile itself
    expected: bytes
    target: str | None  # WARC-Target-URI as text
    status: int | None  # HTTP status of a request/response/revisit block (None for a request)
    payload: bytes  # what follows the HTTP header block, or the whole block of a record without one
    payload_digest: bytes | None  # the WARC-Payload-Digest the golden carries


GOLDENS = [
    Golden("warcinfo", None, WARCINFO, None, None, WARCINFO_BLOCK, None),
    Golden("request", lambda w: w.request_record(
        URL, http_request_headers("GET", "/caf%C3%A9?q=1&lang=en", [
            ("Host", "example.test"), ("User-Agent", USER_AGENT), ("Accept", "*/*"),
            ("Accept-Encoding", "gzip, deflate")]),
        DATE, IP, REQUEST_ID, RESPONSE_ID), REQUEST, URL, None, b"", EMPTY_SHA1),
    Golden("response", lambda w: w.response_record(
        URL, http_response_headers(200, "OK", RESPONSE_HEADERS), BODY, DATE, IP, RESPONSE_ID, REQUEST_ID),
        RESPONSE, URL, 200, BODY, sha1_label(BODY)),
    Golden("fetch metadata", lambda w: w.fetch_metadata_record(
        URL, DATE, RESPONSE_ID, 153, IP, None, "success", record_id=FETCH_METADATA_ID),
        FETCH_METADATA, URL, None, FETCH_FIELDS, None),
    Golden("result", lambda w: w.result_record(URL, DATE, "fetched", RESULT_ROW, record_id=RESULT_ID),
           RESULT, URL, None, RESULT_BLOCK, None),
    Golden("revisit", lambda w: w.not_modified_record(
        NOT_MODIFIED_URL, http_response_headers(304, "Not Modified", NOT_MODIFIED_HEADERS), DATE, IP, REVISIT_ID,
        REVISIT_REQUEST_ID, refers_to_date=EARLIER_DATE), REVISIT, NOT_MODIFIED_URL, 304, b"", None),
    Golden("bare revisit", lambda w: w.not_modified_record(
        NOT_MODIFIED_URL, http_response_headers(304, "Not Modified", NOT_MODIFIED_HEADERS), DATE, None,
        BARE_REVISIT_ID, REVISIT_REQUEST_ID), BARE_REVISIT, NOT_MODIFIED_URL, 304, b"", None),
    Golden("odd response", lambda w: w.response_record(
        ODD_URL, http_response_headers(200, "", ODD_HEADERS), ODD_BODY, DATE, ODD_IP, ODD_ID, ODD_REQUEST_ID,
        truncated_reason="decoded-length"), ODD_RESPONSE, ODD_URL, 200, ODD_BODY, sha1_label(ODD_BODY)),
    Golden("odd metadata", lambda w: w.fetch_metadata_record(
        ODD_URL, DATE, ODD_ID, 7, ODD_IP, "decoded-length", "success", record_id=ODD_METADATA_ID),
        ODD_METADATA, ODD_URL, None, ODD_FIELDS, None),
    Golden("big response", lambda w: w.response_record(
        BIG_URL, http_response_headers(200, "OK", [("Content-Type", "application/octet-stream"),
                                                   ("Content-Length", str(len(BIG_BODY)))]),
        BIG_BODY, DATE, IP, BIG_ID, BIG_REQUEST_ID), BIG_RESPONSE, BIG_URL, 200, BIG_BODY, sha1_label(BIG_BODY)),
]
BY_NAME = {golden.name: golden for golden in GOLDENS}
HTTP_RECORDS = (b"request", b"response", b"revisit")
COMPRESSORS = [("isal", 0), ("isal", 1), ("isal", 3), ("zlib", 0), ("zlib", 1), ("zlib", 9)]


# ---- helpers -------------------------------------------------------------------------------------------------


def split_record(record: bytes) -> tuple[list[bytes], bytes]:
    """The header lines (version line first, without their CRLF) and the block, by WARC 1.1 §4 alone."""
    head, _, rest = record.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    return lines, rest[:int(fields_of(lines)[b"Content-Length"])]


def fields_of(lines: list[bytes]) -> dict[bytes, bytes]:
    """The named fields of a record's header lines."""
    return dict(line.split(b": ", 1) for line in lines[1:])


def assert_same_bytes(actual: bytes, expected: bytes, name: str) -> None:
    """Equal bytes, or a message naming the first difference (a 1 MiB diff helps nobody)."""
    if actual == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b),
              min(len(actual), len(expected)))
    near = slice(max(0, at - 60), at + 60)
    raise AssertionError(f"{name}: {len(actual)} bytes, golden {len(expected)}; first difference at {at}:\n"
                         f"  written {actual[near]!r}\n  golden  {expected[near]!r}")


def gzip_members(data: bytes) -> list[bytes]:
    """The gzip members of a file, one after the other, found by inflating each to its end."""
    members = []
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        inflater.decompress(data)
        assert inflater.eof, "a member that does not end"
        used = len(data) - len(inflater.unused_data)
        members.append(data[:used])
        data = data[used:]
    return members


def write_goldens(path: Path, compressor: str, level: int) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """Every golden record written as the daemon writes them: the warcinfo record by the new file, an
    exchange's request, response and fetch metadata as one job, its result row logged after. The file's bytes,
    and where each record that was waited for landed (offset, length)."""
    warc = WarcFile(str(path), WARCINFO_FIELDS, gzip_level=level, compressor=compressor,
                    warcinfo_id=WARCINFO_ID, warcinfo_date=WARCINFO_DATE)
    jobs = [["request", "response", "fetch metadata"], ["result"], ["revisit"], ["bare revisit"],
            ["odd response", "odd metadata"], ["big response"]]
    landed = {}
    for names in jobs:
        records = [BY_NAME[name].build(warc) for name in names]
        if names == ["result"]:
            warc.log(records[0])
            continue
        for name, written in zip(names, warc.submit(records).result(), strict=True):
            landed[name] = (written.offset, written.length)
            expected_digest = BY_NAME[name].payload_digest
            assert written.payload_digest == (expected_digest.decode() if expected_digest else None), name
    warc.close()
    return path.read_bytes(), landed


@pytest.fixture(scope="module", params=COMPRESSORS, ids=[f"{c}-{level}" for c, level in COMPRESSORS])
def written(request, tmp_path_factory) -> tuple[bytes, dict[str, tuple[int, int]]]:
    compressor, level = request.param
    return write_goldens(tmp_path_factory.mktemp(f"golden-{compressor}-{level}") / FILENAME, compressor, level)


# ---- the goldens against the spec ----------------------------------------------------------------------------


@pytest.mark.parametrize("golden", GOLDENS, ids=[g.name for g in GOLDENS])
def test_goldens_are_well_formed(golden):
    """The hand-written bytes keep WARC 1.1's rules: version line, CRLF-ended unique named fields, the mandatory
    ones, Content-Length = the block's octets, CRLF CRLF after the block, the digests of block and payload."""
    record = golden.expected
    assert record.startswith(b"WARC/1.1\r\n")
    lines, block = split_record(record)
    header_end = sum(len(line) + 2 for line in lines) + 2
    assert record[header_end - 4:header_end] == b"\r\n\r\n"
    assert record[header_end:] == block + b"\r\n\r\n", "the block, then exactly CRLF CRLF"
    names = [line.split(b": ", 1)[0] for line in lines[1:]]
    assert all(re.fullmatch(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name) for name in names)  # tokens
    assert not any(b"\r" in line or b"\n" in line for line in lines)  # no bare CR or LF inside a line
    assert len(set(names)) == len(names)
    fields = {name: line.split(b": ", 1)[1] for name, line in zip(names, lines[1:], strict=True)}
    for mandatory in (b"WARC-Record-ID", b"Content-Length", b"WARC-Date", b"WARC-Type"):
        assert mandatory in fields
    kind = fields[b"WARC-Type"]
    assert (b"WARC-Target-URI" in fields) == (kind != b"warcinfo")
    assert (b"WARC-Filename" in fields) == (kind == b"warcinfo")
    assert int(fields[b"Content-Length"]) == len(block)
    assert fields[b"WARC-Block-Digest"] == sha1_label(block)
    assert fields.get(b"WARC-Payload-Digest") == golden.payload_digest
    if golden.payload_digest is not None:
        assert golden.payload_digest == sha1_label(golden.payload) and block.endswith(golden.payload)
    if kind == b"revisit":
        assert fields[b"WARC-Profile"] == b"http://netpreserve.org/warc/1.1/revisit/server-not-modified"
    assert re.fullmatch(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", fields[b"WARC-Date"])
    assert re.fullmatch(rb"<urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}>",
                        fields[b"WARC-Record-ID"])


def test_empty_sha1_is_the_digest_of_no_octets():
    assert sha1_label(b"") == EMPTY_SHA1


# ---- the writer against the goldens --------------------------------------------------------------------------


def test_each_gzip_member_inflates_to_its_golden_record(written):
    """One member per record, in order, each a gzip file of its own inflating to exactly the golden bytes, at
    the offset and length the writer reported."""
    data, landed = written
    members = gzip_members(data)
    assert len(members) == len(GOLDENS)
    offset = 0
    for golden, member in zip(GOLDENS, members, strict=True):
        assert_same_bytes(gzip.decompress(member), golden.expected, golden.name)
        if golden.name in landed:
            assert landed[golden.name] == (offset, len(member)), golden.name
        offset += len(member)
    assert_same_bytes(gzip.decompress(data), b"".join(g.expected for g in GOLDENS), "the whole file")


def test_warcio_reads_each_record_back(written, tmp_path):
    """warcio, checking both digests as it reads: every field in the golden's order, the target URI, the HTTP
    status line and the payload."""
    path = tmp_path / FILENAME
    path.write_bytes(written[0])
    with open(path, "rb") as fh:
        records = []
        for record in warcio.archiveiterator.ArchiveIterator(fh, check_digests="raise"):
            payload = record.raw_stream.read()  # verifies the digests as the end is read
            records.append((record, payload))
    assert len(records) == len(GOLDENS)
    for golden, (record, payload) in zip(GOLDENS, records, strict=True):
        lines, _ = split_record(golden.expected)
        assert [(name, value) for name, value in record.rec_headers.headers] == \
            [tuple(line.decode("utf-8").split(": ", 1)) for line in lines[1:]], golden.name
        assert record.rec_headers.get_header("WARC-Target-URI") == golden.target
        assert payload == golden.payload, golden.name
        if fields_of(lines)[b"WARC-Type"] in HTTP_RECORDS:
            assert record.http_headers is not None, golden.name
            if golden.status is not None:
                assert record.http_headers.get_statuscode() == str(golden.status), golden.name
        if record.rec_type != "revisit":  # warcio checks no digest of a revisit
            assert record.digest_checker.passed is not False, golden.name
    odd = records[[g.name for g in GOLDENS].index("odd response")][0]
    assert odd.http_headers.get_header("X-Latin1") == "%C3%A9t%C3%A9"


def test_fastwarc_reads_each_record_back(written, tmp_path):
    """fastwarc: type, id, target URI, block and payload digests, HTTP status, payload."""
    path = tmp_path / FILENAME
    path.write_bytes(written[0])
    kinds = {b"warcinfo": WarcRecordType.warcinfo, b"request": WarcRecordType.request,
             b"response": WarcRecordType.response, b"metadata": WarcRecordType.metadata,
             b"revisit": WarcRecordType.revisit}
    seen = 0
    with open(path, "rb") as fh:
        for golden, record in zip(GOLDENS, FastArchiveIterator(fh, parse_http=False), strict=True):
            seen += 1
            fields = fields_of(split_record(golden.expected)[0])
            assert record.record_type == kinds[fields[b"WARC-Type"]], golden.name
            assert record.record_id == fields[b"WARC-Record-ID"].decode(), golden.name
            assert record.headers.get("WARC-Target-URI") == golden.target, golden.name
            assert record.content_length == int(fields[b"Content-Length"]), golden.name
            assert record.verify_block_digest(consume=False), golden.name
            if golden.payload_digest is not None or golden.status is not None:
                record.parse_http()
                if golden.status is not None:
                    assert record.http_headers.status_code == golden.status, golden.name
                if golden.payload_digest is not None:
                    assert record.verify_payload_digest(consume=False), golden.name
            assert record.reader.read() == golden.payload, golden.name
    assert seen == len(GOLDENS)
