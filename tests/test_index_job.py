"""`crawl index` on WARC files the fetch daemon wrote: the `records` Delta table read back record by record with
fastwarc (an independent reader), a CDXJ file per WARC file that lists the table's captures, idempotent re-runs,
and a torn WARC file indexed up to its damage with the reason counted."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType

from crawler import layout
from delta_tables import tables
from fetchd.commands import fetch_segment
from jobs import cli, index
from tests.support.fetchlists import write_fetchlist
from tests.support.servers import EdgeServer, edge_conf
from tests.support.tables import append_rows

SEGMENT = "seg-index"
TORN_SEGMENT = "seg-index-torn"
LANGUAGES_SEGMENT = "seg-index-languages"


@pytest.fixture(scope="module")
def crawled(tmp_path_factory, base_conf):
    """A small fetch by the real daemon (several rotated WARC files: responses, a revisit, a redirect, a 500,
    request and metadata records), indexed once."""
    root = str(tmp_path_factory.mktemp("index") / "root")
    os.makedirs(root)
    server = EdgeServer()
    try:
        conf = edge_conf(base_conf, **{"fetch.warc_max_bytes": 4_000})
        paths = [f"/page/{i}" for i in range(12)] + ["/moved", "/big", "/secret"]
        items = [{"url": server.url("edge.test", p)} for p in paths]
        items += [{"url": server.url("edge.test", "/etag"), "etag": '"v1"'},
                  {"url": server.url("flaky.test", "/down")}]
        write_fetchlist(root, SEGMENT, items, conf.crawl.buckets)
        fetch_segment(conf, root, SEGMENT)
    finally:
        server.stop()
    return {"root": root, "conf": conf}


@pytest.fixture(scope="module")
def indexed(spark, crawled):
    result = index.run(spark, crawled["conf"], crawled["root"], SEGMENT)
    rows = [r.asDict() for r in tables.table_df(spark, crawled["root"], "records")
            .where(f"warc_segment = '{SEGMENT}'").collect()]
    return {**crawled, "result": result, "rows": rows}


def fastwarc_records(path: str) -> list[tuple[int, str, str | None]]:
    with open(path, "rb") as fh:
        return [(r.stream_pos, r.headers["WARC-Type"], r.headers.get("WARC-Target-URI"))
                for r in ArchiveIterator(fh, parse_http=False)]


def read_exactly(path: str, offset: int, length: int):
    """The one record in exactly the bytes (offset, length) of a file, read by fastwarc, its digest verified."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    assert len(data) == length
    records = []
    for record in ArchiveIterator(io.BytesIO(data), parse_http=False):
        assert record.verify_block_digest(consume=False)
        record.freeze()
        records.append(record)
    assert len(records) == 1
    return records[0]


def warc_files(root: str, segment_id: str) -> list[str]:
    return index.closed_warc_files(root, segment_id)


def test_every_record_but_warcinfo_has_one_row(indexed):
    root, rows, result = indexed["root"], indexed["rows"], indexed["result"]
    names = warc_files(root, SEGMENT)
    assert len(names) > 2 and result.files == len(names)  # rotated at fetch.warc_max_bytes
    expected = set()
    for name in names:
        records = fastwarc_records(os.path.join(root, name))
        assert records[0][1] == "warcinfo"
        expected |= {(name, offset, kind, uri) for offset, kind, uri in records[1:]}
        # lengths tile the file: each record ends where the next begins, the last at the end of the file
        spans = sorted((r["warc_record_offset"], r["warc_record_length"]) for r in rows if r["warc_filename"] == name)
        assert [o + n for o, n in spans] == [o for o, _ in spans[1:]] + [os.path.getsize(os.path.join(root, name))]
    got = [(r["warc_filename"], r["warc_record_offset"], r["warc_record_type"], r["url"]) for r in rows]
    assert len(got) == len(set(got)) and set(got) == expected
    kinds = {kind for _, _, kind, _ in expected}
    assert {"request", "response", "revisit", "metadata"} <= kinds
    assert result.records == len(rows) and result.errors == 0 and result.stop_reasons == {}
    assert result.by_type == {kind: sum(1 for g in got if g[2] == kind) for kind in kinds}


def test_random_rows_fetch_their_record_through_the_index(indexed):
    root, rows = indexed["root"], indexed["rows"]
    sample = random.Random(5).sample(rows, 10)
    for row in sample:
        record = read_exactly(os.path.join(root, row["warc_filename"]), row["warc_record_offset"],
                              row["warc_record_length"])
        assert record.headers["WARC-Type"] == row["warc_record_type"]
        assert record.headers["WARC-Target-URI"] == row["url"]
        digest = record.headers.get("WARC-Payload-Digest")
        assert row["content_digest"] == (digest.removeprefix("sha1:") if digest else None)
    captures = [r for r in rows if r["warc_record_type"] in ("response", "revisit")]
    for row in random.Random(6).sample(captures, min(5, len(captures))):
        record = read_exactly(os.path.join(root, row["warc_filename"]), row["warc_record_offset"],
                              row["warc_record_length"])
        assert record.record_type in (WarcRecordType.response, WarcRecordType.revisit)
        record.parse_http()
        assert record.http_headers.status_code == row["fetch_status"]


