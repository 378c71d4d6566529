"""Freshness benchmark: the engine's two service levels measured on a continuous crawl of the loopback site farm.

Run on demand, never as a test:

    .venv/bin/python -m bench.freshness [--minutes 15] [--urls 1000000] [--driver run|inline]

What it runs: the site farm (ordinary sites plus fresh hosts that list a new high-priority article in their sitemap
every minute and change their home page with it: `sitefarm.fresh`) on loopback; a frontier of `--urls` synthetic
rows built with Spark alone (as `bench.frontier` builds them: `spark.range` and expressions, the tables' own
schemas) plus the farm's seeds; then the continuous driver, `crawl run` (one subprocess, with its fetch daemon), for
`--minutes` of real time, stopped with SIGTERM. `--driver inline` replaces it with a stand-in loop in this process
(generate, fetch, parse, dedup, update one after another every `cycle.interval_s`).

The synthetic rows never reach beyond loopback: their hosts are `hostN.synthetic.invalid` (a reserved TLD that
no resolver answers), every one of them mapped to 127.0.0.1 by `fetch.static_hosts` (so the farm answers them, 404),
`fetch.allow_networks` is 127.0.0.0/8 alone and `scope.host_suffixes` keeps discovery to the farm and those names;
the run starts only after an assertion that every host in `urls` is mapped. Their next fetch times are spread
over the next 30 days with `--due-share` (1 %) due at the start, as a real frontier's; their priorities are
below `generate.high_priority`, so the high-priority work is the farm's.

It prints one line, judged from the farm's own request log and the tables, never from the driver's counters:

    freshness: minutes= cycles= discovered_durable_p50_s= discovered_durable_p99_s= leased_10min=
               due_to_leased_p99_s= batch_fixed_s= violations=

* minutes: real time from the injection of the farm's seeds (they fall due then) to the driver's end; cycles: the
  segments generated in it (`segments` created_at).
* discovered_durable: for each fetched page with outlinks, the commit time of the `links` commit that holds its
  links (the Delta log of `links`: the version whose added files hold that (segment, page)) minus the page's fetch
  time in the farm's request log (the end of the request, the last one for that URL at or before the result's
  fetch time). A page fetched in a segment with no links committed by the end, with outlinks in the farm's truth,
  counts with the lower bound end - fetch time.
* leased_10min, due_to_leased_p99_s: over the high-priority URLs (`crawler.service_levels`) that fell due during
  the run on a host in state ok at that moment. Every state a `urls` row ever had is in the Parquet files the
  table's log added (each with its commit time): a state's due time is `due_since(next_fetch_at, discovered_at)`,
  and it counts when it fell due before the next state that changed it was committed. Its lease time is the
  `segments` created_at of the first segment whose fetch list holds the URL from then on; `lease_outcome` at the
  end of the run decides it (URLs still waiting within the target are left out: `share_within`). The part of
  eligibility that is a host's per-segment allowance is not applied: every high-priority URL of an ok host counts,
  which can only lower the figure.
* batch_fixed_s: the median, over the cycles of the smallest segments (the quarter of the run's segments with the
  fewest URLs, at least one), of generate + parse + dedup + update wall seconds: from the driver's progress lines
  (`run: <step> <segment> <seconds>s: ...`) with `crawl run`, timed around each call with `--driver inline`.
* violations: politeness violations in the farm's request log (`sitefarm.judge`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from crawler import config as config_mod
from crawler import layout
from crawler.politeness import PolitenessRules
from crawler.service_levels import LeaseOutcome, ServiceLevels, due_since, is_high_priority, lease_outcome, percentile
from crawler.service_levels import share_within as share_in_time
from crawler.status import HostState

SYNTHETIC_SUFFIX = "synthetic.invalid"
RANGE_PARTITIONS = 8  # fixed, so F.rand(seed) draws the same values on every run
FRONTIER_DAYS = 30
PROGRESS_LINE = re.compile(r"^run: (generate|parse|dedup|update) (\S+) ([0-9.]+)s")
BATCH_STEPS = ("generate", "parse", "dedup", "update")
OVERSTAY_S = 600  # a step in progress at the end may take minutes on a loaded machine


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (here: the JVM and its Python workers), each with the
    children it has reaped (/proc/<pid>/stat utime, stime, cutime, cstime): what this benchmark spends, not the
    machine's other work."""
    stats: dict[int, list[str]] = {}
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry.name)] = fields
        children[int(fields[1])].append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += sum(int(value) for value in stats.get(current, [0] * 15)[11:15])
        todo += children[current]
    return total / os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- reading the tables' history (Delta log + Parquet, no Spark) ----------------------------------------------

