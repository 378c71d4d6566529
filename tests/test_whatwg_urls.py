"""Link resolution against the WHATWG URL Standard's own test data, and hostile URLs.

tests/data/urltestdata.json is web-platform-tests `url/resources/urltestdata.json` (web-platform-tests/wpt at
commit 04f8022e43aeac33a2f8ca248333cb5e8571b160), unmodified. Every case is checked: a case the standard
resolves to an http(s) URL must resolve to that URL after only our documented normalizations; every other case
(a failure, or another scheme) must resolve to None.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from crawler import urls

DATA = Path(__file__).parent / "data" / "urltestdata.json"
CASES = [case for case in json.loads(DATA.read_text(encoding="utf-8")) if isinstance(case, dict)]
HTTP_CASES = [c for c in CASES if not c.get("failure") and c["protocol"] in ("http:", "https:")]

_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"


def expected_canonical(href: str) -> str:
    """The standard's href after our documented extras only: fragment and user info dropped, and in path and
    query %XX of unreserved characters decoded and other %xx hex uppercased. (Written independently of
    crawler.urls.)"""
    without_fragment = href.split("#", 1)[0]
    authority_start = without_fragment.index("//") + 2
    path_start = without_fragment.index("/", authority_start)
    head, tail = without_fragment[:path_start], without_fragment[path_start:]
    scheme, authority = head[:authority_start], head[authority_start:]
    head = scheme + authority.rpartition("@")[2]  # the serialized user info percent-encodes any "@" of its own

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return head + _PERCENT.sub(fix, tail)


def _resolve(case: dict) -> str | None:
    if case["base"] is None:  # no base: the input must be absolute on its own
        return None if urls.reject_reason(case["input"]) else urls.canonicalize(case["input"])
    return urls.resolve(case["base"], case["input"])


def test_data_is_the_whole_file():
    assert len(CASES) > 500
    assert len(HTTP_CASES) > 200


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_resolution_follows_the_standard(case):
    got = _resolve(case)
    if case.get("failure") or case["protocol"] not in ("http:", "https:"):
        assert got is None, f"{case['input']!r} against {case['base']!r} must not give a crawlable URL"
        return
    assert got == urls.canonicalize(case["href"])
    assert urls.canonicalize(case["href"]) == expected_canonical(case["href"])


def test_expectation_helper():
    assert expected_canonical("http://h/%7e%41%2f?%7E%3c#x") == "http://h/~A%2F?~%3C"
    assert expected_canonical("http://%7e:p@h/") == "http://h/"  # user info dropped


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("javascript:alert(1)", "unsupported scheme 'javascript'"),
        ("JavaScript:alert(1)", "unsupported scheme 'javascript'"),
        ("mailto:someone@example.com", "unsupported scheme 'mailto'"),
        ("data:text/html,<script>alert(1)</script>", "unsupported scheme 'data'"),
        ("data:text/html;base64,PGgxPmhpPC9oMT4=", "unsupported scheme 'data'"),
        ("ftp://example.com/file", "unsupported scheme 'ftp'"),
        ("file:///etc/passwd", "unsupported scheme 'file'"),
        ("http://example.com:99999/", "port out of range"),
        ("http://example.com:65536/", "port out of range"),
        ("https://[::1]:70000/", "port out of range"),
        ("http://example.com:4294967377/", "port out of range"),
        ("http://exa\x00mple.com/", "control characters"),
        ("http://exa\x07mple.com/", "control characters"),
        ("http://a\x7fb/", "control characters"),
        ("http://a.b.c.xn--pokxncvks/", "invalid IDNA host"),  # Punycode of mapped (not valid) code points
        ("http://xn--a.com/", "invalid IDNA host"),  # Punycode of a control character
        ("http://xn--abc.com/", "invalid IDNA host"),  # decodes to nothing non-ASCII
        ("http://xn--.com/", "invalid IDNA host"),
        ("http://\ufdd0zyx.com/", "not a valid URL"),
        ("http://\ud800/", "not a valid URL"),  # lone surrogate: not even UTF-8
        ("http://%ef%bc%85%ef%bc%94%ef%bc%91.com/", "not a valid URL"),
        ("http://256.256.256.256/", "not a valid URL"),
        ("http://", "not a valid URL"),
        ("http://exa mple.com/", "not a valid URL"),
        ("/relative/only", "not a valid URL"),
        ("not a url", "not a valid URL"),
        ("", "empty URL"),
        ("   ", "empty URL"),
        ("\t\n\r ", "empty URL"),
        ("\x00\x1f", "empty URL"),
        (None, "not a string (NoneType)"),
        (b"http://example.com/", "not a string (bytes)"),
        (42, "not a string (int)"),
        (["http://example.com/"], "not a string (list)"),
    ],
)
def test_hostile_urls_get_a_reason(url, reason):
    assert urls.reject_reason(url) == reason
    if isinstance(url, str):
        with pytest.raises(ValueError, match=re.escape(reason)):
            urls.canonicalize(url)
        resolved = urls.resolve("http://example.com/a/b", url)  # relative ones may resolve; never raise
        assert resolved is None or resolved.startswith("http://example.com/")


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/",
        "HTTPS://Example.COM:443/a?b#c",
        "  http://example.com/x  ",
        "http://example.com/a\x00b",  # a NUL in the path is percent-encoded by the standard, not rejected
        "http://xn--bcher-kva.de/",
        "http://bücher.de/",
        "http://xn--ls8h.la/",  # an emoji label is valid for the standard (UTS #46), if not for IDNA2008
        "http://a..b/",  # empty labels are allowed by the standard; DNS decides later
    ],
)
def test_acceptable_urls_have_no_reason(url):
    assert urls.reject_reason(url) is None
    urls.canonicalize(url)


def test_huge_urls_are_bounded_not_fatal():
    huge = "http://example.com/" + "a" * (1 << 20)
    started = time.monotonic()
    assert urls.reject_reason(huge) is None  # it does canonicalize
    assert urls.reject_reason(huge, max_length=2048) == "too long"
    assert urls.reject_reason("http://example.com/", max_length=2048) is None
    assert urls.reject_reason("http://" + "a" * (1 << 20) + ".com/", max_length=2048) is not None
    assert urls.resolve("http://example.com/", "/" + "b" * (1 << 20)) is not None
    assert time.monotonic() - started < 30  # generous: a hang would be the failure, not a slow machine


def test_resolve_never_raises_on_hostile_input():
    for base in ("http://example.com/a", "about:blank", "not a url", "", None):
        for href in ("javascript:void(0)", "\x00", "http://\ud800/", "//[bad", "http://h:99999/", "", None, 7):
            result = urls.resolve(base, href)
            assert result is None or result.startswith(("http://", "https://"))
