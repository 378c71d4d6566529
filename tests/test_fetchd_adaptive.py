"""Adaptive politeness: after 503s the gaps shrink step by step, not at once; with k > 0 a slow host's gaps
follow its response time; a robots.txt Crawl-delay above the cap is capped and reported once.

Each behaviour twice: exactly, with the daemon itself on the virtual clock (`tests/support/virtual.py`:
`fetch_virtually`, a scripted server), and in a real daemon run judged from the loopback server's own log,
where two busy cores can only make a gap longer, so only lower bounds are asserted."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from aiohttp import web

from crawler.politeness import BACKOFF_JITTER
from fetchd.commands import fetch_segment
from tests.support import virtual
from tests.support.fetchlists import by_url, read_results, write_fetchlist
from tests.support.servers import ScriptedServer, gaps

SEGMENT = "seg-adaptive"
MIN_DELAY = 0.1
SLOW_S = 0.3            # how long slow.test takes to answer a page
SICK_FAILURES = 2       # sick.test answers its first page requests 503, then recovers
FAST_S = 0.01           # how long every other answer takes on the virtual clock
SICK = {"politeness.backoff_base_s": 0.4, "politeness.backoff_recovery_factor": 0.5,
        "politeness.max_consecutive_failures": 5}


def _virtual_answer(host: str, path: str, earlier: int) -> virtual.Answer:
    """The script of `_respond` below, for the virtual server (host keys are http://<name>)."""
    name = host.removeprefix("http://")
    if path == "/robots.txt":
        return virtual.Answer(200, FAST_S, body="User-agent: *\nCrawl-delay: 999\n") if name == "lazy.test" \
            else virtual.Answer(404, FAST_S)
    if name == "sick.test" and earlier - 1 < SICK_FAILURES:  # `earlier` counts robots.txt too
        return virtual.Answer(503, FAST_S)
    return virtual.Answer(200, SLOW_S if name == "slow.test" else FAST_S)


def _virtual_run(conf, root, hosts_paths: dict[str, list[str]], seed: int = 0) -> virtual.ScriptedTransport:
    """The daemon's fetch of these pages on the virtual clock, against `_virtual_answer`; its server log."""
    items = [{"url": f"http://{name}{path}"} for name, paths in hosts_paths.items() for path in paths]
    return virtual.fetch_virtually(conf, root, items, _virtual_answer, seed)


async def _respond(server: ScriptedServer, host: str, request: web.Request) -> web.StreamResponse:
    if request.path == "/robots.txt":
        if host == "lazy.test":
            return web.Response(text="User-agent: *\nCrawl-delay: 999\n")
        return web.Response(status=404)
    if host == "sick.test":
        server.sick_pages = getattr(server, "sick_pages", 0) + 1
        if server.sick_pages <= SICK_FAILURES:
            return web.Response(status=503, text="overloaded")  # no Retry-After: exponential backoff
    if host == "slow.test":
        await asyncio.sleep(SLOW_S)
    return web.Response(text=f"<html><title>{request.path}</title></html>", content_type="text/html")


@pytest.fixture
def server():
    farm = ScriptedServer(_respond)
    yield farm
    farm.stop()


def _conf(base_conf, **overrides):
    values = {
        "politeness.min_delay_s": MIN_DELAY,
        "fetch.static_hosts": {name: "127.0.0.1" for name in ("sick.test", "slow.test", "fast.test", "lazy.test")},
    }
    values.update(overrides)
    return base_conf.with_overrides(values)


def _pages(server: ScriptedServer, host: str) -> list[dict]:
    return [r for r in server.requests(host) if r["path"] != "/robots.txt"]


def test_after_503s_the_gaps_shrink_gradually_exactly_on_the_virtual_clock(base_conf, root):
    """Backoff 0.4 s (+jitter) after the first 503, twice that after the second; each success halves it until it is
    no longer above the 0.1 s minimum, and then it is over."""
    conf = _conf(base_conf, **SICK)
    run = _virtual_run(conf, root, {"sick.test": [f"/p{i}" for i in range(8)]}, seed=3)
    pages = run.requests("http://sick.test", pages_only=True)
    assert [r.status for r in pages] == [503] * 2 + [200] * 6
    jitter = random.Random(3)  # the run's rng: one draw per backoff without Retry-After
    first = 0.4 * (1 + BACKOFF_JITTER * jitter.random())
    second = 0.8 * (1 + BACKOFF_JITTER * jitter.random())
    expected = [first, second, second / 2, second / 4, second / 8, MIN_DELAY, MIN_DELAY]
    assert gaps(pages) == pytest.approx(expected, abs=1e-9)


def test_after_503s_the_gaps_shrink_gradually(server, base_conf, root):
    conf = _conf(base_conf, **SICK)
    paths = [f"/p{i}" for i in range(8)]
    write_fetchlist(root, SEGMENT, [{"url": server.url("sick.test", p)} for p in paths], conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    rows = by_url(read_results(root, SEGMENT))
    assert [rows[server.url("sick.test", p)]["status_code"] for p in paths] == [503] * 2 + [200] * 6
    pages = _pages(server, "sick.test")
    assert [r["status"] for r in pages] == [503] * 2 + [200] * 6
    g = gaps(pages)
    # at least the rule's gaps (exact values: the virtual-clock twin above): 0.4+ after the first 503, 0.8+ after
    # the second, then halved by each success (0.4+, 0.2+, 0.1+) and never below the minimum
    assert g[0] >= 0.4 and g[1] >= 0.8
    assert g[2] >= 0.4, "one success must not reset the backoff at once"
    assert g[3] >= 0.2 and g[4] >= MIN_DELAY
    assert all(gap >= MIN_DELAY for gap in g)


def test_a_slow_host_gets_gaps_of_k_times_its_response_time_exactly_on_the_virtual_clock(base_conf, root):
    k = 2.0
    conf = _conf(base_conf, **{"politeness.response_time_factor": k, "politeness.max_response_time_delay_s": 5.0})
    run = _virtual_run(conf, root, {name: [f"/{i}" for i in range(4)] for name in ("slow.test", "fast.test")})
    slow = run.requests("http://slow.test", pages_only=True)
    fast = run.requests("http://fast.test", pages_only=True)
    assert gaps(slow) == pytest.approx([k * SLOW_S] * 3)  # k x the 0.3 s answers
    assert gaps(fast) == pytest.approx([MIN_DELAY] * 3)   # per host: 2 x 0.01 s is under the minimum
    capped = _conf(base_conf, **{"politeness.response_time_factor": k, "politeness.max_response_time_delay_s": 0.4})
    run = _virtual_run(capped, root, {"slow.test": [f"/{i}" for i in range(3)]})
    assert gaps(run.requests("http://slow.test", pages_only=True)) == pytest.approx([0.4] * 2)


def test_a_slow_host_gets_gaps_of_at_least_k_times_its_response_time(server, base_conf, root):
    k = 2.0
    conf = _conf(base_conf, **{"politeness.response_time_factor": k, "politeness.max_response_time_delay_s": 5.0})
    items = [{"url": server.url(host, f"/{i}")} for host in ("slow.test", "fast.test") for i in range(4)]
    write_fetchlist(root, SEGMENT, items, conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    assert {row["outcome"] for row in read_results(root, SEGMENT)} == {"success"}
    slow, fast = _pages(server, "slow.test"), _pages(server, "fast.test")
    assert len(slow) == len(fast) == 4
    for before, gap in zip(slow[:-1], gaps(slow), strict=True):
        took = before["end"] - before["start"]  # the server's view; the daemon saw at least this long
        assert took >= SLOW_S * 0.9
        assert gap >= k * took, f"gap {gap:.3f} s after a {took:.3f} s response"
    assert min(gaps(fast)) >= MIN_DELAY  # per host (the fast one at its minimum: the virtual-clock twin above)


def test_crawl_delay_above_the_cap_is_capped_and_logged_once(server, base_conf, root, caplog):
    cap = 0.3
    conf = _conf(base_conf, **{"politeness.max_crawl_delay_s": cap})
    write_fetchlist(root, "seg-a", [{"url": server.url("lazy.test", p)} for p in ("/a", "/b")], conf.crawl.buckets)
    write_fetchlist(root, "seg-b", [{"url": server.url("lazy.test", "/c")}], conf.crawl.buckets)
    with caplog.at_level(logging.WARNING, logger="fetchd"):
        fetch_segment(conf, root, "seg-a")
        fetch_segment(conf, root, "seg-b")  # same process: robots.txt and gate remembered, no second warning
    requests = server.requests("lazy.test")
    assert [r["path"] for r in requests] == ["/robots.txt", "/a", "/b", "/c"]
    assert all(gap >= cap for gap in gaps(requests)), gaps(requests)  # the cap, not 999 s: the test ends
    host_key = f"http://lazy.test:{server.port}"
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "Crawl-delay" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert host_key in warnings[0] and "999" in warnings[0] and f"={cap}s" in warnings[0]


def test_crawl_delay_above_the_cap_gives_gaps_of_the_cap_exactly_on_the_virtual_clock(base_conf, root):
    conf = _conf(base_conf, **{"politeness.max_crawl_delay_s": 0.3})
    run = _virtual_run(conf, root, {"lazy.test": ["/a", "/b", "/c"]})
    requests = run.requests("http://lazy.test")
    assert [r.path for r in requests] == ["/robots.txt", "/a", "/b", "/c"]
    assert gaps(requests) == pytest.approx([0.3] * 3)


def test_a_hosts_fetch_list_limits_hold_exactly_on_the_virtual_clock(base_conf, root):
    """generate writes a host's own limits into the fetch list (`hosts.min_delay_s` folded into `delay_s`,
    `hosts.max_concurrency`): the daemon's gate takes the delay as a floor and the concurrency as a cap."""
    conf = _conf(base_conf, **{"politeness.max_concurrency_per_host": 2})
    paths = [f"/{i}" for i in range(4)]

    def pages(name: str, **limits) -> list:
        items = [{"url": f"http://{name}{path}", **limits} for path in paths]
        return virtual.fetch_virtually(conf, root, items, _virtual_answer).requests(f"http://{name}", pages_only=True)

    assert gaps(pages("fast.test", delay_s=0.5)) == pytest.approx([0.5] * 3)
    assert gaps(pages("slow.test", max_concurrency=1)) == pytest.approx([MIN_DELAY] * 3)  # one at a time
    # The same hosts without limits in their rows: two in flight at once (a negative gap), the minimum delay only.
    assert min(gaps(pages("slow.test"))) < 0
    assert gaps(pages("fast.test")) == pytest.approx([MIN_DELAY] * 3)


def test_a_hosts_planned_delay_is_a_floor_in_the_farm_log(server, base_conf, root):
    """The fetch list's per-host delay (0.5 s here, the configured minimum 0.1 s) holds at the daemon, judged
    from the server's log; the daemon used to ignore it."""
    conf = _conf(base_conf)
    items = [{"url": server.url("fast.test", f"/{i}"), "delay_s": 0.5} for i in range(4)]
    write_fetchlist(root, SEGMENT, items, conf.crawl.buckets)
    fetch_segment(conf, root, SEGMENT)
    assert {row["outcome"] for row in read_results(root, SEGMENT)} == {"success"}
    pages = _pages(server, "fast.test")
    assert len(pages) == 4 and min(gaps(pages)) >= 0.5
