"""`crawl validate`: every table's Great Expectations suite run against its Delta table on Spark, a readable
report and GX Data Docs, and a result that fails the step when any expectation fails.

The suites are data (conf/expectations/<table>.json, GX 1.x suite JSON, one `meta.rule` per expectation); run-time
values come in as suite parameters: `latest_time` (now + validate.future_slack_s, naive UTC like Spark's session
time zone) and `max_bucket` (crawl.buckets - 1). GX runs offline: analytics off through GX_ANALYTICS_ENABLED
(set here, before GX is imported) and in the context config, progress bars off. The GX project is a throw-away
file context in a temporary folder; only its Data Docs site is kept, under the run's output folder:

    ROOT/validation/<UTC timestamp>/report.md
    ROOT/validation/<UTC timestamp>/data_docs/index.html

--out DIR puts the run folder under a local DIR instead. For an s3:// root the run is built in a local temporary
folder (GX writes Data Docs as local files) and then copied to ROOT/validation/<UTC timestamp>/.

Every run then closes or reopens the quality gate (crawler.gate, `ROOT/_gate.json` through jobs/gate.py): a table
that failed holds it closed, and generate makes no new segment, until a run in which that table passes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from crawler import layout
from crawler.config import Config, bundled
from crawler.errors import UserError
from crawler.gate import GateFailure, GateRecord
from jobs import gate
from jobs.base import read_table, step
from jobs.storage import Storage

os.environ["GX_ANALYTICS_ENABLED"] = "false"  # GX reads it when imported: nothing is sent anywhere

BUNDLED_SUITES = bundled("expectations")
SITE = "crawl"
EXAMPLE_MAX_CHARS = 120  # an unexpected value is cut to this many characters in the report
# `crawl validate` when an expectation fails: the data failed its gate (1 stays a bug, 2 a user mistake, so the DAG
# can tell a failed gate, which no retry fixes, from a crash).
EXIT_VALIDATION_FAILED = 3

# Written before GX opens the project, so analytics and progress bars are off from the first moment. Stores GX
# needs only during the run live in memory; validation results go to files because Data Docs are built from them.
_PROJECT_YAML = """\
config_version: 4
analytics_enabled: false
progress_bars:
  globally: false
  metric_calculations: false
stores:
  expectations_store:
    class_name: ExpectationsStore
    store_backend: {{class_name: InMemoryStoreBackend}}
  validation_results_store:
    class_name: ValidationResultsStore
    store_backend: {{class_name: TupleFilesystemStoreBackend, base_directory: uncommitted/validations/}}
  checkpoint_store:
    class_name: CheckpointStore
    store_backend: {{class_name: InMemoryStoreBackend}}
  validation_definition_store:
    class_name: ValidationDefinitionStore
    store_backend: {{class_name: InMemoryStoreBackend}}
expectations_store_name: expectations_store
validation_results_store_name: validation_results_store
checkpoint_store_name: checkpoint_store
data_docs_sites:
  {site}:
    class_name: SiteBuilder
    show_how_to_buttons: false
    store_backend: {{class_name: TupleFilesystemStoreBackend, base_directory: {docs}}}
    site_index_builder: {{class_name: DefaultSiteIndexBuilder}}
"""


class SuiteError(UserError, ValueError):
    """An expectation suite file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class FailedExpectation:
    table: str
    expectation_type: str
    column: str                      # the column, or columns joined by "," for multi-column expectations
    rule: str                        # the expectation's meta.rule
    condition: str | None = None     # the Spark row condition limiting the rows checked
    unexpected_count: int | None = None
    examples: tuple[str, ...] = ()   # a few unexpected values (validate.unexpected_examples)
    error: str | None = None         # GX raised instead of evaluating (e.g. a column the table lacks)

    @property
    def name(self) -> str:
        """`expect_column_values_to_be_unique(url_id)`: what a person greps for in the report and Data Docs."""
        return f"{self.expectation_type}({self.column})"

    def describe(self) -> str:
        text = self.name + (f" where {self.condition}" if self.condition else "") + f": {self.rule}"
        if self.error:
            return f"{text} (error: {self.error})"
        if self.unexpected_count is not None:
            text += f" ({self.unexpected_count} unexpected"
            text += f", e.g. {', '.join(self.examples)})" if self.examples else ")"
        return text


