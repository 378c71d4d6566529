"""SSRF rule (crawler/netpolicy.py): which resolved addresses the daemon may connect to."""

from __future__ import annotations

import pytest

from crawler import urls
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


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://2130706433/", "127.0.0.1"),        # decimal
        ("http://0x7f000001/", "127.0.0.1"),        # hex
        ("http://0177.0.0.1/", "127.0.0.1"),        # octal
        ("http://127.1/", "127.0.0.1"),             # short form
        ("http://0xA9.0376.43518/", "169.254.169.254"),  # mixed hex / octal / 16-bit tail
        ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1"),
        ("http://[::ffff:a9fe:a9fe]/", "::ffff:a9fe:a9fe"),  # the metadata endpoint, IPv4-mapped
        ("http://good.example@127.0.0.1/", "127.0.0.1"),     # user info: the real host is after the @
        ("http://127.0.0.1:80@good.example.@10.0.0.1/", "10.0.0.1"),
    ],
)
def test_url_literals_are_canonical_addresses_and_refused(url, address):
    canonical = urls.canonicalize(url)
    assert "@" not in canonical  # user info is dropped: nothing to be misread as the host, nothing sent
    assert ip_literal(urls.host_name(canonical)) == address
    assert not address_allowed(address, ())
    assert not address_allowed(address, parse_networks(["127.0.0.2/32"]))


def test_user_info_never_hides_the_host():
    assert urls.canonicalize("http://good.example@127.0.0.1/x") == "http://127.0.0.1/x"
    assert urls.canonicalize("https://u:p@h.test:8443/") == "https://h.test:8443/"
    assert urls.host_name(urls.canonicalize("http://127.0.0.1@good.example/")) == "good.example"
