"""The Airflow 3 DAG airflow_dags/crawl_cycle.py with a real Airflow (`tests/support/airflow.py`), and the fetch
progress check it polls. The whole cycle through Airflow runs once per session, its Spark steps on a standalone
cluster (the `airflow_cycle` fixture, which `tests/test_spark_cluster.py` reads as well).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pytest

from crawler import layout
from crawler.errors import EXIT_GATE_CLOSED, EXIT_TRY_LATER, EXIT_USER_ERROR
from fetchd.progress import segment_progress
from jobs import validate
from sitefarm.judge import requested_url
from tests.support import airflow
from tests.support.airflow import DAGS, run_airflow_script
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[1]
CYCLE_ORDER = ["inject", "generate", "fetch", "parse", "dedup", "update", "validate", "maintenance_due", "maintain"]


def make_buckets(root: str, segment_id: str, listed: list[int], done: list[int]) -> None:
    for bucket in listed:
        os.makedirs(layout.fetchlist_dir(root, segment_id, bucket))
    for bucket in done:
        os.makedirs(layout.fetched_dir(root, segment_id, bucket), exist_ok=True)
        Path(layout.done_manifest(root, segment_id, bucket)).write_text("{}")


def test_progress_counts_buckets_with_a_fetch_list_and_their_manifests(root):
    make_buckets(root, "seg-1", listed=[0, 3, 7], done=[3])
    progress = segment_progress(root, "seg-1")
    assert progress == ([0, 3, 7], [3], False)
    assert progress.unfinished == [0, 7] and not progress.complete

    make_buckets(root, "seg-1", listed=[], done=[0, 7])
    assert segment_progress(root, "seg-1").complete


def test_progress_ignores_a_manifest_without_a_fetch_list(root):
    """A `_DONE.json` of a bucket generate never listed does not count (nor make an empty segment pending)."""
    make_buckets(root, "seg-1", listed=[1], done=[2])
    assert segment_progress(root, "seg-1") == ([1], [], False)


def test_progress_of_a_segment_with_nothing_due_is_complete(root):
    progress = segment_progress(root, "seg-empty")
    assert progress == ([], [], False) and progress.complete


def test_progress_refuses_a_segment_id_that_leaves_its_folder(root):
    with pytest.raises(ValueError):
        segment_progress(root, "../seg-1")


def test_progress_of_an_s3_root_lists_the_daemons_s3_keys(base_conf, tmp_path):
    """On S3 the same question is asked of prefixes and manifest keys, through the daemons' own store."""
    from tests.support.s3 import moto_server

    with moto_server() as s3:
        bucket = s3.make_bucket("crawl")
        conf = base_conf.with_overrides({"s3.endpoint_url": s3.endpoint, "fetch.staging_dir": str(tmp_path)})
        client = s3.client()
        for key in ("fetchlist/bucket=00001/part-0.parquet", "fetchlist/bucket=00004/part-0.parquet",
                    "fetched/bucket=00004/_DONE.json", "fetched/bucket=00006/_DONE.json"):
            client.put_object(Bucket=bucket, Key=f"root/segments/seg-1/{key}", Body=b"x")
        progress = segment_progress("s3://crawl/root", "seg-1", conf)
        with pytest.raises(ValueError):
            segment_progress("s3://crawl/root", "seg-1")  # no config: no endpoint or credentials to list with
    assert progress == ([1, 4], [4], False) and progress.unfinished == [1]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    return airflow.airflow_env(tmp_path_factory.mktemp("airflow_home"))


LOAD_DAG = """
    import json, sys

    bag = dag_bag(sys.argv[1])
    dag = bag.dags.get("crawl_cycle")
    """


def test_dagbag_imports_the_cycle_in_order_with_retries(airflow_env, tmp_path):
    found = run_airflow_script(airflow_env, tmp_path, LOAD_DAG + """
    print(json.dumps({
        "errors": {str(k): str(v) for k, v in bag.import_errors.items()},
        "dags": sorted(bag.dags),
        "order": [t.task_id for t in dag.topological_sort()],
        "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
        "max_active_runs": dag.max_active_runs,
        "catchup": dag.catchup,
        "schedule": str(dag.schedule),
        "params": sorted(dag.params),
        "retries": {t.task_id: [t.retries, t.retry_exponential_backoff, t.max_retry_delay is not None]
                    for t in dag.tasks},
        "timeouts": {t.task_id: t.execution_timeout.total_seconds() for t in dag.tasks if t.execution_timeout},
        "no_retry": {t.task_id: list(t.fail_on_exit_code) for t in dag.tasks if hasattr(t, "fail_on_exit_code")},
        "run_timeout_s": dag.dagrun_timeout.total_seconds(),
        "undocumented": [t.task_id for t in dag.tasks if not t.doc_md] + ([] if dag.doc_md else ["<dag>"]),
    }))
    """, str(DAGS))
    assert found["errors"] == {}
    assert found["dags"] == ["crawl_continuous", "crawl_cycle"]
    order = found["order"]
    assert [t for t in order if t in CYCLE_ORDER] == CYCLE_ORDER
    # Both fetch variants sit between the mode branch and parse.
    assert found["upstream"]["parse"] == ["await_daemons", "fetch_segment"]
    assert found["upstream"]["await_daemons"] == found["upstream"]["fetch_segment"] == ["fetch"]
    assert found["max_active_runs"] == 1 and found["catchup"] is False and found["schedule"] == "@hourly"
    assert {"config", "root", "segment_max_urls", "spark_master", "seeds", "fetch_mode",
            "fetch_deadline_minutes"} <= set(found["params"])
    # CYCLECRAWL_RETRIES=0 in this environment: the policy's backoff and cap are still set on every task.
    assert all(backoff > 1 and capped for _, backoff, capped in found["retries"].values())
    assert found["undocumented"] == []
    # Every Spark step is bounded, and so is a run; exit 2 is never retried, nor validate's failed expectation.
    spark_steps = {"inject", "generate", "parse", "dedup", "update", "index", "validate", "maintain"}
    assert set(found["timeouts"]) == spark_steps and len(set(found["timeouts"].values())) == 1
    assert found["run_timeout_s"] >= 2 * 3600
    assert set(found["no_retry"]) == spark_steps | {"fetch_segment"}
    assert all(codes[0] == 2 for codes in found["no_retry"].values()) and found["no_retry"]["validate"] == [2, 3]


