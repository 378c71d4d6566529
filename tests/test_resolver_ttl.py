"""The resolver's DNS cache: answers kept for their records' TTL within `fetch.dns_min_ttl_s`..`fetch.dns_max_ttl_s`,
negative answers `fetch.dns_negative_ttl_s`, the SSRF guard applied to cached answers, the static map first.

A UDP DNS server on 127.0.0.1 (built with dnspython, in the test's own event loop) answers with the TTLs each test
chooses and counts the queries; time moves on a virtual clock, so no test sleeps. No packet leaves loopback: the
resolver is pointed at that server, never at the system's.
"""

from __future__ import annotations

import asyncio
import socket
import typing
from collections.abc import Awaitable, Callable

import dns.asyncresolver
import dns.message
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset
import pytest

from crawler import config
from fetchd.resolver import BlockedAddressError, DnsCacheRule, GuardedResolver

pytestmark = pytest.mark.timeout(30)

RULE = DnsCacheRule(min_s=30, max_s=3600, negative_s=60)
ALLOW = ["127.0.0.0/8"]
SERVED = "127.0.0.5"


class VirtualClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class DnsServer(asyncio.DatagramProtocol):
    """Answers A queries for `records` (name -> (address, TTL)) and AAAA with no record; NXDOMAIN for other names,
    SERVFAIL for the names in `failing`. `queries` lists every (name, type) asked."""

    def __init__(self, records: dict[str, tuple[str, int]], failing: frozenset[str] = frozenset()):
        self.records = records
        self.failing = failing
        self.queries: list[tuple[str, str]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        query = dns.message.from_wire(data)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        self.queries.append((name, dns.rdatatype.to_text(question.rdtype)))
        response = dns.message.make_response(query)
        if name in self.failing:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            address, ttl = self.records[name]
            response.answer.append(dns.rrset.from_text(question.name, ttl, "IN", "A", address))
        assert self.transport is not None
        self.transport.sendto(response.to_wire(), addr)


Scenario = Callable[[GuardedResolver, DnsServer, VirtualClock], Awaitable[None]]


def run(scenario: Scenario, records: dict[str, tuple[str, int]], *, static_hosts: dict[str, str] | None = None,
        failing: frozenset[str] = frozenset()) -> None:
    """`scenario` against a resolver on a fresh loopback DNS server, within 10 s."""

    async def main() -> None:
        server = DnsServer(records, failing)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: server, local_addr=("127.0.0.1", 0))
        try:
            clock = VirtualClock()
            resolver = GuardedResolver(static_hosts or {}, ALLOW, cache_rule=RULE, clock=clock,
                                       nameservers=[("127.0.0.1", transport.get_extra_info("sockname")[1])])
            await scenario(resolver, server, clock)
        finally:
            transport.close()

    asyncio.run(asyncio.wait_for(main(), 10))


async def _addresses(resolver: GuardedResolver, host: str) -> list[str]:
    return [answer["host"] for answer in await resolver.resolve(host, 80, socket.AF_INET)]


@pytest.mark.parametrize(("ttl", "held"), [(120, 120), (5, RULE.min_s), (86400, RULE.max_s)],
                         ids=["within-bounds", "below-min", "above-max"])
def test_answer_is_kept_for_its_ttl_clamped_to_the_bounds(ttl, held):
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        assert await _addresses(resolver, "site.test") == [SERVED]
        assert len(server.queries) == 1
        clock.now += held - 1
        assert await _addresses(resolver, "site.test") == [SERVED]
        assert len(server.queries) == 1, "asked again within the time the answer is held"
        clock.now += 2
        assert await _addresses(resolver, "site.test") == [SERVED]
        assert server.queries == [("site.test", "A")] * 2, "not asked again once the answer expired"

    run(scenario, {"site.test": (SERVED, ttl)})


def test_refused_address_is_refused_from_the_cache_too():
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        for _ in range(2):
            with pytest.raises(BlockedAddressError, match="refused address for private.test: 10.0.0.1"):
                await resolver.resolve("private.test", 80, socket.AF_INET)
        with pytest.raises(BlockedAddressError):
            await resolver.check_host("private.test")
        assert server.queries.count(("private.test", "A")) == 1

    run(scenario, {"private.test": ("10.0.0.1", 300)})


