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
        ("fetch.warc_compressor=lz4", "fetch.warc_compressor"),
        ("fetch.warc_gzip_level=6", "fetch.warc_gzip_level"),  # above isal's scale (0-3), the default compressor
        ("fetch.warc_gzip_level=-1", "fetch.warc_gzip_level"),
        ("noequals", "noequals"),
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
