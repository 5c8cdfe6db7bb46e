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


def _statements(sql: str, what: str) -> list[dict]:
    tree = json.loads(duckdb.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise ConfigError(f"{what} is not one SQL expression servlens may run: {tree.get('error_message', '')}",
                          "A profile holds SQL expressions only (docs/security.md)")
    return tree["statements"]


def _refusals(node, allowed_tables: set[str], allowed_readers: dict[str, str], found: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _refusals(item, allowed_tables, allowed_readers, found)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "BASE_TABLE":
        name = node.get("table_name", "")
        if name not in allowed_tables or node.get("schema_name") or node.get("catalog_name"):
            found.append(f"reads the table {name!r}")
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = function.get("function_name", "")
        arguments = function.get("arguments") or function.get("children") or [{}]
        first = arguments[0].get("expression", arguments[0]) if arguments else {}
        path = (first.get("literal") or {}).get("text") if first.get("class") == "CONSTANT" else None
        if name not in allowed_readers or path != allowed_readers[name]:
            found.append(f"calls the table function {name}()" + (f" on {path!r}" if path else ""))
        # the reader's own call is allowed; its arguments are still checked
        _refusals(function.get("arguments") or function.get("children") or [], allowed_tables, allowed_readers, found)
        for key, value in node.items():
            if key != "function":
                _refusals(value, allowed_tables, allowed_readers, found)
        return
    name = node.get("function_name")
    if name and name.lower() in DENIED_FUNCTIONS:
        found.append(f"calls {name}()")
    for value in node.values():
        _refusals(value, allowed_tables, allowed_readers, found)


def _cte_names(node, names: set[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _cte_names(item, names)
    elif isinstance(node, dict):
        for entry in (node.get("cte_map") or {}).get("map", []):
            names.add(entry.get("key"))
        for value in node.values():
            _cte_names(value, names)


def check_user_query(sql: str, what: str, readers: dict[str, str]) -> None:
    """Refuse `sql` unless it is one SELECT reading only its CTEs and the input file (`readers`: table function ->
    the one path it may read, as DuckDB is given it)."""
    statements = _statements(sql, what)
    if len(statements) != 1:
        raise ConfigError(f"{what} holds {len(statements)} SQL statements, not one query",
                          "A profile holds SQL expressions only (docs/security.md)")
    tables: set[str] = set()
    _cte_names(statements, tables)
    found: list[str] = []
    _refusals(statements, tables, readers, found)
    if found:
        raise ConfigError(f"{what} {found[0]}, which a profile may not do",
                          "A profile's SQL reads the fields of its own file only (docs/security.md)")


def check_user_expression(sql: str, what: str) -> None:
    """Refuse `sql` unless it is one expression reading no table, file or setting."""
    check_user_query(f"SELECT ({sql})", what, readers={})
