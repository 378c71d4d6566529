"""The dedup step on real Delta tables: exact and near marks on the segment's pages with representatives chosen
over every segment, priorities lowered once, a re-run that changes nothing, update after dedup carrying the marks
into index_events and still following a duplicate's outlinks, and no second lowering for a URL that stays a
duplicate in a later segment."""

from __future__ import annotations

import numpy as np
import pytest

from crawler import dedup as rules
from tests.support.dedup_crawl import (
    BASE,
    BINARY,
    COPY,
    EMPTY1,
    EMPTY2,
    LATE,
    NEAR,
    OLD,
    ONLY_FROM_COPY,
    ORIG,
    PAGES,
    SEEDS,
    SEG,
    SEGMENTS,
    UNIQUE,
    generated_corpus,
    uid,
)

pytestmark = pytest.mark.slow  # the module's small crawl is about two minutes of Spark (in the background)


def _keys_agreeing(conf, a: int, b: int) -> int:
    """Index keys under which two SimHashes fall in one bucket, with the config's definition."""
    keys = rules.band_values(np.array([a, b], dtype=np.uint64).view(np.int64), conf.dedup.max_hamming,
                             conf.dedup.blocks_per_key)
    return int((keys[0] == keys[1]).sum())


def test_exact_and_near_marks_with_stable_representatives(dedup_crawl, base_conf):
    pages = dedup_crawl["pages"]
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
    first = dedup_crawl["first"]
    assert (first.examined, first.left, first.exact_duplicates, first.near_duplicates) == (8, 0, 2, 2)
    assert (first.near_clusters, first.capped_buckets, first.skipped_comparisons, first.marked) == (1, 0, 0, 4)
    # ORIG~COPY (distance 0) is found under every index key; NEAR, under the keys its edit misses (its two bits lie
    # in the first block: 3 of the 4 bands with one block a key, 6 of 10 keys with two), is compared with the run of
    # identical SimHashes ORIG heads, not with COPY again.
    assert first.pairs == _keys_agreeing(base_conf, BASE, BASE) + _keys_agreeing(base_conf, BASE, PAGES[NEAR][1])
    assert first.pairs == 4 + 3


def test_duplicates_priority_lowered_once_and_rerun_changes_nothing(dedup_crawl, base_conf):
    factor = base_conf.dedup.duplicate_priority_factor
    before, after = dedup_crawl["priorities"], dedup_crawl["urls"]
    lowered = {u for u in SEEDS if after[u].priority != before[u]}
    assert lowered == {COPY, NEAR, LATE}
    assert all(after[u].priority == pytest.approx(before[u] * factor) for u in lowered)
    again = dedup_crawl["again"]
    assert (again.marked, again.priority_lowered) == (0, 0)
    assert (again.exact_duplicates, again.near_duplicates, again.pairs) == (2, 2, dedup_crawl["first"].pairs)
    # No table takes a second commit for the segment (stricter than equal contents: nothing is rewritten either).
    assert dedup_crawl["versions_after_again"] == dedup_crawl["versions_before_again"]


def test_update_after_dedup_carries_marks_and_follows_a_duplicates_outlinks(dedup_crawl, base_conf):
    events = dedup_crawl["events"]
    assert events[COPY].duplicate_of == uid(ORIG) and events[LATE].duplicate_of == uid(OLD)
    # A near duplicate names its cluster's representative; the representatives are plain first fetches.
    assert events[NEAR].duplicate_of == uid(ORIG)
    assert events[ORIG].duplicate_of is None and events[ORIG].kind == "fetched"
    assert {events[u].kind for u in (COPY, LATE, NEAR)} == {"duplicate"}
    discovered = dedup_crawl["updated_urls"][ONLY_FROM_COPY]
    assert discovered.source == "link"
    # A discovery inherits its parent's (lowered) priority times the discovery factor.
    assert discovered.priority == pytest.approx(dedup_crawl["urls"][COPY].priority * 0.8)


