"""The fetch daemon: reads a segment's fetch lists, fetches politely, writes WARC files and result files.

Per bucket, two-level scheduling: a heap of hosts keyed by the time their politeness gate opens
(`crawler.politeness.HostGate`) over per-host URL queues in fetch-list order. Before a host's first URL its
address passes the SSRF guard and its robots.txt is fetched through the same gate. The daemon writes only
under the segment folder: WARC files (`*.open` until closed), fetched-results Parquet named after the WARC
its rows point into, published in batches after the WARC is synced (`fetchd.output`), robots observations, and a
`_DONE.json` manifest when the bucket is finished. A daemon fetches only buckets it owns (`fetchd.ownership`);
a bucket without `_DONE.json` is resumed by its next owner, which fetches only the URLs not yet reported. On an
s3:// root the same files are written in a staging folder and uploaded as they are published (`fetchd.storage`).
A closed segment (`_CLOSED.json`, `fetchd.progress.close_segment`) has no pending buckets; a bucket being fetched
when it is closed stops as on SIGTERM, without `_DONE.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from warcio.timeutils import datetime_to_iso_date

from crawler import layout, netpolicy, records, urls
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config
from crawler.politeness import BACKOFF_STATUSES, HostGate, parse_retry_after
from crawler.robots import ROBOTS_PATH, RobotsPolicy, RobotsState, policy_for_status
from crawler.scheduling import Dispatch, HostScheduler, HostWork, Prepare, Report
from crawler.status import FetchOutcome
from fetchd.fetcher import Fetcher, FetchResponse
from fetchd.fetchlist import FetchList, KeySet, result_key
from fetchd.metrics import Metrics, MetricsServer, progress_line, snapshot
from fetchd.output import BucketOutput, Fenced, ResumeState, bucket_totals, recover_bucket_output, write_json_atomic
from fetchd.ownership import Lease, LeaseStore
from fetchd.resolver import BlockedAddressError, GuardedResolver
from fetchd.storage import LocalStore, open_store
from fetchd.warc import (
    WrittenRecord,
    http_request_headers,
    http_response_headers,
    new_record_id,
)

log = logging.getLogger("fetchd")

SOFTWARE = "cyclecrawl-fetchd/0.1"
WARC_CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_STOP_POLL_S = 0.5  # how often an idle scheduler looks at the stop flag


async def _sleep(seconds: float, interrupted: Callable[[], bool], clock: Clock) -> None:
    """Sleep `seconds`, looking every `_STOP_POLL_S` whether to give up early."""
    deadline = clock.monotonic() + seconds
    while clock.monotonic() < deadline and not interrupted():
        await asyncio.sleep(min(_STOP_POLL_S, max(0.0, deadline - clock.monotonic())))


def daemon_identity(conf: Config) -> str:
    """`fetch.daemon_id`, or hostname-pid; safe to use inside file names."""
    raw = conf["fetch.daemon_id"] or f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def _warc_date(epoch: float) -> str:
    return datetime_to_iso_date(_utc(epoch).replace(tzinfo=None), use_micros=True)


def read_fetchlist(root: str, segment_id: str, bucket: int) -> FetchList:
    """The bucket's fetch list, to be read in record batches (`fetchd.fetchlist`)."""
    return FetchList(root, segment_id, bucket)


def _store(root: str | LocalStore) -> LocalStore:
    return root if isinstance(root, LocalStore) else LocalStore(layout.normalize_root(root))


def fetchlist_buckets(root: str | LocalStore, segment_id: str) -> list[int]:
    """Buckets of a segment that have a fetch list (`root`: a local folder, or the store of any root)."""
    return _store(root).fetchlist_buckets(segment_id)


def unfinished_buckets(root: str | LocalStore, segment_id: str) -> list[int]:
    """Buckets of a segment that have a fetch list and no `_DONE.json` yet."""
    store = _store(root)
    return [b for b in store.fetchlist_buckets(segment_id) if not store.is_done(segment_id, b)]


def pending_buckets(root: str | LocalStore, segment_id: str) -> list[int]:
    """The unfinished buckets a daemon may fetch: none once the segment is closed (`_CLOSED.json`)."""
    store = _store(root)
    return [] if store.is_closed(segment_id) else unfinished_buckets(store, segment_id)


@dataclass
class HostMemory:
    """What a daemon process remembers about hosts between segments: politeness gates (so a new segment's
    first request still waits out the delay after the previous segment's last) and the robots cache."""

    gates: dict[str, HostGate] = field(default_factory=dict)
    robots: dict[str, tuple[RobotsPolicy, float]] = field(default_factory=dict)  # -> (policy, expiry, monotonic)


class _ThreadMemory(threading.local):
    """One `HostMemory` per thread that runs daemons: `fetch_segment` called once per cycle in a process's thread
    keeps the same memory. Two threads never share one: each runs its own daemons, and a host has one owner (a
    process runs its daemons in one thread; a test session may crawl unrelated farms in two)."""

    def __init__(self) -> None:
        self.memory = HostMemory()


_THREAD_MEMORY = _ThreadMemory()


def forget_hosts() -> None:
    """Drop this thread's host memory (gates, robots cache). For a thread that runs crawls of unrelated sites one
    after another, e.g. a test session's, where a new server can get the host:port an earlier one had."""
    _THREAD_MEMORY.memory = HostMemory()


