"""kill -9 of a Spark job's driver at a random point, then a re-run: nothing lost, nothing doubled (DESIGN §2.3).

Every scenario starts from the shared crawl's root after the second cycle's dedup (`tests/support/crawl.py`): one
merged cycle plus a fetched, parsed and deduplicated second segment that update has not merged yet. Copy A of it
runs the job once through the `crawl` command line in this process, on the suite's Spark session: the reference
(for update, the shared crawl's own update of that segment is that run already: the same job on the same state
with the same config, and its copy after update is the reference). Copy B runs the same command in a child process
of its own process group — the only process the test kills — with SIGKILL (the Python driver, its JVM and its
Python workers) at a seeded random point inside the job's working window, and then the command again in this
process, to completion. Every table of B must then equal A's, column for column, except columns the job stamps
from the wall clock.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delta_tables import TABLES, table_df
from jobs import cli
from jobs.base import STEP_STARTED
from tests.support.config import SHORT_LIVED_JVM_ENV
from tests.support.crawl import StepLog, recording_steps
from tests.support.tables import snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# Columns a job sets from datetime.now(): they differ between any two runs, crashed or not.
WALL_CLOCK = {"urls": {"updated_at"}, "hosts": {"updated_at"}, "segments": {"created_at", "updated_at"}}
# inject stamps new seeds' discovered_at and next_fetch_at with its start time as well.
INJECT_WALL_CLOCK = {"urls": {"updated_at", "discovered_at", "next_fetch_at"}}
# Keys that must stay unique whatever happens ("nothing doubled").
UNIQUE_KEYS = {
    "urls": ("url_id", "url"),
    "hosts": ("host_key",),
    "fetches": ("segment_id", "url_id", "state_version"),
    "index_events": ("url_id", "state_version"),
    "segments": ("segment_id", "bucket"),
}
GENERATED_SEGMENT = "seg-crash-generate"
RUN_TIMEOUT_S = 900
KILL_ATTEMPTS = 3
NO_STEP = "(no step started)"


@dataclass
class Prepared:
    """The snapshot every scenario copies and what a job command needs, shared by every test of the module."""

    base: Path
    root: Path            # read-only: each run works on its own copy
    config: Path
    segment: str          # fetched, parsed and deduplicated, not yet merged by update
    seeds: Path           # a new seeds file for inject
    now: str              # fixed --now for generate
    updated: Path         # read-only: the shared crawl's root after its update of `segment`
    update_log: StepLog   # and when that update's steps started


@dataclass
class Run:
    """One run of a `crawl` command: how it ended, when (seconds since launch) its steps started, its output."""

    returncode: int | None
    seconds: float
    steps: list[tuple[float, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    killed: bool = False

    def last_step(self) -> str:
        return self.steps[-1][1] if self.steps else NO_STEP

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])


def _step_name(line: str) -> str | None:
    """The step of a `jobs.base.step` start line in a child's log (the job is past JVM start-up, doing its work)."""
    marker = " INFO jobs: "
    if marker in line and line.endswith(STEP_STARTED):
        return line.split(marker, 1)[1].removesuffix(STEP_STARTED)
    return None


@pytest.fixture(scope="module")
def prepared(shared_crawl, tmp_path_factory) -> Prepared:
    base = tmp_path_factory.mktemp("crash")
    known = sorted(shared_crawl.farm.page_urls())
    new_seeds = base / "new-seeds.txt"
    lines = known[::3] + [f"http://new-{h:02d}.farm.test/page-{p}" for h in range(8) for p in range(5)]
    new_seeds.write_text("".join(f"{line}\n" for line in lines))
    now = (datetime.now(UTC) + timedelta(days=10)).replace(microsecond=0).isoformat()
    return Prepared(base, shared_crawl.snapshot(2, "dedup"), shared_crawl.config_file, shared_crawl.segment(2),
                    new_seeds, now, shared_crawl.snapshot(2, "update"), shared_crawl.step_logs[(2, "update")])


