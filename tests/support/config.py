"""The test configuration: small, fast settings; everything else is the documented default."""

from __future__ import annotations

from crawler import config as config_mod

# HotSpot's thresholds for C2 (tier 4) compiles, each ten times its default.
TIER4_TEN_TIMES = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
                   "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000")

TEST_OVERRIDES = {
    "spark.master": "local[2]",
    "spark.shuffle_partitions": 2,
    "spark.driver_memory": "2g",
    "spark.log_level": "ERROR",
    "crawl.buckets": 4,
    "politeness.min_delay_s": 0.2,
    "fetch.allow_networks": ["127.0.0.0/8"],
    "fetch.progress_interval_s": 5.0,
    "fetch.total_timeout_s": 10.0,
    # One daemon process per fetch unless a test asks for more (tests/test_fetchd_processes.py).
    "fetch.processes": 1,
    # A daemon taking over a bucket waits this long before a host whose robots.txt it does not know yet (the
    # farm's largest Crawl-delay is 0.5 s); the 60 s default would stall the takeover tests.
    "politeness.max_crawl_delay_s": 2.0,
    # Sitemap discovery adds URLs to every crawl of the farm; the tests that check it turn it on.
    "sitemaps.probe_default_location": False,
    "sitemaps.from_robots": False,
    # WET files cost each parse a fixed second or so (its parts joined per WARC file); the crawls and tests that
    # check them turn them on: the shared crawl, the S3 cycle and test_parse.py's parse (tests/test_wet.py reads them).
    "parse.wet_enabled": False,
    # Spark evaluates the tests' many tiny queries without generating and compiling Java for each (results are
    # the same; Spark falls back to this path itself whenever generated code fails to compile). Measured on
    # test_update.py + test_traps.py: 540 -> 402 CPU-s, 353 -> 264 s wall.
    "spark.conf": {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                   # No adaptive re-planning of the tests' tiny queries (the results are the same; a shuffle keeps
                   # its two partitions instead of being coalesced into one, so more of the code sees more than
                   # one). Measured on test_update.py: 253 -> 230 CPU-s, 173 -> 158 s wall.
                   "spark.sql.adaptive.enabled": "false",
                   # Memory pages of 1 MB instead of the size Spark derives from the heap (16 MB at 2 GB, 64 MB at
                   # 4 GB): each broadcast hash join's relation is at least one page, and the driver keeps it in its
                   # block store until the broadcast is cleaned, so the session JVM held 20+ of them (0.35 GB of
                   # long[] live, 0.7 GB in the store) and ran a full GC every 5-10 s. Measured on the whole suite
                   # (one run each, nothing else running): store 0.7 GB -> 35 MB, GC 263 of 1,271 s -> 65 of 864 s,
                   # pytest 21:13-22:01 -> 17:57 (machine CPU 2,414 -> 2,127 s).
                   "spark.buffer.pageSize": "1m",
                   # Delta keeps every table it has read in a cache (its DeltaLog and latest snapshot, with their
                   # query plans) for 60 minutes, with no bound on the count: the session reads a few hundred tables
                   # (11 a root, a root a test), so its live set kept growing (165 logs and ~650,000 plan nodes live
                   # by the seventh minute). 64 holds the roots in use at once (the test's and the background
                   # work's); a table dropped from it is read from its log again. Measured on the whole suite after
                   # the page size above, one run each: pytest 17:57 -> 15:09, machine CPU 2,127 -> 1,761 s.
                   "spark.databricks.delta.delta.log.cacheSize": "64",
                   # The serial collector: the tests' driver heap is small and its pauses do not matter, while G1's
                   # concurrent threads compete for the two cores. Measured on four warm updates of one segment
                   # in one session: 95/46/39/33 -> 86/37/30/27 CPU-s (parallel GC: 84/36/30/32).
                   # C2 (the optimising JIT) only for methods ten times hotter than its defaults ask: the tests'
                   # many small, different queries kept C2 compiling Spark's broad planning code, a third of the
                   # JVM's CPU, for code that seldom ran long enough to repay it (C1's code runs meanwhile; C1 only
                   # made the driver ~60 % slower). Measured on test_update.py, then test_traps.py, default -> this:
                   # 348 -> 306 CPU-s (252 -> 234 s wall), 255 -> 222 CPU-s (171 s wall both); thirty times
                   # instead: 249 CPU-s and 226 s wall on test_traps.py.
                   "spark.driver.extraJavaOptions": "-XX:+UseSerialGC " + TIER4_TEN_TIMES},
}

# The suite's session JVM (tests/conftest.py::spark_session_only) only: a fixed young generation of 640 MB of its
# 2 GB heap. The serial collector starts it at ~110 MB and grows it only with the heap, so the session collected
# ~1.3 times a second (1,253 young collections by the 16th minute of a suite run). Measured on test_update.py +
# test_traps.py, A B A B: 285/287 -> 280/280 machine CPU-s, 229/228 -> 223/224 s wall. Not for the 1 GB child JVMs.
SESSION_JAVA_OPTIONS = "-Xmn640m"

# The same scalar settings as `crawl --set` arguments, for a test that runs a Spark command line in this process
# (spark.conf is the session's already).
SPARK_CLI_SETTINGS = [f"--set={k}={v}" for k, v in TEST_OVERRIDES.items()
                      if k.startswith("spark.") and not isinstance(v, dict)]


# The background cycles (Airflow on the cluster, the S3 cycle) are the suite's slack: no test waits for them until
# the end of the Spark lane. Their processes (and all they start: Spark drivers, executors, daemons) run niced, so
# the lanes' tests, which are waited for, get the cores first and the cycles take what is left: above all the
# second core once the light lane is done, which the Spark lane alone keeps only about one-fifth busy.
BACKGROUND_NICE = 10


def at_background_priority(command: list) -> list[str]:
    """`command` run niced by BACKGROUND_NICE (its child processes inherit it)."""
    return ["nice", "-n", str(BACKGROUND_NICE), *map(str, command)]


def load_test_config() -> config_mod.Config:
    return config_mod.load().with_overrides(TEST_OVERRIDES)


def flat_keys(data: dict, prefix: str = "") -> dict:
    """A nested config mapping as {"section.key": value} (an open mapping's entries too)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
