"""Table definitions. Jobs never write an ad-hoc schema: they select these columns and MERGE.

Layout (see docs/architecture.md): `urls` and `hosts` are partitioned by `bucket` so generate and update
prune by bucket, and `crawl maintain` clusters each bucket of `urls` by `next_fetch_at` so generate reads only the
files that can hold due URLs; `fetches` and `links` by `segment_id` (`records` by `warc_segment`) so a segment's
rows are replaced or read alone; deletion vectors (the session default, `tables.deletion_vectors`, off unless
set) keep a fleet's MERGE rewrites small. All timestamps are UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from crawler import layout
from crawler.ccindex import RECORD_INDEX


def _f(name: str, dtype, nullable: bool = True) -> StructField:
    return StructField(name, dtype, nullable)


S, INT, L, D, B, T = StringType(), IntegerType(), LongType(), DoubleType(), BooleanType(), TimestampType()


@dataclass(frozen=True)
class TableDef:
    name: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    doc: str = ""


# Deletion vectors are not set here: the session's default (`tables.deletion_vectors`, jobs.base.spark_session)
# decides them for a table when it is created.
_COMMON_PROPS = {
    "delta.autoOptimize.optimizeWrite": "true",
}
# The tables that are only appended to, or replaced a segment at a time (never updated in place), whatever
# `tables.deletion_vectors` says: vectors would buy them nothing, and without the reader feature every Delta reader
# (delta-rs, polars) opens the outputs indexing pipelines consume (docs/outputs.md).
_INSERT_ONLY_PROPS = {**_COMMON_PROPS, "delta.enableDeletionVectors": "false"}

URLS = TableDef(
    "urls",
    StructType(
        [
            _f("url_id", S, False),           # 128-bit mmh3 of the canonical URL, 32 hex digits
            _f("url", S, False),              # canonical URL (compared in every merge: no hash collision merges)
            _f("host_key", S, False),         # scheme://host[:port]
            _f("bucket", INT, False),
            _f("status", S, False),           # crawler.status.UrlStatus
            _f("state_version", L, False),    # +1 at every lease; results must carry the current version
            _f("priority", D, False),
            _f("depth", INT, False),            # link hops from a seed
            _f("source", S, False),           # crawler.status.UrlSource
            _f("discovered_at", T, False),
            _f("discovered_in", S),           # segment whose parse/fetch discovered it (null for seeds)
            _f("last_fetch_at", T),
            _f("next_fetch_at", T, False),
            _f("fetch_interval_s", L, False),
            _f("last_status_code", INT),
            _f("failure_count", INT, False),
            _f("etag", S),
            _f("last_modified", S),
            _f("content_hash", S),
            _f("simhash", L),
            _f("last_changed_at", T),
            _f("redirect_to", S),
            _f("lease_segment", S),
            _f("lease_expires_at", T),
            _f("last_segment", S),            # segment whose result last completed this URL
            _f("inlinks", L, False),          # link observations: distinct pages linking here, summed per segment
            _f("inlink_segment", S),          # last segment folded into inlinks/depth (idempotence marker)
            _f("updated_at", T, False),
            _f("sitemap_origin", S),          # non-null: a sitemap file; how it was found (SitemapOrigin)
        ]
    ),
    partition_by=("bucket",),
    properties=_COMMON_PROPS,
    doc="One row per canonical URL: the frontier.",
)

HOSTS = TableDef(
    "hosts",
    StructType(
        [
            _f("host_key", S, False),
            _f("bucket", INT, False),
            _f("robots_state", S),            # crawler.robots.RobotsState
            _f("robots_body", S),
            _f("robots_status_code", INT),
            _f("robots_fetched_at", T),
            _f("robots_expires_at", T),
            _f("crawl_delay_s", D),
            _f("min_delay_s", D),             # per-host floor on politeness.min_delay_s, set by an operator (null: no)
            _f("max_concurrency", INT),       # per-host cap on requests in flight, set by an operator (null: none)
            _f("backoff_until", T),
            _f("backoff_level", INT, False),
            _f("policy_version", L, False),   # +1 each time the robots policy text changes
            _f("known_urls", L, False),       # rows in `urls` (kept by update and inject; recounted by maintain)
            _f("fetches", L, False),
            _f("status_2xx", L, False),
            _f("status_3xx", L, False),
            _f("status_4xx", L, False),
            _f("status_5xx", L, False),
            _f("status_429", L, False),
            _f("network_errors", L, False),
            _f("robots_denied", L, False),
            _f("last_fetch_at", T),
            _f("last_segment", S),            # last segment folded into the counters (idempotence marker)
            _f("updated_at", T, False),
            _f("trap_rejections", MapType(S, L)),  # discovered URLs rejected: crawler.traps/scope reason -> count
            _f("trap_sample", ArrayType(S)),  # up to 5 rejected URLs, to see what a trap looks like
            _f("discovery_segment", S),       # last segment folded into known_urls/trap_* (idempotence marker)
            _f("failing_since", T),           # first failure of the streak of segments that met nothing but
                                              # failures (null: it answered when last tried); crawler.politeness
            _f("domain", S),                  # registered domain (crawler.urls.registered_domain), set when the row is
                                              # created (null on rows older than the column: maintain fills them)
        ]
    ),
    partition_by=("bucket",),
    properties=_COMMON_PROPS,
    doc="One row per host_key: robots, politeness state and counters.",
)

FETCHES = TableDef(
    "fetches",
    StructType(
        [
            _f("segment_id", S, False),
            _f("bucket", INT, False),
            _f("url_id", S, False),
            _f("state_version", L, False),
            _f("url", S, False),
            _f("host_key", S, False),
            _f("fetched_at", T, False),
            _f("outcome", S, False),          # crawler.status.FetchOutcome
            _f("status_code", INT),
            _f("redirect_to", S),
            _f("etag", S),
            _f("last_modified", S),
            _f("content_type", S),
            _f("content_length", L),
            _f("truncated", B),
            _f("payload_digest", S),
            _f("warc_filename", S),
            _f("warc_offset", L),
            _f("warc_length", L),
            _f("elapsed_ms", L),
            _f("retry_after_s", D),
            _f("remote_ip", S),
            _f("error", S),
            _f("daemon_id", S),
        ]
    ),
    partition_by=("segment_id",),
    properties=_INSERT_ONLY_PROPS,
    doc="Append-only log: one row per fetch attempt, unique per (url_id, state_version, segment_id).",
)

PAGES = TableDef(
    "pages",
    StructType(
        [
            _f("url_id", S, False),
            _f("state_version", L, False),
            _f("url", S, False),
            _f("segment_id", S, False),
            _f("fetched_at", T),
            _f("warc_filename", S),
            _f("warc_offset", L),
            _f("warc_length", L),
            _f("content_type", S),
            _f("title", S),
            _f("canonical_url", S),           # link rel=canonical, a hint only
            _f("meta_noindex", B),
            _f("meta_nofollow", B),
            _f("language", S),
            _f("outlink_count", INT),
            _f("content_hash", S),
            _f("simhash", L),
            _f("duplicate_of", S),            # url_id of the exact-duplicate representative (dedup)
            _f("near_duplicate_cluster", S),  # url_id of the near-duplicate cluster representative (dedup)
            _f("parse_error", S),
            _f("outlinks_skipped", INT),      # a/area not examined: parse.max_outlinks or time budget hit
            _f("parse_time_limited", B),      # parse.max_parse_seconds ran out (no SimHash)
            _f("sitemap_urls", INT),          # a sitemap: URLs and child sitemaps kept (null: a page)
            _f("sitemap_refused", MapType(S, L)),  # a sitemap: entries refused, by crawler.sitemaps.Reason
        ]
    ),
    properties=_COMMON_PROPS,
    doc="One row per fetched version with content, unique per (url_id, state_version).",
)

LINKS = TableDef(
    "links",
    StructType(
        [
            _f("segment_id", S, False),
            _f("from_url_id", S, False),
            _f("from_state_version", L, False),
            _f("to_url_id", S, False),
            _f("to_url", S, False),
            _f("anchor_text", S),
            _f("rel_nofollow", B, False),
            _f("rel_flags", ArrayType(S)),
            _f("sitemap_lastmod", T),         # the sitemap entry's lastmod (links from a sitemap only)
            _f("sitemap_changefreq", S),
            _f("sitemap_priority", D),
            _f("sitemap_origin", S),          # the target is a child sitemap: its origin (sitemap indexes only)
        ]
    ),
    partition_by=("segment_id",),
    properties=_INSERT_ONLY_PROPS,
    doc="Outlinks found by parse, one row per (page version, target).",
)

INDEX_EVENTS = TableDef(
    "index_events",
    StructType(
        [
            _f("url_id", S, False),
            _f("state_version", L, False),
            _f("url", S, False),
            _f("kind", S, False),             # crawler.status.IndexEventKind
            _f("segment_id", S, False),
            _f("status_code", INT),
            _f("warc_filename", S),
            _f("warc_offset", L),
            _f("warc_length", L),
            _f("content_hash", S),
            _f("duplicate_of", S),
            _f("created_at", T, False),
        ]
    ),
    properties={**_INSERT_ONLY_PROPS, "delta.enableChangeDataFeed": "true"},
    doc="Outbox for indexing pipelines: exactly one row per (url_id, state_version).",
)

SEGMENTS = TableDef(
    "segments",
    StructType(
        [
            _f("segment_id", S, False),
            _f("bucket", INT, False),
            _f("state", S, False),            # crawler.status.SegmentState
            _f("url_count", L, False),
            _f("host_count", L, False),
            _f("owner", S),
            _f("epoch", L, False),
            _f("results", L),                 # fetched-result rows read by update
            _f("applied", L),                 # results that completed their URL
            _f("stale", L),                   # results ignored: version no longer current
            _f("discovered", L),              # new URLs inserted
            _f("created_at", T, False),
            _f("updated_at", T, False),
            _f("counters", MapType(S, L)),    # any further per-step counters
        ]
    ),
    properties=_COMMON_PROPS,
    doc="One row per (segment_id, bucket) with its state through the cycle.",
)

RECORDS = TableDef(
    "records",
    from_arrow_schema(RECORD_INDEX),  # crawler/ccindex.py: Common Crawl's cc-index column names
    partition_by=("warc_segment",),
    properties=_INSERT_ONLY_PROPS,
    doc="Record index: one row per WARC record with a target URI, located by (warc_filename, warc_record_offset).",
)

DEDUP_HASHES = TableDef(
    "dedup_hashes",
    StructType(
        [
            _f("url_id", S, False),           # one row per URL whose current page is a document with a hash
            _f("content_hash", S, False),
            _f("seen", T),                    # when this URL was first fetched with this content hash
            _f("representative", S, False),   # url_id representing this hash now (crawler.dedup, incremental rule)
            _f("marked_duplicate", B, False), # the verdict written on the URL's current page (what its priority holds)
            _f("near_members", B, False),     # a near cluster this URL represents has had other members
            _f("segment_id", S, False),       # segment whose dedup wrote the row last
        ]
    ),
    properties=_COMMON_PROPS,
    doc="Dedup index: content hash -> representative, one row per URL with a current document (dedup).",
)

DEDUP_BANDS = TableDef(
    "dedup_bands",
    StructType(
        [
            _f("band", INT, False),           # which index key (crawler.dedup.key_masks): 0 .. C(k + r, r) - 1
            _f("band_key", L, False),         # the SimHash's bits under that key's mask
            _f("url_id", S, False),
            _f("simhash", L, False),          # never 0 (no text) or null (not HTML): those never cluster
            _f("seen", T),
            _f("cluster", S, False),          # url_id of its near-cluster representative (itself when alone)
            _f("cluster_seen", T),            # the representative's `seen`: the cluster's place in the order
            _f("segment_id", S, False),
        ]
    ),
    properties=_COMMON_PROPS,
    doc="Dedup index: SimHash keys -> (url_id, SimHash, cluster), one row per key of each current page (dedup).",
)

CYCLE_METRICS = TableDef(
    "cycle_metrics",
    StructType(
        [
            _f("segment_id", S, False),
            _f("step", S, False),             # crawler.status.MetricsStep: the step run that wrote the row
            _f("run_at", T, False),           # the step's `now`
            _f("due_urls", L),                # generate: URLs due and not leased elsewhere, in any host state
            _f("oldest_due_age_s", D),        # generate: now - the earliest next_fetch_at among them
            _f("due_high_priority", L),       # generate: of the due, priority >= generate.high_priority
            _f("high_priority_not_leased", L),  # generate: of those, not taken into this segment
            _f("leased_urls", L),             # generate: URLs in this segment's fetch list
            _f("results", L),                 # update: results read
            _f("applied", L),                 # update: results that completed their URL
            _f("stale", L),                   # update: results not current for their (url_id, state_version)
            _f("new_urls", L),                # update: discovered URLs accepted into `urls`
            _f("refetched", L),               # update: known pages fetched again, with content (changed + unchanged)
            _f("changed", L),                 # update: of those, content changed
            _f("change_rate", D),             # update: changed / refetched (null: none refetched)
            _f("unmerged_segments", INT),     # generate: other segments neither merged nor closed
            _f("hot_domains", ArrayType(StructType([_f("domain", S), _f("due", L), _f("leased", L)]))),
                                              # generate: the generate.hot_domains registered domains with the most
                                              # due URLs, and how many of them this segment leased
            # The two service levels (crawler/service_levels.py), added after the columns above: a root from before
            # them gains them as nulls (create_all). Generate: its due high-priority URLs that were eligible, and
            # their lease outcomes at this generate.
            _f("hp_eligible", L),             # generate: eligible due high-priority URLs, leased now or not
            _f("hp_leased_within", L),        # generate: of those, leased now within service_levels.lease_within_s
            _f("hp_leased_late", L),          # generate: leased now, later than that
            _f("hp_waiting_late", L),         # generate: not leased, waiting past it (a miss, as a late lease is)
            _f("hp_lease_lag_p99_s", D),      # generate: p99 of due -> lease of those leased now (null: none)
            _f("lease_share_within", D),      # generate: within / (within + late + waiting late) (null: none decided)
            # Update: fetch -> durable lags of the segment's pages with outlinks (durable: the `links` commit).
            _f("discovery_pages", L),         # update: pages with outlinks measured
            _f("discovery_durable_p50_s", D),  # update: median lag (null: no page measured)
            _f("discovery_durable_p99_s", D),  # update: p99 lag, judged against service_levels.discovery_durable_s
        ]
    ),
    # Insert-only (never updated): every reader (delta-rs in the DAG too) opens it.
    properties=_INSERT_ONLY_PROPS,
    doc="Frontier figures: one row per generate or update run of a segment, for the report, the DAG and on-call.",
)

TABLES: dict[str, TableDef] = {
    t.name: t for t in (URLS, HOSTS, FETCHES, PAGES, LINKS, INDEX_EVENTS, SEGMENTS, RECORDS, DEDUP_HASHES, DEDUP_BANDS,
                        CYCLE_METRICS)
}
assert set(TABLES) == set(layout.TABLES)


def table_path(root: str, name: str) -> str:
    return layout.table_path(root, name)


def create_all(spark: SparkSession, root: str) -> list[str]:
    """Create every table that does not exist yet (idempotent); returns the names created."""
    from delta.tables import DeltaTable

    created = []
    for table in TABLES.values():
        path = table_path(root, table.name)
        if DeltaTable.isDeltaTable(spark, path):
            _add_missing_columns(spark, path, table)
            continue
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(table.schema)
        if table.partition_by:
            builder = builder.partitionedBy(*table.partition_by)
        for key, value in table.properties.items():
            builder = builder.property(key, value)
        if table.doc:
            builder = builder.comment(table.doc)
        builder.execute()
        created.append(table.name)
    return created


# (SparkContext application id, root) pairs whose tables this process has created or upgraded (ensure_tables).
_ENSURED: set[tuple[str, str]] = set()


def ensure_tables(spark: SparkSession, root: str) -> None:
    """Every table under `root` exists at the current schema; what each job calls first.

    create_all reads every table's Delta log twice (16 log reads per call), and a process runs many jobs on one
    root (a cycle, the demo, the tests): so create_all runs once per SparkContext and root, and later calls only
    check that each table's `_delta_log` folder is still there (one file-system lookup each, no log read),
    running create_all again if one is gone (a table or a root deleted under a running process)."""
    key = (spark.sparkContext.applicationId, root)
    if key in _ENSURED and all(path_exists(spark, layout.join(table_path(root, name), "_delta_log"))
                               for name in TABLES):
        return
    create_all(spark, root)
    _ENSURED.add(key)


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether `path` exists, asked of the Hadoop FileSystem of its scheme (local, s3a, ...)."""
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jvm_path)


