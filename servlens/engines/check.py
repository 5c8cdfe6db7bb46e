"""`servlens engines check`: can this engine run servlens? Like Soda Core's dialect classes, the answer comes from
the engine itself: its version, its function list (ClickHouse `system.functions`, Spark `SHOW FUNCTIONS`, DuckDB
`duckdb_functions()`), and the canonical columns of the bound tables.

For every piece of SQL servlens would send (the function map's own forms, each SQL rule's detector, decide and
evidence SQL) the check translates it for the engine, lists the functions the translation calls, and names those the
engine lacks. A Python detector builds its SQL as it runs, so it cannot be checked in advance: it is reported as
running where its parity with DuckDB is tested (the rule's `engines` key), and as untested elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp, parse_one
from sqlglot.errors import ParseError

from servlens.engines.base import CANONICAL_TABLES, Engine
from servlens.engines.functions import UnsupportedSQL, parse
from servlens.engines.python_functions import COMPUTED, calls, probe
from servlens.engines.schema import canonical_columns

# Printed like calls but syntax, not functions an engine lists.
_SYNTAX = {"case", "cast", "try_cast", "extract", "interval", "filter", "over", "within", "coalesce", "exists"}
# Spark's parser reads TIMESTAMPDIFF(unit, a, b) as syntax (the unit is a keyword): SHOW FUNCTIONS does not list it.
_DIALECT_SYNTAX = {"spark": {"timestampdiff"}}
_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")

# One probe per construct of the function map (servlens/engines/functions.py), over the canonical columns.
MAP_PROBES = {
    "exact quantile": "SELECT quantile_cont(ttft_s, 0.99) FROM requests",
    "quantile list": "SELECT quantile_cont(ttft_s, [0.5, 0.99])[2] FROM requests",
    "median": "SELECT median(e2e_s) FROM requests",
    "date_diff": "SELECT max(date_diff('microsecond', TIMESTAMP '2026-01-01 00:00:00', t_arrival)) FROM requests",
    "time bucket": "SELECT count(DISTINCT time_bucket(INTERVAL 5 SECOND, t_arrival)) FROM requests",
    "date_trunc": "SELECT min(date_trunc('minute', t_arrival)) FROM requests",
    "epoch": "SELECT max(epoch(t_arrival)) FROM requests",
    "regr_slope": "SELECT regr_slope(e2e_s, completion_tokens) FROM requests",
    "ranks": "SELECT max(k) FROM (SELECT row_number() OVER (ORDER BY ttft_s) AS k FROM requests)",
    "batches": "SELECT max(b) FROM (SELECT ntile(10) OVER (ORDER BY t_arrival) AS b FROM requests)",
    "labels": "SELECT count(labels['model_name']) FROM metric_samples",
    "count_if": "SELECT count_if(ttft_s > 1) FROM requests",
    "filter": "SELECT count(*) FILTER (WHERE finish_reason = 'length') FROM requests",
    "division": "SELECT sum(e2e_s) / nullif(count(*), 0) FROM requests",
    "GROUP BY ALL": "SELECT run, count(*) FROM requests GROUP BY ALL",
}


@dataclass
class Check:
    """One piece of SQL on the engine: the functions it calls that the engine lacks, or why it cannot go there."""

    name: str
    missing: list[str] = field(default_factory=list)
    problem: str | None = None
    ran: bool | None = None        # None: not run (no table bound); True/False: the engine ran / refused it

    @property
    def ok(self) -> bool:
        return not self.missing and self.problem is None and self.ran is not False


# Words before "(" in SQL that are no function, for reading a query sqlglot cannot parse back.
_KEYWORDS = _SYNTAX | {"as", "in", "on", "and", "or", "not", "values", "using", "from", "join", "select", "where",
                       "with", "by", "when", "then", "else", "all", "any", "union", "array", "map", "tuple",
                       "nullable"}
_STRINGS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|--[^\n]*|/\*.*?\*/", re.S)
_CTE_COLUMNS = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\([A-Za-z0-9_\s,]*\)\s+AS\s*\(", re.I)
_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def functions_called(native_sql: str, dialect: str) -> set[str]:
    """Lower-cased names of the functions a translated query calls, as the engine will read them."""
    try:
        tree = parse_one(native_sql, read=dialect)
    except ParseError:
        # sqlglot does not read back every query it wrote for this engine (ClickHouse's CTEs with FILTER): the
        # names before "(" then, which is what the engine's own parser will look up.
        code = _STRINGS.sub(" ", native_sql)  # words in literals, quoted names and comments are no calls
        ctes = {m.group(1).lower() for m in _CTE_COLUMNS.finditer(code)}  # WITH t(a, b) AS (...): a name, no call
        skip = _KEYWORDS | ctes | _DIALECT_SYNTAX.get(dialect, set())
        return {m.group(1).lower() for m in _CALL.finditer(code) if m.group(1).lower() not in skip}
    names = set()
    syntax = _SYNTAX | _DIALECT_SYNTAX.get(dialect, set())
    for node in tree.find_all(exp.Func):
        if isinstance(node, exp.ParameterizedAgg):
            names.add(str(node.this).lower())
            continue
        match = _NAME.match(node.sql(dialect))
        if match and match.group(1).lower() not in syntax:
            names.add(match.group(1).lower())
    return names


def check_sql(engine: Engine, name: str, sql: str, available: set[str], run: bool) -> Check:
    try:
        native = engine.native(sql)
    except UnsupportedSQL as exc:
        return Check(name, problem=str(exc))
    # servlens' statistical functions are computed in Python from the engine's aggregates (python_functions)
    computed = set(COMPUTED) if engine.name != "duckdb" else set()
    try:
        tree = parse(sql)
        for call in calls(tree):
            probe(tree, call)  # raises when the call is where servlens cannot compute it
    except UnsupportedSQL as exc:
        return Check(name, problem=str(exc))
    missing = sorted(functions_called(native, engine.dialect) - available - computed)
    result = Check(name, missing=missing)
    if run and not missing:
        try:
            engine.query(f"SELECT * FROM ({sql}) AS probe LIMIT 0")
            result.ran = True
        except Exception as exc:  # noqa: BLE001 (the engine's own refusal is the answer)
            result.ran = False
            result.problem = getattr(exc, "engine_message", str(exc)).splitlines()[0][:200]
    return result


def rule_sql(rule) -> dict[str, str]:
    """Every piece of SQL a rule sends (docs/rules-contract.md), macros expanded and the default parameters
    written in: its views, detector, decide predicates and evidence SQL, keyed as in the TOML."""
    from servlens.analysis.rule_sql import prepare

    params = rule.default_params()
    found = {}
    contract = getattr(rule, "contract", None)
    if contract:
        for name, sql in contract.views.items():
            found[f"views.{name}"] = prepare(sql, params)
    if rule.sql:
        found["detector.sql"] = prepare(rule.sql, params)
    if contract:
        decide = contract.decide
        predicates = {"decide.fired": decide.fired, "decide.not_evaluable": decide.not_evaluable}
        predicates |= {f"decide.severity[{i}].when": entry.when for i, entry in enumerate(decide.severity)}
        for key, predicate in predicates.items():
            if predicate:
                found[key] = f"SELECT ({prepare(predicate, params)}) AS decided FROM rule_metrics"
        for kind, spec in contract.evidence.items():
            for key in ("sql", "hlines_sql", "vlines_sql", "vspans_sql"):
                if key in spec.spec:
                    found[f"evidence.{kind}.{key}"] = prepare(spec.spec[key], params)
            if kind == "examples":
                found["evidence.examples.where"] = f"SELECT 1 FROM scope_requests WHERE {prepare(spec.spec['where'], params)}"
    return found


def check_engine(engine: Engine, rules: list, tables_bound: bool) -> dict:
    """The engine check document: version, map probes, columns, and each rule's verdict."""
    available = engine.functions()
    probes = [check_sql(engine, name, sql, available, tables_bound) for name, sql in MAP_PROBES.items()]
    columns = {}
    if tables_bound:
        for table in CANONICAL_TABLES:
            present = set(engine.columns(table))
            columns[table] = [c for c, _ in canonical_columns(table) if c not in present]
    verdicts = []
    for rule in rules:
        pieces = rule_sql(rule)
        if getattr(rule, "python", None):
            tested = tested_on(rule, engine)
            verdicts.append({"rule": rule.id, "runs": tested, "checks": [],
                             "reason": None if tested else
                             "a Python detector, whose SQL is built as it runs: its parity is tested on "
                             + ", ".join(rule.engines) + " only"})
            continue
        checks = [check_sql(engine, f"{rule.id} {part}", sql, available, False) for part, sql in pieces.items()]
        bad = [c for c in checks if not c.ok]
        verdicts.append({"rule": rule.id, "runs": not bad, "checks": [_as_dict(c) for c in checks],
                         "reason": "; ".join(_why(c) for c in bad) or None})
    return {
        "kind": "engines-check", "engine": engine.describe(), "functions_known": len(available),
        "probes": [_as_dict(p) for p in probes], "missing_columns": columns, "rules": verdicts,
        "ok": all(p.ok for p in probes) and not any(columns.values()) and all(v["runs"] for v in verdicts),
    }


