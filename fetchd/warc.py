"""WARC/1.1 output of the fetch daemon: one gzip member per record, written as `*.open`, renamed when closed.

A file starts with a warcinfo record; each fetch adds a request record and a response record that name
each other in WARC-Concurrent-To (a 304 adds a revisit record, profile server-not-modified, instead of the
response; so does a 200 whose payload is the URL's stored one, profile identical-payload-digest:
`crawler.payloads`), then a metadata record about the fetch (time, IP, truncation, outcome) concurrent to the
response.
The offset and compressed length of the response/revisit record are measured from the file position around
the write, so results can point at it. `close()` flushes and fsyncs before the rename: a closed file name
always holds complete records. A `*.open` file left by a killed daemon is cut back to its last complete
record by `fetchd.warcrecovery.recover_open_warc`; every write job reaches the OS as soon as it is done, and the
result rows of the fetches are in the file too (`result_record`), so what a killed daemon wrote is kept. Files
are named by the IIPC convention (`iipc_stem`).

Records are serialised here (header lines built directly: warcio's record builder cost more CPU than the
fetching itself) and the costly part — SHA-1 digests, gzip, the file write — runs in the process's single
writer thread (`_writer`). Its jobs run in submission order, so the records of one job (an exchange) are
contiguous and jobs land in the order they were submitted; the compressor (ISA-L by default, or zlib:
`fetch.warc_compressor`), hashlib and file I/O release the GIL, so that work can run beside the event loop
(measured, the two overlap little and a daemon process uses about one core: `fetch.processes` puts the other
cores to work). The loop awaits a job's offsets (`WarcFile.write`); nobody waits for a result record
(`WarcFile.log`).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import errno
import hashlib
import os
import queue
import random
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from isal import isal_zlib
from warcio.statusandheaders import StatusAndHeaders

from crawler import layout

WARC_VERSION = "WARC/1.1"
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
IDENTICAL_PAYLOAD_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
WARC_SUFFIX = ".warc.gz"
DEFAULT_COMPRESSOR = "isal"  # `fetch.warc_compressor` and `fetch.warc_gzip_level` (conf/crawler.yaml says why)
DEFAULT_GZIP_LEVEL = 1
# Both write standard gzip members through the same zlib API: ISA-L is several times faster at its low levels.
_COMPRESSORS: dict[str, Any] = {"isal": isal_zlib, "zlib": zlib}
_HOP_BY_HOP_DROPPED = frozenset({"transfer-encoding"})  # the body is stored de-chunked, so the header would lie
_REASON_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")  # printable ASCII stays as it is
WARC_TRUNCATED_VALUES = frozenset({"length", "time", "disconnect", "unspecified"})  # WARC 1.1 §5.15
RESULT_CONTENT_TYPE = "application/vnd.cyclecrawl.result+json"  # metadata records that carry a result row
WARC_FIELDS = "application/warc-fields"
_HTTP_REQUEST = "application/http; msgtype=request"
_HTTP_RESPONSE = "application/http; msgtype=response"
_JOIN_BELOW = 1 << 20  # payloads smaller than this are copied next to their headers and compressed in one call


@dataclass(frozen=True)
class WrittenRecord:
    """Where a response or revisit record landed, and its payload digest."""

    offset: int
    length: int
    payload_digest: str | None


class Record(NamedTuple):
    """A record not yet written: its WARC header lines (version line first, each ending CRLF; the writer adds
    the digests and Content-Length), the HTTP header block if any, and the payload (never copied). A tuple:
    four are built per fetched page."""

    head: str
    http: bytes
    payload: bytes
    # Whether the record gets a WARC-Payload-Digest of its payload (request and response records), or the digest
    # it gets as it is (a string: computed already, or an identical-payload revisit's, whose payload is not here).
    payload_digest: bool | str

    @property
    def bound(self) -> int:
        """At least the size of its gzip member: zlib's deflateBound for any memLevel, plus the gzip wrapper."""
        n = len(self.head) + len(self.http) + len(self.payload) + 200  # + digests, Content-Length, the end CRLFs
        return n + (n >> 3) + (n >> 6) + 64


_Waiter = concurrent.futures.Future | tuple[asyncio.AbstractEventLoop, asyncio.Future] | None


