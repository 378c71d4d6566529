"""Structured, timestamped log lines for every command line of the engine (one format, one place)."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET = ("py4j", "urllib3", "botocore", "asyncio")


def setup(verbose: bool = False) -> None:
    """Progress lines on stderr (stdout stays for results); chatty libraries only from WARNING. SIGUSR1 prints
    every thread's Python stack there too: what a command that seems stuck is doing, without stopping it."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=FORMAT, datefmt="%H:%M:%S",
                        stream=sys.stderr)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    # `kill -USR1 <pid>`: every thread's stack on the process's own stderr (a descriptor: `sys.stderr` may be a
    # replacement without one, as under a test's capture), and the process goes on.
    if hasattr(signal, "SIGUSR1") and sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
