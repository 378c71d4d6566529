"""The farm's server: every farm host on one loopback aiohttp server, the virtual host chosen by the Host header
(the crawler reaches it through `fetch.static_hosts`), and the server's own request log, which `sitefarm.judge`
judges — never the crawler's account of itself."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from sitefarm.sites import FarmSpec
from sitefarm.truth import FarmTruth


class SiteFarm(FarmTruth):
    """A loopback web server with `spec.hosts` generated sites; also the ground truth about them."""

    def __init__(self, spec: FarmSpec, log_path: str | Path):
        super().__init__(spec)
        self.log_path = Path(log_path)
        self._log: IO[str] | None = None
        self._log_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port, build the sites for that port, serve from a background thread."""
        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._build_sites()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failures: list[BaseException] = []

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._open(sock))
            except BaseException as error:  # surfaced to start()'s caller
                failures.append(error)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="sitefarm", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failures:
            self.stop()
            raise RuntimeError(f"site farm did not start: {failures[:1]}")

    async def _open(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()

    def stop(self) -> None:
        """Stop serving and close the log. Safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None and self._loop is not None:
            if self._loop.is_running():
                self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(30)
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> SiteFarm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- serving ---------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        start = time.time()
        host_header = request.headers.get("Host", "")
        if request.raw_path in self.spec.dropped_paths:
            self._write_log({"host": host_header, "path": request.raw_path, "method": request.method, "start": start,
                             "end": time.time(), "status": None, "dropped": True,
                             "user_agent": request.headers.get("User-Agent", "")})
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError  # aiohttp's way for a handler to end with no response at all
        name = host_header.rpartition(":")[0].lower() or host_header.lower()
        resource, status, body, validators = self.respond(name, request.raw_path, request.headers)
        if self.spec.latency_s > 0:
            await asyncio.sleep(self.spec.latency_s)
        headers = {"Content-Type": resource.content_type, **validators}
        if resource.location:
            headers["Location"] = resource.location
        response = web.Response(status=status, body=None if status == 304 else body, headers=headers)
        await response.prepare(request)
        # `end` is taken before the body's last byte leaves, so a client that waits for the whole response
        # always starts its next request after `end`: an overlap in the log is a real one.
        self._write_log(
            {
                "host": host_header,
                "path": request.raw_path,
                "method": request.method,
                "start": start,
                "end": time.time(),
                "status": status,
                "user_agent": request.headers.get("User-Agent", ""),
            }
        )
        await response.write_eof()
        return response

    def _write_log(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._log_lock:
            if self._log is not None:
                self._log.write(line)
                self._log.flush()


def read_request_log(path: str | Path) -> list[dict]:
    """The server's request log; a last line still being written is skipped."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.endswith("\n"):
                records.append(json.loads(line))
    return records
