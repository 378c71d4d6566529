"""WARC bytes of a recrawl with and without identical-payload revisits, on the demo farm.

Run on demand, never as a test:

    .venv/bin/python -m bench.revisits [--hosts 24] [--pages 60] [--changing 0.2] [--page-kb 0,0]
                                       [--root /tmp/cyclecrawl-bench-revisits]

The demo farm (`crawl demo`'s FarmSpec: --hosts x --pages) with validator roles on (`FarmSpec.validators`: a third
of the hosts honour If-None-Match / If-Modified-Since with a 304, a third ignore them, a third send none) and a
share of pages that change at every request (--changing), on loopback in this process; the daemon
(`fetchd.commands.fetch_segment`, the demo's settings, no Spark) fetches every URL the farm builds (pages, sitemap
files, orphans) once, then recrawls them twice from that first crawl's results, each time as update and generate
would hand them out: once with validators only (no stored payload: what the crawl wrote before identical-payload
revisits), once with validators and the stored payload (`crawler.payloads.stored_after`). It reports each crawl's
WARC bytes on disk (every file of the segment: warcinfo, requests, responses or revisits, metadata and result
records), the outcomes, and how many of the pages the farm serves unchanged without honouring validators (its
truth: `served_unchanged_without_validators`) became revisit records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from crawler import config as config_mod
from crawler import layout, payloads, records, urls
from crawler.bucketing import Bucketing
from fetchd.commands import fetch_segment
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec


def write_fetchlist(root: str, segment: str, items: list[dict], buckets: int) -> None:
    """The fetch list as generate writes it (FETCHLIST columns, a bucket folder each, ranked per host)."""
    by_bucket: dict[int, list[dict]] = {}
    ranks: Counter[str] = Counter()
    for item in items:
        url = urls.canonicalize(item["url"])
        key = urls.host_key(url)
        ranks[key] += 1
        row = dict.fromkeys(records.FETCHLIST.names)
        row.update(item, segment_id=segment, url_id=urls.url_id(url), url=url, host_key=key, state_version=1,
                   rank=ranks[key], priority=1.0, depth=0)
        by_bucket.setdefault(Bucketing(buckets).bucket(key), []).append(row)
    for bucket, rows in by_bucket.items():
        folder = layout.fetchlist_dir(root, segment, bucket)
        os.makedirs(folder, exist_ok=True)
        rows.sort(key=lambda r: (r["rank"], r["host_key"]))
        pq.write_table(pa.Table.from_pylist(rows, schema=records.FETCHLIST), os.path.join(folder, "part-0.parquet"))


def read_results(root: str, segment: str) -> list[dict]:
    rows = []
    for folder, _, names in os.walk(layout.fetched_dir(root, segment)):
        rows += [row for name in sorted(names) if name.endswith(".parquet") and not name.startswith((".", "_"))
                 for row in pq.read_table(os.path.join(folder, name)).to_pylist()]
    return rows


def by_url(rows: list[dict]) -> dict[str, dict]:
    return {row["url"]: row for row in rows}


def warc_bytes(root: str, segment: str) -> int:
    folder = layout.warc_dir(root, segment)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)


def refetch_items(rows: list[dict], stored: bool) -> list[dict]:
    """The recrawl's fetch list from the first crawl's results: validators and the last fetch always, the stored
    payload only when `stored`."""
    items = []
    for row in rows:
        item = {"url": row["url"], "etag": row["etag"], "last_modified": row["last_modified"],
                "last_fetch_at": row["fetched_at"]}
        kept = payloads.stored_after(row["outcome"], row["truncated"], row["payload_digest"], row["warc_filename"],
                                     row["url"], row["redirect_to"], row["fetched_at"], payloads.StoredRecord())
        if stored:
            item.update(stored_payload_digest=kept.digest, stored_target_uri=kept.target_uri,
                        stored_warc_date=kept.warc_date)
        items.append(item)
    return items


def crawl(conf: config_mod.Config, root: str, segment: str, items: list[dict]) -> dict[str, Any]:
    write_fetchlist(root, segment, items, conf.crawl.buckets)
    started = time.monotonic()
    fetch_segment(conf, root, segment)
    rows = read_results(root, segment)
    return {"segment": segment, "seconds": round(time.monotonic() - started, 1), "urls": len(rows),
            "warc_bytes": warc_bytes(root, segment), "outcomes": dict(Counter(row["outcome"] for row in rows)),
            "rows": rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = args.root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    low, high = (int(v) for v in args.page_kb.split(","))
    spec = FarmSpec(hosts=args.hosts, pages_per_host=args.pages, latency_s=0.0, validators=True,
                    changing_share=args.changing, page_kb=(low, high))
    farm = SiteFarm(spec, Path(root) / "farm.jsonl")
    farm.start()
    try:
        conf = config_mod.load().with_overrides({
            "fetch.static_hosts": farm.static_hosts(), "fetch.allow_networks": ["127.0.0.0/8"],
            "politeness.min_delay_s": 0.0, "politeness.max_crawl_delay_s": 0.0,
            "fetch.progress_interval_s": 3600.0,
        })
        listed = sorted(farm.page_urls() | set(farm.sitemap_urls()) | farm.orphan_urls())
        first = crawl(conf, root, "first", [{"url": url} for url in listed])
        without = crawl(conf, root, "recrawl-validators-only", refetch_items(first["rows"], stored=False))
        with_revisits = crawl(conf, root, "recrawl-with-revisits", refetch_items(first["rows"], stored=True))
    finally:
        farm.stop()
    # stored in full the first time (a page of a media type the crawl does not read is cut: never a revisit)
    done = {url for url, row in by_url(first["rows"]).items() if row["outcome"] == "success" and not row["truncated"]}
    unchanged = farm.served_unchanged_without_validators() & done
    second = by_url(with_revisits["rows"])
    missed = sorted(url for url in unchanged if second[url]["outcome"] != "identical_payload")
    roles = Counter(farm.validator_role(name) for name in farm.host_names())
    result = {
        "farm": {"hosts": args.hosts, "pages_per_host": args.pages, "page_kb": [low, high],
                 "changing_share": args.changing, "host_roles": dict(roles), "urls": len(listed),
                 "unchanged_without_validators": len(unchanged), "not_modified_by_304": len(
                     farm.served_not_modified() & done), "changing": len(farm.changing_urls() & done)},
        "crawls": [{k: v for k, v in c.items() if k != "rows"} for c in (first, without, with_revisits)],
        "unchanged_pages_not_revisits": len(missed),
        "recrawl_bytes_saved": without["warc_bytes"] - with_revisits["warc_bytes"],
        "recrawl_bytes_ratio": round(with_revisits["warc_bytes"] / without["warc_bytes"], 3),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    demo = config_mod.load().demo
    parser.add_argument("--hosts", type=int, default=demo.hosts)
    parser.add_argument("--pages", type=int, default=demo.pages_per_host)
    parser.add_argument("--changing", type=float, default=0.2, help="share of pages that change at every request")
    parser.add_argument("--page-kb", default="0,0", help="pages padded to low,high KB (0,0: the demo's pages)")
    parser.add_argument("--root", default="/tmp/cyclecrawl-bench-revisits")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
