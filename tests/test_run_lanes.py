"""`crawl run`'s two lanes, with the steps replaced by stand-ins that log when they run (no Spark, no daemon): a
segment's parse runs as soon as its fetch is over, start to end, even while the main lane is in the previous
segment's update; and the turns the lanes take at a table they both write (`jobs.base.table_turn`).

The real steps, kills and restarts are `tests/test_run.py`'s; this checks the driver's scheduling alone, where a
test can make a step wait for another.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crawler import config as config_mod
from delta_tables import tables
from jobs import dedup, generate, parse, run, update
from jobs.base import table_turn

WAIT_S = 20.0  # the longest any stand-in waits for the other lane (the driver polls every 0.05 s here)


@dataclass
class Generated:
    segment_id: str | None
    urls_version: int | None = None
    next_due_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.segment_id is None

    def summary(self) -> str:
        return self.segment_id or "nothing due"


class Steps:
    """The stand-ins and what they saw: `log` holds (event, step, segment) in the order they happened."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        self.fetched: set[str] = set()
        self.parse_ended = {name: threading.Event() for name in ("seg-1", "seg-2")}
        self.to_generate = ["seg-1", "seg-2"]

    def note(self, event: str, step: str, segment_id: str) -> None:
        with self.lock:
            self.log.append((event, step, segment_id))

    def fetch_over(self, _root: str, segment_id: str, _conf: Any) -> str | None:
        return "fetched" if segment_id in self.fetched else None

    def generate(self, *_args: Any) -> Generated:
        segment_id = self.to_generate.pop(0) if self.to_generate else None
        if segment_id == "seg-1":
            self.fetched.add(segment_id)  # the first segment's fetch is over at once, the second's during update
        return Generated(segment_id)

    def parse(self, _spark: Any, _conf: Any, _root: str, segment_id: str) -> str:
        self.note("start", "parse", segment_id)
        time.sleep(0.05)
        self.note("end", "parse", segment_id)
        self.parse_ended[segment_id].set()
        return "parsed"

    def main_lane(self, step: str):
        def body(_spark: Any, _conf: Any, _root: str, segment_id: str) -> str:
            self.note("start", step, segment_id)
            if step == "update" and segment_id == "seg-1":
                self.fetched.add("seg-2")
                # The next segment's parse must not wait for this update: bounded, so a driver that makes it wait
                # fails the test instead of hanging.
                self.parse_ended["seg-2"].wait(WAIT_S)
            time.sleep(0.05)
            self.note("end", step, segment_id)
            return step
        return body


class OneSegment(Steps):
    """One segment to generate, fetched at once, its merge steps instant; when generate and update ran."""

    def __init__(self) -> None:
        super().__init__()
        self.to_generate = ["seg-1"]
        self.times: dict[str, list[float]] = {"generate": [], "update": []}

    def generate(self, *args: Any) -> Generated:
        self.times["generate"].append(time.monotonic())
        return super().generate(*args)

    def main_lane(self, step: str):
        def body(_spark: Any, _conf: Any, _root: str, segment_id: str) -> str:
            self.times.setdefault(step, []).append(time.monotonic())
            return step
        return body


def stand_in(monkeypatch, steps: Steps) -> Steps:
    """The driver's steps replaced by `steps`' stand-ins."""
    monkeypatch.setattr(run, "fetch_over", steps.fetch_over)
    monkeypatch.setattr(run.Driver, "resume", lambda self: None)
    monkeypatch.setattr(generate, "run", steps.generate)
    monkeypatch.setattr(parse, "run", steps.parse)
    monkeypatch.setattr(dedup, "run", steps.main_lane("dedup"))
    monkeypatch.setattr(update, "run", steps.main_lane("update"))
    return steps


@pytest.fixture
def steps(monkeypatch) -> Steps:
    return stand_in(monkeypatch, Steps())


class NoSpark:
    """The driver gives the parse lane a session of its own, and its jobs a scheduler pool; the stand-ins use
    neither."""

    def __init__(self) -> None:
        self.sparkContext = self
        self.pools: dict[str, str] = {}

    def newSession(self) -> NoSpark:  # noqa: N802 (pyspark's names)
        return self

    def setLocalProperty(self, key: str, value: str) -> None:  # noqa: N802
        self.pools[threading.current_thread().name] = value


def crawl_until_idle(steps: Steps, spark: NoSpark | None = None, interval_s: float = 0.1) -> list[run.StepRecord]:
    conf = config_mod.load().with_overrides({"cycle.interval_s": interval_s, "cycle.poll_s": 0.05,
                                             "index.enabled": False})
    told: list[run.StepRecord] = []
    driver = run.Driver(spark or NoSpark(), conf, "/nowhere", [told.append])
    finished = threading.Event()

    def crawl() -> None:
        driver.run(seeds=None, for_s=WAIT_S * 3, until_idle=True)
        finished.set()

    threading.Thread(target=crawl, daemon=True).start()
    assert finished.wait(WAIT_S * 4), "the driver did not go idle"
    return told


def test_a_segments_parse_does_not_wait_for_the_previous_segments_update(steps):
    told = crawl_until_idle(steps)
    log = steps.log
    assert log.index(("end", "parse", "seg-2")) < log.index(("end", "update", "seg-1"))
    # Each segment in its order: parse, dedup, update; the second merged after the first.
    for segment_id in ("seg-1", "seg-2"):
        ends = [step for event, step, seg in log if event == "end" and seg == segment_id]
        assert ends == ["parse", "dedup", "update"]
    assert log.index(("end", "update", "seg-1")) < log.index(("start", "dedup", "seg-2"))
    # The observers hear of every step of both lanes once, from the driver's own thread.
    heard = [(record.name, record.segment_id) for record in told if record.segment_id]
    for segment_id in ("seg-1", "seg-2"):
        assert [name for name, seg in heard if seg == segment_id] == ["generate", "fetch", "parse", "dedup",
                                                                      "update"]


