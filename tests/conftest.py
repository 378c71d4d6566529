"""Session fixtures and the two lanes of the suite.

Lanes: `make test` runs pytest-xdist with `-n 2 --dist loadgroup`. Every test that starts Spark — the shared
in-process session (the `spark` fixture, directly or through another fixture) or a JVM in a child process
(marked `spark`) — is in the `spark` group; every other test (the daemon against loopback servers, pure rules)
is in the `light` group. Each group runs in one worker process, so the daemon tests' politeness waits overlap
Spark's work, and the two lanes share no process, port range (`tests/support/servers.py::free_port`) or folder.

Shared, built once per session: the SparkSession, and the work that starts in the background as soon as it is up
when any selected test reads it — the shared crawl (`tests/support/crawl.py`, in a thread of this process on its own
SparkSession over the same SparkContext), the dedup tests' small crawl (`tests/support/dedup_crawl.py`, in another
such thread, and after it the generated corpus's dedup runs), the crash tests' references, kills and re-runs once
the shared crawl is done (`tests/support/crash.py`, in a third such thread, the kills in child processes), validate's
runs over its two small crawls (`tests/support/validate_crawls.py`, in a fourth), and,
niced as the suite's slack, the Airflow cycle on a standalone cluster (`tests/support/airflow.py`), the S3 cycle
(`tests/support/s3_cycle.py`) and `crawl run`'s clean and interrupted crawls (`tests/support/run_crawls.py`: the
clean one is `crawl demo`, the README's main command), all three in child processes. In the Spark lane the readers
of each come after tests that read none of it, in the order the work is done (`READ_LATE`), so each has the lane's
earlier time to finish. The lane's end is its costliest part: once the background work is done, the in-process
tests alone keep one core busy.
"""

from __future__ import annotations

import importlib.machinery
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest

from crawler import config as config_mod
from tests.support.config import load_test_config

# An xdist worker's __main__ (execnet's) has neither __spec__ nor __file__, which pyspark's Spark Connect package
# takes for a doctest run: importing it (Great Expectations does) then exits the process. A spec named __main__
# says otherwise, and multiprocessing's spawn re-imports nothing for it in a child (as before).
if getattr(sys.modules["__main__"], "__spec__", None) is None and not hasattr(sys.modules["__main__"], "__file__"):
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("__main__", None)

SPARK_LANE, LIGHT_LANE = "spark", "light"
_SESSION_START = pytest.StashKey[float]()
# What starts in the background as soon as the session is up (`<name>_started`; a test reads `<name>`), with the
# rank of its readers in the Spark lane: after every test that reads nothing in the background, and after the readers
# of work that is done sooner (the crash kills wait for the shared crawl; the niced work takes the slack).
READ_LATE = {"dedup_crawl": 1, "shared_crawl": 1, "crash_kills": 2, "dedup_corpus": 2, "airflow_cycle": 3,
             "s3_cycle": 3, "validate_runs": 3, "run_crawls": 3}
