"""The files a daemon writes for one bucket of one segment, and how a successor resumes from them.

Per bucket: WARC files (`*.open` while written), fetched-results and robots Parquet files, and `_DONE.json`
when finished. Every result row that cost a request is also written into the WARC as a result record (the
WARC is the durable log). Rows are published as Parquet in batches, each time after the WARC is synced, so a
published row only ever points at a durable record. A daemon that dies leaves an `*.open` file; whoever owns
the bucket next cuts it to its last complete record, renames it, publishes the rows found in it, and fetches
only the URLs no published row reports. So a kill costs at most the fetches that were in flight.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from crawler import layout, records
from fetchd.warc import DEFAULT_COMPRESSOR, DEFAULT_GZIP_LEVEL, WARC_SUFFIX, WarcFile, iipc_stem
from fetchd.warcrecovery import read_results, recover_open_warc

log = logging.getLogger("fetchd")

RESULT_KINDS = {"fetched": records.FETCHED, "robots": records.ROBOTS}


class Fenced(RuntimeError):
    """The bucket's lease is lost or about to run out: nothing more may be requested or written for it."""


def write_parquet_atomic(rows: list[dict[str, Any]], schema: pa.Schema, path: str) -> None:
    """Temp name (hidden from Spark by its leading dot), then rename: readers never see half a file."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, path)


def write_json_atomic(payload: dict[str, Any], path: str) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _result_dirs(root: str, segment_id: str, bucket: int) -> dict[str, str]:
    return {"fetched": layout.fetched_dir(root, segment_id, bucket),
            "robots": layout.robots_dir(root, segment_id, bucket)}


def _parquet_files(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)
                  if n.endswith(".parquet") and not n.startswith((".", "_")))


def published_rows(root: str, segment_id: str, bucket: int, kind: str, columns: list[str]) -> list[dict[str, Any]]:
    """The given columns of every published row of one kind (fetched or robots) of the bucket."""
    rows: list[dict[str, Any]] = []
    for path in _parquet_files(_result_dirs(root, segment_id, bucket)[kind]):
        rows.extend(pq.read_table(path, columns=columns).to_pylist())
    return rows


@dataclass
class ResumeState:
    """What a bucket's earlier, unfinished runs left: the URLs already reported and the robots.txt fetched."""

    done: set[tuple[int, int]] = field(default_factory=set)   # (url_id, state_version) with a published row
    robots: dict[str, dict[str, Any]] = field(default_factory=dict)  # host_key -> latest published robots row
    recovered_files: int = 0
    recovered_rows: int = 0
    discarded_files: int = 0


def _row_key(kind: str, row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["url_id"], row["state_version"]) if kind == "fetched" else (row["host_key"], row["fetched_at"])


def recover_bucket_output(root: str, segment_id: str, bucket: int) -> ResumeState:
    """Make an unfinished bucket's files consistent and say what is already done. Only the bucket's owner may
    call this (a fenced predecessor writes nothing more): temp files are removed, each `*.open` WARC is cut to
    its last complete record and renamed (or deleted if it holds no fetch), and the rows recorded in it that
    were not published yet are published as `<stem>-recovered.parquet`."""
    state = ResumeState()
    warc_dir = layout.warc_dir(root, segment_id, bucket)
    dirs = _result_dirs(root, segment_id, bucket)
    for folder in (warc_dir, *dirs.values()):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(".") and name.endswith(".tmp"):
                    os.remove(os.path.join(folder, name))
    key_columns = {"fetched": ["url_id", "state_version"], "robots": ["host_key", "fetched_at"]}
    seen = {kind: {_row_key(kind, r) for r in published_rows(root, segment_id, bucket, kind, key_columns[kind])}
            for kind in RESULT_KINDS}
    open_files = sorted(n for n in os.listdir(warc_dir) if n.endswith(layout.OPEN_SUFFIX)) \
        if os.path.isdir(warc_dir) else []
    for name in open_files:
        recovered = recover_open_warc(os.path.join(warc_dir, name))
        if recovered.path is None:
            state.discarded_files += 1
            continue
        state.recovered_files += 1
        found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in RESULT_KINDS}
        for kind, text in read_results(recovered.path):
            row = records.row_from_json(text, RESULT_KINDS[kind])
            if _row_key(kind, row) not in seen[kind]:
                seen[kind].add(_row_key(kind, row))
                found[kind].append(row)
        stem = os.path.basename(recovered.path).removesuffix(WARC_SUFFIX)
        for kind, rows in found.items():
            if rows:
                os.makedirs(dirs[kind], exist_ok=True)
                write_parquet_atomic(rows, RESULT_KINDS[kind], os.path.join(dirs[kind], f"{stem}-recovered.parquet"))
                state.recovered_rows += len(rows) if kind == "fetched" else 0
    state.done = seen["fetched"]
    for row in published_rows(root, segment_id, bucket, "robots", records.ROBOTS.names):
        latest = state.robots.get(row["host_key"])
        if latest is None or row["fetched_at"] > latest["fetched_at"]:
            state.robots[row["host_key"]] = row
    if open_files:
        log.info("bucket %05d of %s: recovered %d open WARC file(s) (%d discarded), %d result rows rebuilt",
                 bucket, segment_id, state.recovered_files, state.discarded_files, state.recovered_rows)
    return state


