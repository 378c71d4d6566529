"""Seeds file parsing: metadata forms, bad lines reported with a reason, dedup within the file."""

from __future__ import annotations

import pytest

from crawler.scope import Scope
from crawler.seeds import SeedEntry, parse_seed_line, read_seeds

SCOPE = Scope(schemes=("http", "https"), host_suffixes=(), max_url_length=60, max_depth=16)


def test_plain_url_is_canonicalized_with_defaults():
    assert parse_seed_line("HTTP://Example.COM:80/a/../b#frag") == SeedEntry("http://example.com/b", 1.0, None)


def test_named_and_positional_metadata():
    assert parse_seed_line("http://a.test/\tpriority=2.5\tinterval=3600") == SeedEntry("http://a.test/", 2.5, 3600)
    assert parse_seed_line("http://a.test/\tinterval=60\tpriority=0") == SeedEntry("http://a.test/", 0.0, 60)
    assert parse_seed_line("http://a.test/\t3\t120") == SeedEntry("http://a.test/", 3.0, 120)


def test_kind_marks_a_sitemap_seed():
    assert parse_seed_line("http://a.test/s.xml.gz\tkind=sitemap") == SeedEntry("http://a.test/s.xml.gz", sitemap=True)
    assert parse_seed_line("http://a.test/\t2\tkind=page") == SeedEntry("http://a.test/", 2.0, None, False)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("ftp://a.test/file", "scheme"),
        ("not a url", "not a valid URL"),
        ("http://a.test/\tpriority=high", "priority is not a number"),
        ("http://a.test/\tpriority=-1", "priority must be"),
        ("http://a.test/\tinterval=0", "interval must be"),
        ("http://a.test/\tinterval=1.5", "interval must be"),
        # Out of range: each would reach a bigint column or a timestamp and abort the whole inject.
        ("http://a.test/\tinterval=1e30", "at most 3155760000 seconds"),
        ("http://a.test/\tinterval=3155760001", "a century"),
        ("http://a.test/\tinterval=-5", "interval must be"),
        ("http://a.test/\tinterval=nan", "interval must be"),
        ("http://a.test/\tinterval=inf", "interval must be"),
        ("http://a.test/\tpriority=1e400", "priority must be"),
        ("http://a.test/\tpriority=nan", "priority must be"),
        ("http://a.test/\tpriority=-inf", "priority must be"),
        ("http://a.test/\tpriority=-0.5", "priority must be"),
        ("http://a.test/\tcolour=red", "unknown metadata key"),
        ("http://a.test/\t1\t2\t3", "unexpected metadata field"),
        ("http://a.test/\tpriority=1\tpriority=2", "given twice"),
        ("http://a.test/s.xml\tkind=feed", "kind must be one of page, sitemap"),
        ("http://a.test/s.xml\tkind=sitemap\tkind=page", "given twice"),
        ("http://a.test/" + "x" * 80, "longer than scope.max_url_length"),
    ],
)
def test_bad_lines_raise_with_a_reason(line, reason):
    with pytest.raises(ValueError, match=reason):
        parse_seed_line(line, SCOPE)


def test_a_line_out_of_range_is_reported_and_the_rest_is_read():
    lines = ["http://a.test/\tinterval=1e30", "http://b.test/\t1\t3155760000", "http://c.test/\tpriority=1e400"]
    entries, errors = read_seeds(lines)
    assert entries == [SeedEntry("http://b.test/", 1.0, 3155760000)]
    assert [(line_no, reason.split(":")[0]) for line_no, _, reason in errors] == [
        (1, "interval must be at most 3155760000 seconds (a century)"),
        (3, "priority must be a finite number >= 0")]


def test_host_suffix_scope():
    scope = Scope(("http", "https"), ("farm.test",), 2048, 16)
    assert parse_seed_line("http://site-1.farm.test/", scope).url == "http://site-1.farm.test/"
    with pytest.raises(ValueError, match="out of scope"):
        parse_seed_line("http://elsewhere.test/", scope)


def test_read_seeds_skips_comments_reports_errors_and_dedups():
    lines = [
        "# seeds",
        "",
        "http://a.test/\tpriority=2",
        "   ",
        "gopher://a.test/",
        "http://A.test/#x",
        "http://b.test/\t\t",
    ]
    entries, errors = read_seeds(lines, SCOPE)
    assert entries == [SeedEntry("http://a.test/", 2.0, None), SeedEntry("http://b.test/", 1.0, None)]
    assert [(no, text) for no, text, _ in errors] == [(5, "gopher://a.test/")]
    assert "scheme" in errors[0][2]
