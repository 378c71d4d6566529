"""Reading back what the fetch daemon wrote: a `*.open` WARC left by a killed writer cut to its last complete
record (`recover_open_warc`), and the result rows a closed WARC file carries (`read_results`). Streamed: one
gzip member at a time, never the whole file."""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from warcio.archiveiterator import ArchiveIterator

from crawler import layout
from fetchd.warc import RESULT_CONTENT_TYPE

_SCAN_CHUNK = 1 << 16
_MAX_HEAD_BYTES = 1 << 20  # a WARC header block longer than this is taken as garbage by recovery


@dataclass(frozen=True)
class RecoveredWarc:
    """What `recover_open_warc` left on disk: the complete records kept (0 if the file was deleted), their bytes,
    and the final file name (None if deleted)."""

    records: int
    bytes: int
    path: str | None



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
