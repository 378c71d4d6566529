"""The fetch daemon: reads a segment's fetch lists, fetches politely, writes WARC files and result files.

Per bucket, two-level scheduling: a heap of hosts keyed by the time their politeness gate opens
(`crawler.politeness.HostGate`) over per-host URL queues in fetch-list order. Before a host's first URL its
address passes the SSRF guard and its robots.txt is fetched through the same gate. The daemon writes only
under the segment folder: WARC files (`*.open` until closed), one fetched-results Parquet per closed WARC
holding only rows whose records are in it (plus rows of URLs not requested), robots observations, and a
`_DONE.json` manifest when the bucket is finished. A bucket without `_DONE.json` is redone from scratch.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from warcio.timeutils import datetime_to_iso_date

from crawler import layout, netpolicy, records, urls
from crawler.config import Config
from crawler.politeness import BACKOFF_STATUSES, HostGate, parse_retry_after
from crawler.robots import ROBOTS_PATH, RobotsPolicy, RobotsState, policy_for_status
from crawler.status import FetchOutcome
from fetchd.fetcher import Fetcher, FetchResponse
from fetchd.metrics import Metrics, MetricsServer, progress_line, snapshot
from fetchd.resolver import BlockedAddressError, GuardedResolver
from fetchd.warc import (
    WARC_SUFFIX,
    WarcFile,
    WrittenRecord,
    http_request_headers,
    http_response_headers,
    iipc_stem,
    new_record_id,
)

log = logging.getLogger("fetchd")

SOFTWARE = "cyclecrawl-fetchd/0.1"
WARC_CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_STOP_POLL_S = 0.5  # how often an idle scheduler looks at the stop flag


def daemon_identity(conf: Config) -> str:
    """`fetch.daemon_id`, or hostname-pid; safe to use inside file names."""
    raw = conf["fetch.daemon_id"] or f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def _warc_date(epoch: float) -> str:
    return datetime_to_iso_date(_utc(epoch).replace(tzinfo=None), use_micros=True)


def _write_parquet_atomic(rows: list[dict[str, Any]], schema: pa.Schema, path: str) -> None:
    """Temp name (hidden from Spark by its leading dot), then rename: readers never see half a file."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, path)


def _write_json_atomic(payload: dict[str, Any], path: str) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_fetchlist(root: str, segment_id: str, bucket: int) -> list[dict[str, Any]]:
    """The bucket's fetch-list rows sorted by host_key then rank (Spark's `_SUCCESS`/`.crc` files ignored)."""
    folder = layout.fetchlist_dir(root, segment_id, bucket)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet") and not n.startswith(("_", ".")))
    if not names:
        return []
    tables = [pq.read_table(os.path.join(folder, n)).select(records.FETCHLIST.names) for n in names]
    table = pa.concat_tables([t.cast(records.FETCHLIST) for t in tables])
    return table.sort_by([("host_key", "ascending"), ("rank", "ascending")]).to_pylist()


def fetchlist_buckets(root: str, segment_id: str) -> list[int]:
    """Buckets of a segment that have a fetch list."""
    folder = layout.fetchlist_dir(root, segment_id)
    if not os.path.isdir(folder):
        return []
    return sorted(b for b in map(layout.parse_bucket_dirname, os.listdir(folder)) if b is not None)


def pending_buckets(root: str, segment_id: str) -> list[int]:
    """Buckets of a segment that have a fetch list and no `_DONE.json` yet."""
    return [b for b in fetchlist_buckets(root, segment_id)
            if not os.path.exists(layout.done_manifest(root, segment_id, b))]


def reset_bucket_output(root: str, segment_id: str, bucket: int) -> None:
    """Remove everything an earlier, unfinished run left for this bucket (open/temp files and partial results)."""
    for folder in (
        layout.warc_dir(root, segment_id, bucket),
        layout.fetched_dir(root, segment_id, bucket),
        layout.robots_dir(root, segment_id, bucket),
    ):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                os.remove(path)


