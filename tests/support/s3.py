"""A real S3-compatible server for tests: moto's server on loopback, in this process (threaded, one request
handled at a time: see `_OneAtATime`).

Every S3 path in the tests goes to it; clients find it through `endpoint` and the fake credentials in
`client_env`, never through a real AWS endpoint. Also what tests put there and read back: fetch lists, objects,
result rows.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.support.fetchlists import write_fetchlist

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def client_env(self) -> dict[str, str]:
        """Environment for a child process (a daemon, spark-submit) that must reach this server only."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_EC2_METADATA_DISABLED": "true"}


class _OneAtATime:
    """moto's backend checks a conditional PUT (If-None-Match: *, If-Match) and then writes, with no lock between:
    two requests at once can both pass the check, which S3 never allows (the lease tests' epoch race found two
    winners). Handling one request at a time gives the double S3's atomic conditional writes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Any) -> list[bytes]:
        with self.lock:
            return list(self.app(environ, start_response))


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (a free port) and stop it on exit."""
    import logging

    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    saved = {key: os.environ.get(key) for key in CREDENTIALS}
    os.environ.update(CREDENTIALS)  # boto3 in this process must never look for real credentials
    app = _OneAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield S3Server(endpoint=f"http://{host}:{port}")
    finally:
        server.shutdown()
        thread.join()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def put_fetchlist(s3: S3Server, root: str, staging: Path, segment_id: str, urls: list[str],
                  buckets: int) -> dict[int, list[dict]]:
    """Fetch lists written with pyarrow (as generate lays them out) in `staging` and uploaded under the S3 root."""
    local = str(staging / "generated")
    lists = write_fetchlist(local, segment_id, [{"url": u} for u in urls], buckets)
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    for folder, _, names in os.walk(local):
        for name in names:
            path = os.path.join(folder, name)
            s3.client().upload_file(path, bucket, prefix + "/" + os.path.relpath(path, local))
    return lists


def objects(s3: S3Server, root: str, under: str) -> dict[str, bytes]:
    """Relative key -> content of every object under `root/under`."""
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    client = s3.client()
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{under}"):
        for entry in page.get("Contents", []):
            found[entry["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read()
    return found


def result_rows(s3: S3Server, root: str, segment_id: str, kind: str = "fetched") -> list[dict]:
    """Every row of the segment's uploaded fetched (or robots) objects, with its key in `_key`."""
    rows = []
    for key, data in objects(s3, root, f"segments/{segment_id}/{kind}/").items():
        if key.endswith(".parquet"):
            rows += [{**row, "_key": key} for row in pq.read_table(io.BytesIO(data)).to_pylist()]
    return rows
