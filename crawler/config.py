"""Configuration: one documented defaults file (`conf/crawler.yaml`), overrides, validation at start-up.

The defaults file is the schema: a key that is not in it is unknown, and a value must have the type of its
default. Every number must also fit where it goes (`_UPPER_BOUNDS`, `_DURATION_UNITS`), and a few keys carry
extra range rules below. Errors name the offending key so the CLI can exit 2 with a message a person can act on.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.resources
import ipaddress
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from crawler.bucketing import POLITENESS_KEYS
from crawler.dedup import MAX_BLOCKS_PER_KEY, MAX_INDEX_KEYS, MAX_SUPPORTED_HAMMING, index_key_count
from crawler.errors import UserError
from crawler.ownership import check_timing
from crawler.robots import MAX_USE_CACHED_DAYS
from crawler.settings import Settings


def bundled(name: str) -> Path:
    """A file of the bundled configuration (the package `cyclecrawl_conf`, the project's conf/ folder) as a path on
    disk, the same from a clone's editable install and from a wheel (installed as files, never zipped: Spark and
    Great Expectations are given these paths)."""
    return Path(str(importlib.resources.files("cyclecrawl_conf").joinpath(name)))


DEFAULTS_PATH = Path(os.environ.get("CRAWL_DEFAULTS") or bundled("crawler.yaml"))

# `fetch.warc_gzip_level`'s range on each `fetch.warc_compressor`'s scale (fastest, smallest).
WARC_GZIP_LEVELS = {"isal": (0, 3), "zlib": (1, 9)}

# Every integer a key holds reaches Spark as a 32-bit int (`.limit()`, a count compared in SQL, a partition
# number) or a Python size, so INT_MAX bounds every integer key; `_UPPER_BOUNDS` names the keys whose values go
# elsewhere (a file size: 64-bit) or that need a tighter bound. The budgets of `generate.domain_budgets` and
# `generate.domain_daily_budgets` are integers under the same bound.
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
_UPPER_BOUNDS: dict[str, tuple[int, str]] = {
    "fetch.warc_max_bytes": (LONG_MAX, "a file size"),
    "s3.multipart_threshold_bytes": (LONG_MAX, "a file size"),
    "s3.multipart_chunk_bytes": (5 * 1024**3, "S3's largest part, 5 GiB"),
}
# A duration (a key named *_s, *_seconds, *_hours or *_days, with its unit in seconds) is added to a time: at most
# a century, so the sum stays inside the timestamps Spark and Python hold (years 1 to 9999) and inside a
# timer's range. (An integer one is also under INT_MAX: 68 years in seconds.)
MAX_DURATION_S = 100 * 365.25 * 86400
_DURATION_UNITS = {"_s": 1, "_seconds": 1, "_hours": 3600, "_days": 86400}
# `spark.driver_memory`: the JVM's heap size (`-Xmx`, which Spark's launcher builds from it): digits and a unit,
# k, m, g or t (Spark's documented form; a bare number means bytes to the JVM but MiB to Spark, so it is refused).
_JVM_MEMORY = re.compile(r"([0-9]+)([kmgt])", re.IGNORECASE)
_JVM_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
# Spark will not start a driver with a heap under 450 MiB (its reserved 300 MiB x 1.5), and the JVM keeps part of
# the heap for itself: 512m is the least this accepts.
MIN_DRIVER_MEMORY = 512 * 1024**2

# Keys whose value is a free-form mapping: their sub-keys are not checked against the defaults.
_OPEN_MAPPINGS = {"fetch.static_hosts", "spark.conf", "scope.strip_query_params", "generate.domain_budgets",
                  "generate.domain_daily_budgets"}


class ConfigError(UserError, ValueError):
    """A configuration key is unknown or its value is invalid; `key` names it (or the config file, for a file that
    cannot be read)."""

    def __init__(self, key: str, message: str, subject: str = "config key"):
        super().__init__(f"{subject} '{key}': {message}")
        self.key = key


# Keys the defaults file no longer has, and what took their place: a config that still sets one is told where to go.
_REPLACED = {
    "fetch.dns_cache_ttl_s": "was removed: DNS answers are now kept for their records' TTL, bounded by "
                             "fetch.dns_min_ttl_s and fetch.dns_max_ttl_s (fetch.dns_negative_ttl_s for names "
                             "without an address); set those instead",
}


def _unknown_key(dotted: str) -> ConfigError:
    """The error for a key the defaults file lacks; a removed key's message names its replacement."""
    return ConfigError(dotted, _REPLACED.get(dotted, "unknown key (every key is listed in conf/crawler.yaml)"))


