"""`crawl run`: the continuous driver. One process, one SparkSession, short overlapping segments.

A new segment is generated every `cycle.interval_s`, planned to be fetched in as long (generate's per-host cap is
taken with `generate.segment_seconds` = the interval). The fetch daemon (a child process running `crawl fetchd`'s
loop, or daemons elsewhere with --no-daemon) fetches it while the driver merges the segment before it.

Two lanes share the one SparkContext. The parse lane (a thread with a session of its own: its SQL settings and
Delta's idempotent-write ids stay apart) parses each segment as soon as its fetch is over, whatever the other lane
is doing, so a page's links reach `links` within `service_levels.discovery_durable_s` of its fetch: a segment's
parse cannot wait behind the previous segment's update. The main lane runs generate when its tick is due, or at
once when no segment is open and one was merged since the last generate (the segments the driver is merging are
named to generate's backpressure, `crawler.frontier.backpressure`, which then does not take them for stalled, but
counts them), then merges the oldest parsed segment (dedup, update, and index
with `index.enabled`), one step at a time, oldest segment first, with at most one generate between two merge steps
(a generate slower than the interval starves neither the merges nor the idle check of --until-idle); a generate that
found nothing due looks again a whole interval after it ended, and only once `urls` has changed since or one of its
URLs has come due (the version and moment that generate reported). Both lanes write `pages` and `segments`: each such
commit takes its table's turn (`jobs.base.table_turn`), so the lanes' commits never conflict. When generate is
refused (exit 75's reasons: too many open segments, the writer lock held elsewhere) the driver waits for the next
tick.

Validation gates the next segment (crawler.gate). After a segment is merged, once `cycle.validate_every_s` have
passed since the driver started or last validated, the main lane validates every table (`crawl validate`'s suites,
about 11 s on a small crawl: at every 30 s cycle it would hold the merges and generates up for a third of the time).
A failed validation closes the quality gate, and so does one run elsewhere (`crawl validate`); once the driver knows
the gate is closed (its own validation, or generate refusing with `GateClosed`) it generates no more, merges the
segments it has open, and stops with exit 4 and the refusal's line: the data needs a person, and a driver waiting
on a closed gate would only look alive. A restart while the gate is still closed merges nothing new and stops again.

The driver keeps no state of its own: every step is idempotent per segment (docs/architecture.md, Idempotence and
completion), and at start it reads the open segments from the `segments` table and their fetch progress from the
segment folders once, then runs each one's remaining steps in order. From then on it knows what it generated and
merged, and looks at nothing but the fetching segments' folders (`fetchd.progress`, a listing) every `cycle.poll_s`.

Exit status: 0 when stopped (SIGTERM, SIGINT, --for, --until-idle, or the daemon child stopped by a signal),
after the steps in progress (both lanes') and the daemon child's own stop; the daemon child's status when it ended
otherwise (75 when the crawl's settings changed under it, 1 when it failed or was killed); 75 when a step cannot go
on now (another command's commit won, the writer lock held elsewhere: `crawler.errors.TryLater`); 4 when the quality
gate is closed (after merging the open segments); 2 for a user mistake; 1 for any other failure. A restart resumes.
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from crawler import layout, logs
from crawler.config import Config
from crawler.errors import EXIT_TRY_LATER, GateClosed, TryLater
from crawler.frontier import backpressure
from crawler.status import FINISHED_SEGMENT_STATES, SegmentState
from jobs.cycle import CycleReport, describe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from jobs.run_metrics import RunMetrics

log = logging.getLogger("jobs.run")

INJECT, GENERATE, FETCH = "inject", "generate", "fetch"
PARSE, DEDUP, UPDATE, INDEX = "parse", "dedup", "update", "index"
VALIDATE = "validate"
PROGRESS = "run:"  # every progress line on stdout starts with it
BATCH_STEPS = (GENERATE, PARSE, DEDUP, UPDATE)  # the steps the driver's metrics time
PARSE_POOL = "parse"  # the parse lane's Spark scheduler pool


@dataclass(frozen=True)
class StepRecord:
    """One step the driver ran (or, for `fetch`, saw end): what every observer is told."""

    name: str
    segment_id: str | None
    seconds: float
    result: Any  # the step's result; for a refused generate, the refusal (a TryLater)


StepObserver = Callable[[StepRecord], None]


def print_progress(record: StepRecord) -> None:
    """The progress line of a finished step: step, segment, seconds, summary."""
    print(f"{PROGRESS} {record.name} {record.segment_id or '-'} {record.seconds:.1f}s: {describe(record.result)}",
          flush=True)


@dataclass
class OpenSegment:
    """A segment generated and not merged yet, with the steps it has left in order."""

    segment_id: str
    steps_left: list[str]
    fetch_over: bool = False
    seen_at: float = field(default_factory=time.monotonic)  # when the driver generated or found it
    report: CycleReport | None = None

    def __post_init__(self) -> None:
        self.report = self.report or CycleReport(self.segment_id)


def planning_conf(conf: Config) -> Config:
    """The config generate plans with in continuous operation: a segment lasts `cycle.interval_s`, so the per-host
    cap (`crawler.frontier.per_host_cap`) is taken over the interval instead of `generate.segment_seconds`."""
    return conf.with_overrides({"generate.segment_seconds": max(1, math.ceil(conf.cycle.interval_s))})


def merge_steps(conf: Config) -> list[str]:
    """The steps after the fetch, in order."""
    return [PARSE, DEDUP, UPDATE] + ([INDEX] if conf.index.enabled else [])


def segment_time(segment_id: str) -> datetime | None:
    """The `now` a default segment id was generated at (to the second), or None for an id of another form."""
    try:
        return datetime.strptime(segment_id, "seg-%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


class Driver:
    """The loop of `crawl run`; `observers` are told of every step as it ends (the progress lines are the first)."""

    def __init__(self, spark: SparkSession, conf: Config, root: str, observers: list[StepObserver],
                 daemon: DaemonChild | None = None):
        self.spark, self.conf, self.root = spark, conf, root
        self.plan = planning_conf(conf)
        self.observers = observers
        self.daemon = daemon
        self.stop = threading.Event()
        self.wake = threading.Event()  # set by a stop request and by the parse lane when it has news
        self.parse_lane = ParseLane(spark.newSession(), conf, root, self.wake)
        self.open: dict[str, OpenSegment] = {}
        self.regenerate: list[tuple[str, datetime]] = []  # segments published without their `segments` rows
        self.next_tick = 0.0
        self.nothing_due = False  # the last generate found nothing due, and nothing was merged since
        self.merged_since_generate = False  # a segment was merged since the last generate ran (whatever it found)
        # After a generate found nothing due: the `urls` version it read and when its next URL comes due. Until one
        # of the two moves, a generate would find nothing again, so the ticks leave it out.
        self.quiet: tuple[int, datetime | None] | None = None
        self.merged = 0
        self.validated_at = time.monotonic()  # the driver's start, then its last validation (cycle.validate_every_s)
        self.gate_closed: GateClosed | None = None  # once set: no more generates; stop when nothing is open

    # -- start: what the tables and folders say is left -------------------------------------------------------

    def resume(self) -> None:
        """Read, once, every open segment and the steps it has left; and the published segments whose generate
        died between its lease commit and its `segments` rows (generate runs again for them, same id and time)."""
        from delta_tables import tables
        from jobs.storage import Storage

        tables.ensure_tables(self.spark, self.root)
        rows = tables.table_df(self.spark, self.root, "segments").select("segment_id", "state").distinct().collect()
        states: dict[str, set[str]] = {}
        for row in rows:
            states.setdefault(row["segment_id"], set()).add(row["state"])
        for segment_id in sorted(states):
            left = states[segment_id] - set(FINISHED_SEGMENT_STATES)
            if not left:
                continue
            steps = merge_steps(self.conf)
            if left == {SegmentState.PARSED.value}:
                steps.remove(PARSE)
            self._open(OpenSegment(segment_id, steps))
            log.info("run: resuming segment %s (%s left)", segment_id, ", ".join(steps))
        storage = Storage.from_conf(self.conf)
        for segment_id in layout.segment_ids(storage.list_folders(layout.segments_dir(self.root))):
            moment = segment_time(segment_id)
            if (segment_id not in states and moment is not None
                    and not storage.exists(layout.generating_marker(self.root, segment_id))):
                log.info("run: segment %s is published without its segments rows: generating it again", segment_id)
                self.regenerate.append((segment_id, moment))

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self, seeds: str | None, for_s: float | None, until_idle: bool) -> int:
        """Until stopped: inject the seeds, resume, then keep the cycle going. Returns the exit status."""
        from jobs import inject

        deadline = time.monotonic() + for_s if for_s else math.inf
        if seeds:
            self._step(INJECT, None, inject.run, self.spark, self.conf, self.root, seeds)
        self.resume()
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                if self.gate_closed is not None and not self.open:
                    raise self.gate_closed
                if self.daemon is not None and self.daemon.exitcode is not None:
                    # 0: it was stopped (a SIGTERM to the whole process group reaches it too); else it failed
                    status = self.daemon.exitcode
                    log.log(logging.INFO if status == 0 else logging.ERROR,
                            "run: the fetch daemon ended (exit %s): stopping", status)
                    return status if status >= 0 else 1
                self._hear_from_parse_lane()
                self._look_at_fetches()
                if until_idle and self.nothing_due and not self.open and not self.regenerate:
                    log.info("run: nothing due and no segment open: idle")
                    break
                # At most one generate, then one merge step: a generate slower than the interval (a tick already
                # due when it ends) must not starve the merges, nor the idle check above.
                generated = self._generate_if_due()
                if self._merge_one_step() or generated:
                    continue
                # A tick already due here is held back by backpressure: look again after a poll.
                until_tick = self.next_tick - time.monotonic()
                poll = self.conf.cycle.poll_s if until_tick <= 0 else min(self.conf.cycle.poll_s, until_tick)
                if self.wake.wait(min(poll, max(0.0, deadline - time.monotonic()))):
                    self.wake.clear()
            return 0
        finally:
            self.parse_lane.stop()  # after the parse in progress, as any step in progress
            self._hear_from_parse_lane()

    def request_stop(self) -> None:
        """Stop after the steps in progress (SIGTERM, SIGINT)."""
        self.stop.set()
        self.wake.set()

    def _look_at_fetches(self) -> None:
        """Which fetching segments' fetch is over, of those the parse lane does not watch (resumed ones that are
        parsed already)."""
        for segment in self.open.values():
            if segment.fetch_over or segment.steps_left[0] == PARSE:
                continue
            summary = fetch_over(self.root, segment.segment_id, self.conf)
            if summary is not None:
                segment.fetch_over = True
                self._tell(segment, FETCH, time.monotonic() - segment.seen_at, summary)

    def _open(self, segment: OpenSegment) -> None:
        """A segment generated or resumed: the driver merges it, the parse lane parses it first if it must."""
        self.open[segment.segment_id] = segment
        if segment.steps_left[0] == PARSE:
            self.parse_lane.hand(segment.segment_id, segment.seen_at)

    def _hear_from_parse_lane(self) -> None:
        """The fetches the parse lane saw end and the parses it did, told to the observers like the main lane's
        steps; its error is the driver's."""
        for name, segment_id, seconds, result in self.parse_lane.news():
            segment = self.open[segment_id]
            if name == FETCH:
                segment.fetch_over = True
            else:
                segment.steps_left.remove(PARSE)
            self._tell(segment, name, seconds, result)

    def _merge_one_step(self) -> bool:
        """Run the next merge step (dedup, update, index) of the oldest open segment once its fetch is over and it
        is parsed (segments are merged in order). False when there is none."""
        oldest = min(self.open.values(), key=lambda s: s.segment_id, default=None)
        if oldest is None or not oldest.fetch_over or oldest.steps_left[0] == PARSE:  # parsing, or to parse
            return False
        return self._next_step_of(oldest)

    def _next_step_of(self, segment: OpenSegment) -> bool:
        """Run the segment's next step; once it has none left it is merged and its cycle report printed."""
        name = segment.steps_left.pop(0)
        self._step(name, segment, self._job(name), self.spark, self.conf, self.root, segment.segment_id)
        if not segment.steps_left:
            del self.open[segment.segment_id]
            self.merged += 1
            self.nothing_due = False  # what it merged may be due at once
            self.quiet = None
            self.merged_since_generate = True
            print(segment.report.render(self.merged), flush=True)
            self._validate_if_due()
        return True

    def _validate_if_due(self) -> None:
        """Validate every table once `cycle.validate_every_s` have passed since the last validation (or the start);
        a failure closes the quality gate (crawler.gate), which ends the generates."""
        from jobs import validate

        if time.monotonic() - self.validated_at < self.conf.cycle.validate_every_s:
            return
        result = self._step(VALIDATE, None, validate.run, self.spark, self.conf, self.root).result
        self.validated_at = time.monotonic()
        if result.gate is not None:
            self._close_gate(result.gate.refusal())

    def _close_gate(self, refusal: GateClosed) -> None:
        log.error("run: %s; no new segment: stopping once the %d open segments are merged", refusal, len(self.open))
        self.gate_closed = refusal

    @staticmethod
    def _job(name: str) -> Callable[..., Any]:
        from jobs import dedup, index, parse, update

        return {PARSE: parse.run, DEDUP: dedup.run, UPDATE: update.run, INDEX: index.run}[name]

    def _generate_if_due(self) -> bool:
        """Generate when the tick is due, or at once when no segment is open and a segment was merged since the last
        generate (the daemons have nothing to fetch and what was merged may be due: waiting for the tick would only
        idle them), and backpressure allows it (by what the driver knows; generate asks the tables again), before
        the merge steps of fetched segments, so the next segment is fetched while they are merged: the segments in
        the driver's own queue are not stalled ones (`backpressure`'s `merging`), but they count toward
        generate.max_unmerged_segments. A refusal waits for the next tick. False when nothing was tried."""
        from jobs import generate

        if self.gate_closed is not None:
            return False
        if time.monotonic() < self.next_tick and (self.open or not self.merged_since_generate):
            return False
        merging = frozenset(self.open)
        if backpressure({s.segment_id: s.fetch_over for s in self.open.values()},
                        self.conf.generate.max_unmerged_segments, merging):
            return False  # tried as soon as a merge makes room, without waiting for a further tick
        self.next_tick = time.monotonic() + self.conf.cycle.interval_s
        if self._still_quiet():
            return False
        self.merged_since_generate = False
        segment_id, now = self.regenerate[0] if self.regenerate else (None, None)
        record = self._step(GENERATE, segment_id, generate.run, self.spark, self.plan, self.root, segment_id, now,
                            merging, refusal=(TryLater, GateClosed))
        result = record.result
        if isinstance(result, GateClosed):
            self._close_gate(result)
        if isinstance(result, Exception):
            return True
        if self.regenerate:
            self.regenerate.pop(0)
        self.nothing_due = result.empty
        self.quiet = None
        if result.empty:
            if result.urls_version is not None:
                self.quiet = (result.urls_version, result.next_due_at)
            # Nothing was due: look again a whole interval after this generate ended, not back to back when it took
            # longer than the interval (a merge that lands wakes it at once, as above).
            self.next_tick = max(self.next_tick, time.monotonic() + self.conf.cycle.interval_s)
        else:
            segment = OpenSegment(result.segment_id, merge_steps(self.conf))
            segment.report.steps[GENERATE], segment.report.seconds[GENERATE] = result, record.seconds
            self._open(segment)
        return True

    def _still_quiet(self) -> bool:
        """Whether nothing can have come due since the last generate found nothing due: `urls` is at the version it
        read (no merge, inject or other command committed to it since) and its next URL's due moment has not come
        (a lease expiring included: crawler.leases.due_from). Then the tick's generate is left out."""
        if self.quiet is None or self.regenerate:
            return False
        version, due_at = self.quiet
        if due_at is not None and datetime.now(UTC) >= due_at:
            return False
        from delta_tables import tables

        return tables.table_version(self.spark, self.root, "urls") == version  # a listing of its log, no Spark job

    # -- steps and their observers -----------------------------------------------------------------------

    def _step(self, name: str, segment: OpenSegment | str | None, func: Callable[..., Any], *args: Any,
              refusal: tuple[type[Exception], ...] = ()) -> StepRecord:
        """Run one step, print its start, and tell every observer once it is over. An exception of a `refusal`
        class is the step's result (reported) instead of the driver's end."""
        segment_id = segment.segment_id if isinstance(segment, OpenSegment) else segment
        print(f"{PROGRESS} {name} {segment_id or '-'} started", flush=True)
        started = time.monotonic()
        try:
            result = func(*args)
        except Exception as exc:
            if not isinstance(exc, refusal):
                raise
            result = exc
        seconds = time.monotonic() - started
        if name == GENERATE and not isinstance(result, Exception):
            segment_id = None if result.empty else result.segment_id
        return self._tell(segment if isinstance(segment, OpenSegment) else segment_id, name, seconds, result)

    def _tell(self, segment: OpenSegment | str | None, name: str, seconds: float, result: Any) -> StepRecord:
        """The one place a step's (name, segment, seconds, result) is reported: the segment's cycle report and
        every observer."""
        if isinstance(segment, OpenSegment):
            segment.report.steps[name], segment.report.seconds[name] = result, seconds
            segment_id: str | None = segment.segment_id
        else:
            segment_id = segment
        record = StepRecord(name, segment_id, seconds, result)
        for observer in self.observers:
            observer(record)
        return record


