"""`crawl rebucket`: move every URL and host to its bucket under the config's `crawl.buckets` and `politeness.key`,
then record those as the crawl's (`ROOT/_crawl.json`, crawler.bucketing), after which inject, update and the
daemons accept the new settings.

Buckets stay fixed while a crawl runs (generate's fetch lists, the leases of URLs and the daemons' bucket leases
all name them), so this runs between cycles: it refuses while any segment is neither merged nor closed, and while
any daemon holds a live bucket lease (`DaemonsFetching`, exit 75; `--wait-for-daemons SECONDS` waits that long for
them to stop or release first). A daemon without a bucket may keep running: it reads the record before it takes
one and every `fetch.poll_interval_s` while it fetches, and exits (75) once the record is not its config's, to be
started again with the new settings (crawler.bucketing). Every fetch list of a finished segment is history, and a
daemon's bucket lease of an old number expires unused.

Cost: the distinct hosts of `urls` and `hosts` get their new bucket from a Python UDF (one call per host, not per
URL); then each of `urls` and `hosts` whose rows are not all in their new bucket is rewritten whole, in one
overwrite commit (Delta keeps the old version for time travel until VACUUM). The record is written last, and each
table is rewritten only if it still needs it: a run stopped half-way is finished by running it again.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import Config
from crawler.errors import TryLater, UserError
from crawler.ownership import LEASES_FOLDER, LeaseRecord, epoch_of, live_holders
from crawler.status import FINISHED_SEGMENT_STATES
from delta_tables import tables
from jobs.base import pinned_table, step
from jobs.storage import Storage
from jobs.writelock import check_held, holding_writer_lock

log = logging.getLogger("jobs.rebucket")


# How often `--wait-for-daemons` reads the leases again.
LEASE_POLL_S = 1.0


class DaemonsFetching(TryLater):
    """Daemons hold live bucket leases: buckets renumbered under them would leave their politeness gates and
    bucket ownership keyed by the old settings. Exit 75: stop the daemons or wait for them, and run it again."""


@dataclass
class RebucketResult:
    bucketing: Bucketing
    hosts: int = 0          # distinct hosts given a bucket
    moved_hosts: int = 0    # of those, hosts whose bucket changed
    rewritten: tuple[str, ...] = ()  # tables rewritten (none: every row was in its bucket already)

    def summary(self) -> str:
        tables_part = ", ".join(self.rewritten) or "no table"
        return (f"{self.moved_hosts} of {self.hosts} hosts moved to new buckets (crawl.buckets = "
                f"{self.bucketing.buckets}, politeness.key = {self.bucketing.key}); rewrote {tables_part}")


@holding_writer_lock("rebucket")
def run(spark: SparkSession, conf: Config, root: str, wait_for_daemons_s: float = 0.0) -> RebucketResult:
    wait_for_daemons(conf, root, wait_for_daemons_s)
    tables.ensure_tables(spark, root)
    open_segments = sorted({row["segment_id"] for row in tables.table_df(spark, root, "segments")
                            .where(~F.col("state").isin(*FINISHED_SEGMENT_STATES)).select("segment_id").collect()})
    if open_segments:
        raise UserError(f"cannot rebucket while segments are open: {', '.join(open_segments[:5])}"
                        f"{' and more' if len(open_segments) > 5 else ''} (merge them, or give them up with "
                        "`crawl close-segment`)")
    bucketing = Bucketing.from_config(conf)
    result = RebucketResult(bucketing)

    @F.udf("int")
    def new_bucket(host_key):  # no type hints: pyspark would take it for a pandas UDF
        return bucketing.bucket(host_key)

    urls, hosts = pinned_table(spark, root, "urls"), pinned_table(spark, root, "hosts")
    with step("rebucket: new bucket per host"):
        placed = (urls.select("host_key", "bucket").unionByName(hosts.select("host_key", "bucket")).distinct()
                  .groupBy("host_key").agg(F.collect_set("bucket").alias("old"))
                  .withColumn("new_bucket", new_bucket("host_key")).localCheckpoint())
        counts = placed.agg(F.count("*").alias("hosts"), F.count(F.when(
            (F.size("old") != 1) | (F.col("old")[0] != F.col("new_bucket")), 1)).alias("moved")).first()
        result.hosts, result.moved_hosts = int(counts["hosts"]), int(counts["moved"])
    moves = placed.select("host_key", "new_bucket")
    rewritten = []
    for name, table in (("urls", urls), ("hosts", hosts)):
        if _misplaced(table, moves):
            with step(f"rebucket: rewrite {name}"):
                _rewrite(root, name, table, moves)
            rewritten.append(name)
    result.rewritten = tuple(rewritten)
    record_bucketing(conf, root, bucketing)
    log.info("rebucket: %s", result.summary())
    return result


def record_bucketing(conf: Config, root: str, bucketing: Bucketing) -> None:
    """Make `bucketing` the crawl's (`ROOT/_crawl.json`, replaced whole): from here on every command and daemon
    compares its config with it."""
    Storage.from_conf(conf).write_bytes(layout.crawl_record(root),
                                        json.dumps(bucketing.identity(), sort_keys=True).encode("utf-8"))


def lease_holders(conf: Config, root: str) -> list[LeaseRecord]:
    """Each bucket's latest lease whose daemon may still be fetching (`crawler.ownership.live_holders`), read
    through the jobs' storage (a listing of ROOT/leases and one read per bucket with a lease, on S3 too)."""
    storage, folder = Storage.from_conf(conf), layout.join(root, LEASES_FOLDER)
    latest: dict[str, tuple[int, str]] = {}  # bucket folder -> (epoch, file) of its highest epoch
    for relpath in storage.list_files(folder):
        bucket_folder, _, name = relpath.rpartition("/")
        epoch = epoch_of(name)
        if epoch is not None and epoch > latest.get(bucket_folder, (-1, ""))[0]:
            latest[bucket_folder] = (epoch, relpath)
    records = []
    for _, relpath in latest.values():
        try:
            with storage.open_input(layout.join(folder, relpath)) as handle:
                records.append(LeaseRecord.from_json(json.loads(handle.read())))
        except FileNotFoundError:  # pruned since the listing: a higher epoch replaced it, read at the next look
            continue
    return live_holders(records, time.time(), conf.ownership.takeover_grace_s)


