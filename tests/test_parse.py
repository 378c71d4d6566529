"""parse on real WARC files and real Delta tables: pages, links, errors, idempotence; and the WARC reader."""

from __future__ import annotations

import gzip
import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler import config as config_mod
from crawler import layout, pages
from crawler.bucketing import Bucketing
from crawler.fingerprints import content_hash
from crawler.frontier import classify_discovery
from crawler.records import FETCHED
from crawler.scope import Scope
from crawler.traps import TrapRules
from crawler.urls import url_id
from crawler.warcread import read_record_at
from delta_tables import tables
from jobs import parse

SEGMENT = "seg-20240101-000001"
NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)

HOME_HTML = b"""<!doctype html><html lang="en"><head><title>  Home
  page </title><link rel="canonical" href="/index.html#top"></head>
<body><p>Welcome to the home page of a small test site with some words.</p>
<a href="/p1">First</a> <a href="../p2?b=2&a=1#frag">Second</a> <a href="p1">First again</a>
<a href="mailto:x@a.test">mail</a> <a href="javascript:void(0)">js</a>
<a href="http://B.TEST:80/x/./y" rel="nofollow">Other host</a>
<script>document.write('<a href="/never">')</script></body></html>"""

GZIP_HTML = b"<html><head><title>Gzipped</title></head><body><a href='/back'>back home</a> text</body></html>"

NOFOLLOW_HTML = b"""<html><head><meta name="robots" content="noindex, nofollow"><title>Private</title>
<base href="http://b.test/base/"></head><body><a href="rel">relative</a></body></html>"""


def _stripping(rules: dict[str, list[str]]) -> Scope:
    """The default scope with `scope.strip_query_params` set to `rules`."""
    return Scope.from_config(config_mod.load().with_overrides({"scope.strip_query_params": rules}))


def _write_warc(path: str, pages: list[tuple[str, int, dict[str, str], bytes]]) -> dict[str, tuple[int, int]]:
    """A gzip-per-record WARC like the daemon's: warcinfo, then request + response per page.

    Returns url -> (offset, length) of each response record.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    locations: dict[str, tuple[int, int]] = {}
    with open(path, "wb") as out:
        writer = WARCWriter(out, gzip=True, warc_version="WARC/1.1")
        writer.write_record(writer.create_warcinfo_record(os.path.basename(path), {"software": "test"}))
        for url, status, headers, body in pages:
            request = writer.create_warc_record(
                url, "request", http_headers=StatusAndHeaders(f"GET {url} HTTP/1.1", [], is_http_request=True)
            )
            writer.write_record(request)
            http_headers = StatusAndHeaders(f"{status} OK", list(headers.items()), protocol="HTTP/1.1")
            response = writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http_headers)
            start = out.tell()
            writer.write_record(response)
            locations[url] = (start, out.tell() - start)
    return locations


def _fetched_row(url: str, bucket: int, warc: str | None, location: tuple[int, int] | None, **extra) -> dict:
    row = {name: None for name in FETCHED.names}
    row.update(
        segment_id=SEGMENT,
        bucket=bucket,
        url_id=url_id(url),
        state_version=1,
        url=url,
        host_key=url.split("/", 3)[0] + "//" + url.split("/", 3)[2],
        fetched_at=NOW,
        outcome="success",
        status_code=200,
        warc_filename=warc,
        warc_offset=location[0] if location else None,
        warc_length=location[1] if location else None,
    )
    row.update(extra)
    return row


def _write_fetched(root: str, bucket: int, rows: list[dict]) -> None:
    folder = layout.fetched_dir(root, SEGMENT, bucket)
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=FETCHED), f"{folder}/part-00000.parquet")
    with open(f"{folder}/_DONE.json", "w") as manifest:
        json.dump({"rows": len(rows)}, manifest)


@pytest.fixture
def segment(root):
    """Two WARC files (buckets 1 and 2) and their fetched results, plus `segments` rows."""
    warc_a = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/a.warc.gz"
    warc_b = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(2)}/b.warc.gz"
    loc_a = _write_warc(
        f"{root}/{warc_a}",
        [
            ("http://a.test/", 200, {"Content-Type": "text/html; charset=utf-8"}, HOME_HTML),
            (
                "http://a.test/p1",
                200,
                {"Content-Type": "text/html", "Content-Encoding": "gzip"},
                gzip.compress(GZIP_HTML),
            ),
        ],
    )
    loc_b = _write_warc(
        f"{root}/{warc_b}",
        [
            ("http://b.test/doc.pdf", 200, {"Content-Type": "application/pdf"}, b"%PDF-1.4 binary \x00\xff"),
            ("http://b.test/private", 200, {"Content-Type": "text/html"}, NOFOLLOW_HTML),
        ],
    )
    bad_offset = (loc_b["http://b.test/private"][0] + 7, 100)
    _write_fetched(
        root,
        1,
        [
            _fetched_row("http://a.test/", 1, warc_a, loc_a["http://a.test/"], content_type="text/html; charset=utf-8"),
            _fetched_row("http://a.test/p1", 1, warc_a, loc_a["http://a.test/p1"], content_type="text/html"),
            _fetched_row("http://a.test/gone", 1, None, None, outcome="http_error", status_code=404),
        ],
    )
    _write_fetched(
        root,
        2,
        [
            _fetched_row("http://b.test/doc.pdf", 2, warc_b, loc_b["http://b.test/doc.pdf"], content_type=None),
            _fetched_row("http://b.test/private", 2, warc_b, loc_b["http://b.test/private"], content_type="text/html"),
            _fetched_row("http://b.test/bad", 2, warc_b, bad_offset, content_type="text/html"),
        ],
    )
    _write_fetched(root, 3, [_fetched_row("http://c.test/", 3, None, None, outcome="network_error")])
    return {"a": warc_a, "b": warc_b, "loc_a": loc_a, "loc_b": loc_b}


def _seed_segments(spark, root: str) -> None:
    """`segments` rows of SEGMENT's buckets in several states, and of another segment (the tables exist)."""
    rows = [(SEGMENT, 1, "fetched"), (SEGMENT, 2, "fetching"), (SEGMENT, 3, "merged"), ("other", 1, "fetched")]
    df = spark.createDataFrame(rows, "segment_id string, bucket int, state string").selectExpr(
        "*", "0L as url_count", "0L as host_count", "null as owner", "1L as epoch", "null as results",
        "null as applied", "null as stale", "null as discovered", "timestamp'2024-01-01 00:00:00' as created_at",
        "timestamp'2024-01-01 00:00:00' as updated_at", "null as counters", "null as wet_files", "null as wet_records",
    )
    tables.conform(df, "segments").write.format("delta").mode("append").save(tables.table_path(root, "segments"))


