"""`crawl demo`: a full local crawl of the bundled demo site farm, judged from the farm's own request log.

Starts the farm on loopback, runs the continuous driver (`crawl run --until-idle`, with its fetch daemon child, and
its `/metrics` when `cycle.metrics_port` is set) until nothing is due and no segment is open, stops everything it
started, writes each merged segment's HTML report (`crawl report`), validates every table (`crawl validate`) and
prints a short report. Exit status is non-zero on any politeness or robots violation or failed expectation, or when
the driver did not stop cleanly.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from crawler import layout
from crawler.config import Config

log = logging.getLogger("jobs.demo")

MARKER = ".cyclecrawl-demo"


@dataclass
class DemoFigures:
    fetched: int
    outcomes: list[tuple[str, int]]
    hosts: int
    warc_files: int
    warc_bytes: int
    urls_known: int
    reachable: int
    reachable_fetched: int
    sitemap_listed: int           # sitemap files and the in-scope, allowed pages they list
    sitemap_listed_fetched: int
    delay: float
    violations: list[dict]
    robots_violations: list[str]
    farm_requests: int

    def render(self) -> str:
        lines = [
            "demo report",
            f"  fetches by outcome/status: {', '.join(f'{k}={v}' for k, v in self.outcomes) or '-'}",
            f"  hosts fetched:             {self.hosts}",
            f"  WARC files:                {self.warc_files} ({self.warc_bytes / 1e6:.2f} MB)",
            f"  URLs known:                {self.urls_known}",
            f"  reachable (farm graph):    {self.reachable}, fetched {self.reachable_fetched}",
            f"  sitemaps + listed pages:   {self.sitemap_listed}, fetched {self.sitemap_listed_fetched}",
            f"  farm requests logged:      {self.farm_requests}",
            f"  politeness violations:     {len(self.violations)} (server log, delay {self.delay}s)",
            f"  robots violations:         {len(self.robots_violations)} (disallowed URLs requested)",
        ]
        for violation in self.violations[:10]:
            lines.append(f"    {violation}")
        for url in self.robots_violations[:10]:
            lines.append(f"    disallowed but requested: {url}")
        total = len(self.violations) + len(self.robots_violations)
        lines.append(
            f"demo: fetched={self.fetched} hosts={self.hosts} warc_files={self.warc_files} "
            f"delay={self.delay} violations={total}"
        )
        return "\n".join(lines)


def prepare_root(root: str) -> None:
    """Start from an empty root: a previous demo's root is wiped, anything else is refused."""
    path = Path(root)
    if path.exists() and any(path.iterdir()):
        if not (path / MARKER).exists():
            raise SystemExit(f"crawl demo: {root} is not empty and was not made by a demo; choose another --root")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by crawl demo; wiped by the next demo run into this folder\n")


def warc_files(root: str) -> list[Path]:
    return sorted(Path(layout.segments_dir(root)).glob("*/warc/bucket=*/*.warc.gz"))


def demo_config(conf: Config, root: str, farm) -> Config:
    return conf.with_overrides(
        {
            "storage.root": root,
            "fetch.static_hosts": farm.static_hosts(),
            "fetch.allow_networks": ["127.0.0.0/8"],
            "scope.host_suffixes": ["farm.test"],
            "politeness.min_delay_s": conf.demo.min_delay_s,
        }
    )


def measure(spark, conf: Config, root: str, farm, farm_log: Path) -> DemoFigures:
    """The figures, judged from the tables and the farm's own log; the crawl ran until nothing was due, so every
    page within `scope.max_depth` hops of the seeds is expected."""
    from pyspark.sql import functions as F

    from delta_tables import table_df
    from sitefarm.judge import politeness_violations, robots_violations
    from sitefarm.server import read_request_log

    token = conf.crawl.robots_token
    min_delay = conf.politeness.min_delay_s
    fetches = table_df(spark, root, "fetches")
    outcomes = [
        (f"{r['outcome']}/{r['status_code']}", int(r["count"]))
        for r in fetches.groupBy("outcome", "status_code").count().orderBy("outcome", "status_code").collect()
    ]
    answered = fetches.where(F.col("status_code").isNotNull())
    fetched = answered.count()
    hosts = answered.select("host_key").distinct().count()
    files = warc_files(root)

    got = answered.select("url").distinct()

    def fetched_of(expected: set[str]) -> int:
        if not expected:
            return 0
        return spark.createDataFrame([(u,) for u in sorted(expected)], "url string").join(got, "url").count()

    expected = farm.expected_fetches(token, max_depth=conf.scope.max_depth)
    sitemap_listed = farm.expected_fetches_sitemaps_only(token) if conf.sitemaps.from_robots else set()

    log_records = read_request_log(farm_log)

    def delay_for(host: str) -> float:
        return max(min_delay, farm.crawl_delay(host.split(":")[0]) or 0.0)

    return DemoFigures(
        fetched=fetched,
        outcomes=outcomes,
        hosts=hosts,
        warc_files=len(files),
        warc_bytes=sum(f.stat().st_size for f in files),
        urls_known=table_df(spark, root, "urls").count(),
        reachable=len(expected),
        reachable_fetched=fetched_of(expected),
        sitemap_listed=len(sitemap_listed),
        sitemap_listed_fetched=fetched_of(sitemap_listed),
        delay=min_delay,
        violations=politeness_violations(log_records, delay_for),
        robots_violations=robots_violations(log_records, farm.disallowed_urls(token)),
        farm_requests=len(log_records),
    )


def run_demo(conf: Config, root: str) -> int:
    from jobs import report as cycle_report
    from jobs import validate
    from jobs.base import spark_session
    from jobs.run import UPDATE, StepRecord, run_with_metrics
    from sitefarm.server import SiteFarm
    from sitefarm.sites import FarmSpec

    prepare_root(root)
    farm_dir = Path(root) / "sitefarm"
    farm_dir.mkdir(parents=True, exist_ok=True)
    farm = SiteFarm(
        FarmSpec(hosts=conf.demo.hosts, pages_per_host=conf.demo.pages_per_host),
        log_path=farm_dir / "requests.jsonl",
    )
    farm.start()
    merged: list[str] = []

    def keep_merged(record: StepRecord) -> None:
        if record.name == UPDATE and record.segment_id:
            merged.append(record.segment_id)

    try:
        conf = demo_config(conf, root, farm)
        seeds = farm_dir / "seeds.txt"
        seeds.write_text("".join(f"{url}\n" for url in farm.seed_urls()))
        print(f"demo: farm of {conf.demo.hosts} hosts on 127.0.0.1:{farm.port}; crawling into {root} until nothing "
              f"is due (a segment every {conf.cycle.interval_s:g}s)", flush=True)
        spark = spark_session(conf, app_name="crawl-demo")
        status = run_with_metrics(spark, conf, root, [keep_merged], str(seeds), daemon=True, run_for_s=None,
                                  until_idle=True)
    finally:
        farm.stop()
    print(f"demo: crawl data in {os.path.abspath(root)} (farm log: {farm_dir / 'requests.jsonl'})", flush=True)
    for data in cycle_report.build_many(spark, conf, root, merged).values():  # one set of jobs for them all
        print(f"demo: cycle report {cycle_report.write_report(data, root)}", flush=True)
    validation = validate.run(spark, conf, root)
    print(validation.summary(), flush=True)
    figures = measure(spark, conf, root, farm, farm_dir / "requests.jsonl")
    print(figures.render(), flush=True)
    return 1 if status or figures.violations or figures.robots_violations or not validation.success else 0
