"""WARC fidelity: what fetchd writes, read back by an independent reader (fastwarc), and `.open` recovery.

The daemon tests crawl the loopback edge server of test_fetchd; the recovery tests cut a real WARC written by
`WarcFile` at seeded random byte offsets and check that exactly the records wholly written before the cut
survive, as fastwarc sees them.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType
from warcio.timeutils import datetime_to_iso_date

from crawler import layout
from fetchd.commands import fetch_segment
from fetchd.daemon import daemon_identity
from fetchd.warc import (
    NOT_MODIFIED_PROFILE,
    RESULT_CONTENT_TYPE,
    WARC_TRUNCATED_VALUES,
    WarcFile,
    http_request_headers,
    http_response_headers,
    iipc_stem,
    new_record_id,
)
from fetchd.warcrecovery import RecoveredWarc, recover_open_warc
from tests.support.fetchlists import read_results, record_at, write_fetchlist
from tests.support.servers import EdgeServer, edge_conf

SEGMENT = "seg-warc"
HTTP_TYPES = (WarcRecordType.request, WarcRecordType.response, WarcRecordType.revisit)


@pytest.fixture
def edge():
    server = EdgeServer()
    yield server
    server.stop()


def read_warc(path: str) -> list[dict]:
    """Every record of a file as fastwarc reads it: type, headers, offset, block (and payload) digest checks."""
    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh, parse_http=False):
            entry = {"type": record.record_type, "headers": dict(record.headers), "offset": record.stream_pos,
                     "block_ok": record.verify_block_digest(consume=False)}
            if record.record_type in HTTP_TYPES:
                record.parse_http()
                entry["status"] = record.http_headers.status_code if record.record_type != WarcRecordType.request \
                    else None
                entry["payload_ok"] = record.verify_payload_digest(consume=False)
            elif entry["headers"].get("Content-Type") == RESULT_CONTENT_TYPE:
                entry["result"] = json.loads(record.reader.read())
            else:
                entry["fields"] = warc_fields(record.reader.read())
            out.append(entry)
    return out


def warc_fields(block: bytes) -> dict[str, str]:
    lines = block.decode("utf-8").split("\r\n")
    return dict(line.split(": ", 1) for line in lines if line)


def warc_files(root: str) -> list[str]:
    return sorted(str(p) for p in Path(layout.warc_dir(root, SEGMENT)).rglob("*") if p.is_file())


# ---- naming --------------------------------------------------------------------------------------------


def test_iipc_stem_is_prefix_timestamp_serial_host():
    created = datetime(2024, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC).timestamp()
    assert iipc_stem("seg-x-00003", created, 7, "box-12") == "seg-x-00003-20240102030405678-00007-box-12"


# ---- what the daemon writes ----------------------------------------------------------------------------


def test_daemon_warc_has_warcinfo_pairs_metadata_and_revisits(edge, base_conf, root):
    conf = edge_conf(base_conf, **{"fetch.max_body_bytes": 10_000})
    last_fetch = datetime(2024, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)
    write_fetchlist(root, SEGMENT, [
        {"url": edge.url("edge.test", "/page")},
        {"url": edge.url("edge.test", "/big")},
        {"url": edge.url("edge.test", "/moved")},
        {"url": edge.url("edge.test", "/etag"), "etag": '"v1"', "last_fetch_at": last_fetch},
        {"url": edge.url("edge.test", "/etag?never-fetched"), "etag": '"v1"'},
    ], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = {row["url"]: row for row in read_results(root, SEGMENT)}
    assert len(rows) == 5
    [path] = warc_files(root)
    assert not path.endswith(layout.OPEN_SUFFIX)
    bucket = int(re.search(r"bucket=(\d{5})", path).group(1))
    name = os.path.basename(path)
    assert re.fullmatch(rf"{SEGMENT}-{bucket:05d}-\d{{17}}-00000-{re.escape(daemon_identity(conf))}\.warc\.gz", name)

    recs = read_warc(path)
    assert all(r["block_ok"] for r in recs)
    info = recs[0]
    assert info["type"] == WarcRecordType.warcinfo and info["headers"]["WARC-Filename"] == name
    assert info["headers"]["Content-Type"] == "application/warc-fields"
    fields = info["fields"]
    assert fields["format"] == "WARC File Format 1.1" and fields["robots"] == "obey"
    assert fields["conformsTo"].startswith("http") and "1.1" in fields["conformsTo"]
    assert fields["software"].startswith("cyclecrawl") and fields["hostname"]
    assert fields["http-header-user-agent"] == conf.crawl.user_agent
    assert all(r["headers"]["WARC-Warcinfo-ID"] == info["headers"]["WARC-Record-ID"] for r in recs[1:])
    assert [r["type"] for r in recs].count(WarcRecordType.warcinfo) == 1

    # every fetch's result row is in the file too, pointing at its response (what recovery rebuilds rows from)
    results = [r["result"] for r in recs if "result" in r]
    responses = {r["offset"]: r for r in recs if r["type"] in (WarcRecordType.response, WarcRecordType.revisit)}
    assert sorted(r["row"]["url"] for r in results if r["kind"] == "fetched") == sorted(rows)
    for result in results:
        target = responses[result["row"]["warc_offset"]]["headers"]["WARC-Target-URI"]
        assert result["kind"] == "robots" or target in (result["row"]["url"], result["row"]["redirect_to"])
        if result["kind"] == "fetched":
            assert result["row"]["outcome"] == rows[result["row"]["url"]]["outcome"]

    # exchanges come as request, response|revisit, metadata; each names the others
    body = [r for r in recs[1:] if "result" not in r]
    assert len(body) % 3 == 0 and len(body) >= 3 * 6  # robots.txt + 5 pages (+ any redirect hop followed)
    metadata_of: dict[int, dict[str, str]] = {}  # response offset -> its metadata fields
    for request, response, metadata in zip(body[0::3], body[1::3], body[2::3], strict=True):
        assert request["type"] == WarcRecordType.request
        assert response["type"] in (WarcRecordType.response, WarcRecordType.revisit)
        assert metadata["type"] == WarcRecordType.metadata
        assert request["headers"]["WARC-Concurrent-To"] == response["headers"]["WARC-Record-ID"]
        assert response["headers"]["WARC-Concurrent-To"] == request["headers"]["WARC-Record-ID"]
        assert metadata["headers"]["WARC-Concurrent-To"] == response["headers"]["WARC-Record-ID"]
        assert metadata["headers"]["Content-Type"] == "application/warc-fields"
        uri = response["headers"]["WARC-Target-URI"]
        assert request["headers"]["WARC-Target-URI"] == uri == metadata["headers"]["WARC-Target-URI"]
        assert response["headers"]["WARC-IP-Address"] == request["headers"]["WARC-IP-Address"] == "127.0.0.1"
        if response["type"] == WarcRecordType.response:
            assert response["payload_ok"]
        else:  # a 304 carries no payload of its own: the digest would describe nothing
            assert "WARC-Payload-Digest" not in response["headers"]
        meta = metadata["fields"]
        assert int(meta["fetchTimeMs"]) >= 0 and meta["ip"] == "127.0.0.1"
        if "truncated" in meta:  # the header holds a WARC 1.1 value; the metadata the exact reason
            standard = meta["truncated"] in WARC_TRUNCATED_VALUES
            assert response["headers"]["WARC-Truncated"] == (meta["truncated"] if standard else "unspecified")
        else:
            assert "WARC-Truncated" not in response["headers"]
        if uri.endswith("/robots.txt"):
            assert "outcome" not in meta
        metadata_of[response["offset"]] = meta
    for row in rows.values():  # result rows point at the response; its metadata agrees with the row
        meta = metadata_of[row["warc_offset"]]
        assert meta["outcome"] == row["outcome"] and int(meta["fetchTimeMs"]) == row["elapsed_ms"]
        assert meta.get("truncated") == (row["truncated_reason"] if row["truncated"] else None)
    assert rows[edge.url("edge.test", "/big")]["truncated"]

    # 304s: revisit records, dated back to the earlier capture only when the fetch list knows it
    known = rows[edge.url("edge.test", "/etag")]
    unknown = rows[edge.url("edge.test", "/etag?never-fetched")]
    for row in (known, unknown):
        assert row["outcome"] == "not_modified"
        record = record_at(root, row["warc_filename"], row["warc_offset"])
        assert record.record_type == WarcRecordType.revisit
        assert record.headers["WARC-Profile"] == NOT_MODIFIED_PROFILE
        assert record.headers["WARC-Refers-To-Target-URI"] == row["url"]
    assert record_at(root, known["warc_filename"], known["warc_offset"]).headers["WARC-Refers-To-Date"] == \
        datetime_to_iso_date(last_fetch.replace(tzinfo=None), use_micros=True)
    assert "WARC-Refers-To-Date" not in record_at(root, unknown["warc_filename"], unknown["warc_offset"]).headers


def test_rotation_at_warc_max_bytes(edge, base_conf, root):
    max_bytes = 1_500
    conf = edge_conf(base_conf, **{"fetch.warc_max_bytes": max_bytes})
    paths = [f"/r{i}" for i in range(8)]
    write_fetchlist(root, SEGMENT, [{"url": edge.url("edge.test", p)} for p in paths], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    files = warc_files(root)
    serials = [int(re.search(r"-\d{17}-(\d{5})-", os.path.basename(f)).group(1)) for f in files]
    files = [f for _, f in sorted(zip(serials, files, strict=True))]
    assert len(files) > 2 and len(set(serials)) == len(files)
    seen_urls = []
    for index, path in enumerate(files):
        recs = read_warc(path)
        assert recs[0]["type"] == WarcRecordType.warcinfo and all(r["block_ok"] for r in recs)
        assert recs[0]["headers"]["WARC-Filename"] == os.path.basename(path)
        requests = [r for r in recs if r["type"] == WarcRecordType.request]
        exchanges = [r for r in recs if "result" not in r]
        assert requests and len(exchanges) == 1 + 3 * len(requests)  # no exchange is split across files
        offsets = {r["offset"] for r in recs if r["type"] == WarcRecordType.response}
        assert all(r["result"]["row"]["warc_offset"] in offsets for r in recs if "result" in r)  # nor its result
        seen_urls += [r["headers"]["WARC-Target-URI"] for r in requests]
        assert requests[-1]["offset"] < max_bytes  # not full before its last exchange, else it would have rotated
        if index < len(files) - 1:  # closed because full
            assert os.path.getsize(path) >= max_bytes
    assert sorted(seen_urls) == sorted([edge.url("edge.test", "/robots.txt")] + [edge.url("edge.test", p)
                                                                                  for p in paths])
    for row in read_results(root, SEGMENT):
        stem = re.sub(r"-(r\d{4}|recovered)\.parquet$", "", Path(row["_file"]).name)
        assert stem + ".warc.gz" == Path(row["warc_filename"]).name


def test_rotation_under_concurrency_keeps_exchanges_whole_and_results_with_their_files(edge, base_conf, root):
    """Many hosts at once and tiny files: an exchange may still be in the writer's queue when its file is
    rotated away. Its records stay contiguous in that file, its row is published in a result file named after
    it and points at its response, and its result record comes after it (later in the file, or in a later file)."""
    hosts = [f"h{i}.test" for i in range(8)]
    conf = edge_conf(base_conf, **{"fetch.warc_max_bytes": 2_000, "politeness.min_delay_s": 0.0,
                                         "fetch.concurrency": 16, "fetch.warc_gzip_level": 1,
                                         "fetch.static_hosts": {h: "127.0.0.1" for h in hosts}})
    urls_listed = [edge.url(h, f"/r{i}") for h in hosts for i in range(6)]
    write_fetchlist(root, SEGMENT, [{"url": u} for u in urls_listed], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = read_results(root, SEGMENT)
    assert sorted(r["url"] for r in rows) == sorted(urls_listed)
    serial = {}  # file name -> (bucket, serial)
    results = []  # (file, offset of the result record, row)
    for path in warc_files(root):
        name = os.path.basename(path)
        serial[name] = (re.search(r"bucket=(\d{5})", path).group(1), int(re.search(r"-\d{17}-(\d{5})-", name).group(1)))
        recs = read_warc(path)
        assert all(r["block_ok"] for r in recs)
        body = [r for r in recs[1:] if "result" not in r]
        for request, response, metadata in zip(body[0::3], body[1::3], body[2::3], strict=True):
            assert request["type"] == WarcRecordType.request and metadata["type"] == WarcRecordType.metadata
            assert response["headers"]["WARC-Concurrent-To"] == request["headers"]["WARC-Record-ID"]
            assert recs.index(response) == recs.index(request) + 1 == recs.index(metadata) - 1  # contiguous
        results += [(name, r["offset"], r["result"]["row"]) for r in recs if "result" in r]
    for row in rows:
        name = Path(row["warc_filename"]).name
        assert re.sub(r"-(r\d{4}|recovered)\.parquet$", "", Path(row["_file"]).name) + ".warc.gz" == name
        assert record_at(root, row["warc_filename"], row["warc_offset"]).headers["WARC-Target-URI"] == row["url"]
    assert len(results) == len(rows) + len(hosts)  # one per page and per robots.txt
    for name, offset, row in results:
        target = Path(row["warc_filename"]).name
        assert serial[target][0] == serial[name][0]
        assert (serial[target][1], row["warc_offset"]) < (serial[name][1], offset)


# ---- .open recovery ------------------------------------------------------------------------------------


def write_sample_warc(path: str, seed: int) -> None:
    """A WARC as the daemon writes it: warcinfo, then exchanges (one a 304 revisit), some bodies incompressible
    so that gzip members span many read chunks."""
    rng = random.Random(seed)
    warc = WarcFile(path, {"software": "test", "format": "WARC File Format 1.1"})
    for i in range(6):
        uri = f"http://example.test/p{i}"
        date = "2024-01-01T00:00:00.000000Z"
        request_id, response_id = new_record_id(), new_record_id()
        warc.write_request(uri, http_request_headers("GET", f"/p{i}", [("Host", "example.test")]), date,
                           "127.0.0.1", request_id, response_id)
        if i == 3:
            warc.write_not_modified(uri, http_response_headers(304, "Not Modified", []), date, "127.0.0.1",
                                    response_id, request_id, refers_to_date="2023-12-01T00:00:00Z")
        else:
            body = rng.randbytes(rng.choice([10, 3_000, 150_000])) if i % 2 else b"<html>x</html>" * 500
            headers = http_response_headers(200, "OK", [("Content-Length", str(len(body)))])
            warc.write_response(uri, headers, body, date, "127.0.0.1", response_id, request_id)
        warc.write_fetch_metadata(uri, date, response_id, 12, "127.0.0.1", None, "success")
    warc.close()


def boundaries(data: bytes) -> list[tuple[int, int, str, str, str | None]]:
    """(start, end, record id, type, concurrent-to) of each record, from fastwarc's offsets."""
    import io

    starts = []
    for record in ArchiveIterator(io.BytesIO(data), parse_http=False):
        starts.append((record.stream_pos, record.record_id, record.headers["WARC-Type"],
                       record.headers.get("WARC-Concurrent-To")))
    ends = [s[0] for s in starts[1:]] + [len(data)]
    return [(s, e, rid, kind, to) for (s, rid, kind, to), e in zip(starts, ends, strict=True)]


