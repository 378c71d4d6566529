"""The revisit policy and the index event kinds as one state-transition matrix, Nutch style: every previous URL
status x fetch outcome x status code class, as a page and as a sitemap file, each cell checked against the tables
below, written by hand.

A URL's previous row is the typical row of its status (PREVIOUS); a result is a fetch outcome with a status code of
one class, and for a 2xx what the page's content hash says (RESULTS). The (outcome, code class) pairs that are in no
result are the ones the daemon never writes: a requested outcome always matches its status code
(`crawler.status.outcome_for_status`), and an outcome without a request has no status code.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from crawler.frontier import index_event_kind
from crawler.revisit import PreviousState, RevisitPolicy
from crawler.status import FetchOutcome, UrlStatus, made_request, outcome_for_status

DAY, HOUR = 86400, 3600
FETCHED_AT = datetime(2026, 3, 1, 12, tzinfo=UTC)
ROBOTS_EXPIRES_AT = FETCHED_AT + timedelta(hours=5)  # the host's robots policy in force expires 5 h after the fetch

POLICY = RevisitPolicy(
    default_interval_s=7 * DAY, min_interval_s=1 * DAY, max_interval_s=30 * DAY, changed_factor=0.5,
    unchanged_factor=1.5, retry_base_s=1 * HOUR, retry_jitter=0.0, max_failures=4, failed_interval_s=30 * DAY,
    gone_interval_s=90 * DAY, robots_denied_interval_s=1 * DAY, sitemap_min_interval_s=15 * 60,
    sitemap_max_interval_s=1 * DAY,
)

# The typical row of each status before the result: (interval, failure count, content hash of the last content).
PREVIOUS = {
    UrlStatus.UNFETCHED: (7 * DAY, 0, None),
    UrlStatus.FETCHED: (4 * DAY, 0, "h1"),
    UrlStatus.NOT_MODIFIED: (4 * DAY, 0, "h1"),
    UrlStatus.REDIRECT: (7 * DAY, 0, None),
    UrlStatus.GONE: (90 * DAY, 0, "h1"),
    UrlStatus.RETRY: (4 * DAY, 2, "h1"),
    UrlStatus.FAILED: (30 * DAY, 4, "h1"),
    UrlStatus.ROBOTS_DENIED: (1 * DAY, 0, None),
    UrlStatus.EXCLUDED: (30 * DAY, 0, None),
}

# A result: (outcome, status code, the new page's content hash, the representative dedup named for it).
RESULTS = {
    "200-same": (FetchOutcome.SUCCESS, 200, "h1", None),
    "200-new": (FetchOutcome.SUCCESS, 200, "h2", None),
    "200-duplicate": (FetchOutcome.SUCCESS, 200, "h2", "rep"),
    "200-no-page": (FetchOutcome.SUCCESS, 200, None, None),  # no page row (not parsed): no content hash
    "304": (FetchOutcome.NOT_MODIFIED, 304, None, None),
    "200-identical": (FetchOutcome.IDENTICAL_PAYLOAD, 200, None, None),  # the stored payload again: a revisit record
    "301": (FetchOutcome.REDIRECT, 301, None, None),
    "404": (FetchOutcome.HTTP_ERROR, 404, None, None),
    "410": (FetchOutcome.HTTP_ERROR, 410, None, None),
    "403": (FetchOutcome.HTTP_ERROR, 403, None, None),
    "429": (FetchOutcome.HTTP_ERROR, 429, None, None),
    "503": (FetchOutcome.HTTP_ERROR, 503, None, None),
    "no-response": (FetchOutcome.NETWORK_ERROR, None, None, None),
    "robots-denied": (FetchOutcome.ROBOTS_DENIED, None, None, None),
    "blocked": (FetchOutcome.BLOCKED, None, None, None),
    "deferred": (FetchOutcome.DEFERRED, None, None, None),
}

# One status code of each class, and none (no response).
STATUS_CODE_CLASSES = (None, 200, 301, 304, 403, 404, 410, 429, 503)

# Each cell: the URL's new status, stored interval, wait until its next fetch, failure count, and its index event
# (- none). Intervals and waits in days (d) or hours (h).
TRANSITIONS = """
previous       result         status         interval  wait   failures  event
unfetched      200-same       fetched        7d        7d     0         fetched
fetched        200-same       fetched        6d        6d     0         not_modified
not_modified   200-same       fetched        6d        6d     0         not_modified
redirect       200-same       fetched        7d        7d     0         fetched
gone           200-same       fetched        30d       30d    0         not_modified
retry          200-same       fetched        6d        6d     0         not_modified
failed         200-same       fetched        30d       30d    0         not_modified
robots_denied  200-same       fetched        7d        7d     0         fetched
excluded       200-same       fetched        7d        7d     0         fetched

