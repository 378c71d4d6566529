"""The `crawl` command table (`jobs/cli.py::COMMANDS`): the parser offers exactly its commands, every handler
resolves and takes what the dispatch hands it, light commands import no Spark, and close-segment gives a segment
up in the table only when it should. No Spark session starts here."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crawler import layout
from jobs import cli, submit

REPO = Path(__file__).resolve().parents[1]
COMMON = {"command", "root", "config", "assignments", "verbose"}
SAMPLE_VALUES = {"--segment": "seg-1", "--seeds": "seeds.txt", "action": "show"}  # arguments a command requires


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def _required_argv(command: cli.Command) -> list[str]:
    argv = [command.name]
    for argument in command.arguments:
        if not argument.flags[0].startswith("-"):  # a positional argument: always required
            argv.append(SAMPLE_VALUES[argument.flags[0]])
        elif argument.settings.get("required"):
            argv += [argument.flags[0], SAMPLE_VALUES[argument.flags[0]]]
    return argv


def test_the_parser_offers_exactly_the_tables_commands_in_its_order():
    names = [command.name for command in cli.COMMANDS]
    assert list(_subcommands(cli.parser())) == names
    assert len(set(names)) == len(names)


def test_every_command_and_option_says_what_it_does():
    for command in cli.COMMANDS:
        assert command.help.strip(), command.name
        for argument in command.arguments:
            assert argument.settings.get("help", "").strip(), (command.name, argument.flags)


def test_every_handler_resolves_and_takes_what_the_dispatch_hands_it():
    """A Spark command's handler: (spark, conf, root, one keyword per argument); any other's the same without spark.
    A command's further check before Spark takes (conf, root, the same keywords)."""
    for command in cli.COMMANDS:
        options = [argument.dest for argument in command.arguments]
        handler = cli.resolve(command.handler)
        expected = ["spark"] * command.spark + ["conf", "root", *options]
        assert list(inspect.signature(handler).parameters) == expected, command.name
        if command.before_spark:
            check = cli.resolve(command.before_spark)
            assert list(inspect.signature(check).parameters) == ["conf", "root", *options], command.name


def test_each_option_reaches_the_handler_under_the_name_the_table_gives_it():
    parser = cli.parser()
    for command in cli.COMMANDS:
        args = parser.parse_args(_required_argv(command))
        options = command.options(args)
        assert set(vars(args)) == COMMON | set(options), command.name
        assert cli.chosen(args) is command


def test_only_segment_commands_check_a_segment_folder_and_crawl_submit_runs_only_spark_commands():
    for command in cli.COMMANDS:
        if command.segment_folder:
            assert "segment" in [argument.dest for argument in command.arguments], command.name
    assert set(submit.SPARK_COMMANDS) == {command.name for command in cli.COMMANDS if command.spark}
    assert "rebucket" in submit.SPARK_COMMANDS and "fetch" not in submit.SPARK_COMMANDS


def test_the_dispatch_starts_spark_only_for_spark_commands_and_passes_options_by_name(tmp_path, monkeypatch):
    (tmp_path / "segments" / "seg-1").mkdir(parents=True)
    started, calls = [], []

    def spark_session(conf, app_name):
        started.append(app_name)
        return "the session"

    def handler(*args, **options):
        calls.append((args[:-2], args[-1], options))
        return 7

    monkeypatch.setattr("jobs.base.spark_session", spark_session)
    monkeypatch.setattr("jobs.parse.run_command", handler)
    monkeypatch.setattr("jobs.close_segment.run_command", handler)
    assert cli.main(["parse", "--root", str(tmp_path), "--segment", "seg-1"]) == 7
    assert cli.main(["close-segment", "--root", str(tmp_path), "--segment", "seg-1", "--fetch-only"]) == 7
    assert started == ["crawl-parse"]
    assert calls == [(("the session",), str(tmp_path), {"segment": "seg-1"}),
                     ((), str(tmp_path), {"segment": "seg-1", "reason": "closed by crawl close-segment",
                                          "fetch_only": True})]


