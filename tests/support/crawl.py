"""The shared crawl: one site farm crawled once per test session, with a copy of the root kept after each step.

The farm has ordinary sites (robots variants, a Crawl-delay, redirects, cross-host links), the sitemap roles
(robots `Sitemap:` lines, /sitemap.xml probes, indexes, gzip children, orphans, out-of-scope and malformed
entries), both trap hosts (an infinite calendar, a faceted search) and two large news-like hosts, one above and
one below the known-URL cap. Four cycles: probe and robots.txt -> index -> children -> listed pages is the
longest chain, and every trap reaches its cap by the third.

Tests that only read assert against `SharedCrawl.root` (the state after the last step) or a `snapshot`; a test
that writes takes its own `copy` of the step it starts from. The end-to-end, sitemap, trap and job-crash tests
all read this one crawl instead of crawling again.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crawler.config import Config
from jobs import cycle, demo
from jobs.base import STEP_STARTED
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec

CYCLES = 4
FARM = FarmSpec(hosts=6, pages_per_host=20, trap_hosts=True, large_host_pages=(300, 60))
MIN_DELAY_S = 0.2
KNOWN_URL_CAP = 100       # traps.max_known_urls_per_host
TEMPLATE_CAP = 40         # traps.max_new_urls_per_template_per_cycle
PER_HOST_MAX_URLS = 60    # generate.per_host_max_urls: a trap or large host takes more than one cycle to its cap
BAD_SEED_LINES = ("this is not a url", "ftp://site-000.farm.test/file", "http://")


@dataclass
class StepLog:
    """How long one piece of work took and when (seconds after it began) each of its job steps started: the crash
    tests place their kill points in a job's working window by it."""

    seconds: float = 0.0
    starts: list[tuple[float, str]] = field(default_factory=list)


class StepRecorder(logging.Handler):
    """Notes every message of the `jobs` loggers from the thread that made it and when each `jobs.base.step`
    started (the shared crawl runs in a thread of its own while other tests run jobs)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.thread = threading.get_ident()
        self.lines: list[str] = []
        self.began = time.monotonic()
        self.log = StepLog()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return
        message = record.getMessage()
        self.lines.append(message)
        if message.endswith(STEP_STARTED):
            self.log.starts.append((time.monotonic() - self.began, message.removesuffix(STEP_STARTED)))

    def take(self) -> StepLog:
        """The log of the work that ends now; the next begins."""
        taken, taken.seconds = self.log, time.monotonic() - self.began
        self.began, self.log = time.monotonic(), StepLog()
        return taken


@contextmanager
def recording_steps() -> Iterator[StepRecorder]:
    """A `StepRecorder` on the `jobs` logger (at INFO) for the duration of the block."""
    jobs_log, recorder = logging.getLogger("jobs"), StepRecorder()
    level = jobs_log.level
    jobs_log.addHandler(recorder)
    jobs_log.setLevel(logging.INFO)
    try:
        yield recorder
    finally:
        jobs_log.removeHandler(recorder)
        jobs_log.setLevel(level)


@dataclass
class SharedCrawl:
    """What the crawl left: its final root, config, the farm (stopped: its ground truth still answers), the farm's
    request log, inject's result, each cycle's report, and a copy of the root and a `StepLog` after every step."""

    base: Path
    root: Path
    conf: Config
    config_file: Path
    farm: SiteFarm
    log: list[dict]
    inject: Any
    reports: list[cycle.CycleReport]
    snapshots: dict[tuple[int, str], Path] = field(default_factory=dict)
    step_logs: dict[tuple[int, str], StepLog] = field(default_factory=dict)

    def segment(self, number: int) -> str:
        """The segment id of cycle `number` (1-based)."""
        segment_id = self.reports[number - 1].segment_id
        assert segment_id, f"cycle {number} fetched nothing"
        return segment_id

    def snapshot(self, number: int, step: str) -> Path:
        """The root as it was after `step` of cycle `number`: read it, never write it."""
        return self.snapshots[(number, step)]

    def copy(self, number: int, step: str, dest: Path) -> Path:
        """A writable copy at `dest` of the root after `step` of cycle `number` (the last cycle's `update` is
        the final state)."""
        shutil.copytree(self.snapshot(number, step), dest)
        return dest


def crawl_config(base_conf: Config, root: str, farm: SiteFarm) -> Config:
    """The test config (`tests/conftest.py`) with the demo's farm settings, sitemap discovery, WET files, and caps small
    enough that the traps and the larger large host reach them."""
    conf = demo.demo_config(base_conf.with_overrides({"demo.min_delay_s": MIN_DELAY_S}), root, farm)
    return conf.with_overrides({
        "sitemaps.probe_default_location": True,
        "sitemaps.from_robots": True,
        "parse.wet_enabled": True,
        "traps.max_known_urls_per_host": KNOWN_URL_CAP,
        "traps.max_new_urls_per_template_per_cycle": TEMPLATE_CAP,
        "generate.per_host_max_urls": PER_HOST_MAX_URLS,
        # A sitemap is due again this long after its fetch (crawler/revisit.py): a day, so that none is fetched twice
        # within the crawl however long a loaded machine makes its four cycles (the default, 15 minutes, could).
        "revisit.sitemap_min_interval_s": 86400,
    })


def run_shared_crawl(spark, base_conf: Config, base: Path) -> SharedCrawl:
    """Inject the farm's seeds (and a few bad lines), then CYCLES cycles, keeping a copy after every step."""
    root = base / "root"
    root.mkdir(parents=True)
    snapshots_dir = base / "snapshots"
    log_path = base / "sitefarm" / "requests.jsonl"
    farm = SiteFarm(FARM, log_path=log_path)
    snapshots: dict[tuple[int, str], Path] = {}
    step_logs: dict[tuple[int, str], StepLog] = {}
    reports: list[cycle.CycleReport] = []
    farm.start()
    try:
        conf = crawl_config(base_conf, str(root), farm)
        seeds = base / "seeds.txt"
        seeds.write_text("\n".join([*farm.seed_urls(), *BAD_SEED_LINES]) + "\n")
        with recording_steps() as recorder:
            for number in range(1, CYCLES + 1):
                def keep(step: str, _result: Any, number: int = number) -> None:
                    step_logs[(number, step)] = recorder.take()
                    snapshots[(number, step)] = shutil.copytree(root, snapshots_dir / f"cycle-{number}-{step}")
                    recorder.take()  # the copy is no step's work

                # The last cycle also indexes its segment (index.enabled), as the DAG and `crawl cycle` do when on.
                cycle_conf = conf.with_overrides({"index.enabled": number == CYCLES})
                reports.append(cycle.run_cycle(spark, cycle_conf, str(root),
                                               seeds=str(seeds) if number == 1 else None, after_step=keep))
    finally:
        farm.stop()
    config_file = base / "crawl.yaml"
    config_file.write_text(yaml.safe_dump(conf.as_dict(), sort_keys=True))
    return SharedCrawl(base=base, root=root, conf=conf, config_file=config_file, farm=farm,
                       log=read_request_log(log_path), inject=reports[0].steps["inject"], reports=reports,
                       snapshots=snapshots, step_logs=step_logs)
