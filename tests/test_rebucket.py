"""Buckets are fixed for a crawl's life (crawler.bucketing, `ROOT/_crawl.json`): inject and update refuse a config
whose `crawl.buckets` or `politeness.key` differs, with exit 2 and one line; `crawl rebucket` moves every URL and
host to its new bucket between cycles (refused while a segment is open), after which the new settings hold."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from crawler import layout
from crawler.bucketing import Bucketing
from crawler.config import ConfigError
from crawler.errors import UserError
from delta_tables import tables
from jobs import cli, generate, inject, rebucket, update
from jobs.base import check_bucketing
from tests.support.config import SPARK_CLI_SETTINGS
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
