"""Fetch lists as generate writes them, and what a daemon wrote back: result rows, files, WARC records."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from fastwarc.warc import ArchiveIterator

from crawler import layout, records, urls
from crawler.bucketing import Bucketing


def write_fetchlist(root: str, segment_id: str, items: list[dict], buckets: int,
                    bucketing: Bucketing | None = None) -> dict[int, list[dict]]:
    """Fetch-list Parquet per bucket, as generate writes it (sorted by host then rank), bucketed by host name (or
    by `bucketing`), and published as generate publishes it: under `_GENERATING.json` until every file is written,
    so a daemon already polling the root never reads a bucket's folder before its file. Items: url, etag,
    last_modified, delay_s and max_concurrency (the host's limits: none unless given), last_fetch_at, the stored
    payload (`records.FETCHLIST_STORED`), and robots
    (the stored robots.txt generate hands over on a host's first row: status_code, body, fetched_at, expires_at)."""
    bucket_of = (bucketing or Bucketing(buckets)).bucket
    by_bucket: dict[int, list[dict]] = {}
    ranks: Counter[str] = Counter()
    for item in items:
        url = urls.canonicalize(item["url"])
        key = urls.host_key(url)
        ranks[key] += 1
        row = {
            "segment_id": segment_id, "url_id": urls.url_id(url), "url": url, "host_key": key,
            "state_version": 1, "rank": ranks[key], "priority": 1.0, "depth": 0,
            "etag": item.get("etag"), "last_modified": item.get("last_modified"), "delay_s": item.get("delay_s"),
            "max_concurrency": item.get("max_concurrency"),
            "last_fetch_at": item.get("last_fetch_at"),
            **{f"robots_{k}": v for k, v in item.get("robots", {}).items()},
            **{name: item.get(name) for name in records.FETCHLIST_STORED},
        }
        by_bucket.setdefault(bucket_of(key), []).append(row)
    marker = Path(layout.generating_marker(root, segment_id))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("{}")
    for bucket, rows in by_bucket.items():
        folder = layout.fetchlist_dir(root, segment_id, bucket)
        os.makedirs(folder, exist_ok=True)
        rows.sort(key=lambda r: (r["host_key"], r["rank"]))
        pq.write_table(pa.Table.from_pylist(rows, schema=records.FETCHLIST), os.path.join(folder, "part-00000.parquet"))
        Path(folder, "_SUCCESS").touch()  # Spark's marker must be ignored
    marker.unlink()
    return by_bucket


def read_results(root: str, segment_id: str, kind: str = "fetched") -> list[dict]:
    """Every published row of a segment's fetched (or robots) files, with the file it came from in `_file`."""
    base = layout.fetched_dir(root, segment_id) if kind == "fetched" else layout.robots_dir(root, segment_id)
    rows: list[dict] = []
    for folder, _, names in os.walk(base):
        for name in sorted(names):
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                for row in pq.read_table(os.path.join(folder, name)).to_pylist():
                    row["_file"] = os.path.join(folder, name)
                    rows.append(row)
    return rows


def by_url(rows: list[dict]) -> dict[str, dict]:
    return {row["url"]: row for row in rows}


def files_under(path: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names}


def record_at(root: str, filename: str, offset: int):
    """The first WARC record at `offset`, read by fastwarc, with its HTTP headers parsed."""
    with open(os.path.join(root, filename), "rb") as fh:
        fh.seek(offset)
        record = next(iter(ArchiveIterator(fh, parse_http=True)))
        record.freeze()
        return record


def write_parquet(folder: str, rows: list[dict], schema: pa.Schema) -> None:
    """Rows as one Parquet part file in `folder` (a bucket's fetched or robots folder, say)."""
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), os.path.join(folder, "part-00000.parquet"))


def result_row(segment_id: str, url: str, at, outcome: str, code: int | None, version: int = 1, buckets: int = 4,
               **extra) -> dict:
    """One fetched-results row as a daemon reports it, pointing into a WARC file of the segment."""
    key = urls.host_key(url)
    return {"segment_id": segment_id, "bucket": urls.bucket_of(key, buckets), "url_id": urls.url_id(url),
            "state_version": version, "url": url, "host_key": key, "fetched_at": at, "outcome": outcome,
            "status_code": code, "warc_filename": f"segments/{segment_id}/warc/x.warc.gz", "warc_offset": 100,
            "warc_length": 50, **extra}
