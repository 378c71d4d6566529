"""Bucket leases on the storage root (the rule is `crawler.ownership`; this is its file store).

    ROOT/leases/bucket=NNNNN/epoch-NNNNNNNNNN.json

Taking a bucket creates the next epoch's file exclusively (written under a temp name, then hard-linked into
place: `link` fails if the name exists, so exactly one daemon wins an epoch and nobody reads a half-written
file). The owner renews by rewriting its own epoch file; a higher epoch on disk means it lost the bucket.
`S3LeaseStore` keeps the same contract on an s3:// root with conditional writes (see there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from crawler import layout
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config
from crawler.localfiles import write_json_file
from crawler.ownership import (
    LEASES_FOLDER,
    LeaseRecord,
    epoch_filename,
    epoch_of,
    fence_deadline,
    may_take,
    previous_last_end,
)

log = logging.getLogger("fetchd.ownership")

# A conditional PUT that lost: the epoch exists already (412; 409 when a concurrent conditional write is in
# progress) or, for If-Match, was replaced or pruned (412, 404).
_LOST_WRITE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"})
_KEEP_EPOCHS = 3  # older epoch files than the last few are removed when a bucket changes hands
_LATEST_ATTEMPTS = 5  # listings of a bucket's epochs before a read of the highest that keeps missing is an error


def leases_dir(root: str, bucket: int | None = None) -> str:
    base = layout.join(root, LEASES_FOLDER)
    return base if bucket is None else layout.join(base, layout.bucket_dirname(bucket))


def process_space() -> str:
    """This machine boot and pid namespace: two processes can compare pids only when this is the same (a
    container sharing the host name has its own pid namespace). Empty where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _process_is_gone(record: LeaseRecord) -> bool:
    """True only when the holder ran in this machine's pid space and its process no longer exists."""
    here = process_space()
    if (record.hostname != socket.gethostname() or not here or record.process_space != here
            or record.pid <= 0 or record.pid == os.getpid()):
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Lease:
    """A bucket this daemon owns: its epoch record and the monotonic deadline by which it must stop (fencing).

    The daemon renews its leases in a thread (a write and fsync, or an S3 PUT, must not stall the event loop) and
    releases them from the loop: `writing` makes the two take turns, so a release never runs beside a renewal that
    would then overwrite the released record."""

    def __init__(self, record: LeaseRecord, deadline: float, previous_end: float | None,
                 clock: Clock = SYSTEM_CLOCK):
        self.record = record
        self.deadline = deadline
        self.previous_end = previous_end  # wall time the previous owner's last request ended, at the latest
        self.lost = False
        self.clock = clock
        self.writing = threading.Lock()

    @property
    def bucket(self) -> int:
        return self.record.bucket

    def fenced(self, now_mono: float | None = None) -> bool:
        """Must this daemon stop touching the bucket now (lease lost, or not renewed in time)?"""
        return self.lost or (self.clock.monotonic() if now_mono is None else now_mono) >= self.deadline


