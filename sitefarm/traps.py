"""Opt-in extra hosts (FarmSpec.trap_hosts, FarmSpec.large_host_pages) that test the frontier's trap rules: two
crawler traps whose pages are generated on the fly for any valid URL (an infinite calendar, a faceted search), and
ordinary large news-like hosts that the trap rules must not cut."""

from __future__ import annotations

import calendar
import datetime
import math
from collections.abc import Callable

from sitefarm.resources import DOMAIN, WORDS, Resource

CALENDAR_HOST = f"calendar.{DOMAIN}"
FACETS_HOST = f"facets.{DOMAIN}"
CALENDAR_YEARS = (2026, 2027)  # the calendar's home page links to every month of these years
# The faceted search's filters in their one canonical query order; `page` (2, 3, ...) always comes last.
FACETS = (
    ("color", ("red", "green", "blue", "black", "white")),
    ("size", ("s", "m", "l", "xl")),
    ("brand", ("acme", "globex", "initech", "umbrella", "hooli")),
    ("sort", ("price", "rating", "new")),
)
ARTICLES_PER_TOPIC = 50  # a large host's articles are grouped in topics of this many
MAX_LARGE_HOST_PAGES = len(WORDS) ** 2 * ARTICLES_PER_TOPIC  # one distinct word or word pair per topic
LATEST_ARTICLES = 10  # a large host's home page also links to its newest articles
EXTRA_ROBOTS = "User-agent: *\nAllow: /\n"  # trap and large hosts allow everything: only trap rules bound them
# (host, path, title, hrefs) -> the page, its words seeded by its URL so every answer for it is the same
Generate = Callable[[str, str, str, list[str]], Resource]


def trap_home(name: str, generated: Generate) -> dict[str, Resource]:
    """A trap host's two fixed resources; every other page of it is generated on request (`calendar_page`,
    `facets_page`)."""
    if name == CALENDAR_HOST:
        hrefs = [_month_path(datetime.date(year, month, 1)) for year in CALENDAR_YEARS for month in range(1, 13)]
    else:
        hrefs = ["/search", *(_facet_path({facet: value}) for facet, values in FACETS for value in values)]
    return {
        "/": generated(name, "/", f"{name} home", hrefs),
        "/robots.txt": Resource(200, EXTRA_ROBOTS.encode("utf-8"), content_type="text/plain; charset=utf-8"),
    }


def calendar_page(path: str, generated: Generate) -> Resource | None:
    """A calendar with month, ISO-week and day views, each linking to the previous and next one of its kind:
    `/calendar/2026/11` (its weeks and days), `/calendar/2026/w48` (its seven days), `/calendar/2026/11/30`
    (its month and week). Any date of years 1-9999 answers 200: an endless chain of new URLs."""
    parts = path.split("/")
    if "?" in path or len(parts) not in (4, 5) or parts[:2] != ["", "calendar"]:
        return None
    try:
        if len(parts) == 5:
            kind, date = "day", datetime.date(int(parts[2]), int(parts[3]), int(parts[4]))
        elif parts[3].startswith("w"):
            kind, date = "week", datetime.date.fromisocalendar(int(parts[2]), int(parts[3][1:]), 1)
        else:
            kind, date = "month", datetime.date(int(parts[2]), int(parts[3]), 1)
    except ValueError:
        return None
    spelled = {"day": _day_path, "week": _week_path, "month": _month_path}[kind]
    if spelled(date) != path:  # one spelling per page: /calendar/2026/1 is not one
        return None
    hrefs = ["/"]
    if kind == "month":
        last = date.replace(day=calendar.monthrange(date.year, date.month)[1])
        days = [date + datetime.timedelta(days=n) for n in range(last.day)]
        hrefs += [_month_path(d) for d in (_shift(date, -1), _shift(last, 1)) if d is not None]
        hrefs += list(dict.fromkeys(_week_path(d) for d in days)) + [_day_path(d) for d in days]
    elif kind == "week":
        days = [d for d in (_shift(date, n) for n in range(7)) if d is not None]
        hrefs += [_week_path(d) for d in (_shift(date, -7), _shift(date, 7)) if d is not None]
        hrefs += [_day_path(d) for d in days]
    else:
        hrefs += [_month_path(date), _week_path(date)]
        hrefs += [_day_path(d) for d in (_shift(date, -1), _shift(date, 1)) if d is not None]
    title = "calendar " + path.removeprefix("/calendar/").replace("/", "-")
    return generated(CALENDAR_HOST, path, title, hrefs)