def _sorted_rows(spark, root: str, name: str) -> list:
    df = tables.table_df(spark, root, name)
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_parse_segment_pages_links_errors_and_rerun(spark, base_conf, new_tables_root, root, segment):
    new_tables_root(root)
    _seed_segments(spark, root)
    conf = base_conf.with_overrides({"parse.wet_enabled": True})  # the default; the test config turns it off

    result = parse.run(spark, conf, root, SEGMENT)

    assert (result.records, result.pages, result.errors, result.pages_inserted) == (5, 5, 1, 5)
    pages = {r["url"]: r for r in tables.table_df(spark, root, "pages").collect()}
    assert set(pages) == {
        "http://a.test/", "http://a.test/p1", "http://b.test/doc.pdf", "http://b.test/private", "http://b.test/bad"
    }

    home = pages["http://a.test/"]
    assert home["title"] == "Home page"
    assert home["canonical_url"] == "http://a.test/index.html"
    assert home["language"] == "en"
    assert [(language["code"], language["share"]) for language in home["languages"]] == [("eng", 0.99)]
    assert home["outlink_count"] == 3
    assert home["content_hash"] == content_hash(HOME_HTML)
    assert isinstance(home["simhash"], int) and home["simhash"] != 0
    assert home["parse_error"] is None and home["duplicate_of"] is None
    assert (home["warc_filename"], home["warc_offset"]) == (segment["a"], segment["loc_a"]["http://a.test/"][0])
    assert home["segment_id"] == SEGMENT and home["state_version"] == 1

    gzipped = pages["http://a.test/p1"]
    assert gzipped["title"] == "Gzipped"
    assert gzipped["content_hash"] == content_hash(GZIP_HTML)  # hash of the decoded payload

    pdf = pages["http://b.test/doc.pdf"]
    assert pdf["content_type"] == "application/pdf"  # from the record when the result has none
    assert pdf["content_hash"] == content_hash(b"%PDF-1.4 binary \x00\xff")
    assert pdf["title"] is None and pdf["simhash"] is None and pdf["outlink_count"] is None
    assert pdf["languages"] is None  # not HTML: no text

    private = pages["http://b.test/private"]
    assert (private["meta_noindex"], private["meta_nofollow"]) == (True, True)
    assert private["languages"] is None  # one word of text: no language detected with confidence

    bad = pages["http://b.test/bad"]
    assert bad["parse_error"] and bad["content_hash"] is None

    links = {(r["from_url_id"], r["to_url"]): r for r in tables.table_df(spark, root, "links").collect()}
    home_id = url_id("http://a.test/")
    assert {to for frm, to in links if frm == home_id} == {
        "http://a.test/p1", "http://a.test/p2?b=2&a=1", "http://b.test/x/y"
    }
    assert links[(home_id, "http://b.test/x/y")]["rel_nofollow"] is True
    assert links[(home_id, "http://b.test/x/y")]["rel_flags"] == ["nofollow"]
    first = links[(home_id, "http://a.test/p1")]
    assert (first["rel_nofollow"], first["anchor_text"]) == (False, "First")
    assert first["to_url_id"] == url_id("http://a.test/p1")
    assert links[(url_id("http://a.test/p1"), "http://a.test/back")]["anchor_text"] == "back home"
    based = links[(url_id("http://b.test/private"), "http://b.test/base/rel")]
    assert based["rel_nofollow"] is True  # meta nofollow applies to every outlink
    assert len(links) == result.links == 5
    assert all(r["segment_id"] == SEGMENT and r["from_state_version"] == 1 for r in links.values())

    states = {(r["segment_id"], r["bucket"]): r["state"] for r in tables.table_df(spark, root, "segments").collect()}
    assert states == {(SEGMENT, 1): "parsed", (SEGMENT, 2): "parsed", (SEGMENT, 3): "merged", ("other", 1): "fetched"}

    # WET files: one per WARC file, listed with their text records by bucket (tests/test_wet.py reads them closely)
    wet_a, wet_b = layout.wet_filename(segment["a"]), layout.wet_filename(segment["b"])
    listed = {(r["segment_id"], r["bucket"]): (r["wet_files"], r["wet_records"])
              for r in tables.table_df(spark, root, "segments").collect()}
    assert listed == {(SEGMENT, 1): ([wet_a], 2), (SEGMENT, 2): ([wet_b], 1), (SEGMENT, 3): ([], 0),
                      ("other", 1): (None, None)}
    assert (result.wet_files, result.wet_records, result.wet_outcomes) == (2, 3, {"written": 3, "not_html": 1})
    with open(os.path.join(root, wet_b), "rb") as stream:
        [(info, _), (private_text, text)] = [(dict(r.rec_headers.headers), r.content_stream().read())
                                             for r in ArchiveIterator(stream, check_digests=True)]
    assert (info["WARC-Type"], private_text["WARC-Type"], text) == ("warcinfo", "conversion", b"relative")
    assert private_text["WARC-Target-URI"] == "http://b.test/private"
    with open(os.path.join(root, segment["b"]), "rb") as stream:
        ids = {r.rec_headers.get_header("WARC-Target-URI"): r.rec_headers.get_header("WARC-Record-ID")
               for r in ArchiveIterator(stream) if r.rec_type == "response"}
    assert private_text["WARC-Refers-To"] == ids["http://b.test/private"]
    wet_bytes = {name: Path(root, name).read_bytes() for name in (wet_a, wet_b)}
    assert not os.path.exists(layout.join(layout.wet_dir(root, SEGMENT), layout.WET_PARTS))

    before = {name: _sorted_rows(spark, root, name) for name in ("pages", "links", "segments")}
    again = parse.run(spark, conf, root, SEGMENT)
    assert again.pages_inserted == 0 and again.errors == 1
    assert {name: _sorted_rows(spark, root, name) for name in before} == before
    assert {name: Path(root, name).read_bytes() for name in wet_bytes} == wet_bytes  # the same bytes, no duplicates
    assert sorted(os.listdir(os.path.join(layout.wet_dir(root, SEGMENT)))) == ["bucket=00001", "bucket=00002"]


