"""The fetch daemon: reads a segment's fetch lists, fetches politely, writes WARC files and result files.

A `Daemon` builds once what all the buckets it fetches share (`fetchd.services.DaemonServices`: HTTP session, host
gates, robots cache, global slots, counters, owned buckets, the stop signal) and fetches each bucket it owns with a
`fetchd.bucketrun.BucketRun` given that context. The daemon writes only
under the segment folder: WARC files (`*.open` until closed), fetched-results Parquet named after the WARC
its rows point into, published in batches after the WARC is synced (`fetchd.output`), robots observations, and a
`_DONE.json` manifest when the bucket is finished. A daemon fetches only buckets it owns (`fetchd.ownership`);
a bucket without `_DONE.json` is resumed by its next owner, which fetches only the URLs not yet reported. On an
s3:// root the same files are written in a staging folder and uploaded as they are published (`fetchd.storage`).
A closed segment (`_CLOSED.json`, `fetchd.progress.close_segment`) has no pending buckets; a bucket being fetched
when it is closed stops as on SIGTERM, without `_DONE.json`. So does every bucket being fetched when the crawl's
recorded bucketing (`ROOT/_crawl.json`, crawler.bucketing) stops being the daemon's; the daemon then releases its
buckets and exits with `SettingsChanged`. The commands that run daemons are in `fetchd.commands`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
import threading
from collections.abc import Callable
from typing import Any

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config, ConfigError
from crawler.politeness import PolitenessRules
from crawler.robots import RobotsCacheRules
from fetchd.bucketrun import BucketRun
from fetchd.exchange import STOP_POLL_S
from fetchd.fetcher import Fetcher, Transport
from fetchd.hostprep import thread_memory
from fetchd.metrics import (
    DaemonState,
    Metrics,
    MetricsServer,
    metrics_label,
    process_figures,
    progress_line,
    snapshot,
)
from fetchd.output import ResumeState, recover_bucket_output
from fetchd.ownership import Lease
from fetchd.processes import PUBLISH_S, peer_snapshots, publish_snapshot
from fetchd.progress import read_fetchlist
from fetchd.resolver import DnsCacheRule, GuardedResolver
from fetchd.services import DaemonServices, HostGates, OwnedBuckets, StopSignal
from fetchd.storage import LocalStore, open_store

log = logging.getLogger("fetchd")

SOFTWARE = "cyclecrawl-fetchd/0.1"
WARC_CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"


async def interruptible_sleep(seconds: float, interrupted: Callable[[], bool], clock: Clock) -> None:
    """Sleep `seconds`, looking every `STOP_POLL_S` whether to give up early."""
    deadline = clock.monotonic() + seconds
    while clock.monotonic() < deadline and not interrupted():
        await asyncio.sleep(min(STOP_POLL_S, max(0.0, deadline - clock.monotonic())))


def daemon_identity(conf: Config) -> str:
    """`fetch.daemon_id`, or hostname-pid; safe to use inside file names."""
    raw = conf.fetch.daemon_id or f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def warcinfo(conf: Config) -> dict[str, str]:
    """The warcinfo record every WARC of a daemon starts with."""
    return {
        "software": SOFTWARE,
        "format": "WARC File Format 1.1",
        "conformsTo": WARC_CONFORMS_TO,
        "robots": "obey",
        "http-header-user-agent": conf.crawl.user_agent,
        "isPartOf": "cyclecrawl",
        "hostname": socket.gethostname(),
    }


class Daemon:
    """One daemon process's fetching: builds the context its bucket runs share (`services`), owns buckets through
    it, and fetches a segment's owned buckets concurrently, with the lease heartbeat, the `/metrics` endpoint, the
    watch for a closed segment and the progress log beside them.

    Every time it reads comes from `clock`, and every wait is on the event loop's clock, so a test can run the
    daemon's own loop on a virtual clock (an event loop whose time is that clock's, and a scripted `transport`)."""

    def __init__(self, conf: Config, root: str, stop: threading.Event | None = None,
                 store: LocalStore | None = None, clock: Clock = SYSTEM_CLOCK, transport: Transport | None = None,
                 peers_dir: str | None = None):
        self.conf = conf
        self.bucketing = Bucketing.from_config(conf)
        self.clock = clock
        self.store = store or open_store(conf, layout.normalize_root(root))
        self.daemon_id = daemon_identity(conf)
        resolver = GuardedResolver(conf.fetch.static_hosts, conf.fetch.allow_networks,
                                   cache_rule=DnsCacheRule.from_config(conf), clock=clock)
        rules = PolitenessRules.from_config(conf)
        memory = thread_memory()
        gates = HostGates(rules, self.bucketing, gates=memory.gates, domains=memory.domains,
                          addresses=memory.addresses)
        self.owned = OwnedBuckets(self.store.lease_store(conf, self.daemon_id, clock), self.bucketing, gates, clock)
        self.stop_signal = StopSignal(stop or threading.Event())
        self.services = DaemonServices(
            conf=conf, clock=clock, store=self.store, root=self.store.local_root, daemon_id=self.daemon_id,
            warcinfo=warcinfo(conf), transport=transport or Fetcher(conf, resolver), resolver=resolver,
            slots=asyncio.Semaphore(conf.fetch.concurrency), metrics=Metrics(started=clock.monotonic()),
            rng=random.Random(), rules=rules, robots_cache=memory.robots,
            robots_cache_rules=RobotsCacheRules.from_config(conf), gates=gates, owned=self.owned,
            stop=self.stop_signal)
        self.root = self.services.root
        self.metrics = self.services.metrics
        self.segment_id: str | None = None  # the segment being (or last) fetched, for `/status`
        self.runs: list[BucketRun] = []      # its buckets, kept after they finish so `/status` shows them
        self.metrics_server: MetricsServer | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.peers_dir = peers_dir  # `fetch.processes`: where the command's processes leave their metrics
        self._publisher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Start the lease heartbeat, and the `/metrics` + `/status` endpoint when `fetch.metrics_port` asks (with
        the command's other processes' figures, `peers_dir`); a process without it leaves its figures there. A
        config whose bucketing is not the crawl's (crawler.bucketing) stops here, before any bucket is taken."""
        problem = self.bucketing.refusal(await asyncio.to_thread(self.store.crawl_record))
        if problem is not None:
            raise ConfigError(*problem)
        self._heartbeat = asyncio.create_task(self.heartbeat_loop())
        if self.conf.fetch.metrics_port:
            folder = self.peers_dir
            self.metrics_server = MetricsServer(
                self.state, (lambda: peer_snapshots(folder, self.daemon_id)) if folder else list)
            await self.metrics_server.start(self.conf.fetch.metrics_host, self.conf.fetch.metrics_port)
        elif self.peers_dir:
            self._publisher = asyncio.create_task(self.publish_loop(self.peers_dir))

    async def publish_loop(self, folder: str) -> None:
        while True:
            publish_snapshot(folder, snapshot(self.state()))
            await asyncio.sleep(PUBLISH_S)

    async def close(self) -> None:
        """Release every bucket still owned (the next owner may start at once), stop the heartbeat."""
        for bucket in list(self.owned.leases):
            self.owned.release(bucket)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._publisher is not None:
            self._publisher.cancel()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        await self.services.transport.close()
        await self.services.resolver.close()
        await asyncio.to_thread(self.store.close)  # uploads queued before the stop still go up

    async def heartbeat_loop(self) -> None:
        """Renew every owned lease each `ownership.renew_interval_s` (`OwnedBuckets.renew`)."""
        while True:
            await asyncio.sleep(self.conf.ownership.renew_interval_s)
            await self.owned.renew()

    async def watch_closed(self, segment_id: str) -> None:
        """Look for the segment's `_CLOSED.json` every `fetch.poll_interval_s` (off the event loop: a HEAD on
        S3); once it is there, the segment's bucket runs stop."""
        while True:
            await asyncio.sleep(self.conf.fetch.poll_interval_s)
            try:
                closed = await asyncio.to_thread(self.store.is_closed, segment_id)
            except OSError as exc:  # storage trouble: the bucket runs notice it themselves; look again later
                log.warning("cannot look whether segment %s is closed: %s", segment_id, exc)
                continue
            if closed:
                self.stop_signal.segment_closed = True
                return

    async def check_settings(self) -> None:
        """Raise `SettingsChanged` (crawler.bucketing) if the crawl's record no longer holds this daemon's bucketing:
        asked before buckets are taken. One small read, off the event loop (a GET on S3); OSError when the record
        cannot be read (the caller takes no bucket then)."""
        changed = self.bucketing.changed_under(await asyncio.to_thread(self.store.crawl_record))
        if changed is not None:
            self.stop_signal.settings_changed = changed
            raise changed

    async def watch_settings(self) -> None:
        """Read the crawl's record every `fetch.poll_interval_s` while buckets are fetched (as `watch_closed` looks
        for the marker); once its bucketing is not this daemon's, the bucket runs stop handing out requests at
        once, as on SIGTERM, and `fetch_buckets` raises `SettingsChanged` after they have stopped."""
        while True:
            await asyncio.sleep(self.conf.fetch.poll_interval_s)
            try:
                record = await asyncio.to_thread(self.store.crawl_record)
            except OSError as exc:  # storage trouble: look again later
                log.warning("cannot read the crawl's settings: %s", exc)
                continue
            changed = self.bucketing.changed_under(record)
            if changed is not None:
                log.warning("stopping every bucket run: %s", changed)
                self.stop_signal.settings_changed = changed
                return

    async def progress_loop(self) -> None:
        interval = self.conf.fetch.progress_interval_s
        while True:
            await asyncio.sleep(interval)
            self.log_progress()

    def log_progress(self) -> None:
        log.info("fetchd progress: %s", progress_line(snapshot(self.state())))

    def state(self) -> DaemonState:
        """What `fetchd.metrics` reports of this daemon, now."""
        now = self.clock.monotonic()
        live = [entry for entry in self.services.robots_cache.values() if entry.expires > now]
        return DaemonState(daemon_id=self.daemon_id, segment_id=self.segment_id, now=now,
                           metrics=self.metrics, buckets=[run.state() for run in self.runs],
                           label=metrics_label(self.conf), process=process_figures(),
                           robots_ages=[now - e.good_at for e in live if e.good_at is not None],
                           robots_unreachable=sum(1 for e in live if e.unreachable))

    async def fetch_buckets(self, segment_id: str, buckets: list[int]) -> list[dict[str, Any]]:
        """Fetch the given buckets of a segment (each must be owned: `acquire`) concurrently, resuming what an
        earlier run left; the manifests of those that finished. Raises `SettingsChanged` once the runs have stopped
        if the crawl's bucketing changed meanwhile (`watch_settings`)."""
        share = max(1, self.conf.fetch.max_queued_urls // max(1, len(buckets)))  # queued rows per bucket run
        self.segment_id, self.runs, self.stop_signal.segment_closed = segment_id, [], False
        watchers = [asyncio.create_task(self.progress_loop()), asyncio.create_task(self.watch_closed(segment_id)),
                    asyncio.create_task(self.watch_settings())]
        try:
            manifests = await asyncio.gather(*(self._fetch_bucket(segment_id, b, share) for b in buckets))
        finally:
            for watcher in watchers:
                watcher.cancel()
            self.log_progress()
        if self.stop_signal.settings_changed is not None:
            raise self.stop_signal.settings_changed
        return [m for m in manifests if m is not None]

    def _open_bucket(self, segment_id: str, bucket: int, lease: Lease) -> ResumeState | None:
        """The bucket's local files brought in and made consistent, and what is already done (None: the lease was
        lost first). Run in a thread: recovering a large torn WARC takes seconds, and on the event loop it would
        hold up the lease heartbeat (a lease not renewed within ttl - margin is fenced) and every host's timers."""
        self.store.prepare_bucket(segment_id, bucket)
        if lease.fenced():
            return None
        resume = recover_bucket_output(self.root, segment_id, bucket)
        self.store.sync_bucket(segment_id, bucket, lease.fenced)  # what recovery closed goes up
        return resume

    async def _fetch_bucket(self, segment_id: str, bucket: int, max_queued: int) -> dict[str, Any] | None:
        """One owned bucket to its end. When its files cannot be written (a full disk, I/O errors), the bucket
        stops fetching at once (nothing is fetched that cannot be stored), waits with growing pauses up to
        `fetch.storage_retry_max_s`, and resumes from what is durable once a probe write succeeds."""
        pause = self.conf.fetch.storage_retry_s
        while True:
            lease = self.owned.leases.get(bucket)
            if lease is None or lease.fenced() or self.stop_signal.is_set():  # lost since it was claimed, or stopping
                return None
            try:
                resume = await asyncio.to_thread(self._open_bucket, segment_id, bucket, lease)
                if resume is None:
                    return None
                run = BucketRun(self.services, segment_id=segment_id, bucket=bucket,
                                fetchlist=read_fetchlist(self.root, segment_id, bucket), lease=lease, resume=resume,
                                max_queued=max_queued)
            except OSError as exc:
                trouble: BaseException = exc
            else:
                self.runs = [r for r in self.runs if r.bucket != bucket] + [run]
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
                    pause = min(pause * 2, self.conf.fetch.storage_retry_max_s)
                    if lease.fenced() or self.stop_signal.is_set():
                        return None
            finally:
                self.metrics.storage_paused -= 1
            log.info("bucket %05d of %s: storage works again; resuming", bucket, segment_id)

    async def _storage_works(self, segment_id: str, bucket: int, pause: float, lease: Lease) -> bool:
        """Wait `pause` seconds (less if the daemon stops or the lease goes), then try a small durable write where
        the bucket's results go."""
        await interruptible_sleep(pause, lambda: self.stop_signal.is_set() or lease.fenced(), self.clock)
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
