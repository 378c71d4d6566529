"""What a bucket is keyed by, fixed for a crawl's life: the bucket of a host is mmh3 of its politeness key (the
host_key, or its registered domain with `politeness.key: domain`) modulo `crawl.buckets`.

Buckets are written into `urls` and `hosts` (the `bucket` partition column) when a row is created, name the fetch
lists, and are what a daemon owns; so neither setting may change under an existing crawl. The first job that writes
a root records both in `ROOT/_crawl.json` (`Bucketing.identity`); every job that assigns buckets, and every daemon,
compares its config with it (`refusal`) and stops with exit 2 on a difference, until `crawl rebucket` has rewritten
the buckets of every row under the new settings and recorded them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crawler import urls
from crawler.settings import Settings

POLITENESS_KEYS = ("host", "domain")
REBUCKET_COMMAND = "crawl rebucket"


@dataclass(frozen=True)
class Bucketing:
    buckets: int
    key: str = "host"

    @classmethod
    def from_config(cls, conf: Settings) -> Bucketing:
        return cls(int(conf.crawl.buckets), str(conf.politeness.key))

    def key_of(self, host_key: str) -> str:
        """The politeness key of a host: what one bucket (and, with `domain`, one politeness gate) covers."""
        return urls.host_domain(host_key) if self.key == "domain" else host_key

    def bucket(self, host_key: str) -> int:
        return urls.bucket_of(self.key_of(host_key), self.buckets)

    def identity(self) -> dict[str, Any]:
        """What `_crawl.json` records of these settings."""
        return {"crawl.buckets": self.buckets, "politeness.key": self.key}

    def refusal(self, recorded: Mapping[str, Any] | None) -> tuple[str, str] | None:
        """(config key, why) this config may not work on a crawl whose `_crawl.json` holds `recorded`; None when
        it may (a root with no record yet takes this config's)."""
        if recorded is None:
            return None
        differing = [(name, value) for name, value in self.identity().items() if recorded.get(name) != value]
        if not differing:
            return None
        said = [f"{'' if n == 0 else name + ' '}is {value!r} but this crawl's is {recorded.get(name)!r}"
                for n, (name, value) in enumerate(differing)]
        return differing[0][0], (f"{', and '.join(said)} (buckets are fixed for a crawl's life): set it back, or run "
                                 f"`{REBUCKET_COMMAND}` with the new settings to move every URL and host to its new "
                                 "bucket")
