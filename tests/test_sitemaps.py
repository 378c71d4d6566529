"""Sitemaps: formats, the protocol's scope and cross-submission rules, limits, and hostile input.

Every hostile payload must end in a counted reason (never an exception) and must not be read past the caps.
"""

from __future__ import annotations

import gzip
import io
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crawler import sitemaps
from crawler.sitemaps import (
    ChangeFreq,
    FoundVia,
    SitemapEntry,
    SitemapLimits,
    SitemapOrigin,
    first_schedule,
    parse_lastmod,
    parse_sitemap,
)

DATA = Path(__file__).parent / "data" / "sitemaps"
SITEMAP_URL = "https://www.example.com/blog/sitemap.xml"
PROBE = SitemapOrigin(FoundVia.PROBE)
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
UTC = UTC


def urlset(*locs: str, ns: str = NS, extra: str = "") -> bytes:
    body = "".join(f"<url><loc>{loc}</loc>{extra}</url>" for loc in locs)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {ns}>{body}</urlset>'.encode()


def one_entry(extra: str) -> tuple[SitemapEntry | None, dict[str, int]]:
    result = parse_sitemap(SITEMAP_URL, urlset("https://www.example.com/blog/p", extra=extra), PROBE)
    assert result.error is None
    return (result.entries[0] if result.entries else None), dict(result.ignored_fields)


# --- real-world-like fixtures ------------------------------------------------------------------------------

EXPECTED_BLOG = [
    SitemapEntry("https://www.example.com/blog/", datetime(2024, 5, 1, 8, 30, tzinfo=UTC), ChangeFreq.DAILY, 1.0),
    SitemapEntry("https://www.example.com/blog/first-post?ref=a&lang=en", datetime(2024, 4, 30, tzinfo=UTC),
                 ChangeFreq.WEEKLY, 0.6),
    SitemapEntry("https://www.example.com/blog/caf%C3%A9", datetime(2023, 11, 1, tzinfo=UTC), None, None),
    SitemapEntry("https://www.example.com/blog/older.html", datetime(2019, 2, 3, 4, 5, 6, 789000, tzinfo=UTC),
                 ChangeFreq.NEVER, 0.1),
]
EXPECTED_BLOG_REFUSED = {"outside sitemap scope": 2, "duplicate loc": 1, "invalid loc": 1, "missing loc": 1}


@pytest.mark.parametrize("name", ["urlset.xml", "urlset.xml.gz"])
def test_urlset_fixture(name: str) -> None:
    payload = (DATA / name).read_bytes()
    result = parse_sitemap(SITEMAP_URL, payload, PROBE)
    assert (result.kind, result.error, result.gzipped) == ("urlset", None, name.endswith(".gz"))
    assert result.entries == EXPECTED_BLOG
    assert dict(result.refused) == EXPECTED_BLOG_REFUSED
    assert result.uncompressed_bytes == len((DATA / "urlset.xml").read_bytes())


def test_gzip_is_recognised_by_magic_not_name() -> None:
    with (DATA / "urlset.xml.gz").open("rb") as stream:  # a file-like payload, served under a .xml name
        result = parse_sitemap("https://www.example.com/blog/sitemap.xml", stream, PROBE)
    assert result.gzipped and result.entries == EXPECTED_BLOG
    plain_named_gz = parse_sitemap("https://www.example.com/blog/sitemap.xml.gz",
                                   (DATA / "urlset.xml").read_bytes(), PROBE)
    assert not plain_named_gz.gzipped and plain_named_gz.entries == EXPECTED_BLOG


def test_multi_member_gzip_is_read_whole() -> None:
    data = (DATA / "urlset.xml").read_bytes()
    result = parse_sitemap(SITEMAP_URL, gzip.compress(data[:300]) + gzip.compress(data[300:]), PROBE)
    assert result.error is None and result.entries == EXPECTED_BLOG


def test_sitemap_index_fixture() -> None:
    result = parse_sitemap("https://www.example.com/sitemap_index.xml", (DATA / "index.xml").read_bytes(), PROBE)
    assert (result.kind, result.error, result.entries) == ("sitemapindex", None, [])
    assert [(child.loc, child.lastmod) for child in result.sitemaps] == [
        ("https://www.example.com/sitemaps/posts-1.xml.gz", datetime(2024, 5, 1, tzinfo=UTC)),
        ("https://www.example.com/sitemap-pages.xml", None),
    ]
    assert dict(result.refused) == {"outside sitemap scope": 1}  # a child on another site


