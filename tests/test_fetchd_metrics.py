"""Observability of the fetch daemon: `/metrics` (Prometheus text 0.0.4, or OpenMetrics when asked) and `/status`
scraped from a daemon crawling the loopback site farm, during the crawl and after it, judged against the farm's own
request log, the results files and the WARC files (read back with fastwarc)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType

from crawler import layout
from crawler.commandline import engine_version
from crawler.config import ConfigError
from fetchd.commands import fetch_segment, serve
from fetchd.daemon import daemon_identity
from fetchd.metrics import (
    DaemonState,
    Metrics,
    exported_families,
    host_class,
    metrics_label,
    process_figures,
    render_prometheus,
    snapshot,
)
from fetchd.processes import process_conf
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.fetchlists import read_results, write_fetchlist
from tests.support.servers import free_port

SEGMENT = "seg-metrics"
MIN_DELAY = 0.2
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# ---- a strict reader of the Prometheus text exposition format 0.0.4 -------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)$")
_VALUE = re.compile(r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)$")


def parse_exposition(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """(type by family, value by (name, labels)). Fails on anything 0.0.4 does not allow or we never write:
    a sample before its family's TYPE, HELP/TYPE repeated, a family split, a duplicate series, a bad value."""
    assert text.endswith("\n") and "\r" not in text
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[tuple[str, frozenset], float] = {}
    finished: set[str] = set()
    current: str | None = None
    for line in text[:-1].split("\n"):
        assert line, "no blank lines"
        if line.startswith("#"):
            match = re.fullmatch(rf"# (HELP|TYPE) ({_NAME}) (.+)", line)
            assert match, line
            kind, name, rest = match.groups()
            assert name not in finished, f"family {name} split"
            if current is not None and current != name:
                finished.add(current)
            current = name
            if kind == "HELP":
                assert name not in helps and name not in types, f"HELP of {name} repeated or after TYPE"
                helps.add(name)
            else:
                assert name not in types and rest in ("counter", "gauge", "untyped", "summary", "histogram"), line
                types[name] = rest
            continue
        match = _SAMPLE.match(line)
        assert match, f"bad sample line: {line!r}"
        name, value = match.group(1), match.group(match.re.groups)
        family = name
        if current is not None and types.get(current) == "histogram" and name != current:
            family = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        assert family == current and family in types, f"sample {name} outside its family"
        assert _VALUE.match(value), f"bad value in {line!r}"
        labels = frozenset(re.findall(_LABEL, line[len(name):line.rindex(" ")]))
        assert len(labels) == len(dict(labels)), f"label repeated in {line!r}"
        key = (name, labels)
        assert key not in samples, f"duplicate series {line!r}"
        samples[key] = float(value)
    return types, samples


