"""Rule test cases: the `<rule file stem>.cases.toml` beside each rule, run by `servlens rules test` and by pytest.

    rule = "SL004"

    [[case]]
    name = "burst_waiting_for_slots_fires"        # the test id is SL004::burst_waiting_for_slots_fires
    description = "why this case exists"          # optional
    params = { min_queue_share = 0.6 }            # optional overrides of the rule's defaults
    logs = ["fixtures/burst.jsonl"]               # optional: files ingested through the normal ingest path,
    metrics_files = ["fixtures/scrapes/"]         #   relative to the cases file
    expect = "fired"                              # every scope ends in this state; or detailed expectations:

    [[case.expect]]
    scope = { model = "m" }                       # optional: which scope (run, model, deployment)
    state = "fired"                               # fired | clear | not_evaluable
    severity = "critical"                         # optional
    metrics = { cold_start = true }               # optional: evidence metrics, numbers compared to 0.1% (or rel_tol)
    summary_contains = ["cold start"]             # optional: substrings of the summary
    summary_lacks = ["queue-driven"]              # optional: substrings the summary must not have
    remediation_contains = ["raise -c"]           # optional: substrings of the finding's remediation
    reason_contains = ["queue_s"]                 # optional: substrings of the not-evaluable reason
    examples = 5                                  # optional: how many example requests
    rel_tol = 0.001                               # optional

    [case.requests]                               # compact canonical rows (servlens/store/schema.py names)
    defaults = { run = "case", model = "m" }      # values for every row unless a row sets them
    columns = ["request_id", "t_arrival", "ttft_s", "queue_s"]
    rows = [["r1", "2026-11-28 10:00:00", 3.2, 3.0]]

    [[case.requests.generate]]                    # or many rows from SQL expressions over i = 0..count-1
    count = 40
    columns = { request_id = "'g' || i", t_arrival = "TIMESTAMP '2026-11-28 10:00:00' + to_seconds(i)" }

    [case.metrics]                                # metric_samples rows, same shape (columns, rows, generate)

Inputs go into a fresh in-memory store, so cases never share state.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servlens.analysis.rules import STATES, Rule, load_rules, validate_params
from servlens.errors import ConfigError, ServlensError
from servlens.store.schema import FINISH_REASONS, REQUEST_COLUMNS, open_store

_CASE_KEYS = ("name", "description", "params", "logs", "metrics_files", "expect", "requests", "metrics")
_EXPECT_KEYS = ("scope", "state", "severity", "metrics", "summary_contains", "summary_lacks", "remediation_contains",
                "reason_contains", "examples", "rel_tol")
_TABLE_KEYS = ("defaults", "columns", "rows", "generate")
METRIC_COLUMNS = ("run", "source_id", "ts", "name", "name_raw", "type", "series", "le", "labels", "value")


@dataclass
class Case:
    rule_id: str
    name: str
    data: dict
    path: Path

    @property
    def id(self) -> str:
        return f"{self.rule_id}::{self.name}"


@dataclass
class CaseResult:
    case: Case
    passed: bool
    message: str


def load_cases(path: Path, rule: Rule | None = None) -> list[Case]:
    """The cases in one cases file; unknown keys are errors naming the file, the case and the key."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", "Fix the syntax at the position shown") from exc
    for key in data:
        if key not in ("rule", "case"):
            raise ConfigError(f"{path}: unknown key '{key}'", "Allowed keys: rule, case")
    rule_id = data.get("rule")
    if rule is not None and rule_id != rule.id:
        raise ConfigError(f"{path}: rule = {rule_id!r} but the file sits beside {rule.id}", f"Set rule = \"{rule.id}\"")
    cases = []
    seen = set()
    for index, spec in enumerate(data.get("case", [])):
        name = spec.get("name")
        where = f"{path}: case[{index}]" + (f" '{name}'" if name else "")
        if not name:
            raise ConfigError(f"{where} has no name", "Add name = \"what_it_shows\"")
        if name in seen:
            raise ConfigError(f"{where}: the name is used twice", "Give each case its own name")
        seen.add(name)
        for key in spec:
            if key not in _CASE_KEYS:
                raise ConfigError(f"{where}: unknown key '{key}'", "Allowed: " + ", ".join(_CASE_KEYS))
        expect = spec.get("expect")
        if expect is None:
            raise ConfigError(f"{where} has no expect", "expect = \"fired\" | \"clear\" | \"not_evaluable\", or [[case.expect]]")
        for exp in [expect] if isinstance(expect, str) else expect:
            if isinstance(exp, str):
                exp = {"state": exp}
            for key in exp:
                if key not in _EXPECT_KEYS:
                    raise ConfigError(f"{where}: unknown expect key '{key}'", "Allowed: " + ", ".join(_EXPECT_KEYS))
            if exp.get("state") not in STATES:
                raise ConfigError(f"{where}: expect state {exp.get('state')!r} is not a state", "fired, clear or not_evaluable")
        for table_key in ("requests", "metrics"):
            for key in spec.get(table_key, {}):
                if key not in _TABLE_KEYS:
                    raise ConfigError(f"{where}: unknown key '{table_key}.{key}'", "Allowed: " + ", ".join(_TABLE_KEYS))
        if not (spec.get("requests") or spec.get("metrics") or spec.get("logs") or spec.get("metrics_files")):
            raise ConfigError(f"{where} has no input", "Give requests, metrics, logs or metrics_files")
        cases.append(Case(rule_id, name, spec, path))
    if not cases:
        raise ConfigError(f"{path} holds no [[case]]", "Add cases that must fire and cases that must not")
    return cases


