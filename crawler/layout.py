"""The storage layout under a root — a contract that analysts, the DAG and the daemons rely on.

    ROOT/tables/<name>                                     Delta tables (see delta_tables/)
    ROOT/segments/<segment_id>/fetchlist/bucket=NNNNN/     fetch list Parquet, written by generate
    ROOT/segments/<segment_id>/warc/bucket=NNNNN/          *.warc.gz (written as *.warc.gz.open, renamed when closed)
    ROOT/segments/<segment_id>/fetched/bucket=NNNNN/       fetched-results Parquet + _DONE.json bucket manifest
    ROOT/segments/<segment_id>/robots/bucket=NNNNN/        robots.txt observations Parquet
    ROOT/segments/<segment_id>/cdxj/bucket=NNNNN/          <warc name>.cdxj: one CDXJ file per closed WARC file
                                                           (written by `crawl index`)
    ROOT/segments/<segment_id>/wet/bucket=NNNNN/           <warc name without .warc.gz>.warc.wet.gz: the extracted text
                                                           of the WARC file's HTML pages (WET), one per WARC file parse
                                                           read (written by `crawl parse`; _parts/: its tasks' pieces
                                                           while it runs)
    ROOT/segments/<segment_id>/_CLOSED.json                the cycle stopped waiting for the segment (its fetch
                                                           deadline): no daemon starts or goes on with its buckets
    ROOT/segments/<segment_id>/_GENERATING.json            generate has not published the segment yet: every reader
                                                           takes it for absent
    ROOT/locks/writer/epoch-NNNNNNNNNN.json                the crawl's writer lock (crawler.writelock)
    ROOT/_gate.json                                        the quality gate is closed: the tables and expectations
                                                           that failed validation (crawler.gate); absent: open

CDXJ and WET files live in their own folders, not next to the WARC files: the daemon owns its warc/ folder (its resume
removes and renames files there), and a replay tool can be pointed at cdxj/ alone. The WARC paths a CDXJ line
names (`filename`) are relative to ROOT, like every `warc_filename` column.

`_CLOSED.json` (closed_at, reason, the buckets unfinished then) is written by the scheduler when it goes on
without the segment's unfinished buckets (`fetchd.progress.close_segment`). A daemon fetching one of them stops
it as on SIGTERM (results so far published, lease released, no `_DONE.json`); its URLs come back to generate
when their leases expire.

`_GENERATING.json` is written by generate before the segment's first file and removed (the segment published)
only once the segment's leases are committed: a fetch list whose lease commit failed or never came is never
fetched. A reader lists first and looks for the marker after (the marker is written before anything it hides, so
what a reader listed while the marker is absent was published). Leftovers of a generate that crashed keep the
marker; the next generate (holding the writer lock) removes them.

Paths are plain strings joined with "/" so the same code serves local folders and s3:// roots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from crawler.errors import BadName, UnknownSegment, UserError

TABLES = ("urls", "hosts", "fetches", "pages", "links", "index_events", "segments", "records", "dedup_hashes",
          "dedup_bands", "cycle_metrics")
BUCKET_DIR = re.compile(r"^bucket=(\d{5})$")
DONE_MANIFEST = "_DONE.json"
CLOSED_MARKER = "_CLOSED.json"
CRAWL_RECORD = "_crawl.json"
GENERATING_MARKER = "_GENERATING.json"
GATE_RECORD = "_gate.json"
# A segment id names a folder and goes into SQL predicates: letters, digits, '_', '.', '-', starting with a letter or
# digit (so never '.', '..', a hidden name or an option), at most 128 characters.
SEGMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
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


def check_table_name(name: str) -> str:
    """The name itself, or BadName: only the engine's own tables have paths."""
    if name not in TABLES:
        raise BadName(f"unknown table {name!r} (tables: {', '.join(TABLES)})")
    return name


def table_path(root: str, name: str) -> str:
    return join(root, "tables", check_table_name(name))


def segments_dir(root: str) -> str:
    return join(root, "segments")


def check_segment_id(segment_id: str) -> str:
    """The id itself, or BadName: an id that could escape its folder or a replaceWhere clause is refused. Every
    path of a segment is built through `segment_dir`, so no path is ever made from an unchecked id."""
    if not isinstance(segment_id, str) or not SEGMENT_ID.match(segment_id):
        raise BadName(f"invalid segment id {segment_id!r}: use 1-128 letters, digits, '_', '.' or '-', "
                      "starting with a letter or digit")
    return segment_id