def values(samples: dict[tuple[str, frozenset], float], name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def one(samples: dict[tuple[str, frozenset], float], name: str) -> float:
    found = values(samples, name)
    assert len(found) == 1, name
    return next(iter(found.values()))


def test_parser_rejects_what_the_format_forbids():
    good = "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\"} 1\n"
    assert parse_exposition(good)[1] == {("a_total", frozenset({("k", "v")})): 1.0}
    for bad in (
        "a_total 1\n",                                                     # no TYPE
        good + 'a_total{k="v"} 2\n',                                       # duplicate series
        good.replace(" 1\n", " one\n"),                                    # bad value
        good.replace('{k="v"}', '{k="v}'),                                 # broken label
        good + "# TYPE b gauge\nb 1\n# TYPE a_total counter\n",            # family split / TYPE repeated
        good.rstrip("\n"),                                                 # no final newline
    ):
        with pytest.raises(AssertionError):
            parse_exposition(bad)


def test_exposition_escapes_label_values():
    metrics = Metrics(outcomes=Counter(success=2), politeness_wait_s=0.5)
    metrics.request(None, 0.2, "1")
    snap = snapshot(DaemonState(daemon_id='a"b\\c\nd', segment_id=None, now=1.0, metrics=metrics, buckets=[]))
    _, samples = parse_exposition(render_prometheus(snap))
    assert values(samples, "fetchd_fetches_total") == {
        frozenset({("daemon", r'a\"b\\c\nd'), ("outcome", "success")}): 2.0}
    assert one(samples, "fetchd_politeness_wait_seconds_total") == 0.5
    assert values(samples, "fetchd_requests_total") == {frozenset({("daemon", r'a\"b\\c\nd'), ("class", "none")}): 1.0}


def test_build_and_process_series_carry_each_daemons_label():
    """fetchd_build_info (value 1, the engine's version) and prometheus_client's process_* figures, per daemon: a
    command's processes each report their own process under their own label."""
    first = snapshot(DaemonState(daemon_id="host-1234", segment_id=None, now=1.0, metrics=Metrics(), buckets=[],
                                 label="host", process=process_figures()))
    second = dict(first, daemon="host.1", process={**first["process"], "process_open_fds": {
        **first["process"]["process_open_fds"], "value": 7}})
    types, samples = parse_exposition(render_prometheus(first, second))
    builds = values(samples, "fetchd_build_info")
    assert {dict(labels)["daemon"] for labels in builds} == {"host", "host.1"} and set(builds.values()) == {1.0}
    assert all(dict(labels)["version"] == engine_version() for labels in builds)
    cpu = {dict(labels)["daemon"]: v for labels, v in values(samples, "process_cpu_seconds_total").items()}
    assert set(cpu) == {"host", "host.1"} and cpu["host"] > 0 and types["process_cpu_seconds_total"] == "counter"
    fds = {dict(labels)["daemon"]: v for labels, v in values(samples, "process_open_fds").items()}
    assert fds["host.1"] == 7 and fds["host"] > 0
    assert len(values(samples, "process_resident_memory_bytes")) == 2


def test_the_daemon_label_outlives_a_restart(base_conf):
    """The default identity (files, leases) has the pid; the label of the series does not, so a restarted daemon
    carries on its series. Processes of one command add .N; fetch.metrics_label wins over both."""
    host = socket.gethostname()
    assert metrics_label(base_conf) == host and str(os.getpid()) in daemon_identity(base_conf)
    assert metrics_label(base_conf.with_overrides({"fetch.daemon_id": "d7"})) == "d7"
    assert metrics_label(base_conf.with_overrides({"fetch.daemon_id": "d7", "fetch.metrics_label": "edge"})) == "edge"
    assert [metrics_label(process_conf(base_conf, n, 3)) for n in range(3)] == [host, f"{host}.1", f"{host}.2"]


def test_throttles_are_counted_per_host_size_class():
    """The 429/503 ratio per host class is throttled / requests of each class; every class with requests has both
    series, so the ratio exists (0) before the first throttle."""
    assert [host_class(n) for n in (0, 1, 2, 10, 11, 100, 101, 1000, 1001, 10**6)] == [
        "1", "1", "2-10", "2-10", "11-100", "11-100", "101-1000", "101-1000", ">1000", ">1000"]
    metrics = Metrics()
    for status, size in ((200, "1"), (429, "101-1000"), (503, "101-1000"), (200, "101-1000"), (None, "1"), (500, "1")):
        metrics.request(status, 0.1, size)
    snap = snapshot(DaemonState(daemon_id="d", segment_id=None, now=1.0, metrics=metrics, buckets=[]))
    _, samples = parse_exposition(render_prometheus(snap))
    requests = {dict(k)["host_class"]: v for k, v in values(samples, "fetchd_host_class_requests_total").items()}
    throttled = {dict(k)["host_class"]: v for k, v in values(samples, "fetchd_host_class_throttled_total").items()}
    assert requests == {"1": 3, "101-1000": 3} and throttled == {"1": 0, "101-1000": 2}


# ---- helpers -------------------------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[str, str]:
    """(content type, body) of a GET on loopback; http.client, so no proxy setting can intervene."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200
        return response.getheader("Content-Type"), response.read().decode("utf-8")
    finally:
        conn.close()


def scrape(port: int) -> dict:
    """Both endpoints once; the exposition parsed strictly."""
    content_type, text = get(port, "/metrics")
    assert content_type == CONTENT_TYPE
    types, samples = parse_exposition(text)
    status_type, status = get(port, "/status")
    assert status_type.startswith("application/json")
    return {"types": types, "samples": samples, "status": json.loads(status)}


def read_manifest(root: str, bucket: int) -> dict:
    return json.loads(Path(layout.done_manifest(root, SEGMENT, bucket)).read_text())


def all_done(root: str, buckets) -> bool:
    return all(os.path.exists(layout.done_manifest(root, SEGMENT, b)) for b in buckets)


def warc_payload_bytes(root: str, results: list[dict]) -> int:
    """Body bytes of every response record (pages and robots.txt) in the crawl's WARC files, read by fastwarc."""
    folder = layout.warc_dir(root, SEGMENT)
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as fh:
                for record in ArchiveIterator(fh, parse_http=True, record_types=WarcRecordType.response):
                    total += len(record.reader.read())
    return total


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ---- one crawl by a serving daemon, scraped while it runs and after ------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory, base_conf):
    root = str(tmp_path_factory.mktemp("metrics-root"))
    farm = SiteFarm(FarmSpec(hosts=4, pages_per_host=12), os.path.join(root, "farm.jsonl"))
    farm.start()
    port = free_port()
    conf = base_conf.with_overrides({
        "politeness.min_delay_s": MIN_DELAY,
        "fetch.static_hosts": farm.static_hosts(),
        "fetch.warc_max_bytes": 20_000,
        "fetch.metrics_port": port,
        "fetch.poll_interval_s": 0.2,
        "fetch.progress_interval_s": 0.5,
        "fetch.daemon_id": "metrics-test",
    })
    fetchlist = write_fetchlist(root, SEGMENT, [{"url": u} for u in sorted(farm.page_urls())], conf.crawl.buckets)
    logger, collect = logging.getLogger("fetchd"), _Collect()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(collect)
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(conf, root, stop), daemon=True)
    thread.start()
    during: list[dict] = []
    try:
        deadline = time.monotonic() + 60
        while not all_done(root, fetchlist) and time.monotonic() < deadline:
            with contextlib.suppress(ConnectionRefusedError):  # the endpoint is not up yet
                during.append(scrape(port))
            time.sleep(0.2)
        assert all_done(root, fetchlist)
        after = scrape(port)
        yield {"root": root, "farm": farm, "conf": conf, "fetchlist": fetchlist, "during": during, "after": after,
               "log": read_request_log(farm.log_path), "progress": list(collect.lines)}
    finally:
        stop.set()
        thread.join(30)
        logger.removeHandler(collect)
        logger.setLevel(level)
        farm.stop()
    assert not thread.is_alive()


