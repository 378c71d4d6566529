"""The fetch daemon's two commands: fetch one segment to completion (`crawl fetch`), and serve until stopped
(`crawl fetchd`), each in `fetch.processes` processes (`fetchd.processes`) that share the buckets through leases.

Both stop on SIGTERM/SIGINT the same way: requests in flight get `ownership.shutdown_grace_s`, results are
published, files closed, buckets released, and no `_DONE.json` is written for an unfinished bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from crawler import layout
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config
from fetchd.daemon import Daemon, interruptible_sleep
from fetchd.fetcher import Transport
from fetchd.processes import STOP_SIGNALS, process_conf, process_count, run_in_processes, shares
from fetchd.progress import pending_buckets, pending_work
from fetchd.storage import LocalStore, open_store

log = logging.getLogger("fetchd")


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
def stop_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGINT set `stop` instead of killing the process (in the main thread only, the
    one Python delivers signals to); yields the signals received, in order. A process of `fetch.processes` is born
    with both blocked (`fetchd.processes.run_in_processes`): they are unblocked here, once handled, so a stop sent
    while it started arrives now instead of killing it before its daemon could stop and report."""
    received: list[int] = []
    previous: dict[int, Any] = {}

    def handle(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_status(summary: dict[str, Any]) -> int:
    """A fetch command's exit status: 0; 128 + the signal's number when a signal stopped it (the shell's
    convention), so a caller sees the segment was left unfinished; 1 when one of its processes failed."""
    stopped_by = summary.get("stopped_by")
    if stopped_by:
        return 128 + signal.Signals[stopped_by].value
    return 1 if summary.get("failed_processes") else 0


async def fetch_segment_async(conf: Config, store: LocalStore, segment_id: str, buckets: list[int],
                              stop: threading.Event, clock: Clock = SYSTEM_CLOCK, transport: Transport | None = None,
                              peers_dir: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """The given buckets of the segment on the running event loop (whose clock must be `clock`'s monotonic one),
    talking through `transport` (HTTP by default): (manifests of the finished buckets, buckets another daemon
    holds)."""
    daemon = Daemon(conf, store.root, stop, store=store, clock=clock, transport=transport, peers_dir=peers_dir)
    try:
        await daemon.open()
        owned = [b for b in buckets if daemon.owned.acquire(b)]
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
    with stop_on_signals(stop) as received:
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
        split = shares(wanted, process_count(conf))
        failed: list[str] = []
        if len(split) > 1:  # `fetch.processes`: the first share here, the others in processes of their own
            with _peers_folder(conf) as peers:
                first = process_conf(conf, 0, len(split))
                (manifests, held), others, failed = run_in_processes(
                    stop, lambda: asyncio.run(fetch_segment_async(first, store, segment_id, split[0], stop,
                                                                  peers_dir=peers)),
                    [(fetch_share, (process_conf(conf, n, len(split)), store.root, segment_id, share, peers))
                     for n, share in enumerate(split[1:], 1)])
            for their_manifests, their_held in others:
                manifests, held = manifests + their_manifests, held + their_held
        elif wanted:  # the daemon closes the store
            manifests, held = asyncio.run(fetch_segment_async(conf, store, segment_id, wanted, stop))
        else:
            manifests, held = [], []
            store.close()
    stopped_by = signal.Signals(received[0]).name if received else None
    summary = {**_summary(segment_id, manifests, skipped), "held_buckets": sorted(held), "stopped_by": stopped_by}
    return {**summary, "failed_processes": failed} if failed else summary


def _peers_folder(conf: Config) -> contextlib.AbstractContextManager[str | None]:
    """Where a command's processes leave their metrics for the one with the endpoint; none without an endpoint."""
    if conf.fetch.metrics_port:
        return tempfile.TemporaryDirectory(prefix="fetchd-processes-")
    return contextlib.nullcontext(None)


def fetch_share(conf: Config, root: str, segment_id: str, buckets: list[int],
                peers_dir: str | None) -> tuple[list[dict[str, Any]], list[int]]:
    """One process's share of a fetch (`fetch.processes`): its buckets, stopped by SIGTERM as `fetch_segment` is."""
    stop = threading.Event()
    with stop_on_signals(stop):
        return asyncio.run(fetch_segment_async(conf, open_store(conf, root), segment_id, buckets, stop,
                                               peers_dir=peers_dir))


def _claim(daemon: Daemon, work: dict[int, list[str]]) -> None:
    """Forget lost leases; release owned buckets with nothing left to fetch; take free ones with work, up to
    `ownership.max_buckets_per_daemon`, so a fleet of daemons shares the buckets."""
    daemon.owned.drop_lost()
    for bucket in [b for b in daemon.owned.leases if b not in work]:
        daemon.owned.release(bucket)
    limit = daemon.conf.ownership.max_buckets_per_daemon or len(work)
    for bucket in sorted(work):
        if len(daemon.owned.leases) >= limit:
            break
        daemon.owned.acquire(bucket)


async def serve_async(conf: Config, root: str, stop: threading.Event, clock: Clock = SYSTEM_CLOCK,
                      transport: Transport | None = None, peers_dir: str | None = None) -> None:
    """`serve` on the running event loop (whose clock must be `clock`'s monotonic one), talking through
    `transport` (HTTP by default)."""
    daemon = Daemon(conf, root, stop, clock=clock, transport=transport, peers_dir=peers_dir)
    try:
        await daemon.open()
        while not stop.is_set():
            try:
                work = await asyncio.to_thread(pending_work, daemon.store)  # S3: many requests, off the loop
                # Before any bucket is taken, and after the listing: a fetch list written under a new record (generate
                # after rebucket) and seen there is seen with that record here.
                await daemon.check_settings()
            except OSError as exc:  # the root cannot be read (S3 unreachable): look again after the pause
                log.warning("cannot look for work: %s", exc)
                work = {}
            _claim(daemon, work)
            fetched = False
            for segment_id in sorted({s for segments in work.values() for s in segments}):
                buckets = [b for b, segments in work.items() if segment_id in segments and b in daemon.owned.leases]
                if buckets and not stop.is_set():
                    log.info("fetching segment %s buckets %s", segment_id, buckets)
                    await daemon.fetch_buckets(segment_id, buckets)
                    fetched = True
            if fetched:
                continue  # look for work again at once (a peer's lapsed bucket, the next segment)
            await interruptible_sleep(conf.fetch.poll_interval_s, stop.is_set, clock)
    finally:
        await daemon.close()


def serve(conf: Config, root: str, stop: threading.Event | None = None, peers_dir: str | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set): every `fetch.poll_interval_s`, own the buckets with pending
    work that no other daemon owns (leases, `crawler.ownership`) and fetch them, segment by segment, in
    `fetch.processes` daemon processes (`fetchd.processes`). On the stop, requests in flight get
    `ownership.shutdown_grace_s`, results are published, files closed and the buckets released; whoever owns a
    bucket next resumes it. It stops the same way, and raises `SettingsChanged` (exit 75), when the crawl's
    recorded bucketing stops being its config's (`crawl rebucket`): looked at before buckets are taken and every
    `fetch.poll_interval_s` while they are fetched."""
    stop, root = stop or threading.Event(), layout.normalize_root(root)
    with stop_on_signals(stop):
        count = process_count(conf)
        if count == 1:
            asyncio.run(serve_async(conf, root, stop, peers_dir=peers_dir))
            return
        first = process_conf(conf, 0, count)
        with _peers_folder(conf) as peers:
            run_in_processes(stop, lambda: asyncio.run(serve_async(first, root, stop, peers_dir=peers)),
                             [(serve, (process_conf(conf, n, count), root, None, peers)) for n in range(1, count)])
