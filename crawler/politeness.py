"""Politeness rule in one place: the per-host delay, server-directed backoff and host pausing.

Pure: time is passed in, randomness comes from a caller's `random.Random`. The fetch daemon keeps one
`HostGate` per host; the rule it enforces is

    delay = max(politeness.min_delay_s, min(robots Crawl-delay, politeness.max_crawl_delay_s), backoff,
                min(politeness.response_time_factor * last response time, politeness.max_response_time_delay_s))

counted from the END of the previous request to the host (or its failure), never from its dispatch, with
request starts at least `delay` apart and at most `politeness.max_concurrency_per_host` requests in flight.
Adaptive: a failure (network error, 429, 5xx) sets the backoff (Retry-After, else exponential) and drops the
host to one request in flight; each later success multiplies the backoff by `politeness.backoff_recovery_factor`
instead of clearing it, and once it no longer exceeds the delay without it, it is over and the host gets its
full concurrency back. No response lowers the delay below the minimum: every term only adds to it.

Per-host overrides: an operator may set `hosts.min_delay_s` and `hosts.max_concurrency` (a Delta UPDATE on the
`hosts` table). Generate folds them into the fetch list's `delay_s` (`host_delay`, here with its SQL twin) and
`max_concurrency`; the daemon's scheduler applies that delay as a floor on the gate's `min_delay_s` and that
concurrency as a cap when a bucket run first sees the host (`PolitenessRules.limit`). Overrides only ever make a
host's gate stricter.

Politeness key (`politeness.key`): `host` (the default) gives every host name its own gate. `domain` also holds
every host of one registered domain by one `SharedGate` (at most `max_concurrency_per_host` requests in flight
across them, starts `min_delay_s` apart and that long after the end of the last one), and keys buckets by the
domain (`crawler/bucketing.py`), so one daemon owns all of a domain's hosts and its gate covers them all.

Per-IP guard (off by default): many host names can share one server, and each name has its own gate. With
`politeness.max_concurrency_per_ip` or `min_delay_per_ip_s` set, every host a daemon process resolved to one IP
address is also held by that address's `SharedGate`: at most that many requests in flight there, starts that far
apart and that long after the end of the last one, across all the names and buckets of the process. A host is
bound to its address when its bucket run prepares it (the first permitted address of its name). It is a guard per
process: buckets are keyed by host name (or domain), so names of one address can be owned by different daemons.

Across segments (`host_backoff`, applied by update): a segment whose requests to a host met failures — the same
transient failures the gate counts, `crawler.status.is_transient`, and a robots.txt found unreachable (DNS,
refused, TLS, timeout, 5xx: the host's URLs then wait, deferred, without a request) — keeps the host out of
generate for a backoff that grows per consecutive failing segment. A host whose segments met nothing but
failures for `politeness.dead_after_days` is dead (`host_state`): generate gives it one probe URL per segment
(`crawler.frontier.per_host_cap`), and one answer revives it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from crawler.robots import RobotsState
from crawler.settings import Settings
from crawler.status import HostState, is_transient_status

BACKOFF_JITTER = 0.25  # exponential backoff is stretched by a random factor in [1, 1 + this)
THROTTLE_STATUSES = frozenset({429, 503})  # statuses whose Retry-After header directs our backoff
NEGLIGIBLE_BACKOFF_S = 0.01  # a recovering backoff this small is over even when the minimum delay is 0
AUDIT_SLACK_S = 1e-6  # SendAudit: float rounding of a delay counted on one monotonic clock


def effective_delay(
    min_delay_s: float, crawl_delay_s: float | None, max_crawl_delay_s: float, backoff_s: float,
    response_delay_s: float = 0.0,
) -> float:
    """Seconds between the end of one request to a host and the start of the next."""
    robots = min(crawl_delay_s, max_crawl_delay_s) if crawl_delay_s is not None else 0.0
    return max(min_delay_s, robots, backoff_s, response_delay_s)


def response_time_delay(elapsed_s: float | None, factor: float, cap_s: float) -> float:
    """The delay a response time asks for: `factor` x elapsed, at most `cap_s`; 0 when off or unknown."""
    if not factor or elapsed_s is None or not math.isfinite(elapsed_s):
        return 0.0
    return min(factor * max(0.0, elapsed_s), cap_s)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date (RFC 9110 §10.2.3).
    A date in the past gives 0; anything unreadable gives None (the caller falls back to exponential)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def backoff_seconds(
    failures: int, base_s: float, cap_s: float, retry_after_s: float | None, rng: random.Random
) -> float:
    """Backoff after the `failures`-th consecutive failure: the server's Retry-After if it gave one, else
    base * 2^(failures-1) stretched by jitter; capped at `cap_s` either way."""
    if retry_after_s is not None:
        return min(max(0.0, retry_after_s), cap_s)
    exponential = base_s * (2 ** max(0, failures - 1)) * (1.0 + BACKOFF_JITTER * rng.random())
    return min(exponential, cap_s)


def is_backing_off(backoff_until: datetime | None, now: datetime) -> bool:
    """A host whose backoff across segments (`hosts.backoff_until`) is still ahead: generate leaves it out. At
    `backoff_until` itself the backoff is over."""
    return backoff_until is not None and backoff_until > now


def is_backing_off_sql(backoff_until: str, now: str) -> str:
    """`is_backing_off` over a `hosts.backoff_until` column and a timestamp expression for now."""
    return f"coalesce({backoff_until} > {now}, false)"


@dataclass(frozen=True)
class HostBackoff:
    """A host's backoff across segments (`hosts.backoff_level`, `hosts.backoff_until`) and since when its
    segments have met nothing but failures (`hosts.failing_since`; None: it answered when last tried)."""

    level: int
    until: datetime | None
    failing_since: datetime | None = None


@dataclass(frozen=True)
class PolitenessRules:
    """The `politeness.*` settings, typed: the one source of every host gate, of the delay generate plans
    with, and of the backoff update carries from one segment to the next."""

    min_delay_s: float
    max_crawl_delay_s: float
    max_concurrency_per_host: int
    backoff_base_s: float
    max_backoff_s: float
    max_consecutive_failures: int
    backoff_recovery_factor: float
    response_time_factor: float
    max_response_time_delay_s: float
    dead_after_days: float
    max_concurrency_per_ip: int = 0
    min_delay_per_ip_s: float = 0.0
    key: str = "host"  # crawler.bucketing.POLITENESS_KEYS: what one gate (and one bucket) covers

    @classmethod
    def from_config(cls, conf: Settings) -> PolitenessRules:
        return cls(**{name: getattr(conf.politeness, name) for name in cls.__dataclass_fields__})

    def host_delay(self, crawl_delay_s: float | None, host_min_delay_s: float | None) -> float:
        """A host's delay known before fetching (generate, the report): the minimum, its robots.txt
        Crawl-delay (capped) and its own override (`hosts.min_delay_s`), whichever is longest."""
        return max(effective_delay(self.min_delay_s, crawl_delay_s, self.max_crawl_delay_s, 0.0),
                   host_min_delay_s or 0.0)

    def host_delay_sql(self, crawl_delay: str, host_min_delay: str) -> str:
        """`host_delay` over the columns `crawl_delay` and `host_min_delay`."""
        # Spark's least() skips nulls, so a missing Crawl-delay is handled before it.
        robots = (f"(case when {crawl_delay} is null then 0D"
                  f" else least({crawl_delay}, {float(self.max_crawl_delay_s)!r}) end)")
        return f"greatest({float(self.min_delay_s)!r}, {robots}, coalesce({host_min_delay}, 0D))"

    def gate(self, floor_delay_s: float | None = None, host_max_concurrency: int | None = None) -> HostGate:
        """A new host's gate under these settings and the host's own limits (`limit`)."""
        gate = HostGate(
            min_delay_s=self.min_delay_s,
            max_crawl_delay_s=self.max_crawl_delay_s,
            max_concurrency=self.max_concurrency_per_host,
            backoff_base_s=self.backoff_base_s,
            max_backoff_s=self.max_backoff_s,
            max_failures=self.max_consecutive_failures,
            recovery_factor=self.backoff_recovery_factor,
            response_time_factor=self.response_time_factor,
            max_response_time_delay_s=self.max_response_time_delay_s,
        )
        self.limit(gate, floor_delay_s, host_max_concurrency)
        return gate

    def address_gate(self) -> SharedGate | None:
        """A new gate for one IP address (the per-IP guard), or None while the guard is off (both settings 0)."""
        if not self.max_concurrency_per_ip and not self.min_delay_per_ip_s:
            return None
        return SharedGate(self.min_delay_per_ip_s, self.max_concurrency_per_ip)

    def domain_gate(self) -> SharedGate | None:
        """A new gate for one registered domain's hosts with `politeness.key: domain` (None with `host`)."""
        if self.key != "domain":
            return None
        return SharedGate(self.min_delay_s, self.max_concurrency_per_host)

    def limit(self, gate: HostGate, floor_delay_s: float | None, host_max_concurrency: int | None) -> None:
        """Apply a host's limits from its fetch list row to its gate (new, or kept from an earlier segment): the
        row's delay is a floor on the minimum delay, and a per-host concurrency (when set) caps the configured
        one. Only ever stricter than the settings."""
        gate.min_delay_s = max(self.min_delay_s, floor_delay_s or 0.0)
        cap = self.max_concurrency_per_host
        if host_max_concurrency:
            cap = max(1, min(cap, host_max_concurrency))
        gate.concurrency_cap = cap
        gate.max_concurrency = cap if gate.backoff_s == 0.0 else min(gate.max_concurrency, cap)
        if gate.last_end_at is not None:  # a kept gate: a higher floor already holds after the last request
            gate.next_allowed_at = max(gate.next_allowed_at, gate.last_end_at + gate.delay_s())

    def host_backoff(self, previous: HostBackoff, failed: int, answered: int, failed_at: datetime | None,
                     retry_after_s: float | None, seed: str) -> HostBackoff:
        """A host's backoff after a segment. `failed`: its transient failures (network errors, 429, 5xx, and an
        unreachable robots.txt), the last at `failed_at`; `answered`: the answers that were no failure (pages and
        robots.txt). Each segment with failures raises the level and keeps the host out of generate for
        Retry-After (or base * 2^(level-1) with seeded jitter, so a re-run agrees), capped; a segment with answers
        and no failure resets the level. Any answer ends a failing streak; a segment of failures alone starts one
        (or continues it)."""
        if failed > 0 and failed_at is not None:
            level = previous.level + 1
            wait = backoff_seconds(level, self.backoff_base_s, self.max_backoff_s, retry_after_s, random.Random(seed))
            return HostBackoff(level, failed_at + timedelta(seconds=wait),
                               None if answered > 0 else previous.failing_since or failed_at)
        if answered > 0:
            return HostBackoff(0, previous.until, None)
        return previous

    def is_dead(self, failing_since: datetime | None, now: datetime) -> bool:
        """A host whose segments have met nothing but failures for `dead_after_days`."""
        return failing_since is not None and now - failing_since >= timedelta(days=self.dead_after_days)

    def is_dead_sql(self, failing_since: str, now: str) -> str:
        """`is_dead` over a `hosts.failing_since` column and a timestamp expression for now."""
        span_us = round(self.dead_after_days * 86400 * 1_000_000)
        return (f"coalesce(unix_micros({now}) - unix_micros({failing_since}) >= {span_us}L, false)")

    def host_state(self, robots_state: str | None, backoff_until: datetime | None, failing_since: datetime | None,
                   now: datetime) -> str:
        """A host's state across segments from its `hosts` row: dead (`is_dead`: generate gives it a probe URL
        per segment at most), else backing off while its backoff lasts (generate leaves it out), else
        robots_unreachable while its last robots.txt fetch found none (the daemon allows nothing), else ok."""
        if self.is_dead(failing_since, now):
            return HostState.DEAD.value
        if is_backing_off(backoff_until, now):
            return HostState.BACKING_OFF.value
        if robots_state == RobotsState.DISALLOW_ALL.value:
            return HostState.ROBOTS_UNREACHABLE.value
        return HostState.OK.value

    def host_state_sql(self, robots_state: str, backoff_until: str, failing_since: str, now: str) -> str:
        """`host_state` over the `hosts` columns and a timestamp expression for now."""
        return (f"(case when {self.is_dead_sql(failing_since, now)} then '{HostState.DEAD.value}'"
                f" when {is_backing_off_sql(backoff_until, now)} then '{HostState.BACKING_OFF.value}'"
                f" when {robots_state} = '{RobotsState.DISALLOW_ALL.value}'"
                f" then '{HostState.ROBOTS_UNREACHABLE.value}' else '{HostState.OK.value}' end)")