def _command(job: str, prepared: Prepared, root: Path) -> list[str]:
    command = [sys.executable, "-m", "jobs.cli", job, "--config", str(prepared.config), "--root", str(root)]
    if job == "update":
        return [*command, "--segment", prepared.segment]
    if job == "generate":
        return [*command, "--segment", GENERATED_SEGMENT, "--now", prepared.now]
    if job == "inject":
        return [*command, "--seeds", str(prepared.seeds)]
    raise ValueError(job)


def _group_gone(pgid: int, timeout_s: float = 60.0) -> bool:
    """True once no process of the group is left (the JVM and Python workers die with the driver)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _run_killed(command: list[str], log_path: Path, kill_at: tuple[str, float]) -> Run:
    """Run `command` in a child process of a new session (its output kept in `log_path`) and SIGKILL its whole
    process group `kill_at[1]` seconds after the start line of step `kill_at[0]`, if the job is still running
    then."""
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, **SHORT_LIVED_JVM_ENV})
    run = Run(returncode=None, seconds=0.0)
    step_seen = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            run.lines.append(f"{time.monotonic() - started:8.2f} {line}")
            if (name := _step_name(line)) is not None:
                run.steps.append((time.monotonic() - started, name))
                if name == kill_at[0]:
                    step_seen.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        while not step_seen.wait(0.1) and proc.poll() is None:
            assert time.monotonic() - started < RUN_TIMEOUT_S, f"step {kill_at[0]!r} never started"
        try:
            proc.wait(timeout=kill_at[1])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            run.killed = True
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=30)
        log_path.write_text("\n".join(run.lines) + "\n")
    if run.killed:
        assert _group_gone(proc.pid), "processes of the killed job are still running"
    run.returncode, run.seconds = proc.returncode, time.monotonic() - started
    return run


def _run_here(command: list[str]) -> Run:
    """Run a `crawl` command line in this process, on the suite's Spark session, noting its steps."""
    with recording_steps() as recorder:
        returncode = cli.main(command[command.index("jobs.cli") + 1:])
    log = recorder.take()
    return Run(returncode=returncode, seconds=log.seconds, steps=log.starts, lines=recorder.lines)


def _kill_point(reference_run: Run, fraction: float) -> tuple[str, float]:
    """The point `fraction` of the way through the reference's working window (first step start to its end), as
    (step, seconds after that step's start): anchored on a step, a kill lands in the same work however long the
    child's JVM takes to start on a loaded machine."""
    starts = reference_run.steps
    target = starts[0][0] + fraction * (reference_run.seconds - starts[0][0])
    at, name = max((s for s in starts if s[0] <= target), key=lambda s: s[0])
    return name, target - at


@pytest.fixture(scope="module")
def reference(spark, prepared):
    """job -> (root of copy A, its run): each job's reference run once per module, in this process."""
    done: dict[str, tuple[Path, Run]] = {}

    def get(job: str) -> tuple[Path, Run]:
        if job == "update":
            log = prepared.update_log
            return prepared.updated, Run(returncode=0, seconds=log.seconds, steps=log.starts)
        if job not in done:
            root = prepared.base / f"ref-{job}"
            shutil.copytree(prepared.root, root)
            run = _run_here(_command(job, prepared, root))
            assert run.returncode == 0, f"reference {job} failed:\n{run.tail()}"
            assert run.last_step() != NO_STEP, f"reference {job} logged no step:\n{run.tail()}"
            done[job] = (root, run)
        return done[job]

    return get


def _crash_and_rerun(prepared: Prepared, reference_run: Run, job: str, dest: Path, seed: int,
                     window: tuple[float, float]) -> None:
    """Copy B at `dest`: kill the job's child process at a seeded random point of the reference's working window
    (earlier on each attempt the job finished first), then re-run it to completion in this process."""
    fraction = random.Random(seed).uniform(*window)
    for _ in range(KILL_ATTEMPTS):
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(prepared.root, dest)
        point = _kill_point(reference_run, fraction)
        killed = _run_killed(_command(job, prepared, dest), dest.with_suffix(".killed.log"), kill_at=point)
        if killed.killed:
            break
        assert killed.returncode == 0, killed.tail()
        fraction /= 2
    else:
        pytest.fail(f"{job} finished before every kill point")
    assert killed.returncode == -signal.SIGKILL
    print(f"{job}: killed {point[1]:.1f}s after step {point[0]!r} started (fraction {fraction:.2f}); "
          f"last step started: {killed.last_step()!r}")
    rerun = _run_here(_command(job, prepared, dest))
    assert rerun.returncode == 0, f"re-run of {job} after the kill failed:\n{rerun.tail()}"