class _Writer:
    """The process's one WARC writer thread (a daemon process runs one daemon): jobs of every file run one at a
    time in submission order. It takes whatever is queued as a batch and wakes each event loop once per batch,
    not once per job (a wake-up costs a syscall and a loop iteration)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], _Waiter]] = queue.SimpleQueue()
        self._pending = 0  # jobs queued or being written, until their waiters are woken
        self._pending_lock = threading.Lock()
        threading.Thread(target=self._serve, name="warc-writer", daemon=True).start()

    def put(self, job: Callable[..., Any], args: tuple[Any, ...], waiter: _Waiter) -> None:
        with self._pending_lock:
            self._pending += 1
        self._jobs.put((job, args, waiter))

    def pending(self) -> int:
        with self._pending_lock:
            return self._pending

    def _serve(self) -> None:
        while True:
            batch = [self._jobs.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._jobs.get_nowait())
            settle: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, BaseException | None]]] = {}
            for job, args, waiter in batch:
                result, error = None, None
                try:
                    result = job(*args)
                except BaseException as exc:  # handed to whoever waits; a failed file fails its later jobs too
                    error = exc
                if isinstance(waiter, concurrent.futures.Future):
                    if error is None:
                        waiter.set_result(result)
                    else:
                        waiter.set_exception(error)
                elif waiter is not None:
                    settle.setdefault(waiter[0], []).append((waiter[1], result, error))
            for loop, done in settle.items():
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                    loop.call_soon_threadsafe(_settle, done)
            with self._pending_lock:  # only now: a waiter's wake-up is already on its loop's way
                self._pending -= len(batch)


def _settle(done: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for future, result, error in done:
        if future.done():  # a cancelled waiter: its records are written all the same
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


_writer_instance: _Writer | None = None
_writer_lock = threading.Lock()


def _writer() -> _Writer:
    global _writer_instance
    with _writer_lock:
        if _writer_instance is None:
            _writer_instance = _Writer()
        return _writer_instance


def writes_pending() -> int:
    """WARC jobs queued or being written in this process (an event loop on a virtual clock lets time pass only
    when this is 0: a write takes no virtual time)."""
    return _writer_instance.pending() if _writer_instance is not None else 0


async def payload_digest(payload: bytes) -> str:
    """The WARC-Payload-Digest of `payload` (`payload_sha1`), computed in the writer thread, off the event loop (on
    a virtual clock it counts as pending work, like a write): what a response is compared with before its record
    is chosen (`crawler.payloads.is_identical_payload`). The body is the one the fetcher read, bounded by
    `fetch.max_body_bytes`; nothing else is kept."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()
    _writer().put(payload_sha1, (payload,), (loop, future))
    return await future


def iipc_stem(prefix: str, created: float, serial: int, host: str) -> str:
    """`prefix-timestamp-serial-host` (IIPC WARC naming): UTC creation time to the millisecond, 5-digit serial."""
    moment = datetime.fromtimestamp(created, UTC)
    return f"{prefix}-{moment:%Y%m%d%H%M%S}{moment.microsecond // 1000:03d}-{serial:05d}-{host}"


_ids = random.Random()  # seeded from os.urandom; record ids need uniqueness, not secrecy (uuid4 read urandom each)
os.register_at_fork(after_in_child=_ids.seed)  # a forked child must not repeat its parent's ids


def new_record_id() -> str:
    """A random (version 4) UUID URN."""
    bits = _ids.getrandbits(128) & ~(0xF000 << 64) & ~(0xC << 60) | (0x4000 << 64) | (0x8 << 60)
    text = f"{bits:032x}"
    return f"<urn:uuid:{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}>"


def _warc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sha1(*parts: bytes) -> str:
    digest = hashlib.sha1()  # noqa: S324 - the WARC convention (payload digests index deduplication), not security
    for part in parts:
        digest.update(part)
    return "sha1:" + base64.b32encode(digest.digest()).decode("ascii")


_EMPTY_SHA1 = _sha1(b"")  # a request record's payload digest


def payload_sha1(payload: bytes) -> str:
    """A payload's WARC-Payload-Digest as the writer puts it in a response record ("sha1:BASE32")."""
    return _sha1(payload) if payload else _EMPTY_SHA1


