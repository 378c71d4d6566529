"""The crawl's writer lock on the storage root (the rule is `crawler.writelock`; this is its file store and the
holding of it around a command).

    ROOT/locks/writer/epoch-NNNNNNNNNN.json

The same protocol as the daemons' bucket leases (fetchd/ownership.py): taking the lock creates the next epoch's
file exclusively (local: written under a temporary name, then hard-linked into place, which fails if the name
exists; S3: a PUT with If-None-Match: *, which S3 answers 412 for all but the first writer). The holder renews by
rewriting its own epoch (S3: If-Match the ETag it last wrote) and releases by marking it released; a higher epoch
on the root means it lost the lock.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from crawler import layout
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config
from crawler.errors import CrawlBusy
from crawler.localfiles import write_json_file
from crawler.ownership import may_take
from crawler.writelock import LockRecord, fence_deadline, holder, next_look, refusal, renew_interval
from jobs.storage import Storage

log = logging.getLogger("jobs.writelock")
Job = TypeVar("Job", bound=Callable[..., Any])

_KEEP_EPOCHS = 3  # epoch files older than the last few are removed when the lock changes hands
# A conditional PUT that lost: the epoch exists already (412; 409 while another conditional write is under way)
# or, for If-Match, it was replaced or removed (412, 404).
_LOST_WRITE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"})


def _epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:010d}.json"


def _epoch_of(name: str) -> int | None:
    return int(name[6:16]) if name.startswith("epoch-") and name.endswith(".json") and len(name) == 21 else None


class LockFiles:
    """The lock's epoch files in a local folder."""

    def __init__(self, root: str):
        self.folder = layout.writer_lock_dir(root)

    def epochs(self) -> list[int]:
        names = os.listdir(self.folder) if os.path.isdir(self.folder) else []
        return sorted(e for e in map(_epoch_of, names) if e is not None)

    def read(self, epoch: int) -> LockRecord | None:
        """The epoch's record; None if it was removed meanwhile (pruned by a later holder)."""
        try:
            with open(os.path.join(self.folder, _epoch_name(epoch)), encoding="utf-8") as handle:
                return LockRecord.from_json(json.load(handle))
        except FileNotFoundError:
            return None

    def write(self, record: LockRecord, exclusive: bool) -> bool:
        """Create the epoch's file (exclusive: False if it exists) or replace the holder's own."""
        return write_json_file(self.folder, _epoch_name(record.epoch), record.to_json(), exclusive)

    def remove(self, epoch: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.folder, _epoch_name(epoch)))


class S3LockFiles(LockFiles):
    """The lock's epoch files on an s3:// root, through conditional writes."""

    def __init__(self, root: str, client: Any):
        self.client = client
        self.bucket, _, prefix = root.split("://", 1)[1].partition("/")
        self.prefix = layout.join(prefix.strip("/"), "locks", "writer").strip("/") + "/"
        self._etags: dict[int, str] = {}  # epoch -> ETag of this process's last write

    @contextlib.contextmanager
    def _lost_write(self) -> Iterator[list[bool]]:
        """Yields a flag list that holds False when the conditional write inside lost."""
        from botocore.exceptions import ClientError

        outcome = [True]
        try:
            yield outcome
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in _LOST_WRITE_CODES:
                raise
            outcome[0] = False

    def epochs(self) -> list[int]:
        names: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            names += [entry["Key"].rsplit("/", 1)[1] for entry in page.get("Contents", [])]
        return sorted(e for e in map(_epoch_of, names) if e is not None)

    def read(self, epoch: int) -> LockRecord | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + _epoch_name(epoch))["Body"].read()
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None
            raise
        return LockRecord.from_json(json.loads(body))

    def write(self, record: LockRecord, exclusive: bool) -> bool:
        condition = {"IfNoneMatch": "*"}
        if not exclusive:
            etag = self._etags.get(record.epoch)
            if etag is None:
                return False
            condition = {"IfMatch": etag}
        with self._lost_write() as outcome:
            answer = self.client.put_object(Bucket=self.bucket, Key=self.prefix + _epoch_name(record.epoch),
                                            Body=json.dumps(record.to_json()).encode("utf-8"),
                                            ContentType="application/json", **condition)
            self._etags[record.epoch] = answer["ETag"]
        return outcome[0]

    def remove(self, epoch: int) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + _epoch_name(epoch))
        self._etags.pop(epoch, None)


def lock_files(storage: Storage, root: str) -> LockFiles:
    return S3LockFiles(root, storage.s3_client()) if layout.is_s3(root) else LockFiles(root)


