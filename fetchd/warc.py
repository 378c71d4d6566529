"""WARC/1.1 output of the fetch daemon: one gzip member per record, written as `*.open`, renamed when closed.

A file starts with a warcinfo record; each fetch adds a request record and a response record that name
each other in WARC-Concurrent-To (a 304 adds a revisit record, profile server-not-modified, instead of the
response), then a metadata record about the fetch (time, IP, truncation, outcome) concurrent to the response.
The offset and compressed length of the response/revisit record are measured from the file position around
the write, so results can point at it. `close()` flushes and fsyncs before the rename: a closed file name
always holds complete records. A `*.open` file left by a killed daemon is cut back to its last complete
record by `recover_open_warc`; every record is flushed to the OS as it is written, and the result rows of
the fetches are in the file too (`write_result`), so what a killed daemon wrote is kept. Files are named by
the IIPC convention (`iipc_stem`).
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler import layout

WARC_VERSION = "WARC/1.1"
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
WARC_SUFFIX = ".warc.gz"
_HOP_BY_HOP_DROPPED = frozenset({"transfer-encoding"})  # the body is stored de-chunked, so the header would lie
WARC_TRUNCATED_VALUES = frozenset({"length", "time", "disconnect", "unspecified"})  # WARC 1.1 §5.13
RESULT_CONTENT_TYPE = "application/vnd.cyclecrawl.result+json"  # metadata records that carry a result row
_SCAN_CHUNK = 1 << 16
_MAX_HEAD_BYTES = 1 << 20  # a WARC header block longer than this is taken as garbage by recovery


@dataclass(frozen=True)
class WrittenRecord:
    """Where a response or revisit record landed, and its payload digest."""

    offset: int
    length: int
    payload_digest: str | None


@dataclass(frozen=True)
class RecoveredWarc:
    """What `recover_open_warc` left on disk: the complete records kept (0 if the file was deleted), their bytes,
    and the final file name (None if deleted)."""

    records: int
    bytes: int
    path: str | None


def iipc_stem(prefix: str, created: float, serial: int, host: str) -> str:
    """`prefix-timestamp-serial-host` (IIPC WARC naming): UTC creation time to the millisecond, 5-digit serial."""
    moment = datetime.fromtimestamp(created, timezone.utc)
    return f"{prefix}-{moment:%Y%m%d%H%M%S}{moment.microsecond // 1000:03d}-{serial:05d}-{host}"


def new_record_id() -> str:
    return WARCWriter._make_warc_id()


def http_request_headers(method: str, path: str, headers: Sequence[tuple[str, str]]) -> StatusAndHeaders:
    return StatusAndHeaders(f"{method} {path} HTTP/1.1", list(headers), is_http_request=True)


def http_response_headers(status: int, reason: str, headers: Sequence[tuple[str, str]]) -> StatusAndHeaders:
    kept = [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP_DROPPED]
    return StatusAndHeaders(f"{status} {reason}".strip(), kept, protocol="HTTP/1.1")


class WarcFile:
    """One WARC file being written. Not thread-safe: the daemon writes from its event loop only."""

    def __init__(self, path: str, warcinfo: dict[str, str], on_write: Callable[[int], None] = lambda n: None):
        self.path = path
        self.on_write = on_write  # told the bytes of every record written (metrics)
        self.open_path = path + layout.OPEN_SUFFIX
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fh = open(self.open_path, "wb")  # noqa: SIM115 - lives until close()
        self._writer = WARCWriter(self._fh, gzip=True, warc_version=WARC_VERSION)
        self.records = 0
        info = self._writer.create_warcinfo_record(os.path.basename(path), warcinfo)
        self.warcinfo_id = info.rec_headers.get_header("WARC-Record-ID")
        self._writer.write_record(info)
        on_write(self._fh.tell())

    @property
    def size(self) -> int:
        return self._fh.tell()

    def _common_headers(self, record_id: str, date: str, ip: str | None, concurrent_to: str | None) -> dict[str, str]:
        headers = {"WARC-Record-ID": record_id, "WARC-Date": date, "WARC-Warcinfo-ID": self.warcinfo_id}
        if ip:
            headers["WARC-IP-Address"] = ip
        if concurrent_to:
            headers["WARC-Concurrent-To"] = concurrent_to
        return headers

    def _write(self, record) -> WrittenRecord:
        offset = self._fh.tell()
        self._writer.write_record(record)
        self._fh.flush()  # whole records reach the OS: a killed process leaves them for recovery
        self.records += 1
        self.on_write(self._fh.tell() - offset)
        return WrittenRecord(offset, self._fh.tell() - offset, record.rec_headers.get_header("WARC-Payload-Digest"))

    def write_request(
        self, uri: str, http_headers: StatusAndHeaders, date: str, ip: str | None, record_id: str, concurrent_to: str
    ) -> WrittenRecord:
        headers = self._common_headers(record_id, date, ip, concurrent_to)
        record = self._writer.create_warc_record(
            uri, "request", payload=io.BytesIO(b""), length=0, warc_headers_dict=headers, http_headers=http_headers
        )
        return self._write(record)

    def write_response(
        self,
        uri: str,
        http_headers: StatusAndHeaders,
        body: bytes,
        date: str,
        ip: str | None,
        record_id: str,
        concurrent_to: str,
        truncated_reason: str | None = None,
    ) -> WrittenRecord:
        headers = self._common_headers(record_id, date, ip, concurrent_to)
        if truncated_reason:  # the metadata record keeps the exact reason
            headers["WARC-Truncated"] = truncated_reason if truncated_reason in WARC_TRUNCATED_VALUES else "unspecified"
        record = self._writer.create_warc_record(
            uri, "response", payload=io.BytesIO(body), length=len(body), warc_headers_dict=headers,
            http_headers=http_headers,
        )
        return self._write(record)

    def write_not_modified(
        self, uri: str, http_headers: StatusAndHeaders, date: str, ip: str | None, record_id: str, concurrent_to: str,
        refers_to_date: str | None = None,
    ) -> WrittenRecord:
        """A 304 as a revisit record: the server said our stored copy of `uri` is still current. `refers_to_date`
        is the WARC-Date of that earlier capture, when known (the header is left out otherwise)."""
        headers = self._common_headers(record_id, date, ip, concurrent_to)
        headers["WARC-Profile"] = NOT_MODIFIED_PROFILE
        headers["WARC-Refers-To-Target-URI"] = uri
        if refers_to_date:
            headers["WARC-Refers-To-Date"] = refers_to_date
        record = self._writer.create_warc_record(
            uri, "revisit", payload=io.BytesIO(b""), length=0, warc_headers_dict=headers, http_headers=http_headers
        )
        return self._write(record)

    def write_fetch_metadata(
        self, uri: str, date: str, concurrent_to: str, fetch_time_ms: int, ip: str | None,
        truncated_reason: str | None, outcome: str | None,
    ) -> WrittenRecord:
        """A metadata record (application/warc-fields) about the fetch whose response is `concurrent_to`: what
        the response record cannot say itself. Field names follow Heritrix (fetchTimeMs) where it has one."""
        fields = {"fetchTimeMs": str(fetch_time_ms), "ip": ip, "truncated": truncated_reason, "outcome": outcome}
        block = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value).encode("utf-8")
        headers = self._common_headers(new_record_id(), date, None, concurrent_to)
        record = self._writer.create_warc_record(
            uri, "metadata", payload=io.BytesIO(block), length=len(block),
            warc_content_type="application/warc-fields", warc_headers_dict=headers,
        )
        return self._write(record)

    def write_result(self, uri: str, date: str, kind: str, row_json: str) -> WrittenRecord:
        """A metadata record holding a result row (`kind`: fetched or robots) as JSON: the WARC file is the
        daemon's durable log, so rows not yet published when it dies are rebuilt from here (`read_results`)."""
        block = f'{{"kind":"{kind}","row":{row_json}}}'.encode()
        headers = {"WARC-Record-ID": new_record_id(), "WARC-Date": date, "WARC-Warcinfo-ID": self.warcinfo_id}
        record = self._writer.create_warc_record(
            uri, "metadata", payload=io.BytesIO(block), length=len(block),
            warc_content_type=RESULT_CONTENT_TYPE, warc_headers_dict=headers,
        )
        return self._write(record)

    def sync(self) -> None:
        """Make every record written so far durable (before result rows that point at them are published)."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def abandon(self) -> None:
        """Stop writing and leave the `*.open` file as it is, for `recover_open_warc` (the bucket was lost)."""
        self._fh.close()

    def close(self) -> None:
        """Make the records durable, then give the file its final name."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self.open_path, self.path)

    def discard(self) -> None:
        """Drop a file that holds nothing worth keeping (only its warcinfo record)."""
        self._fh.close()
        os.remove(self.open_path)


