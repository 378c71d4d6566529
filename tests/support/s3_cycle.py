"""The one whole crawl cycle the suite runs on an s3:// root (moto's server), in a child process.

The jobs on S3 run in one child process (`crawl` commands sharing one JVM): a session with hadoop-aws and the AWS
SDK bundle on its classpath, bound to this server's endpoint, is a different session from the suite's shared local
one, and Spark allows one per process. All its work is in that child, so the session starts it in the background
(tests/conftest.py) and `tests/test_s3_jobs.py` reads what it left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from crawler.config import Config
from jobs.demo import demo_config
from sitefarm.server import SiteFarm
from sitefarm.sites import FarmSpec
from tests.support.config import at_background_priority
from tests.support.jvm import short_lived_jvm_env
from tests.support.s3 import S3Server

REPO = Path(__file__).resolve().parents[2]
SEGMENT = "seg-s3"
BUCKET = "crawl-s3"
# A child process running several `crawl` command lines in turn (they share its one SparkSession). A script file,
# not `python -c`: under -c, importing GX (validate) runs pyspark's connect doctest guard, which exits the process.
CRAWL_COMMANDS = """
import json, sys
from jobs.cli import main
for argv in json.loads(sys.argv[1]):
    if main(argv):
        sys.exit(f"failed: {argv}")
"""


@dataclass
class S3Cycle:
    """What the cycle left: the server and root it ran on, its config, the farm's seeds, the commands' output and
    the daemon's local staging folder."""

    server: S3Server
    bucket: str
    root: str
    conf: Config
    seed_urls: list[str]
    output: str
    staging: Path


def child_env(s3: S3Server) -> dict[str, str]:
    """This process's environment with only fake credentials and moto's endpoint for AWS; no profile, no
    instance metadata, no proxy for loopback: no request can reach AWS. The child's JVM lives for the ten
    commands only (about two minutes): it compiles with C1 only, like the other short-lived JVMs of the suite
    (measured on the whole cycle: 242 -> 172 CPU-s)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(short_lived_jvm_env())
    env.update(s3.client_env())
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"  # a child killed by a signal still leaves what its commands printed
    return env


def run_crawl_commands(commands: list[list[str]], config_file: Path, env: dict[str, str]) -> str:
    """Run `crawl` commands in one child process (one JVM for all), against the config file; their output."""
    argvs = json.dumps([[*command, "--config", str(config_file)] for command in commands])
    script = config_file.with_name("crawl_commands.py")
    script.write_text(CRAWL_COMMANDS)
    done = subprocess.run(at_background_priority([sys.executable, script, argvs]), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)
    log = config_file.with_name("crawl_commands.stderr")
    log.write_text(done.stderr)
    python_side = without_jvm_log(done.stderr)[-6000:]
    assert done.returncode == 0, (f"exit {done.returncode} (negative: killed by that signal); stdout:\n"
                                  f"{done.stdout[-3000:]}\nstderr less the JVM log ({log} has all):\n{python_side}")
    return done.stdout


JVM_LOG_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ ")
JVM_TRACE_LINE = re.compile(r"\t|Caused by: |[\w.$]+(Exception|Error)\b")


def without_jvm_log(stderr: str) -> str:
    """stderr without the JVM's log lines and their stack traces: what Python printed (a command's error line, a
    traceback), which the JVM's shutdown noise after a failed command would otherwise push out of the message."""
    kept, in_jvm_entry = [], False
    for line in stderr.splitlines():
        if JVM_LOG_LINE.match(line):
            in_jvm_entry = True
        elif not (in_jvm_entry and JVM_TRACE_LINE.match(line)):
            in_jvm_entry = False
            kept.append(line)
    return "\n".join(kept)


def run_s3_cycle(base_conf: Config, s3: S3Server, base: Path) -> S3Cycle:
    """inject, generate, fetch (the daemon through boto3), parse, dedup, update, index, report, validate and stats,
    all with --root s3://... on a two-host farm."""
    bucket = s3.make_bucket(BUCKET)
    root = f"s3://{bucket}/crawl"
    farm = SiteFarm(FarmSpec(hosts=2, pages_per_host=6), log_path=base / "requests.jsonl")
    farm.start()
    try:
        conf = demo_config(base_conf, root, farm).with_overrides(
            {"s3.endpoint_url": s3.endpoint, "s3.path_style_access": True, "fetch.staging_dir": str(base / "staging"),
             "parse.wet_enabled": True})
        config_file = base / "crawl.yaml"
        config_file.write_text(yaml.safe_dump(conf.as_dict()))
        seeds = base / "seeds.txt"
        seed_urls = farm.seed_urls()
        seeds.write_text("\n".join(seed_urls) + "\n")
        output = run_crawl_commands(
            [["inject", "--seeds", str(seeds)], ["generate", "--segment", SEGMENT], ["fetch", "--segment", SEGMENT],
             ["parse", "--segment", SEGMENT], ["dedup", "--segment", SEGMENT], ["update", "--segment", SEGMENT],
             ["index", "--segment", SEGMENT], ["report", "--segment", SEGMENT], ["validate"], ["stats"]],
            config_file, child_env(s3))
    finally:
        farm.stop()
    return S3Cycle(server=s3, bucket=bucket, root=root, conf=conf, seed_urls=list(seed_urls), output=output,
                   staging=base / "staging")
