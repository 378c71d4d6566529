"""Near-duplicate clustering benchmark: time to cluster 1 M synthetic SimHashes with crawler.dedup.

Run on demand, never as a test:

    .venv/bin/python -m bench.dedup [--docs 1000000] [--planted 0.1] [--empty 20000] [--max-hamming 3]
                                    [--max-bucket-size 1000] [--seed 1]

Synthetic input: uniformly random signed 64-bit SimHashes; a `--planted` fraction of them replaced by copies of
other rows with 0..max_hamming+2 random bits flipped (so some copies are within k and some just outside); and
`--empty` rows of SimHash 0 (pages with no text), one huge bucket in every band that the cap must handle.
url_ids are random 32-hex strings and fetch times random minutes, as in `pages`.

It times the same pure functions the Spark dedup job calls per band (representative order, band values,
band_pairs per band, union-find), prints the figures, and checks that every planted copy within k of its source
ended up in its source's cluster (the pigeonhole guarantee of k + 1 bands; only a capped bucket can break it).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from crawler import dedup


def synthetic(docs: int, planted: float, empty: int, max_hamming: int, seed: int):
    """(url_ids, fetched_at, simhashes, copy rows, their source rows)."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(-(2**63), 2**63 - 1, size=docs, dtype=np.int64, endpoint=True)
    copies = rng.choice(np.arange(empty, docs), size=int(docs * planted), replace=False)
    sources = rng.integers(empty, docs, size=copies.shape[0])
    flip_counts = rng.integers(0, max_hamming + 3, size=copies.shape[0])
    flips = np.zeros(copies.shape[0], dtype=np.uint64)
    for step in range(max_hamming + 2):
        bits = rng.integers(0, 64, size=copies.shape[0]).astype(np.uint64)
        flips |= np.where(flip_counts > step, np.uint64(1) << bits, np.uint64(0))
    hashes[copies] = (hashes[sources].view(np.uint64) ^ flips).view(np.int64)
    hashes[:empty] = 0
    url_ids = np.array([f"{value:032x}" for value in rng.integers(0, 2**63, size=(docs,), dtype=np.int64)])
    fetched_at = rng.integers(0, 10_000, size=docs).astype(np.int64) * 60_000_000
    return url_ids, fetched_at, hashes, copies, sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--planted", type=float, default=0.1, help="fraction of rows that are near copies")
    parser.add_argument("--empty", type=int, default=20_000, help="rows with SimHash 0 (no text)")
    parser.add_argument("--max-hamming", type=int, default=dedup.DEFAULT_MAX_HAMMING)
    parser.add_argument("--max-bucket-size", type=int, default=dedup.DEFAULT_MAX_BUCKET_SIZE)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 0 <= args.empty < args.docs * (1 - args.planted):
        room = args.docs * (1 - args.planted)
        parser.error(f"--empty must leave room for the planted copies: 0 <= empty < {room:,.0f}")
    k = args.max_hamming

    url_ids, fetched_at, hashes, copies, sources = synthetic(args.docs, args.planted, args.empty, k, args.seed)
    print(f"{args.docs:,} SimHashes: {copies.shape[0]:,} planted copies (0-{k + 2} bits flipped), "
          f"{args.empty:,} empty pages; k={k}, {k + 1} bands, max_bucket_size={args.max_bucket_size}")

    timings: dict[str, float] = {}
    started = time.perf_counter()
    rank = dedup.representative_rank(url_ids, fetched_at)
    timings["representative order"] = time.perf_counter() - started
    mark = time.perf_counter()
    keys = dedup.band_values(hashes, k)
    timings["band values"] = time.perf_counter() - mark
    lefts, rights, capped, skipped = [], [], 0, 0
    for band in range(k + 1):
        mark = time.perf_counter()
        pairs = dedup.band_pairs(keys[:, band], hashes, rank, k, args.max_bucket_size)
        timings[f"band {band} pairs"] = time.perf_counter() - mark
        lefts.append(pairs.left)
        rights.append(pairs.right)
        capped += pairs.capped_buckets
        skipped += pairs.skipped_comparisons
    left, right = np.concatenate(lefts), np.concatenate(rights)
    mark = time.perf_counter()
    representative = dedup.cluster_representatives(hashes.shape[0], left, right, rank)
    timings["union-find"] = time.perf_counter() - mark
    total = time.perf_counter() - started

    for name, seconds in timings.items():
        print(f"  {name:<22} {seconds:8.2f} s")
    print(f"  {'total':<22} {total:8.2f} s   ({args.docs / total:,.0f} SimHashes/s)")

    members = np.bincount(representative, minlength=hashes.shape[0])
    distance = np.bitwise_count(hashes[copies].view(np.uint64) ^ hashes[sources].view(np.uint64))
    within = distance <= k
    found = representative[copies[within]] == representative[sources[within]]
    reps = representative[np.arange(hashes.shape[0])]
    worst = int(np.bitwise_count(hashes.view(np.uint64) ^ hashes[reps].view(np.uint64)).max())
    print(f"verified pairs {left.shape[0]:,}; clusters of 2+ {int((members > 1).sum()):,}, "
          f"largest {int(members.max()):,}; capped buckets {capped}, comparisons skipped {skipped:,}")
    print(f"planted copies within k found in their source's cluster: {int(found.sum()):,} / {int(within.sum()):,}"
          f" ({'ok' if found.all() else 'MISSED'}); largest member-to-representative distance {worst}")


if __name__ == "__main__":
    main()
