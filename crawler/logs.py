"""Structured, timestamped log lines for every command line of the engine (one format, one place)."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import time

# ISO-8601 in UTC to the millisecond (2026-12-07T13:45:02.118Z): lines from a fleet's hosts and its Spark driver
# sort and compare as they are, whatever zone each host is in.
FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
QUIET = ("py4j", "urllib3", "botocore", "asyncio")


def utc_formatter() -> logging.Formatter:
    """The engine's line format, its times in UTC."""
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    formatter.converter = time.gmtime
    return formatter


def setup(verbose: bool = False) -> None:
    """Progress lines on stderr (stdout stays for results); chatty libraries only from WARNING. SIGUSR1 prints
    every thread's Python stack there too: what a command that seems stuck is doing, without stopping it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(utc_formatter())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    # `kill -USR1 <pid>`: every thread's stack on the process's own stderr (a descriptor: `sys.stderr` may be a
    # replacement without one, as under a test's capture), and the process goes on.
    if hasattr(signal, "SIGUSR1") and sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
