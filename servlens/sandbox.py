"""What a user's profile may put in the SQL servlens runs: checked before anything of it runs.

A profile's expressions and macros are spliced into the one INSERT ... SELECT of an ingest (servlens/ingest/
compiler.py), on the connection that holds the store; DuckDB cannot be locked down there (it must read the input
file). So the profile's compiled query is parsed (json_serialize_sql) and refused unless it is one SELECT that reads
only the input file through the profile's own reader and its own CTEs: no other table of the store, no other file
(read_text, read_csv of another path, glob), no environment (getenv), no settings or secrets. A macro body is one
expression under the same rule. Built-in profiles are not checked (they are the reference). docs/security.md says
what this covers and what it does not (Python rules and --rules folders are code you trust).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb

from servlens.errors import ConfigError

# Functions that reach outside the row in hand: files, the environment, settings, secrets, other queries.
DENIED_FUNCTIONS = frozenset({
    "read_text", "read_blob", "read_csv", "read_csv_auto", "read_json", "read_json_auto", "read_json_objects",
    "read_json_objects_auto", "read_ndjson", "read_ndjson_auto", "read_ndjson_objects", "read_parquet",
    "parquet_scan", "parquet_metadata", "parquet_schema", "parquet_file_metadata", "parquet_kv_metadata",
    "sniff_csv", "glob", "getenv", "query", "query_table", "current_setting", "which_secret", "duckdb_secrets",
    "duckdb_settings", "duckdb_extensions", "duckdb_databases", "duckdb_tables", "duckdb_columns", "duckdb_views",
    "pragma_database_list", "load_extension", "install_extension", "read_xlsx", "st_read", "sqlite_scan",
    "postgres_scan", "mysql_scan", "iceberg_scan", "delta_scan", "http_get", "http_post", "system",
    "nextval", "setseed",  # a SELECT that would still change the store's sequences or the session
})

# The read_csv options a profile's [csv] table may set (DuckDB's documented options; anything else is refused
# before it reaches SQL).
CSV_OPTIONS = frozenset({
    "all_varchar", "allow_quoted_nulls", "auto_detect", "auto_type_candidates", "columns", "comment", "compression",
    "dateformat", "decimal_separator", "delim", "sep", "escape", "encoding", "force_not_null", "header",
    "ignore_errors", "max_line_size", "names", "new_line", "normalize_names", "null_padding", "nullstr", "quote",
    "sample_size", "skip", "strict_mode", "timestampformat", "types", "dtypes", "column_types", "parallel",
    "buffer_size", "thousands",
})
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def check_csv_options(profile_name: str, options: dict) -> None:
    for key in options:
        if not _IDENTIFIER.fullmatch(str(key)) or key not in CSV_OPTIONS:
            raise ConfigError(f"Profile {profile_name}: [csv] option {str(key)!r} is not a read_csv option servlens allows",
                              "Use the read_csv options listed in docs/profiles.md")


_PROFILE_HINT = "A profile holds SQL expressions only (docs/security.md)"


class SqlSyntaxError(ConfigError):
    """SQL that does not parse: it cannot run at all, so the rule checks report it with its position instead."""


def _statements(sql: str, what: str, hint: str = _PROFILE_HINT, kind: str = "SQL expression") -> list[dict]:
    """DuckDB's own parse of `sql`. json_serialize_sql serialises SELECT statements only, so ATTACH, COPY,
    INSTALL, LOAD, SET, PRAGMA, CREATE, INSERT ... are refused here by construction."""
    with duckdb.connect() as parser:  # a private in-memory instance: parsing never touches the store
        tree = json.loads(parser.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        message = str(tree.get("error_message", "")).strip().splitlines()[0].rstrip(".!")
        if message.startswith("Only SELECT statements"):
            message = "only a SELECT may run (no ATTACH, COPY, INSTALL, LOAD, SET, PRAGMA or change to the store)"
            raise ConfigError(f"{what} is not one {kind} servlens may run: {message}", hint)
        raise SqlSyntaxError(f"{what} is not one {kind} servlens may run: {message}", hint)
    return tree["statements"]


def _refusals(node, visible: frozenset[str], allowed_readers: dict[str, str | None], found: list[str]) -> None:
    """Walk the parse tree. `visible`: the tables a name may resolve to here, the allowed ones and the CTEs in
    scope (a CTE of one subquery does not make the same name safe in another)."""
    if isinstance(node, list):
        for item in node:
            _refusals(item, visible, allowed_readers, found)
        return
    if not isinstance(node, dict):
        return
    ctes = [entry.get("key") for entry in (node.get("cte_map") or {}).get("map", [])]
    if ctes:
        visible = visible | frozenset(ctes)
    kind = node.get("type")
    if kind == "BASE_TABLE":
        name = node.get("table_name", "")
        if name not in visible or node.get("schema_name") or node.get("catalog_name"):
            found.append(f"reads the table {name!r}")
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = function.get("function_name", "")
        arguments = function.get("arguments") or function.get("children") or [{}]
        first = arguments[0].get("expression", arguments[0]) if arguments else {}
        path = (first.get("literal") or {}).get("text") if first.get("class") == "CONSTANT" else None
        # a reader may read its one path (None: any arguments, for range() and the like)
        if name not in allowed_readers or allowed_readers[name] not in (None, path):
            found.append(f"calls the table function {name}()" + (f" on {path!r}" if path else ""))
        # the reader's own call is allowed; its arguments are still checked
        _refusals(function.get("arguments") or function.get("children") or [], visible, allowed_readers, found)
        for key, value in node.items():
            if key != "function":
                _refusals(value, visible, allowed_readers, found)
        return
    name = node.get("function_name")
    if name and name.lower() in DENIED_FUNCTIONS:
        found.append(f"calls {name}()")
    for value in node.values():
        _refusals(value, visible, allowed_readers, found)


def _refusal(sql: str, what: str, tables: frozenset[str], readers: dict[str, str | None], hint: str,
             kind: str) -> str | None:
    """The first thing `sql` does that it may not, or None; a text that is not one SELECT is a ConfigError."""
    statements = _statements(sql, what, hint, kind)
    if len(statements) != 1:
        raise ConfigError(f"{what} holds {len(statements)} SQL statements, not one query", hint)
    found: list[str] = []
    _refusals(statements, tables, readers, found)
    return found[0] if found else None


def check_user_query(sql: str, what: str, readers: dict[str, str]) -> None:
    """Refuse `sql` unless it is one SELECT reading only its CTEs and the input file (`readers`: table function ->
    the one path it may read, as DuckDB is given it)."""
    found = _refusal(sql, what, frozenset(), dict(readers), _PROFILE_HINT, "SQL expression")
    if found:
        raise ConfigError(f"{what} {found}, which a profile may not do",
                          "A profile's SQL reads the fields of its own file only (docs/security.md)")


def check_user_expression(sql: str, what: str) -> None:
    """Refuse `sql` unless it is one expression reading no table, file or setting."""
    check_user_query(f"SELECT ({sql})", what, readers={})


# --- rules ---------------------------------------------------------------------------------------------------------
# A user rule's SQL (a --rules folder's TOML) is checked when the rule is loaded and again right before it runs, and
# it runs on a locked-down connection: one SELECT (or WITH ... SELECT) over the scope views, no other table of the
# store, no table function but the row generators, none of the functions that reach outside the row in hand; and the
# connection can then no longer touch a file (enable_external_access = false: no read_*, glob, COPY, ATTACH, INSTALL
# or LOAD) nor change a setting (lock_configuration). Built-in rules are the reference and are not checked.

# What a rule's SQL may read (the views of RULE_CONTRACT_SPEC.md / docs/rules-contract.md, built by the runner).
RULE_VIEWS = frozenset({
    "scope_requests", "scope_metrics", "scope_counter_increases", "scope_windows", "metric_roles",
    "scope_role_samples", "rule_metrics",
})
# Table functions that only generate rows.
RULE_TABLE_FUNCTIONS = {"range": None, "generate_series": None, "unnest": None}
_RULE_HINT = "A rule's SQL is one SELECT over the scope views (docs/security.md)"


def check_rule_sql(sql: str, what: str, tables: frozenset[str] = RULE_VIEWS) -> None:
    """Refuse `sql` unless it is one SELECT / WITH query reading only `tables` and its own CTEs. `what` names it in
    the message, e.g. "rules/XY901-high-error-rate.toml: detector.sql"."""
    found = _refusal(sql, what, tables, RULE_TABLE_FUNCTIONS, _RULE_HINT, "SQL query")
    if found:
        raise ConfigError(f"{what} {found}, which a rule's SQL may not do", _RULE_HINT)


def check_rule_expression(sql: str, what: str, tables: frozenset[str] = RULE_VIEWS) -> None:
    """The same for a predicate or an expression of a rule ([decide] fired = "...", examples.where)."""
    check_rule_sql(f"SELECT ({sql}) FROM rule_metrics", what, tables | {"rule_metrics"})


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """From now on `con`'s database cannot read or write a file, attach a database, install or load an extension,
    or change a setting. For the rest of the process: call it once ingest is over (it is idempotent)."""
    locked = con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]
    if locked:
        return
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def is_user_rule(path) -> bool:
    """A rule read from a --rules folder (not one of the built-in rules)."""
    from servlens.analysis.rules import builtin_rules_dir

    if path is None:
        return False
    builtin = builtin_rules_dir().resolve()
    return builtin not in Path(path).resolve().parents


def check_detector_result(rule_id: str, detector: str, result):
    """A detector's result as the runner needs it (a dict; evidence a dict, examples a list, summary and reason
    text), or a ConfigError naming the rule: a Python rule that returns the wrong type is one sentence, not a
    traceback from deep inside the runner."""
    hint = ("A detector returns a dict: state (fired, clear or not_evaluable), summary, reason, evidence (a dict) "
            "and examples (a list); see docs/CONTRIBUTING.md")
    if not isinstance(result, dict):
        raise ConfigError(f"Rule {rule_id}'s detector ({detector}) returned {_type_name(result)}, not a dict", hint)
    for key, kinds, name in (("evidence", dict, "a dict"), ("examples", list, "a list"),
                             ("summary", str, "text"), ("reason", str, "text"), ("severity", str, "text")):
        value = result.get(key)
        if value is not None and not isinstance(value, kinds):
            raise ConfigError(f"Rule {rule_id}'s detector ({detector}) returned {key} as {_type_name(value)}, "
                              f"not {name}", hint)
    return result


def _type_name(value) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