def test_index_child_on_the_robots_host_is_allowed() -> None:
    origin = SitemapOrigin.from_robots("https://elsewhere.example.org/robots.txt")
    result = parse_sitemap("https://www.example.com/sitemap_index.xml", (DATA / "index.xml").read_bytes(), origin)
    assert len(result.sitemaps) == 3 and not result.refused


def test_nested_index_is_refused_by_depth() -> None:
    child = SitemapOrigin.from_robots("https://www.example.com/robots.txt").child()
    assert (child.via, child.robots_host_key, child.index_depth) == (FoundVia.INDEX, "https://www.example.com", 1)
    result = parse_sitemap("https://www.example.com/sitemap_index.xml", (DATA / "index.xml").read_bytes(), child)
    assert result.sitemaps == [] and dict(result.refused) == {"index too deep": 3}
    deeper = parse_sitemap("https://www.example.com/sitemap_index.xml", (DATA / "index.xml").read_bytes(), child,
                           SitemapLimits(max_index_depth=2))
    assert len(deeper.sitemaps) == 2


def test_text_sitemap_fixture() -> None:
    result = parse_sitemap("https://www.example.com/sitemap.txt", (DATA / "sitemap.txt").read_bytes(), PROBE)
    assert (result.kind, result.error) == ("text", None)
    assert [entry.loc for entry in result.entries] == [
        "https://www.example.com/a", "https://www.example.com/b", "https://www.example.com/c",
        "https://www.example.com/d",
    ]
    assert dict(result.refused) == {"invalid loc": 1, "outside sitemap scope": 1}


def test_text_sitemap_charset_from_content_type() -> None:
    payload = "https://www.example.com/caf\xe9\n".encode("latin-1")
    assert parse_sitemap("https://www.example.com/s.txt", payload, PROBE).error == "not a sitemap"  # not UTF-8
    result = parse_sitemap("https://www.example.com/s.txt", payload, PROBE, content_type="text/plain; charset=latin-1")
    assert [entry.loc for entry in result.entries] == ["https://www.example.com/caf%C3%A9"]


# --- scope and cross-submission -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("loc", "probe_ok", "robots_ok"),
    [
        ("https://www.example.com/blog/a", True, True),
        ("https://www.example.com/blog/deeper/b", True, True),
        ("https://www.example.com/blogger", False, True),          # not under /blog/
        ("https://www.example.com/", False, True),
        ("http://www.example.com/blog/a", False, False),           # other scheme
        ("https://www.example.com:8443/blog/a", False, False),     # other port
        ("https://example.com/blog/a", False, False),              # other host
        ("https://WWW.EXAMPLE.COM:443/blog/%7ea", True, True),     # canonical form decides
    ],
)
def test_location_scope_and_robots_proof(loc: str, probe_ok: bool, robots_ok: bool) -> None:
    robots = SitemapOrigin.from_robots("https://www.example.com/robots.txt")
    for origin, expected in ((PROBE, probe_ok), (SitemapOrigin(FoundVia.LINK), probe_ok), (robots, robots_ok)):
        result = parse_sitemap(SITEMAP_URL, urlset(loc), origin)
        assert bool(result.entries) is expected, (origin, loc)
        assert dict(result.refused) == ({} if expected else {"outside sitemap scope": 1})


def test_cross_submission_covers_the_robots_host_only() -> None:
    # robots.txt of shop.example.net lists a sitemap hosted on cdn.example.org
    origin = SitemapOrigin.from_robots("https://shop.example.net/robots.txt")
    payload = urlset("https://shop.example.net/item/1", "https://cdn.example.org/sitemaps/x",
                     "https://third.example.com/page", "http://shop.example.net/item/2")
    result = parse_sitemap("https://cdn.example.org/sitemaps/shop.xml", payload, origin)
    assert [entry.loc for entry in result.entries] == ["https://shop.example.net/item/1",
                                                       "https://cdn.example.org/sitemaps/x"]
    assert dict(result.refused) == {"outside sitemap scope": 2}
    # the same sitemap found by a link proves nothing about shop.example.net
    linked = parse_sitemap("https://cdn.example.org/sitemaps/shop.xml", payload, SitemapOrigin(FoundVia.LINK))
    assert [entry.loc for entry in linked.entries] == ["https://cdn.example.org/sitemaps/x"]