class _RecordCheck:
    """Fed the decompressed bytes of one gzip member: is it one whole WARC record (version line, headers,
    exactly Content-Length block bytes, then CRLF CRLF)?"""

    def __init__(self) -> None:
        self._head = b""
        self.headers: dict[str, str] | None = None  # lower-cased names, once the header block is parsed
        self._length = -1
        self._after_head = 0
        self._tail = b""
        self.garbage = False

    def feed(self, data: bytes) -> None:
        if self.garbage or not data:
            return
        if self.headers is None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                self.garbage = len(self._head) > _MAX_HEAD_BYTES
                return
            data = self._head[end + 4:]
            self._parse_head(self._head[:end].decode("utf-8", "replace"))
            self._head = b""
            if self.garbage:
                return
        self._after_head += len(data)
        self._tail = (self._tail + data)[-4:]

    def _parse_head(self, text: str) -> None:
        lines = text.split("\r\n")
        if not lines[0].startswith("WARC/"):
            self.garbage = True
            return
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self.garbage = True
                return
            headers[name.strip().lower()] = value.strip()
        try:
            self._length = int(headers.get("content-length", ""))
        except ValueError:
            self.garbage = True
            return
        self.headers = headers

    def complete(self) -> bool:
        return (not self.garbage and self.headers is not None and self._after_head == self._length + 4
                and self._tail == b"\r\n\r\n")


