"""The import graph `docs/architecture.md` describes, checked on the source: one-way, and each package only
with the libraries its row allows (`crawler/` no Spark or network, `fetchd/` no Spark, the site farm apart from
the daemon, Spark jobs that do not import each other sideways), and no module of a package importing itself back
through others (no import circle, not even one made only for type checking)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"crawler", "delta_tables", "jobs", "fetchd", "sitefarm", "bench", "airflow_dags", "tests"}
SPARK = {"pyspark", "delta", "deltalake"}
NETWORK = {"aiohttp", "yarl", "boto3", "botocore", "socket", "asyncio", "requests", "urllib.request", "http.client"}

# Package -> modules (or their prefixes) it must never import.
FORBIDDEN = {
    "crawler": SPARK | NETWORK | PROJECT - {"crawler"},
    "delta_tables": NETWORK | PROJECT - {"crawler", "delta_tables"},
    "fetchd": SPARK | PROJECT - {"crawler", "fetchd"},
    "sitefarm": SPARK | PROJECT - {"crawler", "sitefarm"},
    "jobs": {"bench", "tests", "airflow_dags"},
}
# Jobs modules that may import the daemon's package: the commands that run it in-process, close-segment, which
# writes the segment's marker the daemons obey, and generate, which asks `fetchd.progress` (the daemons' own
# listing of done buckets) whether an open segment's fetch is over.
JOBS_USING_FETCHD = {"fetch": {"fetchd"}, "cycle": {"fetchd"}, "demo": {"fetchd"}, "run": {"fetchd"},
                     "close_segment": {"fetchd.progress"}, "generate": {"fetchd.progress"}}
JOBS_USING_SITEFARM = {"demo"}
STEPS = {"inject", "generate", "parse", "dedup", "update", "index", "maintain", "validate", "rebucket", "discover",
         "update_hosts", "dedup_index", "cycle_metrics"}
# What a step may import of `jobs` beyond its base (`base.py`, `storage.py`): its own halves, and the figures.
STEP_PARTS = {
    "dedup": {"dedup_index"},
    "update": {"discover", "update_hosts", "cycle_metrics"},
    "update_hosts": {"discover"},
    "generate": {"cycle_metrics"},
}


def imported(path: Path) -> set[str]:
    """Every module a file imports (absolute imports; `from a.b import c` gives `a.b` and `a.b.c`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_each_package_imports_only_what_its_layer_allows(package):
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sources(package) for name in imported(path)
        if within(name, FORBIDDEN[package])
        and not (package == "jobs" and path.stem in JOBS_USING_FETCHD and within(name, JOBS_USING_FETCHD[path.stem]))
    }
    assert not found, sorted(found)


def test_only_the_commands_and_generate_reach_the_daemon_and_only_the_demo_the_site_farm():
    found = set()
    for path in sources("jobs"):
        for name in imported(path):
            if within(name, {"fetchd"}) and not within(name, JOBS_USING_FETCHD.get(path.stem, set())):
                found.add(f"{path.name} imports {name}")
            if within(name, {"sitefarm"}) and path.stem not in JOBS_USING_SITEFARM:
                found.add(f"{path.name} imports {name}")
    assert not found, sorted(found)


def test_steps_do_not_import_each_other_sideways():
    found = set()
    for path in sources("jobs"):
        if path.stem not in STEPS:
            continue
        allowed = {"base", "storage"} | STEP_PARTS.get(path.stem, set())
        for name in imported(path):
            parts = name.split(".")
            if parts[0] == "jobs" and len(parts) > 1 and parts[1] in STEPS | {"cli", "cycle", "demo", "report"} \
                    and parts[1] not in allowed:
                found.add(f"{path.name} imports jobs.{parts[1]}")
    assert not found, sorted(found)


BENCH_TESTS = {"tests/test_sim.py", "tests/test_bench_freshness.py"}  # the simulator's and a benchmark judge's


def test_nothing_but_the_benchmark_tests_imports_the_benchmarks_and_no_test_imports_another():
    found = set()
    for package in sorted(PROJECT - {"bench"}):
        for path in sources(package):
            for name in imported(path):
                if within(name, {"bench"}) and path.relative_to(ROOT).as_posix() not in BENCH_TESTS:
                    found.add(f"{path.relative_to(ROOT)} imports {name}")
                if name.startswith("tests.test_"):
                    found.add(f"{path.relative_to(ROOT)} imports {name}")
    assert not found, sorted(found)


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in the file: at the top, inside functions,
    under `if TYPE_CHECKING:`). A package's `__init__.py` is the package's own name; an imported name is the
    longest module of the package it starts with (`from a.b import c` is module `a.b` unless `a/b/c.py` exists)."""
    paths = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
             for path in sources(package)}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for name in imported(path):
            parts = name.split(".")
            owner = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in paths),
                         None)
            if owner is not None and owner != module:
                targets.add(owner)
        graph[module] = targets
    return graph


def import_circle(graph: dict[str, set[str]]) -> str | None:
    """A circle of modules that import each other, as `a -> b -> a` (a imports b), or None (graphlib finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        # graphlib lists each module before one that imports it: read backwards, each imports the next.
        return " -> ".join(reversed(exc.args[1]))
    return None


@pytest.mark.parametrize("package", sorted(PROJECT))
def test_no_import_circle_inside_a_package(package):
    circle = import_circle(module_graph(package))
    assert circle is None, circle


def test_the_checks_see_a_violation():
    """The walker finds imports inside functions too (the daemon's commands import lazily), and the circle finder
    finds a circle through several modules but not a one-way chain."""
    assert "fetchd.commands" in imported(ROOT / "jobs" / "cycle.py")
    assert within("fetchd.progress.segment_progress", JOBS_USING_FETCHD["generate"])
    assert not within("fetchd.commands", JOBS_USING_FETCHD["generate"])
    circle = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    found = import_circle(circle)
    assert found is not None and found.split(" -> ") in (
        ["p.a", "p.b", "p.c", "p.a"], ["p.b", "p.c", "p.a", "p.b"], ["p.c", "p.a", "p.b", "p.c"])
    assert import_circle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set()}) is None
    assert "fetchd.daemon" in module_graph("fetchd")["fetchd.commands"]
