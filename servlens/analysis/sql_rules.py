"""Running a SQL-first rule (docs/rules-contract.md): views, the detector's metrics row, the decision, the sentences
and the evidence, all in SQL; Python only carries rows between them and fills the templates.

Per scope, after the runner made the scope views:

1. the rule's `[views]` are created as temp views, in order;
2. the detector SQL becomes the one-row temp table `rule_metrics` (exactly one row, else a rule error);
3. `[decide]` predicates are evaluated over it in SQL: not_evaluable, then fired, then each severity entry;
4. `[summary]` (and `decide.reason`) templates are filled from the row and the parameters;
5. for a fired finding (and a clear one, for an evidence table with always = true) the evidence SQL runs: table, chart, windows,
   examples; it reads `rule_metrics` and the scope views.

Columns whose name starts with `_` feed the templates and the decision but are not evidence metrics. Every SQL has
its macros expanded and `$param`s written as literals first (servlens/analysis/rule_sql.py). A SQL error is a
RuleSqlError naming the rule file, the TOML key and the line/column in that SQL.
"""

from __future__ import annotations

import math
import re
from typing import Any

import duckdb

from servlens.analysis.rule_contract import EvidenceSpec, fill_template
from servlens.analysis.rule_sql import SqlMacroError, SqlPosition, prepare
from servlens.analysis.windows import iso
from servlens.errors import ConfigError

_LINE_RE = re.compile(r"\nLINE (\d+): (.*)\n( *)\^")


class RuleSqlError(ConfigError):
    """A rule's SQL failed: names the file, the key, the rule and (when DuckDB says) the line and column."""

    def __init__(self, rule, key: str, detail: str, where: SqlPosition | None):
        at = f" at line {where.line}, column {where.column}" if where else ""
        super().__init__(f"{rule.path}: {key}{at}: {detail}",
                         "Fix the rule's SQL (servlens rules check lists every error)")
        self.key = key
        self.where = where
        self.detail = detail


def duckdb_position(message: str, prepared: str, prefix: str = "") -> SqlPosition | None:
    """The line/column of a DuckDB error in the rule's SQL. Expansions are one line, so the line is the rule's own;
    on a line with a macro or a parameter the column counts the expanded text."""
    found = _LINE_RE.search(message)
    if not found:
        return None
    line, shown = int(found.group(1)), found.group(2)
    caret = len(found.group(3)) - len(f"LINE {found.group(1)}: ")
    lines = (prefix + prepared).split("\n")
    if not 1 <= line <= len(lines):
        return None
    # DuckDB shows a window of a long line (with "..." around it): find that window in the real line.
    lead = len(shown) - len(shown.lstrip("."))
    window = shown.strip(".")
    offset = lines[line - 1].find(window) if window else -1
    column = (offset + caret - lead) if offset >= 0 else caret
    if line == 1:
        column -= len(prefix)
    return SqlPosition(line, max(1, column + 1))


