"""The dedup tests' small crawl (`tests/test_dedup_job.py`), run in the background once per session.

Hand-built pages over four segments on one root: exact copies, a near duplicate, unique, empty and binary pages, a
page of an earlier segment, then a later segment where pages change and a last one where some go away. Each stage's
tables are read as soon as it is done. It is about two minutes of the Spark lane's own work, so it runs in a thread
of its own on a session of its own (dedup sets SQL confs for a while) over the suite's SparkContext
(`dedup_crawl_started` in `tests/conftest.py`), overlapping the lane's other tests; the tests only read it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from crawler import layout, urls
from crawler.config import Config
from crawler.records import FETCHED
from delta_tables import tables
from jobs import dedup, generate, inject, update
from tests.support.tables import append_rows, table_versions

SEG, OLD_SEG, NEXT_SEG, GONE_SEG = "seg-d1", "seg-d0", "seg-d2", "seg-d3"
BASE = 0x5A5A_F0F0_1234_8765
FAR = ~BASE  # 64 bits from BASE
A = "http://a.test/"
ORIG, COPY, NEAR, UNIQUE, EMPTY1, EMPTY2, BINARY, LATE, OLD = (
    A + p for p in ("orig", "copy", "near", "unique", "empty1", "empty2", "binary", "late", "old"))
ONLY_FROM_COPY = A + "only-from-copy"
# url -> (content_hash, simhash, seconds after the segment's first fetch); OLD is a page of an earlier segment.
PAGES = {
    ORIG: ("h-orig", BASE, 0),
    COPY: ("h-orig", BASE, 1),           # identical payload, fetched later: exact duplicate of ORIG
    NEAR: ("h-near", BASE ^ 0b101, 2),   # two bits apart: near duplicate of ORIG only
    UNIQUE: ("h-unique", FAR, 3),
    EMPTY1: ("h-empty1", 0, 4),          # no text: SimHash 0 never clusters
    EMPTY2: ("h-empty2", 0, 5),
    BINARY: ("h-binary", None, 6),       # not HTML: no SimHash
    LATE: ("h-old", 0x0F0F_0000_FFFF_1111, 7),  # same payload as OLD, fetched in an earlier segment
}
SEEDS = [ORIG, COPY, NEAR, UNIQUE, EMPTY1, EMPTY2, BINARY, LATE]


def uid(url: str) -> str:
    return urls.url_id(url)


def page_row(url: str, segment: str, version: int, at: datetime, content_hash: str, simhash: int | None) -> dict:
    return {"url_id": uid(url), "state_version": version, "url": url, "segment_id": segment, "fetched_at": at,
            "content_hash": content_hash, "simhash": simhash}


def by_url(spark, root: str, name: str, key: str = "url") -> dict:
    return {(r[key], r["state_version"]) if name == "pages" else r[key]: r
            for r in tables.table_df(spark, root, name).collect()}


def write_fetched(root: str, segment: str, version: int, results: dict[str, tuple[datetime, int]]) -> None:
    """The segment's fetched-results file as the daemon writes it: url -> (fetched_at, status code)."""
    rows = [{"segment_id": segment, "bucket": urls.bucket_of(urls.host_key(u), 4), "url_id": uid(u),
             "state_version": version, "url": u, "host_key": urls.host_key(u), "fetched_at": at,
             "outcome": "success" if code == 200 else "http_error", "status_code": code,
             "warc_filename": f"segments/{segment}/warc/x.warc.gz", "warc_offset": 100, "warc_length": 50}
            for u, (at, code) in results.items()]
    bucket = rows[0]["bucket"]
    path = layout.fetched_dir(root, segment, bucket)
    os.makedirs(path, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=FETCHED), os.path.join(path, "part-00000.parquet"))


def index_rows(spark, root: str) -> dict[str, dict]:
    """url_id -> its dedup_hashes row and {band: cluster} from dedup_bands."""
    rows = {r.url_id: {"hash": r.asDict(), "clusters": {}} for r in tables.table_df(spark, root, "dedup_hashes")
            .collect()}
    for r in tables.table_df(spark, root, "dedup_bands").collect():
        rows.setdefault(r.url_id, {"hash": None, "clusters": {}})["clusters"][r.band] = r.cluster
    return rows


