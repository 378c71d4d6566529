"""The dedup step on real Delta tables: exact and near marks on the segment's pages with representatives chosen
over every segment, priorities lowered once, a re-run that changes nothing, update after dedup carrying the marks
into index_events and still following a duplicate's outlinks, and no second lowering for a URL that stays a
duplicate in a later segment."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawler import dedup as rules
from crawler import layout, urls
from crawler.records import FETCHED
from delta_tables import tables
from jobs import dedup, generate, inject, update
from tests.support.tables import append_rows, table_versions

pytestmark = pytest.mark.slow  # every test reads the module's small crawl (about two minutes of Spark)

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


@pytest.fixture(scope="module")
def crawled(spark, base_conf, new_tables_root, tmp_path_factory):
    """One root through: dedup, dedup again, update, then a later segment's dedup; snapshots at each stage."""
    root = new_tables_root(tmp_path_factory.mktemp("dedup") / "root")
    seeds = tmp_path_factory.mktemp("seeds") / "seeds.txt"
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


def index_rows(spark, root: str) -> dict[str, dict]:
    """url_id -> its dedup_hashes row and {band: cluster} from dedup_bands."""
    rows = {r.url_id: {"hash": r.asDict(), "clusters": {}} for r in tables.table_df(spark, root, "dedup_hashes")
            .collect()}
    for r in tables.table_df(spark, root, "dedup_bands").collect():
        rows.setdefault(r.url_id, {"hash": None, "clusters": {}})["clusters"][r.band] = r.cluster
    return rows


def test_exact_and_near_marks_with_stable_representatives(crawled):
    pages = crawled["pages"]
    marks = {url: (pages[(url, 1)].duplicate_of, pages[(url, 1)].near_duplicate_cluster) for url in PAGES}
    assert marks == {
        ORIG: (None, uid(ORIG)),              # represents both its cluster and its payload
        COPY: (uid(ORIG), uid(ORIG)),
        NEAR: (None, uid(ORIG)),
        UNIQUE: (None, None),
        EMPTY1: (None, None),
        EMPTY2: (None, None),
        BINARY: (None, None),
        LATE: (uid(OLD), None),               # represented by a page of an earlier segment
    }
    old = pages[(OLD, 1)]
    assert (old.duplicate_of, old.near_duplicate_cluster) == (None, None)  # other segments' rows are not rewritten
    # The job's exact representatives agree with the pure rule over the same rows.
    rows = [{"url_id": r.url_id, "fetched_at": r.fetched_at, "content_hash": r.content_hash} for r in pages.values()]
    expected = rules.exact_representative(rows)
    assert all(expected[r.content_hash] == (r.duplicate_of or r.url_id) for r in pages.values() if r.segment_id == SEG)
    first = crawled["first"]
    assert (first.examined, first.left, first.exact_duplicates, first.near_duplicates) == (8, 0, 2, 2)
    assert (first.near_clusters, first.capped_buckets, first.skipped_comparisons, first.marked) == (1, 0, 0, 4)
    # ORIG~COPY (distance 0) is found in all 4 bands; NEAR, in the 3 bands its edit misses, is compared with the
    # run of identical SimHashes ORIG heads, not with COPY again.
    assert first.pairs == 4 + 3


def test_duplicates_priority_lowered_once_and_rerun_changes_nothing(crawled, base_conf):
    factor = base_conf["dedup.duplicate_priority_factor"]
    before, after = crawled["priorities"], crawled["urls"]
    lowered = {u for u in SEEDS if after[u].priority != before[u]}
    assert lowered == {COPY, NEAR, LATE}
    assert all(after[u].priority == pytest.approx(before[u] * factor) for u in lowered)
    again = crawled["again"]
    assert (again.marked, again.priority_lowered) == (0, 0)
    assert (again.exact_duplicates, again.near_duplicates, again.pairs) == (2, 2, 7)
    # No table takes a second commit for the segment (stricter than equal contents: nothing is rewritten either).
    assert crawled["versions_after_again"] == crawled["versions_before_again"]


def test_update_after_dedup_carries_marks_and_follows_a_duplicates_outlinks(crawled, base_conf):
    events = crawled["events"]
    assert events[COPY].duplicate_of == uid(ORIG) and events[LATE].duplicate_of == uid(OLD)
    # A near duplicate names its cluster's representative; the representatives are plain first fetches.
    assert events[NEAR].duplicate_of == uid(ORIG)
    assert events[ORIG].duplicate_of is None and events[ORIG].kind == "fetched"
    assert {events[u].kind for u in (COPY, LATE, NEAR)} == {"duplicate"}
    discovered = crawled["updated_urls"][ONLY_FROM_COPY]
    assert discovered.source == "link"
    # A discovery inherits its parent's (lowered) priority times the discovery factor.
    assert discovered.priority == pytest.approx(crawled["urls"][COPY].priority * 0.8)


def test_a_later_segment_lowers_only_pages_that_became_duplicates(crawled, base_conf):
    factor = base_conf["dedup.duplicate_priority_factor"]
    pages, before, after = crawled["next_pages"], crawled["updated_urls"], crawled["next_urls"]
    assert pages[(COPY, 2)].duplicate_of == uid(ORIG) and pages[(UNIQUE, 2)].duplicate_of == uid(ORIG)
    assert pages[(UNIQUE, 1)].duplicate_of is None  # the earlier version keeps its own segment's verdict
    assert (pages[(NEAR, 2)].duplicate_of, pages[(NEAR, 2)].near_duplicate_cluster) == (None, None)
    assert {u for u in after if after[u].priority != before[u].priority} == {UNIQUE, NEAR}
    assert after[UNIQUE].priority == pytest.approx(before[UNIQUE].priority * factor)
    # NEAR stopped being a duplicate: the lowering of the first segment is undone.
    assert after[NEAR].priority == pytest.approx(before[NEAR].priority / factor)
    assert after[NEAR].priority == pytest.approx(crawled["priorities"][NEAR])
    nxt = crawled["next"]
    assert (nxt.examined, nxt.priority_lowered, nxt.priority_restored) == (3, 1, 1)


