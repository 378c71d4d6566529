"""Config: defaults file is complete and valid; every bad key or value is a clear error naming the key."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from crawler import config, settings
from tests.support.config import flat_keys


def test_defaults_file_is_valid_and_every_key_documented():
    conf = config.load()
    assert conf.crawl.buckets == 16
    text = config.DEFAULTS_PATH.read_text()
    for line in text.splitlines():
        if re.match(r"^\s+[a-z_]+:\s*\S", line):  # a key with a value on its line
            assert "#" in line, f"undocumented key line: {line!r}"


@pytest.mark.parametrize(
    ("assignment", "key"),
    [
        ("fetch.concurency=3", "fetch.concurency"),
        ("fetch.concurrency=abc", "fetch.concurrency"),
        ("fetch.concurrency=0", "fetch.concurrency"),
        ("crawl.buckets=-1", "crawl.buckets"),
        ("robots.cache_ttl_s=90000", "robots.cache_ttl_s"),
        ("robots.max_bytes=1000", "robots.max_bytes"),
        ("nosection.key=1", "nosection.key"),
        ("scope.schemes=[ftp]", "scope.schemes"),
        ("fetch.allow_networks=[not-a-cidr]", "fetch.allow_networks"),
        ("fetch.static_hosts={a.test: nowhere}", "fetch.static_hosts.a.test"),
        ("scope.strip_query_params={a.test: sid}", "scope.strip_query_params"),
        ("scope.strip_query_params={a.test: []}", "scope.strip_query_params"),
        ("scope.strip_query_params=[sid]", "scope.strip_query_params"),
        ("traps.max_known_urls_per_host=0", "traps.max_known_urls_per_host"),
        ("politeness.min_delay_s=true", "politeness.min_delay_s"),
        ("politeness.max_concurrency_per_ip=-1", "politeness.max_concurrency_per_ip"),
        ("politeness.max_concurrency_per_ip=1.5", "politeness.max_concurrency_per_ip"),
        ("politeness.min_delay_per_ip_s=-0.5", "politeness.min_delay_per_ip_s"),
        ("generate.refresh_share=1.5", "generate.refresh_share"),
        ("generate.per_domain_max_urls=-1", "generate.per_domain_max_urls"),
        ("generate.hot_domains=-3", "generate.hot_domains"),
        ('generate.domain_budgets={"a[bc].com": 5}', "generate.domain_budgets"),
        ('generate.domain_budgets={"x.com": -5}', "generate.domain_budgets"),
        ('generate.domain_budgets={"x.com": "many"}', "generate.domain_budgets"),
        ("generate.domain_budgets=[x.com]", "generate.domain_budgets"),
        ("generate.per_domain_daily_max_urls=-3", "generate.per_domain_daily_max_urls"),
        ('generate.domain_daily_budgets={"x.com": -1}', "generate.domain_daily_budgets"),
        ('generate.domain_daily_budgets={"x[y].com": 1}', "generate.domain_daily_budgets"),
        ("revisit.min_interval_s=99999999", "revisit.min_interval_s"),
        ("revisit.sitemap_min_interval_s=999999", "revisit.sitemap_min_interval_s"),
        ("revisit.sitemap_max_interval_s=0", "revisit.sitemap_max_interval_s"),
        ("fetch.warc_compressor=lz4", "fetch.warc_compressor"),
        ("fetch.warc_gzip_level=6", "fetch.warc_gzip_level"),  # above isal's scale (0-3), the default compressor
        ("fetch.warc_gzip_level=-1", "fetch.warc_gzip_level"),
        ("noequals", "noequals"),
        # Numbers that fit no place they go: Spark's int (`.limit()`, SQL), a timestamp, the JVM's heap size.
        ("generate.segment_max_urls=99999999999999999999", "generate.segment_max_urls"),
        ("generate.per_host_max_urls=99999999999999999999", "generate.per_host_max_urls"),
        ("generate.per_domain_max_urls=2147483648", "generate.per_domain_max_urls"),
        ('generate.domain_budgets={"x.com": 99999999999999999999}', "generate.domain_budgets"),
        ('generate.domain_daily_budgets={"x.com": 2147483648}', "generate.domain_daily_budgets"),
        ("s3.multipart_threshold_bytes=-99999999999999999999", "s3.multipart_threshold_bytes"),
        ("s3.multipart_chunk_bytes=6000000000", "s3.multipart_chunk_bytes"),
        ("fetch.warc_max_bytes=99999999999999999999", "fetch.warc_max_bytes"),
        ("politeness.min_delay_s=1.0e+30", "politeness.min_delay_s"),
        ("politeness.max_backoff_s=99999999999999999999", "politeness.max_backoff_s"),
        ("politeness.dead_after_days=40000", "politeness.dead_after_days"),
        ("maintain.vacuum_retention_hours=1000000.0", "maintain.vacuum_retention_hours"),
        ("generate.high_priority=1" + "0" * 400, "generate.high_priority"),
        ("spark.driver_memory=lots", "spark.driver_memory"),
        ("spark.driver_memory=2gb", "spark.driver_memory"),
        ("spark.driver_memory=2048", "spark.driver_memory"),
        ("spark.driver_memory=100m", "spark.driver_memory"),
        ("spark.driver_memory=99999999999999999999t", "spark.driver_memory"),
        ("spark.conf={spark.jars.packages: [a, b]}", "spark.conf"),
        ("spark.conf={spark.x: {y: 1}}", "spark.conf"),
        ("spark.conf={spark.x: null}", "spark.conf"),
        ("spark.conf={spark.x: .inf}", "spark.conf"),
        ("spark.conf={sql.shuffle.partitions: 4}", "spark.conf"),
    ],
)
def test_bad_assignment_names_the_key(assignment, key):
    with pytest.raises(config.ConfigError) as info:
        config.load(assignments=[assignment])
    assert info.value.key == key
    assert key in str(info.value)


def test_override_file_and_set_order(tmp_path: Path):
    override = tmp_path / "o.yaml"
    override.write_text("fetch:\n  concurrency: 5\npoliteness:\n  min_delay_s: 2\n")
    conf = config.load(override, ["fetch.concurrency=7"])
    assert conf.fetch.concurrency == 7  # --set wins over the file
    assert conf.politeness.min_delay_s == 2
    assert conf.crawl.buckets == 16  # untouched keys keep their default


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("fetch:\n  nosuch: 1\n", "fetch.nosuch"),
        ("fetch: 3\n", "fetch"),
        ("[1, 2]\n", "o.yaml"),
        ("fetch: {concurrency: [\n", "o.yaml"),
    ],
)
def test_bad_override_file(tmp_path: Path, content, key):
    override = tmp_path / "o.yaml"
    override.write_text(content)
    with pytest.raises(config.ConfigError) as info:
        config.load(override)
    assert key in str(info.value)


def test_missing_override_file(tmp_path: Path):
    with pytest.raises(config.ConfigError):
        config.load(tmp_path / "absent.yaml")


def test_cli_exits_2_naming_the_key(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "stats", "--root", str(tmp_path), "--set", "fetch.concurrency=-4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "fetch.concurrency" in result.stderr


def test_gzip_level_is_judged_on_the_chosen_compressors_scale():
    assert config.load(assignments=["fetch.warc_gzip_level=0"])["fetch.warc_gzip_level"] == 0  # isal's fastest
    conf = config.load(assignments=["fetch.warc_compressor=zlib", "fetch.warc_gzip_level=9"])
    assert (conf.fetch.warc_compressor, conf.fetch.warc_gzip_level) == ("zlib", 9)
    with pytest.raises(config.ConfigError, match="between 1 .* and 9 .* zlib, got 0") as info:
        config.load(assignments=["fetch.warc_compressor=zlib", "fetch.warc_gzip_level=0"])
    assert info.value.key == "fetch.warc_gzip_level"


def test_with_overrides_validates():
    conf = config.load()
    with pytest.raises(config.ConfigError):
        conf.with_overrides({"crawl.buckets": "many"})
    assert conf.with_overrides({"crawl.buckets": 8})["crawl.buckets"] == 8


def test_typed_settings_hold_exactly_the_defaults_files_keys():
    """Each section's settings class has the section's keys, in the file's order, and reads what the file says."""
    conf = config.load()
    data = conf.as_dict()
    assert list(typing.get_type_hints(settings.Settings)) == list(data)
    for section, values in data.items():
        view = getattr(conf, section)
        assert [field.name for field in dataclasses.fields(view)] == list(values), section
        for key, value in values.items():
            typed = getattr(view, key)
            expected = tuple(value) if isinstance(value, list) else value
            assert typed == expected and type(typed) is type(expected), f"{section}.{key}"