def http_request_headers(method: str, path: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """The request's HTTP header block as stored in its record."""
    return _http_block(f"{method} {path} HTTP/1.1", headers)


def http_response_headers(status: int, reason: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """The response's HTTP header block as stored in its record."""
    kept = [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP_DROPPED]
    if not reason.isascii():
        reason = _ascii_reason(reason)
    return _http_block(f"HTTP/1.1 {status} {reason}".strip(), kept)


def _ascii_reason(reason: str) -> str:
    """A reason phrase with bytes beyond ASCII (a server's own text, or undecodable bytes aiohttp kept as surrogates)
    as its bytes percent-encoded, as warcio stores such header values: a record is written whatever the phrase."""
    return urllib.parse.quote(reason.encode("utf-8", "surrogateescape"), safe=_REASON_SAFE)


def _http_block(status_line: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """Status line, header lines, blank line, in ASCII; a non-ASCII value is percent-encoded as warcio does
    it (the rare path)."""
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers])
    text = f"{status_line}\r\n{lines}\r\n"
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        return StatusAndHeaders(status_line, list(headers)).to_ascii_bytes()


class WarcFile:
    """One WARC file being written. Called from one thread (the daemon's event loop); the bytes are produced
    and written by the writer thread, in submission order."""

    def __init__(self, path: str, warcinfo: dict[str, str], on_write: Callable[[int], None] = lambda n: None,
                 gzip_level: int = DEFAULT_GZIP_LEVEL, compressor: str = DEFAULT_COMPRESSOR, *,
                 warcinfo_id: str | None = None, warcinfo_date: str | None = None):
        """`warcinfo_id` and `warcinfo_date` fix the warcinfo record's id and date (golden tests); by default a
        new id and the current time."""
        self.path = path
        self.on_write = on_write  # told the bytes of every job written, from the writer thread (metrics)
        self.open_path = path + layout.OPEN_SUFFIX
        self.gzip_level = gzip_level
        self._deflater = _COMPRESSORS[compressor]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fh = open(self.open_path, "wb")  # noqa: SIM115 - lives until close()
        self.records = 0  # submitted (the caller's view: written or about to be)
        self._written = 0  # bytes on disk: set by the writer thread only
        self._submitted_bound = 0  # upper bounds of the members submitted (caller) and written (writer thread)
        self._written_bound = 0
        self._failed: BaseException | None = None  # a failed write leaves the file unusable (recovery cuts it)
        self.warcinfo_id = warcinfo_id or new_record_id()
        block = "".join(f"{name}: {value}\r\n" for name, value in warcinfo.items() if value).encode("utf-8")
        head = (f"{WARC_VERSION}\r\nWARC-Type: warcinfo\r\nWARC-Record-ID: {self.warcinfo_id}\r\n"
                f"WARC-Filename: {os.path.basename(path)}\r\nWARC-Date: {warcinfo_date or _warc_now()}\r\n"
                f"Content-Type: {WARC_FIELDS}\r\n")
        self.submit([Record(head, b"", block, False)])
        self.records = 0  # the warcinfo record does not count: a file with only it holds nothing

    @property
    def size(self) -> int:
        """Bytes written so far (jobs still queued are not counted)."""
        return self._written

    def reached(self, max_bytes: int) -> bool:
        """Whether the file holds at least `max_bytes` once every submitted record is written. Waits for the
        writer only when the queued records could make the difference."""
        if self._written + self._submitted_bound - self._written_bound < max_bytes:
            return False
        self.drain()
        return self._written >= max_bytes

    # --- building records (on the caller; cheap string work) -----------------------------------------

    def _head(self, kind: str, uri: str, record_id: str, date: str, content_type: str,
              extra: dict[str, str | None]) -> str:
        lines = "".join([f"{name}: {value}\r\n" for name, value in extra.items() if value])
        return (f"{WARC_VERSION}\r\nWARC-Type: {kind}\r\nWARC-Record-ID: {record_id}\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\nWARC-Warcinfo-ID: {self.warcinfo_id}\r\n{lines}"
                f"Content-Type: {content_type}\r\n")

    def request_record(self, uri: str, http_headers: bytes, date: str, ip: str | None, record_id: str,
                       concurrent_to: str) -> Record:
        head = self._head("request", uri, record_id, date, _HTTP_REQUEST,
                          {"WARC-IP-Address": ip, "WARC-Concurrent-To": concurrent_to})
        return Record(head, http_headers, b"", True)

    def response_record(self, uri: str, http_headers: bytes, body: bytes, date: str, ip: str | None,
                        record_id: str, concurrent_to: str, truncated_reason: str | None = None,
                        payload_digest: str | None = None) -> Record:
        """`payload_digest`: the body's digest when it was computed already (`payload_digest`), else the writer
        computes it."""
        # the metadata record keeps the exact truncation reason; the header holds a WARC 1.1 value
        truncated = None if not truncated_reason else \
            truncated_reason if truncated_reason in WARC_TRUNCATED_VALUES else "unspecified"
        head = self._head("response", uri, record_id, date, _HTTP_RESPONSE,
                          {"WARC-IP-Address": ip, "WARC-Concurrent-To": concurrent_to, "WARC-Truncated": truncated})
        return Record(head, http_headers, body, payload_digest or True)

    def not_modified_record(self, uri: str, http_headers: bytes, date: str, ip: str | None,
                            record_id: str, concurrent_to: str, refers_to_date: str | None = None,
                            payload_digest: str | None = None) -> Record:
        """A 304 as a revisit record: the server said our stored copy of `uri` is still current. `refers_to_date`
        is the WARC-Date of that earlier capture, when known (the header is left out otherwise). A 304 carries no
        payload of its own: `payload_digest` is the stored capture's, when known (so a CDXJ line names the
        original's digest, by which replay finds it), else the record has none."""
        head = self._head("revisit", uri, record_id, date, _HTTP_RESPONSE, {
            "WARC-IP-Address": ip, "WARC-Concurrent-To": concurrent_to, "WARC-Profile": NOT_MODIFIED_PROFILE,
            "WARC-Refers-To-Target-URI": uri, "WARC-Refers-To-Date": refers_to_date})
        return Record(head, http_headers, b"", payload_digest or False)

    def identical_payload_record(self, uri: str, http_headers: bytes, date: str, ip: str | None, record_id: str,
                                 concurrent_to: str, payload_digest: str, refers_to_uri: str,
                                 refers_to_date: str) -> Record:
        """A 200 whose payload is the one an earlier response record of the same URL holds, as a revisit record
        (WARC 1.1 §6.7.2): the HTTP headers kept, no payload, `WARC-Payload-Digest` the payload's digest, and
        the original named by `WARC-Refers-To-Target-URI` and `WARC-Refers-To-Date` (`crawler.payloads`)."""
        head = self._head("revisit", uri, record_id, date, _HTTP_RESPONSE, {
            "WARC-IP-Address": ip, "WARC-Concurrent-To": concurrent_to, "WARC-Profile": IDENTICAL_PAYLOAD_PROFILE,
            "WARC-Refers-To-Target-URI": refers_to_uri, "WARC-Refers-To-Date": refers_to_date})
        return Record(head, http_headers, b"", payload_digest)

    def fetch_metadata_record(self, uri: str, date: str, concurrent_to: str, fetch_time_ms: int, ip: str | None,
                              truncated_reason: str | None, outcome: str | None,
                              record_id: str | None = None) -> Record:
        """A metadata record (application/warc-fields) about the fetch whose response is `concurrent_to`: what
        the response record cannot say itself. Field names follow Heritrix (fetchTimeMs) where it has one."""
        fields = {"fetchTimeMs": str(fetch_time_ms), "ip": ip, "truncated": truncated_reason, "outcome": outcome}
        block = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value).encode("utf-8")
        head = self._head("metadata", uri, record_id or new_record_id(), date, WARC_FIELDS,
                          {"WARC-Concurrent-To": concurrent_to})
        return Record(head, b"", block, False)

    def result_record(self, uri: str, date: str, kind: str, row_json: str, record_id: str | None = None) -> Record:
        """A metadata record holding a result row (`kind`: fetched or robots) as JSON: the WARC file is the
        daemon's durable log, so rows not yet published when it dies are rebuilt from here (`read_results`)."""
        block = f'{{"kind":"{kind}","row":{row_json}}}'.encode()
        head = self._head("metadata", uri, record_id or new_record_id(), date, RESULT_CONTENT_TYPE, {})
        return Record(head, b"", block, False)

    # --- writing (the writer thread) -------------------------------------------------------------------

    def _put(self, records: list[Record], waiter: _Waiter) -> None:
        """Queue `records` as one job."""
        self.records += len(records)
        bound = sum(r.bound for r in records)
        self._submitted_bound += bound
        _writer().put(self._write_job, (records, bound), waiter)

    def submit(self, records: list[Record]) -> concurrent.futures.Future[list[WrittenRecord]]:
        """Queue records to be written one after the other; the future gives where each landed."""
        future: concurrent.futures.Future[list[WrittenRecord]] = concurrent.futures.Future()
        self._put(records, future)
        return future

    async def write(self, records: list[Record]) -> list[WrittenRecord]:
        """`submit` from the event loop: awaits the writer thread, the loop keeps running meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[WrittenRecord]] = loop.create_future()
        self._put(records, (loop, future))
        return await future

    def log(self, record: Record) -> None:
        """Queue a record nobody waits for (a result record): written after everything submitted before it,
        without waking the event loop when done."""
        self._put([record], None)

    def _member(self, record: Record) -> tuple[bytes, str | None]:
        if isinstance(record.payload_digest, str):
            payload_digest: str | None = record.payload_digest
        else:
            payload_digest = payload_sha1(record.payload) if record.payload_digest else None
        block_digest = _sha1(record.http, record.payload)
        length = len(record.http) + len(record.payload)
        tail = f"WARC-Payload-Digest: {payload_digest}\r\n" if payload_digest else ""
        head = f"{record.head}WARC-Block-Digest: {block_digest}\r\n{tail}Content-Length: {length}\r\n\r\n".encode()
        # A window just over the record compresses it exactly as the default 32 KiB window would, with less
        # memory to set up for a small record.
        window_bits = max(9, min(15, (len(head) + length + 4 + 262).bit_length()))
        if len(record.payload) < _JOIN_BELOW:  # one call: each call gives up the GIL and waits to retake it
            whole = b"".join((head, record.http, record.payload, b"\r\n\r\n"))
            return self._deflater.compress(whole, self.gzip_level, 16 + window_bits), payload_digest
        deflate = self._deflater.compressobj(self.gzip_level, zlib.DEFLATED, 16 + window_bits,
                                             max(1, min(8, window_bits - 6)))
        member = b"".join((deflate.compress(head + record.http), deflate.compress(record.payload),
                           deflate.compress(b"\r\n\r\n")))  # a big body is not copied
        return member + deflate.flush(), payload_digest

    def _write_job(self, records: list[Record], bound: int) -> list[WrittenRecord]:
        """Write the records, one gzip member each; where each landed."""
        if self._failed is not None:
            raise OSError(errno.EIO, f"{self.open_path}: an earlier write failed") from self._failed
        try:
            offset = self._fh.tell()
            written = []
            for record in records:
                member, payload_digest = self._member(record)
                self._fh.write(member)
                written.append(WrittenRecord(offset, len(member), payload_digest))
                offset += len(member)
            self._fh.flush()  # whole records reach the OS: a killed process leaves them for recovery
        except BaseException as exc:
            self._failed = exc
            raise
        self.on_write(offset - self._written)
        self._written = offset
        self._written_bound += bound
        return written

    def _run(self, job: Callable[[], None]) -> None:
        """Run `job` in the writer thread after every record submitted so far, and wait for it."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        _writer().put(job, (), done)
        done.result()

    def drain(self) -> None:
        """Wait until every record submitted so far is written."""
        self._run(lambda: None)

    # --- the synchronous interface (tests, tools): build, write, wait --------------------------------

    def write_request(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.request_record(*args, **kwargs)]).result()[0]

    def write_response(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.response_record(*args, **kwargs)]).result()[0]

    def write_not_modified(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.not_modified_record(*args, **kwargs)]).result()[0]

    def write_identical_payload(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.identical_payload_record(*args, **kwargs)]).result()[0]

    def write_fetch_metadata(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.fetch_metadata_record(*args, **kwargs)]).result()[0]

    def write_result(self, *args, **kwargs) -> WrittenRecord:
        return self.submit([self.result_record(*args, **kwargs)]).result()[0]

    # --- ending ----------------------------------------------------------------------------------------

    def _fsync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def sync(self) -> None:
        """Make every record submitted so far durable (before result rows that point at them are published)."""
        self._run(self._fsync)

    def abandon(self) -> None:
        """Stop writing and leave the `*.open` file as it is, for `recover_open_warc` (the bucket was lost)."""
        self._run(self._fh.close)

    def close(self) -> None:
        """Make the records durable, then give the file its final name."""
        def job() -> None:
            self._fsync()
            self._fh.close()
            os.replace(self.open_path, self.path)
        self._run(job)

    def discard(self) -> None:
        """Drop a file that holds nothing worth keeping (only its warcinfo record)."""
        def job() -> None:
            self._fh.close()
            os.remove(self.open_path)
        self._run(job)
