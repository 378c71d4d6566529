"""The Spark jobs on an s3:// root: the S3A settings rule, the plain-file storage rule (jobs/storage.py), and the
jobs themselves against moto's S3 server on loopback (the only endpoint any request goes to).

The jobs on S3 run in one child process that the session starts in the background (`tests/support/s3_cycle.py`);
the last test here reads what that cycle left.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from crawler import layout
from jobs.base import s3a_settings
from jobs.storage import LOCAL, Storage
from tests.support.s3 import moto_server
from tests.support.s3_cycle import SEGMENT


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
    # a streamed file (parse's WET parts and files): whole on commit, none on abort, appended from another file
    with storage.open_output(layout.join(root, "segments/s/wet/bucket=00002/b.warc.wet.gz")) as out:
        out.write(b"head ")
        storage.append_file(layout.join(root, "segments/s/warc/bucket=00002/b.warc.gz"), out.stream)
    dropped = storage.open_output(layout.join(root, "segments/s/wet/bucket=00002/c.warc.wet.gz"))
    dropped.write(b"part")
    dropped.abort()
    assert storage.list_files(layout.join(root, "segments/s/wet")) == ["bucket=00002/b.warc.wet.gz"]
    with storage.open_input(layout.join(root, "segments/s/wet/bucket=00002/b.warc.wet.gz")) as handle:
        assert handle.read() == b"head b"


def test_storage_reads_and_writes_files_under_a_local_root(tmp_path):
    _roundtrip(LOCAL, str(tmp_path))
    assert not list(tmp_path.rglob("*.partial"))


def test_storage_reads_and_writes_objects_under_an_s3_root(s3, base_conf):
    bucket = s3.make_bucket("storage-roundtrip")
    conf = _conf(base_conf, storage__root=f"s3://{bucket}/crawl", s3__endpoint_url=s3.endpoint,
                 s3__path_style_access=True)
    _roundtrip(Storage.from_conf(conf, environ={}), conf.storage.root)
    keys = sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["crawl/segments/s/warc/bucket=00001/a.warc.gz", "crawl/segments/s/warc/bucket=00002/b.warc.gz",
                    "crawl/segments/s/wet/bucket=00002/b.warc.wet.gz"]


# ---- the jobs on an S3 root ------------------------------------------------------------------------------------


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
def test_a_whole_cycle_on_an_s3_root(s3_cycle, monkeypatch):
    """inject, generate, fetch (the daemon through boto3), parse, dedup, update, index, report, validate and stats,
    all with --root s3://... (tests/support/s3_cycle.py): every file of the crawl lives in the bucket, and the
    tables read back."""
    s3, bucket, root, output = s3_cycle.server, s3_cycle.bucket, s3_cycle.root, s3_cycle.output
    for name in layout.TABLES:
        assert f"crawl/tables/{name}/_delta_log/00000000000000000000.json" in _keys(s3, bucket, "crawl/tables")
    segment_keys = [key.removeprefix("crawl/") for key in _keys(s3, bucket, f"crawl/segments/{SEGMENT}/")]
    assert any("/fetchlist/" in key and key.endswith(".parquet") for key in segment_keys)
    warc_files = [key for key in segment_keys if key.endswith(".warc.gz")]
    manifests = [key for key in segment_keys if key.endswith(layout.DONE_MANIFEST)]
    assert warc_files and manifests
    # parse's WET files, one per WARC file it read, no parts left (pyarrow leaves a folder marker, "wet/")
    wet_files = [key for key in segment_keys if "/wet/" in key and not key.endswith("/")]
    assert wet_files and set(wet_files) <= {layout.wet_filename(key) for key in warc_files}
    storage = Storage.from_conf(s3_cycle.conf, environ={})
    results = 0
    for key in segment_keys:
        if "/fetched/" in key and key.endswith(".parquet"):
            with storage.local_copy(layout.join(root, key)) as local:
                results += pq.read_metadata(local).num_rows
    assert results >= len(s3_cycle.seed_urls)
    counts = _stats(output)
    assert counts["fetches"] == results
    assert counts["pages"] > 0 and counts["links"] > 0
    assert counts["urls"] > len(s3_cycle.seed_urls)  # discovered outlinks were added
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
    assert not list(s3_cycle.staging.rglob("*.warc.gz"))  # closed WARC files left staging once uploaded
    # The DAG's frontier task reads the cycle's figures from the bucket with delta-rs (no JVM), as Spark wrote them.
    from jobs.cycle_metrics import read_figures

    for key, value in s3.client_env().items():
        monkeypatch.setenv(key, value)
    figures = read_figures(s3_cycle.conf, SEGMENT)
    assert set(figures) == {"generate", "update"}
    assert figures["generate"]["leased_urls"] >= len(s3_cycle.seed_urls) and figures["update"]["results"] == results
