"""Where a daemon's files live: a local root, or an s3:// root reached through a local staging folder.

`LocalStore` is the daemon as it always was: files are written in place under ROOT (WARC `*.open` renamed on close,
Parquet and `_DONE.json` written under a temp name and renamed, leases hard-linked into place).

`S3Store` keeps that code path unchanged on a staging folder (`fetch.staging_dir`/<s3 bucket>/<prefix>, laid out
like ROOT) and uploads each file once it is *published* there, to the same relative key under the S3 root. S3 has
no rename, so the local guarantees become upload order, kept by one uploader thread:

* a closed WARC file goes up first (multipart past `s3.multipart_threshold_bytes`), then its local copy is removed;
* a result Parquet file (fetched or robots; named `<warc stem>-...parquet`, its rows point into that WARC only)
  goes up only once its WARC object exists, or when no such WARC exists (rows without records). Locally such rows
  may name a `*.open` file not yet renamed; on S3 they are held back instead, so no object names a missing WARC;
* `_DONE.json` goes up last, after every file of the bucket: who sees the manifest sees the whole bucket.

Results and the manifest are not uploaded once the bucket's lease is fenced (the next owner decides from S3).
A bucket's staging copy is trusted on resume only when it holds every result file already on S3 (this machine
was the last to work on it); otherwise it is dropped and the S3 results are downloaded, so a bucket moves between
machines without double reports. What only the staging folder held (an `*.open` WARC of a dead machine) is lost
with it and fetched again. Fetch lists are downloaded into the staging folder before a bucket starts.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

from crawler import layout
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config, s3_endpoint
from fetchd.output import Fenced, write_json_atomic
from fetchd.ownership import LeaseStore, S3LeaseStore, s3_errors
from fetchd.warc import WARC_SUFFIX

log = logging.getLogger("fetchd.storage")

_BUCKET_DIRS = (layout.warc_dir, layout.fetched_dir, layout.robots_dir)


def _is_data_file(name: str) -> bool:
    """A published Parquet file (Spark's `_SUCCESS`, temp and hidden files are not)."""
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def _warc_stem(result_name: str) -> str:
    """`<stem>-r0003.parquet` / `<stem>-recovered.parquet` -> the stem of the WARC file its rows point into."""
    return result_name.rsplit("-", 1)[0]


def _not_found(exc: OSError) -> bool:
    """Whether an S3 error (as `s3_errors` raises it) says the object does not exist."""
    from botocore.exceptions import ClientError

    cause = exc.__cause__
    return isinstance(cause, ClientError) and cause.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound")


class LocalStore:
    """Files written in place under a local root; nothing to upload."""

    def __init__(self, root: str):
        self.root = self.local_root = root

    def segments(self) -> list[str]:
        folder = layout.segments_dir(self.root)
        return layout.segment_ids(os.listdir(folder)) if os.path.isdir(folder) else []

    def fetchlist_buckets(self, segment_id: str) -> list[int]:
        folder = layout.fetchlist_dir(self.root, segment_id)
        if not os.path.isdir(folder):
            return []
        return sorted(b for b in map(layout.parse_bucket_dirname, os.listdir(folder)) if b is not None)

    def is_done(self, segment_id: str, bucket: int) -> bool:
        return os.path.exists(layout.done_manifest(self.root, segment_id, bucket))

    def is_closed(self, segment_id: str) -> bool:
        return os.path.exists(layout.closed_marker(self.root, segment_id))

    def is_generating(self, segment_id: str) -> bool:
        """Generate has not published the segment yet (crawler.layout: `_GENERATING.json`)."""
        return os.path.exists(layout.generating_marker(self.root, segment_id))

    def close_segment(self, segment_id: str, payload: dict[str, Any]) -> None:
        """Write the segment's `_CLOSED.json` (atomically: a reader sees all of it or nothing)."""
        folder = layout.segment_dir(self.root, segment_id)
        os.makedirs(folder, exist_ok=True)
        write_json_atomic(payload, layout.closed_marker(self.root, segment_id))

    def lease_store(self, conf: Config, owner: str, clock: Clock = SYSTEM_CLOCK) -> LeaseStore:
        return LeaseStore(conf, self.root, owner, clock)

    def crawl_record(self) -> dict[str, Any] | None:
        """The root's `_crawl.json` (crawler.bucketing), None before any job wrote one."""
        path = layout.crawl_record(self.root)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)

    def prepare_bucket(self, segment_id: str, bucket: int) -> None:
        """Make the local copy of the bucket current before its recovery and run (nothing to do here)."""

    def sync_bucket(self, segment_id: str, bucket: int, fenced: Callable[[], bool]) -> None:
        """Files were published locally: upload what may go up now, in the background (nothing to do here)."""

    def upload_bucket(self, segment_id: str, bucket: int, fenced: Callable[[], bool], manifest: bool = False) -> None:
        """Upload every published file of the bucket now, the manifest last when `manifest` (nothing here)."""

    def warc_sizes(self, segment_id: str, bucket: int) -> list[int]:
        folder = layout.warc_dir(self.root, segment_id, bucket)
        if not os.path.isdir(folder):
            return []
        return [os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(WARC_SUFFIX)]

    def close(self) -> None:
        pass