def test_robots_proof_is_inherited_through_an_index() -> None:
    child_origin = SitemapOrigin.from_robots("https://shop.example.net/robots.txt").child()
    result = parse_sitemap("https://cdn.example.org/s/1.xml", urlset("https://shop.example.net/p"), child_origin)
    assert [entry.loc for entry in result.entries] == ["https://shop.example.net/p"]


def test_invalid_sitemap_url() -> None:
    assert parse_sitemap("ftp://x/sitemap.xml", urlset("https://x/a"), PROBE).error == "invalid sitemap url"


# --- fields ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-02", datetime(2024, 2, 1, tzinfo=UTC)),
        ("2024-02-29", datetime(2024, 2, 29, tzinfo=UTC)),
        ("2024-02-29T23:30+01:00", datetime(2024, 2, 29, 22, 30, tzinfo=UTC)),
        ("2024-02-29T23:30:15.5-0500", datetime(2024, 3, 1, 4, 30, 15, 500000, tzinfo=UTC)),
        (" 2024-02-29T23:30:15Z ", datetime(2024, 2, 29, 23, 30, 15, tzinfo=UTC)),
        ("2024-02-29T23:30:15", datetime(2024, 2, 29, 23, 30, 15, tzinfo=UTC)),  # no zone: read as UTC
        ("2023-02-29", None), ("2024-13-01", None), ("2024-01-01T25:00Z", None), ("0000-01-01", None),
        ("yesterday", None), ("", None), ("2024-01-01T10:00+15:00", None), ("Mon, 01 Jan 2024 00:00:00 GMT", None),
        ("20240101", None), ("2024-W01", None),
    ],
)
def test_parse_lastmod(text: str, expected: datetime | None) -> None:
    parsed = parse_lastmod(text)
    assert parsed == expected
    assert parsed is None or parsed.tzinfo == UTC  # stored in UTC, not just an equal instant


@pytest.mark.parametrize(
    ("extra", "field", "value", "ignored"),
    [
        ("<priority>0.0</priority>", "priority", 0.0, {}),
        ("<priority>1</priority>", "priority", 1.0, {}),
        ("<priority>1.5</priority>", "priority", None, {"bad priority": 1}),
        ("<priority>-0.1</priority>", "priority", None, {"bad priority": 1}),
        ("<priority>nan</priority>", "priority", None, {"bad priority": 1}),
        ("<priority>0,5</priority>", "priority", None, {"bad priority": 1}),
        ("<changefreq> MONTHLY </changefreq>", "changefreq", ChangeFreq.MONTHLY, {}),
        ("<changefreq>sometimes</changefreq>", "changefreq", None, {"bad changefreq": 1}),
        ("<lastmod>2024-99-99</lastmod>", "lastmod", None, {"bad lastmod": 1}),
        ("<lastmod></lastmod>", "lastmod", None, {}),
    ],
)
def test_bad_fields_drop_the_field_not_the_entry(extra: str, field: str, value: object, ignored: dict) -> None:
    entry, ignored_fields = one_entry(extra)
    assert entry is not None and getattr(entry, field) == value and ignored_fields == ignored


# --- limits and hostile input ------------------------------------------------------------------------------

def test_too_many_urls() -> None:
    locs = [f"https://www.example.com/blog/{i}" for i in range(50_001)]
    result = parse_sitemap(SITEMAP_URL, urlset(*locs), PROBE)
    assert result.error is None
    assert len(result.entries) == 50_000 and result.entries[-1].loc == locs[49_999]
    assert dict(result.refused) == {"too many urls": 1}


def test_too_many_urls_in_a_text_sitemap_with_a_smaller_limit() -> None:
    payload = "".join(f"https://www.example.com/{i}\n" for i in range(12)).encode()
    result = parse_sitemap("https://www.example.com/s.txt", payload, PROBE, SitemapLimits(max_urls=10))
    assert len(result.entries) == 10 and dict(result.refused) == {"too many urls": 2}


