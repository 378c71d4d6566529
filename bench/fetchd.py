"""Fetch daemon benchmark: CPU cost against raw aiohttp, delay-bound rate, memory with a 1 M URL list.

Run on demand, never as a test:

    .venv/bin/python -m bench.fetchd [--only a,b,c] [--daemons 2] [--hosts-a 200] [--pages-a 60]
                                     [--compressor zlib --gzip-level 6] [--hosts-b 1000] [--pages-b 5]
                                     [--rss-urls 100000,1000000] [--root /tmp/cyclecrawl-bench-fetchd]

Everything runs on loopback against the site farm (the sitefarm package, latency 0), which runs in its own
`python -c` subprocess, so the CPU figures are the client's alone. Each client run is a fresh subprocess too
(the daemon's host memory — gates, robots cache — is per process), measured from inside with getrusage
(self + waited-for children, every thread included) around the call.

  (a) CPU bound: --hosts-a hosts, politeness.min_delay_s 0 (Crawl-delay capped at 0), the farm URLs robots
      allows. fetchd (`fetch_segment`, WARC on) next to a minimal aiohttp GET loop over the same URLs with the
      same connector limits (body read, nothing stored). Pages/s, client CPU seconds per page (and per thread:
      the event loop's, the WARC writer's), the ratios; then a separate cProfile run of fetchd (the event loop
      thread's CPU time) for the top entries. With --daemons N (2), also N daemon processes on one segment, its
      buckets split between them (`fetch_segment(..., buckets=...)` each), timed from the first request in the
      farm's log to the last daemon's return: pages/s of the whole, CPU per page summed over them. With
      --processes N (0, one per core), also one `fetch_segment` with `fetch.processes` N (the project's own way
      of using every core). BENCH_UVLOOP=1 runs the fetchd roles on uvloop (installed by hand; not a dependency:
      it did not pay, see bench/README.md).
  (b) delay bound: --hosts-b hosts, delay --delay-b s, --pages-b pages each. From the farm's own log: per-host
      request rate ÷ (1 / delay) summed over hosts (= achieved ÷ hosts/delay), the ready lag (start − previous
      end − delay) and politeness violations; plus the whole-run figure, list loading and start-up included.
  (c) memory: `fetchd.commands.serve` in a subprocess on fetch lists of each --rss-urls size over --hosts-c hosts
      (URLs the farm answers 404, delay 0); SIGTERM --rss-fetch-s seconds after the farm logs its first request.
      RSS sampled every 0.1 s: before the daemon starts, when the first request arrives (list scanned, first rows
      queued), the peak. The lists are ordered as generate writes them (rank, host_key) and streamed by the daemon
      (`fetch.max_queued_urls` rows queued at most); what grows is its 8-byte url_id key per URL.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import json
import os
import pstats
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
from aiohttp.abc import AbstractResolver

from crawler import config as config_mod
from crawler import layout, records, urls
from crawler.robots import RobotsPolicy
from sitefarm.judge import politeness_violations
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec

REPO = Path(__file__).resolve().parent.parent
TARGET_RAW_RATIO = 0.70     # (a) fetchd pages/s ÷ raw aiohttp pages/s
TARGET_RATE_RATIO = 0.95    # (b) achieved pages/s ÷ (hosts ÷ delay)
TARGET_RSS_BYTES_PER_URL = 64  # (c) our reading of "memory must not grow with list size": peak growth per extra URL
RSS_SAMPLE_S = 0.1

# The farm's process: serve, publish port + URLs in a JSON file, print "ready", serve until stdin closes.
FARM_SCRIPT = """
import json, os, sys
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec
hosts, pages, log_path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
low_kb, high_kb = int(sys.argv[5]), int(sys.argv[6])
farm = SiteFarm(FarmSpec(hosts=hosts, pages_per_host=pages, latency_s=0, page_kb=(low_kb, high_kb)), log_path)
farm.start()
with open(out + ".tmp", "w") as fh:
    json.dump({"port": farm.port, "hosts": farm.host_names(), "urls": sorted(farm.page_urls())}, fh)
os.replace(out + ".tmp", out)
print("ready", flush=True)
sys.stdin.read()
farm.stop()
"""


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def client_cpu_s() -> float:
    """CPU seconds of this process (all threads) and of its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds of another process so far (Linux /proc), to watch the farm's load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of this process's live threads by Python thread name (Linux /proc); "other" for the rest."""
    tick, out = os.sysconf("SC_CLK_TCK"), defaultdict(float)
    names = {thread.native_id: thread.name.rstrip("_0123456789") for thread in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        fields = (task / "stat").read_text().rpartition(")")[2].split()
        out[names.get(int(task.name), "other")] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


def peak_rss_kb() -> int:
    """Peak resident memory of this process, and of the largest of its waited-for children (getrusage)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return max(own.ru_maxrss, children.ru_maxrss)


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---- the farm and the fetch lists ----------------------------------------------------------------------