class LeaseStore:
    """Acquire, renew and release bucket leases for one daemon identity, on `clock` (wall time in the records,
    monotonic time for the fence deadline)."""

    def __init__(self, conf: Config, root: str, owner: str, clock: Clock = SYSTEM_CLOCK):
        self.root = root
        self.clock = clock
        self.owner = owner
        self.ttl_s = conf.ownership.lease_ttl_s
        self.fence_margin_s = conf.ownership.fence_margin_s
        self.grace_s = conf.ownership.takeover_grace_s
        self.hostname = socket.gethostname()

    def _epochs(self, bucket: int) -> list[int]:
        folder = leases_dir(self.root, bucket)
        if not os.path.isdir(folder):
            return []
        return sorted(e for e in map(epoch_of, os.listdir(folder)) if e is not None)

    def _read(self, bucket: int, epoch: int) -> LeaseRecord:
        with open(os.path.join(leases_dir(self.root, bucket), epoch_filename(epoch)), encoding="utf-8") as fh:
            return LeaseRecord.from_json(json.load(fh))

    def latest(self, bucket: int) -> LeaseRecord | None:
        """The record of the bucket's highest epoch, None if it has none. A file gone between the listing and the
        read was pruned because later epochs came meanwhile (a reader paused that long): list again."""
        for _ in range(_LATEST_ATTEMPTS - 1):
            epochs = self._epochs(bucket)
            try:
                return self._read(bucket, epochs[-1]) if epochs else None
            except FileNotFoundError:
                continue
        epochs = self._epochs(bucket)
        return self._read(bucket, epochs[-1]) if epochs else None

    def _write(self, record: LeaseRecord, exclusive: bool) -> bool:
        return write_json_file(leases_dir(self.root, record.bucket), epoch_filename(record.epoch), record.to_json(),
                               exclusive)

    def try_acquire(self, bucket: int) -> Lease | None:
        """Take the bucket if the rule allows it now; None if another daemon holds it or won the race."""
        started = self.clock.monotonic()
        now = self.clock.wall()
        previous = self.latest(bucket)
        dead = previous is not None and _process_is_gone(previous)
        if not may_take(previous, now, self.grace_s, dead):
            return None
        record = LeaseRecord(
            bucket=bucket, epoch=(previous.epoch + 1) if previous else 1, owner=self.owner, hostname=self.hostname,
            pid=os.getpid(), acquired_at=now, expires_at=now + self.ttl_s, process_space=process_space(),
        )
        if not self._write(record, exclusive=True):
            return None
        if self._epochs(bucket)[-1] != record.epoch:
            # `previous` was stale: while this daemon paused, later epochs were taken and this epoch's file was
            # pruned, so its name was free again. A higher epoch owns the bucket; withdraw the stray file.
            self._remove(bucket, record.epoch)
            return None
        self._prune(bucket, record.epoch)
        how = "new" if previous is None else ("released" if previous.released else "expired" if not dead else "dead")
        log.info("took bucket %05d, epoch %d (previous owner: %s, %s)", bucket, record.epoch,
                 previous.owner if previous else "none", how)
        return Lease(record, fence_deadline(started, self.ttl_s, self.fence_margin_s),
                     previous_last_end(previous, now, dead), self.clock)

    def renew(self, lease: Lease) -> bool:
        """Extend the lease; False (and the lease marked lost) if it was not renewed before its deadline or a
        higher epoch exists, or it was released meanwhile."""
        with lease.writing:
            return self._renew(lease)

    def _renew(self, lease: Lease) -> bool:
        if lease.lost:
            return False
        started = self.clock.monotonic()
        if started >= lease.deadline:
            lease.lost = True
            return False
        record = replace(lease.record, expires_at=self.clock.wall() + self.ttl_s)
        written = self._write(record, exclusive=False)
        if not written or self._epochs(lease.bucket)[-1] != record.epoch or self.clock.monotonic() >= lease.deadline:
            lease.lost = True
            log.warning("lost bucket %05d (epoch %d): renewed too late or taken over", lease.bucket, record.epoch)
            return False
        lease.record = record
        lease.deadline = fence_deadline(started, self.ttl_s, self.fence_margin_s)
        return True

    def release(self, lease: Lease, last_request_end: float | None) -> None:
        """Give the bucket up (clean stop): the next daemon may take it at once and keeps the delay after
        `last_request_end` (wall clock). A lease already lost is left alone."""
        with lease.writing:
            if lease.lost or lease.fenced() or self._epochs(lease.bucket)[-1] != lease.record.epoch:
                return
            record = replace(lease.record, released=True, expires_at=self.clock.wall(),
                             last_request_end=last_request_end)
            self._write(record, exclusive=False)
            lease.record, lease.lost = record, True
        log.info("released bucket %05d (epoch %d)", lease.bucket, record.epoch)

    def _remove(self, bucket: int, epoch: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(leases_dir(self.root, bucket), epoch_filename(epoch)))

    def _prune(self, bucket: int, epoch: int) -> None:
        for old in self._epochs(bucket):
            if old <= epoch - _KEEP_EPOCHS:
                self._remove(bucket, old)


