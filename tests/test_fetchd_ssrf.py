"""The SSRF guard in real daemon runs: IP literals in every spelling, user@host URLs, redirects to
refused addresses, and DNS rebinding between the pre-check and the connect.

The allow-list admits 127.0.0.1/32 only, so 127.0.0.2 stands for a refused (private) address. The server listens
on both, so a request that slipped through to 127.0.0.2 would show in its own log; no packet ever goes to a
non-loopback address (those are refused from the URL alone).
"""

from __future__ import annotations

import pytest
from aiohttp import web

from fetchd import daemon as daemon_mod
from fetchd.commands import fetch_segment
from fetchd.resolver import GuardedResolver
from tests.support.fetchlists import by_url, read_results, write_fetchlist
from tests.support.servers import ScriptedServer

SEGMENT = "seg-ssrf"
ALLOWED, REFUSED = "127.0.0.1", "127.0.0.2"


async def _respond(server: ScriptedServer, host: str, request: web.Request) -> web.StreamResponse:
    if request.path == "/robots.txt":
        response = web.Response(status=404)
        response.force_close()  # the next request needs a new connection, hence a new resolution
        return response
    if request.path.startswith("/to/"):  # /to/<n>: a redirect to the n-th refused target
        return web.Response(status=302, headers={"Location": server.redirects[int(request.path[4:])]})
    return web.Response(text="<html>ok</html>", content_type="text/html")


@pytest.fixture
def server():
    farm = ScriptedServer(_respond, addresses=(ALLOWED, REFUSED))
    yield farm
    farm.stop()


def _conf(base_conf, **overrides):
    values = {
        "politeness.min_delay_s": 0.05,
        "fetch.allow_networks": [f"{ALLOWED}/32"],
        "fetch.static_hosts": {"edge.test": ALLOWED, "rebind.test": ALLOWED},
    }
    values.update(overrides)
    return base_conf.with_overrides(values)


def _refused_spellings(port: int) -> dict[str, str]:
    """URL -> the address it names: 127.0.0.2 (refused) written as decimal, hex, octal, short, IPv4-mapped IPv6 and
    behind user info; and the metadata endpoint as mapped IPv6 (refused from the URL, never contacted)."""
    return {f"http://2130706434:{port}/decimal": REFUSED, f"http://0x7f000002:{port}/hex": REFUSED,
            f"http://0177.0.0.2:{port}/octal": REFUSED, f"http://127.2:{port}/short": REFUSED,
            f"http://[::ffff:127.0.0.2]:{port}/mapped": "::ffff:7f00:2",
            f"http://good.example@127.0.0.2:{port}/userinfo": REFUSED,
            "http://[::ffff:a9fe:a9fe]/latest/meta-data/": "::ffff:a9fe:a9fe"}


def test_ip_literals_in_any_spelling_are_judged_by_the_address(server, base_conf, root):
    conf = _conf(base_conf)
    ok = f"http://good.example@0x7f000001:{server.port}/ok"  # 127.0.0.1 (allowed) behind user info
    write_fetchlist(root, SEGMENT, [{"url": u} for u in [*_refused_spellings(server.port), ok]],
                    conf.crawl.buckets)
    fetch_segment_rows = _fetch(conf, root)
    blocked = [r for r in fetch_segment_rows if r["outcome"] == "blocked"]
    assert len(blocked) == 7
    assert all("refused address" in r["error"] and r["warc_filename"] is None for r in blocked)
    assert {r["host_key"] for r in blocked} == {f"http://{REFUSED}:{server.port}", f"http://[::ffff:7f00:2]:{server.port}",
                                                "http://[::ffff:a9fe:a9fe]"}
    [fetched] = [r for r in fetch_segment_rows if r["outcome"] != "blocked"]
    assert fetched["url"] == f"http://{ALLOWED}:{server.port}/ok" and fetched["outcome"] == "success"
    assert {r["local"] for r in server.log} == {ALLOWED}  # nothing ever reached the refused address
    assert [r["path"] for r in server.log] == ["/robots.txt", "/ok"]
    assert not any("Authorization" in r["headers"] for r in server.log)  # the link's user info is never sent


