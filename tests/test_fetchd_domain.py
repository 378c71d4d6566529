"""`politeness.key: domain` against a real loopback server: six subdomains of one registered domain, on two
addresses, share one politeness gate, judged from the server's log; a daemon whose key is not the crawl's refuses
to start.

Each subdomain alone would be allowed its own request in flight and its own delay; with the domain as the key, the
server sees at most `max_concurrency_per_host` requests in flight across the whole domain and (a lower bound on two
busy cores) none sooner than `min_delay_s` after the end of the last one to any of its hosts. The exact rule is
checked on the virtual clock (`tests/test_scheduling.py`).
"""

from __future__ import annotations

import json

import pytest

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import ConfigError
from fetchd.commands import fetch_segment
from tests.support.fetchlists import by_url, read_results, write_fetchlist
from tests.support.servers import ScriptedServer, slow_pages

SEGMENT = "seg-domain"
ADDRESSES = ("127.0.0.4", "127.0.0.5")  # their own loopback addresses: no other test's server listens there
NAMES = [f"part{i}.big.test" for i in range(6)]
PAGES = 2
PAGE_SECONDS = 0.1
DELAY_S = 0.15


@pytest.fixture
def domain_server():
    server = ScriptedServer(slow_pages(PAGE_SECONDS), addresses=ADDRESSES)
    yield server
    server.stop()


def _conf(base_conf, key: str):
    return base_conf.with_overrides({
        "politeness.key": key,
        "politeness.min_delay_s": DELAY_S,
        "fetch.static_hosts": {name: ADDRESSES[i % 2] for i, name in enumerate(NAMES)},
    })


def test_the_subdomains_of_one_domain_share_one_gate(domain_server, base_conf, root):
    conf = _conf(base_conf, "domain")
    urls = [domain_server.url(name, f"/page/{i}") for name in NAMES for i in range(PAGES)]
    listed = write_fetchlist(root, SEGMENT, [{"url": url} for url in urls], conf.crawl.buckets,
                             Bucketing.from_config(conf))
    assert len(listed) == 1  # one domain, one bucket: one daemon owns all its hosts
    fetch_segment(conf, root, SEGMENT)

    rows = by_url(read_results(root, SEGMENT))
    assert {url: rows[url]["outcome"] for url in urls} == dict.fromkeys(urls, "success")
    log = sorted(domain_server.log, key=lambda r: r["start"])
    assert {r["local"] for r in log} == set(ADDRESSES) and {r["host"] for r in log} == set(NAMES)
    assert len(log) == len(NAMES) * (PAGES + 1)  # each page once, and each name's robots.txt
    for i, request in enumerate(log):
        earlier = log[:i]
        assert all(other["end"] <= request["start"] for other in earlier), ("two requests in flight", request)
        if earlier:
            assert request["start"] - max(other["end"] for other in earlier) >= DELAY_S, request


def test_a_daemon_whose_key_is_not_the_crawls_refuses_before_any_request(domain_server, base_conf, root):
    with open(layout.crawl_record(root), "w", encoding="utf-8") as handle:
        json.dump(Bucketing(base_conf.crawl.buckets, "domain").identity(), handle)
    write_fetchlist(root, SEGMENT, [{"url": domain_server.url(NAMES[0], "/page/0")}], base_conf.crawl.buckets)
    with pytest.raises(ConfigError, match="politeness.key.*'host' but this crawl's is 'domain'"):
        fetch_segment(_conf(base_conf, "host"), root, SEGMENT)
    assert domain_server.log == []
    assert not read_results(root, SEGMENT)
