"""Trap rules and registered-domain scope at discovery: the pure rules one by one, then update on real Delta
tables where a page links into a calendar trap, repeated paths, faceted queries and more new URLs than its
host may add: only the allowed URLs are stored, rejections are counted per host and reason, a re-run
changes nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from crawler import config as config_mod
from crawler import layout, traps, urls
from crawler.bucketing import Bucketing
from crawler.frontier import classify_discovery
from crawler.records import FETCHED
from crawler.scope import Scope
from crawler.traps import TrapRules, trap_reason, url_template
from crawler.urls import registered_domain
from delta_tables import tables
from jobs import generate, inject, update
from jobs.base import recount_known_urls
from tests.support.fetchlists import result_row, write_parquet
from tests.support.tables import append_rows, unchanged_tables


@pytest.fixture
def root(tables_root) -> str:
    """Every test here starts with the tables created (`tests/conftest.py::tables_root`)."""
    return tables_root


RULES = TrapRules(max_url_length=120, max_path_depth=12, max_segment_repeats=3, max_query_params=12,
                  max_new_urls_per_host_per_cycle=100, max_new_urls_per_template_per_cycle=100,
                  max_known_urls_per_host=1000)
SCOPE = Scope(schemes=("http", "https"), host_suffixes=(), max_url_length=2048, max_depth=16)


def test_defaults_keep_ordinary_farm_urls():
    rules = TrapRules.from_config(config_mod.load())
    for url in ("http://farm-3.test/section/3/page-12.html", "http://farm-3.test/section/3/page-12.html?print=1",
                "http://farm-3.test/", "http://a.test/a/b/a/b/a/b", "http://a.test/cal/2026/01/01/"):
        assert trap_reason(urls.canonicalize(url), rules) is None, url


@pytest.mark.parametrize(("url", "reason"), [
    ("http://a.test/" + "x" * 120, traps.URL_TOO_LONG),
    ("http://a.test/" + "/".join(f"d{i}" for i in range(13)), traps.PATH_TOO_DEEP),
    ("http://a.test/" + "/".join(f"d{i}" for i in range(12)), None),
    ("http://a.test/a/b/a/b/a/b/a", traps.REPEATED_SEGMENT),
    ("http://a.test/a//a//a/", None),
    ("http://a.test/s?" + "&".join(f"f{i}=1" for i in range(13)), traps.TOO_MANY_PARAMS),
    ("http://a.test/s?" + "&".join(f"f{i}=1" for i in range(12)), None),
    ("http://a.test/s?a=1&&&b=2", None),
])
def test_trap_reason_per_rule(url, reason):
    assert trap_reason(urls.canonicalize(url), RULES) == reason


def test_trap_rules_apply_in_a_fixed_order():
    deep_and_repeated = "http://a.test/" + "a/" * 13
    assert trap_reason(deep_and_repeated, RULES) == traps.PATH_TOO_DEEP
    assert trap_reason(deep_and_repeated, replace(RULES, max_path_depth=20)) == traps.REPEATED_SEGMENT


def test_url_template_masks_numbers_and_ids_and_drops_query_values():
    assert url_template("http://cal.test/cal/2026/01/31/?view=day") == "http://cal.test/cal/{n}/{n}/{n}/?view"
    assert url_template("http://cal.test/cal/2031/12/01/?view=week") == "http://cal.test/cal/{n}/{n}/{n}/?view"
    assert url_template("http://farm-3.test:8080/section/3/page-12.html") == (
        "http://farm-3.test:8080/section/{n}/page-{n}.html")
    assert url_template("http://s.test/item/3f2504e0-4f89-11d3-9a0c-0305e82c3301/view") == "http://s.test/item/{id}/view"
    assert url_template("http://s.test/blob/9fceb02d0ae598e95dc970b74767f19372d61af8") == "http://s.test/blob/{id}"
    assert url_template("http://s.test/about-deadbeefcafebabe") == "http://s.test/about-deadbeefcafebabe"
    assert url_template("http://s.test/find?size=2&color=red&size=3&brand=") == "http://s.test/find?brand&color&size"
    assert url_template("http://s.test/find?size=2") != url_template("http://s.test/find?color=2")


def test_registered_domain_is_public_suffix_aware():
    assert registered_domain("a.b.example.co.uk") == "example.co.uk"
    assert registered_domain("WWW.Example.COM.") == "example.com"
    assert registered_domain("user.github.io") == "user.github.io"  # private suffix section of the list
    assert registered_domain("farm-3.test") == "farm-3.test"
    assert registered_domain("127.0.0.1") == "127.0.0.1"
    assert registered_domain("localhost") == "localhost"
    assert registered_domain("co.uk") == "co.uk"


def test_scope_domain_and_pattern_rules():
    deny = replace(SCOPE, deny_domains=("example.co.uk",), deny_patterns=(r"/private/", r"[?&]sessionid="))
    assert deny.reject_reason("http://shop.example.co.uk/") == "denied domain (scope.deny_domains)"
    assert deny.reject_reason("http://other.co.uk/") is None
    assert deny.reject_reason("http://a.test/private/x") == "denied pattern (scope.deny_patterns)"
    assert deny.reject_reason("http://a.test/p?x=1&sessionid=9") == "denied pattern (scope.deny_patterns)"
    assert deny.reject_reason("http://a.test/public/x") is None
    allow = replace(SCOPE, allow_domains=("example.co.uk", "a.test"), deny_domains=("bad.example.co.uk",))
    assert allow.reject_reason("http://x.y.example.co.uk/") is None
    assert allow.reject_reason("http://a.test/") is None
    assert allow.reject_reason("http://b.test/") == "domain not allowed (scope.allow_domains)"
    assert allow.reject_reason("http://co.uk/") == "domain not allowed (scope.allow_domains)"
    # deny_domains names registered domains: a listed subdomain matches nothing
    assert allow.reject_reason("http://bad.example.co.uk/") is None


def test_scope_domain_keys_come_from_config():
    conf = config_mod.load().with_overrides({"scope.allow_domains": ["a.test"], "scope.deny_patterns": ["^https:"]})
    scope = Scope.from_config(conf)
    assert scope.reject_reason("http://www.a.test/") is None
    assert scope.reject_reason("https://www.a.test/") == "denied pattern (scope.deny_patterns)"
    with pytest.raises(config_mod.ConfigError, match="scope.deny_patterns"):
        config_mod.load().with_overrides({"scope.deny_patterns": ["(unclosed"]})
    with pytest.raises(config_mod.ConfigError, match="traps.max_path_depth"):
        config_mod.load().with_overrides({"traps.max_path_depth": 0})


def test_classify_discovery():
    assert classify_discovery("javascript:alert(1)", SCOPE, RULES, Bucketing(4)) is None
    assert classify_discovery("http://[bad/", SCOPE, RULES, Bucketing(4)) is None
    found = classify_discovery("HTTP://A.test:80/cal/2026/01/01/#x", SCOPE, RULES, Bucketing(4))
    assert found.keys.url == "http://a.test/cal/2026/01/01/" and found.keys.host_key == "http://a.test"
    assert (found.keys.url_id, found.keys.bucket) == (uid(found.keys.url), bucket(found.keys.url))
    assert (found.template, found.reject_reason) == ("http://a.test/cal/{n}/{n}/{n}/", None)
    repeated = classify_discovery("http://a.test/a/b/a/b/a/b/a", SCOPE, RULES, Bucketing(4))
    assert repeated.reject_reason == traps.REPEATED_SEGMENT
    denied = replace(SCOPE, deny_domains=("evil.test",))
    assert classify_discovery("http://www.evil.test/", denied, RULES, Bucketing(4)).reject_reason == (
        "denied domain (scope.deny_domains)")


SEG = "seg-t1"
BUCKETS = 4


def uid(url: str) -> str:
    return urls.url_id(url)


def bucket(url: str) -> int:
    return urls.bucket_of(urls.host_key(url), BUCKETS)


def fetched(url: str, at: datetime, outcome: str, code: int | None) -> dict:
    return result_row(SEG, url, at, outcome, code, buckets=BUCKETS)


def by_url_id(found: list[str]) -> list[str]:
    return sorted(found, key=lambda u: (uid(u), u))


@pytest.mark.slow
def test_update_stores_allowed_discoveries_counts_rejections_and_reruns_unchanged(spark, base_conf, root, tmp_path):
    conf = base_conf.with_overrides({
        "traps.max_new_urls_per_host_per_cycle": 6, "traps.max_new_urls_per_template_per_cycle": 4,
        "scope.deny_domains": ["evil.co.uk"], "scope.deny_patterns": ["/private/"],
    })
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/\nhttp://b.test/\n")
    inject.run(spark, conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, conf, root, SEG, now).url_count == 2
    at = now + timedelta(seconds=10)
    results = [fetched("http://a.test/", at, "success", 200), fetched("http://b.test/", at, "success", 200)]
    for b in {r["bucket"] for r in results}:
        write_parquet(layout.fetched_dir(root, SEG, b), [r for r in results if r["bucket"] == b], FETCHED)

    calendar = [f"http://a.test/cal/2026/01/{day:02d}/" for day in range(1, 11)]
    pages = [f"http://a.test/{name}.html" for name in ("alpha", "beta", "gamma", "delta", "epsilon")]
    trapped = {
        "http://a.test/x/y/x/y/x/y/x/y": traps.REPEATED_SEGMENT,
        "http://a.test/" + "/".join(f"d{i}" for i in range(13)): traps.PATH_TOO_DEEP,
        "http://a.test/search?" + "&".join(f"f{i}=v" for i in range(13)): traps.TOO_MANY_PARAMS,
        "http://a.test/" + "l" * 1100: traps.URL_TOO_LONG,
        "http://a.test/private/1": "denied pattern (scope.deny_patterns)",
    }
    foreign_denied = "http://www.evil.co.uk/x"
    a_links = calendar + pages + list(trapped) + [foreign_denied, "http://b.test/"]
    b_links = ["http://b.test/ok", "http://b.test/cal/2026/01/01/"]
    append_rows(spark, root, "links", [
        {"segment_id": SEG, "from_url_id": uid(src), "from_state_version": 1, "to_url_id": uid(dst), "to_url": dst,
         "rel_nofollow": False} for src, targets in (("http://a.test/", a_links), ("http://b.test/", b_links))
        for dst in targets])

    result = update.run(spark, conf, root, SEG)

    calendar_kept = by_url_id(calendar)[:4]
    host_ranked = by_url_id(calendar_kept + pages)
    a_kept, a_capped = host_ranked[:6], host_ranked[6:]
    stored = {r.url for r in tables.table_df(spark, root, "urls").collect()}
    assert stored == {"http://a.test/", "http://b.test/", *a_kept, *b_links}
    assert result.discovered == 6 + 2

    hosts = {r.host_key: r for r in tables.table_df(spark, root, "hosts").collect()}
    a_host, b_host = hosts["http://a.test"], hosts["http://b.test"]
    assert a_host.trap_rejections == {
        traps.TEMPLATE_NEW_URL_CAP: 6, traps.HOST_NEW_URL_CAP: 3, traps.REPEATED_SEGMENT: 1,
        traps.PATH_TOO_DEEP: 1, traps.TOO_MANY_PARAMS: 1, traps.URL_TOO_LONG: 1,
        "denied pattern (scope.deny_patterns)": 1}
    rejected = set(calendar) - set(calendar_kept) | set(a_capped) | set(trapped)
    assert a_host.trap_sample == sorted(rejected)[:5] and a_host.discovery_segment == SEG
    assert (b_host.trap_rejections, b_host.trap_sample, b_host.discovery_segment) == (None, None, SEG)
    assert (a_host.known_urls, b_host.known_urls) == (1 + 6, 1 + 2)  # the seed plus what this segment stored
    inlinks = {r.url: r.inlinks for r in tables.table_df(spark, root, "urls").collect()}
    assert inlinks["http://b.test/"] == 1 and inlinks["http://a.test/"] == 0  # a known URL gains its new inlink
    assert {inlinks[u] for u in [*a_kept, *b_links]} == {1}
    assert "http://www.evil.co.uk" not in hosts  # rejected for scope, never known: no row

    with unchanged_tables(spark, root):
        update.run(spark, conf, root, SEG)


def test_new_url_allowance_rule_and_its_sql_agree(spark):
    cases = [(0, 10), (3, 10), (10, 10), (25, 10), (None, 10)]
    rows = spark.createDataFrame([(k,) for k, _ in cases], "known bigint").select(
        F.expr(traps.new_url_allowance_sql("known", 10)).alias("a")).collect()
    assert [r.a for r in rows] == [traps.new_url_allowance(k or 0, cap) for k, cap in cases] == [10, 7, 0, 0, 10]


@pytest.mark.slow
def test_known_url_cap_bounds_a_host_and_maintain_recounts(spark, base_conf, root, tmp_path):
    conf = base_conf.with_overrides({"traps.max_known_urls_per_host": 4})
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://a.test/\nhttp://b.test/\n")
    inject.run(spark, conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    generate.run(spark, conf, root, SEG, now)
    at = now + timedelta(seconds=10)
    results = [fetched("http://a.test/", at, "success", 200), fetched("http://b.test/", at, "success", 200)]
    for b in {r["bucket"] for r in results}:
        write_parquet(layout.fetched_dir(root, SEG, b), [r for r in results if r["bucket"] == b], FETCHED)
    a_pages = [f"http://a.test/p{i}" for i in range(10)]
    append_rows(spark, root, "links", [
        {"segment_id": SEG, "from_url_id": uid(src), "from_state_version": 1, "to_url_id": uid(dst), "to_url": dst,
         "rel_nofollow": False}
        for src, targets in (("http://a.test/", a_pages), ("http://b.test/", ["http://b.test/x"])) for dst in targets])

    update.run(spark, conf, root, SEG)

    stored = {r.url for r in tables.table_df(spark, root, "urls").collect()}
    assert stored == {"http://a.test/", *by_url_id(a_pages)[:3], "http://b.test/", "http://b.test/x"}
    hosts = {r.host_key: r for r in tables.table_df(spark, root, "hosts").collect()}
    assert hosts["http://a.test"].known_urls == 4 and hosts["http://b.test"].known_urls == 2
    assert hosts["http://a.test"].trap_rejections == {traps.HOST_KNOWN_URL_CAP: 7}
    with unchanged_tables(spark, root):
        update.run(spark, conf, root, SEG)

    # A drifted count (e.g. inject died between its two merges) is put right by maintain's recount.
    DeltaTable.forPath(spark, tables.table_path(root, "hosts")).update(set={"known_urls": F.lit(0).cast("bigint")})
    recount_known_urls(spark, root)
    assert {r.host_key: r.known_urls for r in tables.table_df(spark, root, "hosts").collect()} == {
        "http://a.test": 4, "http://b.test": 2}