def test_a_result_written_twice_is_parsed_from_the_latest_fetch(spark, base_conf, new_tables_root, root):
    """Two results for one (url_id, state_version) (a bucket re-fetched after a crash): parse reads the latest
    fetch's record, the one update completes the URL with (crawler.leases) — it used to read the earliest — and
    a URL whose latest result is a network error gets no page, even though an earlier fetch succeeded."""
    new_tables_root(root)
    first = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/first.warc.gz"
    second = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/second.warc.gz"
    old, new = b"<html><title>old</title>first fetch</html>", b"<html><title>new</title>second fetch</html>"
    html = {"Content-Type": "text/html"}
    at_first = _write_warc(f"{root}/{first}", [("http://a.test/", 200, html, old), ("http://a.test/x", 200, html, old)])
    at_second = _write_warc(f"{root}/{second}", [("http://a.test/", 200, html, new)])
    later = NOW + timedelta(seconds=30)
    _write_fetched(root, 1, [
        _fetched_row("http://a.test/", 1, second, at_second["http://a.test/"], fetched_at=later),
        _fetched_row("http://a.test/", 1, first, at_first["http://a.test/"]),
        _fetched_row("http://a.test/x", 1, first, at_first["http://a.test/x"]),
        _fetched_row("http://a.test/x", 1, None, None, fetched_at=later, outcome="network_error", status_code=None),
    ])
    result = parse.run(spark, base_conf, root, SEGMENT)
    [page] = tables.table_df(spark, root, "pages").collect()
    assert (page["url"], page["warc_filename"], page["title"]) == ("http://a.test/", second, "new")
    assert page["content_hash"] == content_hash(new) and result.pages == 1


