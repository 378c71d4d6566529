"""SSRF rule (crawler/netpolicy.py): which resolved addresses the daemon may connect to."""

from __future__ import annotations

import pytest

from crawler.netpolicy import address_allowed, ip_literal, parse_networks

REFUSED = [
    "127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "169.254.1.1",
    "100.64.0.1", "100.127.255.254", "224.0.0.251", "239.1.2.3", "0.0.0.0", "240.0.0.1", "255.255.255.255",
    "::1", "::", "fc00::1", "fd12:3456::1", "fe80::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "::ffff:169.254.169.254", "64:ff9b::a00:1", "2002:a00:1::1", "fe80::1%eth0", "not-an-ip", "",
]
ALLOWED = ["8.8.8.8", "93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("ip", REFUSED)
def test_special_addresses_are_refused(ip):
    assert not address_allowed(ip, ())


@pytest.mark.parametrize("ip", ALLOWED)
def test_public_addresses_are_allowed(ip):
    assert address_allowed(ip, ())


def test_allow_list_admits_only_its_networks():
    loopback = parse_networks(["127.0.0.0/8"])
    assert address_allowed("127.0.0.1", loopback)
    assert address_allowed("::ffff:127.0.0.1", loopback)  # the mapped form reaches the same host
    assert not address_allowed("10.0.0.1", loopback)
    assert not address_allowed("169.254.169.254", loopback)
    assert not address_allowed("::1", loopback)
    assert address_allowed("10.1.2.3", parse_networks(["10.1.2.0/24"]))


def test_ip_literal_hosts():
    assert ip_literal("127.0.0.1") == "127.0.0.1"
    assert ip_literal("[::1]") == "::1"
    assert ip_literal("site-001.farm.test") is None
