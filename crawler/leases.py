"""Leases and stale results: when a URL is due, which version a fetch list hands out, which result
is current, and which of two results for one version counts. Pure, each rule beside its SQL twin (used by
generate, parse and update; tests/test_rule_twins.py holds the two equal).

* **Due**: `next_fetch_at` has come and no other segment holds a live lease on the URL (`lease_segment` null,
  its `lease_expires_at` passed, or the lease is this segment's own: a re-run of generate hands the same rows out).
  While its row does not change, a URL is due from `due_from` on: its next fetch, or its lease's expiry if later.
* **Version**: a fetch list row carries `state_version + 1`, or the same version when this segment already holds
  the lease (a re-run), so a result names the one version it may complete.
* **Current**: a result is current while its URL's row is still at the result's version; update completes the
  URL only then and only under this segment's lease (or an earlier run of the same update that already did).
* **Latest result**: the same (url_id, state_version) can come back twice (a bucket re-fetched after a crash or
  a takeover). The latest fetch counts — latest `fetched_at`, then the later WARC record, then outcome — for
  every job alike: parse reads that result's record (and no other), update completes the URL with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

# The latest-result order: (column, descending). Nulls sort last either way.
LATEST_RESULT_ORDER = (("fetched_at", True), ("warc_filename", True), ("warc_offset", True), ("outcome", False))
RESULT_KEY = ("url_id", "state_version")


def is_due(next_fetch_at: datetime | None, lease_segment: str | None, lease_expires_at: datetime | None,
           now: datetime, segment_id: str) -> bool:
    """True when generate may hand the URL out in `segment_id` at `now`."""
    if next_fetch_at is None or next_fetch_at > now:
        return False
    return (lease_segment is None or lease_segment == segment_id
            or (lease_expires_at is not None and lease_expires_at < now))


def is_due_sql(now: str, segment_id: str) -> str:
    """`is_due` over the `urls` columns; `now` a SQL timestamp expression, `segment_id` a checked id."""
    return (f"(next_fetch_at <= {now} and (lease_segment is null or lease_expires_at < {now}"
            f" or lease_segment = '{segment_id}'))")


def due_from(next_fetch_at: datetime | None, lease_segment: str | None,
             lease_expires_at: datetime | None) -> datetime | None:
    """From when the URL is due for a new segment as long as its row does not change: `is_due` holds for every `now`
    after this moment (at it too, unless a lease expires then). None: not until its row changes (no next fetch, or
    a lease without an expiry). What a generate that found nothing due reports as the next due moment."""
    if next_fetch_at is None:
        return None
    if lease_segment is None:
        return next_fetch_at
    if lease_expires_at is None:
        return None
    return max(next_fetch_at, lease_expires_at)


def due_from_sql() -> str:
    """`due_from` over the `urls` columns."""
    return ("(case when next_fetch_at is null then null when lease_segment is null then next_fetch_at"
            " when lease_expires_at is null then null else greatest(next_fetch_at, lease_expires_at) end)")


def leased_version(state_version: int, lease_segment: str | None, segment_id: str) -> int:
    """The version a fetch list row of `segment_id` carries for a URL at `state_version`."""
    return state_version if lease_segment == segment_id else state_version + 1


def leased_version_sql(segment_id: str) -> str:
    return f"(case when lease_segment <=> '{segment_id}' then state_version else state_version + 1 end)"


def is_current(result_version: int, url_version: int | None) -> bool:
    """The URL's row is still at the version the result was fetched for (None: the URL has no row)."""
    return url_version is not None and url_version == result_version


def is_current_sql(result_version: str, url_version: str) -> str:
    return f"coalesce({url_version} = {result_version}, false)"


def completes(result_version: int, url_version: int | None, lease_segment: str | None,
              last_segment: str | None, segment_id: str) -> bool:
    """A result of `segment_id` completes its URL: current, and the lease is this segment's — or an earlier run
    of this segment's update already completed it (`last_segment`), so a re-run counts the same."""
    return is_current(result_version, url_version) and segment_id in (lease_segment, last_segment)


def completes_sql(result_version: str, url_version: str, lease_segment: str, last_segment: str,
                  segment_id: str) -> str:
    return (f"({is_current_sql(result_version, url_version)} and coalesce({lease_segment} = '{segment_id}'"
            f" or {last_segment} = '{segment_id}', false))")


def latest_result(results: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The one result that counts among results for the same (url_id, state_version)."""
    ordered = list(results)
    # Stable sorts from the last key to the first; nulls last whatever the direction.
    for column, descending in reversed(LATEST_RESULT_ORDER):
        present = [r for r in ordered if r.get(column) is not None]
        ordered = (sorted(present, key=lambda r: r[column], reverse=descending)
                   + [r for r in ordered if r.get(column) is None])
    return ordered[0]


def latest_result_order_sql() -> str:
    """The ORDER BY of `latest_result`, for a window over (url_id, state_version)."""
    return ", ".join(f"{column} {'desc' if descending else 'asc'} nulls last"
                     for column, descending in LATEST_RESULT_ORDER)


def latest_result_rank_sql() -> str:
    """1 for the result that counts in its (url_id, state_version), 2, 3... for the others."""
    return f"row_number() over (partition by {', '.join(RESULT_KEY)} order by {latest_result_order_sql()})"
