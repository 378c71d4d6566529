"""Durable writes of small JSON files on a local root: how an epoch of a bucket lease (`fetchd.ownership`) or of the
crawl's writer lock (`jobs.writelock`) is taken, where an S3 root uses a conditional PUT instead."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any


def write_json_file(folder: str, name: str, data: Any, exclusive: bool) -> bool:
    """`data` as JSON in `folder/name`, all or nothing: written to a temporary file and synced, then linked to the
    name (exclusive: False when the name exists, so of two writers racing for one epoch exactly one wins) or renamed
    over it; the folder is synced too, so the new name survives a machine crash."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    partial = os.path.join(folder, f".{name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        if exclusive:
            os.link(partial, path)
        else:
            os.replace(partial, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return True