def _complete_records(fh: io.BufferedReader) -> Iterator[tuple[int, dict[str, str]]]:
    """(end offset, headers) of each record from the start of the file, one gzip member each, streamed; stops
    before the first member that is torn (cut short, bad CRC) or does not hold exactly one whole record."""
    offset, pending = 0, b""
    while True:
        inflater, check, used = zlib.decompressobj(wbits=31), _RecordCheck(), 0
        while not inflater.eof:
            if not pending:
                pending = fh.read(_SCAN_CHUNK)
                if not pending:
                    return
            try:
                check.feed(inflater.decompress(pending))
            except zlib.error:
                return
            if inflater.eof:
                used += len(pending) - len(inflater.unused_data)
                pending = inflater.unused_data
            else:
                used += len(pending)
                pending = b""
            if check.garbage:
                return
        if not check.complete():
            return
        offset += used
        assert check.headers is not None
        yield offset, check.headers


def recover_open_warc(open_path: str) -> RecoveredWarc:
    """Make a `*.open` WARC left by a killed writer safe: cut it after its last complete record (a torn tail
    is dropped) and give it its final name if it holds at least one request/response (or revisit) pair;
    otherwise delete it. Only complete gzip members holding one whole record are kept."""
    if not open_path.endswith(layout.OPEN_SUFFIX):
        raise ValueError(f"not an open WARC file: {open_path}")
    end, count, requests, has_pair = 0, 0, set(), False
    with open(open_path, "rb") as fh:
        for record_end, headers in _complete_records(fh):
            end, count = record_end, count + 1
            kind = headers.get("warc-type")
            if kind == "request":
                requests.add(headers.get("warc-record-id"))
            elif kind in ("response", "revisit") and headers.get("warc-concurrent-to") in requests:
                has_pair = True
    if not has_pair:
        os.remove(open_path)
        return RecoveredWarc(0, 0, None)
    with open(open_path, "r+b") as fh:
        fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
    final = open_path.removesuffix(layout.OPEN_SUFFIX)
    os.replace(open_path, final)
    return RecoveredWarc(count, end, final)


def read_results(path: str) -> Iterator[tuple[str, str]]:
    """(kind, row JSON) of every result record in a closed WARC file, streamed (`WarcFile.write_result`)."""
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "metadata" and record.rec_headers.get_header("Content-Type") == RESULT_CONTENT_TYPE:
                data = json.loads(record.content_stream().read())
                yield data["kind"], json.dumps(data["row"])