def s3_client(conf: Config) -> Any:
    """A boto3 S3 client: the endpoint of crawler.config.s3_endpoint, `s3.region`, path-style addressing
    when `s3.path_style_access`; credentials from the AWS default chain."""
    import boto3
    from botocore.config import Config as BotoConfig

    endpoint = s3_endpoint(conf) or None
    addressing = "path" if conf.s3.path_style_access else "auto"
    return boto3.client("s3", endpoint_url=endpoint, region_name=conf.s3.region,
                        config=BotoConfig(s3={"addressing_style": addressing}, retries={"mode": "standard"}))


def split_s3_root(root: str) -> tuple[str, str]:
    """s3://bucket/some/prefix (or s3a://) -> ("bucket", "some/prefix")."""
    bucket, _, prefix = root.split("://", 1)[1].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in S3 root {root!r}")
    return bucket, prefix.strip("/")


def default_staging_dir() -> str:
    """Survives a reboot (unlike most temp folders), so open WARC files can still be recovered after one."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cyclecrawl", "staging")


class S3Store(LocalStore):
    """An s3:// root: the daemon writes under a staging folder, published files are uploaded (module docstring)."""

    def __init__(self, conf: Config, root: str, client: Any | None = None):
        from boto3.s3.transfer import TransferConfig

        self.root = root
        self.bucket, self.prefix = split_s3_root(root)
        staging = os.path.abspath(os.path.expanduser(conf.fetch.staging_dir or default_staging_dir()))
        self.local_root = os.path.join(staging, self.bucket, *self.prefix.split("/")) if self.prefix \
            else os.path.join(staging, self.bucket)
        self.client = client or s3_client(conf)
        self.transfer = TransferConfig(multipart_threshold=conf.s3.multipart_threshold_bytes,
                                       multipart_chunksize=conf.s3.multipart_chunk_bytes)
        self._uploader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="s3-upload")  # one: in order
        self._lock = threading.Lock()
        self._uploaded: dict[tuple[str, int], set[str]] = {}  # keys (relative to the root) known to be on S3
        self._sync_queued: set[tuple[str, int]] = set()

    # --- keys and listings --------------------------------------------------------------------------------

    def key(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def _relative(self, path: str) -> str:
        """A path under the local root -> its key relative to the root."""
        return os.path.relpath(path, self.local_root).replace(os.sep, "/")

    def _list(self, relprefix: str, delimiter: str | None = None) -> list[dict[str, Any]]:
        """Objects (Key relative to the root, Size) under a relative prefix; with a delimiter, the sub-prefix
        names as {"Prefix": name} entries instead of the objects below them."""
        prefix = self.key(relprefix.rstrip("/") + "/")
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            args["Delimiter"] = delimiter
        found: list[dict[str, Any]] = []
        with s3_errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(**args):
                found += [{"Key": relprefix.rstrip("/") + "/" + o["Key"][len(prefix):], "Size": o["Size"]}
                          for o in page.get("Contents", [])]
                found += [{"Prefix": p["Prefix"][len(prefix):].rstrip("/")} for p in page.get("CommonPrefixes", [])]
        return found

    def segments(self) -> list[str]:
        return layout.segment_ids(e["Prefix"] for e in self._list("segments", "/") if "Prefix" in e)

    def fetchlist_buckets(self, segment_id: str) -> list[int]:
        names = [e["Prefix"] for e in self._list(self._relative(layout.fetchlist_dir(self.local_root, segment_id)), "/")
                 if "Prefix" in e]
        return sorted(b for b in map(layout.parse_bucket_dirname, names) if b is not None)

    def _exists(self, local_path: str) -> bool:
        """Whether the object of a path under the local root exists on S3 (one HEAD)."""
        try:
            with s3_errors():
                self.client.head_object(Bucket=self.bucket, Key=self.key(self._relative(local_path)))
        except OSError as exc:
            if _not_found(exc):
                return False
            raise
        return True

    def is_done(self, segment_id: str, bucket: int) -> bool:
        return self._exists(layout.done_manifest(self.local_root, segment_id, bucket))

    def crawl_record(self) -> dict[str, Any] | None:
        """The root's `_crawl.json` (crawler.bucketing), None before any job wrote one (one GET)."""
        try:
            with s3_errors():
                body = self.client.get_object(Bucket=self.bucket, Key=self.key(layout.CRAWL_RECORD))["Body"].read()
        except OSError as exc:
            if _not_found(exc):
                return None
            raise
        return json.loads(body)

    def is_closed(self, segment_id: str) -> bool:
        return self._exists(layout.closed_marker(self.local_root, segment_id))

    def is_generating(self, segment_id: str) -> bool:
        return self._exists(layout.generating_marker(self.local_root, segment_id))

    def close_segment(self, segment_id: str, payload: dict[str, Any]) -> None:
        """Put the segment's `_CLOSED.json` (a PUT is atomic on S3)."""
        relkey = self._relative(layout.closed_marker(self.local_root, segment_id))
        with s3_errors():
            self.client.put_object(Bucket=self.bucket, Key=self.key(relkey), ContentType="application/json",
                                   Body=json.dumps(payload, indent=2, sort_keys=True).encode("utf-8"))

    def lease_store(self, conf: Config, owner: str, clock: Clock = SYSTEM_CLOCK) -> LeaseStore:
        return S3LeaseStore(conf, self.root, owner, self.client, self.bucket, self.prefix, clock)

    def warc_sizes(self, segment_id: str, bucket: int) -> list[int]:
        folder = self._relative(layout.warc_dir(self.local_root, segment_id, bucket))
        return [e["Size"] for e in self._list(folder) if e["Key"].endswith(WARC_SUFFIX)]

    # --- staging <-> S3 -----------------------------------------------------------------------------------

    def _run(self, job: Callable[[], None]) -> None:
        """Run `job` on the uploader thread after everything queued before it; S3 errors become OSError, so the
        daemon treats them like a failing disk (pause the bucket, retry)."""
        with s3_errors():
            self._uploader.submit(job).result()

    def prepare_bucket(self, segment_id: str, bucket: int) -> None:
        self._run(lambda: self._prepare(segment_id, bucket))

    def _prepare(self, segment_id: str, bucket: int) -> None:
        fetchlist = layout.fetchlist_dir(self.local_root, segment_id, bucket)
        os.makedirs(fetchlist, exist_ok=True)
        for entry in self._list(self._relative(fetchlist)):
            name = entry["Key"].rsplit("/", 1)[1]
            local = os.path.join(fetchlist, name)
            if _is_data_file(name) and not (os.path.exists(local) and os.path.getsize(local) == entry["Size"]):
                self._download(entry["Key"], local)
        bucket_dirs = [folder(self.local_root, segment_id, bucket) for folder in _BUCKET_DIRS]
        on_s3 = {e["Key"] for folder in bucket_dirs for e in self._list(self._relative(folder))}
        results_on_s3 = {k for k in on_s3 if _is_data_file(k.rsplit("/", 1)[1])}
        if any(not os.path.exists(os.path.join(self.local_root, k)) for k in results_on_s3):
            if any(_files(folder) for folder in bucket_dirs):
                log.info("bucket %05d of %s: staging copy is behind S3 (another daemon worked on it); dropping it",
                         bucket, segment_id)
                for folder in bucket_dirs:
                    shutil.rmtree(folder, ignore_errors=True)
            for key in sorted(results_on_s3):
                self._download(key, os.path.join(self.local_root, key))
        with self._lock:
            self._uploaded[(segment_id, bucket)] = on_s3

    def _download(self, relkey: str, local: str) -> None:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        tmp = os.path.join(os.path.dirname(local), "." + os.path.basename(local) + ".tmp")
        self.client.download_file(self.bucket, self.key(relkey), tmp)
        os.replace(tmp, local)

    def sync_bucket(self, segment_id: str, bucket: int, fenced: Callable[[], bool]) -> None:
        with self._lock:
            if (segment_id, bucket) in self._sync_queued:
                return  # one queued pass uploads whatever is published by the time it runs
            self._sync_queued.add((segment_id, bucket))
        self._uploader.submit(self._background_sync, segment_id, bucket, fenced)

    def _background_sync(self, segment_id: str, bucket: int, fenced: Callable[[], bool]) -> None:
        with self._lock:
            self._sync_queued.discard((segment_id, bucket))
        try:
            self._upload(segment_id, bucket, fenced)
        except Exception as exc:  # left for the next pass; the bucket's end (`upload_bucket`) raises it
            log.warning("bucket %05d of %s: upload failed, retried later: %s", bucket, segment_id, exc)

    def upload_bucket(self, segment_id: str, bucket: int, fenced: Callable[[], bool], manifest: bool = False) -> None:
        self._run(lambda: self._upload(segment_id, bucket, fenced, manifest))

    def _upload(self, segment_id: str, bucket: int, fenced: Callable[[], bool], manifest: bool = False) -> None:
        """One pass over the bucket's staging folders, in the order of the module docstring."""
        with self._lock:
            uploaded = self._uploaded.setdefault((segment_id, bucket), set())
        warc_dir = layout.warc_dir(self.local_root, segment_id, bucket)
        for path in _files(warc_dir):
            if path.endswith(WARC_SUFFIX):
                relkey = self._relative(path)
                if relkey not in uploaded:
                    self.client.upload_file(path, self.bucket, self.key(relkey), Config=self.transfer)
                    log.debug("uploaded %s", relkey)
                    uploaded.add(relkey)
                os.remove(path)  # on S3 now; the staging folder holds only what is being written
        for folder in (layout.fetched_dir, layout.robots_dir):
            for path in _files(folder(self.local_root, segment_id, bucket)):
                name, relkey = os.path.basename(path), self._relative(path)
                if not _is_data_file(name) or relkey in uploaded:
                    continue
                warc = os.path.join(warc_dir, _warc_stem(name) + WARC_SUFFIX)
                if self._relative(warc) not in uploaded and (os.path.exists(warc + layout.OPEN_SUFFIX)
                                                              or os.path.exists(warc)):
                    continue  # its WARC is still open, or closed and not uploaded yet: the next pass
                if fenced():
                    return
                self._put(path, relkey)
                uploaded.add(relkey)
        if manifest:
            if fenced():
                raise Fenced(f"bucket {bucket:05d}: lease lost, manifest not uploaded")
            path = layout.done_manifest(self.local_root, segment_id, bucket)
            self._put(path, self._relative(path))
            for folder in (*_BUCKET_DIRS, layout.fetchlist_dir):
                shutil.rmtree(folder(self.local_root, segment_id, bucket), ignore_errors=True)
            with self._lock:
                self._uploaded.pop((segment_id, bucket), None)

    def _put(self, path: str, relkey: str) -> None:
        with open(path, "rb") as fh:
            self.client.put_object(Bucket=self.bucket, Key=self.key(relkey), Body=fh.read())
        log.debug("uploaded %s", relkey)

    def close(self) -> None:
        """Wait for the uploads queued so far (a clean stop leaves nothing half-sent that could have gone up)."""
        self._uploader.shutdown(wait=True)


def _files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)) if os.path.isdir(folder) else []


def open_store(conf: Config, root: str) -> LocalStore:
    """The store of a normalized root: S3 for s3:// and s3a://, else the local folder itself."""
    return S3Store(conf, root) if layout.is_s3(root) else LocalStore(root)
