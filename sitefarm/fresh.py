"""Opt-in fresh hosts (FarmSpec.fresh_hosts): news-like sites that change while a crawl runs, for the freshness
benchmark. Each lists a new article every `FarmSpec.fresh_interval_s` in its sitemap (robots.txt names it, and it sits
at the probed /sitemap.xml too), newest first, with priority 1.0, changefreq `always` and the article's listing time
as lastmod, so the crawler gives it a high priority; its home page changes at each listing (a new edition that links
to the newest articles). Article n is listed at `epoch + n x interval` (article 0 at the farm's start); before that
it answers 404. Everything is computed from the farm's clock at request time, and the farm knows when each article
was listed (`FreshSchedule.listed_at`): the ground truth a freshness judge measures against."""

from __future__ import annotations

import datetime
import math
import random
from dataclasses import dataclass

from sitefarm.resources import DOMAIN, Resource, html_page, sitemap_xml

FRESH_SITEMAP_PATH = "/sitemap.xml"
NEWEST_ON_HOME = 10  # the home page links to this many newest articles
SITEMAP_KEEPS = 1000  # the sitemap lists at most this many newest articles (a news sitemap is bounded)


def fresh_host_name(index: int) -> str:
    return f"fresh-{index}.{DOMAIN}"


def article_path(number: int) -> str:
    return f"/news/item-{number}.html"


def fresh_robots(base: str) -> str:
    return f"User-agent: *\nAllow: /\n\nSitemap: {base}{FRESH_SITEMAP_PATH}\n"


@dataclass(frozen=True)
class FreshSchedule:
    """When a fresh host lists its articles: article n at epoch + n x interval_s (Unix seconds)."""

    epoch: float
    interval_s: float

    def listed(self, now: float) -> int:
        """How many articles are listed at `now` (0 before the epoch)."""
        if now < self.epoch:
            return 0
        return math.floor((now - self.epoch) / self.interval_s) + 1

    def listed_at(self, number: int) -> float:
        return self.epoch + number * self.interval_s


def fresh_page(name: str, base: str, path: str, now: float, schedule: FreshSchedule, seed: int) -> Resource | None:
    """What a fresh host answers at `path` at time `now` (robots.txt is the caller's: `fresh_robots`)."""
    listed = schedule.listed(now)
    if path == FRESH_SITEMAP_PATH:
        newest = range(listed - 1, max(-1, listed - 1 - SITEMAP_KEEPS), -1)
        entries = [{"loc": base + article_path(n), "changefreq": "always", "priority": 1.0,
                    "lastmod": datetime.datetime.fromtimestamp(schedule.listed_at(n), datetime.UTC)
                    .replace(microsecond=0)}
                   for n in newest]
        return Resource(200, sitemap_xml("urlset", entries), content_type="application/xml")
    if path == "/":
        edition = max(listed - 1, 0)
        hrefs = [article_path(n) for n in range(listed - 1, max(-1, listed - 1 - NEWEST_ON_HOME), -1)]
        rng = random.Random(f"{seed}:{name}:edition:{edition}")
        return html_page(base + path, f"{name} home, edition {edition}", hrefs, rng)
    number = _article_number(path)
    if number is None or number >= listed:
        return None
    hrefs = ["/"] + ([article_path(number - 1)] if number else [])
    return html_page(base + path, f"{name} article {number}", hrefs, random.Random(f"{seed}:{name}:{path}"))


def _article_number(path: str) -> int | None:
    prefix, suffix = article_path(0).split("0")
    digits = path[len(prefix):-len(suffix)] if path.startswith(prefix) and path.endswith(suffix) else ""
    return int(digits) if digits.isdigit() and str(int(digits)) == digits else None
