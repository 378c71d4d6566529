"""One URL's exchange with a web server, for a bucket run (`fetchd.bucketrun`).

A request takes its host's politeness gate and a global slot; an unexpected library error becomes a failed
response. A page's same-host redirects are followed hop by hop through the gate, each response's Retry-After is
read for the gate, every response is written to the bucket's WARC (request, response or revisit, metadata), and
the URL gets one result row saying how its last response came out. A page's 200 whose payload is the one the
URL's stored record holds (the fetch list's stored payload, `crawler.payloads`) is written as an identical-payload
revisit record instead of a response record: its digest is computed (in the WARC writer thread) before the record
is chosen. Host preparation (`fetchd.hostprep`) fetches
robots.txt through the same gated GET.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from warcio.timeutils import datetime_to_iso_date

from crawler import netpolicy, records, urls
from crawler.payloads import StoredPayload, is_identical_payload, may_be_identical
from crawler.politeness import THROTTLE_STATUSES, HostGate, parse_retry_after
from crawler.scheduling import HostWork
from crawler.status import FetchOutcome, outcome_for_status
from fetchd.fetcher import FetchResponse
from fetchd.fetchlist import KeySet
from fetchd.metrics import host_class
from fetchd.output import BucketOutput, Fenced
from fetchd.services import DaemonServices
from fetchd.warc import WrittenRecord, http_request_headers, http_response_headers, new_record_id, payload_digest

log = logging.getLogger("fetchd")

_FETCHED_NAMES = tuple(records.FETCHED.names)  # pyarrow builds the list anew on every read
STOP_POLL_S = 0.5  # how often a wait (an idle scheduler, a closed gate, a drain, a pause) looks whether to stop


def utc(epoch: float) -> datetime:
    """An epoch as an aware UTC datetime, as result rows hold times."""
    return datetime.fromtimestamp(epoch, UTC)


def _warc_date(epoch: float) -> str:
    return datetime_to_iso_date(utc(epoch).replace(tzinfo=None), use_micros=True)


def _warc_date_of(moment: datetime) -> str:
    """A result row's time (an aware datetime, microseconds) as the WARC-Date its record was written with."""
    return datetime_to_iso_date(moment.astimezone(UTC).replace(tzinfo=None), use_micros=True)