unfetched      200-new        fetched        7d        7d     0         fetched
fetched        200-new        fetched        2d        2d     0         changed
not_modified   200-new        fetched        2d        2d     0         changed
redirect       200-new        fetched        7d        7d     0         fetched
gone           200-new        fetched        30d       30d    0         changed
retry          200-new        fetched        2d        2d     0         changed
failed         200-new        fetched        15d       15d    0         changed
robots_denied  200-new        fetched        7d        7d     0         fetched
excluded       200-new        fetched        7d        7d     0         fetched

unfetched      200-duplicate  fetched        7d        7d     0         duplicate
fetched        200-duplicate  fetched        2d        2d     0         duplicate
not_modified   200-duplicate  fetched        2d        2d     0         duplicate
redirect       200-duplicate  fetched        7d        7d     0         duplicate
gone           200-duplicate  fetched        30d       30d    0         duplicate
retry          200-duplicate  fetched        2d        2d     0         duplicate
failed         200-duplicate  fetched        15d       15d    0         duplicate
robots_denied  200-duplicate  fetched        7d        7d     0         duplicate
excluded       200-duplicate  fetched        7d        7d     0         duplicate

unfetched      200-no-page    fetched        7d        7d     0         -
fetched        200-no-page    fetched        4d        4d     0         -
not_modified   200-no-page    fetched        4d        4d     0         -
redirect       200-no-page    fetched        7d        7d     0         -
gone           200-no-page    fetched        30d       30d    0         -
retry          200-no-page    fetched        4d        4d     0         -
failed         200-no-page    fetched        30d       30d    0         -
robots_denied  200-no-page    fetched        7d        7d     0         -
excluded       200-no-page    fetched        7d        7d     0         -

unfetched      304            not_modified   10.5d     10.5d  0         not_modified
fetched        304            not_modified   6d        6d     0         not_modified
not_modified   304            not_modified   6d        6d     0         not_modified
redirect       304            not_modified   10.5d     10.5d  0         not_modified
gone           304            not_modified   30d       30d    0         not_modified
retry          304            not_modified   6d        6d     0         not_modified
failed         304            not_modified   30d       30d    0         not_modified
robots_denied  304            not_modified   1.5d      1.5d   0         not_modified
excluded       304            not_modified   30d       30d    0         not_modified

unfetched      200-identical  not_modified   10.5d     10.5d  0         not_modified
fetched        200-identical  not_modified   6d        6d     0         not_modified
not_modified   200-identical  not_modified   6d        6d     0         not_modified
redirect       200-identical  not_modified   10.5d     10.5d  0         not_modified
gone           200-identical  not_modified   30d       30d    0         not_modified
retry          200-identical  not_modified   6d        6d     0         not_modified
failed         200-identical  not_modified   30d       30d    0         not_modified
robots_denied  200-identical  not_modified   1.5d      1.5d   0         not_modified
excluded       200-identical  not_modified   30d       30d    0         not_modified

unfetched      301            redirect       7d        7d     0         -
fetched        301            redirect       7d        7d     0         -
not_modified   301            redirect       7d        7d     0         -
redirect       301            redirect       7d        7d     0         -
gone           301            redirect       7d        7d     0         -
retry          301            redirect       7d        7d     0         -
failed         301            redirect       7d        7d     0         -
robots_denied  301            redirect       7d        7d     0         -
excluded       301            redirect       7d        7d     0         -

unfetched      404            gone           90d       90d    0         gone
fetched        404            gone           90d       90d    0         gone
not_modified   404            gone           90d       90d    0         gone
redirect       404            gone           90d       90d    0         gone
gone           404            gone           90d       90d    0         gone
retry          404            gone           90d       90d    0         gone
failed         404            gone           90d       90d    0         gone
robots_denied  404            gone           90d       90d    0         gone
excluded       404            gone           90d       90d    0         gone

unfetched      410            gone           90d       90d    0         gone
fetched        410            gone           90d       90d    0         gone
not_modified   410            gone           90d       90d    0         gone
redirect       410            gone           90d       90d    0         gone
gone           410            gone           90d       90d    0         gone
retry          410            gone           90d       90d    0         gone
failed         410            gone           90d       90d    0         gone
robots_denied  410            gone           90d       90d    0         gone
excluded       410            gone           90d       90d    0         gone

unfetched      403            excluded       30d       30d    0         -
fetched        403            excluded       30d       30d    0         -
not_modified   403            excluded       30d       30d    0         -
redirect       403            excluded       30d       30d    0         -
gone           403            excluded       30d       30d    0         -
retry          403            excluded       30d       30d    0         -
failed         403            excluded       30d       30d    0         -
robots_denied  403            excluded       30d       30d    0         -
excluded       403            excluded       30d       30d    0         -

