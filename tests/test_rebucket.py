"""Buckets are fixed for a crawl's life (crawler.bucketing, `ROOT/_crawl.json`): inject and update refuse a config
whose `crawl.buckets` or `politeness.key` differs, with exit 2 and one line; `crawl rebucket` moves every URL and
host to its new bucket between cycles (refused while a segment is open, and while a daemon holds a live bucket
lease unless told to wait for it), after which the new settings hold."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import ConfigError
from crawler.errors import EXIT_TRY_LATER, UserError
from delta_tables import tables
from fetchd.storage import LocalStore, S3Store
from jobs import cli, generate, inject, rebucket, update
from jobs.base import check_bucketing
from tests.support.config import SPARK_CLI_SETTINGS
from tests.support.s3 import moto_server
from tests.support.tables import table_rows, table_versions

SEEDS = [f"http://{name}/{page}" for name in ("a.news.test", "b.news.test", "c.news.test", "www.shop.test",
                                               "shop.test", "solo.test") for page in ("x", "y")]


def _record(root: str) -> dict:
    with open(layout.crawl_record(root), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.slow
def test_a_changed_bucketing_is_refused_until_rebucket_moves_every_row(spark, base_conf, tables_root, tmp_path,
                                                                         capsys):
    root, seeds = tables_root, tmp_path / "seeds.txt"
    seeds.write_text("\n".join(SEEDS) + "\n")
    inject.run(spark, base_conf, root, str(seeds))
    assert _record(root) == {"crawl.buckets": 4, "politeness.key": "host"}

    by_domain = base_conf.with_overrides({"politeness.key": "domain"})
    with pytest.raises(ConfigError, match="politeness.key.*'domain' but this crawl's is 'host'.*crawl rebucket"):
        inject.run(spark, by_domain, root, str(seeds))
    with pytest.raises(ConfigError, match="crawl.buckets.*8 but this crawl's is 4"):
        update.run(spark, base_conf.with_overrides({"crawl.buckets": 8}), root, "seg-none")
    # The command line's config (16 buckets by default) differs in both: one line says so.
    code = cli.main(["inject", "--root", root, "--seeds", str(seeds), "--set", "politeness.key=domain",
                     *SPARK_CLI_SETTINGS])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert ("'crawl.buckets': is 16 but this crawl's is 4, and politeness.key is 'domain' but this crawl's is "
            "'host'") in err

    generate.run(spark, base_conf, root, "seg-open", datetime.now(UTC) + timedelta(minutes=1))
    before = {name: table_rows(spark, root, name, {"bucket"}) for name in ("urls", "hosts")}
    with pytest.raises(UserError, match="segments are open: seg-open"):
        rebucket.run(spark, by_domain, root)
    update.record_closed(spark, root, "seg-open", datetime.now(UTC))  # given up: the segment is finished

    result = rebucket.run(spark, by_domain, root)
    assert (result.hosts, result.rewritten) == (6, ("urls", "hosts"))
    placing = Bucketing(4, "domain")
    for name in ("urls", "hosts"):
        rows = tables.table_df(spark, root, name).select("host_key", "bucket").collect()
        assert {r.host_key: r.bucket for r in rows} == {r.host_key: placing.bucket(r.host_key) for r in rows}
        assert table_rows(spark, root, name, {"bucket"}) == before[name]  # nothing else changed
    assert len({placing.bucket(f"http://{n}.news.test") for n in "abc"}) == 1  # one domain, one bucket
    assert result.moved_hosts == sum(Bucketing(4).bucket(h) != placing.bucket(h) for h in
                                     {f"http://{u.split('/')[2]}" for u in SEEDS})
    assert _record(root) == {"crawl.buckets": 4, "politeness.key": "domain"}

    versions = table_versions(root)
    again = rebucket.run(spark, by_domain, root)
    assert (again.moved_hosts, again.rewritten) == (0, ()) and table_versions(root) == versions
    check_bucketing(by_domain, root)  # the crawl's settings now (what inject and update ask first)
    with pytest.raises(ConfigError, match="politeness.key"):
        check_bucketing(base_conf, root)


# ---- daemons holding bucket leases (no Spark: the leases are read through the jobs' storage) ------------------


class _AnHourAgo:
    """A clock an hour behind: a lease taken on it expired long ago."""

    def wall(self) -> float:
        return time.time() - 3600

    def monotonic(self) -> float:
        return time.monotonic()


def _holders(conf, root: str) -> list[tuple[str, int]]:
    return sorted((record.owner, record.bucket) for record in rebucket.lease_holders(conf, root))


def _check_lease_holders(conf, root: str, store: LocalStore) -> None:
    """Live leases are named, released and lapsed ones are not; the wait ends once the last one is released."""
    assert _holders(conf, root) == []
    first, second = store.lease_store(conf, "daemon-1"), store.lease_store(conf, "daemon-2")
    leases = [first.try_acquire(3), first.try_acquire(5), second.try_acquire(2)]
    lapsed = store.lease_store(conf, "daemon-3", _AnHourAgo()).try_acquire(7)  # a crashed daemon's, expired
    assert all(leases) and lapsed is not None
    assert _holders(conf, root) == [("daemon-1", 3), ("daemon-1", 5), ("daemon-2", 2)]
    with pytest.raises(rebucket.DaemonsFetching, match=r"hold bucket leases: daemon-1 \(buckets 3, 5\); daemon-2 "
                                                         r"\(bucket 2\) \(stop them.*--wait-for-daemons"):
        rebucket.wait_for_daemons(conf, root, 0)

    second.release(leases[2], time.time())
    assert _holders(conf, root) == [("daemon-1", 3), ("daemon-1", 5)]
    releases = [threading.Timer(0.3, first.release, (lease, time.time())) for lease in leases[:2]]
    for timer in releases:
        timer.start()
    started = time.monotonic()
    rebucket.wait_for_daemons(conf, root, 30)  # returns once both are released
    assert time.monotonic() - started < 10 and _holders(conf, root) == []


def test_rebucket_sees_the_daemons_bucket_leases_on_a_local_root(base_conf, root):
    _check_lease_holders(base_conf, root, LocalStore(root))


def test_rebucket_sees_the_daemons_bucket_leases_on_an_s3_root(base_conf, tmp_path):
    with moto_server() as s3:
        root = f"s3://{s3.make_bucket('rebucket-leases')}/crawl"
        conf = base_conf.with_overrides({"s3.endpoint_url": s3.endpoint, "fetch.staging_dir": str(tmp_path)})
        _check_lease_holders(conf, root, S3Store(conf, root))


@pytest.mark.slow
def test_rebucket_refuses_while_a_daemon_holds_a_lease_and_waits_for_it_when_told(spark, base_conf, tables_root,
                                                                                   capsys):
    root, by_domain = tables_root, base_conf.with_overrides({"politeness.key": "domain"})
    store = LocalStore(root).lease_store(base_conf, "busy-daemon")
    lease = store.try_acquire(1)
    assert lease is not None
    code = cli.main(["rebucket", "--root", root, "--set", "politeness.key=domain", "--set", "crawl.buckets=4",
                     *SPARK_CLI_SETTINGS])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_TRY_LATER and len(err.splitlines()) == 1
    assert "cannot rebucket while daemons hold bucket leases: busy-daemon (bucket 1)" in err
    assert not os.path.exists(layout.crawl_record(root))  # nothing done

    release = threading.Timer(1.0, store.release, (lease, time.time()))
    release.start()
    result = rebucket.run(spark, by_domain, root, wait_for_daemons_s=60)
    assert result.bucketing == Bucketing(4, "domain")
    assert _record(root) == {"crawl.buckets": 4, "politeness.key": "domain"}
    assert not release.is_alive()