def test_typed_settings_are_immutable_and_coerced():
    conf = config.load().with_overrides({"politeness.min_delay_s": 2, "scope.schemes": ["https"],
                                          "fetch.static_hosts": {"a.test": "127.0.0.1"}})
    assert conf.politeness.min_delay_s == 2.0 and isinstance(conf.politeness.min_delay_s, float)
    assert conf.scope.schemes == ("https",)
    assert conf.fetch.static_hosts == {"a.test": "127.0.0.1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.fetch.concurrency = 1  # type: ignore[misc]
    assert conf.with_overrides({"fetch.concurrency": 3}).fetch.concurrency == 3
    assert conf.fetch.concurrency == 64  # the original is untouched


def test_every_integer_key_is_bounded_by_what_it_reaches():
    """No integer key takes a value past Spark's int unless it names its own bound, and those hold."""
    integer_keys = [key for key, value in flat_keys(config.defaults()).items()
                    if isinstance(value, int) and not isinstance(value, bool)]
    assert len(integer_keys) > 40
    for key in integer_keys:
        bound = config._UPPER_BOUNDS.get(key, (config.INT_MAX, ""))[0]
        with pytest.raises(config.ConfigError, match=f"'{key}'"):
            config.load(assignments=[f"{key}={bound + 1}"])
    assert config.load(assignments=["fetch.warc_max_bytes=5000000000"]).fetch.warc_max_bytes == 5000000000
    assert config.load(assignments=["generate.segment_max_urls=2147483647"]).generate.segment_max_urls == config.INT_MAX


def test_durations_are_at_most_a_century_in_their_unit():
    century_days = 36525
    assert config.load(assignments=[f"politeness.dead_after_days={century_days}"]).politeness.dead_after_days == 36525
    for assignment in (f"politeness.dead_after_days={century_days + 1}", "ownership.shutdown_grace_s=3200000000.0",
                       "parse.max_parse_seconds=3200000000.0"):
        with pytest.raises(config.ConfigError, match="a century"):
            config.load(assignments=[assignment])


def test_spark_memory_and_settings_in_the_forms_spark_takes():
    conf = config.load(assignments=["spark.driver_memory=4G", "spark.conf={spark.a: 1, spark.b: x, spark.c: true}"])
    assert conf.spark.driver_memory == "4G" and conf.spark.conf == {"spark.a": 1, "spark.b": "x", "spark.c": True}
    assert config.load(assignments=["spark.driver_memory=524288k"]).spark.driver_memory == "524288k"