@dataclass
class SharedGate:
    """A gate many hosts of one process share: at most `max_concurrency` requests in flight (0: no cap) and starts
    `min_delay_s` apart, each also `min_delay_s` after the end of the last one, across every host it holds. Two
    uses: an IP address's per-IP guard (every host name that resolved to it: many names on one shared server get one
    allowance, not one each; per process, since hosts of one address can sit in buckets of different daemons, so a
    fleet of N processes may send up to N times this), and a registered domain's gate with `politeness.key: domain`
    (all its hosts; one daemon owns them, since buckets are then keyed by the domain)."""

    min_delay_s: float
    max_concurrency: int
    in_flight: int = 0
    next_allowed_at: float = 0.0

    def full(self) -> bool:
        return bool(self.max_concurrency) and self.in_flight >= self.max_concurrency

    def can_start(self, now: float) -> bool:
        return not self.full() and now >= self.next_allowed_at

    def started(self, now: float) -> None:
        self.in_flight += 1
        self.next_allowed_at = max(self.next_allowed_at, now + self.min_delay_s)

    def released(self, count: int, now: float) -> None:
        """`count` requests to the address ended (or were abandoned) at `now`."""
        self.in_flight = max(0, self.in_flight - count)
        self.next_allowed_at = max(self.next_allowed_at, now + self.min_delay_s)


