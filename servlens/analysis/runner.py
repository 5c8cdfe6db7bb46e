"""Running rules over a store: scopes, evidence paths, detectors, and the analyze result document.

For every run the analysis covers, the scopes are the (model, deployment) pairs seen in its requests (or, for a run
with metrics only, the model_name labels of its metrics). For each rule and scope the runner:

1. creates three temporary views the detector reads (and rule SQL may read):
   - `scope_requests`  the scope's rows of `requests`, plus `t_at` (arrival, else first token, else end time);
   - `scope_metrics`   the run's `metric_samples` whose model_name label is the scope's model or absent
                       (llama.cpp exposes no labels, so its metrics belong to every scope of the run);
   - `scope_counter_increases`  per counter series (and histogram/summary sum and count), the increase since the
                       previous scrape (a drop is a restart: the new value is the increase), so rates never go
                       negative across a restart;
2. checks the rule's evidence paths (`[[requires]]`) against the columns that are non-NULL in the scope and the
   metrics that have samples; with none available the result is `not_evaluable`, naming what is missing —
   never `clear` for want of data;
3. calls the detector (a Python function, or the rule's SQL) and completes its result into the finding shape
   documented in docs/CONTRIBUTING.md.

A Python detector is `detect(ctx: DetectorContext) -> dict` returning at least `state` and `summary`, and for a
fired finding `evidence` ({metrics, thresholds, windows, table, chart}) and `examples`; it may return `severity`,
`remediation` and `rollback` to override the rule's text. A SQL detector returns one row: `state`, `summary`,
optionally `reason`, and any other columns become evidence metrics.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import duckdb

from servlens import __version__
from servlens.analysis import sql_functions
from servlens.analysis.rule_contract import fill_template
from servlens.analysis.rule_sql import sql_literal
from servlens.analysis.rules import SEVERITIES, STATES, Requirement, Rule, validate_params
from servlens.analysis.sql_rules import run_contract, run_sql
from servlens.analysis.windows import WindowSpec, iso, spec_for
from servlens.documents import SCHEMA_VERSION
from servlens.errors import ConfigError
from servlens.sandbox import check_detector_result, is_user_rule, lock_down
from servlens.store import format_columns, metric_roles
from servlens.store.runs import list_runs, select_runs
from servlens.store.schema import REQUEST_COLUMNS

MAX_EXAMPLES = 5
# Leak flags, prefix keys and such are columns too; text columns never count as evidence (privacy by default).
_TEXT_COLUMNS = ("prompt_text", "content_text", "reasoning_text")
EVIDENCE_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in _TEXT_COLUMNS)


@dataclass(frozen=True)
class Scope:
    run: str
    model: str | None
    deployment: str | None

    def as_dict(self) -> dict:
        return {"run": self.run, "model": self.model, "deployment": self.deployment}


def _eq(column: str, value: Any) -> str:
    return f"{column} IS NULL" if value is None else f"{column} = {sql_literal(value)}"


class RuleParams(dict):
    """A detector's parameters: reading one the rule does not declare is a rule error naming it, not a KeyError."""

    def __init__(self, rule: Rule, values: dict[str, Any]):
        super().__init__(values)
        self._rule = rule

    def __missing__(self, key):
        raise ConfigError(f"{self._rule.path}: {self._rule.detector} reads parameter '{key}', which the rule does "
                          "not declare", f"Declare [params.{key}] in the rule file")


