"""A bucket's fetch list, read in Parquet record batches so a daemon's memory does not grow with the list.

The daemon takes rows on as its host queues drain (`fetch.max_queued_urls`), so only a window of the list is
ever held as Python rows. What it must know about the whole list is kept as sorted 64-bit keys, 8 bytes a URL:
the list's url_ids (a redirect to a listed URL is not followed: that URL is fetched as its own row) and the
(url_id, state_version) pairs an earlier run already reported (resume).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from crawler import layout, records, urls

BATCH_ROWS = 4096  # rows per Parquet read: the reader's own window, besides the scheduler's queues


def url_key(url_id: str) -> int:
    """A url_id's 64-bit key (url_ids are hashes already; hashing again accepts any spelling of one)."""
    return mmh3.hash64(url_id, signed=False)[0]


def result_key(url_id: str, state_version: int) -> int:
    """The 64-bit key of a (url_id, state_version) pair: one URL's result for one lease."""
    return mmh3.hash64(f"{url_id}/{state_version}", signed=False)[0]


class KeySet:
    """An immutable set of 64-bit keys as one sorted array: 8 bytes a member (a Python set of tuples costs ~150)."""

    def __init__(self, keys: np.ndarray | None = None):
        self.keys = np.zeros(0, np.uint64) if keys is None else keys
        self.keys.sort()  # in place, no second copy; a duplicate does no harm to `member`

    @classmethod
    def of(cls, keys: Iterable[int]) -> KeySet:
        return cls(np.fromiter(keys, np.uint64))

    def __len__(self) -> int:
        """Members, a key listed twice counted twice."""
        return len(self.keys)

    def member(self, keys: np.ndarray) -> np.ndarray:
        """Which of `keys` are in the set (vectorised)."""
        if not len(self.keys):
            return np.zeros(len(keys), bool)
        pos = np.searchsorted(self.keys, keys)
        pos[pos == len(self.keys)] = 0
        return self.keys[pos] == keys

    def has(self, key: int) -> bool:
        return bool(self.member(np.array([key], np.uint64))[0])


class ListedUrls(KeySet):
    """The url_ids of a fetch list; `url in listed` for a canonical URL."""

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self.has(url_key(urls.url_id(url)))


def _url_keys(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    return np.fromiter((url_key(u) for u in table.column("url_id").to_pylist()), np.uint64, len(table))


def _result_keys(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    pairs = zip(table.column("url_id").to_pylist(), table.column("state_version").to_pylist(), strict=True)
    return np.fromiter((result_key(u, v) for u, v in pairs), np.uint64, len(table))


class FetchList:
    """One bucket's fetch-list files (Spark's `_SUCCESS`/`.crc` files ignored), read file by file in record
    batches, rows in file order: a host's rows come in rank order however hosts are interleaved."""

    def __init__(self, root: str, segment_id: str, bucket: int, batch_rows: int = BATCH_ROWS):
        folder = layout.fetchlist_dir(root, segment_id, bucket)
        self.paths = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                            if n.endswith(".parquet") and not n.startswith(("_", ".")))
        self.batch_rows = batch_rows

    def __len__(self) -> int:
        """Rows in the list, from the Parquet footers."""
        total = 0
        for path in self.paths:
            with pq.ParquetFile(path) as parquet:
                total += parquet.metadata.num_rows
        return total

    def _batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """Record batches of those of `columns` each file has (a list written before a column existed lacks it)."""
        for path in self.paths:
            with pq.ParquetFile(path) as parquet:
                present = [name for name in columns if name in parquet.schema_arrow.names]
                for group in range(parquet.num_row_groups):  # asked one by one, or all are read ahead at once
                    yield from parquet.iter_batches(self.batch_rows, row_groups=[group], columns=present)

    def scan(self, done: KeySet) -> tuple[ListedUrls, int]:
        """One pass over the url_id and state_version columns: the list's url_ids, and how many of its rows
        are not in `done` (result keys already reported)."""
        keys, filled, todo = np.empty(len(self), np.uint64), 0, 0
        for batch in self._batches(["url_id", "state_version"]):
            keys[filled:filled + len(batch)] = _url_keys(batch)
            filled += len(batch)
            todo += len(batch) - int(done.member(_result_keys(batch)).sum())
        return ListedUrls(keys[:filled]), todo

    def rows(self, done: KeySet) -> Iterator[dict[str, Any]]:
        """The rows (FETCHLIST columns) whose result is not in `done`, a batch at a time. The stored robots.txt
        generate put on a host's first row moves to the host's first row left when that one was reported already
        (a resumed bucket), so the host still gets it (`handed_over_robots`)."""
        carried: dict[str, dict[str, Any]] = {}
        for batch in self._batches(records.FETCHLIST.names):
            table = _conformed(pa.Table.from_batches([batch]))
            reported = done.member(_result_keys(table))
            if reported.any():
                carried.update(_robots_of(table.filter(pa.array(reported))))
                table = table.filter(pa.array(~reported))
            for row in table.to_pylist():
                if carried and handed_over_robots(row) is None and row["host_key"] in carried:
                    row.update(carried.pop(row["host_key"]))
                yield row


def handed_over_robots(row: dict[str, Any]) -> dict[str, Any] | None:
    """The stored robots.txt observation generate put on a host's first row (status_code, body, fetched_at,
    expires_at), or None: not that row, none in force, or a list written before the columns existed."""
    if row.get("robots_expires_at") is None:
        return None
    return {name.removeprefix("robots_"): row[name] for name in records.FETCHLIST_ROBOTS}


def _robots_of(table: pa.Table) -> dict[str, dict[str, Any]]:
    """host_key -> the robots columns of `table`'s rows that carry a handed-over robots.txt."""
    carrying = table.filter(pc.is_valid(table.column("robots_expires_at")))
    return {row["host_key"]: {name: row[name] for name in records.FETCHLIST_ROBOTS}
            for row in carrying.select(["host_key", *records.FETCHLIST_ROBOTS]).to_pylist()}


def _conformed(table: pa.Table) -> pa.Table:
    """FETCHLIST's columns in order and types; one the list's writer did not know yet (an older generate, before
    an upgrade) is null, so a daemon finishes a segment generated by the previous version."""
    return pa.Table.from_arrays(
        [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
         for f in records.FETCHLIST],
        schema=records.FETCHLIST,
    )

