"""Batch-side benchmark: what one cycle's parse, dedup, update and generate cost per page, and how that
cost grows with the corpus the segment is merged into.

Run on demand, never as a test:

    .venv/bin/python -m bench.cycle [--pages 100k] [--known-urls 1M,10M] [--exact 0.2] [--near 0.1]
                                    [--new-link-share 1] [--due COUNT] [--hosts 200] [--cycles 1]
                                    [--root /tmp/cyclecrawl-bench-cycle] [--keep]
    .venv/bin/python -m bench.cycle --pages 20 --known-urls 2000 --cycles 4   # a small segment's fixed costs

For each corpus size (--known-urls): `hosts` and `urls` are built synthetically (bench.frontier: every URL due, or
about --due of them with the rest due over the next 30 days; hosts Zipf-skewed), and so are the dedup indexes as a
crawl of that size would hold them (every known URL has a current document: a unique content hash and a random
SimHash, band rows keyed as dedup keys them and the index's definition recorded). Then `crawl generate` leases a
segment of --pages URLs, and the segment is written as the daemon writes it: real HTML (bench.parse.PageMaker:
realistic pages of 5-60 KB with 20-80 links of every form) through fetchd.warc.WarcFile, one WARC file and one
fetched-results Parquet file per bucket. A share --exact of the pages repeats an earlier page of the segment byte
for byte, a share --near repeats one with one paragraph changed (a few words: a near duplicate at small Hamming
distance). A share 1 - --new-link-share of a page's links point to URLs the crawl knows (drawn from `urls`; 0.1 is a
mature crawl, where most links lead to pages it has seen), the others are new (the default: every link new,
discovery's worst case). Timed, each on the same SparkSession: parse, dedup, update, and generate of the next
segment.

With --cycles N the cycle repeats N times on the same SparkSession, as the continuous driver runs it: each
cycle's segment is the one the previous cycle's generate leased, fetched (written) untimed, then parsed, deduplicated,
merged, and the next one generated. The first cycle pays what a process pays once (JVM warm-up, table checks
cached per session); the later ones show the fixed cost per cycle of a long-running driver.

Printed per step: wall seconds, whole-machine CPU seconds (from /proc/stat: Spark's JVM, its Python workers and
everything else on the machine), the driver's own CPU seconds (this process and its descendants: the JVM and its
Python workers; not disturbed by other work on the machine), CPU ms per page, peak resident memory of the driver
(the Python process plus its JVM, sampled every 0.2 s), Delta commits (table versions added over every table) and
Spark jobs started. Then its goals: the four steps together <= 5 CPU ms/page, and dedup and update each < 1.3x from
the smallest corpus to the largest; with a small segment (--pages <= 100), the fixed-cost goal: the four steps
together <= 25 s wall per cycle.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.frontier import StepTimes, build_hosts, build_urls, progress
from bench.parse import PageMaker
from crawler import config as config_mod
from crawler import layout, urls
from crawler.dedup import IndexDefinition
from crawler.records import FETCHED
from crawler.status import FetchOutcome
from delta_tables import tables
from fetchd.warc import WARC_SUFFIX, WarcFile, http_request_headers, http_response_headers, new_record_id
from jobs import dedup, generate, parse, update
from jobs.base import spark_session, table_rows

TARGET_CPU_MS_PER_PAGE = 5.0
TARGET_CORPUS_GROWTH = 1.3
TARGET_SMALL_SEGMENT_S = 25.0  # the four steps of a cycle on a small segment, wall seconds
SMALL_SEGMENT_PAGES = 100
STEPS = ("parse", "dedup", "update", "generate")
KNOWN_LINK_POOL = 200_000  # known URLs the pages' links to known URLs are drawn from (--new-link-share)


def size(text: str) -> int:
    """100k, 1M, 10_000 -> int."""
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def machine_cpu_seconds() -> float:
    """CPU seconds spent by the whole machine so far (user + nice + system + irq + softirq + steal)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7))
    return ticks / os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    """Each live process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    return children


def driver_cpu_seconds() -> float:
    """CPU seconds spent so far by this process and its descendants (the JVM, its Python workers), those that
    ended and were waited for included: the driver's own cost, whatever else the machine runs."""
    children, pending, ticks = _children(), [os.getpid()], 0
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def job_sites(spark: SparkSession, first: int, end: int) -> list[str]:
    """Each Spark job in [first, end) by its description (Delta names its own: "Delta: MERGE ...: Compute
    snapshot ...") or else its call site: how many times each, and their seconds from submission to completion
    (jobs of one step may overlap), most seconds first: where a step's jobs and time go."""
    store, sites = spark.sparkContext._jsc.sc().statusStore(), {}
    for job_id in range(first, end):
        seconds = 0.0
        try:
            job = store.job(job_id)
            description = job.description()
            site = description.get() if description.isDefined() else job.name()
            if job.submissionTime().isDefined() and job.completionTime().isDefined():
                seconds = (job.completionTime().get().getTime() - job.submissionTime().get().getTime()) / 1000
        except Exception:  # noqa: BLE001 - a job the store no longer holds
            site = "?"
        site = " ".join(str(site).split())[:150]
        count, total = sites.get(site, (0, 0.0))
        sites[site] = (count + 1, total + seconds)
    lines = [f"{count} x {site} ({total:.1f} s)"
             for site, (count, total) in sorted(sites.items(), key=lambda item: -item[1][1])]
    return [f"{sum(c for c, _ in sites.values())} jobs, {sum(t for _, t in sites.values()):.1f} s in jobs", *lines]


