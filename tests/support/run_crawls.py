"""`crawl run`, the continuous driver, as a person or a supervisor runs it: its own process, its daemon child, a
tiny loopback farm, a 2-second cadence; the crawls `tests/test_run.py` judges.

The clean crawl, to idle with no interruption, is `crawl demo` (the README's main command, which runs this driver
until idle on a farm it starts; `tests/test_end_to_end.py` judges its report): one crawl serves both, so the suite
starts one JVM crawl fewer. Another root, on a farm of its own with the same pages, is crawled by `crawl run` and
killed (SIGKILL of the whole process group, or of the driver alone) when its progress lines say a parse has
started, an update has started, and right after a dedup ended (between steps), restarted each time, then stopped
with SIGTERM during an update, then run to idle. The two crawls run at once, in the background of the session (a
`conftest.py` BACKGROUND_WORK): they wait on cadences, lease expiries and JVM starts more than they compute, so in
the Spark lane's own process they held the lane for over four minutes. They run niced like the suite's other slack
(`tests/support/config.py::BACKGROUND_NICE`); the kill points are progress lines, not times, so the niceness
changes when they fall, not what they test.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from crawler import config as config_mod
from crawler import layout
from fetchd.ownership import LeaseStore, leases_dir
from fetchd.storage import LocalStore
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec
from sitefarm.truth import FarmTruth
from tests.support.config import TEST_OVERRIDES, at_background_priority
from tests.support.jvm import short_lived_jvm_env
from tests.support.process_group import wait_until_gone
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[2]
FARM = FarmSpec(hosts=3, pages_per_host=8)  # what `crawl demo --set demo.hosts=3 --set demo.pages_per_host=8` serves
DELAY_S = 0.05
RUN_TIMEOUT_S = 900  # one start of the driver: a loaded machine's JVM start and steps
MAX_DEPTH = 1
# A bound against a hang, not a speed goal: the steps in progress on a tiny segment (a niced JVM on the loaded
# machine: one fresh-clone run's stop took 92 s) and the daemon child's stop.
SIGTERM_BOUND_S = 240
# (step whose progress line triggers the kill, "started" or "done", seconds after that line, whom it kills: the
# whole process group, or the driver alone, whose daemon child and JVM must then end by themselves)
KILLS = (("parse", "started", 1.0, "group"), ("update", "started", 2.0, "driver"), ("dedup", "done", 0.0, "group"))
# During the update the last kill leaves to do (its segment's dedup ended, its update not committed): a step that
# is still to come whatever the timing (a parse may not be: the last segment can be parsed before that kill).
SIGTERM_AT = ("update", "started", 1.0)
CHILDREN_GONE_S = 60  # after kill -9 of the driver alone: the daemon's stop on its parent's death, the JVM's exit


# A generate that found nothing due, line by line (its start, lock, selection, verdict and end), and what a JVM
# prints as it starts (Ivy's resolution, log4j's notes).
_IDLE_ROUND = re.compile(r"^run: generate - started$|for `crawl generate`$|: select: (started|done)|nothing due at "
                         r"|^run: generate - [\d.]+s: 0 URLs ")
_DAEMON_STARTED = re.compile(r"run: fetch daemon started \(pid (\d+)\)")
_JVM_START = re.compile(r"^(\t|:: |Ivy |The jars |io\.delta#|Using Spark|Setting default|To adjust|\S+ \S+ WARN )")


def run_config(root: Path, farm: SiteFarm | None, metrics_port: int = 0) -> Path:
    """The test settings, the farm's hosts and a short cadence; leases and the writer lock short, so a restart
    after kill -9 does not wait a minute for what the killed driver held. With no farm, for `crawl demo`, which sets
    the root, the farm's hosts and the delay itself (`jobs/demo.py`)."""
    overrides = {
        **{k: v for k, v in TEST_OVERRIDES.items() if k != "spark.driver_memory"},
        "spark.driver_memory": "1g",
        **({"storage.root": str(root), "fetch.static_hosts": farm.static_hosts(),
            "scope.host_suffixes": ["farm.test"], "politeness.min_delay_s": DELAY_S} if farm else {}),
        "politeness.max_crawl_delay_s": 0.5,
        "cycle.interval_s": 2.0,
        "cycle.poll_s": 0.2,
        "fetch.poll_interval_s": 0.3,
        "ownership.lease_ttl_s": 4.0,
        "ownership.renew_interval_s": 1.0,
        "ownership.fence_margin_s": 1.0,
        "ownership.takeover_grace_s": 0.5,
        "ownership.shutdown_grace_s": 2.0,
        "writer_lock.ttl_s": 4.0,
        # Two segments (the homes, then what they link to): the kills and restarts cost JVM starts enough.
        "scope.max_depth": MAX_DEPTH,
        "cycle.metrics_port": metrics_port,
    }
    data: dict = {}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    path = root.parent / f"{root.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Driver:
    """One `crawl run` (or `crawl demo`) process in a session of its own, its stdout lines read as they come (and
    its stderr's with them, unless it goes to a file)."""

    process: subprocess.Popen
    lines: queue.Queue = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, config: Path, *args: str, command: str = "run", stderr: IO[str] | None = None) -> Driver:
        argv = at_background_priority([sys.executable, "-m", "jobs.cli", command, "--config", str(config), *args])
        process = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **short_lived_jvm_env()},
                                   stdout=subprocess.PIPE, stderr=stderr or subprocess.STDOUT, text=True,
                                   start_new_session=True)
        driver = cls(process)
        threading.Thread(target=driver._read, daemon=True).start()
        return driver

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, step: str, event: str) -> str:
        """The first new progress line of `step` (`run: <step> <segment> started`, or its done line)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"crawl run ended (exit {self.process.wait()}) before {step} {event}:\n"
                                     + self.story())
            self.seen.append(line)
            words = line.split()
            if words[:2] == ["run:", step] and (words[-1] == "started") == (event == "started"):
                return line
        self.dump_stacks()
        os.killpg(self.process.pid, signal.SIGKILL)
        self._drain()
        raise AssertionError(f"no {step} {event} within {RUN_TIMEOUT_S}s:\n" + self.story())

    def finish(self) -> int:
        try:
            code = self.process.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self._drain()
            raise AssertionError(f"crawl run still running after {RUN_TIMEOUT_S}s:\n{self.story()}") from None
        self._drain()
        return code

    def _drain(self) -> None:
        """The lines still to read, up to the end of the output (the process has exited)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if line is None:
                return
            self.seen.append(line)

    def daemon_pids(self) -> list[int]:
        """The pids of the daemon children this start said it started."""
        return [int(m.group(1)) for line in self.seen if (m := _DAEMON_STARTED.search(line))]

    def dump_stacks(self) -> None:
        """Have the driver and its daemon child print every thread's stack (SIGUSR1, `crawler.logs.setup`) into the
        output, before a stalled start is killed."""
        for pid in [self.process.pid, *self.daemon_pids()[-1:]]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.seen[-n:])

    def story(self, head: int = 40, tail: int = 250) -> str:
        """What a failure message needs of this start's output: its first and last lines without the rounds of
        generates that found nothing due (a stalled start repeats them for minutes and they pushed out what the
        daemon and the steps said) and without the JVM's start-up lines."""
        kept = [line for line in self.seen if not _IDLE_ROUND.search(line) and not _JVM_START.match(line)]
        idle = sum(1 for line in self.seen if "nothing due at" in line)
        lines = kept if len(kept) <= head + tail else [
            *kept[:head], f"[... {len(kept) - head - tail} lines left out ...]", *kept[-tail:]]
        return "\n".join([f"[{idle} generates that found nothing due left out]", *lines])

    def group_left(self, timeout_s: float) -> list[str]:
        """What of its process group still runs after waiting up to `timeout_s` (empty: nothing)."""
        return wait_until_gone(self.process.pid, timeout_s)