ROOT_CHECKS = """
    import copy, json, sys
    from airflow.sdk.exceptions import ParamValidationError

    bag = dag_bag(sys.argv[1])
    found = {"errors": {k.rsplit("/", 1)[-1]: str(v).strip().splitlines()[-1] for k, v in bag.import_errors.items()},
             "dags": sorted(bag.dags), "run_roots": {}}
    for dag in bag.dags.values():
        for root in sys.argv[2:]:
            params = copy.deepcopy(dag.params)
            try:
                params.update({"root": root})
                params.validate()
                found["run_roots"][f"{dag.dag_id} {root}"] = "accepted"
            except ParamValidationError:
                found["run_roots"][f"{dag.dag_id} {root}"] = "refused"
    print(json.dumps(found))
    """


def test_the_dags_refuse_a_root_that_is_not_absolute_or_s3(airflow_env, tmp_path):
    """An empty or relative root would make every task write its tables into its own temporary working directory:
    with CYCLECRAWL_ROOT unset or relative the DAG files do not load (their import error says why), and a run
    triggered with such a `root` is refused by its param's pattern."""
    for bad in ("", "crawl-data"):
        found = run_airflow_script({**airflow_env, "CYCLECRAWL_ROOT": bad}, tmp_path, ROOT_CHECKS, str(DAGS))
        assert found["dags"] == [] and set(found["errors"]) == {"crawl_cycle.py", "crawl_run.py"}
        assert all(f"the crawl's storage root (the Airflow Variable cyclecrawl_root, else CYCLECRAWL_ROOT where the "
                   f"DAGs are parsed) must be an absolute folder or an s3:// URL (it is {bad!r})" in error
                   for error in found["errors"].values())
    found = run_airflow_script(airflow_env, tmp_path, ROOT_CHECKS, str(DAGS), "/srv/crawl", "s3://bucket/crawl",
                               "", "crawl-data", "./x", "s3://")
    assert found["errors"] == {}
    for dag_id in ("crawl_cycle", "crawl_continuous"):
        assert {root: found["run_roots"][f"{dag_id} {root}"] for root in (
            "/srv/crawl", "s3://bucket/crawl", "", "crawl-data", "./x", "s3://")} == {
            "/srv/crawl": "accepted", "s3://bucket/crawl": "accepted", "": "refused", "crawl-data": "refused",
            "./x": "refused", "s3://": "refused"}


def test_the_continuous_dag_runs_crawl_run_for_less_than_its_timeout_one_run_at_a_time(airflow_env, tmp_path):
    """`crawl_continuous` (airflow_dags/crawl_run.py): one task, `crawl run --for` the run's minutes (with or without
    its own daemon), stopped by its execution_timeout only past them, exit 75 a skip, exit 4 (the quality gate
    closed: the driver stopped) a failure without retries, one run at a time."""
    found = run_airflow_script(airflow_env, tmp_path, """
    import json, sys

    bag = dag_bag(sys.argv[1])
    dag = bag.dags["crawl_continuous"]
    (task,) = dag.tasks
    print(json.dumps({"errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "task": task.task_id,
                      "command": task.bash_command, "env": task.env, "skip": task.skip_on_exit_code,
                      "fail": task.fail_on_exit_code, "timeout_s": task.execution_timeout.total_seconds(),
                      "max_active_runs": dag.max_active_runs,
                      "schedule": str(dag.schedule), "run_minutes": dag.params["run_minutes"],
                      "documented": bool(task.doc_md and dag.doc_md)}))
    """, str(DAGS))
    assert found["errors"] == {} and found["task"] == "run" and found["documented"]
    assert ' run --for "$RUN_SECONDS" $NO_DAEMON ' in found["command"]
    assert found["env"]["RUN_SECONDS"] == "{{ (params.run_minutes * 60) | int }}"
    assert "--no-daemon" in found["env"]["NO_DAEMON"]
    assert found["skip"] == [EXIT_TRY_LATER] and found["fail"] == [EXIT_USER_ERROR, EXIT_GATE_CLOSED]
    assert found["max_active_runs"] == 1 and found["schedule"] == "@hourly"
    assert found["run_minutes"] * 60 < found["timeout_s"] <= 3600


def test_dag_default_retries_come_from_the_environment(airflow_env, tmp_path):
    env = {**airflow_env, "CYCLECRAWL_RETRIES": "5"}
    found = run_airflow_script(env, tmp_path, LOAD_DAG + """
    print(json.dumps(sorted({t.retries for t in dag.tasks})))
    """, str(DAGS))
    assert found == [5]


