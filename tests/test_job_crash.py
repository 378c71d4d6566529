"""kill -9 of a Spark job's driver at a random point, then a re-run: nothing lost, nothing doubled.

Update and inject start from the shared crawl's root after the second cycle's dedup, generate from it after that
cycle's update (as in a cycle: backpressure refuses a new segment while one is fetched and not merged). Copy A is
the job run once to completion (for update, the shared crawl's own update of that segment); copy B runs the same
`crawl` command in a child process that is killed with SIGKILL (its whole process group: the Python driver, its
JVM and its Python workers) at a seeded random point inside the job's working window, and then the job again, with
the command's config and arguments, in this process on the suite's SparkContext, to completion. All of that happens
in the background once the shared crawl is done, with the reading of every table of A and B
(`tests/support/crash.py`). Every table of B must then equal A's, column for column, except columns the job stamps
from the wall clock (`wall_clock_columns`).
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from delta_tables import TABLES, table_df
from tests.support.crash import GENERATED_SEGMENT, SCENARIOS, WALL_CLOCK, CrashKills, Killed, Reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# Keys that must stay unique whatever happens ("nothing doubled").
UNIQUE_KEYS = {
    "urls": ("url_id", "url"),
    "hosts": ("host_key",),
    "fetches": ("segment_id", "url_id", "state_version"),
    "index_events": ("url_id", "state_version"),
    "segments": ("segment_id", "bucket"),
}


def _rerun_after_kill(crash_kills: CrashKills, scenario: str) -> Killed:
    """Copy B of `scenario`: killed, then its job run again to completion (both in the background)."""
    job = SCENARIOS[scenario][0]
    killed = crash_kills.killed_copy(scenario)
    assert killed.run.killed and killed.run.returncode == -signal.SIGKILL
    print(f"{job}: killed {killed.point[1]:.1f}s after step {killed.point[0]!r} started (fraction "
          f"{killed.fraction:.2f}); last step started: {killed.run.last_step()!r}")
    assert killed.rerun is not None and killed.rerun.returncode == 0 and killed.rerun.steps, (
        f"re-run of {job} after the kill did not complete")
    return killed


def _assert_same_tables(reference: Reference, crashed: Killed) -> None:
    """Every table of the re-run copy B holds exactly copy A's rows (both read in the background)."""
    expected, got = reference.tables, crashed.tables
    assert got is not None
    problems = []
    for name in TABLES:
        missing = Counter(expected[name]) - Counter(got[name])
        extra = Counter(got[name]) - Counter(expected[name])
        if missing or extra:
            problems.append(f"table {name}: {sum(missing.values())} reference rows missing, "
                            f"{sum(extra.values())} rows not in the reference\n"
                            f"  missing e.g. {list(missing)[:2]}\n  extra e.g.   {list(extra)[:2]}")
    assert not problems, "after kill -9 and a re-run:\n" + "\n".join(problems)


def _assert_unique_keys(spark, root: Path) -> None:
    for name, key in UNIQUE_KEYS.items():
        df = table_df(spark, str(root), name)
        assert df.count() == df.select(*key).distinct().count(), f"duplicate {key} in {name}"


def _segment_rows(spark, root: Path, segment_id: str) -> list[dict]:
    rows = table_df(spark, str(root), "segments").where(f"segment_id = '{segment_id}'").collect()
    drop = WALL_CLOCK["segments"]
    return sorted(({k: v for k, v in r.asDict().items() if k not in drop} for r in rows), key=lambda r: r["bucket"])


@pytest.mark.parametrize("scenario", ["update-early", "update-late"], ids=["early", "late"])
def test_update_killed_and_rerun_equals_one_clean_run(spark, crash_kills, scenario):
    segment = crash_kills.prepared.segment
    reference = crash_kills.reference("update")
    ref_segments = _segment_rows(spark, reference.root, segment)
    assert ref_segments and all(r["state"] == "merged" for r in ref_segments)
    assert sum(r["applied"] for r in ref_segments) > 10, "the reference update must complete URLs"
    assert sum(r["discovered"] for r in ref_segments) > 0, "the reference update must discover URLs"

    crashed = _rerun_after_kill(crash_kills, scenario)
    assert _segment_rows(spark, crashed.root, segment) == ref_segments
    _assert_unique_keys(spark, crashed.root)
    _assert_same_tables(reference, crashed)


def _fetchlist(spark, root: Path) -> list[tuple]:
    path = root / "segments" / GENERATED_SEGMENT / "fetchlist"
    return sorted(tuple(str(v) for v in row) for row in spark.read.parquet(str(path)).collect())


def test_generate_killed_and_rerun_equals_one_clean_run(spark, crash_kills):
    reference = crash_kills.reference("generate")
    assert sum(r["url_count"] for r in _segment_rows(spark, reference.root, GENERATED_SEGMENT)) > 10

    crashed = _rerun_after_kill(crash_kills, "generate")
    _assert_unique_keys(spark, crashed.root)
    _assert_same_tables(reference, crashed)
    assert _fetchlist(spark, crashed.root) == _fetchlist(spark, reference.root)


def test_inject_killed_and_rerun_equals_one_clean_run(spark, crash_kills):
    reference = crash_kills.reference("inject")
    before = table_df(spark, str(crash_kills.prepared.root), "urls").count()
    assert table_df(spark, str(reference.root), "urls").count() >= before + 40, "the reference inject must add URLs"

    crashed = _rerun_after_kill(crash_kills, "inject")
    _assert_unique_keys(spark, crashed.root)
    _assert_same_tables(reference, crashed)
