"""Fetching one owned bucket of a segment: the asyncio driver of the bucket's host scheduler.

Two-level scheduling (`crawler.scheduling.HostScheduler`): a heap of hosts keyed by the time their politeness gate
(`crawler.politeness.HostGate`) opens, over per-host URL queues in fetch-list order, filled as the streamed fetch
list is read. A bucket run starts what the scheduler has ready (a host's preparation, `fetchd.hostprep`; a URL's
exchange, `fetchd.exchange`) as tasks holding global slots, emits one result row per URL to the bucket's output
(`fetchd.output`), drains its requests when it stops, and writes `_DONE.json` when the bucket is finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

from crawler import layout
from crawler.robots import RobotsPolicy
from crawler.scheduling import Dispatch, HostScheduler, HostWork, Prepare, Report
from crawler.status import FetchOutcome, made_request
from fetchd.exchange import STOP_POLL_S, Exchange, utc
from fetchd.fetchlist import FetchList, KeySet, handed_over_robots, result_key
from fetchd.hostprep import HostPreparer
from fetchd.metrics import BucketState, host_class
from fetchd.output import BucketOutput, Fenced, ResumeState, bucket_totals, write_json_atomic
from fetchd.ownership import Lease
from fetchd.services import DaemonServices

log = logging.getLogger("fetchd")


class BucketRun:
    """Fetches one bucket of one segment to completion (or until the daemon is told to stop). What it shares with
    the daemon's other bucket runs comes from `services`; the daemon's collaborators it uses per request are kept as
    its own attributes (one lookup, not two, on the hot path)."""

    def __init__(self, services: DaemonServices, *, segment_id: str, bucket: int, fetchlist: FetchList,
                 lease: Lease, resume: ResumeState, max_queued: int):
        self.conf = services.conf
        self.clock = services.clock
        self.store = services.store
        self.root = services.root
        self.daemon_id = services.daemon_id
        self.slots = services.slots
        self.metrics = services.metrics
        self.daemon_outcomes = services.metrics.outcomes
        self.stop_signal = services.stop
        self.segment_id = segment_id
        self.bucket = bucket
        self.lease = lease
        self.listed_urls = len(fetchlist)  # the whole fetch list, including URLs an earlier run already reported
        self.out = BucketOutput(
            root=self.root, segment_id=segment_id, bucket=bucket, daemon_id=self.daemon_id,
            warcinfo=services.warcinfo, warc_max_bytes=self.conf.fetch.warc_max_bytes,
            compression=(self.conf.fetch.warc_compressor, self.conf.fetch.warc_gzip_level),
            batch_rows=self.conf.ownership.results_batch_rows,
            publish_after_s=self.conf.ownership.results_publish_s, fenced=lease.fenced,
            on_write=self.metrics.warc_written, on_publish=self._sync_files, wall_time=self.clock.wall,
            monotonic=self.clock.monotonic)
        self.sched = HostScheduler(services.gates.gate_for, self.clock.monotonic, self._report,
                                   recheck_s=STOP_POLL_S, rules=services.rules)
        self.hosts = self.sched.hosts
        # The list is streamed: rows are taken on while the host queues hold fewer than `max_queued` (this run's
        # share of `fetch.max_queued_urls`).
        # What is known of the whole list is compact (`fetchd.fetchlist`): the reported results (resume) and the
        # url_ids, read from their column up front, so a redirect to a URL listed further on is not followed.
        done = KeySet.of(result_key(url_id, version) for url_id, version in resume.done)
        resume.done.clear()  # replaced by the compact keys
        listed, self.urls = fetchlist.scan(done)  # urls: rows this run fetches (not reported before)
        self.reading: Iterator[dict[str, Any]] | None = fetchlist.rows(done)  # None once read to the end
        self.max_queued = max_queued
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots_held = 0  # global slots taken for this run's page requests and not given back yet
        self.storage_error: OSError | None = None  # why this run's files could not be written, if they could not
        self.wake = asyncio.Event()
        self.outcomes: Counter[str] = Counter()
        self.begun: float | None = None  # monotonic start of the scheduler: ready lag is never counted before it
        self.exchange = Exchange(services, out=self.out, listed=listed, should_stop=self.should_stop,
                                 fenced=lease.fenced)
        self.preparer = HostPreparer(services, exchange=self.exchange, out=self.out, previous_robots=resume.robots,
                                     previous_end=lease.previous_end)

    def _sync_files(self) -> None:
        """After rows are published or a WARC closed: on an S3 root they go up (`fetchd.storage`)."""
        self.store.sync_bucket(self.segment_id, self.bucket, self.lease.fenced)

    def state(self) -> BucketState:
        """What `fetchd.metrics` reports of this run, now."""
        return BucketState(bucket=self.bucket, urls=self.urls, outcomes=self.outcomes, hosts=self.hosts.values(),
                           begun=self.begun, tasks=len(self.tasks), warc_files_closed=self.out.warc_files)

    # --- scheduling: a thin asyncio driver of `crawler.scheduling.HostScheduler` -------------------------

    def add(self, row: dict[str, Any]) -> None:
        """Take on one fetch-list row."""
        new = row["host_key"] not in self.hosts
        self.sched.add(row)
        if new:  # a host's first row carries its stored robots.txt, if generate handed one over
            self.preparer.take_over(self.hosts[row["host_key"]], handed_over_robots(row))

    def _refill(self) -> None:
        """Read more of the fetch list while the host queues hold fewer than `max_queued` URLs."""
        while self.reading is not None and self.sched.queued < self.max_queued:
            row = next(self.reading, None)
            if row is None:
                self.reading = None
            else:
                self.add(row)

    def should_stop(self) -> bool:
        """Whether to stop handing out work: the daemon is stopping, the segment was closed, the crawl's settings
        changed, the bucket's lease is lost (fenced), or its files cannot be written. An unfinished bucket is resumed
        from what was published or recorded in the WARC."""
        return self.stop_signal.is_set() or self.lease.fenced() or self.storage_error is not None

    def _storage_failed(self, exc: OSError) -> None:
        """A write of this bucket's files failed: stop (the daemon pauses the bucket and resumes it later)."""
        if self.storage_error is None:
            log.warning("bucket %05d of %s: cannot write its files: %s", self.bucket, self.segment_id, exc)
            self.storage_error = exc
        self.wake.set()

    def _publish_if_due(self) -> None:
        """Publish rows that have waited `ownership.results_publish_s` (the loop wakes at least every STOP_POLL_S);
        a lost lease is the loop's to see, a failed write stops the bucket."""
        if self.lease.fenced():
            return
        try:
            self.out.publish_if_due()
        except Fenced:
            pass  # the lease lapsed since the look above: the loop stops on it
        except OSError as exc:
            self._storage_failed(exc)

    async def _guarded(self, coro: Any) -> None:
        """Run a request task; a storage error it hits stops the bucket. Network errors never get here: the
        fetcher turns them into responses, so an OSError here comes from writing files."""
        try:
            await coro
        except OSError as exc:
            self._storage_failed(exc)
        except Fenced:
            pass  # the lease lapsed before the request went out: the loop sees it, stops and releases the gates

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
                if not await self._take_slot():
                    return None  # told to stop while every slot was taken: nothing more is sent
                self.slots_held += 1
                item = self.sched.start(action.host)
                if item is None:  # changed while waiting for a slot
                    self._release_slot()
                else:
                    self._start(self._fetch_url(action.host, item))
            else:
                return action
        return None

    async def _take_slot(self) -> bool:
        """A global request slot, or False once the run should stop: while every slot is taken, whether to stop is
        looked at every STOP_POLL_S, so a stop never waits for another request to end (nor sends one after it)."""
        if not self.slots.locked():
            await self.slots.acquire()  # free now: taken without a wait
            return True
        taking = asyncio.ensure_future(self.slots.acquire())
        try:
            while not self.should_stop():
                if (await asyncio.wait({taking}, timeout=STOP_POLL_S))[0]:
                    return True
        except BaseException:
            _give_back(taking, self.slots)
            raise
        _give_back(taking, self.slots)
        return False

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
            # A timer that sets the event, not asyncio.wait_for: that one builds a task per wait, about one a page.
            timer = asyncio.get_running_loop().call_later(STOP_POLL_S if wait is None else min(wait, STOP_POLL_S),
                                                          self.wake.set)
            try:
                await self.wake.wait()
            finally:
                timer.cancel()
            self._publish_if_due()
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
            await asyncio.to_thread(self.store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced)
            if self.stop_signal.settings_changed is not None:
                log.warning("bucket %05d of %s: released unfinished because the crawl's settings changed; results so "
                            "far are published and a daemon with the new settings resumes it",
                            self.bucket, self.segment_id)
            elif self.stop_signal.segment_closed:
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
        grace_ends = self.clock.monotonic() + self.conf.ownership.shutdown_grace_s
        while self.tasks or self.lease.fenced():
            over = (self.lease.fenced() or self.storage_error is not None
                    or (self.stop_signal.is_set() and self.clock.monotonic() >= grace_ends))
            if over:  # fenced: also the gates of requests that stopped on the fence before they were sent
                for task in self.tasks:
                    task.cancel()
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
                self._release_cancelled()
                return
            await asyncio.wait(list(self.tasks), timeout=STOP_POLL_S)

    def _release_slot(self) -> None:
        self.slots_held -= 1
        self.slots.release()

    def _release_cancelled(self) -> None:
        """Give back what cancelled requests held: a request cancelled in flight skips its gate's `finished`, and
        one cancelled before its task ran also skips its slot's release. Gates and slots outlive this run (the
        bucket's next run in this process uses them), so without this the host would stay closed and the daemon
        one slot short. No request of this run is left, and a host belongs to one bucket, so its gate has none. A
        robots.txt request on another bucket's host (a redirect) gives its own place back (`Exchange.gated_get`)."""
        now = self.clock.monotonic()
        for host in self.sched.hosts.values():
            host.gate.abandoned(now)
        while self.slots_held:
            self._release_slot()

    async def _finish(self, started: float) -> dict[str, Any]:
        """Publish the last rows, close the WARC and write `_DONE.json`, counting every run of the bucket. On an
        S3 root every file is uploaded before the manifest, and the manifest last."""
        self.out.close_current()
        store = self.store
        await asyncio.to_thread(store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced)
        manifest = {
            "segment_id": self.segment_id,
            "bucket": self.bucket,
            "daemon_id": self.daemon_id,
            "urls": self.listed_urls,
            **bucket_totals(self.root, self.segment_id, self.bucket,
                            await asyncio.to_thread(store.warc_sizes, self.segment_id, self.bucket)),
            "hosts": len(self.hosts),
            "resumed": self.listed_urls - self.urls,
            "started_at": utc(started).isoformat(),
            "finished_at": utc(self.clock.wall()).isoformat(),
        }
        self.out.check()
        write_json_atomic(manifest, layout.done_manifest(self.root, self.segment_id, self.bucket))
        await asyncio.to_thread(store.upload_bucket, self.segment_id, self.bucket, self.lease.fenced, True)
        log.info("bucket %05d of %s done: %s", self.bucket, self.segment_id, manifest["outcomes"])
        return manifest

    # --- host preparation and URL exchanges, as scheduler tasks -----------------------------------------

    async def _prepare(self, host: HostWork) -> None:
        """Prepare a host (`fetchd.hostprep`), then tell the scheduler, whatever happened, unless the stopping run
        cancelled it: the host then stays unprepared, so its URLs stay unreported and the bucket unfinished for its
        next run (told, the scheduler would report them `deferred` and the bucket would end done without them)."""
        cancelled = False
        try:
            await self.preparer.prepare(host)
        except asyncio.CancelledError:
            cancelled = True
            raise
        except (OSError, Fenced):
            raise  # writing failed (name lookups are handled inside), or the lease lapsed: the bucket run stops
        except Exception:  # never leave a host half-prepared: its URLs would never be reported
            log.exception("preparing %s failed; its URLs are deferred", host.host_key)
            host.policy = RobotsPolicy.disallow_all()
        finally:
            if not cancelled:
                self.sched.prepared(host)
                self._after_request(host)

    async def _fetch_url(self, host: HostWork, item: dict[str, Any]) -> None:
        """Fetch one fetch-list URL (gate already taken, global slot held) and its same-host redirects
        (`fetchd.exchange`), and report its row. The slot goes back once the first response is in; from then on
        the scheduler hears the URL is over whatever happens (`_release_cancelled` gives back what a request
        cancelled before that held)."""
        try:
            response = await self.exchange.first_request(item)
        finally:
            self._release_slot()
        retry_after = self.exchange.request_finished(host.gate, response, host_class(host.listed))
        try:
            self._emit(await self.exchange.follow_redirects(host, item, response, retry_after))
        finally:
            self.sched.finished(host)
            self._after_request(host)

    def _after_request(self, host: HostWork) -> None:
        """The scheduler has settled and rescheduled the host: count its hold and wake the driver."""
        if host.queue:
            self.exchange.count_politeness_wait(host.gate)
        self.wake.set()

    # --- result rows ------------------------------------------------------------------------------------

    def _report(self, report: Report) -> None:
        """A URL the scheduler reports without a request."""
        self._emit(self.exchange.row(report.item, report.outcome, error=report.error))
        if report.outcome is FetchOutcome.ROBOTS_DENIED:
            self.metrics.robots_denials += 1

    def _emit(self, row: dict[str, Any]) -> None:
        """Hand a URL's row to the output (a row that cost a request is logged in the WARC too) and count it."""
        self.out.add("fetched", row, logged=made_request(row["outcome"]))
        self.out.after_result()
        self.outcomes[row["outcome"]] += 1
        self.daemon_outcomes[row["outcome"]] += 1


def _give_back(taking: asyncio.Future, slots: asyncio.Semaphore) -> None:
    """Undo a slot's acquisition that is no longer wanted: cancelled while it waits (the semaphore hands a slot
    granted meanwhile to the next waiter), released if it was granted."""
    if not taking.done():
        taking.cancel()
    elif not taking.cancelled() and taking.exception() is None:
        slots.release()
