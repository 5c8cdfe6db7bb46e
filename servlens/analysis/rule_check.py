"""`servlens rules check`: every rule loaded, every SQL expanded and bound against empty scope views, every
template's names checked, and ALL the problems reported (not the first), each with the file, the TOML key and, for
SQL, the line and column in the file.

The SQL is bound the way the runner runs it: the rule's views are created, the detector becomes `rule_metrics`
(over empty views, so it costs nothing), and decide predicates and evidence queries are EXPLAINed in the statement
the runner wraps them in. An error in a view or the detector leaves the SQL that reads it unchecked rather than
reported twice.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import duckdb

from servlens.analysis.rule_sql import SqlMacroError, prepare
from servlens.analysis.rules import Rule, builtin_rules_dir, load_rule_file, rule_files
from servlens.analysis.sql_rules import clean_message, duckdb_position, examples_sql
from servlens.errors import ConfigError


@dataclass(frozen=True)
class Problem:
    path: Path
    key: str | None
    message: str
    line: int | None = None      # in the file
    column: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}:{self.column}" if self.line else f"{self.path}"
        return f"{where}: {self.key + ': ' if self.key else ''}{self.message}"


def _key_position(text: str, key: str) -> tuple[int, int] | None:
    """Where the value of `key` (e.g. evidence.chart.sql, decide.severity[0].when) starts in the file: the line of
    `leaf = ` under its table header, and the column after the opening quote (a '''-string that starts with a
    newline starts on the next line, column 1)."""
    import re

    parts = re.sub(r"\[\d+\]", "", key).split(".")
    table, leaf = ".".join(parts[:-1]), parts[-1]
    lines = text.split("\n")
    start = 0
    if table:
        headers = [i for i, l in enumerate(lines) if l.strip() in (f"[{table}]", f"[[{table}]]")]
        index = int(re.findall(r"\[(\d+)\]", key)[0]) if re.findall(r"\[(\d+)\]", key) else 0
        if len(headers) <= index:
            return None
        start = headers[index] + 1
    for i in range(start, len(lines)):
        if lines[i].startswith("["):
            return None
        found = re.match(rf"\s*{re.escape(leaf)}\s*=\s*('''|\"\"\"|'|\")", lines[i])
        if found:
            if found.group(1) in ("'''", '"""') and lines[i].rstrip().endswith(found.group(1)):
                return i + 2, 1
            return i + 1, found.end() + 1
    return None