def clean_message(exc: Exception) -> str:
    """DuckDB's message without its LINE/caret block: one sentence for the user."""
    text = str(exc).split("\n\nLINE ")[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def run_sql(con: duckdb.DuckDBPyConnection, rule, key: str, sql: str, params: dict[str, Any],
            prefix: str = "", suffix: str = "") -> duckdb.DuckDBPyConnection:
    """Prepare (macros, literals) and run one of the rule's SQL texts; errors name the key and the position."""
    try:
        prepared = prepare(sql, params)
    except SqlMacroError as exc:
        raise RuleSqlError(rule, key, exc.message, exc.where) from exc
    try:
        return con.execute(prefix + prepared + suffix)
    except duckdb.OutOfMemoryException:
        raise  # the machine's limit, not the rule's SQL (the CLI says what to set)
    except duckdb.Error as exc:
        raise RuleSqlError(rule, key, clean_message(exc), duckdb_position(str(exc), prepared, prefix)) from exc


def _rows(cursor) -> tuple[list[str], list[tuple]]:
    return [d[0] for d in cursor.description], cursor.fetchall()


def _dicts(cursor) -> list[dict]:
    names, rows = _rows(cursor)
    return [dict(zip(names, row)) for row in rows]


def _predicate(con, rule, key: str, sql: str, params: dict) -> bool:
    value = run_sql(con, rule, key, sql, params, prefix="SELECT (", suffix="\n) AS decided FROM rule_metrics"
                    ).fetchone()[0]
    if value is not None and not isinstance(value, bool):
        raise RuleSqlError(rule, key, f"gives {value!r}, not true/false/NULL", None)
    return bool(value)


def _significant(value: Any) -> Any:
    """A float metric to 10 significant digits: a sum the engine's threads add in another order differs in the last
    bits from run to run, and a report must not change with it (a tiny p-value keeps its digits)."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.10g}")
    return value


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if hasattr(value, "__float__") and not isinstance(value, (int, bool)):
        return round(float(value), 4)
    return value


def _table(con, rule, spec: EvidenceSpec, params: dict, values: dict) -> dict:
    names, rows = _rows(run_sql(con, rule, "evidence.table.sql", spec.spec["sql"], params))
    return {"columns": names, "rows": [[_rounded(v) for v in row] for row in rows]}


def _series(names: list[str], rows: list[tuple], key: str, rule) -> list[dict]:
    if "x" not in names:
        raise RuleSqlError(rule, key, f"returns columns {', '.join(names)}; a chart needs x", None)
    xi = names.index("x")
    if "series" in names:
        if "y" not in names:
            raise RuleSqlError(rule, key, "has a series column but no y", None)
        si, yi = names.index("series"), names.index("y")
        out: dict[Any, dict] = {}
        for row in rows:
            entry = out.setdefault(row[si], {"name": str(row[si]), "x": [], "y": []})
            entry["x"].append(row[xi])
            entry["y"].append(_rounded(row[yi]))
        return list(out.values())
    # One series per column; a column with no value at all (a gauge the scope lacks) draws nothing, so it is left out.
    return [{"name": name, "x": [row[xi] for row in rows], "y": [_rounded(row[i]) for row in rows]}
            for i, name in enumerate(names) if i != xi and any(row[i] is not None for row in rows)]


def _chart(con, rule, spec: EvidenceSpec, params: dict, values: dict) -> dict:
    s = spec.spec
    names, rows = _rows(run_sql(con, rule, "evidence.chart.sql", s["sql"], params))
    # Titles and labels may name the metrics ({_latency_short} per request ...), like the summary's sentences.
    title, x_label, y_label = (fill_template(s[k], values) for k in ("title", "x_label", "y_label"))
    chart = {"type": s["type"], "title": title, "x_label": x_label, "y_label": y_label,
             "x_time": s.get("x_time", False), "x_log": s.get("x_log", False), "y_log": s.get("y_log", False),
             "series": _series(names, rows, "evidence.chart.sql", rule), "hlines": [], "vspans": []}
    if s.get("y_logit"):
        chart["y_logit"] = True
    for key, field in (("hlines_sql", "hlines"), ("vlines_sql", "vlines"), ("vspans_sql", "vspans")):
        if key in s:
            chart[field] = [{k: _rounded(v) for k, v in row.items() if v is not None}
                            for row in _dicts(run_sql(con, rule, f"evidence.chart.{key}", s[key], params))]
    return chart


def _windows(con, rule, spec: EvidenceSpec, params: dict, values: dict) -> list[dict]:
    found = _dicts(run_sql(con, rule, "evidence.windows.sql", spec.spec["sql"], params))
    if found and not {"start", "end"} <= set(found[0]):
        raise RuleSqlError(rule, "evidence.windows.sql", f"returns {', '.join(found[0])}; windows need start, end",
                           None)
    return [{k: (iso(v) if k in ("start", "end") else v) for k, v in row.items()} for row in found]


def examples_sql(order_by: str, source: str, limit: int) -> tuple[str, str]:
    """The examples query that goes around the rule's predicate (prefix, suffix), ordered by `order_by`, then
    line."""
    prefix = (f"SELECT r.request_id, s.path AS source, r.source_line AS line FROM (SELECT request_id, source_id, "
              f"source_line, row_number() OVER (ORDER BY {order_by}, source_line) AS k FROM {source} WHERE (")
    suffix = f"\n) ORDER BY k LIMIT {int(limit)}) r LEFT JOIN sources s ON s.source_id = r.source_id ORDER BY r.k"
    return prefix, suffix


def _examples(con, rule, spec: EvidenceSpec, params: dict, values: dict) -> list[dict]:
    s = spec.spec
    order_by = prepare(s.get("order_by") or "t_at", params)
    prefix, suffix = examples_sql(order_by, s.get("from", "scope_requests"), s.get("limit", 5))
    return [{"request_id": row["request_id"], "source": row["source"], "line": row["line"]}
            for row in _dicts(run_sql(con, rule, "evidence.examples.where", s["where"], params, prefix, suffix))]


_EVIDENCE = {"table": _table, "chart": _chart, "windows": _windows, "examples": _examples}


def run_contract(con: duckdb.DuckDBPyConnection, rule, params: dict[str, Any]) -> dict:
    """The detector result of a SQL-first rule on the current scope (the runner completes it into a finding)."""
    contract = rule.contract
    created: list[tuple[str, str]] = []
    try:
        for name, sql in contract.views.items():
            # materialised: a view would be re-run by every query that reads it (SL013's read five times)
            run_sql(con, rule, f"views.{name}", sql, params, prefix=f"CREATE OR REPLACE TEMP TABLE {name} AS ")
            created.append(("TABLE", name))
        run_sql(con, rule, "detector.sql", rule.sql, params, prefix="CREATE OR REPLACE TEMP TABLE rule_metrics AS ")
        created.append(("TABLE", "rule_metrics"))
        rows = _dicts(con.execute("SELECT * FROM rule_metrics"))
        if len(rows) != 1:
            raise RuleSqlError(rule, "detector.sql", f"returned {len(rows)} rows; the detector returns exactly one "
                               "row (the metrics)", None)
        row = rows[0]
        values = {**params, **row}
        decide = contract.decide
        if decide.not_evaluable and _predicate(con, rule, "decide.not_evaluable", decide.not_evaluable, params):
            state = "not_evaluable"
        elif _predicate(con, rule, "decide.fired", decide.fired, params):
            state = "fired"
        else:
            state = "clear"
        severity = rule.severity
        if state == "fired":
            for index, entry in enumerate(decide.severity):
                if _predicate(con, rule, f"decide.severity[{index}].when", entry.when, params):
                    severity = entry.level
        evidence: dict[str, Any] = {"metrics": {k: _significant(v) for k, v in row.items() if not k.startswith("_")}}
        examples: list[dict] = []
        for kind, spec in contract.evidence.items():
            if state == "fired" or (spec.always and state == "clear"):
                found = _EVIDENCE[kind](con, rule, spec, params, values)
                if kind == "examples":
                    examples = found
                else:
                    evidence[kind] = found
        result = {"state": state, "severity": severity, "evidence": evidence, "examples": examples,
                  "summary": fill_template(getattr(contract.summary, state), values)}
        if state == "not_evaluable":
            result["reason"] = fill_template(decide.reason, values)
        elif state == "fired" and row.get("_remediation"):
            result["remediation"] = row["_remediation"]  # what to do depends on what was found (one line per cause)
        return result
    finally:
        for kind, name in reversed(created):
            con.execute(f"DROP {kind} IF EXISTS {name}")