def _positive(value: Any) -> bool:
    return value > 0


def _non_negative(value: Any) -> bool:
    return value >= 0


def _ip(value: Any) -> bool:
    ipaddress.ip_address(value)
    return True


def _networks(value: Any) -> bool:
    for item in value:
        ipaddress.ip_network(item, strict=False)
    return True


def _regexes(value: Any) -> bool:
    for item in value:
        try:
            re.compile(item)
        except re.error as exc:
            raise ValueError(str(exc)) from None
    return True


def _param_rules(value: Any) -> bool:
    return all(isinstance(host, str) and host and isinstance(names, list) and names
               and all(isinstance(name, str) and name for name in names) for host, names in value.items())


def _domain_budgets(value: Any) -> bool:
    from crawler.frontier import is_domain_pattern

    return all(is_domain_pattern(pattern) and isinstance(budget, int) and not isinstance(budget, bool)
               and 0 <= budget <= INT_MAX for pattern, budget in value.items())


def _jvm_memory(value: Any) -> bool:
    match = _JVM_MEMORY.fullmatch(value)
    return match is not None and MIN_DRIVER_MEMORY <= int(match[1]) * _JVM_UNITS[match[2].lower()] <= LONG_MAX


def _spark_settings(value: Any) -> bool:
    """`spark.conf`: Spark settings by name, each a scalar (Spark takes every value as text: a list or mapping
    would reach it as Python's repr)."""
    return all(isinstance(key, str) and key.startswith("spark.") and isinstance(setting, str | int | float | bool)
               and (not isinstance(setting, float) or math.isfinite(setting)) for key, setting in value.items())