BACKGROUND_WORK = tuple(READ_LATE)
# Fixtures that start Spark, in this process or a child.
SPARK_FIXTURES = frozenset({"spark", "spark_session_only", *BACKGROUND_WORK})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", choices=(SPARK_LANE, LIGHT_LANE), help="run only the tests of this lane")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts a Spark JVM in a child process (runs in the Spark lane)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every test in its lane (before xdist reads the groups), the readers of background work late (`READ_LATE`);
    with --lane, keep only that lane's."""
    lanes = {}
    for item in items:
        uses_spark = (not SPARK_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
                      or item.get_closest_marker("spark") is not None)
        lanes[item] = SPARK_LANE if uses_spark else LIGHT_LANE
        item.add_marker(pytest.mark.xdist_group(lanes[item]))
    # Readers of background work go after all other tests (a stable sort keeps the order within each rank), so the
    # work has the lane's earlier time to finish (docs/measurements.md: it is done before the lane's other tests).
    def rank(item: pytest.Item) -> int:
        return max((READ_LATE.get(name, 0) for name in getattr(item, "fixturenames", ())), default=0)

    items.sort(key=rank)
    wanted = config.getoption("lane")
    if wanted:
        config.hook.pytest_deselected(items=[item for item in items if lanes[item] != wanted])
        items[:] = [item for item in items if lanes[item] == wanted]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` a worker names each test with its group (`...@spark`); a test without one would be
    spread over both lanes, so the Spark tests would start a second JVM: refuse to run (an xdist/pytest upgrade
    broke the lanes before)."""
    if session.config.getoption("loadgroup", default=False):
        stray = [item.nodeid for item in session.items if "@" not in item.nodeid.rsplit("]", 1)[-1]]
        if stray:
            raise pytest.UsageError(f"--dist loadgroup did not group {len(stray)} tests, e.g. {stray[:3]}")


_lane_ends: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION_START] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note when each lane reported last (in the controller, under xdist): its last test's teardown includes the
    session fixtures', so it is when the lane's worker was done."""
    lane = report.nodeid.rpartition("@")[2] if "@" in report.nodeid.rsplit("]", 1)[-1] else None
    if lane in (SPARK_LANE, LIGHT_LANE):
        _lane_ends[lane] = time.monotonic()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """When each lane ended, so the suite's critical lane is visible beside the slowest tests."""
    if _lane_ends:
        start = config.stash[_SESSION_START]
        ends = ", ".join(f"{lane} at {end - start:.0f} s" for lane, end in sorted(_lane_ends.items()))
        terminalreporter.write_line(f"lanes ended: {ends}")


@pytest.fixture(scope="session")
def base_conf() -> config_mod.Config:
    return load_test_config()


def _in_background(name: str, work: Callable[..., Any], *args: Any) -> Iterator[Future]:
    """A session fixture's body: `work(*args)` in a thread of its own, its future yielded; on the way out it waits
    for the work (no child process, server or session outlives the fixture), whether a test read it or not."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as executor:
        future = executor.submit(work, *args)
        yield future
        future.exception()


def _after(first: Future, work: Callable[..., Any], *args: Any) -> Any:
    """`work(*args)` once `first` is done, whether it succeeded or not (its readers see its own error)."""
    wait([first])
    return work(*args)


@pytest.fixture(scope="session")
def spark_session_only(base_conf):
    """The suite's one SparkSession (`spark` is the same, with the background work started)."""
    from jobs.base import spark_session
    from tests.support.config import SESSION_JAVA_OPTIONS

    options = f"{base_conf.spark.conf['spark.driver.extraJavaOptions']} {SESSION_JAVA_OPTIONS}"
    session_conf = base_conf.with_overrides({"spark.conf": {**base_conf.spark.conf,
                                                            "spark.driver.extraJavaOptions": options}})
    session = spark_session(session_conf, app_name="cyclecrawl-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark(spark_session_only, request):
    for name in BACKGROUND_WORK:
        if any(name in getattr(item, "fixturenames", ()) for item in request.session.items):
            # Started now, it overlaps the in-process Spark tests instead of running after them.
            request.getfixturevalue(f"{name}_started")
    return spark_session_only


@pytest.fixture(scope="session")
def class_archive(tmp_path_factory):
    """The archive of Spark's classes that the JVMs of the background work map (`tests/support/jvm.py`), built in a
    child process of its own as soon as any of that work is started; their starts wait for it."""
    from tests.support import jvm

    jvm.expect_class_archive()
    yield from _in_background("class-archive", jvm.build_class_archive, tmp_path_factory.mktemp("jvm"))


@pytest.fixture(scope="session")
def shared_crawl_started(spark_session_only, base_conf, tmp_path_factory):
    """The shared crawl, run in a background thread on a session of its own over the suite's SparkContext (its SQL
    confs apart: dedup and maintain set some for a while) and with its own daemon host memory (per thread)."""
    from tests.support.crawl import run_shared_crawl

    base = tmp_path_factory.mktemp("shared-crawl")
    yield from _in_background("shared-crawl", run_shared_crawl, spark_session_only.newSession(), base_conf, base)


@pytest.fixture(scope="session")
def dedup_crawl_started(spark_session_only, base_conf, new_tables_root, tmp_path_factory):
    """The dedup tests' small crawl (`tests/support/dedup_crawl.py`), in a background thread on a session of its own
    over the suite's SparkContext (dedup sets SQL confs for a while)."""
    from tests.support.dedup_crawl import run_dedup_crawl

    base = tmp_path_factory.mktemp("dedup-crawl")
    root = new_tables_root(base / "root")
    yield from _in_background("dedup-crawl", run_dedup_crawl, spark_session_only.newSession(), base_conf, root, base)


@pytest.fixture(scope="session")
def dedup_crawl(spark, dedup_crawl_started):
    return dedup_crawl_started.result()


@pytest.fixture(scope="session")
def dedup_corpus_started(spark_session_only, base_conf, new_tables_root, dedup_crawl_started, tmp_path_factory):
    """The generated corpus's dedup runs (`tests/support/dedup_crawl.py::run_generated_corpus`), in a background
    thread on a session of its own, once the small crawl's are done (one thread of dedup work at a time: the small
    crawl's readers come before its own)."""
    from tests.support.dedup_crawl import run_generated_corpus

    root = new_tables_root(tmp_path_factory.mktemp("dedup-corpus") / "root")
    yield from _in_background("dedup-corpus", _after, dedup_crawl_started, run_generated_corpus,
                              spark_session_only.newSession(), base_conf, root)


@pytest.fixture(scope="session")
def dedup_corpus(spark, dedup_corpus_started):
    return dedup_corpus_started.result()


@pytest.fixture(scope="session")
def validate_runs_started(spark_session_only, base_conf, new_tables_root, tmp_path_factory):
    """validate over its valid crawl and its crawl of defects (`tests/support/validate_crawls.py`), in a background
    thread on a session of its own over the suite's SparkContext. Its readers come last in the lane: in-process
    validation in the lane waits for it (GX's current project is process-wide)."""
    from tests.support.validate_crawls import run_validations

    base = tmp_path_factory.mktemp("validate-runs")
    yield from _in_background("validate-runs", run_validations, spark_session_only.newSession(), base_conf,
                              new_tables_root, base)


@pytest.fixture(scope="session")
def validate_runs(spark, validate_runs_started):
    return validate_runs_started.result()


@pytest.fixture(scope="session")
def shared_crawl(spark, shared_crawl_started):
    """The one crawl of the farm that the end-to-end, sitemap, trap and crash tests read (`tests/support/crawl.py`)."""
    return shared_crawl_started.result()


@pytest.fixture(scope="session")
def _crash_parts():
    from tests.support.crash import CrashKills

    return CrashKills()


@pytest.fixture(scope="session")
def crash_kills_started(_crash_parts, spark_session_only, shared_crawl_started, class_archive, tmp_path_factory):
    """The crash tests' references and kills (`tests/support/crash.py`), in a thread of their own on a session of
    their own over the suite's SparkContext, once the shared crawl is done; each part is ready as soon as it is."""
    from tests.support.crash import run_crash_kills

    yield from _in_background("crash-kills", run_crash_kills, _crash_parts, spark_session_only.newSession(),
                              shared_crawl_started.result, tmp_path_factory.mktemp("crash"))


@pytest.fixture(scope="session")
def crash_kills(spark, crash_kills_started, _crash_parts):
    """The parts of the crash tests' background work; each read waits for its own part only."""
    return _crash_parts


@pytest.fixture(scope="session")
def run_crawls_started(class_archive, tmp_path_factory):
    """`crawl run`'s two crawls in child processes (niced), in a background thread (`tests/support/run_crawls.py`):
    the clean one is `crawl demo`, as `make demo` runs it, and the interrupted one."""
    from tests.support.run_crawls import run_both

    yield from _in_background("crawl-run", run_both, tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="session")
def run_crawls(run_crawls_started):
    return run_crawls_started.result()


@pytest.fixture(scope="session")
def airflow_cycle_started(base_conf, class_archive, tmp_path_factory):
    """One whole cycle through Airflow, its Spark steps on a standalone cluster that is stopped afterwards, running
    in a background thread (all its work is in child processes); the fixture waits for it at the session's end."""
    from tests.support.airflow import run_cycle_through_airflow
    from tests.support.cluster import standalone_cluster

    base = tmp_path_factory.mktemp("airflow-cycle")

    def run():
        with standalone_cluster(base / "cluster") as cluster:
            return run_cycle_through_airflow(base_conf, cluster, base)

    yield from _in_background("airflow-cycle", run)


@pytest.fixture(scope="session")
def airflow_cycle(airflow_cycle_started):
    """What the Airflow cycle left; the Airflow and the cluster tests both read it."""
    return airflow_cycle_started.result()


@pytest.fixture(scope="session")
def s3_cycle_started(base_conf, class_archive, tmp_path_factory):
    """One whole cycle on an s3:// root of moto's server (kept up for the session), in a background thread."""
    from tests.support.s3 import moto_server
    from tests.support.s3_cycle import run_s3_cycle

    base = tmp_path_factory.mktemp("s3-cycle")
    with moto_server() as server:
        yield from _in_background("s3-cycle", run_s3_cycle, base_conf, server, base)


@pytest.fixture(scope="session")
def s3_cycle(s3_cycle_started):
    return s3_cycle_started.result()


@pytest.fixture(autouse=True)
def _fresh_daemon_memory():
    """Each test's daemons start with no host memory: the robots cache and gates (per thread) are keyed by
    host:port, and a test's loopback server can get a port an earlier test's server had."""
    from fetchd.hostprep import forget_hosts

    forget_hosts()


@pytest.fixture
def root(tmp_path) -> str:
    path = tmp_path / "root"
    path.mkdir()
    return str(path)


@pytest.fixture(scope="session")
def _tables_template(spark_session_only, tmp_path_factory):
    from delta_tables import create_all

    path = tmp_path_factory.mktemp("tables-template") / "root"
    create_all(spark_session_only, str(path))
    return path


@pytest.fixture(scope="session")
def new_tables_root(_tables_template) -> Callable[[Path], str]:
    """A function: folder -> a root there (new or not) whose tables exist and are empty, copied from one created once
    per session (creating the tables costs about 3 CPU-s a root; the jobs' own ensure_tables then finds them all)."""
    return lambda folder: str(shutil.copytree(_tables_template, folder, dirs_exist_ok=True))


@pytest.fixture
def tables_root(new_tables_root, tmp_path) -> str:
    """A root whose tables exist and are empty (`new_tables_root`)."""
    return new_tables_root(tmp_path / "root")
