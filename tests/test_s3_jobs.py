"""The Spark jobs on an s3:// root: the S3A settings rule, the plain-file storage rule (jobs/storage.py), and the
jobs themselves against moto's S3 server on loopback (the only endpoint any request goes to).

The jobs on S3 run in child processes (`crawl` commands, one JVM per child): a session with hadoop-aws and the
AWS SDK bundle on its classpath, bound to this test's moto endpoint, is a different session from the suite's
shared local one, and Spark allows one per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from crawler import layout
from jobs.base import s3a_settings
from jobs.storage import LOCAL, Storage
from tests.moto_s3 import moto_server

REPO = Path(__file__).resolve().parents[1]
SEGMENT = "seg-s3"
# A child process running several `crawl` command lines in turn (they share its one SparkSession).
CRAWL_COMMANDS = """
import json, sys
from jobs.cli import main
for argv in json.loads(sys.argv[1]):
    if main(argv):
        sys.exit(f"failed: {argv}")
"""


def _conf(base_conf, **overrides):
    return base_conf.with_overrides({key.replace("__", "."): value for key, value in overrides.items()})


# ---- the S3A settings rule ------------------------------------------------------------------------------------


def test_s3a_settings_none_for_a_local_root(base_conf):
    assert s3a_settings(_conf(base_conf, storage__root="/data/crawl"), environ={}) == {}


def test_s3a_settings_map_s3_scheme_to_s3a_with_the_configured_endpoint(base_conf):
    conf = _conf(base_conf, storage__root="s3://bucket/crawl", s3__endpoint_url="http://127.0.0.1:9000",
                 s3__region="eu-west-1", s3__path_style_access=True)
    settings = s3a_settings(conf, environ={"AWS_ENDPOINT_URL": "http://elsewhere:1"})
    assert settings["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"  # config wins over the env
    assert settings["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert settings["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert settings["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith("DefaultCredentialsProvider")


def test_s3a_settings_take_the_endpoint_from_the_environment_when_config_has_none(base_conf):
    conf = _conf(base_conf, storage__root="s3a://bucket/crawl")
    settings = s3a_settings(conf, environ={"AWS_ENDPOINT_URL": "https://s3.example.test"})
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example.test"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert settings["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_s3a_settings_leave_aws_endpoint_to_s3a_when_none_is_given(base_conf):
    settings = s3a_settings(_conf(base_conf, storage__root="s3://bucket/crawl"), environ={})
    assert "spark.hadoop.fs.s3a.endpoint" not in settings
    assert "spark.hadoop.fs.s3a.connection.ssl.enabled" not in settings
    assert settings["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"


# ---- the plain-file storage rule -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    with moto_server() as server:
        yield server


def _roundtrip(storage: Storage, root: str) -> None:
    """What index and report do with files under a root: write whole, list, read by offset, copy locally."""
    storage.write_bytes(layout.join(root, "segments/s/warc/bucket=00001/a.warc.gz"), b"0123456789" * 300_000)
    storage.write_bytes(layout.join(root, "segments/s/warc/bucket=00001/a.warc.gz"), b"abcdefghij" * 300_000)
    storage.write_bytes(layout.join(root, "segments/s/warc/bucket=00002/b.warc.gz"), b"b")
    assert storage.list_files(layout.join(root, "segments/s/warc")) == [
        "bucket=00001/a.warc.gz", "bucket=00002/b.warc.gz"]
    assert storage.list_files(layout.join(root, "segments/none")) == []
    with storage.open_input(layout.join(root, "segments/s/warc/bucket=00001/a.warc.gz")) as handle:
        handle.seek(2_000_003)  # past the first read buffer
        assert handle.read(4) == b"defg"
        handle.seek(1)
        assert handle.read(2) == b"bc"
    with storage.local_copy(layout.join(root, "segments/s/warc/bucket=00001/a.warc.gz")) as local:
        assert Path(local).read_bytes() == b"abcdefghij" * 300_000


def test_storage_reads_and_writes_files_under_a_local_root(tmp_path):
    _roundtrip(LOCAL, str(tmp_path))
    assert not list(tmp_path.rglob("*.partial"))


def test_storage_reads_and_writes_objects_under_an_s3_root(s3, base_conf):
    bucket = s3.make_bucket("storage-roundtrip")
    conf = _conf(base_conf, storage__root=f"s3://{bucket}/crawl", s3__endpoint_url=s3.endpoint,
                 s3__path_style_access=True)
    _roundtrip(Storage.from_conf(conf, environ={}), conf["storage.root"])
    keys = sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["crawl/segments/s/warc/bucket=00001/a.warc.gz", "crawl/segments/s/warc/bucket=00002/b.warc.gz"]


# ---- the jobs on an S3 root ------------------------------------------------------------------------------------


def _crawl(commands: list[list[str]], config_file: Path, env: dict[str, str]) -> str:
    """Run `crawl` commands in one child process (one JVM for all), against the config file; their output."""
    argvs = json.dumps([[*command, "--config", str(config_file)] for command in commands])
    # A script file, not `python -c`: under -c, importing GX (validate) runs pyspark's connect doctest guard,
    # which exits the process.
    script = config_file.with_name("crawl_commands.py")
    script.write_text(CRAWL_COMMANDS)
    done = subprocess.run([sys.executable, str(script), argvs], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


def _child_env(s3) -> dict[str, str]:
    """This process's environment with only fake credentials and moto's endpoint for AWS; no profile, no
    instance metadata, no proxy for loopback: no request can reach AWS."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(s3.client_env())
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _stats(output: str) -> dict[str, int]:
    """Row counts from `crawl stats` output (table name, rows, breakdown)."""
    counts = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in layout.TABLES and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_whole_cycle_on_an_s3_root(s3, base_conf, tmp_path):
    """inject, generate, fetch (the daemon through boto3), parse, dedup, update, index, report, validate and stats,
    all with --root s3://...: every file of the crawl lives in the bucket, and the tables read back."""
    from fetchd.sitefarm import FarmSpec, SiteFarm
    from jobs.demo import demo_config

    bucket = s3.make_bucket("crawl-s3")
    root = f"s3://{bucket}/crawl"
    farm = SiteFarm(FarmSpec(hosts=2, pages_per_host=6), log_path=tmp_path / "requests.jsonl")
    farm.start()
    try:
        conf = demo_config(base_conf, root, farm).with_overrides(
            {"s3.endpoint_url": s3.endpoint, "s3.path_style_access": True,
             "fetch.staging_dir": str(tmp_path / "staging")})
        config_file = tmp_path / "crawl.yaml"
        config_file.write_text(yaml.safe_dump(conf.as_dict()))
        seeds = tmp_path / "seeds.txt"
        seeds.write_text("\n".join(farm.seed_urls()) + "\n")
        output = _crawl([["inject", "--seeds", str(seeds)], ["generate", "--segment", SEGMENT],
                         ["fetch", "--segment", SEGMENT], ["parse", "--segment", SEGMENT],
                         ["dedup", "--segment", SEGMENT], ["update", "--segment", SEGMENT],
                         ["index", "--segment", SEGMENT], ["report", "--segment", SEGMENT],
                         ["validate"], ["stats"]], config_file, _child_env(s3))
    finally:
        farm.stop()
    for name in layout.TABLES:
        assert f"crawl/tables/{name}/_delta_log/00000000000000000000.json" in _keys(s3, bucket, "crawl/tables")
    segment_keys = [key.removeprefix("crawl/") for key in _keys(s3, bucket, f"crawl/segments/{SEGMENT}/")]
    assert any("/fetchlist/" in key and key.endswith(".parquet") for key in segment_keys)
    warc_files = [key for key in segment_keys if key.endswith(".warc.gz")]
    manifests = [key for key in segment_keys if key.endswith(layout.DONE_MANIFEST)]
    assert warc_files and manifests
    storage = Storage.from_conf(conf, environ={})
    results = 0
    for key in segment_keys:
        if "/fetched/" in key and key.endswith(".parquet"):
            with storage.local_copy(layout.join(root, key)) as local:
                results += pq.read_metadata(local).num_rows
    assert results >= len(farm.seed_urls())
    counts = _stats(output)
    assert counts["fetches"] == results
    assert counts["pages"] > 0 and counts["links"] > 0
    assert counts["urls"] > len(farm.seed_urls())  # discovered outlinks were added
    assert counts["records"] >= counts["fetches"]  # a response or revisit record per fetch, plus its request
    cdxj = {key.removeprefix("crawl/") for key in _keys(s3, bucket, f"crawl/segments/{SEGMENT}/cdxj/")}
    assert cdxj == {layout.cdxj_filename(name) for name in warc_files}
    lines = sum(len(s3.client().get_object(Bucket=bucket, Key=f"crawl/{name}")["Body"].read().splitlines())
                for name in cdxj)
    assert f"{lines} CDXJ lines" in output
    report = s3.client().get_object(Bucket=bucket, Key=f"crawl/reports/{SEGMENT}.html")["Body"].read()
    assert SEGMENT.encode() in report
    assert "validate: passed" in output
    validation = _keys(s3, bucket, "crawl/validation/")
    assert any(key.endswith("/report.md") for key in validation)
    assert any(key.endswith("/data_docs/index.html") for key in validation)
    assert not list((tmp_path / "staging").rglob("*.warc.gz"))  # closed WARC files left staging once uploaded