def gzipped_padding(head: bytes, filler: bytes, megabytes: int, tail: bytes = b"") -> bytes:
    """A gzip member of head + `megabytes` MB of filler + tail, built without holding the filler whole."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = filler * ((1 << 20) // len(filler))
    parts = [compressor.compress(head)] + [compressor.compress(block) for _ in range(megabytes)]
    return b"".join(parts) + compressor.compress(tail) + compressor.flush()


def test_gzip_bomb_after_valid_entries_is_refused_and_keeps_them() -> None:
    head = urlset("https://www.example.com/blog/a")[: -len(b"</urlset>")]
    bomb = gzipped_padding(head, b" ", 200, b"<url><loc>https://www.example.com/blog/z</loc></url></urlset>")
    assert len(bomb) < 300_000  # 200 MB of valid XML whitespace
    result = parse_sitemap(SITEMAP_URL, bomb, PROBE)
    assert result.error == "gzip bomb"
    assert result.uncompressed_bytes == SitemapLimits().max_uncompressed_bytes  # stopped at the cap
    assert [entry.loc for entry in result.entries] == ["https://www.example.com/blog/a"]


def test_gzip_bomb_of_zeros_stops_at_the_first_bytes() -> None:
    result = parse_sitemap(SITEMAP_URL, gzipped_padding(b"", b"\x00", 200), PROBE)
    assert result.error == "not a sitemap" and result.uncompressed_bytes < 1 << 20


def test_too_large_uncompressed_plain_and_gzip() -> None:
    limits = SitemapLimits(max_uncompressed_bytes=10_000)
    head = urlset("https://www.example.com/blog/a")[: -len(b"</urlset>")]
    body = b"".join(f"<url><loc>https://www.example.com/blog/{i:06d}</loc></url>".encode() for i in range(1000))
    plain = parse_sitemap(SITEMAP_URL, head + body + b"</urlset>", PROBE, limits)
    assert plain.error == "too large uncompressed" and plain.uncompressed_bytes == 10_000
    assert 100 < len(plain.entries) < 250
    random_like = b"".join(f"<url><loc>https://www.example.com/blog/{i * 7919 % 100003:x}{i}</loc></url>".encode()
                           for i in range(1000))
    zipped = parse_sitemap(SITEMAP_URL, gzip.compress(head + random_like + b"</urlset>"), PROBE, limits)
    assert zipped.error == "too large uncompressed" and zipped.gzipped


@pytest.mark.parametrize("cut", [5, 40, -9])
def test_truncated_gzip(cut: int) -> None:
    payload = (DATA / "urlset.xml.gz").read_bytes()
    result = parse_sitemap(SITEMAP_URL, payload[:cut], PROBE)
    assert result.error == "truncated gzip"


def test_corrupt_gzip() -> None:
    payload = bytearray((DATA / "urlset.xml.gz").read_bytes())
    payload[20:40] = b"\xff" * 20
    assert parse_sitemap(SITEMAP_URL, bytes(payload), PROBE).error == "bad gzip"


def test_file_like_that_fails_while_reading() -> None:
    class Broken(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise OSError("disk gone")

    assert parse_sitemap(SITEMAP_URL, Broken(), PROBE).error == "unreadable payload"


XXE = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://www.example.com/blog/&xxe;</loc></url></urlset>"""
LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://www.example.com/blog/&lol3;</loc></url></urlset>"""
PARAMETER = b"""<?xml version="1.0"?>
<!DOCTYPE urlset SYSTEM "http://attacker.example/evil.dtd">
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://www.example.com/blog/a</loc></url></urlset>"""
UNDECLARED = b"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>https://www.example.com/blog/a</loc></url><url><loc>https://www.example.com/blog/&ent;</loc></url></urlset>"""


@pytest.mark.parametrize(("payload", "reason", "kept"), [
    (XXE, "doctype refused", 0),
    (LAUGHS, "doctype refused", 0),
    (PARAMETER, "doctype refused", 0),
    (UNDECLARED, "malformed xml", 1),  # the entry before the bad reference is kept
])
def test_entities_are_never_expanded(payload: bytes, reason: str, kept: int) -> None:
    result = parse_sitemap(SITEMAP_URL, payload, PROBE)
    assert result.error == reason and len(result.entries) == kept
    assert not any("passwd" in entry.loc or "lol" in entry.loc for entry in result.entries)


