"""The crash tests' kills (`tests/test_job_crash.py`), run in the background once the shared crawl is done.

Every scenario starts from the shared crawl's root after the second cycle's dedup (`tests/support/crawl.py`): one
merged cycle plus a fetched, parsed and deduplicated second segment that update has not merged yet. Copy A of it
is the reference: the job run once to completion in the suite's JVM (for update, the shared crawl's own update of
that segment is that run already: the same job on the same state with the same config). Copy B runs the same
`crawl` command in a child process of its own process group — the only process killed — with SIGKILL (the Python
driver, its JVM and its Python workers) at a seeded random point inside the job's working window. The job is then
run again on copy B in this process (the same call as the reference, with the command's config and arguments), to
completion, and every table of copy B is read for the test to compare with copy A's (read here once as well).

The references, the kills and the re-runs run in a thread of the Spark worker (`crash_kills_started` in
`tests/conftest.py`), while the lane's other tests run: a killed job's JVM is mostly start-up and its own work,
which the second core takes while the in-process tests keep about one busy, and a re-run there overlaps them too
(run by the tests themselves, the four re-runs and the tables' reads were the lane's last minute or more, on one
core, after the rest of the background work was done). The killed jobs
run niced, like the rest of the suite's slack (`tests/support/config.py::BACKGROUND_NICE`): a kill point is
anchored on a step's start, so a slower child is killed at an earlier point of the same step, never outside the
job's working window.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from crawler import config as config_mod
from jobs import generate, inject, update
from jobs.base import STEP_STARTED
from tests.support.config import at_background_priority
from tests.support.crawl import SharedCrawl, recording_steps
from tests.support.jvm import short_lived_jvm_env
from tests.support.process_group import wait_until_gone
from tests.support.tables import snapshot

GENERATED_SEGMENT = "seg-crash-generate"
RUN_TIMEOUT_S = 900
KILL_ATTEMPTS = 3
NO_STEP = "(no step started)"
REPO = Path(__file__).resolve().parents[2]
# Scenario -> (job, seed of its kill point, the window of the reference's working time it falls in).
SCENARIOS = {
    "update-early": ("update", 11, (0.1, 0.5)),
    "update-late": ("update", 23, (0.5, 0.9)),
    "generate": ("generate", 5, (0.3, 0.9)),
    "inject": ("inject", 3, (0.3, 0.9)),
}
# Columns a job sets from datetime.now(): they differ between any two runs, crashed or not (cycle_metrics: the
# figures of "when the step ran"; a re-run keeps the first run's row).
WALL_CLOCK = {"urls": {"updated_at"}, "hosts": {"updated_at"}, "segments": {"created_at", "updated_at"},
              "cycle_metrics": {"run_at", "oldest_due_age_s"}}
# inject stamps new seeds' discovered_at and next_fetch_at with its start time as well.
INJECT_WALL_CLOCK = {"urls": {"updated_at", "discovered_at", "next_fetch_at"}}


def wall_clock_columns(job: str) -> dict[str, set[str]]:
    """The columns of each table that two complete runs of `job` may differ in; the tests compare all the rest."""
    return {**WALL_CLOCK, **INJECT_WALL_CLOCK} if job == "inject" else WALL_CLOCK


@dataclass
class Prepared:
    """The snapshot every scenario copies and what a job command needs."""

    base: Path
    root: Path            # read-only: each run works on its own copy
    config: Path
    segment: str          # fetched, parsed and deduplicated, not yet merged by update
    seeds: Path           # a new seeds file for inject
    now: str              # fixed --now for generate
    updated: Path         # read-only: the shared crawl's root after its update of `segment`

    def start_for(self, job: str) -> Path:
        """The snapshot a job's scenario starts from: update merges `segment`; generate runs after that update, as
        in a cycle (on `root` backpressure would refuse it: `segment` is fetched and not merged); inject anywhere."""
        return self.updated if job == "generate" else self.root


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


@dataclass
class Killed:
    """Copy B of one scenario: killed, then its job run again to completion."""

    root: Path
    run: Run
    point: tuple[str, float]   # (step, seconds after its start) the kill was aimed at
    fraction: float            # of the reference's working window
    rerun: Run | None = None
    tables: dict[str, list[str]] | None = None  # every table after the re-run, without wall_clock_columns(job)


@dataclass
class Reference:
    """Copy A of one job: its root, its run, and every table (`tests.support.tables.snapshot`) without the
    job's `wall_clock_columns`."""

    root: Path
    run: Run
    tables: dict[str, list[str]]


