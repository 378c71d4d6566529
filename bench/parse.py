"""Parse-step benchmark: docs/s of `jobs.parse` against a raw fastwarc + selectolax loop, and dedup time.

Run on demand, never as a test:

    .venv/bin/python -m bench.parse [--docs 20000] [--files 8] [--root /tmp/cyclecrawl-bench-parse] [--keep]
                                    [--master local[2]] [--shuffle-partitions 4] [--dedup-docs 1000000]

Input: synthetic HTML pages (title, boilerplate header/nav/footer, script and style, paragraphs cut from a Zipf-like
word stream, 20-80 links of mixed forms: root-relative, relative, ../, absolute to other hosts, protocol-relative,
query-only, fragments, mailto:, javascript:), sizes log-uniform between ~5 and ~60 KB. They are written as the daemon
writes them — `fetchd.warc.WarcFile` (request, response and fetch-metadata record per page, one gzip member each) —
under the segment layout parse reads, with one fetched-results Parquet file per bucket (`crawler.records.FETCHED`:
success, 200, the response record's offset/length). `crawl.buckets` is set to --files, so each bucket holds one
WARC file, as a daemon writes when no file reaches its size limit.

Timed:
  A  `jobs.parse.run` on the measured segment (wall, pages + links Delta writes and the segment-state MERGE
     included), after a run on a small warm-up segment (its time is the cold figure: first Python workers, first
     Delta writes). docs/s = records / wall.
  B  a raw loop over the same WARC files: fastwarc ArchiveIterator (response records), selectolax
     LexborHTMLParser, title, a[href] through urllib.parse.urljoin, body text. Once in one process and once in
     two (multiprocessing, files split by size), since local[2] uses two cores; the ratio uses the two-process
     figure, both are printed.
  In-process, no Spark: `read_record_at`, `analyze_record` and the page's WET record over every record, one
  process — the per-record work parse does in its Python workers, apart from Spark/Delta; then a cProfile pass over
  the first --profile-records records: the engine's functions by cumulative time, all by own time.
  Dedup: `python -m bench.dedup --docs <--dedup-docs>` in a subprocess (its own figures, echoed).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import math
import multiprocessing
import os
import pstats
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urljoin

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from crawler import config as config_mod
from crawler import layout, urls
from crawler.records import FETCHED
from crawler.status import FetchOutcome
from crawler.warcread import read_record_at
from fetchd.warc import WARC_SUFFIX, WarcFile, http_request_headers, http_response_headers, new_record_id

TARGET_RAW_RATIO = 0.50  # parse docs/s ÷ raw loop docs/s (two processes)
MEASURED = "seg-bench-measured"
WARMUP = "seg-bench-warmup"
HOSTS_PER_DOCS = 100  # one host per this many pages (min 4 per file), so buckets hold similar page counts
WORDS = 4000
CORPUS_WORDS = 2_000_000
MIN_PAGE_BYTES, MAX_PAGE_BYTES = 5_000, 60_000
PROFILE_TOP = 12
REPO_PREFIX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- synthetic input -------------------------------------------------------------------------------------------


class PageMaker:
    """Deterministic synthetic HTML pages; paragraphs are slices of one Zipf-like word stream (varied text, so
    SimHashes differ) made once with numpy, since drawing words one by one in Python would dominate the set-up."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        vocabulary = np.array(["".join(self.rng.choice(letters, size=int(n))) for n in self.rng.integers(2, 11, WORDS)])
        weights = 1.0 / np.arange(1, WORDS + 1)
        stream = self.rng.choice(vocabulary, size=CORPUS_WORDS, p=weights / weights.sum())
        self.corpus = " ".join(stream.tolist())

    def paragraph(self, size: int) -> str:
        start = int(self.rng.integers(0, len(self.corpus) - size - 20))
        start = self.corpus.index(" ", start) + 1
        end = self.corpus.rfind(" ", start, start + size)
        return self.corpus[start:end]

    def link(self, host: str, hosts: list[str], known: Sequence[str] = (), new_share: float = 1.0) -> str:
        """One href: with probability 1 - `new_share` a URL of `known` (one the crawl has seen), else one of ten
        forms (relative, absolute, protocol-relative, query, fragment, mailto, javascript...) with a random number:
        almost always a URL the crawl has never seen."""
        if known and self.rng.random() >= new_share:
            return known[int(self.rng.integers(0, len(known)))]
        n = int(self.rng.integers(0, 100_000))
        other = hosts[int(self.rng.integers(0, len(hosts)))]
        form = int(self.rng.integers(0, 10))
        return [
            f"/section{n % 7}/page-{n}.html",
            f"page-{n}.html",
            f"../archive/{n}/",
            f"{other}/p/{n}",
            f"//{other.split('//', 1)[1]}/x?id={n}&amp;ref=home",
            f"?page={n % 50}&amp;sort=asc",
            f"#part-{n % 9}",
            f"mailto:info@{host.split('//', 1)[1]}",
            "javascript:void(0)",
            f"{host}/a%20b/{n}?utm_source=feed&amp;id={n}",
        ][form]

    def page(self, url: str, host: str, hosts: list[str], known: Sequence[str] = (), new_share: float = 1.0) -> bytes:
        """A page of 5-60 KB with 20-80 links (`link`)."""
        target = int(math.exp(self.rng.uniform(math.log(MIN_PAGE_BYTES), math.log(MAX_PAGE_BYTES))))
        links = [self.link(host, hosts, known, new_share) for _ in range(int(self.rng.integers(20, 81)))]
        nav, inline, footer = links[:8], links[8:-6], links[-6:]
        title = self.paragraph(60)
        parts = [
            f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="description" content="{self.paragraph(120)}"><link rel="canonical" href="{url}">'
            "<style>body{font-family:sans-serif;margin:0}.nav a{padding:4px}</style>"
            "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments)}</script>"
            '</head><body><header class="nav"><ul>',
            *[f'<li><a href="{href}">{self.paragraph(14)}</a></li>' for href in nav],
            f"</ul></header><main><h1>{title}</h1>",
        ]
        texts: list[str] = []
        size = sum(map(len, parts)) + 400
        while size < target or not texts:
            texts.append(self.paragraph(int(self.rng.integers(300, 1500))))
            size += len(texts[-1]) + 7
        placed: list[list[str]] = [[] for _ in texts]
        for href in inline:
            placed[int(self.rng.integers(0, len(texts)))].append(f'<a href="{href}">{self.paragraph(20)}</a>')
        for text, anchors in zip(texts, placed, strict=True):
            chunks = [" ".join(chunk) for chunk in np.array_split(text.split(" "), len(anchors) + 1)]
            mixed = [piece for pair in zip(chunks, [*anchors, ""], strict=True) for piece in pair]
            parts.append(f"<p>{' '.join(mixed)}</p>")
        parts += ['</main><footer><p>&copy; 2024 All rights reserved.</p>',
                  *[f'<a href="{href}">{self.paragraph(12)}</a> ' for href in footer],
                  "</footer></body></html>"]
        return "".join(parts).encode()