def test_parse_without_fetched_results_does_nothing(spark, base_conf, root):
    assert parse.run(spark, base_conf, root, "seg-empty") == parse.ParseResult(0, 0, 0, 0, 0)
    assert tables.table_df(spark, root, "pages").count() == 0


def test_parse_rejects_unsafe_segment_id(spark, base_conf, root):
    with pytest.raises(ValueError):
        parse.run(spark, base_conf, root, "x' OR '1'='1")


def test_read_record_at_decodes_and_caps(tmp_path):
    path = str(tmp_path / "x.warc.gz")
    body = b"<html>" + b"y" * 5000 + b"</html>"
    locations = _write_warc(
        path,
        [
            ("http://a.test/", 200, {"Content-Type": "text/html", "Content-Encoding": "gzip"}, gzip.compress(body)),
            ("http://a.test/2", 404, {"Content-Type": "text/plain"}, b"nope"),
        ],
    )
    with open(path, "rb") as stream:
        record = read_record_at(stream, locations["http://a.test/"][0], max_bytes=100_000)
        assert (record.record_type, record.target_uri, record.status_code) == ("response", "http://a.test/", 200)
        assert record.payload == body and not record.truncated
        assert record.content_type == "text/html"
        capped = read_record_at(stream, locations["http://a.test/"][0], max_bytes=100)
        assert capped.payload == body[:100] and capped.truncated
        second = read_record_at(stream, locations["http://a.test/2"][0], max_bytes=100)
        assert (second.status_code, second.payload) == (404, b"nope")
        with pytest.raises(ValueError):
            read_record_at(stream, locations["http://a.test/2"][0] + 3, max_bytes=100)


def test_analyze_record_rejects_a_record_for_another_url(tmp_path):
    path = str(tmp_path / "x.warc.gz")
    locations = _write_warc(path, [("http://a.test/", 200, {"Content-Type": "text/html"}, b"<a href=x>x</a>")])
    with open(path, "rb") as stream:
        record = read_record_at(stream, locations["http://a.test/"][0], max_bytes=1000)
    with pytest.raises(ValueError):
        pages.analyze_record(record, "http://a.test/other", None, max_outlinks=10, shingle=3)
    fields = pages.analyze_record(record, "http://a.test/", None, max_outlinks=10, shingle=3)
    assert [link["to_url"] for link in fields["outlinks"]] == ["http://a.test/x"]


def test_analyze_record_strips_configured_query_params_from_outlinks(tmp_path):
    path = str(tmp_path / "x.warc.gz")
    body = (b'<a href="/p?sid=1&q=2" rel=nofollow>a</a><a href="/p?q=2&sid=9">b</a><a href="/p?sid=3" rel=nofollow>c'
            b'</a><a href="http://b.test/?sid=1">d</a>')
    locations = _write_warc(path, [("http://a.test/", 200, {"Content-Type": "text/html"}, body)])
    with open(path, "rb") as stream:
        record = read_record_at(stream, locations["http://a.test/"][0], max_bytes=10000)
    fields = pages.analyze_record(record, "http://a.test/", None, max_outlinks=10, shingle=3,
                                  scope=_stripping({"a.test": ["sid"]}))
    rows = {link["to_url"]: link for link in fields["outlinks"]}
    assert list(rows) == ["http://a.test/p?q=2", "http://a.test/p", "http://b.test/?sid=1"]
    assert rows["http://a.test/p?q=2"]["to_url_id"] == url_id("http://a.test/p?q=2")
    assert not rows["http://a.test/p?q=2"]["rel_nofollow"]  # one of the links that collapsed into it is followed
    assert rows["http://a.test/p"]["rel_nofollow"]