@dataclass(frozen=True)
class Commit:
    """One Delta commit: its version, its commit time (Unix seconds) and the data files it added."""

    version: int
    committed_at: float
    added: tuple[tuple[str, dict[str, str]], ...]  # (path relative to the table, partition values)


def delta_commits(table_dir: str | Path) -> list[Commit]:
    """Every commit in a table's `_delta_log` (JSON files), oldest first."""
    commits = []
    for log_file in sorted(Path(table_dir, "_delta_log").glob("*.json")):
        committed_at, added = None, []
        for line in log_file.read_text(encoding="utf-8").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action and "timestamp" in action["commitInfo"]:
                committed_at = action["commitInfo"]["timestamp"] / 1000
            if "add" in action:
                added.append((unquote(action["add"]["path"]), action["add"].get("partitionValues") or {}))
        commits.append(Commit(int(log_file.stem), committed_at or log_file.stat().st_mtime, tuple(added)))
    return commits


def added_rows(table_dir: str | Path, commits: Iterable[Commit], columns: list[str],
               where: Callable | None = None) -> list[dict]:
    """Every row of every file the commits added (`version` and `committed_at` of the commit added to each),
    partition columns filled from the log; `where(table)` -> a pyarrow mask keeps only some rows. Rows a later
    commit deleted are still there: the files hold every state a row ever had."""
    rows = []
    for commit in commits:
        for path, partitions in commit.added:
            stored = [c for c in columns if c not in partitions]
            table = utc_times(pq.read_table(Path(table_dir, path), columns=stored))
            if where is not None:
                table = table.filter(where(table))
            for row in table.to_pylist():
                row.update({c: partitions[c] for c in columns if c in partitions})
                row.update(version=commit.version, committed_at=commit.committed_at)
                rows.append(row)
    return rows


def utc_times(table: pa.Table) -> pa.Table:
    """Timestamp columns as UTC microseconds (Spark writes them as naive INT96 nanoseconds), so rows hold datetimes."""
    return table.cast(pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type)
                                 else f for f in table.schema]))


def as_utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# ---- the judges (pure) ----------------------------------------------------------------------------------------

def link_commit_times(rows: Iterable[dict]) -> dict[tuple[str, str], float]:
    """(segment_id, from_url_id) -> commit time of the earliest `links` commit holding that page's links."""
    first: dict[tuple[str, str], float] = {}
    for row in rows:
        key = (row["segment_id"], row["from_url_id"])
        first[key] = min(first.get(key, math.inf), row["committed_at"])
    return first


def request_ends(log: Iterable[dict], canonical: Callable[[dict], str | None]) -> dict[str, list[tuple[float, float]]]:
    """URL -> the (start, end) of every answered request for it in the farm's log, by start."""
    by_url: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in log:
        url = canonical(record)
        if url is not None and record.get("status") is not None:
            by_url[url].append((record["start"], record["end"]))
    for requests in by_url.values():
        requests.sort()
    return by_url


def fetch_time(requests: list[tuple[float, float]], fetched_at: float, slack_s: float = 1.0) -> float | None:
    """The end of the last request for a URL that started by the result's fetch time (plus `slack_s` for the two
    clocks' reading order); None when the farm never answered it by then."""
    index = bisect_right(requests, (fetched_at + slack_s, math.inf))
    return requests[index - 1][1] if index else None


def discovered_durable_lags(link_commits: dict[tuple[str, str], float],
                            fetched: dict[tuple[str, str], tuple[str, float]],
                            requests: dict[str, list[tuple[float, float]]]) -> list[float]:
    """Per fetched page with outlinks: links commit time - the page's fetch time in the farm's log. Pages the farm's
    log does not show (not a farm request) are left out."""
    lags = []
    for key, committed_at in link_commits.items():
        if key not in fetched:
            continue
        url, fetched_at = fetched[key]
        answered = fetch_time(requests.get(url, []), fetched_at)
        if answered is not None:
            lags.append(committed_at - answered)
    return lags


