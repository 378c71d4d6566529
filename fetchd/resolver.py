"""SSRF-guarded name resolution for aiohttp (docs/architecture.md#no-ssrf).

`GuardedResolver` answers from `fetch.static_hosts` first, then the system resolver, and refuses every
address `crawler.netpolicy.address_allowed` rejects. The connector calls it at connect time; the daemon
also calls `check_host` before a host's first request, so a refused host is reported `blocked` without any
connection attempt. aiohttp skips resolvers for IP-literal hosts, so `check_host` judges those itself.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from crawler import netpolicy


class BlockedAddressError(OSError):
    """The host resolves only to addresses the SSRF guard refuses (an OSError so aiohttp wraps it)."""

    def __init__(self, host: str, addresses: Iterable[str]):
        self.host = host
        self.addresses = tuple(addresses)
        super().__init__(f"refused address for {host}: {', '.join(self.addresses) or 'none'}")
        self.strerror = str(self)  # aiohttp's connect error shows only this: the report then says why


class GuardedResolver(AbstractResolver):
    """Static map, then system DNS; only addresses the SSRF rule allows are returned."""

    def __init__(self, static_hosts: Mapping[str, str], allow_networks: Iterable[str]):
        self._static = {name.lower().rstrip("."): ip for name, ip in static_hosts.items()}
        self._allow = netpolicy.parse_networks(allow_networks)
        self._system = ThreadedResolver()

    def allowed(self, ip: str) -> bool:
        return netpolicy.address_allowed(ip, self._allow)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        static_ip = self._static.get(host.lower().rstrip("."))
        if static_ip is not None:
            ip_family = socket.AF_INET6 if ":" in static_ip else socket.AF_INET
            answers: list[ResolveResult] = [
                {"hostname": host, "host": static_ip, "port": port, "family": ip_family, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}
            ]
        else:
            answers = await self._system.resolve(host, port, family)
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
        await self._system.close()