class BucketOutput:
    """The files of one bucket: the current WARC and the result rows that may reference it."""

    def __init__(self, root: str, segment_id: str, bucket: int, daemon_id: str, warc_max_bytes: int,
                 warcinfo: dict[str, str]):
        self.root, self.segment_id, self.bucket, self.daemon_id = root, segment_id, bucket, daemon_id
        self.warc_max_bytes = warc_max_bytes
        self.warcinfo = warcinfo
        self.seq = 0
        self.current: WarcFile | None = None
        self.rows: list[dict[str, Any]] = []
        self.robots_rows: list[dict[str, Any]] = []
        self.warc_files = 0
        self.warc_bytes = 0
        for folder in (self._warc_dir, self._fetched_dir, self._robots_dir):
            os.makedirs(folder, exist_ok=True)

    @property
    def _warc_dir(self) -> str:
        return layout.warc_dir(self.root, self.segment_id, self.bucket)

    @property
    def _fetched_dir(self) -> str:
        return layout.fetched_dir(self.root, self.segment_id, self.bucket)

    @property
    def _robots_dir(self) -> str:
        return layout.robots_dir(self.root, self.segment_id, self.bucket)

    def _stem(self) -> str:
        """The current WARC's name without suffix (its result files share it); a new IIPC name when none is open.
        The daemon id is the host part, so daemons sharing a bucket folder never pick the same name."""
        if self.current is not None:
            return os.path.basename(self.current.path).removesuffix(WARC_SUFFIX)
        return iipc_stem(f"{self.segment_id}-{self.bucket:05d}", time.time(), self.seq, self.daemon_id)

    def warc(self) -> WarcFile:
        if self.current is None:
            self.current = WarcFile(os.path.join(self._warc_dir, self._stem() + WARC_SUFFIX), self.warcinfo)
        return self.current

    def warc_relpath(self) -> str:
        """The current WARC's final name relative to the storage root (what result rows store)."""
        return os.path.relpath(self.warc().path, self.root).replace(os.sep, "/")

    def rotate_if_full(self) -> None:
        if self.current is not None and self.current.size >= self.warc_max_bytes:
            self.close_current()

    def close_current(self) -> None:
        """Close the WARC durably, then publish the rows that point into it (and rows with no location)."""
        stem = self._stem()
        if self.current is not None:
            if self.current.records:
                self.warc_bytes += self.current.size
                self.current.close()
                self.warc_files += 1
            else:
                self.current.discard()
            self.current = None
        if self.rows:
            _write_parquet_atomic(self.rows, records.FETCHED, os.path.join(self._fetched_dir, stem + ".parquet"))
        if self.robots_rows:
            _write_parquet_atomic(self.robots_rows, records.ROBOTS, os.path.join(self._robots_dir, stem + ".parquet"))
        self.rows, self.robots_rows = [], []
        self.seq += 1

    def abandon(self) -> None:
        """Stop without publishing (daemon stopping mid-bucket): the bucket will be redone."""
        if self.current is not None:
            self.current.discard()
            self.current = None


@dataclass
class HostWork:
    """One host of a bucket: its URL queue, gate, and what we learned before its first URL."""

    host_key: str
    hostname: str
    gate: HostGate
    queue: deque[dict[str, Any]] = field(default_factory=deque)
    prepared: bool = False      # address checked and robots policy known
    preparing: bool = False
    blocked: str | None = None  # why the SSRF guard refused the host, if it did
    policy: RobotsPolicy | None = None
    heap_at: float | None = None  # ready time of the host's live heap entry (older entries are stale)
    left: int = 0               # URLs not reported yet: queued or in flight (an active host for the metrics)

    def wants_dispatch(self) -> bool:
        return not self.preparing and (not self.prepared or bool(self.queue))


@dataclass
class HostMemory:
    """What a daemon process remembers about hosts between segments: politeness gates (so a new segment's
    first request still waits out the delay after the previous segment's last) and the robots cache."""

    gates: dict[str, HostGate] = field(default_factory=dict)
    robots: dict[str, tuple[RobotsPolicy, float]] = field(default_factory=dict)  # -> (policy, expiry, monotonic)


# One per process: `fetch_segment` called once per cycle keeps the same memory. Not shared across threads
# running daemons at the same time (a host has one owner, so that never happens in one process).
_PROCESS_MEMORY = HostMemory()


