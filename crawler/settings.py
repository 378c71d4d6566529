"""Typed settings: every section of the defaults file (`conf/crawler.yaml`) as a frozen dataclass.

A validated `crawler.config.Config` carries one of each as an attribute (`conf.fetch.concurrency`), so code reads
typed, immutable values by name and a misspelt key fails where it is written, not at run time. Each class's fields
are exactly its section's keys, in the file's order (a test holds them equal); the defaults file documents them.
Lists become tuples and floats are floats whatever the YAML wrote (`5` for `5.0`); the open mappings
(`fetch.static_hosts`, `spark.conf`, `scope.strip_query_params`, `generate.domain_budgets`,
`generate.domain_daily_budgets`) stay mappings, copied, and are not to be changed.
"""

from __future__ import annotations

import copy
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class StorageSettings:
    """`storage.*`."""
    root: str

@dataclass(frozen=True)
class S3Settings:
    """`s3.*`."""
    endpoint_url: str
    region: str
    path_style_access: bool
    multipart_threshold_bytes: int
    multipart_chunk_bytes: int

@dataclass(frozen=True)
class CrawlSettings:
    """`crawl.*`."""
    buckets: int
    user_agent: str
    robots_token: str

@dataclass(frozen=True)
class ScopeSettings:
    """`scope.*`."""
    schemes: tuple[str, ...]
    host_suffixes: tuple[str, ...]
    max_url_length: int
    max_depth: int
    allow_domains: tuple[str, ...]
    deny_domains: tuple[str, ...]
    deny_patterns: tuple[str, ...]
    strip_query_params: Mapping[str, list[str]]

@dataclass(frozen=True)
class TrapsSettings:
    """`traps.*`."""
    max_url_length: int
    max_path_depth: int
    max_segment_repeats: int
    max_query_params: int
    max_new_urls_per_host_per_cycle: int
    max_new_urls_per_template_per_cycle: int
    max_known_urls_per_host: int

@dataclass(frozen=True)
class GenerateSettings:
    """`generate.*`."""
    segment_max_urls: int
    per_host_max_urls: int
    per_domain_max_urls: int
    domain_budgets: Mapping[str, int]
    per_domain_daily_max_urls: int
    domain_daily_budgets: Mapping[str, int]
    hot_domains: int
    segment_seconds: int
    lease_seconds: int
    age_boost_per_day: float
    budget_split: bool
    refresh_share: float
    refresh_share_adaptive: bool
    refresh_share_min: float
    refresh_share_max: float
    refresh_share_gain: float
    high_priority: float
    max_unmerged_segments: int

@dataclass(frozen=True)
class CycleSettings:
    """`cycle.*`."""
    interval_s: float
    poll_s: float
    metrics_port: int
    metrics_host: str
    validate_every_s: float

@dataclass(frozen=True)
class ServiceLevelsSettings:
    """`service_levels.*`."""
    discovery_durable_s: float
    lease_within_s: float
    lease_share: float

@dataclass(frozen=True)
class PolitenessSettings:
    """`politeness.*`."""
    min_delay_s: float
    max_crawl_delay_s: float
    max_concurrency_per_host: int
    key: str
    backoff_base_s: float
    max_backoff_s: float
    max_consecutive_failures: int
    backoff_recovery_factor: float
    response_time_factor: float
    max_response_time_delay_s: float
    max_concurrency_per_ip: int
    min_delay_per_ip_s: float
    dead_after_days: float

@dataclass(frozen=True)
class FetchSettings:
    """`fetch.*`."""
    concurrency: int
    processes: int
    connect_timeout_s: float
    total_timeout_s: float
    max_body_bytes: int
    max_decoded_bytes: int
    max_header_field_bytes: int
    max_headers: int
    accept_content_types: tuple[str, ...]
    max_redirects: int
    accept_language: str
    warc_max_bytes: int
    warc_compressor: str
    warc_gzip_level: int
    max_queued_urls: int
    progress_interval_s: float
    dns_min_ttl_s: int
    dns_max_ttl_s: int
    dns_negative_ttl_s: int
    static_hosts: Mapping[str, str]
    allow_networks: tuple[str, ...]
    daemon_id: str
    poll_interval_s: float
    storage_retry_s: float
    storage_retry_max_s: float
    staging_dir: str
    metrics_port: int
    metrics_host: str
    metrics_label: str

