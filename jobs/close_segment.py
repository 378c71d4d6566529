"""`crawl close-segment`: give a segment up, in two places.

Its marker, `ROOT/segments/<id>/_CLOSED.json` (`fetchd.progress.close_segment`), stops the fetch: daemons start
none of its unfinished buckets and release those they hold. Unless only the fetch is stopped (`--fetch-only`, the
DAG's fetch deadline: the segment is still parsed and merged afterwards), its buckets that are not merged become
`closed` in the `segments` table (`jobs.update.record_closed`): never merged, and generate's backpressure no
longer waits for them. A root without a `segments` table has nothing to give up there, and Spark is not started.
"""

from __future__ import annotations

from datetime import UTC, datetime

from crawler import layout
from crawler.config import Config
from fetchd.progress import close_segment
from jobs.storage import Storage


def give_up(conf: Config, root: str, segment_id: str, now: datetime) -> int | None:
    """The segment's buckets that are not merged -> `closed` in the `segments` table: how many changed, or None when
    the root has no `segments` table yet (then Spark is not started)."""
    segments_log = layout.join(layout.table_path(root, "segments"), "_delta_log")
    if not Storage.from_conf(conf).list_files(segments_log):
        return None
    from jobs import base, update  # Spark only past this point: --fetch-only and a fresh root stay light

    spark = base.spark_session(conf, app_name="crawl-close-segment")
    return update.record_closed(spark, root, segment_id, now)


def run_command(conf: Config, root: str, segment: str, reason: str, fetch_only: bool) -> int:
    """`crawl close-segment`: the marker written (a retry keeps the first), then, unless `fetch_only`, the segment
    given up in the table; a line for each."""
    progress = close_segment(root, segment, reason, conf)
    print(f"close-segment: {segment} closed; unfinished buckets: {progress.unfinished}")
    if fetch_only:
        return 0
    given_up = give_up(conf, root, segment, datetime.now(UTC))
    if given_up is not None:
        print(f"close-segment: {given_up} buckets given up (segments.state closed): not merged, and generate no "
              "longer waits for them")
    return 0