_RULES: dict[str, tuple[Any, str]] = {
    "scope.strip_query_params": (_param_rules, "must map host patterns to non-empty lists of parameter names"),
    "crawl.buckets": (lambda v: 1 <= v <= 99999, "must be between 1 and 99999"),
    "crawl.user_agent": (lambda v: bool(v.strip()), "must not be empty"),
    "crawl.robots_token": (lambda v: bool(v.strip()) and " " not in v, "must be one word"),
    "scope.schemes": (lambda v: set(v) <= {"http", "https"} and bool(v), "only http and https are supported"),
    "scope.max_url_length": (_positive, "must be > 0"),
    "scope.max_depth": (_non_negative, "must be >= 0"),
    "scope.deny_patterns": (_regexes, "must be a list of valid regular expressions"),
    "traps.max_url_length": (_positive, "must be > 0"),
    "traps.max_path_depth": (_positive, "must be > 0"),
    "traps.max_segment_repeats": (_positive, "must be > 0"),
    "traps.max_query_params": (_non_negative, "must be >= 0"),
    "traps.max_new_urls_per_host_per_cycle": (_positive, "must be > 0"),
    "traps.max_new_urls_per_template_per_cycle": (_positive, "must be > 0"),
    "traps.max_known_urls_per_host": (_positive, "must be > 0"),
    "generate.segment_max_urls": (_positive, "must be > 0"),
    "generate.per_host_max_urls": (_positive, "must be > 0"),
    "generate.per_domain_max_urls": (_non_negative, "must be >= 0 (0: no domain budget)"),
    "generate.domain_budgets": (_domain_budgets,
                                f"must map domain globs (* and ? only) to budgets from 0 to {INT_MAX}"),
    "generate.per_domain_daily_max_urls": (_non_negative, "must be >= 0 (0: no daily domain budget)"),
    "generate.domain_daily_budgets": (_domain_budgets,
                                      f"must map domain globs (* and ? only) to budgets from 0 to {INT_MAX}"),
    "generate.hot_domains": (_non_negative, "must be >= 0"),
    "generate.segment_seconds": (_positive, "must be > 0"),
    "generate.lease_seconds": (_positive, "must be > 0"),
    "generate.age_boost_per_day": (_non_negative, "must be >= 0"),
    "generate.refresh_share": (lambda v: 0 <= v <= 1, "must be between 0 and 1"),
    "generate.refresh_share_min": (lambda v: 0 <= v <= 1, "must be between 0 and 1"),
    "generate.refresh_share_max": (lambda v: 0 <= v <= 1, "must be between 0 and 1"),
    "generate.refresh_share_gain": (_non_negative, "must be >= 0"),
    "generate.max_unmerged_segments": (_non_negative, "must be >= 0"),
    "cycle.interval_s": (_positive, "must be > 0"),
    "cycle.poll_s": (_positive, "must be > 0"),
    "cycle.metrics_port": (lambda v: 0 <= v <= 65535, "must be between 0 (no endpoint) and 65535"),
    "cycle.metrics_host": (_ip, "must be an IP address such as 127.0.0.1"),
    "cycle.validate_every_s": (_non_negative, "must be >= 0 (0: after every merged segment)"),
    "service_levels.discovery_durable_s": (_positive, "must be > 0"),
    "service_levels.lease_within_s": (_positive, "must be > 0"),
    "service_levels.lease_share": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "politeness.min_delay_s": (_non_negative, "must be >= 0"),
    "politeness.max_crawl_delay_s": (_non_negative, "must be >= 0"),
    "politeness.max_concurrency_per_host": (_positive, "must be > 0"),
    "politeness.dead_after_days": (_positive, "must be > 0"),
    "politeness.key": (lambda v: v in POLITENESS_KEYS, f"must be one of {', '.join(POLITENESS_KEYS)}"),
    "politeness.max_concurrency_per_ip": (_non_negative, "must be >= 0 (0: no cap)"),
    "politeness.min_delay_per_ip_s": (_non_negative, "must be >= 0"),
    "politeness.backoff_base_s": (_non_negative, "must be >= 0"),
    "politeness.max_backoff_s": (_non_negative, "must be >= 0"),
    "politeness.max_consecutive_failures": (_positive, "must be > 0"),
    "politeness.backoff_recovery_factor": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "politeness.response_time_factor": (_non_negative, "must be >= 0"),
    "politeness.max_response_time_delay_s": (_non_negative, "must be >= 0"),
    "fetch.concurrency": (_positive, "must be > 0"),
    "fetch.processes": (_non_negative, "must be >= 0 (0: one per core)"),
    "fetch.connect_timeout_s": (_positive, "must be > 0"),
    "fetch.total_timeout_s": (_positive, "must be > 0"),
    "fetch.max_body_bytes": (_positive, "must be > 0"),
    "fetch.max_decoded_bytes": (_positive, "must be > 0"),
    "fetch.max_header_field_bytes": (lambda v: v >= 1024, "must be >= 1024"),
    "fetch.max_headers": (_positive, "must be > 0"),
    "fetch.accept_content_types": (lambda v: all(isinstance(t, str) and "/" in t for t in v),
                                   "must be a list of media-type prefixes such as text/html"),
    "fetch.max_redirects": (_non_negative, "must be >= 0"),
    "fetch.warc_max_bytes": (_positive, "must be > 0"),
    "fetch.warc_compressor": (lambda v: v in WARC_GZIP_LEVELS, f"must be one of {', '.join(WARC_GZIP_LEVELS)}"),
    "fetch.max_queued_urls": (_positive, "must be > 0"),
    "fetch.progress_interval_s": (_positive, "must be > 0"),
    "fetch.dns_min_ttl_s": (_non_negative, "must be >= 0"),
    "fetch.dns_max_ttl_s": (_non_negative, "must be >= 0"),
    "fetch.dns_negative_ttl_s": (_non_negative, "must be >= 0 (0: not cached)"),
    "fetch.poll_interval_s": (_positive, "must be > 0"),
    "fetch.storage_retry_s": (_positive, "must be > 0"),
    "fetch.storage_retry_max_s": (_positive, "must be > 0"),
    "s3.multipart_chunk_bytes": (lambda v: v >= 5 * 1024 * 1024, "must be at least 5 MiB (S3's smallest part)"),
    "fetch.metrics_port": (lambda v: 0 <= v <= 65535, "must be between 0 (no endpoint) and 65535"),
    "fetch.metrics_host": (_ip, "must be an IP address such as 127.0.0.1"),
    "fetch.allow_networks": (_networks, "must be a list of CIDR networks such as 127.0.0.0/8"),
    "ownership.lease_ttl_s": (_positive, "must be > 0"),
    "ownership.renew_interval_s": (_positive, "must be > 0"),
    "ownership.fence_margin_s": (_positive, "must be > 0"),
    "ownership.takeover_grace_s": (_non_negative, "must be >= 0"),
    "ownership.max_buckets_per_daemon": (_non_negative, "must be >= 0"),
    "ownership.shutdown_grace_s": (_non_negative, "must be >= 0"),
    "ownership.results_batch_rows": (_positive, "must be > 0"),
    "ownership.results_publish_s": (_positive, "must be > 0"),
    "writer_lock.wait_s": (_non_negative, "must be >= 0 (0: refuse at once)"),
    "writer_lock.ttl_s": (_positive, "must be > 0"),
    "robots.max_bytes": (lambda v: v >= 512000, "must be >= 512000 (RFC 9309 asks for at least 500 KiB)"),
    "robots.cache_ttl_s": (lambda v: 0 < v <= 86400, "must be in (0, 86400] (RFC 9309: cache at most 24 h)"),
    "robots.max_redirects": (lambda v: 0 <= v <= 5, "must be between 0 and 5"),
    "robots.unreachable_use_cached_days": (lambda v: 0 <= v <= MAX_USE_CACHED_DAYS,
                                           f"must be in [0, {MAX_USE_CACHED_DAYS}]: RFC 9309 lets a cached copy stand "
                                           "in for an unreachable robots.txt for at most 30 days (0 = never)"),
    "robots.unreachable_retry_s": (_positive, "must be > 0"),
    "revisit.default_interval_s": (_positive, "must be > 0"),
    "revisit.min_interval_s": (_positive, "must be > 0"),
    "revisit.max_interval_s": (_positive, "must be > 0"),
    "revisit.changed_factor": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "revisit.unchanged_factor": (lambda v: v >= 1, "must be >= 1"),
    "revisit.retry_base_s": (_positive, "must be > 0"),
    "revisit.retry_jitter": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "revisit.max_failures": (_positive, "must be > 0"),
    "revisit.failed_interval_s": (_positive, "must be > 0"),
    "revisit.gone_interval_s": (_positive, "must be > 0"),
    "revisit.robots_denied_interval_s": (_positive, "must be > 0"),
    "revisit.sitemap_min_interval_s": (_positive, "must be > 0"),
    "revisit.sitemap_max_interval_s": (_positive, "must be > 0"),
    "parse.max_outlinks": (_positive, "must be > 0"),
    "parse.max_html_bytes": (_positive, "must be > 0"),
    "parse.simhash_shingle": (_positive, "must be > 0"),
    "parse.max_parse_seconds": (_positive, "must be > 0"),
    "parse.language_max_chars": (_non_negative, "must be >= 0 (0 = no language detection)"),
    "sitemaps.max_urls": (_positive, "must be > 0"),
    "sitemaps.max_fetch_bytes": (_positive, "must be > 0"),
    "sitemaps.max_uncompressed_bytes": (_positive, "must be > 0"),
    "sitemaps.max_index_depth": (_non_negative, "must be >= 0"),
    "sitemaps.max_loc_length": (_positive, "must be > 0"),
    "dedup.max_hamming": (lambda v: 0 <= v <= MAX_SUPPORTED_HAMMING, f"must be between 0 and {MAX_SUPPORTED_HAMMING}"),
    "dedup.blocks_per_key": (lambda v: 1 <= v <= MAX_BLOCKS_PER_KEY, f"must be between 1 and {MAX_BLOCKS_PER_KEY}"),
    "dedup.max_bucket_size": (lambda v: v >= 2, "must be >= 2"),
    "dedup.duplicate_priority_factor": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "spark.shuffle_partitions": (_positive, "must be > 0"),
    "spark.small_input_rows": (_non_negative, "must be >= 0 (0: never)"),
    "spark.driver_memory": (_jvm_memory, "must be a JVM memory size, digits and a unit k, m, g or t (such as 2g), "
                                         "at least 512m"),
    "spark.conf": (_spark_settings, "must map spark.* setting names to single values (text, numbers, true/false)"),
    "maintain.vacuum_retention_hours": (_non_negative, "must be >= 0"),
    "maintain.target_file_mb": (_positive, "must be > 0"),
    "maintain.vacuum_listing_tasks": (_non_negative, "must be >= 0"),
    "maintain.urls_files_per_bucket": (_positive, "must be > 0"),
    "maintain.urls_min_file_mb": (_non_negative, "must be >= 0"),
    "validate.unexpected_examples": (lambda v: 1 <= v <= 100, "must be between 1 and 100"),
    "validate.future_slack_s": (_non_negative, "must be >= 0"),
    "demo.hosts": (lambda v: 1 <= v <= 10000, "must be between 1 and 10000"),
    "demo.pages_per_host": (lambda v: 1 <= v <= 100000, "must be between 1 and 100000"),
    "demo.min_delay_s": (_non_negative, "must be >= 0"),
}