@pytest.mark.parametrize(("payload", "reason", "kept"), [
    (urlset("https://www.example.com/blog/a")[:-5], "malformed xml", 1),           # truncated document
    (b"<urlset " + NS.encode() + b"><url><loc>https://www.example.com/blog/a</loc></url><url><loc>x</url>",
     "malformed xml", 1),                                                           # mismatched tag
    (b"<?xml version='1.0'?><urlset>" + b"<a>" * 100_000, "malformed xml", 0),      # deep nesting, unclosed
    (urlset("https://www.example.com/blog/a", ns='xmlns="http://example.com/not-sitemaps"'), "wrong namespace", 0),
    (b'<rss version="2.0"><channel><item><link>https://www.example.com/blog/a</link></item></channel></rss>',
     "not a sitemap", 0),
    (b"<!DOCTYPE html><html><body>Not found</body></html>", "not a sitemap", 0),
    (b"\n  <!doctype html>\n<html><body>soft 404</body></html>", "not a sitemap", 0),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "not a sitemap", 0),
    (b"", "empty", 0),
    (b"  \n\t ", "empty", 0),
])
def test_bad_documents(payload: bytes, reason: str, kept: int) -> None:
    result = parse_sitemap(SITEMAP_URL, payload, PROBE)
    assert result.error == reason and len(result.entries) == kept


def test_legacy_google_namespace_and_no_namespace_are_read() -> None:
    for ns in ('xmlns="http://www.google.com/schemas/sitemap/0.84"', ""):
        result = parse_sitemap(SITEMAP_URL, urlset("https://www.example.com/blog/a", ns=ns), PROBE)
        assert result.error is None and len(result.entries) == 1


def test_elements_of_other_namespaces_are_not_entries() -> None:
    payload = urlset("https://www.example.com/blog/a").replace(
        b"</urlset>", b'<x:url xmlns:x="urn:x"><x:loc>https://www.example.com/blog/b</x:loc></x:url></urlset>')
    assert [entry.loc for entry in parse_sitemap(SITEMAP_URL, payload, PROBE).entries] == [
        "https://www.example.com/blog/a"]


def test_huge_single_loc_is_refused() -> None:
    giant = "https://www.example.com/blog/" + "a" * 5_000_000
    result = parse_sitemap(SITEMAP_URL, urlset(giant, "https://www.example.com/blog/ok"), PROBE)
    assert result.error is None and dict(result.refused) == {"loc too long": 1}
    assert [entry.loc for entry in result.entries] == ["https://www.example.com/blog/ok"]
    text = parse_sitemap("https://www.example.com/s.txt", (giant + "\nhttps://www.example.com/ok\n").encode(), PROBE)
    assert dict(text.refused) == {"loc too long": 1} and len(text.entries) == 1


def test_loc_at_the_length_limit_is_kept() -> None:
    limits = SitemapLimits(max_loc_length=40)
    fits = "https://www.example.com/blog/" + "a" * (40 - 29)
    result = parse_sitemap(SITEMAP_URL, urlset(fits, fits + "b"), PROBE, limits)
    assert [entry.loc for entry in result.entries] == [fits] and dict(result.refused) == {"loc too long": 1}


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be"])
def test_bom_and_utf16(encoding: str) -> None:
    declared = "UTF-8" if encoding == "utf-8-sig" else "UTF-16"
    text = (DATA / "urlset.xml").read_text(encoding="utf-8").replace('encoding="UTF-8"', f'encoding="{declared}"')
    if encoding in ("utf-16-le", "utf-16-be"):
        text = "\ufeff" + text
    result = parse_sitemap(SITEMAP_URL, text.encode(encoding), PROBE)
    assert result.error is None and result.entries == EXPECTED_BLOG


def test_utf16_without_bom_is_still_xml() -> None:
    text = urlset("https://www.example.com/blog/a").decode().replace('encoding="UTF-8"', 'encoding="UTF-16"')
    result = parse_sitemap(SITEMAP_URL, text.encode("utf-16-le"), PROBE)
    assert result.error is None and len(result.entries) == 1


def test_payload_split_at_every_byte_boundary_parses_the_same() -> None:
    payload = (DATA / "urlset.xml.gz").read_bytes()

    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.position = 0

        def read(self, size: int = -1) -> bytes:
            chunk = payload[self.position:self.position + 1]
            self.position += 1
            return chunk

    result = parse_sitemap(SITEMAP_URL, Trickle(), PROBE)
    assert result.error is None and result.entries == EXPECTED_BLOG


# --- first schedule ----------------------------------------------------------------------------------------

