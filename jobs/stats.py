"""`crawl stats`: row counts by status for each table, as a readable table."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from crawler.config import Config
from crawler.politeness import PolitenessRules
from delta_tables import TABLES, table_df

# The column each table is broken down by; `hosts` by its state now (crawler.politeness.host_state).
BREAKDOWN = {
    "urls": "status",
    "hosts": "state",
    "fetches": "outcome",
    "pages": "content_type",
    "links": "rel_nofollow",
    "index_events": "kind",
    "segments": "state",
    "records": "warc_record_type",
    "dedup_hashes": "marked_duplicate",
    "dedup_bands": "band",
    "cycle_metrics": "step",
}


def table_counts(spark: SparkSession, conf: Config, root: str) -> dict[str, tuple[int, list[tuple[str, int]]]]:
    """{table: (total rows, [(value, count), ...])}; small aggregates only, never rows."""
    out: dict[str, tuple[int, list[tuple[str, int]]]] = {}
    host_state = PolitenessRules.from_config(conf).host_state_sql("robots_state", "backoff_until", "failing_since",
                                                                 "current_timestamp()")
    for name in TABLES:
        column = BREAKDOWN[name]
        try:
            df = table_df(spark, root, name)
            if name == "hosts":
                df = df.withColumn("state", F.expr(host_state))
        except Exception:  # noqa: BLE001 - a missing table is shown as such, not a crash
            out[name] = (-1, [])
            continue
        rows = df.groupBy(column).count().orderBy("count", ascending=False).limit(20).collect()
        groups = [(str(r[column]), int(r["count"])) for r in rows]
        out[name] = (sum(c for _, c in groups) if len(groups) < 20 else df.count(), groups)
    return out


def render_stats(spark: SparkSession, conf: Config, root: str) -> str:
    lines = [f"tables under {root}", f"{'table':<14}{'rows':>10}  breakdown"]
    for name, (total, groups) in table_counts(spark, conf, root).items():
        if total < 0:
            lines.append(f"{name:<14}{'missing':>10}")
            continue
        detail = ", ".join(f"{value}={count}" for value, count in groups) or "-"
        lines.append(f"{name:<14}{total:>10}  {BREAKDOWN[name]}: {detail}")
    return "\n".join(lines)


def run_command(spark: SparkSession, conf: Config, root: str) -> int:
    """`crawl stats`: the table of row counts."""
    print(render_stats(spark, conf, root))
    return 0
