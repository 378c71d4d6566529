"""A scripted aiohttp server on loopback for daemon tests that need behaviours the site farm lacks.

It can listen on several loopback addresses at one port (127.0.0.1 and 127.0.0.2, say), so a test can prove
from the server's own log that nothing reached an address the SSRF guard refuses: a request that got there
would be logged with that local address.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

Handler = Callable[["ScriptedServer", str, web.Request], Awaitable[web.StreamResponse]]


class ScriptedServer:
    """Routes every request to `handler(server, host, request)`; logs host, path, local address, start, end."""

    def __init__(self, handler: Handler, addresses: Sequence[str] = ("127.0.0.1",)):
        assert all(a.startswith("127.") for a in addresses), "loopback only"
        self.handler = handler
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
            app.router.add_route("*", "/{tail:.*}", self._handle)
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

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def requests(self, host: str) -> list[dict]:
        """The host's requests in the order they started."""
        return sorted((r for r in self.log if r["host"] == host), key=lambda r: r["start"])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        start = time.time()
        host = request.host.rpartition(":")[0] or request.host
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        entry = {"host": host, "path": request.path_qs, "start": start, "end": None,
                 "local": sockname[0] if sockname else None, "headers": dict(request.headers)}
        response = await self.handler(self, host, request)
        await response.prepare(request)
        # `end` is taken before the body's last byte leaves, as in the site farm: a client that waits for the
        # whole response starts its next request after it, so an overlap or a short gap in this log is a real one
        entry["end"] = time.time()
        entry["status"] = response.status
        self.log.append(entry)
        await response.write_eof()
        return response


def gaps(requests: list[dict]) -> list[float]:
    """Seconds from the end of each request to the start of the next (the politeness rule's own measure)."""
    return [b["start"] - a["end"] for a, b in zip(requests, requests[1:], strict=False)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for servers started by a child process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
