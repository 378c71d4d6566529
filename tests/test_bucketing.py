"""crawler.bucketing: what a bucket is keyed by, and when a config may not work on a crawl."""

from __future__ import annotations

from crawler import urls
from crawler.bucketing import Bucketing


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
