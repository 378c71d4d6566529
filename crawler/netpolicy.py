"""SSRF guard rule: which resolved addresses the daemon may connect to. Pure: no network.

The daemon refuses every address that is not globally routable — loopback, RFC 1918 private, link-local
(including the 169.254.169.254 cloud metadata endpoint), CGNAT 100.64/10, multicast, reserved, unspecified,
IPv6 unique-local and link-local — and judges IPv4-mapped/compatible IPv6 forms by their IPv4 address.
Only an explicit allow-list (`fetch.allow_networks`) admits such an address, e.g. 127.0.0.0/8 in tests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """The allow-list as network objects (host bits tolerated, as in `10.0.0.1/8`)."""
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address hidden in an IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64
    (64:ff9b::a.b.c.d) or 6to4 (2002::/16) IPv6 address — each reaches that IPv4 host."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = int(address)
    if address in _NAT64:
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if packed >> 32 == 0 and packed > 1:  # deprecated IPv4-compatible form (not :: or ::1)
        return ipaddress.IPv4Address(packed)
    return None


def is_public(address: IPAddress) -> bool:
    """True for a globally routable unicast address; anything special-purpose is not public."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            return False
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public(embedded)
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return False
    return address.is_global and not (
        address.is_multicast
        or address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_unspecified
    )


def address_allowed(ip: str, allow_networks: Iterable[IPNetwork]) -> bool:
    """Whether the daemon may connect to `ip`: public, or inside an allow-listed network. Unparseable -> no."""
    if "%" in ip:
        return False  # a zone-scoped address is link-local by definition
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            candidates.append(embedded)
    for network in allow_networks:
        if any(c.version == network.version and c in network for c in candidates):
            return True
    return is_public(address)


def ip_literal(host: str) -> str | None:
    """The address if `host` (as in a URL, IPv6 possibly bracketed) is an IP literal, else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None
