"""Canonical URLs and keys."""

from __future__ import annotations

import pytest

from crawler import urls
from crawler.bucketing import Bucketing


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("HTTP://Example.COM/", "http://example.com/"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:8080/a", "http://example.com:8080/a"),
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/%7euser/%41", "http://example.com/~user/A"),
        ("http://example.com/a%2fb%2F", "http://example.com/a%2Fb%2F"),
        ("http://example.com/?b=2&a=1&b=3", "http://example.com/?b=2&a=1&b=3"),
        ("http://example.com/?q=%7e%2a", "http://example.com/?q=~%2A"),
        ("http://bücher.de/", "http://xn--bcher-kva.de/"),
        ("  http://example.com/x  ", "http://example.com/x"),
    ],
)
def test_canonicalize(raw, canonical):
    assert urls.canonicalize(raw) == canonical
    assert urls.canonicalize(canonical) == canonical  # idempotent


@pytest.mark.parametrize(
    "bad",
    [
        "", "   ", "not a url", "ftp://example.com/", "javascript:alert(1)", "mailto:a@b.c", "http://",
        "http://exa mple.com/", "http://example.com:99999/", "data:text/html,hi", "/relative/only",
    ],
)
def test_canonicalize_rejects(bad):
    with pytest.raises(ValueError):
        urls.canonicalize(bad)


@pytest.mark.parametrize(
    ("base", "href", "expected"),
    [
        ("http://a.com/x/y", "../z", "http://a.com/z"),
        ("http://a.com/x/y", "z?q=1#f", "http://a.com/x/z?q=1"),
        ("http://a.com/x/y", "//b.com/p", "http://b.com/p"),
        ("http://a.com/x/y", "https://c.com", "https://c.com/"),
        ("http://a.com/x/y", "javascript:void(0)", None),
        ("http://a.com/x/y", "mailto:x@a.com", None),
        ("http://a.com/x/y", "http://[bad", None),
        ("http://a.com/x/y", "", "http://a.com/x/y"),
    ],
)
def test_resolve(base, href, expected):
    assert urls.resolve(base, href) == expected


def test_keys():
    url = urls.canonicalize("http://Site-1.farm.test:8080/a?b=1")
    uid = urls.url_id(url)
    assert len(uid) == 32 and int(uid, 16) >= 0
    assert urls.url_id(url) == uid  # stable
    assert urls.url_id(url + "x") != uid
    assert urls.host_key(url) == "http://site-1.farm.test:8080"
    assert urls.host_key(urls.canonicalize("https://u:p@h.com/")) == "https://h.com"
    bucket = urls.bucket_of(urls.host_key(url), 16)
    assert 0 <= bucket < 16
    assert all(urls.bucket_of(urls.host_key(url), 16) == bucket for _ in range(3))


def test_buckets_spread():
    hosts = [f"http://h{i}.test" for i in range(2000)]
    counts = [0] * 16
    for host in hosts:
        counts[urls.bucket_of(host, 16)] += 1
    assert min(counts) > 60  # roughly uniform (expected 125)


def test_in_scope():
    assert urls.in_scope("http://a.farm.test/", ["http", "https"], ["farm.test"], 100)
    assert urls.in_scope("http://farm.test/", ["http"], ["farm.test"], 100)
    assert not urls.in_scope("http://evilfarm.test/", ["http"], ["farm.test"], 100)
    assert not urls.in_scope("https://a.farm.test/", ["http"], [], 100)
    assert not urls.in_scope("http://a.test/" + "x" * 100, ["http"], [], 100)
    assert urls.in_scope("http://anything.example/", ["http"], [], 100)


STRIP = {"*.shop.test": ["sid", "utm_*"], "a.test": ["x"]}


