"""The jobs on a real Spark standalone cluster, through spark-submit (`crawl-submit`).

A master and a worker are started on 127.0.0.1 with pyspark's own bin/spark-class (the pip package has no
start scripts). Each Spark step of a whole cycle is its own spark-submit application whose executors live in
the worker's processes, so a job that relied on state in the driver process (a module-level cache, a local
file only the driver wrote, a Python object captured by reference) would fail or produce wrong tables here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
import yaml

from delta_tables import table_df
from fetchd.sitefarm import FarmSpec, SiteFarm
from jobs import demo, submit
from tests.loopback import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
STEP_TIMEOUT_S = 300


def _loopback_env() -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def _wait_for(path: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout_s}s:\n{path.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and one worker (2 cores) on loopback; yields (master URL, worker work dir)."""
    base = tmp_path_factory.mktemp("cluster")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    work_dir = base / "work"
    processes = []
    try:
        master_log = base / "master.log"
        with open(master_log, "wb") as out:
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=_loopback_env()))
        _wait_for(master_log, "I have been elected leader", processes[0], 90)
        worker_log = base / "worker.log"
        with open(worker_log, "wb") as out:
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "2", "--memory", "3g", "--webui-port", str(free_port()), "--work-dir", str(work_dir)],
                stdout=out, stderr=subprocess.STDOUT, env=_loopback_env()))
        _wait_for(worker_log, "Successfully registered with master", processes[1], 90)
        yield master_url, work_dir
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _crawl_submit(master_url: str, config_path: Path, *crawl_args: str) -> str:
    command = [sys.executable, "-m", "jobs.submit", "--master", master_url, "--",
               *crawl_args, "--config", str(config_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=_loopback_env(), timeout=STEP_TIMEOUT_S)
    assert done.returncode == 0, f"{crawl_args[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-6000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def cluster_cycle(cluster, base_conf, tmp_path_factory):
    """One whole cycle whose Spark steps ran on the cluster; the fetch is the daemon (not a Spark job)."""
    master_url, work_dir = cluster
    base = tmp_path_factory.mktemp("cluster-crawl")
    root = str(base / "root")
    farm = SiteFarm(FarmSpec(hosts=3, pages_per_host=8), log_path=base / "requests.jsonl")
    farm.start()
    try:
        conf = demo.demo_config(base_conf.with_overrides({"demo.min_delay_s": 0.2, "spark.driver_memory": "1g"}),
                                root, farm)
        config_path = base / "crawl.yaml"
        config_path.write_text(yaml.safe_dump(conf.as_dict(), sort_keys=True))
        seeds = base / "seeds.txt"
        seeds.write_text("\n".join(farm.seed_urls()) + "\n")
        outputs = {"inject": _crawl_submit(master_url, config_path, "inject", "--seeds", str(seeds)),
                   "generate": _crawl_submit(master_url, config_path, "generate", "--segment", "seg-cluster")}
        fetched = subprocess.run([sys.executable, "-m", "jobs.cli", "fetch", "--segment", "seg-cluster",
                                  "--config", str(config_path)], capture_output=True, text=True, timeout=300)
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        for step in ("parse", "dedup", "update"):
            outputs[step] = _crawl_submit(master_url, config_path, step, "--segment", "seg-cluster")
    finally:
        farm.stop()
    return {"root": root, "farm": farm, "work_dir": work_dir, "outputs": outputs}


def test_submit_command_names_master_jars_and_entry(base_conf):
    command = submit.submit_command(base_conf, ["parse", "--segment", "s1"], "spark://127.0.0.1:7077")
    assert command[0].endswith("spark-submit")
    assert command[command.index("--master") + 1] == "spark://127.0.0.1:7077"
    assert command[command.index("--packages") + 1].startswith("io.delta:delta-spark_")
    assert command[-4:] == [str(submit.ENTRY), "parse", "--segment", "s1"]
    s3 = submit.submit_command(base_conf.with_overrides({"storage.root": "s3://bucket/crawl"}), ["init"], "local[2]")
    assert "org.apache.hadoop:hadoop-aws:3.5.0" in s3[s3.index("--packages") + 1]
    with pytest.raises(ValueError, match="not a Spark command"):
        submit.submit_command(base_conf, ["fetch", "--segment", "s1"], "local[2]")


def test_cycle_on_the_cluster_fills_the_tables(spark, cluster_cycle):
    root, farm = cluster_cycle["root"], cluster_cycle["farm"]
    fetches = table_df(spark, root, "fetches").where("segment_id = 'seg-cluster'")
    fetched_urls = {r["url"] for r in fetches.where("status_code = 200").select("url").collect()}
    assert set(farm.seed_urls()) <= fetched_urls
    pages = table_df(spark, root, "pages").where("segment_id = 'seg-cluster'")
    assert {r["url"] for r in pages.select("url").collect()} >= set(farm.seed_urls())
    urls = table_df(spark, root, "urls")
    completed = {r["url"] for r in urls.where("last_segment = 'seg-cluster'").select("url").collect()}
    assert fetched_urls <= completed
    assert urls.where("discovered_in = 'seg-cluster'").count() > 0  # the seeds' links, merged by update
    assert "update:" in cluster_cycle["outputs"]["update"]


def test_every_step_ran_executors_on_the_worker(cluster_cycle):
    """Each application's executors ran in the worker (work/app-*/<executor>/stderr), not in the driver."""
    apps = sorted(cluster_cycle["work_dir"].glob("app-*"))
    assert len(apps) == 5  # inject (which creates the tables), generate, parse, dedup, update
    for app in apps:
        assert list(app.glob("*/stderr")), f"no executor ran for {app.name}"