@contextlib.contextmanager
def s3_errors() -> Iterator[None]:
    """S3 trouble as OSError: the daemon treats an unreachable lease store like an unreadable disk."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise OSError(f"S3: {exc}") from exc


class S3LeaseStore(LeaseStore):
    """The lease store on an s3:// root: the same keys (ROOT/leases/bucket=NNNNN/epoch-NNNNNNNNNN.json) and rule.

    Taking an epoch is a PUT with If-None-Match: * (S3 answers 412 to all but the first writer, so exactly one
    daemon wins an epoch; a PUT is atomic, so nobody reads half a record). Renewing and releasing overwrite the
    epoch object with If-Match: <the ETag this daemon last wrote>: an object that was replaced or pruned meanwhile
    (412, 404) means the lease is lost, where the local store only finds out by listing. Listing epochs is a
    prefix listing (strongly consistent on S3). Fencing is unchanged: it runs on this daemon's own clock.
    """

    def __init__(self, conf: Config, root: str, owner: str, client: Any, s3_bucket: str, prefix: str,
                 clock: Clock = SYSTEM_CLOCK):
        super().__init__(conf, root, owner, clock)
        self.client, self.s3_bucket, self.prefix = client, s3_bucket, prefix
        self._etags: dict[tuple[int, int], str] = {}  # (bucket, epoch) -> ETag of this daemon's last write

    def _key(self, bucket: int, epoch: int | None = None) -> str:
        folder = layout.join(LEASES_FOLDER, layout.bucket_dirname(bucket))
        relkey = folder + "/" + (epoch_filename(epoch) if epoch is not None else "epoch-")
        return f"{self.prefix}/{relkey}" if self.prefix else relkey

    def _epochs(self, bucket: int) -> list[int]:
        names: list[str] = []
        with s3_errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.s3_bucket,
                                                                              Prefix=self._key(bucket)):
                names += [o["Key"].rsplit("/", 1)[1] for o in page.get("Contents", [])]
        return sorted(e for e in map(epoch_of, names) if e is not None)

    def _read(self, bucket: int, epoch: int) -> LeaseRecord:
        """As the local store: FileNotFoundError when the epoch's object is gone (pruned since it was listed)."""
        from botocore.exceptions import ClientError

        key = self._key(bucket, epoch)
        try:
            with s3_errors():
                body = self.client.get_object(Bucket=self.s3_bucket, Key=key)["Body"].read()
        except OSError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and cause.response["Error"]["Code"] in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"s3://{self.s3_bucket}/{key}") from cause
            raise
        return LeaseRecord.from_json(json.loads(body))

    def _write(self, record: LeaseRecord, exclusive: bool) -> bool:
        from botocore.exceptions import ClientError

        condition: dict[str, str] = {"IfNoneMatch": "*"}
        if not exclusive:
            etag = self._etags.get((record.bucket, record.epoch))
            if etag is None:
                return False
            condition = {"IfMatch": etag}
        try:
            with s3_errors():
                answer = self.client.put_object(Bucket=self.s3_bucket, Key=self._key(record.bucket, record.epoch),
                                                Body=json.dumps(record.to_json()).encode("utf-8"),
                                                ContentType="application/json", **condition)
        except OSError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and cause.response["Error"]["Code"] in _LOST_WRITE_CODES:
                return False
            raise
        self._etags[(record.bucket, record.epoch)] = answer["ETag"]
        return True

    def _remove(self, bucket: int, epoch: int) -> None:
        with s3_errors():
            self.client.delete_object(Bucket=self.s3_bucket, Key=self._key(bucket, epoch))
        self._etags.pop((bucket, epoch), None)