@pytest.mark.parametrize(
    ("canonical", "stripped"),
    [
        ("http://www.shop.test/p?a=1&sid=9&utm_source=x&b=2&a=3", "http://www.shop.test/p?a=1&b=2&a=3"),
        ("http://www.shop.test/p?sid=9", "http://www.shop.test/p"),
        ("http://www.shop.test/p?SID=9&sidx=1", "http://www.shop.test/p?SID=9&sidx=1"),  # names match exactly
        ("http://shop.test/p?sid=9", "http://shop.test/p?sid=9"),  # the glob needs a subdomain
        ("http://a.test/?x&x=1&y", "http://a.test/?y"),
        ("http://b.test/?x=1", "http://b.test/?x=1"),  # no rule for this host
    ],
)
def test_strip_query_params_is_per_host_and_opt_in(canonical, stripped):
    assert urls.strip_query_params(canonical, STRIP) == stripped
    assert urls.strip_query_params(canonical, {}) == canonical


def test_scope_rewrite_applies_to_seeds_and_discoveries():
    from crawler import config
    from crawler.frontier import classify_discovery
    from crawler.scope import Scope
    from crawler.seeds import parse_seed_line
    from crawler.traps import TrapRules

    conf = config.load().with_overrides({"scope.strip_query_params": {"*.shop.test": ["sid"]}})
    scope = Scope.from_config(conf)
    assert parse_seed_line("http://www.shop.test/p?sid=1&q=2", scope).url == "http://www.shop.test/p?q=2"
    found = classify_discovery("http://WWW.shop.test/p?sid=7#f", scope, TrapRules.from_config(conf), Bucketing(4))
    assert found.keys.url == "http://www.shop.test/p" and found.keys.url_id == urls.url_id("http://www.shop.test/p")
    assert Scope.from_config(config.load()).stored_url("http://www.shop.test/p?sid=1") == "http://www.shop.test/p?sid=1"


_BASES = ["http://a.com/x/y", "https://A.com:443/d/e/f.html?q=1", "http://b%C3%BC.de/", "http://h.test:8080/"]
_HREFS = [
    "", "z", "../z", "./a/../b", "/abs?x=1&y=2", "?only", "#frag", "?#", "?", "/p?", "//Other.COM/p#f",
    "HTTPS://Upper.COM:443/P", "http://h/%7euser/%41", "/a%2fb", "/caf\u00e9", "/a b", "/q?x=caf\u00e9&y=%7e",
    "http://u:p@h.com/a", "http://@h.com/", "/x@y", "http://b\u00fccher.de/", "http://xn--bcher-kva.de/",
    "http://xn--zz.de/", "http://h.com/\t\nx", "javascript:void(0)", "mailto:a@b", "ftp://f/", "http://[::1]/",
    "http://127.0.0.1:80/", "http://h.com./", "http://h.com/a/..", "HTTP://h.com/%2e%2E/x", "/\u00a0x",
]


@pytest.mark.parametrize("base", _BASES)
def test_link_fast_path_equals_the_full_rule(base):
    """`resolve` skips `_canonical_or_reason` for links ada serialises canonically already; on links of every form
    the answer is the full rule's."""
    for href in _HREFS:
        joined = urls.ada_url.join_url(base, href)
        assert urls._canonical_of_joined(joined) == urls._canonical_or_reason(joined)[0], (base, href)
        if urls.already_canonical(joined):
            assert urls.canonicalize(joined) == joined


@pytest.mark.parametrize("raw", [
    "http://h.com/", "https://H.com:8443/a/b?x=1&y", "http://[::1]:8080/p?q", "http://[::1]/", "http://127.0.0.1:80/",
    "http://bücher.de/p q?a=%7e", "https://h.com/?", "http://u:p@h.com:81/x", "http://h.com/a/%2e%2e/b?#f",
])
def test_parts_of_a_canonical_url_agree_with_ada(raw):
    canonical = urls.canonicalize(raw)
    origin, host, path, query = urls.parts(canonical)
    assert origin == urls.host_key(canonical) and host == urls.host_name(canonical)
    assert path + ("?" + query if query else "") == urls.path_and_query(canonical)