class CrashKills:
    """What the background work leaves, each part as soon as it is done: the snapshot, each job's reference (root
    of copy A and its run) and each scenario's killed copy B; a test waits only for the parts it reads, and an
    error that stopped a part is raised again in the test that reads it."""

    def __init__(self) -> None:
        self._parts: dict[str, Any] = {}
        parts = ("prepared", *(f"reference-{job}" for job in ("update", "generate", "inject")), *SCENARIOS)
        self._ready = {name: threading.Event() for name in parts}

    def put(self, name: str, value: Any) -> None:
        self._parts[name] = value
        self._ready[name].set()

    def fail_the_rest(self, error: BaseException) -> None:
        for name, ready in self._ready.items():
            if not ready.is_set():
                self.put(name, error)

    def _get(self, name: str) -> Any:
        assert self._ready[name].wait(RUN_TIMEOUT_S * 2), f"the crash tests' {name!r} never became ready"
        value = self._parts[name]
        if isinstance(value, BaseException):
            raise value
        return value

    @property
    def prepared(self) -> Prepared:
        return self._get("prepared")

    def reference(self, job: str) -> Reference:
        return self._get(f"reference-{job}")

    def killed_copy(self, scenario: str) -> Killed:
        return self._get(scenario)


def command(job: str, prepared: Prepared, root: Path) -> list[str]:
    """The `crawl` command line of a scenario's job on `root`."""
    argv = [sys.executable, "-m", "jobs.cli", job, "--config", str(prepared.config), "--root", str(root)]
    if job == "update":
        return [*argv, "--segment", prepared.segment]
    if job == "generate":
        return [*argv, "--segment", GENERATED_SEGMENT, "--now", prepared.now]
    if job == "inject":
        return [*argv, "--seeds", str(prepared.seeds)]
    raise ValueError(job)


def _step_name(line: str) -> str | None:
    """The step of a `jobs.base.step` start line in a child's log (the job is past JVM start-up, doing its work)."""
    marker = " INFO jobs: "
    if marker in line and line.endswith(STEP_STARTED):
        return line.split(marker, 1)[1].removesuffix(STEP_STARTED)
    return None


