"""SSRF-guarded name resolution for aiohttp (docs/architecture.md#no-ssrf), with the daemon's one DNS cache.

`GuardedResolver` answers from `fetch.static_hosts` first (never cached: the map is already in memory), then
DNS, and refuses every address `crawler.netpolicy.address_allowed` rejects — on every call, so an answer served
from the cache is judged again. The connector calls it at connect time (its own DNS cache is off: this is the only
one); the daemon also calls `check_host` before a host's first request, so a refused host is reported `blocked`
without any connection attempt. aiohttp skips resolvers for IP-literal hosts, so `check_host` judges those itself.

DNS answers are kept for their records' TTL (the least TTL along a CNAME chain), held at least
`fetch.dns_min_ttl_s` and at most `fetch.dns_max_ttl_s` (`DnsCacheRule`); a name that does not exist or has no
address of the family asked is kept `fetch.dns_negative_ttl_s`; a failed lookup (timeout, SERVFAIL) is not kept.
The cache holds A and AAAA answers apart, keyed by name: AF_INET asks A, AF_INET6 AAAA, AF_UNSPEC both (A first).

TTLs need a DNS client, since getaddrinfo gives none: dnspython's asyncio resolver, with the name servers of
/etc/resolv.conf and names taken as absolute (no search domains). So /etc/hosts is not consulted: a name the
crawl must reach outside DNS goes in `fetch.static_hosts`. Where no DNS server is configured (no resolv.conf, or
no nameserver line in it) the system resolver answers (getaddrinfo, which may read /etc/hosts) without a TTL,
each answer held `fetch.dns_min_ttl_s`, a name it reports unknown `fetch.dns_negative_ttl_s`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver
from aiohttp.abc import AbstractResolver, ResolveResult

from crawler import netpolicy
from crawler.clock import SYSTEM_CLOCK, Clock
from crawler.config import Config, validated

log = logging.getLogger("fetchd")

_RECORD_TYPES = {socket.AF_INET: dns.rdatatype.A, socket.AF_INET6: dns.rdatatype.AAAA}
# Expired entries are dropped when the cache has grown to twice its size after the last sweep (at least this).
_SWEEP_FLOOR = 4096
# getaddrinfo's "this name has no address" (EAI_NODATA is glibc's, absent elsewhere): what a negative answer
# is reported as, and the errors of the system resolver that are one.
_NO_ADDRESS = getattr(socket, "EAI_NODATA", socket.EAI_NONAME)
_GAI_NEGATIVE = {socket.EAI_NONAME, _NO_ADDRESS}


class BlockedAddressError(OSError):
    """The host resolves only to addresses the SSRF guard refuses (an OSError so aiohttp wraps it)."""

    def __init__(self, host: str, addresses: Iterable[str]):
        self.host = host
        self.addresses = tuple(addresses)
        super().__init__(f"refused address for {host}: {', '.join(self.addresses) or 'none'}")
        self.strerror = str(self)  # aiohttp's connect error shows only this: the report then says why


@dataclass(frozen=True)
class DnsCacheRule:
    """How long a DNS answer is reused: its TTL clamped to [min_s, max_s], so a tiny TTL does not cost a query
    per connection and a long one does not hide a renumbered host; a name without an address: negative_s."""

    min_s: float
    max_s: float
    negative_s: float

    @classmethod
    def from_config(cls, conf: Config) -> DnsCacheRule:
        return cls(conf.fetch.dns_min_ttl_s, conf.fetch.dns_max_ttl_s, conf.fetch.dns_negative_ttl_s)

    def hold(self, ttl: float) -> float:
        """Seconds an answer whose records carry `ttl` is reused."""
        return min(max(ttl, self.min_s), self.max_s)


@dataclass(frozen=True)
class _Entry:
    addresses: tuple[str, ...]  # empty: the name has no address of this family
    expires: float              # on the resolver's monotonic clock


class GuardedResolver(AbstractResolver):
    """Static map, then DNS (cached per `DnsCacheRule`); only addresses the SSRF rule allows are returned.

    `cache_rule` None takes the defaults file's bounds; `nameservers` ((address, port) pairs) replaces the system's
    DNS configuration (tests run their own server)."""

    def __init__(self, static_hosts: Mapping[str, str], allow_networks: Iterable[str], *,
                 cache_rule: DnsCacheRule | None = None, clock: Clock = SYSTEM_CLOCK,
                 nameservers: Sequence[tuple[str, int]] | None = None):
        self._static = {name.lower().rstrip("."): ip for name, ip in static_hosts.items()}
        self._allow = netpolicy.parse_networks(allow_networks)
        self._rule = cache_rule or DnsCacheRule.from_config(validated({}))
        self._clock = clock
        self._dns = _dns_client(nameservers)
        self._cache: dict[tuple[str, socket.AddressFamily], _Entry] = {}
        self._sweep_at = _SWEEP_FLOOR

    def allowed(self, ip: str) -> bool:
        return netpolicy.address_allowed(ip, self._allow)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        name = host.lower().rstrip(".")
        static_ip = self._static.get(name)
        addresses = [static_ip] if static_ip is not None else await self._addresses(name, family)
        answers: list[ResolveResult] = [
            {"hostname": host, "host": ip, "port": port, "family": socket.AF_INET6 if ":" in ip else socket.AF_INET,
             "proto": 0, "flags": socket.AI_NUMERICHOST}
            for ip in addresses
        ]
        permitted = [answer for answer in answers if self.allowed(answer["host"])]
        if not permitted:
            raise BlockedAddressError(host, [answer["host"] for answer in answers])
        return permitted

    async def check_host(self, host: str) -> str:
        """The first permitted address of a URL host (name or IP literal); raises BlockedAddressError."""
        literal = netpolicy.ip_literal(host)
        if literal is not None:
            if not self.allowed(literal):
                raise BlockedAddressError(host, [literal])
            return literal
        return (await self.resolve(host, 0, socket.AF_UNSPEC))[0]["host"]

    async def close(self) -> None:
        """Nothing to release: the DNS client opens a socket per query."""

    async def _addresses(self, name: str, family: socket.AddressFamily) -> list[str]:
        """The name's addresses of `family` (AF_UNSPEC: IPv4 then IPv6); OSError when it has none."""
        families = (socket.AF_INET, socket.AF_INET6) if family == socket.AF_UNSPEC else (family,)
        found = await asyncio.gather(*(self._lookup(name, f) for f in families), return_exceptions=True)
        addresses = [ip for result in found if isinstance(result, tuple) for ip in result]
        if addresses:
            return addresses
        failure = next((result for result in found if isinstance(result, BaseException)), None)
        if failure is not None:
            raise failure
        raise OSError(_NO_ADDRESS, f"{name} has no address")

    async def _lookup(self, name: str, family: socket.AddressFamily) -> tuple[str, ...]:
        """One family's addresses, from the cache while the entry holds, else asked and kept per the rule."""
        now = self._clock.monotonic()
        entry = self._cache.get((name, family))
        if entry is not None and entry.expires > now:
            return entry.addresses
        addresses, hold = await (self._ask_dns(name, family) if self._dns else self._ask_system(name, family))
        if hold > 0:
            if len(self._cache) >= self._sweep_at:
                self._cache = {key: kept for key, kept in self._cache.items() if kept.expires > now}
                self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._cache))
            self._cache[(name, family)] = _Entry(addresses, now + hold)
        return addresses

    async def _ask_dns(self, name: str, family: socket.AddressFamily) -> tuple[tuple[str, ...], float]:
        """Addresses and how long to keep them; OSError (not kept) when DNS gives no answer."""
        assert self._dns is not None
        try:
            answer = await self._dns.resolve(name, _RECORD_TYPES[family], search=False, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            return (), self._rule.negative_s
        except dns.exception.DNSException as exc:
            raise OSError(socket.EAI_AGAIN, f"cannot resolve {name}: {exc}") from exc
        if answer.rrset is None:
            return (), self._rule.negative_s
        return tuple(record.address for record in answer.rrset), self._rule.hold(answer.chaining_result.minimum_ttl)

    async def _ask_system(self, name: str, family: socket.AddressFamily) -> tuple[tuple[str, ...], float]:
        """getaddrinfo, for a system without a DNS server configured: no TTL, so the answer is held the min bound."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, 0, family=family, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _GAI_NEGATIVE:
                return (), self._rule.negative_s
            raise OSError(exc.errno, f"cannot resolve {name}: {exc.strerror}") from exc
        addresses = dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos)  # in order, without duplicates
        return tuple(addresses), self._rule.min_s


def _dns_client(nameservers: Sequence[tuple[str, int]] | None) -> dns.asyncresolver.Resolver | None:
    """A DNS client on `nameservers`, else on the system's configuration; None where the system has none."""
    if nameservers is not None:
        client = dns.asyncresolver.Resolver(configure=False)
        client.nameservers = [dns.nameserver.Do53Nameserver(address, port) for address, port in nameservers]
        return client
    try:
        return dns.asyncresolver.Resolver()
    except dns.resolver.NoResolverConfiguration as exc:
        log.warning("no DNS server configured (%s): the system resolver answers, without TTLs", exc)
        return None
