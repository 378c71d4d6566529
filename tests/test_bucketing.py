"""crawler.bucketing: what a bucket is keyed by, and when a config may not work on a crawl or a running daemon must
stop; and which bucket leases `crawl rebucket` must wait for (crawler.ownership)."""

from __future__ import annotations

from crawler import ownership, urls
from crawler.bucketing import Bucketing, SettingsChanged
from crawler.errors import TryLater


def test_the_key_is_the_host_or_its_registered_domain():
    by_host, by_domain = Bucketing(64), Bucketing(64, "domain")
    assert by_host.key_of("http://a.news.example.co.uk") == "http://a.news.example.co.uk"
    assert by_domain.key_of("http://a.news.example.co.uk") == "example.co.uk"
    assert by_domain.key_of("https://example.co.uk:8443") == "example.co.uk"
    assert by_domain.key_of("http://127.0.0.1:8080") == "127.0.0.1"
    assert by_host.bucket("http://a.test") == urls.bucket_of("http://a.test", 64)
    subdomains = {by_domain.bucket(f"http://s{i}.blog.test") for i in range(50)}
    assert subdomains == {urls.bucket_of("blog.test", 64)}  # every subdomain in its domain's bucket
    assert len({by_host.bucket(f"http://s{i}.blog.test") for i in range(50)}) > 10  # by host: spread out


def test_a_config_is_refused_when_its_bucketing_is_not_the_crawls():
    recorded = Bucketing(16).identity()
    assert recorded == {"crawl.buckets": 16, "politeness.key": "host"}
    assert Bucketing(16).refusal(recorded) is None and Bucketing(8, "domain").refusal(None) is None
    key, why = Bucketing(16, "domain").refusal(recorded)
    assert key == "politeness.key" and why.startswith("is 'domain' but this crawl's is 'host'")
    assert "crawl rebucket" in why
    key, why = Bucketing(8, "domain").refusal(recorded)
    assert key == "crawl.buckets" and "is 8 but this crawl's is 16, and politeness.key is 'domain'" in why


def test_a_running_daemon_is_told_to_stop_once_the_record_is_not_its_settings():
    recorded = Bucketing(16, "domain").identity()
    assert Bucketing(16, "domain").changed_under(recorded) is None
    assert Bucketing(16).changed_under(None) is None  # no record yet: nothing has changed under it
    changed = Bucketing(16).changed_under(recorded)
    assert isinstance(changed, SettingsChanged) and isinstance(changed, TryLater)  # exit 75
    assert "politeness.key is now 'domain', this daemon's 'host'" in str(changed) and "\n" not in str(changed)
    both = str(Bucketing(8).changed_under(recorded))
    assert "crawl.buckets is now 16, this daemon's 8, politeness.key is now 'domain'" in both


def test_lease_files_are_named_by_epoch_and_only_unreleased_unexpired_leases_are_live():
    assert ownership.epoch_of(ownership.epoch_filename(42)) == 42
    assert ownership.epoch_of(".daemon-1-42.tmp") is None and ownership.epoch_of("epoch-x.json") is None

    def lease(bucket: int, expires_at: float, released: bool = False) -> ownership.LeaseRecord:
        return ownership.LeaseRecord(bucket=bucket, epoch=1, owner="d", hostname="h", pid=1, acquired_at=0.0,
                                     expires_at=expires_at, released=released)

    records = [lease(1, 100.0), lease(2, 100.0, released=True), lease(3, 89.0), lease(4, 91.0)]
    assert [r.bucket for r in ownership.live_holders(records, now=95.0, takeover_grace_s=5.0)] == [1, 4]