def test_static_map_answers_first_and_is_never_cached():
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        assert await _addresses(resolver, "Edge.Test.") == ["127.0.0.9"]
        assert await resolver.check_host("edge.test") == "127.0.0.9"
        assert server.queries == []

    run(scenario, {"edge.test": (SERVED, 300)}, static_hosts={"edge.test": "127.0.0.9"})


def test_check_host_asks_a_and_aaaa_once_each_while_held():
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        assert await resolver.check_host("site.test") == SERVED
        assert await resolver.check_host("site.test") == SERVED
        assert await _addresses(resolver, "site.test") == [SERVED]  # the A entry serves AF_INET too
        assert sorted(server.queries) == [("site.test", "A"), ("site.test", "AAAA")]

    run(scenario, {"site.test": (SERVED, 300)})


def test_name_without_address_is_kept_for_the_negative_ttl():
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        for _ in range(2):
            with pytest.raises(OSError, match="missing.test has no address") as info:
                await resolver.resolve("missing.test", 80, socket.AF_INET)
            assert not isinstance(info.value, BlockedAddressError)
        assert len(server.queries) == 1
        clock.now += RULE.negative_s + 1
        with pytest.raises(OSError):
            await resolver.resolve("missing.test", 80, socket.AF_INET)
        assert len(server.queries) == 2

    run(scenario, {})


def test_failed_lookup_is_not_cached():
    async def scenario(resolver: GuardedResolver, server: DnsServer, clock: VirtualClock) -> None:
        for _ in range(2):
            with pytest.raises(OSError, match="cannot resolve broken.test") as info:
                await resolver.resolve("broken.test", 80, socket.AF_INET)
            assert not isinstance(info.value, BlockedAddressError)
        assert len(server.queries) == 2

    run(scenario, {}, failing=frozenset({"broken.test"}))


def test_without_a_dns_server_the_system_resolver_answers_held_for_the_min(monkeypatch):
    def no_configuration(*args, **kwargs):
        raise dns.resolver.NoResolverConfiguration("no nameservers")

    monkeypatch.setattr(dns.asyncresolver, "Resolver", no_configuration)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        asked: list[str] = []
        getaddrinfo = loop.getaddrinfo

        async def counting(host, *args, **kwargs):
            asked.append(host)
            return await getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(loop, "getaddrinfo", counting)
        clock = VirtualClock()
        resolver = GuardedResolver({}, ALLOW, cache_rule=RULE, clock=clock)
        # A numeric name: getaddrinfo answers it without any lookup, so nothing leaves the machine.
        assert await _addresses(resolver, SERVED) == [SERVED]
        clock.now += RULE.min_s - 1
        assert await _addresses(resolver, SERVED) == [SERVED]
        assert asked == [SERVED]
        clock.now += 2
        assert await _addresses(resolver, SERVED) == [SERVED]
        assert asked == [SERVED] * 2

    asyncio.run(asyncio.wait_for(main(), 10))


def test_rule_reads_the_config_keys(base_conf):
    conf = base_conf.with_overrides({"fetch.dns_min_ttl_s": 5, "fetch.dns_max_ttl_s": 50,
                                     "fetch.dns_negative_ttl_s": 0})
    assert DnsCacheRule.from_config(conf) == DnsCacheRule(5, 50, 0)


def test_old_key_is_refused_naming_its_replacement(base_conf, tmp_path):
    file = tmp_path / "old.yaml"
    file.write_text("fetch:\n  dns_cache_ttl_s: 300\n")
    attempts = [lambda: base_conf.with_overrides({"fetch.dns_cache_ttl_s": 0}),
                lambda: config.load(assignments=["fetch.dns_cache_ttl_s=0"]),
                lambda: config.load(file)]
    for attempt in attempts:
        with pytest.raises(config.ConfigError, match="fetch.dns_min_ttl_s and fetch.dns_max_ttl_s") as info:
            attempt()
        assert info.value.key == "fetch.dns_cache_ttl_s"


@pytest.mark.parametrize(("assignments", "key"), [
    (["fetch.dns_min_ttl_s=600", "fetch.dns_max_ttl_s=60"], "fetch.dns_min_ttl_s"),
    (["fetch.dns_max_ttl_s=-1"], "fetch.dns_max_ttl_s"),
    (["fetch.dns_negative_ttl_s=-5"], "fetch.dns_negative_ttl_s"),
])
def test_bad_bounds_are_refused_naming_the_key(assignments, key):
    with pytest.raises(config.ConfigError) as info:
        config.load(assignments=assignments)
    assert info.value.key == key