class Exchange:
    """The requests of one bucket run and what they leave: WARC records and result rows in the bucket's `out`.

    Gates, slots, metrics and rng come from the daemon's `services`, shared by all its bucket runs; `listed` holds
    the keys of the bucket's fetch list (a redirect to a listed URL is not followed); `should_stop` says the bucket
    run stops handing out work, `fenced` that its lease is lost."""

    def __init__(self, services: DaemonServices, *, out: BucketOutput, listed: KeySet,
                 should_stop: Callable[[], bool], fenced: Callable[[], bool]):
        self.conf = services.conf
        self.clock = services.clock
        self.transport = services.transport
        self.resolver = services.resolver
        self.gate_for = services.gates.gate_for
        self.slots = services.slots
        self.metrics = services.metrics
        self.rng = services.rng
        self.out = out
        self.listed = listed
        self.should_stop = should_stop
        self.fenced = fenced

    # --- the gate -----------------------------------------------------------------------------------------

    def count_politeness_wait(self, gate: HostGate) -> None:
        """A request is due on the host but its gate holds it: count the hold (`fetchd.metrics` says why here)."""
        now = self.clock.monotonic()
        if not gate.paused and gate.opens_at() > now:
            self.metrics.politeness_wait(gate.opens_at() - now)

    def unless_fenced(self) -> None:
        """Raise Fenced once the bucket's lease is lost: asked before a gate is taken and again just before a request
        is sent, since a task can wait in between (for a global slot, or frozen with its process) while the lease
        lapses and the bucket's next owner starts on the host."""
        if self.fenced():
            raise Fenced(f"bucket {self.out.bucket:05d}: lease lost, no new request")

    async def _take_gate(self, gate: HostGate, stoppable: bool) -> bool:
        """Wait (sleeping, never spinning) until the gate opens, then take it. False if the host is paused first,
        or, when `stoppable`, the bucket run stops first."""
        self.count_politeness_wait(gate)
        while not gate.paused and not (stoppable and self.should_stop()):
            self.unless_fenced()
            now = self.clock.monotonic()
            if gate.can_start(now):
                gate.started(now)
                return True
            await asyncio.sleep(min(max(gate.opens_at() - now, 0.01), STOP_POLL_S))
        return False

    async def gated_get(self, url: str, host_size_class: str, max_bytes: int | None = None) -> FetchResponse:
        """One request taking the politeness gate of the URL's host and a global slot, counted under the size class
        of the host it was made for (`fetchd.metrics.host_class`)."""
        gate = self.gate_for(urls.host_key(url))
        if not await self._take_gate(gate, stoppable=False):  # a paused host's robots.txt: unreachable this time
            return FetchResponse(url=url, started_at=self.clock.wall(), error="host paused")
        try:
            async with self.slots:
                self.unless_fenced()
                response = await self._send(url, None, max_bytes)
        except BaseException:
            # Cancelled, or fenced before it was sent: it never ends on the gate. The gate may be another bucket's
            # host (a robots.txt redirect), which the stopping bucket run does not release: give its place back here.
            gate.abandoned(self.clock.monotonic(), requests=1)
            raise
        self.request_finished(gate, response, host_size_class)
        return response

    async def _send(self, url: str, headers: dict[str, str] | None, max_bytes: int | None = None, *,
                    page: bool = False) -> FetchResponse:
        """Send a request whose gate the caller took, judged as it leaves by the host's `SendAudit`: a violation
        is counted and logged (a bug), never held back, since the gate already decided."""
        gate = self.gate_for(urls.host_key(url))
        too_soon = gate.sends.sent(self.clock.monotonic(), gate.floor_delay_s(), gate.concurrency_cap)
        if too_soon is not None:
            self.metrics.politeness_violations += 1
            log.error("politeness violation on %s: %s", urls.host_key(url), too_soon)
        try:
            return await self.transport.get(url, headers, max_bytes, page=page)
        finally:
            gate.sends.ended(self.clock.monotonic())

    def _retry_after(self, response: FetchResponse) -> float | None:
        if response.status not in THROTTLE_STATUSES:
            return None
        return parse_retry_after(response.header("Retry-After"), self.clock.wall())

    def request_finished(self, gate: HostGate, response: FetchResponse, host_size_class: str) -> float | None:
        """Close any request on its host's gate (the delay counts from now) and count the response (under the
        host's size class); the server's Retry-After, if any."""
        if response.status is not None:
            self.metrics.response(len(response.body))
        self.metrics.request(response.status, response.elapsed_ms / 1000, host_size_class)
        retry_after = self._retry_after(response)
        gate.finished(self.clock.monotonic(), response.status, retry_after, self.rng, response.elapsed_ms / 1000)
        return retry_after

    # --- page fetch -------------------------------------------------------------------------------------

    async def first_request(self, item: dict[str, Any]) -> FetchResponse:
        """A fetch-list URL's request (its gate already taken, a global slot held by the caller), conditional on
        what the URL's last fetch saw."""
        conditional = {}
        if item.get("etag"):
            conditional["If-None-Match"] = item["etag"]
        if item.get("last_modified"):
            conditional["If-Modified-Since"] = item["last_modified"]
        return await self._page_get(item["url"], conditional, sitemap=item.get("sitemap_origin") is not None)

    async def follow_redirects(self, host: HostWork, item: dict[str, Any], response: FetchResponse,
                               retry_after: float | None) -> dict[str, Any]:
        """From the URL's first response (its gate closed: `request_finished`), follow its same-host redirects;
        the URL's one row: the last response's outcome, with `redirect_to` the URL that answered when a hop was
        followed, or the unfollowed target of a last 3xx."""
        sitemap = item.get("sitemap_origin") is not None
        chain = [item["url"]]
        while True:
            target, note, follow = self._redirect_step(host, response, chain)
            if not follow:
                break
            assert target is not None
            if not await self._take_gate(host.gate, stoppable=True):
                note = "redirect not followed: host paused or daemon stopping"
                break
            await self.write_exchange(response, FetchOutcome.REDIRECT)  # the hop's 3xx, before the next one
            chain.append(target)
            async with self.slots:
                response = await self._page_get(target, sitemap=sitemap)
            retry_after = self.request_finished(host.gate, response, host_class(host.listed))
        if response.status is None or not 300 <= response.status < 400:
            target = response.url if len(chain) > 1 else None
        return await self._page_row(host, item, response, retry_after, target, note)

    async def _page_get(self, url: str, headers: dict[str, str] | None = None, *, sitemap: bool = False
                        ) -> FetchResponse:
        """One page request (the caller holds the gate and a slot); an unexpected library error becomes a failed
        response, so the URL is still reported and the gate released. A sitemap is read whatever its media type
        (gzip files are served as application/x-gzip and the like) up to `sitemaps.max_fetch_bytes`."""
        self.unless_fenced()
        try:
            if sitemap:
                return await self._send(url, headers, self.conf.sitemaps.max_fetch_bytes)
            return await self._send(url, headers, page=True)
        except Exception as exc:
            log.exception("fetching %s failed unexpectedly", url)
            return FetchResponse(url=url, started_at=self.clock.wall(), error=f"{type(exc).__name__}: {exc}")

    def _redirect_step(self, host: HostWork, response: FetchResponse,
                       chain: list[str]) -> tuple[str | None, str | None, bool]:
        """Where a response redirects and whether to follow: (canonical target, why it stops here, follow). Only a
        same-host hop is followed, and only if it is new, not in this bucket's fetch list (it is fetched as its
        own URL), within `fetch.max_redirects` and allowed by robots.txt;
        another host's URL is left for update to discover, unless it is an IP literal the SSRF guard refuses."""
        if response.status is None or not 300 <= response.status < 400:
            return None, None, False
        location = response.header("Location")
        target = urls.resolve(response.url, location) if location else None
        if target is None:
            return None, "redirect without a usable Location" if location else None, False
        literal = netpolicy.ip_literal(urls.host_name(target))
        if literal is not None and not self.resolver.allowed(literal):
            return None, f"redirect to a refused address: {literal}", False
        if target in chain:
            return None, f"redirect loop back to {target}"[:500], False
        if urls.host_key(target) != host.host_key:
            return target, None, False
        if target in self.listed:
            return target, "redirect target is in this fetch list: fetched as its own URL", False
        limit = self.conf.fetch.max_redirects
        if len(chain) > limit:
            return target, f"more than {limit} redirects" if limit else None, False
        if host.policy is not None and not host.policy.allowed(target):
            return target, "redirect target disallowed by robots.txt", False
        return target, None, True

    # --- result rows ------------------------------------------------------------------------------------

    def row(self, item: dict[str, Any], outcome: FetchOutcome, **values: Any) -> dict[str, Any]:
        """The fetched-results row of one fetch-list URL of this bucket, requested or not."""
        row = dict.fromkeys(_FETCHED_NAMES)
        row.update(
            segment_id=self.out.segment_id, bucket=self.out.bucket, url_id=item["url_id"],
            state_version=item["state_version"], url=item["url"], host_key=item["host_key"],
            fetched_at=utc(self.clock.wall()), outcome=outcome.value, truncated=False, daemon_id=self.out.daemon_id,
            sitemap_origin=item.get("sitemap_origin"),
        )
        row.update(values)
        return row

    async def _page_row(self, host: HostWork, item: dict[str, Any], response: FetchResponse,
                        retry_after: float | None, redirect_to: str | None = None,
                        note: str | None = None) -> dict[str, Any]:
        """The URL's row, from its last response: how it came out, and where its records are (a response with a
        status is written to the WARC first)."""
        common = dict(fetched_at=utc(response.started_at), elapsed_ms=response.elapsed_ms,
                      remote_ip=response.remote_ip, error=note or response.error, redirect_to=redirect_to)
        if response.blocked:
            host.blocked = response.error  # the address changed to a refused one: nothing more goes to this host
            return self.row(item, FetchOutcome.BLOCKED, **common)
        if response.status is None:
            return self.row(item, FetchOutcome.NETWORK_ERROR, **common)
        status = response.status
        outcome = outcome_for_status(status)
        stored = StoredPayload.of(item)
        digest = None
        if may_be_identical(status, response.truncated, response.url, stored):
            digest = await payload_digest(response.body)
            if is_identical_payload(status, response.truncated, digest, response.url, stored):
                outcome = FetchOutcome.IDENTICAL_PAYLOAD
        warc_filename, written = await self.write_exchange(response, outcome, item.get("last_fetch_at"), stored,
                                                           digest)
        return self.row(
            item, outcome, **common,
            status_code=status,
            etag=response.header("ETag"),
            last_modified=response.header("Last-Modified"),
            content_type=response.header("Content-Type"),
            content_length=len(response.body),
            truncated=response.truncated,
            truncated_reason=response.truncated_reason,
            payload_digest=written.payload_digest,
            warc_filename=warc_filename,
            warc_offset=written.offset,
            warc_length=written.length,
            retry_after_s=retry_after,
        )

    # --- WARC -------------------------------------------------------------------------------------------

    async def write_exchange(self, response: FetchResponse, outcome: FetchOutcome | None = None,
                             last_fetch_at: datetime | None = None, stored: StoredPayload | None = None,
                             digest: str | None = None) -> tuple[str, WrittenRecord]:
        """Request + response (or revisit) records of one exchange, then a metadata record about the fetch, as one
        writer job (contiguous); the file and where the response landed, once written. A revisit refers to the
        URL's stored record (`stored`, when it is of the URL that answered): a 304 to its date and digest, else to the
        URL's previous fetch, `last_fetch_at`; an identical payload (`outcome`) to its URI and date, with the payload's
        `digest`. A response record takes `digest` when it was computed already."""
        warc = self.out.warc()
        relpath = self.out.warc_relpath()  # now: the output may rotate to a new file while this awaits
        date = _warc_date(response.started_at)
        request_id, response_id = new_record_id(), new_record_id()
        request_headers = http_request_headers("GET", response.request_path, response.request_headers)
        http_headers = http_response_headers(response.status or 0, response.reason, response.headers)
        truncated_reason = (response.truncated_reason or "unspecified") if response.truncated else None
        original = stored.refers_to(response.url) if stored is not None else None
        if response.status == 304:
            refers_to = original.warc_date if original is not None else last_fetch_at
            answer = warc.not_modified_record(
                response.url, http_headers, date, response.remote_ip, response_id, request_id,
                refers_to_date=_warc_date_of(refers_to) if refers_to else None,
                payload_digest=original.digest if original is not None else None,
            )
        elif outcome == FetchOutcome.IDENTICAL_PAYLOAD and original is not None and digest is not None:
            answer = warc.identical_payload_record(
                response.url, http_headers, date, response.remote_ip, response_id, request_id, digest,
                original.target_uri, _warc_date_of(original.warc_date),
            )
        else:
            answer = warc.response_record(
                response.url, http_headers, response.body, date, response.remote_ip, response_id, request_id,
                truncated_reason=truncated_reason, payload_digest=digest,
            )
        written = await warc.write([
            warc.request_record(response.url, request_headers, date, response.remote_ip, request_id, response_id),
            answer,
            warc.fetch_metadata_record(response.url, date, response_id, response.elapsed_ms, response.remote_ip,
                                       truncated_reason, outcome.value if outcome else None),
        ])
        return relpath, written[1]