class Transport(Protocol):
    """How the daemon talks to web servers: `fetchd.fetcher.Fetcher` (HTTP), or a scripted stand-in in tests."""

    async def get(self, url: str, headers: dict[str, str] | None = None, max_bytes: int | None = None, *,
                  page: bool = False) -> FetchResponse: ...

    async def close(self) -> None: ...


class Daemon:
    """State shared by every bucket one daemon process fetches: HTTP session, gates, robots cache, slots.

    Every time it reads comes from `clock`, and every wait is on the event loop's clock, so a test can run the
    daemon's own loop on a virtual clock (an event loop whose time is that clock's, and a scripted `transport`)."""

    def __init__(self, conf: Config, root: str, stop: threading.Event | None = None,
                 store: LocalStore | None = None, clock: Clock = SYSTEM_CLOCK, transport: Transport | None = None):
        self.conf = conf
        self.clock = clock
        self.store = store or open_store(conf, layout.normalize_root(root))
        self.root = self.store.local_root  # where files are written: the root itself, or an S3 root's staging
        self.stop = stop or threading.Event()
        self.daemon_id = daemon_identity(conf)
        self.resolver = GuardedResolver(conf["fetch.static_hosts"], conf["fetch.allow_networks"])
        self.fetcher: Transport = transport or Fetcher(conf, self.resolver)
        self.slots = asyncio.Semaphore(conf["fetch.concurrency"])
        memory = _THREAD_MEMORY.memory
        self.gates = memory.gates
        self.robots_cache = memory.robots
        self.rng = random.Random()
        self.total = 0
        self.metrics = Metrics(started=clock.monotonic())
        self.outcomes = self.metrics.outcomes
        self.segment_id: str | None = None  # the segment being (or last) fetched, for `/status`
        self.segment_closed = False          # the segment being fetched was closed: its bucket runs stop
        self.runs: list[BucketRun] = []      # its buckets, kept after they finish so `/status` shows them
        self.metrics_server: MetricsServer | None = None
        self.lease_store: LeaseStore = self.store.lease_store(conf, self.daemon_id, clock)
        self.leases: dict[int, Lease] = {}  # buckets this daemon owns
        self._heartbeat: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Start the lease heartbeat, and the `/metrics` + `/status` endpoint when `fetch.metrics_port` asks."""
        self._heartbeat = asyncio.create_task(self.heartbeat_loop())
        if self.conf["fetch.metrics_port"]:
            self.metrics_server = MetricsServer(self)
            await self.metrics_server.start(self.conf["fetch.metrics_host"], self.conf["fetch.metrics_port"])

    async def close(self) -> None:
        """Release every bucket still owned (the next owner may start at once), stop the heartbeat."""
        for bucket in list(self.leases):
            self.release(bucket)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        await self.fetcher.close()
        await self.resolver.close()
        await asyncio.to_thread(self.store.close)  # uploads queued before the stop still go up

    # --- bucket ownership (`crawler.ownership`) -----------------------------------------------------------

    def acquire(self, bucket: int) -> bool:
        """Own the bucket: already owned, or taken now under the lease rule."""
        if bucket in self.leases and not self.leases[bucket].fenced():
            return True
        try:
            lease = self.lease_store.try_acquire(bucket)
        except OSError as exc:  # storage trouble: try again at the next look for work
            log.warning("cannot take bucket %05d: %s", bucket, exc)
            return False
        if lease is None:
            return False
        self.leases[bucket] = lease
        return True

    def release(self, bucket: int) -> None:
        lease = self.leases.pop(bucket, None)
        if lease is not None:
            try:
                self.lease_store.release(lease, self.clock.wall())
            except OSError as exc:  # the lease then lapses by itself
                log.warning("cannot release bucket %05d: %s", bucket, exc)

    async def heartbeat_loop(self) -> None:
        """Renew every owned lease each `ownership.renew_interval_s`; a lease that could not be renewed in time
        is dropped (its bucket run is fenced and stops)."""
        while True:
            await asyncio.sleep(self.conf["ownership.renew_interval_s"])
            for bucket, lease in list(self.leases.items()):
                try:
                    renewed = self.lease_store.renew(lease)
                except OSError as exc:  # not renewed: the lease fences itself at its deadline if this goes on
                    log.warning("cannot renew bucket %05d: %s", bucket, exc)
                    continue
                if not renewed:
                    self.leases.pop(bucket, None)

    def gate_for(self, host_key: str) -> HostGate:
        """The host's politeness gate, shared by all buckets and segments this daemon fetches."""
        gate = self.gates.get(host_key)
        if gate is None:
            gate = self.gates[host_key] = HostGate.from_config(self.conf)
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

    def stopping(self) -> bool:
        """Whether bucket runs must stop as on SIGTERM: the daemon is stopping, or the cycle closed the segment."""
        return self.stop.is_set() or self.segment_closed

    async def watch_closed(self, segment_id: str) -> None:
        """Look for the segment's `_CLOSED.json` every `fetch.poll_interval_s` (off the event loop: a HEAD on
        S3); once it is there, the segment's bucket runs stop."""
        while True:
            await asyncio.sleep(self.conf["fetch.poll_interval_s"])
            try:
                closed = await asyncio.to_thread(self.store.is_closed, segment_id)
            except OSError as exc:  # storage trouble: the bucket runs notice it themselves; look again later
                log.warning("cannot look whether segment %s is closed: %s", segment_id, exc)
                continue
            if closed:
                self.segment_closed = True
                return

    async def progress_loop(self) -> None:
        interval = self.conf["fetch.progress_interval_s"]
        while True:
            await asyncio.sleep(interval)
            self.log_progress()

    def log_progress(self) -> None:
        log.info("fetchd progress: %s", progress_line(snapshot(self)))

    async def fetch_buckets(self, segment_id: str, buckets: list[int]) -> list[dict[str, Any]]:
        """Fetch the given buckets of a segment (each must be owned: `acquire`) concurrently, resuming what an
        earlier run left; the manifests of those that finished."""
        share = max(1, self.conf["fetch.max_queued_urls"] // max(1, len(buckets)))  # queued rows per bucket run
        self.segment_id, self.runs, self.segment_closed = segment_id, [], False
        watchers = [asyncio.create_task(self.progress_loop()), asyncio.create_task(self.watch_closed(segment_id))]
        try:
            manifests = await asyncio.gather(*(self._fetch_bucket(segment_id, b, share) for b in buckets))
        finally:
            for watcher in watchers:
                watcher.cancel()
            self.log_progress()
        return [m for m in manifests if m is not None]

    async def _fetch_bucket(self, segment_id: str, bucket: int, max_queued: int) -> dict[str, Any] | None:
        """One owned bucket to its end. When its files cannot be written (a full disk, I/O errors), the bucket
        stops fetching at once (nothing is fetched that cannot be stored), waits with growing pauses up to
        `fetch.storage_retry_max_s`, and resumes from what is durable once a probe write succeeds."""
        pause = self.conf["fetch.storage_retry_s"]
        while True:
            lease = self.leases.get(bucket)
            if lease is None or lease.fenced() or self.stopping():  # lost since it was claimed, or stopping
                return None
            try:
                await asyncio.to_thread(self.store.prepare_bucket, segment_id, bucket)
                resume = recover_bucket_output(self.root, segment_id, bucket)
                self.store.sync_bucket(segment_id, bucket, lease.fenced)  # what recovery closed goes up
                run = BucketRun(self, segment_id, bucket, read_fetchlist(self.root, segment_id, bucket), lease,
                                resume, max_queued)
            except OSError as exc:
                trouble: BaseException = exc
            else:
                self.runs = [r for r in self.runs if r.bucket != bucket] + [run]
                self.total += run.urls
                self.metrics.urls_listed += run.urls
                manifest = await run.run()
                if run.storage_error is None:
                    return manifest
                trouble = run.storage_error
            self.metrics.storage_errors += 1
            self.metrics.storage_paused += 1
            log.warning("bucket %05d of %s: storage trouble (%s); fetching paused, retrying in %.1fs",
                        bucket, segment_id, trouble, pause)
            try:
                while not await self._storage_works(segment_id, bucket, pause, lease):
                    pause = min(pause * 2, self.conf["fetch.storage_retry_max_s"])
                    if lease.fenced() or self.stopping():
                        return None
            finally:
                self.metrics.storage_paused -= 1
            log.info("bucket %05d of %s: storage works again; resuming", bucket, segment_id)

    async def _storage_works(self, segment_id: str, bucket: int, pause: float, lease: Lease) -> bool:
        """Wait `pause` seconds (less if the daemon stops or the lease goes), then try a small durable write where
        the bucket's results go."""
        await _sleep(pause, lambda: self.stopping() or lease.fenced(), self.clock)
        probe = layout.join(layout.fetched_dir(self.root, segment_id, bucket), ".storage-probe.tmp")
        try:
            os.makedirs(os.path.dirname(probe), exist_ok=True)
            with open(probe, "wb") as fh:
                fh.write(b"\0" * 65536)
                fh.flush()
                os.fsync(fh.fileno())
            os.remove(probe)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(probe)
            return False


class BucketRun:
    """Fetches one bucket of one segment to completion (or until the daemon is told to stop)."""

    def __init__(self, daemon: Daemon, segment_id: str, bucket: int, fetchlist: FetchList, lease: Lease,
                 resume: ResumeState, max_queued: int):
        self.d = daemon
        self.conf = daemon.conf
        self.segment_id = segment_id
        self.bucket = bucket
        self.lease = lease
        self.listed_urls = len(fetchlist)  # the whole fetch list, including URLs an earlier run already reported
        self.out = BucketOutput(daemon.root, segment_id, bucket, daemon.daemon_id, self.conf["fetch.warc_max_bytes"],
                                daemon.warcinfo(), self.conf["ownership.results_batch_rows"], lease.fenced,
                                daemon.metrics.warc_written, self.conf["fetch.warc_gzip_level"],
                                lambda: daemon.store.sync_bucket(segment_id, bucket, lease.fenced),
                                daemon.clock.wall)
        self.clock = daemon.clock
        self.sched = HostScheduler(daemon.gate_for, self.clock.monotonic, self._report, recheck_s=_STOP_POLL_S)
        self.hosts = self.sched.hosts  # what `fetchd.metrics` reads
        # The list is streamed: rows are taken on while the host queues hold fewer than `max_queued` (this run's
        # share of `fetch.max_queued_urls`).
        # What is known of the whole list is compact (`fetchd.fetchlist`): the reported results (resume) and the
        # url_ids, read from their column up front, so a redirect to a URL listed further on is not followed.
        done = KeySet.of(result_key(url_id, version) for url_id, version in resume.done)
        resume.done.clear()  # replaced by the compact keys
        self.listed, self.urls = fetchlist.scan(done)  # urls: rows this run fetches (not reported before)
        self.reading: Iterator[dict[str, Any]] | None = fetchlist.rows(done)  # None once read to the end
        self.max_queued = max_queued
        self.previous_robots = resume.robots  # taken over as each host first appears
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots_held = 0  # global slots taken for this run's page requests and not given back yet
        self.storage_error: OSError | None = None  # why this run's files could not be written, if they could not
        self.wake = asyncio.Event()
        self.outcomes: Counter[str] = Counter()
        self.begun: float | None = None  # monotonic start of the scheduler: ready lag is never counted before it

    def _take_over(self, host: HostWork) -> None:
        """Carry politeness and robots.txt across owners and runs, for a host this run just met: its next request
        waits one delay after the previous owner's last possible request end, and a robots.txt an earlier run of
        this bucket published is reused while it is in force (so a resumed bucket does not fetch it again)."""
        wall_now, mono_now = self.clock.wall(), self.clock.monotonic()
        row = self.previous_robots.pop(host.host_key, None)
        cached = self.d.robots_cache.get(host.host_key)
        if row is not None and row["expires_at"].timestamp() > wall_now and (cached is None or cached[1] <= mono_now):
            expires = row["expires_at"].timestamp()
            policy = policy_for_status(row["status_code"], row["body"], self.conf["crawl.robots_token"],
                                       self.conf["robots.max_bytes"])
            if policy.state is not RobotsState.DISALLOW_ALL:
                self.d.robots_cache[host.host_key] = (policy, mono_now + expires - wall_now)
        previous_end = self.lease.previous_end
        if previous_end is not None:
            cached = self.d.robots_cache.get(host.host_key)
            host.gate.ended_elsewhere(mono_now + previous_end - wall_now,
                                      crawl_delay_known=cached is not None and cached[1] > mono_now)

    # --- scheduling: a thin asyncio driver of `crawler.scheduling.HostScheduler` -------------------------

    def add(self, row: dict[str, Any]) -> None:
        """Take on one fetch-list row."""
        new = row["host_key"] not in self.hosts
        self.sched.add(row)
        if new:
            self._take_over(self.hosts[row["host_key"]])

    def _refill(self) -> None:
        """Read more of the fetch list while the host queues hold fewer than `max_queued` URLs."""
        while self.reading is not None and self.sched.queued < self.max_queued:
            row = next(self.reading, None)
            if row is None:
                self.reading = None
            else:
                self.add(row)

    def should_stop(self) -> bool:
        """Whether to stop handing out work: the daemon is stopping, the segment was closed, the bucket's lease is
        lost (fenced), or its files cannot be written. An unfinished bucket is resumed from what was published or
        recorded in the WARC."""
        return self.d.stopping() or self.lease.fenced() or self.storage_error is not None

    def _storage_failed(self, exc: OSError) -> None:
        """A write of this bucket's files failed: stop (the daemon pauses the bucket and resumes it later)."""
        if self.storage_error is None:
            log.warning("bucket %05d of %s: cannot write its files: %s", self.bucket, self.segment_id, exc)
            self.storage_error = exc
        self.wake.set()

    async def _guarded(self, coro: Any) -> None:
        """Run a request task; a storage error it hits stops the bucket. Network errors never get here: the
        fetcher turns them into responses, so an OSError here comes from writing files."""
        try:
            await coro
        except OSError as exc:
            self._storage_failed(exc)

    def _start(self, coro: Any) -> None:
        task = asyncio.create_task(self._guarded(coro))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _dispatch_ready(self) -> float | None:
        """Start everything the scheduler has ready; then the seconds until it may have more (None: not before a
        task ends)."""
        while not self.should_stop():
            action = self.sched.next_ready()
            if isinstance(action, Prepare):
                self._start(self._prepare(action.host))
            elif isinstance(action, Dispatch):
                await self.d.slots.acquire()
                self.slots_held += 1
                item = self.sched.start(action.host)
                if item is None:  # changed while waiting for a slot
                    self._release_slot()
                else:
                    self._start(self._fetch_url(action.host, item))
            else:
                return action
        return None

    async def run(self) -> dict[str, Any] | None:
        """Fetch the bucket; its manifest when finished, else None (`storage_error` says if storage stopped it)."""
        try:
            return await self._run()
        except OSError as exc:  # a write from the driver itself (publishing rows, closing a WARC)
            self._storage_failed(exc)
            await self._drain()
        except Fenced:  # the lease ran out while the bucket was being finished: its next owner finishes it
            log.warning("bucket %05d of %s: lease lost while finishing; its next owner resumes it",
                        self.bucket, self.segment_id)
            with contextlib.suppress(OSError):
                self.out.abandon()
            return None
        if self.storage_error is not None:
            self.reading = None
            with contextlib.suppress(OSError):
                self.out.abandon()
        return None

    async def _run(self) -> dict[str, Any] | None:
        started = self.clock.wall()
        self.begun = self.clock.monotonic()
        while not self.should_stop():
            self._refill()
            wait = await self._dispatch_ready()
            if wait is None and not self.tasks:
                if self.reading is None:
                    break
                continue  # queues empty: read on at once
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), _STOP_POLL_S if wait is None else min(wait, _STOP_POLL_S))
        await self._drain()
        unread, self.reading = self.reading is not None, None  # dropping the reader closes its file
        if self.storage_error is not None:
            return None
        if self.lease.fenced():
            self.out.abandon()
            log.warning("bucket %05d of %s: lease lost, stopped at once; its next owner resumes it",
                        self.bucket, self.segment_id)
            return None
        if unread or self.sched.unfinished():
            self.out.close_current()
            # On S3, up now, while the lease holds: uploads after its release count as fenced and are skipped.
            await asyncio.to_thread(self.d.store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced)
            if self.d.segment_closed:
                log.warning("bucket %05d of %s: released unfinished because the segment was closed (%s); results "
                            "so far are published, its other URLs come back when their leases expire",
                            self.bucket, self.segment_id, layout.CLOSED_MARKER)
            else:
                log.info("bucket %05d of %s: stopped before finishing; results so far are published and the next "
                         "run resumes it", self.bucket, self.segment_id)
            return None
        return await self._finish(started)

    async def _drain(self) -> None:
        """Let the requests in flight end. Once the lease is fenced they are cancelled at once; when the daemon
        is stopping (or the segment was closed) they get `ownership.shutdown_grace_s` and are then cancelled
        (their URLs stay unreported)."""
        grace_ends = self.clock.monotonic() + self.conf["ownership.shutdown_grace_s"]
        while self.tasks:
            over = (self.lease.fenced() or self.storage_error is not None
                    or (self.d.stopping() and self.clock.monotonic() >= grace_ends))
            if over:
                for task in self.tasks:
                    task.cancel()
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
                self._release_cancelled()
                return
            await asyncio.wait(list(self.tasks), timeout=_STOP_POLL_S)

    def _release_slot(self) -> None:
        self.slots_held -= 1
        self.d.slots.release()

    def _release_cancelled(self) -> None:
        """Give back what cancelled requests held: a request cancelled in flight skips its gate's `finished`, and
        one cancelled before its task ran also skips its slot's release. Gates and slots outlive this run (the
        bucket's next run in this process uses them), so without this the host would stay closed and the daemon
        one slot short. No request of this run is left, and a host belongs to one bucket, so its gate has none."""
        now = self.clock.monotonic()
        for host in self.sched.hosts.values():
            host.gate.abandoned(now)
        while self.slots_held:
            self._release_slot()

    async def _finish(self, started: float) -> dict[str, Any]:
        """Publish the last rows, close the WARC and write `_DONE.json`, counting every run of the bucket. On an
        S3 root every file is uploaded before the manifest, and the manifest last."""
        self.out.close_current()
        store = self.d.store
        await asyncio.to_thread(store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced)
        manifest = {
            "segment_id": self.segment_id,
            "bucket": self.bucket,
            "daemon_id": self.d.daemon_id,
            "urls": self.listed_urls,
            **bucket_totals(self.d.root, self.segment_id, self.bucket,
                            await asyncio.to_thread(store.warc_sizes, self.segment_id, self.bucket)),
            "hosts": len(self.hosts),
            "resumed": self.listed_urls - self.urls,
            "started_at": _utc(started).isoformat(),
            "finished_at": _utc(self.clock.wall()).isoformat(),
        }
        self.out.check()
        write_json_atomic(manifest, layout.done_manifest(self.d.root, self.segment_id, self.bucket))
        await asyncio.to_thread(store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced, True)
        log.info("bucket %05d of %s done: %s", self.bucket, self.segment_id, manifest["outcomes"])
        return manifest

    def _report(self, report: Report) -> None:
        """A URL the scheduler reports without a request."""
        self._emit(self._row(report.item, report.outcome, error=report.error))
        if report.outcome is FetchOutcome.ROBOTS_DENIED:
            self.d.metrics.robots_denials += 1

    def _count_politeness_wait(self, gate: HostGate) -> None:
        """A request is due on the host but its gate holds it: count the hold (`fetchd.metrics` says why here)."""
        now = self.clock.monotonic()
        if not gate.paused and gate.next_allowed_at > now:
            self.d.metrics.politeness_wait(gate.next_allowed_at - now)

    def _after_request(self, host: HostWork) -> None:
        """The scheduler has settled and rescheduled the host: count its hold and wake the driver."""
        if host.queue:
            self._count_politeness_wait(host.gate)
        self.wake.set()

    # --- result rows ------------------------------------------------------------------------------------

    def _row(self, item: dict[str, Any], outcome: FetchOutcome, **values: Any) -> dict[str, Any]:
        row = {name: None for name in records.FETCHED.names}
        row.update(
            segment_id=self.segment_id, bucket=self.bucket, url_id=item["url_id"],
            state_version=item["state_version"], url=item["url"], host_key=item["host_key"],
            fetched_at=_utc(self.clock.wall()), outcome=outcome.value, truncated=False, daemon_id=self.d.daemon_id,
            sitemap_origin=item.get("sitemap_origin"),
        )
        row.update(values)
        return row

    def _emit(self, row: dict[str, Any]) -> None:
        requested = row["status_code"] is not None or row["outcome"] == FetchOutcome.NETWORK_ERROR.value
        self.out.add("fetched", row, logged=requested)
        self.out.after_result()
        self.outcomes[row["outcome"]] += 1
        self.d.outcomes[row["outcome"]] += 1

    # --- WARC -------------------------------------------------------------------------------------------

    async def _write_exchange(self, response: FetchResponse, outcome: FetchOutcome | None = None,
                              last_fetch_at: datetime | None = None) -> tuple[str, WrittenRecord]:
        """Request + response (or revisit for a 304) records of one exchange, then a metadata record about the
        fetch, as one writer job (contiguous); the file and where the response landed, once written. A 304's
        revisit refers to the URL's previous fetch, `last_fetch_at`."""
        warc = self.out.warc()
        relpath = self.out.warc_relpath()  # now: the output may rotate to a new file while this awaits
        date = _warc_date(response.started_at)
        request_id, response_id = new_record_id(), new_record_id()
        request_headers = http_request_headers("GET", response.request_path, response.request_headers)
        http_headers = http_response_headers(response.status or 0, response.reason, response.headers)
        truncated_reason = (response.truncated_reason or "unspecified") if response.truncated else None
        if response.status == 304:
            answer = warc.not_modified_record(
                response.url, http_headers, date, response.remote_ip, response_id, request_id,
                refers_to_date=_warc_date(last_fetch_at.timestamp()) if last_fetch_at else None,
            )
        else:
            answer = warc.response_record(
                response.url, http_headers, response.body, date, response.remote_ip, response_id, request_id,
                truncated_reason=truncated_reason,
            )
        written = await warc.write([
            warc.request_record(response.url, request_headers, date, response.remote_ip, request_id, response_id),
            answer,
            warc.fetch_metadata_record(response.url, date, response_id, response.elapsed_ms, response.remote_ip,
                                       truncated_reason, outcome.value if outcome else None),
        ])
        return relpath, written[1]

    # --- host preparation: SSRF check + robots.txt ------------------------------------------------------

    async def _take_gate(self, gate: HostGate, stoppable: bool) -> bool:
        """Wait (sleeping, never spinning) until the gate opens, then take it. False if the host is paused first,
        or, when `stoppable`, the bucket run stops first."""
        self._count_politeness_wait(gate)
        while not gate.paused and not (stoppable and self.should_stop()):
            if self.lease.fenced():
                raise Fenced(f"bucket {self.bucket:05d}: lease lost, no new request")
            now = self.clock.monotonic()
            if gate.can_start(now):
                gate.started(now)
                return True
            await asyncio.sleep(min(max(gate.next_allowed_at - now, 0.01), _STOP_POLL_S))
        return False

    async def _prepare(self, host: HostWork) -> None:
        try:
            await self._prepare_host(host)
        except OSError:
            raise  # writing failed (name lookups are handled inside): the bucket pauses for its storage
        except Exception:  # never leave a host half-prepared: its URLs would never be reported
            log.exception("preparing %s failed; its URLs are deferred", host.host_key)
            host.policy = RobotsPolicy.disallow_all()
        finally:
            self.sched.prepared(host)
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
        if cached is not None and cached[1] > self.clock.monotonic():
            host.policy = cached[0]
        else:
            host.policy = await self._fetch_robots(host)
        if host.gate.set_crawl_delay(host.policy.crawl_delay_s):
            log.warning("robots.txt of %s asks for Crawl-delay %ss; applying the cap politeness.max_crawl_delay_s=%ss",
                        host.host_key, host.policy.crawl_delay_s, host.gate.max_crawl_delay_s)

    async def _fetch_robots(self, host: HostWork) -> RobotsPolicy:
        """GET /robots.txt through the politeness gate of every host on the way, following redirects."""
        token, max_bytes = self.conf["crawl.robots_token"], self.conf["robots.max_bytes"]
        url = host.host_key + ROBOTS_PATH
        response: FetchResponse | None = None
        location: tuple[str, WrittenRecord] | None = None
        for hop in range(self.conf["robots.max_redirects"] + 1):
            response = await self._gated_get(url, max_bytes)
            location = await self._write_exchange(response) if response.status is not None else None
            target = response.header("Location") if response.status and 300 <= response.status < 400 else None
            if target is None or hop == self.conf["robots.max_redirects"]:
                break
            next_url = urls.resolve(url, target)
            if next_url is None:
                break
            url = next_url
        assert response is not None
        if response.blocked and urls.host_key(url) == host.host_key:
            host.blocked = response.error  # the name now resolves to a refused address: nothing goes to this host
        body = response.decoded_body(max_bytes).decode("utf-8", "replace") if response.status is not None else None
        status = None if response.blocked else response.status
        policy = policy_for_status(status, body, token, max_bytes)
        self._robots_row(host.host_key, status, body, policy, location, response.error)
        if policy.state is not RobotsState.DISALLOW_ALL:  # an unreachable robots.txt is retried next time
            self.d.robots_cache[host.host_key] = (policy, self.clock.monotonic() + self.conf["robots.cache_ttl_s"])
        return policy

    async def _gated_get(self, url: str, max_bytes: int | None = None,
                         headers: dict[str, str] | None = None) -> FetchResponse:
        """One request taking the politeness gate of the URL's host and a global slot."""
        gate = self.d.gate_for(urls.host_key(url))
        if not await self._take_gate(gate, stoppable=False):  # a paused host's robots.txt: unreachable this time
            return FetchResponse(url=url, started_at=self.clock.wall(), error="host paused")
        async with self.d.slots:
            response = await self.d.fetcher.get(url, headers, max_bytes)
        self._request_finished(gate, response)
        return response

    def _robots_row(self, host_key: str, status: int | None, body: str | None, policy: RobotsPolicy,
                    location: tuple[str, WrittenRecord] | None, error: str | None) -> None:
        now = self.clock.wall()
        self.out.add("robots", {
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
        }, logged=location is not None)
        self.out.after_result()

    # --- page fetch -------------------------------------------------------------------------------------

    def _retry_after(self, response: FetchResponse) -> float | None:
        if response.status not in BACKOFF_STATUSES:
            return None
        return parse_retry_after(response.header("Retry-After"), self.clock.wall())

    async def _fetch_url(self, host: HostWork, item: dict[str, Any]) -> None:
        """Fetch one fetch-list URL (gate already taken, global slot held), follow its same-host redirects, and
        record one row: the last response's outcome, with `redirect_to` the URL that answered when a hop was
        followed, or the unfollowed target of a last 3xx."""
        conditional = {}
        sitemap = item.get("sitemap_origin") is not None
        if item.get("etag"):
            conditional["If-None-Match"] = item["etag"]
        if item.get("last_modified"):
            conditional["If-Modified-Since"] = item["last_modified"]
        try:
            response = await self._page_get(item["url"], conditional, sitemap=sitemap)
        finally:
            self._release_slot()
        retry_after = self._request_finished(host.gate, response)
        try:
            chain = [item["url"]]
            while True:
                target, note, follow = self._redirect_step(host, response, chain)
                if not follow:
                    break
                assert target is not None
                if not await self._take_gate(host.gate, stoppable=True):
                    note = "redirect not followed: host paused or daemon stopping"
                    break
                await self._write_exchange(response, FetchOutcome.REDIRECT)  # the hop's 3xx, before the next one
                chain.append(target)
                async with self.d.slots:
                    response = await self._page_get(target, sitemap=sitemap)
                retry_after = self._request_finished(host.gate, response)
            if response.status is None or not 300 <= response.status < 400:
                target = response.url if len(chain) > 1 else None
            self._emit(await self._page_row(host, item, response, retry_after, target, note))
        finally:
            self.sched.finished(host)
            self._after_request(host)

    async def _page_get(self, url: str, headers: dict[str, str] | None = None, *, sitemap: bool = False
                        ) -> FetchResponse:
        """One page request (the caller holds the gate and a slot); an unexpected library error becomes a failed
        response, so the URL is still reported and the gate released. A sitemap is read whatever its media type
        (gzip files are served as application/x-gzip and the like) up to `sitemaps.max_fetch_bytes`."""
        try:
            if sitemap:
                return await self.d.fetcher.get(url, headers, self.conf["sitemaps.max_fetch_bytes"])
            return await self.d.fetcher.get(url, headers, page=True)
        except Exception as exc:
            log.exception("fetching %s failed unexpectedly", url)
            return FetchResponse(url=url, started_at=self.clock.wall(), error=f"{type(exc).__name__}: {exc}")

    def _request_finished(self, gate: HostGate, response: FetchResponse) -> float | None:
        """Close any request on its host's gate (the delay counts from now) and count the response; the
        server's Retry-After, if any."""
        if response.status is not None:
            self.d.metrics.response(len(response.body))
        retry_after = self._retry_after(response)
        gate.finished(self.clock.monotonic(), response.status, retry_after, self.d.rng, response.elapsed_ms / 1000)
        return retry_after

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

    async def _page_row(self, host: HostWork, item: dict[str, Any], response: FetchResponse,
                        retry_after: float | None, redirect_to: str | None = None,
                        note: str | None = None) -> dict[str, Any]:
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
        warc_filename, written = await self._write_exchange(response, outcome, item.get("last_fetch_at"))
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


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGINT set `stop` instead of killing the process (in the main thread only, the
    one Python delivers signals to); yields the signals received, in order."""
    received: list[int] = []
    previous: dict[int, Any] = {}

    def handle(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handle)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_status(summary: dict[str, Any]) -> int:
    """A fetch command's exit status: 0, or 128 + the signal's number when a signal stopped it (the shell's
    convention), so a caller sees the segment was left unfinished."""
    stopped_by = summary.get("stopped_by")
    return 128 + signal.Signals[stopped_by].value if stopped_by else 0


async def fetch_segment_async(conf: Config, store: LocalStore, segment_id: str, buckets: list[int],
                              stop: threading.Event, clock: Clock = SYSTEM_CLOCK, transport: Transport | None = None,
                              ) -> tuple[list[dict[str, Any]], list[int]]:
    """The given buckets of the segment on the running event loop (whose clock must be `clock`'s monotonic one),
    talking through `transport` (HTTP by default): (manifests of the finished buckets, buckets another daemon
    holds)."""
    daemon = Daemon(conf, store.root, stop, store=store, clock=clock, transport=transport)
    try:
        await daemon.open()
        owned = [b for b in buckets if daemon.acquire(b)]
        held = [b for b in buckets if b not in owned]
        if held:
            log.warning("buckets %s of %s are owned by another daemon: left to it", held, segment_id)
        return await daemon.fetch_buckets(segment_id, owned), held
    finally:
        await daemon.close()


def fetch_segment(conf: Config, root: str, segment_id: str, buckets: list[int] | None = None) -> dict:
    """Fetch every bucket of the segment (or the given ones) that has no `_DONE.json` yet, to completion,
    resuming what an earlier run left. Returns summary counts; buckets already done (or all of a closed
    segment's) are listed in `skipped_buckets` and left untouched, buckets another live daemon owns in
    `held_buckets`. SIGTERM/SIGINT (in the main thread) stop it as they stop `serve`: requests in flight get
    `ownership.shutdown_grace_s`, results are published, files closed, buckets released, no `_DONE.json` for
    an unfinished bucket; `stopped_by` then names the signal. A segment the root does not hold is UnknownSegment."""
    stop = threading.Event()
    with _stop_on_signals(stop) as received:
        store = open_store(conf, layout.normalize_root(root))
        try:
            layout.require_segment(segment_id, store.root, store.segments())
            requested = store.fetchlist_buckets(segment_id) if buckets is None else sorted(set(buckets))
            pending = set(pending_buckets(store, segment_id))
        except BaseException:
            store.close()
            raise
        wanted = [b for b in requested if b in pending]
        skipped = [b for b in requested if b not in pending]
        if wanted:  # the daemon closes the store
            manifests, held = asyncio.run(fetch_segment_async(conf, store, segment_id, wanted, stop))
        else:
            manifests, held = [], []
            store.close()
    stopped_by = signal.Signals(received[0]).name if received else None
    return {**_summary(segment_id, manifests, skipped), "held_buckets": held, "stopped_by": stopped_by}


def pending_work(root: str | LocalStore) -> dict[int, list[str]]:
    """Bucket -> the segments (oldest first) where it has a fetch list and no `_DONE.json`."""
    store = _store(root)
    work: dict[int, list[str]] = {}
    for segment_id in store.segments():
        for bucket in pending_buckets(store, segment_id):
            work.setdefault(bucket, []).append(segment_id)
    return work


def _claim(daemon: Daemon, work: dict[int, list[str]]) -> None:
    """Release owned buckets with nothing left to fetch; take free ones with work, up to
    `ownership.max_buckets_per_daemon`, so a fleet of daemons shares the buckets."""
    for bucket in [b for b in daemon.leases if b not in work]:
        daemon.release(bucket)
    limit = daemon.conf["ownership.max_buckets_per_daemon"] or len(work)
    for bucket in sorted(work):
        if len(daemon.leases) >= limit:
            break
        daemon.acquire(bucket)


async def serve_async(conf: Config, root: str, stop: threading.Event, clock: Clock = SYSTEM_CLOCK,
                      transport: Transport | None = None) -> None:
    """`serve` on the running event loop (whose clock must be `clock`'s monotonic one), talking through
    `transport` (HTTP by default)."""
    daemon = Daemon(conf, root, stop, clock=clock, transport=transport)
    try:
        await daemon.open()
        while not stop.is_set():
            try:
                work = await asyncio.to_thread(pending_work, daemon.store)  # S3: many requests, off the loop
            except OSError as exc:  # the root cannot be listed (S3 unreachable): look again after the pause
                log.warning("cannot look for work: %s", exc)
                work = {}
            _claim(daemon, work)
            fetched = False
            for segment_id in sorted({s for segments in work.values() for s in segments}):
                buckets = [b for b, segments in work.items() if segment_id in segments and b in daemon.leases]
                if buckets and not stop.is_set():
                    log.info("fetching segment %s buckets %s", segment_id, buckets)
                    await daemon.fetch_buckets(segment_id, buckets)
                    fetched = True
            if fetched:
                continue  # look for work again at once (a peer's lapsed bucket, the next segment)
            await _sleep(conf["fetch.poll_interval_s"], stop.is_set, clock)
    finally:
        await daemon.close()


def serve(conf: Config, root: str, stop: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set): every `fetch.poll_interval_s`, own the buckets with pending
    work that no other daemon owns (leases, `crawler.ownership`) and fetch them, segment by segment. On the stop,
    requests in flight get `ownership.shutdown_grace_s`, results are published, files closed and the buckets
    released; whoever owns a bucket next resumes it."""
    stop = stop or threading.Event()
    with _stop_on_signals(stop):
        asyncio.run(serve_async(conf, layout.normalize_root(root), stop))