@dataclass
class DetectorContext:
    """What a detector sees: the connection with the scope views, its parameters, and helpers."""

    con: duckdb.DuckDBPyConnection
    rule: Rule
    scope: Scope
    params: dict[str, Any]
    columns_present: set[str]
    metrics_present: set[str]
    available: list[Requirement]
    relative_clock: bool = False
    source_formats: set[str] = field(default_factory=set)
    _window: WindowSpec | None = None

    def has(self, *columns: str) -> bool:
        return all(column in self.columns_present for column in columns)

    def has_metric(self, *names: str) -> bool:
        return all(name in self.metrics_present for name in names)

    def path_available(self, requirement_id: str) -> bool:
        """Whether the evidence path with this `[[requires]]` id is present (an id the rule lacks, or one its
        detector's USES does not list, is a rule error: never a silent false)."""
        wanted = self.rule.requirement(requirement_id)
        if self.rule.uses is not None and requirement_id not in self.rule.uses["requires"]:
            raise ConfigError(f"{self.rule.python} asks for requirement '{requirement_id}', which its USES does not "
                              "list", "Add it to USES[\"requires\"]")
        return any(req.id == wanted.id for req in self.available)

    def rows(self, sql: str, params: dict | list | None = None) -> list[dict]:
        """Run SQL and return its rows as dicts (results are small: aggregates, not request rows)."""
        cursor = self.con.execute(sql, params) if params else self.con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def one(self, sql: str, params: dict | list | None = None) -> dict:
        found = self.rows(sql, params)
        return found[0] if found else {}

    def has_temp_table(self, name: str) -> bool:
        """Whether an earlier call made the temp table `name` on this connection (a cache kept across scopes)."""
        if not isinstance(self.con, duckdb.DuckDBPyConnection):
            return name in self.con.views  # an engine's connection keeps its temp tables as views of the scope
        return bool(self.con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?",
                                     [name]).fetchone()[0])

    @property
    def window(self) -> WindowSpec | None:
        """The scope's window layout, or None when no request has a time."""
        if self._window is None:
            row = self.con.execute("SELECT min(t_at), max(t_at) FROM scope_requests").fetchone()
            if row[0] is not None:
                self._window = spec_for(row[0], row[1])
        return self._window

    def examples(self, where: str, order_by: str, limit: int = MAX_EXAMPLES) -> list[dict]:
        """A handful of request ids with their source file and line, for the rows matching `where`."""
        # Filter and order inside the scope first, so `where` and `order_by` see only request columns.
        found = self.rows(
            f"""SELECT r.request_id, s.path AS source, r.source_line AS line
                FROM (SELECT request_id, source_id, source_line, row_number() OVER (ORDER BY {order_by}, source_line) AS k
                      FROM scope_requests WHERE {where} ORDER BY k LIMIT {int(limit)}) r
                LEFT JOIN sources s ON s.source_id = r.source_id ORDER BY r.k"""
        )
        return [{"request_id": e["request_id"], "source": e["source"], "line": e["line"]} for e in found]

    def counter_increase(self, name: str, label_filter: str = "TRUE") -> float | None:
        """Total increase of a counter over the run (all its series), None when it has no samples."""
        row = self.con.execute(
            f"SELECT count(*), sum(increase) FROM scope_counter_increases WHERE name = ? AND series = 'value' AND {label_filter}",
            [name],
        ).fetchone()
        return None if not row[0] else float(row[1] or 0.0)


T_AT = "coalesce(t_arrival, t_first_token, t_end)"

# A table, not a view: every rule and the evidence checks read the scope, so a view re-scanned all of `requests` for
# each (rule, scope) pair; once the store is larger than DuckDB's memory limit, each of those scans read it back from
# the spill files (1M lean LiteLLM rows under the 768 MiB default: rules 45 s CPU through the view, 20 s + 18 s to
# copy through the table; benchmarks/RESULTS.md).
SCOPE_REQUESTS_SQL = """
CREATE OR REPLACE TEMP TABLE scope_requests AS
SELECT * {replace_attrs}, {t_at} AS t_at, {t_window} AS t_window
FROM requests WHERE {where}
"""