class HeldLock:
    """The lock as its holder has it: the record it last wrote and its fence (monotonic)."""

    def __init__(self, files: LockFiles, record: LockRecord, deadline: float, ttl_s: float, clock: Clock):
        self.files, self.record, self.deadline, self.ttl_s, self.clock = files, record, deadline, ttl_s, clock
        self.lost = False
        self.writing = threading.Lock()  # a renewal and the release take turns

    def check(self, before: str) -> None:
        """Raise CrawlBusy when the lock is lost (taken over, or not renewed in time): the holder must not
        commit `before` (what it was about to do)."""
        if self.lost or self.clock.monotonic() >= self.deadline:
            self.lost = True
            raise CrawlBusy(f"lost the crawl's writer lock (not renewed in time, or taken over) before {before}; "
                            "nothing of it was committed: run again")

    def renew(self) -> bool:
        """Extend the lease; False (and the lock marked lost) when too late or a higher epoch exists."""
        with self.writing:
            if self.lost:
                return False
            started = self.clock.monotonic()
            if started >= self.deadline:
                self.lost = True
                return False
            record = replace(self.record, expires_at=self.clock.wall() + self.ttl_s)
            if not self.files.write(record, exclusive=False) or self.files.epochs()[-1] != record.epoch \
                    or self.clock.monotonic() >= self.deadline:
                self.lost = True
                log.warning("lost the crawl's writer lock (epoch %d): renewed too late or taken over", record.epoch)
                return False
            self.record, self.deadline = record, fence_deadline(started, self.ttl_s)
            return True

    def release(self) -> None:
        """Give the lock up: the next command may take it at once. A lock already lost is left alone."""
        with self.writing:
            epochs = self.files.epochs()
            if self.lost or not epochs or epochs[-1] != self.record.epoch:
                return
            self.files.write(replace(self.record, released=True, expires_at=self.clock.wall()), exclusive=False)
            self.lost = True


def acquire(files: LockFiles, command: str, root: str, wait_s: float, ttl_s: float, grace_s: float,
            clock: Clock = SYSTEM_CLOCK, sleep: Callable[[float], None] = time.sleep) -> HeldLock:
    """Take the lock, waiting up to `wait_s` for its holder; CrawlBusy naming the holder when it does not let go."""
    started = clock.monotonic()
    give_up = started + wait_s
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    waiting_for = None
    while True:
        epochs = files.epochs()
        latest = files.read(epochs[-1]) if epochs else None
        if epochs and latest is None:
            continue  # pruned between the listing and the read: a newer epoch exists
        now = clock.wall()
        if may_take(latest, now, grace_s):
            renew_started = clock.monotonic()
            record = LockRecord(epoch=latest.epoch + 1 if latest else 1, command=command, owner=owner,
                                hostname=socket.gethostname(), pid=os.getpid(), acquired_at=now,
                                expires_at=now + ttl_s)
            if files.write(record, exclusive=True):
                if files.epochs()[-1] == record.epoch:
                    for old in files.epochs():
                        if old <= record.epoch - _KEEP_EPOCHS:
                            files.remove(old)
                    return HeldLock(files, record, fence_deadline(renew_started, ttl_s), ttl_s, clock)
                files.remove(record.epoch)  # a stale view: later epochs exist and this one's name was free again
            continue  # another command won this epoch: look again
        if clock.monotonic() >= give_up:
            raise CrawlBusy(refusal(latest, clock.monotonic() - started, root))
        if waiting_for != latest.owner:
            waiting_for = latest.owner
            log.warning("waiting up to %.0f s for the crawl's writer lock: held by %s", wait_s, holder(latest))
        sleep(next_look(clock.monotonic(), give_up))


_holding = threading.local()  # root -> the HeldLock this thread holds there (`check_held`)


def check_held(root: str, before: str) -> None:
    """CrawlBusy when this thread's writer lock on `root` is lost: a job calls it right before a commit no
    later holder may see undone (rebucket's blind overwrite)."""
    held = getattr(_holding, "locks", {}).get(root)
    if held is not None:
        held.check(before)


@contextlib.contextmanager
def writer_lock(conf: Config, root: str, command: str, clock: Clock = SYSTEM_CLOCK) -> Iterator[HeldLock]:
    """Hold the crawl's writer lock for the work inside, renewed by a thread; released on the way out (also on
    an error). CrawlBusy when another command holds it past `writer_lock.wait_s`."""
    settings = conf.writer_lock
    held = acquire(lock_files(Storage.from_conf(conf), root), command, root, settings.wait_s, settings.ttl_s,
                   conf.ownership.takeover_grace_s, clock)
    log.info("holding the crawl's writer lock (epoch %d) for `crawl %s`", held.record.epoch, command)
    stop = threading.Event()

    def renew_until_stopped() -> None:
        while not stop.wait(renew_interval(settings.ttl_s)):
            try:
                if not held.renew():
                    return
            except Exception as exc:  # storage trouble: the next renewal tries again; the fence decides
                log.warning("could not renew the crawl's writer lock: %s", exc)

    renewer = threading.Thread(target=renew_until_stopped, name="writer-lock-renewal", daemon=True)
    renewer.start()
    held_here = _holding.__dict__.setdefault("locks", {})
    held_here[root] = held
    try:
        yield held
    finally:
        held_here.pop(root, None)
        stop.set()
        renewer.join()
        try:
            held.release()
        except Exception as exc:  # the command's own outcome matters more: the lock then expires after its ttl
            log.warning("could not release the crawl's writer lock (it expires in %.0f s): %s", settings.ttl_s, exc)


def holding_writer_lock(command: str) -> Callable[[Job], Job]:
    """A job's `run(spark, conf, root, ...)` that holds the crawl's writer lock for the whole run."""
    def wrap(job: Job) -> Job:
        @functools.wraps(job)
        def locked(spark: Any, conf: Config, root: str, *args: Any, **kwargs: Any) -> Any:
            with writer_lock(conf, root, command):
                return job(spark, conf, root, *args, **kwargs)
        return locked  # type: ignore[return-value]
    return wrap
