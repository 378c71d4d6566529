"""WARC/1.1 output of the fetch daemon: one gzip member per record, written as `*.open`, renamed when closed.

A file starts with a warcinfo record; each fetch adds a request record and a response record that name
each other in WARC-Concurrent-To (a 304 adds a revisit record, profile server-not-modified, instead of the
response). The offset and compressed length of the response/revisit record are measured from the file
position around the write, so results can point at it. `close()` flushes and fsyncs before the rename:
a closed file name always holds complete records.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler import layout

WARC_VERSION = "WARC/1.1"
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
_HOP_BY_HOP_DROPPED = frozenset({"transfer-encoding"})  # the body is stored de-chunked, so the header would lie


@dataclass(frozen=True)
class WrittenRecord:
    """Where a response or revisit record landed, and its payload digest."""

    offset: int
    length: int
    payload_digest: str | None


def new_record_id() -> str:
    return WARCWriter._make_warc_id()


def http_request_headers(method: str, path: str, headers: Sequence[tuple[str, str]]) -> StatusAndHeaders:
    return StatusAndHeaders(f"{method} {path} HTTP/1.1", list(headers), is_http_request=True)


def http_response_headers(status: int, reason: str, headers: Sequence[tuple[str, str]]) -> StatusAndHeaders:
    kept = [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP_DROPPED]
    return StatusAndHeaders(f"{status} {reason}".strip(), kept, protocol="HTTP/1.1")


class WarcFile:
    """One WARC file being written. Not thread-safe: the daemon writes from its event loop only."""

    def __init__(self, path: str, warcinfo: dict[str, str]):
        self.path = path
        self.open_path = path + layout.OPEN_SUFFIX
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fh = open(self.open_path, "wb")  # noqa: SIM115 - lives until close()
        self._writer = WARCWriter(self._fh, gzip=True, warc_version=WARC_VERSION)
        self.records = 0
        info = self._writer.create_warcinfo_record(os.path.basename(path), warcinfo)
        self.warcinfo_id = info.rec_headers.get_header("WARC-Record-ID")
        self._writer.write_record(info)

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
        self.records += 1
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
        if truncated_reason:
            headers["WARC-Truncated"] = truncated_reason
        record = self._writer.create_warc_record(
            uri, "response", payload=io.BytesIO(body), length=len(body), warc_headers_dict=headers,
            http_headers=http_headers,
        )
        return self._write(record)

    def write_not_modified(
        self, uri: str, http_headers: StatusAndHeaders, date: str, ip: str | None, record_id: str, concurrent_to: str
    ) -> WrittenRecord:
        """A 304 as a revisit record: the server said our stored copy of `uri` is still current."""
        headers = self._common_headers(record_id, date, ip, concurrent_to)
        headers["WARC-Profile"] = NOT_MODIFIED_PROFILE
        headers["WARC-Refers-To-Target-URI"] = uri
        record = self._writer.create_warc_record(
            uri, "revisit", payload=io.BytesIO(b""), length=0, warc_headers_dict=headers, http_headers=http_headers
        )
        return self._write(record)

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
