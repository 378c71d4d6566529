"""What the two cyclecrawl DAGs (`crawl_cycle.py`, `crawl_run.py`) share: the deployment defaults read from the
environment (CYCLECRAWL_*, when a DAG file is parsed), the retry policy, the params every crawl command takes and
how a task hands them to `crawl-submit`. No DAG is defined here; like the DAG files it imports no crawl module.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

EXIT_TRY_LATER = 75  # crawler.errors.EXIT_TRY_LATER: another command holds the writer lock, or the like; a skip
EXIT_USER_ERROR = 2  # crawler.errors.EXIT_USER_ERROR: a mistake in what was asked (config key, file, argument)
EXIT_VALIDATION_FAILED = 3  # jobs.validate.EXIT_VALIDATION_FAILED: an expectation failed
# A storage root every task can share: an absolute folder or an S3 URL. A relative one (or none, the config's
# default ./crawl-data) would be each task's own working directory, Airflow's temporary folder, deleted after it.
ROOT_PATTERN = r"^(/|s3a?://[^/]+)"
# Bounds on a stuck run: each Spark step, and a cycle run as a whole (its fetch deadline included).
STEP_TIMEOUT = timedelta(minutes=float(os.environ.get("CYCLECRAWL_STEP_TIMEOUT_MINUTES", "120")))

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


def default_root() -> str:
    """CYCLECRAWL_ROOT, the storage root of every run, checked when a DAG file is parsed: a DAG whose runs would
    write their tables into Airflow's temporary working directory is not loaded, with this message as its import
    error."""
    root = os.environ.get("CYCLECRAWL_ROOT", "")
    if not re.match(ROOT_PATTERN, root):
        raise ValueError(f"CYCLECRAWL_ROOT must be the crawl's storage root, an absolute folder or an s3:// URL, "
                         f"where the DAGs are parsed (it is {root!r}): a relative or empty root would put each "
                         "task's tables in its temporary working directory")
    return root


def crawl_params(config_doc: str = "YAML config file (absolute path); empty = defaults") -> dict[str, Any]:
    """The params of the config file, the storage root and the Spark master, defaulted from the environment. A
    run's `root` must be absolute or s3:// too (Airflow refuses a trigger with another)."""
    return {
        "config": Param(os.environ.get("CYCLECRAWL_CONFIG", ""), type="string", description=config_doc),
        "root": Param(default_root(), type="string", pattern=ROOT_PATTERN,
                      description="storage root: an absolute folder or s3://bucket/... (never relative: a task's "
                                  "working directory is temporary)"),
        "spark_master": Param(os.environ.get("CYCLECRAWL_SPARK_MASTER", ""), type="string",
                              description="Spark master URL for crawl-submit; empty = spark.master of the config"),
    }


class CrawlCommand(BashOperator):
    """A task running a `crawl` command line. Exit 75 skips where the task says so (`skip_on_exit_code`); exit 2 (a
    mistake in what was asked) and the codes in `fail_on_exit_code` fail the task for good (AirflowFailException):
    they are deterministic, and a retry would only repeat them. Any other failure is retried (DEFAULT_ARGS)."""

    def __init__(self, *, fail_on_exit_code: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_on_exit_code = (EXIT_USER_ERROR, *fail_on_exit_code)

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowSkipException:
            raise
        except AirflowException as exc:  # BashOperator's "... returned a non-zero exit code N."
            found = re.search(r"exit code (\d+)", str(exc))
            if found and int(found.group(1)) in self.fail_on_exit_code:
                why = (f"{exc} Not retried: exit {found.group(1)} is deterministic (2: a mistake in what was asked, "
                       "named on stderr; 3: a failed validation)")
                raise AirflowFailException(why) from exc
            raise
