"""Every enum of the engine, documented in one place: URL status, fetch outcome, segment state,
URL source and index event kind. Tables, jobs, the daemon and the expectation suites all import these."""

from __future__ import annotations

from enum import Enum


class UrlStatus(str, Enum):
    """`urls.status`: what the frontier knows of a URL."""

    UNFETCHED = "unfetched"          # known, never fetched (or never successfully attempted)
    FETCHED = "fetched"              # last fetch returned content (2xx)
    NOT_MODIFIED = "not_modified"    # last fetch was a 304 for our validators
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
    REDIRECT = "redirect"            # 3xx; redirect_to holds the resolved target
    HTTP_ERROR = "http_error"        # 4xx/5xx response (status_code says which)
    NETWORK_ERROR = "network_error"  # DNS, connect, reset, TLS or timeout; no response
    ROBOTS_DENIED = "robots_denied"  # not requested: robots.txt disallows it
    BLOCKED = "blocked"              # not requested: the address is refused (SSRF guard)
    DEFERRED = "deferred"            # not requested this segment (host paused or robots unreachable); no failure


class SegmentState(str, Enum):
    """`segments.state`, per bucket, in order."""

    GENERATED = "generated"
    FETCHING = "fetching"
    FETCHED = "fetched"
    PARSED = "parsed"
    MERGED = "merged"


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
    NOT_MODIFIED = "not_modified"    # 304 or identical content: nothing to reindex
    GONE = "gone"                    # 404/410: remove from the index
    DUPLICATE = "duplicate"          # new/changed content duplicating another URL: index the representative


def values(enum: type[Enum]) -> list[str]:
    return [member.value for member in enum]
