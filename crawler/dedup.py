"""Duplicate rules for the dedup step: one representative per identical payload, near-duplicate clusters by SimHash.

Both kinds pick the same stable representative: the earliest fetched page, then the lowest url_id, so the answer
does not depend on input order or partitioning. Nothing here drops a page: dedup only marks duplicates.

Near duplicates (Manku, Jain, Das Sarma, "Detecting near-duplicates for web crawling", WWW 2007):

* Keys (Manku's permuted tables, in the form of masks). With k = the largest Hamming distance kept and r =
  `blocks_per_key`, the 64 SimHash bits are split into k + r blocks. Two hashes within distance k differ in at
  most k blocks, so (pigeonhole) at least r blocks are identical in both: one index key per choice of r blocks
  (C(k + r, r) keys, each the SimHash's bits under the chosen blocks' mask) and grouping by (key index, key value)
  finds every pair within distance k. Candidates are then verified by `hamming <= k`, so no pair further apart is
  ever kept. r = 1, the default, is classic banding (k + 1 keys of 64 / (k + 1) bits); r = 2 gives wider keys
  (10 keys of ~26 bits at k = 3) at the cost of 2.5 times the index rows.
* Bucket cap. A band value shared by very many documents (boilerplate-only pages, and every page with no text,
  whose SimHash is 0) would need m² comparisons. Members of one bucket are sorted by (SimHash, representative
  order); rows with identical SimHashes are chained to each other at O(m) (distance 0 is always a match), and
  each distinct SimHash is compared only with its next `max_bucket_size - 1` distinct neighbours: a bucket of no
  more distinct values than the cap is compared completely, a larger one costs O(m · cap). Capped buckets and
  the comparisons skipped are counted, never silent.
* Clusters are connected components (union-find) of the verified pairs. They are transitive: A~B and B~C put A
  and C together even when hamming(A, C) > k, so a cluster's diameter can reach k times its chain length. That is
  accepted because a duplicate mark only lowers crawl priority (outlinks are still followed, pages are kept) and
  templated near duplicates form tight stars around their original rather than long chains; the tests measure
  the largest distance from any member to its representative.
* What k means: an unweighted SimHash moves 64·θ/π bits on average for an angle θ between the pages' shingle
  vectors, so in a 500-word page one edited word already moves it ~2 bits and a changed nav line ~5. k = 3 keeps
  edits of a word or two; tests/test_dedup.py measures recall 0.53 at k = 3 and 0.97 at k = 7 on its generated
  corpus, precision 1.0 at every k up to 7 (unrelated pages sit ~32 bits apart).
* Scale: a random key of w bits puts n / 2^w documents in a bucket, so a probe's comparisons grow as n / 2^w per key
  and page. With r = 1 at k = 3 (16-bit keys) a bucket holds 153 rows at 10 M documents and a segment of 100 k pages
  hits most buckets: the comparisons grow with the corpus. With r = 2 (26-bit keys, 10 tables) a bucket holds < 1
  row at 10 M, so the comparisons follow the segment; but the index holds C(k + r, r) rows per document instead of
  k + 1, and dedup's MERGEs into it read the whole table (bench/README.md: at 2 M documents r = 2 cost more than
  r = 1, the MERGEs' reads outgrowing the comparisons saved). The functions take numpy arrays of one key's rows, so a
  Spark job calls them per partition (applyInPandas over rows partitioned by (key index, key value): every row of a
  bucket in one call).

The incremental rule (what `crawl dedup` runs each cycle, on the segment's pages and two Delta indexes: content
hash -> representative, and SimHash band -> (url_id, SimHash, cluster); `jobs/dedup.py`):

* A URL is in the indexes with its current page while that page is a document with a content hash (SimHash 0 or
  null: only in the hash index). It leaves when a later fetch finds it gone or redirected (`leaves_index`), or its
  new page is no document (a parse error, a sitemap). A page whose content changed replaces its rows.
* Exact: a hash's representative is the first of its current holders in representative order, where "fetched"
  is when the URL was first fetched with that hash (kept while it keeps the hash). That is the full recompute's
  answer, with one difference by design: a URL that changes away from a hash and back starts a new `seen`.
  When a representative leaves or changes, the next holder takes over at once (its rows are relabelled).
* Near: a new page takes the cluster of the earliest cluster (by its representative's place in the order) among
  the index rows it matches (same band key, Hamming <= k); pages of one segment that match each other share the
  earliest cluster any of them reached, or form a new cluster represented by their earliest member. Differences
  from the full recompute, by design: (1) a representative stays stable once chosen — a page that matches two
  existing clusters joins the earlier one and the two are not merged retroactively; (2) when a representative
  with members leaves or its SimHash changes, its members fall back to themselves and regroup as they are
  refetched (their index rows are relabelled; their pages' marks, as always, keep their own segment's verdict).
* Marks and priority are as before: only the segment's pages are marked; a URL's priority is lowered when its
  verdict becomes "duplicate" against the verdict its previous page was marked with, restored when it stops
  being one (also when the URL leaves the index: a gone page is no duplicate).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from crawler.fingerprints import SIMHASH_DEFINITION, tokens
from crawler.settings import Settings
from crawler.status import FetchOutcome, is_gone, is_gone_sql

SIMHASH_BITS = 64
DEFAULT_MAX_HAMMING = 3
DEFAULT_MAX_BUCKET_SIZE = 1000
# Block widths shrink as k grows; below 8 bits a one-block key's bucket holds n / 256 documents or more, which no
# corpus worth deduplicating can afford, so the configuration stops at k = 7.
MAX_SUPPORTED_HAMMING = 7
DEFAULT_BLOCKS_PER_KEY = 1
MAX_BLOCKS_PER_KEY = 3
# Index rows per SimHash at most (k = 7 with 3 blocks a key would make 120): the config refuses more.
MAX_INDEX_KEYS = 64
_MASK_ALL = (1 << SIMHASH_BITS) - 1
REBUILD_COMMAND = "crawl dedup --rebuild"


def normalize_text(text: str) -> str:
    """Lowercased words joined by single spaces: the text `fingerprints.simhash` actually sees, so
    `simhash(normalize_text(t)) == simhash(t)` and two texts that normalize alike hash alike."""
    return " ".join(tokens(text))


def representative_of(url_id: str, duplicate_of: str | None, near_duplicate_cluster: str | None) -> str | None:
    """The duplicate verdict on a page's marks: the URL whose page it duplicates — its exact representative, else
    its near-duplicate cluster's representative when that is another URL — or None when it is no duplicate."""
    if duplicate_of is not None:
        return duplicate_of
    if near_duplicate_cluster is not None and near_duplicate_cluster != url_id:
        return near_duplicate_cluster
    return None