def cdxj_entries(root: str, warc_filename: str) -> list[tuple[str, str, dict]]:
    text = Path(root, layout.cdxj_filename(warc_filename)).read_text(encoding="ascii")
    lines = text.splitlines()
    assert lines == sorted(lines)
    return [(key, stamp, json.loads(block)) for key, stamp, block in (line.split(" ", 2) for line in lines)]


def test_each_warc_file_has_a_cdxj_file_listing_its_captures(indexed):
    root, rows, result = indexed["root"], indexed["rows"], indexed["result"]
    total = 0
    for name in warc_files(root, SEGMENT):
        entries = cdxj_entries(root, name)
        total += len(entries)
        captures = {(r["url_surtkey"], f"{r['fetch_time']:%Y%m%d%H%M%S}", r["url"], r["warc_record_offset"],
                     r["warc_record_length"], r["fetch_status"])
                    for r in rows if r["warc_filename"] == name and r["warc_record_type"] in ("response", "revisit")}
        listed = {(key, stamp, block["url"], int(block["offset"]), int(block["length"]), int(block["status"]))
                  for key, stamp, block in entries}
        assert listed == captures and len(entries) == len(captures)
        assert {block["filename"] for _, _, block in entries} <= {name}
    assert total == result.cdxj_lines > 0
    revisits = [block for name in warc_files(root, SEGMENT) for _, _, block in cdxj_entries(root, name)
                if block.get("mime") == "warc/revisit"]
    assert len(revisits) == 1 and revisits[0]["status"] == "304"


def snapshot(spark, root: str) -> tuple[list, dict]:
    rows = sorted(tuple(str(v) for v in r) for r in tables.table_df(spark, root, "records").collect())
    cdxj_root = os.path.join(layout.segment_dir(root, SEGMENT), "cdxj")
    files = {os.path.relpath(os.path.join(d, n), cdxj_root): Path(d, n).read_bytes()
             for d, _, names in os.walk(cdxj_root) for n in names}
    return rows, files


def test_rerun_changes_nothing(spark, indexed, capsys):
    root, conf = indexed["root"], indexed["conf"]
    before = snapshot(spark, root)
    assert index.run(spark, conf, root, SEGMENT) == indexed["result"]
    assert snapshot(spark, root) == before
    # and through the command line (the session of the tests is reused)
    argv = ["index", "--root", root, "--segment", SEGMENT, "--set", "spark.master=local[2]",
            "--set", "spark.shuffle_partitions=2"]
    assert cli.main(argv) == 0
    assert f"index: {indexed['result'].files} WARC files: {len(indexed['rows'])} records" in capsys.readouterr().out
    assert snapshot(spark, root) == before


def test_torn_warc_is_indexed_up_to_its_damage_and_the_reason_counted(spark, indexed):
    root, conf, rows = indexed["root"], indexed["conf"], indexed["rows"]
    name = max(warc_files(root, SEGMENT), key=lambda n: os.path.getsize(os.path.join(root, n)))
    ours = sorted((r for r in rows if r["warc_filename"] == name), key=lambda r: r["warc_record_offset"])
    cut = ours[-2]["warc_record_offset"] + 40  # inside the second-to-last record
    bucket_dir = name.split("/")[3]
    torn_dir = os.path.join(layout.warc_dir(root, TORN_SEGMENT), bucket_dir)
    os.makedirs(torn_dir)
    torn_name = f"segments/{TORN_SEGMENT}/warc/{bucket_dir}/torn.warc.gz"
    whole_name = f"segments/{TORN_SEGMENT}/warc/{bucket_dir}/whole.warc.gz"
    Path(root, torn_name).write_bytes(Path(root, name).read_bytes()[:cut])
    shutil.copyfile(os.path.join(root, name), os.path.join(root, whole_name))
    Path(torn_dir, "being-written.warc.gz.open").write_bytes(b"ignored")

    result = index.run(spark, conf, root, TORN_SEGMENT)

    assert result.files == 2 and result.errors == 0
    assert len(result.stop_reasons) == 1 and sum(result.stop_reasons.values()) == 1
    [(damaged_file, reason)] = result.damaged
    assert damaged_file == torn_name and "offset" in reason
    torn_rows = tables.table_df(spark, root, "records").where(f"warc_filename = '{torn_name}'").collect()
    assert sorted(r["warc_record_offset"] for r in torn_rows) == [r["warc_record_offset"] for r in ours[:-2]]
    assert result.records == len(torn_rows) + len(ours)
    listed = {int(block["offset"]) for _, _, block in cdxj_entries(root, torn_name)}
    assert listed == {r["warc_record_offset"] for r in ours[:-2] if r["warc_record_type"] in ("response", "revisit")}
    # the first segment's partition is untouched by the second one's replace
    assert tables.table_df(spark, root, "records").where(f"warc_segment = '{SEGMENT}'").count() == len(rows)


