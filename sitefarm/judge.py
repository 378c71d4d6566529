"""Judges of a crawl from the farm server's own request log alone — never from the crawler's account of itself:
politeness (one request at a time per host, the host's delay from the end of one to the start of the next) and
robots (no disallowed URL requested)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from crawler.urls import canonicalize


def requested_url(record: dict) -> str | None:
    """The canonical URL one logged request asked for; None when the request line does not make one."""
    try:
        return canonicalize(f"http://{record['host']}{record['path']}")
    except ValueError:
        return None


def politeness_violations(
    log: list[dict], delay_for_host: Callable[[str], float], tolerance_s: float = 0.0
) -> list[dict]:
    """Politeness judged from the server's log alone, per Host header (host and port), by the rule the daemon
    promises: from the end of one request to a host to the start of the next, at least its delay.
    `concurrent` — a request started before an earlier one to that host ended;
    `too_soon` — any other request that started less than delay_for_host(host) - tolerance_s after the latest
    end of an earlier request to that host (end to start: stricter than spacing the starts)."""
    by_host: dict[str, list[dict]] = defaultdict(list)
    for record in log:
        by_host[record["host"]].append(record)
    violations = []
    for host, records in sorted(by_host.items()):
        records.sort(key=lambda r: r["start"])
        required = delay_for_host(host)
        latest_end = records[0]["end"]
        latest_end_path = records[0]["path"]
        for current in records[1:]:
            gap = current["start"] - latest_end
            if gap < 0:
                violations.append(
                    {"kind": "concurrent", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": latest_end_path, "previous_end": latest_end}
                )
            elif gap < required - tolerance_s:
                violations.append(
                    {"kind": "too_soon", "host": host, "path": current["path"], "start": current["start"],
                     "previous_path": latest_end_path, "gap_s": gap, "required_s": required}
                )
            if current["end"] > latest_end:
                latest_end, latest_end_path = current["end"], current["path"]
    return violations


def robots_violations(log_records: list[dict], disallowed: set[str]) -> list[str]:
    """Disallowed farm URLs that appear in the farm's own request log."""
    return [url for url in map(requested_url, log_records) if url in disallowed]
