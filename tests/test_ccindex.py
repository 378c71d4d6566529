"""The cc-index record index and CDXJ of a WARC file: SURT keys against the `surt` package's documented examples,
rows against what the daemon's writer put in the file, records fetched back through the index by (file, offset,
length) and read by an independent reader (fastwarc), and torn files indexed up to the damage."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler.ccindex import (
    CAPTURE_TYPES,
    RECORD_INDEX,
    REVISIT_MIME,
    cdxj_lines,
    index_warc,
    record_index_row,
    surt,
    write_cdxj,
)
from fetchd.warc import WarcFile, http_request_headers, http_response_headers, new_record_id

SEGMENT = "seg-20240101-000000"

# (url, key): examples from the surt package's tests (WaybackURLKeyMakerTest and the canonicalizer tests), and the
# port/query case of the brief.
SURT_EXAMPLES = [
    ("http://www.example.com/", "com,example)/"),
    ("http://www.archive.org/", "org,archive)/"),
    ("http://archive.org/", "org,archive)/"),
    ("http://archive.org/goo/", "org,archive)/goo"),
    ("http://archive.org/goo/?", "org,archive)/goo"),
    ("http://archive.org/goo/?b&a", "org,archive)/goo?a&b"),
    ("http://archive.org/goo/?a=2&b&a=1", "org,archive)/goo?a=1&a=2&b"),
    ("http://archive.org/index.php?PHPSESSID=0123456789abcdefghijklemopqrstuv&action=profile;u=4221",
     "org,archive)/index.php?action=profile;u=4221"),
    ("http://visit.webhosting.yahoo.com/visit.gif?&r=http%3A//web.archive.org/web/20090517140029/http%3A//"
     "anthonystewarthead.electric-chi.com/&b=Netscape%205.0%20%28Windows%3B%20en-US%29&s=1366x768&o=Win32&c=24"
     "&j=true&v=1.2",
     "com,yahoo,webhosting,visit)/visit.gif?&b=netscape%205.0%20(windows;%20en-us)&c=24&j=true&o=win32"
     "&r=http://web.archive.org/web/20090517140029/http://anthonystewarthead.electric-chi.com/&s=1366x768&v=1.2"),
    ("https://Example.com:8080/a?b=2&a=1", "com,example:8080)/a?a=1&b=2"),
    ("http://www.archive.org:80/", "org,archive)/"),
    ("https://www.archive.org:443/", "org,archive)/"),
    ("http://www.archive.org:443/", "org,archive:443)/"),
    ("http://www34.archive.org/index.html?b=a&b=b&a=b", "org,archive)/index.html?a=b&b=a&b=b"),
    ("http://www2.www2foo.com/", "com,www2foo)/"),
    ("http://ARCHIVE.ORG/Big/", "org,archive)/big"),
    ("http://host.test/%25%32%35", "test,host)/%25"),
    ("http://host.test/%2525252525252525", "test,host)/%25"),
    ("http://www.google.com/blah/..", "com,google)/"),
    ("http://host.com//twoslashes?more//slashes", "com,host)/twoslashes?more//slashes"),
    ("http://host.com/ab%23cd", "com,host)/ab%23cd"),
    ("http://3279880203/blah", "11,0,127,195)/blah"),
    ("http://www.nsf.gov/statistics/sed/2009/SED_2009.zip?CFID=14387305&CFTOKEN=72942008",
     "gov,nsf)/statistics/sed/2009/sed_2009.zip"),
    ("http://example.com/(S(4hqa0555fwsecu455xqckv45))/mileg.aspx", "com,example)/mileg.aspx"),
    ("http://example.com/Caf%C3%A9?Q=%C3%A9", "com,example)/caf%c3%a9?q=%c3%a9"),
    ("http://example.com/a%20b#frag", "com,example)/a%20b"),
    ("http://user:pw@bücher.example/", "example,xn--bcher-kva)/"),
]


@pytest.mark.parametrize(("url", "key"), SURT_EXAMPLES)
def test_surt_matches_the_surt_package_examples(url, key):
    assert surt(url) == key


def test_surt_of_a_non_http_uri_is_the_uri_itself():
    assert surt("dns:archive.org") == "dns:archive.org"
    assert surt("not a url") == "not a url"


# ---- rows from headers ------------------------------------------------------------------------------------------


def row_of(url: str, status: int | None = 200, http: dict | None = None, **warc: str) -> dict:
    headers = {"warc-type": "response", "warc-target-uri": url, "warc-date": "2024-03-04T05:06:07.123456Z", **warc}
    return record_index_row(headers, status, http, warc_filename="f.warc.gz", offset=10, length=20, segment="s")


def test_row_url_columns():
    row = row_of("https://News.Example.co.uk:8443/a/b.html?x=1&y")
    assert row["url_surtkey"] == "uk,co,example,news:8443)/a/b.html?x=1&y"
    assert row["url"] == "https://News.Example.co.uk:8443/a/b.html?x=1&y"
    assert (row["url_host_name"], row["url_host_tld"], row["url_host_registered_domain"]) == \
        ("news.example.co.uk", "uk", "example.co.uk")
    assert (row["url_protocol"], row["url_port"], row["url_path"], row["url_query"]) == \
        ("https", 8443, "/a/b.html", "x=1&y")
    plain = row_of("http://example.com")
    assert (plain["url_port"], plain["url_path"], plain["url_query"]) == (None, "/", None)
    ip = row_of("http://10.1.2.3:8080/")
    assert (ip["url_host_name"], ip["url_host_tld"], ip["url_host_registered_domain"]) == ("10.1.2.3", None, "10.1.2.3")


def test_row_fetch_and_content_columns():
    row = row_of("http://example.com/old/page", 301,
                 {"location": "../new?a=1", "content-type": 'Text/HTML; Charset="ISO-8859-1"'},
                 **{"warc-payload-digest": "sha1:ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", "warc-truncated": "length"})
    assert row["fetch_time"] == datetime(2024, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    assert (row["fetch_status"], row["fetch_redirect"]) == (301, "http://example.com/new?a=1")
    assert (row["content_mime_type"], row["content_charset"]) == ("text/html", "iso-8859-1")
    assert row["content_digest"] == "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    assert row["content_truncated"] == "length"
    assert (row["warc_filename"], row["warc_record_offset"], row["warc_record_length"], row["warc_segment"]) == \
        ("f.warc.gz", 10, 20, "s")
    assert row_of("http://example.com/", 200, {"location": "/elsewhere"})["fetch_redirect"] is None
    meta = row_of("http://example.com/", None, None,
                  **{"warc-type": "metadata", "content-type": "application/warc-fields"})
    assert (meta["fetch_status"], meta["content_mime_type"], meta["warc_record_type"]) == \
        (None, "application/warc-fields", "metadata")
    assert row_of("http://example.com/", 200, {}, **{"content-type": "application/http"})["content_mime_type"] is None
    assert row_of("http://example.com/", **{"warc-date": "yesterday"})["fetch_time"] is None
    assert record_index_row({"warc-type": "warcinfo"}, None, None, warc_filename="f", offset=0, length=1,
                            segment="s") is None
    assert set(row) == set(RECORD_INDEX.names)


# ---- a WARC file as the daemon writes it -------------------------------------------------------------------------


def warc_date(second: int) -> str:
    return f"2024-01-01T00:{second // 60:02d}:{second % 60:02d}.000000Z"


def write_crawl_warc(path: str, pages: int, seed: int) -> dict[str, dict]:
    """A WARC with every kind of exchange the daemon writes; returns what was written per response record id."""
    rng = random.Random(seed)
    warc = WarcFile(path, {"software": "test", "format": "WARC File Format 1.1"})
    written = {}
    for i in range(pages):
        kind = ["html", "404", "redirect", "gzip", "truncated", "revisit", "binary"][i % 7]
        uri = f"http://www{i % 3}.site{i % 5}.test/p/{i}?b={i}&a=x"
        date = warc_date(i)
        request_id, response_id = new_record_id(), new_record_id()
        warc.write_request(uri, http_request_headers("GET", f"/p/{i}", [("Host", f"site{i % 5}.test")]), date,
                           "127.0.0.1", request_id, response_id)
        truncated = None
        if kind == "revisit":
            status, headers, body = 304, [("ETag", '"v1"')], b""
            warc.write_not_modified(uri, http_response_headers(304, "Not Modified", headers), date, "127.0.0.1",
                                    response_id, request_id, refers_to_date="2023-12-01T00:00:00Z")
        else:
            status = {"404": 404, "redirect": 302}.get(kind, 200)
            body = {"html": b"<html><body>page %d</body></html>" % i, "404": b"not found",
                    "redirect": b"", "gzip": gzip.compress(b"<p>zipped</p>" * 50),
                    "truncated": b"x" * 1000, "binary": rng.randbytes(rng.choice([10, 5_000, 200_000]))}[kind]
            headers = [("Content-Type", "text/html; charset=utf-8")]
            if kind == "redirect":
                headers.append(("Location", f"/moved/{i}"))
            if kind == "gzip":
                headers.append(("Content-Encoding", "gzip"))
            if kind == "truncated":
                truncated = "length"
            if kind == "binary":
                headers = [("Content-Type", "application/octet-stream")]
            warc.write_response(uri, http_response_headers(status, "X", headers), body, date, "127.0.0.1",
                                response_id, request_id, truncated_reason=truncated)
        warc.write_fetch_metadata(uri, date, response_id, 12, "127.0.0.1", truncated, "success")
        written[response_id] = {"kind": kind, "uri": uri, "status": status, "date": date}
    warc.close()
    return written


def read_exactly(path: str, offset: int, length: int) -> dict:
    """The one record at (offset, length), read from exactly those bytes by fastwarc: its headers, whether its
    block digest verifies, and its HTTP status (None without one)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    assert len(data) == length
    found = []
    for record in ArchiveIterator(io.BytesIO(data), parse_http=False):
        status = None
        block_ok = record.verify_block_digest(consume=False)
        if record.record_type in (WarcRecordType.response, WarcRecordType.revisit):
            record.parse_http()
            status = record.http_headers.status_code
        found.append({"headers": dict(record.headers), "block_ok": block_ok, "status": status})
    assert len(found) == 1 and found[0]["block_ok"]
    return found[0]


