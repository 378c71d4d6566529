"""Near-duplicate groups in Spark: dedup's connected components against min-label propagation, side by side.

Run on demand, never as a test:

    .venv/bin/python -m bench.components [--sizes 57,1000,20000] [--master local[2]] [--shuffle-partitions 8]

dedup joins the segment pages that matched each other into groups: every page of a connected group takes the
group's earliest label. It did so by min-label propagation (the reference here: a Spark job a round, a round per
hop of the group's longest chain) and now by `jobs.dedup.connected_components` (large-star / small-star: rounds
that grow with the logarithm of a group's size). Both run on one SparkSession over the same graphs, one after the
other, each timed (wall, whole-machine CPU from /proc/stat: Spark's JVM and everything else) and their answers
compared. The graphs, per size n:

* `chain`: n pages, each matched only with the next (what the bucket cap's window makes of a family of n
  near-identical pages: their pairs are only between neighbours in SimHash order); the propagation's worst case.
* `families`: n pages in families of 2 to 20, each family's pages all matched with each other (templated pages).
* `random`: n pages and n random pairs among them (components of every shape, loops included).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.cycle import machine_cpu_seconds, size
from crawler import config as config_mod
from jobs.base import spark_session
from jobs.dedup import DedupResult, connected_components

GraphBuilder = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]


def chain(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    return order[:-1], order[1:]


def families(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    order, left, right, start = rng.permutation(n), [], [], 0
    while start < n:
        members = order[start:start + int(rng.integers(2, 21))]
        pairs = np.array([(a, b) for i, a in enumerate(members) for b in members[i + 1:]]).reshape(-1, 2)
        left.append(pairs[:, 0])
        right.append(pairs[:, 1])
        start += len(members)
    return np.concatenate(left), np.concatenate(right)


def random_pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, n, n), rng.integers(0, n, n)


GRAPHS: dict[str, GraphBuilder] = {"chain": chain, "families": families, "random": random_pairs}


def propagated(edges: DataFrame, max_rounds: int) -> tuple[DataFrame | None, int]:
    """The reference: min-label propagation over the pairs until no label moves (dedup's former `_propagate`,
    each page's own id as its label). Returns (node, group) and the rounds; None after `max_rounds` rounds."""
    mutual = edges.select(F.col("a").alias("node"), F.col("b").alias("other")).unionByName(
        edges.select(F.col("b").alias("node"), F.col("a").alias("other"))).where("node != other").distinct()
    labels = mutual.select("node").distinct().withColumn("label", F.col("node")).localCheckpoint()
    mutual = mutual.localCheckpoint()
    for rounds in range(1, max_rounds + 1):
        offered = mutual.join(labels.withColumnRenamed("node", "other").withColumnRenamed("label", "offer"), "other")
        updated = (
            labels.join(offered.groupBy("node").agg(F.min("offer").alias("offer")), "node", "left")
            .select("node", F.least("offer", "label").alias("label"), (F.col("offer") < F.col("label")).alias("moved"))
            .localCheckpoint()
        )
        if not updated.where("moved").limit(1).count():
            return updated.select("node", F.col("label").alias("group")), rounds
        labels = updated.drop("moved")
    return None, max_rounds


def timed(action: Callable[[], tuple[dict | None, int]]) -> tuple[dict | None, int, float, float]:
    wall, cpu = time.monotonic(), machine_cpu_seconds()
    groups, rounds = action()
    return groups, rounds, time.monotonic() - wall, machine_cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="57,1000,20000", help="comma-separated page counts per graph")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--max-rounds", type=int, default=200,
                        help="the reference stops after this many rounds (its figures are then lower bounds, '>')")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    conf = config_mod.load().with_overrides({"spark.master": args.master, "spark.log_level": "ERROR",
                                             "spark.shuffle_partitions": args.shuffle_partitions})
    spark: SparkSession = spark_session(conf, app_name="cyclecrawl-bench-components")
    try:
        spark.range(1).count()  # the JVM's start is no part of either figure
        print(f"{'graph':<10}{'pages':>8}{'pairs':>8} | {'propagation':>26} | {'connected components':>26} | same")
        print(f"{'':<26} | {'rounds':>8}{'wall s':>9}{'CPU s':>9} | {'rounds':>8}{'wall s':>9}{'CPU s':>9} |")
        for n in map(size, args.sizes.split(",")):
            for name, build in GRAPHS.items():
                left, right = build(np.random.default_rng(args.seed), n)
                names = np.array([f"{value:032x}" for value in np.random.default_rng(n).permutation(10 * n)[:n]])
                edges = spark.createDataFrame(list(zip(names[left].tolist(), names[right].tolist(), strict=True)),
                                              "a string, b string").localCheckpoint()

                def reference(edges: DataFrame = edges) -> tuple[dict | None, int]:
                    groups, rounds = propagated(edges, args.max_rounds)
                    return (None if groups is None else dict(groups.collect())), rounds

                def ours(edges: DataFrame = edges) -> tuple[dict, int]:
                    result = DedupResult("bench")
                    return dict(connected_components(edges, result).collect()), result.rounds

                old = timed(reference)
                new = timed(ours)
                stopped = old[0] is None  # the reference's figures are then lower bounds
                same = "-" if stopped else "yes" if old[0] == new[0] else "NO"
                rounds = f">{old[1]}" if stopped else str(old[1])
                print(f"{name:<10}{n:>8,}{len(left):>8,} | {rounds:>8}{old[2]:>9.1f}{old[3]:>9.1f} | "
                      f"{new[1]:>8}{new[2]:>9.1f}{new[3]:>9.1f} | {same}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
