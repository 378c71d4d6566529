"""A step's Spark plan sized to its input (jobs.base.sized_to_input): the small-input settings inside, only when the
rows are known and few, and the session's own settings back after, also on an error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawler import layout
from crawler.status import MetricsStep
from jobs import cycle_metrics
from jobs.base import SMALL_INPUT, segment_rows, session_settings, sized_to_input, table_rows
from tests.support.tables import append_rows

SIZED = [*SMALL_INPUT, "spark.sql.shuffle.partitions", "spark.databricks.delta.snapshotPartitions"]
# The session's own settings in these tests: a large input's (the suite's session runs the small-input ones).
LARGE_INPUT = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK",
               "spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "8",
               "spark.databricks.delta.snapshotPartitions": "8"}


@pytest.fixture
def large_session(spark):
    with session_settings(spark, LARGE_INPUT):
        yield spark


def _settings(spark) -> dict[str, str | None]:
    return {key: spark.conf.get(key, None) for key in SIZED}


@pytest.mark.parametrize("rows, small", [(0, True), (20, True), (21, False), (None, False)])
def test_small_input_plan_only_for_known_few_rows(large_session, base_conf, rows, small):
    spark = large_session
    conf = base_conf.with_overrides({"spark.small_input_rows": 20, "spark.shuffle_partitions": 8})
    before = _settings(spark)
    assert before == LARGE_INPUT
    with sized_to_input(spark, conf, lambda: rows):
        inside = _settings(spark)
        assert spark.range(50).selectExpr("id % 7 as k").groupBy("k").count().count() == 7
    assert _settings(spark) == before
    if not small:
        assert inside == before
        return
    assert {key: inside[key] for key in SMALL_INPUT} == SMALL_INPUT
    cores = str(spark.sparkContext.defaultParallelism)
    assert inside["spark.sql.shuffle.partitions"] == inside["spark.databricks.delta.snapshotPartitions"] == cores


def test_never_small_when_turned_off(large_session, base_conf):
    spark = large_session
    conf = base_conf.with_overrides({"spark.small_input_rows": 0})
    before = _settings(spark)
    with sized_to_input(spark, conf, lambda: 1):
        assert _settings(spark) == before


def test_settings_restored_after_an_error(large_session, base_conf):
    spark = large_session
    before = _settings(spark)
    with pytest.raises(RuntimeError), sized_to_input(spark, base_conf, lambda: 1):
        assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        raise RuntimeError("step failed")
    assert _settings(spark) == before


def test_a_session_already_on_the_small_input_plan_skips_the_count(spark, base_conf):
    """The suite's session runs the small-input settings: sizing cannot change them, so the count (for generate a
    read of `cycle_metrics`) is never asked; on a large session it is asked once."""
    asked = []

    def count() -> int:
        asked.append(1)
        return 1

    conf = base_conf.with_overrides({"spark.small_input_rows": 20})
    before = _settings(spark)
    with sized_to_input(spark, conf, count):
        assert _settings(spark) == before
    assert asked == []
    with session_settings(spark, LARGE_INPUT), sized_to_input(spark, conf, count):
        assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert asked == [1]


def test_segment_rows_counts_what_the_steps_read(tmp_path, base_conf):
    """Every bucket's Parquet files, from their footers; files and folders Spark skips (`_`, `.`) are skipped."""
    folder = tmp_path / "fetched"
    assert segment_rows(base_conf, str(folder)) == 0  # no folder yet: nothing fetched
    table = pa.table({"n": list(range(5))})
    for name in ("bucket=00000/a.parquet", "bucket=00000/b.parquet", "bucket=00003/c.parquet",
                 "bucket=00003/_tmp.parquet", "bucket=00003/.hidden.parquet", "_staging/d.parquet"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / name)
    (folder / "bucket=00000" / "_DONE.json").write_text("{}")
    assert segment_rows(base_conf, str(folder)) == 15
    assert segment_rows(base_conf, layout.join(str(folder), "bucket=00003")) == 5


def test_table_rows_from_the_log(spark, tables_root):
    assert table_rows(spark, tables_root, "urls") == 0
    append_rows(spark, tables_root, "urls", [{"url_id": f"u{i}", "url": f"http://a.test/{i}"} for i in range(7)])
    assert table_rows(spark, tables_root, "urls") == 7


def test_the_last_generate_and_update_rows_size_and_steer_the_next_generate(spark, tables_root):
    """What generate reads of `cycle_metrics` before it starts: the latest row of each step by run time."""
    assert cycle_metrics.last_due_urls(spark, tables_root) is None
    assert cycle_metrics.update_signals(spark, tables_root) == (None, None)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for minute, due in ((2, 700), (1, 900)):  # the later run recorded first
        cycle_metrics.record(spark, tables_root, {"segment_id": f"seg-{minute}", "step": MetricsStep.GENERATE.value,
                                                  "run_at": start + timedelta(minutes=minute), "due_urls": due})
    cycle_metrics.record(spark, tables_root, {"segment_id": "seg-1", "step": MetricsStep.UPDATE.value,
                                              "run_at": start, "results": 40, "new_urls": 10, "change_rate": 0.25})
    assert cycle_metrics.last_due_urls(spark, tables_root) == 700
    assert cycle_metrics.update_signals(spark, tables_root) == (0.25, 0.25)