@pytest.fixture(scope="module")
def crawl_warc(tmp_path_factory) -> tuple[str, dict, list[dict]]:
    path = str(tmp_path_factory.mktemp("ccindex") / f"{SEGMENT}-00000.warc.gz")
    written = write_crawl_warc(path, pages=70, seed=5)
    indexed = index_warc(path, os.path.basename(path), SEGMENT)
    rows = list(indexed)
    assert indexed.stop_reason is None
    return path, written, rows


def fastwarc_records(path: str) -> list[tuple[int, str, str | None]]:
    with open(path, "rb") as fh:
        return [(r.stream_pos, r.headers["WARC-Type"], r.headers.get("WARC-Target-URI"))
                for r in ArchiveIterator(fh, parse_http=False)]


def test_every_record_but_warcinfo_has_a_row_at_its_offset(crawl_warc):
    path, written, rows = crawl_warc
    records = fastwarc_records(path)
    assert records[0][1] == "warcinfo"
    assert [(r["warc_record_offset"], r["warc_record_type"], r["url"]) for r in rows] == records[1:]
    ends = [r["warc_record_offset"] + r["warc_record_length"] for r in rows]
    assert ends == [r["warc_record_offset"] for r in rows[1:]] + [os.path.getsize(path)]
    assert [r["warc_record_type"] for r in rows].count("request") == len(written)


