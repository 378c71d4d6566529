"""Every command line, walked with wrong arguments: each mistake is exit 2 and one line on stderr naming it, with
no traceback, no file written outside the root, the root unchanged and no Spark started (the checks run first:
`jobs.base.spark_session` refuses to start in these tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crawler import commandline, frontier, layout
from crawler import config as config_mod
from crawler.errors import EXIT_TRY_LATER, Backpressure, UnknownSegment, UserError
from crawler.seeds import read_seeds, split_lines
from fetchd import cli as fetchd_cli
from jobs import cli, submit
from tests.support.config import flat_keys

KNOWN = "seg-known"
OTHER = "seg-other"
SEGMENT_COMMANDS = ("fetch", "parse", "dedup", "update", "index", "report", "close-segment")
# The commands that read the segment's folder know an unknown segment before Spark starts (report asks the
# `segments` table, which outlives the folders: tests/test_report.py).
FOLDER_COMMANDS = tuple(command for command in SEGMENT_COMMANDS if command != "report")
ESCAPES = ("../../escaped", "../segments/" + KNOWN, ".", "..", "a/b", "/abs", ".hidden", "-x", "")


def _cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(case id, crawl arguments after the command's --root, a word the one line must hold)."""
    a_file = tmp / "a-file"
    cases: list[tuple[str, list[str], str]] = []
    for command in ("init", "stats", "maintain", "validate", "generate"):
        cases += [
            (f"{command}-inf", [command, "--set", "politeness.min_delay_s=.inf"], "politeness.min_delay_s"),
            (f"{command}-nan", [command, "--set", "generate.age_boost_per_day=.nan"], "generate.age_boost_per_day"),
            (f"{command}-unknown-key", [command, "--set", "nosuch.key=1"], "nosuch.key"),
            (f"{command}-missing-config", [command, "--config", str(tmp / "missing.yaml")], "missing.yaml"),
            (f"{command}-root-is-a-file", [command, "--root", str(a_file)], "not a folder"),
            (f"{command}-root-under-a-file", [command, "--root", str(a_file / "root")], "not a folder"),
        ]
    for segment in ESCAPES:
        cases.append((f"generate-segment-{segment!r}", ["generate", "--segment", segment], "segment"))
        cases += [(f"{command}-segment-{segment!r}", [command, "--segment", segment], "segment")
                  for command in SEGMENT_COMMANDS]
    cases += [(f"{command}-unknown-segment", [command, "--segment", "seg-typo"], "seg-typo")
              for command in FOLDER_COMMANDS]
    cases += [(f"{command}-no-segment", [command], "--segment") for command in SEGMENT_COMMANDS]
    cases += [
        ("generate-now-not-a-date", ["generate", "--now", "notadate"], "notadate"),
        ("rebucket-unknown-key", ["rebucket", "--set", "politeness.key=ip"], "politeness.key"),
        ("generate-zero-budget", ["generate", "--set", "generate.segment_max_urls=0"], "generate.segment_max_urls"),
        ("inject-missing-seeds", ["inject", "--seeds", str(tmp / "no-seeds.txt")], "no-seeds.txt"),
        ("inject-seeds-folder", ["inject", "--seeds", str(tmp)], "folder"),
        ("inject-no-seeds", ["inject"], "--seeds"),
        ("dedup-segment-and-rebuild", ["dedup", "--segment", KNOWN, "--rebuild"], "--rebuild"),
        ("dedup-rebuild-too-many-keys", ["dedup", "--rebuild", "--set", "dedup.max_hamming=7", "--set",
                                         "dedup.blocks_per_key=3"], "dedup.blocks_per_key"),
        ("cycle-negative", ["cycle", "--cycles", "-1"], "--cycles"),
        ("cycle-zero", ["cycle", "--cycles", "0"], "--cycles"),
        ("cycle-not-a-number", ["cycle", "--cycles", "many"], "--cycles"),
        ("maintain-unknown-table", ["maintain", "--table", "nosuch"], "nosuch"),
        ("validate-unknown-table", ["validate", "--table", "nosuch"], "nosuch"),
        ("validate-out-is-a-file", ["validate", "--out", str(a_file)], "not a folder"),
        ("report-out-under-a-file", ["report", "--segment", KNOWN, "--out", str(a_file / "r.html")], "not a folder"),
        ("report-out-is-a-folder", ["report", "--segment", KNOWN, "--out", str(tmp)], "folder"),
        ("unknown-command", ["nosuch"], "nosuch"),
        # Numbers past what Spark, a timestamp or the JVM takes, and Spark settings it would not take.
        ("generate-budget-past-int", ["generate", "--set", "generate.segment_max_urls=99999999999999999999"],
         "generate.segment_max_urls"),
        ("generate-host-cap-past-int", ["generate", "--set", "generate.per_host_max_urls=99999999999999999999"],
         "generate.per_host_max_urls"),
        ("generate-domain-budget-past-int",
         ["generate", "--set", "generate.domain_budgets={a.test: 99999999999999999999}"], "generate.domain_budgets"),
        ("update-delay-past-a-century", ["update", "--segment", KNOWN, "--set", "politeness.min_delay_s=1.0e+30"],
         "politeness.min_delay_s"),
        ("inject-driver-memory-lots", ["inject", "--seeds", str(a_file), "--set", "spark.driver_memory=lots"],
         "spark.driver_memory"),
        ("stats-spark-conf-list", ["stats", "--set", "spark.conf={spark.jars.packages: [a, b]}"], "spark.conf"),
        ("stats-spark-conf-not-spark", ["stats", "--set", "spark.conf={sql.shuffle.partitions: 4}"], "spark.conf"),
    ]
    return cases


