"""`crawl validate`: the suites are loadable data whose enum sets and columns match the code, a small valid crawl
passes, one crawl carrying a defect per rule fails naming each broken expectation (type + column) in the result
and in report.md, Data Docs are built, and the CLI exits 0 / 1 / 2 (pass / failure / malformed suite).

Validation is slow (GX evaluates each expectation as Spark jobs), so the Spark runs are few and shared: one over
the valid crawl and one over the crawl holding every defect (each defect in its own row, so each breaks exactly one
expectation), both made in the background (`tests/support/validate_crawls.py`), one through the CLI over a root made
by create_all only, and one CLI run of a single failing table.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from crawler import layout, status
from crawler.ccindex import CAPTURE_TYPES
from crawler.robots import RobotsState
from delta_tables import tables
from jobs import cli, validate
from tests.support.config import SPARK_CLI_SETTINGS, TEST_OVERRIDES
from tests.support.validate_crawls import DEFECTS

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
def test_a_valid_crawl_passes_with_a_report_and_data_docs(validate_runs):
    valid_run = validate_runs.valid
    assert valid_run.success, valid_run.summary()
    assert [t.table for t in valid_run.tables] == list(layout.TABLES)
    assert all(t.rows >= 1 and t.evaluated == len(_suite(t.table)["expectations"]) for t in valid_run.tables)
    report = valid_run.report_path.read_text()
    assert "PASSED" in report and valid_run.report_path.parent.parent.name == "validation"
    assert re.fullmatch(r"\d{8}T\d{6}Z(-\d+)?", valid_run.out_dir.name)
    assert valid_run.data_docs_index.is_file() and "<html" in valid_run.data_docs_index.read_text().lower()


@pytest.mark.slow
def test_every_defect_and_nothing_else_fails(validate_runs):
    defect_run = validate_runs.defects
    assert not defect_run.success
    assert sorted((f.table, f.name) for f in defect_run.failures) == sorted(
        (table, f"{kind}({column})") for _, table, kind, column, _, _ in DEFECTS)
    docs = defect_run.data_docs_index.parent
    assert defect_run.data_docs_index.is_file()
    pages = [page.relative_to(docs).parts[1] for page in docs.glob("validations/*/*/*/*.html")]
    # one result per table: a failed table's second run (with unexpected examples) replaced its first
    assert sorted(pages) == sorted(layout.TABLES)


@pytest.mark.parametrize("case, table, kind, column, row, shown", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_defect_is_named_in_result_and_report(validate_runs, case, table, kind, column, row, shown):
    defect_run = validate_runs.defects
    name = f"{kind}({column})"
    [failure] = [f for f in defect_run.failures if f.table == table and f.name == name]
    assert failure.rule and failure.error is None and failure.unexpected_count >= 1
    if shown is not None:
        assert any(shown in example for example in failure.examples), failure.examples
    report = defect_run.report_path.read_text()
    section = report.split(f"## {table}: FAILED", 1)[1].split("\n## ", 1)[0]
    assert f"`{name}`" in section and failure.rule in section


def test_cli_passes_on_a_root_with_empty_tables(spark, validate_runs, tables_root, capsys):
    """After the background runs (`validate_runs`): GX keeps its current project in process-wide state, so two
    validations in one process must not overlap."""
    root = tables_root
    assert cli.main(["validate", "--root", root, *CLI_SETTINGS]) == 0
    out = capsys.readouterr().out
    assert "validate: passed" in out
    assert next(Path(root, "validation").glob("*/data_docs/index.html")).is_file()


def test_cli_exits_3_naming_the_failed_expectation(spark, validate_runs, tmp_path, capsys):
    root = str(validate_runs.defects.out_dir.parent.parent)
    out = tmp_path / "reports"
    assert cli.main(["validate", "--root", root, "--table", "segments", "--out", str(out), *CLI_SETTINGS]) == 3
    assert validate.EXIT_VALIDATION_FAILED == 3
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "expect_column_values_to_be_between(updated_at)" in printed
    assert next(out.glob("*/report.md")).is_file()