@dataclass
class SendAudit:
    """A second opinion on a host's gate, from its requests as they were sent and ended (`fetchd_politeness_
    violations_total`): a request sent while the host's concurrency was already taken, or sooner than the host's
    delay floor after the end of its last request, is a violation. The floor is what the rules owe the host
    whatever else happens (`HostGate.floor_delay_s`; backoff and response-time terms only add to it), and a send
    is never earlier than the gate's start (a request may wait for a global slot after it), so a violation is a bug
    in the gates or in their use, never a rule decided differently. Starts are not judged against each other: with
    several requests allowed in flight, one that waited for a slot may be sent close behind the next. Per process,
    on its clock: a live signal for operators; the tests judge politeness from the servers' logs."""

    in_flight: int = 0
    last_end_at: float | None = None

    def sent(self, now: float, floor_s: float, max_concurrency: int) -> str | None:
        """A request to the host is sent now: why that is too soon, or None."""
        self.in_flight += 1
        if self.in_flight > max_concurrency:
            return f"{self.in_flight} requests in flight, at most {max_concurrency} allowed"
        if self.last_end_at is not None and now - self.last_end_at < floor_s - AUDIT_SLACK_S:
            return f"sent {now - self.last_end_at:.3f}s after the last request ended, the delay is {floor_s:g}s"
        return None

    def ended(self, now: float) -> None:
        """A request sent to the host ended (answered, failed or cancelled) now."""
        self.in_flight = max(0, self.in_flight - 1)
        self.last_end_at = now if self.last_end_at is None else max(self.last_end_at, now)