def run_dedup_crawl(spark, base_conf: Config, root: str, base: Path) -> dict[str, Any]:
    """One root (its tables created and empty) through: dedup, dedup again, update, then a later segment's dedup
    and a last one where pages went away; what each stage left, read at once."""
    seeds = base / "seeds.txt"
    seeds.write_text("\n".join(SEEDS))
    inject.run(spark, base_conf, root, str(seeds))
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    assert generate.run(spark, base_conf, root, SEG, now).url_count == len(SEEDS)
    at = now + timedelta(seconds=10)
    # OLD: a page of an earlier segment, deduplicated in its own cycle (the index holds it).
    write_fetched(root, OLD_SEG, 1, {OLD: (at - timedelta(days=1), 200)})
    append_rows(spark, root, "pages", [page_row(OLD, OLD_SEG, 1, at - timedelta(days=1), "h-old", 0x77)])
    dedup.run(spark, base_conf, root, OLD_SEG)
    write_fetched(root, SEG, 1, {u: (at + timedelta(seconds=PAGES[u][2]), 200) for u in SEEDS})
    append_rows(spark, root, "pages", [
        page_row(u, SEG, 1, at + timedelta(seconds=s), h, sim) for u, (h, sim, s) in PAGES.items()])
    append_rows(spark, root, "links", [
        {"segment_id": SEG, "from_url_id": uid(COPY), "from_state_version": 1, "to_url_id": uid(ONLY_FROM_COPY),
         "to_url": ONLY_FROM_COPY, "rel_nofollow": False}])
    priorities = {u: r.priority for u, r in by_url(spark, root, "urls").items()}
    stages = {"priorities": priorities, "first": dedup.run(spark, base_conf, root, SEG)}
    stages["pages"] = by_url(spark, root, "pages")
    stages["urls"] = by_url(spark, root, "urls")
    stages["versions_before_again"] = table_versions(root)
    stages["again"] = dedup.run(spark, base_conf, root, SEG)
    stages["versions_after_again"] = table_versions(root)
    update.run(spark, base_conf, root, SEG)
    stages["updated_urls"] = by_url(spark, root, "urls")
    stages["events"] = by_url(spark, root, "index_events")
    # A later segment: COPY stays an exact duplicate, UNIQUE changes into one, NEAR changes into a unique page.
    later = at + timedelta(hours=1)
    write_fetched(root, NEXT_SEG, 2, {u: (later, 200) for u in (COPY, UNIQUE, NEAR)})
    append_rows(spark, root, "pages", [page_row(COPY, NEXT_SEG, 2, later, "h-orig", BASE),
                                       page_row(UNIQUE, NEXT_SEG, 2, later, "h-orig", BASE),
                                       page_row(NEAR, NEXT_SEG, 2, later, "h-near-2", BASE ^ 0xFFFF_0000_FFFF)])
    stages["next"] = dedup.run(spark, base_conf, root, NEXT_SEG)
    stages["next_pages"] = by_url(spark, root, "pages")
    stages["next_urls"] = by_url(spark, root, "urls")
    stages["next_index"] = index_rows(spark, root)
    # A last segment: ORIG (which represents h-orig and a near cluster) answers 404, LATE (a duplicate) 410.
    write_fetched(root, GONE_SEG, 3, {ORIG: (later + timedelta(hours=1), 404), LATE: (later + timedelta(hours=1), 410)})
    stages["gone"] = dedup.run(spark, base_conf, root, GONE_SEG)
    stages["gone_urls"] = by_url(spark, root, "urls")
    stages["gone_index"] = index_rows(spark, root)
    return stages


# ---- a generated corpus over three segments (its marks against a full recompute: tests/test_dedup_job.py) --------

FAMILIES, SEGMENTS = 12, ("seg-g1", "seg-g2", "seg-g3")


