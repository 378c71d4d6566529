"""How far the daemons are with a segment: which buckets have a fetch list, which have `_DONE.json`.

The scheduler's fetch sensor (airflow_dags/crawl_cycle.py) polls this between the generate and parse steps;
it lists folders (or S3 prefixes) only and reads no Parquet, so a poke stays cheap however large the segment
is. The listing is the daemons' own (`fetchd.daemon.fetchlist_buckets` / `pending_buckets` over a
`fetchd.storage` store), so the sensor and the daemons always agree on what "done" means, on a local root
and on S3 alike.
"""

from __future__ import annotations

from typing import NamedTuple

from crawler import layout
from crawler.config import Config


class SegmentProgress(NamedTuple):
    listed: list[int]  # buckets that have a fetch list
    done: list[int]    # of those, the buckets whose `_DONE.json` manifest is written

    @property
    def unfinished(self) -> list[int]:
        done = set(self.done)
        return [b for b in self.listed if b not in done]

    @property
    def complete(self) -> bool:
        """Every bucket with a fetch list is done (vacuously true for a segment with nothing due)."""
        return not self.unfinished


def segment_progress(root: str, segment_id: str, conf: Config | None = None) -> SegmentProgress:
    """`conf` (for its s3.* keys) is needed for an s3:// root only."""
    from fetchd.daemon import fetchlist_buckets, pending_buckets
    from fetchd.storage import LocalStore, open_store

    layout.check_segment_id(segment_id)
    root = layout.normalize_root(root)
    if layout.is_s3(root) and conf is None:
        raise ValueError(f"the progress of a segment under {root} needs the config (s3.* keys)")
    store = open_store(conf, root) if conf is not None else LocalStore(root)
    try:
        listed = fetchlist_buckets(store, segment_id)
        pending = set(pending_buckets(store, segment_id))
    finally:
        store.close()
    return SegmentProgress(listed=listed, done=[b for b in listed if b not in pending])
