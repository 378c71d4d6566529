"""`crawl`: the one command-line entry point. Every command takes --root, --config and --set key=value.

Each command is one entry of `COMMANDS`: its help, its arguments, whether it runs on Spark or on a segment's
folder, and its handler in its job module. The parser, the checks before Spark and the dispatch all read that
table, so a command is added or changed in one place.

A user mistake (a bad config key or value, argument, file or segment, a config whose bucketing is not the crawl's)
exits with code 2 and one line on stderr that names it (`crawler/commandline.py`); what can be checked before Spark
starts is checked first. A commit that lost to another command's on the same Delta table is one line and exit 75
(`crawler.errors.WriteConflict`), recognised here for every command.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crawler import commandline, layout, logs
from crawler import config as config_mod
from crawler.errors import UserError, WriteConflict


@dataclass(frozen=True)
class Argument:
    """One option of a command: argparse's flags and settings, and an optional check of its value before Spark
    starts (a UserError naming the mistake, e.g. a seeds file that is not there)."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any], object] | None = None

    @property
    def dest(self) -> str:
        """The keyword the handler takes the value under (argparse's own rule for a long option)."""
        return self.settings.get("dest") or self.flags[0].lstrip("-").replace("-", "_")


def option(*flags: str, check: Callable[[Any], object] | None = None, **settings: Any) -> Argument:
    """An `Argument`, written the way `add_argument` is called."""
    return Argument(flags, settings, check)


@dataclass(frozen=True)
class Command:
    """One `crawl` command, bound to its handler where it is declared. The handler is named as "module:function"
    and imported only when the command runs, so a light command never pays for a heavy one's imports (pyspark).
    A Spark command's handler is called as handler(spark, conf, root, **options), with the session the dispatch
    started; any other's as handler(conf, root, **options); `options` holds each argument's value by its `dest`."""

    name: str
    help: str
    handler: str
    spark: bool = False
    # --segment names a folder under ROOT/segments: an unknown one is a user error, not an empty run, found before
    # Spark starts. (`report` reads the tables, which outlive the folders: it names an unknown segment by the
    # `segments` table, jobs/report.py; `fetch` is checked by the daemon's fetch_segment, for `fetchd fetch` too.)
    segment_folder: bool = False
    # "module:function", called as function(conf, root, **options) before Spark starts: the command's own checks
    # beyond its arguments' (validate: every suite it will run is there and well-formed; generate: the quality gate
    # is open or overridden, so a refused generate costs no JVM start).
    before_spark: str | None = None
    # It reads or writes rows by bucket: refused before Spark starts when the config's `crawl.buckets` or
    # `politeness.key` is not the crawl's (`jobs/base.py::check_bucketing`). Not `init` (no rows yet); the commands
    # that run a fetch daemon leave it to the daemon, which checks for `fetchd`'s own command line too; `demo`
    # makes a crawl of its own; `close-segment` works from the segment's folder and `segments` rows, not from the
    # config's buckets; `rebucket` makes the config's settings the crawl's.
    checks_bucketing: bool = True
    arguments: tuple[Argument, ...] = ()

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        """The command's own argument values, by the keywords its handler takes them under."""
        return {argument.dest: getattr(args, argument.dest) for argument in self.arguments}


def resolve(reference: str) -> Callable[..., Any]:
    """The function a "module:function" reference names, importing its module."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _seeds_file(path: str) -> None:
    """A seeds file that is not there is named now, not once Spark has started."""
    if not os.path.isfile(path):
        raise UserError(f"seeds file {path}: {'it is a folder' if os.path.isdir(path) else 'not found'}")


def _wait_seconds(seconds: float) -> None:
    """A wait must be a finite number of seconds, 0 or more (float() takes "inf" and "nan" too)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise UserError(f"--wait-for-daemons must be a number of seconds, 0 or more: {seconds}")


def _reason(text: str) -> str:
    """--override-gate: a reason someone can read later in `cycle_metrics` (a usage error, exit 2, when blank)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give the reason for overriding the quality gate (it is recorded)")
    return text.strip()


def _run_seconds(text: str) -> float:
    """--for: a finite number of seconds above 0 (a usage error, exit 2, otherwise)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text}")
    return seconds


SEGMENT = option("--segment", type=commandline.segment_id, required=True, help="segment id")
TABLE = option("--table", action="append", dest="tables", choices=layout.TABLES, help="only this table (repeatable)")

