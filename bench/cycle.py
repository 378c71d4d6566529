"""Batch-side benchmark: what one cycle's parse, dedup, update and generate cost per page, and how that
cost grows with the corpus the segment is merged into.

Run on demand, never as a test:

    .venv/bin/python -m bench.cycle [--pages 100k] [--known-urls 1M,10M] [--exact 0.2] [--near 0.1]
                                    [--hosts 200] [--root /tmp/cyclecrawl-bench-cycle] [--keep]

For each corpus size (--known-urls): `hosts` and `urls` are built synthetically (bench.frontier: every URL due,
hosts Zipf-skewed), and so are the dedup indexes as a crawl of that size would hold them (every known URL has a
current document: a unique content hash and a random SimHash, band rows by crawler.dedup.band_values_sql). Then
`crawl generate` leases a segment of --pages URLs, and the segment is written as the daemon writes it: real HTML
(bench.parse.PageMaker: realistic pages of 5-60 KB with 20-80 links of every form) through fetchd.warc.WarcFile,
one WARC file and one fetched-results Parquet file per bucket. A share --exact of the pages repeats an earlier
page of the segment byte for byte, a share --near repeats one with one paragraph changed (a few words: a near
duplicate at small Hamming distance). Timed, each on the same SparkSession: parse, dedup, update, and generate of
the next segment.

Printed per step: wall seconds, whole-machine CPU seconds (from /proc/stat: Spark's JVM, its Python workers and
everything else on the machine), CPU ms per page, peak resident memory of the driver (the Python process plus its
JVM, sampled every 0.2 s), and Delta commits (table versions added over every table). Then its goals:
the four steps together <= 5 CPU ms/page, and dedup and update each < 1.3x from the smallest corpus to
the largest.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.frontier import StepTimes, build_hosts, build_urls, progress
from bench.parse import PageMaker
from crawler import config as config_mod
from crawler import layout, urls
from crawler.dedup import band_values_sql
from crawler.records import FETCHED
from crawler.status import FetchOutcome
from delta_tables import tables
from fetchd.warc import WARC_SUFFIX, WarcFile, http_request_headers, http_response_headers, new_record_id
from jobs import dedup, generate, parse, update
from jobs.base import spark_session

TARGET_CPU_MS_PER_PAGE = 5.0
TARGET_CORPUS_GROWTH = 1.3
STEPS = ("parse", "dedup", "update", "generate")


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
    from delta.tables import DeltaTable

    return sum(DeltaTable.forPath(spark, tables.table_path(root, name)).history(1).first()["version"]
               for name in tables.TABLES)


@dataclass
class StepFigures:
    wall_s: float
    cpu_s: float
    peak_mb: float
    commits: int
    summary: str


@dataclass
class Figures:
    known_urls: int
    pages: int = 0
    steps: dict[str, StepFigures] = field(default_factory=dict)


def measure(spark: SparkSession, root: str, name: str, action) -> tuple[StepFigures, object]:
    versions = delta_versions(spark, root)
    cpu, started = machine_cpu_seconds(), time.monotonic()
    with PeakMemory() as memory:
        value = action()
    figures = StepFigures(time.monotonic() - started, machine_cpu_seconds() - cpu, memory.peak_kb / 1024,
                          delta_versions(spark, root) - versions, getattr(value, "summary", lambda: str(value))())
    progress(f"  {name}: {figures.wall_s:.1f}s wall, {figures.cpu_s:.1f} CPU-s, {figures.commits} commits — "
             f"{figures.summary}")
    return figures, value


def build_dedup_index(spark: SparkSession, root: str, max_hamming: int, now: datetime) -> None:
    """dedup_hashes and dedup_bands as a crawl of this corpus holds them: every known URL with a current document
    (a unique content hash, a random SimHash), itself its representative and its own cluster."""
    known = tables.table_df(spark, root, "urls").select(
        "url_id", F.concat(F.lit("sha1:"), F.upper(F.sha1("url"))).alias("content_hash"),
        F.xxhash64("url", F.lit("simhash")).alias("simhash"), F.lit(now - timedelta(days=1)).alias("seen"))
    seg = F.lit("seg-bench-corpus")
    hashes = known.select("url_id", "content_hash", "seen", F.col("url_id").alias("representative"),
                          F.lit(False).alias("marked_duplicate"), F.lit(False).alias("near_members"),
                          seg.alias("segment_id"))
    tables.conform(hashes, "dedup_hashes").write.format("delta").mode("append").save(
        tables.table_path(root, "dedup_hashes"))
    keys = F.array(*[F.expr(e) for e in band_values_sql("simhash", max_hamming)])
    bands = known.select("*", F.posexplode(keys).alias("band", "band_key")).select(
        "band", "band_key", "url_id", "simhash", "seen", F.col("url_id").alias("cluster"),
        F.col("seen").alias("cluster_seen"), seg.alias("segment_id"))
    tables.conform(bands, "dedup_bands").write.format("delta").mode("append").save(
        tables.table_path(root, "dedup_bands"))


def near_copy(body: bytes, rng: np.random.Generator) -> bytes:
    """The page with a few words of one paragraph replaced: the same page to a reader, a near duplicate."""
    start = body.find(b"<p>", int(rng.integers(0, max(1, len(body) // 2))))
    start = body.find(b"<p>") if start < 0 else start
    return body[: start + 3] + b"updated notice " + body[start + 3:]


def write_segment(spark: SparkSession, root: str, segment_id: str, maker: PageMaker, exact: float, near: float,
                  now: datetime, seed: int) -> tuple[int, int, int]:
    """The leased fetch list's URLs fetched: WARC + fetched results per bucket, as fetchd writes them.
    Returns (pages, exact copies, near copies)."""
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
                body = maker.page(row["url"], row["host_key"], hosts)
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
    build_urls(spark, root, known, hosts, args.hosts, 1.0, conf.revisit.default_interval_s, now)
    build_dedup_index(spark, root, conf.dedup.max_hamming, now)
    segment_id = "seg-bench-cycle"
    leased = generate.run(spark, conf, root, segment_id, now=now)
    progress(f"{known:,} known URLs: leased {leased.url_count:,}; writing the fetched segment (not timed)")
    figures.pages, exact, near = write_segment(spark, root, segment_id, maker, args.exact, args.near,
                                               now + timedelta(minutes=5), args.seed)
    progress(f"{known:,} known URLs: {figures.pages:,} pages, {exact:,} exact and {near:,} near copies")
    later = now + timedelta(hours=2)
    for name, action in (
        ("parse", lambda: parse.run(spark, conf, root, segment_id)),
        ("dedup", lambda: dedup.run(spark, conf, root, segment_id)),
        ("update", lambda: update.run(spark, conf, root, segment_id)),
        ("generate", lambda: generate.run(spark, conf, root, "seg-bench-next", now=later)),
    ):
        figures.steps[name], _ = measure(spark, root, name, action)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def report(all_figures: list[Figures]) -> None:
    print()
    header = (f"{'known URLs':>11} {'step':<9} {'wall s':>7} {'CPU s':>7} {'CPU ms/page':>11} {'peak MB':>8} "
              f"{'commits':>7}")
    print(header)
    print("-" * len(header))
    for f in all_figures:
        for name in STEPS:
            s = f.steps[name]
            print(f"{f.known_urls:>11,} {name:<9} {s.wall_s:>7.1f} {s.cpu_s:>7.1f} {1000 * s.cpu_s / f.pages:>11.2f} "
                  f"{s.peak_mb:>8.0f} {s.commits:>7}")
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
    parser.add_argument("--hosts", type=int, default=200, help="distinct hosts")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-cycle", help="scratch root (wiped per size)")
    parser.add_argument("--keep", action="store_true", help="keep each size's root")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    args = parser.parse_args(argv)
    args.sizes = [size(s) for s in args.known_urls.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < args.pages or args.pages <= 0:
        parser.error("--pages must be positive and every --known-urls size at least --pages")
    if not (args.exact >= 0 and args.near >= 0 and args.exact + args.near < 1):
        parser.error("--exact and --near are shares whose sum is below 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = config_mod.load().with_overrides({
        "spark.master": args.master,
        "spark.shuffle_partitions": args.shuffle_partitions,
        "spark.driver_memory": args.driver_memory,
        "spark.log_level": "ERROR",
        "generate.segment_max_urls": args.pages,
        "generate.per_host_max_urls": args.pages,
        "politeness.min_delay_s": 0.01,
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
          f"copies), {args.hosts} hosts, {conf.crawl.buckets} buckets, {args.master}")
    report(all_figures)
    print(f"\nTotal benchmark time {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
