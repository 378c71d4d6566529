"""`crawl rebucket`: move every URL and host to its bucket under the config's `crawl.buckets` and `politeness.key`,
then record those as the crawl's (`ROOT/_crawl.json`, crawler.bucketing), after which inject, update and the
daemons accept the new settings.

Buckets stay fixed while a crawl runs (generate's fetch lists, the leases of URLs and the daemons' bucket leases
all name them), so this runs between cycles: it refuses while any segment is neither merged nor closed. Every
fetch list of a finished segment is history, and a daemon's bucket lease of an old number expires unused.

Cost: the distinct hosts of `urls` and `hosts` get their new bucket from a Python UDF (one call per host, not per
URL); then each of `urls` and `hosts` whose rows are not all in their new bucket is rewritten whole, in one
overwrite commit (Delta keeps the old version for time travel until VACUUM). The record is written last, and each
table is rewritten only if it still needs it: a run stopped half-way is finished by running it again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import Config
from crawler.errors import UserError
from crawler.status import FINISHED_SEGMENT_STATES
from delta_tables import tables
from jobs.base import pinned_table, step
from jobs.storage import Storage
from jobs.writelock import check_held, holding_writer_lock

log = logging.getLogger("jobs.rebucket")


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
def run(spark: SparkSession, conf: Config, root: str) -> RebucketResult:
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
    Storage.from_conf(conf).write_bytes(layout.crawl_record(root),
                                        json.dumps(bucketing.identity(), sort_keys=True).encode("utf-8"))
    log.info("rebucket: %s", result.summary())
    return result


def _misplaced(table: DataFrame, moves: DataFrame) -> bool:
    return bool(table.join(moves, "host_key").where(F.col("bucket") != F.col("new_bucket")).limit(1).count())


def _rewrite(root: str, name: str, table: DataFrame, moves: DataFrame) -> None:
    """The whole table again, each row in its host's new bucket: one overwrite commit (of every partition, whatever
    the session's partition overwrite mode), partitioned as before."""
    moved = table.join(moves, "host_key").withColumn("bucket", F.col("new_bucket"))
    check_held(root, f"rewriting {name}")  # the overwrite is blind: only the lock keeps other commits out
    (tables.conform(moved, name).write.format("delta").mode("overwrite").option("partitionOverwriteMode", "static")
     .save(tables.table_path(root, name)))


def run_command(spark: SparkSession, conf: Config, root: str) -> int:
    """`crawl rebucket`: what moved, in one summary line."""
    print(f"rebucket: {run(spark, conf, root).summary()}")
    return 0