def _add_missing_columns(spark: SparkSession, path: str, table: TableDef) -> None:
    """A table written by an older version gains the columns added since (nullable, at the end), so a crawl
    root survives an upgrade; existing rows read them as null."""
    present = set(spark.read.format("delta").load(path).columns)
    missing = [f for f in table.schema.fields if f.name not in present]
    if not missing:
        return
    if any(not f.nullable for f in missing):
        raise ValueError(f"{table.name}: cannot add non-null columns {[f.name for f in missing if not f.nullable]}")
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")


def table_df(spark: SparkSession, root: str, name: str) -> DataFrame:
    return spark.read.format("delta").load(table_path(root, name))


def table_version(spark: SparkSession, root: str, name: str) -> int:
    """A table's latest Delta version, as its DeltaLog finds it by listing the log (what every read of the table
    does first). Not `DeltaTable.history(1)`: that plans and runs a Spark job to read the last commit's record,
    about ten times the cost (190 vs 18 ms on a small local table), and jobs ask once for each table they read.
    The DeltaLog is Delta's internal API (py4j reaches it); every job's tests go through here."""
    from delta.tables import DeltaTable

    none = spark._jvm.scala.Option.empty()
    log = DeltaTable.forPath(spark, table_path(root, name))._jdt.deltaLog()
    return int(log.update(False, none, none).version())


