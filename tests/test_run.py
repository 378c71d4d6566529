"""`crawl run`, the continuous driver, as a person or a supervisor runs it: its own process, its daemon child, a
tiny loopback farm, a 2-second cadence.

One root is crawled without interruption to idle (the reference); another, on a farm of its own with the same
pages, is killed (SIGKILL of the whole process group) when its progress lines say a parse has started, an update
has started, and right after a dedup ended (between steps), restarted each time, then stopped with SIGTERM during a
step, then run to idle. Both end with the same URLs and statuses, every reachable page fetched, no result, index
event or link twice, every segment merged once, and no politeness violation in either farm's own log. The two
crawls run at once (their JVM starts overlap); the tables are read with delta-rs (no JVM here).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from crawler import config as config_mod
from fetchd.ownership import LeaseStore
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm, read_request_log
from sitefarm.sites import FarmSpec
from tests.support.config import TEST_OVERRIDES
from tests.support.jvm import short_lived_jvm_env

pytestmark = [pytest.mark.slow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[1]
FARM = FarmSpec(hosts=3, pages_per_host=8, latency_s=0.0)
DELAY_S = 0.05
RUN_TIMEOUT_S = 900  # one start of the driver: a loaded machine's JVM start and steps
MAX_DEPTH = 1
SIGTERM_BOUND_S = 90  # the step in progress on a tiny segment (on a loaded machine), and the daemon child's stop
# (step whose progress line triggers the kill, "started" or "done", seconds after that line, whom it kills: the
# whole process group, or the driver alone, whose daemon child and JVM must then end by themselves)
KILLS = (("parse", "started", 1.0, "group"), ("update", "started", 2.0, "driver"), ("dedup", "done", 0.0, "group"))
SIGTERM_AT = ("parse", "started", 1.0)
CHILDREN_GONE_S = 30  # after kill -9 of the driver alone: the daemon's stop on its parent's death, the JVM's exit


def run_config(root: Path, farm: SiteFarm, metrics_port: int = 0) -> Path:
    """The test settings, the farm's hosts and a short cadence; tables readable by delta-rs; leases and the
    writer lock short, so a restart after kill -9 does not wait a minute for what the killed driver held."""
    overrides = {
        **{k: v for k, v in TEST_OVERRIDES.items() if k != "spark.driver_memory"},
        "spark.driver_memory": "1g",
        "storage.root": str(root),
        "fetch.static_hosts": farm.static_hosts(),
        "scope.host_suffixes": ["farm.test"],
        "politeness.min_delay_s": DELAY_S,
        "politeness.max_crawl_delay_s": 0.5,
        "cycle.interval_s": 2.0,
        "cycle.poll_s": 0.2,
        "fetch.poll_interval_s": 0.3,
        "ownership.lease_ttl_s": 4.0,
        "ownership.renew_interval_s": 1.0,
        "ownership.fence_margin_s": 1.0,
        "ownership.takeover_grace_s": 0.5,
        "ownership.shutdown_grace_s": 2.0,
        "writer_lock.ttl_s": 4.0,
        "tables.deletion_vectors": False,
        # Two segments (the homes, then what they link to): the kills and restarts cost JVM starts enough.
        "scope.max_depth": MAX_DEPTH,
        "cycle.metrics_port": metrics_port,
    }
    data: dict = {}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    path = root.parent / f"{root.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Driver:
    """One `crawl run` process in a session of its own, its stdout lines read as they come."""

    process: subprocess.Popen
    lines: queue.Queue = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, config: Path, *args: str) -> Driver:
        argv = [sys.executable, "-m", "jobs.cli", "run", "--config", str(config), *args]
        process = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **short_lived_jvm_env()},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        driver = cls(process)
        threading.Thread(target=driver._read, daemon=True).start()
        return driver

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, step: str, event: str) -> str:
        """The first new progress line of `step` (`run: <step> <segment> started`, or its done line)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"crawl run ended (exit {self.process.wait()}) before {step} {event}:\n"
                                     + self.tail())
            self.seen.append(line)
            words = line.split()
            if words[:2] == ["run:", step] and (words[-1] == "started") == (event == "started"):
                return line
        os.killpg(self.process.pid, signal.SIGKILL)
        raise AssertionError(f"no {step} {event} within {RUN_TIMEOUT_S}s:\n" + self.tail())

    def finish(self) -> int:
        try:
            code = self.process.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self._drain()
            raise AssertionError(f"crawl run still running after {RUN_TIMEOUT_S}s:\n{self.tail()}") from None
        self._drain()
        return code

    def _drain(self) -> None:
        time.sleep(0.1)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.seen[-n:])

    def group_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
        return False