class Config(Settings):
    """Validated configuration, read through its typed sections (`conf.fetch.concurrency`, `crawler.settings`);
    `conf["section.key"]` is for the edges that hold a key as text (config loading, the command line)."""

    def __init__(self, data: Mapping[str, Any], sources: Mapping[str, str] | None = None):
        self._data = copy.deepcopy(dict(data))
        super().__init__(self._data)
        # Where each key's value came from (`load`, `from_arguments`): "default", "file PATH", "--set", "--root";
        # "set by the caller" for keys a `with_overrides` changed.
        self.sources: dict[str, str] = dict(sources or {})

    def __getitem__(self, dotted: str) -> Any:
        node: Any = self._data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(dotted)
            node = node[part]
        return copy.deepcopy(node)

    def as_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    def with_overrides(self, overrides: Mapping[str, Any], source: str = "set by the caller") -> Config:
        """A new validated Config with `{"section.key": value}` overrides applied (their source: `source`)."""
        data = self.as_dict()
        for dotted, value in overrides.items():
            _set_dotted(data, dotted, value)
        return validated(data, {**self.sources, **{dotted: source for dotted in overrides}})

    def describe(self) -> list[str]:
        """The effective config, one `key: value  # source` line per key in the defaults file's order (values as
        YAML flow text), what `crawl config show` prints."""
        lines = []
        for dotted in leaf_keys(self._data):
            value = yaml.safe_dump(self[dotted], default_flow_style=True, width=1 << 20).strip()
            value = value.removesuffix("\n...").strip()
            owner = next((self.sources[k] for k in _and_parents(dotted) if k in self.sources), "default")
            lines.append(f"{dotted}: {value}  # {owner}")
        return lines


