"""One crawl cycle on the embedded default: inject (if seeds) -> generate -> fetch -> parse -> dedup -> update
(-> index, when index.enabled); `crawl cycle` then validates every table, as the DAG's validate step does.

A failed validation closes the quality gate (crawler.gate): `crawl cycle` stops there with exit 3 (the cycles left
are not run), and while the gate is closed its generate refuses (exit 4, the line naming the table and expectation).
The validation is `run_command`'s, not `run_cycle`'s: the steps alone are what the tests' crawls run.

The fetch step runs a daemon in this process; on a cluster the same steps run as separate Spark
submissions and long-lived daemons (see airflow_dags/ and docs/architecture.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crawler.config import Config

if TYPE_CHECKING:  # `describe` serves `crawl fetch`, which never imports Spark
    from pyspark.sql import SparkSession

log = logging.getLogger("jobs.cycle")


@dataclass
class CycleReport:
    segment_id: str | None
    steps: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def render(self, number: int) -> str:
        """A few lines a person reads at a glance: one per step with its time and figures."""
        total = sum(self.seconds.values())
        lines = [f"cycle {number}: segment {self.segment_id or '(nothing due)'} in {total:.1f}s"]
        for name, result in self.steps.items():
            lines.append(f"  {name:<9}{self.seconds.get(name, 0.0):7.1f}s  {describe(result)}")
        return "\n".join(lines)


def describe(result: Any) -> str:
    """One line for a step's result: its `headline()` or `summary()`, or the daemon's summary dict."""
    if hasattr(result, "headline"):
        return result.headline()
    if hasattr(result, "summary"):
        return result.summary()
    if isinstance(result, dict) and "outcomes" in result:
        outcomes = ", ".join(f"{k}={v}" for k, v in sorted(result["outcomes"].items())) or "-"
        held = result.get("held_buckets")
        return (f"{result['urls']} URLs ({outcomes}); {result['warc_files']} WARC files, "
                f"{result['warc_bytes'] / 1e6:.2f} MB" + (f"; buckets owned by another daemon: {held}" if held else ""))
    return str(result)


AfterStep = Callable[[str, Any], None]  # (step name, its result), called once the step is over


def run_cycle(spark: SparkSession, conf: Config, root: str, seeds: str | None = None,
              after_step: AfterStep | None = None) -> CycleReport:
    """Run the steps in order; `after_step` is told when each is over (the tests keep a copy of the root there)."""
    from fetchd.commands import exit_status, fetch_segment
    from jobs import dedup, generate, inject, parse, update

    report = CycleReport(segment_id=None)

    def timed(name: str, func, *args):
        started = time.monotonic()
        log.info("cycle: %s started", name)
        result = func(*args)
        report.seconds[name] = time.monotonic() - started
        report.steps[name] = result
        log.info("cycle: %s done in %.1fs: %s", name, report.seconds[name], result)
        if after_step is not None:
            after_step(name, result)
        return result

    if seeds:
        timed("inject", inject.run, spark, conf, root, seeds)
    generated = timed("generate", generate.run, spark, conf, root)
    if not generated.url_count:
        return report
    report.segment_id = generated.segment_id
    fetched = timed("fetch", fetch_segment, conf, root, generated.segment_id)
    if fetched.get("stopped_by"):
        # SIGTERM/SIGINT stopped the fetch (its results are published, its buckets released): the process was
        # asked to end, so the cycle ends here instead of going on to parse; the next fetch resumes the segment.
        raise SystemExit(exit_status(fetched))
    timed("parse", parse.run, spark, conf, root, generated.segment_id)
    # Before update: update copies pages.duplicate_of into index_events and takes a parent's (lowered) priority.
    timed("dedup", dedup.run, spark, conf, root, generated.segment_id)
    timed("update", update.run, spark, conf, root, generated.segment_id)
    if conf.index.enabled:
        from jobs import index

        timed("index", index.run, spark, conf, root, generated.segment_id)
    return report


def run_command(spark: SparkSession, conf: Config, root: str, seeds: str | None, cycles: int) -> int:
    """`crawl cycle`: `cycles` cycles, the seeds injected in the first, each validated once merged, each cycle's
    report as it ends; a failed validation ends the command (exit 3) with its summary."""
    from jobs import validate

    for number in range(1, cycles + 1):
        report = run_cycle(spark, conf, root, seeds=seeds if number == 1 else None)
        if report.segment_id is None:  # nothing was generated: nothing changed to validate
            print(report.render(number))
            continue
        started = time.monotonic()
        validation = validate.run(spark, conf, root)
        report.seconds["validate"], report.steps["validate"] = time.monotonic() - started, validation
        print(report.render(number))
        if not validation.success:
            print(validation.summary())
            return validate.EXIT_VALIDATION_FAILED
    return 0
