"""Every enum of the engine, documented in one place: URL status, fetch outcome, segment state,
URL source and index event kind. Tables, jobs, the daemon and the expectation suites all import these.

Also the rules that read a response's status, one home each with the SQL twin that Spark jobs use beside the
Python form (tests/test_rule_twins.py holds them equal): which outcome a status gives, which outcomes made a
request, which failures are transient (retried soon, and counted by politeness backoff) and which codes mean gone.
"""

from __future__ import annotations

from enum import Enum


class UrlStatus(str, Enum):
    """`urls.status`: what the frontier knows of a URL."""

    UNFETCHED = "unfetched"          # known, never fetched (or never successfully attempted)
    FETCHED = "fetched"              # last fetch returned content (2xx)
    NOT_MODIFIED = "not_modified"    # last fetch found the content unchanged: a 304, or the stored payload again
    REDIRECT = "redirect"            # last fetch was a 3xx; the target is a URL of its own
    GONE = "gone"                    # 404/410 tombstone, revisited rarely
    RETRY = "retry"                  # transient failure (5xx, timeout, network); retried with backoff
    FAILED = "failed"                # transient failures exhausted the retry budget; revisited rarely
    ROBOTS_DENIED = "robots_denied"  # disallowed by the host's robots.txt; rechecked when the policy expires
    EXCLUDED = "excluded"            # out of scope or refused (e.g. SSRF guard, 4xx other than 404/410)




class FetchOutcome(str, Enum):
    """`fetches.outcome` and the daemon's fetched-results files: what one fetch attempt produced."""

    SUCCESS = "success"              # 2xx response written to the WARC
    NOT_MODIFIED = "not_modified"    # 304 written as a revisit record
    # A 200 whose payload digest is the URL's stored one (crawler.payloads.is_identical_payload): written as a
    # revisit record (identical-payload-digest) referring to the URL's own stored response record.
    IDENTICAL_PAYLOAD = "identical_payload"
    REDIRECT = "redirect"            # 3xx; redirect_to holds the resolved target
    HTTP_ERROR = "http_error"        # 4xx/5xx response (status_code says which)
    NETWORK_ERROR = "network_error"  # DNS, connect, reset, TLS or timeout; no response
    ROBOTS_DENIED = "robots_denied"  # not requested: robots.txt disallows it
    BLOCKED = "blocked"              # not requested: the address is refused (SSRF guard)
    DEFERRED = "deferred"            # not requested this segment (host paused or robots unreachable); no failure


class SegmentState(str, Enum):
    """`segments.state`, per bucket, in order; a segment's buckets end `merged`, or `closed` when given up."""

    GENERATED = "generated"
    FETCHING = "fetching"
    FETCHED = "fetched"
    PARSED = "parsed"
    MERGED = "merged"
    # Given up on purpose (`crawl close-segment`) before it was merged: its results are not merged, its URLs come
    # back when their leases expire, and it no longer holds generate back (crawler.frontier.backpressure).
    CLOSED = "closed"


# The states a segment's bucket ends in: merged, or given up. Anything else is still open (generate's backpressure).
FINISHED_SEGMENT_STATES = (SegmentState.MERGED.value, SegmentState.CLOSED.value)


class HostState(str, Enum):
    """What holds a host back across segments (`crawler.politeness.host_state`), as `crawl stats` shows it."""

    OK = "ok"
    BACKING_OFF = "backing_off"                 # hosts.backoff_until is still ahead: generate leaves it out
    ROBOTS_UNREACHABLE = "robots_unreachable"   # its last robots.txt fetch found it unreachable (disallow all)
    DEAD = "dead"                               # nothing but failures for politeness.dead_after_days: probed only


class LiveHostState(str, Enum):
    """What holds a host of a bucket a daemon is fetching now (`crawler.scheduling.HostWork.state`, the daemon's
    `fetchd_hosts` metric); across segments the `hosts` table has `HostState`."""

    OK = "ok"
    BACKING_OFF = "backing_off"                 # its gate holds a backoff after failures
    PAUSED = "paused"                           # politeness.max_consecutive_failures reached: nothing more this run
    ROBOTS_UNREACHABLE = "robots_unreachable"   # no robots.txt (and no good copy in force): nothing allowed
    BLOCKED = "blocked"                         # the SSRF guard refused its address


class MetricsStep(str, Enum):
    """`cycle_metrics.step`: the step run whose frontier figures a row holds."""

    GENERATE = "generate"
    UPDATE = "update"


class UrlSource(str, Enum):
    """`urls.source`: how a URL first became known."""

    SEED = "seed"
    SITEMAP = "sitemap"
    LINK = "link"
    REDIRECT = "redirect"


