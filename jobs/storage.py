"""Files under a storage root that jobs read and write outside Spark (WARC files, CDXJ files, reports): one rule
for local folders and s3:// roots, through pyarrow.fs.

Spark reads and writes (Delta tables, Parquet) go through Hadoop (S3A, see jobs/base.py::s3a_settings); this
module serves the plain-Python paths, including those in Spark tasks: `Storage` is a small frozen value, so a
mapInArrow closure carries it to the workers. The S3 endpoint is always passed explicitly from config (or
AWS_ENDPOINT_URL read on the driver), never left to the worker's environment; credentials come from the AWS
default chain.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from crawler import layout
from crawler.config import Config, s3_endpoint

# Reads of an S3 object are range GETs: a buffer this size makes a sequential scan (one WARC file's records in
# offset order) one request per MiB instead of one per record or per 16 KiB read.
READ_BUFFER_BYTES = 1 << 20
COPY_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class Storage:
    """How to reach an s3:// root (unused for a local one); the defaults serve local roots."""

    endpoint_url: str = ""          # "" = AWS's own endpoint for the region
    region: str = "us-east-1"
    path_style_access: bool = False

    @classmethod
    def from_conf(cls, conf: Config, environ: Mapping[str, str] = os.environ) -> Storage:
        return cls(endpoint_url=s3_endpoint(conf, environ),
                   region=conf.s3.region, path_style_access=bool(conf.s3.path_style_access))

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem of `uri` and the path within it (bucket/key for S3, an absolute path for a local file)."""
        if not layout.is_s3(uri):
            return pafs.LocalFileSystem(), os.path.abspath(uri)
        options: dict = {"region": self.region}
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url)
            options.update(scheme=endpoint.scheme or "https", endpoint_override=endpoint.netloc or endpoint.path,
                           force_virtual_addressing=not self.path_style_access)
        return pafs.S3FileSystem(**options), uri.split("://", 1)[1]

    def delta_rs(self, uri: str) -> tuple[str, dict[str, str]]:
        """`uri` and the storage options delta-rs (the `deltalake` package) opens a table there with: readers that
        run without a JVM, such as the DAG's frontier task. Credentials come from the AWS default chain."""
        if not layout.is_s3(uri):
            return os.path.abspath(uri), {}
        options = {"AWS_REGION": self.region}
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_ALLOW_HTTP"] = str(self.endpoint_url.startswith("http://")).lower()
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not self.path_style_access).lower()
        return "s3://" + uri.split("://", 1)[1], options

    def open_input(self, uri: str) -> BinaryIO:
        """A seekable, buffered binary stream of the file."""
        filesystem, path = self.filesystem(uri)
        if isinstance(filesystem, pafs.LocalFileSystem):
            return open(path, "rb")
        return io.BufferedReader(filesystem.open_input_file(path), buffer_size=READ_BUFFER_BYTES)

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Replace the file with `data` as a whole: a reader sees the old file or the new one, never a part (local:
        a temporary name, then rename; S3: an object appears only when its upload completes)."""
        filesystem, path = self.filesystem(uri)
        if isinstance(filesystem, pafs.LocalFileSystem):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = path + ".partial"
            with open(partial, "wb") as out:
                out.write(data)
            os.replace(partial, path)
            return
        # compression=None: pyarrow would otherwise gzip a *.gz name (detect by extension) - a WARC file twice over.
        with filesystem.open_output_stream(path, compression=None) as out:
            out.write(data)

    def open_output(self, uri: str) -> AtomicOutput:
        """A file written as a stream that replaces `uri` as a whole on `commit()` (local: a temporary name beside
        it, then rename; S3: a local temporary file uploaded on commit, so a failed write never leaves a part) and
        is dropped on `abort()`. As a context manager: committed when the block ends without an error."""
        return AtomicOutput(self, uri)

    def append_file(self, uri: str, out: BinaryIO) -> None:
        """Copy the file's bytes to the end of `out`, streamed."""
        filesystem, path = self.filesystem(uri)
        with filesystem.open_input_stream(path, compression=None) as source:
            shutil.copyfileobj(source, out, COPY_CHUNK_BYTES)

    def list_files(self, uri: str) -> list[str]:
        """Every file under the folder (recursively), as paths relative to it; none if it does not exist."""
        filesystem, base = self.filesystem(uri)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        return sorted(info.path[len(base):].lstrip("/") for info in filesystem.get_file_info(selector)
                      if info.type == pafs.FileType.File)

    def list_folders(self, uri: str) -> list[str]:
        """The names of the folders directly under `uri` (on S3: the common prefixes); none if it does not exist."""
        filesystem, base = self.filesystem(uri)
        selector = pafs.FileSelector(base, recursive=False, allow_not_found=True)
        return sorted(info.base_name for info in filesystem.get_file_info(selector)
                      if info.type == pafs.FileType.Directory)

    def exists(self, uri: str) -> bool:
        """Whether a file (or folder) is there (on S3: an object, or a prefix with objects)."""
        filesystem, path = self.filesystem(uri)
        return filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def delete_file(self, uri: str) -> None:
        """Remove one file; none there is no error."""
        filesystem, path = self.filesystem(uri)
        if filesystem.get_file_info(path).type == pafs.FileType.File:
            filesystem.delete_file(path)

    def delete_folder(self, uri: str) -> None:
        """Remove a folder and everything under it; none there is no error."""
        filesystem, path = self.filesystem(uri)
        if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            filesystem.delete_dir(path)

    def s3_client(self) -> Any:
        """A boto3 S3 client with these settings (for what pyarrow does not offer: conditional writes);
        credentials from the AWS default chain."""
        import boto3
        from botocore.config import Config as BotoConfig

        addressing = "path" if self.path_style_access else "auto"
        return boto3.client("s3", endpoint_url=self.endpoint_url or None, region_name=self.region,
                            config=BotoConfig(s3={"addressing_style": addressing}, retries={"mode": "standard"}))

    @contextmanager
    def local_copy(self, uri: str) -> Iterator[str]:
        """A local path of the file for code that opens paths: the file itself for a local root, else a temporary
        copy (one streaming GET) removed on exit."""
        if not layout.is_s3(uri):
            yield os.path.abspath(uri)
            return
        with tempfile.TemporaryDirectory(prefix="cyclecrawl-") as folder:
            local = os.path.join(folder, os.path.basename(uri))
            filesystem, path = self.filesystem(uri)
            with filesystem.open_input_stream(path, compression=None) as source, open(local, "wb") as target:
                shutil.copyfileobj(source, target, COPY_CHUNK_BYTES)
            yield local


class AtomicOutput:
    """`Storage.open_output`: written whole or not at all."""

    def __init__(self, storage: Storage, uri: str) -> None:
        self._storage, self._uri = storage, uri
        filesystem, path = storage.filesystem(uri)
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        if self._local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._path = f"{path}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._file: BinaryIO = open(self._path, "wb")  # noqa: SIM115 - closed by commit or abort
        else:
            self._file = tempfile.NamedTemporaryFile(prefix="cyclecrawl-", delete=False)  # noqa: SIM115
            self._path = self._file.name
        self._target = path

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    @property
    def stream(self) -> BinaryIO:
        return self._file

    def commit(self) -> None:
        self._file.close()
        if self._local:
            os.replace(self._path, self._target)
            return
        try:
            filesystem, path = self._storage.filesystem(self._uri)
            with open(self._path, "rb") as source, filesystem.open_output_stream(path, compression=None) as target:
                shutil.copyfileobj(source, target, COPY_CHUNK_BYTES)
        finally:
            os.remove(self._path)

    def abort(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path)

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


LOCAL = Storage()  # a local root needs no settings
