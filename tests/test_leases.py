"""Leases and stale results (crawler/leases.py), pure: due, the version handed out, current, completes, and
which of two results for one (url_id, state_version) counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from crawler import leases

NOW = datetime(2024, 5, 10, 12, tzinfo=UTC)
EARLIER, LATER = NOW - timedelta(minutes=5), NOW + timedelta(minutes=5)


def test_due_when_its_time_came_and_no_other_segment_holds_a_live_lease():
    assert leases.is_due(EARLIER, None, None, NOW, "s2")
    assert leases.is_due(NOW, None, None, NOW, "s2")
    assert not leases.is_due(LATER, None, None, NOW, "s2")
    assert not leases.is_due(None, None, None, NOW, "s2")
    assert not leases.is_due(EARLIER, "s1", LATER, NOW, "s2")   # s1's lease is live
    assert leases.is_due(EARLIER, "s1", EARLIER, NOW, "s2")     # s1's lease expired
    assert leases.is_due(EARLIER, "s2", LATER, NOW, "s2")       # its own lease: a re-run of generate


def test_due_from_is_the_next_fetch_or_a_later_lease_expiry_and_due_holds_after_it():
    assert leases.due_from(LATER, None, None) == LATER
    assert leases.due_from(EARLIER, "s1", LATER) == LATER       # leased: due once the lease has expired
    assert leases.due_from(LATER, "s1", EARLIER) == LATER       # an expired lease: its next fetch
    assert leases.due_from(None, None, None) is None            # no next fetch
    assert leases.due_from(EARLIER, "s1", None) is None         # a lease without an expiry: until its row changes
    for row in ((LATER, None, None), (EARLIER, "s1", LATER), (LATER, "s1", EARLIER)):
        moment = leases.due_from(*row)
        assert not leases.is_due(*row, moment - timedelta(microseconds=1), "s2")
        assert leases.is_due(*row, moment + timedelta(microseconds=1), "s2")


def test_a_fetch_list_names_the_next_version_or_its_own_on_a_rerun():
    assert leases.leased_version(4, None, "s2") == 5
    assert leases.leased_version(4, "s1", "s2") == 5
    assert leases.leased_version(5, "s2", "s2") == 5


def test_a_result_completes_only_while_current_and_under_its_segments_lease():
    assert leases.is_current(5, 5) and not leases.is_current(5, 6) and not leases.is_current(5, None)
    assert leases.completes(5, 5, "s2", None, "s2")
    assert leases.completes(5, 5, None, "s2", "s2")       # an earlier run of this update completed it
    assert not leases.completes(5, 5, "s3", "s1", "s2")   # another segment took the URL over
    assert not leases.completes(5, 6, "s2", None, "s2")   # a later version exists: stale


def test_the_latest_fetch_counts_whatever_the_input_order():
    early = {"fetched_at": EARLIER, "warc_filename": "b", "warc_offset": 9, "outcome": "success"}
    late = {"fetched_at": NOW, "warc_filename": None, "warc_offset": None, "outcome": "network_error"}
    same_time_later_file = {"fetched_at": EARLIER, "warc_filename": "c", "warc_offset": 1, "outcome": "success"}
    for order in ([early, late, same_time_later_file], [same_time_later_file, late, early]):
        assert leases.latest_result(order) is late
    assert leases.latest_result([early, same_time_later_file]) is same_time_later_file
    unknown_time = {**late, "fetched_at": None}
    assert leases.latest_result([unknown_time, early]) is early  # a missing time sorts last


def test_a_segment_merged_after_its_leases_expired_completes_what_no_other_segment_took():
    """Backpressure's other half: a late update still merges the results whose version is current, and counts
    as stale those whose URL a later generate leased again after the expiry (the version it handed out is newer)."""
    version = leases.leased_version(4, None, "s1")
    assert leases.is_due(EARLIER, "s1", EARLIER, NOW, "s2")  # s1's lease expired: due again
    # Nobody generated in between: s1's result is still current and completes its URL.
    assert leases.completes(version, version, "s1", None, "s1")
    # s2 leased the URL again: the row is at s2's version, s1's result is stale.
    released = leases.leased_version(version, "s1", "s2")
    assert released == version + 1 and not leases.is_current(version, released)
    assert not leases.completes(version, released, "s2", None, "s1")