class IndexEventKind(str, Enum):
    """`index_events.kind`: what an indexing pipeline should do with a URL version."""

    FETCHED = "fetched"              # first content for this URL
    CHANGED = "changed"              # content differs from the previous version
    NOT_MODIFIED = "not_modified"    # 304, identical payload or identical content: nothing to reindex
    GONE = "gone"                    # 404/410: remove from the index
    DUPLICATE = "duplicate"          # new/changed content duplicating another URL: index the representative


class WetOutcome(str, Enum):
    """What parse wrote to the segment's WET files for a page it read (crawler/wet.py; counted in its summary)."""

    WRITTEN = "written"              # a conversion record of the page's visible text
    NO_TEXT = "no_text"              # HTML with no visible text (empty, only markup or script): no record
    NOT_HTML = "not_html"            # a body that is not HTML (PDF, image, other binary or text types): no record


# 404 and 410: the page is gone (a tombstone, revisited rarely; an index `gone` event).
GONE_CODES = frozenset({404, 410})

# Outcomes where a request reached the server (a response, or a network error on the way); the others were
# decided without one (robots.txt, the address guard, a deferred host).
REQUESTED_OUTCOMES = frozenset({FetchOutcome.SUCCESS, FetchOutcome.NOT_MODIFIED, FetchOutcome.IDENTICAL_PAYLOAD,
                                FetchOutcome.REDIRECT, FetchOutcome.HTTP_ERROR, FetchOutcome.NETWORK_ERROR})

# Outcomes that found the URL's content unchanged without storing it again (a revisit record): a 304, or a 200
# whose payload is the stored one. The revisit policy and the index event treat them alike.
UNCHANGED_OUTCOMES = frozenset({FetchOutcome.NOT_MODIFIED, FetchOutcome.IDENTICAL_PAYLOAD})


def outcome_for_status(status_code: int | None) -> FetchOutcome:
    """The outcome of an exchange by its response status; None means no response (a network error)."""
    if status_code is None:
        return FetchOutcome.NETWORK_ERROR
    if status_code == 304:
        return FetchOutcome.NOT_MODIFIED
    if 200 <= status_code < 300:
        return FetchOutcome.SUCCESS
    if 300 <= status_code < 400:
        return FetchOutcome.REDIRECT
    return FetchOutcome.HTTP_ERROR


def is_unchanged(outcome: str) -> bool:
    """True when the attempt found the content unchanged and wrote a revisit record (`UNCHANGED_OUTCOMES`)."""
    return outcome in UNCHANGED_OUTCOMES


def is_unchanged_sql(outcome: str) -> str:
    """`is_unchanged` over the outcome column `outcome`."""
    listed = ", ".join(f"'{o.value}'" for o in sorted(UNCHANGED_OUTCOMES, key=lambda o: o.value))
    return f"({outcome} in ({listed}))"


def made_request(outcome: str) -> bool:
    """True when the attempt sent a request to the host (what politeness and the request log count)."""
    return outcome in REQUESTED_OUTCOMES


def made_request_sql(outcome: str) -> str:
    """`made_request` over the outcome column `outcome`."""
    listed = ", ".join(f"'{o.value}'" for o in sorted(REQUESTED_OUTCOMES, key=lambda o: o.value))
    return f"({outcome} in ({listed}))"


def is_transient_status(status_code: int | None) -> bool:
    """A response that asks us to slow down and try again: none at all (network error), 429 or a 5xx."""
    return status_code is None or status_code == 429 or status_code >= 500


def is_transient(outcome: str, status_code: int | None) -> bool:
    """A result worth retrying soon, and a failure of its host: a network error, or an HTTP 429 or 5xx."""
    if outcome == FetchOutcome.NETWORK_ERROR:
        return True
    return outcome == FetchOutcome.HTTP_ERROR and status_code is not None and is_transient_status(status_code)


def is_transient_sql(outcome: str, status_code: str) -> str:
    """`is_transient` over the columns `outcome` and `status_code`."""
    return (f"({outcome} = '{FetchOutcome.NETWORK_ERROR.value}' or ({outcome} = '{FetchOutcome.HTTP_ERROR.value}'"
            f" and coalesce({status_code} = 429 or {status_code} >= 500, false)))")


def is_gone(outcome: str, status_code: int | None) -> bool:
    """An HTTP 404 or 410: the page is gone."""
    return outcome == FetchOutcome.HTTP_ERROR and status_code in GONE_CODES


def is_gone_sql(outcome: str, status_code: str) -> str:
    """`is_gone` over the columns `outcome` and `status_code`."""
    return (f"({outcome} = '{FetchOutcome.HTTP_ERROR.value}' and coalesce({status_code} in "
            f"({', '.join(str(code) for code in sorted(GONE_CODES))}), false))")


def values(enum: type[Enum]) -> list[str]:
    return [member.value for member in enum]
