"""Schemas of the files exchanged between Spark jobs and fetch daemons (Parquet under a segment).

generate writes the fetch list; the daemon writes fetched results and robots observations; parse and
update read them. Both sides use these Arrow schemas, so a column is never spelled twice.
"""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

# One row per URL to fetch; files sorted by rank then host_key (hosts interleaved, each host's rows in rank order),
# so a daemon reading the list in batches has many hosts to work on. Written by generate in row groups of about
# FETCHLIST_ROW_GROUP_BYTES: a reader decodes a whole row group at a time, so that bounds the daemon's read window.
FETCHLIST = pa.schema(
    [
        ("segment_id", pa.string()),
        ("url_id", pa.string()),
        ("url", pa.string()),
        ("host_key", pa.string()),
        ("state_version", pa.int64()),
        ("rank", pa.int32()),            # position within its host, 1 = first
        ("priority", pa.float64()),
        ("depth", pa.int32()),
        ("etag", pa.string()),           # validators for a conditional GET (null if none)
        ("last_modified", pa.string()),
        ("delay_s", pa.float64()),       # the host's delay known at generate time: a floor on the daemon's gate
        ("max_concurrency", pa.int32()), # the host's own cap on requests in flight (hosts.max_concurrency; null: none)
        ("last_fetch_at", TS),           # the URL's previous fetch (null if none): a 304's WARC-Refers-To-Date
        ("sitemap_origin", pa.string()), # non-null: a sitemap (fetched with sitemaps.max_fetch_bytes, parsed as one)
        # The host's stored robots.txt (crawler.robots.handed_over: in force, else its last good copy, expired), on
        # its first row in the list only (null on the others and when there is none): a daemon new to the host (its
        # bucket came from another process, or it restarted) obeys a copy in force instead of fetching robots.txt
        # again after the longest Crawl-delay the previous owner may have obeyed, and keeps the last good copy in
        # force through an outage (crawler.robots.adopt).
        ("robots_status_code", pa.int32()),
        ("robots_body", pa.string()),
        ("robots_fetched_at", TS),
        ("robots_expires_at", TS),
        # The URL's stored payload (crawler.payloads; null when none, or its record's segment is gone): the
        # WARC-Payload-Digest of the last payload stored in full, and the WARC-Target-URI and WARC-Date of the
        # response record that holds it. A 200 with that digest is written as a revisit record referring to it.
        ("stored_payload_digest", pa.string()),
        ("stored_target_uri", pa.string()),
        ("stored_warc_date", TS),
    ]
)
FETCHLIST_STORED = ("stored_payload_digest", "stored_target_uri", "stored_warc_date")
FETCHLIST_ROBOTS = ("robots_status_code", "robots_body", "robots_fetched_at", "robots_expires_at")

FETCHLIST_ROW_GROUP_BYTES = 1024 * 1024

# One row per fetch attempt of a fetch-list URL. Written by the daemon after the WARC it points to is closed.
FETCHED = pa.schema(
    [
        ("segment_id", pa.string()),
        ("bucket", pa.int32()),
        ("url_id", pa.string()),
        ("state_version", pa.int64()),
        ("url", pa.string()),
        ("host_key", pa.string()),
        ("fetched_at", TS),
        ("outcome", pa.string()),        # crawler.status.FetchOutcome
        ("status_code", pa.int32()),
        ("redirect_to", pa.string()),    # canonical, resolved Location of a 3xx
        ("etag", pa.string()),
        ("last_modified", pa.string()),
        ("content_type", pa.string()),
        ("content_length", pa.int64()),  # payload bytes as received (before content decoding)
        ("truncated", pa.bool_()),
        ("payload_digest", pa.string()), # "sha1:BASE32" as in WARC-Payload-Digest
        ("warc_filename", pa.string()),  # path relative to the storage root
        ("warc_offset", pa.int64()),     # offset of the response (or revisit) record
        ("warc_length", pa.int64()),     # compressed length of that record
        ("elapsed_ms", pa.int64()),
        ("retry_after_s", pa.float64()),
        ("remote_ip", pa.string()),
        ("error", pa.string()),
        ("daemon_id", pa.string()),
        ("truncated_reason", pa.string()), # why the body was cut: length, decoded-length, content-type (null if not)
        ("sitemap_origin", pa.string()), # copied from the fetch list: the URL is a sitemap
    ]
)

# One row per robots.txt fetch. Written by the daemon; folded into `hosts` by update.
ROBOTS = pa.schema(
    [
        ("segment_id", pa.string()),
        ("bucket", pa.int32()),
        ("host_key", pa.string()),
        ("fetched_at", TS),
        ("status_code", pa.int32()),     # null for a network failure
        ("state", pa.string()),          # crawler.robots.RobotsState
        ("body", pa.string()),           # text as parsed (at most robots.max_bytes)
        ("crawl_delay_s", pa.float64()),
        ("expires_at", TS),
        ("warc_filename", pa.string()),
        ("warc_offset", pa.int64()),
        ("warc_length", pa.int64()),
        ("error", pa.string()),
    ]
)


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_JSON_LAYOUTS: dict[int, tuple[pa.Schema, tuple[str, ...], tuple[str, ...]]] = {}  # keeps each schema: ids stay unique


def _json_layout(schema: pa.Schema) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A schema's column names in sorted order, and those of its date and time columns. Looked up by identity:
    hashing a pyarrow schema costs more than writing the row."""
    layout = _JSON_LAYOUTS.get(id(schema))
    if layout is None:
        layout = _JSON_LAYOUTS[id(schema)] = (
            schema, tuple(sorted(schema.names)), tuple(f.name for f in schema if pa.types.is_temporal(f.type)))
    return layout[1], layout[2]


def row_to_json(row: dict, schema: pa.Schema) -> str:
    """One row of `schema` as a JSON object, keys sorted (times as ISO 8601): how the daemon keeps a result row
    inside its WARC file, so a killed daemon's rows can be rebuilt from the records it wrote. Once per fetched
    page, so the layout is worked out once per schema."""
    names, temporal = _json_layout(schema)
    out = {name: row.get(name) for name in names}
    for name in temporal:
        if out[name] is not None:
            out[name] = out[name].isoformat()
    return _COMPACT_JSON.encode(out)


def row_from_json(text: str, schema: pa.Schema) -> dict:
    """The inverse of `row_to_json`; unknown names are dropped, missing ones are null."""
    data = json.loads(text)
    row = {}
    for field in schema:
        value = data.get(field.name)
        if value is not None and pa.types.is_timestamp(field.type):
            value = datetime.fromisoformat(value)
        row[field.name] = value
    return row