def test_the_indexes_hold_each_urls_current_document(crawled):
    index = crawled["next_index"]
    assert set(index) == {uid(u) for u in [*SEEDS, OLD]}
    rows = {u: index[uid(u)]["hash"] for u in [*SEEDS, OLD]}
    assert {u: r["representative"] for u, r in rows.items() if r["representative"] != uid(u)} == {
        COPY: uid(ORIG), UNIQUE: uid(ORIG), LATE: uid(OLD)}
    assert {u for u, r in rows.items() if r["marked_duplicate"]} == {COPY, UNIQUE, LATE}
    assert rows[UNIQUE]["content_hash"] == "h-orig"  # the changed page replaced its row
    # SimHash 0 and null never enter the band index; every other page has one row per band.
    banded = {u for u in rows if index[uid(u)]["clusters"]}
    assert banded == {ORIG, COPY, NEAR, UNIQUE, LATE, OLD}
    assert all(len(index[uid(u)]["clusters"]) == 4 for u in banded)
    assert set(index[uid(COPY)]["clusters"].values()) == {uid(ORIG)}
    assert set(index[uid(NEAR)]["clusters"].values()) == {uid(NEAR)}  # changed into a unique page


def test_gone_pages_leave_the_indexes_and_the_next_holder_takes_over(crawled, base_conf):
    """ORIG and LATE went away: their rows leave both indexes; h-orig passes to the earliest remaining holder
    (COPY, fetched before UNIQUE had that content), ORIG's near cluster is retired (its members fall back to
    themselves), and LATE, a duplicate, gets its priority back."""
    gone, index = crawled["gone"], crawled["gone_index"]
    assert (gone.examined, gone.left, gone.priority_lowered, gone.priority_restored) == (0, 2, 0, 1)
    assert uid(ORIG) not in index and uid(LATE) not in index
    assert index[uid(COPY)]["hash"]["representative"] == uid(COPY)
    assert index[uid(UNIQUE)]["hash"]["representative"] == uid(COPY)
    assert set(index[uid(COPY)]["clusters"].values()) == {uid(COPY)}
    assert set(index[uid(UNIQUE)]["clusters"].values()) == {uid(UNIQUE)}
    assert gone.relabelled == 2 + 2 * 4
    factor = base_conf["dedup.duplicate_priority_factor"]
    before, after = crawled["next_urls"], crawled["gone_urls"]
    assert after[LATE].priority == pytest.approx(before[LATE].priority / factor)
    assert {u for u in after if after[u].priority != before[u].priority} == {LATE}


# ---- a generated corpus over three segments: the incremental marks against the full recompute ---------------------

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


def full_recompute_marks(pages: list[dict]) -> dict[str, tuple[str | None, str | None]]:
    """url_id -> (duplicate_of, near_duplicate_cluster) by crawler.dedup's rules over the whole corpus."""
    rows = [{"url_id": uid(p["url"]), "fetched_at": p["at"], "content_hash": p["content_hash"]} for p in pages]
    exact = rules.exact_representative(rows)
    ids = np.array([r["url_id"] for r in rows])
    near = rules.near_duplicate_clusters(ids, np.array([p["at"] for p in pages], dtype="datetime64[us]"),
                                         [p["simhash"] for p in pages])
    sizes = np.bincount(near.representative, minlength=len(ids))
    return {ids[i]: (None if exact[rows[i]["content_hash"]] == ids[i] else exact[rows[i]["content_hash"]],
                     ids[r] if sizes[r] > 1 else None) for i, r in enumerate(near.representative)}


def test_incremental_marks_equal_the_full_recompute_on_a_generated_corpus(spark, base_conf, tmp_path):
    root = str(tmp_path / "root")
    tables.ensure_tables(spark, root)
    corpus = generated_corpus()
    for segment in SEGMENTS:
        mine = [p for p in corpus if p["segment"] == segment]
        write_fetched(root, segment, 1, {p["url"]: (p["at"], 200) for p in mine})
        append_rows(spark, root, "pages", [page_row(p["url"], segment, 1, p["at"], p["content_hash"], p["simhash"])
                                           for p in mine])
        dedup.run(spark, base_conf, root, segment)
    # Each segment's pages were marked against the corpus of its own and earlier segments: compare per segment.
    got = {r.url_id: (r.duplicate_of, r.near_duplicate_cluster) for r in tables.table_df(spark, root, "pages")
           .collect()}
    for number in range(1, len(SEGMENTS) + 1):
        so_far = [p for p in corpus if p["segment"] in SEGMENTS[:number]]
        expected = full_recompute_marks(so_far)
        segment = {uid(p["url"]) for p in so_far if p["segment"] == SEGMENTS[number - 1]}
        assert {u: got[u] for u in segment} == {u: expected[u] for u in segment}, number
    final = full_recompute_marks(corpus)
    assert sum(d is not None for d, _ in final.values()) >= 10
    assert sum(c is not None and c != u for u, (_, c) in final.items()) >= 10
