"""Readying a host before its first URL, and what a daemon remembers about hosts.

When a bucket run meets a host it takes over what earlier owners and runs left: the previous owner's last request
delays the first one, and a robots.txt an earlier run of the bucket published is reused while in force. Before the
host's first URL its address passes the SSRF guard and its robots.txt is fetched (through the same gate as its
pages, `fetchd.exchange`; a redirect to another host goes through that host's gate, and only where this daemon
owns that host's bucket: RFC 9309 asks crawlers to follow robots.txt redirects, and politeness asks that one
daemon alone sends a host requests, so a redirect into a bucket another daemon holds is not followed and the
robots.txt counts as unreachable this time), recorded as a robots row and applied (policy, Crawl-delay); how long
an answer holds, and which copy is in force while robots.txt is unreachable, is `crawler.robots.remember`. Gates
and the robots cache outlive a bucket run: they are the host memory of the thread that runs the daemons. A daemon
that restarts forgets them, but the last good copy is stored (`hosts`) and handed over in the fetch list, so an
outage across a restart keeps the rules in force (`crawler.robots.adopt`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from crawler import urls
from crawler.politeness import HostGate, SharedGate
from crawler.robots import (
    ROBOTS_PATH,
    CachedRobots,
    RobotsPolicy,
    adopt,
    is_unreachable,
    policy_for_status,
    remember,
)
from crawler.scheduling import HostWork
from fetchd.exchange import Exchange, utc
from fetchd.fetcher import FetchResponse
from fetchd.metrics import host_class
from fetchd.output import BucketOutput
from fetchd.resolver import BlockedAddressError
from fetchd.services import DaemonServices
from fetchd.warc import WrittenRecord

log = logging.getLogger("fetchd")


@dataclass
class HostMemory:
    """What a daemon process remembers about hosts between segments: politeness gates (so a new segment's
    first request still waits out the delay after the previous segment's last) and the robots cache."""

    gates: dict[str, HostGate] = field(default_factory=dict)
    robots: dict[str, CachedRobots] = field(default_factory=dict)  # on the monotonic clock
    addresses: dict[str, SharedGate] = field(default_factory=dict)  # the per-IP guard's gates, by IP address
    domains: dict[str, SharedGate] = field(default_factory=dict)  # politeness.key domain: gates by registered domain


class _ThreadMemory(threading.local):
    """One `HostMemory` per thread that runs daemons: `fetch_segment` called once per cycle in a process's thread
    keeps the same memory. Two threads never share one: each runs its own daemons, and a host has one owner (a
    process runs its daemons in one thread; a test session may crawl unrelated farms in two)."""

    def __init__(self) -> None:
        self.memory = HostMemory()


_THREAD_MEMORY = _ThreadMemory()


def thread_memory() -> HostMemory:
    """This thread's host memory, for the daemons it runs."""
    return _THREAD_MEMORY.memory


def forget_hosts() -> None:
    """Drop this thread's host memory (gates, robots cache). For a thread that runs crawls of unrelated sites one
    after another, e.g. a test session's, where a new server can get the host:port an earlier one had."""
    _THREAD_MEMORY.memory = HostMemory()


class HostPreparer:
    """Readies the hosts of one bucket run. From the daemon's `services`: its robots cache (host memory), whether it
    may send a host outside the bucket a request (`owned.owns_host`) and the per-IP guard's gate of an address
    (`gates.address_gate_for`; None while the guard is off). Of the bucket: `previous_robots`, the robots rows
    earlier runs of the bucket published (host_key -> row, taken as each host first appears), and `previous_end`,
    the wall time the bucket's previous owner's last request ended, at the latest."""

    def __init__(self, services: DaemonServices, *, exchange: Exchange, out: BucketOutput,
                 previous_robots: dict[str, dict[str, Any]], previous_end: float | None):
        self.conf = services.conf
        self.clock = services.clock
        self.resolver = services.resolver
        self.robots_cache = services.robots_cache
        self.cache_rules = services.robots_cache_rules
        self.owns_host = services.owned.owns_host
        self.address_gate_for = services.gates.address_gate_for
        self.exchange = exchange
        self.out = out
        self.previous_robots = previous_robots
        self.previous_end = previous_end

    def take_over(self, host: HostWork, handed_over: dict[str, Any] | None = None) -> None:
        """Carry politeness and robots.txt across owners, runs and restarts, for a host this run just met: its next
        request waits one delay after the previous owner's last possible request end, and the robots.txt an earlier
        run of this bucket published or the stored copy generate `handed_over` on the host's first fetch-list row
        (`hosts`: in force, else its last good copy) is adopted (`crawler.robots.adopt`): reused while in force, so
        neither a resumed bucket nor a new owner fetches it again, and kept as the last good copy after, so an
        outage across a restart keeps its rules in force as long as RFC 9309 allows."""
        wall_now, mono_now = self.clock.wall(), self.clock.monotonic()
        for row in (self.previous_robots.pop(host.host_key, None), handed_over):
            if row is None or row["fetched_at"] is None or is_unreachable(row["status_code"]):
                continue
            stored = policy_for_status(row["status_code"], row["body"], self.conf.crawl.robots_token,
                                       self.conf.robots.max_bytes)
            until = row["expires_at"] or row["fetched_at"]
            adopted = adopt(self.robots_cache.get(host.host_key), stored,
                            mono_now - (wall_now - row["fetched_at"].timestamp()),
                            mono_now + until.timestamp() - wall_now, mono_now, self.cache_rules)
            if adopted is not None:
                self.robots_cache[host.host_key] = adopted
        if self.previous_end is not None:
            cached = self.robots_cache.get(host.host_key)
            host.gate.ended_elsewhere(mono_now + self.previous_end - wall_now,
                                      crawl_delay_known=cached is not None and cached.expires > mono_now)

    async def prepare(self, host: HostWork) -> None:
        """Check the host's address, then learn its robots policy (cached, or fetched) and apply its Crawl-delay:
        sets `blocked` or `policy` on the host."""
        started = self.clock.monotonic()
        try:
            address = await self.resolver.check_host(host.hostname)
            self.exchange.metrics.resolve_seconds.observe(self.clock.monotonic() - started)
        except BlockedAddressError as exc:
            log.warning("blocked %s: %s", host.host_key, exc)
            host.blocked = str(exc)
            return
        except OSError as exc:  # name does not resolve: robots unreachable -> nothing this segment
            log.warning("cannot resolve %s: %s", host.host_key, exc)
            self._robots_row(host.host_key, None, None, RobotsPolicy.disallow_all(), None, f"resolve: {exc}")
            host.policy = RobotsPolicy.disallow_all()
            return
        host.gate.bind_address(self.address_gate_for(address))  # before robots.txt: that request counts too
        cached = self.robots_cache.get(host.host_key)
        if cached is not None and cached.expires > self.clock.monotonic():
            host.policy = cached.policy
        else:
            host.policy = await self._fetch_robots(host)
        if host.gate.set_crawl_delay(host.policy.crawl_delay_s):
            log.warning("robots.txt of %s asks for Crawl-delay %ss; applying the cap politeness.max_crawl_delay_s=%ss",
                        host.host_key, host.policy.crawl_delay_s, host.gate.max_crawl_delay_s)

    async def _fetch_robots(self, host: HostWork) -> RobotsPolicy:
        """GET /robots.txt through the politeness gate of every host on the way, following redirects (to another
        host only where this daemon owns it: `owns_host`)."""
        token, max_bytes = self.conf.crawl.robots_token, self.conf.robots.max_bytes
        url = host.host_key + ROBOTS_PATH
        response: FetchResponse | None = None
        location: tuple[str, WrittenRecord] | None = None
        not_followed: str | None = None
        for hop in range(self.conf.robots.max_redirects + 1):
            response = await self.exchange.gated_get(url, host_class(host.listed), max_bytes)
            location = await self.exchange.write_exchange(response) if response.status is not None else None
            target = response.header("Location") if response.status and 300 <= response.status < 400 else None
            if target is None or hop == self.conf.robots.max_redirects:
                break
            next_url = urls.resolve(url, target)
            if next_url is None:
                break
            next_host = urls.host_key(next_url)
            if next_host != urls.host_key(url) and not self.owns_host(next_host):
                not_followed = (f"robots.txt redirects to {next_host}, whose bucket another daemon owns: not "
                                f"followed (that daemon alone sends the host requests); unreachable this time")
                log.warning("%s: %s", host.host_key, not_followed)
                break
            url = next_url
        assert response is not None
        if response.blocked and urls.host_key(url) == host.host_key:
            host.blocked = response.error  # the name now resolves to a refused address: nothing goes to this host
        answered = response.status is not None and not_followed is None
        body = response.decoded_body(max_bytes).decode("utf-8", "replace") if answered else None
        status = None if response.blocked or not answered else response.status
        policy = policy_for_status(status, body, token, max_bytes)
        now = self.clock.monotonic()
        entry = remember(self.robots_cache.get(host.host_key), policy, status, now, self.cache_rules)
        self.robots_cache[host.host_key] = entry
        error = not_followed or response.error
        if entry.good is not None and entry.unreachable:
            kept = f"unreachable: the copy fetched {(now - entry.good_at) / 3600:.1f} h ago stays in force"
            error = f"{error}; {kept}" if error else kept
        self._robots_row(host.host_key, status, body, policy, location, error)
        return entry.policy

    def _robots_row(self, host_key: str, status: int | None, body: str | None, policy: RobotsPolicy,
                    location: tuple[str, WrittenRecord] | None, error: str | None) -> None:
        now = self.clock.wall()
        self.out.add("robots", {
            "segment_id": self.out.segment_id,
            "bucket": self.out.bucket,
            "host_key": host_key,
            "fetched_at": utc(now),
            "status_code": status,
            "state": policy.state.value,
            "body": body,
            "crawl_delay_s": policy.crawl_delay_s,
            "expires_at": utc(now) + timedelta(seconds=self.conf.robots.cache_ttl_s),
            "warc_filename": location[0] if location else None,
            "warc_offset": location[1].offset if location else None,
            "warc_length": location[1].length if location else None,
            "error": error,
        }, logged=location is not None)
        self.out.after_result()