def _insert(con, table: str, allowed: tuple[str, ...], spec: dict, where: str) -> None:
    defaults = spec.get("defaults", {})
    for column in list(defaults) + list(spec.get("columns", [])):
        if column not in allowed:
            raise ConfigError(f"{where}: '{column}' is not a column of {table}", "Columns: " + ", ".join(allowed))
    columns = list(spec.get("columns", []))
    rows = spec.get("rows", [])
    if rows:
        fixed = [c for c in defaults if c not in columns]
        names = columns + fixed
        placeholders = ", ".join(_placeholder(table, c) for c in names)
        values = []
        for row in rows:
            if len(row) != len(columns):
                raise ConfigError(f"{where}: a row has {len(row)} values for {len(columns)} columns", "Match the columns list")
            values.append(list(row) + [defaults[c] for c in fixed])
        con.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({placeholders})", values)
    for gen in spec.get("generate", []):
        exprs = dict(gen.get("columns", {}))
        for column in exprs:
            if column not in allowed:
                raise ConfigError(f"{where}: '{column}' is not a column of {table}", "Columns: " + ", ".join(allowed))
        names = list(exprs) + [c for c in defaults if c not in exprs]
        select = [f"({exprs[c]})" for c in exprs] + [_literal(defaults[c]) for c in defaults if c not in exprs]
        count = int(gen.get("count", 1))
        try:
            con.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(select)} FROM range({count}) t(i)")
        except Exception as exc:  # duckdb errors name the bad expression
            raise ConfigError(f"{where}: a generate expression failed: {exc}", "Fix the SQL expression") from exc


def _placeholder(table: str, column: str) -> str:
    if table == "requests" and column == "attrs":
        return "CAST(? AS JSON)"
    if table == "metric_samples" and column == "labels":
        return "CAST(? AS MAP(VARCHAR, VARCHAR))"
    return "?"