def expected_after_cut(records: list, cut: int) -> tuple[list[str], bool, int]:
    kept = [r for r in records if r[1] <= cut]
    requests = {r[2] for r in kept if r[3] == "request"}
    has_pair = any(r[3] in ("response", "revisit") and r[4] in requests for r in kept)
    return [r[2] for r in kept], has_pair, kept[-1][1] if kept else 0


def check_recovery(open_path: str, records: list, cut: int) -> RecoveredWarc:
    ids, has_pair, end = expected_after_cut(records, cut)
    final = open_path.removesuffix(layout.OPEN_SUFFIX)
    result = recover_open_warc(open_path)
    assert not os.path.exists(open_path)
    if not has_pair:
        assert result == RecoveredWarc(0, 0, None) and not os.path.exists(final)
        return result
    assert result == RecoveredWarc(len(ids), end, final)
    assert os.path.getsize(final) == end
    with open(final, "rb") as fh:
        got = [(r.record_id, r.verify_block_digest(consume=False)) for r in ArchiveIterator(fh, parse_http=False)]
    assert got == [(rid, True) for rid in ids]
    os.remove(final)
    return result


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[bytes, list]:
    path = str(tmp_path_factory.mktemp("sample") / "sample.warc.gz")
    write_sample_warc(path, seed=4)
    data = Path(path).read_bytes()
    records = boundaries(data)
    assert [r[3] for r in records[:4]] == ["warcinfo", "request", "response", "metadata"]
    assert len(records) == 1 + 6 * 3 and "revisit" in [r[3] for r in records]
    return data, records


