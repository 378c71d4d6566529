"""A URL's stored payload: which response record holds the last payload the crawl stored for a URL, when a new
200 is that payload again (a revisit record, WARC 1.1 profile identical-payload-digest, instead of a response
record), which stored record update keeps, and which one generate may hand to a daemon.

The stored payload is per URL: its `WARC-Payload-Digest` ("sha1:BASE32", the digest of the payload as received,
Content-Encoding not undone), and the `WARC-Target-URI` and `WARC-Date` of the response record that holds it, kept
in `urls` (`stored_payload_digest`, `stored_target_uri`, `stored_warc_date`, `stored_warc_filename`) and copied by
generate into the fetch list. Rules, each with its SQL twin where a Spark job evaluates it
(tests/test_rule_twins.py):

* **What becomes the stored payload** (`stored_after`, update): a complete response record stored in full — a
  `success` result that is not truncated, with a payload digest and a WARC location. Its target URI is the URL that
  answered (`redirect_to` when a same-host redirect was followed: the record is the final hop's), its date the
  result's `fetched_at` (the record's WARC-Date). Every other result keeps what the URL had: a revisit (a 304 or an
  identical payload) refers to the older record, which stays the original; an error or a truncated body stores
  nothing that a later fetch could be identical to.
* **When a 200 is a revisit** (`is_identical_payload`, the daemon): its status is 200, its body is complete (a
  truncated payload is never identical), its payload digest equals the stored digest, and the stored record's
  target URI is the URL that answered now. So a revisit only ever refers to the URL's own record: two URLs with the
  same bytes (a digest "collision" across URLs) are each stored in full once, and a redirect that now lands on
  another URL than the stored record's is stored in full.
* **Which stored payload generate hands out** (`reference_in_force`): only one whose record's segment is still under
  the root (generate lists `ROOT/segments` once). A segment removed (retention, an operator's cleanup) takes its
  records with it, and its URLs are stored in full at their next fetch. A closed (given up) segment is never merged,
  so no URL's stored payload is ever in one. A single WARC file removed from a segment that is still there is not
  seen by generate: the revisit written against it is an unresolved revisit, counted by `crawl index`.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crawler.status import FetchOutcome

# segments/<segment>/warc/bucket=NNNNN/<file>: the segment of a WARC file named relative to the root
_RECORD_SEGMENT = re.compile(r"^segments/([^/]+)/warc/")
_RECORD_SEGMENT_SQL = "^segments/([^/]+)/warc/"


@dataclass(frozen=True)
class StoredPayload:
    """The URL's stored payload as the fetch list carries it: the digest and the record that holds it."""

    digest: str
    target_uri: str
    warc_date: datetime

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> StoredPayload | None:
        """From a fetch-list row; None unless all three are there."""
        digest, uri, date = (item.get("stored_payload_digest"), item.get("stored_target_uri"),
                             item.get("stored_warc_date"))
        if not digest or not uri or date is None:
            return None
        return cls(digest, uri, date)

    def refers_to(self, captured_url: str) -> StoredPayload | None:
        """Itself when its record is of `captured_url` (the URL that answered now), else None: a revisit only ever
        refers to the URL's own record."""
        return self if self.target_uri == captured_url else None


def may_be_identical(status: int | None, truncated: bool, captured_url: str, stored: StoredPayload | None) -> bool:
    """Whether a response can be an identical-payload revisit whatever its digest (so whether its digest is worth
    computing before its record is written): a complete 200 of the URL the stored record is of."""
    return status == 200 and not truncated and stored is not None and stored.refers_to(captured_url) is not None


def is_identical_payload(status: int | None, truncated: bool, payload_digest: str | None, captured_url: str,
                         stored: StoredPayload | None) -> bool:
    """Whether a response is written as an identical-payload revisit of the URL's stored record (module
    docstring)."""
    return (may_be_identical(status, truncated, captured_url, stored) and payload_digest is not None
            and stored is not None and payload_digest == stored.digest)


@dataclass(frozen=True)
class StoredRecord:
    """What `urls` keeps of a URL's stored payload (all None: none)."""

    digest: str | None = None
    target_uri: str | None = None
    warc_date: datetime | None = None
    warc_filename: str | None = None


def stored_after(outcome: str, truncated: bool | None, payload_digest: str | None, warc_filename: str | None,
                 url: str, redirect_to: str | None, fetched_at: datetime, previous: StoredRecord) -> StoredRecord:
    """The URL's stored payload after one completing result (module docstring)."""
    if (outcome == FetchOutcome.SUCCESS and not truncated and payload_digest is not None
            and warc_filename is not None):
        return StoredRecord(payload_digest, redirect_to or url, fetched_at, warc_filename)
    return previous


STORED_COLUMNS = ("stored_payload_digest", "stored_target_uri", "stored_warc_date", "stored_warc_filename")


def stored_after_sql(outcome: str, truncated: str, payload_digest: str, warc_filename: str, url: str,
                     redirect_to: str, fetched_at: str, prev: Mapping[str, str]) -> dict[str, str]:
    """`stored_after` over columns: one expression per `STORED_COLUMNS` name (`prev`: the previous value's column
    for each)."""
    stores = (f"({outcome} = '{FetchOutcome.SUCCESS.value}' and not coalesce({truncated}, false)"
              f" and {payload_digest} is not null and {warc_filename} is not null)")
    new = {"stored_payload_digest": payload_digest, "stored_target_uri": f"coalesce({redirect_to}, {url})",
           "stored_warc_date": fetched_at, "stored_warc_filename": warc_filename}
    return {name: f"(case when {stores} then {new[name]} else {prev[name]} end)" for name in STORED_COLUMNS}


def record_segment(warc_filename: str | None) -> str | None:
    """The segment whose folder holds a WARC file named relative to the root (None: not a segment's WARC file)."""
    match = _RECORD_SEGMENT.match(warc_filename or "")
    return match.group(1) if match else None


def record_segment_sql(warc_filename: str) -> str:
    """`record_segment` over a column (null where it is none)."""
    return f"nullif(regexp_extract({warc_filename}, '{_RECORD_SEGMENT_SQL}', 1), '')"


def reference_in_force(warc_filename: str | None, present_segments: Container[str]) -> bool:
    """Whether generate may hand out a URL's stored payload: its record's segment is still under the root."""
    segment = record_segment(warc_filename)
    return segment is not None and segment in present_segments


def reference_in_force_sql(present_segment: str) -> str:
    """`reference_in_force` over `present_segment`: the record's segment (`record_segment_sql`) joined against the
    segments listed under the root (null when the record's segment is not among them)."""
    return f"({present_segment} is not null)"