def test_capture_rows_carry_what_was_written(crawl_warc):
    path, written, rows = crawl_warc
    captures = [r for r in rows if r["warc_record_type"] in CAPTURE_TYPES]
    assert len(captures) == len(written)
    for row, exchange in zip(captures, written.values(), strict=True):
        kind = exchange["kind"]
        assert row["url"] == exchange["uri"] and row["fetch_status"] == exchange["status"]
        assert row["fetch_time"] == datetime.fromisoformat(exchange["date"])
        assert row["warc_record_type"] == ("revisit" if kind == "revisit" else "response")
        assert row["url_surtkey"] == surt(exchange["uri"]) and row["url_surtkey"].startswith("test,site")
        assert row["warc_segment"] == SEGMENT and row["warc_filename"] == os.path.basename(path)
        assert row["content_truncated"] == ("length" if kind == "truncated" else None)
        assert (row["fetch_redirect"] is not None) == (kind == "redirect")
        assert (row["content_digest"] is None) == (kind == "revisit")
        if kind in ("html", "gzip"):
            assert (row["content_mime_type"], row["content_charset"]) == ("text/html", "utf-8")
    redirect = next(r for r in captures if r["fetch_status"] == 302)
    assert redirect["fetch_redirect"] == redirect["url"].split("/p/")[0] + "/moved/" + redirect["url_path"][3:]


