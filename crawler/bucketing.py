"""What a bucket is keyed by, fixed for a crawl's life: the bucket of a host is mmh3 of its politeness key (the
host_key, or its registered domain with `politeness.key: domain`) modulo `crawl.buckets`.

Buckets are written into `urls` and `hosts` (the `bucket` partition column) when a row is created, name the fetch
lists, and are what a daemon owns; so neither setting may change under an existing crawl. The first job that writes
a root records both in `ROOT/_crawl.json` (`Bucketing.identity`); every job that assigns buckets, and every daemon,
compares its config with it (`refusal`) and stops with exit 2 on a difference, until `crawl rebucket` has rewritten
the buckets of every row under the new settings and recorded them.

A daemon already running when the record changes (`crawl rebucket`, or the first job on an empty root) compares
again before it takes buckets and every `fetch.poll_interval_s` while it fetches; on a difference it stops
fetching, releases its buckets and exits with `SettingsChanged` (exit 75), to be started again with the crawl's
settings (fetchd.daemon). Comparing the settings themselves is exact: what makes a daemon wrong is a bucket or a
politeness gate keyed otherwise than the crawl's, and a rebucket that changed nothing leaves every daemon right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crawler import urls
from crawler.errors import TryLater
from crawler.settings import Settings

POLITENESS_KEYS = ("host", "domain")
REBUCKET_COMMAND = "crawl rebucket"


class SettingsChanged(TryLater):
    """The crawl's recorded bucketing changed under a running daemon: it stopped fetching and released its buckets.
    Exit 75, like every TryLater: nothing is wrong with the daemon's run and nothing is half written; started again
    with the crawl's settings it goes on (with the old ones it is refused at start, exit 2)."""


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
        differing = self._differing(recorded)
        if not differing:
            return None
        said = [f"{'' if n == 0 else name + ' '}is {value!r} but this crawl's is {recorded.get(name)!r}"
                for n, (name, value) in enumerate(differing)]
        return differing[0][0], (f"{', and '.join(said)} (buckets are fixed for a crawl's life): set it back, or run "
                                 f"`{REBUCKET_COMMAND}` with the new settings to move every URL and host to its new "
                                 "bucket")

    def changed_under(self, recorded: Mapping[str, Any] | None) -> SettingsChanged | None:
        """What a daemon running with these settings stops with once the crawl's record is `recorded`; None while
        they are still the crawl's."""
        if recorded is None:
            return None
        differing = self._differing(recorded)
        if not differing:
            return None
        said = ", ".join(f"{name} is now {recorded.get(name)!r}, this daemon's {value!r}" for name, value in differing)
        return SettingsChanged(f"the crawl's settings changed while this daemon ran ({said}): it stopped fetching "
                               "and released its buckets; start it again with the crawl's settings")

    def _differing(self, recorded: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """(config key, this config's value) of each setting `recorded` holds otherwise."""
        return [(name, value) for name, value in self.identity().items() if recorded.get(name) != value]