def test_loopback_literals_are_refused_without_an_allow_list(server, base_conf, root):
    conf = _conf(base_conf, **{"fetch.allow_networks": []})
    port = server.port
    spellings = [f"http://2130706433:{port}/d", f"http://0x7f000001:{port}/h", f"http://0177.0.0.1:{port}/o",
                 f"http://127.1:{port}/s", f"http://[::ffff:127.0.0.1]:{port}/m", f"http://a@127.0.0.1:{port}/u"]
    write_fetchlist(root, SEGMENT, [{"url": u} for u in spellings], conf.crawl.buckets)
    rows = _fetch(conf, root)
    assert len(rows) == len(spellings) and {r["outcome"] for r in rows} == {"blocked"}
    assert server.log == []


def test_redirects_to_refused_addresses_are_not_followed(server, base_conf, root):
    conf = _conf(base_conf)
    targets = _refused_spellings(server.port)
    server.redirects = list(targets)
    pages = [f"/to/{i}" for i in range(len(server.redirects))]
    write_fetchlist(root, SEGMENT, [{"url": server.url("edge.test", p)} for p in pages], conf.crawl.buckets)
    rows = by_url(_fetch(conf, root))
    for i, page in enumerate(pages):
        row = rows[server.url("edge.test", page)]
        assert row["outcome"] == "redirect" and row["status_code"] == 302
        assert row["error"] == f"redirect to a refused address: {targets[server.redirects[i]]}", row
        assert row["redirect_to"] is None  # never becomes a URL to crawl either
    assert {r["local"] for r in server.log} == {ALLOWED}
    assert sorted(r["path"] for r in server.log) == sorted(["/robots.txt", *pages])


def _rebinding(flip_after: int) -> type[GuardedResolver]:
    """A resolver whose static answer for rebind.test turns to the refused address after `flip_after`
    resolutions — what a DNS rebinding attacker's name server does with a short TTL."""

    class Rebinding(GuardedResolver):
        calls = 0

        async def resolve(self, host, port=0, family=0):
            if host == "rebind.test":
                type(self).calls += 1
                if type(self).calls > flip_after:
                    self._static["rebind.test"] = REFUSED
            return await super().resolve(host, port, family)

    return Rebinding


def test_rebinding_after_the_pre_check_is_refused_at_connect(server, base_conf, root, monkeypatch):
    resolver = _rebinding(flip_after=2)  # the pre-check and robots.txt see 127.0.0.1, the page's connect 127.0.0.2
    monkeypatch.setattr(daemon_mod, "GuardedResolver", resolver)
    conf = _conf(base_conf)
    paths = ["/a", "/b", "/c"]
    write_fetchlist(root, SEGMENT, [{"url": server.url("rebind.test", p)} for p in paths], conf.crawl.buckets)
    rows = _fetch(conf, root)
    assert resolver.calls >= 3
    assert [r["outcome"] for r in rows] == ["blocked"] * 3
    assert "refused address for rebind.test: 127.0.0.2" in rows[0]["error"]
    assert all(r["warc_filename"] is None for r in rows)
    assert [(r["path"], r["local"]) for r in server.log] == [("/robots.txt", ALLOWED)]


def test_rebinding_right_after_the_pre_check_never_connects(server, base_conf, root, monkeypatch):
    monkeypatch.setattr(daemon_mod, "GuardedResolver", _rebinding(flip_after=1))  # robots.txt connect is refused
    conf = _conf(base_conf)
    write_fetchlist(root, SEGMENT, [{"url": server.url("rebind.test", p)} for p in ("/a", "/b")],
                    conf.crawl.buckets)
    rows = _fetch(conf, root)
    assert server.log == []
    [robots] = read_results(root, SEGMENT, kind="robots")
    assert robots["status_code"] is None and "refused address for rebind.test: 127.0.0.2" in robots["error"]
    # the host now resolves to a refused address: its URLs are reported blocked, never requested
    assert [r["outcome"] for r in rows] == ["blocked"] * 2
    assert all("refused address" in r["error"] for r in rows)


def _fetch(conf, root: str) -> list[dict]:
    fetch_segment(conf, root, SEGMENT)
    return sorted(read_results(root, SEGMENT), key=lambda r: r["url"])
