"""The quality gate: no new segment while the data failed its validation.

`crawl validate` (and the validation `crawl run` and `crawl cycle` run after update) judges every table it runs
against its Great Expectations suite. The gate's rule, here and nowhere else:

* A validation run closes the gate for each table it ran that failed, with that table's failed expectations.
* It reopens the gate for each table it ran that passed; a table it did not run keeps what the gate held of it (so
  `crawl validate --table pages` passing does not reopen a gate closed by `urls`).
* The gate is closed while it holds a failure of any table. Generate refuses a new segment then
  (`GateClosed`, exit 4), unless an operator overrides it for one run (`crawl generate --override-gate REASON`,
  the reason recorded in the segment's `cycle_metrics` row); the override leaves the gate closed.

The record is `ROOT/_gate.json` (crawler.layout), written by validation and read by generate, both through
`jobs/gate.py`; absent means open. This module holds the record as a value, its JSON form and the rule; it reads
no file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crawler.errors import GateClosed

REOPEN = "fix the data and run `crawl validate` until it passes, or `crawl generate --override-gate REASON` for one run"


@dataclass(frozen=True)
class GateFailure:
    """One failed expectation that holds the gate closed."""

    table: str
    expectation: str  # `expect_column_values_to_be_unique(url_id)`: what the report and Data Docs name
    rule: str         # the expectation's meta.rule, in words


@dataclass(frozen=True)
class GateRecord:
    """What `_gate.json` holds: the failures holding the gate closed, when the validation that found the latest of
    them ran, and where its report is."""

    failures: tuple[GateFailure, ...]
    validated_at: datetime
    report: str

    @property
    def closed(self) -> bool:
        return bool(self.failures)

    @property
    def tables(self) -> list[str]:
        return list(dict.fromkeys(f.table for f in self.failures))

    def refusal(self) -> GateClosed:
        """The one line generate stops with: the first failure by name, how many more, the report, what reopens."""
        first = self.failures[0]
        more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return GateClosed(f"quality gate closed: table {first.table} expectation {first.expectation}{more} failed "
                          f"validation at {self.validated_at.isoformat(timespec='seconds')} (report {self.report}); "
                          f"{REOPEN}")

    def to_json(self) -> dict[str, Any]:
        return {"closed": self.closed, "tables": self.tables, "validated_at": self.validated_at.isoformat(),
                "report": self.report,
                "failures": [{"table": f.table, "expectation": f.expectation, "rule": f.rule} for f in self.failures]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateRecord:
        failures = tuple(GateFailure(f["table"], f["expectation"], f.get("rule", "")) for f in data["failures"])
        return cls(failures, datetime.fromisoformat(data["validated_at"]), data["report"])


def after_validation(previous: GateRecord | None, validated: Iterable[str], failures: Iterable[GateFailure],
                     validated_at: datetime, report: str) -> GateRecord | None:
    """The gate once a validation of the tables `validated` found `failures` (none: every one of them passed):
    their failures replace what the gate held of them, the other tables' stay. None: the gate is open."""
    ran = set(validated)
    kept = tuple(f for f in (previous.failures if previous else ()) if f.table not in ran)
    found = tuple(failures)
    if not kept and not found:
        return None
    if not found:  # the run cleared some tables but not the ones it did not run: the older record still holds
        return GateRecord(kept, previous.validated_at, previous.report)
    return GateRecord(found + kept, validated_at, report)


def check(record: GateRecord | None, override: str | None) -> str | None:
    """Whether generate may go on: raises the gate's refusal (GateClosed) while it is closed and not overridden; the
    override reason to record when it was; None when the gate is open."""
    if record is None or not record.closed:
        return None
    if override is None:
        raise record.refusal()
    return override