def test_counters_equal_the_results_files(served):
    root, samples = served["root"], served["after"]["samples"]
    results = read_results(root, SEGMENT)
    outcomes = Counter(row["outcome"] for row in results)
    assert {dict(labels)["outcome"]: v for labels, v in values(samples, "fetchd_fetches_total").items()} == outcomes
    assert all(dict(labels)["daemon"] == "metrics-test" for labels in values(samples, "fetchd_fetches_total"))
    listed = sum(len(rows) for rows in served["fetchlist"].values())
    assert one(samples, "fetchd_urls_listed_total") == listed == len(results)
    assert one(samples, "fetchd_robots_denials_total") == outcomes["robots_denied"] > 0
    manifests = [read_manifest(root, b) for b in served["fetchlist"]]
    warc_sizes = sum(os.path.getsize(os.path.join(d, n))
                     for d, _, names in os.walk(layout.warc_dir(root, SEGMENT)) for n in names)
    assert one(samples, "fetchd_warc_written_bytes_total") == warc_sizes == sum(m["warc_bytes"] for m in manifests)
    assert one(samples, "fetchd_downloaded_bytes_total") == warc_payload_bytes(root, results) > 0
    assert served["after"]["types"]["fetchd_fetches_total"] == "counter"
    assert served["after"]["types"]["fetchd_hosts_ready"] == "gauge"


def test_counters_equal_the_farm_log(served):
    log, samples = served["log"], served["after"]["samples"]
    assert one(samples, "fetchd_responses_total") == len(log)
    # Every request to a host but its last is followed by a politeness hold, at least close to the delay and at
    # most the gap the server saw between that request's end and the next one's start.
    by_host: dict[str, list[dict]] = defaultdict(list)
    for record in log:
        by_host[record["host"]].append(record)
    gaps = 0.0
    for records in by_host.values():
        records.sort(key=lambda r: r["start"])
        gaps += sum(b["start"] - a["end"] for a, b in zip(records, records[1:], strict=False))
    # At most one hold per request but each host's last; fewer when the loop came back to a host after its gate had
    # opened already (a busy machine: that time is ready lag, not a hold), so the real clock gives a bound only.
    waits = one(samples, "fetchd_politeness_waits_total")
    assert 0 < waits <= len(log) - len(by_host)
    assert 0.5 * MIN_DELAY * waits <= one(samples, "fetchd_politeness_wait_seconds_total") <= gaps
    # The live signal agrees with the server's log: no request sooner than the delay, none counted as such.
    assert politeness_violations(log, lambda _host: MIN_DELAY) == []
    assert one(samples, "fetchd_politeness_self_violations_total") == 0