def wait_for_daemons(conf: Config, root: str, wait_s: float) -> None:
    """Return once no daemon holds a live bucket lease, looking again every `LEASE_POLL_S` for up to `wait_s`
    seconds; then `DaemonsFetching`, naming the holders."""
    deadline = time.monotonic() + wait_s
    while holders := lease_holders(conf, root):
        if time.monotonic() >= deadline:
            by_owner: dict[str, list[int]] = defaultdict(list)
            for record in holders:
                by_owner[record.owner].append(record.bucket)
            named = "; ".join(f"{owner} (bucket{'s' if len(b) > 1 else ''} {', '.join(map(str, sorted(b)))})"
                              for owner, b in sorted(by_owner.items()))
            waited = f" after waiting {wait_s:g}s" if wait_s > 0 else ""
            raise DaemonsFetching(f"cannot rebucket while daemons hold bucket leases{waited}: {named} (stop them, or "
                                  "give them time with --wait-for-daemons SECONDS)")
        log.info("rebucket: waiting for %d bucket lease(s) to be released", len(holders))
        time.sleep(min(LEASE_POLL_S, max(0.0, deadline - time.monotonic())))


def _misplaced(table: DataFrame, moves: DataFrame) -> bool:
    return bool(table.join(moves, "host_key").where(F.col("bucket") != F.col("new_bucket")).limit(1).count())


def _rewrite(root: str, name: str, table: DataFrame, moves: DataFrame) -> None:
    """The whole table again, each row in its host's new bucket: one overwrite commit (of every partition, whatever
    the session's partition overwrite mode), partitioned as before."""
    moved = table.join(moves, "host_key").withColumn("bucket", F.col("new_bucket"))
    check_held(root, f"rewriting {name}")  # the overwrite is blind: only the lock keeps other commits out
    (tables.conform(moved, name).write.format("delta").mode("overwrite").option("partitionOverwriteMode", "static")
     .save(tables.table_path(root, name)))


def run_command(spark: SparkSession, conf: Config, root: str, wait_for_daemons_s: float) -> int:
    """`crawl rebucket`: what moved, in one summary line."""
    print(f"rebucket: {run(spark, conf, root, wait_for_daemons_s).summary()}")
    return 0