def test_recovery_of_files_cut_at_random_offsets(sample, tmp_path):
    data, records = sample
    rng = random.Random(20240504)
    edges = [e for _, end, *_ in records for e in (end - 1, end, end + 1)]
    cuts = sorted({0, 1, len(data)} | {c for c in edges if 0 <= c <= len(data)}
                  | {rng.randrange(len(data) + 1) for _ in range(250)})
    open_path = str(tmp_path / "cut.warc.gz.open")
    outcomes = {"kept": 0, "deleted": 0}
    for cut in cuts:
        Path(open_path).write_bytes(data[:cut])
        result = check_recovery(open_path, records, cut)
        outcomes["kept" if result.path else "deleted"] += 1
    assert outcomes["kept"] > 100 and outcomes["deleted"] > 5  # both branches really ran
    Path(open_path).write_bytes(data)  # an .open file that was complete keeps everything
    assert check_recovery(open_path, records, len(data)).records == len(records)


def test_recovery_cuts_garbage_and_damaged_members(sample, tmp_path):
    data, records = sample
    rng = random.Random(7)
    open_path = str(tmp_path / "bad.warc.gz.open")
    for _ in range(40):  # a torn tail followed by junk (e.g. a reused disk block)
        cut = rng.randrange(len(data))
        Path(open_path).write_bytes(data[:cut] + rng.randbytes(rng.randrange(1, 5000)))
        check_recovery(open_path, records, cut)
    for _ in range(40):  # one flipped byte inside a record: that record and everything after it are dropped
        index = rng.randrange(4, len(records))
        start, end = records[index][0], records[index][1]
        position = rng.randrange(start + 10, end)  # past the gzip header (its mtime/OS bytes are unchecked)
        damaged = bytearray(data)
        damaged[position] ^= 0xFF
        Path(open_path).write_bytes(bytes(damaged))
        check_recovery(open_path, records, start)
    whole = gzip.decompress(data[records[5][0]:records[5][1]])  # one record, uncompressed
    for bad in (whole[:-3], whole[:40], whole + b"extra", b"not a WARC record\r\n\r\n"):
        # a sound gzip member that holds no whole record: cut there, even with good records after it
        cut = records[7][0]
        Path(open_path).write_bytes(data[:cut] + gzip.compress(bad) + data[cut:])
        check_recovery(open_path, records, cut)


