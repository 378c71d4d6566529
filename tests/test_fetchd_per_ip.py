"""The per-IP guard against a real loopback server: ten host names on one address, judged from the server's log.

Each name has its own politeness gate (no delay, two requests in flight); under
`politeness.max_concurrency_per_ip` / `min_delay_per_ip_s` the address they share gets one allowance across all
of them and across the buckets the daemon process fetches. The exact timing rules are checked on the virtual clock
(`tests/test_scheduling.py`); here the server's log shows what reached the address: the requests in flight at any
moment, and (a lower bound on two busy cores) nothing sooner than the address's delay after the end of the last.
"""

from __future__ import annotations

import pytest

from fetchd.commands import fetch_segment
from tests.support.fetchlists import by_url, read_results, write_fetchlist
from tests.support.servers import ScriptedServer, slow_pages

SEGMENT = "seg-per-ip"
ADDRESS = "127.0.0.3"  # its own loopback address: no other test's server listens there
NAMES = [f"name{i}.shared.test" for i in range(10)]
PAGES = 3
PAGE_SECONDS = 0.15


@pytest.fixture
def shared_server():
    server = ScriptedServer(slow_pages(PAGE_SECONDS), addresses=(ADDRESS,))
    yield server
    server.stop()


def _in_flight_peak(log: list[dict]) -> int:
    """Most requests the server had open at once (a request is open from its start to its end)."""
    events = sorted([(r["start"], 1) for r in log] + [(r["end"], -1) for r in log], key=lambda e: (e[0], e[1]))
    peak = open_now = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


@pytest.mark.parametrize("per_ip, delay_s", [(2, 0.0), (1, 0.1)], ids=["concurrency-2", "one-at-a-time-0.1s"])
def test_ten_names_on_one_address_share_its_allowance(shared_server, base_conf, root, per_ip, delay_s):
    conf = base_conf.with_overrides({
        "politeness.min_delay_s": 0.0,
        "politeness.max_concurrency_per_host": 2,
        "politeness.max_concurrency_per_ip": per_ip,
        "politeness.min_delay_per_ip_s": delay_s,
        "fetch.static_hosts": {name: ADDRESS for name in NAMES},
    })
    urls = [shared_server.url(name, f"/page/{i}") for name in NAMES for i in range(PAGES)]
    write_fetchlist(root, SEGMENT, [{"url": url} for url in urls], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)

    rows = by_url(read_results(root, SEGMENT))
    assert {url: rows[url]["outcome"] for url in urls} == dict.fromkeys(urls, "success")
    log = sorted(shared_server.log, key=lambda r: r["start"])
    assert {r["local"] for r in log} == {ADDRESS}
    assert len(log) == len(NAMES) * (PAGES + 1)  # each page once, and each name's robots.txt
    assert _in_flight_peak(log) <= per_ip
    for i, request in enumerate(log):
        ended = [other["end"] for other in log[:i] if other["end"] <= request["start"]]
        assert not ended or request["start"] - max(ended) >= delay_s, request
