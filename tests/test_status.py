"""The rules that read a response's status (crawler/status.py), pure: outcome, request made, transient, gone."""

from __future__ import annotations

import pytest

from crawler.status import (
    FetchOutcome,
    is_gone,
    is_transient,
    is_transient_status,
    is_unchanged,
    made_request,
    outcome_for_status,
)


@pytest.mark.parametrize(("status", "outcome"), [
    (None, FetchOutcome.NETWORK_ERROR), (200, FetchOutcome.SUCCESS), (204, FetchOutcome.SUCCESS),
    (299, FetchOutcome.SUCCESS), (301, FetchOutcome.REDIRECT), (308, FetchOutcome.REDIRECT),
    (304, FetchOutcome.NOT_MODIFIED), (404, FetchOutcome.HTTP_ERROR), (429, FetchOutcome.HTTP_ERROR),
    (503, FetchOutcome.HTTP_ERROR), (100, FetchOutcome.HTTP_ERROR), (999, FetchOutcome.HTTP_ERROR),
])
def test_outcome_for_status(status, outcome):
    assert outcome_for_status(status) is outcome


def test_only_outcomes_that_reached_the_server_made_a_request():
    made = {o for o in FetchOutcome if made_request(o.value)}
    assert made == {FetchOutcome.SUCCESS, FetchOutcome.NOT_MODIFIED, FetchOutcome.IDENTICAL_PAYLOAD,
                    FetchOutcome.REDIRECT, FetchOutcome.HTTP_ERROR, FetchOutcome.NETWORK_ERROR}
    assert not made_request("robots_denied") and not made_request("blocked") and not made_request("deferred")


def test_a_304_and_an_identical_payload_are_the_unchanged_outcomes():
    assert {o for o in FetchOutcome if is_unchanged(o.value)} == {FetchOutcome.NOT_MODIFIED,
                                                                  FetchOutcome.IDENTICAL_PAYLOAD}


def test_transient_results_are_network_errors_429_and_5xx_of_a_request():
    assert is_transient("network_error", None)
    assert all(is_transient("http_error", code) for code in (429, 500, 502, 503, 599))
    assert not any(is_transient("http_error", code) for code in (400, 403, 404, 410, 451))
    # The same statuses without a request (or with a success) are no failure of the host.
    assert not is_transient("robots_denied", None) and not is_transient("deferred", None)
    assert not is_transient("success", 200) and not is_transient("redirect", 301)
    # The gate's form, by status alone, says the same for every status a request can end with.
    for code in (None, 200, 301, 304, 404, 429, 500, 503):
        assert is_transient_status(code) == is_transient(outcome_for_status(code).value, code)


def test_gone_is_404_and_410_only():
    assert is_gone("http_error", 404) and is_gone("http_error", 410)
    assert not is_gone("http_error", 403) and not is_gone("success", 200) and not is_gone("network_error", None)
