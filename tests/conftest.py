"""Shared fixtures: one real local SparkSession with Delta for the whole test session, test config."""

from __future__ import annotations

import pytest

from crawler import config as config_mod

# Small, fast settings for tests; everything else is the documented default.
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
    # A daemon taking over a bucket waits this long before a host whose robots.txt it does not know yet (the
    # farm's largest Crawl-delay is 0.5 s); the 60 s default would stall the takeover tests.
    "politeness.max_crawl_delay_s": 2.0,
    # Sitemap discovery adds URLs to every crawl of the farm; the tests that check it turn it on.
    "sitemaps.probe_default_location": False,
    "sitemaps.from_robots": False,
}


@pytest.fixture(scope="session")
def base_conf() -> config_mod.Config:
    return config_mod.load().with_overrides(TEST_OVERRIDES)


@pytest.fixture(scope="session")
def spark(base_conf):
    from jobs.base import spark_session

    session = spark_session(base_conf, app_name="cyclecrawl-tests")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _fresh_daemon_memory():
    """Each test's daemons start with no host memory: the process-wide robots cache and gates are keyed by
    host:port, and a test's loopback server can get a port an earlier test's server had."""
    from fetchd.daemon import forget_hosts

    forget_hosts()


@pytest.fixture
def root(tmp_path) -> str:
    path = tmp_path / "root"
    path.mkdir()
    return str(path)