def fetch_over(root: str, segment_id: str, conf: Config) -> str | None:
    """Whether a segment's fetch is over (`fetchd.progress.SegmentProgress.fetch_over`, the daemons' own listing,
    the one generate's backpressure reads): its summary, or None while it goes on."""
    from fetchd.progress import segment_progress

    progress = segment_progress(root, segment_id, conf)
    if not progress.fetch_over:
        return None
    return f"{len(progress.done)} of {len(progress.listed)} buckets done" + (
        ", segment closed" if progress.closed else "")


class ParseLane:
    """The driver's parse lane: a thread that takes the segments it is handed in order, watches each one's fetch
    (every `cycle.poll_s`) and parses it as soon as the fetch is over, on a session of its own. What it saw and
    did comes back through `news` (read by the main lane, which tells the observers); `wake` is set when there is
    some."""

    def __init__(self, spark: SparkSession, conf: Config, root: str, wake: threading.Event):
        self.spark, self.conf, self.root, self.wake = spark, conf, root, wake
        self.handed: queue.Queue[tuple[str, float]] = queue.Queue()
        self.done: queue.Queue[tuple[str, str, float, Any]] = queue.Queue()
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="parse-lane", daemon=True)
        self.thread.start()

    def hand(self, segment_id: str, seen_at: float) -> None:
        """A segment to parse once its fetch is over; `seen_at`: when the driver generated or found it (its fetch
        is timed from then)."""
        self.handed.put((segment_id, seen_at))

    def news(self) -> list[tuple[str, str, float, Any]]:
        """(step, segment, seconds, result) of each fetch seen over and each parse done since the last call;
        raises the lane's error once its news is read."""
        items = []
        while not self.done.empty():
            items.append(self.done.get())
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        return items

    def stop(self) -> None:
        """Stop after the parse in progress (a segment still fetching is left to the next start)."""
        self.stopping.set()
        self.thread.join()

    def _work(self) -> None:
        from jobs import parse

        # Its jobs share the executors fairly with the main lane's (`spark.scheduler.mode` FAIR, jobs.base).
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", PARSE_POOL)
        try:
            while not self.stopping.is_set():
                try:
                    segment_id, seen_at = self.handed.get(timeout=self.conf.cycle.poll_s)
                except queue.Empty:
                    continue
                while (summary := fetch_over(self.root, segment_id, self.conf)) is None:
                    if self.stopping.wait(self.conf.cycle.poll_s):
                        return
                self._tell(FETCH, segment_id, time.monotonic() - seen_at, summary)
                print(f"{PROGRESS} {PARSE} {segment_id} started", flush=True)
                started = time.monotonic()
                result = parse.run(self.spark, self.conf, self.root, segment_id)
                self._tell(PARSE, segment_id, time.monotonic() - started, result)
        except BaseException as exc:  # the driver's error: raised in the main lane by `news`
            self.failure = exc
            self.wake.set()

    def _tell(self, name: str, segment_id: str, seconds: float, result: Any) -> None:
        self.done.put((name, segment_id, seconds, result))
        self.wake.set()


