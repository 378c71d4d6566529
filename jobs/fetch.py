"""`crawl fetch` and `crawl fetchd`: the fetch daemon run in this process (`fetchd/commands.py`), without Spark."""

from __future__ import annotations

import sys

from crawler.config import Config
from fetchd.commands import exit_status, fetch_segment, serve
from jobs.cycle import describe


def fetch_command(conf: Config, root: str, segment: str) -> int:
    """`crawl fetch`: the segment's pending buckets, then one summary line; a signal's stop is said on stderr and
    in the exit status (`fetchd.commands.exit_status`)."""
    summary = fetch_segment(conf, root, segment)
    print(f"fetch: {describe(summary)}")
    if summary["stopped_by"]:
        print(f"fetch: stopped by {summary['stopped_by']}; unfinished buckets are resumed by the next fetch",
              file=sys.stderr)
    return exit_status(summary)


def serve_command(conf: Config, root: str) -> int:
    """`crawl fetchd`: a long-lived daemon watching ROOT/segments, until SIGTERM or SIGINT."""
    serve(conf, root)
    return 0