def spark_jobs_started(spark: SparkSession) -> int:
    """Spark jobs this SparkContext has started so far (the DAG scheduler's next job id)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def _driver_pids() -> list[int]:
    """This process and its child JVM (local mode's driver)."""
    me = os.getpid()
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == me:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return [me, *children]


class PeakMemory:
    """Peak resident memory of the driver (Python + JVM) while inside the `with` block, sampled every 0.2 s."""

    def __enter__(self) -> PeakMemory:
        self.peak_kb, self._stop = 0, threading.Event()
        self._pids = _driver_pids()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, sum(_rss_kb(pid) for pid in self._pids))
            self._stop.wait(0.2)

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()


def delta_versions(spark: SparkSession, root: str) -> int:
    """Sum over every table of its latest Delta version (commits made = the difference of two sums)."""
    return sum(tables.table_version(spark, root, name) for name in tables.TABLES)


@dataclass
class StepFigures:
    wall_s: float
    cpu_s: float
    driver_cpu_s: float
    peak_mb: float
    commits: int
    jobs: int
    summary: str


@dataclass
class Figures:
    known_urls: int
    pages: int = 0
    steps: dict[str, StepFigures] = field(default_factory=dict)
    # With --cycles > 1: every cycle's steps, the first one included (`steps` is the last cycle's).
    cycles: list[dict[str, StepFigures]] = field(default_factory=list)


def measure(spark: SparkSession, root: str, name: str, action, list_jobs: bool = False) -> tuple[StepFigures, object]:
    versions, jobs = delta_versions(spark, root), spark_jobs_started(spark)
    cpu, driver_cpu, started = machine_cpu_seconds(), driver_cpu_seconds(), time.monotonic()
    with PeakMemory() as memory:
        value = action()
    wall, driver_cpu = time.monotonic() - started, driver_cpu_seconds() - driver_cpu
    figures = StepFigures(wall, machine_cpu_seconds() - cpu, driver_cpu, memory.peak_kb / 1024,
                          delta_versions(spark, root) - versions, spark_jobs_started(spark) - jobs,
                          getattr(value, "summary", lambda: str(value))())
    progress(f"  {name}: {figures.wall_s:.1f}s wall, {figures.cpu_s:.1f} machine CPU-s, {figures.driver_cpu_s:.1f} "
             f"driver CPU-s, {figures.commits} commits, {figures.jobs} Spark jobs — {figures.summary}")
    if list_jobs:
        for line in job_sites(spark, jobs, jobs + figures.jobs):
            progress(f"    {line}")
    return figures, value


