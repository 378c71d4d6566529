"""A real Spark standalone cluster on 127.0.0.1: one master and one worker, started with pyspark's own
bin/spark-class (the pip package has no start scripts). The suite starts it once: the Airflow cycle runs its
Spark steps there through crawl-submit (`tests/support/airflow.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tests.support.config import at_background_priority
from tests.support.jvm import short_lived_jvm_env
from tests.support.servers import free_port

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT_S = 180  # niced (BACKGROUND_NICE) on a machine the lanes keep busy


@dataclass(frozen=True)
class Cluster:
    master_url: str  # spark://127.0.0.1:PORT
    work_dir: Path   # the worker's: one app-*/<executor>/ folder per application that ran executors there


def loopback_env() -> dict[str, str]:
    """This process's environment, with Spark bound to loopback, this interpreter for Python workers, and the
    JIT settings of short-lived JVMs (the worker's executors inherit them: each lives for one step)."""
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **short_lived_jvm_env()}


def _wait_for(path: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout_s}s:\n{path.read_text(errors='replace')[-3000:]}")


@contextmanager
def standalone_cluster(base: Path, cores: int = 2, memory: str = "3g") -> Iterator[Cluster]:
    """A master and one worker on loopback, logs under `base`; both stopped on exit. Only the background Airflow
    cycle uses it: both run niced (BACKGROUND_NICE), and so do the executors the worker starts."""
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    work_dir = base / "work"
    processes: list[subprocess.Popen] = []
    try:
        master_log = base / "master.log"
        with open(master_log, "wb") as out:
            processes.append(subprocess.Popen(at_background_priority(
                [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", port, "--webui-port", free_port()]),
                stdout=out, stderr=subprocess.STDOUT, env=loopback_env()))
        _wait_for(master_log, "I have been elected leader", processes[0], START_TIMEOUT_S)
        worker_log = base / "worker.log"
        with open(worker_log, "wb") as out:
            processes.append(subprocess.Popen(at_background_priority(
                [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", cores, "--memory", memory, "--webui-port", free_port(), "--work-dir", work_dir]),
                stdout=out, stderr=subprocess.STDOUT, env=loopback_env()))
        _wait_for(worker_log, "Successfully registered with master", processes[1], START_TIMEOUT_S)
        yield Cluster(master_url, work_dir)
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
