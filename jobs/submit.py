"""`crawl-submit`: run one `crawl` Spark command through spark-submit, so the same command drives a cluster.

    crawl-submit [--master URL] [--deploy-mode client] [--spark-submit PATH] [--dry-run] -- COMMAND [ARGS...]

COMMAND and ARGS are a `crawl` command line (parse --segment S --root R ...). The wrapper reads the same
--config/--set/--root to choose the jars (Delta's, and hadoop-aws for s3:// roots), then runs spark-submit with
jobs/spark_entry.py as the application; the driver's SparkSession takes master and jars from spark-submit
(jobs.base.submitted_by_spark_submit). Executors run this interpreter (spark.pyspark.python), so every node needs
the same virtualenv at the same path, or ship one (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from crawler import commandline
from crawler import config as config_mod
from crawler.config import Config
from crawler.errors import UserError
from jobs.cli import COMMANDS

# The `crawl` commands that run Spark, as the command table says; fetch, fetchd, demo and close-segment are not Spark
# applications.
SPARK_COMMANDS = tuple(command.name for command in COMMANDS if command.spark)
ENTRY = Path(__file__).resolve().with_name("spark_entry.py")


def delta_package() -> str:
    """Delta's Maven coordinate for this pyspark and delta-spark (the rule of delta.pip_utils)."""
    import pyspark

    spark_major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_major_minor}_2.13:{version('delta-spark')}"


def spark_packages(conf: Config) -> list[str]:
    from jobs.base import extra_packages

    return [delta_package(), *extra_packages(conf)]


def spark_submit_path() -> str:
    """pyspark's own spark-submit (the pip package ships bin/ but no cluster start scripts)."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def submit_command(conf: Config, crawl_args: list[str], master: str, deploy_mode: str = "client",
                   spark_submit: str | None = None) -> list[str]:
    """The spark-submit command line that runs `crawl <crawl_args>` as a Spark application on `master`."""
    from jobs.base import IVY_SETTINGS, SHIPPED_WITH_PYSPARK

    if not crawl_args or crawl_args[0] not in SPARK_COMMANDS:
        raise UserError(f"not a Spark command of crawl: {crawl_args[:1]} (one of {', '.join(SPARK_COMMANDS)})")
    command = [spark_submit or spark_submit_path(), "--master", master, "--deploy-mode", deploy_mode,
               "--name", f"crawl-{crawl_args[0]}", "--driver-memory", conf.spark.driver_memory]
    extra_jars = conf.spark.extra_jars.strip()
    if extra_jars:
        command += ["--jars", extra_jars]
    else:
        command += ["--packages", ",".join(spark_packages(conf)), "--exclude-packages", ",".join(SHIPPED_WITH_PYSPARK),
                    "--conf", f"spark.jars.ivy={os.path.expanduser(conf.spark.ivy_dir)}",
                    "--conf", f"spark.jars.ivySettings={IVY_SETTINGS}"]
    # Every other setting is made by the driver's own spark_session before its SparkContext starts.
    for key in ("spark.pyspark.python", "spark.pyspark.driver.python"):
        command += ["--conf", f"{key}={sys.executable}"]
    return [*command, str(ENTRY), *crawl_args]


def _parser() -> argparse.ArgumentParser:
    parser = commandline.Parser(prog="crawl-submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", help="Spark master URL (default: spark.master of the config)")
    parser.add_argument("--deploy-mode", default="client", choices=("client", "cluster"))
    parser.add_argument("--spark-submit", help="spark-submit to run (default: pyspark's own)")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("crawl_args", nargs=argparse.REMAINDER, help="a crawl command line, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    return commandline.run(_parser(), argv, _command)


def _command(args: argparse.Namespace) -> int:
    crawl_args = args.crawl_args[1:] if args.crawl_args[:1] == ["--"] else args.crawl_args
    config_args, _ = _config_parser().parse_known_args(crawl_args[1:])
    conf = config_mod.from_arguments(config_args)
    command = submit_command(conf, crawl_args, args.master or conf.spark.master, args.deploy_mode,
                             args.spark_submit)
    if args.dry_run:
        print(" ".join(command))
        return 0
    return subprocess.call(command)


def _config_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    config_mod.add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main())