class Daemon:
    """State shared by every bucket one daemon process fetches: HTTP session, gates, robots cache, slots."""

    def __init__(self, conf: Config, root: str, stop: threading.Event | None = None):
        self.conf = conf
        self.root = layout.normalize_root(root)
        self.stop = stop or threading.Event()
        self.daemon_id = daemon_identity(conf)
        self.resolver = GuardedResolver(conf["fetch.static_hosts"], conf["fetch.allow_networks"])
        self.fetcher = Fetcher(conf, self.resolver)
        self.slots = asyncio.Semaphore(conf["fetch.concurrency"])
        self.gates = _PROCESS_MEMORY.gates
        self.robots_cache = _PROCESS_MEMORY.robots
        self.rng = random.Random()
        self.total = 0
        self.metrics = Metrics()
        self.outcomes = self.metrics.outcomes
        self.segment_id: str | None = None  # the segment being (or last) fetched, for `/status`
        self.runs: list[BucketRun] = []      # its buckets, kept after they finish so `/status` shows them
        self.metrics_server: MetricsServer | None = None

    async def open(self) -> None:
        """Start the `/metrics` + `/status` endpoint when `fetch.metrics_port` asks for one."""
        if self.conf["fetch.metrics_port"]:
            self.metrics_server = MetricsServer(self)
            await self.metrics_server.start(self.conf["fetch.metrics_host"], self.conf["fetch.metrics_port"])

    async def close(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.close()
        await self.fetcher.close()
        await self.resolver.close()

    def gate_for(self, host_key: str) -> HostGate:
        """The host's politeness gate, shared by all buckets and segments this daemon fetches."""
        gate = self.gates.get(host_key)
        if gate is None:
            c = self.conf
            gate = HostGate(
                min_delay_s=c["politeness.min_delay_s"],
                max_crawl_delay_s=c["politeness.max_crawl_delay_s"],
                max_concurrency=c["politeness.max_concurrency_per_host"],
                backoff_base_s=c["politeness.backoff_base_s"],
                max_backoff_s=c["politeness.max_backoff_s"],
                max_failures=c["politeness.max_consecutive_failures"],
            )
            self.gates[host_key] = gate
        return gate

    def warcinfo(self) -> dict[str, str]:
        return {
            "software": SOFTWARE,
            "format": "WARC File Format 1.1",
            "conformsTo": WARC_CONFORMS_TO,
            "robots": "obey",
            "http-header-user-agent": self.conf["crawl.user_agent"],
            "isPartOf": "cyclecrawl",
            "hostname": socket.gethostname(),
        }

    async def progress_loop(self) -> None:
        interval = self.conf["fetch.progress_interval_s"]
        while True:
            await asyncio.sleep(interval)
            self.log_progress()

    def log_progress(self) -> None:
        log.info("fetchd progress: %s", progress_line(snapshot(self)))

    async def fetch_buckets(self, segment_id: str, buckets: list[int]) -> list[dict[str, Any]]:
        """Fetch the given buckets of a segment concurrently; the manifests of those that finished."""
        runs = []
        for bucket in buckets:
            reset_bucket_output(self.root, segment_id, bucket)
            rows = read_fetchlist(self.root, segment_id, bucket)
            self.total += len(rows)
            self.metrics.urls_listed += len(rows)
            runs.append(BucketRun(self, segment_id, bucket, rows))
        self.segment_id, self.runs = segment_id, runs
        progress = asyncio.create_task(self.progress_loop())
        try:
            manifests = await asyncio.gather(*(run.run() for run in runs))
        finally:
            progress.cancel()
            self.log_progress()
        return [m for m in manifests if m is not None]


class BucketRun:
    """Fetches one bucket of one segment to completion (or until the daemon is told to stop)."""

    def __init__(self, daemon: Daemon, segment_id: str, bucket: int, rows: list[dict[str, Any]]):
        self.d = daemon
        self.conf = daemon.conf
        self.segment_id = segment_id
        self.bucket = bucket
        self.urls = len(rows)
        self.out = BucketOutput(daemon.root, segment_id, bucket, daemon.daemon_id, self.conf["fetch.warc_max_bytes"],
                                daemon.warcinfo())
        self.hosts: dict[str, HostWork] = {}
        for row in rows:
            host = self.hosts.get(row["host_key"])
            if host is None:
                gate = daemon.gate_for(row["host_key"])
                gate.paused, gate.failures = False, 0  # a pause lasts for one segment only
                host = HostWork(row["host_key"], urls.host_name(row["url"]), gate)
                self.hosts[row["host_key"]] = host
            host.queue.append(row)
            host.left += 1
        self.listed = {row["url"] for row in rows}  # a redirect to one of these is not followed: no double fetch
        self.heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self.outcomes: Counter[str] = Counter()
        self.begun: float | None = None  # monotonic start of the scheduler: ready lag is never counted before it

    # --- scheduling -------------------------------------------------------------------------------------

    def _schedule(self, host: HostWork) -> None:
        """Put the host on the heap at the time its gate opens, if it has something to dispatch. A host whose
        gate is full is looked at again later as well, in case a request this bucket does not own holds it."""
        if not host.wants_dispatch():
            return
        if not host.prepared:
            ready_at = 0.0
        elif host.gate.in_flight >= host.gate.max_concurrency:
            ready_at = max(host.gate.next_allowed_at, time.monotonic() + _STOP_POLL_S)
        else:
            ready_at = host.gate.next_allowed_at
        if host.heap_at is not None and host.heap_at <= ready_at:
            return
        self._seq += 1
        heapq.heappush(self.heap, (ready_at, self._seq, host.host_key))
        host.heap_at = ready_at

    def _start(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> dict[str, Any] | None:
        started = time.time()
        self.begun = time.monotonic()
        for host in self.hosts.values():
            self._schedule(host)
        while not self.d.stop.is_set():
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now and not self.d.stop.is_set():
                ready_at, _, key = heapq.heappop(self.heap)
                host = self.hosts[key]
                if host.heap_at != ready_at:
                    continue  # superseded by an earlier entry
                host.heap_at = None
                if not host.prepared:
                    if not host.preparing:
                        host.preparing = True
                        self._start(self._prepare(host))
                    continue
                self._settle(host)
                if not host.queue:
                    continue
                if not host.gate.can_start(now):
                    self._schedule(host)
                    continue
                await self.d.slots.acquire()
                now = time.monotonic()
                if not host.gate.can_start(now) or not host.queue:  # changed while waiting for a slot
                    self.d.slots.release()
                    self._schedule(host)
                    continue
                host.gate.started(now)
                self._start(self._fetch_url(host, host.queue.popleft()))
                self._schedule(host)
            if not self.heap and not self.tasks:
                break
            self.wake.clear()
            timeout = _STOP_POLL_S
            if self.heap:
                timeout = min(timeout, max(0.0, self.heap[0][0] - time.monotonic()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if self.d.stop.is_set() and any(h.queue or not h.prepared for h in self.hosts.values()):
            self.out.abandon()
            log.info("bucket %05d of %s: stopped before finishing; it will be redone", self.bucket, self.segment_id)
            return None
        return self._finish(started)

    def _finish(self, started: float) -> dict[str, Any]:
        self.out.close_current()
        manifest = {
            "segment_id": self.segment_id,
            "bucket": self.bucket,
            "daemon_id": self.d.daemon_id,
            "urls": self.urls,
            "results": sum(self.outcomes.values()),
            "outcomes": dict(sorted(self.outcomes.items())),
            "hosts": len(self.hosts),
            "warc_files": self.out.warc_files,
            "warc_bytes": self.out.warc_bytes,
            "started_at": _utc(started).isoformat(),
            "finished_at": _utc(time.time()).isoformat(),
        }
        _write_json_atomic(manifest, layout.done_manifest(self.d.root, self.segment_id, self.bucket))
        log.info("bucket %05d of %s done: %s", self.bucket, self.segment_id, manifest["outcomes"])
        return manifest

    def _settle(self, host: HostWork) -> None:
        """Report, without a request, the host's queued URLs that cannot be requested now: all of them if the
        host is blocked, paused or its robots.txt is unreachable; the head of the queue while robots denies it."""
        if not host.prepared:
            return
        if host.blocked:
            while host.queue:
                self._emit(self._row(host.queue.popleft(), FetchOutcome.BLOCKED, error=host.blocked))
            return
        if host.gate.paused or host.policy is None or host.policy.state is RobotsState.DISALLOW_ALL:
            while host.queue:
                self._emit(self._row(host.queue.popleft(), FetchOutcome.DEFERRED))
            return
        while host.queue and not host.policy.allowed(host.queue[0]["url"]):
            self._emit(self._row(host.queue.popleft(), FetchOutcome.ROBOTS_DENIED))
            self.d.metrics.robots_denials += 1

    def _count_politeness_wait(self, gate: HostGate) -> None:
        """A request is due on the host but its gate holds it: count the hold (`fetchd.metrics` says why here)."""
        now = time.monotonic()
        if not gate.paused and gate.next_allowed_at > now:
            self.d.metrics.politeness_wait(gate.next_allowed_at - now)

    def _after_request(self, host: HostWork) -> None:
        self._settle(host)
        if host.queue:
            self._count_politeness_wait(host.gate)
        self._schedule(host)
        self.wake.set()

    # --- result rows ------------------------------------------------------------------------------------

    def _row(self, item: dict[str, Any], outcome: FetchOutcome, **values: Any) -> dict[str, Any]:
        row = {name: None for name in records.FETCHED.names}
        row.update(
            segment_id=self.segment_id, bucket=self.bucket, url_id=item["url_id"],
            state_version=item["state_version"], url=item["url"], host_key=item["host_key"],
            fetched_at=_utc(time.time()), outcome=outcome.value, truncated=False, daemon_id=self.d.daemon_id,
        )
        row.update(values)
        return row

    def _emit(self, row: dict[str, Any]) -> None:
        self.out.rows.append(row)
        self.outcomes[row["outcome"]] += 1
        self.d.outcomes[row["outcome"]] += 1
        self.hosts[row["host_key"]].left -= 1

    # --- WARC -------------------------------------------------------------------------------------------

    def _write_exchange(self, response: FetchResponse, outcome: FetchOutcome | None = None,
                        last_fetch_at: datetime | None = None) -> tuple[str, WrittenRecord]:
        """Request + response (or revisit for a 304) records of one exchange, then a metadata record about the
        fetch; where the response landed. A 304's revisit refers to the URL's previous fetch, `last_fetch_at`."""
        size_before = self.out.current.size if self.out.current is not None else 0
        warc = self.out.warc()
        date = _warc_date(response.started_at)
        request_id, response_id = new_record_id(), new_record_id()
        request_headers = http_request_headers("GET", response.request_path, response.request_headers)
        warc.write_request(response.url, request_headers, date, response.remote_ip, request_id, response_id)
        http_headers = http_response_headers(response.status or 0, response.reason, response.headers)
        truncated_reason = (response.truncated_reason or "unspecified") if response.truncated else None
        if response.status == 304:
            written = warc.write_not_modified(
                response.url, http_headers, date, response.remote_ip, response_id, request_id,
                refers_to_date=_warc_date(last_fetch_at.timestamp()) if last_fetch_at else None,
            )
        else:
            written = warc.write_response(
                response.url, http_headers, response.body, date, response.remote_ip, response_id, request_id,
                truncated_reason=truncated_reason,
            )
        warc.write_fetch_metadata(response.url, date, response_id, response.elapsed_ms, response.remote_ip,
                                  truncated_reason, outcome.value if outcome else None)
        self.d.metrics.warc_bytes += warc.size - size_before
        return self.out.warc_relpath(), written

    # --- host preparation: SSRF check + robots.txt ------------------------------------------------------

    async def _wait_and_start(self, gate: HostGate) -> None:
        """Wait (sleeping, never spinning) until the gate opens, then take it."""
        self._count_politeness_wait(gate)
        while True:
            now = time.monotonic()
            if gate.can_start(now):
                gate.started(now)
                return
            await asyncio.sleep(max(gate.next_allowed_at - now, 0.05))

    async def _prepare(self, host: HostWork) -> None:
        try:
            await self._prepare_host(host)
        except Exception:  # never leave a host half-prepared: its URLs would never be reported
            log.exception("preparing %s failed; its URLs are deferred", host.host_key)
            host.policy = RobotsPolicy.disallow_all()
        finally:
            host.prepared, host.preparing = True, False
            self._after_request(host)

    async def _prepare_host(self, host: HostWork) -> None:
        try:
            await self.d.resolver.check_host(host.hostname)
        except BlockedAddressError as exc:
            log.warning("blocked %s: %s", host.host_key, exc)
            host.blocked = str(exc)
            return
        except OSError as exc:  # name does not resolve: robots unreachable -> nothing this segment
            log.warning("cannot resolve %s: %s", host.host_key, exc)
            self._robots_row(host.host_key, None, None, RobotsPolicy.disallow_all(), None, f"resolve: {exc}")
            host.policy = RobotsPolicy.disallow_all()
            return
        cached = self.d.robots_cache.get(host.host_key)
        if cached is not None and cached[1] > time.monotonic():
            host.policy = cached[0]
        else:
            host.policy = await self._fetch_robots(host)
        host.gate.set_crawl_delay(host.policy.crawl_delay_s)

    async def _fetch_robots(self, host: HostWork) -> RobotsPolicy:
        """GET /robots.txt through the politeness gate of every host on the way, following redirects."""
        token, max_bytes = self.conf["crawl.robots_token"], self.conf["robots.max_bytes"]
        url = host.host_key + ROBOTS_PATH
        response: FetchResponse | None = None
        location: tuple[str, WrittenRecord] | None = None
        for hop in range(self.conf["robots.max_redirects"] + 1):
            response = await self._gated_get(url, max_bytes)
            location = self._write_exchange(response) if response.status is not None else None
            self.out.rotate_if_full()
            target = response.header("Location") if response.status and 300 <= response.status < 400 else None
            if target is None or hop == self.conf["robots.max_redirects"]:
                break
            next_url = urls.resolve(url, target)
            if next_url is None:
                break
            url = next_url
        assert response is not None
        body = response.decoded_body(max_bytes).decode("utf-8", "replace") if response.status is not None else None
        status = None if response.blocked else response.status
        policy = policy_for_status(status, body, token, max_bytes)
        self._robots_row(host.host_key, status, body, policy, location, response.error)
        if policy.state is not RobotsState.DISALLOW_ALL:  # an unreachable robots.txt is retried next time
            self.d.robots_cache[host.host_key] = (policy, time.monotonic() + self.conf["robots.cache_ttl_s"])
        return policy

    async def _gated_get(self, url: str, max_bytes: int | None = None,
                         headers: dict[str, str] | None = None) -> FetchResponse:
        """One request taking the politeness gate of the URL's host and a global slot."""
        gate = self.d.gate_for(urls.host_key(url))
        await self._wait_and_start(gate)
        async with self.d.slots:
            response = await self.d.fetcher.get(url, headers, max_bytes)
        self._request_finished(gate, response)
        return response

    def _robots_row(self, host_key: str, status: int | None, body: str | None, policy: RobotsPolicy,
                    location: tuple[str, WrittenRecord] | None, error: str | None) -> None:
        now = time.time()
        self.out.robots_rows.append({
            "segment_id": self.segment_id,
            "bucket": self.bucket,
            "host_key": host_key,
            "fetched_at": _utc(now),
            "status_code": status,
            "state": policy.state.value,
            "body": body,
            "crawl_delay_s": policy.crawl_delay_s,
            "expires_at": _utc(now) + timedelta(seconds=self.conf["robots.cache_ttl_s"]),
            "warc_filename": location[0] if location else None,
            "warc_offset": location[1].offset if location else None,
            "warc_length": location[1].length if location else None,
            "error": error,
        })

    # --- page fetch -------------------------------------------------------------------------------------

    @staticmethod
    def _retry_after(response: FetchResponse) -> float | None:
        if response.status not in BACKOFF_STATUSES:
            return None
        return parse_retry_after(response.header("Retry-After"), time.time())

    async def _fetch_url(self, host: HostWork, item: dict[str, Any]) -> None:
        """Fetch one fetch-list URL (gate already taken, global slot held), follow its same-host redirects, and
        record one row: the last response's outcome, with `redirect_to` the URL that answered when a hop was
        followed, or the unfollowed target of a last 3xx."""
        conditional = {}
        if item.get("etag"):
            conditional["If-None-Match"] = item["etag"]
        if item.get("last_modified"):
            conditional["If-Modified-Since"] = item["last_modified"]
        try:
            response = await self._page_get(item["url"], conditional)
        finally:
            self.d.slots.release()
        retry_after = self._request_finished(host.gate, response)
        try:
            chain = [item["url"]]
            while True:
                target, note, follow = self._redirect_step(host, response, chain)
                if not follow:
                    break
                assert target is not None
                if not await self._wait_for_hop(host.gate):
                    note = "redirect not followed: host paused or daemon stopping"
                    break
                self._write_exchange(response, FetchOutcome.REDIRECT)  # the hop's 3xx, before the next request
                chain.append(target)
                async with self.d.slots:
                    response = await self._page_get(target)
                retry_after = self._request_finished(host.gate, response)
            if response.status is None or not 300 <= response.status < 400:
                target = response.url if len(chain) > 1 else None
            self._emit(self._page_row(host, item, response, retry_after, target, note))
            self.out.rotate_if_full()
        finally:
            self._after_request(host)

    async def _page_get(self, url: str, headers: dict[str, str] | None = None) -> FetchResponse:
        """One page request (the caller holds the gate and a slot); an unexpected library error becomes a failed
        response, so the URL is still reported and the gate released."""
        try:
            return await self.d.fetcher.get(url, headers, page=True)
        except Exception as exc:
            log.exception("fetching %s failed unexpectedly", url)
            return FetchResponse(url=url, started_at=time.time(), error=f"{type(exc).__name__}: {exc}")

    def _request_finished(self, gate: HostGate, response: FetchResponse) -> float | None:
        """Close any request on its host's gate (the delay counts from now) and count the response; the
        server's Retry-After, if any."""
        if response.status is not None:
            self.d.metrics.response(len(response.body))
        retry_after = self._retry_after(response)
        gate.finished(time.monotonic(), response.status, retry_after, self.d.rng)
        return retry_after

    async def _wait_for_hop(self, gate: HostGate) -> bool:
        """Take the gate for a redirect hop once it opens: a hop is a new request to the host. False if the host
        is paused (a failure elsewhere) or the daemon stops first."""
        self._count_politeness_wait(gate)
        while not gate.paused and not self.d.stop.is_set():
            now = time.monotonic()
            if gate.can_start(now):
                gate.started(now)
                return True
            await asyncio.sleep(min(max(gate.next_allowed_at - now, 0.01), _STOP_POLL_S))
        return False

    def _redirect_step(self, host: HostWork, response: FetchResponse,
                       chain: list[str]) -> tuple[str | None, str | None, bool]:
        """Where a response redirects and whether to follow: (canonical target, why it stops here, follow). Only a
        same-host hop is followed, and only if it is new, not in this bucket's fetch list (it is fetched as its
        own URL), within `fetch.max_redirects` and allowed by robots.txt;
        another host's URL is left for update to discover, unless it is an IP literal the SSRF guard refuses."""
        if response.status is None or not 300 <= response.status < 400:
            return None, None, False
        location = response.header("Location")
        target = urls.resolve(response.url, location) if location else None
        if target is None:
            return None, "redirect without a usable Location" if location else None, False
        literal = netpolicy.ip_literal(urls.host_name(target))
        if literal is not None and not self.d.resolver.allowed(literal):
            return None, f"redirect to a refused address: {literal}", False
        if target in chain:
            return None, f"redirect loop back to {target}"[:500], False
        if urls.host_key(target) != host.host_key:
            return target, None, False
        if target in self.listed:
            return target, "redirect target is in this fetch list: fetched as its own URL", False
        limit = self.conf["fetch.max_redirects"]
        if len(chain) > limit:
            return target, f"more than {limit} redirects" if limit else None, False
        if host.policy is not None and not host.policy.allowed(target):
            return target, "redirect target disallowed by robots.txt", False
        return target, None, True

    def _page_row(self, host: HostWork, item: dict[str, Any], response: FetchResponse, retry_after: float | None,
                  redirect_to: str | None = None, note: str | None = None) -> dict[str, Any]:
        common = dict(fetched_at=_utc(response.started_at), elapsed_ms=response.elapsed_ms,
                      remote_ip=response.remote_ip, error=note or response.error, redirect_to=redirect_to)
        if response.blocked:
            host.blocked = response.error  # the address changed to a refused one: nothing more goes to this host
            return self._row(item, FetchOutcome.BLOCKED, **common)
        if response.status is None:
            return self._row(item, FetchOutcome.NETWORK_ERROR, **common)
        status = response.status
        if status == 304:
            outcome = FetchOutcome.NOT_MODIFIED
        elif 200 <= status < 300:
            outcome = FetchOutcome.SUCCESS
        elif 300 <= status < 400:
            outcome = FetchOutcome.REDIRECT
        else:
            outcome = FetchOutcome.HTTP_ERROR
        warc_filename, written = self._write_exchange(response, outcome, item.get("last_fetch_at"))
        return self._row(
            item, outcome, **common,
            status_code=status,
            etag=response.header("ETag"),
            last_modified=response.header("Last-Modified"),
            content_type=response.header("Content-Type"),
            content_length=len(response.body),
            truncated=response.truncated,
            truncated_reason=response.truncated_reason,
            payload_digest=written.payload_digest,
            warc_filename=warc_filename,
            warc_offset=written.offset,
            warc_length=written.length,
            retry_after_s=retry_after,
        )

def _summary(segment_id: str, manifests: list[dict[str, Any]], skipped: list[int]) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    for manifest in manifests:
        outcomes.update(manifest["outcomes"])
    return {
        "segment_id": segment_id,
        "buckets": [m["bucket"] for m in manifests],
        "skipped_buckets": skipped,
        "urls": sum(m["urls"] for m in manifests),
        "outcomes": dict(sorted(outcomes.items())),
        "warc_files": sum(m["warc_files"] for m in manifests),
        "warc_bytes": sum(m["warc_bytes"] for m in manifests),
    }


async def _fetch_segment(conf: Config, root: str, segment_id: str, buckets: list[int],
                         stop: threading.Event | None) -> list[dict[str, Any]]:
    daemon = Daemon(conf, root, stop)
    try:
        await daemon.open()
        return await daemon.fetch_buckets(segment_id, buckets)
    finally:
        await daemon.close()


def fetch_segment(conf: Config, root: str, segment_id: str, buckets: list[int] | None = None) -> dict:
    """Fetch every bucket of the segment (or the given ones) that has no `_DONE.json` yet, to completion.
    Returns summary counts; buckets already done are listed in `skipped_buckets` and left untouched."""
    root = layout.normalize_root(root)
    requested = fetchlist_buckets(root, segment_id) if buckets is None else sorted(set(buckets))
    pending = set(pending_buckets(root, segment_id))
    wanted = [b for b in requested if b in pending]
    skipped = [b for b in requested if b not in pending]
    manifests = asyncio.run(_fetch_segment(conf, root, segment_id, wanted, None)) if wanted else []
    return _summary(segment_id, manifests, skipped)


async def _serve(conf: Config, root: str, stop: threading.Event) -> None:
    daemon = Daemon(conf, root, stop)
    try:
        await daemon.open()
        while not stop.is_set():
            segments_root = layout.segments_dir(daemon.root)
            segment_ids = sorted(os.listdir(segments_root)) if os.path.isdir(segments_root) else []
            for segment_id in segment_ids:
                if stop.is_set():
                    break
                buckets = pending_buckets(daemon.root, segment_id)
                if buckets:
                    log.info("fetching segment %s buckets %s", segment_id, buckets)
                    await daemon.fetch_buckets(segment_id, buckets)
            deadline = time.monotonic() + conf["fetch.poll_interval_s"]
            while not stop.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(min(_STOP_POLL_S, max(0.0, deadline - time.monotonic())))
    finally:
        await daemon.close()


def serve(conf: Config, root: str, stop: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set): every `fetch.poll_interval_s`, fetch every segment bucket
    that has a fetch list and no `_DONE.json`. A bucket interrupted by the stop is redone by the next run."""
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        asyncio.run(_serve(conf, layout.normalize_root(root), stop))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