def bucket_totals(root: str, segment_id: str, bucket: int, warc_sizes: list[int] | None = None) -> dict[str, Any]:
    """Outcome counts of every published row and the closed WARC files of a bucket (for its manifest); the sizes
    of those files are read under `root` unless given (an S3 root lists its objects)."""
    outcomes = Counter(r["outcome"] for r in published_rows(root, segment_id, bucket, "fetched", ["outcome"]))
    warc_dir = layout.warc_dir(root, segment_id, bucket)
    sizes = warc_sizes if warc_sizes is not None else \
        [os.path.getsize(os.path.join(warc_dir, n)) for n in os.listdir(warc_dir) if n.endswith(WARC_SUFFIX)] \
        if os.path.isdir(warc_dir) else []
    return {"results": sum(outcomes.values()), "outcomes": dict(sorted(outcomes.items())),
            "warc_files": len(sizes), "warc_bytes": sum(sizes)}


def _by_warc(rows: list[dict[str, Any]], current: str) -> dict[str, list[dict[str, Any]]]:
    """Rows by the stem of the WARC they point into (`current` for rows without a record): a fetch whose records
    went into a file that was rotated away while it awaited them still names that file's result files."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        name = row.get("warc_filename")
        groups.setdefault(os.path.basename(name).removesuffix(WARC_SUFFIX) if name else current, []).append(row)
    return groups


class BucketOutput:
    """The files of one bucket being written: the current WARC and the result rows not yet published.
    `fenced()` is asked before every write: once the bucket's lease is gone this output writes nothing."""

    def __init__(self, *, root: str, segment_id: str, bucket: int, daemon_id: str, warcinfo: dict[str, str],
                 warc_max_bytes: int, batch_rows: int, publish_after_s: float = math.inf,
                 compression: tuple[str, int] = (DEFAULT_COMPRESSOR, DEFAULT_GZIP_LEVEL),
                 fenced: Callable[[], bool] = lambda: False, on_write: Callable[[int], None] = lambda n: None,
                 on_publish: Callable[[], None] = lambda: None, wall_time: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.root, self.segment_id, self.bucket, self.daemon_id = root, segment_id, bucket, daemon_id
        self.warc_max_bytes = warc_max_bytes
        self.warcinfo = warcinfo
        self.batch_rows = batch_rows
        # Rows wait at most this long (`ownership.results_publish_s`, on the `monotonic` clock) before they are
        # published, so a fetch is durable within a bound even when results come slowly (hosts held by their delay).
        self.publish_after_s = publish_after_s
        self.monotonic = monotonic
        self.pending_since: float | None = None  # when the oldest row not yet published was queued
        self.fenced = fenced
        self.on_write = on_write
        self.compressor, self.gzip_level = compression  # `fetch.warc_compressor`, `fetch.warc_gzip_level`
        self.on_publish = on_publish  # told after rows are published or a WARC closed (an S3 root uploads them)
        self.wall_time = wall_time  # the daemon's clock: a WARC's name carries the time it was opened
        self.seq = 0
        self.batch = 0
        self.warc_files = 0  # closed by this run, and their bytes (for `/status`)
        self.warc_bytes = 0
        self.current: WarcFile | None = None
        self.current_relpath = ""  # of `current`, computed once (relpath asks the OS for the working directory)
        self.pending: dict[str, list[dict[str, Any]]] = {kind: [] for kind in RESULT_KINDS}
        self.dirs = _result_dirs(root, segment_id, bucket)
        self.warc_dir = layout.warc_dir(root, segment_id, bucket)
        for folder in (self.warc_dir, *self.dirs.values()):
            os.makedirs(folder, exist_ok=True)

    def check(self) -> None:
        if self.fenced():
            raise Fenced(f"bucket {self.bucket:05d}: lease lost, nothing more is written")

    def _stem(self) -> str:
        """The current WARC's name without suffix (its result files share it); a new IIPC name when none is open.
        The daemon id is the host part, so daemons sharing a bucket folder never pick the same name."""
        if self.current is not None:
            return os.path.basename(self.current.path).removesuffix(WARC_SUFFIX)
        return iipc_stem(f"{self.segment_id}-{self.bucket:05d}", self.wall_time(), self.seq, self.daemon_id)

    def warc(self) -> WarcFile:
        self.check()
        if self.current is None:
            self.current = WarcFile(os.path.join(self.warc_dir, self._stem() + WARC_SUFFIX), self.warcinfo,
                                    self.on_write, self.gzip_level, self.compressor)
            self.current_relpath = os.path.relpath(self.current.path, self.root).replace(os.sep, "/")
        return self.current

    def warc_relpath(self) -> str:
        """The current WARC's final name relative to the storage root (what result rows store)."""
        self.warc()
        return self.current_relpath

    def add(self, kind: str, row: dict[str, Any], logged: bool) -> None:
        """Queue a result row for publishing; `logged` rows (those that cost a request) also go into the WARC,
        queued to its writer after the records the row points at (the publish that follows syncs it first)."""
        self.check()
        if logged:
            date = row["fetched_at"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            warc = self.warc()
            warc.log(warc.result_record(row.get("url") or row["host_key"], date, kind,
                                        records.row_to_json(row, RESULT_KINDS[kind])))
        if self.pending_since is None:
            self.pending_since = self.monotonic()
        self.pending[kind].append(row)

    def after_result(self) -> None:
        """Rotate a full WARC; publish a full batch of rows, or rows that have waited long enough."""
        if self.current is not None and self.current.reached(self.warc_max_bytes):
            self.close_current()
        elif sum(map(len, self.pending.values())) >= self.batch_rows:
            self.publish()
        else:
            self.publish_if_due()

    def publish_if_due(self) -> None:
        """Publish the queued rows when the oldest has waited `publish_after_s` (the bucket's driver asks this
        between results too, so a lull does not hold rows back)."""
        if self.pending_since is not None and self.monotonic() - self.pending_since >= self.publish_after_s:
            self.publish()

    def publish(self) -> None:
        """Sync the WARC, then publish the queued rows (they only point at records written before the sync)."""
        self.check()
        if not any(self.pending.values()):
            return
        if self.current is not None:
            self.current.sync()
        current = self._stem()
        for kind, rows in self.pending.items():
            for stem, group in _by_warc(rows, current).items():
                # Asked again right before each file (the sync above can take long): a plain file system cannot
                # make the check and the write one step, so the window where a lapsed lease still writes is kept
                # to one small file.
                self.check()
                path = os.path.join(self.dirs[kind], f"{stem}-r{self.batch:04d}.parquet")
                write_parquet_atomic(group, RESULT_KINDS[kind], path)
        self.batch += 1
        self.pending = {kind: [] for kind in RESULT_KINDS}
        self.pending_since = None
        self.on_publish()

    def close_current(self) -> None:
        """Publish what is queued, then close the WARC durably under its final name (rows published before
        the rename name the final file, and a crash in between leaves an `*.open` file recovery renames)."""
        self.publish()
        if self.current is not None:
            self.check()
            if self.current.records:
                self.current.close()
                self.warc_files += 1
                self.warc_bytes += self.current.size
            else:
                self.current.discard()
            self.current = None
            self.on_publish()
        self.seq += 1

    def abandon(self) -> None:
        """Stop writing (the lease is lost): the `*.open` file and its rows are left for the next owner."""
        if self.current is not None:
            self.current.abandon()
            self.current = None
        self.pending = {kind: [] for kind in RESULT_KINDS}
        self.pending_since = None