SETTINGS = """
    import json, os, sys

    found = {}
    for name, settings in json.loads(sys.argv[2]).items():
        for key in ("AIRFLOW_VAR_CYCLECRAWL_ROOT", "AIRFLOW_CONN_CYCLECRAWL_SPARK", "CYCLECRAWL_SPARK_MASTER"):
            os.environ.pop(key, None)
        os.environ.update(settings)
        bag = dag_bag(sys.argv[1])
        found[name] = {"errors": [str(e).strip().splitlines()[-1] for e in bag.import_errors.values()], **{
            dag.dag_id: {"root": dag.params["root"], "spark_master": dag.params["spark_master"],
                         "outlets": {t.task_id: [a.uri for a in t.outlets] for t in dag.tasks if t.outlets},
                         "deadlines": [(type(d.reference).__name__, d.interval.total_seconds(), d.callback.path,
                                        d.callback.kwargs) for d in dag.deadline or []]}
            for dag in bag.dags.values()}}
    print(json.dumps(found))
    """


def test_root_and_master_come_from_the_airflow_variable_and_connection_before_the_environment(airflow_env, tmp_path):
    """The Variable `cyclecrawl_root` wins over CYCLECRAWL_ROOT, and the Connection `cyclecrawl_spark` over
    CYCLECRAWL_SPARK_MASTER (here in their AIRFLOW_VAR_ / AIRFLOW_CONN_ environment forms, Airflow's own secrets
    backend); without them the environment serves. A relative Variable is refused as a relative env var is, even
    with an absolute one beside it. The Assets of the tables follow the parse-time root (s3a:// as s3://), and both
    DAGs carry a deadline from the run's queueing whose callback is the alert notifier."""
    settings = {
        "variable": {"AIRFLOW_VAR_CYCLECRAWL_ROOT": "s3a://bucket/crawl", "CYCLECRAWL_ROOT": "/srv/env-root",
                     "AIRFLOW_CONN_CYCLECRAWL_SPARK": "spark://master:7077", "CYCLECRAWL_SPARK_MASTER": "local[2]"},
        "environment": {"CYCLECRAWL_ROOT": "/srv/env-root", "CYCLECRAWL_SPARK_MASTER": "local[2]"},
        "relative variable": {"AIRFLOW_VAR_CYCLECRAWL_ROOT": "crawl-data", "CYCLECRAWL_ROOT": "/srv/env-root"},
    }
    env = {**airflow_env, "CYCLECRAWL_DEADLINE_MINUTES": "90", "CYCLECRAWL_RUN_MINUTES": "55"}
    found = run_airflow_script(env, tmp_path, SETTINGS, str(DAGS), json.dumps(settings))

    by_variable, by_env = found["variable"], found["environment"]
    assert by_variable["errors"] == by_env["errors"] == []
    for dag_id in ("crawl_cycle", "crawl_continuous"):
        assert (by_variable[dag_id]["root"], by_variable[dag_id]["spark_master"]) == ("s3a://bucket/crawl",
                                                                                      "spark://master:7077")
        assert (by_env[dag_id]["root"], by_env[dag_id]["spark_master"]) == ("/srv/env-root", "local[2]")
    assert by_variable["crawl_cycle"]["outlets"] == {"update": ["s3://bucket/crawl/tables/index_events"],
                                                     "index": ["s3://bucket/crawl/tables/records"]}
    assert by_env["crawl_cycle"]["outlets"] == {"update": ["file:///srv/env-root/tables/index_events"],
                                                "index": ["file:///srv/env-root/tables/records"]}
    assert by_env["crawl_continuous"]["outlets"] == {"run": ["file:///srv/env-root/tables/index_events"]}
    notifier = ["cyclecrawl_dags.CrawlAlertNotifier", {"conn_id": "cyclecrawl_alerts"}]
    assert by_env["crawl_cycle"]["deadlines"] == [["DagRunQueuedAtDeadline", 90 * 60, *notifier]]
    assert by_env["crawl_continuous"]["deadlines"] == [["DagRunQueuedAtDeadline", (55 + 4) * 60, *notifier]]

    errors = found["relative variable"]["errors"]
    assert len(errors) == 2 and all("Airflow Variable cyclecrawl_root" in e and "(it is 'crawl-data')" in e
                                    for e in errors)


NOTIFY_DIRECTLY = """
    import json, logging, os, sys
    from types import SimpleNamespace

    sys.path.insert(0, sys.argv[1])
    from cyclecrawl_dags import CrawlAlertNotifier

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("cyclecrawl_dags").addHandler(Lines())
    ti = SimpleNamespace(dag_id="crawl_cycle", run_id="r1", task_id="update", try_number=2, log_url="http://x/log")
    found = {}
    for case, url in json.loads(sys.argv[2]).items():
        os.environ.pop("AIRFLOW_CONN_CYCLECRAWL_ALERTS", None)
        os.environ.update({"AIRFLOW_CONN_CYCLECRAWL_ALERTS": url} if url else {})
        lines = []
        CrawlAlertNotifier()({"ti": ti, "exception": RuntimeError("lost executor")})
        found[case] = lines
    print(json.dumps(found))
    """