@dataclass
class HostGate:
    """Politeness state of one host inside one daemon: when it may start its next request.

    `max_concurrency` is the host's allowance now: 1 while a backoff is in force, the configured
    `concurrency_cap` again once it is over (schedulers read it, so it always holds what `can_start` uses)."""

    min_delay_s: float
    max_crawl_delay_s: float
    max_concurrency: int
    backoff_base_s: float
    max_backoff_s: float
    max_failures: int
    recovery_factor: float = 0.5        # each success multiplies the backoff by this (0: a success ends it)
    response_time_factor: float = 0.0   # k in the k x response time delay term (0: off)
    max_response_time_delay_s: float = 60.0
    crawl_delay_s: float | None = None
    backoff_s: float = 0.0
    response_delay_s: float = 0.0
    failures: int = 0
    in_flight: int = 0
    next_allowed_at: float = 0.0
    hold_until: float = 0.0             # a server's Retry-After: nothing starts before it, whatever ends later
    last_start_at: float | None = None
    last_end_at: float | None = None
    paused: bool = False
    concurrency_cap: int = 0            # the configured concurrency (defaults to max_concurrency)
    address: SharedGate | None = None   # the per-IP guard of the address the host resolved to (None: off)
    domain: SharedGate | None = None    # the gate of the host's registered domain (politeness.key: domain)
    sends: SendAudit = field(default_factory=SendAudit)  # the requests as sent, judged against the floor

    def __post_init__(self) -> None:
        self.concurrency_cap = self.concurrency_cap or self.max_concurrency

    def floor_delay_s(self) -> float:
        """The least delay the host is owed after a request ends, whatever backoff or response times add."""
        return effective_delay(self.min_delay_s, self.crawl_delay_s, self.max_crawl_delay_s, 0.0)

    def _delay_without_backoff(self) -> float:
        return effective_delay(self.min_delay_s, self.crawl_delay_s, self.max_crawl_delay_s, 0.0,
                               self.response_delay_s)

    def delay_s(self) -> float:
        return max(self._delay_without_backoff(), self.backoff_s)

    def shared(self) -> tuple[SharedGate, ...]:
        """The gates the host shares with other hosts: its domain's and its address's (those in force). Asked
        several times per request; most hosts share none."""
        if self.domain is None and self.address is None:
            return ()
        return tuple(g for g in (self.domain, self.address) if g is not None)

    def can_start(self, now: float) -> bool:
        if self.paused or self.in_flight >= self.max_concurrency or now < self.next_allowed_at:
            return False
        return all(g.can_start(now) for g in self.shared())

    def full(self) -> bool:
        """No request may start before one in flight ends: the host's, its domain's or its address's concurrency is
        taken."""
        return self.in_flight >= self.max_concurrency or any(g.full() for g in self.shared())

    def opens_at(self) -> float:
        """The earliest time a request may start, as far as delays go (the host's, its domain's, its address's)."""
        return max([self.next_allowed_at, *(g.next_allowed_at for g in self.shared())])

    def bind_address(self, address: SharedGate | None) -> None:
        """Put the host under the per-IP guard of the address it resolved to (or none). A host with requests in
        flight keeps its address until they end: each one is released where it was counted."""
        if self.in_flight == 0:
            self.address = address

    def started(self, now: float) -> None:
        """A request to the host starts now; the next start is at least one delay later."""
        if not self.can_start(now):
            raise RuntimeError("request started against the host's politeness gate")
        self.in_flight += 1
        self.last_start_at = now
        self.next_allowed_at = max(self.next_allowed_at, now + self.delay_s())
        for shared in self.shared():
            shared.started(now)

    def abandoned(self, now: float, requests: int | None = None) -> None:
        """Requests counted in flight were cancelled and will never call `finished`: release `requests` of them, or
        all (a bucket run that stopped, none of whose requests is still running), holding the host for one delay
        from now, since the server may have seen them."""
        count = self.in_flight if requests is None else min(requests, self.in_flight)
        if count:
            for shared in self.shared():
                shared.released(count, now)
            self.in_flight -= count
            self.next_allowed_at = max(self.next_allowed_at, now + self.delay_s())

    def finished(self, now: float, status_code: int | None, retry_after_s: float | None, rng: random.Random,
                 elapsed_s: float | None = None) -> None:
        """A request ended (response read or failure) at `now` after `elapsed_s`: update the response-time
        term and backoff, maybe pause, and hold the host for one delay (as it now stands) counted from now,
        or from a later start still in flight."""
        self.in_flight -= 1
        for shared in self.shared():
            shared.released(1, now)
        self.response_delay_s = response_time_delay(elapsed_s, self.response_time_factor,
                                                    self.max_response_time_delay_s)
        if is_transient_status(status_code):
            self.failures += 1
            directed = retry_after_s if status_code in THROTTLE_STATUSES else None
            fresh = backoff_seconds(self.failures, self.backoff_base_s, self.max_backoff_s, directed, rng)
            if directed is not None:
                self.hold_until = max(self.hold_until, now + fresh)
            self.backoff_s = max(self.backoff_s, fresh)  # a failure while recovering never shortens the backoff
            self.max_concurrency = 1
            if self.failures >= self.max_failures:
                self.paused = True
        else:
            self.failures = 0
            self._recover()
        self.last_end_at = now
        self.next_allowed_at = max(max(now, self.last_start_at or now) + self.delay_s(), self.hold_until)

    def _recover(self) -> None:
        """A success shrinks the backoff by `recovery_factor`; once it no longer adds to the delay it is over
        and the host gets its configured concurrency back."""
        self.backoff_s *= self.recovery_factor
        if self.backoff_s <= max(self._delay_without_backoff(), NEGLIGIBLE_BACKOFF_S):
            self.backoff_s = 0.0
            self.max_concurrency = self.concurrency_cap

    def set_crawl_delay(self, crawl_delay_s: float | None) -> bool:
        """Adopt a robots.txt Crawl-delay; it already applies to the gap after the request that fetched it.
        True when it asks for more than `max_crawl_delay_s` and differs from the one held before, so the caller
        reports the cap once per host (not again for the same cached robots.txt)."""
        newly_capped = (crawl_delay_s is not None and crawl_delay_s > self.max_crawl_delay_s
                        and crawl_delay_s != self.crawl_delay_s)
        self.crawl_delay_s = crawl_delay_s
        if self.last_end_at is not None:
            self.next_allowed_at = max(self.next_allowed_at, self.last_end_at + self.delay_s())
        return newly_capped

    def ended_elsewhere(self, at: float, crawl_delay_known: bool = True) -> None:
        """Another process's request to the host ended at `at` (at the latest): the previous owner of its
        bucket. The delay counts from there too, as if this gate had seen that request. When this process does
        not know the host's robots.txt yet (`crawl_delay_known` False), the previous owner may have been obeying
        any Crawl-delay up to `max_crawl_delay_s`, and the next request here is the robots.txt fetch that would
        tell: it waits as if the host asked for the cap."""
        self.last_end_at = at if self.last_end_at is None else max(self.last_end_at, at)
        owed = self.delay_s()
        if not crawl_delay_known:
            owed = max(owed, effective_delay(self.min_delay_s, self.max_crawl_delay_s, self.max_crawl_delay_s, 0.0))
        self.next_allowed_at = max(self.next_allowed_at, at + owed)
        if self.domain is not None:  # the previous owner held the whole domain (its bucket is keyed by it)
            self.domain.next_allowed_at = max(self.domain.next_allowed_at, at + self.domain.min_delay_s)