unfetched      429            retry          7d        1h     1         -
fetched        429            retry          4d        1h     1         -
not_modified   429            retry          4d        1h     1         -
redirect       429            retry          7d        1h     1         -
gone           429            retry          90d       1h     1         -
retry          429            retry          4d        4h     3         -
failed         429            failed         30d       30d    5         -
robots_denied  429            retry          1d        1h     1         -
excluded       429            retry          30d       1h     1         -

unfetched      503            retry          7d        1h     1         -
fetched        503            retry          4d        1h     1         -
not_modified   503            retry          4d        1h     1         -
redirect       503            retry          7d        1h     1         -
gone           503            retry          90d       1h     1         -
retry          503            retry          4d        4h     3         -
failed         503            failed         30d       30d    5         -
robots_denied  503            retry          1d        1h     1         -
excluded       503            retry          30d       1h     1         -

unfetched      no-response    retry          7d        1h     1         -
fetched        no-response    retry          4d        1h     1         -
not_modified   no-response    retry          4d        1h     1         -
redirect       no-response    retry          7d        1h     1         -
gone           no-response    retry          90d       1h     1         -
retry          no-response    retry          4d        4h     3         -
failed         no-response    failed         30d       30d    5         -
robots_denied  no-response    retry          1d        1h     1         -
excluded       no-response    retry          30d       1h     1         -

unfetched      robots-denied  robots_denied  1d        5h     0         -
fetched        robots-denied  robots_denied  1d        5h     0         -
not_modified   robots-denied  robots_denied  1d        5h     0         -
redirect       robots-denied  robots_denied  1d        5h     0         -
gone           robots-denied  robots_denied  1d        5h     0         -
retry          robots-denied  robots_denied  1d        5h     2         -
failed         robots-denied  robots_denied  1d        5h     4         -
robots_denied  robots-denied  robots_denied  1d        5h     0         -
excluded       robots-denied  robots_denied  1d        5h     0         -

unfetched      blocked        excluded       30d       30d    0         -
fetched        blocked        excluded       30d       30d    0         -
not_modified   blocked        excluded       30d       30d    0         -
redirect       blocked        excluded       30d       30d    0         -
gone           blocked        excluded       30d       30d    0         -
retry          blocked        excluded       30d       30d    2         -
failed         blocked        excluded       30d       30d    4         -
robots_denied  blocked        excluded       30d       30d    0         -
excluded       blocked        excluded       30d       30d    0         -

unfetched      deferred       unfetched      7d        0      0         -
fetched        deferred       fetched        4d        0      0         -
not_modified   deferred       not_modified   4d        0      0         -
redirect       deferred       redirect       7d        0      0         -
gone           deferred       gone           90d       0      0         -
retry          deferred       retry          4d        0      2         -
failed         deferred       failed         30d       0      4         -
robots_denied  deferred       robots_denied  1d        0      0         -
excluded       deferred       excluded       30d       0      0         -
"""


# A sitemap file's cells where they differ from a page's: what it read adapts between the sitemap clamps (15
# minutes, a day), and its first content starts at the lower one; status, failures and every other cell are the
# page's, and a sitemap file has no index event.
SITEMAP_TRANSITIONS = """
previous       result         interval  wait
unfetched      200-same       15m       15m
fetched        200-same       1d        1d
not_modified   200-same       1d        1d
redirect       200-same       15m       15m
gone           200-same       1d        1d
retry          200-same       1d        1d
failed         200-same       1d        1d
robots_denied  200-same       15m       15m
excluded       200-same       15m       15m

unfetched      200-new        15m       15m
fetched        200-new        1d        1d
not_modified   200-new        1d        1d
redirect       200-new        15m       15m
gone           200-new        1d        1d
retry          200-new        1d        1d
failed         200-new        1d        1d
robots_denied  200-new        15m       15m
excluded       200-new        15m       15m

unfetched      200-duplicate  15m       15m
fetched        200-duplicate  1d        1d
not_modified   200-duplicate  1d        1d
redirect       200-duplicate  15m       15m
gone           200-duplicate  1d        1d
retry          200-duplicate  1d        1d
failed         200-duplicate  1d        1d
robots_denied  200-duplicate  15m       15m
excluded       200-duplicate  15m       15m

unfetched      200-no-page    15m       15m
fetched        200-no-page    1d        1d
not_modified   200-no-page    1d        1d
redirect       200-no-page    15m       15m
gone           200-no-page    1d        1d
retry          200-no-page    1d        1d
failed         200-no-page    1d        1d
robots_denied  200-no-page    15m       15m
excluded       200-no-page    15m       15m