def pending_lags(link_commits: dict[tuple[str, str], float], fetched: dict[tuple[str, str], tuple[str, float]],
                 requests: dict[str, list[tuple[float, float]]], has_outlinks: Callable[[str], bool],
                 end: float) -> list[float]:
    """Lower bounds of the lags of the pages not durable at the end: fetched in a segment with no links committed
    yet, answered by the farm, with outlinks in the farm's truth; each waited at least end - its fetch time. Left
    out, they would flatter the figure."""
    parsed = {segment_id for segment_id, _ in link_commits}
    lags = []
    for (segment_id, _), (url, fetched_at) in fetched.items():
        answered = fetch_time(requests.get(url, []), fetched_at)
        if segment_id not in parsed and answered is not None and has_outlinks(url):
            lags.append(end - answered)
    return lags


@dataclass(frozen=True)
class DueEpisode:
    """A URL that fell due at `due` with a high priority (one state of its `urls` row)."""

    url_id: str
    url: str
    host_key: str
    due: datetime


def due_episodes(states: Iterable[dict], threshold: float, start: datetime, end: datetime) -> list[DueEpisode]:
    """The high-priority due episodes within [start, end] from every state of `urls` rows (dicts with url_id, url,
    host_key, priority, next_fetch_at, discovered_at, version, committed_at). A state's due time is `due_since`;
    it fell due if that came before the next state with another due time was committed (a state replaced before
    its time never fell due). Copies of a state (a rewritten file) are one episode."""
    by_url: dict[str, list[dict]] = defaultdict(list)
    for state in states:
        by_url[state["url_id"]].append(state)
    episodes = []
    for url_id, history in by_url.items():
        history.sort(key=lambda s: s["version"])
        dues = [due_since(as_utc(s["next_fetch_at"]), as_utc(s["discovered_at"])) for s in history]
        for i, state in enumerate(history):
            due = dues[i]
            if i and dues[i - 1] == due:
                continue
            replaced = next((instant(history[j]["committed_at"]) for j in range(i + 1, len(history))
                             if dues[j] != due), None)
            fell_due = replaced is None or due < replaced
            if fell_due and start <= due <= end and is_high_priority(state["priority"], threshold):
                episodes.append(DueEpisode(url_id, state["url"], state["host_key"], due))
    return episodes


def lease_times(listings: Iterable[tuple[str, str]], created_at: dict[str, datetime]) -> dict[str, list[datetime]]:
    """url_id -> the created_at of every segment whose fetch list holds it, sorted."""
    leases: dict[str, list[datetime]] = defaultdict(list)
    for segment_id, url_id in listings:
        if segment_id in created_at:
            leases[url_id].append(created_at[segment_id])
    for times in leases.values():
        times.sort()
    return leases


@dataclass
class LeaseFigures:
    within: int = 0
    late: int = 0
    waiting: int = 0
    ineligible: int = 0
    lags_s: list[float] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        return share_in_time(self.within, self.late)


def lease_figures(episodes: Iterable[DueEpisode], leases: dict[str, list[datetime]], end: datetime,
                  within_s: float, host_ok: Callable[[str, datetime], bool]) -> LeaseFigures:
    """Each counted episode's lease: the first segment that listed the URL at or after it fell due."""
    figures = LeaseFigures()
    for episode in episodes:
        if not host_ok(episode.host_key, episode.due):
            figures.ineligible += 1
            continue
        times = leases.get(episode.url_id, [])
        index = bisect_left(times, episode.due)
        leased_at = times[index] if index < len(times) else None
        outcome = lease_outcome(episode.due, leased_at, end, within_s)
        if leased_at is not None:
            figures.lags_s.append((leased_at - episode.due).total_seconds())
        if outcome is LeaseOutcome.WITHIN:
            figures.within += 1
        elif outcome is LeaseOutcome.LATE:
            figures.late += 1
        else:
            figures.waiting += 1
    return figures


class HostStates:
    """A host's `hosts` row as of a moment, from every state the table's files hold."""

    def __init__(self, states: Iterable[dict], rules: PolitenessRules):
        self.rules = rules
        self.history: dict[str, list[tuple[float, dict]]] = defaultdict(list)
        for state in states:
            self.history[state["host_key"]].append((state["committed_at"], state))
        for history in self.history.values():
            history.sort(key=lambda item: (item[0], item[1]["version"]))

    def ok(self, host_key: str, moment: datetime) -> bool:
        """Whether the host was in state ok at `moment` (a host not in `hosts` yet had no reason not to be)."""
        history = self.history.get(host_key, [])
        index = bisect_right([committed for committed, _ in history], moment.timestamp())
        if not index:
            return True
        row = history[index - 1][1]
        state = self.rules.host_state(row["robots_state"], as_utc(row["backoff_until"]), as_utc(row["failing_since"]),
                                      moment)
        return state == HostState.OK.value