NOW = datetime(2024, 6, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("entry", "priority"),
    [
        (SitemapEntry("https://a/"), 0.8),                                       # nothing known: a link's priority
        (SitemapEntry("https://a/", priority=1.0), 1.2),
        (SitemapEntry("https://a/", priority=0.0), 0.4),
        (SitemapEntry("https://a/", lastmod=NOW - timedelta(days=2)), 1.0),      # fresh
        (SitemapEntry("https://a/", lastmod=NOW - timedelta(days=30)), 0.8),
        (SitemapEntry("https://a/", lastmod=NOW - timedelta(days=400)), 0.6),    # stale
        (SitemapEntry("https://a/", lastmod=NOW + timedelta(days=30)), 0.8),     # future: ignored
        (SitemapEntry("https://a/", changefreq=ChangeFreq.HOURLY), 0.9),
        (SitemapEntry("https://a/", changefreq=ChangeFreq.NEVER), 0.7),
        (SitemapEntry("https://a/", changefreq=ChangeFreq.WEEKLY), 0.8),
        (SitemapEntry("https://a/", NOW, ChangeFreq.ALWAYS, 1.0), 1.5),          # clamped at the top
        (SitemapEntry("https://a/", NOW - timedelta(days=999), ChangeFreq.NEVER, 0.0), 0.1),  # and the bottom
    ],
)
def test_first_schedule(entry: SitemapEntry, priority: float) -> None:
    got_priority, next_fetch_at = first_schedule(entry, NOW)
    assert got_priority == pytest.approx(priority) and next_fetch_at == NOW


@pytest.mark.parametrize("origin", [
    sitemaps.SitemapOrigin(sitemaps.FoundVia.PROBE),
    sitemaps.SitemapOrigin(sitemaps.FoundVia.ROBOTS, "https://a.example:8443"),
    sitemaps.SitemapOrigin(sitemaps.FoundVia.INDEX, "http://b.example", 1),
    sitemaps.SitemapOrigin(sitemaps.FoundVia.LINK).child(),
])
def test_origin_round_trips_through_its_stored_form(origin):
    assert sitemaps.SitemapOrigin.decode(origin.encode()) == origin


@pytest.mark.parametrize("text", ["", "robots", "robots x http://a", "nowhere 0", "index 1 http://a extra"])
def test_a_bad_stored_origin_is_refused(text):
    with pytest.raises(ValueError):
        sitemaps.SitemapOrigin.decode(text)


def test_robots_sitemap_lines_for_every_agent():
    body = ("User-agent: otherbot\nDisallow: /\nSitemap: http://a.test/one.xml\n\n"
            "User-agent: *\nsite-map: https://cdn.test/two.xml.gz\n")
    assert sitemaps.robots_sitemaps("http://a.test", body, 500_000) == [
        ("http://a.test/one.xml", "robots 0 http://a.test"), ("https://cdn.test/two.xml.gz", "robots 0 http://a.test")]
    assert sitemaps.robots_sitemaps("http://a.test", None, 500_000) == []
    assert sitemaps.robots_sitemaps("http://a.test", "\x00\xff garbage", 500_000) == []
    assert sitemaps.probe_url("https://a.test:8443") == "https://a.test:8443/sitemap.xml"


def test_discovered_depth_and_priority_follow_how_the_url_was_found():
    """crawler.frontier's discovery rank: a link is a hop, a sitemap's entries and children are not; entries
    take their first_schedule priority, sitemap files SITEMAP_FILE_PRIORITY, links the parent's damped."""
    from crawler import frontier

    now = datetime(2024, 5, 1, tzinfo=UTC)
    entry = sitemaps.SitemapEntry("http://a.test/p", now - timedelta(days=1), sitemaps.ChangeFreq.DAILY, 0.9)
    assert frontier.discovery_depth("link", None, 2) == 3
    assert frontier.discovery_depth("redirect", None, 2) == 3
    assert frontier.discovery_depth("sitemap", None, 2) == 2
    assert frontier.discovery_depth("link", "index 1 http://a.test", 2) == 2
    assert frontier.discovery_priority("link", None, 0.5) == 0.5 * frontier.DISCOVERY_PRIORITY_FACTOR
    assert frontier.discovery_priority("sitemap", "index 1 http://a.test", 0.5) == sitemaps.SITEMAP_FILE_PRIORITY
    assert frontier.discovery_priority("sitemap", None, 0.5, entry, now) == sitemaps.first_schedule(entry, now)[0]
    with pytest.raises(ValueError):
        frontier.discovery_priority("sitemap", None, 0.5)
