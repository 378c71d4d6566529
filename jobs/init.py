"""`crawl init`: every Delta table under the root (`delta_tables.create_all`; the jobs create what they miss too,
through `ensure_tables`, so this is the explicit first step, not a required one)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from crawler.config import Config
from delta_tables import create_all


def run_command(spark: SparkSession, conf: Config, root: str) -> int:
    """`crawl init`: the tables it created, or that there was nothing to create."""
    created = create_all(spark, root)
    print(f"init: {root}: created {', '.join(created) if created else 'nothing (all tables exist)'}")
    return 0
