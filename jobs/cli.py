"""`crawl`: the one command-line entry point. Every command takes --root, --config and --set key=value.

A user mistake (a bad config key or value, argument, file or segment) exits with code 2 and one line on stderr
that names it (`crawler/commandline.py`); what can be checked before Spark starts is checked first.
"""

from __future__ import annotations

import argparse
import os
import sys

from crawler import commandline, layout, logs
from crawler import config as config_mod
from crawler.errors import UserError

EXIT_VALIDATION_FAILED = 1
# Commands that read a segment's folder: an unknown one is a user error, not an empty run. (`report` reads the
# tables, which outlive the folders: it names an unknown segment by the `segments` table, jobs/report.py.)
# Commands on one segment whose folder is checked here, before Spark starts. `crawl fetch` is not one: the daemon's
# fetch_segment checks it (for `fetchd fetch` too), before it writes anything.
ON_A_SEGMENT = ("parse", "dedup", "update", "index", "close-segment")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    config_mod.add_arguments(common)
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = commandline.Parser(prog="crawl", description="Batch-incremental web crawl engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("init", parents=[common], help="create every Delta table under the root")
    p = sub.add_parser("inject", parents=[common], help="add seed URLs (one per line, tab-separated metadata)")
    p.add_argument("--seeds", required=True, help="seeds file")
    p = sub.add_parser("generate", parents=[common], help="select due URLs into a new segment's fetch list")
    p.add_argument("--segment", type=commandline.segment_id, help="segment id (default: seg-<UTC timestamp>)")
    p.add_argument("--now", type=commandline.iso_time, help="ISO-8601 time to generate as of (default: now)")
    for name, text in (
        ("fetch", "run a fetch daemon in the foreground until the segment's buckets are done"),
        ("parse", "parse the segment's WARC records into pages and links"),
        ("dedup", "mark the segment's exact and near-duplicate pages and lower their URLs' priority"),
        ("update", "merge the segment's results, discoveries and host state into the tables"),
        ("index", "index the segment's closed WARC files into `records` and a CDXJ file per WARC file"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--segment", type=commandline.segment_id, required=True, help="segment id")
    p = sub.add_parser("cycle", parents=[common],
                       help="inject (if --seeds) -> generate -> fetch -> parse -> dedup -> update")
    p.add_argument("--seeds", help="seeds file to inject first")
    p.add_argument("--cycles", type=commandline.positive_int, default=1, help="how many cycles to run (default 1)")
    p = sub.add_parser("demo", parents=[common], help="crawl the bundled demo site farm on loopback")
    p.add_argument("--cycles", type=commandline.positive_int, help="cycles to run (default: demo.cycles)")
    p = sub.add_parser("maintain", parents=[common], help="compact (OPTIMIZE), VACUUM and report every table")
    p.add_argument("--table", action="append", dest="tables", choices=layout.TABLES,
                   help="only this table (repeatable)")
    p.add_argument("--no-vacuum", action="store_true", help="compact only")
    p = sub.add_parser("validate", parents=[common],
                       help="run the Great Expectations suite of every table; exit 1 if any expectation fails")
    p.add_argument("--table", action="append", dest="tables", choices=layout.TABLES,
                   help="only this table (repeatable)")
    p.add_argument("--out", help="local folder for the report and Data Docs (default: ROOT/validation)")
    sub.add_parser("rebucket", parents=[common],
                   help="move every URL and host to its bucket under crawl.buckets and politeness.key, and make those "
                        "the crawl's (between cycles: refused while a segment is open)")
    sub.add_parser("stats", parents=[common], help="row counts by status for each table")
    p = sub.add_parser("report", parents=[common], help="write the segment's HTML cycle report and print a summary")
    p.add_argument("--segment", type=commandline.segment_id, required=True, help="segment id")
    p.add_argument("--out", help="HTML file to write (default: ROOT/reports/<segment>.html)")
    sub.add_parser("fetchd", parents=[common], help="run a long-lived fetch daemon watching ROOT/segments")
    p = sub.add_parser("close-segment", parents=[common],
                       help="give a segment up: daemons release its unfinished buckets, and its buckets that are not "
                            "merged become `closed` (generate stops waiting for it)")
    p.add_argument("--segment", type=commandline.segment_id, required=True, help="segment id")
    p.add_argument("--reason", default="closed by crawl close-segment", help="why, recorded in the marker")
    p.add_argument("--fetch-only", action="store_true",
                   help="only stop the fetch (the marker); the segment is still parsed and merged (the DAG's deadline)")
    return parser


def _validate(conf: config_mod.Config, root: str, tables: list[str] | None, out: str | None) -> int:
    """Exit 0 when every expectation holds, 1 when one fails, 2 for a missing or malformed suite (checked before
    Spark starts)."""
    from jobs import validate
    from jobs.base import spark_session

    validate.load_suites(conf, tables)
    result = validate.run(spark_session(conf, app_name="crawl-validate"), conf, root, tables=tables, out=out)
    print(result.summary())
    return 0 if result.success else EXIT_VALIDATION_FAILED


def _check_before_spark(args: argparse.Namespace, conf: config_mod.Config, root: str) -> None:
    """Every user mistake that can be found without Spark, found before it starts (UserError)."""
    layout.check_local_folder(root, "storage root")
    if getattr(args, "seeds", None) and not os.path.isfile(args.seeds):
        raise UserError(f"seeds file {args.seeds}: {'it is a folder' if os.path.isdir(args.seeds) else 'not found'}")
    if args.command == "report" and args.out:
        layout.check_output_file(args.out, "report file")
    if args.command == "validate" and args.out:
        layout.check_local_folder(args.out, "validation folder")
    if args.command in ON_A_SEGMENT:
        from jobs.storage import Storage

        storage = Storage.from_conf(conf)
        layout.require_segment(args.segment, root, storage.list_folders(layout.segments_dir(root)))


def main(argv: list[str] | None = None) -> int:
    return commandline.run(_parser(), argv, _command)


def _command(args: argparse.Namespace) -> int:
    logs.setup(args.verbose)
    conf = config_mod.from_arguments(args)
    root = layout.normalize_root(conf["storage.root"])
    _check_before_spark(args, conf, root)

    from jobs.cycle import describe

    if args.command == "fetch":
        from fetchd.commands import exit_status, fetch_segment

        summary = fetch_segment(conf, root, args.segment)
        print(f"fetch: {describe(summary)}")
        if summary["stopped_by"]:
            print(f"fetch: stopped by {summary['stopped_by']}; unfinished buckets are resumed by the next fetch",
                  file=sys.stderr)
        return exit_status(summary)
    if args.command == "close-segment":
        from fetchd.progress import close_segment
        from jobs.storage import Storage

        progress = close_segment(root, args.segment, args.reason, conf)
        print(f"close-segment: {args.segment} closed; unfinished buckets: {progress.unfinished}")
        segments_log = layout.join(layout.table_path(root, "segments"), "_delta_log")
        if not args.fetch_only and Storage.from_conf(conf).list_files(segments_log):  # given up in the table too
            from datetime import UTC, datetime

            from jobs.base import spark_session
            from jobs.update import record_closed

            spark = spark_session(conf, app_name="crawl-close-segment")
            given_up = record_closed(spark, root, args.segment, datetime.now(UTC))
            print(f"close-segment: {given_up} buckets given up (segments.state closed): not merged, and generate "
                  "no longer waits for them")
        return 0
    if args.command == "fetchd":
        from fetchd.commands import serve

        serve(conf, root)
        return 0
    if args.command == "demo":
        from jobs.demo import run_demo

        return run_demo(conf, root, cycles=args.cycles)
    if args.command == "validate":
        return _validate(conf, root, args.tables, args.out)

    from jobs import cycle
    from jobs.base import spark_session

    spark = spark_session(conf, app_name=f"crawl-{args.command}")
    if args.command == "init":
        from delta_tables import create_all

        created = create_all(spark, root)
        print(f"init: {root}: created {', '.join(created) if created else 'nothing (all tables exist)'}")
    elif args.command == "inject":
        from jobs import inject

        result = inject.run(spark, conf, root, args.seeds)
        for line_no, text, reason in result.errors:
            print(f"inject: {args.seeds}:{line_no}: skipped: {reason}: {text[:200]!r}")
        print(f"inject: {describe(result)}")
    elif args.command == "generate":
        from jobs import generate

        result = generate.run(spark, conf, root, segment_id=args.segment, now=args.now)
        print(f"generate: segment {result.segment_id}: {describe(result)}")
    elif args.command == "parse":
        from jobs import parse

        print(f"parse: {describe(parse.run(spark, conf, root, args.segment))}")
    elif args.command == "dedup":
        from jobs import dedup

        print(f"dedup: {describe(dedup.run(spark, conf, root, args.segment))}")
    elif args.command == "index":
        from jobs import index

        print(f"index: {describe(index.run(spark, conf, root, args.segment))}")
    elif args.command == "update":
        from jobs import update

        print(f"update: {describe(update.run(spark, conf, root, args.segment))}")
    elif args.command == "cycle":
        for number in range(1, args.cycles + 1):
            report = cycle.run_cycle(spark, conf, root, seeds=args.seeds if number == 1 else None)
            print(report.render(number))
    elif args.command == "maintain":
        from jobs import maintain

        print(maintain.run(spark, conf, root, tables=args.tables, vacuum=not args.no_vacuum).render())
    elif args.command == "rebucket":
        from jobs import rebucket

        print(f"rebucket: {rebucket.run(spark, conf, root).summary()}")
    elif args.command == "stats":
        from jobs.stats import render_stats

        print(render_stats(spark, conf, root))
    elif args.command == "report":
        from crawler.report import terminal_summary
        from jobs import report
        from jobs.storage import Storage

        data = report.build(spark, conf, root, args.segment)
        print(terminal_summary(data))
        print(f"report: {report.write_report(data, root, args.out, Storage.from_conf(conf))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