@dataclass(frozen=True)
class TableValidation:
    table: str
    rows: int
    evaluated: int
    failures: tuple[FailedExpectation, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class ValidationResult:
    out_dir: Path  # where the report and Data Docs were built (a local folder)
    tables: list[TableValidation] = field(default_factory=list)
    published_to: str | None = None  # ROOT/validation/<stamp> when they were copied to an s3:// root
    gate: GateRecord | None = None  # the quality gate after this run (None: open)

    @property
    def location(self) -> str:
        return self.published_to or str(self.out_dir)

    @property
    def success(self) -> bool:
        return all(t.passed for t in self.tables)

    @property
    def failures(self) -> list[FailedExpectation]:
        return [f for t in self.tables for f in t.failures]

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.md"

    @property
    def data_docs_index(self) -> Path:
        return self.out_dir / "data_docs" / "index.html"

    def verdict(self) -> str:
        """Passed, or how many expectations failed in which tables: one line."""
        total = sum(t.evaluated for t in self.tables)
        if self.success:
            return f"passed: {total} expectations on {len(self.tables)} tables"
        per_table = ", ".join(f"{t.table}: {len(t.failures)}" for t in self.tables if t.failures)
        return f"FAILED: {len(self.failures)} of {total} expectations failed ({per_table})"

    def headline(self) -> str:
        """One line for a progress line or a cycle report (`jobs.cycle.describe`): the verdict, the report, and
        the quality gate when it is closed."""
        closed = f"; quality gate closed by {', '.join(self.gate.tables)}" if self.gate is not None else ""
        return f"{self.verdict()}; report {self.location}/report.md{closed}"

    def summary(self) -> str:
        """A few lines for the terminal; the report has the rest."""
        lines = [f"validate: {self.verdict()}", *(f"  {f.table}: {f.describe()}" for f in self.failures)]
        lines += [f"validate: report {self.location}/report.md",
                  f"validate: data docs {self.location}/data_docs/index.html"]
        if self.gate is not None:
            lines.append(f"validate: quality gate closed by {', '.join(self.gate.tables)}: generate makes no new "
                         "segment until they pass validation")
        return "\n".join(lines)


def suites_dir(conf: Config) -> Path:
    configured = conf.validate.suites_dir
    return Path(configured).expanduser() if configured else BUNDLED_SUITES


def load_suite(path: Path, table: str) -> dict[str, Any]:
    """The suite JSON of `table`, checked: every expectation must build in GX and say its rule. GX itself logs
    and drops an expectation it cannot build, which would silently weaken the gate."""
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read the expectation suite of table {table!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise SuiteError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("name") != table:
        raise SuiteError(f"{path}: must be a JSON object with \"name\": \"{table}\"")
    expectations = data.get("expectations")
    if not isinstance(expectations, list) or not expectations:
        raise SuiteError(f"{path}: \"expectations\" must be a non-empty list")
    for number, item in enumerate(expectations, 1):
        where = f"{path}: expectation {number}"
        if not isinstance(item, dict) or not isinstance(item.get("type"), str) or not isinstance(
                item.get("kwargs"), dict):
            raise SuiteError(f"{where}: must be an object with a \"type\" and \"kwargs\"")
        rule = (item.get("meta") or {}).get("rule")
        if not isinstance(rule, str) or not rule.strip():
            raise SuiteError(f"{where} ({item['type']}): meta.rule must say what the expectation checks")
        try:
            ExpectationConfiguration(type=item["type"], kwargs=item["kwargs"], meta=item["meta"]).to_domain_obj()
        except Exception as exc:  # GX raises several unrelated types (not found, pydantic, config errors)
            raise SuiteError(f"{where} ({item['type']}): not a valid expectation: {exc}") from None
    return data


def load_suites(conf: Config, tables: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The checked suite of each table asked for (default: all), in layout order; SuiteError names a bad file."""
    names = [layout.check_table_name(name) for name in dict.fromkeys(tables or layout.TABLES)]
    return {name: load_suite(suites_dir(conf) / f"{name}.json", name) for name in names}


def output_dir(root: str, out: str | None, started: datetime) -> Path:
    """A new folder for this run: <out or ROOT/validation>/<UTC timestamp>[-n]."""
    base = Path(out).expanduser() if out else Path(root) / "validation"
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    base.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        candidate = base / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"too many validation runs in {base} at {stamp}")


def suite_parameters(conf: Config, started: datetime) -> dict[str, Any]:
    latest = started + timedelta(seconds=conf.validate.future_slack_s)
    latest = latest.astimezone(UTC).replace(tzinfo=None)
    return {"latest_time": latest.isoformat(), "max_bucket": conf.crawl.buckets - 1}


def run(spark: SparkSession, conf: Config, root: str, tables: list[str] | None = None, out: str | None = None,
        now: datetime | None = None) -> ValidationResult:
    """Validate `tables` (default: all) of the crawl at `root`; raises SuiteError before any Spark work when a
    suite is missing or malformed."""
    suites = load_suites(conf, tables)
    names = list(suites)
    started = now or datetime.now(UTC)
    # An s3:// root gets the run built in a local folder first (GX writes Data Docs to local files), then copied.
    staging = tempfile.mkdtemp(prefix="cyclecrawl-validation-") if out is None and layout.is_s3(root) else None
    result = ValidationResult(output_dir(root, staging or out, started))
    params = suite_parameters(conf, started)
    examples = conf.validate.unexpected_examples

    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    # GX logs each save of its throw-away config at INFO: keep the crawl's own progress lines readable.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="cyclecrawl-gx-") as project:
        (Path(project) / "gx").mkdir()
        (Path(project) / "gx" / "great_expectations.yml").write_text(
            _PROJECT_YAML.format(site=SITE, docs=json.dumps(str(result.out_dir / "data_docs"))), encoding="utf-8")
        context = gx.get_context(mode="file", project_root_dir=project)
        source = context.data_sources.add_spark(name="crawl")
        run_id = RunIdentifier(run_name=f"validate-{result.out_dir.name}", run_time=started)
        for name in names:
            with step(f"validate {name}"):
                batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe(name)
                suite = context.suites.add(gx.ExpectationSuite(**suites[name]))
                definition = context.validation_definitions.add(
                    gx.ValidationDefinition(name=name, data=batch, suite=suite))
                # Every expectation reads the table again: hold it in memory for the run.
                frame = read_table(spark, root, name).persist()
                try:
                    rows = frame.count()
                    outcome = _run_definition(definition, frame, params, run_id, examples=0)
                    if not outcome.success:
                        outcome = _run_definition(definition, frame, params, run_id, examples)
                finally:
                    frame.unpersist()
                result.tables.append(_table_validation(name, rows, outcome))
        context.build_data_docs(site_names=[SITE])
    result.report_path.write_text(render_report(result, root, suites_dir(conf), started), encoding="utf-8")
    if staging:
        result.published_to = _publish(result.out_dir, layout.join(root, "validation", result.out_dir.name),
                                       Storage.from_conf(conf))
        shutil.rmtree(staging, ignore_errors=True)
    result.gate = gate.record_validation(
        Storage.from_conf(conf), root, names, [GateFailure(f.table, f.name, f.rule) for f in result.failures],
        started, f"{result.location}/report.md")
    return result


def _run_definition(definition: Any, frame: DataFrame, params: dict[str, Any], run_id: Any, examples: int) -> Any:
    """One table's validation result. Unexpected examples cost a Spark job per column-map expectation even when
    it passes (253 instead of 115 jobs for the eight suites), so `run` asks for none first and again, with
    `examples`, only for a table that failed; the second run has the same run id, so its result replaces the first
    in the results store and Data Docs."""
    return definition.run(batch_parameters={"dataframe": frame}, expectation_parameters=params, run_id=run_id,
                          result_format={"result_format": "BASIC", "partial_unexpected_count": examples})


def _publish(folder: Path, target: str, storage: Storage) -> str:
    """Copy every file of a local run folder under `target` (an s3:// folder), keeping relative paths."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            storage.write_bytes(layout.join(target, path.relative_to(folder).as_posix()), path.read_bytes())
    return target


def _table_validation(table: str, rows: int, outcome) -> TableValidation:
    failures = tuple(_failure(table, r) for r in outcome.results if not r.success)
    return TableValidation(table, rows, len(outcome.results), failures)


def _failure(table: str, result) -> FailedExpectation:
    config = result.expectation_config
    kwargs = config.kwargs
    if "column" in kwargs:
        column = kwargs["column"]
    elif "column_list" in kwargs:
        column = ",".join(kwargs["column_list"])
    else:
        column = ",".join(str(kwargs[k]) for k in ("column_A", "column_B") if k in kwargs)
    condition = kwargs.get("row_condition")
    if isinstance(condition, dict):  # GX 1.x turns a Spark row condition into {"pass_through_filter": ...}
        condition = condition.get("pass_through_filter") or json.dumps(condition)
    info = result.exception_info or {}
    if "raised_exception" not in info:  # keyed by metric when several metrics were computed
        info = next(iter(info.values()), {}) if info else {}
    error = info.get("exception_message") if info.get("raised_exception") else None
    details = result.result or {}
    return FailedExpectation(
        table=table, expectation_type=config.type, column=column, rule=(config.meta or {}).get("rule", ""),
        condition=condition or None, unexpected_count=details.get("unexpected_count"),
        examples=tuple(_example(v) for v in details.get("partial_unexpected_list") or ()), error=error)


def _example(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= EXAMPLE_MAX_CHARS else text[:EXAMPLE_MAX_CHARS - 1] + "…"


def render_report(result: ValidationResult, root: str, suites: Path, started: datetime) -> str:
    """report.md: the verdict first, a table per crawl table, then each failed expectation with its rule."""
    total = sum(t.evaluated for t in result.tables)
    verdict = ("PASSED: every expectation holds" if result.success
               else f"FAILED: {len(result.failures)} of {total} expectations failed")
    lines = [
        "# Validation report", "",
        f"* Root: `{root}`",
        f"* Run: {started.astimezone(UTC).isoformat(timespec='seconds')}",
        f"* Suites: `{suites}`",
        "* Data Docs: [data_docs/index.html](data_docs/index.html)",
        f"* Result: **{verdict}**", "",
        "| table | rows | expectations | failed | result |",
        "|---|---:|---:|---:|---|",
    ]
    lines += [f"| {t.table} | {t.rows} | {t.evaluated} | {len(t.failures)} | {'passed' if t.passed else 'FAILED'} |"
              for t in result.tables]
    for t in result.tables:
        lines += ["", f"## {t.table}: {'passed' if t.passed else 'FAILED'}", ""]
        if t.passed:
            lines.append(f"All {t.evaluated} expectations passed on {t.rows} rows.")
            continue
        for f in t.failures:
            lines.append(f"* `{f.name}`" + (f" where `{f.condition}`" if f.condition else ""))
            lines.append(f"  * rule: {f.rule}")
            if f.error:
                lines.append(f"  * error: {f.error}")
            if f.unexpected_count is not None:
                lines.append(f"  * unexpected: {f.unexpected_count} of {t.rows} rows")
            if f.examples:
                lines.append(f"  * examples: {', '.join(f'`{e}`' for e in f.examples)}")
    return "\n".join(lines) + "\n"


def check_suites(conf: Config, root: str, tables: list[str] | None, out: str | None) -> None:
    """`crawl validate`'s check before Spark starts: every suite it will run is there and well-formed (SuiteError,
    exit 2, naming the file)."""
    load_suites(conf, tables)


def run_command(spark: SparkSession, conf: Config, root: str, tables: list[str] | None, out: str | None) -> int:
    """`crawl validate`: the summary; exit 0 when every expectation holds, 3 when one fails."""
    result = run(spark, conf, root, tables=tables, out=out)
    print(result.summary())
    return 0 if result.success else EXIT_VALIDATION_FAILED
