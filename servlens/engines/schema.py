"""The canonical tables' columns and types, read from the store's own DDL (servlens/store/schema.py is their one
home), for engines that must stand up an empty table (a run with no metrics in an export)."""

from __future__ import annotations

from functools import cache


@cache
def canonical_columns(table: str) -> tuple[tuple[str, str], ...]:
    """(column, DuckDB type) of a canonical table, in order."""
    import duckdb

    from servlens.store.schema import create_schema

    con = duckdb.connect(":memory:")
    try:
        create_schema(con)
        return tuple((name, sqltype) for name, sqltype, *_ in con.execute(f"DESCRIBE {table}").fetchall())
    finally:
        con.close()


def empty_relation_sql(table: str) -> str:
    """Portable SQL (DuckDB dialect) for the table with no rows: typed NULL columns, WHERE false."""
    items = ", ".join(f"CAST(NULL AS {'VARCHAR' if sqltype == 'JSON' else sqltype}) AS {name}"
                      for name, sqltype in canonical_columns(table))
    return f"SELECT {items} WHERE 1 = 0"