@dataclass
class DemoRun:
    """What `crawl demo` left: its root, exit status, stdout and stderr."""

    root: Path
    returncode: int
    out: str
    err: str


@dataclass
class Crawl:
    root: Path
    farm: FarmTruth  # the farm's pages (a SiteFarm this process served, or the truth about the demo's)
    log_path: Path
    outputs: list[str] = field(default_factory=list)
    sigterm: dict = field(default_factory=dict)
    scrape: str = ""  # the driver's /metrics after its first merge
    demo: DemoRun | None = None  # the clean crawl's: `crawl demo`'s own outcome


@contextmanager
def _crawl_on_own_farm(base: Path, name: str) -> Iterator[Crawl]:
    """A crawl of root `name` on a farm of its own, stopped when the crawl ends (what the tests read of the farm
    afterwards is its request log and its spec)."""
    log_path = base / f"{name}-requests.jsonl"
    farm = SiteFarm(FARM, log_path)
    farm.start()
    try:
        yield Crawl(base / name, farm, log_path)
    finally:
        farm.stop()


def _seeds(base: Path, farm: SiteFarm, name: str) -> Path:
    path = base / f"{name}-seeds.txt"
    path.write_text("".join(f"{url}\n" for url in farm.seed_urls()))
    return path


def clean_crawl(base: Path) -> Crawl:
    """`crawl demo` on a farm of FARM's pages (it starts its own) with the run settings, its metrics scraped after
    its first merge; sitemap discovery is off as in the test settings, so it is two segments: the homes, then what
    they link to."""
    root, port = base / "clean", free_port()
    config = run_config(root, None, port)
    with (base / "clean-stderr.txt").open("w+", encoding="utf-8") as stderr:
        driver = Driver.start(config, "--root", str(root), "--set", f"demo.hosts={FARM.hosts}",
                              "--set", f"demo.pages_per_host={FARM.pages_per_host}",
                              "--set", f"demo.min_delay_s={DELAY_S}", command="demo", stderr=stderr)
        driver.wait_for("update", "done")  # the first segment's: the second (what the homes link to) is to come
        scrape = scrape_after_merge(port)
        code = driver.finish()
        stderr.seek(0)
        err = stderr.read()
    out = "\n".join(driver.seen) + "\n"
    farm_port = int(next(line for line in driver.seen if line.startswith("demo: farm of")).split(";")[0]
                    .rsplit(":", 1)[1])
    log_path = root / "sitefarm" / "requests.jsonl"
    return Crawl(root, FarmTruth.served_at(FARM, farm_port), log_path, outputs=[out], scrape=scrape,
                 demo=DemoRun(root, code, out, err))


