"""What one fetch daemon shares with the bucket runs it starts, built once by the daemon (`fetchd.daemon.Daemon`).

A bucket run (`fetchd.bucketrun`) and its helpers (`fetchd.exchange`, `fetchd.hostprep`, `fetchd.output`) take the
daemon's collaborators from a `DaemonServices` and never from the daemon itself: the clock, the storage, the HTTP
transport and resolver, the global request slots, the counters, the host memory (politeness gates, robots cache),
the buckets the daemon owns and a `StopSignal` they only read. So the object graph runs one way (daemon -> bucket
run -> its helpers), and a bucket run can be built from a context without a daemon around it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from dataclasses import dataclass

from crawler.bucketing import Bucketing, SettingsChanged
from crawler.clock import Clock
from crawler.config import Config
from crawler.politeness import HostGate, PolitenessRules, SharedGate
from crawler.robots import CachedRobots, RobotsCacheRules
from fetchd.fetcher import Transport
from fetchd.metrics import Metrics
from fetchd.ownership import Lease, LeaseStore
from fetchd.resolver import GuardedResolver
from fetchd.storage import LocalStore

log = logging.getLogger("fetchd")


class StopSignal:
    """Whether a daemon's bucket runs must stop as on SIGTERM: the daemon is stopping (`daemon_stop`, set by the
    signal handler or the caller), the cycle closed the segment being fetched (`segment_closed`), or the crawl's
    bucketing is no longer the daemon's (`settings_changed`, what the daemon then exits with). The daemon sets it;
    bucket runs only read it."""

    def __init__(self, daemon_stop: threading.Event):
        self.daemon_stop = daemon_stop
        self.segment_closed = False
        self.settings_changed: SettingsChanged | None = None

    def is_set(self) -> bool:
        return self.daemon_stop.is_set() or self.segment_closed or self.settings_changed is not None


class HostGates:
    """The politeness gates of one daemon's hosts, made by its politeness rules and kept in the host memory of the
    thread that runs it (`fetchd.hostprep.HostMemory`: `gates` by host, `domains` by registered domain, `addresses`
    by IP address), so they outlive bucket runs and segments."""

    def __init__(self, rules: PolitenessRules, bucketing: Bucketing, *, gates: dict[str, HostGate],
                 domains: dict[str, SharedGate], addresses: dict[str, SharedGate]):
        self.rules = rules
        self.bucketing = bucketing
        self.gates = gates
        self.domains = domains
        self.addresses = addresses

    def gate_for(self, host_key: str) -> HostGate:
        """The host's politeness gate, shared by all buckets and segments this daemon fetches; with
        `politeness.key: domain` held by its registered domain's gate too (one per domain and process: the crawl's
        key is fixed, so a gate keeps the domain it was made with)."""
        gate = self.gates.get(host_key)
        if gate is None:
            gate = self.gates[host_key] = self.rules.gate()
            fresh = self.rules.domain_gate()
            if fresh is not None:
                gate.domain = self.domains.setdefault(self.bucketing.key_of(host_key), fresh)
        return gate

    def address_gate_for(self, address: str) -> SharedGate | None:
        """The per-IP guard's gate of an IP address, shared by every host of this process that resolved to it (None
        while `politeness.max_concurrency_per_ip` and `min_delay_per_ip_s` are both 0: the guard is off)."""
        fresh = self.rules.address_gate()
        if fresh is None:
            return None
        gate = self.addresses.setdefault(address, fresh)
        gate.min_delay_s, gate.max_concurrency = fresh.min_delay_s, fresh.max_concurrency  # this daemon's settings
        return gate


class OwnedBuckets:
    """The buckets one daemon owns (`crawler.ownership`): their leases, taken, renewed and released through its
    lease store, by bucket in `leases`."""

    def __init__(self, lease_store: LeaseStore, bucketing: Bucketing, gates: HostGates, clock: Clock):
        self.lease_store = lease_store
        self.bucketing = bucketing
        self.gates = gates
        self.clock = clock
        self.leases: dict[int, Lease] = {}

    def acquire(self, bucket: int) -> bool:
        """Own the bucket: already owned, or taken now under the lease rule."""
        if bucket in self.leases and not self.leases[bucket].fenced():
            return True
        try:
            lease = self.lease_store.try_acquire(bucket)
        except OSError as exc:  # storage trouble: try again at the next look for work
            log.warning("cannot take bucket %05d: %s", bucket, exc)
            return False
        if lease is None:
            return False
        self.leases[bucket] = lease
        return True

    def drop_lost(self) -> None:
        """Forget the leases that are fenced (lost, or not renewed in time): only a new epoch owns such a bucket again.
        Kept, a lost lease looked owned to the look for work, whose fetch of it ended at once, over and over, until
        a renewal round dropped it."""
        for bucket, lease in list(self.leases.items()):
            if lease.fenced():
                self.leases.pop(bucket)

    def release(self, bucket: int) -> None:
        lease = self.leases.pop(bucket, None)
        if lease is not None:
            try:
                self.lease_store.release(lease, self.clock.wall())
            except OSError as exc:  # the lease then lapses by itself
                log.warning("cannot release bucket %05d: %s", bucket, exc)

    async def renew(self) -> None:
        """Renew every owned lease, in a thread: a renewal is a durable write (or an S3 PUT), and a slow one on the
        event loop would stall every host's timers. A lease that could not be renewed in time is dropped (its
        bucket run is fenced and stops)."""
        for bucket, lease in list(self.leases.items()):
            try:
                renewed = await asyncio.to_thread(self.lease_store.renew, lease)
            except OSError as exc:  # not renewed: the lease fences itself at its deadline if this goes on
                log.warning("cannot renew bucket %05d: %s", bucket, exc)
                continue
            if not renewed and self.leases.get(bucket) is lease:
                self.leases.pop(bucket)

    def owns_host(self, host_key: str) -> bool:
        """Whether this daemon may send `host_key` a request that no fetch list asked for (a robots.txt redirect to
        another host): it owns the host's bucket, or takes it now because no other daemon holds it. A bucket taken
        now carries its previous owner's last request end onto the host's gate, as every takeover does."""
        bucket = self.bucketing.bucket(host_key)
        held = self.leases.get(bucket)
        if held is not None and not held.fenced():
            return True
        if not self.acquire(bucket):
            return False
        previous_end = self.leases[bucket].previous_end
        if previous_end is not None:
            self.gates.gate_for(host_key).ended_elsewhere(self.clock.monotonic() + previous_end - self.clock.wall(),
                                                          crawl_delay_known=False)
        return True


@dataclass(eq=False)
class DaemonServices:
    """Everything a daemon's bucket runs share, one per daemon. The daemon builds it from its config (`fetch.*`,
    `ownership.*`, the politeness and robots rules, the bucketing) and hands it to every `BucketRun`, which passes
    it on to its `Exchange` and `HostPreparer`."""

    conf: Config
    clock: Clock              # every time a bucket run reads; its waits are on the event loop's clock, the same one
    store: LocalStore         # the storage root (an S3 root uploads what is written in `root`)
    root: str                 # where files are written: the root itself, or an S3 root's staging
    daemon_id: str            # `fetchd.daemon.daemon_identity`: names this daemon in files, rows and leases
    warcinfo: dict[str, str]  # the warcinfo record every WARC this daemon writes starts with
    transport: Transport      # HTTP (`fetchd.fetcher.Fetcher`), or a scripted stand-in in tests
    resolver: GuardedResolver
    slots: asyncio.Semaphore  # `fetch.concurrency`: requests in flight over all the daemon's bucket runs
    metrics: Metrics
    rng: random.Random        # the gates' jitter
    rules: PolitenessRules    # every gate's settings; each host's fetch-list limits on top
    robots_cache: dict[str, CachedRobots]  # host memory, on the monotonic clock
    robots_cache_rules: RobotsCacheRules
    gates: HostGates
    owned: OwnedBuckets
    stop: StopSignal
