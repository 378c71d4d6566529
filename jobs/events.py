"""Reading `index_events` incrementally: the consumer side of the outbox contract (docs/outputs.md).

update only ever inserts into `index_events` (one row per (url_id, state_version), never updated), and the
table has Delta's Change Data Feed on, so the rows a commit added are exactly its `insert` changes. A consumer
keeps the last table version it processed and asks for what came after it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from delta_tables import tables


def index_events_since(spark: SparkSession, root: str, after_version: int | None,
                       up_to_version: int | None = None) -> tuple[DataFrame, int]:
    """Index events committed after table version `after_version` (every one when None) up to `up_to_version`
    (the latest when None), and the version they run to: store it and pass it next time. Each row keeps
    `_commit_version` so a consumer can process in commit order; there is nothing but inserts to read."""
    path = tables.table_path(root, "index_events")
    latest = tables.table_version(spark, root, "index_events") if up_to_version is None else up_to_version
    start = 0 if after_version is None else after_version + 1
    reader = spark.read.format("delta").option("readChangeFeed", "true")
    if start > latest:  # nothing new: an empty frame of the same shape
        empty = reader.option("startingVersion", latest).option("endingVersion", latest).load(path).limit(0)
        return empty.drop("_change_type", "_commit_timestamp"), latest
    changes = reader.option("startingVersion", start).option("endingVersion", latest).load(path)
    inserts = changes.where(F.col("_change_type") == "insert").drop("_change_type", "_commit_timestamp")
    return inserts, latest
