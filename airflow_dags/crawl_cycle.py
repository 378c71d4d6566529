"""Airflow 3 DAG `crawl_cycle`: one crawl cycle per run, with the fetch left to the daemons.

    inject -> generate -> fetch -> {await_daemons | fetch_segment} -> parse -> dedup -> update
           -> [index_enabled -> index] -> validate -> maintenance_due -> maintain
    update -> frontier (reads the segment's cycle_metrics; fails, as an alert, past alert_oldest_due_hours)
    update -> service_levels (fails, as an alert, when the segment missed a service level)

Every Spark step is `crawl-submit [--master M] -- <crawl command>`, one spark-submit per step, so the same DAG
drives `local[*]` on one machine and a cluster master; the scheduler's workers need the cyclecrawl package
(for `crawl`, `crawl-submit` and the fetch sensor) but no JVM of their own beyond spark-submit's driver.
Deployment defaults come from the Airflow Variable `cyclecrawl_root`, the Connection `cyclecrawl_spark` and the
environment (CYCLECRAWL_*), read when the file is parsed (cyclecrawl_dags.py); each run's params (or its conf)
override them. A task that fails for good, and a run not done `CYCLECRAWL_DEADLINE_MINUTES` after it was queued,
alert through `cyclecrawl_dags.CrawlAlertNotifier` (a log line, and the `cyclecrawl_alerts` webhook). update and
index update the Assets of `index_events` and `records`, which indexing DAGs can be scheduled on
(docs/examples/index_consumer_dag.py).
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, BaseSensorOperator, Param, PokeReturnValue, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout
from cyclecrawl_dags import (
    CONFIG_ARGS,
    CRAWL_ENV,
    CYCLE_DEADLINE,
    DEFAULT_ARGS,
    EXIT_GATE_CLOSED,
    EXIT_TRY_LATER,
    EXIT_VALIDATION_FAILED,
    STEP_TIMEOUT,
    SUBMIT,
    CrawlCommand,
    crawl_params,
    default_root,
    missed_deadline,
    table_asset,
)

log = logging.getLogger(__name__)

SCHEDULE = os.environ.get("CYCLECRAWL_SCHEDULE", "@hourly")
POKE_INTERVAL_S = float(os.environ.get("CYCLECRAWL_POKE_INTERVAL_S", "60"))
MAINTAIN_HOUR_UTC = int(os.environ.get("CYCLECRAWL_MAINTAIN_HOUR", "3"))
FETCH_MODES = ("daemons", "task")
EXIT_TIMEOUT = 124  # what coreutils `timeout` exits with when the deadline killed the command
NO_SEEDS = 99  # the inject task's own exit when the run has no seeds file: BashOperator's default skip code
ROOT = default_root()
# What indexing pipelines consume, as Assets of the parse-time root: update's events, index's WARC records.
INDEX_EVENTS, RECORDS = table_asset(ROOT, "index_events"), table_asset(ROOT, "records")

# Values the cycle's command lines need beyond the crawl's (cyclecrawl_dags.CRAWL_ENV).
STEP_ENV = {
    **CRAWL_ENV,
    "SEGMENT": "{{ segment_id(dag_run) }}",
    "SEEDS": "{{ params.seeds or '' }}",
    "SEGMENT_MAX_URLS": "{{ params.segment_max_urls if params.segment_max_urls is not none else '' }}",
    "FETCH_DEADLINE_S": "{{ (params.fetch_deadline_minutes * 60) | int }}",
    "VALIDATION_OUT": "{{ params.validation_out or '' }}",
}


def segment_id(dag_run: Any) -> str:
    """The run's segment: `crawl generate`'s own default id (seg-<UTC time>) at the run's logical date, or at
    its run_after for a manual run without one. The same on every retry of the run, and time-ordered, which is
    the order the daemons work through pending segments in."""
    from crawler import layout
    from jobs.generate import default_segment_id

    return layout.check_segment_id(default_segment_id(dag_run.logical_date or dag_run.run_after))


def crawl_conf(params: dict[str, Any]) -> Any:
    """The config the crawl commands use: the `config` file, with the `root` param over its storage.root (its
    s3.* keys serve an s3:// root)."""
    from crawler import config as config_mod

    conf = config_mod.load(params.get("config") or None)
    return conf.with_overrides({"storage.root": params["root"]}) if params.get("root") else conf


def segment_progress(params: dict[str, Any], dag_run: Any) -> Any:
    """The run's segment's `fetchd.progress.SegmentProgress`."""
    from fetchd import progress

    conf = crawl_conf(params)
    return progress.segment_progress(conf.storage.root, segment_id(dag_run), conf)


def close_segment(params: dict[str, Any], dag_run: Any, reason: str) -> Any:
    """Write the run's segment's `_CLOSED.json` (`fetchd.progress.close_segment`): the daemons release its
    unfinished buckets. The `SegmentProgress` it was closed with."""
    from fetchd import progress

    conf = crawl_conf(params)
    return progress.close_segment(conf.storage.root, segment_id(dag_run), reason, conf)


def spark_step(task_id: str, command: str, doc_md: str, **kwargs: Any) -> CrawlCommand:
    """A Spark step: `crawl-submit -- <command>`, bounded by STEP_TIMEOUT, exit 2 not retried (CrawlCommand)."""
    return CrawlCommand(task_id=task_id, bash_command=f"{SUBMIT} {command} {CONFIG_ARGS}", env=STEP_ENV,
                        append_env=True, doc_md=doc_md, execution_timeout=STEP_TIMEOUT, **kwargs)


class SegmentFetchedSensor(BaseSensorOperator):
    """Waits until every bucket of the run's segment that has a fetch list has its `_DONE.json` manifest.

    At the fetch deadline it does not fail: it closes the segment (`_CLOSED.json`, so the daemons release its
    unfinished buckets), logs the unfinished buckets, returns them (XCom) and the cycle goes on with what was
    fetched. A segment found closed already (a cleared and rerun task) is not waited for."""

    template_fields = ("deadline_minutes",)

    def __init__(self, *, deadline_minutes: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deadline_minutes = deadline_minutes

    def poke(self, context: Any) -> PokeReturnValue:
        progress = segment_progress(context["params"], context["dag_run"])
        self.log.info("segment %s: %d of %d buckets done%s", segment_id(context["dag_run"]), len(progress.done),
                      len(progress.listed), " (closed: no daemon fetches the others)" if progress.closed else "")
        return PokeReturnValue(is_done=progress.complete or progress.closed, xcom_value=progress.unfinished)

    def execute(self, context: Any) -> list[int]:
        # The deadline is a run param, known only now; the base class measures it from the first poke.
        self.timeout = float(self.deadline_minutes) * 60
        try:
            return super().execute(context)
        except AirflowSensorTimeout:
            progress = close_segment(context["params"], context["dag_run"],
                                     f"fetch deadline of {self.deadline_minutes} min reached ({self.task_id})")
            self.log.warning("fetch deadline of %s min reached: segment closed, going on without buckets %s (the "
                             "daemons release them; their URLs come back when their leases expire)",
                             self.deadline_minutes, progress.unfinished)
            return progress.unfinished


with DAG(
    dag_id="crawl_cycle",
    description="inject -> generate -> fetch -> parse -> dedup -> update -> validate (-> maintain)",
    schedule=SCHEDULE,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # cycles must not overlap: each one's generate leases what the previous one updated
    # A run stuck past this fails, and the next one starts (its generate waits for what this one left open).
    dagrun_timeout=timedelta(minutes=float(os.environ.get("CYCLECRAWL_CYCLE_TIMEOUT_MINUTES", "360"))),
    deadline=missed_deadline(CYCLE_DEADLINE),  # a late run is an alert well before it times out
    default_args=DEFAULT_ARGS,
    user_defined_macros={"segment_id": segment_id},
    tags=["cyclecrawl"],
    params={
        **crawl_params(ROOT, "YAML config file (absolute path) for every crawl command; empty = defaults"),
        "segment_max_urls": Param(None, type=["null", "integer"], minimum=1,
                                  description="generate.segment_max_urls for this run; empty = the config's"),
        "seeds": Param("", type="string", description="seeds file to inject first (absolute path); empty = none"),
        "fetch_mode": Param(os.environ.get("CYCLECRAWL_FETCH_MODE", "daemons"), enum=list(FETCH_MODES),
                            description="daemons: wait for the long-running fetch daemons; "
                                        "task: run a bounded `crawl fetch` here (local demo)"),
        "fetch_deadline_minutes": Param(45, type="number", exclusiveMinimum=0,
                                        description="the fetch step goes on without unfinished buckets after this"),
        "validation_out": Param("", type="string",
                                description="local folder for crawl validate's report and Data Docs; "
                                            "empty = ROOT/validation (an s3:// root's too)"),
        "alert_oldest_due_hours": Param(float(os.environ.get("CYCLECRAWL_ALERT_OLDEST_DUE_HOURS", "0")),
                                        type="number", minimum=0,
                                        description="the frontier task fails (an alert) when the oldest due URL "
                                                    "had waited longer than this at generate; 0 = never"),
        "maintain": Param("auto", enum=["auto", "always", "never"],
                          description=f"auto: maintain in the run whose time is {MAINTAIN_HOUR_UTC}:00-59 UTC"),
    },
    doc_md=__doc__,
) as dag:
    inject = CrawlCommand(
        task_id="inject", execution_timeout=STEP_TIMEOUT,
        bash_command=(f'if [ -z "$SEEDS" ]; then echo "no seeds file: nothing to inject"; exit {NO_SEEDS}; fi\n'
                      f'{SUBMIT} inject --seeds "$SEEDS" {CONFIG_ARGS}'),
        env=STEP_ENV, append_env=True,
        doc_md="`crawl inject --seeds` when the run has a seeds file (it also probes the seeds' sitemaps); "
               "skipped otherwise, and on exit 75 (another command held the crawl's writer lock: the seeds wait for "
               "the next run).",
        skip_on_exit_code=[NO_SEEDS, EXIT_TRY_LATER],
    )
    generate = spark_step(
        "generate",
        'generate --segment "$SEGMENT" ${SEGMENT_MAX_URLS:+--set generate.segment_max_urls="$SEGMENT_MAX_URLS"}',
        "`crawl generate --segment seg-<run time>`: due URLs into the segment's fetch lists, leased to it. Exit 75 "
        "(backpressure: an earlier segment finished fetching but is not merged, or too many are open) skips the run "
        "instead of failing it: no retries, no new leases, the next run asks again. Exit 4 (the quality gate is "
        "closed: an earlier run's validate failed, crawler/gate.py) skips it too, the skip's reason naming the table "
        "and expectation, until `crawl validate` passes again (or an operator runs `crawl generate --override-gate`).",
        trigger_rule="none_failed",  # runs after a skipped inject
        skip_on_exit_code=[EXIT_TRY_LATER, EXIT_GATE_CLOSED],
    )

    @task.branch(task_id="fetch", doc_md="Chooses the fetch by the `fetch_mode` param; skips the rest of the "
                                         "cycle when generate found nothing due (no fetch list).")
    def choose_fetch(params: dict[str, Any], dag_run: Any) -> str | None:
        if not segment_progress(params, dag_run).listed:
            log.info("nothing was due: no fetch list, nothing to fetch, parse or update")
            return None
        return "await_daemons" if params["fetch_mode"] == "daemons" else "fetch_segment"

    await_daemons = SegmentFetchedSensor(
        task_id="await_daemons",
        deadline_minutes="{{ params.fetch_deadline_minutes }}",
        mode="reschedule",  # frees the worker slot between pokes
        poke_interval=POKE_INTERVAL_S,
        doc_md="""Waits for the long-running fetch daemons (`crawl fetchd` / `fetchd serve`, run as services)
to write `_DONE.json` in every bucket of the segment that has a fetch list.

At `fetch_deadline_minutes` after its first poke it does **not** fail: it closes the segment (writes
`ROOT/segments/<id>/_CLOSED.json` with the unfinished buckets), logs the unfinished buckets, returns them as
its XCom and the cycle goes on with what was fetched. A daemon still fetching such a bucket notices the marker
within `fetch.poll_interval_s` and stops it as on SIGTERM: no new requests, requests in flight get
`ownership.shutdown_grace_s`, results so far published, lease released, no `_DONE.json`; no daemon starts a
closed segment's bucket. The unfinished buckets' URLs are not lost: update completes only the URLs with
results; the others keep their lease until it expires (generate.lease_seconds) and a later generate selects
them again. A segment already closed when the sensor starts (a cleared task) is not waited for.""",
    )
    fetch_segment = CrawlCommand(
        task_id="fetch_segment",
        bash_command=(f'timeout --kill-after=60 "$FETCH_DEADLINE_S" crawl fetch --segment "$SEGMENT" {CONFIG_ARGS}'
                      f' || {{ status=$?; [ $status -eq {EXIT_TIMEOUT} ] || exit $status;'
                      ' echo "fetch deadline reached: closing the segment, going on with what was fetched";'
                      ' crawl close-segment --fetch-only --segment "$SEGMENT"'
                      ' --reason "fetch deadline reached (fetch_segment)"'
                      f' {CONFIG_ARGS}; }}'),
        env=STEP_ENV, append_env=True,
        doc_md="""`crawl fetch --segment S` in the worker: one daemon fetches the segment's buckets and exits
(the local demo, no daemons running). Bounded by `fetch_deadline_minutes`: at the deadline `timeout` sends
SIGTERM, and the fetch stops as a daemon does (requests in flight get `ownership.shutdown_grace_s`, results
published, WARC files closed, leases released, no `_DONE.json` for an unfinished bucket); then
`crawl close-segment --fetch-only` writes `_CLOSED.json` and the cycle goes on (the unfinished buckets' URLs come back
through lease expiry, as with daemons).""",
    )
    parse = spark_step(
        "parse", 'parse --segment "$SEGMENT"',
        "`crawl parse`: the segment's WARC records into pages and links.",
        trigger_rule="none_failed_min_one_success",  # after whichever fetch ran
    )
    dedup = spark_step(
        "dedup", 'dedup --segment "$SEGMENT"',
        "`crawl dedup`: marks exact and near duplicates; before update, which copies duplicate_of into events.",
    )
    update = spark_step(
        "update", 'update --segment "$SEGMENT"',
        "`crawl update`: results, discoveries and host state merged into the tables (idempotent MERGE). Exit 75 "
        "(the crawl's writer lock held elsewhere, a lost commit) is retried like a failure: the segment must be merged "
        "before generate leases anew. Updates the `index_events` Asset (extra: the run's root and segment).",
        outlets=[INDEX_EVENTS],
    )

    @task(task_id="frontier", doc_md="""Reads the segment's frontier figures from `cycle_metrics` (written by generate
and update; read with delta-rs, no JVM), logs them and returns them as its XCom: due backlog, oldest due URL, due
high-priority URLs not leased, new URLs, change rate, stale results, unmerged segments. Fails when
the oldest due URL had waited longer than `alert_oldest_due_hours` (0 = never): a leaf task, so the run shows failed
(on-call's alert) while validate and maintain still run.""")
    def frontier(params: dict[str, Any], dag_run: Any) -> dict[str, Any]:
        from crawler.frontier import freshness_alert
        from jobs.cycle_metrics import read_figures

        segment = segment_id(dag_run)
        figures = read_figures(crawl_conf(params), segment)
        if "update" not in figures:
            raise RuntimeError(f"cycle_metrics has no update row for {segment}: update did not record its figures")
        for step, row in sorted(figures.items()):
            log.info("%s %s: %s", segment, step, ", ".join(f"{k}={v}" for k, v in row.items()
                                                           if v is not None and k not in ("segment_id", "step")))
        alert = freshness_alert((figures.get("generate") or {}).get("oldest_due_age_s"),
                                params["alert_oldest_due_hours"])
        if alert:
            raise AirflowFailException(f"{segment}: {alert}")  # an alert, not a flaky read: no retries
        return {step: {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
                for step, row in figures.items()}

    @task(task_id="service_levels", doc_md="""Reads the segment's `cycle_metrics` rows (delta-rs, no JVM)
and fails, as an alert, when the segment missed a service level (crawler/service_levels.py, targets in the config's
`service_levels`): its pages' p99 fetch -> durable lag over the target, or fewer of the eligible high-priority URLs
leased in time at its generate than the target share. The message names each level missed with its figures; an
alert is not retried (AirflowFailException).
A failed leaf task rather than a callback or a soft fail: the run shows failed (on-call's alert, as `frontier`),
validate and maintain still run, and the next run's generate does not wait for it (nothing downstream, no
depends_on_past). Nothing measured (no page with outlinks, no URL decided) is no alert.""")
    def service_levels_alert(params: dict[str, Any], dag_run: Any) -> dict[str, Any]:
        from crawler.service_levels import ServiceLevels
        from jobs.cycle_metrics import read_figures

        conf, segment = crawl_conf(params), segment_id(dag_run)
        figures = read_figures(conf, segment)
        missed = ServiceLevels.from_config(conf).misses(figures)
        if missed:
            raise AirflowFailException(f"{segment}: service level missed: " + "; ".join(missed))
        return {name: (figures.get(step) or {}).get(name) for step, name in (
            ("generate", "lease_share_within"), ("generate", "hp_eligible"), ("update", "discovery_durable_p99_s"),
            ("update", "discovery_pages"))}

    @task.short_circuit(task_id="index_enabled", ignore_downstream_trigger_rules=False,
                        doc_md="Lets index run when the config's `index.enabled` is on (skipped otherwise; validate "
                               "runs either way).")
    def index_enabled(params: dict[str, Any]) -> bool:
        return bool(crawl_conf(params).index.enabled)

    index = spark_step(
        "index", 'index --segment "$SEGMENT"',
        "`crawl index`: the segment's closed WARC files into the `records` table and one CDXJ file each. Updates "
        "the `records` Asset (extra: the run's root and segment).",
        outlets=[RECORDS],
    )
    validate = spark_step(
        "validate", 'validate ${VALIDATION_OUT:+--out "$VALIDATION_OUT"}',
        "`crawl validate`: Great Expectations suites over the tables; a failed expectation (exit 3) fails the run "
        "here, without retries (the data would fail again), and closes the quality gate: the next runs' generate "
        "skips (exit 4) until a validation passes.",
        trigger_rule="none_failed_min_one_success",  # after update, and after index when it ran
        fail_on_exit_code=(EXIT_VALIDATION_FAILED,),
    )

    @task.short_circuit(task_id="maintenance_due", trigger_rule="none_failed",
                        doc_md=f"Lets maintain run once a day (the run at {MAINTAIN_HOUR_UTC}:xx UTC) or as the "
                               "`maintain` param says; inside the cycle so it never races a cycle's writes.")
    def maintenance_due(params: dict[str, Any], dag_run: Any) -> bool:
        if params["maintain"] != "auto":
            return params["maintain"] == "always"
        moment = (dag_run.logical_date or dag_run.run_after).astimezone(UTC)
        return moment.hour == MAINTAIN_HOUR_UTC

    maintain = spark_step(
        "maintain", "maintain",
        "`crawl maintain`: OPTIMIZE, VACUUM (retention from config) and statistics of every table.",
    )

    fetch = choose_fetch()
    inject >> generate >> fetch >> [await_daemons, fetch_segment] >> parse >> dedup >> update >> validate
    update >> index_enabled() >> index >> validate
    update >> frontier()
    update >> service_levels_alert()
    validate >> maintenance_due() >> maintain