class DaemonChild:
    """`crawl fetchd`'s loop (`fetchd.commands.serve`) in a child process on the driver's root and config, which
    dies with the driver: on Linux the kernel sends it SIGTERM when the driver dies (PR_SET_PDEATHSIG), and
    everywhere it watches its parent every `fetch.poll_interval_s`; either way it stops as on SIGTERM (requests in
    flight get their grace, results are published, buckets released)."""

    def __init__(self, conf: Config, root: str):
        self.conf = conf
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the JVM's threads
        verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
        self.process = context.Process(target=serve_while_parent_lives, args=(conf, root, os.getpid(), verbose),
                                       name="crawl-run-fetchd")

    def start(self) -> None:
        self.process.start()
        log.info("run: fetch daemon started (pid %s)", self.process.pid)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def stop(self) -> int | None:
        """SIGTERM it and wait for its own stop (the grace for requests in flight, and some); SIGKILL if it hangs."""
        if self.process.exitcode is None and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGTERM)
        self.process.join(self.conf.ownership.shutdown_grace_s + 30.0)
        if self.process.exitcode is None:
            log.error("run: the fetch daemon did not stop within its grace: killing it")
            self.process.kill()
            self.process.join()
        return self.process.exitcode


def serve_while_parent_lives(conf: Config, root: str, parent: int, verbose: bool) -> None:
    """The daemon child's body: `serve` until SIGTERM/SIGINT or until its parent is gone."""
    from fetchd.commands import serve

    logs.setup(verbose)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    stop = threading.Event()
    if os.getppid() != parent:  # the parent died before the request took effect
        return

    def watch_parent() -> None:
        while not stop.wait(conf.fetch.poll_interval_s):
            if os.getppid() != parent:
                log.warning("fetch daemon: the crawl run driver is gone: stopping")
                stop.set()

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    try:
        serve(conf, root, stop)
    except TryLater as exc:  # the crawl's settings changed under it: one line and 75, as `crawl fetchd` says it
        log.error("fetch daemon: %s", exc)
        sys.exit(EXIT_TRY_LATER)