# The attrs keys built-in rules read (tests/analysis/test_scope_attrs.py checks every built-in rule against it).
# Copying each row's attrs JSON into every scope table was three quarters of the copy's time (1M lean LiteLLM rows:
# 18.1 s CPU with attrs, 4.5 s without; benchmarks/RESULTS.md), for three keys few logs carry. So when no selected
# rule reads attrs beyond these keys, a row keeps its attrs only when the text names one of them, and any other
# row's attrs is '{}': every value those rules read, and which rows have attrs at all, are unchanged. A user rule
# that names attrs (or a user Python detector, which may read anything) gets every row's attrs as stored.
BUILTIN_ATTRS_KEYS = ("prefix_blocks", "ignore_eos", "parallel")
_NAMED_KEYS = " OR ".join(f"contains(attrs, '\"{key}\"')" for key in BUILTIN_ATTRS_KEYS)
ATTRS_COPIES = {
    "all": "",
    "keys": f"REPLACE (CASE WHEN {_NAMED_KEYS} THEN attrs WHEN attrs IS NOT NULL THEN CAST('{{}}' AS JSON) END AS attrs)",
    # the same copy when no row of the runs names a key (one scan per analysis decides it): it then reads only
    # attrs' NULL mask, not its text (1M lean LiteLLM rows, 8 scopes: 20-25 s CPU -> 7-8 s; benchmarks/RESULTS.md)
    "none named": "REPLACE (CASE WHEN attrs IS NOT NULL THEN CAST('{}' AS JSON) END AS attrs)",
}

# Every window of the scope's layout (servlens/analysis/windows.py), so SQL rules see the windows Python ones do.
SCOPE_WINDOWS_SQL = """
CREATE OR REPLACE TEMP VIEW scope_windows AS
SELECT CAST(i AS INTEGER) AS t_window,
       TIMESTAMP '{t0}' + to_microseconds(CAST(i * {width_us} AS BIGINT)) AS w_start,
       TIMESTAMP '{t0}' + to_microseconds(CAST((i + 1) * {width_us} AS BIGINT)) AS w_end,
       CAST({width_s} AS DOUBLE) AS width_s, i = 0 AS is_first
FROM range({count}) t(i)
"""
NO_WINDOWS_SQL = """
CREATE OR REPLACE TEMP VIEW scope_windows AS
SELECT CAST(NULL AS INTEGER) AS t_window, CAST(NULL AS TIMESTAMP) AS w_start, CAST(NULL AS TIMESTAMP) AS w_end,
       CAST(NULL AS DOUBLE) AS width_s, CAST(NULL AS BOOLEAN) AS is_first
WHERE false
"""

# The scope's metric samples with the role each plays (servlens/store/metric_roles.toml); `preference` orders the
# names of one role (1 = the one to read when a rule wants a single series).
SCOPE_ROLE_SAMPLES_SQL = f"""
CREATE OR REPLACE TEMP VIEW scope_role_samples AS
SELECT m.*, r.role, r.engine, r.preference FROM scope_metrics m JOIN metric_roles r ON {metric_roles.ROLE_JOIN_SQL}
"""

SCOPE_METRICS_SQL = """
CREATE OR REPLACE TEMP VIEW scope_metrics AS
SELECT * FROM metric_samples WHERE {where}
"""

# Counter increases per series between consecutive scrapes, from the store's metric_counter_increases view (a drop
# is a restart, so the new value is the increase since then; a series' first scrape has no increase and is dropped).
# Counters (series 'value') and the cumulative parts of histograms and summaries (series 'sum' / 'count'; buckets
# are left out to keep the view small: a detector that needs them reads metric_counter_increases).
SCOPE_COUNTER_INCREASES_SQL = """
CREATE OR REPLACE TEMP VIEW scope_counter_increases AS
SELECT run, name, series, labels, prev_ts, ts, interval_s, value, increase, is_reset
FROM metric_counter_increases
WHERE ((type = 'counter' AND series = 'value') OR (type IN ('histogram', 'summary') AND series IN ('sum', 'count')))
  AND increase IS NOT NULL AND {where}
"""


