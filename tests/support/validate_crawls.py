"""The two crawls `crawl validate` is tested on (`tests/test_validate.py`) and their validation runs, made in the
background: a small valid crawl, and the same crawl with one row per defect (each breaks exactly one expectation).

Validation is the Spark lane's slowest kind of work (GX evaluates every expectation as Spark jobs) and its tests came
last in the lane, on one core once the rest of the background work was done; both runs now go to a thread of their
own at the session's start (`validate_runs_started` in `tests/conftest.py`), on a session of their own over the
suite's SparkContext, and the tests read what they left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from crawler.config import Config
from jobs import validate
from tests.support.tables import append_rows

SEG = "seg-v1"
NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
HOST = "http://a.test"
U1, U2, U3, U4, U5 = (f"{n:032x}" for n in range(1, 6))


def url_row(url_id: str, path: str, **values) -> dict:
    return {"url_id": url_id, "url": f"{HOST}/{path}", "host_key": HOST, "bucket": 1, "status": "fetched",
            "state_version": 1, "source": "seed", "discovered_at": NOW, "next_fetch_at": NOW + timedelta(days=7),
            "fetch_interval_s": 86400, "updated_at": NOW, **values}


VALID: dict[str, list[dict]] = {
    "urls": [url_row(U1, "one", last_fetch_at=NOW),
             url_row(U2, "two", status="unfetched", state_version=2, lease_segment=SEG,
                  lease_expires_at=NOW + timedelta(hours=2))],
    "hosts": [{"host_key": HOST, "bucket": 1, "robots_state": "rules", "robots_status_code": 200,
               "robots_fetched_at": NOW, "updated_at": NOW}],
    "fetches": [{"segment_id": SEG, "bucket": 1, "url_id": U1, "state_version": 1, "url": f"{HOST}/one",
                 "host_key": HOST, "fetched_at": NOW, "outcome": "success", "status_code": 200, "warc_offset": 0}],
    "pages": [{"url_id": U1, "state_version": 1, "url": f"{HOST}/one", "segment_id": SEG, "fetched_at": NOW,
               "outlink_count": 1}],
    "links": [{"segment_id": SEG, "from_url_id": U1, "from_state_version": 1, "to_url_id": U2,
               "to_url": f"{HOST}/two", "rel_nofollow": False}],
    "index_events": [{"url_id": U1, "state_version": 1, "url": f"{HOST}/one", "kind": "fetched", "segment_id": SEG,
                      "status_code": 200, "created_at": NOW}],
    "segments": [{"segment_id": SEG, "bucket": 1, "state": "merged", "url_count": 2, "host_count": 1, "epoch": 1,
                  "created_at": NOW, "updated_at": NOW}],
    "records": [{"url": f"{HOST}/one", "warc_filename": "segments/seg-v1/warc/bucket=00001/a.warc.gz",
                 "warc_record_offset": 0, "warc_record_length": 500, "warc_segment": SEG,
                 "warc_record_type": "response", "fetch_time": NOW, "fetch_status": 200}],
    "dedup_hashes": [{"url_id": U1, "content_hash": "sha1:A", "seen": NOW, "representative": U1,
                      "marked_duplicate": False, "near_members": False, "segment_id": SEG}],
    "dedup_bands": [{"band": band, "band_key": band, "url_id": U1, "simhash": 7, "seen": NOW, "cluster": U1,
                     "cluster_seen": NOW, "segment_id": SEG} for band in range(4)],
    "cycle_metrics": [{"segment_id": SEG, "step": "generate", "run_at": NOW, "due_urls": 2, "oldest_due_age_s": 60.0,
                       "due_high_priority": 1, "high_priority_not_leased": 0, "leased_urls": 2,
                       "unmerged_segments": 0},
                      {"segment_id": SEG, "step": "update", "run_at": NOW, "results": 2, "applied": 2, "stale": 0,
                       "new_urls": 1, "refetched": 1, "changed": 1, "change_rate": 1.0}],
}

# (case, table, expectation type, column, the defect's row, a value the report must show as unexpected or None)
DEFECTS = [
    ("duplicate key", "urls", "expect_column_values_to_be_unique", "url_id", url_row(U1, "dup"), repr(U1)),
    ("malformed url", "urls", "expect_column_values_to_match_regex", "url", url_row(U3, "x", url="ftp://a.test/x"),
     "'ftp://a.test/x'"),
    ("unknown status", "urls", "expect_column_values_to_be_in_set", "status", url_row(U4, "s", status="leased"),
     "'leased'"),
    ("lease without expiry", "urls", "expect_column_values_to_not_be_null", "lease_expires_at",
     url_row(U5, "l", lease_segment=SEG), "None"),
    ("expiry without lease", "urls", "expect_column_values_to_be_null", "lease_expires_at",
     url_row(f"{6:032x}", "e", lease_expires_at=NOW), None),
    ("bucket out of range", "hosts", "expect_column_values_to_be_between", "bucket",
     {**VALID["hosts"][0], "host_key": "http://b.test", "bucket": 99}, "99"),
    ("fetch in 1970", "fetches", "expect_column_values_to_be_between", "fetched_at",
     {**VALID["fetches"][0], "url_id": U2, "fetched_at": datetime(1970, 1, 1, tzinfo=UTC)}, "1970"),
    ("unknown outcome", "fetches", "expect_column_values_to_be_in_set", "outcome",
     {**VALID["fetches"][0], "url_id": U3, "outcome": "timeout"}, "'timeout'"),
    ("page of an unleased version", "pages", "expect_column_values_to_be_between", "state_version",
     {**VALID["pages"][0], "state_version": 0}, "0"),
    ("malformed link target", "links", "expect_column_values_to_match_regex", "to_url",
     {**VALID["links"][0], "to_url_id": U3, "to_url": "not a url"}, "'not a url'"),
    ("duplicate index event per version", "index_events", "expect_compound_columns_to_be_unique",
     "url_id,state_version", {**VALID["index_events"][0], "kind": "changed"}, None),
    ("segment updated far in the future", "segments", "expect_column_values_to_be_between", "updated_at",
     {**VALID["segments"][0], "bucket": 2, "updated_at": datetime(2999, 1, 1, tzinfo=UTC)}, "2999"),
    ("null record key", "records", "expect_column_values_to_not_be_null", "warc_record_offset",
     {**VALID["records"][0], "warc_record_offset": None}, "None"),
    ("a URL twice in the hash index", "dedup_hashes", "expect_column_values_to_be_unique", "url_id",
     {**VALID["dedup_hashes"][0], "content_hash": "sha1:B"}, repr(U1)),
    ("SimHash 0 in the band index", "dedup_bands", "expect_column_values_to_not_be_in_set", "simhash",
     {**VALID["dedup_bands"][0], "url_id": U2, "simhash": 0}, "0"),
    ("a change rate above 1", "cycle_metrics", "expect_column_values_to_be_between", "change_rate",
     {**VALID["cycle_metrics"][1], "segment_id": "seg-v2", "changed": 1, "change_rate": 2.0}, "2.0"),
    ("a negative backlog", "cycle_metrics", "expect_column_values_to_be_between", "due_urls",
     {**VALID["cycle_metrics"][0], "segment_id": "seg-v3", "due_urls": -4}, "-4"),
]


@dataclass
class ValidateRuns:
    """validate's result over the valid crawl and over the crawl holding every defect."""

    valid: validate.ValidationResult
    defects: validate.ValidationResult


def build(spark, root: str, rows: dict[str, list[dict]]) -> str:
    """`root` (whose tables exist) with `rows` appended."""
    for name, table_rows in rows.items():
        append_rows(spark, root, name, table_rows)
    return root


def run_validations(spark, conf: Config, new_tables_root: Callable[[Path], str], base: Path) -> ValidateRuns:
    """Build both crawls under `base` and validate each."""
    rows = {name: list(table_rows) for name, table_rows in VALID.items()}
    for _, table, _, _, row, _ in DEFECTS:
        rows[table].append(row)
    valid = validate.run(spark, conf, build(spark, new_tables_root(base / "valid" / "root"), VALID))
    defects = validate.run(spark, conf, build(spark, new_tables_root(base / "defects" / "root"), rows))
    return ValidateRuns(valid, defects)