def test_the_notifier_always_logs_its_alert_and_a_webhook_down_never_raises(airflow_env, tmp_path):
    """No `cyclecrawl_alerts` connection: the log line is the alert. A webhook that fails (HTTP 500) or is not there
    (a closed port) is logged and given up: the notifier returns, so nothing covers the failure it reports."""
    from tests.support.airflow import webhook_receiver

    with webhook_receiver(status=500) as failing:
        cases = {"no connection": "", "HTTP 500": failing.url("/hook"),
                 "closed port": f"http://127.0.0.1:{free_port()}/hook"}
        found = run_airflow_script(airflow_env, tmp_path, NOTIFY_DIRECTLY, str(DAGS), json.dumps(cases))
    alert = ('cyclecrawl alert: {"event": "task_failed", "dag_id": "crawl_cycle", "run_id": "r1", "task_id": '
             '"update", "try_number": 2, "exception": "lost executor", "log_url": "http://x/log"}')
    assert found["no connection"] == [alert]
    for case in ("HTTP 500", "closed port"):
        assert found[case][0] == alert and len(found[case]) == 2, found[case]
        assert found[case][1].startswith("alert not sent to the webhook of connection cyclecrawl_alerts at 127.0.0.1:")
    assert "HTTP Error 500" in found["HTTP 500"][1] and "Connection refused" in found["closed port"][1]
    assert [body["task_id"] for _, body in failing.received] == ["update"]  # the 500 one was posted


@pytest.fixture(scope="module")
def airflow_db(tmp_path_factory) -> Path:
    """A migrated metadata DB, copied by every test that runs DAGs (`deployment`): one migration per module."""
    home = tmp_path_factory.mktemp("airflow_db")
    airflow.migrate_airflow_db(airflow.airflow_env(home))
    return home / "airflow.db"


FAIL_FOR_GOOD = """
    import json, sys

    run = dag_bag(sys.argv[1]).dags["crawl_continuous"].test()
    print(json.dumps({ti.task_id: str(ti.state) for ti in run.get_task_instances()}))
    """


def test_a_task_failed_for_good_posts_its_alert_to_the_webhook(airflow_db, tmp_path):
    """`dag.test` runs crawl_continuous in a real Airflow with `crawl-submit` exiting 2 (a mistake in what was asked:
    no retry); the task's on_failure_callback, the notifier, POSTs the alert to the webhook of the `cyclecrawl_alerts`
    connection (its URI form): the run's ids, the try, the exception and the task's log URL."""
    from tests.support.airflow import deployment, webhook_receiver

    env = deployment(tmp_path, airflow_db)
    stub = tmp_path / "bin" / "crawl-submit"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 2\n")
    stub.chmod(0o755)
    with webhook_receiver() as webhook:
        env |= {"AIRFLOW_CONN_CYCLECRAWL_ALERTS": webhook.url("/hooks/crawl"),
                "PATH": f"{stub.parent}{os.pathsep}{env['PATH']}"}
        found = run_airflow_script(env, tmp_path, FAIL_FOR_GOOD, env["AIRFLOW__CORE__DAGS_FOLDER"])
    assert found == {"run": "failed"}
    ((path, alert),) = webhook.received
    assert path == "/hooks/crawl"
    assert {k: alert[k] for k in ("event", "dag_id", "task_id", "try_number")} == {
        "event": "task_failed", "dag_id": "crawl_continuous", "task_id": "run", "try_number": 1}
    assert alert["exception"].startswith("Bash command failed. The command returned a non-zero exit code 2.")
    assert alert["run_id"].startswith("manual__") and alert["log_url"].endswith(
        f"/dags/crawl_continuous/runs/{quote(alert['run_id'], safe='')}/tasks/run?try_number=1")


MISS_A_DEADLINE = """
    import json, pathlib, sys, time
    from datetime import datetime, timezone

    import structlog
    from sqlalchemy import select
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.callback import CallbackState, ExecutorCallback
    from airflow.models.deadline import Deadline
    from airflow.sdk.execution_time.callback_supervisor import execute_callback
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType

    # The DAG processor's part: the bundle's DAGs, their deadline alerts with them, into the metadata DB.
    folder = pathlib.Path(sys.argv[1])
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(BundleDagBag(dag_folder=folder, bundle_path=folder, bundle_name="dags-folder"), "dags-folder", None)
    # A triggered run is queued; its deadline is the queueing time plus the interval.
    trigger_dag("crawl_cycle", run_id="late-cycle", triggered_by=DagRunTriggeredByType.TEST)
    time.sleep(0.5)
    # The scheduler's part, in its loop: the deadlines past and not handled yet become executor callbacks.
    with create_session() as session:
        for deadline in session.scalars(select(Deadline).where(Deadline.deadline_time < datetime.now(timezone.utc),
                                                               ~Deadline.missed)):
            deadline.handle_miss(session)
    with create_session() as session:
        pending = [callback.data for callback in session.scalars(
            select(ExecutorCallback).where(ExecutorCallback.state == CallbackState.PENDING))]
    # The executor's part: the callback process puts the bundle on sys.path and runs the callback by its path.
    sys.path.append(str(folder))
    results = [execute_callback(data["path"], data["kwargs"], "crawl_cycle.py", folder, structlog.get_logger())
               for data in pending]
    print(json.dumps({"callbacks": [data["path"] for data in pending], "results": results}))
    """


