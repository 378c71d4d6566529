"""One HTTP GET, bounded: the daemon's only way to talk to a web server.

A single aiohttp ClientSession with one TCPConnector (connection reuse, DNS cache, the SSRF-guarded
resolver) and `auto_decompress=False`, so the body is stored exactly as the server encoded it. Redirects are
never followed here; the caller decides. Every response is bounded: header lines, fields and count
(`fetch.max_header_field_bytes`, `fetch.max_headers`), the raw body (`fetch.max_body_bytes`), the decoded
body (`fetch.max_decoded_bytes`, measured by inflating as the bytes arrive, so a compression bomb is cut
without ever being inflated whole), the media type of a page (`fetch.accept_content_types`: other types are
not read past their headers) and the whole request's time (`fetch.total_timeout_s`, which a slow-drip server
cannot stretch). A cut body is flagged `truncated` with a `truncated_reason`.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import brotli
from yarl import URL

from crawler import urls
from crawler.config import Config
from fetchd.resolver import BlockedAddressError, GuardedResolver

_READ_CHUNK = 65536
ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
ACCEPT_ENCODING = "gzip, deflate"  # what the WARC readers downstream can decode

# FetchResponse.truncated_reason values
CUT_LENGTH = "length"                  # raw body longer than the cap
CUT_DECODED_LENGTH = "decoded-length"  # decoded (Content-Encoding undone) body longer than the cap: a bomb
CUT_CONTENT_TYPE = "content-type"      # media type not accepted: the body was not read at all


@dataclass
class FetchResponse:
    """What one GET produced: a response (possibly truncated), a refusal, or a network error."""

    url: str
    started_at: float                      # epoch seconds at dispatch
    elapsed_ms: int = 0
    status: int | None = None              # None: no response (network error or refused)
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""                      # raw, as received (Content-Encoding not undone)
    truncated: bool = False
    truncated_reason: str | None = None    # CUT_* when truncated
    remote_ip: str | None = None
    request_path: str = "/"
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    blocked: bool = False                  # the SSRF guard refused the address; nothing was sent
    error: str | None = None

    _by_name: tuple[list[tuple[str, str]], dict[str, str]] | None = field(default=None, init=False, repr=False,
                                                                         compare=False)

    def header(self, name: str) -> str | None:
        """The first value of a header, by case-insensitive name (a page asks for five or more)."""
        if self._by_name is None or self._by_name[0] is not self.headers:  # built once per headers list
            first: dict[str, str] = {}
            for key, value in self.headers:
                first.setdefault(key.lower(), value)
            self._by_name = (self.headers, first)
        return self._by_name[1].get(name.lower())

    def decoded_body(self, max_bytes: int) -> bytes:
        """The body with its Content-Encoding (gzip/deflate) undone, at most `max_bytes` (bomb-safe). The WARC
        keeps the bytes as received; this is for the daemon's own reading, e.g. of robots.txt."""
        encoding = (self.header("Content-Encoding") or "").strip().lower()
        if encoding not in ("gzip", "x-gzip", "deflate"):
            return self.body[:max_bytes]
        for wbits in (zlib.MAX_WBITS | 32, -zlib.MAX_WBITS):  # gzip or zlib header; then raw deflate
            try:
                return zlib.decompressobj(wbits).decompress(self.body, max_bytes)
            except zlib.error:
                continue
        return b""


class Transport(Protocol):
    """How the daemon talks to web servers: `Fetcher` (HTTP), or a scripted stand-in in tests."""

    async def get(self, url: str, headers: dict[str, str] | None = None, max_bytes: int | None = None, *,
                  page: bool = False) -> FetchResponse: ...

    async def close(self) -> None: ...


