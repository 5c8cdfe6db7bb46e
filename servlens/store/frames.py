"""Query results into Python as polars frames: DuckDB → Arrow → polars.

The relation is handed over through the Arrow C stream interface (`__arrow_c_stream__`), so neither pyarrow nor a
row-by-row fetch is involved. Results are small (aggregates, chart points, report tables), never request rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import polars as pl


def frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """The result of `sql` as a polars DataFrame.

    DuckDB's HUGEINT (what sum() of integers gives) arrives as an Arrow decimal; it becomes an Int64 again (a
    decimal with a scale a Float64), so values read the same as DuckDB's own Python rows: ints stay ints.
    """
    import duckdb
    import polars as pl

    if not isinstance(con, duckdb.DuckDBPyConnection):
        # An engine's connection (servlens/engines: chDB, Spark) hands back rows, not an Arrow stream.
        cursor = con.execute(sql, params) if params else con.execute(sql)
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        return pl.DataFrame({name: [row[i] for row in rows] for i, name in enumerate(names)}, strict=False)
    found = pl.DataFrame(con.sql(sql, params=params) if params else con.sql(sql))
    decimals = {name: dtype for name, dtype in found.schema.items() if isinstance(dtype, pl.Decimal)}
    if not decimals:
        return found
    return found.with_columns(pl.col(name).cast(pl.Int64 if dtype.scale == 0 else pl.Float64)
                              for name, dtype in decimals.items())


def first_row(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> dict[str, Any]:
    """The first row of `sql` by column name, or {} when it has none."""
    found = frame(con, sql, params)
    return found.row(0, named=True) if found.height else {}