def test_a_cycle_past_its_deadline_alerts_through_the_same_notifier(airflow_db, tmp_path):
    """A crawl_cycle run queued with a deadline of 0.001 min misses it: the scheduler's deadline handling queues the
    DAG's SyncCallback for the executor, and the callback, the alert notifier, POSTs `deadline_missed` with the
    run's ids and times to the same webhook."""
    from tests.support.airflow import deployment, webhook_receiver

    env = deployment(tmp_path, airflow_db) | {"CYCLECRAWL_DEADLINE_MINUTES": "0.001"}
    with webhook_receiver() as webhook:
        env["AIRFLOW_CONN_CYCLECRAWL_ALERTS"] = webhook.url("/hooks/late")
        found = run_airflow_script(env, tmp_path, MISS_A_DEADLINE, env["AIRFLOW__CORE__DAGS_FOLDER"])
    assert found == {"callbacks": ["cyclecrawl_dags.CrawlAlertNotifier"], "results": [[True, None]]}
    ((path, alert),) = webhook.received
    assert path == "/hooks/late"
    assert {k: alert[k] for k in ("event", "dag_id", "run_id")} == {
        "event": "deadline_missed", "dag_id": "crawl_cycle", "run_id": "late-cycle"}
    queued_at, deadline_time = (datetime.fromisoformat(alert[k]) for k in ("queued_at", "deadline_time"))
    assert abs((deadline_time - queued_at).total_seconds() - 0.06) < 0.01


ASSET_CONSUMER = """
    import json, sys
    from datetime import datetime, timezone

    from sqlalchemy import select
    from airflow.cli.cli_parser import get_parser
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    # The producer: a cycle whose update and index run (crawl-submit stubbed), every other task marked done.
    cycle = dag_bag(sys.argv[1]).dags["crawl_cycle"]
    run = cycle.test(logical_date=datetime(2026, 3, 1, 4, 0, tzinfo=timezone.utc), run_conf={"config": sys.argv[2]},
                     mark_success_pattern=r"(?!update$|index$).*")
    # The scheduler's step that creates runs, asset-triggered ones included (as in its loop).
    with create_session() as session, prohibit_commit(session) as guard:
        SchedulerJobRunner(job=Job(), executors=[])._create_dagruns_for_dags(guard, session)
    with create_session() as session:
        consumer_runs = [(r.run_id, str(r.run_type), [e.extra for e in r.consumed_asset_events])
                         for r in session.scalars(select(DagRun).where(DagRun.dag_id == "index_consumer"))]
    # The consumer's task in the run the Asset triggered: `airflow tasks test DAG TASK RUN_ID`.
    args = get_parser().parse_args(["tasks", "test", "index_consumer", "plan_indexing", consumer_runs[0][0]])
    args.func(args)
    with create_session() as session:
        plans = list(session.scalars(select(XComModel.value).where(XComModel.dag_id == "index_consumer")))
    print(json.dumps({"producer": run.run_id, "tasks": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
                      "consumer_runs": consumer_runs, "plans": plans}))
    """