def test_a_followed_redirect_is_parsed_as_its_final_url(root):
    """The daemon stores a followed same-host redirect under the fetch-list URL with the final hop's record:
    parse reads that record as `redirect_to` and resolves links against it."""
    warc = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/r.warc.gz"
    final = "http://a.test/new/home"
    locations = _write_warc(f"{root}/{warc}", [(final, 200, {"Content-Type": "text/html"}, b'<a href="next">n</a>')])
    row = _fetched_row("http://a.test/old", 1, warc, locations[final], content_type="text/html", redirect_to=final)
    batch = pa.RecordBatch.from_pylist([row], schema=FETCHED)
    [out] = list(parse.parse_partition([batch], root=root, max_bytes=100000, max_outlinks=10, shingle=3))
    [page] = out.to_pylist()
    assert page["url"] == "http://a.test/old" and page["parse_error"] is None
    assert [link["to_url"] for link in page["outlinks"]] == ["http://a.test/new/next"]


SITEMAP_INDEX = b"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<sitemap><loc>http://a.test/maps/pages.xml.gz</loc><lastmod>2024-01-01</lastmod></sitemap>
<sitemap><loc>http://elsewhere.test/maps/x.xml</loc></sitemap>
</sitemapindex>"""

URLSET = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>http://a.test/maps/one.html</loc><lastmod>2023-12-30T10:00:00Z</lastmod><changefreq>daily</changefreq>
<priority>0.9</priority></url>
<url><loc>http://a.test/maps/two.html</loc></url>
<url><loc>http://b.test/maps/three.html</loc></url>
<url><loc>ht!tp://bad</loc></url>
</urlset>"""


def test_parse_reads_sitemaps_by_their_origin(root):
    """Rows with sitemap_origin are read as sitemaps: an index gives child sitemaps with the child origin, a gzip
    urlset gives entries with their fields; refusals are counted by reason; a broken sitemap keeps what it read."""
    warc = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/s.warc.gz"
    gz = gzip.compress(URLSET, mtime=0)
    bomb = gzip.compress(b"<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>" + b" " * 3_000_000)
    locations = _write_warc(f"{root}/{warc}", [
        ("http://a.test/maps/index.xml", 200, {"Content-Type": "application/xml"}, SITEMAP_INDEX),
        ("http://a.test/maps/pages.xml.gz", 200, {"Content-Type": "application/x-gzip"}, gz),
        ("http://a.test/maps/bomb.xml.gz", 200, {"Content-Type": "application/gzip"}, bomb),
    ])
    rows = [
        _fetched_row("http://a.test/maps/index.xml", 1, warc, locations["http://a.test/maps/index.xml"],
                     sitemap_origin="robots 0 http://a.test"),
        _fetched_row("http://a.test/maps/pages.xml.gz", 1, warc, locations["http://a.test/maps/pages.xml.gz"],
                     sitemap_origin="index 1 http://a.test"),
        _fetched_row("http://a.test/maps/bomb.xml.gz", 1, warc, locations["http://a.test/maps/bomb.xml.gz"],
                     sitemap_origin="probe 0"),
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=FETCHED)
    limits = parse.SitemapLimits(max_uncompressed_bytes=1_000_000)
    [out] = list(parse.parse_partition([batch], root=root, max_bytes=100000, max_outlinks=10, shingle=3,
                                       sitemap_limits=limits, sitemap_max_bytes=5_000_000))
    pages = {p["url"]: p for p in out.to_pylist()}

    index = pages["http://a.test/maps/index.xml"]
    assert index["parse_error"] is None and index["sitemap_urls"] == 1 and index["simhash"] is None
    assert dict(index["sitemap_refused"]) == {"outside sitemap scope": 1}
    [child] = index["outlinks"]
    assert (child["to_url"], child["sitemap_origin"], child["rel_flags"]) == (
        "http://a.test/maps/pages.xml.gz", "index 1 http://a.test", ["sitemapindex"])
    assert child["sitemap_lastmod"] == datetime(2024, 1, 1, tzinfo=UTC)

    urlset = pages["http://a.test/maps/pages.xml.gz"]
    links = {link["to_url"]: link for link in urlset["outlinks"]}
    # b.test is outside the sitemap's scope even via robots: the robots host is a.test.
    assert list(links) == ["http://a.test/maps/one.html", "http://a.test/maps/two.html"]
    one = links["http://a.test/maps/one.html"]
    assert (one["sitemap_changefreq"], one["sitemap_priority"], one["sitemap_origin"]) == ("daily", 0.9, None)
    assert one["sitemap_lastmod"] == datetime(2023, 12, 30, 10, tzinfo=UTC)
    assert one["rel_flags"] == ["sitemap"]
    assert links["http://a.test/maps/two.html"]["sitemap_priority"] is None
    assert dict(urlset["sitemap_refused"]) == {"outside sitemap scope": 1, "invalid loc": 1}
    assert urlset["outlink_count"] == 2 and urlset["content_hash"] == content_hash(gz)

    broken = pages["http://a.test/maps/bomb.xml.gz"]
    assert broken["parse_error"].startswith("sitemap (urlset): ") and "gzip bomb" in broken["parse_error"]
    assert broken["outlinks"] == [] and broken["sitemap_urls"] == 0