def test_the_parse_lane_runs_its_jobs_in_a_scheduler_pool_of_its_own(steps):
    spark = NoSpark()
    crawl_until_idle(steps, spark)
    assert spark.pools == {"parse-lane": run.PARSE_POOL}  # its jobs share the executors with the main lane's


def test_commits_to_one_table_take_turns_and_others_do_not_wait():
    """While one thread holds a table's turn, another thread's commit to that table waits for it; a commit to
    another table, or to the same table of another root, does not."""
    held, release = threading.Event(), threading.Event()
    order: list[str] = []

    def holder() -> None:
        with table_turn("/root-a", "pages"):
            held.set()
            release.wait(WAIT_S)
            order.append("first pages commit")

    def waiter(root: str, table: str, name: str) -> threading.Thread:
        def take() -> None:
            with table_turn(root, table):
                order.append(name)
        thread = threading.Thread(target=take)
        thread.start()
        return thread

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(WAIT_S)
    same = waiter("/root-a", "pages", "second pages commit")
    others = [waiter("/root-a", "segments", "segments commit"), waiter("/root-b", "pages", "other root's pages")]
    for thread in others:
        thread.join(WAIT_S)
    time.sleep(0.1)
    assert sorted(order) == ["other root's pages", "segments commit"]  # the second pages commit still waits
    release.set()
    first.join(WAIT_S)
    same.join(WAIT_S)
    assert order[2:] == ["first pages commit", "second pages commit"]


def test_with_no_segment_open_a_merge_is_followed_by_generate_at_once(monkeypatch):
    """The daemons would idle until the tick, and what the merge stored may be due now; the tick is a minute away."""
    steps = stand_in(monkeypatch, OneSegment())
    crawl_until_idle(steps, interval_s=60.0)
    first, second = steps.times["generate"]  # seg-1, then the one that found nothing due: idle
    update_ended = steps.times["update"][0]
    assert first < update_ended < second < update_ended + 5.0


class SlowGenerate(OneSegment):
    """OneSegment whose generate takes six intervals: the tick is always due again when it ends."""

    def generate(self, *args: Any) -> Generated:
        time.sleep(0.3)
        return super().generate(*args)


def test_a_generate_slower_than_the_interval_starves_neither_the_merges_nor_the_idle_check(monkeypatch):
    """Generates back to back would hold the main lane (its merge steps never ran, and --until-idle never saw the
    idle state) for as long as each took longer than the interval."""
    steps = stand_in(monkeypatch, SlowGenerate())
    started = time.monotonic()
    crawl_until_idle(steps, interval_s=0.05)
    assert steps.times["dedup"] and steps.times["update"]
    assert time.monotonic() - started < WAIT_S  # idle, not stopped at the run's end (for_s)
    # seg-1, an empty one or two while its parse runs in the other lane (more on a loaded machine), the one after
    # its merge: idle. Back to back, it would be one every 0.3 s until the run's end.
    assert 2 <= len(steps.times["generate"]) <= 5
    assert steps.times["generate"][-1] > steps.times["update"][0]


class Quiet(Steps):
    """Nothing due on any generate: `urls` at `version` (a test moves it), its next URL due at `due_at`."""

    def __init__(self, due_at: datetime) -> None:
        super().__init__()
        self.version, self.due_at = 7, due_at
        self.generated: list[float] = []

    def generate(self, *_args: Any) -> Generated:
        self.generated.append(time.monotonic())
        return Generated(None, self.version, self.due_at)

    def table_version(self, _spark: Any, _root: str, name: str) -> int:
        assert name == "urls"
        return self.version


def test_after_a_generate_found_nothing_due_the_ticks_wait_for_a_commit_to_urls_or_its_next_due_moment(monkeypatch):
    """A generate would find nothing again until `urls` changes (another command's commit: its version moves) or
    one of its URLs comes due (the moment the generate reported): the ticks in between generate nothing."""
    started = time.monotonic()
    steps = stand_in(monkeypatch, Quiet(datetime.now(UTC) + timedelta(seconds=3.0)))
    monkeypatch.setattr(tables, "table_version", steps.table_version)
    conf = config_mod.load().with_overrides({"cycle.interval_s": 0.05, "cycle.poll_s": 0.05,
                                             "index.enabled": False})
    driver = run.Driver(NoSpark(), conf, "/nowhere", [])
    crawl = threading.Thread(target=driver.run, kwargs={"seeds": None, "for_s": 5.0, "until_idle": False})
    crawl.start()
    time.sleep(1.0)
    assert len(steps.generated) == 1  # sixty ticks and more, no generate
    steps.version = 8  # a commit to `urls`: inject, say, from another process
    moved = time.monotonic()
    crawl.join(WAIT_S)
    assert not crawl.is_alive()
    due = started + 3.0
    after_move = [t for t in steps.generated if t >= moved]
    assert after_move and after_move[0] < due  # the commit is seen at the next tick
    assert not [t for t in after_move[1:] if t < due]  # then quiet again, until the due moment
    assert [t for t in after_move if t >= due]  # from the due moment on, generate looks again
