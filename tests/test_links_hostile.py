"""Hostile HTML corpus for crawler.links: every case parses without an exception and records what happened.

Big inputs are generated here from fixed seeds; small ones live in tests/data/html. Timing is measured by hand
(see the parse report), never asserted.
"""

from __future__ import annotations

import codecs
import random
from pathlib import Path

import pytest

from crawler.links import MAX_ELEMENT_DEPTH, cap_nesting, extract, parse_refresh, robots_directives

PAGE = "http://site.test/dir/page.html"
FIXTURES = Path(__file__).parent / "data" / "html"
UTF8_HEADER = {"Content-Type": "text/html; charset=utf-8"}


def _urls(parsed) -> list[str]:
    return [link.url for link in parsed.outlinks]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "crawl", "page", "link")) for _ in range(count))


def test_unclosed_tags_fixture():
    parsed = extract((FIXTURES / "unclosed.html").read_bytes(), PAGE, max_outlinks=100)
    assert parsed.title == "Unclosed <b>everything"
    assert parsed.meta_nofollow is True  # the meta in an unclosed head still counts
    assert _urls(parsed) == [
        "http://site.test/one",
        "http://site.test/dir/two.html",
        "http://site.test/three",
        "http://site.test/four",
        "http://site.test/in-select",
        "http://site.test/five",  # its unterminated attribute swallows the /six link, as in a browser
    ]
    assert all(link.nofollow for link in parsed.outlinks)
    assert "in-comment" not in parsed.text and "/six" not in _urls(parsed)
    assert parsed.deep_tags_dropped == 0 and parsed.outlinks_skipped == 0 and not parsed.time_limited


def test_ten_megabyte_page():
    rng = random.Random(10)
    blocks = [f'<p>{_words(rng, 150)} <a href="/p{i % 3000}">{_words(rng, 3)}</a></p>\n' for i in range(12_000)]
    html = ("<html><head><title>big</title></head><body>" + "".join(blocks) + "</body></html>").encode()
    assert len(html) > 10_000_000
    parsed = extract(html, PAGE, max_outlinks=2000)
    assert parsed.title == "big"
    assert len(parsed.outlinks) == 2000
    assert parsed.outlinks_skipped == 12_000 - 2000  # 2000 distinct URLs reached at the 2001st distinct link element
    assert len(parsed.text) > 9_000_000 and not parsed.time_limited


def test_hundred_thousand_links_are_capped_and_counted():
    html = "<body>" + "".join(f'<a href="/p{i}">p{i}</a>' for i in range(100_000)) + "</body>"
    parsed = extract(html, PAGE, max_outlinks=2000)
    assert len(parsed.outlinks) == 2000
    assert parsed.outlinks[-1].url == "http://site.test/p1999"
    assert parsed.outlinks_skipped == 100_000 - 2000


def test_hundred_thousand_links_to_one_url_are_one_outlink():
    html = '<a href="/same">x</a>' * 100_000
    parsed = extract(html, PAGE, max_outlinks=10)
    assert _urls(parsed) == ["http://site.test/same"] and parsed.outlinks_skipped == 0


def test_time_budget_cuts_and_flags():
    html = "<body><p>words</p>" + "".join(f'<a href="/p{i}">p{i}</a>' for i in range(20_000)) + "</body>"
    spent = extract(html, PAGE, max_outlinks=100_000, max_parse_seconds=0)
    assert spent.time_limited is True
    assert spent.outlinks == [] and spent.outlinks_skipped == 20_000 and spent.text == ""
    ample = extract(html, PAGE, max_outlinks=100_000, max_parse_seconds=600)
    assert ample.time_limited is False and len(ample.outlinks) == 20_000 and ample.text.startswith("words")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_binary_junk_labelled_html(seed: int):
    junk = random.Random(seed).randbytes(1_000_000)
    parsed = extract(junk, PAGE, max_outlinks=100, headers={"Content-Type": "text/html"})
    assert parsed.charset == "utf-8"
    assert all(link.url.startswith("http") for link in parsed.outlinks)


def test_binary_junk_with_an_embedded_link():
    rng = random.Random(4)
    junk = rng.randbytes(200_000) + b'><a href="/survivor">s</a>' + rng.randbytes(200_000)
    assert "http://site.test/survivor" in _urls(extract(junk, PAGE, max_outlinks=1000))


def test_header_says_utf8_but_bytes_are_cp1252():
    parsed = extract((FIXTURES / "cp1252_declared_utf8.html").read_bytes(), PAGE, max_outlinks=10,
                     headers=UTF8_HEADER)
    assert parsed.charset == "utf-8"
    assert parsed.title == "Caf\ufffd \ufffd \ufffdquoted\ufffd na\ufffdve"
    assert _urls(parsed) == ["http://site.test/caf%EF%BF%BD"]  # the replacement character, percent-encoded


