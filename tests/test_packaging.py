"""The project as users install it: every command line's `--version`, a wheel that carries the bundled config
(defaults, expectation suites, Ivy and scheduler settings) and declares its extras, and a fetch host's install
(`cyclecrawl[fetchd]` in a clean virtualenv) that runs the daemon's code with no Spark and tells a Spark command
what to install. The wheel's tests (marked `packaging`) run in CI after the suite, in `.ci/check-wheel`, with its
own check: the wheel with every extra running `crawl init`, `inject` and `generate` (Spark's JVM three times)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser as MetadataParser
from pathlib import Path

import pytest

from crawler import config
from fetchd import cli as fetchd_cli
from jobs import cli, submit

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("main", "prog"), [(cli.main, "crawl"), (fetchd_cli.main, "fetchd"),
                                            (submit.main, "crawl-submit")])
def test_every_command_line_prints_the_installed_version(main, prog, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {importlib.metadata.version('cyclecrawl')}"


def test_the_bundled_config_is_read_through_its_package():
    assert config.bundled("crawler.yaml") == config.DEFAULTS_PATH and config.DEFAULTS_PATH.is_file()
    suites = sorted(p.name for p in config.bundled("expectations").glob("*.json"))
    assert suites == sorted(p.name for p in (PROJECT / "conf" / "expectations").glob("*.json")) and len(suites) >= 10


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built as a user's pip builds it (an isolated build environment), from a copy of the
    work tree's sources: setuptools builds in place, and its build/ folder must neither appear in the work tree nor
    carry a stale file into the wheel."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    shutil.copytree(PROJECT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", "demo-crawl",
        "crawl-data", "tests", "bench"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                    str(source)], check=True, timeout=300)
    (built,) = out.glob("cyclecrawl-*.whl")
    return built


@pytest.mark.packaging
def test_the_wheel_carries_the_bundled_config_and_declares_its_extras(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        declared = MetadataParser().parsestr(archive.read(metadata).decode())
    bundled = {f"cyclecrawl_conf/{p.relative_to(PROJECT / 'conf')}" for p in (PROJECT / "conf").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert bundled <= names and "cyclecrawl_conf/crawler.yaml" in bundled
    assert "cyclecrawl_conf/expectations/urls.json" in bundled
    requires = declared.get_all("Requires-Dist")
    unconditional = {r.split(";")[0].strip() for r in requires if "extra ==" not in r}
    by_extra: dict[str, set[str]] = {}
    for requirement in requires:
        if "extra ==" in requirement:
            name, _, marker = requirement.partition(";")
            by_extra.setdefault(marker.split("==")[1].strip().strip("'\""), set()).add(name.strip())
    assert not any(r.startswith(("pyspark", "delta-spark", "great-expectations", "pytest")) for r in unconditional)
    assert any(r.startswith("pyspark==") for r in by_extra["spark"])
    assert any(r.startswith("brotli") for r in by_extra["fetchd"])
    assert {"fetchd", "spark", "all", "dev", "airflow"} <= set(declared.get_all("Provides-Extra"))


@pytest.mark.packaging
def test_a_fetch_host_install_runs_the_daemon_without_spark(wheel, tmp_path):
    """A clean virtualenv outside the work tree with `cyclecrawl[fetchd]` only: the daemon's modules import, the
    bundled defaults come from the installed package, `fetchd --version` answers, pyspark is absent, and a Spark
    command says in one line what to install (exit 2), before trying to start anything."""
    venv = tmp_path / "fetch-host"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[fetchd]"], check=True,
                   timeout=600)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CRAWL_DEFAULTS")}
    probe = ("import importlib.util, fetchd.commands, fetchd.daemon, crawler.config as c; "
             "print(importlib.util.find_spec('pyspark') is None, c.DEFAULTS_PATH)")
    shown = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=clean, capture_output=True, text=True,
                           check=True, timeout=120).stdout.split()
    assert shown[0] == "True" and Path(shown[1]).is_relative_to(venv) and Path(shown[1]).is_file()
    version = subprocess.run([str(venv / "bin" / "fetchd"), "--version"], cwd=tmp_path, env=clean,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == f"fetchd {importlib.metadata.version('cyclecrawl')}"
    refused = subprocess.run([str(venv / "bin" / "crawl"), "init", "--root", str(tmp_path / "root")], cwd=tmp_path,
                             env=clean, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "pip install 'cyclecrawl[all]'" in refused.stderr and not (tmp_path / "root").exists()
