"""How far the daemons are with a segment: which buckets have a fetch list, which have `_DONE.json`, whether
the segment is closed; and closing it, when the cycle stops waiting for it.

The scheduler's fetch sensor (airflow_dags/crawl_cycle.py) polls this between the generate and parse steps;
it lists folders (or S3 prefixes) only and reads no Parquet, so a poke stays cheap however large the segment
is. The listing is the daemons' own (`fetchlist_buckets` / `is_done` of a `fetchd.storage` store), so the
sensor and the daemons always agree on what "done" means, on a local root and on S3 alike.

At the fetch deadline the scheduler closes the segment (`close_segment`: `ROOT/segments/<id>/_CLOSED.json`).
Daemons then start none of its buckets, and a daemon fetching one stops it within `fetch.poll_interval_s` plus
`ownership.shutdown_grace_s`, the way SIGTERM stops it: results so far published, lease released, no
`_DONE.json`. The URLs it did not report keep their lease until it expires and a later generate selects them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple

from crawler import layout
from crawler.config import Config

if TYPE_CHECKING:
    from fetchd.storage import LocalStore


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


def _open_store(root: str, segment_id: str, conf: Config | None) -> LocalStore:
    """The daemons' store of the root; `conf` (for its s3.* keys) is needed for an s3:// root only."""
    from fetchd.storage import LocalStore, open_store

    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    if layout.is_s3(root) and conf is None:
        raise ValueError(f"the progress of a segment under {root} needs the config (s3.* keys)")
    return open_store(conf, root) if conf is not None else LocalStore(root)


def _progress(store: LocalStore, segment_id: str) -> SegmentProgress:
    listed = store.fetchlist_buckets(segment_id)  # listed once per poke (a delimited listing on S3)
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
                "closed_at": datetime.now(timezone.utc).isoformat(),
                "reason": reason,
                "unfinished_buckets": progress.unfinished,
            })
        return progress._replace(closed=True)
    finally:
        store.close()