def build_dedup_index(spark: SparkSession, root: str, definition: IndexDefinition, now: datetime) -> None:
    """dedup_hashes and dedup_bands as a crawl of this corpus holds them: every known URL with a current document
    (a unique content hash, a random SimHash), itself its representative and its own cluster; the bands keyed and
    recorded under `definition`, as dedup keys and records them."""
    known = tables.table_df(spark, root, "urls").select(
        "url_id", F.concat(F.lit("sha1:"), F.upper(F.sha1("url"))).alias("content_hash"),
        F.xxhash64("url", F.lit("simhash")).alias("simhash"), F.lit(now - timedelta(days=1)).alias("seen"))
    seg = F.lit("seg-bench-corpus")
    hashes = known.select("url_id", "content_hash", "seen", F.col("url_id").alias("representative"),
                          F.lit(False).alias("marked_duplicate"), F.lit(False).alias("near_members"),
                          seg.alias("segment_id"))
    tables.conform(hashes, "dedup_hashes").write.format("delta").mode("append").save(
        tables.table_path(root, "dedup_hashes"))
    documents = known.select("url_id", "simhash", "seen", F.col("url_id").alias("cluster"),
                             F.col("seen").alias("cluster_seen"), seg.alias("segment_id"))
    tables.conform(dedup.explode_bands(documents, definition), "dedup_bands").write.format("delta").mode("append").save(
        tables.table_path(root, "dedup_bands"))
    tables.set_table_property(spark, root, "dedup_bands", dedup.INDEX_PROPERTY, definition.identity())