def test_content_languages_come_from_the_pages_parse_wrote(spark, indexed):
    """records.content_languages is pages.languages of the response at the same place, in Common Crawl's form;
    every other record (no pages row, or a page without languages) has null."""
    root, conf, rows = indexed["root"], indexed["conf"], indexed["rows"]
    source = max(warc_files(root, SEGMENT), key=lambda n: sum(
        r["warc_filename"] == n and r["warc_record_type"] == "response" for r in rows))
    name = source.replace(SEGMENT, LANGUAGES_SEGMENT)
    os.makedirs(os.path.dirname(os.path.join(root, name)))
    shutil.copyfile(os.path.join(root, source), os.path.join(root, name))
    responses = sorted(r["warc_record_offset"] for r in rows
                       if r["warc_filename"] == source and r["warc_record_type"] == "response")
    assert len(responses) >= 3
    detected = {responses[0]: [("fra", 0.6), ("eng", 0.38)], responses[1]: [("deu", 0.99)], responses[2]: []}
    append_rows(spark, root, "pages", [
        {"url_id": f"u{offset}", "url": f"u{offset}", "segment_id": LANGUAGES_SEGMENT, "warc_filename": name,
         "warc_offset": offset, "languages": [{"code": code, "share": share} for code, share in languages]}
        for offset, languages in detected.items()])

    index.run(spark, conf, root, LANGUAGES_SEGMENT)

    found = {r["warc_record_offset"]: r["content_languages"]
             for r in tables.table_df(spark, root, "records").where(f"warc_segment = '{LANGUAGES_SEGMENT}'").collect()}
    assert {offset: found[offset] for offset in detected} == {responses[0]: "fra,eng", responses[1]: "deu",
                                                              responses[2]: None}
    assert all(languages is None for offset, languages in found.items() if offset not in detected)
    assert all(r["content_languages"] is None for r in rows)  # the first segment has no pages rows
    listed = {int(block["offset"]): block.get("languages") for _, _, block in cdxj_entries(root, name)}
    assert {offset: listed[offset] for offset in detected} == {responses[0]: "fra,eng", responses[1]: "deu",
                                                               responses[2]: None}
    assert all(languages is None for offset, languages in listed.items() if offset not in detected)


def test_an_unreadable_file_is_an_error_row_not_an_exception(tmp_path):
    name = f"segments/{SEGMENT}/warc/bucket=00000/missing.warc.gz"
    [summary] = list(index.index_file(str(tmp_path), name, SEGMENT))
    assert summary["file_summary"] and summary["warc_filename"] == name
    assert summary["error"].startswith("FileNotFoundError") and summary["cdxj_lines"] == 0


def test_cdxj_path_of_a_warc_path():
    assert (layout.cdxj_filename("segments/s1/warc/bucket=00003/a.warc.gz")
            == "segments/s1/cdxj/bucket=00003/a.warc.gz.cdxj")
    with pytest.raises(ValueError):
        layout.cdxj_filename("elsewhere/a.warc.gz")


def test_a_revisit_resolves_to_its_original_by_digest_and_one_without_it_is_counted(spark, base_conf, tables_root):
    """Identical-payload revisits, one with its original in another file: in the CDXJ a revisit is `warc/revisit`
    with the original's digest (pywb finds the original by URL and digest); one whose original is in no indexed
    segment (its segment removed, say) is counted in the result, and the job still succeeds."""
    from fetchd.warc import WarcFile, http_response_headers, new_record_id, payload_sha1

    root, segment = tables_root, "seg-revisits"
    headers = http_response_headers(200, "OK", [("Content-Type", "text/html")])
    body = b"<html><title>same</title></html>"
    digest = payload_sha1(body)
    original = WarcFile(os.path.join(layout.warc_dir(root, segment, 0), "a.warc.gz"), {"software": "test"})
    original.write_response("http://a.test/1", headers, body, "2026-12-01T00:00:00.000000Z", None, new_record_id(),
                            new_record_id())
    original.close()
    revisits = WarcFile(os.path.join(layout.warc_dir(root, segment, 0), "b.warc.gz"), {"software": "test"})
    for url, payload_digest in (("http://a.test/1", digest), ("http://a.test/2", payload_sha1(b"never stored"))):
        revisits.write_identical_payload(url, headers, "2026-12-02T00:00:00.000000Z", None, new_record_id(),
                                         new_record_id(), payload_digest, url, "2026-12-01T00:00:00.000000Z")
    revisits.close()
    result = index.run(spark, base_conf, root, segment)
    assert result.by_type == {"response": 1, "revisit": 2} and result.unresolved_revisits == 1
    assert "1 revisits without their original in the index" in result.summary()
    [(_, _, resolved), (_, _, unresolved)] = cdxj_entries(root, f"segments/{segment}/warc/bucket=00000/b.warc.gz")
    assert resolved["mime"] == unresolved["mime"] == "warc/revisit"
    assert resolved["digest"] == digest.removeprefix("sha1:")
    [(_, _, response)] = cdxj_entries(root, f"segments/{segment}/warc/bucket=00000/a.warc.gz")
    assert (response["url"], response["digest"]) == (resolved["url"], resolved["digest"])
