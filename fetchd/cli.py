"""`fetchd`: run the fetch daemon without Spark or a JVM.

    fetchd serve --root R [--config F] [--set k=v]...      watch R/segments and fetch new buckets until SIGTERM
    fetchd fetch --segment S --root R [--bucket N]...     fetch one segment's pending buckets, then exit
                                                          (SIGTERM/SIGINT: stop cleanly, exit 128 + signal)

A user mistake (a bad config key or value, argument or segment) exits with code 2 and one line on stderr that
names it (`crawler/commandline.py`).
"""

from __future__ import annotations

import argparse
import json
import sys

from crawler import commandline, layout, logs
from crawler import config as config_mod


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    config_mod.add_arguments(common)
    parser = commandline.Parser(prog="fetchd", description="cyclecrawl fetch daemon (politeness owner).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (("serve", "watch ROOT/segments and fetch every bucket without _DONE.json, until SIGTERM"),
                       ("fetch", "fetch one segment's pending buckets and exit")):
        sub.add_parser(name, parents=[common], help=text, description=text, epilog=commandline.EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    fetch = sub.choices["fetch"]
    fetch.add_argument("--segment", type=commandline.segment_id, required=True, help="segment id")
    fetch.add_argument("--bucket", dest="buckets", type=int, action="append",
                       help="only this bucket (repeatable; default: every pending bucket)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return commandline.run(_parser(), argv, _command)


def _command(args: argparse.Namespace) -> int:
    logs.setup(args.verbose)
    conf = config_mod.from_arguments(args)
    root = layout.check_local_folder(layout.normalize_root(conf.storage.root), "storage root")

    from fetchd import commands

    if args.command == "serve":
        commands.serve(conf, root)
        return 0
    summary = commands.fetch_segment(conf, root, args.segment, args.buckets)
    print(json.dumps(summary, sort_keys=True))
    return commands.exit_status(summary)


if __name__ == "__main__":
    sys.exit(main())