def test_header_charset_beats_meta_even_when_wrong():
    payload = (FIXTURES / "shift_jis_meta.html").read_bytes()
    by_meta = extract(payload, PAGE, max_outlinks=10)
    assert (by_meta.charset, by_meta.title) == ("shift_jis", "日本語のページ")
    assert _urls(by_meta) == ["http://site.test/%E6%97%A5%E6%9C%AC"]
    by_header = extract(payload, PAGE, max_outlinks=10, headers=UTF8_HEADER)
    assert by_header.charset == "utf-8" and "\ufffd" in by_header.title


def test_utf16_without_bom_declared_utf8():
    payload = '<title>wide</title><a href="/wide">w</a>'.encode("utf-16-le")
    parsed = extract(payload, PAGE, max_outlinks=10, headers=UTF8_HEADER)
    assert parsed.charset == "utf-8"
    assert parsed.outlinks == [] and parsed.title is None  # NUL-interleaved bytes are text, not markup


@pytest.mark.parametrize(
    ("bom", "encoding", "header_charset"),
    [(codecs.BOM_UTF8, "utf-8", "shift_jis"), (codecs.BOM_UTF16_LE, "utf-16-le", "utf-8"),
     (codecs.BOM_UTF16_BE, "utf-16-be", "iso-8859-1")],
)
def test_bom_beats_the_header(bom: bytes, encoding: str, header_charset: str):
    payload = bom + '<title>Grüße</title><a href="/bom">b</a>'.encode(encoding)
    parsed = extract(payload, PAGE, max_outlinks=10, headers={"content-type": f"text/html; charset={header_charset}"})
    assert (parsed.charset, parsed.title, _urls(parsed)) == (encoding, "Grüße", ["http://site.test/bom"])


def test_hundred_thousand_nested_divs_are_flattened():
    html = "<div>" * 100_000 + '<a href="/deep">deep</a>' + "</div>" * 100_000
    parsed = extract(html, PAGE, max_outlinks=10)
    assert _urls(parsed) == ["http://site.test/deep"] and parsed.text == "deep"
    assert parsed.deep_tags_dropped == 100_000 - MAX_ELEMENT_DEPTH


def test_deep_links_survive_the_depth_cap():
    html = "<ul><li>" * 5000 + "".join(f'<a href="/d{i}">d</a>' for i in range(5))
    parsed = extract(html, PAGE, max_outlinks=10)
    assert _urls(parsed) == [f"http://site.test/d{i}" for i in range(5)]
    assert parsed.deep_tags_dropped > 0


def test_cap_nesting_leaves_ordinary_markup_alone():
    ordinary = "<html><body>" + "<p>para<br><img src=x></p>" * 2000 + "</body></html>"
    assert cap_nesting(ordinary) == (ordinary, 0)
    scripted = "<script>" + "document.write('<div>');" * 2000 + "</script><div>after</div>"
    assert cap_nesting(scripted) == (scripted, 0)  # markup inside raw text is not counted
    commented = "<!--" + "<div>" * 2000  # an unclosed comment swallows the rest
    assert cap_nesting(commented) == (commented, 0)
    unclosed_script = "<script>" * 3000  # each unclosed raw-text element would rescan the rest: it must not
    assert cap_nesting(unclosed_script) == (unclosed_script, 0)


def test_nul_bytes_everywhere():
    payload = b'<ti\x00tle>T\x00itle</title><a hr\x00ef="/x"></a><a href="/n\x00ul">n\x00</a>\x00' * 3
    parsed = extract(payload, PAGE, max_outlinks=10)
    assert _urls(parsed) == ["http://site.test/n%EF%BF%BDul"]  # NUL in attribute values -> U+FFFD
    assert parsed.title is None  # <ti\0tle> is not a title element


def test_huge_attributes():
    long_path = "/" + "a" * 2_000_000
    html = f'<a title="{"t" * 3_000_000}" href="/ok">ok</a><a href="{long_path}">long</a><div class="{"c " * 500_000}">'
    parsed = extract(html, PAGE, max_outlinks=10)
    assert _urls(parsed) == ["http://site.test/ok", "http://site.test" + long_path]  # length is scope's rule


def test_unusable_schemes_are_dropped():
    html = "".join(
        f'<a href="{href}">x</a>' for href in (
            "javascript:alert(1)", " JaVaScRiPt:alert(1)", "java\tscript:alert(1)", "\x01javascript:x",
            "data:text/html;base64,PHNjcmlwdD4=", "DATA:,x", "mailto:a@b.test", "MAILTO:x", "tel:+1", "ftp://f.test/",
            "file:///etc/passwd", "about:blank", "blob:http://site.test/uuid", "ws://site.test/",
        )
    ) + '<area href="vbscript:x"><area href="/kept" alt="k">'
    assert _urls(extract(html, PAGE, max_outlinks=100)) == ["http://site.test/kept"]