COMMANDS: tuple[Command, ...] = (
    Command("init", "create every Delta table under the root",
            "jobs.init:run_command", spark=True, checks_bucketing=False),
    Command("inject", "add seed URLs (one per line, tab-separated metadata)",
            "jobs.inject:run_command", spark=True, arguments=(
                option("--seeds", required=True, help="seeds file", check=_seeds_file),)),
    Command("generate", "select due URLs into a new segment's fetch list (refused, exit 4, while the quality gate "
                        "is closed)",
            "jobs.generate:run_command", spark=True, before_spark="jobs.gate:check_before_generate", arguments=(
                option("--segment", type=commandline.segment_id, help="segment id (default: seg-<UTC timestamp>)"),
                option("--now", type=commandline.iso_time, help="ISO-8601 time to generate as of (default: now)"),
                option("--override-gate", type=_reason, metavar="REASON",
                       help="make this one segment although the quality gate is closed (a failed validation, "
                            "ROOT/_gate.json); the reason is recorded in its cycle_metrics row, the gate stays "
                            "closed"))),
    Command("fetch", "run a fetch daemon in the foreground until the segment's buckets are done",
            "jobs.fetch:fetch_command", checks_bucketing=False, arguments=(SEGMENT,)),
    Command("parse", "parse the segment's WARC records into pages, links and WET files (each page's text)",
            "jobs.parse:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    Command("dedup", "mark the segment's exact and near-duplicate pages and lower their URLs' priority; or, with "
            "--rebuild, re-key the near-duplicate index under the config's dedup settings",
            "jobs.dedup:run_command", spark=True, segment_folder=True, before_spark="jobs.dedup:check_arguments",
            arguments=(
                option("--segment", type=commandline.segment_id, help="segment id"),
                option("--rebuild", action="store_true",
                       help="rewrite dedup_bands under dedup.max_hamming and dedup.blocks_per_key (instead of a "
                            "segment): what a change of either needs"))),
    Command("update", "merge the segment's results, discoveries and host state into the tables",
            "jobs.update:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    Command("index", "index the segment's closed WARC files into `records` and a CDXJ file per WARC file",
            "jobs.index:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    Command("cycle", "inject (if --seeds) -> generate -> fetch -> parse -> dedup -> update",
            "jobs.cycle:run_command", spark=True, arguments=(
                option("--seeds", help="seeds file to inject first", check=_seeds_file),
                option("--cycles", type=commandline.positive_int, default=1,
                       help="how many cycles to run (default 1)"))),
    Command("run", "the continuous crawl: a new segment every cycle.interval_s, fetched by a daemon child while "
                   "the previous one is parsed, deduplicated and merged; until SIGTERM/SIGINT (exit 0)",
            "jobs.run:run_command", spark=True, arguments=(
                option("--seeds", help="seeds file to inject first", check=_seeds_file),
                option("--no-daemon", action="store_false", dest="daemon",
                       help="start no fetch daemon: daemons run elsewhere on the same root"),
                option("--for", type=_run_seconds, dest="run_for_s", metavar="SECONDS",
                       help="stop as on SIGTERM after this many seconds (a scheduler's bounded run)"),
                option("--until-idle", action="store_true",
                       help="stop once nothing is due and no segment is open"))),
    Command("demo", "crawl the bundled demo site farm on loopback with `crawl run` until nothing is due",
            "jobs.demo:run_demo", checks_bucketing=False),
    Command("maintain", "compact (OPTIMIZE), VACUUM and report every table",
            "jobs.maintain:run_command", spark=True, arguments=(
                TABLE,
                option("--no-vacuum", action="store_false", dest="vacuum", help="compact only"))),
    Command("validate", "run the Great Expectations suite of every table; exit 3 if any expectation fails",
            "jobs.validate:run_command", spark=True, before_spark="jobs.validate:check_suites", arguments=(
                TABLE,
                option("--out", help="local folder for the report and Data Docs (default: ROOT/validation)",
                       check=lambda path: layout.check_local_folder(path, "validation folder")))),
    Command("rebucket", "move every URL and host to its bucket under crawl.buckets and politeness.key, and make "
                        "those the crawl's (between cycles: refused while a segment is open or a daemon holds a "
                        "bucket lease)",
            "jobs.rebucket:run_command", spark=True, checks_bucketing=False, arguments=(  # it makes them the crawl's
                option("--wait-for-daemons", type=float, default=0.0, metavar="SECONDS", dest="wait_for_daemons_s",
                       check=_wait_seconds, help="wait up to SECONDS for daemons holding bucket leases to release "
                                                 "them (default 0: refuse at once, exit 75)"),)),
    Command("stats", "row counts by status for each table",
            "jobs.stats:run_command", spark=True),
    Command("report", "write the segment's HTML cycle report and print a summary",
            "jobs.report:run_command", spark=True, arguments=(
                SEGMENT,
                option("--out", help="HTML file to write (default: ROOT/reports/<segment>.html)",
                       check=lambda path: layout.check_output_file(path, "report file")))),
    Command("fetchd", "run a long-lived fetch daemon watching ROOT/segments",
            "jobs.fetch:serve_command", checks_bucketing=False),
    Command("close-segment", "give a segment up: daemons release its unfinished buckets, and its buckets that are "
                             "not merged become `closed` (generate stops waiting for it)",
            "jobs.close_segment:run_command", segment_folder=True, checks_bucketing=False, arguments=(
                SEGMENT,
                option("--reason", default="closed by crawl close-segment", help="why, recorded in the marker"),
                option("--fetch-only", action="store_true",
                       help="only stop the fetch (the marker); the segment is still parsed and merged (the DAG's "
                            "deadline)"))),
    Command("config", "show: print the effective config, every key with its value and where it came from (the "
                      "defaults file, --config FILE, --set, --root)",
            "jobs.cli:config_command", checks_bucketing=False, arguments=(
                option("action", choices=("show",), help="what to do with the config"),)),
)


