"""WET files: the text of each HTML page as a conversion record (crawler/wet.py), written by parse per WARC file
(jobs/parse.py: each task's parts, then one file per WARC file). The records and the parts are tested without Spark;
the shared crawl's WET files are read back with warcio, fastwarc and `warcio check` against its WARC files."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from fastwarc.warc import ArchiveIterator as FastArchiveIterator
from fastwarc.warc import WarcRecordType
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawler import layout, wet
from crawler.records import FETCHED
from crawler.status import WetOutcome
from crawler.urls import url_id
from delta_tables.tables import table_df
from jobs import parse

SEGMENT = "seg-wet"
NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
WARC = f"segments/{SEGMENT}/warc/{layout.bucket_dirname(3)}/CC-TEST-00000.warc.gz"
WARCIO = str(Path(sys.executable).with_name("warcio"))

ENGLISH = ("The committee met on Tuesday to discuss the new library, which will open next spring with a reading "
           "room, a children's corner and a small cafe for visitors.")
GERMAN = ("Der Ausschuss traf sich am Dienstag, um die neue Bibliothek zu besprechen, die im nächsten Frühjahr mit "
          "einem Lesesaal, einer Kinderecke und einem kleinen Café eröffnet wird.")
_RANDOM = random.Random(7)
LINEAR_B = " ".join("".join(chr(_RANDOM.randrange(0x10000, 0x1005D)) for _ in range(_RANDOM.randrange(2, 8)))
                    for _ in range(120))  # a script CLD2 does not know

# url -> (Content-Type, body): the outcomes parse records for each.
PAGES = {
    "http://a.test/en": ("text/html; charset=utf-8",
                         f"<html><head><title>Library</title></head><body><p>{ENGLISH}</p></body></html>".encode()),
    "http://a.test/mixed": ("text/html; charset=utf-8",
                            f"<html><body><p>{ENGLISH} {ENGLISH}</p><p>{GERMAN} {GERMAN} {GERMAN}</p>"
                            "</body></html>".encode()),
    "http://a.test/empty": ("text/html", b"<html><head><title>Nothing</title><script>var x = 1;</script></head>"
                                         b"<body>  \n </body></html>"),
    "http://a.test/doc.pdf": ("application/pdf", b"%PDF-1.4\n\x00\xff\xfe binary " * 20),
    "http://a.test/image.png": ("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))),
    "http://a.test/linear-b": ("text/html; charset=utf-8", f"<html><body><p>{LINEAR_B}</p></body></html>".encode()),
    "http://a.test/malformed": ("text/html", b"<html><body><div><p>Unclosed <b>bold <i>text</div></span>"
                                             b"</td><table><tr><td>" + ENGLISH.encode() + b"<<>>&&; \xff\xfe"),
}
OUTCOMES = {
    "http://a.test/en": WetOutcome.WRITTEN, "http://a.test/mixed": WetOutcome.WRITTEN,
    "http://a.test/empty": WetOutcome.NO_TEXT, "http://a.test/doc.pdf": WetOutcome.NOT_HTML,
    "http://a.test/image.png": WetOutcome.NOT_HTML, "http://a.test/linear-b": WetOutcome.WRITTEN,
    "http://a.test/malformed": WetOutcome.WRITTEN,
}


def _write_warc(path: str) -> dict[str, tuple[int, str]]:
    """A gzip-per-record WARC of PAGES: warcinfo, then request + response per page. url -> (response offset,
    response WARC-Record-ID)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    found = {}
    with open(path, "wb") as out:
        writer = WARCWriter(out, gzip=True, warc_version="WARC/1.1")
        writer.write_record(writer.create_warcinfo_record(os.path.basename(path), {"software": "test"}))
        for url, (content_type, body) in PAGES.items():
            request = StatusAndHeaders(f"GET {url} HTTP/1.1", [], is_http_request=True)
            writer.write_record(writer.create_warc_record(url, "request", http_headers=request))
            response = writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=(
                StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")))
            start = out.tell()
            writer.write_record(response)
            found[url] = (start, response.rec_headers.get_header("WARC-Record-ID"))
    return found


def _rows(locations: dict[str, tuple[int, str]]) -> list[dict]:
    rows = []
    for url, (offset, _) in locations.items():
        row = dict.fromkeys(FETCHED.names)
        row.update(segment_id=SEGMENT, bucket=3, url_id=url_id(url), state_version=1, url=url, host_key="http://a.test",
                   fetched_at=NOW, outcome="success", status_code=200, warc_filename=WARC, warc_offset=offset,
                   warc_length=1, content_type=PAGES[url][0])
        rows.append(row)
    return rows


def _parse_task(root: str, rows: list[dict]) -> list[dict]:
    """One parse task over `rows` (in order), WET on: its pages rows; its parts are left under the root."""
    batch = pa.RecordBatch.from_pylist(rows, schema=FETCHED)
    return list(parse.parsed_pages(iter([batch]), root=root, max_bytes=1 << 20, max_outlinks=10, shingle=3,
                                   language_max_chars=1024, wet_enabled=True))


def _join_parts(root: str) -> str:
    """The WET file of WARC from its parts, as parse's last task does; returns its path."""
    names = sorted(p for p in _files(root) if "/_parts/" in p)
    row = {"warc_filename": WARC, "fetched_at": NOW, "parts": names}
    written = list(parse.wet_file_partition(iter([pa.RecordBatch.from_pylist([row])]), root=root, segment_id=SEGMENT))
    [out] = written[0].to_pylist()
    assert out["wet_filename"] == layout.wet_filename(WARC)
    return layout.join(root, out["wet_filename"])


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _read_wet(path: str) -> list:
    """(type, headers dict, text) of every record, read by warcio with its digests checked."""
    with open(path, "rb") as stream:
        return [(r.rec_type, dict(r.rec_headers.headers), r.content_stream().read().decode("utf-8"))
                for r in ArchiveIterator(stream, check_digests=True)]


def _warcio_check(path: str) -> None:
    done = subprocess.run([WARCIO, "check", "-v", path], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "digest pass" in done.stdout and "fail" not in done.stdout


def _fastwarc_records(path: str) -> list[tuple[str, str, bool, bytes]]:
    with open(path, "rb") as stream:
        return [(r.headers["WARC-Type"], r.record_id, r.verify_block_digest(), r.reader.read())
                for r in FastArchiveIterator(stream, parse_http=False,
                                             record_types=WarcRecordType.warcinfo | WarcRecordType.conversion)]


def test_wet_filenames_follow_the_warc_files():
    assert layout.wet_filename(WARC) == f"segments/{SEGMENT}/wet/bucket=00003/CC-TEST-00000.warc.wet.gz"
    assert layout.wet_filename(f"segments/{SEGMENT}/warc/bucket=00003/x.warc") == \
        f"segments/{SEGMENT}/wet/bucket=00003/x.warc.wet.gz"
    assert layout.wet_part_filename(WARC, 1234) == \
        f"segments/{SEGMENT}/wet/_parts/bucket=00003/CC-TEST-00000.warc.gz.000000000001234"
    with pytest.raises(ValueError):
        layout.wet_filename("elsewhere/x.warc.gz")


def test_a_conversion_record_reads_back_in_warcio_and_fastwarc_and_is_the_same_each_time(tmp_path):
    text = "Grüße aus Köln — 北京 " + ENGLISH
    record = wet.conversion_record(text, target_uri="http://a.test/", date="2024-01-01T12:00:00Z",
                                   refers_to="<urn:uuid:00000000-0000-4000-8000-000000000001>", languages="deu,eng")
    info = wet.warcinfo_record(layout.wet_filename(WARC), NOW, {"isPartOf": SEGMENT})
    path = str(tmp_path / "one.warc.wet.gz")
    Path(path).write_bytes(info + record)
    [(info_type, info_headers, fields), (kind, headers, body)] = _read_wet(path)
    assert (info_type, info_headers["WARC-Filename"], fields) == ("warcinfo", "CC-TEST-00000.warc.wet.gz",
                                                                 f"isPartOf: {SEGMENT}\r\n")
    assert kind == "conversion" and body == text
    assert headers["Content-Type"] == "text/plain" and headers["WARC-Identified-Content-Language"] == "deu,eng"
    assert headers["WARC-Refers-To"] == "<urn:uuid:00000000-0000-4000-8000-000000000001>"
    assert (headers["WARC-Target-URI"], headers["WARC-Date"]) == ("http://a.test/", "2024-01-01T12:00:00Z")
    assert headers["WARC-Block-Digest"] == wet.block_digest(text.encode())
    assert [(t, ok, data.decode()) for t, _, ok, data in _fastwarc_records(path)] == [
        ("warcinfo", True, fields), ("conversion", True, text)]
    _warcio_check(path)
    again = wet.conversion_record(text, target_uri="http://a.test/", date="2024-01-01T12:00:00Z",
                                  refers_to="<urn:uuid:00000000-0000-4000-8000-000000000001>", languages="deu,eng")
    assert again == record  # ids and gzip members carry nothing that changes between runs
    bare = wet.conversion_record("x", target_uri="http://a.test/", date="2024-01-01T12:00:00Z", refers_to=None,
                                 languages=None)
    [headers] = [dict(r.rec_headers.headers) for r in ArchiveIterator(io.BytesIO(bare))]
    assert "WARC-Identified-Content-Language" not in headers and "WARC-Refers-To" not in headers


def test_each_page_gets_its_outcome_and_the_wet_file_refers_to_its_responses(tmp_path):
    """No text, binary bodies, an unknown script and malformed HTML are outcomes, never errors; the WET file holds a
    record for each page with text, in WARC order, each naming its response record, URI and date; warcio,
    fastwarc and `warcio check` read it."""
    root = str(tmp_path)
    locations = _write_warc(layout.join(root, WARC))
    pages = _parse_task(root, _rows(locations))
    assert {p["url"]: p["wet"] for p in pages} == {url: outcome.value for url, outcome in OUTCOMES.items()}
    assert all(p.get("parse_error") is None for p in pages)
    languages = {p["url"]: p.get("languages") for p in pages}
    path = _join_parts(root)
    records = _read_wet(path)
    assert [kind for kind, _, _ in records] == ["warcinfo"] + ["conversion"] * 4
    responses = {record_id: url for url, (_, record_id) in locations.items()}
    with open(layout.join(root, WARC), "rb") as stream:
        dates = {r.rec_headers.get_header("WARC-Target-URI"): r.rec_headers.get_header("WARC-Date")
                 for r in ArchiveIterator(stream) if r.rec_type == "response"}
    written = [url for url, outcome in OUTCOMES.items() if outcome is WetOutcome.WRITTEN]
    assert [responses[h["WARC-Refers-To"]] for _, h, _ in records[1:]] == written
    for _, headers, text in records[1:]:
        url = headers["WARC-Target-URI"]
        assert responses[headers["WARC-Refers-To"]] == url and headers["WARC-Date"] == dates[url]
        assert headers.get("WARC-Identified-Content-Language") == wet.language_codes(languages[url])
        assert text.strip()
    by_url = {h["WARC-Target-URI"]: (h, text) for _, h, text in records[1:]}
    assert by_url["http://a.test/en"][0]["WARC-Identified-Content-Language"] == "eng"
    assert by_url["http://a.test/en"][1] == ENGLISH
    assert by_url["http://a.test/mixed"][0]["WARC-Identified-Content-Language"] == "deu,eng"
    assert "WARC-Identified-Content-Language" not in by_url["http://a.test/linear-b"][0]  # no language known
    assert ENGLISH in by_url["http://a.test/malformed"][1]
    assert len(_fastwarc_records(path)) == 5 and all(ok for _, _, ok, _ in _fastwarc_records(path))
    _warcio_check(path)


def test_a_file_split_over_tasks_makes_the_same_wet_file_and_an_abandoned_task_leaves_no_part(tmp_path):
    root = str(tmp_path)
    rows = _rows(_write_warc(layout.join(root, WARC)))
    _parse_task(root, rows)
    whole = Path(_join_parts(root)).read_bytes()
    for part in [p for p in _files(root) if "/_parts/" in p]:
        os.remove(layout.join(root, part))

    unfinished = parse.parsed_pages(iter([pa.RecordBatch.from_pylist(rows, schema=FETCHED)]), root=root,
                                    max_bytes=1 << 20, max_outlinks=10, shingle=3, wet_enabled=True)
    next(unfinished), next(unfinished)
    unfinished.close()  # Spark stopped reading: the task's part is not kept
    assert [p for p in _files(root) if "/_parts/" in p] == []

    _parse_task(root, rows[:3])  # two tasks, each a range of the file
    _parse_task(root, rows[3:])
    assert len([p for p in _files(root) if "/_parts/" in p]) == 2
    assert Path(_join_parts(root)).read_bytes() == whole


def test_wet_off_writes_nothing_and_sets_no_outcome(tmp_path):
    root = str(tmp_path)
    rows = _rows(_write_warc(layout.join(root, WARC)))
    batch = pa.RecordBatch.from_pylist(rows, schema=FETCHED)
    pages = list(parse.parsed_pages(iter([batch]), root=root, max_bytes=1 << 20, max_outlinks=10, shingle=3))
    assert {p.get("wet") for p in pages} == {None} and "text" not in pages[0]
    assert [p for p in _files(root) if "/wet/" in p] == []


def test_the_shared_crawls_wet_files_pass_warcio_check_and_refer_to_its_responses(spark, shared_crawl):
    """Every parsed bucket of the crawl lists its WET files; warcio (digests checked), fastwarc and `warcio check`
    read them, and each conversion record names a response record of the WARC file it was made from, with its
    URI and date, and the languages parse stored for that page."""
    root = shared_crawl.root
    buckets = table_df(spark, str(root), "segments").where("state = 'merged' AND wet_files IS NOT NULL").collect()
    listed = sorted(name for row in buckets for name in row["wet_files"])
    on_disk = sorted(str(path.relative_to(root)) for path in root.glob("segments/*/wet/**/*") if path.is_file())
    assert listed and on_disk == listed  # no parts left, nothing unlisted
    languages = {(r["warc_filename"], r["warc_offset"]): wet.language_codes(r["languages"])
                 for r in table_df(spark, str(root), "pages").where("parse_error IS NULL").collect()}
    conversions = 0
    for name in listed:
        path = str(root / name)
        records = _read_wet(path)
        assert records[0][0] == "warcinfo" and {kind for kind, _, _ in records[1:]} <= {"conversion"}
        source = dict(line.split(": ", 1) for line in records[0][2].splitlines())["sourceWarc"]
        assert layout.wet_filename(source) == name
        with open(root / source, "rb") as stream:
            responses, warc = {}, ArchiveIterator(stream)
            for record in warc:
                if record.rec_type == "response":
                    responses[record.rec_headers.get_header("WARC-Record-ID")] = (
                        record.rec_headers.get_header("WARC-Target-URI"), record.rec_headers.get_header("WARC-Date"),
                        languages.get((source, warc.get_record_offset())))
        for _, headers, text in records[1:]:
            uri, date, codes = responses[headers["WARC-Refers-To"]]
            assert (headers["WARC-Target-URI"], headers["WARC-Date"]) == (uri, date) and text.strip()
            assert headers.get("WARC-Identified-Content-Language") == codes
        fast = _fastwarc_records(path)
        assert len(fast) == len(records) and all(ok for _, _, ok, _ in fast)
        conversions += len(records) - 1
    assert conversions == sum(row["wet_records"] for row in buckets) > 0
    done = subprocess.run([WARCIO, "check", *(str(root / name) for name in listed)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