@dataclass(frozen=True)
class Segment:
    segment_id: str
    records: int
    warc_files: list[str]  # absolute paths
    warc_bytes: int
    html_bytes: int


def write_segment(root: str, segment_id: str, docs: int, buckets: int, maker: PageMaker, now: datetime) -> Segment:
    """`docs` pages over their hosts' buckets: one WARC file and one fetched-results file per bucket."""
    host_count = max(buckets * 4, docs // HOSTS_PER_DOCS)
    hosts = [f"http://www{i}.site{i * 7919 % 10007}.example" for i in range(host_count)]
    by_bucket: dict[int, list[str]] = {}
    for i in range(docs):
        host = hosts[i % host_count]
        url = urls.canonicalize(f"{host}/section{i % 5}/page-{i}.html")
        by_bucket.setdefault(urls.bucket_of(urls.host_key(url), buckets), []).append(url)
    files, html_bytes = [], 0
    for bucket, bucket_urls in sorted(by_bucket.items()):
        relative = layout.join("segments", segment_id, "warc", layout.bucket_dirname(bucket),
                               f"BENCH-{bucket:05d}{WARC_SUFFIX}")
        warc = WarcFile(layout.join(root, relative), {"software": "cyclecrawl bench.parse",
                                                      "format": "WARC File Format 1.1"})
        pending = []
        for url in bucket_urls:
            host = urls.host_key(url)
            body = maker.page(url, host, hosts)
            html_bytes += len(body)
            date = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            request_id, response_id = new_record_id(), new_record_id()
            headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                       ("Server", "bench")]
            records = [
                warc.request_record(url, http_request_headers("GET", urls.path_and_query(url), [("Host", host)]),
                                    date, "127.0.0.1", request_id, response_id),
                warc.response_record(url, http_response_headers(200, "OK", headers), body, date, "127.0.0.1",
                                     response_id, request_id),
                warc.fetch_metadata_record(url, date, response_id, 12, "127.0.0.1", None, "success"),
            ]
            pending.append((url, host, len(body), warc.submit(records)))
        rows = []
        for url, host, length, future in pending:
            response = future.result()[1]
            rows.append({**dict.fromkeys(FETCHED.names), **{
                "segment_id": segment_id, "bucket": bucket, "url_id": urls.url_id(url), "state_version": 1,
                "url": url, "host_key": host, "fetched_at": now, "outcome": FetchOutcome.SUCCESS.value,
                "status_code": 200, "content_type": "text/html; charset=utf-8", "content_length": length,
                "truncated": False, "payload_digest": response.payload_digest, "warc_filename": relative,
                "warc_offset": response.offset, "warc_length": response.length, "elapsed_ms": 12,
                "remote_ip": "127.0.0.1", "daemon_id": "bench",
            }})
        warc.close()
        files.append(layout.join(root, relative))
        folder = layout.fetched_dir(root, segment_id, bucket)
        os.makedirs(folder, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=FETCHED), f"{folder}/part-00000.parquet")
        with open(layout.join(folder, layout.DONE_MANIFEST), "w") as manifest:
            json.dump({"rows": len(rows)}, manifest)
    return Segment(segment_id, docs, files, sum(os.path.getsize(f) for f in files), html_bytes)


