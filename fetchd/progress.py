"""How far the daemons are with a segment: which buckets have a fetch list, which have `_DONE.json`, whether
the segment is closed; and closing it, when the cycle stops waiting for it.

The scheduler's fetch sensor (airflow_dags/crawl_cycle.py) polls this (`segment_progress`) between the generate
and parse steps; it lists folders (or S3 prefixes) only and reads no Parquet, so a poke stays cheap however large
the segment is. The listing is the daemons' own (`fetchlist_buckets` / `is_done` of a `fetchd.storage` store), so
the sensor and the daemons always agree on what "done" means, on a local root and on S3 alike.

The daemons look for work here too, with the same store calls: the buckets of a segment still to fetch
(`pending_buckets`, none once it is closed), those of every segment (`pending_work`), and a bucket's fetch list
(`read_fetchlist`).

A segment generate has not published yet (`_GENERATING.json`, crawler.layout: its leases are not committed, or
its generate crashed) is no segment here: no bucket is listed, none pending. The buckets are listed first and the
marker looked for after, the order that layout's rule asks of a reader.

At the fetch deadline the scheduler closes the segment (`close_segment`: `ROOT/segments/<id>/_CLOSED.json`).
Daemons then start none of its buckets, and a daemon fetching one stops it within `fetch.poll_interval_s` plus
`ownership.shutdown_grace_s`, the way SIGTERM stops it: results so far published, lease released, no
`_DONE.json`. The URLs it did not report keep their lease until it expires and a later generate selects them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from crawler import layout
from crawler.config import Config
from fetchd.fetchlist import FetchList
from fetchd.storage import LocalStore, open_store


class SegmentProgress(NamedTuple):
    listed: list[int]  # buckets that have a fetch list
    done: list[int]    # of those, the buckets whose `_DONE.json` manifest is written
    closed: bool = False  # `_CLOSED.json` is written: no daemon fetches the unfinished buckets any more

    @property
    def unfinished(self) -> list[int]:
        done = set(self.done)
        return [b for b in self.listed if b not in done]

    @property
    def complete(self) -> bool:
        """Every bucket with a fetch list is done (vacuously true for a segment with nothing due)."""
        return not self.unfinished

    @property
    def fetch_over(self) -> bool:
        """Nothing more of the segment will be fetched: every listed bucket done, or the segment closed (what
        generate's backpressure and `crawl run` wait for before the steps after the fetch)."""
        return self.complete or self.closed


def _open_store(root: str, segment_id: str, conf: Config | None) -> LocalStore:
    """The daemons' store of the root; `conf` (for its s3.* keys) is needed for an s3:// root only."""
    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    if layout.is_s3(root) and conf is None:
        raise ValueError(f"the progress of a segment under {root} needs the config (s3.* keys)")
    return open_store(conf, root) if conf is not None else LocalStore(root)


def listed_buckets(store: LocalStore, segment_id: str) -> list[int]:
    """The buckets of a published segment's fetch list (none for a segment generate has not published)."""
    listed = store.fetchlist_buckets(segment_id)
    return [] if listed and store.is_generating(segment_id) else listed


def _progress(store: LocalStore, segment_id: str) -> SegmentProgress:
    listed = listed_buckets(store, segment_id)  # listed once per poke (a delimited listing on S3)
    return SegmentProgress(listed=listed, done=[b for b in listed if store.is_done(segment_id, b)],
                           closed=store.is_closed(segment_id))


def segment_progress(root: str, segment_id: str, conf: Config | None = None) -> SegmentProgress:
    """`conf` (for its s3.* keys) is needed for an s3:// root only."""
    store = _open_store(root, segment_id, conf)
    try:
        return _progress(store, segment_id)
    finally:
        store.close()


def close_segment(root: str, segment_id: str, reason: str, conf: Config | None = None) -> SegmentProgress:
    """Write the segment's `_CLOSED.json` (closed_at, reason, the buckets unfinished now) unless it is closed
    already (a retried task keeps the first close); the progress as of the close."""
    store = _open_store(root, segment_id, conf)
    try:
        progress = _progress(store, segment_id)
        if not progress.closed:
            store.close_segment(segment_id, {
                "segment_id": segment_id,
                "closed_at": datetime.now(UTC).isoformat(),
                "reason": reason,
                "unfinished_buckets": progress.unfinished,
            })
        return progress._replace(closed=True)
    finally:
        store.close()


def read_fetchlist(root: str, segment_id: str, bucket: int) -> FetchList:
    """The bucket's fetch list, to be read in record batches (`fetchd.fetchlist`)."""
    return FetchList(root, segment_id, bucket)


def _store(root: str | LocalStore) -> LocalStore:
    """`root`: a local folder, or the store of any root."""
    return root if isinstance(root, LocalStore) else LocalStore(layout.normalize_root(root))


def unfinished_buckets(root: str | LocalStore, segment_id: str) -> list[int]:
    """Buckets of a segment that have a fetch list and no `_DONE.json` yet."""
    store = _store(root)
    return [b for b in listed_buckets(store, segment_id) if not store.is_done(segment_id, b)]


def pending_buckets(root: str | LocalStore, segment_id: str) -> list[int]:
    """The unfinished buckets a daemon may fetch: none once the segment is closed (`_CLOSED.json`)."""
    store = _store(root)
    return [] if store.is_closed(segment_id) else unfinished_buckets(store, segment_id)


def pending_work(root: str | LocalStore) -> dict[int, list[str]]:
    """Bucket -> the segments (oldest first) where it has a fetch list and no `_DONE.json`."""
    store = _store(root)
    work: dict[int, list[str]] = {}
    for segment_id in store.segments():
        for bucket in pending_buckets(store, segment_id):
            work.setdefault(bucket, []).append(segment_id)
    return work
