"""What the two cyclecrawl DAGs (`crawl_cycle.py`, `crawl_run.py`) share: the deployment defaults read from the
environment (CYCLECRAWL_*, when a DAG file is parsed), the retry policy, the params every crawl command takes and
how a task hands them to `crawl-submit`. No DAG is defined here; like the DAG files it imports no crawl module.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.sdk import Param

EXIT_TRY_LATER = 75  # crawler.errors.EXIT_TRY_LATER: another command holds the writer lock, or the like; a skip

# Every task: retried with exponential backoff (1, 2, 4 ... min, at most 30 min apart); each Spark step is
# idempotent (Delta MERGE, segment-keyed overwrites) and `crawl run` resumes from the tables, so a retry after a
# lost executor or a flaky cluster submission redoes only that task.
DEFAULT_ARGS = {
    "owner": "cyclecrawl",
    "retries": int(os.environ.get("CYCLECRAWL_RETRIES", "3")),
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=30),
}

# The values every command line needs, handed to bash as environment variables (no shell quoting of paths), and
# the arguments and the submission they become.
CRAWL_ENV = {
    "CRAWL_ROOT": "{{ params.root or '' }}",
    "CRAWL_CONFIG": "{{ params.config or '' }}",
    "SPARK_MASTER": "{{ params.spark_master or '' }}",
}
CONFIG_ARGS = '${CRAWL_ROOT:+--root "$CRAWL_ROOT"} ${CRAWL_CONFIG:+--config "$CRAWL_CONFIG"}'
SUBMIT = 'crawl-submit ${SPARK_MASTER:+--master "$SPARK_MASTER"} --'


def crawl_params(config_doc: str = "YAML config file (absolute path); empty = defaults") -> dict[str, Any]:
    """The params of the config file, the storage root and the Spark master, defaulted from the environment."""
    return {
        "config": Param(os.environ.get("CYCLECRAWL_CONFIG", ""), type="string", description=config_doc),
        "root": Param(os.environ.get("CYCLECRAWL_ROOT", ""), type="string",
                      description="storage root (local folder or s3://...); empty = storage.root of the config"),
        "spark_master": Param(os.environ.get("CYCLECRAWL_SPARK_MASTER", ""), type="string",
                              description="Spark master URL for crawl-submit; empty = spark.master of the config"),
    }
