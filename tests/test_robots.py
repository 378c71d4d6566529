"""robots.txt policy (RFC 9309): group selection, matching, percent-encoding, limits and HTTP outcomes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crawler.config import ConfigError
from crawler.robots import (
    RobotsCacheRules,
    RobotsPolicy,
    RobotsState,
    adopt,
    handed_over,
    is_allowed,
    is_unreachable,
    policy_for_status,
    remember,
)

TOKEN = "cyclecrawl"
BASE = "http://example.com"

# RFC 9309 §5.1, verbatim apart from the trailing EOF marker.
RFC_EXAMPLE = """User-Agent: *
Disallow: *.gif$
Disallow: /example/
Allow: /publications/

User-Agent: foobot
Disallow:/
Allow:/example/page.html
Allow:/example/allowed.gif

User-Agent: barbot
User-Agent: bazbot
Disallow: /example/page.html

User-Agent: quxbot
"""


def allowed(text: str, path: str, token: str = TOKEN) -> bool:
    return RobotsPolicy.parse(text, token).allowed(BASE + path)


@pytest.mark.parametrize(
    ("agent", "path", "expected"),
    [
        ("foobot", "/example/page.html", True),
        ("foobot", "/example/allowed.gif", True),
        ("foobot", "/example/other.html", False),
        ("foobot", "/", False),
        ("barbot", "/example/page.html", False),
        ("bazbot", "/example/page.html", False),
        ("barbot", "/example/other.html", True),
        ("barbot", "/image.gif", True),  # the * group does not apply to a bot with its own group
        ("quxbot", "/example/page.html", True),  # an empty group allows everything
        ("otherbot", "/image.gif", False),
        ("otherbot", "/image.gif?x=1", True),
        ("otherbot", "/example/x", False),
        ("otherbot", "/publications/a", True),
        ("otherbot", "/", True),
    ],
)
def test_rfc_example(agent: str, path: str, expected: bool) -> None:
    assert allowed(RFC_EXAMPLE, path, agent) is expected


def test_longest_match_wins_either_way() -> None:
    text = "User-agent: *\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\nDisallow: /a\nAllow: /a/b\n"
    assert allowed(text, "/example/page/ok.html")
    assert not allowed(text, "/example/page/disallowed.gif")
    assert not allowed(text, "/a/c")
    assert allowed(text, "/a/b/c")


def test_allow_wins_a_tie() -> None:
    assert allowed("User-agent: *\nDisallow: /folder\nAllow: /folder\n", "/folder/page")
    assert allowed("User-agent: *\nAllow: /folder\nDisallow: /folder\n", "/folder/page")
    # equal length, different patterns: /pag and /p*e both match /page with 4 octets each
    assert allowed("User-agent: *\nDisallow: /pag\nAllow: /p*e\n", "/page")


def test_no_match_allows() -> None:
    assert allowed("User-agent: *\nDisallow: /private\n", "/public")


def test_wildcard_and_end_anchor() -> None:
    text = "User-agent: *\nDisallow: /*.php$\nDisallow: /*/secret\nDisallow: /fish*\n"
    assert not allowed(text, "/index.php")
    assert not allowed(text, "/dir/index.php")
    assert allowed(text, "/index.php?x=1")
    assert allowed(text, "/index.php5")
    assert not allowed(text, "/a/secret/x")
    assert allowed(text, "/secret")
    assert not allowed(text, "/fish")
    assert not allowed(text, "/fishheads/x")
    assert allowed(text, "/Fish")  # paths are case-sensitive


def test_dollar_inside_a_pattern_is_literal() -> None:
    text = "User-agent: *\nDisallow: /a$b\n"
    assert not allowed(text, "/a$b/c")
    assert allowed(text, "/a")


def test_end_anchor_alone_and_star_alone() -> None:
    assert not allowed("User-agent: *\nDisallow: /$\n", "/")
    assert allowed("User-agent: *\nDisallow: /$\n", "/page")
    assert not allowed("User-agent: *\nDisallow: *\n", "/anything")


def test_query_is_matched() -> None:
    text = "User-agent: *\nDisallow: /search?q=\nDisallow: /*?sessionid\n"
    assert not allowed(text, "/search?q=cats")
    assert allowed(text, "/search")
    assert not allowed(text, "/page?sessionid=1")
    assert allowed(text, "/page?other=1")


@pytest.mark.parametrize(
    ("pattern", "path", "expected_allowed"),
    [
        ("/%7Efoo", "/~foo/x", False),  # unreserved character encoded in the pattern
        ("/~foo", "/%7efoo/x", False),  # ... or in the URL, any hex case
        ("/foo/bar/%62%61%7A", "/foo/bar/baz", False),  # RFC 9309 §2.2.2 table
        ("/a%3cb", "/a%3Cb", False),  # hex case of a reserved character does not matter
        ("/ツ", "/%E3%83%84", False),  # non-ASCII pattern compares as UTF-8 octets
        ("/%E3%83%84", "/ツ", False),
        ("/a%2Fb", "/a/b", True),  # an encoded slash is not a slash
    ],
)
def test_percent_encoding_equivalence(pattern: str, path: str, expected_allowed: bool) -> None:
    assert allowed(f"User-agent: *\nDisallow: {pattern}\n", path) is expected_allowed


def test_robots_txt_is_always_allowed() -> None:
    assert allowed("User-agent: *\nDisallow: /\n", "/robots.txt")
    assert not allowed("User-agent: *\nDisallow: /\n", "/robots.txt.bak")
    assert RobotsPolicy.disallow_all().allowed(BASE + "/robots.txt")
    assert not RobotsPolicy.disallow_all().allowed(BASE + "/")
    assert RobotsPolicy.allow_all().allowed(BASE + "/anything")


def test_empty_disallow_allows_everything() -> None:
    assert allowed("User-agent: *\nDisallow:\n", "/anything")
    assert allowed("User-agent: *\nDisallow: \nAllow:\n", "/")


def test_product_token_matching_is_case_insensitive_and_exact() -> None:
    assert not allowed("User-agent: CycleCrawl\nDisallow: /\n", "/x")
    assert not allowed("User-agent: cyclecrawl/1.0\nDisallow: /\n", "/x")
    assert allowed("User-agent: cyclecrawler\nDisallow: /\n", "/x")
    assert allowed("User-agent: cycle\nDisallow: /\n", "/x")
    # the caller may pass a full User-Agent header; its product token is used
    assert not is_allowed("User-agent: cyclecrawl\nDisallow: /\n", "cyclecrawl/0.1 (+https://x.invalid/bot)", BASE)


def test_groups_for_the_same_agent_are_merged_and_star_is_only_a_fallback() -> None:
    text = (
        "User-agent: *\nDisallow: /everyone\n\n"
        "User-agent: cyclecrawl\nDisallow: /one\n\n"
        "User-agent: other\nDisallow: /other\n\n"
        "User-agent: CYCLECRAWL\nDisallow: /two\n"
    )
    assert not allowed(text, "/one")
    assert not allowed(text, "/two")
    assert allowed(text, "/everyone")
    assert allowed(text, "/other")
    assert not allowed(text, "/everyone", "somebot")
    assert allowed(text, "/one", "somebot")


def test_consecutive_user_agent_lines_share_one_group() -> None:
    text = "User-agent: a\nUser-agent: cyclecrawl\n# comment between\nUser-agent: b\nDisallow: /shared\n"
    for agent in ("a", "cyclecrawl", "b"):
        assert not allowed(text, "/shared", agent)
    assert allowed(text, "/shared", "c")


def test_user_agent_after_rules_starts_a_new_group() -> None:
    text = "User-agent: a\nDisallow: /x\nUser-agent: cyclecrawl\nDisallow: /y\n"
    assert allowed(text, "/x")
    assert not allowed(text, "/y")


def test_no_matching_group_allows_everything() -> None:
    policy = RobotsPolicy.parse("User-agent: other\nDisallow: /\n", TOKEN)
    assert policy.state is RobotsState.RULES
    assert policy.rules == ()
    assert policy.allowed(BASE + "/page")


def test_malformed_lines_are_tolerated() -> None:
    text = (
        "Disallow: /before-any-group\n"
        "this line has no colon\n"
        "\x00\x01 binary junk \xff\n"
        "User-agent: *\n"
        "Unknown-directive: whatever\n"
        "Noindex: /x\n"
        "Disallow: no-leading-slash\n"
        "   Disallow   :   /spaced   \n"
        "DISALLOW: /upper\n"
        "Dissalow: /typo\n"
        ":\n"
    )
    assert allowed(text, "/before-any-group")
    assert allowed(text, "/no-leading-slash")
    assert not allowed(text, "/spaced/page")
    assert not allowed(text, "/upper")
    assert not allowed(text, "/typo")
    assert allowed(text, "/x")


def test_comments_are_stripped() -> None:
    text = "# header\nUser-agent: * # everyone\nDisallow: /a # not /a#\nAllow: # nothing\n"
    assert not allowed(text, "/a")
    assert not allowed(text, "/ab")
    assert allowed(text, "/b")


def test_bom_and_line_endings() -> None:
    assert not allowed("\ufeffUser-agent: *\nDisallow: /\n", "/x")
    assert not allowed("User-agent: *\r\nDisallow: /crlf\r\n", "/crlf")
    assert not allowed("User-agent: *\rDisallow: /cr\r", "/cr")


def test_only_the_first_max_bytes_are_parsed() -> None:
    padding = "# " + "x" * 997 + "\n"  # 1000 bytes a line
    head = "User-agent: *\nDisallow: /early\n"
    text = head + padding * 600 + "Disallow: /late\n"  # /late begins past 600 KB
    policy = RobotsPolicy.parse(text, TOKEN)
    assert not policy.allowed(BASE + "/early")
    assert policy.allowed(BASE + "/late")
    assert not RobotsPolicy.parse(text, TOKEN, max_bytes=len(text.encode())).allowed(BASE + "/late")
    assert RobotsPolicy.parse(text, TOKEN, max_bytes=10).allowed(BASE + "/early")


def test_cut_inside_a_multibyte_character_is_tolerated() -> None:
    text = "User-agent: *\nDisallow: /ツツ\n"
    cut = len("User-agent: *\nDisallow: /ツ".encode()) + 1
    policy = RobotsPolicy.parse(text, TOKEN, max_bytes=cut)
    assert not policy.allowed(BASE + "/%E3%83%84")


def test_many_rules_and_pathological_patterns() -> None:
    rules = "".join(f"Disallow: /dir{i}/\n" for i in range(20000))
    policy = RobotsPolicy.parse("User-agent: *\n" + rules + "Allow: /dir19999/open\n", TOKEN)
    assert len(policy.rules) == 20001
    assert not policy.allowed(BASE + "/dir12345/x")
    assert policy.allowed(BASE + "/dir19999/open")
    assert policy.allowed(BASE + "/elsewhere")
    nasty = "User-agent: *\nDisallow: /" + "*a" * 200 + "b\n"
    # a backtracking matcher would not finish on this; position-set matching is quadratic at worst
    assert allowed(nasty, "/" + "a" * 3000)
    assert not allowed(nasty, "/" + "a" * 300 + "b")


def test_crawl_delay_from_the_selected_group() -> None:
    text = "User-agent: *\nCrawl-delay: 9\n\nUser-agent: cyclecrawl\nCrawl-delay: 0.5\nDisallow: /x\n"
    assert RobotsPolicy.parse(text, TOKEN).crawl_delay_s == 0.5
    assert RobotsPolicy.parse(text, "other").crawl_delay_s == 9.0
    assert RobotsPolicy.parse("User-agent: *\nDisallow: /\n", TOKEN).crawl_delay_s is None


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", ""])
def test_invalid_crawl_delay_is_ignored(value: str) -> None:
    policy = RobotsPolicy.parse(f"User-agent: *\nCrawl-delay: {value}\nCrawl-delay: 2\n", TOKEN)
    assert policy.crawl_delay_s == 2.0


def test_sitemaps_anywhere_in_the_file() -> None:
    text = (
        "Sitemap: http://example.com/before.xml\n"
        "User-agent: other\nSitemap: http://example.com/in-other-group.xml\nDisallow: /\n"
        "sitemap:https://example.com/last.xml.gz\n"
        "Sitemap:\n"
    )
    policy = RobotsPolicy.parse(text, TOKEN)
    assert policy.sitemaps == (
        "http://example.com/before.xml",
        "http://example.com/in-other-group.xml",
        "https://example.com/last.xml.gz",
    )
    assert policy.allowed(BASE + "/")  # the sitemap line did not end or start a group for us


def test_sitemap_line_does_not_split_agent_lines() -> None:
    text = "User-agent: a\nSitemap: http://example.com/s.xml\nUser-agent: cyclecrawl\nDisallow: /x\n"
    assert not allowed(text, "/x", "a")
    assert not allowed(text, "/x")


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (200, RobotsState.RULES),
        (204, RobotsState.RULES),
        (301, RobotsState.ALLOW_ALL),
        (400, RobotsState.ALLOW_ALL),
        (401, RobotsState.ALLOW_ALL),
        (403, RobotsState.ALLOW_ALL),
        (404, RobotsState.ALLOW_ALL),
        (410, RobotsState.ALLOW_ALL),
        (429, RobotsState.DISALLOW_ALL),
        (500, RobotsState.DISALLOW_ALL),
        (503, RobotsState.DISALLOW_ALL),
        (None, RobotsState.DISALLOW_ALL),
    ],
)
def test_policy_for_status(status: int | None, state: RobotsState) -> None:
    policy = policy_for_status(status, "User-agent: *\nDisallow: /private\n", TOKEN, 512000)
    assert policy.state is state
    expect_private = state is RobotsState.ALLOW_ALL
    assert policy.allowed(BASE + "/private/x") is expect_private
    assert policy.allowed(BASE + "/public") is (state is not RobotsState.DISALLOW_ALL)


def test_policy_for_status_200_with_no_body_allows_all() -> None:
    assert policy_for_status(200, None, TOKEN, 512000).allowed(BASE + "/x")


def test_policy_is_hashable_and_comparable() -> None:
    text = "User-agent: *\nDisallow: /p\nCrawl-delay: 1\n"
    assert RobotsPolicy.parse(text, TOKEN) == RobotsPolicy.parse(text, TOKEN)
    assert hash(RobotsPolicy.parse(text, TOKEN)) == hash(RobotsPolicy.parse(text, TOKEN))


def test_allowed_accepts_a_bare_path() -> None:
    policy = RobotsPolicy.parse("User-agent: *\nDisallow: /p\n", TOKEN)
    assert not policy.allowed("/p/x")
    assert policy.allowed("/q")


DAY = 86400.0
CACHE = RobotsCacheRules(ttl_s=DAY, use_cached_s=30 * DAY, retry_s=600.0)
GOOD = RobotsPolicy.parse("User-agent: *\nDisallow: /private\n", "cyclecrawl")


@pytest.mark.parametrize(("status", "unreachable"), [
    (None, True), (429, True), (500, True), (503, True), (600, True), (199, True),
    (200, False), (301, False), (404, False), (410, False),
])
def test_unreachable_is_no_answer_429_5xx_or_off_the_scale(status, unreachable):
    assert is_unreachable(status) is unreachable
    assert (policy_for_status(status, "", "cyclecrawl", 512000).state is RobotsState.DISALLOW_ALL) is unreachable


def test_while_robots_is_unreachable_the_last_good_copy_holds_for_30_days_then_disallow_all():
    """RFC 9309 §2.3.1.4/§2.4 on an injected clock: rules fetched, then 503s for days (re-fetched at 600 s, then
    doubling up to the TTL), the copy kept while younger than 30 days, then disallow all until an answer comes."""
    entry = remember(None, GOOD, 200, 0.0, CACHE)
    assert (entry.policy, entry.expires, entry.good_at, entry.unreachable) == (GOOD, DAY, 0.0, 0)

    now, retries = DAY, []
    while now < 30 * DAY:
        entry = remember(entry, RobotsPolicy.disallow_all(), 503, now, CACHE)
        assert entry.policy == GOOD and not entry.policy.allowed("http://h.test/private/x")
        assert entry.policy.allowed("http://h.test/open")
        retries.append(entry.expires - now)
        now = entry.expires
    assert retries[:4] == [600.0, 1200.0, 2400.0, 4800.0] and max(retries) == DAY  # escalates, capped at the TTL

    entry = remember(entry, RobotsPolicy.disallow_all(), None, now, CACHE)  # a timeout past the 30 days
    assert entry.policy.state is RobotsState.DISALLOW_ALL and entry.good is None
    assert not entry.policy.allowed("http://h.test/open")
    entry = remember(entry, RobotsPolicy.disallow_all(), 503, entry.expires, CACHE)
    assert entry.policy.state is RobotsState.DISALLOW_ALL  # the old copy never comes back

    entry = remember(entry, GOOD, 200, entry.expires, CACHE)  # reachable again: a fresh copy, the streak over
    assert (entry.policy, entry.unreachable, entry.expires - entry.good_at) == (GOOD, 0, DAY)


def test_unreachable_with_no_copy_disallows_all_and_a_4xx_answer_is_a_copy_too():
    entry = remember(None, RobotsPolicy.disallow_all(), 503, 0.0, CACHE)
    assert entry.policy.state is RobotsState.DISALLOW_ALL and entry.expires == 600.0
    missing = remember(None, RobotsPolicy.allow_all(), 404, 0.0, CACHE)  # "unavailable": allow all, RFC 9309
    assert remember(missing, RobotsPolicy.disallow_all(), 500, 10.0, CACHE).policy.state is RobotsState.ALLOW_ALL
    never = RobotsCacheRules(ttl_s=DAY, use_cached_s=0.0, retry_s=600.0)  # unreachable_use_cached_days: 0
    kept = remember(None, GOOD, 200, 0.0, never)
    assert remember(kept, GOOD, 503, 1.0, never).policy.state is RobotsState.DISALLOW_ALL


def test_a_stored_copy_is_adopted_in_force_then_kept_through_an_outage_as_a_running_daemon_would():
    """`adopt` on an injected clock: a daemon that never saw the host (restarted) meets the stored copy."""
    in_force = adopt(None, GOOD, stored_at=-100.0, stored_until=DAY - 100.0, now=0.0, rules=CACHE)
    assert (in_force.policy, in_force.expires, in_force.good_at) == (GOOD, DAY - 100.0, -100.0)
    # Expired two days ago: fetched again at once; a 503 then keeps the copy (younger than 30 days) ...
    expired = adopt(None, GOOD, stored_at=-3 * DAY, stored_until=-2 * DAY, now=0.0, rules=CACHE)
    assert expired.expires <= 0.0 and expired.good == GOOD
    outage = remember(expired, RobotsPolicy.disallow_all(), 503, 0.0, CACHE)
    assert outage.policy == GOOD and outage.unreachable == 1
    # ... which a daemon without it would not: disallow all.
    assert remember(None, RobotsPolicy.disallow_all(), 503, 0.0, CACHE).policy.state is RobotsState.DISALLOW_ALL
    # A copy older than 30 days is adopted but never put in force by an outage.
    old = adopt(None, GOOD, stored_at=-31 * DAY, stored_until=-30 * DAY, now=0.0, rules=CACHE)
    assert remember(old, RobotsPolicy.disallow_all(), 503, 0.0, CACHE).policy.state is RobotsState.DISALLOW_ALL


def test_a_daemon_keeps_what_it_knows_unless_the_stored_copy_is_newer_or_rescues_an_outage():
    own = remember(None, GOOD, 200, 0.0, CACHE)
    assert adopt(own, RobotsPolicy.allow_all(), stored_at=-5.0, stored_until=DAY, now=10.0, rules=CACHE) is None
    # Disallowing all for an outage with no copy of its own: a young stored copy stands in until the next retry.
    blind = remember(None, RobotsPolicy.disallow_all(), 503, 0.0, CACHE)
    rescued = adopt(blind, GOOD, stored_at=-DAY, stored_until=-DAY + 1.0, now=10.0, rules=CACHE)
    assert (rescued.policy, rescued.expires, rescued.unreachable) == (GOOD, blind.expires, 1)
    too_old = adopt(blind, GOOD, stored_at=-40 * DAY, stored_until=-39 * DAY, now=10.0, rules=CACHE)
    assert too_old.policy.state is RobotsState.DISALLOW_ALL and too_old.good == GOOD


def test_the_stored_copy_a_hosts_row_hands_over():
    """In force: the last observation; else the last good copy, expired; a row from before the good-copy columns
    hands over its last observation when it was reachable; an unreachable one with no good copy: nothing."""
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    hour = timedelta(hours=1)
    assert handed_over(200, "b", now - hour, now + hour, 200, now - hour, now) == (200, "b", now - hour, now + hour)
    good_at = now - 48 * hour
    assert handed_over(503, "b", now - hour, now + hour, 200, good_at, now) == (200, "b", good_at, good_at)
    assert handed_over(200, "b", now - 30 * hour, now - 6 * hour, None, None, now) == (
        200, "b", now - 30 * hour, now - 30 * hour)
    assert handed_over(503, None, now - hour, now + hour, None, None, now) is None
    assert handed_over(None, None, None, None, None, None, now) is None


def test_the_cached_copy_limit_cannot_pass_30_days(base_conf):
    assert base_conf.with_overrides({"robots.unreachable_use_cached_days": 30}).robots.unreachable_use_cached_days == 30
    with pytest.raises(ConfigError, match=r"robots.unreachable_use_cached_days.*at most 30 days"):
        base_conf.with_overrides({"robots.unreachable_use_cached_days": 365})