def set_scope_views(con: duckdb.DuckDBPyConnection, scope: Scope, attrs_copy: str = "all") -> WindowSpec | None:
    """Point the scope views at `scope` (and make sure the roles table and the rule functions exist); the scope's
    window layout, None when no request has a time. `attrs_copy` is a key of ATTRS_COPIES (see attrs_copy_for)."""
    metric_roles.install(con)
    format_columns.install(con)
    sql_functions.register(con)
    where = " AND ".join([_eq("run", scope.run), _eq("model", scope.model), _eq("deployment", scope.deployment)])
    t0, t1 = con.execute(f"SELECT min({T_AT}), max({T_AT}) FROM requests WHERE {where}").fetchone()
    spec = spec_for(t0, t1) if t0 is not None else None
    t_window = spec.index_sql(T_AT) if spec else "CAST(NULL AS INTEGER)"
    con.execute(SCOPE_REQUESTS_SQL.format(where=where, t_at=T_AT, t_window=t_window,
                                          replace_attrs=ATTRS_COPIES[attrs_copy]))
    if spec:
        con.execute(SCOPE_WINDOWS_SQL.format(t0=t0.isoformat(sep=" "), width_us=int(round(spec.width_s * 1e6)),
                                             width_s=spec.width_s, count=spec.count))
    else:
        con.execute(NO_WINDOWS_SQL)
    model_match = "TRUE" if scope.model is None else (
        f"(labels['model_name'] IS NULL OR labels['model_name'] = {sql_literal(scope.model)})"
    )
    metric_where = f"{_eq('run', scope.run)} AND {model_match}"
    con.execute(SCOPE_METRICS_SQL.format(where=metric_where))
    con.execute(SCOPE_COUNTER_INCREASES_SQL.format(where=metric_where))
    con.execute(SCOPE_ROLE_SAMPLES_SQL)
    return spec


def list_scopes(con: duckdb.DuckDBPyConnection, runs: list[str]) -> list[Scope]:
    """(run, model, deployment) from the requests; runs with metrics only get one scope per model_name label."""
    run_list = ", ".join(sql_literal(r) for r in runs) or "NULL"
    scopes = [Scope(*row) for row in con.execute(
        f"""SELECT DISTINCT run, model, deployment FROM requests WHERE run IN ({run_list})
            ORDER BY run, model NULLS LAST, deployment NULLS LAST"""
    ).fetchall()]
    with_requests = {s.run for s in scopes}
    metric_only = [r for r in runs if r not in with_requests]
    if metric_only:
        # One scope per model_name label; series without the label (process, HTTP, llama.cpp) join every scope of
        # the run through scope_metrics, so they only make a scope of their own when no series names a model.
        scopes += [Scope(*row) for row in con.execute(
            f"""SELECT DISTINCT run, labels['model_name'], NULL FROM metric_samples m
                WHERE run IN ({", ".join(sql_literal(r) for r in metric_only)})
                  AND (labels['model_name'] IS NOT NULL OR NOT EXISTS (
                       SELECT 1 FROM metric_samples o WHERE o.run = m.run AND o.labels['model_name'] IS NOT NULL))
                ORDER BY 1, 2 NULLS LAST"""
        ).fetchall()]
    return scopes


