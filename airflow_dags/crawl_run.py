"""Airflow 3 DAG `crawl_continuous`: the continuous driver (`crawl run`) supervised by Airflow.

    run   (one task: `crawl-submit -- run --for <run_minutes>`, hourly, one run at a time)

Why a supervised long run and not the cycle DAG at a short cadence: `crawl run` keeps a segment every
`cycle.interval_s` (30 s by default) going in one SparkSession, parsing a segment as soon as its fetch ends so its
links are durable within `service_levels.discovery_durable_s`. The cycle DAG (`crawl_cycle.py`) pays a spark-submit
(a JVM start, the Delta log reads) per step and the scheduler's own latency per task, a minute or more per cycle
before any work: it cannot keep a 30-second cadence, and an hourly cycle cannot meet the service levels. So
Airflow starts the driver every hour for `run_minutes` (55 by default); the driver stops itself then as on SIGTERM
(the step in progress finishes, its fetch daemon child publishes and releases its buckets) and exits 0, and the
next run resumes from the tables. `max_active_runs=1` keeps one driver per root (one writer per table); the task's
`execution_timeout` (run_minutes + 4) ends a driver that did not stop: Airflow's SIGTERM stops it the same way, and
a kill -9 loses nothing either (the next run resumes every open segment). Exit 75 (the crawl's settings changed
under its daemon child, another command holding the writer lock) skips the run; exit 2 (a mistake in what was asked:
a config key, a file) and exit 4 (the quality gate closed: the driver's own validation, or a `crawl validate`, failed;
the driver merged its open segments and stopped, crawler/gate.py) fail it without retries, the alert naming the table
and expectation (there is no validate task here to alert); any other failure is retried.

With `daemons: false` the driver starts no fetch daemon: long-running `crawl fetchd` services fetch (the cycle
DAG's `daemons` mode); with true (the default) it runs one as its child, for one machine.
Deployment defaults come from the Airflow Variable, Connection and environment, as for the cycle DAG, and so do its
alerts: a run failed for good, or a driver not stopped `run_minutes` + 4 after its run was queued (the deadline).
The run task updates the `index_events` Asset (not `records`: whether a run indexes is its config's
`index.enabled`, known only to the run). Use one of the two DAGs on a root, not both.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param
from cyclecrawl_dags import (
    CONFIG_ARGS,
    CRAWL_ENV,
    DEFAULT_ARGS,
    EXIT_GATE_CLOSED,
    EXIT_TRY_LATER,
    SUBMIT,
    CrawlCommand,
    crawl_params,
    default_root,
    missed_deadline,
    table_asset,
)

SCHEDULE = os.environ.get("CYCLECRAWL_RUN_SCHEDULE", "@hourly")
RUN_MINUTES = float(os.environ.get("CYCLECRAWL_RUN_MINUTES", "55"))
STOP_MARGIN_MINUTES = 4  # the step in progress and the daemon child's stop, after --for
ROOT = default_root()

STEP_ENV = {
    **CRAWL_ENV,
    "RUN_SECONDS": "{{ (params.run_minutes * 60) | int }}",
    "NO_DAEMON": "{{ '' if params.daemons else '--no-daemon' }}",
}

with DAG(
    dag_id="crawl_continuous",
    description="crawl run --for <run_minutes>: the continuous driver, started every hour",
    schedule=SCHEDULE,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # one driver per root
    dagrun_timeout=timedelta(minutes=RUN_MINUTES + 2 * STOP_MARGIN_MINUTES),  # the task's own bound, and a margin
    deadline=missed_deadline(timedelta(minutes=RUN_MINUTES + STOP_MARGIN_MINUTES)),  # the driver overran its stop
    default_args=DEFAULT_ARGS,
    tags=["cyclecrawl"],
    params={
        **crawl_params(ROOT),
        "run_minutes": Param(RUN_MINUTES, type="number", exclusiveMinimum=0, maximum=RUN_MINUTES,
                             description="the driver stops itself (as on SIGTERM) after this long (at most "
                                         "CYCLECRAWL_RUN_MINUTES, which the task's execution_timeout follows)"),
        "daemons": Param(os.environ.get("CYCLECRAWL_RUN_DAEMON", "true") == "true", type="boolean",
                         description="true: the driver runs its own fetch daemon; false: daemons run as services"),
    },
    doc_md=__doc__,
) as dag:
    CrawlCommand(
        task_id="run",
        bash_command=f'{SUBMIT} run --for "$RUN_SECONDS" $NO_DAEMON {CONFIG_ARGS}',
        env=STEP_ENV, append_env=True,
        execution_timeout=timedelta(minutes=RUN_MINUTES + STOP_MARGIN_MINUTES),
        skip_on_exit_code=EXIT_TRY_LATER,
        fail_on_exit_code=(EXIT_GATE_CLOSED,),
        outlets=[table_asset(ROOT, "index_events")],
        doc_md="`crawl run --for run_minutes`: the continuous driver until then (docs/architecture.md, Continuous "
               "operation); exit 0 when it stopped itself, 75 skips the run, 4 (the quality gate closed) fails it "
               "without retries, anything else is retried.",
    )
