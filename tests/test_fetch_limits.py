"""Request limits and redirects of the fetch daemon against a scripted loopback server (no Spark).

Compression bombs, header floods, slow-drip bodies, unwanted media types and redirect chains, each judged
from the server's own request log and from the WARC read back by fastwarc (an independent reader).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import zlib
from functools import cache

import brotli
import pytest
from aiohttp import web
from fastwarc.warc import ArchiveIterator, WarcRecordType

from fetchd.commands import fetch_segment
from fetchd.fetcher import CUT_LENGTH, DecodedMeter, Fetcher, media_type_accepted
from fetchd.resolver import GuardedResolver
from tests.support.fetchlists import by_url, read_results, record_at, write_fetchlist
from tests.support.servers import LoopbackServer

SEGMENT = "seg-limits"
DELAY = 0.3
DECODED_CAP = 1 << 20
DRIP_TIMEOUT = 1.5
DRIP_S, DRIP_BYTES = 20.0, 40  # /drip sends one byte every 0.5 s for 20 s unless the client hangs up
MAX_STREAM_CHUNKS = 32768  # a streamed body is at most 2 GiB of 64 KiB chunks; a client that hangs up ends it


@cache
def bomb(encoding: str) -> bytes:
    """A body of zeros, compressed: gzip and deflate 256 MiB (about 260 KB sent), br 1 GiB (about 190 KB)."""
    block = b"\0" * (1 << 20)
    if encoding == "br":
        compressor = brotli.Compressor(quality=1)
        return b"".join([compressor.process(block) for _ in range(1024)] + [compressor.finish()])
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    return b"".join([deflater.compress(block) for _ in range(256)] + [deflater.flush()])


class LimitServer(LoopbackServer):
    """Scripted misbehaviour by path; every request logged with start/end and the body bytes it got out."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        entry = {"host": request.host.rpartition(":")[0], "path": request.path_qs, "headers": dict(request.headers),
                 "start": time.monotonic(), "sent": 0}
        self.log.append(entry)
        response = await self._serve(request, entry)
        with contextlib.suppress(ConnectionError, RuntimeError):  # sent in full before "end" is taken
            await response.prepare(request)
            await response.write_eof()
        entry["end"] = time.monotonic()
        return response

    async def _serve(self, request: web.Request, entry: dict) -> web.StreamResponse:
        path, port = request.path, self.port
        if path == "/robots.txt":  # served as octet-stream: robots.txt is read whatever its type
            return web.Response(body=b"User-agent: *\nDisallow: /secret\n", content_type="application/octet-stream")
        if path.startswith("/bomb-"):
            encoding = path.removeprefix("/bomb-")
            return await self._stream(request, entry, bomb(encoding), {"Content-Encoding": encoding})
        if path == "/video":
            return await self._stream(request, entry, None, {"Content-Type": "video/mp4"})
        if path == "/fat-header":
            return web.Response(text="never", headers={"X-Fat": "a" * (1 << 20)})
        if path == "/many-headers":
            response = web.Response(text="never")
            for i in range(10_000):
                response.headers.add(f"X-Flood-{i}", "b" * 90)  # 1 MB of headers in total
            return response
        if path == "/drip":
            response = web.StreamResponse(headers={"Content-Type": "text/html"})
            await response.prepare(request)
            for _ in range(DRIP_BYTES):  # DRIP_S of dripping at most
                await asyncio.sleep(DRIP_S / DRIP_BYTES)
                try:
                    await response.write(b"x")
                except (ConnectionError, RuntimeError):
                    break
                entry["sent"] += 1
            return response
        routes = {
            "/c0": "/c1", "/c1": "/c2", "/c2": "/c3",                       # 3 same-host hops, then a page
            "/l1": "/l2", "/l2": "/l1",                                     # a loop
            **{f"/h{i}": f"/h{i + 1}" for i in range(6)},                   # 6 hops, then a page
            "/x": f"http://other.test:{port}/landing",                      # to another host
            "/d": "/secret/page",                                           # to a path robots.txt disallows
            "/p1": "http://10.0.0.1/admin",                                 # to private / metadata addresses
            "/p2": "http://169.254.169.254/latest/meta-data/",
            "/p3": "http://0xA9FEA9FE/latest/",                             # the same, as a hex literal
        }
        if path in routes:
            return web.Response(status=301, headers={"Location": routes[path]})
        if path == "/odd-reason":  # a reason phrase beyond ASCII (aiohttp sends it as UTF-8)
            return web.Response(text="<p>odd</p>", content_type="text/html", reason="Déjà vu")
        if path == "/typed":
            return web.Response(text="<p>ok</p>", headers={"Content-Type": "text/HTML; charset=utf-8"})
        return web.Response(text=f"<html><title>{path}</title></html>", content_type="text/html")

    async def _stream(self, request: web.Request, entry: dict, body: bytes | None,
                      headers: dict[str, str]) -> web.StreamResponse:
        """`body` in 64 KiB writes (None: zeros, up to 2 GiB) until done or the client hangs up."""
        response = web.StreamResponse(headers={"Content-Type": "text/html", **headers})
        await response.prepare(request)
        for i in range(MAX_STREAM_CHUNKS):
            chunk = body[i * 65536:(i + 1) * 65536] if body is not None else b"\0" * 65536
            if not chunk:
                break
            try:
                await response.write(chunk)
            except (ConnectionError, RuntimeError):
                return response
            entry["sent"] += len(chunk)
        await response.write_eof()
        return response


