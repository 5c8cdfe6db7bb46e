"""The `format_columns` table: which canonical request columns each built-in format profile maps, so rule SQL can
tell a source that records failures (its profile maps an outcome column, even when no request failed: vllm bench's
`errors` list is all empty strings on a clean run) from one that never would (a public trace)."""

from __future__ import annotations

import duckdb


def format_column_rows() -> list[tuple[str, str]]:
    """(format, column_name) for every built-in format profile and the canonical columns it maps."""
    from servlens.ingest.profiles import RENAMED_PROFILES, builtin_profiles

    mapped = {p.name: sorted(p.columns) for p in builtin_profiles()}
    for old, new in RENAMED_PROFILES.items():  # sources ingested under an old name keep it
        mapped.setdefault(old, mapped.get(new, []))
    return [(name, column) for name, columns in sorted(mapped.items()) for column in columns]


def install(con: duckdb.DuckDBPyConnection) -> None:
    """The `format_columns(format, column_name)` temp table on `con`, from the built-in profiles; idempotent."""
    try:  # a probe, not a catalog listing: this runs once per scope
        con.execute("SELECT 1 FROM temp.format_columns LIMIT 0")
        return
    except duckdb.CatalogException:
        pass
    rows = ", ".join(f"({_quoted(name)}, {_quoted(column)})" for name, column in format_column_rows())
    con.execute("CREATE TEMP TABLE format_columns (format VARCHAR, column_name VARCHAR)")
    if rows:
        con.execute(f"INSERT INTO format_columns VALUES {rows}")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
