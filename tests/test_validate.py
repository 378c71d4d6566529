"""`crawl validate`: the suites are loadable data whose enum sets and columns match the code, a small valid crawl
passes, one crawl carrying a defect per rule fails naming each broken expectation (type + column) in the result
and in report.md, Data Docs are built, and the CLI exits 0 / 1 / 2 (pass / failure / malformed suite).

Validation is slow (GX evaluates each expectation as Spark jobs), so the Spark runs are few and shared: one over
the valid crawl, one over the crawl holding every defect (each defect in its own row, so each breaks exactly one
expectation), one through the CLI over a root made by create_all only, and one CLI run of a single failing table.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crawler import layout, status
from crawler.ccindex import CAPTURE_TYPES
from crawler.robots import RobotsState
from delta_tables import tables
from jobs import cli, validate
from tests.support.config import SPARK_CLI_SETTINGS, TEST_OVERRIDES
from tests.support.tables import append_rows

SEG = "seg-v1"
NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
HOST = "http://a.test"
U1, U2, U3, U4, U5 = (f"{n:032x}" for n in range(1, 6))
CLI_SETTINGS = [*SPARK_CLI_SETTINGS, f"--set=crawl.buckets={TEST_OVERRIDES['crawl.buckets']}"]

# Each in-set expectation of the suites and the code's value set it must equal, so the two cannot drift.
ENUMS = {
    ("urls", "status"): status.values(status.UrlStatus),
    ("urls", "source"): status.values(status.UrlSource),
    ("fetches", "outcome"): status.values(status.FetchOutcome),
    ("index_events", "kind"): status.values(status.IndexEventKind),
    ("segments", "state"): status.values(status.SegmentState),
    ("hosts", "robots_state"): [s.value for s in RobotsState],
    ("cycle_metrics", "step"): status.values(status.MetricsStep),
}


def _url(url_id: str, path: str, **values) -> dict:
    return {"url_id": url_id, "url": f"{HOST}/{path}", "host_key": HOST, "bucket": 1, "status": "fetched",
            "state_version": 1, "source": "seed", "discovered_at": NOW, "next_fetch_at": NOW + timedelta(days=7),
            "fetch_interval_s": 86400, "updated_at": NOW, **values}


VALID: dict[str, list[dict]] = {
    "urls": [_url(U1, "one", last_fetch_at=NOW),
             _url(U2, "two", status="unfetched", state_version=2, lease_segment=SEG,
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
    ("duplicate key", "urls", "expect_column_values_to_be_unique", "url_id", _url(U1, "dup"), repr(U1)),
    ("malformed url", "urls", "expect_column_values_to_match_regex", "url", _url(U3, "x", url="ftp://a.test/x"),
     "'ftp://a.test/x'"),
    ("unknown status", "urls", "expect_column_values_to_be_in_set", "status", _url(U4, "s", status="leased"),
     "'leased'"),
    ("lease without expiry", "urls", "expect_column_values_to_not_be_null", "lease_expires_at",
     _url(U5, "l", lease_segment=SEG), "None"),
    ("expiry without lease", "urls", "expect_column_values_to_be_null", "lease_expires_at",
     _url(f"{6:032x}", "e", lease_expires_at=NOW), None),
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


def _build(spark, root: str, rows: dict[str, list[dict]]) -> str:
    """`root` (whose tables exist) with `rows` appended."""
    for name, table_rows in rows.items():
        append_rows(spark, root, name, table_rows)
    return root


@pytest.fixture(scope="module")
def valid_run(spark, base_conf, new_tables_root, tmp_path_factory) -> validate.ValidationResult:
    root = _build(spark, new_tables_root(tmp_path_factory.mktemp("valid") / "root"), VALID)
    return validate.run(spark, base_conf, root)


@pytest.fixture(scope="module")
def defect_run(spark, base_conf, new_tables_root, tmp_path_factory) -> validate.ValidationResult:
    rows = {name: list(table_rows) for name, table_rows in VALID.items()}
    for _, table, _, _, row, _ in DEFECTS:
        rows[table].append(row)
    root = _build(spark, new_tables_root(tmp_path_factory.mktemp("defects") / "root"), rows)
    return validate.run(spark, base_conf, root)


def _suite(name: str) -> dict:
    return json.loads((validate.BUNDLED_SUITES / f"{name}.json").read_text())


# ---- the suites as data (no Spark) ------------------------------------------------------------------------------


def test_every_table_has_a_loadable_suite_whose_expectations_name_their_rule_and_real_columns(base_conf):
    suites = validate.load_suites(base_conf)
    assert list(suites) == list(layout.TABLES)
    for name, suite in suites.items():
        columns = set(tables.TABLES[name].schema.names)
        for expectation in suite["expectations"]:
            kwargs = expectation["kwargs"]
            used = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
            used += kwargs.get("column_list", [])
            assert used and set(used) <= columns, (name, expectation)
            assert expectation["meta"]["rule"].strip()


def test_enum_sets_equal_the_codes_enums():
    found = {}
    for name in layout.TABLES:
        for expectation in _suite(name)["expectations"]:
            if expectation["type"] == "expect_column_values_to_be_in_set":
                found[(name, expectation["kwargs"]["column"])] = expectation["kwargs"]["value_set"]
    records = found.pop(("records", "warc_record_type"))
    assert CAPTURE_TYPES | {"request", "metadata"} <= set(records) and "warcinfo" not in records
    assert {key: sorted(values) for key, values in found.items()} == {k: sorted(v) for k, v in ENUMS.items()}


def test_segment_id_rule_is_the_layouts():
    patterns = {e["kwargs"]["regex"] for name in layout.TABLES for e in _suite(name)["expectations"]
                if e["type"] == "expect_column_values_to_match_regex" and "segment_id" in e["kwargs"]["column"]}
    assert patterns == {layout.SEGMENT_ID.pattern}


@pytest.mark.parametrize("breakage, message", [
    (lambda s: "{not json", "not valid JSON"),
    (lambda s: json.dumps({**s, "expectations": [{**s["expectations"][0], "type": "expect_nothing_at_all"}]}),
     "expect_nothing_at_all"),
    (lambda s: json.dumps({**s, "expectations": [{**s["expectations"][0], "meta": {}}]}), "meta.rule"),
    (lambda s: json.dumps({**s, "name": "hosts"}), '"name": "urls"'),
    (None, "cannot read"),
])
def test_malformed_or_missing_suite_is_an_error_naming_the_file(tmp_path, breakage, message):
    folder = tmp_path / "suites"
    shutil.copytree(validate.BUNDLED_SUITES, folder)
    if breakage is None:
        (folder / "urls.json").unlink()
    else:
        (folder / "urls.json").write_text(breakage(_suite("urls")))
    with pytest.raises(validate.SuiteError, match=re.escape(str(folder / "urls.json")) + ".*" + re.escape(message)):
        validate.load_suite(folder / "urls.json", "urls")


def test_cli_exits_2_on_a_malformed_suite_before_any_spark_work(tmp_path, capsys):
    folder = tmp_path / "suites"
    shutil.copytree(validate.BUNDLED_SUITES, folder)
    (folder / "pages.json").write_text("[]")
    code = cli.main(["validate", "--root", str(tmp_path / "root"), f"--set=validate.suites_dir={folder}"])
    assert code == 2
    assert str(folder / "pages.json") in capsys.readouterr().err


def test_latest_time_is_computed_at_run_time(base_conf):
    started = datetime(2030, 5, 1, 12, tzinfo=UTC)
    params = validate.suite_parameters(base_conf, started)
    assert params == {"latest_time": "2030-05-02T12:00:00", "max_bucket": TEST_OVERRIDES["crawl.buckets"] - 1}


# ---- on Spark ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_valid_crawl_passes_with_a_report_and_data_docs(valid_run):
    assert valid_run.success, valid_run.summary()
    assert [t.table for t in valid_run.tables] == list(layout.TABLES)
    assert all(t.rows >= 1 and t.evaluated == len(_suite(t.table)["expectations"]) for t in valid_run.tables)
    report = valid_run.report_path.read_text()
    assert "PASSED" in report and valid_run.report_path.parent.parent.name == "validation"
    assert re.fullmatch(r"\d{8}T\d{6}Z(-\d+)?", valid_run.out_dir.name)
    assert valid_run.data_docs_index.is_file() and "<html" in valid_run.data_docs_index.read_text().lower()


@pytest.mark.slow
def test_every_defect_and_nothing_else_fails(defect_run):
    assert not defect_run.success
    assert sorted((f.table, f.name) for f in defect_run.failures) == sorted(
        (table, f"{kind}({column})") for _, table, kind, column, _, _ in DEFECTS)
    docs = defect_run.data_docs_index.parent
    assert defect_run.data_docs_index.is_file()
    pages = [page.relative_to(docs).parts[1] for page in docs.glob("validations/*/*/*/*.html")]
    # one result per table: a failed table's second run (with unexpected examples) replaced its first
    assert sorted(pages) == sorted(layout.TABLES)


@pytest.mark.parametrize("case, table, kind, column, row, shown", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_defect_is_named_in_result_and_report(defect_run, case, table, kind, column, row, shown):
    name = f"{kind}({column})"
    [failure] = [f for f in defect_run.failures if f.table == table and f.name == name]
    assert failure.rule and failure.error is None and failure.unexpected_count >= 1
    if shown is not None:
        assert any(shown in example for example in failure.examples), failure.examples
    report = defect_run.report_path.read_text()
    section = report.split(f"## {table}: FAILED", 1)[1].split("\n## ", 1)[0]
    assert f"`{name}`" in section and failure.rule in section


def test_cli_passes_on_a_root_with_empty_tables(spark, tables_root, capsys):
    root = tables_root
    assert cli.main(["validate", "--root", root, *CLI_SETTINGS]) == 0
    out = capsys.readouterr().out
    assert "validate: passed" in out
    assert next(Path(root, "validation").glob("*/data_docs/index.html")).is_file()


def test_cli_exits_1_naming_the_failed_expectation(spark, defect_run, tmp_path, capsys):
    root = str(defect_run.out_dir.parent.parent)
    out = tmp_path / "reports"
    assert cli.main(["validate", "--root", root, "--table", "segments", "--out", str(out), *CLI_SETTINGS]) == 1
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "expect_column_values_to_be_between(updated_at)" in printed
    assert next(out.glob("*/report.md")).is_file()
