"""The JVMs the tests start in child processes for short work (a `crawl` command killed mid-step, the Airflow
cycle's spark-submits and the cluster's executors, the S3 cycle, `crawl demo`): their JIT and GC settings and a shared
archive of Spark's classes.

* C1 only. Such a JVM spent about 40 % of its CPU in C2 compiles it never profits from (inject + generate in a
  child process: 60 -> 36 CPU-s); the suite's own long-lived session keeps the default (C1 only made it 60 %
  slower). The code cache keeps the tiered default's size: C1 only reserves 48 MB, which Spark's generated code
  filled in an update ("Out of space in CodeCache"), and the JVM then fails the job.
* The serial collector, as in the suite's own session (tests/support/config.py): G1's concurrent threads compete for
  the two cores. Measured on `crawl demo` (two cycles) in a child process, A B A B: 197/196 -> 195/188 CPU-s,
  184/183 -> 176/172 s wall.
* Class data sharing (JDK 13+ dynamic archives). A Spark driver loads and verifies some 20,000 classes before its
  first job, every time. Once per session, `build_class_archive` runs a small job (create the tables and inject two
  seeds) in a driver that dumps the classes it loaded (`-XX:ArchiveClassesAtExit`); every later JVM maps them
  instead (`-XX:SharedArchiveFile`). Measured on `crawl inject` in a child process: 37 -> 29 CPU-s. A JVM whose
  class path differs from the archive's (spark-submit's launcher) or that finds no archive runs as before, and
  says nothing about it (`-Xlog:cds=off`). Classes of Delta's jars (a Spark class loader, not the JVM's) are not
  in the archive: the JDK archives only what its own loaders load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC"
QUIET_ARCHIVE = "-Xlog:cds=off -Xlog:cds+dynamic=off"
ARCHIVE_WAIT_S = 300  # how long a child's start waits for the archive being built (then it starts without)

# The training job, run in a child interpreter: the suite's Spark settings, the driver dumping its classes, and a
# wait for the driver JVM to exit (it writes the archive as it exits, after this interpreter's own work is done).
_TRAIN = """
import sys
from crawler import config
from delta_tables import tables
from jobs import inject
from jobs.base import spark_session
from tests.support.config import TEST_OVERRIDES

archive, root, seeds = sys.argv[1:4]
settings = {**TEST_OVERRIDES["spark.conf"]}
settings["spark.driver.extraJavaOptions"] = (
    settings.get("spark.driver.extraJavaOptions", "") + f" -XX:ArchiveClassesAtExit={archive} {sys.argv[4]}")
conf = config.load().with_overrides({**TEST_OVERRIDES, "spark.conf": settings})
spark = spark_session(conf, app_name="class-archive")
tables.create_all(spark, root)
inject.run(spark, conf, root, seeds)
driver = spark.sparkContext._gateway.proc
spark.stop()
driver.stdin.close()  # the driver exits when its stdin closes, and dumps the archive on the way out
driver.wait(240)
"""


class _Archive:
    """The session's archive: built once (in the background), then read by every child's environment."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.started = False
        self.ready = threading.Event()


_ARCHIVE = _Archive()


def expect_class_archive() -> None:
    """From now on a child's start waits for `build_class_archive` (called next, in the background)."""
    _ARCHIVE.started = True


def build_class_archive(folder: Path) -> Path | None:
    """Dump the classes of a small Spark job into `folder` (a child process); afterwards `short_lived_jvm_env` names
    the archive. None, and no archive used, if the dump failed. Not niced like the work that waits for it: niced on a
    machine the lanes keep busy, its ~60 CPU-s took five minutes and more, so the dump ran out of ARCHIVE_WAIT_S and
    every child started late and without the archive."""
    try:
        part = folder / "spark-classes.jsa.part"
        seeds = folder / "seeds.txt"
        seeds.write_text("http://a.test/\nhttp://b.test/\n")
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, str(part), str(folder / "root"), str(seeds), QUIET_ARCHIVE],
            cwd=REPO, env={**os.environ, "JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM}, capture_output=True, text=True,
            timeout=ARCHIVE_WAIT_S)
        if done.returncode == 0 and part.is_file() and part.stat().st_size:
            _ARCHIVE.path = part.rename(folder / "spark-classes.jsa")
        return _ARCHIVE.path
    finally:
        _ARCHIVE.ready.set()


def short_lived_jvm_env() -> dict[str, str]:
    """JAVA_TOOL_OPTIONS for a child's JVMs: C1 only, the serial collector, and the session's class archive once it
    is built (a start waits for a build under way, at most ARCHIVE_WAIT_S)."""
    if _ARCHIVE.started:
        _ARCHIVE.ready.wait(ARCHIVE_WAIT_S)
    options = SHORT_LIVED_JVM
    if _ARCHIVE.path is not None:
        options += f" -XX:SharedArchiveFile={_ARCHIVE.path} {QUIET_ARCHIVE}"
    return {"JAVA_TOOL_OPTIONS": options}