def test_light_commands_import_no_spark(tmp_path):
    """The Spark-free commands' handlers, and a whole close-segment --fetch-only, never import pyspark (it costs a
    quarter of a second before the command does anything)."""
    os.makedirs(layout.fetchlist_dir(str(tmp_path), "seg-1", 0))
    script = (
        "import sys\n"
        "from jobs import cli\n"
        "for command in cli.COMMANDS:\n"
        "    if not command.spark:\n"
        "        cli.resolve(command.handler)\n"
        f"code = cli.main(['close-segment', '--fetch-only', '--segment', 'seg-1', '--root', {str(tmp_path)!r}])\n"
        "assert code == 0, code\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('pyspark', 'delta', 'py4j')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
    assert os.path.exists(layout.closed_marker(str(tmp_path), "seg-1"))


@pytest.fixture
def segment_root(tmp_path, monkeypatch):
    """A root with segment seg-1 (buckets 0 and 1 listed, 1 done); Spark refused unless a test allows it."""
    root = str(tmp_path)
    for bucket in (0, 1):
        os.makedirs(layout.fetchlist_dir(root, "seg-1", bucket))
    os.makedirs(layout.fetched_dir(root, "seg-1", 1))
    Path(layout.done_manifest(root, "seg-1", 1)).write_text("{}")

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started")

    monkeypatch.setattr("jobs.base.spark_session", no_spark)
    return root


def test_close_segment_without_a_segments_table_writes_the_marker_only(segment_root, capsys):
    assert cli.main(["close-segment", "--root", segment_root, "--segment", "seg-1", "--reason", "why"]) == 0
    assert capsys.readouterr().out == "close-segment: seg-1 closed; unfinished buckets: [0]\n"
    marker = json.loads(Path(layout.closed_marker(segment_root, "seg-1")).read_text())
    assert marker["reason"] == "why" and marker["unfinished_buckets"] == [0]


def test_close_segment_gives_the_segment_up_in_the_table_unless_only_the_fetch_stops(segment_root, capsys,
                                                                                    monkeypatch):
    segments_log = Path(layout.table_path(segment_root, "segments")) / "_delta_log"
    segments_log.mkdir(parents=True)
    (segments_log / "00000000000000000000.json").write_text("{}")
    argv = ["close-segment", "--root", segment_root, "--segment", "seg-1"]
    assert cli.main([*argv, "--fetch-only"]) == 0  # the DAG's deadline: parsed and merged later, no Spark
    assert capsys.readouterr().out == "close-segment: seg-1 closed; unfinished buckets: [0]\n"

    given_up = []
    monkeypatch.setattr("jobs.base.spark_session", lambda conf, app_name: app_name)
    monkeypatch.setattr("jobs.update.record_closed",
                        lambda spark, root, segment_id, now: given_up.append((spark, root, segment_id)) or 2)
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == (
        "close-segment: seg-1 closed; unfinished buckets: [0]\n"
        "close-segment: 2 buckets given up (segments.state closed): not merged, and generate no longer waits for "
        "them\n")
    assert given_up == [("crawl-close-segment", segment_root, "seg-1")]


# Every Spark command reads or writes rows by bucket but init (no rows yet) and rebucket (it moves them).
BUCKETING_EXEMPT_SPARK_COMMANDS = {"init", "rebucket"}


def test_a_config_with_another_crawls_buckets_is_refused_before_spark_by_every_command(segment_root, capsys):
    """`ROOT/_crawl.json` holds 8 buckets; the config says 16: each Spark command but init and rebucket refuses in
    one line naming the key, before Spark starts (the segment_root fixture fails a command that starts it)."""
    Path(layout.crawl_record(segment_root)).write_text(json.dumps({"crawl.buckets": 8, "politeness.key": "host"}))
    seeds = Path(segment_root) / "seeds.txt"
    seeds.write_text("http://a.test/\n")
    values = {"--segment": "seg-1", "--seeds": str(seeds)}
    exempt = set()
    for command in cli.COMMANDS:
        if not command.spark:
            continue
        argv = [command.name, "--root", segment_root]
        for argument in command.arguments:
            if argument.settings.get("required") or (command.segment_folder and argument.flags[0] == "--segment"):
                argv += [argument.flags[0], values[argument.flags[0]]]  # dedup's is optional (or --rebuild)
        try:
            code = cli.main(argv)
        except AssertionError as started:
            assert str(started) == "Spark started"
            exempt.add(command.name)
            continue
        assert code == 2, command.name
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (f"crawl {command.name}: config key 'crawl.buckets': is 16 but this crawl's is 8 (buckets "
                        "are fixed for a crawl's life): set it back, or run `crawl rebucket` with the new settings "
                        "to move every URL and host to its new bucket"), command.name
    assert exempt == BUCKETING_EXEMPT_SPARK_COMMANDS
    assert cli.main(["generate", "--root", segment_root, "--set", "politeness.key=domain",
                     "--set", "crawl.buckets=8"]) == 2
    assert "config key 'politeness.key': is 'domain' but this crawl's is 'host'" in capsys.readouterr().err


def test_the_check_before_spark_records_nothing_on_a_root_without_a_record(segment_root):
    """A command that only reads (stats) leaves a root as it found it: the jobs that assign buckets record."""
    with pytest.raises(AssertionError, match="Spark started"):
        cli.main(["stats", "--root", segment_root])
    assert not os.path.exists(layout.crawl_record(segment_root))