def test_update_and_index_update_their_assets_and_the_example_consumer_runs_on_them(airflow_db, tmp_path):
    """The cycle's update and index tasks (crawl-submit stubbed) record Asset events for `index_events` and
    `records` with the run's root and segment; the scheduler creates a run of the example consumer
    (docs/examples/index_consumer_dag.py) for the `index_events` one, and the consumer's task in that run reads
    the triggering event and the Delta table (delta-rs) and plans the segment's rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tests.support.airflow import deployment

    env = deployment(tmp_path, airflow_db)
    root = env["CYCLECRAWL_ROOT"]
    segment = "seg-20260301T040000Z"
    write_deltalake(layout.table_path(root, "index_events"),
                    pa.table({"segment_id": [segment] * 3 + ["seg-20260301T030000Z"], "url": list("abcd")}))
    config = tmp_path / "indexing.yaml"
    config.write_text("index:\n  enabled: true\n")
    stub = tmp_path / "bin" / "crawl-submit"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    env["PATH"] = f"{stub.parent}{os.pathsep}{env['PATH']}"
    found = run_airflow_script(env, tmp_path, ASSET_CONSUMER, env["AIRFLOW__CORE__DAGS_FOLDER"], str(config))
    assert found["tasks"]["update"] == found["tasks"]["index"] == "success"
    ((run_id, run_type, consumed),) = found["consumer_runs"]
    assert run_type == "asset_triggered" and consumed == [{"root": root, "segment_id": segment}]
    assert found["plans"] == [[{"segment_id": segment, "rows": 3, "version": 0,
                                "source": f"crawl_cycle/{found['producer']}/update"}]]


SENSOR_AT_DEADLINE = """
    import json, sys
    from datetime import datetime, timezone
    from types import SimpleNamespace

    sys.path.insert(0, sys.argv[1])
    from crawl_cycle import SegmentFetchedSensor, segment_id

    run = SimpleNamespace(logical_date=datetime(2026, 3, 1, 4, 0, tzinfo=timezone.utc), run_after=None)
    sensor = SegmentFetchedSensor(task_id="s", deadline_minutes=sys.argv[3], mode="poke", poke_interval=0.05)
    context = {"params": {"root": sys.argv[2], "config": ""}, "dag_run": run}
    print(json.dumps({"segment": segment_id(run), "returned": sensor.execute(context)}))
    """


def test_sensor_at_its_deadline_closes_the_segment_and_returns_the_unfinished_buckets(airflow_env, tmp_path, root):
    segment = "seg-20260301T040000Z"
    make_buckets(root, segment, listed=[0, 2, 5], done=[2])
    found = run_airflow_script(airflow_env, tmp_path, SENSOR_AT_DEADLINE, str(DAGS), root, "0.003")
    assert found == {"segment": segment, "returned": [0, 5]}
    marker = json.loads(Path(layout.closed_marker(root, segment)).read_text())
    assert marker["unfinished_buckets"] == [0, 5] and "deadline" in marker["reason"]
    assert segment_progress(root, segment).closed

    # A closed segment is not waited for (a cleared task runs again): no daemon will finish it.
    found = run_airflow_script(airflow_env, tmp_path, SENSOR_AT_DEADLINE, str(DAGS), root, "10")
    assert found["returned"] == [0, 5]


def test_sensor_returns_nothing_for_a_finished_segment_and_does_not_close_it(airflow_env, tmp_path, root):
    make_buckets(root, "seg-20260301T040000Z", listed=[0, 2], done=[0, 2])
    found = run_airflow_script(airflow_env, tmp_path, SENSOR_AT_DEADLINE, str(DAGS), root, "10")
    assert found["returned"] == []
    assert not os.path.exists(layout.closed_marker(root, "seg-20260301T040000Z"))


DECISIONS = """
    import json, sys
    from datetime import datetime, timezone
    from types import SimpleNamespace

    dag = dag_bag(sys.argv[1]).dags["crawl_cycle"]
    choose_fetch = dag.task_dict["fetch"].python_callable
    maintenance_due = dag.task_dict["maintenance_due"].python_callable

    def run_at(hour):
        return SimpleNamespace(logical_date=None, run_after=datetime(2026, 3, 1, hour, 30, tzinfo=timezone.utc))

    params = {"root": sys.argv[2], "config": ""}
    print(json.dumps({
        "fetch": {mode: choose_fetch(params={**params, "fetch_mode": mode}, dag_run=run_at(4))
                  for mode in ("daemons", "task")},
        "fetch_nothing_due": choose_fetch(params={**params, "fetch_mode": "daemons"}, dag_run=run_at(5)),
        "maintain": {f"{m}@{h}": maintenance_due(params={"maintain": m}, dag_run=run_at(h))
                     for m in ("auto", "always", "never") for h in (3, 4)},
        "fetch_command": dag.task_dict["fetch_segment"].bash_command,
        "index": [dag.task_dict["index_enabled"].python_callable(params={**params, "config": config})
                  for config in ("", sys.argv[3] if len(sys.argv) > 3 else "")],
    }))
    """


def test_dag_decisions_fetch_mode_nothing_due_and_maintenance_hour(airflow_env, tmp_path, root):
    make_buckets(root, "seg-20260301T043000Z", listed=[1], done=[])
    config = tmp_path / "indexing.yaml"
    config.write_text("index:\n  enabled: true\n")
    found = run_airflow_script(airflow_env, tmp_path, DECISIONS, str(DAGS), root, str(config))
    assert found["index"] == [False, True]  # index.enabled: off by default, on from the run's config
    assert found["fetch"] == {"daemons": "await_daemons", "task": "fetch_segment"}
    assert found["fetch_nothing_due"] is None  # no fetch list for the 05:30 run's segment: skip the rest
    assert found["maintain"] == {"auto@3": True, "auto@4": False, "always@3": True, "always@4": True,
                                 "never@3": False, "never@4": False}


FRONTIER = """
    import json, sys
    from datetime import datetime, timezone
    from types import SimpleNamespace
    from airflow.exceptions import AirflowFailException

    dag = dag_bag(sys.argv[1]).dags["crawl_cycle"]
    frontier = dag.task_dict["frontier"].python_callable
    found = {}
    for hour, limit in ((4, 0), (4, 3), (4, 1), (5, 0)):
        params = {"root": sys.argv[2], "config": "", "alert_oldest_due_hours": limit}
        run = SimpleNamespace(logical_date=None, run_after=datetime(2026, 3, 1, hour, 30, tzinfo=timezone.utc))
        try:
            found[f"{hour}/{limit}"] = frontier(params=params, dag_run=run)
        except AirflowFailException as exc:
            found[f"{hour}/{limit}"] = f"alert: {exc}"
        except RuntimeError as exc:
            found[f"{hour}/{limit}"] = f"failed: {exc}"
    print(json.dumps(found))
    """


def test_frontier_task_reads_the_segments_figures_without_spark_and_alerts_past_the_limit(airflow_env, tmp_path,
                                                                                         root):
    """The DAG's frontier task reads its run's `cycle_metrics` rows with delta-rs (here a table delta-rs wrote; the
    whole-cycle test reads Spark's): it returns them, fails as an alert (no retry) when the oldest due URL waited
    longer than alert_oldest_due_hours, and fails when update recorded nothing."""
    import pyarrow as pa
    from deltalake import write_deltalake

    segment, other = "seg-20260301T043000Z", "seg-20260301T053000Z"
    at = datetime(2026, 3, 1, 4, 30, tzinfo=UTC)
    write_deltalake(layout.table_path(root, "cycle_metrics"), pa.table({
        "segment_id": [segment, segment, other], "step": ["generate", "update", "generate"],
        "run_at": pa.array([at, at, at], pa.timestamp("us", "UTC")), "due_urls": [40, None, 9],
        "oldest_due_age_s": [7200.0, None, 10.0], "stale": [None, 2, None]}))
    found = run_airflow_script(airflow_env, tmp_path, FRONTIER, str(DAGS), root)
    assert found["4/0"]["generate"]["due_urls"] == 40 and found["4/0"]["update"]["stale"] == 2
    assert found["4/0"]["generate"]["run_at"].startswith("2026-03-01T04:30:00")
    assert found["4/3"] == found["4/0"]  # waited 2 h: under a 3 h limit
    assert found["4/1"].startswith(f"alert: {segment}: the oldest due URL had waited 2.0 h")
    assert found["5/0"].startswith(f"failed: cycle_metrics has no update row for {other}")


SERVICE_LEVELS = """
    import json, sys
    from datetime import datetime, timezone
    from types import SimpleNamespace
    from airflow.exceptions import AirflowFailException

    dag = dag_bag(sys.argv[1]).dags["crawl_cycle"]
    task = dag.task_dict["service_levels"]
    found = {"downstream": sorted(task.downstream_task_ids), "upstream": sorted(task.upstream_task_ids)}
    for hour in (4, 5, 6):
        params = {"root": sys.argv[2], "config": ""}
        run = SimpleNamespace(logical_date=None, run_after=datetime(2026, 3, 1, hour, 30, tzinfo=timezone.utc))
        try:
            found[str(hour)] = task.python_callable(params=params, dag_run=run)
        except AirflowFailException as exc:
            found[str(hour)] = f"alert: {exc}"
    print(json.dumps(found))
    """


def test_service_levels_task_alerts_when_a_segment_missed_a_level(airflow_env, tmp_path, root):
    """The DAG's service_levels task reads its run's `cycle_metrics` rows with delta-rs: both levels met, or nothing
    measured, is no alert; a missed level fails the task (no retry) with the figures and the target. A leaf after
    update: it holds back nothing, and the next run's generate never waits for it."""
    import pyarrow as pa
    from deltalake import write_deltalake

    met, missed, unmeasured = "seg-20260301T043000Z", "seg-20260301T053000Z", "seg-20260301T063000Z"
    at = datetime(2026, 3, 1, 4, 30, tzinfo=UTC)
    write_deltalake(layout.table_path(root, "cycle_metrics"), pa.table({
        "segment_id": [met, met, missed, missed, unmeasured, unmeasured],
        "step": ["generate", "update"] * 3,
        "run_at": pa.array([at] * 6, pa.timestamp("us", "UTC")),
        "hp_eligible": [5, None, 100, None, 0, None],
        "hp_leased_within": [5, None, 90, None, 0, None],
        "hp_leased_late": [0, None, 4, None, 0, None],
        "hp_waiting_late": [0, None, 6, None, 0, None],
        "lease_share_within": [1.0, None, 0.9, None, None, None],
        "discovery_pages": [None, 8, None, 40, None, 0],
        "discovery_durable_p99_s": [None, 42.0, None, 75.2, None, None]}))
    found = run_airflow_script(airflow_env, tmp_path, SERVICE_LEVELS, str(DAGS), root)
    assert (found["upstream"], found["downstream"]) == (["update"], [])
    assert found["4"] == {"lease_share_within": 1.0, "hp_eligible": 5, "discovery_durable_p99_s": 42.0,
                          "discovery_pages": 8}
    assert found["5"] == (
        f"alert: {missed}: service level missed: discovery: p99 of 40 pages' fetch-to-durable lags is 75 s, over the "
        "60 s target; leases: 90 of 100 eligible high-priority URLs leased within 600 s (90.0 %), under the 99 % "
        "target")
    assert found["6"]["discovery_pages"] == 0  # nothing measured: no alert


STEP_EXITS = """
    import json, os, sys
    from collections import defaultdict
    from types import SimpleNamespace
    from airflow.exceptions import AirflowException, AirflowFailException, AirflowSkipException

    tasks = dag_bag(sys.argv[1]).dags["crawl_cycle"].task_dict
    found = {}
    for task_id in sys.argv[2:]:
        for status in ("75", "4", "3", "2", "1", "0"):
            os.environ["STUB_STATUS"] = status
            try:
                tasks[task_id].execute({"outlet_events": defaultdict(lambda: SimpleNamespace(extra={}))})
                found[f"{task_id} {status}"] = "success"
            except AirflowSkipException as skip:
                found[f"{task_id} {status}"] = "skipped"
                found[f"{task_id} {status} reason"] = str(skip)
            except AirflowFailException:
                found[f"{task_id} {status}"] = "failed, no retry"
            except AirflowException:
                found[f"{task_id} {status}"] = "failed"
    print(json.dumps(found))
    """


def test_exit_75_skips_generate_and_inject_and_update_retries_it(airflow_env, tmp_path):
    """The real BashOperators, `crawl-submit` stubbed: exit 75 (crawler.errors.EXIT_TRY_LATER: backpressure, the
    crawl's writer lock held elsewhere) skips generate (and so the run: every later step needs it) and inject (its
    seeds wait for the next run); update fails on it like on any failure, to be retried (a segment must be merged
    before generate leases anew). Exit 4 (crawler.errors.EXIT_GATE_CLOSED: an earlier validation failed) skips
    generate too, the skip's reason the refusal's line. Exit 2 (a mistake in what was asked) fails every step for
    good, as exit 3 (a failed expectation) fails validate: a retry would repeat them. Any other failure fails each,
    to be retried."""
    stub = tmp_path / "bin" / "crawl-submit"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\n'
                    'echo "crawl $2: refused with $STUB_STATUS" >&2\nexit "$STUB_STATUS"\n')
    stub.chmod(0o755)
    env = {**airflow_env, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}
    found = run_airflow_script(env, tmp_path, STEP_EXITS, str(DAGS), "generate", "inject", "update", "validate")
    retried_or_not = {"2": "failed, no retry", "1": "failed", "0": "success"}
    expected = {}
    for task_id, on_75, on_4, on_3 in (("generate", "skipped", "skipped", "failed"),
                                       ("inject", "skipped", "failed", "failed"),
                                       ("update", "failed", "failed", "failed"),
                                       ("validate", "failed", "failed", "failed, no retry")):
        expected |= {f"{task_id} 75": on_75, f"{task_id} 4": on_4, f"{task_id} 3": on_3,
                     **{f"{task_id} {code}": outcome for code, outcome in retried_or_not.items()}}
        expected |= {f"{task_id} {code} reason": f"exit {code}: crawl {task_id}: refused with {code}"
                     for code, outcome in (("75", on_75), ("4", on_4)) if outcome == "skipped"}
    assert found == expected
    assert (EXIT_TRY_LATER, EXIT_USER_ERROR, validate.EXIT_VALIDATION_FAILED, EXIT_GATE_CLOSED) == (75, 2, 3, 4)