def near_copy(body: bytes, rng: np.random.Generator) -> bytes:
    """The page with a few words of one paragraph replaced: the same page to a reader, a near duplicate."""
    start = body.find(b"<p>", int(rng.integers(0, max(1, len(body) // 2))))
    start = body.find(b"<p>") if start < 0 else start
    return body[: start + 3] + b"updated notice " + body[start + 3:]


def known_links(spark: SparkSession, root: str, count: int, seed: int) -> list[str]:
    """About `count` URLs of `urls` drawn at random: the links of a page that point to URLs the crawl knows."""
    rows = spark.read.format("delta").load(tables.table_path(root, "urls"))
    share = min(1.0, 1.2 * count / max(1, table_rows(spark, root, "urls")))
    return [row["url"] for row in rows.select("url").sample(fraction=share, seed=seed).limit(count).collect()]


def write_segment(spark: SparkSession, root: str, segment_id: str, maker: PageMaker, exact: float, near: float,
                  now: datetime, seed: int, known: Sequence[str] = (), new_share: float = 1.0) -> tuple[int, int, int]:
    """The leased fetch list's URLs fetched: WARC + fetched results per bucket, as fetchd writes them; a page's
    links are known URLs (of `known`) with probability 1 - `new_share`. Returns (pages, exact copies, near
    copies)."""
    leased = spark.read.parquet(layout.fetchlist_dir(root, segment_id)).select(
        F.col("bucket").cast("int").alias("bucket"), "url_id", "state_version", "url", "host_key").collect()
    hosts = sorted({row["host_key"] for row in leased})
    rng = np.random.default_rng(seed)
    bodies: list[bytes] = []
    copies = {"exact": 0, "near": 0}
    by_bucket: dict[int, list] = {}
    for row in leased:
        by_bucket.setdefault(row["bucket"], []).append(row)
    for bucket, rows in sorted(by_bucket.items()):
        relative = layout.join("segments", segment_id, "warc", layout.bucket_dirname(bucket),
                               f"BENCH-{bucket:05d}{WARC_SUFFIX}")
        warc = WarcFile(layout.join(root, relative), {"software": "cyclecrawl bench.cycle",
                                                      "format": "WARC File Format 1.1"})
        pending = []
        for row in rows:
            draw = rng.random()
            if bodies and draw < exact:
                body = bodies[int(rng.integers(0, len(bodies)))]
                copies["exact"] += 1
            elif bodies and draw < exact + near:
                body = near_copy(bodies[int(rng.integers(0, len(bodies)))], rng)
                copies["near"] += 1
            else:
                body = maker.page(row["url"], row["host_key"], hosts, known, new_share)
                bodies.append(body)
            date = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            request_id, response_id = new_record_id(), new_record_id()
            headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))]
            records = [
                warc.request_record(row["url"], http_request_headers(
                    "GET", urls.path_and_query(row["url"]), [("Host", row["host_key"].split("//", 1)[1])]),
                    date, "127.0.0.1", request_id, response_id),
                warc.response_record(row["url"], http_response_headers(200, "OK", headers), body, date,
                                     "127.0.0.1", response_id, request_id),
                warc.fetch_metadata_record(row["url"], date, response_id, 12, "127.0.0.1", None, "success"),
            ]
            pending.append((row, len(body), warc.submit(records)))
        results = []
        for row, length, future in pending:
            response = future.result()[1]
            results.append({**dict.fromkeys(FETCHED.names), **{
                "segment_id": segment_id, "bucket": bucket, "url_id": row["url_id"],
                "state_version": row["state_version"], "url": row["url"], "host_key": row["host_key"],
                "fetched_at": now, "outcome": FetchOutcome.SUCCESS.value, "status_code": 200,
                "content_type": "text/html; charset=utf-8", "content_length": length, "truncated": False,
                "payload_digest": response.payload_digest, "warc_filename": relative,
                "warc_offset": response.offset, "warc_length": response.length, "elapsed_ms": 12,
                "remote_ip": "127.0.0.1", "daemon_id": "bench",
            }})
        warc.close()
        folder = layout.fetched_dir(root, segment_id, bucket)
        os.makedirs(folder, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(results, schema=FETCHED), f"{folder}/part-00000.parquet")
    return len(leased), copies["exact"], copies["near"]


def run_corpus(spark: SparkSession, conf: config_mod.Config, root: str, known: int, args: argparse.Namespace,
               maker: PageMaker) -> Figures:
    figures = Figures(known)
    shutil.rmtree(root, ignore_errors=True)
    now = datetime.now(UTC).replace(microsecond=0)
    progress(f"{known:,} known URLs: building urls, hosts and the dedup indexes under {root} (not timed)")
    tables.create_all(spark, root)
    hosts = build_hosts(spark, root, args.hosts, conf.crawl.buckets, now)
    build_urls(spark, root, known, hosts, args.hosts, 1.0, conf.revisit.default_interval_s, now, due_count=args.due,
               engine_ids=True)
    build_dedup_index(spark, root, IndexDefinition.from_config(conf), now)
    known_urls = known_links(spark, root, KNOWN_LINK_POOL, args.seed) if args.new_link_share < 1 else []
    segment_id = "seg-bench-cycle"
    leased = generate.run(spark, conf, root, segment_id, now=now)
    progress(f"{known:,} known URLs: leased {leased.url_count:,}; writing the fetched segment (not timed)")
    figures.pages, exact, near = write_segment(spark, root, segment_id, maker, args.exact, args.near,
                                               now + timedelta(minutes=5), args.seed, known_urls, args.new_link_share)
    progress(f"{known:,} known URLs: {figures.pages:,} pages, {exact:,} exact and {near:,} near copies")
    for cycle in range(1, args.cycles + 1):
        later = now + timedelta(hours=2 * cycle)
        next_segment = f"seg-bench-next-{cycle:03d}" if args.cycles > 1 else "seg-bench-next"
        if cycle > 1:
            progress(f"cycle {cycle}: writing the fetched segment {segment_id} (not timed)")
            write_segment(spark, root, segment_id, maker, args.exact, args.near, later - timedelta(hours=1),
                          args.seed + cycle, known_urls, args.new_link_share)
        steps = {}
        for name, action in (
            ("parse", partial(parse.run, spark, conf, root, segment_id)),
            ("dedup", partial(dedup.run, spark, conf, root, segment_id)),
            ("update", partial(update.run, spark, conf, root, segment_id)),
            ("generate", partial(generate.run, spark, conf, root, next_segment, now=later)),
        ):
            steps[name], _ = measure(spark, root, name, action, args.list_jobs)
        figures.steps = steps
        figures.cycles.append(steps)
        segment_id = next_segment
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def report_cycles(figures: Figures) -> None:
    """Per cycle of one corpus: each step's wall, driver CPU, commits and Spark jobs, and the four together."""
    print(f"\n{figures.known_urls:,} known URLs, {figures.pages} pages per segment, per cycle (one SparkSession):")
    header = (f"{'cycle':>5} {'step':<9} {'wall s':>7} {'CPU s':>7} {'driver CPU s':>12} {'commits':>7} "
              f"{'Spark jobs':>10}")
    print(header)
    print("-" * len(header))
    for number, steps in enumerate(figures.cycles, 1):
        for name in STEPS:
            s = steps[name]
            print(f"{number:>5} {name:<9} {s.wall_s:>7.1f} {s.cpu_s:>7.1f} {s.driver_cpu_s:>12.1f} {s.commits:>7} "
                  f"{s.jobs:>10}")
        together = [sum(getattr(steps[n], a) for n in STEPS) for a in ("wall_s", "cpu_s", "driver_cpu_s",
                                                                         "commits", "jobs")]
        print(f"{number:>5} {'together':<9} {together[0]:>7.1f} {together[1]:>7.1f} {together[2]:>12.1f} "
              f"{together[3]:>7} {together[4]:>10}")
    later = figures.cycles[1:]
    if later:
        walls = sorted(sum(c[n].wall_s for n in STEPS) for c in later)
        median = walls[len(walls) // 2]
        status = "met" if median <= TARGET_SMALL_SEGMENT_S else "NOT met"
        print(f"Goal: the four steps of a cycle after the first <= {TARGET_SMALL_SEGMENT_S:g} s wall (median of "
              f"{len(later)}): {median:.1f} {status}")


def report(all_figures: list[Figures]) -> None:
    for figures in all_figures:
        if len(figures.cycles) > 1:
            report_cycles(figures)
    print()
    header = (f"{'known URLs':>11} {'step':<9} {'wall s':>7} {'CPU s':>7} {'CPU ms/page':>11} {'peak MB':>8} "
              f"{'commits':>7} {'jobs':>5}")
    print(header)
    print("-" * len(header))
    for f in all_figures:
        for name in STEPS:
            s = f.steps[name]
            print(f"{f.known_urls:>11,} {name:<9} {s.wall_s:>7.1f} {s.cpu_s:>7.1f} {1000 * s.cpu_s / f.pages:>11.2f} "
                  f"{s.peak_mb:>8.0f} {s.commits:>7} {s.jobs:>5}")
        total = sum(f.steps[n].cpu_s for n in STEPS)
        print(f"{f.known_urls:>11,} {'together':<9} {sum(f.steps[n].wall_s for n in STEPS):>7.1f} {total:>7.1f} "
              f"{1000 * total / f.pages:>11.2f}")
    print()
    for f in all_figures:
        per_page = 1000 * sum(f.steps[n].cpu_s for n in STEPS) / f.pages
        status = "met" if per_page <= TARGET_CPU_MS_PER_PAGE else "NOT met"
        print(f"Goal: batch side <= {TARGET_CPU_MS_PER_PAGE:g} CPU ms/page at {f.known_urls:,} known URLs: "
              f"{per_page:.2f} {status}")
    if len(all_figures) > 1:
        small, large = all_figures[0], all_figures[-1]
        for name in ("dedup", "update"):
            growth = large.steps[name].cpu_s / small.steps[name].cpu_s
            status = "met" if growth < TARGET_CORPUS_GROWTH else "NOT met"
            print(f"Goal: {name} CPU at {large.known_urls:,} / at {small.known_urls:,} known URLs < "
                  f"{TARGET_CORPUS_GROWTH:g}: {growth:.2f} {status}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=size, default=size("100k"), help="pages in the segment (100k, 1M)")
    parser.add_argument("--known-urls", default="1M,10M", help="comma-separated corpus sizes, smallest first")
    parser.add_argument("--exact", type=float, default=0.2, help="share of pages repeating an earlier page")
    parser.add_argument("--near", type=float, default=0.1, help="share of pages that are near copies")
    parser.add_argument("--new-link-share", type=float, default=1.0,
                        help="share of a page's links drawn as new URLs; the rest point to known URLs (0.1: a mature "
                             "crawl; 1: every link new)")
    parser.add_argument("--due", type=size, default=None,
                        help="about this many known URLs due, the rest due over the next 30 days as in a running "
                             "crawl (default: every known URL due); at least --pages")
    parser.add_argument("--hosts", type=int, default=200, help="distinct hosts")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=1, help="cycles per corpus on one SparkSession")
    parser.add_argument("--list-jobs", action="store_true", help="print each step's Spark jobs by call site")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-cycle", help="scratch root (wiped per size)")
    parser.add_argument("--keep", action="store_true", help="keep each size's root")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable): to compare one against the default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a config key (section.key=YAML value, repeatable), as `crawl --set` takes it")
    args = parser.parse_args(argv)
    args.sizes = [size(s) for s in args.known_urls.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < args.pages or args.pages <= 0:
        parser.error("--pages must be positive and every --known-urls size at least --pages")
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.due is not None and not args.pages <= args.due <= min(args.sizes):
        parser.error("--due must be at least --pages and at most the smallest --known-urls size")
    if not 0 <= args.new_link_share <= 1:
        parser.error("--new-link-share is a share between 0 and 1")
    if not (args.exact >= 0 and args.near >= 0 and args.exact + args.near < 1):
        parser.error("--exact and --near are shares whose sum is below 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = config_mod.load(assignments=args.settings).with_overrides({
        "spark.master": args.master,
        "spark.shuffle_partitions": args.shuffle_partitions,
        "spark.driver_memory": args.driver_memory,
        "spark.log_level": "ERROR",
        "generate.segment_max_urls": args.pages,
        "generate.per_host_max_urls": args.pages,
        "politeness.min_delay_s": 0.01,
        "spark.conf": dict(setting.split("=", 1) for setting in args.spark_conf),
    })
    steps = StepTimes()
    logging.getLogger("jobs").setLevel(logging.INFO)
    logging.getLogger("jobs").addHandler(steps)
    progress(f"starting Spark ({args.master}); making the page generator")
    maker = PageMaker(args.seed)
    spark = spark_session(conf, app_name="cyclecrawl-bench-cycle")
    started = time.monotonic()
    try:
        all_figures = [run_corpus(spark, conf, layout.join(layout.normalize_root(args.root), f"known-{n}"), n,
                                  args, maker) for n in args.sizes]
    finally:
        spark.stop()
    print(f"\nBatch-side benchmark: {args.pages:,} pages per segment ({args.exact:.0%} exact, {args.near:.0%} near "
          f"copies, {args.new_link_share:.0%} of links new), {args.hosts} hosts, {conf.crawl.buckets} buckets, "
          f"{args.master}")
    report(all_figures)
    print(f"\nTotal benchmark time {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