def _literal(value: Any) -> str:
    """A default as a SQL literal for generated rows: tables become MAPs (metric labels), lists become lists."""
    from servlens.analysis.runner import sql_literal

    if isinstance(value, dict):
        return "MAP {" + ", ".join(f"{sql_literal(str(k))}: {sql_literal(str(v))}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return sql_literal(value)


def build_store(case: Case):
    """A fresh in-memory store holding the case's inputs."""
    con = open_store(None)
    spec = case.data
    base = case.path.parent
    if spec.get("logs") or spec.get("metrics_files"):
        from servlens.analysis.inputs import ingest_paths

        ingest_paths(con, [str(base / p) for p in spec.get("logs", [])],
                     [str(base / p) for p in spec.get("metrics_files", [])], run=f"case-{case.name}")
    if spec.get("requests"):
        _insert(con, "requests", tuple(REQUEST_COLUMNS), spec["requests"], f"{case.path}: {case.name}.requests")
        _check_canonical(con, f"{case.path}: {case.name}.requests")
    if spec.get("metrics"):
        _insert(con, "metric_samples", METRIC_COLUMNS, spec["metrics"], f"{case.path}: {case.name}.metrics")
    return con


# Values ingest can write (servlens/ingest/compiler.py): a case row outside them tests a state real data never has.
_CANONICAL_CHECKS = (
    ("status", "status NOT IN ('ok', 'error')", "ok or error"),
    ("finish_reason", f"finish_reason NOT IN ({', '.join(repr(f) for f in FINISH_REASONS)})",
     ", ".join(FINISH_REASONS)),
    ("http_status", "http_status NOT BETWEEN 100 AND 599", "an HTTP status from 100 to 599"),
) + tuple((c, f"{c} < 0", "a count of at least 0") for c in
          ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens", "max_tokens", "context_window")
          ) + tuple((c, f"{c} < 0", "seconds, at least 0") for c in
                    ("queue_s", "prefill_s", "ttft_s", "first_content_s", "tpot_s", "decode_s", "e2e_s"))


def _check_canonical(con, where: str) -> None:
    for column, bad, allowed in _CANONICAL_CHECKS:
        found = con.execute(f"SELECT any_value({column}), count(*) FROM requests WHERE {bad}").fetchone()
        if found[1]:
            raise ConfigError(f"{where}: {found[1]} row(s) have {column} = {found[0]!r}, which ingest never writes",
                              f"Use {allowed}")


def _close(actual: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool) or isinstance(expected, str):
        return actual == expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(actual, expected, rel_tol=rel_tol, abs_tol=1e-9)
    return actual == expected


def check(case: Case, findings: list[dict]) -> list[str]:
    """Problems with `findings` against the case's expectations (empty = pass)."""
    expect = case.data["expect"]
    problems = []
    if isinstance(expect, str):
        if not findings:
            return [f"expected {expect} but the rule produced no scope at all"]
        for f in findings:
            if f["state"] != expect:
                problems.append(f"scope {_scope_text(f)}: expected {expect}, got {f['state']}: {f['reason'] or f['summary']}")
        return problems
    for exp in expect:
        matching = [f for f in findings if all(f["scope"].get(k) == v for k, v in (exp.get("scope") or {}).items())]
        if not matching:
            problems.append(f"no scope matches {exp.get('scope')}; scopes: {[_scope_text(f) for f in findings]}")
            continue
        for f in matching:
            label = _scope_text(f)
            if f["state"] != exp["state"]:
                problems.append(f"scope {label}: expected {exp['state']}, got {f['state']}: {f['reason'] or f['summary']}")
                continue
            if "severity" in exp and f["severity"] != exp["severity"]:
                problems.append(f"scope {label}: expected severity {exp['severity']}, got {f['severity']}")
            metrics = f["evidence"].get("metrics") or {}
            for key, value in (exp.get("metrics") or {}).items():
                if key not in metrics:
                    problems.append(f"scope {label}: no evidence metric '{key}' (has {sorted(metrics)})")
                elif not _close(metrics[key], value, exp.get("rel_tol", 1e-3)):
                    problems.append(f"scope {label}: metric {key} = {metrics[key]!r}, expected {value!r}")
            for needle in _as_list(exp.get("summary_contains")):
                if needle not in f["summary"]:
                    problems.append(f"scope {label}: summary lacks {needle!r}: {f['summary']}")
            for needle in _as_list(exp.get("summary_lacks")):
                if needle in f["summary"]:
                    problems.append(f"scope {label}: summary has {needle!r}: {f['summary']}")
            for needle in _as_list(exp.get("remediation_contains")):
                if needle not in (f.get("remediation") or ""):
                    problems.append(f"scope {label}: remediation lacks {needle!r}: {f.get('remediation')}")
            for needle in _as_list(exp.get("reason_contains")):
                if needle not in (f["reason"] or ""):
                    problems.append(f"scope {label}: reason lacks {needle!r}: {f['reason']}")
            if "examples" in exp and len(f["examples"]) != exp["examples"]:
                problems.append(f"scope {label}: {len(f['examples'])} examples, expected {exp['examples']}")
    return problems


def _as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _scope_text(finding: dict) -> str:
    return "/".join(str(v) for v in finding["scope"].values() if v is not None) or "all"


def run_case(rule: Rule, case: Case) -> CaseResult:
    """The case's inputs through exactly the path analyze takes (runner.run_rules), checked against its
    expectations. A broken rule or case (bad SQL, a malformed file, non-canonical rows) raises ConfigError: that is
    exit 2 for `rules test`, not a failed case. Input the ingest path refuses is a failed case."""
    from servlens.analysis.runner import list_runs, run_rules

    params = validate_params(rule, case.data.get("params", {}), f"{case.path}: {case.name}.params")
    try:
        con = build_store(case)
    except ConfigError:
        raise
    except ServlensError as exc:
        return CaseResult(case, False, f"error: {exc}")
    try:
        findings = run_rules(con, [rule], list_runs(con), {rule.id: params})
    finally:
        con.close()
    problems = check(case, findings)
    return CaseResult(case, not problems, "; ".join(problems) if problems else "ok")


def collect(rules_dir: Path | None = None) -> list[tuple[Rule, Case]]:
    """Every (rule, case) for the built-in rules, or for the rules in `rules_dir`."""
    rules = load_rules([rules_dir], include_builtin=False) if rules_dir else load_rules()
    pairs = []
    for rule in rules:
        if rule.cases_path is None:
            continue
        pairs.extend((rule, case) for case in load_cases(rule.cases_path, rule))
    return pairs


def rules_without_cases(rules_dir: Path | None = None) -> list[Rule]:
    rules = load_rules([rules_dir], include_builtin=False) if rules_dir else load_rules()
    return [rule for rule in rules if rule.cases_path is None]