def test_a_later_segment_lowers_only_pages_that_became_duplicates(dedup_crawl, base_conf):
    factor = base_conf.dedup.duplicate_priority_factor
    pages, before, after = dedup_crawl["next_pages"], dedup_crawl["updated_urls"], dedup_crawl["next_urls"]
    assert pages[(COPY, 2)].duplicate_of == uid(ORIG) and pages[(UNIQUE, 2)].duplicate_of == uid(ORIG)
    assert pages[(UNIQUE, 1)].duplicate_of is None  # the earlier version keeps its own segment's verdict
    assert (pages[(NEAR, 2)].duplicate_of, pages[(NEAR, 2)].near_duplicate_cluster) == (None, None)
    assert {u for u in after if after[u].priority != before[u].priority} == {UNIQUE, NEAR}
    assert after[UNIQUE].priority == pytest.approx(before[UNIQUE].priority * factor)
    # NEAR stopped being a duplicate: the lowering of the first segment is undone.
    assert after[NEAR].priority == pytest.approx(before[NEAR].priority / factor)
    assert after[NEAR].priority == pytest.approx(dedup_crawl["priorities"][NEAR])
    nxt = dedup_crawl["next"]
    assert (nxt.examined, nxt.priority_lowered, nxt.priority_restored) == (3, 1, 1)


def test_the_indexes_hold_each_urls_current_document(dedup_crawl, base_conf):
    index = dedup_crawl["next_index"]
    assert set(index) == {uid(u) for u in [*SEEDS, OLD]}
    rows = {u: index[uid(u)]["hash"] for u in [*SEEDS, OLD]}
    assert {u: r["representative"] for u, r in rows.items() if r["representative"] != uid(u)} == {
        COPY: uid(ORIG), UNIQUE: uid(ORIG), LATE: uid(OLD)}
    assert {u for u, r in rows.items() if r["marked_duplicate"]} == {COPY, UNIQUE, LATE}
    assert rows[UNIQUE]["content_hash"] == "h-orig"  # the changed page replaced its row
    # SimHash 0 and null never enter the band index; every other page has one row per index key.
    banded = {u for u in rows if index[uid(u)]["clusters"]}
    assert banded == {ORIG, COPY, NEAR, UNIQUE, LATE, OLD}
    keys = rules.index_key_count(base_conf.dedup.max_hamming, base_conf.dedup.blocks_per_key)
    assert all(len(index[uid(u)]["clusters"]) == keys == 4 for u in banded)
    assert set(index[uid(COPY)]["clusters"].values()) == {uid(ORIG)}
    assert set(index[uid(NEAR)]["clusters"].values()) == {uid(NEAR)}  # changed into a unique page


def test_gone_pages_leave_the_indexes_and_the_next_holder_takes_over(dedup_crawl, base_conf):
    """ORIG and LATE went away: their rows leave both indexes; h-orig passes to the earliest remaining holder
    (COPY, fetched before UNIQUE had that content), ORIG's near cluster is retired (its members fall back to
    themselves), and LATE, a duplicate, gets its priority back."""
    gone, index = dedup_crawl["gone"], dedup_crawl["gone_index"]
    assert (gone.examined, gone.left, gone.priority_lowered, gone.priority_restored) == (0, 2, 0, 1)
    assert uid(ORIG) not in index and uid(LATE) not in index
    assert index[uid(COPY)]["hash"]["representative"] == uid(COPY)
    assert index[uid(UNIQUE)]["hash"]["representative"] == uid(COPY)
    assert set(index[uid(COPY)]["clusters"].values()) == {uid(COPY)}
    assert set(index[uid(UNIQUE)]["clusters"].values()) == {uid(UNIQUE)}
    assert gone.relabelled == 2 + 2 * rules.index_key_count(base_conf.dedup.max_hamming, base_conf.dedup.blocks_per_key)
    factor = base_conf.dedup.duplicate_priority_factor
    before, after = dedup_crawl["next_urls"], dedup_crawl["gone_urls"]
    assert after[LATE].priority == pytest.approx(before[LATE].priority / factor)
    assert {u for u in after if after[u].priority != before[u].priority} == {LATE}


# ---- a generated corpus over three segments: the incremental marks against the full recompute ---------------------


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