def batch_fixed_s(cycles: Iterable[tuple[int, float]]) -> float | None:
    """The median of the four steps' wall over the quarter of the cycles (at least one) with the fewest URLs;
    `cycles`: (segment URLs, generate + parse + dedup + update seconds)."""
    ordered = sorted(cycles)
    if not ordered:
        return None
    return statistics.median(seconds for _, seconds in ordered[:max(1, len(ordered) // 4)])


def progress_steps(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """segment -> step -> seconds, from the driver's progress lines (`run: <step> <segment> <seconds>s: ...`)."""
    steps: dict[str, dict[str, float]] = defaultdict(dict)
    for line in lines:
        match = PROGRESS_LINE.match(line)
        if match:
            step, segment_id, seconds = match.groups()
            steps[segment_id][step] = steps[segment_id].get(step, 0.0) + float(seconds)
    return steps


def fixed_cost_cycles(steps: dict[str, dict[str, float]], sizes: dict[str, int]) -> list[tuple[int, float]]:
    """(segment URLs, the four steps' seconds) of every segment that went through all four."""
    return [(sizes.get(segment_id, 0), sum(seconds[s] for s in BATCH_STEPS))
            for segment_id, seconds in steps.items() if all(s in seconds for s in BATCH_STEPS)]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def render_line(minutes: float, cycles: int, durable: list[float], leases: LeaseFigures, batch_s: float | None,
                violations: int) -> str:
    def num(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return (f"freshness: minutes={minutes:.1f} cycles={cycles} "
            f"discovered_durable_p50_s={num(percentile(durable, 0.5))} "
            f"discovered_durable_p99_s={num(percentile(durable, 0.99))} leased_10min={num(leases.share, 3)} "
            f"due_to_leased_p99_s={num(percentile(leases.lags_s, 0.99))} batch_fixed_s={num(batch_s)} "
            f"violations={violations}")


# ---- the synthetic frontier (Spark alone) ---------------------------------------------------------------------

def synthetic_host_names(count: int) -> list[str]:
    return [f"host{n}.{SYNTHETIC_SUFFIX}" for n in range(count)]


def build_synthetic_frontier(spark, conf: config_mod.Config, root: str, url_count: int, host_count: int, port: int,
                             due_share: float, skew: float, now: datetime) -> None:
    """`hosts` and `urls` rows for `url_count` synthetic URLs over `host_count` hosts (Zipf-like skew, as
    bench.frontier), each host `hostN.synthetic.invalid` on the farm's port; next fetch times spread uniformly
    over FRONTIER_DAYS, `due_share` of them already due; priorities below generate.high_priority."""
    from pyspark.sql import functions as F

    from crawler import urls
    from crawler.status import UrlSource, UrlStatus
    from delta_tables import tables

    buckets = conf.crawl.buckets

    @F.udf("int")
    def bucket_of(host_key):  # no type hints: pyspark would try to read them as a pandas UDF's
        return urls.bucket_of(host_key, buckets)

    @F.udf("string")
    def domain_of(host_key):
        return urls.host_domain(host_key)

    def as_table(df, name: str):
        fields = tables.TABLES[name].schema.fields
        missing = [F.lit(None).cast(f.dataType).alias(f.name) for f in fields
                   if f.nullable and f.name not in df.columns]
        return tables.conform(df.select("*", *missing), name)

    tables.create_all(spark, root)
    keys = spark.range(host_count, numPartitions=RANGE_PARTITIONS).select(
        F.col("id").alias("host_index"),
        F.concat(F.lit("http://host"), F.col("id").cast("string"), F.lit(f".{SYNTHETIC_SUFFIX}:{port}")).alias(
            "host_key"))
    zero = F.lit(0).cast("bigint")
    hosts = keys.select(
        "host_key", bucket_of("host_key").alias("bucket"), domain_of("host_key").alias("domain"),
        F.lit(0).alias("backoff_level"), zero.alias("policy_version"),
        *[zero.alias(c) for c in ("known_urls", "fetches", "status_2xx", "status_3xx", "status_4xx", "status_5xx",
                                  "status_429", "network_errors", "robots_denied")],
        F.lit(now).alias("updated_at"))
    as_table(hosts, "hosts").repartition("bucket").write.format("delta").mode("append").save(
        tables.table_path(root, "hosts"))
    stored = tables.table_df(spark, root, "hosts").where(F.col("host_key").contains(SYNTHETIC_SUFFIX)).select(
        F.regexp_extract("host_key", r"^http://host(\d+)\.", 1).cast("bigint").alias("host_index"), "host_key",
        "bucket")

    host_index = F.least(F.floor(F.pow(F.rand(11), F.lit(skew)) * host_count).cast("bigint"), F.lit(host_count - 1))
    offset_s = ((F.rand(13) - F.lit(due_share)) * FRONTIER_DAYS * 86400).cast("bigint")  # < 0: already due
    ceiling = min(1.0, conf.generate.high_priority) * 0.999
    drawn = spark.range(url_count, numPartitions=RANGE_PARTITIONS).select(
        "id", host_index.alias("host_index"), (F.rand(12) * ceiling).alias("priority"), offset_s.alias("offset_s"))
    next_fetch_at = F.timestamp_seconds(F.lit(int(now.timestamp())) + F.col("offset_s"))
    rows = drawn.join(F.broadcast(stored), "host_index").select(
        F.concat("host_key", F.lit("/page/"), F.col("id").cast("string")).alias("url"),
        "host_key", "bucket", "priority", next_fetch_at.alias("next_fetch_at"),
        F.lit(UrlSource.LINK.value).alias("source"), (F.col("id") % 4).alias("depth"),
    ).select(
        F.md5("url").alias("url_id"), "*",
        F.lit(UrlStatus.UNFETCHED.value).alias("status"),
        F.lit(0).alias("state_version"),
        (F.least("next_fetch_at", F.lit(now)) - F.expr("INTERVAL 1 DAY")).alias("discovered_at"),
        F.lit(conf.revisit.default_interval_s).alias("fetch_interval_s"),
        F.lit(0).alias("failure_count"), F.lit(0).alias("inlinks"), F.lit(now).alias("updated_at"))
    as_table(rows, "urls").repartition("bucket").write.format("delta").mode("append").save(
        tables.table_path(root, "urls"))


def assert_loopback_only(spark, root: str, static_hosts: dict[str, str]) -> tuple[int, int]:
    """Stop unless every host in `urls` is mapped to loopback by fetch.static_hosts (no request or DNS lookup can
    leave the machine); (hosts, URLs due now) for the report."""
    from pyspark.sql import functions as F

    from delta_tables import tables

    known = tables.table_df(spark, root, "urls")
    names = {row[0] for row in known.select(F.regexp_extract("host_key", r"^https?://([^:/]+)", 1)).distinct()
             .collect()}
    unmapped = sorted(name for name in names if not static_hosts.get(name, "").startswith("127."))
    assert not unmapped, f"hosts outside the loopback map: {unmapped[:5]}"
    due = known.where(F.col("next_fetch_at") <= F.current_timestamp()).count()
    return len(names), due


# ---- the run --------------------------------------------------------------------------------------------------

def bench_config(args: argparse.Namespace, root: str, static_hosts: dict[str, str]) -> config_mod.Config:
    """The engine's configuration for the run: loopback only, the farm's and the synthetic hosts in scope,
    segments planned for one cycle, pages and sitemaps revisited after `--revisit-s` at the soonest (the fresh
    hosts change every minute; unchanged pages back off by revisit.unchanged_factor)."""
    conf = config_mod.load(None, args.settings)
    interval = args.interval_s or conf.cycle.interval_s
    return conf.with_overrides({
        "storage.root": root,
        "fetch.static_hosts": static_hosts,
        "fetch.allow_networks": ["127.0.0.0/8"],
        "fetch.processes": 1,
        "scope.host_suffixes": ["farm.test", SYNTHETIC_SUFFIX],
        "politeness.min_delay_s": args.min_delay_s,
        "revisit.default_interval_s": args.revisit_s,
        "revisit.min_interval_s": args.revisit_s,
        "revisit.sitemap_min_interval_s": args.revisit_s,
        "cycle.interval_s": interval,
        "generate.segment_seconds": max(1, round(interval)),
        "spark.master": args.master,
        "spark.driver_memory": args.driver_memory,
        "spark.log_level": "ERROR",
    })


@dataclass
class InlineCycle:
    segment_id: str
    urls: int
    seconds: dict[str, float]


def run_inline(spark, conf: config_mod.Config, root: str, seconds: float) -> list[InlineCycle]:
    """The stand-in driver: generate, fetch, parse, dedup, update one after another, a cycle started every
    cycle.interval_s (or as soon as the last one ends), until `seconds` have passed."""
    from fetchd.commands import fetch_segment
    from jobs import dedup, generate, parse, update

    cycles: list[InlineCycle] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick = time.monotonic()
        walls: dict[str, float] = {}

        def timed(name: str, step: Callable, *step_args, walls: dict[str, float] = walls):
            started = time.monotonic()
            result = step(*step_args)
            walls[name] = time.monotonic() - started
            return result

        generated = timed("generate", generate.run, spark, conf, root)
        if generated.url_count:
            timed("fetch", fetch_segment, conf, root, generated.segment_id)
            for name, job in (("parse", parse.run), ("dedup", dedup.run), ("update", update.run)):
                timed(name, job, spark, conf, root, generated.segment_id)
            cycles.append(InlineCycle(generated.segment_id, generated.url_count, walls))
        progress(f"inline cycle {len(cycles)}: {generated.url_count} URLs, "
                 + ", ".join(f"{name} {wall:.1f}s" for name, wall in walls.items()))
        time.sleep(max(0.0, min(tick + conf.cycle.interval_s, deadline) - time.monotonic()))
    return cycles


def run_driver(config_file: Path, root: str, seconds: float, log_file: Path) -> list[str]:
    """`crawl run` for `seconds` (its own --for: it stops after the step in progress), SIGTERM if it overstays by
    OVERSTAY_S, kill -9 (and fail) if it is still there OVERSTAY_S later; its output lines."""
    command = [sys.executable, "-m", "jobs.cli", "run", "--root", root, "--config", str(config_file),
               "--for", str(round(seconds))]
    progress(f"starting: {' '.join(command)}")
    stopped = False
    with log_file.open("w", encoding="utf-8") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.wait(seconds + OVERSTAY_S)
        except subprocess.TimeoutExpired:
            stopped = True
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(OVERSTAY_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # its own process group: the driver and its daemon child
                child.wait()
                raise SystemExit(f"bench.freshness: crawl run did not stop on SIGTERM (output: {log_file})") from None
    lines = log_file.read_text(encoding="utf-8").splitlines()
    progress(f"crawl run exited with {child.returncode}" + (" after a SIGTERM" if stopped else ""))
    if child.returncode and not stopped:
        raise SystemExit(f"bench.freshness: crawl run failed (exit {child.returncode}): {lines[-1:] or ''} "
                         f"(its output: {log_file})")
    return lines


@dataclass
class RunRecord:
    root: str
    started: datetime
    ended: datetime
    inline_cycles: list[InlineCycle] | None
    driver_lines: list[str]


def judge(conf: config_mod.Config, farm, record: RunRecord) -> str:
    """Every figure from the farm's request log and the tables' files; prints the detail and returns the line."""
    from sitefarm.judge import politeness_violations, requested_url
    from sitefarm.server import read_request_log

    root, start, end = record.root, record.started, record.ended
    log = read_request_log(farm.log_path)
    violations = politeness_violations(log, lambda host: farm.politeness_delay(host, conf.politeness.min_delay_s))
    table = {name: Path(layout.table_path(root, name)) for name in ("urls", "hosts", "links", "segments")}

    segment_rows = added_rows(table["segments"], delta_commits(table["segments"]),
                              ["segment_id", "bucket", "url_count", "created_at"])
    created = {}
    sizes: dict[str, dict[int, int]] = defaultdict(dict)
    for row in segment_rows:
        created[row["segment_id"]] = min(created.get(row["segment_id"], as_utc(row["created_at"])),
                                         as_utc(row["created_at"]))
        sizes[row["segment_id"]][row["bucket"]] = row["url_count"]
    in_run = [s for s, at in created.items() if start <= at <= end]

    fetched: dict[tuple[str, str], tuple[str, float]] = {}
    for path in Path(layout.segments_dir(root)).glob("*/fetched/bucket=*/*.parquet"):
        for row in utc_times(pq.read_table(path, columns=["segment_id", "url_id", "url", "fetched_at"])).to_pylist():
            key, at = (row["segment_id"], row["url_id"]), as_utc(row["fetched_at"]).timestamp()
            if key not in fetched or at < fetched[key][1]:
                fetched[key] = (row["url"], at)
    link_commits = link_commit_times(added_rows(table["links"], delta_commits(table["links"]),
                                                ["segment_id", "from_url_id"]))
    requests = request_ends(log, requested_url)
    durable = discovered_durable_lags(link_commits, fetched, requests)
    pending = pending_lags(link_commits, fetched, requests, lambda url: bool(farm.links_of(url)), end.timestamp())

    levels = ServiceLevels.from_config(conf)
    states = added_rows(table["urls"], delta_commits(table["urls"]),
                        ["url_id", "url", "host_key", "priority", "next_fetch_at", "discovered_at"],
                        where=lambda t: pc.fill_null(pc.greater_equal(t["priority"], levels.high_priority), False))
    episodes = due_episodes(states, levels.high_priority, start, end)
    wanted = {state["url_id"] for state in states}
    listings = []
    for path in Path(layout.segments_dir(root)).glob("*/fetchlist/bucket=*/*.parquet"):
        listings += [(r["segment_id"], r["url_id"]) for r in
                     pq.read_table(path, columns=["segment_id", "url_id"]).to_pylist() if r["url_id"] in wanted]
    leases = lease_times(listings, created)
    hosts = HostStates(added_rows(table["hosts"], delta_commits(table["hosts"]),
                                  ["host_key", "robots_state", "backoff_until", "failing_since"]),
                       PolitenessRules.from_config(conf))
    leased = lease_figures(episodes, leases, end, levels.lease_within_s, hosts.ok)

    if record.inline_cycles is not None:
        cycles = [(c.urls, sum(c.seconds[s] for s in BATCH_STEPS)) for c in record.inline_cycles]
        fixed_source = "timed around each step of the inline driver"
    else:
        cycles = fixed_cost_cycles(progress_steps(record.driver_lines),
                                   {s: sum(b.values()) for s, b in sizes.items()})
        fixed_source = "the driver's progress lines"
    batch_s = batch_fixed_s(cycles)

    listed = farm.fresh_listings(end.timestamp() - levels.lease_within_s)
    url_ids = {state["url"]: state["url_id"] for state in states}
    listed_lags = [(leases[url_ids[url]][0] - instant(at)).total_seconds() for url, at in listed.items()
                   if at >= start.timestamp() and url in url_ids and leases.get(url_ids[url])]
    minutes = (end - start).total_seconds() / 60
    print(f"farm: {len(log):,} requests; {len(violations)} politeness violations")
    print(f"discovery: {len(durable):,} fetched pages with outlinks judged (fetch in the farm's log -> links commit), "
          f"{len(pending)} more fetched with outlinks but not durable at the end (counted at end - fetch)")
    print(f"leases: {len(episodes):,} high-priority due episodes: {leased.within} within "
          f"{levels.lease_within_s:.0f}s, {leased.late} late, {leased.waiting} still within the target at the end, "
          f"{leased.ineligible} on hosts not ok; due -> leased p50 {seconds(percentile(leased.lags_s, 0.5))}")
    print(f"fresh articles listed during the run (up to {levels.lease_within_s:.0f}s before its end): "
          f"{sum(1 for at in listed.values() if at >= start.timestamp())}, leased {len(listed_lags)}; "
          f"listed -> leased p50 {seconds(percentile(listed_lags, 0.5))}, p99 {seconds(percentile(listed_lags, 0.99))}")
    print(f"batch steps over {len(cycles)} cycles (generate+parse+dedup+update, {fixed_source}); "
          f"segment sizes {sorted(size for size, _ in cycles)[:8]}...")
    for violation in violations[:5]:
        print(f"  violation: {violation}")
    return render_line(minutes, len(in_run), durable + pending, leased, batch_s, len(violations))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="real time the driver runs (shorter: a smoke run)")
    parser.add_argument("--driver", choices=("run", "inline"), default="run",
                        help="run: `crawl run` in a subprocess; inline: a stand-in loop of the batch steps here")
    parser.add_argument("--urls", type=int, default=1_000_000, help="synthetic frontier rows")
    parser.add_argument("--synthetic-hosts", type=int, default=10_000, help="hosts of the synthetic rows")
    parser.add_argument("--due-share", type=float, default=0.01, help="share of the synthetic rows due at the start")
    parser.add_argument("--skew", type=float, default=3.0, help="host = floor(hosts * u^skew), as bench.frontier")
    parser.add_argument("--farm-hosts", type=int, default=12, help="ordinary farm sites")
    parser.add_argument("--farm-pages", type=int, default=40, help="pages per ordinary farm site")
    parser.add_argument("--fresh-hosts", type=int, default=4, help="farm hosts that list a new article every minute")
    parser.add_argument("--min-delay-s", type=float, default=1.0, help="politeness.min_delay_s")
    parser.add_argument("--revisit-s", type=int, default=60,
                        help="revisit.default_interval_s, min_interval_s and sitemap_min_interval_s")
    parser.add_argument("--interval-s", type=float, default=0.0, help="cycle.interval_s (0: the configured one)")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-freshness", help="scratch root, wiped first")
    parser.add_argument("--keep", action="store_true", help="keep the root after the run")
    parser.add_argument("--master", default="local[2]", help="spark.master")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver_memory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a config key for the engine (YAML value); repeatable")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.urls < 0 or args.synthetic_hosts <= 0 or not 0 <= args.due_share <= 1:
        parser.error("--minutes and --synthetic-hosts must be positive, --urls not negative, --due-share in [0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    from jobs import inject
    from jobs.base import spark_session
    from sitefarm.server import SiteFarm
    from sitefarm.sites import FarmSpec

    args = parse_args(argv)
    root = layout.normalize_root(args.root)
    shutil.rmtree(root, ignore_errors=True)
    Path(root).mkdir(parents=True)
    farm = SiteFarm(FarmSpec(hosts=args.farm_hosts, pages_per_host=args.farm_pages, fresh_hosts=args.fresh_hosts),
                    Path(root, "sitefarm-requests.jsonl"))
    farm.start()  # first: the synthetic URLs carry its port
    try:
        static_hosts = {**farm.static_hosts(),
                        **{name: "127.0.0.1" for name in synthetic_host_names(args.synthetic_hosts)}}
        conf = bench_config(args, root, static_hosts)
        progress(f"farm on 127.0.0.1:{farm.port} ({args.farm_hosts} sites, {args.fresh_hosts} fresh hosts); "
                 f"building {args.urls:,} synthetic URLs over {args.synthetic_hosts:,} hosts under {root}")
        spark = spark_session(conf, app_name="cyclecrawl-bench-freshness")
        cpu_before, build_started = process_tree_cpu_s(os.getpid()), time.monotonic()
        build_synthetic_frontier(spark, conf, root, args.urls, args.synthetic_hosts, farm.port, args.due_share,
                                 args.skew, datetime.now(UTC).replace(microsecond=0))
        build_s, build_cpu = time.monotonic() - build_started, process_tree_cpu_s(os.getpid()) - cpu_before
        host_count, due = assert_loopback_only(spark, root, static_hosts)
        progress(f"synthetic frontier built in {build_s:.1f}s wall, {build_cpu:.1f} CPU-s (this process, its JVM and "
                 f"workers; load average {os.getloadavg()[0]:.1f}); {host_count:,} hosts in urls, all mapped to "
                 f"loopback; {due:,} URLs due now")
        seeds = Path(root, "seeds.txt")
        seeds.write_text("".join(f"{url}\n" for url in farm.seed_urls()))
        started = datetime.now(UTC)
        progress(f"injecting {len(farm.seed_urls())} farm seeds: {inject.run(spark, conf, root, str(seeds)).summary()}")
        seconds = args.minutes * 60
        if args.driver == "inline":
            inline_cycles, lines = run_inline(spark, conf, root, seconds), []
        else:
            spark.stop()  # the driver's own session gets the machine
            config_file = Path(root, "bench-config.yaml")
            config_file.write_text(yaml.safe_dump(conf.as_dict()))
            inline_cycles, lines = None, run_driver(config_file, root, seconds, Path(root, "driver.log"))
        ended = datetime.now(UTC)
    finally:
        farm.stop()
    line = judge(conf, farm, RunRecord(root, started, ended, inline_cycles, lines))
    print(line, flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