def scrape_after_merge(port: int, timeout_s: float = 60.0) -> str:
    """The driver's /metrics once it counts a merged segment (its observers run right after the progress line)."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        if "crawl_segments_merged_total 1.0" in text:
            break
        time.sleep(0.2)
    return text


def interrupted_crawl(base: Path) -> Crawl:
    with _crawl_on_own_farm(base, "killed") as crawl, _root_told(crawl.root):
        config = run_config(crawl.root, crawl.farm)
        seeds = ["--seeds", str(_seeds(base, crawl.farm, "killed"))]
        for step, event, after_s, whom in KILLS:
            driver = Driver.start(config, *seeds)
            seeds = []  # injected by the first start (inject is idempotent, but once is what a supervisor does)
            driver.wait_for(step, event)
            time.sleep(after_s)
            if whom == "group":
                os.killpg(driver.process.pid, signal.SIGKILL)
            else:
                driver.process.kill()
            driver.finish()
            crawl.outputs.append(driver.tail(400))
            left = driver.group_left(CHILDREN_GONE_S)
            assert not left, f"processes of the driver's group outlived kill -9 of the {whom}: {left}"
        driver = Driver.start(config)
        driver.wait_for(*SIGTERM_AT[:2])
        time.sleep(SIGTERM_AT[2])
        sent = time.monotonic()
        driver.process.send_signal(signal.SIGTERM)
        code = driver.finish()
        crawl.sigterm = {"code": code, "seconds": time.monotonic() - sent, "group_left": driver.group_left(5),
                         "output": driver.tail()}
        crawl.outputs.append(driver.tail(400))
        settings = config_mod.load(str(config))
        leases = LeaseStore(settings, str(crawl.root), owner="test")
        # The buckets whose latest lease is this start's daemon's and was not released. Not any unreleased lease: an
        # earlier start's daemon may have lost one to a late renewal on a loaded machine (fenced, so it was left as
        # it was, as the lease rule says), and no later daemon took that bucket yet.
        ours = set(driver.daemon_pids())
        crawl.sigterm["held"] = [b for b in range(settings.crawl.buckets)
                                 if (lease := leases.latest(b)) is not None and lease.pid in ours
                                 and not lease.released]
        driver = Driver.start(config, "--until-idle")
        code = driver.finish()
        crawl.outputs.append(driver.tail(400))
        assert code == 0, driver.story()
        return crawl


@contextmanager
def _root_told(root: Path) -> Iterator[None]:
    """A start that failed (did not reach its step, ran past its bound, ended badly): its message also lists what
    the root holds (each segment's state, listed and done buckets, each bucket's latest lease), which says
    whether a segment was waiting for its fetch, and for which bucket and owner."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- the root's segments and leases ---\n{_root_listing(root)}") from None


def _root_listing(root: Path) -> str:
    """What the daemons see of the root, through their own store and lease store: each segment's state, listed and
    done buckets, and each bucket's latest lease."""
    store, leases = LocalStore(str(root)), LeaseStore(config_mod.load(), str(root), owner="test")
    lines = [f"{segment}: generating {store.is_generating(segment)}, closed {store.is_closed(segment)}, fetch lists "
             f"{store.fetchlist_buckets(segment)}, done "
             f"{[b for b in store.fetchlist_buckets(segment) if store.is_done(segment, b)]}"
             for segment in store.segments()]
    folder = leases_dir(str(root))
    names = os.listdir(folder) if os.path.isdir(folder) else []
    buckets = sorted(b for b in map(layout.parse_bucket_dirname, names) if b is not None)
    lines += [f"bucket {bucket}: {leases.latest(bucket)}" for bucket in buckets]
    return "\n".join(lines) or "(nothing)"


def run_both(base: Path) -> tuple[Crawl, Crawl]:
    """The clean and the interrupted crawl at once (their JVM starts overlap)."""
    with ThreadPoolExecutor(2, thread_name_prefix="crawl-run") as pool:
        clean, killed = pool.submit(clean_crawl, base), pool.submit(interrupted_crawl, base)
        return clean.result(), killed.result()