def _file_position(path: Path, key: str, sql: str, line: int, column: int) -> tuple[int, int]:
    """A line/column in `sql` as a line/column in the rule file: the SQL's text is found in the file (a literal
    '''-string is verbatim), else the key's value is (a basic string with escapes); else the SQL's own line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return line, column
    lines = sql.split("\n")
    anchor = next((i for i, l in enumerate(lines) if l.strip()), None)
    if anchor is None:
        return line, column
    at = text.find("\n".join(lines[anchor:anchor + 3]))
    if at < 0:
        found = _key_position(text, key)
        if found is None:
            return line, column
        return found[0] + line - 1, column + (found[1] - 1 if line == 1 else 0)
    first = text.count("\n", 0, at) + 1 - anchor
    if line - 1 == anchor:  # the SQL's first line may start mid-line in the file: where = "..."
        column += at - (text.rfind("\n", 0, at) + 1)
    return first + line - 1, column


def _fields(template: str) -> set[str]:
    try:
        return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError:
        return {"{"}


class _Checker:
    def __init__(self, rule: Rule, problems: list[Problem]):
        self.rule = rule
        self.problems = problems
        self.params = rule.default_params()
        self.failed: set[str] = set()

    def report(self, key: str, message: str, sql: str | None = None, line: int | None = None,
               column: int | None = None) -> None:
        if sql is not None and line is not None:
            line, column = _file_position(self.rule.path, key, sql, line, column or 1)
        elif line is None:
            try:
                line, column = _key_position(self.rule.path.read_text(encoding="utf-8"), key) or (None, None)
            except OSError:
                pass
        self.problems.append(Problem(self.rule.path, key, message, line, column))

    def run(self, con, key: str, sql: str, prefix: str = "", suffix: str = "") -> bool:
        try:
            prepared = prepare(sql, self.params)
        except SqlMacroError as exc:
            self.report(key, exc.message, sql, exc.where.line, exc.where.column)
            return False
        try:
            con.execute(prefix + prepared + suffix)
        except duckdb.Error as exc:
            where = duckdb_position(str(exc), prepared, prefix)
            self.report(key, clean_message(exc), sql, where.line if where else None, where.column if where else None)
            return False
        return True

    def reads_failed(self, key: str, sql: str, con) -> bool:
        """Whether `sql` reads a view or table whose own SQL failed; then it is only parsed (its syntax errors are
        still reported, its binding would only repeat the first error)."""
        lowered = sql.lower()
        if not any(name in lowered for name in self.failed):
            return False
        self.parse_only(key, sql, con)
        return True

    def parse_only(self, key: str, sql: str, con) -> None:
        try:
            prepared = prepare(sql, self.params)
        except SqlMacroError as exc:
            self.report(key, exc.message, sql, exc.where.line, exc.where.column)
            return
        prefix, suffix = {"decide": ("SELECT (", "\n)"), "evidence.examples.where": ("SELECT 1 WHERE (", "\n)"),
                          "evidence.examples.order_by": ("SELECT 1 ORDER BY ", "")}.get(
            "decide" if key.startswith("decide.") else key, ("", ""))
        try:
            con.extract_statements(prefix + prepared + suffix)
        except duckdb.Error as exc:
            where = duckdb_position(str(exc), prepared, prefix)
            self.report(key, clean_message(exc), sql, where.line if where else None, where.column if where else None)

    def check(self, con) -> None:
        rule, contract = self.rule, self.rule.contract
        if contract is None:
            self.run(con, "detector.sql", rule.sql, prefix="EXPLAIN ")
            return
        for name, sql in contract.views.items():
            if self.reads_failed(f"views.{name}", sql, con):
                self.failed.add(name)
            elif not self.run(con, f"views.{name}", sql, prefix=f"CREATE OR REPLACE TEMP VIEW {name} AS "):
                self.failed.add(name)
        if self.reads_failed("detector.sql", rule.sql, con) or not self.run(
                con, "detector.sql", rule.sql, prefix="CREATE OR REPLACE TEMP TABLE rule_metrics AS "):
            self.failed.add("rule_metrics")
            for key, sql in contract.sql_items():
                if not key.startswith("views."):
                    self.parse_only(key, sql, con)
            return
        columns = [row[0] for row in con.execute("DESCRIBE rule_metrics").fetchall()]
        for key, sql in contract.sql_items():
            if key.startswith("views.") or self.reads_failed(key, sql, con):
                continue
            if key.startswith("decide."):
                self.run(con, key, sql, prefix="EXPLAIN SELECT (", suffix="\n) AS decided FROM rule_metrics")
            elif key == "evidence.examples.where":
                spec = contract.evidence["examples"].spec
                order_by = prepare(spec.get("order_by") or "t_at", self.params)
                prefix, suffix = examples_sql(order_by, spec.get("from", "scope_requests"), 5)
                self.run(con, key, sql, prefix="EXPLAIN " + prefix, suffix=suffix)
            elif key == "evidence.examples.order_by":
                source = contract.evidence["examples"].spec.get("from", "scope_requests")
                self.run(con, key, sql, prefix=f"EXPLAIN SELECT request_id FROM {source} ORDER BY ")
            else:
                self.run(con, key, sql, prefix="EXPLAIN ")
        self.check_templates(columns)

    def check_templates(self, columns: list[str]) -> None:
        rule, contract = self.rule, self.rule.contract
        known = set(columns) | set(rule.params)
        templates = [("summary.fired", contract.summary.fired), ("summary.clear", contract.summary.clear),
                     ("summary.not_evaluable", contract.summary.not_evaluable), ("decide.reason", contract.decide.reason),
                     ("remediation", rule.remediation), ("rollback", rule.rollback)]
        for key, template in templates:
            if not template:
                continue
            unknown = sorted(_fields(template) - known)
            if unknown:
                self.report(key, "names " + ", ".join("{" + u + "}" for u in unknown) + ", which is neither a "
                            "column of the detector's row nor a parameter (columns: " + ", ".join(columns) + ")")


def _empty_scope(con) -> None:
    from servlens.analysis.runner import Scope, prepare_scope

    prepare_scope(con, Scope("rules-check", None, None))


def check_rules(directory: Path | None = None) -> tuple[int, list[Problem]]:
    """(rules checked, problems) for the rules in `directory`, or the built-in ones."""
    from servlens.store.schema import open_store

    folder = directory or builtin_rules_dir()
    problems: list[Problem] = []
    try:
        files = rule_files(folder)
    except ConfigError as exc:
        return 0, [Problem(folder, None, exc.message)]
    seen: dict[str, Path] = {}
    con = open_store(None)
    try:
        _empty_scope(con)
        for path in files:
            try:
                rule = load_rule_file(path)
            except ConfigError as exc:
                problems.append(Problem(path, None, exc.message.removeprefix(f"{path}: ")))
                continue
            for rule_id in (rule.id, *rule.aliases):
                if rule_id in seen:
                    problems.append(Problem(path, "id", f"{rule_id} is also the id or an alias of {seen[rule_id]}"))
                seen[rule_id] = path
            if rule.sql:
                _Checker(rule, problems).check(con)
                for kind in ("VIEW", "TABLE"):
                    for (name,) in con.execute(f"SELECT {kind.lower()}_name FROM duckdb_{kind.lower()}s() "
                                               "WHERE temporary AND NOT internal").fetchall():
                        if name not in ("metric_roles",) and not name.startswith("scope_"):
                            con.execute(f"DROP {kind} IF EXISTS {name}")
    finally:
        con.close()
    return len(files), problems