def test_random_rows_fetch_their_record_through_the_index(crawl_warc):
    path, _, rows = crawl_warc
    for row in random.Random(20).sample(rows, 20):
        record = read_exactly(path, row["warc_record_offset"], row["warc_record_length"])
        assert record["headers"]["WARC-Type"] == row["warc_record_type"]
        assert record["headers"]["WARC-Target-URI"] == row["url"]
        digest = record["headers"].get("WARC-Payload-Digest")
        assert row["content_digest"] == (digest.removeprefix("sha1:") if digest else None)
        assert record["status"] == row["fetch_status"]


def test_rows_fit_the_arrow_schema(crawl_warc):
    table = pa.Table.from_pylist(crawl_warc[2], schema=RECORD_INDEX)
    assert table.num_rows == len(crawl_warc[2])


# ---- CDXJ -------------------------------------------------------------------------------------------------------


def test_cdxj_is_sorted_and_points_at_the_captures(crawl_warc, tmp_path):
    path, written, rows = crawl_warc
    out = str(tmp_path / "index.cdxj")
    indexed = write_cdxj(path, out, segment=SEGMENT)
    assert indexed.stop_reason is None
    lines = Path(out).read_text("ascii").splitlines()
    assert lines == list(cdxj_lines(rows))
    assert len(lines) == len(written)
    keys = [(line.split(" ", 2)[0], line.split(" ", 2)[1]) for line in lines]
    assert keys == sorted(keys) and [line.encode() for line in lines] == sorted(line.encode() for line in lines)
    by_offset = {r["warc_record_offset"]: r for r in rows}
    for line in lines:
        key, stamp, block = line.split(" ", 2)
        fields = json.loads(block)
        row = by_offset[int(fields["offset"])]
        assert row["warc_record_type"] in CAPTURE_TYPES
        assert (key, int(fields["length"]), fields["url"], fields["filename"]) == \
            (row["url_surtkey"], row["warc_record_length"], row["url"], os.path.basename(path))
        assert stamp == row["fetch_time"].strftime("%Y%m%d%H%M%S") and len(stamp) == 14
        assert fields["status"] == str(row["fetch_status"])
        assert fields.get("digest") == row["content_digest"]
        revisit = row["warc_record_type"] == "revisit"
        assert fields.get("mime") == (REVISIT_MIME if revisit else row["content_mime_type"])
        record = read_exactly(path, int(fields["offset"]), int(fields["length"]))
        assert record["headers"]["WARC-Target-URI"] == fields["url"]


def test_cdxj_orders_captures_of_one_url_by_time():
    rows = [row_of("http://example.com/b", **{"warc-date": "2024-02-01T00:00:00Z"}),
            row_of("http://example.com/a", **{"warc-date": "2024-03-01T00:00:00Z"}),
            row_of("http://example.com/a", **{"warc-date": "2024-01-01T00:00:00Z"}),
            row_of("http://example.com/a", **{"warc-type": "request"}),
            row_of("http://example.com/a", **{"warc-date": "junk"})]
    stamps = [line.split(" ")[:2] for line in cdxj_lines(rows)]
    assert stamps == [["com,example)/a", "20240101000000"], ["com,example)/a", "20240301000000"],
                      ["com,example)/b", "20240201000000"]]


