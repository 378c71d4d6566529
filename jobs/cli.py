"""`crawl`: the one command-line entry point. Every command takes --root, --config and --set key=value.

Each command is one entry of `COMMANDS`: its help, its arguments, whether it runs on Spark or on a segment's
folder, and its handler in its job module. The parser, the checks before Spark and the dispatch all read that
table, so a command is added or changed in one place.

A user mistake (a bad config key or value, argument, file or segment) exits with code 2 and one line on stderr
that names it (`crawler/commandline.py`); what can be checked before Spark starts is checked first.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from crawler import commandline, layout, logs
from crawler import config as config_mod
from crawler.commandline import option
from crawler.errors import UserError


@dataclass(frozen=True)
class CrawlCommand(commandline.Command):
    """A `crawl` command. A Spark command's handler is called as handler(spark, conf, root, **options), with the
    session the dispatch started; any other's as handler(conf, root, **options)."""

    spark: bool = False
    # --segment names a folder under ROOT/segments: an unknown one is a user error, not an empty run, found before
    # Spark starts. (`report` reads the tables, which outlive the folders: it names an unknown segment by the
    # `segments` table, jobs/report.py; `fetch` is checked by the daemon's fetch_segment, for `fetchd fetch` too.)
    segment_folder: bool = False
    # "module:function", called as function(conf, root, **options) before Spark starts: the command's other checks.
    check: str | None = None


def _seeds_file(path: str) -> None:
    if not os.path.isfile(path):
        raise UserError(f"seeds file {path}: {'it is a folder' if os.path.isdir(path) else 'not found'}")


SEGMENT = option("--segment", type=commandline.segment_id, required=True, help="segment id")
TABLE = option("--table", action="append", dest="tables", choices=layout.TABLES, help="only this table (repeatable)")

COMMANDS: tuple[CrawlCommand, ...] = (
    CrawlCommand("init", "create every Delta table under the root", "jobs.init:run_command", spark=True),
    CrawlCommand("inject", "add seed URLs (one per line, tab-separated metadata)", "jobs.inject:run_command",
                 spark=True, arguments=(option("--seeds", required=True, help="seeds file", check=_seeds_file),)),
    CrawlCommand("generate", "select due URLs into a new segment's fetch list", "jobs.generate:run_command",
                 spark=True, arguments=(
                     option("--segment", type=commandline.segment_id,
                            help="segment id (default: seg-<UTC timestamp>)"),
                     option("--now", type=commandline.iso_time,
                            help="ISO-8601 time to generate as of (default: now)"))),
    CrawlCommand("fetch", "run a fetch daemon in the foreground until the segment's buckets are done",
                 "jobs.fetch:fetch_command", arguments=(SEGMENT,)),
    CrawlCommand("parse", "parse the segment's WARC records into pages and links", "jobs.parse:run_command",
                 spark=True, segment_folder=True, arguments=(SEGMENT,)),
    CrawlCommand("dedup", "mark the segment's exact and near-duplicate pages and lower their URLs' priority",
                 "jobs.dedup:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    CrawlCommand("update", "merge the segment's results, discoveries and host state into the tables",
                 "jobs.update:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    CrawlCommand("index", "index the segment's closed WARC files into `records` and a CDXJ file per WARC file",
                 "jobs.index:run_command", spark=True, segment_folder=True, arguments=(SEGMENT,)),
    CrawlCommand("cycle", "inject (if --seeds) -> generate -> fetch -> parse -> dedup -> update",
                 "jobs.cycle:run_command", spark=True, arguments=(
                     option("--seeds", help="seeds file to inject first", check=_seeds_file),
                     option("--cycles", type=commandline.positive_int, default=1,
                            help="how many cycles to run (default 1)"))),
    CrawlCommand("demo", "crawl the bundled demo site farm on loopback", "jobs.demo:run_demo", arguments=(
        option("--cycles", type=commandline.positive_int, help="cycles to run (default: demo.cycles)"),)),
    CrawlCommand("maintain", "compact (OPTIMIZE), VACUUM and report every table", "jobs.maintain:run_command",
                 spark=True, arguments=(
                     TABLE, option("--no-vacuum", action="store_false", dest="vacuum", help="compact only"))),
    CrawlCommand("validate", "run the Great Expectations suite of every table; exit 1 if any expectation fails",
                 "jobs.validate:run_command", spark=True, check="jobs.validate:check_suites", arguments=(
                     TABLE,
                     option("--out", help="local folder for the report and Data Docs (default: ROOT/validation)",
                            check=lambda path: layout.check_local_folder(path, "validation folder")))),
    CrawlCommand("rebucket", "move every URL and host to its bucket under crawl.buckets and politeness.key, and "
                             "make those the crawl's (between cycles: refused while a segment is open)",
                 "jobs.rebucket:run_command", spark=True),
    CrawlCommand("stats", "row counts by status for each table", "jobs.stats:run_command", spark=True),
    CrawlCommand("report", "write the segment's HTML cycle report and print a summary", "jobs.report:run_command",
                 spark=True, arguments=(
                     SEGMENT,
                     option("--out", help="HTML file to write (default: ROOT/reports/<segment>.html)",
                            check=lambda path: layout.check_output_file(path, "report file")))),
    CrawlCommand("fetchd", "run a long-lived fetch daemon watching ROOT/segments", "jobs.fetch:serve_command"),
    CrawlCommand("close-segment", "give a segment up: daemons release its unfinished buckets, and its buckets that "
                                  "are not merged become `closed` (generate stops waiting for it)",
                 "jobs.close_segment:run_command", segment_folder=True, arguments=(
                     SEGMENT,
                     option("--reason", default="closed by crawl close-segment", help="why, recorded in the marker"),
                     option("--fetch-only", action="store_true",
                            help="only stop the fetch (the marker); the segment is still parsed and merged (the "
                                 "DAG's deadline)"))),
)


def parser() -> argparse.ArgumentParser:
    return commandline.parser("crawl", "Batch-incremental web crawl engine.", COMMANDS)


def _check_before_spark(command: CrawlCommand, args: argparse.Namespace, conf: config_mod.Config, root: str) -> None:
    """Every user mistake that can be found without Spark, found before it starts (UserError)."""
    layout.check_local_folder(root, "storage root")
    command.check_arguments(args)
    if command.segment_folder:
        from jobs.storage import Storage

        storage = Storage.from_conf(conf)
        layout.require_segment(args.segment, root, storage.list_folders(layout.segments_dir(root)))
    if command.check:
        commandline.resolve(command.check)(conf, root, **command.options(args))


def main(argv: list[str] | None = None) -> int:
    return commandline.run(parser(), argv, _command)


def _command(args: argparse.Namespace) -> int:
    logs.setup(args.verbose)
    conf = config_mod.from_arguments(args)
    root = layout.normalize_root(conf["storage.root"])
    command = commandline.chosen(COMMANDS, args)
    _check_before_spark(command, args, conf, root)
    handler = commandline.resolve(command.handler)
    if not command.spark:
        return handler(conf, root, **command.options(args))

    from jobs.base import spark_session

    return handler(spark_session(conf, app_name=f"crawl-{command.name}"), conf, root, **command.options(args))


if __name__ == "__main__":
    sys.exit(main())