class FarmProcess:
    """The site farm in a subprocess; `urls`, `hosts`, `port` as it published them; its log read by offset."""

    def __init__(self, hosts: int, pages: int, folder: str, page_kb: tuple[int, int] = (0, 0)):
        os.makedirs(folder, exist_ok=True)
        self.spec = FarmSpec(hosts=hosts, pages_per_host=pages, latency_s=0, page_kb=page_kb)
        self.log_path = os.path.join(folder, "farm.jsonl")
        self.info_path = os.path.join(folder, "farm.json")
        self.proc: subprocess.Popen[str] | None = None
        self.truth = SiteFarm(self.spec, self.log_path)  # never started: robots files and delays only

    def __enter__(self) -> FarmProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FARM_SCRIPT, str(self.spec.hosts), str(self.spec.pages_per_host),
             self.log_path, self.info_path, *map(str, self.spec.page_kb)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.__exit__()
            raise RuntimeError("the site farm did not start")
        info = json.loads(Path(self.info_path).read_text())
        self.port, self.hosts, self.urls = info["port"], info["hosts"], info["urls"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu_s(self) -> float:
        assert self.proc is not None
        return process_cpu_s(self.proc.pid)

    def static_hosts(self) -> dict[str, str]:
        return {name: "127.0.0.1" for name in self.hosts}

    def log_size(self) -> int:
        return os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0

    def log_since(self, offset: int) -> list[dict[str, Any]]:
        """Complete request-log lines written after byte `offset`."""
        with open(self.log_path, "rb") as fh:
            fh.seek(offset)
            return [json.loads(line) for line in fh.read().splitlines(keepends=True) if line.endswith(b"\n")]

    def allowed(self, token: str) -> dict[str, list[str]]:
        """The farm's URLs robots.txt allows for `token`, by host_key, in URL order."""
        by_host: dict[str, list[str]] = defaultdict(list)
        for url in self.urls:
            canonical = urls.canonicalize(url)
            name = urls.host_name(canonical)
            robots = self.truth.robots_txt(name)
            if robots is None or RobotsPolicy.parse(robots, token).allowed(canonical):
                by_host[urls.host_key(canonical)].append(canonical)
        return by_host


def write_fetchlist(root: str, segment_id: str, by_host: dict[str, list[str]], buckets: int, delay_s: float) -> int:
    """Fetch-list Parquet per bucket in the FETCHLIST schema, as generate writes it; URLs must be canonical."""
    keys_of: dict[int, list[str]] = defaultdict(list)
    for key in sorted(by_host):
        keys_of[urls.bucket_of(key, buckets)].append(key)
    total = 0
    for bucket, keys in keys_of.items():
        # ordered by (rank, host_key) as generate writes it: every host's first URL, then every host's second...
        ranked = [(rank, key, url) for key in keys for rank, url in enumerate(by_host[key], 1)]
        ranked.sort(key=lambda entry: entry[:2])
        url_col = [url for _, _, url in ranked]
        n = len(url_col)
        columns = {
            "segment_id": pa.array([segment_id] * n, pa.string()),
            "url_id": pa.array([urls.url_id(u) for u in url_col], pa.string()),
            "url": pa.array(url_col, pa.string()),
            "host_key": pa.array([key for _, key, _ in ranked], pa.string()),
            "state_version": pa.array([1] * n, pa.int64()),
            "rank": pa.array([rank for rank, _, _ in ranked], pa.int32()),
            "priority": pa.array([1.0] * n, pa.float64()),
            "depth": pa.array([0] * n, pa.int32()),
            "delay_s": pa.array([delay_s] * n, pa.float64()),
        }
        folder = layout.fetchlist_dir(root, segment_id, bucket)
        os.makedirs(folder, exist_ok=True)
        # validators, previous fetch time and any other column: null, as for URLs never fetched
        table = pa.Table.from_arrays([columns.get(f.name, pa.nulls(n, f.type)) for f in records.FETCHLIST],
                                     schema=records.FETCHLIST)
        # row groups near generate's (records.FETCHLIST_ROW_GROUP_BYTES, ~130 bytes a row here)
        pq.write_table(table, os.path.join(folder, "part-00000.parquet"), row_group_size=8192)
        total += n
    return total


def interleaved(by_host: dict[str, list[str]]) -> list[str]:
    """URLs round-robin over hosts, so a per-host connection limit does not serialise the raw loop."""
    return [u for group in itertools.zip_longest(*by_host.values()) for u in group if u is not None]


def conf_overrides(farm: FarmProcess, **values: Any) -> dict[str, Any]:
    return {
        "fetch.static_hosts": farm.static_hosts(),
        "fetch.allow_networks": ["127.0.0.0/8"],
        "fetch.progress_interval_s": 3600.0,
        **values,
    }


# ---- client roles (each runs in its own subprocess, prints one JSON line) ------------------------------


def run_role(role: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run a client role in a fresh subprocess; its result is the last line it prints."""
    job_path = os.path.join(job["workdir"], f"job-{role}-{time.monotonic_ns()}.json")
    Path(job_path).write_text(json.dumps(job))
    done = subprocess.run([sys.executable, "-m", "bench.fetchd", "--role", role, "--job", job_path],
                          cwd=REPO, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def role_fetchd(job: dict[str, Any]) -> dict[str, Any]:
    """`fetch_segment` once, WARC on, on all buckets or job["buckets"]; optionally under cProfile (written as text
    to job["profile"]). With job["barrier"] it prints "ready" once imported and starts on a line on stdin, so a
    fleet of these processes starts together."""
    import pyarrow.dataset  # noqa: F401 - imported on a daemon's first list read (~1.5 s once per process): not timed

    from fetchd.commands import fetch_segment

    conf = config_mod.load().with_overrides(job["overrides"])
    if os.environ.get("BENCH_UVLOOP"):
        import uvloop
        uvloop.install()
    # the event loop thread's CPU time (not waits on a busy box, nor the WARC writer thread's work)
    profiler = cProfile.Profile(time.thread_time) if job.get("profile") else None
    if job.get("barrier"):
        print("ready", flush=True)
        sys.stdin.readline()
    started, cpu, wall = time.time(), client_cpu_s(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    summary = fetch_segment(conf, job["root"], job["segment"], job.get("buckets"))
    if profiler is not None:
        profiler.disable()
    result = {"wall_s": time.perf_counter() - wall, "cpu_s": client_cpu_s() - cpu, "summary": summary,
              "started": started, "ended": time.time(), "rss_peak_kb": peak_rss_kb(),
              "threads": threading.active_count(), "thread_cpu_s": thread_cpu_s()}
    if profiler is not None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).strip_dirs()
        stats.sort_stats("tottime").print_stats(job.get("profile_top", 25))
        stats.sort_stats("cumulative").print_stats(job.get("profile_top", 25))
        Path(job["profile"]).write_text(text.getvalue())
    return result


class LoopbackResolver(AbstractResolver):
    """Every name is 127.0.0.1: the raw loop needs no SSRF guard or static map."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


async def raw_loop(url_list: list[str], concurrency: int, per_host: int) -> int:
    """The baseline: `concurrency` workers, one session, GET and read each body; nothing stored or parsed."""
    connector = aiohttp.TCPConnector(resolver=LoopbackResolver(), limit=concurrency, limit_per_host=per_host)
    pending = iter(url_list)
    done = 0

    async def worker() -> None:
        nonlocal done
        for url in pending:
            async with session.get(url, allow_redirects=False) as response:
                await response.read()
            done += 1

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def run_fleet(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run one `fetchd` role per job, each in its own subprocess, released together once all have imported."""
    procs = []
    try:
        for i, job in enumerate(jobs):
            job_path = os.path.join(job["workdir"], f"job-fleet-{i}-{time.monotonic_ns()}.json")
            Path(job_path).write_text(json.dumps({**job, "barrier": True}))
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.fetchd", "--role", "fetchd", "--job", job_path],
                                          cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a fleet daemon did not start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        results = []
        for proc in procs:
            assert proc.stdout is not None
            out = proc.stdout.read()
            if proc.wait():
                raise RuntimeError(f"a fleet daemon exited with {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def split_buckets(by_host: dict[str, list[str]], buckets: int, parts: int) -> list[list[int]]:
    """The segment's buckets in `parts` disjoint sets of near-equal URL counts (largest bucket first, to the
    lightest set), as an operator would assign them with `fetch_segment(..., buckets=...)`."""
    sizes: dict[int, int] = defaultdict(int)
    for key, found in by_host.items():
        sizes[urls.bucket_of(key, buckets)] += len(found)
    sets: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for bucket in sorted(sizes, key=lambda b: (-sizes[b], b)):
        lightest = loads.index(min(loads))
        sets[lightest].append(bucket)
        loads[lightest] += sizes[bucket]
    return [sorted(s) for s in sets if s]


def role_raw(job: dict[str, Any]) -> dict[str, Any]:
    url_list = json.loads(Path(job["urls"]).read_text())
    cpu, wall = client_cpu_s(), time.perf_counter()
    done = asyncio.run(raw_loop(url_list, job["concurrency"], job["per_host"]))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": client_cpu_s() - cpu, "pages": done,
            "rss_peak_kb": peak_rss_kb()}


async def polite_loop(by_host: dict[str, list[str]], concurrency: int, warc_path: str, compressor: str,
                      gzip_level: int) -> int:
    """The minimal polite fetcher: one request in flight per host (a worker per host, `concurrency` at once), each
    response written as a gzip WARC response record with warcio, in the event loop, as it arrives, by `compressor`
    (warcio's own is zlib) at `gzip_level` (warcio's own is 9)."""
    import zlib

    from isal import isal_zlib
    from warcio import warcwriter
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    class LeveledGzip(warcwriter.GzippingWrapper):
        def __init__(self, out: Any):
            super().__init__(out)
            deflater = isal_zlib if compressor == "isal" else zlib
            self.compressor = deflater.compressobj(gzip_level, zlib.DEFLATED, zlib.MAX_WBITS + 16)

    warcwriter.GzippingWrapper = LeveledGzip

    connector = aiohttp.TCPConnector(resolver=LoopbackResolver(), limit=concurrency, limit_per_host=1)
    slots = asyncio.Semaphore(concurrency)
    done = 0
    with open(warc_path, "wb") as out:
        writer = WARCWriter(out, gzip=True)

        async def host_worker(host_urls: list[str]) -> None:
            nonlocal done
            for url in host_urls:
                async with slots, session.get(url, allow_redirects=False) as response:
                    body = await response.read()
                    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
                    head = StatusAndHeaders(f"{response.status} {response.reason}", headers, protocol="HTTP/1.1")
                    record = writer.create_warc_record(url, "response", payload=io.BytesIO(body),
                                                       http_headers=head)
                    writer.write_record(record)
                done += 1

        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            await asyncio.gather(*(host_worker(host_urls) for host_urls in by_host.values()))
    return done


def role_polite(job: dict[str, Any]) -> dict[str, Any]:
    by_host = json.loads(Path(job["by_host"]).read_text())
    cpu, wall = client_cpu_s(), time.perf_counter()
    done = asyncio.run(polite_loop(by_host, job["concurrency"], job["warc"], job["compressor"], job["gzip_level"]))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": client_cpu_s() - cpu, "pages": done,
            "warc_bytes": os.path.getsize(job["warc"]), "rss_peak_kb": peak_rss_kb()}


def role_rss(job: dict[str, Any]) -> dict[str, Any]:
    """`serve` until SIGTERM, RSS sampled in a thread; the first sample is taken before the daemon starts."""
    from fetchd.commands import serve

    conf = config_mod.load().with_overrides(job["overrides"])
    samples: list[tuple[float, int]] = [(time.time(), rss_kb())]
    halt = threading.Event()

    def sample() -> None:
        while not halt.wait(RSS_SAMPLE_S):
            samples.append((time.time(), rss_kb()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.time()
    serve(conf, job["root"])
    halt.set()
    sampler.join()
    samples.append((time.time(), rss_kb()))
    return {"started": started, "samples": samples,
            "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


ROLES = {"fetchd": role_fetchd, "raw": role_raw, "polite": role_polite, "rss": role_rss}


# ---- the three runs ------------------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def run_a(args: argparse.Namespace, base: config_mod.Config, workdir: str) -> dict[str, Any]:
    """(a) CPU bound: fetchd vs a raw aiohttp loop over the same URLs, then a profiled fetchd run."""
    progress(f"(a) starting a farm of {args.hosts_a} hosts x {args.pages_a} pages")
    page_kb = tuple(int(v) for v in args.page_kb.split(","))
    with FarmProcess(args.hosts_a, args.pages_a, os.path.join(workdir, "farm-a"), page_kb) as farm:
        by_host = farm.allowed(base.crawl.robots_token)
        url_list = interleaved(by_host)
        urls_path = os.path.join(workdir, "urls-a.json")
        Path(urls_path).write_text(json.dumps(url_list))
        by_host_path = os.path.join(workdir, "by-host-a.json")
        Path(by_host_path).write_text(json.dumps(by_host))
        overrides = conf_overrides(farm, **{
            "politeness.min_delay_s": 0.0, "politeness.max_crawl_delay_s": 0.0,
            "fetch.concurrency": args.concurrency, "politeness.max_concurrency_per_host": args.per_host,
            "fetch.warc_compressor": args.compressor or base.fetch.warc_compressor,
            "fetch.warc_gzip_level": base.fetch.warc_gzip_level if args.gzip_level is None else args.gzip_level,
            "fetch.processes": 1,
        })
        figures: dict[str, Any] = {"urls": len(url_list), "hosts": len(by_host),
                                   "compressor": overrides["fetch.warc_compressor"],
                                   "gzip_level": overrides["fetch.warc_gzip_level"], "page_kb": page_kb,
                                   "polite_compression": (args.polite_compressor, args.polite_gzip_level)}
        runs = [("raw", {"urls": urls_path, "concurrency": args.concurrency, "per_host": args.per_host}),
                ("polite", {"by_host": by_host_path, "concurrency": args.concurrency,
                            "warc": os.path.join(workdir, "polite-a.warc.gz"),
                            "compressor": args.polite_compressor, "gzip_level": args.polite_gzip_level}),
                ("fetchd", {"overrides": overrides, "segment": "bench-a"})]
        if args.processes != 1:  # `fetch.processes`: one fetch command as several daemon processes
            runs.append(("processes", {"overrides": {**overrides, "fetch.processes": args.processes},
                                       "segment": "bench-a-processes"}))
        if args.profile:
            runs.append(("profile", {"overrides": overrides, "segment": "bench-a-profile",
                                     "profile": os.path.join(workdir, "profile-a.txt")}))
        for name, job in runs:
            root = os.path.join(workdir, f"root-a-{name}")
            if "segment" in job:
                job["root"] = root
                write_fetchlist(root, job["segment"], by_host, base.crawl.buckets, 0.0)
            progress(f"(a) {name}: {len(url_list):,} URLs over {len(by_host)} hosts, concurrency {args.concurrency}")
            offset, farm_cpu = farm.log_size(), farm.cpu_s()
            role = name if name in ("raw", "polite") else "fetchd"
            result = run_role(role, {**job, "workdir": workdir})
            result["farm_cpu_s"] = farm.cpu_s() - farm_cpu
            log = farm.log_since(offset)
            result["requests"] = len(log)
            # server side: with delay 0 the rule left is one request at a time per host (end before next start)
            result["violations"] = len(politeness_violations(log, lambda _host: 0.0))
            if "ended" in result:  # the fleet's measure, for comparison: first request (farm log) to the return
                result["from_first_request_s"] = result["ended"] - min(r["start"] for r in log)
            result["pages"] = result.get("pages") or result["summary"]["urls"]
            if name == "processes":
                result["processes"] = args.processes or os.cpu_count() or 1
            figures[name] = result
            progress(f"(a) {name}: {result['pages']:,} pages in {result['wall_s']:.1f}s, client CPU "
                     f"{result['cpu_s']:.1f}s, farm CPU {result['farm_cpu_s']:.1f}s, {result['requests']:,} requests")
            if name == "fetchd" and args.daemons:
                figures["fleet"] = run_a_fleet(args, base, workdir, farm, by_host, overrides)
        if args.profile:
            figures["profile_text"] = Path(runs[-1][1]["profile"]).read_text()
    return figures


def run_a_fleet(args: argparse.Namespace, base: config_mod.Config, workdir: str, farm: FarmProcess,
                by_host: dict[str, list[str]], overrides: dict[str, Any]) -> dict[str, Any]:
    """(a) with --daemons processes on one segment, its buckets split between them; each daemon has the
    single daemon's configuration (so --concurrency each). The whole is timed from the first request in the
    farm's log to the last daemon's return (its results published)."""
    root, segment = os.path.join(workdir, "root-a-fleet"), "bench-a-fleet"
    write_fetchlist(root, segment, by_host, base.crawl.buckets, 0.0)
    sets = split_buckets(by_host, base.crawl.buckets, args.daemons)
    progress(f"(a) fleet: {len(sets)} daemons on buckets {sets}")
    offset, farm_cpu = farm.log_size(), farm.cpu_s()
    daemons = run_fleet([{"overrides": overrides, "root": root, "segment": segment, "buckets": bucket_set,
                          "workdir": workdir} for bucket_set in sets])
    log = farm.log_since(offset)
    first, last = min(r["start"] for r in log), max(d["ended"] for d in daemons)
    result = {
        "daemons": daemons, "buckets": sets, "requests": len(log), "farm_cpu_s": farm.cpu_s() - farm_cpu,
        "pages": sum(d["summary"]["urls"] for d in daemons), "cpu_s": sum(d["cpu_s"] for d in daemons),
        "wall_s": last - first, "span_s": last - min(d["started"] for d in daemons),
        "held": sum(len(d["summary"]["held_buckets"]) for d in daemons),
    }
    progress(f"(a) fleet: {result['pages']:,} pages in {result['wall_s']:.1f}s (first request to last result), "
             f"client CPU {result['cpu_s']:.1f}s, farm CPU {result['farm_cpu_s']:.1f}s, {len(log):,} requests")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


def run_b(args: argparse.Namespace, base: config_mod.Config, workdir: str) -> dict[str, Any]:
    """(b) delay bound: many hosts, a real delay; the rate is judged from the farm's log."""
    delay = args.delay_b
    progress(f"(b) starting a farm of {args.hosts_b} hosts")
    with FarmProcess(args.hosts_b, max(args.pages_b, 1), os.path.join(workdir, "farm-b")) as farm:
        by_host = {key: found[: args.pages_b] for key, found in farm.allowed(base.crawl.robots_token).items()}
        root = os.path.join(workdir, "root-b")
        total = write_fetchlist(root, "bench-b", by_host, base.crawl.buckets, delay)
        overrides = conf_overrides(farm, **{"politeness.min_delay_s": delay, "fetch.concurrency": args.concurrency})
        progress(f"(b) fetchd: {total:,} URLs over {len(by_host)} hosts, delay {delay}s")
        offset = farm.log_size()
        result = run_role("fetchd", {"overrides": overrides, "root": root, "segment": "bench-b", "workdir": workdir})
        log = farm.log_since(offset)
    by_log_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in log:
        by_log_host[record["host"]].append(record)
    gaps = spans = 0.0
    lags: list[float] = []
    for host, requests in by_log_host.items():
        requests.sort(key=lambda r: r["start"])
        required = farm.truth.politeness_delay(host, delay)
        gaps += (len(requests) - 1) * required / delay  # in units of the base delay (a Crawl-delay host counts less)
        spans += requests[-1]["start"] - requests[0]["start"]
        lags += [b["start"] - a["end"] - required for a, b in itertools.pairwise(requests)]
    lags.sort()
    hosts = len(by_log_host)
    violations = politeness_violations(log, lambda host: farm.truth.politeness_delay(host, delay))
    return {
        "urls": total, "hosts": hosts, "requests": len(log), "delay": delay, "result": result,
        # Sum over hosts of each host's rate (gaps / its span) ≈ gaps / mean span; ideal hosts / delay.
        "steady_ratio": (gaps / (spans / hosts)) / (hosts / delay) if spans else 0.0,
        "whole_ratio": (gaps / result["wall_s"]) / (hosts / delay),
        "lag_p50": lags[len(lags) // 2] if lags else 0.0,
        "lag_p99": lags[int(len(lags) * 0.99)] if lags else 0.0,
        "lag_max": lags[-1] if lags else 0.0,
        "violations": len(violations),
    }


def run_c(args: argparse.Namespace, base: config_mod.Config, workdir: str) -> list[dict[str, Any]]:
    """(c) memory: the daemon's RSS with fetch lists of each size, stopped a while after fetching starts."""
    progress(f"(c) starting a farm of {args.hosts_c} hosts")
    figures = []
    with FarmProcess(args.hosts_c, 1, os.path.join(workdir, "farm-c")) as farm:
        keys = [f"http://{name}:{farm.port}" for name in farm.hosts]
        for size in args.rss_sizes:
            per_host, extra = divmod(size, len(keys))
            by_host = {key: [f"{key}/missing/{i}.html" for i in range(per_host + (h < extra))]
                       for h, key in enumerate(keys)}
            assert all(urls.canonicalize(u) == u for u in (by_host[keys[0]][0], by_host[keys[-1]][-1]))
            root = os.path.join(workdir, f"root-c-{size}")
            progress(f"(c) writing a fetch list of {size:,} URLs")
            write_fetchlist(root, "bench-c", by_host, base.crawl.buckets, 0.0)
            del by_host
            overrides = conf_overrides(farm, **{
                "politeness.min_delay_s": 0.0, "politeness.max_crawl_delay_s": 0.0,
                "fetch.concurrency": args.concurrency, "fetch.poll_interval_s": 3600.0,
            })
            job_path = os.path.join(workdir, f"job-rss-{size}.json")
            Path(job_path).write_text(json.dumps({"overrides": overrides, "root": root}))
            offset = farm.log_size()
            progress(f"(c) serve on {size:,} URLs; SIGTERM {args.rss_fetch_s:.0f}s after the first request")
            proc = subprocess.Popen([sys.executable, "-m", "bench.fetchd", "--role", "rss", "--job", job_path],
                                    cwd=REPO, stdout=subprocess.PIPE, text=True)
            first = None
            deadline = time.monotonic() + args.rss_load_timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                log = farm.log_since(offset) if first is None else []
                if log:
                    first = min(r["start"] for r in log)
                    deadline = min(deadline, time.monotonic() + args.rss_fetch_s)
                time.sleep(0.5)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=300)
            result = json.loads(out.strip().splitlines()[-1])
            log = farm.log_since(offset)
            samples = result["samples"]
            at_first = max((kb for t, kb in samples if first is not None and t <= first), default=samples[0][1])
            figures.append({
                "urls": size, "hosts": len(keys), "requests": len(log),
                "base_kb": samples[0][1], "first_kb": at_first, "peak_kb": result["peak_kb"],
                "end_kb": samples[-1][1],
                "load_s": (first - result["started"]) if first is not None else None,
            })
            progress(f"(c) {size:,} URLs: RSS before {samples[0][1] / 1024:.0f} MB, at first request "
                     f"{at_first / 1024:.0f} MB, peak {result['peak_kb'] / 1024:.0f} MB, {len(log):,} requests")
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    return figures


# ---- report --------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(a: dict[str, Any] | None, b: dict[str, Any] | None, c: list[dict[str, Any]] | None,
           args: argparse.Namespace) -> None:
    rows: list[tuple[str, str, str, str]] = []
    print()
    if a is not None:
        print(f"(a) CPU bound: {a['urls']:,} URLs over {a['hosts']} hosts, delay 0, concurrency {args.concurrency}, "
              f"{args.per_host} per host, WARC by {a['compressor']} at gzip level {a['gzip_level']}; client CPU = "
              f"getrusage self + children; farm in its own process")
        print(f"    pages {a['page_kb'][0]}-{a['page_kb'][1]} KB; polite = a minimal polite fetcher (one request in "
              f"flight per host) writing a gzip WARC with warcio, by {a['polite_compression'][0]} at level "
              f"{a['polite_compression'][1]}; p=N = fetchd with fetch.processes N")
        print(f"    {'':8} {'pages':>7} {'wall s':>7} {'pages/s':>8} {'÷ raw':>6} {'CPU s':>7} {'CPU ms/page':>12} "
              f"{'client CPU/wall':>16} {'farm CPU/wall':>14} {'peak RSS MB':>12} {'violations':>11} {'requests':>9}")
        raw, fetchd, polite = a["raw"], a["fetchd"], a["polite"]
        processes = a.get("processes")
        named = [("raw", raw), ("polite", polite), ("fetchd", fetchd)]
        if processes is not None:
            named.append((f"p={processes['processes']}", processes))
        for name, r in named:
            print(f"    {name:8} {r['pages']:>7,} {r['wall_s']:>7.2f} {r['pages'] / r['wall_s']:>8.0f} "
                  f"{(r['pages'] / r['wall_s']) / (raw['pages'] / raw['wall_s']):>6.2f} "
                  f"{r['cpu_s']:>7.2f} {1000 * r['cpu_s'] / r['pages']:>12.3f} {r['cpu_s'] / r['wall_s']:>16.2f} "
                  f"{r['farm_cpu_s'] / r['wall_s']:>14.2f} {r['rss_peak_kb'] / 1024:>12.0f} {r['violations']:>11} "
                  f"{r['requests']:>9,}")
        polite_cpu = polite["cpu_s"] / polite["pages"]
        for name, r in named[2:]:
            rate = (r["pages"] / r["wall_s"]) / (raw["pages"] / raw["wall_s"])
            rows.append((f"(a) {name} pages/s ÷ raw pages/s", pct(rate), f">= {pct(TARGET_RAW_RATIO)}",
                         verdict(rate >= TARGET_RAW_RATIO)))
            per_page = r["cpu_s"] / r["pages"]
            rows.append((f"(a) {name} CPU ms/page vs polite's", f"{1000 * per_page:.3f}",
                         f"<= {1000 * polite_cpu:.3f}", verdict(per_page <= polite_cpu)))
            rows.append((f"(a) {name} violations (farm log)", str(r["violations"]), "0", verdict(not r["violations"])))
        fleet = a.get("fleet")
        if fleet is not None:
            name = f"fetchd×{len(fleet['daemons'])}"
            print(f"    {name:8} {fleet['pages']:>7,} {fleet['wall_s']:>7.2f} {fleet['pages'] / fleet['wall_s']:>8.0f} "
                  f"{fleet['cpu_s']:>7.2f} {1000 * fleet['cpu_s'] / fleet['pages']:>12.3f} "
                  f"{fleet['cpu_s'] / fleet['wall_s']:>16.2f} {fleet['farm_cpu_s'] / fleet['wall_s']:>14.2f} "
                  f"{fleet['requests']:>9,}")
        summary = fetchd["summary"]
        print(f"    fetchd outcomes: {summary['outcomes']}, WARC {summary['warc_bytes'] / 1e6:.1f} MB (polite's "
              f"{polite['warc_bytes'] / 1e6:.1f} MB); fetchd CPU s by thread (whole process, list loading included): "
              f"{', '.join(f'{n} {s:.2f}' for n, s in sorted(fetchd['thread_cpu_s'].items()))}")
        if processes is not None:  # its wall includes starting the other processes (imports, list loading)
            print(f"    p={processes['processes']} from its first request (farm log) to its return: "
                  f"{processes['from_first_request_s']:.2f}s, "
                  f"{processes['pages'] / processes['from_first_request_s']:.0f} pages/s, "
                  f"{(processes['pages'] / processes['from_first_request_s']) / (raw['pages'] / raw['wall_s']):.2f}"
                  f" of raw")
        if fleet is not None:
            n = len(fleet["daemons"])
            print(f"    fetchd from its first request (farm log) to its return, as the fleet is timed: "
                  f"{fetchd['from_first_request_s']:.2f}s, "
                  f"{fetchd['pages'] / fetchd['from_first_request_s']:.0f} pages/s")
            print(f"    fetchd×{n}: buckets {fleet['buckets']}, --concurrency {args.concurrency} each; wall = first "
                  f"request (farm log) to the last daemon's return; from the first daemon's start "
                  f"{fleet['span_s']:.2f}s; held buckets {fleet['held']}")
            for i, d in enumerate(fleet["daemons"]):
                print(f"      daemon {i}: {d['summary']['urls']:,} pages in {d['wall_s']:.2f}s, CPU {d['cpu_s']:.2f}s "
                      f"({d['cpu_s'] / d['wall_s']:.2f} of a CPU); by thread "
                      f"{', '.join(f'{t} {s:.2f}' for t, s in sorted(d['thread_cpu_s'].items()))}")
            fleet_rate = (fleet["pages"] / fleet["wall_s"]) / (raw["pages"] / raw["wall_s"])
            fleet_cpu = (raw["cpu_s"] / raw["pages"]) / (fleet["cpu_s"] / fleet["pages"])
            rows.append((f"(a) fetchd×{n} pages/s ÷ raw pages/s", pct(fleet_rate), f">= {pct(TARGET_RAW_RATIO)}",
                         verdict(fleet_rate >= TARGET_RAW_RATIO)))
            rows.append((f"(a) raw CPU/page ÷ fetchd×{n} CPU/page", pct(fleet_cpu), "(info)", ""))
    if b is not None:
        r = b["result"]
        print(f"(b) delay bound: {b['urls']:,} URLs over {b['hosts']:,} hosts, delay {b['delay']}s; "
              f"{b['requests']:,} requests in the farm log (robots.txt included) in {r['wall_s']:.1f}s; "
              f"client CPU {r['cpu_s']:.1f}s ({1000 * r['cpu_s'] / b['requests']:.2f} ms/request, "
              f"{r['cpu_s'] / r['wall_s']:.2f} of a CPU)")
        print(f"    ready lag (start - previous end - delay, farm log): p50 {1000 * b['lag_p50']:.1f} ms, "
              f"p99 {1000 * b['lag_p99']:.1f} ms, max {1000 * b['lag_max']:.1f} ms; "
              f"politeness violations {b['violations']}")
        rows.append(("(b) achieved ÷ (hosts ÷ delay), per-host steady", pct(b["steady_ratio"]),
                     f">= {pct(TARGET_RATE_RATIO)}", verdict(b["steady_ratio"] >= TARGET_RATE_RATIO)))
        rows.append(("(b) same over the whole run (load, start-up)", pct(b["whole_ratio"]), "(info)", ""))
        rows.append(("(b) politeness violations (farm log)", str(b["violations"]), "0", verdict(b["violations"] == 0)))
    if c:
        print(f"(c) memory: serve on fetch lists over {c[0]['hosts']:,} hosts (404 answers, delay 0), "
              f"stopped {args.rss_fetch_s:.0f}s after the first request")
        print(f"    {'URLs':>10} {'RSS before MB':>14} {'at 1st request MB':>18} {'peak MB':>8} {'end MB':>7} "
              f"{'list load s':>12} {'requests':>9}")
        for f in c:
            load = f"{f['load_s']:.1f}" if f["load_s"] is not None else "n/a"
            print(f"    {f['urls']:>10,} {f['base_kb'] / 1024:>14.0f} {f['first_kb'] / 1024:>18.0f} "
                  f"{f['peak_kb'] / 1024:>8.0f} {f['end_kb'] / 1024:>7.0f} {load:>12} {f['requests']:>9,}")
        if len(c) > 1:
            small, large = c[0], c[-1]
            growth = large["peak_kb"] / small["peak_kb"]
            per_url = (large["peak_kb"] - small["peak_kb"]) * 1024 / (large["urls"] - small["urls"])
            rows.append((f"(c) peak RSS growth per URL, {small['urls']:,} -> {large['urls']:,}", f"{per_url:.0f} B",
                         f"<= {TARGET_RSS_BYTES_PER_URL} B", verdict(per_url <= TARGET_RSS_BYTES_PER_URL)))
            rows.append((f"(c) peak RSS {large['urls']:,} ÷ {small['urls']:,} URLs", f"{growth:.2f}", "(info)", ""))
    print()
    width = max(len(row[0]) for row in rows) if rows else 10
    print(f"{'Target':<{width}}  {'figure':>9}  {'target':>9}  verdict")
    for name, figure, target, ok in rows:
        print(f"{name:<{width}}  {figure:>9}  {target:>9}  {ok}")
    if a is not None and "profile_text" in a:
        print("\ncProfile (CPU time, main thread) of a separate fetchd run of (a); profiling slows it:")
        print(a["profile_text"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="a,b,c", help="comma-separated runs to do: a, b, c")
    parser.add_argument("--concurrency", type=int, default=64, help="fetch.concurrency (and the raw loop's)")
    parser.add_argument("--daemons", type=int, default=2,
                        help="(a) daemon processes sharing the segment's buckets in the fleet figure (0: skip it)")
    parser.add_argument("--processes", type=int, default=0,
                        help="(a) fetch.processes of the second fetchd run (0: one per core; 1: skip it)")
    parser.add_argument("--per-host", type=int, default=1, help="(a) politeness.max_concurrency_per_host")
    parser.add_argument("--hosts-a", type=int, default=200, help="(a) farm hosts")
    parser.add_argument("--pages-a", type=int, default=50, help="(a) farm pages per host")
    parser.add_argument("--page-kb", default="13,93",
                        help="(a) page sizes, LOW,HIGH KB (realistic documentation pages; 0,0: the farm's small pages)")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="(a) skip the cProfile run")
    parser.add_argument("--compressor", choices=sorted(config_mod.WARC_GZIP_LEVELS),
                        help="(a) fetch.warc_compressor (default: the configured one)")
    parser.add_argument("--gzip-level", type=int,
                        help="(a) fetch.warc_gzip_level, on the compressor's scale (default: the configured one)")
    parser.add_argument("--polite-compressor", choices=sorted(config_mod.WARC_GZIP_LEVELS), default="zlib",
                        help="(a) the polite writer's gzip (zlib: warcio's own)")
    parser.add_argument("--polite-gzip-level", type=int, default=1, help="(a) the polite writer's gzip level")
    parser.add_argument("--hosts-b", type=int, default=1000, help="(b) farm hosts")
    parser.add_argument("--pages-b", type=int, default=5, help="(b) fetch-list URLs per host")
    parser.add_argument("--delay-b", type=float, default=1.0, help="(b) politeness.min_delay_s")
    parser.add_argument("--hosts-c", type=int, default=2000, help="(c) farm hosts the list is spread over")
    parser.add_argument("--rss-urls", default="100000,1000000", help="(c) comma-separated list sizes, smallest first")
    parser.add_argument("--rss-fetch-s", type=float, default=15.0, help="(c) seconds of fetching before SIGTERM")
    parser.add_argument("--rss-load-timeout-s", type=float, default=300.0,
                        help="(c) SIGTERM anyway if no request arrived within this")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-fetchd", help="scratch folder (wiped first)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.runs = {s.strip() for s in args.only.split(",") if s.strip()}
    args.rss_sizes = [int(s.replace("_", "")) for s in args.rss_urls.split(",") if s.strip()]
    counts = (args.hosts_a, args.hosts_b, args.hosts_c, args.pages_a, args.pages_b, args.concurrency, args.per_host)
    if not args.runs <= {"a", "b", "c"} or args.daemons < 0 or min(counts) <= 0:
        parser.error("--only takes a, b, c; host, page and concurrency counts must be positive, --daemons >= 0")
    if not args.rss_sizes or min(args.rss_sizes) < args.hosts_c:
        parser.error("--rss-urls sizes must be at least --hosts-c")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.role:
        print(json.dumps(ROLES[args.role](json.loads(Path(args.job).read_text()))), flush=True)
        return
    base = config_mod.load()
    workdir = os.path.abspath(args.root)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    started, load = time.monotonic(), os.getloadavg()
    try:
        a = run_a(args, base, workdir) if "a" in args.runs else None
        b = run_b(args, base, workdir) if "b" in args.runs else None
        c = run_c(args, base, workdir) if "c" in args.runs else None
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report(a, b, c, args)
    print(f"\nTotal benchmark time {time.monotonic() - started:.0f}s; load average (1 min) {load[0]:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} CPUs (wall figures need an otherwise idle machine)")


if __name__ == "__main__":
    main()
