"""The quality gate (crawler/gate.py, jobs/gate.py, issue 47): a failed validation closes it, generate refuses a new
segment while it is closed (exit 4, one line naming the table and expectation), an override lets one generate
through and is recorded in `cycle_metrics`, and a passing validation of the failed tables reopens it.

The rule and the record need no Spark; the gate on a real crawl is one Spark test over a small root of the validate
tests' rows (`tests/support/validate_crawls.py`) with one defect row, after their background runs (GX's current
project is process-wide: two validations in one process must not overlap).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crawler import commandline, gate, layout
from crawler.errors import EXIT_GATE_CLOSED, GateClosed
from jobs import cli
from jobs import gate as gate_record
from jobs.storage import LOCAL
from tests.support.config import SPARK_CLI_SETTINGS, TEST_OVERRIDES

AT = datetime(2026, 12, 7, 12, tzinfo=UTC)
URLS_UNIQUE = gate.GateFailure("urls", "expect_column_values_to_be_unique(url_id)", "url_id is the key")
HOSTS_BUCKET = gate.GateFailure("hosts", "expect_column_values_to_be_between(bucket)", "bucket < crawl.buckets")
CLI_SETTINGS = [*SPARK_CLI_SETTINGS, f"--set=crawl.buckets={TEST_OVERRIDES['crawl.buckets']}"]


# ---- the rule ---------------------------------------------------------------------------------------------------


def test_a_failed_table_closes_the_gate_and_only_its_passing_validation_reopens_it():
    closed = gate.after_validation(None, ["urls", "hosts"], [URLS_UNIQUE], AT, "/r/validation/1/report.md")
    assert closed is not None and closed.closed and closed.tables == ["urls"]
    # a run of other tables that pass leaves it as it was
    assert gate.after_validation(closed, ["pages"], [], AT + timedelta(hours=1), "/r/2") == closed
    # a run that fails another table adds it, keeping the failure it did not run
    both = gate.after_validation(closed, ["hosts"], [HOSTS_BUCKET], AT + timedelta(hours=2), "/r/3")
    assert both.failures == (HOSTS_BUCKET, URLS_UNIQUE) and both.report == "/r/3"
    # urls passes: hosts still holds it
    assert gate.after_validation(both, ["urls"], [], AT, "/r/4").failures == (HOSTS_BUCKET,)
    assert gate.after_validation(both, ["urls", "hosts"], [], AT, "/r/5") is None
    assert gate.after_validation(None, layout.TABLES, [], AT, "/r/6") is None


def test_generate_may_go_on_while_open_or_overridden_and_the_refusal_names_table_expectation_and_reopening():
    record = gate.GateRecord((URLS_UNIQUE, HOSTS_BUCKET), AT, "/r/validation/1/report.md")
    assert gate.check(None, None) is None
    assert gate.check(record, "ticket 12: known duplicate") == "ticket 12: known duplicate"
    with pytest.raises(GateClosed) as refused:
        gate.check(record, None)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("quality gate closed: table urls expectation expect_column_values_to_be_unique(url_id) "
                           "(and 1 more) failed validation at 2026-12-07T12:00:00+00:00")
    assert "/r/validation/1/report.md" in line and "crawl validate" in line and "--override-gate" in line
    assert gate.GateRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_the_record_is_written_when_the_gate_closes_and_removed_when_it_reopens(root):
    path = Path(layout.gate_record(root))
    assert gate_record.read(LOCAL, root) is None
    closed = gate_record.record_validation(LOCAL, root, ["urls"], [URLS_UNIQUE], AT, "/r/1")
    assert gate_record.read(LOCAL, root) == closed and json.loads(path.read_text())["tables"] == ["urls"]
    assert gate_record.record_validation(LOCAL, root, ["urls"], [], AT, "/r/2") is None
    assert not path.exists()


# ---- the command line, before Spark ------------------------------------------------------------------------------


def test_generate_exits_4_before_spark_naming_the_table_and_expectation(root, capsys, monkeypatch):
    gate_record.record_validation(LOCAL, root, ["hosts"], [HOSTS_BUCKET], AT, "/r/1")
    monkeypatch.setenv("JAVA_HOME", "/nowhere")  # a JVM start would be refused (exit 2): the gate answers first
    assert cli.main(["generate", "--root", root, *CLI_SETTINGS]) == EXIT_GATE_CLOSED == 4
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("crawl generate: quality gate closed: table hosts expectation "
                           "expect_column_values_to_be_between(bucket) failed")
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error
        cli.main(["generate", "--root", root, "--override-gate", "  ", *CLI_SETTINGS])
    assert "give the reason" in capsys.readouterr().err
    assert "4   the quality gate is closed" in commandline.EXIT_CODES


def test_the_driver_validates_at_most_every_validate_every_s_and_stops_generating_once_the_gate_closes(
        base_conf, root, monkeypatch):
    """`crawl run`'s side without a JVM: a session stand-in for its parse lane, validate's result stubbed."""
    from types import SimpleNamespace

    from jobs import run, validate

    lane_session = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda *_: None))
    validations = []
    failed = SimpleNamespace(gate=gate.GateRecord((URLS_UNIQUE,), AT, "/r/1"), headline=lambda: "FAILED")
    monkeypatch.setattr(validate, "run", lambda *args: validations.append(args) or failed)
    for every_s, expected in ((600.0, 0), (0.0, 1)):
        conf = base_conf.with_overrides({"cycle.validate_every_s": every_s})
        driver = run.Driver(SimpleNamespace(newSession=lambda: lane_session), conf, root, [])
        try:
            driver._validate_if_due()
            assert len(validations) == expected
            assert (driver.gate_closed is not None) == bool(expected)
            if expected:
                assert "table urls expectation expect_column_values_to_be_unique(url_id)" in str(driver.gate_closed)
                assert driver._generate_if_due() is False  # no generate is even tried
        finally:
            driver.parse_lane.stop()
        validations.clear()


# ---- on Spark ----------------------------------------------------------------------------------------------------


def test_a_defect_closes_the_gate_until_fixed_and_an_override_lets_one_segment_through(
        spark, base_conf, validate_runs, new_tables_root, tmp_path, capsys):
    """A host row in a bucket past crawl.buckets fails `hosts`' suite: generate (the command, `crawl cycle`'s and
    `crawl run`'s) refuses with exit 4 naming it; an override makes one segment, recorded in its cycle_metrics row,
    and leaves the gate closed; once the row is fixed, `crawl validate --table hosts` reopens it."""
    from delta.tables import DeltaTable

    from delta_tables import tables
    from jobs import run, validate
    from tests.support.validate_crawls import NOW, VALID, build

    root = build(spark, new_tables_root(tmp_path / "root"), {
        **VALID, "hosts": [*VALID["hosts"], {**VALID["hosts"][0], "host_key": "http://b.test", "bucket": 99}]})
    assert not validate.run(spark, base_conf, root, tables=["hosts"]).success
    closed = gate_record.read(LOCAL, root)
    assert closed.failures == (gate.GateFailure("hosts", HOSTS_BUCKET.expectation, closed.failures[0].rule),)

    assert cli.main(["generate", "--root", root, *CLI_SETTINGS]) == EXIT_GATE_CLOSED
    assert "table hosts expectation expect_column_values_to_be_between(bucket)" in capsys.readouterr().err
    assert cli.main(["cycle", "--root", root, *CLI_SETTINGS]) == EXIT_GATE_CLOSED
    assert "crawl cycle: quality gate closed: table hosts" in capsys.readouterr().err
    # the driver: no segment open, the gate closed at its first generate: it stops at once
    driver = run.Driver(spark, base_conf, root, [])
    with pytest.raises(GateClosed, match="table hosts"):
        driver.run(None, for_s=60, until_idle=False)
    assert driver.merged == 0 and not driver.open

    later = (NOW + timedelta(days=8)).isoformat()  # both URLs due (and the second's lease expired)
    assert cli.main(["generate", "--root", root, "--now", later, "--override-gate", "ticket 12: b.test row known",
                     *CLI_SETTINGS]) == 0
    segment = capsys.readouterr().out.split("segment ", 1)[1].split(":", 1)[0]
    [row] = (tables.table_df(spark, root, "cycle_metrics")
             .where(f"segment_id = '{segment}' and step = 'generate'").collect())
    assert row["gate_override"] == "ticket 12: b.test row known" and row["leased_urls"] == 2
    assert gate_record.read(LOCAL, root) == closed  # the override is for one run

    DeltaTable.forPath(spark, tables.table_path(root, "hosts")).delete("bucket = 99")
    assert cli.main(["validate", "--root", root, "--table", "hosts", *CLI_SETTINGS]) == 0
    assert gate_record.read(LOCAL, root) is None and not Path(layout.gate_record(root)).exists()
    gate_record.check_before_generate(base_conf, root, None, None, None)  # open: generate may go on