def test_cdxj_carries_the_languages_as_common_crawl_does():
    rows = [row_of("http://example.com/a", **{"warc-date": "2024-01-01T00:00:00Z"}),
            row_of("http://example.com/b", **{"warc-date": "2024-01-01T00:00:00Z"})]
    rows[0]["content_languages"] = "fra,eng"
    blocks = [json.loads(line.split(" ", 2)[2]) for line in cdxj_lines(rows)]
    assert [block.get("languages") for block in blocks] == ["fra,eng", None]


# ---- damaged files -----------------------------------------------------------------------------------------------


def index_copy(data: bytes, tmp_path, name: str) -> tuple[list[dict], str | None]:
    path = tmp_path / name
    path.write_bytes(data)
    indexed = index_warc(str(path), "f.warc.gz", SEGMENT)
    rows = list(indexed)
    return rows, indexed.stop_reason


def test_torn_files_index_the_complete_records_and_say_why_they_stop(crawl_warc, tmp_path):
    path, _, rows = crawl_warc
    data = Path(path).read_bytes()
    ends = {r["warc_record_offset"] + r["warc_record_length"] for r in rows} | {rows[0]["warc_record_offset"]}
    last = rows[-1]["warc_record_offset"]
    rng = random.Random(7)
    cuts = rng.sample(range(1, len(data)), 40) + [len(data) - 1, len(data) - 5, len(data) - 9, last + 1,
                                                  rows[-3]["warc_record_offset"] + 30]
    for cut in cuts:
        got, reason = index_copy(data[:cut], tmp_path, "torn.warc.gz")
        expected = [r for r in rows if r["warc_record_offset"] + r["warc_record_length"] <= cut]
        assert [r["warc_record_offset"] for r in got] == [r["warc_record_offset"] for r in expected], cut
        assert (reason is None) == (cut in ends), (cut, reason)
        if reason is not None:
            assert "offset" in reason


def test_garbage_after_the_records_stops_with_a_reason(crawl_warc, tmp_path):
    path, _, rows = crawl_warc
    data = Path(path).read_bytes()
    for junk in (b"not a warc record at all\r\n\r\n", gzip.compress(b"WARC/1.1\r\nContent-Length: 99\r\n\r\nshort"),
                 b"\x1f\x8b\x08\x00garbage"):
        got, reason = index_copy(data + junk, tmp_path, "junk.warc.gz")
        assert len(got) == len(rows) and reason is not None, junk


def test_an_uncompressed_warc_is_indexed_too(tmp_path):
    path = tmp_path / "plain.warc"
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=False)
        http = StatusAndHeaders("200 OK", [("Content-Type", "text/plain")], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record("http://example.com/x", "response", payload=io.BytesIO(b"hi"),
                                                      http_headers=http))
    indexed = index_warc(str(path), "plain.warc", SEGMENT)
    [row] = list(indexed)
    assert indexed.stop_reason is None
    assert (row["url_surtkey"], row["fetch_status"], row["content_mime_type"]) == ("com,example)/x", 200, "text/plain")
    record = read_exactly(str(path), row["warc_record_offset"], row["warc_record_length"])
    assert record["headers"]["WARC-Target-URI"] == "http://example.com/x"


def test_damage_inside_the_file_stops_at_the_damaged_record(crawl_warc, tmp_path):
    path, _, rows = crawl_warc
    data = bytearray(Path(path).read_bytes())
    damaged = rows[20]["warc_record_offset"]
    data[damaged + 40:damaged + 48] = bytes(8)
    got, reason = index_copy(bytes(data), tmp_path, "damaged.warc.gz")
    assert [r["warc_record_offset"] for r in got] == [r["warc_record_offset"] for r in rows[:20]]
    assert reason is not None and f"offset {damaged}" in reason
