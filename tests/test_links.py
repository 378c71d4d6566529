"""Link extraction on hostile HTML: every rule of crawler.links."""

from __future__ import annotations

from crawler.links import decode_html, detect_charset, extract, is_html, robots_directives

PAGE = "http://site.test/dir/page.html"


def _urls(parsed) -> list[str]:
    return [link.url for link in parsed.outlinks]


def test_relative_dotdot_fragment_and_query_links_resolve_canonically():
    html = (
        '<a href="other.html">o</a><a href="../up/">u</a><a href="/abs?b=2&a=1#x">q</a>'
        '<a href="#top">self</a><a href="HTTP://Site.Test:80/%7euser/./a/../b">c</a>'
        '<a href="//cdn.site.test/lib">proto-relative</a><a href="?page=2">query only</a>'
    )
    parsed = extract(html, PAGE, max_outlinks=100)
    assert _urls(parsed) == [
        "http://site.test/dir/other.html",
        "http://site.test/up/",
        "http://site.test/abs?b=2&a=1",
        "http://site.test/dir/page.html",
        "http://site.test/~user/b",
        "http://cdn.site.test/lib",
        "http://site.test/dir/page.html?page=2",
    ]


def test_unusable_hrefs_are_dropped():
    html = (
        '<a href="javascript:alert(1)">j</a><a href="mailto:a@b.test">m</a><a href="tel:123">t</a>'
        '<a href="ftp://x.test/f">f</a><a href="http://[bad">bad</a><a href="">empty</a><a>no href</a>'
        '<a href="data:text/html,hi">d</a>'
    )
    assert _urls(extract(html, PAGE, max_outlinks=100)) == ["http://site.test/dir/page.html"]  # only href=""


def test_base_href_applies_to_links_and_canonical():
    html = (
        '<head><base href="/base/sub/"><link rel="canonical" href="canon.html"></head>'
        '<body><a href="x">x</a><area href="../y" alt=" Y  area "></body>'
    )
    parsed = extract(html, PAGE, max_outlinks=100)
    assert parsed.base_href == "http://site.test/base/sub/"
    assert parsed.canonical_url == "http://site.test/base/sub/canon.html"
    assert _urls(parsed) == ["http://site.test/base/sub/x", "http://site.test/base/y"]
    assert parsed.outlinks[1].anchor_text == "Y area"


def test_invalid_base_href_falls_back_to_page_url():
    parsed = extract('<base href="javascript:void(0)"><a href="x">x</a>', PAGE, max_outlinks=10)
    assert parsed.base_href is None
    assert _urls(parsed) == ["http://site.test/dir/x"]


def test_nofollow_variants_and_dedup():
    html = (
        '<a href="/a" rel="NoFollow">1</a><a href="/a">2</a>'
        '<a href="/b" rel="nofollow noopener">1</a><a href="/b" rel="ugc nofollow">2</a>'
        '<a href="/c" rel="sponsored">c</a><a href="/d" rel=" external  nofollow ">d</a>'
    )
    links = {link.url.rsplit("/", 1)[1]: link for link in extract(html, PAGE, max_outlinks=100).outlinks}
    assert list(links) == ["a", "b", "c", "d"]
    assert links["a"].nofollow is False  # one followed occurrence is enough
    assert links["a"].anchor_text == "1"  # the first occurrence wins
    assert links["b"].nofollow is True and links["b"].rel == ("nofollow", "noopener", "ugc")
    assert links["c"].nofollow is False and links["c"].rel == ("sponsored",)
    assert links["d"].nofollow is True and links["d"].rel == ("external", "nofollow")


def test_meta_robots_and_x_robots_tag():
    meta = extract('<meta name="Robots" content="NOINDEX"><a href="/x">x</a>', PAGE, max_outlinks=10)
    assert (meta.meta_noindex, meta.meta_nofollow) == (True, False)
    assert meta.outlinks[0].nofollow is False
    none = extract('<meta name="robots" content="none"><a href="/x">x</a>', PAGE, max_outlinks=10)
    assert (none.meta_noindex, none.meta_nofollow) == (True, True)
    assert none.outlinks[0].nofollow is True
    other_meta = extract('<meta name="description" content="noindex nofollow">', PAGE, max_outlinks=10)
    assert (other_meta.meta_noindex, other_meta.meta_nofollow) == (False, False)
    header = extract(b"<a href=/x>x</a>", PAGE, max_outlinks=10, headers={"X-Robots-Tag": "nofollow"})
    assert (header.meta_noindex, header.meta_nofollow) == (False, True)
    assert header.outlinks[0].nofollow is True
    assert robots_directives("googlebot: noindex, noarchive") == (False, False)  # another agent's directive
    assert robots_directives("googlebot: noindex, noarchive", "GoogleBot") == (True, False)
    assert robots_directives(None) == (False, False)