def test_a_sitemap_row_with_a_bad_origin_is_a_parse_error_not_a_crash(root):
    warc = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(1)}/s.warc.gz"
    locations = _write_warc(f"{root}/{warc}", [("http://a.test/s.xml", 200, {}, URLSET)])
    row = _fetched_row("http://a.test/s.xml", 1, warc, locations["http://a.test/s.xml"], sitemap_origin="garbage")
    [out] = list(parse.parse_partition([pa.RecordBatch.from_pylist([row], schema=FETCHED)], root=root,
                                       max_bytes=100000, max_outlinks=10, shingle=3))
    [page] = out.to_pylist()
    assert "not a sitemap origin" in page["parse_error"] and page["outlinks"] == []


def test_sitemap_entries_are_keyed_by_the_url_discovery_stores(tmp_path):
    """A sitemap entry, a child sitemap and a page's outlink with a stripped parameter (scope.strip_query_params)
    all get the links key that discovery gives the same target in `urls` (it used to keep the entry's raw URL)."""
    scope = _stripping({"a.test": ["sid"]})
    urlset = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
              b'<url><loc>http://a.test/p?sid=5&amp;q=1</loc></url><url><loc>http://a.test/p?q=1&amp;sid=6</loc></url>'
              b'</urlset>')
    index = (b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             b'<sitemap><loc>http://a.test/m.xml?sid=2</loc></sitemap></sitemapindex>')
    path = str(tmp_path / "s.warc.gz")
    locations = _write_warc(path, [("http://a.test/s.xml", 200, {"Content-Type": "application/xml"}, urlset),
                                   ("http://a.test/i.xml", 200, {"Content-Type": "application/xml"}, index),
                                   ("http://a.test/", 200, {"Content-Type": "text/html"}, b'<a href="/p?sid=7&q=1">')])
    with open(path, "rb") as stream:
        def record(url):
            return read_record_at(stream, locations[url][0], max_bytes=10000)
        entries = pages.analyze_sitemap(record("http://a.test/s.xml"), "http://a.test/s.xml", None, "probe 0",
                                        parse.SitemapLimits(), scope)["outlinks"]
        children = pages.analyze_sitemap(record("http://a.test/i.xml"), "http://a.test/i.xml", None, "probe 0",
                                         parse.SitemapLimits(), scope)["outlinks"]
        links = pages.analyze_record(record("http://a.test/"), "http://a.test/", None, max_outlinks=10, shingle=3,
                                     scope=scope)["outlinks"]
    rules = TrapRules.from_config(config_mod.load())

    def stored_id(raw: str) -> str:
        return classify_discovery(raw, scope, rules, Bucketing(16)).keys.url_id

    [entry] = entries  # both entries are one stored URL
    assert (entry["to_url"], entry["to_url_id"]) == ("http://a.test/p?q=1", stored_id("http://a.test/p?sid=5&q=1"))
    [child] = children
    assert child["to_url_id"] == stored_id("http://a.test/m.xml?sid=2") == url_id("http://a.test/m.xml")
    [link] = links
    assert link["to_url_id"] == entry["to_url_id"]