@pytest.fixture
def setting(tmp_path):
    """A root holding two segment folders, a regular file beside it and an empty folder that must stay empty."""
    root = tmp_path / "crawl" / "root"
    for segment in (KNOWN, OTHER):
        (root / "segments" / segment / "fetchlist").mkdir(parents=True)
    (root / "segments" / ".partial").mkdir()  # not a segment id: never listed as a segment
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "outside").mkdir()
    return root, tmp_path


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


class SparkStarted(Exception):
    """A command got as far as starting Spark: its mistake was not found first."""


def _exit_code(main, argv: list[str]) -> int | str:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own exit for a usage error
        return exc.code
    except SparkStarted:
        return "Spark started"


def test_every_command_refuses_wrong_arguments_in_one_line(setting, capsys, monkeypatch):
    root, tmp = setting
    monkeypatch.chdir(root)  # relative escapes resolve from inside the root

    def no_spark(*args, **kwargs):
        raise SparkStarted

    monkeypatch.setattr("jobs.base.spark_session", no_spark)
    before, outside_before = _tree(tmp), _tree(tmp / "outside")
    failures = []
    for case, argv, word in _cases(tmp):
        full = argv[:1] + ["--root", str(root)] + argv[1:] if "--root" not in argv and argv != ["nosuch"] else argv
        code = _exit_code(cli.main, full)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or "Traceback" in err or word not in lines[0]:
            failures.append(f"{case}: exit {code}, stderr {err!r}, stdout {out[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert _tree(tmp) == before and _tree(tmp / "outside") == outside_before
    assert not (tmp / "crawl" / "escaped").exists() and not (tmp / "escaped").exists()


def test_unknown_segment_names_the_segments_that_exist(setting, capsys):
    root, _ = setting
    for command in FOLDER_COMMANDS:
        assert cli.main([command, "--root", str(root), "--segment", "seg-typo"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (f"crawl {command}: unknown segment 'seg-typo' under {root} "
                        f"(segments there: {KNOWN}, {OTHER})")
    empty = root.parent / "empty"
    assert cli.main(["parse", "--root", str(empty), "--segment", "seg-1"]) == 2
    assert "no segment exists there yet" in capsys.readouterr().err
    many = [f"seg-{i:02d}" for i in range(12)]
    assert str(UnknownSegment("x", "/r", many)).endswith("(segments there: seg-07, seg-08, seg-09, seg-10, seg-11 "
                                                          "and 7 earlier)")


def test_fetchd_and_submit_refuse_the_same_way(setting, capsys):
    root, tmp = setting
    assert fetchd_cli.main(["fetch", "--root", str(root), "--segment", "seg-typo"]) == 2
    assert "unknown segment 'seg-typo'" in capsys.readouterr().err
    assert _exit_code(fetchd_cli.main, ["fetch", "--root", str(root), "--segment", "../x"]) == 2
    assert "invalid segment id" in capsys.readouterr().err
    assert fetchd_cli.main(["serve", "--root", str(tmp / "a-file")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert submit.main(["--dry-run", "--", "fetch", "--segment", KNOWN]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("crawl-submit: not a Spark command of crawl")


@pytest.mark.parametrize("argv", [
    ["generate", "--segment", "../../escaped"],
    ["init", "--set", "politeness.min_delay_s=.inf"],
    ["parse", "--segment", "seg-typo"],
])
def test_a_whole_process_prints_one_line_and_exits_2(setting, argv):
    root, _ = setting
    result = subprocess.run([sys.executable, "-m", "jobs.cli", argv[0], "--root", str(root), *argv[1:]],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def test_segment_ids_that_could_leave_their_folder_are_refused():
    for bad in ESCAPES + ("a" * 129, "seg 1", "seg'1", "seg\n1"):
        with pytest.raises(UserError):
            layout.check_segment_id(bad)
        with pytest.raises(UserError):
            layout.fetchlist_dir("/root", bad)  # every segment path is built through the check
    for good in ("seg-20260101T000000Z", "a", "seg_1.2-x", "9" * 128):
        assert layout.check_segment_id(good) == good
    assert layout.segment_ids(["seg-1", ".partial", "..", "_tmp", "seg-0"]) == ["seg-0", "seg-1"]


def test_non_finite_numbers_are_refused_for_every_numeric_key():
    numeric = [key for key, value in flat_keys(config_mod.defaults()).items()
               if isinstance(value, float | int) and not isinstance(value, bool)]
    assert len(numeric) > 50
    for key in numeric:
        for value in (".inf", "-.inf", ".nan"):
            with pytest.raises(config_mod.ConfigError, match=f"'{key}'"):
                config_mod.load(assignments=[f"{key}={value}"])



def test_a_missing_config_file_is_named_as_a_file_not_a_key(tmp_path):
    with pytest.raises(config_mod.ConfigError) as raised:
        config_mod.load(tmp_path / "missing.yaml")
    assert str(raised.value).startswith(f"config file '{tmp_path / 'missing.yaml'}': cannot be read")


def test_seeds_with_a_bom_and_a_line_that_is_not_utf8():
    data = b"\xef\xbb\xbfhttp://a.test/\nhttp://b.test/\xff\xfe\r\nhttp://c.test/\n"
    entries, errors = read_seeds(split_lines(data))
    assert [e.url for e in entries] == ["http://a.test/", "http://c.test/"]
    assert errors == [(2, "http://b.test/\\xff\\xfe", "not valid UTF-8")]


def test_output_paths_blocked_by_a_file_are_refused(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        layout.check_output_file(str(a_file / "deeper" / "r.html"), "report file")
    with pytest.raises(UserError, match="it is a folder"):
        layout.check_output_file(str(tmp_path), "report file")
    assert layout.check_output_file(str(tmp_path / "new" / "r.html"), "report file")
    assert layout.check_local_folder("s3://bucket/x", "storage root") == "s3://bucket/x"
    assert os.path.isdir(tmp_path) and not (tmp_path / "new").exists()  # a check writes nothing


def test_backpressure_is_one_line_and_exit_75(capsys):
    """Generate's refusal is not the user's mistake and not a bug: its own exit code, which the DAG skips on."""
    def refuse(_args):
        raise Backpressure("no new segment: segment seg-1 finished fetching but is not merged")

    parser = commandline.Parser(prog="crawl")
    parser.add_argument("command")
    assert commandline.run(parser, ["generate"], refuse) == EXIT_TRY_LATER == 75
    line = "crawl generate: no new segment: segment seg-1 finished fetching but is not merged\n"
    assert capsys.readouterr().err == line


@pytest.mark.parametrize(("unmerged", "expected"), [
    ({}, None),
    ({"seg-a": False, "seg-b": False}, None),  # still fetching, within the limit of 2
    ({"seg-a": False, "seg-b": False, "seg-c": False}, "3 earlier segments are not merged yet (seg-a, seg-b, seg-c)"),
    ({"seg-b": True}, "segment seg-b finished fetching but is not merged: "),
    ({"seg-c": True, "seg-a": False, "seg-b": True},
     "segment seg-b finished fetching but is not merged (and 1 more: seg-c)"),
])
def test_backpressure_rule(unmerged, expected):
    refusal = frontier.backpressure(unmerged, max_unmerged=2)
    assert (refusal is None) if expected is None else expected in refusal
    if refusal and "finished fetching" in refusal:
        assert "crawl close-segment --segment seg-b" in refusal  # says what to do
    assert frontier.backpressure({"seg-a": False}, max_unmerged=0) is not None


def test_a_segment_the_caller_is_merging_is_not_stalled_but_still_counts():
    """`crawl run` generates the next segment while it merges the last: its own merge queue is no stall, but it
    still counts toward generate.max_unmerged_segments, which bounds a driver whose merges fall behind."""
    assert frontier.backpressure({"seg-a": True}, max_unmerged=2, merging={"seg-a"}) is None
    assert "seg-b finished fetching" in frontier.backpressure({"seg-a": True, "seg-b": True}, 2, merging={"seg-a"})
    assert "3 earlier segments" in frontier.backpressure({"seg-a": True, "seg-b": False, "seg-c": False}, 2,
                                                         merging={"seg-a"})


# Delta's message for a lost MERGE on a path table (delta-spark's DELTA_CONCURRENT_APPEND error class).
CONFLICT_MESSAGE = ("[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a concurrent MERGE "
                    "added data to table delta.`file:{root}/tables/urls` committed at version 7. The concurrent "
                    "operation modified data in the partition [bucket=3] that should have been read by this "
                    "operation. Please retry the operation.")


@pytest.mark.parametrize("conflict", ["ConcurrentAppendException", "ConcurrentDeleteReadException",
                                      "MetadataChangedException", "ConcurrentWriteException"])
def test_a_lost_delta_commit_is_one_line_and_exit_75(setting, capsys, monkeypatch, conflict):
    """Raised by the handler as pyspark raises it (delta.exceptions' class, which the JVM-backed one subclasses),
    through the real dispatch: the table named when Delta's message names it, and never a traceback."""
    from delta.exceptions import base as delta_exceptions

    root, _ = setting
    message = CONFLICT_MESSAGE.format(root=root) if conflict == "ConcurrentAppendException" else "conflict"

    def lose(*args, **options):
        raise getattr(delta_exceptions, conflict)(message=message)

    monkeypatch.setattr("jobs.base.spark_session", lambda conf, app_name: "the session")
    monkeypatch.setattr("jobs.update.run_command", lose)
    assert cli.main(["update", "--root", str(root), "--segment", KNOWN]) == EXIT_TRY_LATER
    (line,) = capsys.readouterr().err.strip().splitlines()
    where = "table urls" if conflict == "ConcurrentAppendException" else "one of its tables"
    assert line == (f"crawl update: another command committed to {where} at the same time and this command's "
                    f"commit lost ({conflict}); that commit was not made (Delta commits are whole or nothing) and its "
                    "earlier commits stand: run it again once the other has finished")


def test_any_other_failure_of_a_job_keeps_its_traceback(setting, monkeypatch):
    root, _ = setting

    def fail(*args, **options):
        raise RuntimeError("a bug")

    monkeypatch.setattr("jobs.base.spark_session", lambda conf, app_name: "the session")
    monkeypatch.setattr("jobs.update.run_command", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["update", "--root", str(root), "--segment", KNOWN])
    assert cli.write_conflict(RuntimeError("ConcurrentAppendException at /tables/urls")) is None


def test_a_spark_command_without_java_is_one_line_before_spark(setting, capsys, monkeypatch, tmp_path):
    """No JAVA_HOME and no java on PATH (or a JAVA_HOME without one): exit 2 naming what is missing, before
    Spark would start (pyspark would otherwise fail later with a Java gateway error)."""
    root, _ = setting

    def no_spark(*args, **kwargs):
        raise SparkStarted

    monkeypatch.setattr("jobs.base.spark_session", no_spark)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    for java_home, word in ((None, "JAVA_HOME is unset and no java is on PATH"),
                            (str(tmp_path / "no-jdk"), "has no bin/java")):
        if java_home:
            monkeypatch.setenv("JAVA_HOME", java_home)
        assert _exit_code(cli.main, ["stats", "--root", str(root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs a Java runtime (17 or later)" in err[0] and word in err[0]