def representative_of_sql(url_id: str, duplicate_of: str, near_duplicate_cluster: str) -> str:
    """`representative_of` over three columns; `... is not null` is the verdict "is a duplicate"."""
    return (f"coalesce({duplicate_of}, case when {near_duplicate_cluster} <> {url_id}"
            f" then {near_duplicate_cluster} end)")


def leaves_index(outcome: str, status_code: int | None) -> bool:
    """A fetch result after which the URL holds no document for dedup: the page is gone, or it redirects."""
    return outcome == FetchOutcome.REDIRECT or is_gone(outcome, status_code)


def leaves_index_sql(outcome: str, status_code: str) -> str:
    """`leaves_index` over the columns `outcome` and `status_code`."""
    return f"({outcome} = '{FetchOutcome.REDIRECT.value}' or {is_gone_sql(outcome, status_code)})"


def _order_key(row: Mapping[str, Any]) -> tuple[bool, Any, str]:
    fetched = row.get("fetched_at")
    # A row without a fetch time sorts after every fetched one (and None is never compared with a timestamp).
    return (fetched is None, fetched if fetched is not None else 0, row["url_id"])


def exact_representative(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """content_hash -> url_id of its representative: earliest `fetched_at`, then lowest `url_id`.

    Rows are mappings with `url_id`, `fetched_at` and `content_hash`; rows without a content hash are skipped.
    The result does not depend on row order.
    """
    best: dict[str, tuple[bool, Any, str]] = {}
    for row in rows:
        digest = row.get("content_hash")
        if digest is None:
            continue
        key = _order_key(row)
        if digest not in best or key < best[digest]:
            best[digest] = key
    return {digest: key[2] for digest, key in best.items()}


def block_layout(max_hamming: int, blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY) -> tuple[tuple[int, int], ...]:
    """(shift, width) of each of the max_hamming + blocks_per_key blocks, widths as equal as possible, covering all
    64 bits."""
    if not 0 <= max_hamming <= MAX_SUPPORTED_HAMMING:
        raise ValueError(f"max_hamming must be between 0 and {MAX_SUPPORTED_HAMMING}, got {max_hamming}")
    if not 1 <= blocks_per_key <= MAX_BLOCKS_PER_KEY:
        raise ValueError(f"blocks_per_key must be between 1 and {MAX_BLOCKS_PER_KEY}, got {blocks_per_key}")
    blocks = max_hamming + blocks_per_key
    widths = [SIMHASH_BITS // blocks + (1 if i < SIMHASH_BITS % blocks else 0) for i in range(blocks)]
    shifts = np.cumsum([0, *widths[:-1]]).tolist()
    return tuple(zip(shifts, widths, strict=True))


def index_key_count(max_hamming: int, blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY) -> int:
    """How many keys (index rows) a SimHash has: one per choice of blocks_per_key of the k + blocks_per_key blocks."""
    return math.comb(max_hamming + blocks_per_key, blocks_per_key)


def key_masks(max_hamming: int, blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY) -> tuple[int, ...]:
    """The bits of each index key, as a 64-bit mask: the union of one choice of `blocks_per_key` blocks, in
    `itertools.combinations` order (key b is the `band` column's value b). A key is the SimHash's bits under its
    mask, left in place."""
    blocks = [((1 << width) - 1) << shift for shift, width in block_layout(max_hamming, blocks_per_key)]
    masks = tuple(functools.reduce(operator.or_, chosen) for chosen in itertools.combinations(blocks, blocks_per_key))
    if len(masks) > MAX_INDEX_KEYS:
        raise ValueError(f"max_hamming {max_hamming} with blocks_per_key {blocks_per_key} makes {len(masks)} index "
                         f"keys a SimHash, more than {MAX_INDEX_KEYS}")
    return masks


def band_values_sql(simhash: str, max_hamming: int = DEFAULT_MAX_HAMMING,
                    blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY) -> list[str]:
    """`band_values` over the bigint column `simhash`: one expression per index key, its value as a bigint (the
    masked bits; a mask of all 64 bits, k = 0 with one table, is the SimHash itself)."""
    return [simhash if mask == _MASK_ALL else f"({simhash} & {_signed(mask)}L)"
            for mask in key_masks(max_hamming, blocks_per_key)]


def _signed(value: int) -> int:
    return value - (1 << SIMHASH_BITS) if value >= 1 << (SIMHASH_BITS - 1) else value


def _unsigned(simhashes: Any) -> np.ndarray:
    """SimHashes as uint64 (the tables store them as signed int64; the bits are what matter)."""
    return np.asarray(simhashes, dtype=np.int64).view(np.uint64)


def band_values(simhashes: Any, max_hamming: int = DEFAULT_MAX_HAMMING,
                blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY) -> np.ndarray:
    """(n, index_key_count) uint64 array: each SimHash's value under each key's mask; column b is key b."""
    hashes = _unsigned(simhashes)
    masks = np.array(key_masks(max_hamming, blocks_per_key), dtype=np.uint64)
    return hashes[:, None] & masks[None, :]


@dataclass(frozen=True)
class IndexDefinition:
    """What the rows of `dedup_bands` are: SimHashes of one fingerprint definition, keyed by one key layout. A
    crawl records its index's definition beside the index (`jobs.dedup`); rows of two definitions never mix, so
    a config that differs from the recorded one is refused until `crawl dedup --rebuild` re-keys the index."""

    fingerprint: str
    max_hamming: int
    blocks_per_key: int

    @classmethod
    def from_config(cls, conf: Settings) -> IndexDefinition:
        """The config's: the SimHash's definition with its shingle size (`parse.simhash_shingle`), and the keys'."""
        fingerprint = f"{SIMHASH_DEFINITION}/shingle-{int(conf.parse.simhash_shingle)}"
        return cls(fingerprint, int(conf.dedup.max_hamming), int(conf.dedup.blocks_per_key))

    def key_count(self) -> int:
        """Index rows a SimHash has (`index_key_count`)."""
        return index_key_count(self.max_hamming, self.blocks_per_key)

    def identity(self) -> str:
        """What the index's record holds: a JSON object of the three."""
        return json.dumps({"fingerprint": self.fingerprint, "max_hamming": self.max_hamming,
                           "blocks_per_key": self.blocks_per_key}, sort_keys=True)

    @classmethod
    def parse(cls, identity: str) -> IndexDefinition:
        fields = json.loads(identity)
        return cls(str(fields["fingerprint"]), int(fields["max_hamming"]), int(fields["blocks_per_key"]))

    def refusal(self, recorded: str | None, has_rows: bool) -> str | None:
        """Why this config may not add to an index recorded as `recorded` (None: not recorded, e.g. made before
        definitions were recorded); None when it may (the same definition, or an empty index)."""
        if recorded == self.identity() or (recorded is None and not has_rows):
            return None
        if recorded is None:
            held = "an index whose definition was never recorded (made before definitions were)"
        else:
            old = IndexDefinition.parse(recorded)
            said = [f"{name} {getattr(old, name)!r}" for name in ("fingerprint", "max_hamming", "blocks_per_key")
                    if getattr(old, name) != getattr(self, name)]
            held = f"an index of {', '.join(said)}"
        mine = ", ".join(f"{name} {getattr(self, name)!r}" for name in ("fingerprint", "max_hamming", "blocks_per_key"))
        return (f"dedup_bands holds {held}, not this config's ({mine}): run `{REBUILD_COMMAND}` to rebuild it "
                "under this config, or set the config back")

def representative_rank(url_ids: Any, fetched_at: Any) -> np.ndarray:
    """Rank of each document in representative order (0 = earliest fetched, then lowest url_id).

    `fetched_at` is int64 (e.g. epoch microseconds; Spark timestamps arrive as datetime64 and are converted).
    """
    ids = np.asarray(url_ids, dtype=str)
    times = np.asarray(fetched_at)
    if np.issubdtype(times.dtype, np.datetime64):
        times = times.astype("datetime64[us]").astype(np.int64)
    order = np.lexsort((ids, times.astype(np.int64)))
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0], dtype=np.int64)
    return rank