def generated_corpus(seed: int = 7) -> list[dict]:
    """Pages of three segments: near families (a base SimHash with any subset of three family bits flipped, so
    every two members are within k = 3 and no page bridges two families), exact copies of members in later
    segments, and unique pages. Content never changes and nothing leaves: the incremental rule and the full
    recompute must agree on every mark."""
    rng = np.random.default_rng(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    pages, n = [], 0
    for family in range(FAMILIES):
        base = int(rng.integers(-(2**63), 2**63 - 1))
        bits = rng.choice(64, size=3, replace=False)
        for member in range(int(rng.integers(1, 6))):
            mask = sum(1 << int(b) for j, b in enumerate(bits) if member >> j & 1)
            simhash = np.int64(np.uint64(base & (2**64 - 1)) ^ np.uint64(mask)).item()
            for _copy in range(int(rng.integers(1, 3))):
                segment = int(rng.integers(0, 3))
                n += 1
                pages.append({"url": f"http://g{n % 5}.test/p{n}", "segment": SEGMENTS[segment],
                              "at": start + timedelta(days=segment, seconds=int(rng.integers(0, 3600))),
                              "content_hash": f"h-{family}-{member}", "simhash": simhash})
    for _ in range(20):
        n += 1
        segment = int(rng.integers(0, 3))
        pages.append({"url": f"http://g{n % 5}.test/p{n}", "segment": SEGMENTS[segment],
                      "at": start + timedelta(days=segment, seconds=int(rng.integers(0, 3600))),
                      "content_hash": f"h-unique-{n}", "simhash": int(rng.integers(-(2**63), 2**63 - 1))})
    return pages


def run_generated_corpus(spark, base_conf: Config, root: str) -> dict[str, Any]:
    """The corpus's pages written and deduplicated one segment after another (one dedup run each, as a crawl would);
    the marks dedup left: url_id -> (duplicate_of, near_duplicate_cluster), under "marks". About two minutes of
    Spark, so it runs in the background too (`dedup_corpus_started` in `tests/conftest.py`, after the small crawl).

    The first segment is deduplicated with wide keys (`dedup.blocks_per_key` 2), the later ones with the defaults
    (classic banding): the second is refused until `crawl dedup --rebuild` re-keys the index (each stage's answer
    kept), so the marks also hold across a rebuild. Then the index's record is dropped (an index from before
    records) and replaced by one of another fingerprint: what dedup and the rebuild say to each."""
    corpus, stages = generated_corpus(), {}
    wide = base_conf.with_overrides({"dedup.blocks_per_key": 2})
    for number, segment in enumerate(SEGMENTS):
        mine = [p for p in corpus if p["segment"] == segment]
        write_fetched(root, segment, 1, {p["url"]: (p["at"], 200) for p in mine})
        append_rows(spark, root, "pages", [page_row(p["url"], segment, 1, p["at"], p["content_hash"], p["simhash"])
                                           for p in mine])
        if number == 1:
            stages["refused"] = _refusal(dedup.run, spark, base_conf, root, segment)
            stages["wide_rows"] = tables.table_df(spark, root, "dedup_bands").count()
            stages["rebuilt"] = dedup.rebuild_index(spark, base_conf, root)
            stages["rebuilt_rows"] = tables.table_df(spark, root, "dedup_bands").count()
            stages["rebuilt_again"] = dedup.rebuild_index(spark, base_conf, root)
        dedup.run(spark, wide if number == 0 else base_conf, root, segment)
    stages["marks"] = {r.url_id: (r.duplicate_of, r.near_duplicate_cluster)
                       for r in tables.table_df(spark, root, "pages").collect()}
    stages["index"] = sorted(map(tuple, tables.table_df(spark, root, "dedup_bands").drop("segment_id").collect()))
    recorded = tables.table_property(spark, root, "dedup_bands", dedup.INDEX_PROPERTY)
    spark.sql(f"ALTER TABLE delta.`{tables.table_path(root, 'dedup_bands')}` UNSET TBLPROPERTIES "
              f"('{dedup.INDEX_PROPERTY}')")
    stages["unrecorded"] = _refusal(dedup.run, spark, base_conf, root, SEGMENTS[-1])
    stages["from_unrecorded"] = dedup.rebuild_index(spark, base_conf, root)
    stages["index_from_unrecorded"] = sorted(
        map(tuple, tables.table_df(spark, root, "dedup_bands").drop("segment_id").collect()))
    stages["recorded_again"] = tables.table_property(spark, root, "dedup_bands", dedup.INDEX_PROPERTY) == recorded
    foreign = recorded.replace("/v1", "/v0")
    tables.set_table_property(spark, root, "dedup_bands", dedup.INDEX_PROPERTY, foreign)
    stages["foreign_dedup"] = _refusal(dedup.run, spark, base_conf, root, SEGMENTS[-1])
    stages["foreign_rebuild"] = _refusal(dedup.rebuild_index, spark, base_conf, root)
    return stages


def _refusal(action, *args) -> str:
    """The message of the IndexRefused that `action(*args)` raises (AssertionError when it raises none)."""
    try:
        action(*args)
    except dedup.IndexRefused as exc:
        return str(exc)
    raise AssertionError("not refused")