CLOSE = 'crawl close-segment --fetch-only --segment seg-1 --reason fetch deadline reached (fetch_segment) --root /r\n'


@pytest.mark.parametrize(("crawl_fetch", "deadline_s", "status", "close"), [
    ("exit 0", 10, 0, ""),
    ("exec sleep 30", 1, 0, CLOSE),  # stopped at the deadline: the segment is closed and the cycle goes on
    ("exit 3", 10, 3, ""),           # a real failure still fails the task (and is retried)
], ids=["finished", "deadline", "failed"])
def test_task_mode_fetch_is_bounded_by_the_deadline(airflow_env, tmp_path, crawl_fetch, deadline_s, status, close):
    found = run_airflow_script(airflow_env, tmp_path, DECISIONS, str(DAGS), str(tmp_path))
    stub = tmp_path / "bin" / "crawl"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\necho \"crawl $*\" >> {tmp_path}/calls\n"
                    f"[ \"$1\" = fetch ] || exit 0\n{crawl_fetch}\n")
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}", "FETCH_DEADLINE_S": str(deadline_s),
           "SEGMENT": "seg-1", "CRAWL_ROOT": "/r", "CRAWL_CONFIG": ""}
    result = subprocess.run(["bash", "-c", found["fetch_command"]], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == status, result.stdout + result.stderr
    assert (tmp_path / "calls").read_text() == "crawl fetch --segment seg-1 --root /r\n" + close


def test_close_segment_command_writes_the_marker_once(root):
    make_buckets(root, "seg-1", listed=[0, 1], done=[1])
    command = [sys.executable, "-m", "jobs.cli", "close-segment", "--segment", "seg-1", "--root", root]
    result = subprocess.run([*command, "--reason", "deadline"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "unfinished buckets: [0]" in result.stdout
    marker = json.loads(Path(layout.closed_marker(root, "seg-1")).read_text())
    assert marker["reason"] == "deadline" and marker["unfinished_buckets"] == [0] and marker["closed_at"]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=60)  # a retry keeps the first
    assert json.loads(Path(layout.closed_marker(root, "seg-1")).read_text()) == marker


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_one_cycle_through_airflow_with_a_fetch_daemon(spark, airflow_cycle):
    """`dag.test` drove one whole cycle: Spark steps through crawl-submit, the fetch by a `fetchd serve` daemon
    running beside it on the same root; then the tables hold the segment's fetches, pages and URLs."""
    from delta_tables import table_df

    assert airflow_cycle.daemon_returncode == 0, airflow_cycle.daemon_log[-3000:]
    assert airflow_cycle.tasks == {
        "inject": "success", "generate": "success", "fetch": "success", "await_daemons": "success",
        "fetch_segment": "skipped", "parse": "success", "dedup": "success", "update": "success",
        "index_enabled": "success", "index": "success",  # the run's config turns index.enabled on
        "frontier": "success",  # it read the segment's cycle_metrics rows that generate and update wrote
        "service_levels": "success",  # the same rows, both levels within the hour-wide targets of this run
        "validate": "success", "maintenance_due": "success", "maintain": "skipped"}

    root, segment, seed_urls = str(airflow_cycle.root), airflow_cycle.segment, airflow_cycle.seed_urls
    fetches = table_df(spark, root, "fetches").where(f"segment_id = '{segment}'")
    answered = {r["url"] for r in fetches.where("status_code is not null").collect()}
    assert seed_urls <= answered
    assert seed_urls <= set(map(requested_url, airflow_cycle.farm_log))  # fetched from the farm, for real
    urls = table_df(spark, root, "urls")
    fetched_urls = {r["url"] for r in urls.where("status = 'fetched'").collect()}
    assert seed_urls <= fetched_urls
    assert urls.where(f"lease_segment = '{segment}'").count() == 0  # every fetched URL's lease completed
    pages = table_df(spark, root, "pages").where(f"segment_id = '{segment}'")
    assert pages.count() > 0 and pages.where("title is not null").count() > 0
    # The index path: every response record of the segment's WARC files in `records`, each file's CDXJ beside it.
    records = table_df(spark, root, "records").where(f"warc_segment = '{segment}'").collect()
    assert {r["url"] for r in records if r["warc_record_type"] == "response"} >= seed_urls
    warc_files = {r["warc_filename"] for r in records}
    assert warc_files == {r["warc_filename"] for r in fetches.where("warc_filename is not null").collect()}
    assert all(Path(root, layout.cdxj_filename(name)).exists() for name in warc_files)
