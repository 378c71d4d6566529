"""One HTTP GET, bounded: the daemon's only way to talk to a web server.

A single aiohttp ClientSession with one TCPConnector (connection reuse, DNS cache, the SSRF-guarded
resolver) and `auto_decompress=False`, so the body is stored exactly as the server encoded it. Redirects are
never followed here; the caller decides. The body is read up to `fetch.max_body_bytes` and flagged
truncated past it; connect and whole-request timeouts bound the time.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import ada_url
import aiohttp
from yarl import URL

from crawler.config import Config
from fetchd.resolver import BlockedAddressError, GuardedResolver

_READ_CHUNK = 65536
ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
ACCEPT_ENCODING = "gzip, deflate"  # what the WARC readers downstream can decode


@dataclass
class FetchResponse:
    """What one GET produced: a response (possibly truncated), a refusal, or a network error."""

    url: str
    started_at: float                      # epoch seconds at dispatch
    elapsed_ms: int = 0
    status: int | None = None              # None: no response (network error or refused)
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    truncated: bool = False
    remote_ip: str | None = None
    request_path: str = "/"
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    blocked: bool = False                  # the SSRF guard refused the address; nothing was sent
    error: str | None = None

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

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


def _request_target(url: str) -> str:
    parsed = ada_url.URL(url)
    return (parsed.pathname or "/") + parsed.search


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


class Fetcher:
    """Owns the HTTP session of one daemon; create and close inside the event loop."""

    def __init__(self, conf: Config, resolver: GuardedResolver):
        self.max_body_bytes = conf["fetch.max_body_bytes"]
        self.resolver = resolver
        connector = aiohttp.TCPConnector(
            resolver=resolver,
            use_dns_cache=True,
            ttl_dns_cache=conf["fetch.dns_cache_ttl_s"],
            limit=conf["fetch.concurrency"],
            limit_per_host=conf["politeness.max_concurrency_per_host"],
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(
                total=conf["fetch.total_timeout_s"], sock_connect=conf["fetch.connect_timeout_s"]
            ),
            headers={
                "User-Agent": conf["crawl.user_agent"],
                "Accept": ACCEPT,
                "Accept-Language": conf["fetch.accept_language"],
                "Accept-Encoding": ACCEPT_ENCODING,
            },
            skip_auto_headers=("Content-Type",),
        )

    async def close(self) -> None:
        await self.session.close()

    async def get(
        self, url: str, extra_headers: Mapping[str, str] | None = None, max_bytes: int | None = None
    ) -> FetchResponse:
        """GET `url` once (no redirects), reading at most `max_bytes` (default `fetch.max_body_bytes`) of the
        body. Never raises for network trouble: the result says what happened."""
        result = FetchResponse(url=url, started_at=time.time(), request_path=_request_target(url))
        clock = time.monotonic()
        try:
            async with self.session.get(
                URL(url, encoded=True), headers=dict(extra_headers or {}), allow_redirects=False
            ) as response:
                result.status = response.status
                result.reason = response.reason or ""
                result.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
                result.request_headers = list(response.request_info.headers.items())
                result.remote_ip = _peer_ip(response)
                result.body, result.truncated = await self._read_capped(response, max_bytes or self.max_body_bytes)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            result.blocked = _is_blocked(exc)
            result.status = None
            result.body = b""
            result.error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        result.elapsed_ms = int((time.monotonic() - clock) * 1000)
        return result

    @staticmethod
    async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
        """At most `cap` bytes of the body; past the cap the connection is dropped, not drained."""
        parts: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            room = cap - size
            if len(chunk) > room:
                parts.append(chunk[:room])
                response.close()
                return b"".join(parts), True
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts), False
