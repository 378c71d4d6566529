"""The simulated web: hosts drawn from documented distributions, and the server that answers them on virtual time.

Every draw comes from one seeded `random.Random`, so a run is reproduced by its seed. The distributions (per host
unless said otherwise; `docs/simulation.md` shows them beside the figures):

* known URLs: Zipf-like, 1 + max_urls * u^SKEW (u uniform): a long tail of tiny hosts and a few large ones; the
  first `giant_hosts` hosts get `giant_urls` each (never slow-drip: a site that large is provisioned for it);
* response time: log-normal per request, median per host log-uniform in [50 ms, 1 s], sigma 1 (heavy tail), at
  most 30 s (the fetch deadline); 3 % of hosts slow-drip: 5-30 s per response;
* throttling: 6 % of hosts answer a share (5-30 %) of page requests 429 or 503, with Retry-After 5, 30 or 120 s,
  in seconds for half of them and as an HTTP date for the others;
* robots.txt: 62 % rules (Disallow: /private), 20 % none (404), 6 % rules with Crawl-delay 2-20 s, 4 % answer 503
  for a window of 1-6 hours, 3 % redirect to another path, 3 % time out (no answer), 2 % 403;
* dead hosts: 2 % never answer (no response: DNS, refused and TLS failures alike); 60 % of them have failed for
  10-60 days already (the hosts table says since when), the others for 0-7 days; 3 % of the others are flaky: 20 %
  of their requests get no response;
* pages: every 20th path is under /private; 1 % of page requests answer 404; a page's content changes every
  `change_interval_s` of its host, log-uniform in [6 hours, 90 days] (the revisit policy adapts to it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from email.utils import formatdate

SKEW = 4.0                 # Zipf-like exponent of the URL count draw
EPOCH = 1_800_000_000.0    # wall-clock seconds at virtual time 0 (HTTP-date Retry-After values are absolute)
ROBOTS_RULES = "User-agent: *\nDisallow: /private\n"


@dataclass(frozen=True)
class SimHost:
    """One simulated host: how its server behaves."""

    key: str                      # host key, http://hNNNNN.sim
    urls: int                     # known URLs (paths /p0 ... /p<urls-1>; every 20th is under /private)
    rt_median_s: float            # median response time
    slow_drip: bool               # every response takes 5-30 s
    throttle_share: float         # share of page requests answered 429/503 (0: never)
    retry_after_date: bool        # Retry-After as an HTTP date (else seconds)
    robots: str                   # rules | none | crawl_delay | outage | redirect | timeout | forbidden
    crawl_delay_s: float | None   # the Crawl-delay line of a crawl_delay robots.txt
    outage: tuple[float, float]   # virtual seconds [from, to) a robots `outage` host answers robots.txt 503
    dead: bool                    # never answers
    dead_for_days: float          # a dead host has failed for this long before the run (0: alive)
    flaky: bool                   # a share of requests get no response
    change_interval_s: float      # a page's content changes this often

    def path(self, index: int) -> str:
        return f"/private/p{index}" if index % 20 == 19 else f"/p{index}"


def draw_hosts(count: int, max_urls: int, giant_hosts: int, giant_urls: int, hours: float,
               rng: random.Random) -> list[SimHost]:
    """`count` hosts from the distributions in the module docstring."""
    hosts = []
    for number in range(count):
        urls = giant_urls if number < giant_hosts else 1 + int(max_urls * rng.random() ** SKEW)
        robots = rng.choices(("rules", "none", "crawl_delay", "outage", "redirect", "timeout", "forbidden"),
                             (62, 20, 6, 4, 3, 3, 2))[0]
        start = rng.uniform(0, max(hours - 1, 0) * 3600)
        dead = rng.random() < 0.02
        hosts.append(SimHost(
            key=f"http://h{number:05d}.sim",
            urls=urls,
            rt_median_s=math.exp(rng.uniform(math.log(0.05), math.log(1.0))),
            slow_drip=rng.random() < 0.03 and number >= giant_hosts,
            throttle_share=rng.uniform(0.05, 0.3) if rng.random() < 0.06 else 0.0,
            retry_after_date=rng.random() < 0.5,
            robots=robots,
            crawl_delay_s=round(rng.uniform(2, 20), 1) if robots == "crawl_delay" else None,
            outage=(start, start + rng.uniform(1, 6) * 3600) if robots == "outage" else (0.0, 0.0),
            dead=dead,
            dead_for_days=(rng.uniform(10, 60) if rng.random() < 0.6 else rng.uniform(0, 7)) if dead else 0.0,
            flaky=not dead and rng.random() < 0.03,
            change_interval_s=math.exp(rng.uniform(math.log(6 * 3600), math.log(90 * 86400))),
        ))
    return hosts


@dataclass
class Answer:
    """A response as the server sends it: status (None: no response), its duration, headers that matter."""

    status: int | None
    seconds: float
    retry_after: str | None = None
    location: str | None = None
    body: str = ""


@dataclass
class SimServer:
    """Answers every request of the simulation and keeps the log the invariants are judged from: one record per
    request, as the server saw it (host, path, start, end, the daemon that sent it, the URL's version)."""

    hosts: dict[str, SimHost]
    rng: random.Random
    log: list[dict] = field(default_factory=list)

    def answer(self, host_key: str, path: str, start: float) -> Answer:
        host = self.hosts[host_key]
        seconds = self.rng.uniform(5, 30) if host.slow_drip else host.rt_median_s * math.exp(self.rng.gauss(0, 1))
        seconds = min(seconds, 30.0)  # the fetcher's total deadline
        if host.dead or (host.flaky and self.rng.random() < 0.2):
            return Answer(None, min(seconds, 10.0))
        if path == "/robots.txt":
            return self._robots(host, start, seconds)
        if path == "/robots-moved.txt":
            return Answer(200, seconds, body=ROBOTS_RULES)
        if host.throttle_share and self.rng.random() < host.throttle_share:
            wait = self.rng.choice((5, 30, 120))
            retry = formatdate(EPOCH + start + seconds + wait, usegmt=True) if host.retry_after_date else str(wait)
            return Answer(self.rng.choice((429, 503)), seconds, retry_after=retry)
        return Answer(404 if self.rng.random() < 0.01 else 200, seconds)

    @staticmethod
    def _robots(host: SimHost, start: float, seconds: float) -> Answer:
        if host.robots == "rules":
            return Answer(200, seconds, body=ROBOTS_RULES)
        if host.robots == "crawl_delay":
            return Answer(200, seconds, body=f"{ROBOTS_RULES}Crawl-delay: {host.crawl_delay_s}\n")
        if host.robots == "outage":
            in_outage = host.outage[0] <= start < host.outage[1]
            return Answer(503 if in_outage else 200, seconds, body="" if in_outage else ROBOTS_RULES)
        if host.robots == "redirect":
            return Answer(301, seconds, location="/robots-moved.txt")
        if host.robots == "timeout":
            return Answer(None, 30.0)
        return Answer(403 if host.robots == "forbidden" else 404, seconds)