def seed_segment_states(spark, root: str, segment: Segment, buckets: int) -> None:
    """`segments` rows in state fetched, so parse's state MERGE has rows to move (as in a crawl)."""
    from delta_tables import tables

    tables.create_all(spark, root)
    rows = [(segment.segment_id, bucket, "fetched") for bucket in range(buckets)]
    df = spark.createDataFrame(rows, "segment_id string, bucket int, state string").selectExpr(
        "*", "0L as url_count", "0L as host_count", "null as owner", "1L as epoch", "null as results",
        "null as applied", "null as stale", "null as discovered", "current_timestamp() as created_at",
        "current_timestamp() as updated_at", "null as counters", "null as wet_files", "null as wet_records",
    )
    tables.conform(df, "segments").write.format("delta").mode("append").save(tables.table_path(root, "segments"))


# --- B: the raw loop -------------------------------------------------------------------------------------------


def raw_parse_files(paths: list[str]) -> tuple[int, int, int]:
    """(documents, links, text characters) of the response records of `paths`: the least a parser must do."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from selectolax.lexbor import LexborHTMLParser

    docs = links = chars = 0
    for path in paths:
        for record in ArchiveIterator(path, record_types=WarcRecordType.response, parse_http=True):
            url = record.headers["WARC-Target-URI"]
            tree = LexborHTMLParser(record.reader.read())
            title_node = tree.css_first("title")
            _title = title_node.text() if title_node is not None else None
            hrefs = [urljoin(url, node.attributes.get("href") or "") for node in tree.css("a[href]")]
            body = tree.body
            chars += len(body.text(separator=" ")) if body is not None else 0
            links += len(hrefs)
            docs += 1
    return docs, links, chars


def split_by_size(paths: list[str], parts: int) -> list[list[str]]:
    """Greedy: largest file first into the lightest part."""
    shares: list[tuple[int, list[str]]] = [(0, []) for _ in range(parts)]
    for path in sorted(paths, key=os.path.getsize, reverse=True):
        shares.sort(key=lambda share: share[0])
        size, chosen = shares[0]
        shares[0] = (size + os.path.getsize(path), [*chosen, path])
    return [chosen for _, chosen in shares if chosen]


def run_raw(paths: list[str], processes: int) -> tuple[float, int, int]:
    """(wall s, documents, links); the worker processes are started before the clock starts."""
    if processes == 1:
        started = time.monotonic()
        docs, links, _ = raw_parse_files(paths)
        return time.monotonic() - started, docs, links
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.map(raw_parse_files, [[] for _ in range(processes)])
        started = time.monotonic()
        results = pool.map(raw_parse_files, split_by_size(paths, processes))
        wall = time.monotonic() - started
    return wall, sum(r[0] for r in results), sum(r[1] for r in results)


# --- per-record work without Spark ------------------------------------------------------------------------------


def in_process_parse(root: str, segment_id: str, conf: config_mod.Config, limit: int | None = None) -> dict[str, float]:
    """read_record_at, analyze_record and the page's WET record (with parse.wet_enabled) over the segment's rows
    (the first `limit`) in parse's order, timed apart, one process."""
    from crawler import wet
    from crawler.pages import analyze_record
    from crawler.scope import Scope

    scope = Scope.from_config(conf)
    table = pq.read_table(layout.fetched_dir(root, segment_id), partitioning=None)
    table = table.sort_by([("warc_filename", "ascending"), ("warc_offset", "ascending")]).slice(0, limit)
    read_s = analyze_s = wet_s = 0.0
    handle, name = None, None
    for row in table.select(["url", "warc_filename", "warc_offset", "content_type"]).to_pylist():
        if row["warc_filename"] != name:
            if handle is not None:
                handle.close()
            name = row["warc_filename"]
            handle = open(layout.join(root, name), "rb")  # noqa: SIM115 - closed when the next file starts
        mark = time.perf_counter()
        record = read_record_at(handle, row["warc_offset"], max_bytes=conf.parse.max_html_bytes)
        between = time.perf_counter()
        fields = analyze_record(record, row["url"], row["content_type"], max_outlinks=conf.parse.max_outlinks,
                                shingle=conf.parse.simhash_shingle, scope=scope,
                                robots_token=conf.crawl.robots_token, max_parse_seconds=conf.parse.max_parse_seconds,
                                language_max_chars=conf.parse.language_max_chars)
        analyzed = time.perf_counter()
        text = fields["text"]
        if conf.parse.wet_enabled and wet.wet_outcome(text is not None, text) is wet.WetOutcome.WRITTEN:
            wet.conversion_record(text, target_uri=record.target_uri, date=record.date, refers_to=record.record_id,
                                  languages=wet.language_codes(fields["languages"]))
        read_s += between - mark
        analyze_s += analyzed - between
        wet_s += time.perf_counter() - analyzed
    if handle is not None:
        handle.close()
    return {"read_s": read_s, "analyze_s": analyze_s, "wet_s": wet_s, "records": table.num_rows}


