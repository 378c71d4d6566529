"""The storage layout under a root — a contract that analysts, the DAG and the daemons rely on.

    ROOT/tables/<name>                                     Delta tables (see delta_tables/)
    ROOT/segments/<segment_id>/fetchlist/bucket=NNNNN/     fetch list Parquet, written by generate
    ROOT/segments/<segment_id>/warc/bucket=NNNNN/          *.warc.gz (written as *.warc.gz.open, renamed when closed)
    ROOT/segments/<segment_id>/fetched/bucket=NNNNN/       fetched-results Parquet + _DONE.json bucket manifest
    ROOT/segments/<segment_id>/robots/bucket=NNNNN/        robots.txt observations Parquet
    ROOT/segments/<segment_id>/cdxj/bucket=NNNNN/          <warc name>.cdxj: one CDXJ file per closed WARC file
                                                           (written by `crawl index`)
    ROOT/segments/<segment_id>/_CLOSED.json                the cycle stopped waiting for the segment (its fetch
                                                           deadline): no daemon starts or goes on with its buckets

CDXJ files live in their own folder, not next to the WARC files: the daemon owns its warc/ folder (its resume
removes and renames files there), and a replay tool can be pointed at cdxj/ alone. The WARC paths a CDXJ line
names (`filename`) are relative to ROOT, like every `warc_filename` column.

`_CLOSED.json` (closed_at, reason, the buckets unfinished then) is written by the scheduler when it goes on
without the segment's unfinished buckets (`fetchd.progress.close_segment`). A daemon fetching one of them stops
it as on SIGTERM (results so far published, lease released, no `_DONE.json`); its URLs come back to generate
when their leases expire.

Paths are plain strings joined with "/" so the same code serves local folders and s3:// roots.
"""

from __future__ import annotations

import os
import re

TABLES = ("urls", "hosts", "fetches", "pages", "links", "index_events", "segments", "records")
BUCKET_DIR = re.compile(r"^bucket=(\d{5})$")
DONE_MANIFEST = "_DONE.json"
CLOSED_MARKER = "_CLOSED.json"
SEGMENT_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")  # a segment id names a folder and goes into SQL predicates
OPEN_SUFFIX = ".open"


def normalize_root(root: str) -> str:
    """Absolute local path, or an s3:// URI unchanged; never a trailing slash."""
    if "://" in root:
        return root.rstrip("/")
    return os.path.abspath(os.path.expanduser(root))


def is_s3(root: str) -> bool:
    """An S3 root (s3://bucket/prefix, or s3a://), as opposed to a local folder."""
    return root.startswith(("s3://", "s3a://"))


def join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


def table_path(root: str, name: str) -> str:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}")
    return join(root, "tables", name)


def segments_dir(root: str) -> str:
    return join(root, "segments")


def check_segment_id(segment_id: str) -> str:
    """The id itself, or ValueError: jobs refuse an id that could escape its folder or a replaceWhere clause."""
    if not SEGMENT_ID.match(segment_id):
        raise ValueError(f"invalid segment id {segment_id!r}")
    return segment_id


def segment_dir(root: str, segment_id: str) -> str:
    return join(root, "segments", segment_id)


def bucket_dirname(bucket: int) -> str:
    return f"bucket={bucket:05d}"


def fetchlist_dir(root: str, segment_id: str, bucket: int | None = None) -> str:
    base = join(segment_dir(root, segment_id), "fetchlist")
    return base if bucket is None else join(base, bucket_dirname(bucket))


def warc_dir(root: str, segment_id: str, bucket: int | None = None) -> str:
    base = join(segment_dir(root, segment_id), "warc")
    return base if bucket is None else join(base, bucket_dirname(bucket))


def fetched_dir(root: str, segment_id: str, bucket: int | None = None) -> str:
    base = join(segment_dir(root, segment_id), "fetched")
    return base if bucket is None else join(base, bucket_dirname(bucket))


def robots_dir(root: str, segment_id: str, bucket: int | None = None) -> str:
    base = join(segment_dir(root, segment_id), "robots")
    return base if bucket is None else join(base, bucket_dirname(bucket))


def cdxj_filename(warc_filename: str) -> str:
    """The CDXJ file of a WARC file, both relative to the root: segments/<id>/warc/bucket=NNNNN/<name> ->
    segments/<id>/cdxj/bucket=NNNNN/<name>.cdxj."""
    parts = warc_filename.split("/")
    if len(parts) != 5 or parts[0] != "segments" or parts[2] != "warc" or parse_bucket_dirname(parts[3]) is None:
        raise ValueError(f"not a segment WARC path: {warc_filename!r}")
    return "/".join([parts[0], parts[1], "cdxj", parts[3], parts[4] + ".cdxj"])


def done_manifest(root: str, segment_id: str, bucket: int) -> str:
    return join(fetched_dir(root, segment_id, bucket), DONE_MANIFEST)


def closed_marker(root: str, segment_id: str) -> str:
    return join(segment_dir(root, segment_id), CLOSED_MARKER)


def parse_bucket_dirname(name: str) -> int | None:
    match = BUCKET_DIR.match(name)
    return int(match.group(1)) if match else None
