"""Example: an indexing DAG scheduled on the crawl's `index_events` Asset (copy it next to the cyclecrawl DAG files).

Airflow starts a run of it after each run of `crawl_cycle` whose update task succeeded (or `crawl_continuous`'s run
task), with the Asset events that triggered it; several events may arrive in one run. Each event's extra names the
producing run's storage root and segment. This example only plans: it reads the table's current Delta version and
the segment's row count with delta-rs (no JVM), logs what it would index and returns the plan; a real indexer would
then read the new rows from the version it reached last (docs/outputs.md, `jobs/events.py::index_events_since`).

The Asset comes from `cyclecrawl_dags.table_asset` over the same parse-time root (the Variable `cyclecrawl_root`,
else CYCLECRAWL_ROOT), so its URI is the producers' to the character.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, task
from cyclecrawl_dags import default_root, table_asset

log = logging.getLogger(__name__)

INDEX_EVENTS = table_asset(default_root(), "index_events")


def table_location(uri: str) -> str:
    """The path delta-rs opens for an Asset URI: a local folder for file://, the s3:// URL itself (credentials from
    the AWS default chain)."""
    return uri.removeprefix("file://") if uri.startswith("file://") else uri


with DAG(
    dag_id="index_consumer",
    description="plans indexing of the segments each update of index_events brings",
    schedule=[INDEX_EVENTS],
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["cyclecrawl", "example"],
    doc_md=__doc__,
):

    @task(task_id="plan_indexing")
    def plan_indexing(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """One plan per triggering event: the segment, its events' count and the table version to read up to."""
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        plans = []
        for event in triggering_asset_events[INDEX_EVENTS]:
            table = DeltaTable(table_location(event.asset.uri))
            segment = event.extra.get("segment_id")
            rows = table.to_pyarrow_dataset().count_rows(filter=pc.field("segment_id") == segment) if segment else None
            plan = {"segment_id": segment, "rows": rows, "version": table.version(),
                    "source": f"{event.source_dag_id}/{event.source_run_id}/{event.source_task_id}"}
            log.info("would index %s", plan)
            plans.append(plan)
        return plans

    plan_indexing()