def _stop_on_signals(stop: Callable[[], None]) -> dict[int, Any]:
    """SIGTERM and SIGINT call `stop` (the steps in progress finish; pyspark's own SIGINT handler would cancel
    them); returns the handlers they replace."""
    def handle(signum: int, _frame: Any) -> None:
        log.info("run: %s received: stopping after the steps in progress", signal.Signals(signum).name)
        stop()

    return {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}


def run_continuously(spark: SparkSession, conf: Config, root: str, observers: list[StepObserver], seeds: str | None,
                     daemon: bool, run_for_s: float | None, until_idle: bool) -> tuple[int, Driver]:
    """The driver with its fetch daemon child (unless `daemon` is false) until it stops; SIGTERM and SIGINT stop it
    after the step in progress. Returns (exit status, the driver)."""
    child = DaemonChild(conf, root) if daemon else None
    driver = Driver(spark, conf, root, observers, child)
    previous = _stop_on_signals(driver.request_stop)
    if child is not None:
        child.start()
    try:
        status = driver.run(seeds, run_for_s, until_idle)
    finally:
        if child is not None:
            log.info("run: fetch daemon stopped (exit %s)", child.stop())
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"{PROGRESS} stopped: {driver.merged} segments merged, {len(driver.open)} open", flush=True)
    return status, driver


