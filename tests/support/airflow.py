"""A real Airflow for the DAG airflow_dags/crawl_cycle.py, and the one whole cycle the suite drives through it.

Airflow runs in subprocesses with its own AIRFLOW_HOME (sqlite metadata DB, no examples), so its global
configuration and logging never touch the rest of the test session. The alerts' webhook is a server in the test
process on 127.0.0.1 (`WebhookReceiver`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from crawler.config import Config
from jobs import demo
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.cluster import Cluster
from tests.support.config import at_background_priority
from tests.support.jvm import short_lived_jvm_env

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "airflow_dags"
INDEX_CONSUMER = REPO / "docs" / "examples" / "index_consumer_dag.py"
BIN = Path(sys.executable).parent
CYCLE_TIMEOUT_S = 1800  # the DAG run, each step a spark-submit, all niced: on a slow day it ran past 20 minutes


def airflow_env(home: Path) -> dict[str, str]:
    """Environment of an isolated Airflow: its own home and sqlite DB, our DAG folder only, fast pokes and no
    retries (a failing step fails the test at once instead of backing off); each step's Spark driver is a
    short-lived JVM."""
    return {
        **os.environ,
        **short_lived_jvm_env(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "CYCLECRAWL_RETRIES": "0",
        "CYCLECRAWL_ROOT": str(home / "crawl-root"),  # the DAGs load only with an absolute root
        "CYCLECRAWL_POKE_INTERVAL_S": "2",
        # No deadline alerts: dag.test crashes at the end of a successful run of a DAG with one (apache/airflow#73428).
        "CYCLECRAWL_DEADLINE_MINUTES": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # crawl, crawl-submit, fetchd of this venv
    }


def migrate_airflow_db(env: dict[str, str]) -> None:
    """Create the metadata DB of `env`'s Airflow (its AIRFLOW_HOME/airflow.db)."""
    subprocess.run(at_background_priority([BIN / "airflow", "db", "migrate"]), env=env, check=True,
                   capture_output=True, timeout=300)


