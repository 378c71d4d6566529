"""The jobs on a real Spark standalone cluster, through spark-submit (`crawl-submit`).

The suite's one cluster cycle is the Airflow cycle (`tests/support/airflow.py`): a master and a worker on
127.0.0.1 (`tests/support/cluster.py`), and each Spark step of the cycle its own spark-submit application whose
executors live in the worker's processes, so a job that relied on state in the driver process (a module-level
cache, a local file only the driver wrote, a Python object captured by reference) would fail or produce wrong
tables here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from crawler.errors import UserError
from delta_tables import table_df
from jobs import submit
from jobs.base import SHIPPED_WITH_PYSPARK

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

# The cycle's Spark applications: inject (which creates the tables), generate, parse, dedup, update, index (the
# run's config turns index.enabled on), validate.
SPARK_STEPS = 7


def test_submit_command_names_master_jars_and_entry(base_conf):
    command = submit.submit_command(base_conf, ["parse", "--segment", "s1"], "spark://127.0.0.1:7077")
    assert command[0].endswith("spark-submit")
    assert command[command.index("--master") + 1] == "spark://127.0.0.1:7077"
    assert command[command.index("--packages") + 1].startswith("io.delta:delta-spark_")
    assert command[command.index("--exclude-packages") + 1].split(",") == list(SHIPPED_WITH_PYSPARK)
    assert command[-4:] == [str(submit.ENTRY), "parse", "--segment", "s1"]
    s3 = submit.submit_command(base_conf.with_overrides({"storage.root": "s3://bucket/crawl"}), ["init"], "local[2]")
    assert "org.apache.hadoop:hadoop-aws:3.5.0" in s3[s3.index("--packages") + 1]
    with pytest.raises(UserError, match="not a Spark command"):
        submit.submit_command(base_conf, ["fetch", "--segment", "s1"], "local[2]")


def test_packages_pyspark_ships_are_left_out_of_resolution(spark):
    """Every artifact left out of package resolution is one pyspark ships (at its own version), so nothing the JVM
    loads goes missing; the session's resolved jars hold Delta's and none of those."""
    shipped = {jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    for artifact in SHIPPED_WITH_PYSPARK:
        name = artifact.split(":")[1]
        assert any(re.fullmatch(rf"{re.escape(name)}-\d[\w.\-]*\.jar", jar) for jar in shipped), artifact
    resolved = [Path(jar).name for jar in spark.sparkContext.getConf().get("spark.jars", "").split(",") if jar]
    assert any(jar.startswith("io.delta_delta-spark_") for jar in resolved), resolved
    for artifact in SHIPPED_WITH_PYSPARK:
        assert not [jar for jar in resolved if jar.startswith(artifact.replace(":", "_") + "-")], artifact


def test_cycle_on_the_cluster_fills_the_tables(spark, airflow_cycle):
    root, segment, seeds = str(airflow_cycle.root), airflow_cycle.segment, airflow_cycle.seed_urls
    fetches = table_df(spark, root, "fetches").where(f"segment_id = '{segment}'")
    fetched_urls = {r["url"] for r in fetches.where("status_code = 200").select("url").collect()}
    assert seeds <= fetched_urls
    pages = table_df(spark, root, "pages").where(f"segment_id = '{segment}'")
    assert {r["url"] for r in pages.select("url").collect()} >= seeds
    urls = table_df(spark, root, "urls")
    completed = {r["url"] for r in urls.where(f"last_segment = '{segment}'").select("url").collect()}
    assert fetched_urls <= completed
    assert urls.where(f"discovered_in = '{segment}'").count() > 0  # the seeds' links, merged by update


def test_every_step_ran_executors_on_the_worker(airflow_cycle):
    """Each application's executors ran in the worker (work/app-*/<executor>/stderr), not in the driver."""
    apps = sorted(airflow_cycle.cluster.work_dir.glob("app-*"))
    assert len(apps) == SPARK_STEPS
    for app in apps:
        assert list(app.glob("*/stderr")), f"no executor ran for {app.name}"