def metrics_observer(conf: Config, metrics: RunMetrics) -> StepObserver:
    """Tells the driver's Prometheus series (`jobs/run_metrics.py`) of each batch step of a segment, and, after a
    generate or an update, of the `cycle_metrics` row it wrote: the service levels come from the tables."""
    from jobs.cycle_metrics import read_figures

    def observe(record: StepRecord) -> None:
        if record.name not in BATCH_STEPS or record.segment_id is None or isinstance(record.result, Exception):
            return
        if record.name in (GENERATE, UPDATE):  # the figures first: a scrape that sees the merge sees its levels
            row = read_figures(conf, record.segment_id).get(record.name)
            if row is not None:
                metrics.observe_cycle_metrics(row)
        metrics.observe_step(record.name, record.segment_id, record.seconds)

    return observe


def run_with_metrics(spark: SparkSession, conf: Config, root: str, observers: list[StepObserver], seeds: str | None,
                     daemon: bool, run_for_s: float | None, until_idle: bool) -> int:
    """The driver (run_continuously) with its progress lines, `observers`, and its `/metrics` endpoint when
    `cycle.metrics_port` is set: what `crawl run` and `crawl demo` run. Returns the exit status."""
    from jobs.run_metrics import RunMetrics

    metrics = RunMetrics.from_config(conf)
    if metrics.port:
        log.info("run: metrics on http://%s:%s/metrics", conf.cycle.metrics_host, metrics.port)
    try:
        observers = [print_progress, *observers, metrics_observer(conf, metrics)]
        return run_continuously(spark, conf, root, observers, seeds, daemon, run_for_s, until_idle)[0]
    finally:
        metrics.close()


def run_command(spark: SparkSession, conf: Config, root: str, seeds: str | None, daemon: bool,
                run_for_s: float | None, until_idle: bool) -> int:
    """`crawl run`: the driver, with its fetch daemon child unless --no-daemon, and its `/metrics` endpoint when
    `cycle.metrics_port` is set."""
    return run_with_metrics(spark, conf, root, [], seeds, daemon, run_for_s, until_idle)
