"""What the two cyclecrawl DAGs (`crawl_cycle.py`, `crawl_run.py`) share: the deployment settings read when a DAG
file is parsed (Airflow Variable and Connections first, CYCLECRAWL_* environment variables as their fallback), the
retry policy, the failure alerts, the Assets the crawl's outputs are, the params every crawl command takes and how a
task hands them to `crawl-submit`. No DAG is defined here; like the DAG files it imports no crawl module.

Parse-time reads: the storage root (Variable `cyclecrawl_root`) and the Spark master (Connection `cyclecrawl_spark`)
are read at the top level of the DAG files, against Airflow's advice to keep Variables out of parsing, because two
things need them before any run exists: the check that refuses a DAG without a shareable root, and the Assets' URIs,
which Airflow fixes when it serializes a DAG. They are two lookups per parse of each file; a deployment that parses
often can turn on `[secrets] use_cache`. A run's `root` and `spark_master` params still override them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.request
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from airflow.providers.standard.hooks.subprocess import SubprocessHook, SubprocessResult
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import (
    Asset,
    BaseNotifier,
    Connection,
    DeadlineAlert,
    DeadlineReference,
    Param,
    SyncCallback,
    Variable,
)
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSkipException,
)

log = logging.getLogger(__name__)

EXIT_TRY_LATER = 75  # crawler.errors.EXIT_TRY_LATER: another command holds the writer lock, or the like; a skip
EXIT_USER_ERROR = 2  # crawler.errors.EXIT_USER_ERROR: a mistake in what was asked (config key, file, argument)
EXIT_VALIDATION_FAILED = 3  # jobs.validate.EXIT_VALIDATION_FAILED: an expectation failed
EXIT_GATE_CLOSED = 4  # crawler.errors.EXIT_GATE_CLOSED: a failed validation holds the quality gate closed; a skip
# A storage root every task can share: an absolute folder or an S3 URL. A relative one (or none, the config's
# default ./crawl-data) would be each task's own working directory, Airflow's temporary folder, deleted after it.
ROOT_PATTERN = r"^(/|s3a?://[^/]+)"
ROOT_VARIABLE = "cyclecrawl_root"  # the storage root; else CYCLECRAWL_ROOT
SPARK_CONNECTION = "cyclecrawl_spark"  # its host (and port) is the Spark master; else CYCLECRAWL_SPARK_MASTER
ALERTS_CONNECTION = "cyclecrawl_alerts"  # an http(s) connection: the webhook the alerts are POSTed to
WEBHOOK_TIMEOUT_S = 10  # an alert must not hold a worker: a webhook slower than this is logged and given up
# Bounds on a stuck run: each Spark step, and a cycle run as a whole (its fetch deadline included).
STEP_TIMEOUT = timedelta(minutes=float(os.environ.get("CYCLECRAWL_STEP_TIMEOUT_MINUTES", "120")))
# A cycle run still going this long after it was queued is late (an alert; it goes on, to its dagrun_timeout).
# 0 turns the deadline alerts of both DAGs off: Airflow 3.3's `dag.test` / `airflow dags test` crash at the end of
# a successful run of a DAG with a deadline (apache/airflow#73428).
CYCLE_DEADLINE = timedelta(minutes=float(os.environ.get("CYCLECRAWL_DEADLINE_MINUTES", "120")))


def alert_of(context: Any) -> dict[str, Any]:
    """What an alert says, from a failed task's context (its `ti` and `exception`) or a missed deadline's (the
    scheduler's `dag_run` as JSON and the `deadline`)."""
    ti = context.get("ti")
    if ti is not None:
        return {"event": "task_failed", "dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
                "try_number": ti.try_number, "exception": str(context.get("exception") or ""),
                "log_url": ti.log_url}
    run, deadline = context.get("dag_run") or {}, context.get("deadline") or {}
    deadline_time = deadline.get("deadline_time")
    return {"event": "deadline_missed", "dag_id": run.get("dag_id"), "run_id": run.get("dag_run_id"),
            "queued_at": run.get("queued_at"),
            "deadline_time": deadline_time.isoformat() if isinstance(deadline_time, datetime) else deadline_time}


def webhook_url(connection: Connection) -> str:
    """The URL an http(s) connection names: its host when that is a URL (JSON form, `"host": "https://..."`), else
    built from its URI form (`http://host:port/path`: conn_type, host, port, and the path, which Airflow keeps as
    `schema`)."""
    if "://" in (connection.host or ""):
        return connection.host
    scheme = "https" if connection.conn_type == "https" else "http"
    port = f":{connection.port}" if connection.port else ""
    return f"{scheme}://{connection.host}{port}/{connection.schema or ''}"


class CrawlAlertNotifier(BaseNotifier):
    """Airflow's notifier for the crawl's alerts: a task that failed for good (its `on_failure_callback`) and a cycle
    past its deadline (the DeadlineAlert's callback). It always logs one line; with the `cyclecrawl_alerts` connection
    it also POSTs the alert as JSON to its webhook. It never raises: a webhook down must not hide the failure it
    reports (the task's own state and log stay what they were)."""

    def __init__(self, conn_id: str = ALERTS_CONNECTION, context: Any = None) -> None:
        super().__init__(context)
        self.conn_id = conn_id

    def notify(self, context: Any) -> None:
        alert = alert_of(context)
        log.error("cyclecrawl alert: %s", json.dumps(alert))
        try:
            connection = Connection.get(self.conn_id)
        except AirflowNotFoundException:
            return  # no webhook configured: the log line is the alert
        url = webhook_url(connection)
        try:
            request = urllib.request.Request(url, data=json.dumps(alert).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
                log.info("alert sent to the webhook of connection %s (HTTP %s)", self.conn_id, response.status)
        except Exception as exc:  # any failure to deliver: logged, never raised over the task's own failure
            log.warning("alert not sent to the webhook of connection %s at %s: %s", self.conn_id,
                        urlsplit(url).netloc, exc)


def missed_deadline(interval: timedelta) -> list[DeadlineAlert]:
    """A deadline `interval` after a run was queued (scheduled and manual runs alike: a manual run may have no
    logical date), missed when the run has not ended by then; the notifier sends it. The scheduler hands it to the
    executor (SyncCallback), which imports it from the DAG bundle; the executor must run callbacks (LocalExecutor
    and CeleryExecutor do). None while CYCLECRAWL_DEADLINE_MINUTES is 0."""
    if not CYCLE_DEADLINE:
        return []
    return [DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=interval,
                          callback=SyncCallback(CrawlAlertNotifier, kwargs={"conn_id": ALERTS_CONNECTION}))]


# Every task: retried with exponential backoff (1, 2, 4 ... min, at most 30 min apart); each Spark step is
# idempotent (Delta MERGE, segment-keyed overwrites) and `crawl run` resumes from the tables, so a retry after a
# lost executor or a flaky cluster submission redoes only that task. A task that fails for good is an alert.
DEFAULT_ARGS = {
    "owner": "cyclecrawl",
    "retries": int(os.environ.get("CYCLECRAWL_RETRIES", "3")),
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=30),
    "on_failure_callback": [CrawlAlertNotifier()],
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
    """The storage root of every run: the Airflow Variable `cyclecrawl_root`, else CYCLECRAWL_ROOT, checked when a
    DAG file is parsed: a DAG whose runs would write their tables into Airflow's temporary working directory is not
    loaded, with this message as its import error."""
    root = Variable.get(ROOT_VARIABLE, default=None) or os.environ.get("CYCLECRAWL_ROOT", "")
    if not re.match(ROOT_PATTERN, root):
        raise ValueError(f"the crawl's storage root (the Airflow Variable {ROOT_VARIABLE}, else CYCLECRAWL_ROOT where "
                         f"the DAGs are parsed) must be an absolute folder or an s3:// URL (it is {root!r}): a "
                         "relative or empty root would put each task's tables in its temporary working directory")
    return root


def default_spark_master() -> str:
    """The Spark master of every run: the Connection `cyclecrawl_spark`, else CYCLECRAWL_SPARK_MASTER; empty =
    spark.master of the config. The connection's host and port, as Airflow's Spark provider reads them, a bare host
    being a standalone master: URI `spark://master:7077` is spark://master:7077, `spark://yarn` is yarn; a master
    with a scheme of its own in JSON form, e.g. `{"conn_type": "spark", "host": "k8s://https://api:443"}`."""
    try:
        connection = Connection.get(SPARK_CONNECTION)
    except AirflowNotFoundException:
        return os.environ.get("CYCLECRAWL_SPARK_MASTER", "")
    host = connection.host or ""
    if host and "://" not in host and host != "yarn" and not host.startswith("local"):
        host = f"spark://{host}"
    return f"{host}:{connection.port}" if connection.port else host


def table_asset(root: str, table: str) -> Asset:
    """The Asset of a crawl table, `ROOT/tables/<table>`: `file:///...` for a local root, `s3://bucket/...` for an
    s3:// or s3a:// one. Airflow fixes an Asset's URI when it serializes the DAG, so it follows the parse-time root;
    a run triggered with another `root` param still updates the Asset of this one (its event's extra names the
    run's root)."""
    location = f"{root.rstrip('/')}/tables/{table}"
    return Asset(uri=re.sub(r"^s3a://", "s3://", location) if "://" in location else f"file://{location}")


def crawl_params(root: str, config_doc: str = "YAML config file (absolute path); empty = defaults") -> dict[str, Any]:
    """The params of the config file, the storage root (defaulting to the parse-time `root`) and the Spark master.
    A run's `root` must be absolute or s3:// too (Airflow refuses a trigger with another)."""
    return {
        "config": Param(os.environ.get("CYCLECRAWL_CONFIG", ""), type="string", description=config_doc),
        "root": Param(root, type="string", pattern=ROOT_PATTERN,
                      description="storage root: an absolute folder or s3://bucket/... (never relative: a task's "
                                  "working directory is temporary)"),
        "spark_master": Param(default_spark_master(), type="string",
                              description="Spark master URL for crawl-submit; empty = spark.master of the config"),
    }


class LastResultHook(SubprocessHook):
    """Airflow's subprocess hook, keeping what the command last returned: its exit code and last line of output
    (stderr is merged into it), which a crawl command's refusal is."""

    last: SubprocessResult | None = None

    def run_command(self, *args: Any, **kwargs: Any) -> SubprocessResult:
        self.last = super().run_command(*args, **kwargs)
        return self.last


class CrawlCommand(BashOperator):
    """A task running a `crawl` command line. Exit 75 (try later) and 4 (the quality gate closed) skip where the
    task says so (`skip_on_exit_code`), the skip's reason being the command's last line (the refusal it printed on
    stderr); exit 2 (a mistake in what was asked) and the codes in `fail_on_exit_code` fail the task for good
    (AirflowFailException): they are deterministic, and a retry would only repeat them. Any other failure is retried
    (DEFAULT_ARGS). A task with outlets (the tables it writes, `table_asset`) gives each Asset event the run's root
    and segment as extra, so a consumer knows what changed without asking the DAG."""

    def __init__(self, *, fail_on_exit_code: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_on_exit_code = (EXIT_USER_ERROR, *fail_on_exit_code)

    @cached_property
    def subprocess_hook(self) -> LastResultHook:
        return LastResultHook()

    def execute(self, context: Any) -> Any:
        try:
            result = super().execute(context)
        except AirflowSkipException as exc:
            last = self.subprocess_hook.last
            if last is None or not last.output:
                raise
            raise AirflowSkipException(f"exit {last.exit_code}: {last.output}") from exc
        except AirflowException as exc:  # BashOperator's "... returned a non-zero exit code N."
            found = re.search(r"exit code (\d+)", str(exc))
            if found and int(found.group(1)) in self.fail_on_exit_code:
                last = self.subprocess_hook.last
                why = (f"{exc} Not retried: exit {found.group(1)} is deterministic (2: a mistake in what was asked, "
                       "named on stderr; 3: a failed validation; 4: the quality gate closed)"
                       + (f": {last.output}" if last is not None and last.output else ""))
                raise AirflowFailException(why) from exc
            raise
        written = {key: self.env[name] for key, name in (("root", "CRAWL_ROOT"), ("segment_id", "SEGMENT"))
                   if self.env.get(name)}
        for asset in self.outlets:
            context["outlet_events"][asset].extra.update(written)
        return result