unfetched      304            1d        1d
fetched        304            1d        1d
not_modified   304            1d        1d
redirect       304            1d        1d
gone           304            1d        1d
retry          304            1d        1d
failed         304            1d        1d
robots_denied  304            1d        1d
excluded       304            1d        1d

unfetched      200-identical  1d        1d
fetched        200-identical  1d        1d
not_modified   200-identical  1d        1d
redirect       200-identical  1d        1d
gone           200-identical  1d        1d
retry          200-identical  1d        1d
failed         200-identical  1d        1d
robots_denied  200-identical  1d        1d
excluded       200-identical  1d        1d
"""


def _duration(text: str) -> int:
    return 0 if text == "0" else round(float(text[:-1]) * {"d": DAY, "h": HOUR, "m": 60}[text[-1]])


ROWS = [line.split() for line in TRANSITIONS.strip().splitlines()[1:] if line.strip()]
EXPECTED = {(previous, result): (status, _duration(interval), _duration(wait), int(failures),
                                 None if event == "-" else event)
            for previous, result, status, interval, wait, failures, event in ROWS}
SITEMAP_ROWS = [line.split() for line in SITEMAP_TRANSITIONS.strip().splitlines()[1:] if line.strip()]
SITEMAP_EXPECTED = {**{cell: (status, interval, wait, failures, None)
                       for cell, (status, interval, wait, failures, _) in EXPECTED.items()},
                    **{(previous, result): (EXPECTED[(previous, result)][0], _duration(interval), _duration(wait),
                                            EXPECTED[(previous, result)][3], None)
                       for previous, result, interval, wait in SITEMAP_ROWS}}


def test_the_table_has_one_cell_for_every_previous_status_and_result():
    assert len(EXPECTED) == len(ROWS), "a cell is in the table twice"
    sitemap_cells = [(previous, result) for previous, result, _, _ in SITEMAP_ROWS]
    assert len(set(sitemap_cells)) == len(sitemap_cells) and set(sitemap_cells) <= set(EXPECTED)
    assert set(EXPECTED) == {(s.value, r) for s in UrlStatus for r in RESULTS}
    assert set(PREVIOUS) == set(UrlStatus)


def test_the_results_are_every_outcome_and_status_code_class_the_daemon_writes():
    # A requested outcome matches its status code, but for a 200 whose payload is the stored one (crawler.payloads).
    written = {(outcome, code) for outcome, code in itertools.product(FetchOutcome, STATUS_CODE_CLASSES)
               if (outcome_for_status(code) == outcome if made_request(outcome) else code is None)
               or (outcome, code) == (FetchOutcome.IDENTICAL_PAYLOAD, 200)}
    assert {(outcome, code) for outcome, code, _, _ in RESULTS.values()} == written


def test_every_transition():
    """Every previous status x outcome x status code class, as a page and as a sitemap file: the decision and the
    event of its table (a sitemap file's differs where SITEMAP_TRANSITIONS says, and it has no event). Every wrong
    cell is listed."""
    wrong, checked = [], 0
    for status, outcome, code, sitemap in itertools.product(UrlStatus, FetchOutcome, STATUS_CODE_CLASSES,
                                                            (False, True)):
        interval, failures, content_hash = PREVIOUS[status]
        for name, (_, _, new_hash, duplicate_of) in _results_of(outcome, code).items():
            decision = POLICY.decide(outcome.value, code, PreviousState(status.value, interval, failures,
                                                                        content_hash, is_sitemap=sitemap),
                                     FETCHED_AT, new_hash, ROBOTS_EXPIRES_AT)
            event = index_event_kind(outcome.value, code, content_hash, new_hash, duplicate_of,
                                     "robots http://a.test" if sitemap else None)
            got = (decision.status, int((decision.next_fetch_at - FETCHED_AT).total_seconds()),
                   decision.fetch_interval_s, decision.failure_count, event)
            new_status, new_interval, wait, new_failures, new_event = (SITEMAP_EXPECTED if sitemap
                                                                        else EXPECTED)[(status.value, name)]
            expected = (new_status, wait, new_interval, new_failures, new_event)
            checked += 1
            if got != expected:
                wrong.append(f"{status.value} + {name}{' (sitemap)' if sitemap else ''}: {got} != {expected}")
    assert not wrong, "\n".join(wrong)
    assert checked == 2 * len(EXPECTED)


def _results_of(outcome: FetchOutcome, code: int | None) -> dict[str, tuple]:
    return {name: result for name, result in RESULTS.items() if (result[0], result[1]) == (outcome, code)}