class DecodedMeter:
    """Counts the decoded size of a Content-Encoded body as its raw bytes arrive. It inflates at most
    `_READ_CHUNK` bytes at a time and keeps none of them, so memory and work stay bounded by the cap."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.size = 0
        self.broken = False  # the stream is not valid in its encoding: parse will say so; we stop measuring
        self._inflater: zlib._Decompress | None = None
        self._brotli = brotli.Decompressor() if encoding == "br" else None

    @staticmethod
    def for_header(content_encoding: str | None) -> DecodedMeter | None:
        """A meter for the encodings we can measure; None for identity (the raw cap is the decoded cap)."""
        encoding = (content_encoding or "").strip().lower()
        if encoding == "x-gzip":
            encoding = "gzip"
        return DecodedMeter(encoding) if encoding in ("gzip", "deflate", "br") else None

    def feed(self, data: bytes, limit: int) -> bool:
        """Add raw bytes; False once more than `limit` decoded bytes have come out."""
        try:
            if self._brotli is not None:
                self._feed_brotli(data, limit)
            else:
                self._feed_zlib(data, limit)
        except (zlib.error, brotli.error):
            self.broken = True
        return self.size <= limit

    def _feed_zlib(self, data: bytes, limit: int) -> None:
        while data and not self.broken and self.size <= limit:
            if self._inflater is None:
                self._inflater = zlib.decompressobj(self._wbits(data))
            self.size += len(self._inflater.decompress(data, _READ_CHUNK))
            if self._inflater.eof:  # another gzip member may follow (a bomb can be many members)
                data = self._inflater.unused_data if self.encoding == "gzip" else b""
                self._inflater = None
            else:
                data = self._inflater.unconsumed_tail

    def _wbits(self, first: bytes) -> int:
        if self.encoding == "gzip":
            return zlib.MAX_WBITS | 16
        zlib_header = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
        return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS  # "deflate" is zlib; some servers send raw

    def _feed_brotli(self, data: bytes, limit: int) -> None:
        assert self._brotli is not None
        if self._brotli.is_finished():
            return
        self.size += len(self._brotli.process(data, output_buffer_limit=_READ_CHUNK))
        while self.size <= limit and not self._brotli.is_finished() and not self._brotli.can_accept_more_data():
            self.size += len(self._brotli.process(b"", output_buffer_limit=_READ_CHUNK))


def media_type_accepted(content_type: str | None, accepted: Sequence[str]) -> bool:
    """Whether a Content-Type starts with one of the accepted prefixes (case-insensitive). No header or an
    empty list accepts: the type is then decided from the bytes downstream."""
    if not content_type or not accepted:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return any(media.startswith(prefix) for prefix in accepted)


def _is_blocked(exc: BaseException) -> bool:
    """Whether an aiohttp connect error came from the SSRF guard refusing the resolved address."""
    visited: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in visited:
        if isinstance(current, BlockedAddressError):
            return True
        visited.add(id(current))
        current = current.__cause__ or getattr(current, "os_error", None)
    return False


def _peer_ip(response: aiohttp.ClientResponse) -> str | None:
    """The address the response came from. aiohttp hands a small, complete response's connection back to the
    pool before we see it, so fall back to the protocol the response was read from."""
    protocol = response.connection.protocol if response.connection else getattr(response, "_protocol", None)
    transport = getattr(protocol, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[0] if peer else None


def _never_retry(session: aiohttp.ClientSession) -> None:
    """Turn off aiohttp's own retry. When a connection drops before the answer, aiohttp sends an idempotent request
    again at once (RFC 9112 §9.3.1 allows it): a second request to the host that its gate never saw and no WARC
    records. Here a dropped connection is a network error for that URL; a later attempt waits at the gate like any
    other. aiohttp has no public switch; its own test client clears the same attribute, and a release that renames
    it fails here instead of retrying silently (tests/test_fetchd.py drops connections on purpose)."""
    if not isinstance(getattr(session, "_retry_connection", None), bool):
        raise RuntimeError(f"aiohttp {aiohttp.__version__}: no ClientSession._retry_connection to turn off")
    session._retry_connection = False


class Fetcher:
    """Owns the HTTP session of one daemon; create and close inside the event loop."""

    def __init__(self, conf: Config, resolver: GuardedResolver):
        self.max_body_bytes = conf.fetch.max_body_bytes
        self.max_decoded_bytes = conf.fetch.max_decoded_bytes
        self.accept_content_types = tuple(t.strip().lower() for t in conf.fetch.accept_content_types)
        self.resolver = resolver
        connector = aiohttp.TCPConnector(
            resolver=resolver,
            use_dns_cache=False,  # the resolver keeps answers for their TTL: one cache (fetchd/resolver.py)
            limit=conf.fetch.concurrency,
            limit_per_host=conf.politeness.max_concurrency_per_host,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(
                total=conf.fetch.total_timeout_s, sock_connect=conf.fetch.connect_timeout_s
            ),
            headers={
                "User-Agent": conf.crawl.user_agent,
                "Accept": ACCEPT,
                "Accept-Language": conf.fetch.accept_language,
                "Accept-Encoding": ACCEPT_ENCODING,
            },
            skip_auto_headers=("Content-Type",),
            max_line_size=conf.fetch.max_header_field_bytes,
            max_field_size=conf.fetch.max_header_field_bytes,
            max_headers=conf.fetch.max_headers,
        )
        _never_retry(self.session)

    async def close(self) -> None:
        await self.session.close()

    async def get(
        self, url: str, extra_headers: Mapping[str, str] | None = None, max_bytes: int | None = None,
        *, page: bool = False,
    ) -> FetchResponse:
        """GET `url` once (no redirects), reading at most `max_bytes` (default `fetch.max_body_bytes`) of the
        body. A `page` (not robots.txt) of a media type outside `fetch.accept_content_types` is not read past
        its headers. Never raises for network trouble: the result says what happened."""
        result = FetchResponse(url=url, started_at=time.time(), request_path=urls.path_and_query(url))
        clock = time.monotonic()
        try:
            async with self.session.get(
                URL(url, encoded=True), headers=extra_headers or None, allow_redirects=False
            ) as response:
                result.status = response.status
                result.reason = response.reason or ""
                result.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
                result.request_headers = list(response.request_info.headers.items())
                result.remote_ip = _peer_ip(response)
                if page and not media_type_accepted(result.header("Content-Type"), self.accept_content_types):
                    response.close()  # the body is never read: a 2 GB video costs its headers only
                    result.truncated, result.truncated_reason = True, CUT_CONTENT_TYPE
                else:
                    result.body, result.truncated_reason = await self._read_capped(
                        response, max_bytes or self.max_body_bytes, result.header("Content-Encoding")
                    )
                    result.truncated = result.truncated_reason is not None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            result.blocked = _is_blocked(exc)
            result.status = None
            result.body = b""
            result.truncated, result.truncated_reason = False, None
            result.error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        result.elapsed_ms = int((time.monotonic() - clock) * 1000)
        return result

    async def _read_capped(
        self, response: aiohttp.ClientResponse, cap: int, content_encoding: str | None
    ) -> tuple[bytes, str | None]:
        """The raw body, cut (and the connection dropped, not drained) once it passes `cap` raw bytes or its
        decoding passes `fetch.max_decoded_bytes`; with the reason it was cut, if it was."""
        meter = DecodedMeter.for_header(content_encoding)
        length = response.content_length
        if meter is None and length is not None and length <= cap and "Transfer-Encoding" not in response.headers:
            # An unencoded body of a declared length within the cap (most pages): the HTTP parser stops at that
            # length, so one read to the end is bounded; it costs the event loop less than a loop of chunks.
            return await response.read(), None
        parts: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            room = cap - size
            cut = len(chunk) > room
            if cut:
                chunk = chunk[:room]
            parts.append(chunk)
            size += len(chunk)
            if meter is not None and not meter.feed(chunk, self.max_decoded_bytes):
                response.close()
                return b"".join(parts), CUT_DECODED_LENGTH
            if cut:
                response.close()
                return b"".join(parts), CUT_LENGTH
        return b"".join(parts), None
