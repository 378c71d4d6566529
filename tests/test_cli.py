"""The `crawl` command line and the cycle report, without Spark."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs.cycle import CycleReport, describe
from jobs.generate import GenerateResult
from jobs.update import UpdateResult

COMMANDS = ("init", "inject", "generate", "fetch", "parse", "dedup", "update", "index", "cycle", "demo", "maintain",
            "rebucket", "stats", "report", "fetchd", "validate", "close-segment", "config")


def test_help_lists_every_command():
    result = subprocess.run([sys.executable, "-m", "jobs.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in COMMANDS:
        assert command in result.stdout


def test_every_command_takes_root_config_and_set():
    for command in COMMANDS:
        result = subprocess.run(
            [sys.executable, "-m", "jobs.cli", command, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, command
        for option in ("--root", "--config", "--set", "--version"):
            assert option in result.stdout, (command, option)
        # What it does, then what its exit status means.
        assert "exit codes:" in result.stdout and "75  try later" in result.stdout, command
        assert result.stdout.split("\n\n")[1].strip(), command


def test_config_show_names_where_each_value_came_from(tmp_path):
    """`crawl config show`: every key of the defaults file once, in its order, each value with its source."""
    override = tmp_path / "crawl.yaml"
    override.write_text("fetch:\n  concurrency: 17\nscope:\n  deny_domains: [spam.test]\n")
    result = subprocess.run([sys.executable, "-m", "jobs.cli", "config", "show", "--config", str(override),
                             "--set", "politeness.min_delay_s=2.5", "--root", str(tmp_path / "root")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    from crawler import config

    assert list(lines) == config.leaf_keys(config.defaults())
    assert lines["fetch.concurrency"] == f"17  # file {override}"
    assert lines["scope.deny_domains"] == f"[spam.test]  # file {override}"
    assert lines["politeness.min_delay_s"] == "2.5  # --set"
    assert lines["storage.root"] == f"{tmp_path / 'root'}  # --root"
    assert lines["crawl.buckets"].endswith("  # default")


def test_an_override_of_a_config_from_defaults_alone_keeps_its_source(tmp_path):
    """With no file and no --set, `--root` (a `with_overrides`) is still named as the root's source."""
    from crawler import config

    conf = config.load().with_overrides({"storage.root": str(tmp_path)}, source="--root")
    assert f"storage.root: {tmp_path}  # --root" in conf.describe()
    assert conf.with_overrides({"fetch.concurrency": 3}).sources == {"storage.root": "--root",
                                                                     "fetch.concurrency": "set by the caller"}


def test_missing_required_argument_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "jobs.cli", "parse"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--segment" in result.stderr


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (Linux: the SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signum - 1)))


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on(tmp_path):
    """A command that seems stuck says what it is doing: SIGUSR1 prints every thread's Python stack on stderr
    (crawler.logs.setup) and the command goes on; here `fetchd serve` on a root with no work, stopped by SIGTERM."""
    process = subprocess.Popen([sys.executable, "-m", "fetchd.cli", "serve", "--root", str(tmp_path / "root"),
                                "--set", "fetch.processes=1"],
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (_catches(process.pid, signal.SIGUSR1) and _catches(process.pid, signal.SIGTERM)):  # serving
            assert process.poll() is None and time.monotonic() < deadline, "the handler was never installed"
            time.sleep(0.1)
        process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        assert process.poll() is None  # still serving
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    assert "most recent call first" in err and "fetchd/commands.py" in err


def test_cycle_report_reads_at_a_glance():
    report = CycleReport("seg-1")
    report.steps["generate"] = GenerateResult("seg-1", url_count=10, host_count=2, buckets=[1, 2])
    report.seconds["generate"] = 1.5
    report.steps["fetch"] = {"urls": 10, "outcomes": {"success": 9, "robots_denied": 1}, "warc_files": 2,
                             "warc_bytes": 2_000_000}
    report.seconds["fetch"] = 2.0
    report.steps["update"] = UpdateResult("seg-1", results=10, applied=9, stale=1, discovered=4)
    report.seconds["update"] = 3.0
    text = report.render(1)
    assert text.splitlines()[0] == "cycle 1: segment seg-1 in 6.5s"
    assert "10 URLs from 2 hosts in 2 buckets" in text
    assert "robots_denied=1, success=9" in text and "2.00 MB" in text
    assert "9 applied, 1 stale, 4 new URLs" in text
    assert describe("plain") == "plain"


def test_log_lines_carry_an_iso_8601_utc_time():
    """Every command line's log format (crawler.logs): the date, the time to the millisecond and the zone (UTC),
    whatever the host's zone."""
    import logging
    import re
    from datetime import UTC, datetime

    from crawler import logs

    record = logging.LogRecord("jobs", logging.INFO, __file__, 1, "a step: done", None, None)
    record.created, record.msecs = 1796651102.118, 118.0  # 2026-12-07T13:45:02.118Z
    line = logs.utc_formatter().format(record)
    assert line == "2026-12-07T13:45:02.118Z INFO jobs: a step: done"
    assert datetime.fromtimestamp(record.created, UTC).isoformat().startswith(line[:19])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO jobs: .*", line)
