"""The stored-payload rules alone (crawler/payloads.py): when a 200 is an identical-payload revisit and of which
record, what a result leaves of the stored payload, and which record's segment keeps it handed out. Their SQL twins:
tests/test_rule_twins.py; the daemon against the farm: tests/test_fetchd_revisits.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from crawler.payloads import (
    StoredPayload,
    StoredRecord,
    is_identical_payload,
    may_be_identical,
    record_segment,
    reference_in_force,
    stored_after,
)

URL = "http://a.test/page"
AT = datetime(2026, 12, 1, tzinfo=UTC)
STORED = StoredPayload("sha1:AAAA", URL, AT)


@pytest.mark.parametrize(("status", "truncated", "digest", "captured", "stored", "identical"), [
    (200, False, "sha1:AAAA", URL, STORED, True),
    (200, False, "sha1:BBBB", URL, STORED, False),              # changed
    (200, True, "sha1:AAAA", URL, STORED, False),               # a truncated payload is never identical
    (200, False, "sha1:AAAA", "http://a.test/other", STORED, False),  # the stored record is another URL's
    (200, False, "sha1:AAAA", URL, None, False),                # nothing stored
    (203, False, "sha1:AAAA", URL, STORED, False),              # only a 200
    (304, False, None, URL, STORED, False),                     # a 304 is a revisit of its own kind
    (200, False, None, URL, STORED, False),
])
def test_a_200_is_an_identical_payload_only_of_the_urls_own_complete_record(status, truncated, digest, captured,
                                                                            stored, identical):
    assert is_identical_payload(status, truncated, digest, captured, stored) is identical
    if identical:
        assert may_be_identical(status, truncated, captured, stored)


def test_the_fetch_list_names_a_stored_payload_only_with_its_record():
    assert StoredPayload.of({"stored_payload_digest": "sha1:AAAA", "stored_target_uri": URL,
                             "stored_warc_date": AT}) == STORED
    assert StoredPayload.of({"stored_payload_digest": "sha1:AAAA"}) is None  # a digest without its record
    assert StoredPayload.of({}) is None
    assert STORED.refers_to(URL) is STORED and STORED.refers_to("http://a.test/other") is None


def test_only_a_complete_response_stored_in_full_becomes_the_stored_payload():
    before = StoredRecord("sha1:OLD", URL, AT, "segments/s0/warc/bucket=00000/a.warc.gz")
    file = "segments/s1/warc/bucket=00000/b.warc.gz"
    assert stored_after("success", False, "sha1:NEW", file, URL, None, AT, before) == StoredRecord(
        "sha1:NEW", URL, AT, file)
    assert stored_after("success", False, "sha1:NEW", file, URL, "http://a.test/final", AT, before).target_uri == \
        "http://a.test/final"  # a same-host redirect followed: the record is the final hop's
    for outcome, truncated in (("success", True), ("identical_payload", False), ("not_modified", False),
                               ("http_error", False), ("network_error", False), ("deferred", False)):
        assert stored_after(outcome, truncated, "sha1:NEW", file, URL, None, AT, before) == before
    assert stored_after("success", False, "sha1:NEW", None, URL, None, AT, before) == before


def test_a_stored_payload_is_handed_out_while_its_records_segment_is_there():
    name = "segments/seg-1/warc/bucket=00003/x.warc.gz"
    assert record_segment(name) == "seg-1"
    assert record_segment(None) is None and record_segment("elsewhere/seg-1/warc/x.warc.gz") is None
    assert reference_in_force(name, {"seg-1", "seg-2"})
    assert not reference_in_force(name, {"seg-2"}) and not reference_in_force(None, {"seg-1"})