def test_incremental_marks_equal_the_full_recompute_on_a_generated_corpus(dedup_corpus):
    """Each segment's pages were marked against the corpus of its own and earlier segments (one dedup run a segment,
    in the background: `tests/support/dedup_crawl.py::run_generated_corpus`): compare per segment."""
    got, corpus = dedup_corpus["marks"], generated_corpus()
    for number in range(1, len(SEGMENTS) + 1):
        so_far = [p for p in corpus if p["segment"] in SEGMENTS[:number]]
        expected = full_recompute_marks(so_far)
        segment = {uid(p["url"]) for p in so_far if p["segment"] == SEGMENTS[number - 1]}
        assert {u: got[u] for u in segment} == {u: expected[u] for u in segment}, number
    final = full_recompute_marks(corpus)
    assert sum(d is not None for d, _ in final.values()) >= 10
    assert sum(c is not None and c != u for u, (_, c) in final.items()) >= 10


def test_an_index_of_another_definition_is_refused_until_the_rebuild_re_keys_it(dedup_corpus):
    """The generated corpus's first segment went into an index of two blocks a key (10 rows a SimHash); dedup with the
    defaults (one block a key, classic banding: 4 rows) refused the second segment in one line naming the rebuild,
    which re-keyed every URL's row (and, asked again, had nothing to do); the marks across it are the full
    recompute's (the test above)."""
    assert "dedup_bands holds an index of blocks_per_key 2, not this config's" in dedup_corpus["refused"]
    assert "run `crawl dedup --rebuild`" in dedup_corpus["refused"] and "\n" not in dedup_corpus["refused"]
    rebuilt = dedup_corpus["rebuilt"]
    assert rebuilt.urls * 10 == dedup_corpus["wide_rows"] and rebuilt.rows == rebuilt.urls * 4
    assert dedup_corpus["rebuilt_rows"] == rebuilt.rows
    assert '"blocks_per_key": 2' in rebuilt.previous and '"blocks_per_key": 1' in rebuilt.definition
    again = dedup_corpus["rebuilt_again"]
    assert (again.rows, again.previous) == (0, rebuilt.definition) and "nothing to rebuild" in again.summary()


def test_an_unrecorded_index_is_refused_and_rebuilt_and_another_fingerprint_cannot_be(dedup_corpus):
    assert "an index whose definition was never recorded" in dedup_corpus["unrecorded"]
    unrecorded = dedup_corpus["from_unrecorded"]
    assert unrecorded.previous is None and "was not recorded" in unrecorded.summary()
    assert dedup_corpus["index_from_unrecorded"] == dedup_corpus["index"] and dedup_corpus["recorded_again"]
    assert "fingerprint 'simhash64/mmh3-x64-128/word-shingles/v0/shingle-3'" in dedup_corpus["foreign_dedup"]
    assert "keys cannot convert one into the other" in dedup_corpus["foreign_rebuild"]


@pytest.mark.parametrize("shape", ["chain", "random", "two below one"])
def test_connected_components_in_rounds_that_grow_with_the_log_of_the_size(spark, shape):
    """The segment pages' groups: every node ends in its component's least node, as the union-find rule says, and a
    chain of 200 pages (the bucket cap's window makes one of a near-identical family) takes a handful of rounds."""
    from jobs.dedup import DedupResult, connected_components

    generator = np.random.default_rng(7)
    names = [f"u{value:05d}" for value in generator.permutation(100_000)[:200]]  # ids in no order along the chain
    if shape == "chain":
        left, right = np.arange(199), np.arange(1, 200)
    elif shape == "random":  # a sparse random graph: several components, some single pairs, some loops
        left, right = generator.integers(0, 200, 180), generator.integers(0, 200, 180)
    else:  # pages each matched with two lesser ones that match nothing else: no star, though no page is pointed at
        # and points both (a group the first form of the stopping rule split in two)
        order = np.argsort(names)
        left, right = order[[2, 2, 5, 5]], order[[0, 1, 3, 4]]
    rows = [(names[a], names[b]) for a, b in zip(left.tolist(), right.tolist(), strict=True)]
    result = DedupResult("seg")
    found = connected_components(spark.createDataFrame(rows, "a string, b string"), result).collect()
    groups = dict(found)
    assert len(groups) == len(found)  # one group per node

    expected = rules.cluster_representatives(200, left, right, np.argsort(np.argsort(names)))
    in_pairs = {node for a, b in zip(left.tolist(), right.tolist(), strict=True) if a != b for node in (a, b)}
    assert groups == {names[node]: names[expected[node]] for node in sorted(in_pairs)}
    assert 1 <= result.rounds <= 2 * int(np.ceil(np.log2(200)))