def present_columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Canonical columns with at least one non-NULL value in scope_requests (one scan)."""
    counts = ", ".join(f"count({c}) AS {c}" for c in EVIDENCE_COLUMNS)
    row = con.execute(f"SELECT {counts} FROM scope_requests").fetchone()
    return {column for column, count in zip(EVIDENCE_COLUMNS, row) if count}


def present_metrics(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {row[0] for row in con.execute("SELECT DISTINCT name FROM scope_metrics").fetchall()}


def _metric_text(metric: str) -> str:
    """A required metric as a reason names it: a role with its first names (metric_roles.toml)."""
    if not metric.startswith("role:"):
        return metric
    names = metric_roles.names(metric[len("role:"):])
    return f"{metric} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"


def missing_reason(rule: Rule, columns: set[str], metrics: set[str]) -> str:
    """Why no evidence path of the rule is available, naming the missing columns and metrics of each."""
    parts = []
    for req in rule.requires:
        missing = [c for c in req.columns if c not in columns] + [_metric_text(m) for m in req.metrics
                                                                  if not req.metric_present(m, metrics)]
        parts.append(f"{req.name} (missing {', '.join(missing)})")
    lead = "needs " + ("one of: " if len(parts) > 1 else "")
    return lead + "; ".join(parts)


def _clean(value: Any) -> Any:
    """JSON-safe evidence values: NaN/inf become None, datetimes ISO strings, decimals floats."""
    if isinstance(value, float):
        return None if (math.isnan(value) or math.isinf(value)) else value
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "__float__") and not isinstance(value, (int, bool)):
        return _clean(float(value))
    return value


def _run_state_column_sql(ctx: DetectorContext) -> dict:
    """A SQL rule of the older form (no [decide]): its one row carries state, summary and reason columns."""
    cursor = run_sql(ctx.con, ctx.rule, "detector.sql", ctx.rule.sql, ctx.params)
    names = [d[0] for d in cursor.description]
    found = [dict(zip(names, row)) for row in cursor.fetchall()]
    if not found:
        return {"state": "clear", "summary": f"{ctx.rule.title}: not found."}
    row = dict(found[0])
    result = {"state": row.pop("state", None), "summary": row.pop("summary", None), "reason": row.pop("reason", None)}
    result["evidence"] = {"metrics": row, "thresholds": dict(ctx.params)}
    return result


def reads_all_attrs(rule: Rule) -> bool:
    """Whether `rule` may read attrs keys beyond BUILTIN_ATTRS_KEYS: a user rule whose SQL names attrs, or a user
    Python detector (it may read anything)."""
    if not is_user_rule(rule.path):
        return False
    return bool(rule.python) or any(re.search(r"\battrs\b", sql, re.IGNORECASE) for _, sql in rule.sql_items())


def attrs_copy_for(con: duckdb.DuckDBPyConnection, rules: list[Rule], run_list: str) -> str:
    """How the scope tables copy attrs (a key of ATTRS_COPIES) for these rules on the runs of `run_list` (SQL
    literals): every key when a rule may read any."""
    if any(reads_all_attrs(rule) for rule in rules):
        return "all"
    named = con.execute(f"SELECT bool_or({_NAMED_KEYS}) FROM requests WHERE run IN ({run_list})").fetchone()[0]
    return "keys" if named else "none named"


def prepare_scope(con: duckdb.DuckDBPyConnection, scope: Scope, attrs_copy: str = "all") -> tuple[set[str], set[str]]:
    """Point the scope views at `scope`; the columns and metrics present in it (one scan, shared by all rules)."""
    set_scope_views(con, scope, attrs_copy)
    return present_columns(con), present_metrics(con)


def evaluate(con: duckdb.DuckDBPyConnection, rule: Rule, scope: Scope, params: dict[str, Any],
             relative_clock: bool = False, source_formats: set[str] | None = None,
             presence: tuple[set[str], set[str]] | None = None) -> dict:
    """One rule on one scope: the finding dict (docs/CONTRIBUTING.md shape).

    `presence` is prepare_scope's result when the caller already pointed the views at this scope.
    """
    columns, metrics = presence if presence is not None else prepare_scope(con, scope)
    available = [req for req in rule.requires if req.available(columns, metrics)]
    base = {
        "rule": rule.id, "name": rule.name, "title": rule.title, "severity": rule.severity,
        "scope": scope.as_dict(), "reason": None, "remediation": "", "rollback": "",
        "evidence": {"metrics": {}, "thresholds": {}, "windows": [], "table": None, "chart": None},
        "examples": [], "references": rule.references(),
    }
    if not available:
        return base | {"state": "not_evaluable", "summary": f"{rule.title}: cannot be judged from these sources.",
                       "reason": missing_reason(rule, columns, metrics)}
    ctx = DetectorContext(con, rule, scope, RuleParams(rule, params), columns, metrics, available, relative_clock,
                          set(source_formats or ()))
    if not rule.python and is_user_rule(rule.path):
        # Issue 15: a user rule's SQL is checked again as it runs (the file may have changed since it was loaded)
        # and the connection is locked down: no file access, no ATTACH, no settings.
        from servlens.analysis.rules import check_user_rule_sql

        check_user_rule_sql(rule.path, rule.sql, rule.contract)
        if isinstance(con, duckdb.DuckDBPyConnection):
            # The store's own connection; an engine's (servlens/engines) reads its tables from files or a server
            # where the data is, so there the check above is the guard.
            lock_down(con)
    if rule.python:
        result = rule.resolve_python()(ctx)
    elif rule.contract:
        result = run_contract(con, rule, params)
    else:
        result = _run_state_column_sql(ctx)
    result = check_detector_result(rule.id, rule.detector, result)
    state = result.get("state")
    if state not in STATES:
        raise ConfigError(f"{rule.id}'s detector returned state {state!r}", "A detector returns fired, clear or not_evaluable")
    if state == "not_evaluable" and not result.get("reason"):
        raise ConfigError(f"{rule.id}'s detector returned not_evaluable without a reason",
                          "Say which columns or metrics are missing")
    evidence = base["evidence"] | (result.get("evidence") or {})
    evidence.setdefault("thresholds", {})
    evidence["thresholds"] = evidence["thresholds"] or {
        k: v for k, v in params.items() if not isinstance(v, (list, bool, str))
    }
    finding = base | {
        "state": state,
        "summary": result.get("summary") or rule.title,
        "reason": result.get("reason"),
        "evidence": evidence,
        "examples": result.get("examples") or [],
    }
    severity = result.get("severity", rule.severity)
    if severity not in SEVERITIES:
        raise ConfigError(f"{rule.id}'s detector returned severity {severity!r}", "info, warning or critical")
    finding["severity"] = severity
    if state == "fired":
        values = {**params, **(evidence.get("thresholds") or {}), **(evidence.get("metrics") or {})}
        finding["remediation"] = fill_template(result.get("remediation") or rule.remediation, values)
        finding["rollback"] = fill_template(result.get("rollback") or rule.rollback, values)
    return _clean(finding)


def run_rules(con: duckdb.DuckDBPyConnection, rules: list[Rule], runs: list[str], params: dict[str, dict],
              relative_clock: bool | None = None, source_formats: set[str] | None = None) -> list[dict]:
    """Every rule on every scope of `runs`: the findings, unsorted. The one path analyze and `rules test` take.

    `params` maps rule id -> validated parameters; the clock and the source formats are read from the store when
    not given."""
    run_list = ", ".join(sql_literal(r) for r in runs) or "NULL"
    if relative_clock is None:
        relative_clock = bool(con.execute(
            f"SELECT coalesce(bool_or(relative_clock), false) FROM runs WHERE run IN ({run_list})").fetchone()[0])
    if source_formats is None:
        source_formats = {row[0] for row in con.execute(
            f"SELECT DISTINCT format FROM sources WHERE run IN ({run_list}) AND format IS NOT NULL").fetchall()}
    findings = []
    attrs_copy = attrs_copy_for(con, rules, run_list)
    for scope in list_scopes(con, runs):
        presence = prepare_scope(con, scope, attrs_copy)
        for rule in rules:
            findings.append(evaluate(con, rule, scope, params[rule.id], relative_clock, source_formats, presence))
    return findings


def coverage(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict:
    """What the analysis saw: sources, runs, request count, time span, models, columns and metrics present."""
    run_list = ", ".join(sql_literal(r) for r in runs) or "NULL"
    sources = [
        {"path": p, "format": f, "kind": k, "rows": r, "bad_lines": b}
        for p, f, k, r, b in con.execute(
            f"SELECT path, format, kind, rows, bad_lines FROM sources WHERE run IN ({run_list}) ORDER BY source_id"
        ).fetchall()
    ]
    n, start, end = con.execute(
        f"SELECT count(*), min(coalesce(t_arrival, t_first_token, t_end)), max(coalesce(t_end, t_first_token, t_arrival))"
        f" FROM requests WHERE run IN ({run_list})"
    ).fetchone()
    if start is None:
        start, end = con.execute(f"SELECT min(ts), max(ts) FROM metric_samples WHERE run IN ({run_list})").fetchone()
    relative = bool(con.execute(
        f"SELECT coalesce(bool_or(relative_clock), false) FROM runs WHERE run IN ({run_list})"
    ).fetchone()[0])
    models = [row[0] for row in con.execute(
        f"SELECT DISTINCT model FROM requests WHERE run IN ({run_list}) AND model IS NOT NULL ORDER BY 1"
    ).fetchall()]
    counts = ", ".join(f"count({c})" for c in EVIDENCE_COLUMNS)
    row = con.execute(f"SELECT {counts} FROM requests WHERE run IN ({run_list})").fetchone()
    columns = [c for c, count in zip(EVIDENCE_COLUMNS, row) if count]
    metrics = [r[0] for r in con.execute(
        f"SELECT DISTINCT name FROM metric_samples WHERE run IN ({run_list}) ORDER BY 1"
    ).fetchall()]
    return {
        "sources": sources, "runs": runs, "requests": int(n),
        "time_span": {"start": iso(start), "end": iso(end), "relative_clock": relative},
        "models": models, "columns_present": columns, "metrics_present": metrics,
    }


_STATE_ORDER = {"fired": 0, "not_evaluable": 1, "clear": 2}
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def sort_findings(findings: list[dict]) -> list[dict]:
    """Fired first (critical, warning, info), then not evaluable, then clear; by rule id within each."""
    return sorted(findings, key=lambda f: (_STATE_ORDER[f["state"]], _SEVERITY_ORDER[f["severity"]], f["rule"],
                                           str(f["scope"].get("run")), str(f["scope"].get("model"))))


def analyze(con: duckdb.DuckDBPyConnection, rules: list[Rule], runs: list[str] | None = None,
            overrides: dict[str, dict[str, Any]] | None = None, slo: dict | None = None) -> dict:
    """Run `rules` on every scope of `runs` (default: every run in the store); the analyze result document.

    `slo` is goodput.parse_slo's targets (None: attainment curves instead of attainment)."""
    runs = select_runs(list_runs(con), runs, "the store", ("The store holds no requests and no metrics to analyse",
                                                         "Ingest request logs or scrapes first"))
    cover = coverage(con, runs)
    relative = cover["time_span"]["relative_clock"]
    formats = {s["format"] for s in cover["sources"] if s["format"]}
    params = {rule.id: validate_params(rule, (overrides or {}).get(rule.id, {}), "--set") for rule in rules}
    findings = run_rules(con, rules, runs, params, relative, formats)
    doc = {
        "kind": "analyze",
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "servlens_version": __version__,
        "run": runs[0] if len(runs) == 1 else runs,
        "coverage": cover,
        "findings": sort_findings(findings),
    }
    # The workload profile (issue 8), and the story the report leads with (issue 20): chains across the findings,
    # and goodput against the SLO.
    from servlens.analysis.chains import build_chains
    from servlens.analysis.goodput import goodput_section
    from servlens.analysis.workload import workload_profile

    doc["workload"] = workload_profile(con, runs)
    doc["chains"] = _clean(build_chains(con, doc["findings"]))
    doc["goodput"] = _clean(goodput_section(con, runs, slo))
    return doc


def worst_fired(document: dict) -> str | None:
    """The highest severity among fired findings, or None."""
    fired = [f["severity"] for f in document["findings"] if f["state"] == "fired"]
    return min(fired, key=_SEVERITY_ORDER.__getitem__) if fired else None


def fails(document: dict, fail_on: str | None) -> bool:
    """True when a finding at or above `fail_on` fired (exit 1)."""
    if fail_on is None:
        return False
    worst = worst_fired(document)
    return worst is not None and _SEVERITY_ORDER[worst] <= _SEVERITY_ORDER[fail_on]