def test_ten_thousand_base_tags_first_wins():
    html = '<base href="http://first.test/a/">' + "".join(f'<base href="http://b{i}.test/">' for i in range(10_000))
    parsed = extract(html + '<a href="x">x</a>', PAGE, max_outlinks=10)
    assert parsed.base_href == "http://first.test/a/" and _urls(parsed) == ["http://first.test/a/x"]


@pytest.mark.parametrize(
    ("href", "expected"),
    [("canon.html", "http://site.test/dir/canon.html"), ("HTTPS://Other.Test/x#frag", "https://other.test/x"),
     ("javascript:void(0)", None), ("http://[bad", None), ("", "http://site.test/dir/page.html")],
)
def test_canonical_relative_absolute_invalid(href: str, expected: str | None):
    parsed = extract(f'<link rel="Canonical" href="{href}"><a href="/a">a</a>', PAGE, max_outlinks=10)
    assert parsed.canonical_url == expected
    assert _urls(parsed) == ["http://site.test/a"]  # a hint only: never an outlink, never the page URL


def test_first_valid_canonical_wins():
    html = ('<link rel="canonical" href="javascript:x"><link rel="alternate canonical" href="/c1">'
            '<link rel=canonical href=/c2>')
    assert extract(html, PAGE, max_outlinks=1).canonical_url == "http://site.test/c1"


@pytest.mark.parametrize(
    ("content", "expected"),
    [("5; url=/next", (5, "/next")), ("0;URL='/n ext'", (0, "/n ext")), ('3, "quoted"', (3, "quoted")),
     (" 7 ; Url = \"/q\" trailing", (7, "/q")), ("5 url=/x", (5, "/x")), ("5;/plain", (5, "/plain")),
     ("5;urlish", (5, "urlish")), ("1.5", (1, None)), (".5;url=a", (0, "a")), ("0;url=", (0, None)),
     ("3;url='unterminated", (3, "unterminated")), ("abc", None), ("5x;url=/x", None), ("-1;url=/x", None),
     ("", None), (None, None)],
)
def test_parse_refresh_spellings(content: str | None, expected):
    assert parse_refresh(content) == expected


def test_meta_refresh_becomes_the_first_outlink():
    html = ('<a href="/a">a</a><meta http-equiv="REFRESH" content="nonsense">'
            '<meta http-equiv=refresh content="2;URL=\'/next\'"><meta http-equiv=refresh content="0;url=/second">')
    parsed = extract(html, PAGE, max_outlinks=10)
    assert (parsed.refresh_seconds, parsed.refresh_url) == (2, "http://site.test/next")
    assert [(link.url, link.kind) for link in parsed.outlinks] == [
        ("http://site.test/next", "refresh"), ("http://site.test/a", "a")]


def test_meta_refresh_without_url_or_to_itself_or_unusable_is_not_an_outlink():
    for content in ("30", "0; url=page.html", "0;url=javascript:alert(1)"):
        parsed = extract(f'<meta http-equiv="refresh" content="{content}">', PAGE, max_outlinks=10)
        assert parsed.refresh_url is None and parsed.outlinks == []
        assert parsed.refresh_seconds in (30, 0)


def test_meta_refresh_respects_base_and_page_nofollow():
    html = ('<base href="/b/"><meta name=robots content=nofollow><meta http-equiv=refresh content="0;url=n">'
            '<area href=z>')
    parsed = extract(html, PAGE, max_outlinks=10)
    assert [(link.url, link.kind, link.nofollow) for link in parsed.outlinks] == [
        ("http://site.test/b/n", "refresh", True), ("http://site.test/b/z", "area", True)]


def test_x_robots_tag_user_agent_prefixes():
    assert robots_directives("googlebot: noindex", "cyclecrawl") == (False, False)
    assert robots_directives("CycleCrawl: noindex, nofollow", "cyclecrawl") == (True, True)
    assert robots_directives("noarchive, cyclecrawl: nofollow, otherbot: noindex", "cyclecrawl") == (False, True)
    assert robots_directives("unavailable_after: 25 Jun 2010 15:00:00 PST, noindex") == (True, False)
    assert robots_directives("max-snippet: 20, none") == (True, True)
    # Repeated headers arrive joined with ", " (crawler.warcread): the generic one first keeps its meaning.
    joined = "nofollow, otherbot: noindex"
    page = extract(b'<a href="/x">x</a>', PAGE, max_outlinks=10, headers={"x-robots-tag": joined},
                   robots_token="cyclecrawl")
    assert (page.meta_noindex, page.meta_nofollow) == (False, True)


def test_meta_robots_named_for_our_token():
    html = '<meta name="CYCLECRAWL" content="noindex"><meta name="googlebot" content="nofollow"><a href=/x>x</a>'
    ours = extract(html, PAGE, max_outlinks=10, robots_token="cyclecrawl")
    assert (ours.meta_noindex, ours.meta_nofollow) == (True, False)
    anonymous = extract(html, PAGE, max_outlinks=10)
    assert (anonymous.meta_noindex, anonymous.meta_nofollow) == (False, False)