@dataclass(frozen=True)
class OwnershipSettings:
    """`ownership.*`."""
    lease_ttl_s: float
    renew_interval_s: float
    fence_margin_s: float
    takeover_grace_s: float
    max_buckets_per_daemon: int
    shutdown_grace_s: float
    results_batch_rows: int
    results_publish_s: float

@dataclass(frozen=True)
class WriterLockSettings:
    """`writer_lock.*`."""
    wait_s: float
    ttl_s: float

@dataclass(frozen=True)
class RobotsSettings:
    """`robots.*`."""
    max_bytes: int
    cache_ttl_s: int
    unreachable_use_cached_days: float
    unreachable_retry_s: float
    max_redirects: int

@dataclass(frozen=True)
class RevisitSettings:
    """`revisit.*`."""
    default_interval_s: int
    min_interval_s: int
    max_interval_s: int
    changed_factor: float
    unchanged_factor: float
    retry_base_s: int
    retry_jitter: float
    max_failures: int
    failed_interval_s: int
    gone_interval_s: int
    robots_denied_interval_s: int
    sitemap_min_interval_s: int
    sitemap_max_interval_s: int

@dataclass(frozen=True)
class ParseSettings:
    """`parse.*`."""
    max_outlinks: int
    max_html_bytes: int
    max_parse_seconds: float
    simhash_shingle: int
    language_max_chars: int
    wet_enabled: bool

@dataclass(frozen=True)
class DedupSettings:
    """`dedup.*`."""
    max_hamming: int
    blocks_per_key: int
    max_bucket_size: int
    duplicate_priority_factor: float

@dataclass(frozen=True)
class SitemapsSettings:
    """`sitemaps.*`."""
    probe_default_location: bool
    from_robots: bool
    max_fetch_bytes: int
    max_urls: int
    max_uncompressed_bytes: int
    max_index_depth: int
    max_loc_length: int

@dataclass(frozen=True)
class IndexSettings:
    """`index.*`."""
    enabled: bool

@dataclass(frozen=True)
class TablesSettings:
    """`tables.*`."""
    deletion_vectors: bool

@dataclass(frozen=True)
class SparkSettings:
    """`spark.*`."""
    master: str
    shuffle_partitions: int
    small_input_rows: int
    driver_memory: str
    ivy_dir: str
    extra_jars: str
    log_level: str
    conf: Mapping[str, Any]

@dataclass(frozen=True)
class MaintainSettings:
    """`maintain.*`."""
    vacuum_retention_hours: float
    target_file_mb: int
    vacuum_listing_tasks: int
    urls_files_per_bucket: int
    urls_min_file_mb: float

@dataclass(frozen=True)
class ValidateSettings:
    """`validate.*`."""
    suites_dir: str
    unexpected_examples: int
    future_slack_s: int

@dataclass(frozen=True)
class DemoSettings:
    """`demo.*`."""
    hosts: int
    pages_per_host: int
    min_delay_s: float


class Settings:
    """All sections, typed: the attributes a validated `Config` is read through."""

    storage: StorageSettings
    s3: S3Settings
    crawl: CrawlSettings
    scope: ScopeSettings
    traps: TrapsSettings
    generate: GenerateSettings
    cycle: CycleSettings
    service_levels: ServiceLevelsSettings
    politeness: PolitenessSettings
    fetch: FetchSettings
    ownership: OwnershipSettings
    writer_lock: WriterLockSettings
    robots: RobotsSettings
    revisit: RevisitSettings
    parse: ParseSettings
    dedup: DedupSettings
    sitemaps: SitemapsSettings
    index: IndexSettings
    tables: TablesSettings
    spark: SparkSettings
    maintain: MaintainSettings
    validate: ValidateSettings
    demo: DemoSettings

    def __init__(self, data: Mapping[str, Any]):
        for section, cls in _section_classes().items():
            setattr(self, section, section_of(cls, data[section]))


@functools.cache
def _section_classes() -> dict[str, type]:
    """Section name -> its settings class, from `Settings`'s annotations."""
    return typing.get_type_hints(Settings)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def section_of(cls: type, values: Mapping[str, Any]) -> Any:
    """One section's settings from its validated mapping: floats as floats, lists as tuples, mappings copied."""
    types = _field_types(cls)
    kwargs = {}
    for field in fields(cls):
        value, kind = values[field.name], types[field.name]
        if kind is float:
            value = float(value)
        elif typing.get_origin(kind) is tuple:
            value = tuple(value)
        elif typing.get_origin(kind) is Mapping:
            value = copy.deepcopy(dict(value))
        kwargs[field.name] = value
    return cls(**kwargs)