def test_an_openmetrics_scraper_gets_openmetrics(served):
    """A scraper that asks for OpenMetrics (Prometheus does first) gets it: the same families, `# EOF` last."""
    conn = http.client.HTTPConnection("127.0.0.1", served["conf"].fetch.metrics_port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        response = conn.getresponse()
        body = response.read().decode("utf-8")
    finally:
        conn.close()
    assert response.status == 200 and response.getheader("Content-Type").startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n") and "# TYPE fetchd_fetches counter" in body
    assert re.search(r'^fetchd_fetches_total\{daemon="metrics-test",outcome="success"\} \d', body, re.M)


def test_after_the_crawl_gauges_are_zero_and_status_shows_every_bucket(served):
    samples, status = served["after"]["samples"], served["after"]["status"]
    for name in ("fetchd_hosts_active", "fetchd_hosts_ready", "fetchd_urls_queued", "fetchd_ready_lag_max_seconds",
                 "fetchd_ready_hosts_lag_seconds"):
        assert one(samples, name) == 0, name
    assert status["daemon_id"] == "metrics-test" and status["segment_id"] == SEGMENT
    root = served["root"]
    manifests = {b: read_manifest(root, b) for b in served["fetchlist"]}
    assert {b["bucket"] for b in status["buckets"]} == set(manifests)
    for bucket in status["buckets"]:
        manifest = manifests[bucket["bucket"]]
        assert bucket["state"] == "done" and bucket["queued"] == 0 and bucket["active_hosts"] == 0
        assert bucket["urls"] == bucket["results"] == manifest["urls"]
        assert bucket["outcomes"] == manifest["outcomes"] and bucket["hosts"] == manifest["hosts"]
        assert bucket["warc_files_closed"] == manifest["warc_files"]
    counters = status["counters"]
    assert counters["urls_done"] == counters["urls_listed"] == sum(m["urls"] for m in manifests.values())
    assert counters["responses"] == one(samples, "fetchd_responses_total")
    assert counters["warc_bytes"] == one(samples, "fetchd_warc_written_bytes_total")
    assert math.isclose(counters["politeness_wait_s"], one(samples, "fetchd_politeness_wait_seconds_total"),
                        abs_tol=1e-5)


def test_scrapes_during_the_crawl_show_it_progressing(served):
    during, total = served["during"], sum(len(rows) for rows in served["fetchlist"].values())
    mid = [s for s in during if 0 < s["status"]["counters"]["urls_done"] < total]
    assert len(mid) >= 3, "the crawl lasts seconds: several scrapes must land inside it"
    assert any(one(s["samples"], "fetchd_hosts_active") > 0 and one(s["samples"], "fetchd_urls_queued") > 0
               for s in mid)
    names = ("fetchd_responses_total", "fetchd_downloaded_bytes_total", "fetchd_warc_written_bytes_total",
             "fetchd_politeness_waits_total", "fetchd_politeness_wait_seconds_total")
    for name in names:
        series = [one(s["samples"], name) for s in [*during, served["after"]]]
        assert series == sorted(series), f"{name} went down"
    for scrape_ in mid:
        status = scrape_["status"]
        for bucket in status["buckets"]:
            left = bucket["urls"] - bucket["results"]  # queued or in flight
            assert 0 <= bucket["queued"] <= left
            assert min(left, 1) <= bucket["active_hosts"] <= min(left, bucket["hosts"])
        assert sum(b["queued"] for b in status["buckets"]) == status["gauges"]["urls_queued"]
        assert sum(b["results"] for b in status["buckets"]) == status["counters"]["urls_done"]


def test_progress_line_uses_the_same_figures(served):
    lines = [line for line in served["progress"] if line.startswith("fetchd progress:")]
    assert len(lines) >= 2  # periodic lines during the crawl, and one when it ends
    counters = served["after"]["status"]["counters"]
    last = lines[-1]
    assert f"{counters['urls_done']}/{counters['urls_listed']} urls" in last
    assert f"downloaded={counters['bytes_downloaded']}B warc={counters['warc_bytes']}B" in last
    assert f"politeness waits={counters['politeness_waits']} " in last
    assert "hosts active=0 ready=0" in last


# ---- the scheduler falling behind shows as ready lag ---------------------------------------------------


def test_ready_lag_grows_when_slots_are_the_bottleneck(root, base_conf):
    """One global slot for eight hosts whose delay would allow far more: hosts wait with their gate open."""
    farm = SiteFarm(FarmSpec(hosts=8, pages_per_host=8, latency_s=0.02), os.path.join(root, "farm.jsonl"))
    farm.start()
    try:
        port = free_port()
        conf = base_conf.with_overrides({
            "politeness.min_delay_s": 0.05,
            "fetch.concurrency": 1,
            "fetch.static_hosts": farm.static_hosts(),
            "fetch.metrics_port": port,
        })
        page_urls = sorted(farm.page_urls())
        write_fetchlist(root, SEGMENT, [{"url": u} for u in page_urls], conf.crawl.buckets)
        summary: dict = {}
        thread = threading.Thread(target=lambda: summary.update(fetch_segment(conf, root, SEGMENT)), daemon=True)
        thread.start()
        scrapes = []
        deadline = time.monotonic() + 60
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                scrapes.append(scrape(port)["samples"])
            except (OSError, http.client.HTTPException):
                thread.join(1)
                if scrapes and thread.is_alive():
                    raise  # not up yet, or closing with the daemon, is fine; while the daemon runs it must answer
            time.sleep(0.1)
        thread.join(30)
        assert not thread.is_alive() and summary["urls"] == len(page_urls)
    finally:
        farm.stop()
    assert len(scrapes) >= 3
    assert max(one(s, "fetchd_hosts_ready") for s in scrapes) >= 2
    lags = [(one(s, "fetchd_ready_lag_max_seconds"), one(s, "fetchd_ready_hosts_lag_seconds")) for s in scrapes]
    assert max(lag for lag, _ in lags) > 0.0
    assert all(0 <= lag_max <= lag_sum for lag_max, lag_sum in lags)
    # the endpoint closed with the daemon
    with pytest.raises(ConnectionRefusedError):
        get(port, "/metrics")


def test_metrics_keys_are_validated(base_conf):
    assert base_conf.fetch.metrics_port == 0  # no endpoint unless asked for
    for key, value in (("fetch.metrics_port", 65536), ("fetch.metrics_port", -1), ("fetch.metrics_host", "nope")):
        with pytest.raises(ConfigError) as info:
            base_conf.with_overrides({key: value})
        assert info.value.key == key


def test_responses_by_class_timings_hosts_and_robots_cache(served):
    """The on-call figures: requests by status class (the farm's own log says which), throttles, the fetch and
    resolve time histograms, hosts by state (none left after the crawl) and the robots cache."""
    log, samples = served["log"], served["after"]["samples"]
    by_class = {dict(labels)["class"]: v for labels, v in values(samples, "fetchd_requests_total").items()}
    assert by_class == Counter(f"{r['status'] // 100}xx" for r in log)
    throttled = {dict(labels)["code"]: v for labels, v in values(samples, "fetchd_throttled_responses_total").items()}
    assert throttled == {"429": 0, "503": 0}
    # Every host had its 12 pages listed: all its requests (robots.txt too) count in class 11-100.
    by_host_class = {dict(labels)["host_class"]: v
                     for labels, v in values(samples, "fetchd_host_class_requests_total").items()}
    assert by_host_class == {"11-100": len(log)}
    assert {dict(labels)["host_class"]: v for labels, v in values(
        samples, "fetchd_host_class_throttled_total").items()} == {"11-100": 0}
    for name, count in (("fetchd_fetch_seconds", len(log)), ("fetchd_resolve_seconds", len({r["host"] for r in log}))):
        buckets = {dict(labels)["le"]: v for labels, v in values(samples, f"{name}_bucket").items()}
        cumulative = list(buckets.values())
        assert cumulative == sorted(cumulative) and buckets["+Inf"] == one(samples, f"{name}_count") == count
        assert one(samples, f"{name}_sum") >= 0
    assert served["after"]["types"]["fetchd_fetch_seconds"] == "histogram"
    hosts = {dict(labels)["state"]: v for labels, v in values(samples, "fetchd_hosts").items()}
    assert hosts == {"ok": 0, "backing_off": 0, "paused": 0, "robots_unreachable": 0, "blocked": 0}
    assert one(samples, "fetchd_robots_cached_hosts") == len({r["host"] for r in log})
    assert 0 < one(samples, "fetchd_robots_cache_max_age_seconds") < 120
    assert one(samples, "fetchd_robots_unreachable_hosts") == 0


def test_the_grafana_dashboard_queries_only_what_the_daemon_exports(served):
    """docs/grafana-fetchd.json: every fetchd_* series a panel queries is in a real scrape of the daemon."""
    dashboard = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana-fetchd.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queried = {name for expr in exprs for name in re.findall(r"\bfetchd_[a-z0-9_]+", expr)}
    scraped = {name for name, _ in served["after"]["samples"]}
    assert len(exprs) >= 10 and queried and queried <= scraped, sorted(queried - scraped)
    assert exported_families() >= scraped