@dataclass(frozen=True)
class BandPairs:
    """Verified near-duplicate pairs found in one band (indices into the input arrays), and what the cap cost."""

    left: np.ndarray
    right: np.ndarray
    capped_buckets: int       # buckets larger than max_bucket_size (compared only within the window)
    skipped_comparisons: int  # candidate pairs in those buckets that were never compared


def band_pairs(
    keys: Any,
    simhashes: Any,
    rank: Any,
    max_hamming: int = DEFAULT_MAX_HAMMING,
    max_bucket_size: int = DEFAULT_MAX_BUCKET_SIZE,
) -> BandPairs:
    """Pairs (i, j) sharing a band key whose SimHashes are within `max_hamming` bits, for the rows of one band.

    `keys` is the band value of each row (rows may hold many band values, e.g. one Spark partition of a band),
    `rank` the representative order from `representative_rank`, used only to make the sort, and so the pairs
    returned, independent of input order. Rows with identical SimHashes are chained; each distinct SimHash is
    compared with at most `max_bucket_size - 1` following distinct ones of its bucket in SimHash order.
    """
    if max_bucket_size < 2:
        raise ValueError("max_bucket_size must be >= 2")
    keys = np.asarray(keys, dtype=np.uint64)
    hashes = _unsigned(simhashes)
    order = np.lexsort((np.asarray(rank), hashes, keys))
    sorted_keys, sorted_hashes = keys[order], hashes[order]
    # A row repeating its predecessor's SimHash is linked to it and compared with nothing else: its run's first
    # row stands for the whole run, so a thousand empty pages cost a chain, not a window of pairs each.
    same = (sorted_keys[1:] == sorted_keys[:-1]) & (sorted_hashes[1:] == sorted_hashes[:-1])
    repeat = np.r_[False, same][: order.shape[0]]
    repeats = np.flatnonzero(repeat)
    lefts, rights = [order[repeats - 1]], [order[repeats]]
    heads = np.flatnonzero(~repeat)
    order, sorted_keys, sorted_hashes = order[heads], sorted_keys[heads], sorted_hashes[heads]
    # Bucket boundaries among the distinct SimHashes, and how many rows of its bucket follow each row.
    n = order.shape[0]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]][:n])
    sizes = np.diff(np.r_[starts, n])
    remaining = np.repeat(starts + sizes, sizes) - np.arange(n) - 1
    capped = sizes[sizes > max_bucket_size]
    window = max_bucket_size - 1
    # Of m(m-1)/2 pairs a capped bucket compares `window` per row, minus the window's overhang at the end.
    skipped = int((capped * (capped - 1) // 2 - window * capped).sum() + window * max_bucket_size // 2 * capped.size)
    active = np.flatnonzero(remaining > 0)
    for offset in range(1, max_bucket_size):
        active = active[remaining[active] >= offset]
        if active.size == 0:
            break
        partners = active + offset
        near = np.bitwise_count(sorted_hashes[active] ^ sorted_hashes[partners]) <= max_hamming
        lefts.append(order[active[near]])
        rights.append(order[partners[near]])
    return BandPairs(
        left=np.concatenate(lefts),
        right=np.concatenate(rights),
        capped_buckets=int(capped.size),
        skipped_comparisons=skipped,
    )


def cluster_representatives(n: int, left: Any, right: Any, rank: Any) -> np.ndarray:
    """Index of each document's cluster representative: connected components of the pairs (union-find), each
    represented by its member of lowest `rank`. A document in no pair represents itself."""
    rank = np.asarray(rank)
    parent = list(range(n))

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b in zip(np.asarray(left).tolist(), np.asarray(right).tolist(), strict=True):
        root_a, root_b = root(a), root(b)
        if root_a == root_b:
            continue
        # The root is always the lowest-ranked member seen so far, so the final root is the representative.
        if rank[root_b] < rank[root_a]:
            root_a, root_b = root_b, root_a
        parent[root_b] = root_a
    return np.fromiter((root(node) for node in range(n)), dtype=np.int64, count=n)


@dataclass(frozen=True)
class NearDuplicates:
    """Result of `near_duplicate_clusters`: per-document representative index and what was found and skipped."""

    representative: np.ndarray  # index (into the inputs) of each document's cluster representative
    pairs: int                  # verified pairs over all bands (a pair found in two bands counts twice)
    capped_buckets: int
    skipped_comparisons: int

    def clusters(self) -> int:
        """Clusters with more than one member."""
        members = np.bincount(self.representative, minlength=self.representative.shape[0])
        return int((members > 1).sum())


def near_duplicate_clusters(
    url_ids: Any,
    fetched_at: Any,
    simhashes: Any,
    max_hamming: int = DEFAULT_MAX_HAMMING,
    max_bucket_size: int = DEFAULT_MAX_BUCKET_SIZE,
    blocks_per_key: int = DEFAULT_BLOCKS_PER_KEY,
) -> NearDuplicates:
    """Near-duplicate clusters of a whole set of documents: every band, verified pairs, union-find.

    Pass only documents that have a SimHash (pages with no text hash to 0 and all cluster together).
    """
    hashes = np.asarray(simhashes, dtype=np.int64)
    rank = representative_rank(url_ids, fetched_at)
    keys = band_values(hashes, max_hamming, blocks_per_key)
    found = [band_pairs(keys[:, band], hashes, rank, max_hamming, max_bucket_size) for band in range(keys.shape[1])]
    left = np.concatenate([pairs.left for pairs in found])
    right = np.concatenate([pairs.right for pairs in found])
    return NearDuplicates(
        representative=cluster_representatives(hashes.shape[0], left, right, rank),
        pairs=int(left.shape[0]),
        capped_buckets=sum(pairs.capped_buckets for pairs in found),
        skipped_comparisons=sum(pairs.skipped_comparisons for pairs in found),
    )