@pytest.fixture
def server():
    server = LimitServer()
    yield server
    server.stop()


def limit_conf(base_conf, **overrides):
    values = {
        "politeness.min_delay_s": DELAY,
        "fetch.static_hosts": {"edge.test": "127.0.0.1", "other.test": "127.0.0.1"},
        "fetch.max_decoded_bytes": DECODED_CAP,
        "fetch.max_body_bytes": 8 << 20,
    }
    values.update(overrides)
    return base_conf.with_overrides(values)


def crawl(server: LimitServer, conf, root: str, paths: list[str]) -> dict[str, dict]:
    write_fetchlist(root, SEGMENT, [{"url": server.url("edge.test", p)} for p in paths], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    return by_url(read_results(root, SEGMENT))


def requested(server: LimitServer, host: str = "edge.test") -> list[dict]:
    return sorted(server.requests(host), key=lambda r: r["start"])


def assert_gaps(log: list[dict], delay: float) -> None:
    """Each request starts at least `delay` after the previous one to the host ended (server clock)."""
    for before, after in zip(log, log[1:], strict=False):
        assert after["start"] - before["end"] >= delay - 0.01, (before["path"], after["path"])


# ---- decoded-body cap --------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_meter_cuts_a_bomb_without_inflating_it(encoding):
    body = bomb(encoding)
    meter = DecodedMeter.for_header(encoding.upper())
    assert meter is not None
    fed = 0
    for i in range(0, len(body), 65536):
        fed += len(body[i:i + 65536])
        if not meter.feed(body[i:i + 65536], DECODED_CAP):
            break
    assert DECODED_CAP < meter.size <= DECODED_CAP + 65536  # stopped one piece past the cap, not at 256 MiB
    assert fed <= 65536 and not meter.broken


def test_meter_counts_every_gzip_member_and_raw_deflate_and_survives_garbage():
    meter = DecodedMeter("gzip")
    assert meter.feed(zlib.compress(b"a" * 1000, wbits=31) + zlib.compress(b"b" * 500, wbits=31), 10_000)
    assert meter.size == 1500
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    meter = DecodedMeter("deflate")
    assert meter.feed(raw.compress(b"c" * 3000) + raw.flush(), 10_000) and meter.size == 3000
    meter = DecodedMeter("gzip")
    assert meter.feed(b"this is not gzip at all", 10) and meter.broken
    assert DecodedMeter.for_header("identity") is None and DecodedMeter.for_header(None) is None


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_bomb_is_cut_at_the_decoded_cap_and_warc_keeps_raw_bytes(server, base_conf, root, encoding):
    conf = limit_conf(base_conf)
    rows = crawl(server, conf, root, [f"/bomb-{encoding}", "/after"])
    row = rows[server.url("edge.test", f"/bomb-{encoding}")]
    assert row["outcome"] == "success" and row["status_code"] == 200
    assert row["truncated"] and row["truncated_reason"] == "decoded-length"
    body = bomb(encoding)
    assert 0 < row["content_length"] < len(body) // 2  # stopped early: most of the bomb was never read
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.headers["WARC-Truncated"] in ("length", "unspecified")  # WARC 1.1 has no "decoded" reason
    assert record.http_headers["Content-Encoding"] == encoding
    raw = record.reader.read()
    assert len(raw) == row["content_length"] and body.startswith(raw)  # the bytes as received, still encoded
    assert rows[server.url("edge.test", "/after")]["outcome"] == "success"


def test_plain_gzip_page_under_the_cap_is_not_truncated(server, base_conf, root):
    conf = limit_conf(base_conf, **{"fetch.max_decoded_bytes": 300 << 20})
    [row] = crawl(server, conf, root, ["/bomb-gzip"]).values()  # 256 MiB decoded < 300 MiB cap
    assert row["outcome"] == "success" and not row["truncated"] and row["truncated_reason"] is None
    assert row["content_length"] == len(bomb("gzip"))


# ---- the raw-body cap against a declared Content-Length --------------------------------------------------

RAW_CAP = 1000
DECLARED = {  # path -> the bytes a raw socket sends back, then it closes
    "/exact": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/html\r\n\r\nhello",
    "/at-cap": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % RAW_CAP + b"a" * RAW_CAP,
    "/over-cap": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (RAW_CAP + 1) + b"b" * (RAW_CAP + 1),
    "/more-than-declared": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello, and bytes past the length",
    "/less-than-declared": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
    "/chunked-and-declared": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5\r\nhello\r\n0\r\n\r\n",
}


def test_a_declared_length_bounds_the_body_as_the_cap_does(base_conf):
    """A body with a Content-Length is read in one go when the length is within `fetch.max_body_bytes`: the
    bytes must still be exactly the declared ones (never the extra a server sends, never a short body passed
    off as whole), and a length past the cap is cut at the cap as a streamed body is."""
    conf = base_conf.with_overrides({"fetch.max_body_bytes": RAW_CAP, "fetch.static_hosts": {"raw.test": "127.0.0.1"},
                                     "fetch.allow_networks": ["127.0.0.0/8"]})

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        writer.write(DECLARED[request.split(b" ")[1].decode()])
        await writer.drain()
        writer.close()

    async def fetch_all() -> dict:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        fetcher = Fetcher(conf, GuardedResolver(conf.fetch.static_hosts, conf.fetch.allow_networks))
        try:
            return {path: await asyncio.wait_for(fetcher.get(f"http://raw.test:{port}{path}", page=True), 10)
                    for path in DECLARED}
        finally:
            await fetcher.close()
            server.close()

    got = asyncio.run(fetch_all())
    assert (got["/exact"].status, got["/exact"].body, got["/exact"].truncated) == (200, b"hello", False)
    assert (got["/at-cap"].body, got["/at-cap"].truncated) == (b"a" * RAW_CAP, False)
    over = got["/over-cap"]
    assert (over.body, over.truncated, over.truncated_reason) == (b"b" * RAW_CAP, True, CUT_LENGTH)
    more = got["/more-than-declared"]  # aiohttp reads the extra bytes as a next response: a bad status line
    assert b"past" not in more.body and (more.status is None or more.body == b"hello"), more
    short = got["/less-than-declared"]
    assert short.status is None and short.body == b"" and short.error  # a network error, not a 9-byte page
    both = got["/chunked-and-declared"]  # RFC 9112 6.3: refused, or read as chunked; never cut at the 3 bytes
    assert both.status is None or both.body == b"hello", both


# ---- header size, slow drip, media types -------------------------------------------------------------


def test_oversized_headers_are_a_recorded_failure(server, base_conf, root):
    conf = limit_conf(base_conf, **{"politeness.backoff_base_s": 0.2})
    rows = crawl(server, conf, root, ["/fat-header", "/many-headers", "/after"])
    for path in ("/fat-header", "/many-headers"):
        row = rows[server.url("edge.test", path)]
        assert row["outcome"] == "network_error" and row["error"], path
        assert row["warc_filename"] is None and row["elapsed_ms"] < 5000
    assert rows[server.url("edge.test", "/after")]["outcome"] == "success"


def test_slow_drip_is_ended_by_the_total_deadline_and_the_gate_counts_from_its_end(server, base_conf, root):
    conf = limit_conf(base_conf, **{"fetch.total_timeout_s": DRIP_TIMEOUT, "politeness.backoff_base_s": 0.6})
    rows = crawl(server, conf, root, ["/drip", "/after"])
    drip = rows[server.url("edge.test", "/drip")]
    assert drip["outcome"] == "network_error" and "Timeout" in drip["error"]
    # the deadline, not the server, ended it: no sooner than the deadline, and far from the drip's 20 s (two busy
    # cores only ever make it later: the bound is generous, what it tells apart is cut from never cut)
    assert DRIP_TIMEOUT * 1000 - 100 <= drip["elapsed_ms"] < DRIP_S * 1000 / 2
    log = {r["path"]: r for r in requested(server)}
    assert log["/drip"]["sent"] < DRIP_BYTES / 2  # the server's drip was cut off: it never sent half of it
    # the failed request ended at >= its start + the deadline; the backoff (>= 0.6 s) counts from there
    assert log["/after"]["start"] - log["/drip"]["start"] >= DRIP_TIMEOUT + 0.6 - 0.05
    assert rows[server.url("edge.test", "/after")]["outcome"] == "success"


def test_unaccepted_media_type_is_not_downloaded(server, base_conf, root):
    conf = limit_conf(base_conf)
    rows = crawl(server, conf, root, ["/video", "/typed", "/secret/x"])
    video = rows[server.url("edge.test", "/video")]
    assert video["outcome"] == "success" and video["status_code"] == 200
    assert video["truncated"] and video["truncated_reason"] == "content-type"
    assert video["content_length"] == 0 and video["content_type"] == "video/mp4"
    assert record_at(root, video["warc_filename"], video["warc_offset"]).reader.read() == b""
    log = {r["path"]: r for r in requested(server)}
    assert log["/video"]["sent"] < 16 << 20  # socket buffers at most, of the 2 GiB it offered
    typed = rows[server.url("edge.test", "/typed")]  # accepted case-insensitively, parameters ignored
    assert typed["outcome"] == "success" and not typed["truncated"] and typed["content_length"] > 0
    # robots.txt came as application/octet-stream and was still obeyed
    assert rows[server.url("edge.test", "/secret/x")]["outcome"] == "robots_denied" and "/secret/x" not in log



def test_a_reason_phrase_beyond_ascii_is_stored_percent_encoded(server, base_conf, root):
    """The record's status line is ASCII whatever the server's reason phrase (its bytes percent-encoded, as warcio
    stores such header values): the page gets its row and its record, and the bucket goes on."""
    rows = crawl(server, limit_conf(base_conf), root, ["/odd-reason", "/after"])
    row = rows[server.url("edge.test", "/odd-reason")]
    assert row["outcome"] == "success" and row["status_code"] == 200
    with open(os.path.join(root, row["warc_filename"]), "rb") as fh:
        fh.seek(row["warc_offset"])
        record = zlib.decompressobj(31).decompress(fh.read(row["warc_length"]))
    assert "HTTP/1.1 200 Déjà vu".encode() not in record
    assert b"\r\n\r\nHTTP/1.1 200 D%C3%A9j%C3%A0 vu\r\n" in record
    assert record_at(root, row["warc_filename"], row["warc_offset"]).reader.read() == b"<p>odd</p>"
    assert rows[server.url("edge.test", "/after")]["outcome"] == "success"

@pytest.mark.parametrize(("content_type", "accepted"), [
    ("text/html", True), ("TEXT/HTML; charset=utf-8", True), ("application/xhtml+xml", True),
    (None, True), ("video/mp4", False), ("application/octet-stream", False), ("text/htmlx", True),
])
def test_media_type_prefixes(content_type, accepted):
    assert media_type_accepted(content_type, ("text/html", "application/xhtml+xml")) is accepted
    assert media_type_accepted(content_type, ())


# ---- redirects ----------------------------------------------------------------------------------------


def warc_target_uris(root: str, row: dict, record_type: WarcRecordType) -> list[str]:
    with open(f"{root}/{row['warc_filename']}", "rb") as fh:
        return [r.headers["WARC-Target-URI"] for r in ArchiveIterator(fh, parse_http=False)
                if r.record_type == record_type]


def test_same_host_chain_is_followed_through_the_gate(server, base_conf, root):
    conf = limit_conf(base_conf)
    [row] = crawl(server, conf, root, ["/c0"]).values()
    final = server.url("edge.test", "/c3")
    assert row["url"] == server.url("edge.test", "/c0")
    assert row["outcome"] == "success" and row["status_code"] == 200 and row["redirect_to"] == final
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.record_type == WarcRecordType.response and record.headers["WARC-Target-URI"] == final
    hops = [server.url("edge.test", p) for p in ("/c0", "/c1", "/c2", "/c3")]
    assert [u for u in warc_target_uris(root, row, WarcRecordType.response) if u in hops] == hops
    assert [u for u in warc_target_uris(root, row, WarcRecordType.request) if u in hops] == hops
    log = requested(server)
    assert [r["path"] for r in log] == ["/robots.txt", "/c0", "/c1", "/c2", "/c3"]
    assert_gaps(log, DELAY)  # every hop waited out the delay after the previous response


def test_hop_to_a_url_of_the_same_fetch_list_is_not_fetched_twice(server, base_conf, root):
    rows = crawl(server, limit_conf(base_conf), root, ["/c2", "/c3"])
    c2, c3 = rows[server.url("edge.test", "/c2")], rows[server.url("edge.test", "/c3")]
    assert c2["outcome"] == "redirect" and c2["redirect_to"] == server.url("edge.test", "/c3")
    assert "fetch list" in c2["error"]
    assert c3["outcome"] == "success"
    assert sorted(r["path"] for r in requested(server)) == ["/c2", "/c3", "/robots.txt"]


def test_redirect_loop_is_detected(server, base_conf, root):
    [row] = crawl(server, limit_conf(base_conf), root, ["/l1"]).values()
    assert row["outcome"] == "redirect" and row["status_code"] == 301
    assert row["redirect_to"] is None and "loop" in row["error"]
    assert [r["path"] for r in requested(server)] == ["/robots.txt", "/l1", "/l2"]


def test_six_hops_are_cut_at_five(server, base_conf, root):
    [row] = crawl(server, limit_conf(base_conf), root, ["/h0"]).values()
    assert row["outcome"] == "redirect" and row["status_code"] == 301
    assert row["redirect_to"] == server.url("edge.test", "/h6")  # not followed: update may discover it
    assert "more than 5 redirects" in row["error"]
    assert [r["path"] for r in requested(server)] == ["/robots.txt"] + [f"/h{i}" for i in range(6)]
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.headers["WARC-Target-URI"] == server.url("edge.test", "/h5")


def test_max_redirects_zero_records_the_first_3xx(server, base_conf, root):
    [row] = crawl(server, limit_conf(base_conf, **{"fetch.max_redirects": 0}), root, ["/c0"]).values()
    assert row["outcome"] == "redirect" and row["redirect_to"] == server.url("edge.test", "/c1")
    assert row["error"] is None
    assert [r["path"] for r in requested(server)] == ["/robots.txt", "/c0"]


def test_cross_host_hop_is_recorded_not_followed(server, base_conf, root):
    [row] = crawl(server, limit_conf(base_conf), root, ["/x"]).values()
    assert row["outcome"] == "redirect" and row["redirect_to"] == server.url("other.test", "/landing")
    assert row["error"] is None
    assert [r["path"] for r in requested(server)] == ["/robots.txt", "/x"]
    assert server.requests("other.test") == []


def test_hop_to_a_disallowed_path_is_not_requested(server, base_conf, root):
    [row] = crawl(server, limit_conf(base_conf), root, ["/d"]).values()
    assert row["outcome"] == "redirect" and row["redirect_to"] == server.url("edge.test", "/secret/page")
    assert "robots.txt" in row["error"]
    assert [r["path"] for r in requested(server)] == ["/robots.txt", "/d"]


def test_hop_to_a_private_address_is_blocked(server, base_conf, root):
    rows = crawl(server, limit_conf(base_conf), root, ["/p1", "/p2", "/p3"])
    refused = {"/p1": "10.0.0.1", "/p2": "169.254.169.254", "/p3": "169.254.169.254"}
    for path, address in refused.items():
        row = rows[server.url("edge.test", path)]
        assert row["outcome"] == "redirect" and row["redirect_to"] is None  # never becomes a URL to crawl
        assert row["error"] == f"redirect to a refused address: {address}"
    assert sorted(r["path"] for r in requested(server)) == ["/p1", "/p2", "/p3", "/robots.txt"]
