"""Identical-payload revisits: the daemon against the site farm on loopback, twice over the same URLs, judged from
the farm's own truth (which pages it serves unchanged without honouring validators, which change, which it answers
with a 304), the WARC files read back by warcio and fastwarc. The second fetch list carries what update and generate
hand over (validators, the last fetch, the stored payload: `crawler.payloads.stored_after`); the Spark side of those
columns is tested in tests/test_update.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator as FastIterator
from fastwarc.warc import WarcRecordType
from warcio.archiveiterator import ArchiveIterator

from crawler import payloads
from crawler.status import FetchOutcome
from fetchd.commands import fetch_segment
from fetchd.warc import IDENTICAL_PAYLOAD_PROFILE, NOT_MODIFIED_PROFILE
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec
from tests.support.fetchlists import by_url, read_results, record_at, write_fetchlist

FIRST, SECOND = "seg-first", "seg-second"


def _refetch_items(rows: list[dict]) -> list[dict]:
    """The second fetch list from the first segment's results, as update keeps them in `urls` and generate hands
    them out: validators, the last fetch and the stored payload of a complete response."""
    items = []
    for row in rows:
        kept = payloads.stored_after(row["outcome"], row["truncated"], row["payload_digest"], row["warc_filename"],
                                     row["url"], row["redirect_to"], row["fetched_at"], payloads.StoredRecord())
        items.append({"url": row["url"], "etag": row["etag"], "last_modified": row["last_modified"],
                      "last_fetch_at": row["fetched_at"], "stored_payload_digest": kept.digest,
                      "stored_target_uri": kept.target_uri, "stored_warc_date": kept.warc_date})
    return items


@pytest.fixture(scope="module")
def recrawl(tmp_path_factory, base_conf):
    root = str(tmp_path_factory.mktemp("revisit-root"))
    farm = SiteFarm(FarmSpec(hosts=3, pages_per_host=12, latency_s=0.002, validators=True, changing_share=0.3),
                    os.path.join(root, "farm.jsonl"))
    farm.start()
    try:
        conf = base_conf.with_overrides({"politeness.min_delay_s": 0.02, "fetch.static_hosts": farm.static_hosts()})
        listed = sorted(farm.page_urls() | set(farm.sitemap_urls()) | farm.orphan_urls())
        write_fetchlist(root, FIRST, [{"url": u} for u in listed], conf.crawl.buckets)
        fetch_segment(conf, root, FIRST)
        first = read_results(root, FIRST)
        write_fetchlist(root, SECOND, _refetch_items(first), conf.crawl.buckets)
        fetch_segment(conf, root, SECOND)
        yield {"root": root, "farm": farm, "conf": conf, "first": by_url(first),
               "second": by_url(read_results(root, SECOND))}
    finally:
        farm.stop()


def test_every_page_served_unchanged_without_validators_is_a_revisit_record_of_its_own_first_capture(recrawl):
    root, farm, first, second = recrawl["root"], recrawl["farm"], recrawl["first"], recrawl["second"]
    # every one stored in full the first time (a sitemap's gzip file fetched as a page is cut: never a revisit)
    unchanged = {url for url in farm.served_unchanged_without_validators() if url in first
                 and first[url]["outcome"] == "success" and not first[url]["truncated"]}
    assert len(unchanged) > 20
    for url in unchanged:
        row, original = second[url], first[url]
        assert row["outcome"] == FetchOutcome.IDENTICAL_PAYLOAD.value and row["status_code"] == 200, url
        assert row["payload_digest"] == original["payload_digest"]
        record = record_at(root, row["warc_filename"], row["warc_offset"])
        assert record.record_type == WarcRecordType.revisit
        assert record.headers["WARC-Profile"] == IDENTICAL_PAYLOAD_PROFILE
        assert record.headers["WARC-Refers-To-Target-URI"] == url
        assert record.headers["WARC-Payload-Digest"] == original["payload_digest"]
        first_record = record_at(root, original["warc_filename"], original["warc_offset"])
        assert first_record.record_type == WarcRecordType.response
        assert record.headers["WARC-Refers-To-Date"] == first_record.headers["WARC-Date"]
        assert record.http_headers.status_code == 200  # the headers kept
        assert record.http_headers.get("Content-Type") == first_record.http_headers.get("Content-Type")
        assert record.reader.read() == b""  # no payload


def test_changed_pages_are_stored_again_and_honoured_validators_give_304_revisits(recrawl):
    root, farm, first, second = recrawl["root"], recrawl["farm"], recrawl["first"], recrawl["second"]
    changing = {url for url in farm.changing_urls() if first.get(url, {}).get("outcome") == "success"}
    not_modified = {url for url in farm.served_not_modified() if first.get(url, {}).get("outcome") == "success"
                    and not first[url]["truncated"]}
    assert len(changing) > 5 and len(not_modified) > 5
    for url in changing:
        assert second[url]["outcome"] == "success" and second[url]["payload_digest"] != first[url]["payload_digest"]
        assert record_at(root, second[url]["warc_filename"], second[url]["warc_offset"]).record_type == \
            WarcRecordType.response
    for url in not_modified:
        row = second[url]
        assert row["outcome"] == "not_modified" and row["status_code"] == 304, url
        record = record_at(root, row["warc_filename"], row["warc_offset"])
        assert record.headers["WARC-Profile"] == NOT_MODIFIED_PROFILE
        first_record = record_at(root, first[url]["warc_filename"], first[url]["warc_offset"])
        assert record.headers["WARC-Refers-To-Date"] == first_record.headers["WARC-Date"]
        # the stored capture's digest, so replay finds the original by URL and digest as for an identical payload
        assert record.headers["WARC-Payload-Digest"] == first[url]["payload_digest"]
    outcomes = Counter(row["outcome"] for row in second.values())
    assert outcomes["identical_payload"] == len(farm.served_unchanged_without_validators() & {
        url for url, row in first.items() if row["outcome"] == "success" and not row["truncated"]})


def _warc_files(root: str, segment: str) -> list[str]:
    folder = os.path.join(root, "segments", segment, "warc")
    return sorted(os.path.join(d, n) for d, _, names in os.walk(folder) for n in names if n.endswith(".warc.gz"))


def test_the_recrawls_warc_files_read_back_with_warcio_digests_checked_and_fastwarc(recrawl):
    files = _warc_files(recrawl["root"], SECOND)
    assert files
    revisits = {"warcio": Counter(), "fastwarc": Counter()}
    for path in files:
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh, check_digests="raise"):
                if record.rec_type == "revisit":
                    revisits["warcio"][record.rec_headers.get_header("WARC-Profile")] += 1
                    assert record.http_headers.get_statuscode() in ("200", "304")
                    assert record.content_stream().read() == b""
        with open(path, "rb") as fh:
            for record in FastIterator(fh, parse_http=False):
                assert record.verify_block_digest()
                if record.record_type == WarcRecordType.revisit:
                    revisits["fastwarc"][record.headers["WARC-Profile"]] += 1
    assert revisits["warcio"] == revisits["fastwarc"]
    checked = subprocess.run([str(Path(sys.executable).with_name("warcio")), "check", *files], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # `warcio check`: every digest it can check
    outcomes = Counter(row["outcome"] for row in recrawl["second"].values())
    assert revisits["warcio"][IDENTICAL_PAYLOAD_PROFILE] == outcomes["identical_payload"] > 20
    assert revisits["warcio"][NOT_MODIFIED_PROFILE] == outcomes["not_modified"] > 5


def test_a_revisit_is_smaller_than_the_response_it_stands_for(recrawl):
    first, second = recrawl["first"], recrawl["second"]
    pairs = [(first[url], row) for url, row in second.items() if row["outcome"] == "identical_payload"]
    assert pairs and all(revisit["warc_length"] < original["warc_length"] for original, revisit in pairs)


# ---- bad input: each a recorded outcome, never a revisit to the wrong record, never an exception ----------------


@pytest.fixture
def farm(tmp_path):
    farm = SiteFarm(FarmSpec(hosts=1, pages_per_host=3, latency_s=0.0, sitemaps=False),
                    str(tmp_path / "farm.jsonl"))
    farm.start()
    yield farm
    farm.stop()


def _first_fetch(farm, base_conf, root, **overrides):
    conf = base_conf.with_overrides({"politeness.min_delay_s": 0.01, "fetch.static_hosts": farm.static_hosts(),
                                     **overrides})
    pages = sorted(url for url in farm.page_urls() if "/section/0/page-" in url)
    write_fetchlist(root, FIRST, [{"url": u} for u in pages], conf.crawl.buckets)
    fetch_segment(conf, root, FIRST)
    return conf, pages, by_url(read_results(root, FIRST))


def test_another_urls_record_and_a_digest_without_its_record_are_stored_in_full(farm, base_conf, root):
    conf, pages, first = _first_fetch(farm, base_conf, root)
    a, b, c = pages[:3]
    assert all(first[u]["outcome"] == "success" and not first[u]["truncated"] for u in (a, b, c))
    items = [
        # b's list names a's record with b's own digest: a digest "collision" across URLs is never a revisit
        {"url": b, "stored_payload_digest": first[b]["payload_digest"], "stored_target_uri": a,
         "stored_warc_date": first[a]["fetched_at"]},
        # a digest without the record that holds it: nothing to refer to
        {"url": c, "stored_payload_digest": first[c]["payload_digest"]},
        # the URL's own record: a revisit
        {"url": a, "stored_payload_digest": first[a]["payload_digest"], "stored_target_uri": a,
         "stored_warc_date": first[a]["fetched_at"]},
    ]
    write_fetchlist(root, SECOND, items, conf.crawl.buckets)
    fetch_segment(conf, root, SECOND)
    second = by_url(read_results(root, SECOND))
    assert second[a]["outcome"] == "identical_payload"
    for url in (b, c):
        row = second[url]
        assert row["outcome"] == "success" and row["payload_digest"] == first[url]["payload_digest"]
        assert record_at(root, row["warc_filename"], row["warc_offset"]).record_type == WarcRecordType.response


def test_a_truncated_body_is_never_a_revisit(farm, base_conf, root):
    conf, pages, first = _first_fetch(farm, base_conf, root, **{"fetch.max_body_bytes": 600})
    url = pages[0]
    assert first[url]["truncated"]
    # even a list that names the truncated payload as the stored one (update never keeps it: stored_after)
    assert payloads.stored_after("success", True, first[url]["payload_digest"], first[url]["warc_filename"], url,
                                 None, first[url]["fetched_at"], payloads.StoredRecord()) == payloads.StoredRecord()
    write_fetchlist(root, SECOND, [{"url": url, "stored_payload_digest": first[url]["payload_digest"],
                                    "stored_target_uri": url, "stored_warc_date": first[url]["fetched_at"]}],
                    conf.crawl.buckets)
    fetch_segment(conf, root, SECOND)
    [row] = read_results(root, SECOND)
    assert row["outcome"] == "success" and row["truncated"]
    assert row["payload_digest"] == first[url]["payload_digest"]  # the same cut bytes, stored again in full
    record = record_at(root, row["warc_filename"], row["warc_offset"])
    assert record.record_type == WarcRecordType.response and record.headers["WARC-Truncated"] == "length"
