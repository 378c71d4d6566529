"""Table definitions. Jobs never write an ad-hoc schema: they select these columns and MERGE.

Layout (see docs/architecture.md): `urls` and `hosts` are partitioned by `bucket` so generate and update
prune by bucket, and `crawl maintain` clusters each bucket of `urls` by `next_fetch_at` so generate reads only the
files that can hold due URLs; `fetches` and `links` by `segment_id` (`records` by `warc_segment`) so a segment's
rows are replaced or read alone; deletion vectors (the session default, `tables.deletion_vectors`, off unless
set) keep a fleet's MERGE rewrites small. All timestamps are UTC.

Each column's description is its Delta column comment (`_f`), what `DESCRIBE TABLE` and delta-rs show a reader;
docs/outputs.md "Schema evolution" is the policy for changing these schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
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


def _f(name: str, dtype: DataType, nullable: bool, doc: str) -> StructField:
    """A column with its description, which becomes its Delta column comment (the `comment` key of the field's
    metadata, where Spark and Delta keep it): `DESCRIBE TABLE` and delta-rs show it to every reader."""
    return StructField(name, dtype, nullable, {"comment": doc})


def _commented(schema: StructType, docs: dict[str, str]) -> StructType:
    """`schema` (built from an Arrow schema) with each column's description from `docs` as its comment; every column
    needs one, and every description a column."""
    if set(docs) != set(schema.names):
        raise ValueError(f"column docs do not match the columns: {sorted(set(docs) ^ set(schema.names))}")
    return StructType([StructField(f.name, f.dataType, f.nullable, {**f.metadata, "comment": docs[f.name]})
                       for f in schema.fields])


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
            _f("url_id", S, False, "32 hex digits of the 128-bit MurmurHash3 of the canonical URL (crawler.urls)"),
            _f("url", S, False, "the canonical URL the crawl stores (crawler.scope); compared in every merge, so a "
                                "hash collision never merges two URLs"),
            _f("host_key", S, False, "scheme://host[:port] of the URL: the row's key in `hosts`"),
            _f("bucket", INT, False, "mmh3 of the host's politeness key modulo crawl.buckets (crawler.bucketing); "
                                     "the partition column"),
            _f("status", S, False, "what the frontier knows of the URL: crawler.status.UrlStatus, set by "
                                   "crawler.revisit"),
            _f("state_version", L, False, "+1 at every lease (generate); a result applies only to the current "
                                          "version (crawler.leases)"),
            _f("priority", D, False, "ranking weight, higher first (crawler.frontier): seeds from inject, inherited "
                                     "by discovered URLs, lowered by dedup for duplicates"),
            _f("depth", INT, False, "fewest link hops from a seed"),
            _f("source", S, False, "how the URL first became known: crawler.status.UrlSource"),
            _f("discovered_at", T, False, "when the URL became known: its injection, or the fetch time of the "
                                          "page that led to it"),
            _f("discovered_in", S, True, "segment whose parse or fetch discovered the URL (null: a seed)"),
            _f("last_fetch_at", T, True, "time of the last request for the URL (null: never requested)"),
            _f("next_fetch_at", T, False, "when the URL is due again (crawler.revisit); what generate selects on"),
            _f("fetch_interval_s", L, False, "seconds between fetches, adapted to change by crawler.revisit"),
            _f("last_status_code", INT, True, "HTTP status of the last request (null: none, or a network error)"),
            _f("failure_count", INT, False, "transient failures in a row (crawler.revisit: the max_failures-th marks "
                                          "the URL failed)"),
            _f("etag", S, True, "ETag of the last content, sent as If-None-Match (null: none given)"),
            _f("last_modified", S, True, "Last-Modified of the last content, sent as If-Modified-Since (null: none)"),
            _f("content_hash", S, True, "sha1: + base32 of the last content's decoded payload "
                                        "(crawler.fingerprints; null: no content yet)"),
            _f("simhash", L, True, "64-bit SimHash of the last content's text, signed (crawler.fingerprints; "
                                   "0: no text, null: not HTML or none yet)"),
            _f("last_changed_at", T, True, "when a fetch last found content differing from content_hash, the first "
                                           "content included (null: none yet)"),
            _f("redirect_to", S, True, "target of the last redirect (null: the last answer was not a redirect)"),
            _f("lease_segment", S, True, "segment that holds the URL's lease (null: not leased; update clears it)"),
            _f("lease_expires_at", T, True, "when that lease lapses and the URL can be leased again (null: "
                                            "not leased)"),
            _f("last_segment", S, True, "segment whose result last completed this URL"),
            _f("inlinks", L, False, "link observations: distinct pages linking here, summed per segment"),
            _f("inlink_segment", S, True, "last segment folded into inlinks and depth (idempotence marker)"),
            _f("updated_at", T, False, "when a job last wrote the row"),
            _f("sitemap_origin", S, True, "non-null: the URL is a sitemap file, and how it was found "
                                          "(crawler.sitemaps.SitemapOrigin)"),
            # Added after the columns above: a root from before gains them at the end (_upgrade_columns), null on
            # its rows until their next complete response.
            _f("stored_payload_digest", S, True, "WARC-Payload-Digest (sha1:BASE32) of the last payload stored in "
                                                 "full, a response record; a 200 with it is written as a revisit "
                                                 "record (crawler.payloads, set by update; null: none stored)"),
            _f("stored_target_uri", S, True, "WARC-Target-URI of the response record holding that payload: the URL, "
                                             "or the target of a same-host redirect followed (null: none stored)"),
            _f("stored_warc_date", T, True, "WARC-Date of that record, what a revisit's WARC-Refers-To-Date names "
                                            "(null: none stored)"),
            _f("stored_warc_filename", S, True, "WARC file of that record, relative to the root: generate hands the "
                                                "stored payload out only while its segment is under the root "
                                                "(crawler.payloads; null: none stored)"),
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
            _f("host_key", S, False, "scheme://host[:port]: one row per host"),
            _f("bucket", INT, False, "the host's bucket (crawler.bucketing), as in `urls`; the partition column"),
            _f("robots_state", S, True, "which robots.txt policy is in force: crawler.robots.RobotsState (null: "
                                        "never fetched)"),
            _f("robots_body", S, True, "the last robots.txt text read, at most robots.max_bytes (kept while "
                                       "unreachable; null: none read)"),
            _f("robots_status_code", INT, True, "HTTP status of the last robots.txt fetch (null: none, or a network "
                                                "failure)"),
            _f("robots_fetched_at", T, True, "when robots.txt was last fetched (null: never)"),
            _f("robots_expires_at", T, True, "when the robots.txt policy in force expires and is fetched again"),
            _f("crawl_delay_s", D, True, "robots.txt Crawl-delay for the crawler's group, seconds, as written "
                                         "(capped by politeness.max_crawl_delay_s where used; null: none)"),
            _f("min_delay_s", D, True, "per-host floor on politeness.min_delay_s, set by an operator (null: none)"),
            _f("max_concurrency", INT, True, "per-host cap on requests in flight, set by an operator (null: none)"),
            _f("backoff_until", T, True, "generate leaves the host out until then (crawler.politeness; null: no "
                                         "backoff)"),
            _f("backoff_level", INT, False, "consecutive segments whose requests to the host met failures "
                                            "(crawler.politeness.host_backoff; 0: none)"),
            _f("policy_version", L, False, "+1 each time the robots policy text changes"),
            _f("known_urls", L, False, "rows in `urls` for the host (kept by update and inject; recounted by "
                                       "maintain)"),
            _f("fetches", L, False, "requests made to the host, summed over segments (update)"),
            _f("status_2xx", L, False, "of those, answered 2xx"),
            _f("status_3xx", L, False, "of those, answered 3xx"),
            _f("status_4xx", L, False, "of those, answered 4xx"),
            _f("status_5xx", L, False, "of those, answered 5xx"),
            _f("status_429", L, False, "of those, answered 429"),
            _f("network_errors", L, False, "fetch attempts that ended in a network error"),
            _f("robots_denied", L, False, "fetch-list URLs not requested because robots.txt disallowed them"),
            _f("last_fetch_at", T, True, "time of the last request to the host (null: none yet)"),
            _f("last_segment", S, True, "last segment folded into the counters (idempotence marker)"),
            _f("updated_at", T, False, "when a job last wrote the row"),
            _f("trap_rejections", MapType(S, L), True, "discovered URLs rejected, by crawler.traps or scope reason "
                                                       "-> count"),
            _f("trap_sample", ArrayType(S), True, "up to 5 rejected URLs, to see what a trap looks like"),
            _f("discovery_segment", S, True, "last segment folded into known_urls and trap_* (idempotence marker)"),
            _f("failing_since", T, True, "first failure of the streak of segments that met nothing but failures "
                                         "(crawler.politeness; null: it answered when last tried)"),
            _f("domain", S, True, "registered domain (crawler.urls.registered_domain), set when the row is created "
                                  "(null on rows older than the column: maintain fills them)"),
            _f("robots_good_at", T, True, "when the last reachable robots.txt answer (robots_body's) was fetched: the "
                                          "last good copy a daemon keeps in force through an outage "
                                          "(crawler.robots.adopt; null: none since the column exists)"),
            _f("robots_good_status_code", INT, True, "HTTP status of that answer (2xx: robots_body's rules; 4xx: "
                                                     "allow all)"),
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
            _f("segment_id", S, False, "segment whose fetch list held the URL; the partition column"),
            _f("bucket", INT, False, "the URL's bucket"),
            _f("url_id", S, False, "the URL's urls.url_id"),
            _f("state_version", L, False, "the URL version leased for this fetch"),
            _f("url", S, False, "the canonical URL fetched"),
            _f("host_key", S, False, "scheme://host[:port] of the URL"),
            _f("fetched_at", T, False, "when the attempt was made (the request's start)"),
            _f("outcome", S, False, "what the attempt produced: crawler.status.FetchOutcome"),
            _f("status_code", INT, True, "HTTP status (null: no response)"),
            _f("redirect_to", S, True, "canonical, resolved Location of a 3xx (null: not a redirect)"),
            _f("etag", S, True, "ETag response header (null: none)"),
            _f("last_modified", S, True, "Last-Modified response header (null: none)"),
            _f("content_type", S, True, "Content-Type response header (null: none)"),
            _f("content_length", L, True, "payload bytes as received, before content decoding"),
            _f("truncated", B, True, "the body was cut at a fetch limit"),
            _f("payload_digest", S, True, "sha1:BASE32 as in WARC-Payload-Digest (null: nothing written)"),
            _f("warc_filename", S, True, "WARC file of the record, relative to the storage root (null: none "
                                         "written)"),
            _f("warc_offset", L, True, "byte offset of the response (or revisit) record in that file"),
            _f("warc_length", L, True, "compressed length of that record, bytes"),
            _f("elapsed_ms", L, True, "request duration, milliseconds"),
            _f("retry_after_s", D, True, "Retry-After the server gave, seconds (null: none)"),
            _f("remote_ip", S, True, "address the request went to (null: no connection)"),
            _f("error", S, True, "error text of a failed attempt (null: none)"),
            _f("daemon_id", S, True, "the fetch daemon that made the attempt"),
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
            _f("url_id", S, False, "the URL's urls.url_id"),
            _f("state_version", L, False, "the URL version fetched"),
            _f("url", S, False, "the canonical URL"),
            _f("segment_id", S, False, "segment that fetched and parsed it"),
            _f("fetched_at", T, True, "when it was fetched"),
            _f("warc_filename", S, True, "WARC file of the response record, relative to the storage root"),
            _f("warc_offset", L, True, "byte offset of the record in that file"),
            _f("warc_length", L, True, "compressed length of the record, bytes"),
            _f("content_type", S, True, "Content-Type of the response"),
            _f("title", S, True, "the HTML title, whitespace collapsed (null: none, or not HTML)"),
            _f("canonical_url", S, True, "link rel=canonical, a hint only (null: none)"),
            _f("meta_noindex", B, True, "robots meta or X-Robots-Tag says noindex"),
            _f("meta_nofollow", B, True, "robots meta or X-Robots-Tag says nofollow"),
            _f("language", S, True, "the html element's lang attribute (null: none)"),
            _f("outlink_count", INT, True, "outlinks extracted (rows in `links`)"),
            _f("content_hash", S, True, "sha1: + base32 of the decoded payload (crawler.fingerprints)"),
            _f("simhash", L, True, "64-bit SimHash of the text, signed (0: no text, null: not HTML or "
                                   "parse.max_parse_seconds ran out)"),
            _f("duplicate_of", S, True, "url_id of the exact-duplicate representative (dedup; null: not a "
                                        "duplicate)"),
            _f("near_duplicate_cluster", S, True, "url_id of the near-duplicate cluster representative (dedup; "
                                                  "null: none)"),
            _f("parse_error", S, True, "why the record could not be parsed (null: parsed)"),
            _f("outlinks_skipped", INT, True, "a/area not examined: parse.max_outlinks or time budget hit"),
            _f("parse_time_limited", B, True, "parse.max_parse_seconds ran out (no SimHash)"),
            _f("sitemap_urls", INT, True, "a sitemap: URLs and child sitemaps kept (null: a page)"),
            _f("sitemap_refused", MapType(S, L), True, "a sitemap: entries refused, by crawler.sitemaps.Reason "
                                                       "(null: a page)"),
            # Added after the columns above: a root from before gains it at the end (_upgrade_columns).
            _f("languages", ArrayType(StructType([StructField("code", S), StructField("share", D)])), True,
               "languages of the visible text (CLD2, crawler/languages.py), most of the text first, at most 3: "
               "code is ISO-639-3, share the part of the text (0-1) in it (null: not HTML, no text, or none "
               "detected with confidence, or parse.language_max_chars 0)"),
        ]
    ),
    properties=_COMMON_PROPS,
    doc="One row per fetched version with content, unique per (url_id, state_version).",
)

LINKS = TableDef(
    "links",
    StructType(
        [
            _f("segment_id", S, False, "segment whose parse found the link; the partition column"),
            _f("from_url_id", S, False, "url_id of the linking page"),
            _f("from_state_version", L, False, "version of the linking page"),
            _f("to_url_id", S, False, "url_id of the target, as discovery keys it (crawler.pages)"),
            _f("to_url", S, False, "the target URL as the crawl stores it (crawler.scope)"),
            _f("anchor_text", S, True, "the link's text, whitespace collapsed (null: none)"),
            _f("rel_nofollow", B, False, "rel=nofollow on every link from the page to the target, or a "
                                          "page-wide nofollow"),
            _f("rel_flags", ArrayType(S), True, "the link's rel values (a sitemap's: sitemap, sitemapindex)"),
            _f("sitemap_lastmod", T, True, "the sitemap entry's lastmod (links from a sitemap only)"),
            _f("sitemap_changefreq", S, True, "the sitemap entry's changefreq (links from a sitemap only)"),
            _f("sitemap_priority", D, True, "the sitemap entry's priority (links from a sitemap only)"),
            _f("sitemap_origin", S, True, "the target is a child sitemap: its origin (sitemap indexes only)"),
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
            _f("url_id", S, False, "32 hex digits of the 128-bit MurmurHash3 of the canonical URL"),
            _f("state_version", L, False, "the URL version this event is about; (url_id, state_version) is the "
                                          "key"),
            _f("url", S, False, "the canonical URL"),
            _f("kind", S, False, "what an indexing pipeline should do: crawler.status.IndexEventKind"),
            _f("segment_id", S, False, "the cycle that produced the event"),
            _f("status_code", INT, True, "HTTP status of the fetch"),
            _f("warc_filename", S, True, "WARC file of the response (or revisit) record, relative to the root"),
            _f("warc_offset", L, True, "byte offset of that record: one gzip member"),
            _f("warc_length", L, True, "compressed length of that record, bytes"),
            _f("content_hash", S, True, "sha1: + base32 of the decoded payload"),
            _f("duplicate_of", S, True, "url_id of the representative page (set on duplicate events)"),
            _f("created_at", T, False, "when the event was written"),
        ]
    ),
    properties={**_INSERT_ONLY_PROPS, "delta.enableChangeDataFeed": "true"},
    doc="Outbox for indexing pipelines: exactly one row per (url_id, state_version).",
)

SEGMENTS = TableDef(
    "segments",
    StructType(
        [
            _f("segment_id", S, False, "the segment (one crawl cycle's fetch list)"),
            _f("bucket", INT, False, "one bucket of the segment's fetch list"),
            _f("state", S, False, "where the bucket is in the cycle: crawler.status.SegmentState"),
            _f("url_count", L, False, "URLs generate leased into the bucket"),
            _f("host_count", L, False, "distinct hosts among them"),
            _f("owner", S, True, "unused: always null (bucket ownership is kept under ROOT/leases)"),
            _f("epoch", L, False, "unused: always 0 (bucket ownership is kept under ROOT/leases)"),
            _f("results", L, True, "fetched-result rows read by update (null: not merged yet)"),
            _f("applied", L, True, "results that completed their URL"),
            _f("stale", L, True, "results ignored: version no longer current"),
            _f("discovered", L, True, "new URLs inserted"),
            _f("created_at", T, False, "when the row was first written"),
            _f("updated_at", T, False, "when a step last changed the row"),
            _f("counters", MapType(S, L), True, "any further per-step counters by name (null: none)"),
            # Added after the columns above: a root from before gains them at the end (_upgrade_columns).
            _f("wet_files", ArrayType(S), True, "the bucket's WET files (the text of its HTML pages, one per WARC "
                                                "file parse read), relative to the root, written by parse (null: not "
                                                "parsed since WET files exist, or parse.wet_enabled off)"),
            _f("wet_records", L, True, "conversion records (pages with text) in those WET files (null: as wet_files)"),
        ]
    ),
    properties=_COMMON_PROPS,
    doc="One row per (segment_id, bucket) with its state through the cycle.",
)

# Common Crawl's cc-index meanings where a name is shared (crawler/ccindex.py's docstring says which differ).
_RECORD_DOCS = {
    "url_surtkey": "SURT key of the URL, as Common Crawl and pywb write it (crawler.ccindex.surt)",
    "url": "WARC-Target-URI as written",
    "url_host_name": "host name of the URL",
    "url_host_tld": "last host label (null: an IP address)",
    "url_host_registered_domain": "registered domain of the host (null: none, e.g. an IP address)",
    "url_protocol": "URL scheme",
    "url_port": "port of the URL (null: the scheme's default port)",
    "url_path": "path of the URL",
    "url_query": "query of the URL, without ? (null: none)",
    "fetch_time": "WARC-Date: when the record was captured",
    "fetch_status": "HTTP status (null: request and metadata records)",
    "fetch_redirect": "Location of a 3xx, resolved against the URL (null: none)",
    "content_digest": "base32 SHA-1 of WARC-Payload-Digest without sha1: (null: none, e.g. a 304 revisit)",
    "content_mime_type": "media type of the HTTP Content-Type (of the WARC Content-Type without HTTP headers)",
    "content_charset": "charset parameter of that header, as declared (null: none)",
    "content_truncated": "WARC-Truncated value (null: not truncated)",
    "warc_filename": "WARC file of the record, relative to the storage root",
    "warc_record_offset": "byte offset of the record in that file",
    "warc_record_length": "bytes of the record in the file (its gzip member)",
    "warc_segment": "segment of the WARC file; the partition column",
    "warc_record_type": "WARC-Type: response, revisit, resource, request or metadata",
    "content_languages": "languages parse detected in the page's text (pages.languages), ISO-639-3 codes "
                         "comma-separated, most of the text first, at most 3, as Common Crawl writes them (null: "
                         "not a parsed page, no languages detected, or the segment not parsed when it was indexed)",
}

RECORDS = TableDef(
    "records",
    _commented(from_arrow_schema(RECORD_INDEX), _RECORD_DOCS),  # crawler/ccindex.py: cc-index column names
    partition_by=("warc_segment",),
    properties=_INSERT_ONLY_PROPS,
    doc="Record index: one row per WARC record with a target URI, located by (warc_filename, warc_record_offset).",
)

DEDUP_HASHES = TableDef(
    "dedup_hashes",
    StructType(
        [
            _f("url_id", S, False, "a URL whose current page is a document with a hash (one row per URL)"),
            _f("content_hash", S, False, "that page's content hash"),
            _f("seen", T, True, "when this URL was first fetched with this content hash"),
            _f("representative", S, False, "url_id representing this hash now (crawler.dedup, incremental rule)"),
            _f("marked_duplicate", B, False, "the verdict written on the URL's current page (what its priority "
                                             "holds)"),
            _f("near_members", B, False, "a near cluster this URL represents has had other members"),
            _f("segment_id", S, False, "segment whose dedup wrote the row last"),
        ]
    ),
    properties=_COMMON_PROPS,
    doc="Dedup index: content hash -> representative, one row per URL with a current document (dedup).",
)

DEDUP_BANDS = TableDef(
    "dedup_bands",
    StructType(
        [
            _f("band", INT, False, "which index key (crawler.dedup.key_masks): 0 .. C(k + r, r) - 1"),
            _f("band_key", L, False, "the SimHash's bits under that key's mask"),
            _f("url_id", S, False, "the URL whose current page has this SimHash"),
            _f("simhash", L, False, "the page's SimHash; never 0 (no text) or null (not HTML): those never "
                                    "cluster"),
            _f("seen", T, True, "when this URL was first fetched with its current content (as dedup_hashes.seen)"),
            _f("cluster", S, False, "url_id of its near-cluster representative (itself when alone)"),
            _f("cluster_seen", T, True, "the representative's `seen`: the cluster's place in the order"),
            _f("segment_id", S, False, "segment whose dedup wrote the row last"),
        ]
    ),
    properties=_COMMON_PROPS,
    doc="Dedup index: SimHash keys -> (url_id, SimHash, cluster), one row per key of each current page (dedup).",
)

CYCLE_METRICS = TableDef(
    "cycle_metrics",
    StructType(
        [
            _f("segment_id", S, False, "the segment the step ran for"),
            _f("step", S, False, "the step run that wrote the row: crawler.status.MetricsStep"),
            _f("run_at", T, False, "the step's `now`"),
            _f("due_urls", L, True, "generate: URLs due and not leased elsewhere, in any host state"),
            _f("oldest_due_age_s", D, True, "generate: now - the earliest next_fetch_at among them, seconds"),
            _f("due_high_priority", L, True, "generate: of the due, priority >= generate.high_priority"),
            _f("high_priority_not_leased", L, True, "generate: of those, not taken into this segment"),
            _f("leased_urls", L, True, "generate: URLs in this segment's fetch list"),
            _f("results", L, True, "update: results read"),
            _f("applied", L, True, "update: results that completed their URL"),
            _f("stale", L, True, "update: results not current for their (url_id, state_version)"),
            _f("new_urls", L, True, "update: discovered URLs accepted into `urls`"),
            _f("refetched", L, True, "update: known pages fetched again, with content (changed + unchanged)"),
            _f("changed", L, True, "update: of those, content changed"),
            _f("change_rate", D, True, "update: changed / refetched (null: none refetched)"),
            _f("unmerged_segments", INT, True, "generate: other segments neither merged nor closed"),
            # The nested fields carry no comment: conform() compares whole data types, and a comment on them would
            # make every written DataFrame's type differ from this one (a cast per write).
            _f("hot_domains", ArrayType(StructType([StructField("domain", S), StructField("due", L),
                                                    StructField("leased", L)])), True,
               "generate: the generate.hot_domains registered domains with the most due URLs (domain, due), and "
               "how many of them this segment leased (leased)"),
            # The two service levels (crawler/service_levels.py), added after the columns above: a root from before
            # them gains them as nulls (create_all).
            _f("hp_eligible", L, True, "generate: due high-priority URLs that were eligible, leased now or not"),
            _f("hp_leased_within", L, True, "generate: of those, leased now within service_levels.lease_within_s"),
            _f("hp_leased_late", L, True, "generate: leased now, later than that"),
            _f("hp_waiting_late", L, True, "generate: not leased, waiting past it (a miss, as a late lease is)"),
            _f("hp_lease_lag_p99_s", D, True, "generate: p99 of due -> lease of those leased now, seconds (null: "
                                              "none)"),
            _f("lease_share_within", D, True, "generate: within / (within + late + waiting late) (null: none "
                                              "decided)"),
            _f("discovery_pages", L, True, "update: pages with outlinks measured for fetch -> durable lag "
                                           "(durable: the `links` commit)"),
            _f("discovery_durable_p50_s", D, True, "update: median of that lag, seconds (null: no page measured)"),
            _f("discovery_durable_p99_s", D, True, "update: p99 of that lag, seconds, judged against "
                                                   "service_levels.discovery_durable_s (null: no page measured)"),
            _f("gate_override", S, True, "generate: the reason an operator gave for making this segment while the "
                                         "quality gate was closed (crawl generate --override-gate; null: the gate "
                                         "was open)"),
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
    """Create every table that does not exist yet and bring the others to the current columns and column comments
    (idempotent); returns the names created."""
    from delta.tables import DeltaTable

    created = []
    for table in TABLES.values():
        path = table_path(root, table.name)
        if DeltaTable.isDeltaTable(spark, path):
            _upgrade_columns(spark, path, table)
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


def _upgrade_columns(spark: SparkSession, path: str, table: TableDef) -> None:
    """A table written by an older version gains the columns added since (nullable, at the end), so a crawl
    root survives an upgrade (existing rows read them as null), and each column's comment becomes the one defined
    here. One schema read per table; a commit only where something differs (one for the comments, one for the new
    columns)."""
    stored = {f.name: f for f in spark.read.format("delta").load(path).schema.fields}
    missing = [f for f in table.schema.fields if f.name not in stored]
    if any(not f.nullable for f in missing):
        raise ValueError(f"{table.name}: cannot add non-null columns {[f.name for f in missing if not f.nullable]}")
    stale = [f for f in table.schema.fields
             if f.name in stored and stored[f.name].metadata.get("comment") != f.metadata["comment"]]
    if stale:
        comments = ", ".join(f"`{f.name}` COMMENT {_sql_string(f.metadata['comment'])}" for f in stale)
        spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN {comments}")
    if missing:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()} COMMENT {_sql_string(f.metadata['comment'])}"
                            for f in missing)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")


def _sql_string(value: str) -> str:
    """`value` as a Spark SQL string literal (backslash escapes, Spark's default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
    spark.sql(f"ALTER TABLE delta.`{table_path(root, name)}` SET TBLPROPERTIES ('{key}' = {_sql_string(value)})")


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