def test_recovery_refuses_a_closed_name(tmp_path):
    path = tmp_path / "x.warc.gz"
    path.write_bytes(b"")
    with pytest.raises(ValueError):
        recover_open_warc(str(path))
    assert path.exists()


# ---- the writer thread ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("compressor", "level"), [("isal", 0), ("isal", 3), ("zlib", 1), ("zlib", 9)])
def test_writer_thread_output_reads_back_with_fastwarc_at_the_offsets_it_returned(tmp_path, compressor, level):
    """Exchanges submitted concurrently from an event loop: each job's records are contiguous and in order,
    at exactly the offsets and lengths the futures returned, with sound digests, from either compressor at
    either end of its scale."""
    rng = random.Random(level)
    path = str(tmp_path / f"thread-{compressor}-{level}.warc.gz")
    warc = WarcFile(path, {"software": "test"}, gzip_level=level, compressor=compressor)
    non_ascii = ("X-Name", "caf\u00e9")  # percent-encoded as warcio would

    async def exchange(i: int) -> tuple[list[str], list]:
        uri, date = f"http://example.test/t{i}", "2024-01-01T00:00:00.000000Z"
        request_id, response_id = new_record_id(), new_record_id()
        body = rng.randbytes(rng.choice([0, 10, 5_000, 300_000])) if i % 3 else b"<p>hello</p>" * rng.randrange(1, 900)
        headers = http_response_headers(200, "OK", [("Content-Length", str(len(body)))] + ([non_ascii] if i == 5
                                                                                          else []))
        records = [warc.request_record(uri, http_request_headers("GET", f"/t{i}", [("Host", "example.test")]),
                                       date, "127.0.0.1", request_id, response_id),
                   warc.response_record(uri, headers, body, date, "127.0.0.1", response_id, request_id),
                   warc.fetch_metadata_record(uri, date, response_id, i, "127.0.0.1", None, "success")]
        written = await warc.write(records)
        result = await warc.write([warc.result_record(uri, date, "fetched", json.dumps({"i": i}))])
        return [request_id, response_id], written + result

    async def main() -> list:
        return await asyncio.gather(*(exchange(i) for i in range(40)))

    jobs = asyncio.run(main())
    assert warc.records == 40 * 4
    warc.close()
    data = Path(path).read_bytes()
    found = {start: (end, rid, kind) for start, end, rid, kind, _ in boundaries(data)}
    assert len(found) == 1 + 40 * 4
    recs = read_warc(path)
    assert all(r["block_ok"] and r.get("payload_ok", True) for r in recs)
    assert sum("payload_ok" in r for r in recs) == 80  # requests and responses
    for (request_id, response_id), written in jobs:
        request, response, metadata, result = written
        assert response.offset == request.offset + request.length  # one job: contiguous
        assert metadata.offset == response.offset + response.length
        assert result.offset >= metadata.offset + metadata.length  # awaited after: lands later
        for record in written:
            assert found[record.offset][0] == record.offset + record.length
        assert [found[r.offset][1:] for r in written[:2]] == [(request_id, "request"), (response_id, "response")]
        assert [found[r.offset][2] for r in written[2:]] == ["metadata", "metadata"]
        payload = gzip.decompress(data[response.offset:response.offset + response.length])
        assert f"WARC-Payload-Digest: {response.payload_digest}\r\n".encode() in payload
    [odd] = [r for r in recs if r["type"] == WarcRecordType.response
             and r["headers"]["WARC-Target-URI"] == "http://example.test/t5"]
    assert b"\r\nX-Name: caf%C3%A9\r\n" in gzip.decompress(data[odd["offset"]:found[odd["offset"]][0]])
