"""The quality gate's record, `ROOT/_gate.json` (crawler.gate holds the rule): written after every validation run,
read by generate before it makes a segment. Through `jobs/storage.py`, so local and s3:// roots are alike; a write
replaces the file whole (a reader sees the old record or the new one), and an open gate is no file at all."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime

from crawler import gate, layout
from crawler.config import Config
from jobs.storage import Storage

log = logging.getLogger("jobs.gate")


def read(storage: Storage, root: str) -> gate.GateRecord | None:
    """The gate's record, None while it is open (no file)."""
    path = layout.gate_record(root)
    if not storage.exists(path):
        return None
    with storage.open_input(path) as handle:
        return gate.GateRecord.from_json(json.loads(handle.read()))


def record_validation(storage: Storage, root: str, validated: Iterable[str], failures: Iterable[gate.GateFailure],
                      validated_at: datetime, report: str) -> gate.GateRecord | None:
    """Close or reopen the gate by a validation run's outcome (crawler.gate.after_validation) and write it; the gate
    as it now stands."""
    previous = read(storage, root)
    now = gate.after_validation(previous, validated, failures, validated_at, report)
    path = layout.gate_record(root)
    if now is None:
        if previous is not None:
            storage.delete_file(path)
            log.info("quality gate reopened: every table that failed passed validation")
    elif now != previous:
        storage.write_bytes(path, json.dumps(now.to_json(), indent=2).encode("utf-8"))
        log.warning("quality gate closed: %s", ", ".join(f"{f.table} {f.expectation}" for f in now.failures))
    return now


def check_before_generate(conf: Config, root: str, segment: str | None, now: datetime | None,
                          override_gate: str | None) -> None:
    """`crawl generate`'s check before Spark starts (its options as the command table hands them; only the override
    matters): a closed gate is refused (GateClosed, exit 4) without a JVM's start; generate asks again under the
    writer lock (`jobs/generate.py`), which `crawl run` and `crawl cycle` go through too."""
    gate.check(read(Storage.from_conf(conf), root), override_gate)
