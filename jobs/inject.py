"""inject: a seeds file -> `urls` and `hosts`, insert-if-absent (docs/architecture.md#data-flow).

Seeds marked `kind=sitemap` enter as sitemaps. With `sitemaps.probe_default_location` on, every seed host's
default sitemap location (crawler.sitemaps.probe_url) is added too, as a sitemap found by probing (source
`sitemap`, depth 0): a 404 there is recorded like any fetch and the URL is revisited rarely as `gone`.

The seeds file is a config input, small enough to read on the driver; the upsert itself is a set-based Delta
MERGE on (url_id AND url), so a hash collision never merges two URLs and a re-run inserts nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from crawler import urls
from crawler.bucketing import Bucketing
from crawler.config import Config
from crawler.payloads import STORED_COLUMNS
from crawler.scope import Scope
from crawler.seeds import SeedEntry, is_skipped, read_seeds, split_lines
from crawler.sitemaps import SITEMAP_FILE_PRIORITY, FoundVia, SitemapOrigin, probe_url
from crawler.status import UrlSource, UrlStatus
from delta_tables import tables
from jobs.base import check_bucketing, insert_if_absent, known_url_counts, merge_into, step
from jobs.writelock import holding_writer_lock

log = logging.getLogger("jobs.inject")


@dataclass
class InjectResult:
    lines: int                    # seed lines (blank lines and comments not counted)
    injected: int                 # new rows in `urls`
    already_known: int            # valid seeds whose URL was already in `urls`
    rejected: int                 # bad lines, reported in `errors` and skipped
    duplicates: int = 0           # lines repeating a URL seen earlier in the same file
    probes: int = 0               # default-location sitemap URLs new to `urls`
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (line_no, text, reason)

    def summary(self) -> str:
        return (f"{self.lines} seed lines: {self.injected} injected, {self.already_known} already known, "
                f"{self.duplicates} duplicates, {self.rejected} rejected; {self.probes} sitemap probes added")


def merge_seed_hosts(spark: SparkSession, root: str, host_rows: DataFrame, now: datetime) -> None:
    """The seeds' hosts (`host_rows`: host_key, bucket, domain) into `hosts` in one MERGE: a new host gets a row with
    zero counters and its registered domain, and every seed host's `known_urls` becomes its row count in `urls`
    (read after the seeds' own MERGE): an absolute count, so a re-run after a crash repairs what it lost."""
    zero = F.lit(0).cast("bigint")
    wanted = host_rows.select("host_key", "bucket", "domain").dropDuplicates(["host_key"])
    source = tables.conform(
        wanted.join(known_url_counts(spark, root, wanted), ["host_key", "bucket"], "left").select(
            "host_key",
            "bucket",
            "domain",
            *[F.lit(None).alias(c) for c in ("robots_state", "robots_body", "robots_status_code", "robots_fetched_at",
                                             "robots_expires_at", "crawl_delay_s", "min_delay_s", "max_concurrency",
                                             "backoff_until", "last_fetch_at", "last_segment", "trap_rejections",
                                             "trap_sample", "discovery_segment", "failing_since", "robots_good_at",
                                             "robots_good_status_code")],
            F.lit(0).alias("backoff_level"),
            zero.alias("policy_version"),
            F.coalesce(F.col("known_urls"), zero).alias("known_urls"),
            *[zero.alias(c) for c in ("fetches", "status_2xx", "status_3xx", "status_4xx", "status_5xx",
                                      "status_429", "network_errors", "robots_denied")],
            F.lit(now).alias("updated_at"),
        ),
        "hosts",
    )
    (
        merge_into(spark, root, "hosts", source, "t.bucket = s.bucket AND t.host_key = s.host_key")
        .whenMatchedUpdate(condition="t.known_urls <> s.known_urls", set={"known_urls": "s.known_urls"})
        .whenNotMatchedInsertAll()
        .execute()
    )


_URL_ROW = ("url_id string, url string, host_key string, bucket int, priority double, fetch_interval_s bigint, "
            "source string, sitemap_origin string, domain string")


def _url_row(url: str, priority: float, interval_s: int, source: UrlSource, origin: str | None,
             bucketing: Bucketing) -> tuple:
    host = urls.host_key(url)
    return (urls.url_id(url), url, host, bucketing.bucket(host), float(priority), int(interval_s),
            source.value, origin, urls.host_domain(host))


def _probe_rows(conf: Config, entries: list[SeedEntry]) -> list[tuple]:
    """The default-location sitemap of each seed host not already seeded, as a sitemap found by probing."""
    seeded = {entry.url for entry in entries}
    probes = sorted({probe_url(urls.host_key(entry.url)) for entry in entries} - seeded)
    origin = SitemapOrigin(FoundVia.PROBE).encode()
    return [_url_row(url, SITEMAP_FILE_PRIORITY, conf.revisit.default_interval_s, UrlSource.SITEMAP, origin,
                     Bucketing.from_config(conf)) for url in probes]


def _merge_new_urls(spark: SparkSession, root: str, rows: DataFrame, now: datetime) -> int:
    """Insert-if-absent of unfetched depth-0 `urls` rows (_URL_ROW columns); returns rows inserted."""
    nulls = ("discovered_in", "last_fetch_at", "last_status_code", "etag", "last_modified", "content_hash",
             "simhash", "last_changed_at", "redirect_to", "lease_segment", "lease_expires_at", "last_segment",
             "inlink_segment", *STORED_COLUMNS)
    source = tables.conform(
        rows.select(
            "*",
            F.lit(UrlStatus.UNFETCHED.value).alias("status"),
            F.lit(0).alias("state_version"),
            F.lit(0).alias("depth"),
            F.lit(now).alias("discovered_at"),
            F.lit(now).alias("next_fetch_at"),
            F.lit(0).alias("failure_count"),
            F.lit(0).alias("inlinks"),
            F.lit(now).alias("updated_at"),
            *[F.lit(None).alias(c) for c in nulls],
        ),
        "urls",
    )
    return insert_if_absent(spark, root, "urls", source,
                            "t.bucket = s.bucket AND t.url_id = s.url_id AND t.url = s.url")


@holding_writer_lock("inject")
def run(spark: SparkSession, conf: Config, root: str, seeds_path: str) -> InjectResult:
    """Inject the seeds file at `seeds_path` into the tables under `root`."""
    tables.ensure_tables(spark, root)
    check_bucketing(conf, root)
    with open(seeds_path, "rb") as handle:
        lines = split_lines(handle.read())
    seed_lines = sum(1 for line in lines if not is_skipped(line))
    entries, errors = read_seeds(lines, Scope.from_config(conf))
    for line_no, text, reason in errors:
        log.warning("inject: %s line %d rejected: %s (%r)", seeds_path, line_no, reason, text[:200])
    duplicates = seed_lines - len(errors) - len(entries)
    result = InjectResult(seed_lines, 0, 0, len(errors), duplicates, errors=errors)
    if entries:
        now = datetime.now(UTC)
        bucketing, default_interval = Bucketing.from_config(conf), conf.revisit.default_interval_s
        seeded_origin = SitemapOrigin(FoundVia.LINK).encode()
        seeds = spark.createDataFrame([
            _url_row(entry.url, entry.priority, entry.interval_s or default_interval, UrlSource.SEED,
                     seeded_origin if entry.sitemap else None, bucketing)
            for entry in entries
        ], _URL_ROW)
        with step("inject: merge urls"):
            result.injected = _merge_new_urls(spark, root, seeds, now)
            result.already_known = len(entries) - result.injected
            if conf.sitemaps.probe_default_location:
                probes = spark.createDataFrame(_probe_rows(conf, entries), _URL_ROW)
                result.probes = _merge_new_urls(spark, root, probes, now)
        with step("inject: merge hosts"):
            merge_seed_hosts(spark, root, seeds, now)
    log.info("inject: %s: %s", seeds_path, result.summary())
    return result


def run_command(spark: SparkSession, conf: Config, root: str, seeds: str) -> int:
    """`crawl inject`: a line for each seed line skipped (so the user can fix the file), then the summary."""
    result = run(spark, conf, root, seeds)
    for line_no, text, reason in result.errors:
        print(f"inject: {seeds}:{line_no}: skipped: {reason}: {text[:200]!r}")
    print(f"inject: {result.summary()}")
    return 0