def _run_killed(argv: list[str], log_path: Path, kill_at: tuple[str, float]) -> Run:
    """Run `argv` in a child process of a new session (its output kept in `log_path`) and SIGKILL its whole
    process group `kill_at[1]` seconds after the start line of step `kill_at[0]`, if the job is still running
    then."""
    started = time.monotonic()
    proc = subprocess.Popen(at_background_priority(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=REPO, env={**os.environ, **short_lived_jvm_env()})
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
        left = wait_until_gone(proc.pid, 60.0)
        assert not left, f"processes of the killed job are still running: {left}"
    run.returncode, run.seconds = proc.returncode, time.monotonic() - started
    return run


def _kill_point(reference_run: Run, fraction: float) -> tuple[str, float]:
    """The point `fraction` of the way through the reference's working window (first step start to its end), as
    (step, seconds after that step's start): anchored on a step, a kill lands in the same work however long the
    child's JVM takes to start on a loaded machine."""
    starts = reference_run.steps
    target = starts[0][0] + fraction * (reference_run.seconds - starts[0][0])
    at, name = max((s for s in starts if s[0] <= target), key=lambda s: s[0])
    return name, target - at


def _kill(prepared: Prepared, reference_run: Run, job: str, dest: Path, seed: int,
          window: tuple[float, float]) -> Killed:
    """Copy B at `dest`, its job's child process killed at a seeded random point of the reference's working window
    (earlier on each attempt the job finished first)."""
    fraction = random.Random(seed).uniform(*window)
    for _ in range(KILL_ATTEMPTS):
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(prepared.start_for(job), dest)
        point = _kill_point(reference_run, fraction)
        run = _run_killed(command(job, prepared, dest), dest.with_suffix(".killed.log"), kill_at=point)
        if run.killed:
            assert run.returncode == -signal.SIGKILL, run.tail()
            return Killed(dest, run, point, fraction)
        assert run.returncode == 0, run.tail()
        fraction /= 2
    raise AssertionError(f"{job} finished before every kill point")


def _run_job(spark, prepared: Prepared, job: str, root: Path) -> Run:
    """`job` run to completion on `root` on `spark` (this thread's session over the suite's SparkContext), with the
    command's config and arguments (`command`), its steps noted."""
    conf = config_mod.load(prepared.config).with_overrides({"storage.root": str(root)})
    with recording_steps() as recorder:
        if job == "generate":
            generate.run(spark, conf, str(root), segment_id=GENERATED_SEGMENT,
                         now=datetime.fromisoformat(prepared.now))
        elif job == "inject":
            inject.run(spark, conf, str(root), str(prepared.seeds))
        else:
            update.run(spark, conf, str(root), prepared.segment)
    log = recorder.take()
    assert log.starts, f"{job} on {root} logged no step:\n" + "\n".join(recorder.lines[-40:])
    return Run(returncode=0, seconds=log.seconds, steps=log.starts, lines=recorder.lines)


def _reference(spark, prepared: Prepared, job: str) -> Reference:
    """Copy A of generate or inject: the job run once to completion."""
    root = prepared.base / f"ref-{job}"
    shutil.copytree(prepared.start_for(job), root)
    run = _run_job(spark, prepared, job, root)
    return Reference(root, run, snapshot(spark, root, wall_clock_columns(job)))


def run_crash_kills(kills: CrashKills, spark, shared: Callable[[], SharedCrawl], base: Path) -> None:
    """Once the shared crawl is done, the references, then every scenario's kill, one after another, each put into
    `kills` as soon as it is done. A scenario's error is its test's; anything else fails every part not done."""
    try:
        crawl = shared()
        known = sorted(crawl.farm.page_urls())
        seeds = base / "new-seeds.txt"
        lines = known[::3] + [f"http://new-{h:02d}.farm.test/page-{p}" for h in range(8) for p in range(5)]
        seeds.write_text("".join(f"{line}\n" for line in lines))
        now = (datetime.now(UTC) + timedelta(days=10)).replace(microsecond=0).isoformat()
        prepared = Prepared(base, crawl.snapshot(2, "dedup"), crawl.config_file, crawl.segment(2), seeds, now,
                            crawl.snapshot(2, "update"))
        kills.put("prepared", prepared)
        update_log = crawl.step_logs[(2, "update")]
        runs = {"update": Run(returncode=0, seconds=update_log.seconds, steps=update_log.starts)}
        kills.put("reference-update", Reference(prepared.updated, runs["update"],
                                                snapshot(spark, prepared.updated, wall_clock_columns("update"))))
        for job in ("generate", "inject"):
            reference = _reference(spark, prepared, job)
            runs[job] = reference.run
            kills.put(f"reference-{job}", reference)
        for scenario, (job, seed, window) in SCENARIOS.items():
            try:
                killed = _kill(prepared, runs[job], job, base / scenario, seed, window)
                killed.rerun = _run_job(spark, prepared, job, killed.root)
                killed.tables = snapshot(spark, killed.root, wall_clock_columns(job))
                kills.put(scenario, killed)
            except Exception as error:
                kills.put(scenario, error)
    except BaseException as error:
        kills.fail_the_rest(error)
        raise
