"""`crawl demo` on a tiny farm, as `make demo` runs it: its own interpreter and JVM, in the background.

It is the suite's slack like the background cycles (run niced: `tests/support/config.py::BACKGROUND_NICE`): the
command crawls with real politeness waits, so in the Spark lane's own process it held the lane for about 100 s; in a
child process of its own the waits and the work overlap the lane's other tests, and the test reads what it left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.config import TEST_OVERRIDES, at_background_priority
from tests.support.jvm import short_lived_jvm_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1500


@dataclass
class DemoRun:
    root: Path
    returncode: int
    out: str   # stdout
    err: str   # stderr


def run_demo_command(base: Path) -> DemoRun:
    """`crawl demo` (until nothing is due) on three hosts of eight pages, one hop from the seeds (two segments: the
    homes, then what they link to; each further one is a whole cycle of the suite's time), with the suite's Spark
    settings (a config file: the `spark.conf` mapping cannot be given with --set). Sitemap discovery is off, as in
    the suite's other crawls but the shared one (which the sitemap tests read): with it the demo ran five segments
    instead of two (the sitemaps that robots.txt files name, the pages they list, and what those link to)."""
    root = base / "demo"
    config = base / "demo.yaml"
    config.write_text(yaml.safe_dump({"spark": {"conf": TEST_OVERRIDES["spark.conf"]}}))
    argv = [sys.executable, "-m", "jobs.cli", "demo", "--root", str(root), "--config", str(config),
            "--set", "demo.hosts=3", "--set", "demo.pages_per_host=8", "--set", "demo.min_delay_s=0.1",
            "--set", "scope.max_depth=1", "--set", "spark.master=local[2]", "--set", "spark.shuffle_partitions=2",
            "--set", "spark.log_level=ERROR", "--set", "sitemaps.probe_default_location=false",
            "--set", "sitemaps.from_robots=false"]
    done = subprocess.run(at_background_priority(argv), cwd=REPO, env={**os.environ, **short_lived_jvm_env()},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    return DemoRun(root, done.returncode, done.stdout, done.stderr)