def leaf_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of a config mapping's values: sections are walked, open mappings are values."""
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted not in _OPEN_MAPPINGS:
            keys.extend(leaf_keys(value, dotted + "."))
        else:
            keys.append(dotted)
    return keys


def _and_parents(dotted: str) -> list[str]:
    """`a.b.c`, `a.b`, `a`: an assignment into an open mapping (`fetch.static_hosts.h=...`) sets its parent."""
    parts = dotted.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, "is not a section")
    node[parts[-1]] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read: {exc.strerror or exc}", "config file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"is not UTF-8 text: {exc}", "config file") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"is not valid YAML: {' '.join(str(exc).split())}", "config file") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(str(path), "must hold a mapping of sections", "config file")
    return loaded


def _merge(base: dict[str, Any], override: Mapping[str, Any], prefix: str = "") -> None:
    for key, value in override.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise _unknown_key(dotted)
        if isinstance(base[key], dict) and dotted not in _OPEN_MAPPINGS:
            if not isinstance(value, Mapping):
                raise ConfigError(dotted, "must be a section (a mapping)")
            _merge(base[key], value, dotted + ".")
        else:
            base[key] = value


def _type_ok(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _check(defaults: Mapping[str, Any], data: Mapping[str, Any], prefix: str = "") -> None:
    for key, default in defaults.items():
        dotted = f"{prefix}{key}"
        value = data[key]
        if isinstance(default, dict) and dotted not in _OPEN_MAPPINGS:
            _check(default, value, dotted + ".")
            continue
        if not _type_ok(default, value):
            raise ConfigError(dotted, f"must be of type {type(default).__name__}, got {value!r}")
        if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, list) else [value])):
            # No key gives infinity (or NaN) a meaning; SQL built from such a value would not even parse.
            raise ConfigError(dotted, f"must be a finite number, got {value!r}")
        if isinstance(default, list) and default and not all(isinstance(v, type(default[0])) for v in value):
            raise ConfigError(dotted, f"items must be of type {type(default[0]).__name__}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            _check_fits(dotted, default, value)
        rule = _RULES.get(dotted)
        if rule is not None:
            check, message = rule
            try:
                ok = check(value)
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise ConfigError(dotted, f"{message}, got {value!r}")
    for host, ip in data.get("fetch", {}).get("static_hosts", {}).items() if prefix == "" else ():
        try:
            _ip(ip)
        except ValueError:
            raise ConfigError(f"fetch.static_hosts.{host}", f"must be an IP address, got {ip!r}") from None
    if prefix == "" and data["revisit"]["min_interval_s"] > data["revisit"]["max_interval_s"]:
        raise ConfigError("revisit.min_interval_s", "must not exceed revisit.max_interval_s")
    if prefix == "" and data["revisit"]["sitemap_min_interval_s"] > data["revisit"]["sitemap_max_interval_s"]:
        raise ConfigError("revisit.sitemap_min_interval_s", "must not exceed revisit.sitemap_max_interval_s")
    if prefix == "" and data["fetch"]["dns_min_ttl_s"] > data["fetch"]["dns_max_ttl_s"]:
        raise ConfigError("fetch.dns_min_ttl_s", "must not exceed fetch.dns_max_ttl_s")
    if prefix == "" and data["generate"]["refresh_share_min"] > data["generate"]["refresh_share_max"]:
        raise ConfigError("generate.refresh_share_min", "must not exceed generate.refresh_share_max")
    if prefix == "":
        dedup = data["dedup"]
        keys = index_key_count(dedup["max_hamming"], dedup["blocks_per_key"])
        if keys > MAX_INDEX_KEYS:
            raise ConfigError("dedup.blocks_per_key", f"with dedup.max_hamming {dedup['max_hamming']} makes {keys} "
                              f"index rows a page, more than {MAX_INDEX_KEYS}: use fewer blocks a key")
        compressor, level = data["fetch"]["warc_compressor"], data["fetch"]["warc_gzip_level"]
        fastest, smallest = WARC_GZIP_LEVELS[compressor]
        if not fastest <= level <= smallest:
            raise ConfigError("fetch.warc_gzip_level", f"must be between {fastest} (fastest) and {smallest} (smallest) "
                              f"with fetch.warc_compressor {compressor}, got {level!r}")
        lease = data["ownership"]
        problem = check_timing(lease["lease_ttl_s"], lease["renew_interval_s"], lease["fence_margin_s"])
        if problem is not None:
            raise ConfigError(*problem)


def _check_fits(dotted: str, default: float, value: float) -> None:
    """A number within what its key reaches (`_UPPER_BOUNDS`, `MAX_DURATION_S`): ConfigError naming the key."""
    if isinstance(default, float):
        try:
            float(value)  # a whole number for a float key: 10**400 has no float
        except OverflowError:
            raise ConfigError(dotted, f"must be a finite number, got {value!r}") from None
    else:
        bound, what = _UPPER_BOUNDS.get(dotted, (INT_MAX, "Spark's largest int"))
        if abs(value) > bound:
            limit = f"at most {bound}" if value > 0 else f"at least {-bound}"
            raise ConfigError(dotted, f"must be {limit} ({what}), got {value!r}")
    unit = next((seconds for suffix, seconds in _DURATION_UNITS.items() if dotted.endswith(suffix)), None)
    if unit is not None and abs(value) * unit > MAX_DURATION_S:
        raise ConfigError(dotted, f"must be at most {MAX_DURATION_S / unit:.0f} (a century), got {value!r}")


def defaults() -> dict[str, Any]:
    """The defaults file's mapping: a fresh copy each time (callers merge into it)."""
    return copy.deepcopy(_parsed_defaults())


@functools.cache
def _parsed_defaults() -> dict[str, Any]:
    """The defaults file, read once per process: every load and `with_overrides` validates against it (about 12 ms
    a read; a test session validates hundreds of configs)."""
    return _read_yaml(DEFAULTS_PATH)


def validated(data: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Config:
    """Check a full config mapping against the defaults file's schema; `sources` says where set keys came from."""
    base = defaults()
    merged = copy.deepcopy(base)
    _merge(merged, data)
    _check(base, merged)
    return Config(merged, sources)


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` from the command line; the value is read as YAML (`5`, `1.5`, `true`, `[a, b]`)."""
    if "=" not in text:
        raise ConfigError(text, "--set takes key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value is not valid YAML: {' '.join(str(exc).split())}") from exc
    return key, value


def load(path: str | Path | None = None, assignments: Iterable[str] = ()) -> Config:
    """Defaults, then the override file, then `--set key=value` assignments, validated."""
    data = defaults()
    sources: dict[str, str] = {}
    if path is not None:
        from_file = _read_yaml(Path(path))
        _merge(data, from_file)
        sources.update({dotted: f"file {path}" for dotted in leaf_keys(from_file)})
    for assignment in assignments:
        key, value = parse_assignment(assignment)
        head = data
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            dotted = ".".join(parts[: i + 1])
            if part not in head or not isinstance(head[part], dict):
                raise ConfigError(key, f"unknown key (no section '{dotted}')")
            head = head[part]
        if parts[-1] not in head and ".".join(parts[:-1]) not in _OPEN_MAPPINGS:
            raise _unknown_key(key)
        head[parts[-1]] = value
        sources[key] = "--set"
    return validated(data, sources)


def s3_endpoint(conf: Config, environ: Mapping[str, str] = os.environ) -> str:
    """The S3 endpoint every client uses (boto3 in the daemon, pyarrow and S3A in the jobs): `s3.endpoint_url`,
    else AWS_ENDPOINT_URL, else "" for AWS's own endpoint of `s3.region`."""
    return conf.s3.endpoint_url or environ.get("AWS_ENDPOINT_URL", "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every command line of the engine takes: --root, --config, --set, -v."""
    parser.add_argument("--root", help="storage root (default: storage.root from config)")
    parser.add_argument("--config", help="YAML file overriding any subset of conf/crawler.yaml")
    parser.add_argument(
        "--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set politeness.min_delay_s=2 (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def from_arguments(args: argparse.Namespace) -> Config:
    """The validated config for parsed `add_arguments` options; raises ConfigError naming a bad key."""
    conf = load(args.config, args.assignments)
    if args.root:
        conf = conf.with_overrides({"storage.root": args.root}, source="--root")
    return conf