@dataclass
class Crawl:
    root: Path
    farm: SiteFarm
    log_path: Path
    outputs: list[str] = field(default_factory=list)
    sigterm: dict = field(default_factory=dict)
    scrape: str = ""  # the driver's /metrics after its first merge


def _farm(base: Path, name: str) -> tuple[SiteFarm, Path]:
    log_path = base / f"{name}-requests.jsonl"
    farm = SiteFarm(FARM, log_path)
    farm.start()
    return farm, log_path


def _seeds(base: Path, farm: SiteFarm, name: str) -> Path:
    path = base / f"{name}-seeds.txt"
    path.write_text("".join(f"{url}\n" for url in farm.seed_urls()))
    return path


def clean_crawl(base: Path) -> Crawl:
    farm, log_path = _farm(base, "clean")
    crawl = Crawl(base / "clean", farm, log_path)
    port = free_port()
    driver = Driver.start(run_config(crawl.root, farm, port), "--seeds", str(_seeds(base, farm, "clean")),
                          "--until-idle")
    driver.wait_for("update", "done")  # the first segment's: the second (the pages the homes link to) is to come
    crawl.scrape = scrape_after_merge(port)
    code = driver.finish()
    crawl.outputs.append(driver.tail(400))
    assert code == 0, driver.tail()
    return crawl


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape_after_merge(port: int, timeout_s: float = 60.0) -> str:
    """The driver's /metrics once it counts a merged segment (its observers run right after the progress line)."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        if "crawl_segments_merged_total 1.0" in text:
            break
        time.sleep(0.2)
    return text


def interrupted_crawl(base: Path) -> Crawl:
    farm, log_path = _farm(base, "killed")
    crawl = Crawl(base / "killed", farm, log_path)
    config = run_config(crawl.root, farm)
    seeds = ["--seeds", str(_seeds(base, farm, "killed"))]
    for step, event, after_s, whom in KILLS:
        driver = Driver.start(config, *seeds)
        seeds = []  # injected by the first start (inject is idempotent, but once is what a supervisor does)
        driver.wait_for(step, event)
        time.sleep(after_s)
        if whom == "group":
            os.killpg(driver.process.pid, signal.SIGKILL)
        else:
            driver.process.kill()
        driver.finish()
        crawl.outputs.append(driver.tail(400))
        assert driver.group_gone(CHILDREN_GONE_S), f"a process of the driver's group outlived kill -9 of the {whom}"
    driver = Driver.start(config)
    driver.wait_for(*SIGTERM_AT[:2])
    time.sleep(SIGTERM_AT[2])
    sent = time.monotonic()
    driver.process.send_signal(signal.SIGTERM)
    code = driver.finish()
    crawl.sigterm = {"code": code, "seconds": time.monotonic() - sent, "group_gone": driver.group_gone(5),
                     "output": driver.tail()}
    crawl.outputs.append(driver.tail(400))
    settings = config_mod.load(str(config))
    leases = LeaseStore(settings, str(crawl.root), owner="test")
    crawl.sigterm["held"] = [b for b in range(settings.crawl.buckets)
                             if leases.latest(b) is not None and not leases.latest(b).released]
    driver = Driver.start(config, "--until-idle")
    code = driver.finish()
    crawl.outputs.append(driver.tail(400))
    assert code == 0, driver.tail()
    return crawl


@pytest.fixture(scope="module")
def crawls(tmp_path_factory):
    base = tmp_path_factory.mktemp("run")
    with ThreadPoolExecutor(2) as pool:
        clean, killed = pool.submit(clean_crawl, base), pool.submit(interrupted_crawl, base)
        try:
            yield clean.result(), killed.result()
        finally:
            for future in (clean, killed):
                if future.exception() is None:
                    future.result().farm.stop()


def table(root: Path, name: str):
    from deltalake import DeltaTable

    return DeltaTable(str(root / "tables" / name)).to_pyarrow_table().to_pylist()


def test_sigterm_stops_the_driver_and_its_daemon_cleanly(crawls):
    """SIGTERM during a step: exit 0 within the bound, the step finished, nothing of the process group left (the
    daemon child, the JVM), every bucket lease the daemon held released; the restart to idle finishes the crawl
    (checked with the rest below)."""
    _, killed = crawls
    stop = killed.sigterm
    assert stop["code"] == 0, stop["output"]
    assert stop["seconds"] < SIGTERM_BOUND_S
    assert stop["group_gone"]
    assert stop["held"] == []
    assert "run: update" in stop["output"] and "run: stopped:" in stop["output"]


def test_kill_9_at_any_step_loses_nothing_and_merges_nothing_twice(crawls):
    clean, killed = crawls
    token = config_mod.load().crawl.robots_token
    summaries = {}
    for crawl in (clean, killed):
        reachable = crawl.farm.expected_fetches(token, max_depth=MAX_DEPTH)
        urls = table(crawl.root, "urls")
        fetches = table(crawl.root, "fetches")
        fetched = {r["url"] for r in fetches if r["status_code"] is not None}
        assert reachable <= fetched, sorted(reachable - fetched)[:5]
        results = Counter((r["url_id"], r["state_version"]) for r in fetches)
        assert max(results.values()) == 1, [k for k, n in results.items() if n > 1][:5]
        events = Counter((r["url_id"], r["state_version"]) for r in table(crawl.root, "index_events"))
        assert not events or max(events.values()) == 1
        links = Counter(repr(sorted(r.items())) for r in table(crawl.root, "links"))
        assert max(links.values()) == 1
        segments = table(crawl.root, "segments")
        assert {r["state"] for r in segments} == {"merged"}
        assert len({(r["segment_id"], r["bucket"]) for r in segments}) == len(segments)
        assert sum(r["stale"] or 0 for r in segments) == 0  # no result was merged after its URL moved on
        log = read_request_log(crawl.log_path)
        assert len(log) > len(reachable)
        assert politeness_violations(log, lambda host, farm=crawl.farm: farm.politeness_delay(host, DELAY_S)) == []
        port = f":{crawl.farm.port}/"  # the two farms serve the same pages on ports of their own
        summaries[crawl.root.name] = sorted((r["url"].replace(port, "/"), r["status"]) for r in urls)
        summaries[crawl.root.name + " applied"] = sum(r["applied"] or 0 for r in segments)
    assert summaries["killed"] == summaries["clean"]
    assert summaries["killed applied"] == summaries["clean applied"]


def test_the_driver_serves_its_steps_and_the_service_levels_from_the_tables(crawls):
    """`cycle.metrics_port`: the driver's /metrics, scraped after its first merge, times each batch step and shows
    the levels measured from the segment's `cycle_metrics` rows (generate's lease figures, update's discovery lags)."""
    clean, _ = crawls
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in clean.scrape.splitlines()
               if line and not line.startswith("#")}
    assert samples["crawl_segments_merged_total"] == 1.0
    for step in ("generate", "parse", "dedup", "update"):
        assert samples[f'crawl_step_last_duration_seconds{{step="{step}"}}'] > 0
    assert samples["crawl_discovery_pages"] >= 1  # the homes link to the pages of the second segment
    assert 0 <= samples["crawl_discovery_durable_p99_seconds"] < 3600
    assert samples["crawl_lease_eligible_high_priority_urls"] >= 0  # measured (NaN until a generate wrote it)