def test_outlinks_are_capped():
    html = "".join(f'<a href="/p{i}">p{i}</a>' for i in range(5000))
    parsed = extract(html, PAGE, max_outlinks=50)
    assert len(parsed.outlinks) == 50
    assert parsed.outlinks[-1].url == "http://site.test/p49"


def test_title_text_language_and_hidden_content():
    html = (
        '<html lang=" EN-gb "><head><title>\n  A   <b>bold</b>\ttitle </title><style>.x{color:red}</style></head>'
        "<body><h1>Heading</h1><script>var secret = 1;</script><noscript>nojs</noscript>"
        "<p>Visible <i>text</i></p></body></html>"
    )
    parsed = extract(html, PAGE, max_outlinks=10)
    assert parsed.title == "A <b>bold</b> title"  # title content is raw text in HTML
    assert parsed.language == "en-gb"
    assert "Heading" in parsed.text and "Visible" in parsed.text and "text" in parsed.text
    assert "secret" not in parsed.text and "color" not in parsed.text and "nojs" not in parsed.text
    long_title = extract("<title>" + "x" * 5000 + "</title>", PAGE, max_outlinks=10).title
    assert long_title is not None and len(long_title) == 1000


def test_empty_and_malformed_documents():
    empty = extract(b"", PAGE, max_outlinks=10)
    assert (empty.title, empty.outlinks, empty.text, empty.canonical_url, empty.language) == (None, [], "", None, None)
    unclosed = extract('<html><body><div><a href="/a">A <b>bold <a href="/b">B', PAGE, max_outlinks=10)
    assert _urls(unclosed) == ["http://site.test/a", "http://site.test/b"]
    nested = extract("<div>" * 2000 + '<a href="/deep">deep</a>' + "</div>" * 10, PAGE, max_outlinks=10)
    assert _urls(nested) == ["http://site.test/deep"]


def test_binary_junk_never_raises():
    junk = bytes(range(256)) * 40 + b'<a href="/after-junk">x</a>' + b"\x00\xff\xfe" * 100
    parsed = extract(junk, PAGE, max_outlinks=10)
    assert "http://site.test/after-junk" in _urls(parsed)
    assert parsed.charset == "utf-8"


def test_charset_detection_order():
    latin = "<title>Café</title>".encode("latin-1")
    assert detect_charset(latin, "text/html; charset=ISO-8859-1") == "cp1252"
    declared = {"content-type": "text/html; charset=iso-8859-1"}
    assert extract(latin, PAGE, max_outlinks=1, headers=declared).title == "Café"
    meta = '<meta charset="windows-1251"><title>Привет</title>'.encode("cp1251")
    parsed = extract(meta, PAGE, max_outlinks=1)
    assert (parsed.charset, parsed.title) == ("cp1251", "Привет")
    http_equiv = b'<meta http-equiv="Content-Type" content="text/html; charset=koi8-r">'
    assert detect_charset(http_equiv) == "koi8-r"
    assert detect_charset(b"\xef\xbb\xbf<meta charset=latin1>", "text/html; charset=latin1") == "utf-8"  # BOM first
    assert decode_html("\ufeffhi".encode("utf-16-le"))[0] == "hi"
    assert detect_charset(b"<title>x</title>", "text/html; charset=no-such-codec") == "utf-8"


def test_wrong_declared_charset_is_replaced_not_raised():
    parsed = extract("<title>日本語</title>".encode("shift_jis"), PAGE, max_outlinks=1,
                     headers={"Content-Type": "text/html; charset=utf-8"})
    assert parsed.title is not None and "\ufffd" in parsed.title


def test_is_html_by_type_or_sniff():
    assert is_html("text/html; charset=utf-8") and is_html("APPLICATION/XHTML+XML")
    assert not is_html("application/pdf", b"<html>")
    assert is_html(None, b"  \n<!DOCTYPE html><html>") and is_html("", b"<HTML>")
    assert not is_html(None, b"%PDF-1.4")