def config_command(conf: config_mod.Config, root: str, action: str) -> int:
    """`crawl config show`: the effective config, one `key: value  # source` line per key."""
    print("\n".join(conf.describe()))
    return 0


def parser() -> argparse.ArgumentParser:
    """One subcommand per entry of `COMMANDS`, in its order, each also taking --root, --config, --set and -v."""
    common = argparse.ArgumentParser(add_help=False)
    config_mod.add_arguments(common)
    top = commandline.Parser(prog="crawl", description="Batch-incremental web crawl engine.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, parents=[common], help=command.help, description=command.help,
                                        epilog=commandline.EXIT_CODES,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
        for argument in command.arguments:
            command_parser.add_argument(*argument.flags, **argument.settings)
    return top


def chosen(args: argparse.Namespace) -> Command:
    """The entry of `COMMANDS` that `args` was parsed for."""
    return next(command for command in COMMANDS if command.name == args.command)


def _check_before_spark(command: Command, args: argparse.Namespace, conf: config_mod.Config, root: str) -> None:
    """Every user mistake that can be found without Spark, found before it starts (UserError)."""
    layout.check_local_folder(root, "storage root")
    for argument in command.arguments:
        value = getattr(args, argument.dest)
        if argument.check is not None and value:
            argument.check(value)
    if command.before_spark:
        resolve(command.before_spark)(conf, root, **command.options(args))
    if command.segment_folder and args.segment is not None:  # None: a command that takes one or something else
        from jobs.storage import Storage

        storage = Storage.from_conf(conf)
        listing = storage.list_folders(layout.segments_dir(root))
        if args.segment in listing and storage.exists(layout.generating_marker(root, args.segment)):
            listing.remove(args.segment)  # not published yet (crawler.layout): no segment to work on
        layout.require_segment(args.segment, root, listing)
    if command.spark:
        check_spark_runtime()
    if command.checks_bucketing:
        from jobs.base import check_bucketing

        check_bucketing(conf, root, record=False)


def check_spark_runtime(environ: Mapping[str, str] = os.environ) -> None:
    """What Spark needs before it can start, each missing one a UserError naming it: pyspark (the `spark` extra,
    absent from a fetch host's `cyclecrawl[fetchd]`) and a Java runtime (JAVA_HOME's, else `java` on PATH), which
    pyspark would otherwise report as a Java gateway error after a pause."""
    if importlib.util.find_spec("pyspark") is None:
        raise UserError("this command runs on Spark, which is not installed here: pip install 'cyclecrawl[all]' "
                        "(or the 'spark' extra)")
    home = environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java", path=environ.get("PATH"))
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME is {home!r} and has no bin/java" if home else "JAVA_HOME is unset and no java is on PATH"
        raise UserError(f"this command runs on Spark, which needs a Java runtime (17 or later): {where}")


def main(argv: list[str] | None = None) -> int:
    return commandline.run(parser(), argv, _command)


def _command(args: argparse.Namespace) -> int:
    logs.setup(args.verbose)
    conf = config_mod.from_arguments(args)
    root = layout.normalize_root(conf.storage.root)
    command = chosen(args)
    _check_before_spark(command, args, conf, root)
    handler = resolve(command.handler)
    try:
        if not command.spark:
            return handler(conf, root, **command.options(args))

        import delta.exceptions  # noqa: F401  (from now on pyspark raises Delta's commit conflicts as its classes)

        from jobs.base import spark_session

        return handler(spark_session(conf, app_name=f"crawl-{command.name}"), conf, root, **command.options(args))
    except Exception as exc:
        conflict = write_conflict(exc)
        if conflict is None:
            raise
        raise conflict from exc


def write_conflict(exc: BaseException) -> WriteConflict | None:
    """The `WriteConflict` a Delta concurrent-modification exception is, naming its table when Delta's message
    does (`.../tables/<name>`); None for any other exception. Delta's Python classes are what pyspark raises once
    `delta` is imported (the dispatch imports it for every Spark command; the others that start Spark import it
    before their first commit, `jobs/base.py::merge_into`); a command that never loaded Delta cannot have lost a
    commit, and is not made to import it here."""
    delta_exceptions = sys.modules.get("delta.exceptions.base")
    if delta_exceptions is None or not isinstance(exc, tuple(getattr(delta_exceptions, name)
                                                              for name in DELTA_CONFLICTS)):
        return None
    table = next((name for name in layout.TABLES if re.search(rf"/tables/{name}(?![\w-])", str(exc))), None)
    return WriteConflict(table, type(exc).__name__)


# Delta's commit conflicts (delta.exceptions): each is its own class, with no common base but pyspark's.
DELTA_CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
                   "ConcurrentTransactionException", "ConcurrentWriteException", "MetadataChangedException",
                   "ProtocolChangedException", "DeltaConcurrentModificationException")


if __name__ == "__main__":
    sys.exit(main())
