"""Scripted aiohttp servers on loopback for daemon tests that need behaviours the site farm lacks.

A server runs its own event loop in a thread and logs every request it sees, answered or not (host, path, local
address, start, end, status, headers), so a test judges the daemon from the server's side. It can listen on several
loopback addresses at one port (127.0.0.1 and 127.0.0.2, say), so a test can prove from the server's own log that
nothing reached an address the SSRF guard refuses: a request that got there would be logged with that address.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

Handler = Callable[["ScriptedServer", str, web.Request], Awaitable[web.StreamResponse]]

# Ports a test picks for a server that a child process starts (`free_port`): one range per xdist worker, below
# the kernel's ephemeral range (32768-60999), so they never meet a port the kernel hands out for port 0 or a port
# the other lane picked.
PORT_RANGE_PER_LANE = 5000
FIRST_PICKED_PORT = 20000
_handed_out: set[int] = set()  # never the same port twice in one process, even once its test is over


class LoopbackServer:
    """An aiohttp server on loopback in a thread of its own; every request goes to `handle`."""

    def __init__(self, addresses: Sequence[str] = ("127.0.0.1",)):
        assert all(a.startswith("127.") for a in addresses), "loopback only"
        self.log: list[dict] = []
        self.loop = asyncio.new_event_loop()
        sockets = []
        self.port = 0
        for address in addresses:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, self.port))
            sock.listen(64)
            sock.setblocking(False)
            self.port = sock.getsockname()[1]
            sockets.append(sock)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            self.runner = web.AppRunner(app, access_log=None)
            self.loop.run_until_complete(self.runner.setup())
            for sock in sockets:
                self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
            ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self.runner.cleanup())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def requests(self, host: str) -> list[dict]:
        """The host's requests in the order they started."""
        return sorted((r for r in self.log if r["host"] == host), key=lambda r: r["start"])


class ScriptedServer(LoopbackServer):
    """Routes every request to `handler(server, host, request)`; logs host, path, local address, start, end."""

    def __init__(self, handler: Handler, addresses: Sequence[str] = ("127.0.0.1",)):
        self.handler = handler
        super().__init__(addresses)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        start = time.time()
        host = request.host.rpartition(":")[0] or request.host
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        entry = {"host": host, "path": request.path_qs, "start": start, "end": None, "status": None,
                 "local": sockname[0] if sockname else None, "headers": dict(request.headers)}
        try:
            response = await self.handler(self, host, request)
            await response.prepare(request)
            entry["status"] = response.status
        finally:
            # `end` is taken before the body's last byte leaves, as in the site farm: a client that waits for the
            # whole response starts its next request after it, so an overlap or a short gap in this log is a real
            # one. A request the handler left unanswered (a dropped connection) is logged too, with status None.
            entry["end"] = time.time()
            self.log.append(entry)
        await response.write_eof()
        return response



def slow_pages(page_seconds: float) -> Handler:
    """A ScriptedServer handler: robots.txt 404 (allow all), every other path a small HTML page after
    `page_seconds`, long enough for requests to overlap if nothing holds them."""

    async def answer(_server: ScriptedServer, _host: str, request: web.Request) -> web.StreamResponse:
        if request.path == "/robots.txt":
            return web.Response(status=404)
        await asyncio.sleep(page_seconds)
        return web.Response(text=f"<html><title>{request.path}</title></html>", content_type="text/html")

    return answer


class EdgeServer(ScriptedServer):
    """The cases the farm does not cover, by Host name and path: robots.txt answering 503 (broken.test),
    redirected to a gzip body (moved.test) or to another host (elsewhere.test -> edge.test), a host answering 500
    (flaky.test), ETag/304 (/etag), a 429 with Retry-After the first time (/busy), a 50 KB body (/big) and a
    redirect (/moved). Subclasses add paths by overriding `respond`."""

    def __init__(self) -> None:
        self.busy_calls = 0
        super().__init__(EdgeServer._route)

    async def _route(self, host: str, request: web.Request) -> web.StreamResponse:
        return self.respond(host, request)

    def respond(self, host: str, request: web.Request) -> web.StreamResponse:
        path = request.path
        if host == "broken.test" and path == "/robots.txt":
            return web.Response(status=503, text="down")
        if host == "moved.test" and path == "/robots.txt":
            return web.Response(status=301, headers={"Location": "/real-robots.txt"})
        if host == "moved.test" and path == "/real-robots.txt":
            body = gzip.compress(b"User-agent: *\nDisallow: /no\n")
            return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        if host == "elsewhere.test" and path == "/robots.txt":  # served by another host
            return web.Response(status=301, headers={"Location": f"http://edge.test:{request.url.port}/shared-robots"})
        if host == "edge.test" and path == "/shared-robots":
            return web.Response(text="User-agent: *\nDisallow: /no\n")
        if path == "/robots.txt":
            return web.Response(text="User-agent: *\nDisallow: /secret\n")
        if host == "flaky.test":
            return web.Response(status=500, text="oops")
        if path == "/etag":
            if request.headers.get("If-None-Match") == '"v1"':
                return web.Response(status=304, headers={"ETag": '"v1"'})
            return web.Response(text="versioned", headers={"ETag": '"v1"'})
        if path == "/busy":
            self.busy_calls += 1
            if self.busy_calls == 1:
                return web.Response(status=429, text="slow down", headers={"Retry-After": "1"})
        if path == "/big":
            return web.Response(body=b"x" * 50_000, content_type="application/octet-stream")
        if path == "/moved":
            return web.Response(status=301, headers={"Location": "/target?x=1#frag"})
        return web.Response(text=f"<html><title>{path}</title></html>", content_type="text/html")


EDGE_HOSTS = ("edge.test", "broken.test", "flaky.test", "moved.test", "elsewhere.test")


def edge_conf(base_conf, **overrides):
    """Test config for the edge server: its names on 127.0.0.1, private.test on a private address."""
    values = {
        "politeness.min_delay_s": 0.1,
        "fetch.static_hosts": {**{name: "127.0.0.1" for name in EDGE_HOSTS}, "private.test": "10.0.0.1"},
    }
    values.update(overrides)
    return base_conf.with_overrides(values)


def gaps(requests: Sequence[Any]) -> list[float]:
    """Seconds from the end of each request to the start of the next (the politeness rule's own measure), for a
    loopback server's log records (mappings) and a virtual server's `Request`s alike."""
    times = [(r["start"], r["end"]) if isinstance(r, Mapping) else (r.start, r.end) for r in requests]
    return [start - end for (_, end), (start, _) in zip(times, times[1:], strict=False)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a server a child process starts. Picked from
    this xdist lane's own range (see PORT_RANGE_PER_LANE)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    lane = int(worker) if worker.isdigit() else 0
    first = FIRST_PICKED_PORT + lane * PORT_RANGE_PER_LANE
    start = first + (os.getpid() * 7919 + time.monotonic_ns()) % PORT_RANGE_PER_LANE
    for offset in range(PORT_RANGE_PER_LANE):
        port = first + (start - first + offset) % PORT_RANGE_PER_LANE
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {first}-{first + PORT_RANGE_PER_LANE - 1}")