def facets_page(path: str, generated: Generate) -> Resource | None:
    """`/search?color=red&size=m&page=3`: any valid filter set (facets in FACETS order, at most one value
    each, `page` >= 2 last) answers 200 and links to every filter set one step away — one facet added,
    changed or removed, and the next page: about 20 new URLs per page, without end."""
    filters = _parse_facets(path)
    if filters is None:
        return None
    page = int(filters.pop("page", "1"))
    hrefs = ["/"]
    for facet, values in FACETS:
        for value in values:
            if filters.get(facet) != value:
                hrefs.append(_facet_path({**filters, facet: value}))
        if facet in filters:
            hrefs.append(_facet_path({k: v for k, v in filters.items() if k != facet}))
    hrefs.append(_facet_path(filters, page + 1))
    title = "search " + (", ".join(f"{k} {v}" for k, v in filters.items()) or "everything") + f" page {page}"
    return generated(FACETS_HOST, path, title, hrefs)


def large_site(name: str, articles: int, generated: Generate) -> dict[str, Resource]:
    """An ordinary news-like host: home -> topic indexes -> articles, every article linking to the others of
    its topic (a "more in this topic" list). Finite and fully allowed: the trap rules must not cut it."""
    topics = [_topic_slug(t) for t in range(math.ceil(articles / ARTICLES_PER_TOPIC))]
    site: dict[str, Resource] = {}

    def members(t: int) -> range:
        return range(t * ARTICLES_PER_TOPIC, min(articles, (t + 1) * ARTICLES_PER_TOPIC))

    def article_path(n: int) -> str:
        return f"/topics/{topics[n // ARTICLES_PER_TOPIC]}/{n}.html"

    latest = [article_path(n) for n in range(articles - 1, max(-1, articles - 1 - LATEST_ARTICLES), -1)]
    site["/"] = generated(name, "/", f"{name} home", [*(f"/topics/{t}/" for t in topics), *latest])
    for t, slug in enumerate(topics):
        following = topics[(t + 1) % len(topics)]
        hrefs = [f"{n}.html" for n in members(t)] + ["../../", f"../{following}/"]
        site[f"/topics/{slug}/"] = generated(name, f"/topics/{slug}/", f"{name} topic {slug}", hrefs)
        for n in members(t):
            hrefs = ["./", "/", *(f"{m}.html" for m in members(t) if m != n)]
            hrefs.append(article_path((n * 7 + 3) % articles))
            path = article_path(n)
            site[path] = generated(name, path, f"{name} article {n}", hrefs)
    site["/robots.txt"] = Resource(200, EXTRA_ROBOTS.encode("utf-8"), content_type="text/plain; charset=utf-8")
    return site


def _month_path(date: datetime.date) -> str:
    return f"/calendar/{date.year:04d}/{date.month:02d}"


def _week_path(date: datetime.date) -> str:
    year, week, _ = date.isocalendar()
    return f"/calendar/{year:04d}/w{week:02d}"


def _day_path(date: datetime.date) -> str:
    return f"/calendar/{date.year:04d}/{date.month:02d}/{date.day:02d}"


def _shift(date: datetime.date, days: int) -> datetime.date | None:
    """The date `days` away, or None beyond the calendar's ends (years 1 and 9999)."""
    ordinal = date.toordinal() + days
    return datetime.date.fromordinal(ordinal) if 1 <= ordinal <= datetime.date.max.toordinal() else None


def _facet_path(filters: dict[str, str], page: int = 1) -> str:
    """The one canonical spelling of a filter set: facets in FACETS order, `page` last and only from 2 on."""
    params = [f"{facet}={filters[facet]}" for facet, _ in FACETS if facet in filters]
    if page > 1:
        params.append(f"page={page}")
    return "/search" + ("?" + "&".join(params) if params else "")


def _parse_facets(path: str) -> dict[str, str] | None:
    """The filters (and `page`) of a canonical faceted-search path, or None if the farm has no such page."""
    route, _, query = path.partition("?")
    if route != "/search":
        return None
    filters = dict(param.partition("=")[::2] for param in query.split("&") if param)
    allowed = dict(FACETS)
    if any(key != "page" and value not in allowed.get(key, ()) for key, value in filters.items()):
        return None
    page = filters.get("page", "1")
    if not (page.isascii() and page.isdigit() and len(page) <= 9):  # no absurd page numbers
        return None
    rest = {key: value for key, value in filters.items() if key != "page"}
    if path != _facet_path(rest, int(page)):  # one spelling per page: no page=1, no other order, no repeats
        return None
    return filters


def _topic_slug(index: int) -> str:
    """A large host's topic name: one word, then word pairs — no digits, so each topic is its own template."""
    words = len(WORDS)
    return WORDS[index] if index < words else f"{WORDS[index % words]}-{WORDS[index // words]}"