def segment_ids(names: Iterable[str]) -> list[str]:
    """The names in a listing of ROOT/segments that are segment ids, sorted (anything else there, such as a
    hidden or temporary folder, is not a segment)."""
    return sorted(name for name in names if SEGMENT_ID.match(name))


def require_segment(segment_id: str, root: str, listing: Iterable[str]) -> str:
    """The id itself when `listing` (the names in ROOT/segments) holds it, else UnknownSegment naming the segments
    that do exist: a command on a mistyped segment is an error, not an empty run."""
    existing = segment_ids(listing)
    if check_segment_id(segment_id) not in existing:
        raise UnknownSegment(segment_id, root, existing)
    return segment_id


def segment_dir(root: str, segment_id: str) -> str:
    return join(root, "segments", check_segment_id(segment_id))


def _nearest_existing(path: str) -> str:
    """`path` or its nearest ancestor that exists (absolute)."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def check_local_folder(path: str, what: str) -> str:
    """The path itself, or UserError when it cannot be a local folder: it is a file, or a file stands where one of
    its parents should be. (An s3:// path is not checked: S3 has no files in the way.)"""
    if is_s3(path):
        return path
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        blocker = "it is" if existing == os.path.abspath(path) else f"{existing} is"
        raise UserError(f"{what} {path}: {blocker} not a folder")
    return path


def check_output_file(path: str, what: str) -> str:
    """The path itself, or UserError when a file cannot be written there: it is a folder, or a file stands where
    one of its parents should be."""
    if is_s3(path):
        return path
    if os.path.isdir(path):
        raise UserError(f"{what} {path}: it is a folder, not a file")
    existing = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(existing):
        raise UserError(f"{what} {path}: {existing} is not a folder")
    return path


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


def wet_dir(root: str, segment_id: str) -> str:
    return join(segment_dir(root, segment_id), "wet")


def wet_filename(warc_filename: str) -> str:
    """The WET file of a WARC file, both relative to the root, named as Common Crawl names them:
    segments/<id>/warc/bucket=NNNNN/<name>.warc.gz -> segments/<id>/wet/bucket=NNNNN/<name>.warc.wet.gz."""
    parts = warc_filename.split("/")
    if len(parts) != 5 or parts[0] != "segments" or parts[2] != "warc" or parse_bucket_dirname(parts[3]) is None:
        raise ValueError(f"not a segment WARC path: {warc_filename!r}")
    stem = parts[4].removesuffix(".gz").removesuffix(".warc")
    return "/".join([parts[0], parts[1], "wet", parts[3], stem + ".warc.wet.gz"])


def wet_part_filename(warc_filename: str, first_offset: int) -> str:
    """One parse task's conversion records of a WARC file, from the record at `first_offset` on, relative to the
    root: segments/<id>/wet/_parts/bucket=NNNNN/<name>.<offset, 15 digits>. Parse joins a file's parts, in
    offset order, into its WET file and removes them."""
    wet = wet_filename(warc_filename).split("/")
    warc_name = warc_filename.rsplit("/", 1)[1]
    return "/".join([*wet[:3], WET_PARTS, wet[3], f"{warc_name}.{first_offset:015d}"])


WET_PARTS = "_parts"


def done_manifest(root: str, segment_id: str, bucket: int) -> str:
    return join(fetched_dir(root, segment_id, bucket), DONE_MANIFEST)


def crawl_record(root: str) -> str:
    """`_crawl.json`: the bucketing a crawl was started with (crawler.bucketing)."""
    return join(root, CRAWL_RECORD)


def gate_record(root: str) -> str:
    """`_gate.json`: what holds the quality gate closed (crawler.gate)."""
    return join(root, GATE_RECORD)


def closed_marker(root: str, segment_id: str) -> str:
    return join(segment_dir(root, segment_id), CLOSED_MARKER)


def generating_marker(root: str, segment_id: str) -> str:
    return join(segment_dir(root, segment_id), GENERATING_MARKER)


def writer_lock_dir(root: str) -> str:
    return join(root, "locks", "writer")


def parse_bucket_dirname(name: str) -> int | None:
    match = BUCKET_DIR.match(name)
    return int(match.group(1)) if match else None