def profile_in_process(root: str, segment_id: str, conf: config_mod.Config, records: int, top: int) -> None:
    """`in_process_parse` of the first `records` under cProfile: the engine's functions by cumulative time (where
    the per-record time goes), then every function by own time."""
    profiler = cProfile.Profile()
    profiler.runcall(in_process_parse, root, segment_id, conf, records)
    for order, restriction in (("cumulative", r"crawler/|jobs/"), ("tottime", "")):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(restriction, top)
        lines = out.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"  by {order}:")
        for line in lines[start:start + top + 1]:
            print(f"  {line.replace(REPO_PREFIX, '')}")


# --- dedup -----------------------------------------------------------------------------------------------------


def run_dedup(docs: int) -> float | None:
    """bench.dedup in a subprocess (its figures echoed); its total seconds. Empty pages 2 % of the docs, as
    bench.dedup's defaults (20 000 of 1 M), which fail below 20 001 docs."""
    command = [sys.executable, "-m", "bench.dedup", "--docs", str(docs), "--empty", str(max(1, docs // 50))]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        print(f"  {line}")
    match = re.search(r"^\s*total\s+([\d.]+) s", done.stdout, re.MULTILINE)
    return float(match.group(1)) if match else None


# --- main ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20_000, help="pages in the measured segment")
    parser.add_argument("--files", type=int, default=8, help="WARC files (= buckets) per segment")
    parser.add_argument("--warmup-docs", type=int, default=500, help="pages in the warm-up segment")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-parse")
    parser.add_argument("--keep", action="store_true", help="keep the scratch root")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--dedup-docs", type=int, default=1_000_000, help="0 skips the dedup figure")
    parser.add_argument("--profile-records", type=int, default=2000, help="0 skips the cProfile pass")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started_all, load = time.monotonic(), os.getloadavg()
    root = layout.normalize_root(args.root)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    conf = config_mod.load().with_overrides({
        "spark.master": args.master, "spark.shuffle_partitions": args.shuffle_partitions,
        "spark.driver_memory": args.driver_memory, "spark.log_level": "ERROR", "crawl.buckets": args.files,
    })
    logging.basicConfig(level=logging.WARNING)
    try:
        progress("building synthetic pages and WARC files")
        mark = time.monotonic()
        maker = PageMaker(args.seed)
        now = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
        warmup = write_segment(root, WARMUP, args.warmup_docs, args.files, maker, now)
        measured = write_segment(root, MEASURED, args.docs, args.files, maker, now)
        build_s = time.monotonic() - mark
        progress(f"  {measured.records:,} pages in {len(measured.warc_files)} WARC files, "
                 f"{measured.html_bytes / 1e6:.0f} MB of HTML, {measured.warc_bytes / 1e6:.0f} MB gzipped "
                 f"({build_s:.0f}s, warm-up segment {warmup.records:,} pages included)")

        progress("B: raw fastwarc + selectolax loop")
        raw1_s, raw_docs, raw_links = run_raw(measured.warc_files, 1)
        raw2_s, raw2_docs, _ = run_raw(measured.warc_files, 2)
        assert raw_docs == raw2_docs == measured.records, (raw_docs, raw2_docs, measured.records)
        progress(f"  1 process {raw1_s:.1f}s, 2 processes {raw2_s:.1f}s ({raw_links:,} a[href])")

        progress("per-record work in-process (read_record_at + analyze_record, no Spark)")
        inproc = in_process_parse(root, MEASURED, conf)
        progress(f"  read {inproc['read_s']:.1f}s + analyze {inproc['analyze_s']:.1f}s + WET record "
                 f"{inproc['wet_s']:.1f}s")
        if args.profile_records:
            progress(f"  the same under cProfile, first {args.profile_records:,} records:")
            profile_in_process(root, MEASURED, conf, args.profile_records, PROFILE_TOP)

        progress("A: jobs.parse.run")
        from jobs import parse
        from jobs.base import spark_session

        mark = time.monotonic()
        spark = spark_session(conf, app_name="cyclecrawl-bench-parse")
        session_s = time.monotonic() - mark
        try:
            seed_segment_states(spark, root, warmup, args.files)
            seed_segment_states(spark, root, measured, args.files)
            mark = time.monotonic()
            warm_result = parse.run(spark, conf, root, WARMUP)
            warmup_s = time.monotonic() - mark
            progress(f"  session {session_s:.1f}s; warm-up segment ({warm_result.summary()}) {warmup_s:.1f}s")
            mark = time.monotonic()
            result = parse.run(spark, conf, root, MEASURED)
            parse_s = time.monotonic() - mark
            progress(f"  measured segment ({result.summary()}) {parse_s:.1f}s")
        finally:
            spark.stop()

        dedup_s = None
        if args.dedup_docs:
            progress(f"dedup: bench.dedup --docs {args.dedup_docs:,}")
            dedup_s = run_dedup(args.dedup_docs)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    parse_rate = rate(result.records, parse_s)
    raw1_rate, raw2_rate = rate(measured.records, raw1_s), rate(measured.records, raw2_s)
    inproc_s = inproc["read_s"] + inproc["analyze_s"] + inproc["wet_s"]
    print(f"\nParse benchmark: {measured.records:,} pages (~{measured.html_bytes / measured.records / 1e3:.0f} KB "
          f"of HTML each, {raw_links / measured.records:.0f} a[href] each), {len(measured.warc_files)} WARC files, "
          f"{args.master}, {args.shuffle_partitions} shuffle partitions\n")
    print("| run | wall s | docs/s | parse ÷ it |")
    print("|---|---:|---:|---:|")
    print(f"| jobs.parse.run (warm session; {result.links:,} links, {result.errors} errors) | {parse_s:.1f} | "
          f"{parse_rate:,.0f} | — |")
    print(f"| jobs.parse.run, cold: warm-up segment of {warm_result.records:,} | {warmup_s:.1f} | "
          f"{rate(warm_result.records, warmup_s):,.0f} | — |")
    print(f"| raw loop, 1 process | {raw1_s:.1f} | {raw1_rate:,.0f} | {parse_rate / raw1_rate:.0%} |")
    print(f"| raw loop, 2 processes (the baseline) | {raw2_s:.1f} | {raw2_rate:,.0f} | {parse_rate / raw2_rate:.0%} |")
    print(f"| in-process read_record_at + analyze_record + WET record, 1 process | {inproc_s:.1f} | "
          f"{rate(measured.records, inproc_s):,.0f} | {parse_rate / rate(measured.records, inproc_s):.0%} |")
    ratio = parse_rate / raw2_rate
    print(f"\nparse ÷ raw (2 processes) = {ratio:.1%}: target >= {TARGET_RAW_RATIO:.0%}: "
          f"{'met' if ratio >= TARGET_RAW_RATIO else 'not met'} (÷ raw, 1 process: {parse_rate / raw1_rate:.1%})")
    per_doc_ms = 1000 / measured.records
    print(f"per record, one process: read_record_at {inproc['read_s'] * per_doc_ms:.2f} ms, analyze_record "
          f"{inproc['analyze_s'] * per_doc_ms:.2f} ms, WET record {inproc['wet_s'] * per_doc_ms:.3f} ms, raw loop "
          f"{raw1_s * per_doc_ms:.2f} ms; parse's wall × 2 cores "
          f"{parse_s * 2 * per_doc_ms:.2f} ms; Spark session start {session_s:.1f}s (not in the figures)")
    if dedup_s is not None:
        print(f"dedup of {args.dedup_docs:,} SimHashes (bench.dedup, pure functions, one process): {dedup_s:.2f}s")
    print(f"\nTotal {time.monotonic() - started_all:.0f}s (input built in {build_s:.0f}s); load average (1 min) "
          f"{load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