@pytest.fixture(scope="module")
def reference_snapshot(spark):
    """(reference root, excluded columns) -> its snapshot, read once however many crashed copies compare to it."""
    done: dict[tuple[Path, str], dict[str, list[str]]] = {}

    def get(root: Path, excluded: dict[str, set[str]]) -> dict[str, list[str]]:
        key = (root, repr(sorted((name, sorted(columns)) for name, columns in excluded.items())))
        if key not in done:
            done[key] = snapshot(spark, root, excluded)
        return done[key]

    return get


def _assert_same_tables(spark, expected: dict[str, list[str]], crashed_root: Path,
                        excluded: dict[str, set[str]]) -> None:
    got = snapshot(spark, crashed_root, excluded)
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


@pytest.mark.parametrize(("seed", "window"), [(11, (0.1, 0.5)), (23, (0.5, 0.9))], ids=["early", "late"])
def test_update_killed_and_rerun_equals_one_clean_run(spark, prepared, reference, reference_snapshot, tmp_path, seed,
                                                      window):
    ref_root, ref_run = reference("update")
    ref_segments = _segment_rows(spark, ref_root, prepared.segment)
    assert ref_segments and all(r["state"] == "merged" for r in ref_segments)
    assert sum(r["applied"] for r in ref_segments) > 10, "the reference update must complete URLs"
    assert sum(r["discovered"] for r in ref_segments) > 0, "the reference update must discover URLs"

    _crash_and_rerun(prepared, ref_run, "update", tmp_path / "crashed", seed, window)
    crashed = tmp_path / "crashed"
    assert _segment_rows(spark, crashed, prepared.segment) == ref_segments
    _assert_unique_keys(spark, crashed)
    _assert_same_tables(spark, reference_snapshot(ref_root, WALL_CLOCK), crashed, WALL_CLOCK)


def _fetchlist(spark, root: Path) -> list[tuple]:
    path = root / "segments" / GENERATED_SEGMENT / "fetchlist"
    return sorted(tuple(str(v) for v in row) for row in spark.read.parquet(str(path)).collect())


def test_generate_killed_and_rerun_equals_one_clean_run(spark, prepared, reference, reference_snapshot, tmp_path):
    ref_root, ref_run = reference("generate")
    assert sum(r["url_count"] for r in _segment_rows(spark, ref_root, GENERATED_SEGMENT)) > 10

    _crash_and_rerun(prepared, ref_run, "generate", tmp_path / "crashed", seed=5, window=(0.3, 0.9))
    crashed = tmp_path / "crashed"
    _assert_unique_keys(spark, crashed)
    _assert_same_tables(spark, reference_snapshot(ref_root, WALL_CLOCK), crashed, WALL_CLOCK)
    assert _fetchlist(spark, crashed) == _fetchlist(spark, ref_root)


def test_inject_killed_and_rerun_equals_one_clean_run(spark, prepared, reference, reference_snapshot, tmp_path):
    ref_root, ref_run = reference("inject")
    before = table_df(spark, str(prepared.root), "urls").count()
    assert table_df(spark, str(ref_root), "urls").count() >= before + 40, "the reference inject must add URLs"

    _crash_and_rerun(prepared, ref_run, "inject", tmp_path / "crashed", seed=3, window=(0.3, 0.9))
    crashed = tmp_path / "crashed"
    _assert_unique_keys(spark, crashed)
    excluded = {**WALL_CLOCK, **INJECT_WALL_CLOCK}
    _assert_same_tables(spark, reference_snapshot(ref_root, excluded), crashed, excluded)