def table_property(spark: SparkSession, root: str, name: str, key: str) -> str | None:
    """A table property of the table's latest version (its Delta metadata's configuration), None when unset; read
    from the DeltaLog's snapshot as `table_version` reads the version, with no Spark job."""
    from delta.tables import DeltaTable

    none = spark._jvm.scala.Option.empty()
    log = DeltaTable.forPath(spark, table_path(root, name))._jdt.deltaLog()
    value = log.update(False, none, none).metadata().configuration().get(key)
    return str(value.get()) if value.isDefined() else None


def set_table_property(spark: SparkSession, root: str, name: str, key: str, value: str) -> None:
    """Set one table property (a Delta commit of its own)."""
    quoted = value.replace("\\", "\\\\").replace("'", "\\'")
    spark.sql(f"ALTER TABLE delta.`{table_path(root, name)}` SET TBLPROPERTIES ('{key}' = '{quoted}')")


def conform(df: DataFrame, name: str) -> DataFrame:
    """Select and cast a DataFrame to a table's exact column order and types."""
    from pyspark.sql import functions as F

    schema = TABLES[name].schema
    # One schema read (pyspark asks the JVM again on each `columns`), and a cast only where the type differs: each
    # cast hands its type to the JVM as JSON to parse (~5 ms a column, most of a small write's planning).
    present = {field.name: field.dataType for field in df.schema.fields}
    missing = [f.name for f in schema.fields if f.name not in present]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")
    return df.select([(F.col(f.name) if present[f.name] == f.dataType else F.col(f.name).cast(f.dataType)).alias(f.name)
                      for f in schema.fields])
