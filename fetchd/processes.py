"""`fetch.processes`: one fetch command, or one `serve`, as several daemon processes, so every core fetches.

The processes share nothing but the root: each is a whole daemon (its own event loop, WARC writer, leases, host
memory) with an identity of its own, and they divide the buckets through the leases that already divide them
between daemons on different machines (`crawler.ownership`). A host belongs to one bucket and a bucket to one
lease holder, so politeness stays owned by one process per host. A fetch gives each process its share of the
pending buckets (round robin); `serve` runs the same loop in each, and each claims what no other holds.

The first share runs in the calling process; the others in child processes started with `spawn` (a fresh
interpreter: nothing of the caller's event loop or threads is copied). SIGTERM or SIGINT on the caller reaches
every child (as SIGTERM), and each stops as a single daemon does: requests in flight get their grace, results are
published, buckets released; a child still starting gets it once its daemon handles it (children are born with
both signals blocked). The metrics endpoint (`fetch.metrics_port`) is the first process's: the others
leave a snapshot in a folder of the command's every `PUBLISH_S`, and it serves them beside its own (each
series labelled with its daemon). A caller killed outright takes its children with it (Linux's parent-death signal):
kill -9 of the command stays kill -9 of every daemon it ran, whose buckets the next owner resumes.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from crawler import logs
from crawler.config import Config
from crawler.errors import EXIT_TRY_LATER, TryLater
from fetchd.metrics import metrics_label

log = logging.getLogger(__name__)
JOIN_POLL_S = 0.5
PUBLISH_S = 1.0  # how often a process without the endpoint leaves its snapshot for the one with it
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def process_count(conf: Config) -> int:
    """`fetch.processes`, where 0 means one per core."""
    return conf.fetch.processes or os.cpu_count() or 1


def process_conf(conf: Config, number: int, count: int) -> Config:
    """The settings of process `number` of `count`: its own identity (`fetch.daemon_id` with `.number` added; the
    default, hostname-pid, differs already) and metrics label (`.number` added to the first's), the metrics endpoint
    only in the first (the others report to it), and
    no more than its share of the buckets at once (`ownership.max_buckets_per_daemon`, when that is looser), so a
    process that starts first does not take every bucket from the others."""
    share = -(-conf.crawl.buckets // count)
    limit = conf.ownership.max_buckets_per_daemon
    overrides: dict[str, Any] = {"fetch.processes": 1, "ownership.max_buckets_per_daemon": min(limit or share, share)}
    if number:
        overrides["fetch.metrics_port"] = 0
        overrides["fetch.metrics_label"] = f"{metrics_label(conf)}.{number}"
        if conf.fetch.daemon_id:
            overrides["fetch.daemon_id"] = f"{conf.fetch.daemon_id}.{number}"
    return conf.with_overrides(overrides)


def shares(items: list[int], count: int) -> list[list[int]]:
    """`items` dealt round robin to at most `count` non-empty shares."""
    count = max(1, min(count, len(items)))
    return [items[k::count] for k in range(count)]


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), as if both had been killed."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + signal.SIGKILL)


def _child(work: Callable[..., Any], args: tuple, results: Any, verbose: bool, parent: int) -> None:
    """A child process: run `work(*args)` and report its return value (or its failure) on `results`."""
    _die_with(parent)
    logs.setup(verbose)
    try:
        results.put((os.getpid(), True, work(*args)))
    except TryLater as exc:  # a stop with one line (the crawl's settings changed): its exit code, no traceback
        results.put((os.getpid(), False, f"{type(exc).__name__}: {exc}"))
        sys.exit(EXIT_TRY_LATER)
    except BaseException as exc:  # reported, then re-raised so the exit code says so too
        results.put((os.getpid(), False, f"{type(exc).__name__}: {exc}"))
        raise


def run_in_processes(stop: threading.Event, first: Callable[[], Any], children: list[tuple[Callable[..., Any], tuple]],
                     ) -> tuple[Any, list[Any], list[str]]:
    """Run `first()` here and each (work, args) of `children` in a process of its own, `work(*args)` there (a
    module-level function); once `stop` is set, every child still running gets SIGTERM. Returns (what `first`
    returned, what each child returned that finished, one line per child that failed)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    started = [context.Process(target=_child, args=(work, args, results, verbose, os.getpid()), name=f"fetchd-{n}")
               for n, (work, args) in enumerate(children, 1)]
    # Each child is born with the stop signals blocked (a signal mask outlives fork and exec): a stop forwarded while
    # it starts waits until its work handles them (fetchd.commands.stop_on_signals) instead of killing it unreported.
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for process in started:
            process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    done = threading.Event()

    def forward_stop() -> None:
        while not done.is_set():
            if stop.wait(JOIN_POLL_S):
                for process in started:
                    if process.is_alive() and process.pid is not None:
                        os.kill(process.pid, signal.SIGTERM)
                return

    forwarder = threading.Thread(target=forward_stop, name="fetchd-stop-forwarder", daemon=True)
    forwarder.start()
    try:
        mine = first()
    finally:
        reported: dict[int, tuple[bool, Any]] = {}
        while len(reported) < len(started):
            try:
                pid, ok, value = results.get(timeout=JOIN_POLL_S)
                reported[pid] = (ok, value)
            except queue.Empty:
                if not any(p.is_alive() for p in started) and results.empty():
                    break  # a child died without reporting (killed): its exit code says how
        for process in started:
            process.join()
        done.set()
        forwarder.join()
    returned, failures = [], []
    for process in started:
        ok, value = reported.get(process.pid, (False, f"exited with code {process.exitcode}, nothing reported"))
        if ok and process.exitcode == 0:
            returned.append(value)
        else:
            failures.append(f"{process.name} (pid {process.pid}): {value}")
            log.error("fetch process %s (pid %s) failed: %s", process.name, process.pid, value)
    return mine, returned, failures


def publish_snapshot(folder: str, snap: dict[str, Any]) -> None:
    """Leave this process's metrics snapshot for the process with the endpoint (replaced whole, never half)."""
    path = os.path.join(folder, f"{snap['daemon_id']}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(snap, fh)
    os.replace(path + ".tmp", path)


def peer_snapshots(folder: str, own_id: str) -> list[dict[str, Any]]:
    """The latest snapshots the command's other processes left in `folder`, by daemon id."""
    snaps = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and name != f"{own_id}.json":
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    snaps.append(json.load(fh))
            except (OSError, ValueError):  # gone or being replaced: the next scrape has it
                continue
    return snaps
