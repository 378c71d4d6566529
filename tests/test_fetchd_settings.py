"""A daemon follows the crawl's settings (`ROOT/_crawl.json`, crawler.bucketing): once `crawl rebucket` records
other ones, a running daemon takes no bucket and sends no request under its old settings, stops the buckets it is
fetching within `fetch.poll_interval_s`, releases them and exits with `SettingsChanged` (exit 75); a daemon started
with the new settings does the rest. Judged from a real loopback server's own log, no Spark: the record is written
by rebucket's own function, the fetch lists as generate writes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from crawler import layout, urls
from crawler.bucketing import Bucketing, SettingsChanged
from crawler.errors import EXIT_TRY_LATER
from fetchd import cli as fetchd_cli
from fetchd.commands import fetch_segment, serve
from fetchd.ownership import leases_dir
from jobs.rebucket import record_bucketing
from tests.support.fetchlists import by_url, read_results, write_fetchlist
from tests.support.s3 import moto_server, objects, put_fetchlist
from tests.support.servers import ScriptedServer, slow_pages

ADDRESS = "127.0.0.8"  # its own loopback address
DOMAIN_NAMES = ["a.test", "x.a.test", "y.a.test"]  # one registered domain: one gate with `politeness.key: domain`
# Fetched before the rebucket, in a bucket none of the domain's hosts is in afterwards: a bucket depends on the host
# key, whose port is the server's (a new one each run), so the first of these names whose bucket differs is taken.
OTHER_NAMES = [f"solo{n}.test" for n in range(8)]
PAGE_SECONDS = 0.1
DELAY_S = 0.15
POLL_S = 0.2
BUCKETS = 16
WAIT_S = 15.0  # the longest any daemon here is given to notice or to finish


@pytest.fixture
def server():
    server = ScriptedServer(slow_pages(PAGE_SECONDS), addresses=(ADDRESS,))
    yield server
    server.stop()


def _conf(base_conf, key: str, daemon_id: str):
    return base_conf.with_overrides({
        "crawl.buckets": BUCKETS,
        "politeness.key": key,
        "politeness.min_delay_s": DELAY_S,
        "fetch.poll_interval_s": POLL_S,
        "fetch.daemon_id": daemon_id,
        "fetch.static_hosts": {name: ADDRESS for name in [*DOMAIN_NAMES, *OTHER_NAMES]},
    })


@contextlib.contextmanager
def _serving(conf, root: str) -> Iterator[Future]:
    """`serve` in a thread of its own (its future); stopped and waited for on the way out."""
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve") as executor:
        future = executor.submit(serve, conf, root, stop)
        try:
            yield future
        finally:
            stop.set()
            future.exception(WAIT_S)


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S}s: {what}"
        time.sleep(0.05)


def _lease_owners(root: str) -> dict[int, set[str]]:
    """Every bucket with a lease file, and who held each of its epochs still on disk."""
    base = leases_dir(root)
    owners: dict[int, set[str]] = {}
    for name in os.listdir(base) if os.path.isdir(base) else []:
        bucket = layout.parse_bucket_dirname(name)
        for epoch in os.listdir(os.path.join(base, name)):
            if epoch.endswith(".json"):
                with open(os.path.join(base, name, epoch), encoding="utf-8") as handle:
                    owners.setdefault(bucket, set()).add(json.load(handle)["owner"])
    return owners


def _domain_violations(requests: list[dict]) -> list[tuple[dict, str]]:
    """Requests (all to one domain) that started while another was in flight, or sooner than `DELAY_S` after the
    end of the one before."""
    found = []
    ordered = sorted(requests, key=lambda r: r["start"])
    for i, request in enumerate(ordered[1:], 1):
        last_end = max(other["end"] for other in ordered[:i])
        if last_end > request["start"]:
            found.append((request, "overlaps"))
        elif request["start"] - last_end < DELAY_S:
            found.append((request, f"{request['start'] - last_end:.3f}s after the last one"))
    return found


def _domain_urls(server, pages: int) -> list[str]:
    return [server.url(name, f"/page/{i}") for name in DOMAIN_NAMES for i in range(pages)]


def test_a_daemon_running_across_a_rebucket_to_domain_fetches_nothing_under_its_old_key(server, base_conf, root):
    by_host, by_domain = Bucketing(BUCKETS, "host"), Bucketing(BUCKETS, "domain")
    old_conf, new_conf = _conf(base_conf, "host", "before"), _conf(base_conf, "domain", "after")
    record_bucketing(old_conf, root, by_host)
    after_urls = _domain_urls(server, 3)
    domain_bucket = by_domain.bucket(urls.host_key(after_urls[0]))
    other = next(url for url in (server.url(name, "/first") for name in OTHER_NAMES)
                 if by_host.bucket(urls.host_key(url)) != domain_bucket)
    before = write_fetchlist(root, "seg-before", [{"url": other}], BUCKETS, by_host)
    assert set(before) != {domain_bucket}  # so a lease of the domain's bucket can only be taken for seg-after

    with _serving(old_conf, root) as serving:
        _wait_for(lambda: os.path.exists(layout.done_manifest(root, "seg-before", *before)), "seg-before done")
        record_bucketing(new_conf, root, by_domain)  # what `crawl rebucket` writes last
        after = write_fetchlist(root, "seg-after", [{"url": url} for url in after_urls], BUCKETS, by_domain)
        assert list(after) == [domain_bucket]  # one domain, one bucket
        # It stops by itself; a daemon that went on under its old key would fetch seg-after to its end instead.
        _wait_for(lambda: serving.done() or os.path.exists(layout.done_manifest(root, "seg-after", domain_bucket)),
                  "the daemon with the old settings stopped, or fetched seg-after")
    fetch_segment(new_conf, root, "seg-after")  # what its supervisor starts again, with the crawl's settings

    domain_requests = [r for r in server.log if r["host"] in DOMAIN_NAMES]
    assert _domain_violations(domain_requests) == []
    assert Counter(server.url(r["host"], r["path"]) for r in domain_requests if r["path"] != "/robots.txt") == \
        Counter(after_urls)  # every URL fetched once
    assert {url: row["outcome"] for url, row in by_url(read_results(root, "seg-after")).items()} == \
        dict.fromkeys(after_urls, "success")
    with pytest.raises(SettingsChanged, match="politeness.key is now 'domain', this daemon's 'host'"):
        serving.result(0)
    assert "before" not in _lease_owners(root).get(domain_bucket, set())  # it took no bucket after the change


def test_a_daemon_notices_the_change_before_it_takes_a_bucket(server, base_conf, root):
    old_conf = _conf(base_conf, "host", "before")
    record_bucketing(old_conf, root, Bucketing(BUCKETS, "host"))
    with _serving(old_conf, root) as serving:
        time.sleep(2 * POLL_S)  # open, and idle: nothing to fetch
        assert not serving.done()
        by_domain = Bucketing(BUCKETS, "domain")
        record_bucketing(old_conf, root, by_domain)
        write_fetchlist(root, "seg-after", [{"url": url} for url in _domain_urls(server, 2)], BUCKETS, by_domain)
        _wait_for(serving.done, "the daemon stopped by itself")
        assert isinstance(serving.exception(), SettingsChanged)
    assert server.log == [] and _lease_owners(root) == {}


def test_a_daemon_fetching_a_bucket_stops_within_a_poll_interval_and_its_successor_finishes(server, base_conf, root):
    by_domain = Bucketing(BUCKETS, "domain")
    old_conf, new_conf = _conf(base_conf, "host", "before"), _conf(base_conf, "domain", "after")
    record_bucketing(old_conf, root, Bucketing(BUCKETS, "host"))
    listed = _domain_urls(server, 12)
    write_fetchlist(root, "seg-long", [{"url": url} for url in listed], BUCKETS, Bucketing(BUCKETS, "host"))

    with _serving(old_conf, root) as serving:
        _wait_for(lambda: len(server.log) >= 6, "the daemon fetching")
        changed_at = time.time()
        record_bucketing(new_conf, root, by_domain)
        _wait_for(serving.done, "the daemon stopped by itself")
        assert isinstance(serving.exception(), SettingsChanged)
    stopped_at = time.time()
    old_requests = list(server.log)
    # No request starts once the daemon has read the record: a poll interval, and time for a loaded machine.
    assert max(r["start"] for r in old_requests) < changed_at + POLL_S + 1.0
    assert len([r for r in old_requests if r["path"] != "/robots.txt"]) < len(listed)  # stopped unfinished
    for owners_bucket in os.listdir(leases_dir(root)):  # released: a successor may take them at once
        folder = os.path.join(leases_dir(root), owners_bucket)
        latest = max(name for name in os.listdir(folder) if name.endswith(".json"))
        with open(os.path.join(folder, latest), encoding="utf-8") as handle:
            assert json.load(handle)["released"], owners_bucket

    fetch_segment(new_conf, root, "seg-long")  # the fetch lists keep their old buckets: resumed all the same
    rows = read_results(root, "seg-long")
    assert Counter(row["url"] for row in rows) == Counter(listed)  # every URL reported once
    assert {row["outcome"] for row in rows} == {"success"}
    pages = Counter(server.url(r["host"], r["path"]) for r in server.log if r["path"] != "/robots.txt")
    assert pages == Counter(listed)  # and fetched once
    assert _domain_violations([r for r in server.log if r["start"] >= stopped_at]) == []


def test_the_daemon_command_exits_75_with_one_line(base_conf, root, capsys):
    """`fetchd serve` (and `crawl fetchd`, through the same line printer): one line on stderr, exit 75."""
    old_conf = _conf(base_conf, "host", "before")
    record_bucketing(old_conf, root, Bucketing(BUCKETS, "host"))
    changer = threading.Timer(1.0, record_bucketing, (old_conf, root, Bucketing(BUCKETS, "domain")))
    changer.start()
    try:
        code = fetchd_cli.main(["serve", "--root", root, "--set", f"crawl.buckets={BUCKETS}",
                                "--set", f"fetch.poll_interval_s={POLL_S}", "--set", "fetch.processes=1"])
    finally:
        changer.cancel()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_TRY_LATER
    assert len(err) == 1 and "settings changed" in err[0] and err[0].startswith("fetchd serve: ")


def test_a_daemon_on_an_s3_root_notices_the_change_before_it_takes_a_bucket(server, base_conf, tmp_path):
    """The same look on an s3:// root: the record is one GET through the daemon's store."""
    with moto_server() as s3:
        root = f"s3://{s3.make_bucket('settings-change')}/crawl"
        old_conf = _conf(base_conf, "host", "before").with_overrides({
            "s3.endpoint_url": s3.endpoint, "fetch.staging_dir": str(tmp_path / "staging")})
        record_bucketing(old_conf, root, Bucketing(BUCKETS, "host"))
        with _serving(old_conf, root) as serving:
            time.sleep(2 * POLL_S)
            assert not serving.done()
            record_bucketing(old_conf, root, Bucketing(BUCKETS, "domain"))
            put_fetchlist(s3, root, tmp_path, "seg-after", _domain_urls(server, 2), BUCKETS)
            _wait_for(serving.done, "the daemon stopped by itself")
            assert isinstance(serving.exception(), SettingsChanged)
        assert server.log == [] and objects(s3, root, "leases/") == {}