def deployment(base: Path, template_db: Path) -> dict[str, str]:
    """A deployment in `base`: the DAG files with the example index consumer beside them (docs/examples/, copied as
    a deployment copies it), a copy of the migrated `template_db`, new DAGs unpaused (a consumer must be, to be
    scheduled on an Asset). Its environment."""
    folder = base / "dags"
    folder.mkdir()
    for source in [*DAGS.glob("*.py"), INDEX_CONSUMER]:
        shutil.copy(source, folder)
    env = airflow_env(base / "home")
    (base / "home").mkdir()
    shutil.copy(template_db, base / "home" / "airflow.db")
    return {**env, "AIRFLOW__CORE__DAGS_FOLDER": str(folder), "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}


class WebhookReceiver:
    """An alert webhook on 127.0.0.1: records each POST's path and JSON body and answers `status`."""

    def __init__(self, status: int = 204) -> None:
        self.received: list[tuple[str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((self.path, json.loads(body)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet: the test asserts what was received
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"


@contextmanager
def webhook_receiver(status: int = 204) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(status)
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(timeout=10)


# What every script starts with: `dag_bag(folder)` loads the DAG folder as Airflow 3's DAG processor and task runner
# load a bundle, the folder on sys.path, so the DAG files import what they share (airflow_dags/cyclecrawl_dags.py).
SCRIPT_PRELUDE = """
    import pathlib
    from airflow.dag_processing.dagbag import BundleDagBag

    def dag_bag(folder):
        return BundleDagBag(dag_folder=folder, bundle_path=pathlib.Path(folder))
    """


def run_airflow_script(env: dict[str, str], folder: Path, script: str, *args: str, timeout: float = 300) -> dict:
    """Run `script` (which prints one JSON line last) with a real Airflow in a subprocess, after SCRIPT_PRELUDE.
    Niced (tests/support/config.py::BACKGROUND_NICE): no assertion reads how fast a script ran, the light lane
    that runs them ends minutes before the Spark lane, and the Spark lane's in-process tests, the suite's critical
    path, then get the cores first (each script is seconds of CPU, most of it importing Airflow)."""
    path = folder / "airflow_script.py"
    path.write_text(textwrap.dedent(SCRIPT_PRELUDE) + textwrap.dedent(script))
    result = subprocess.run(at_background_priority([sys.executable, str(path), *args]), env=env, cwd=folder,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


RUN_CYCLE = """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from crawl_cycle import segment_id

    dag = dag_bag(sys.argv[1]).dags["crawl_cycle"]
    run = dag.test(run_conf=json.loads(sys.argv[2]))
    print(json.dumps({"state": str(run.state), "segment": segment_id(run),
                      "tasks": {ti.task_id: str(ti.state) for ti in run.get_task_instances()}}))
    """


@dataclass
class AirflowCycle:
    """What one cycle through Airflow left: the root, the farm (stopped) and its log, the seeds, the run's task
    states and segment, the daemon's exit status and log, and the cluster its Spark steps ran on."""

    root: Path
    farm: SiteFarm
    farm_log: list[dict]
    seed_urls: set[str]
    tasks: dict[str, str]
    segment: str
    daemon_returncode: int | None
    daemon_log: str
    cluster: Cluster


def run_cycle_through_airflow(base_conf: Config, cluster: Cluster, base: Path) -> AirflowCycle:
    """`dag.test` drives one whole cycle: every Spark step through crawl-submit on the standalone cluster, the
    fetch by a `fetchd serve` daemon running beside it on the same root."""
    root = base / "root"
    root.mkdir()
    farm_log = base / "farm-requests.jsonl"
    farm = SiteFarm(FarmSpec(hosts=3, pages_per_host=8), log_path=farm_log)
    env = airflow_env(base / "airflow_home")
    farm.start()
    daemon = None
    try:
        conf = demo.demo_config(base_conf.with_overrides({
            "demo.min_delay_s": 0.2, "fetch.poll_interval_s": 1.0,
            "spark.driver_memory": "1g",  # beside the worker's executors
            "index.enabled": True,  # the DAG's index path: `crawl index` after update, before validate
            # The service_levels task's verdict must not hang on this machine's load (each step a spark-submit):
            # targets an hour wide, so the task shows it read the rows Spark wrote.
            "service_levels.discovery_durable_s": 3600.0, "service_levels.lease_within_s": 3600.0,
        }), str(root), farm)
        config_file = base / "crawl.yaml"
        config_file.write_text(yaml.safe_dump(conf.as_dict()))
        seed_urls = set(farm.seed_urls())
        seeds = base / "seeds.txt"
        seeds.write_text("\n".join(sorted(seed_urls)) + "\n")
        migrate_airflow_db(env)
        with open(base / "fetchd.log", "w") as daemon_log:
            daemon = subprocess.Popen(
                at_background_priority([BIN / "fetchd", "serve", "--root", root, "--config", config_file]),
                stdout=daemon_log, stderr=subprocess.STDOUT)
        run_conf = {"config": str(config_file), "root": str(root), "seeds": str(seeds),
                    "spark_master": cluster.master_url, "segment_max_urls": 1000, "fetch_mode": "daemons",
                    "fetch_deadline_minutes": 10, "maintain": "never"}
        found = run_airflow_script({**env, "SPARK_LOCAL_IP": "127.0.0.1"}, base, RUN_CYCLE, str(DAGS),
                                   json.dumps(run_conf), timeout=CYCLE_TIMEOUT_S)
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=30)
        farm.stop()
    return AirflowCycle(root=root, farm=farm, farm_log=read_request_log(farm_log), seed_urls=seed_urls,
                        tasks=found["tasks"], segment=found["segment"], daemon_returncode=daemon.returncode,
                        daemon_log=(base / "fetchd.log").read_text(), cluster=cluster)