def tested_on(rule, engine: Engine) -> bool:
    """Whether the rule's parity with DuckDB is tested on this engine (a ClickHouse server is chDB's code)."""
    return (engine.name if engine.name != "clickhouse" else "chdb") in rule.engines


def _why(check: Check) -> str:
    if check.missing:
        return f"{check.name}: the engine lacks {', '.join(check.missing)}"
    return f"{check.name}: {check.problem}"


def _as_dict(check: Check) -> dict:
    return {"name": check.name, "ok": check.ok, "missing": check.missing, "problem": check.problem, "ran": check.ran}


def render_check(doc: dict) -> str:
    eng = doc["engine"]
    lines = [f"{eng['name']} {eng['version']} ({eng['url']}): {doc['functions_known']} functions known"]
    if eng.get("table"):
        lines.append(f"tables: {eng['table']}")
    lines.append("")
    lines.append("Function map:")
    for result in doc["probes"]:
        state = "ok" if result["ok"] else ("MISSING " + ", ".join(result["missing"]) if result["missing"]
                                         else f"FAILS: {result['problem']}")
        ran = "" if result["ran"] is None else (" (ran)" if result["ran"] else "")
        lines.append(f"  {result['name']:<15} {state}{ran}")
    for table, missing in doc["missing_columns"].items():
        lines.append(f"{table}: " + ("every canonical column" if not missing else
                                     f"lacks {', '.join(missing)} (read as NULL: unknown, not zero)"))
    lines.append("")
    lines.append("Rules:")
    for verdict in doc["rules"]:
        lines.append(f"  {verdict['rule']:<7} " + ("runs here" if verdict["runs"] else f"not here: {verdict['reason']}"))
    runnable = sum(v["runs"] for v in doc["rules"])
    lines.append("")
    lines.append(f"{runnable} of {len(doc['rules'])} rules run on {eng['name']}; "
                 + ("every function servlens maps is there." if all(p["ok"] for p in doc["probes"])
                    else "some functions servlens maps are missing (above)."))
    return "\n".join(lines)
