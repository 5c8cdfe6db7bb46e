"""What every engine offers the analysis: the canonical tables bound by name, portable SQL run through the function
map, and only small results back.

Only aggregates come back to Python. The queries servlens sends are aggregates (a metrics row, per-window rows, a
few examples), so what moves is bounded by the number of windows and groups, not by the requests; every engine
counts the rows it returned (`rows_moved`) and refuses a result larger than `max_rows` instead of pulling a table
to the laptop.
"""

from __future__ import annotations

import math
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servlens.engines import python_functions
from servlens.engines.functions import DIALECTS, parse, translate
from servlens.engines.schema import empty_relation_sql
from servlens.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

# The canonical tables an engine binds (DESIGN.md "Engines": `--table` names requests; metric_samples sits beside it).
CANONICAL_TABLES = ("requests", "metric_samples")
# A canonical table the engine does not have: read as the empty table with the canonical columns.
EMPTY = "(empty)"
# A result bigger than this is a bug in the query (a detail table instead of an aggregate), not data to ship.
MAX_RESULT_ROWS = 100_000


@dataclass(frozen=True)
class TableSource:
    """Where the canonical tables are: a Parquet export folder (`parquet:DIR`) or a table in the engine."""

    kind: str                       # "parquet" | "table" | "store" (the engine's own DuckDB store)
    location: str                   # the folder, the requests table's (qualified) name, or the store path

    @classmethod
    def parse(cls, text: str | None) -> TableSource:
        if not text:
            return cls("table", "requests")
        if text.startswith("parquet:"):
            folder = text[len("parquet:"):]
            if not folder:
                raise ConfigError("--table parquet: needs a folder", "Write --table parquet:out/servlens")
            return cls("parquet", folder)
        return cls("table", text)

    def table_names(self) -> dict[str, str]:
        """requests / metric_samples -> the engine's table names (metric_samples beside requests)."""
        if "." in self.location:
            prefix = self.location.rsplit(".", 1)[0] + "."
        else:
            prefix = ""
        return {"requests": self.location, "metric_samples": prefix + "metric_samples"}


def partition_value(value: Any) -> str:
    """A run or day as a Hive-style directory value (the characters Hive escapes, percent-encoded)."""
    return urllib.parse.quote(str(value), safe=" -_.,:+@~")


def partition_dirs(folder: str | Path, table: str, runs: list[str] | None) -> list[Path]:
    """The export's run folders of `table` (all, or those of `runs` that exist)."""
    root = Path(folder) / table
    if runs is None:
        return sorted(p for p in root.glob("run=*") if p.is_dir())
    return [root / f"run={partition_value(r)}" for r in runs if (root / f"run={partition_value(r)}").is_dir()]


def export_runs(folder: str | Path) -> list[str]:
    """The runs a Parquet export holds (from its directory names: no file is opened)."""
    names = set()
    for table in CANONICAL_TABLES:
        for path in partition_dirs(folder, table, None):
            names.add(urllib.parse.unquote(path.name[len("run="):]))
    return sorted(names)


@dataclass
class QueryStats:
    queries: int = 0
    rows_moved: int = 0
    seconds: float = 0.0
    log: list[tuple[str, int]] = field(default_factory=list)   # (first words of the SQL, rows returned)


class Engine:
    """One backend. Subclasses implement _bind_parquet, _fetch_arrow (and _fetch where the client has rows of its
    own), _columns_of_empty, version and functions."""

    name = "engine"

    def __init__(self, url: str, max_rows: int = MAX_RESULT_ROWS):
        self.url = url
        self.max_rows = max_rows
        self.stats = QueryStats()
        self.source: TableSource | None = None
        self.tables: dict[str, str] = {}     # canonical name -> what the engine's SQL reads
        self.last_columns: list[str] = []    # the column names of the last result (an empty one has them too)
        # the last result's column types as DuckDB type names, where the client says them (Arrow); a column whose
        # type has no portable name is left out
        self.last_types: dict[str, str] = {}
        self._computed: dict[str, list[tuple]] = {}  # probe SQL -> its argument tuples (python_functions)

    @property
    def dialect(self) -> str:
        return DIALECTS[self.name]

    # -- binding ------------------------------------------------------------------------------------------------
    def bind(self, source: TableSource, runs: list[str] | None = None) -> None:
        """Make `requests` and `metric_samples` readable under those names (only `runs`' partitions of an export)."""
        self.source = source
        if source.kind == "parquet":
            folder = Path(source.location)
            if not (folder / "requests").is_dir() and not (folder / "metric_samples").is_dir():
                raise ConfigError(f"{folder} is not a servlens Parquet export (no requests/ or metric_samples/ in it)",
                                  "Write one with 'servlens export --db STORE --parquet DIR'")
            for table in CANONICAL_TABLES:
                dirs = partition_dirs(folder, table, runs)
                self._bind_parquet(table, dirs)
        else:
            self._bind_tables(source.table_names())
            if self.tables["requests"] == EMPTY:
                raise ConfigError(f"{self.name} has no table {source.location}",
                                  "Pass --table with the canonical requests table (or a documented view over yours)")

    def runs(self) -> list[str]:
        """Every run in the bound tables (an export: from its folders, no data read)."""
        if self.source is not None and self.source.kind == "parquet":
            return export_runs(self.source.location)
        found = set()
        for table in CANONICAL_TABLES:
            if table in self.tables:
                found |= {r["run"] for r in self.query(f"SELECT DISTINCT run FROM {table} WHERE run IS NOT NULL")}
        return sorted(found)

    # -- running ------------------------------------------------------------------------------------------------
    def native(self, sql: str, views: dict[str, str] | None = None) -> str:
        """Portable SQL (DuckDB dialect) as this engine runs it, canonical table names resolved; `views` (name ->
        portable SQL) that the query reads become CTEs in front of it, so nothing is created on the engine."""
        return self._native_tree(self._tree(sql, views))

    def _tree(self, sql: str, views: dict[str, str] | None):
        tree = parse(sql)
        return with_views(tree, views) if views else tree

    def _native_tree(self, tree) -> str:
        renames = {name: target for name, target in self.tables.items() if target != name}
        if renames:
            from sqlglot import exp

            ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
            for table in list(tree.find_all(exp.Table)):
                target = renames.get(table.name)
                if target and not table.db and table.name not in ctes:
                    alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
                    if target == EMPTY:
                        replacement = exp.Subquery(this=parse(empty_relation_sql(table.name)), alias=alias)
                    else:
                        replacement = exp.to_table(target, dialect=self.dialect)
                        replacement.set("alias", alias)
                    table.replace(replacement)
        return translate(tree, self.name, copy=False)

    def query(self, sql: str, views: dict[str, str] | None = None, max_rows: int | None = None) -> list[dict]:
        """Run portable SQL; its rows as dicts of plain Python values (naive UTC datetimes, floats, ints, str).
        `max_rows` replaces the engine's cap for this query (compare's binned counts)."""
        return self._run(self._computed_native(sql, views), sql, max_rows)

    def query_arrow(self, sql: str, views: dict[str, str] | None = None, max_rows: int | None = None) -> pa.Table:
        """`query`'s result as an Arrow table, its columns plain as `query`'s values are (plain_columns): the rows
        never become Python objects (compare's binned counts, millions of rows at 1M requests, go on to polars)."""
        return plain_columns(self._counted(self._fetch_arrow, self._computed_native(sql, views), sql, max_rows))

    def _computed_native(self, sql: str, views: dict[str, str] | None) -> str:
        """The native SQL with servlens' statistical functions computed in Python from the engine's aggregates
        (python_functions): their probes run here."""
        tree = self._tree(sql, views)
        if self.name != "duckdb" and python_functions.calls(tree):
            tree = python_functions.compute_calls(tree, lambda probe: self._run(self._native_tree(probe), sql),
                                                  self._computed)
        return self._native_tree(tree)

    def materialise(self, name: str, sql: str, views: dict[str, str] | None = None) -> str | None:
        """Compute `sql` into a scratch table of the engine's own session and return the portable SQL that reads
        it, or None where the engine offers no scratch space (a server servlens only reads: the view stays a CTE).
        The rows stay on the engine."""
        return None

    def _run(self, native: str, sql: str, max_rows: int | None = None) -> list[dict]:
        rows = self._counted(self._fetch, native, sql, max_rows)
        return [{k: plain(v) for k, v in row.items()} for row in rows]

    def _counted(self, fetch, native: str, sql: str, max_rows: int | None):
        """`fetch(native, limit)`'s result (rows, or an Arrow table: both have a len), refused above the cap and
        counted in self.stats; the client's own errors as one EngineError."""
        max_rows = max_rows or self.max_rows
        started = time.perf_counter()
        try:
            result = fetch(native, max_rows + 1)
        except ConfigError:
            raise
        except Exception as exc:  # each client has its own error classes; one sentence, the engine named
            raise EngineError(self, native, exc) from exc
        self.stats.seconds += time.perf_counter() - started
        if len(result) > max_rows:
            raise ConfigError(f"A query on {self.name} returned more than {max_rows} rows; servlens only moves "
                              "aggregates", "This is a bug in the rule's SQL: aggregate before returning rows")
        self.stats.queries += 1
        self.stats.rows_moved += len(result)
        self.stats.log.append((" ".join(sql.split())[:80], len(result)))
        return result

    def one(self, sql: str) -> dict:
        found = self.query(sql)
        return found[0] if found else {}

    def describe(self) -> dict:
        """For the document's coverage: which engine ran it, where the tables were, what moved."""
        return {"name": self.name, "url": redact_url(self.url), "version": self.version(),
                "table": None if self.source is None else f"{self.source.kind}:{self.source.location}",
                "queries": self.stats.queries, "rows_moved": self.stats.rows_moved}

    # -- per backend --------------------------------------------------------------------------------------------
    def _bind_parquet(self, table: str, dirs: list[Path]) -> None:
        raise NotImplementedError

    def _bind_tables(self, names: dict[str, str]) -> None:
        """Name the engine's tables; one that does not exist (no metric_samples beside a Langfuse view) reads as
        an empty table with the canonical columns, so rules that need it are not evaluable, not broken."""
        self.tables = {}
        for table, target in names.items():
            try:
                self._fetch(f"SELECT * FROM {target} LIMIT 0", 1)
                self.tables[table] = target
            except Exception:  # noqa: BLE001 (absent, or not readable: both mean no rows of it here)
                self.tables[table] = EMPTY

    def execute(self, native_sql: str) -> None:
        """Run a statement in the engine's own dialect (set-up: a view over a vendor table). Not counted."""
        self._fetch(native_sql, 0)

    def _fetch(self, native_sql: str, limit: int) -> list[dict]:
        """At most `limit` rows as dicts: the Arrow result's, unless the engine's client has rows of its own."""
        table = self._fetch_arrow(native_sql, limit)
        self.last_columns = list(table.column_names)
        self.last_types = arrow_types(table.schema)
        return table.to_pylist()

    def _fetch_arrow(self, native_sql: str, limit: int) -> pa.Table:
        """At most `limit` rows as an Arrow table (the engine's own values: plain_columns comes after)."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def functions(self) -> set[str]:
        """Lower-cased names of the functions the engine has (probed from the server)."""
        raise NotImplementedError

    def columns(self, table: str) -> list[str]:
        """The columns of a bound canonical table (empty when it is absent)."""
        if table not in self.tables:
            return []
        rows = self._fetch(self.native(f"SELECT * FROM {table} LIMIT 0"), 1)
        return list(rows[0]) if rows else self._columns_of_empty(table)

    def _columns_of_empty(self, table: str) -> list[str]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _own_cte_names(view: str, body):
    """A view's own CTEs renamed `<view>__<cte>`: Spark hoists nested CTEs to the top, where two views' `p` (or the
    query's) would clash."""
    from sqlglot import exp

    names = {cte.alias for cte in body.find_all(exp.CTE)}
    if not names:
        return body
    for cte in body.find_all(exp.CTE):
        # the column list stays: `t(a, b) AS (VALUES ...)` names its columns only there
        old = cte.args.get("alias")
        cte.set("alias", exp.TableAlias(this=exp.to_identifier(f"{view}__{cte.alias}"),
                                        columns=[c.copy() for c in old.columns] if old is not None else None))
    for table in body.find_all(exp.Table):
        if not table.db and table.name in names:
            alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
            table.set("this", exp.to_identifier(f"{view}__{table.name}"))
            table.set("alias", alias)
    return body


_PARSED_VIEWS: dict[tuple[str, str], Any] = {}


def _parsed_view(name: str, sql: str):
    """A view's tree, parsed once per (name, SQL): every query of a scope carries the same views, and parsing them
    again each time was most of a rule's time (the literal metric_roles view alone is hundreds of rows)."""
    key = (name, sql)
    if key not in _PARSED_VIEWS:
        if len(_PARSED_VIEWS) > 1000:
            _PARSED_VIEWS.clear()
        _PARSED_VIEWS[key] = _own_cte_names(name, parse(sql))
    return _PARSED_VIEWS[key]


def with_views(tree, views: dict[str, str]):
    """`tree` with the views it reads (directly or through another view) as leading CTEs, dependencies first."""
    from sqlglot import exp

    defined = {cte.alias for cte in tree.find_all(exp.CTE)}

    def view(name: str):
        # parsed only when the query reads it (a view can be large: literal rows), and once per (name, SQL)
        return _parsed_view(name, views[name])

    def reads(node) -> set[str]:
        return {t.name for t in node.find_all(exp.Table) if not t.db} & set(views)

    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name in defined:
            return
        for dependency in sorted(reads(view(name)) - {name}):
            visit(dependency)
        order.append(name)

    for name in sorted(reads(tree)):
        visit(name)
    if not order:
        return tree
    ctes = [exp.CTE(this=view(name).copy(), alias=exp.TableAlias(this=exp.to_identifier(name))) for name in order]
    target = tree if isinstance(tree, exp.Query) else tree.find(exp.Query)
    key = "with_" if "with_" in type(target).arg_types else "with"   # sqlglot renamed the arg
    existing = target.args.get(key)
    target.set(key, exp.With(expressions=ctes + (existing.expressions if existing else []),
                                recursive=existing.args.get("recursive") if existing else None))
    return tree


class EngineError(ConfigError):
    """A query the engine refused: one sentence with the engine's own first line."""

    exit_code = 2

    def __init__(self, engine: Engine, native_sql: str, exc: Exception):
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # a JVM error (py4j) says only "An error occurred while calling ..." first: the cause is a later line
        if lines and lines[0].startswith("An error occurred while calling"):
            lines = [line.lstrip(": ") for line in lines[1:] if "Exception" in line or "[" in line] or lines
        first = lines[0] if lines else type(exc).__name__
        self.engine_message = first
        self.native_sql = native_sql
        super().__init__(f"{engine.name} could not run a query: {first[:300]}",
                         f"Run 'servlens engines check --engine {redact_url(engine.url)}' to see what it lacks")


def duckdb_type(arrow_type) -> str | None:
    """An Arrow type as the DuckDB type name the function map translates (None: no portable name, e.g. a struct
    or Arrow's null type), so a fetched value can go back to the engine as a literal of its own type."""
    import pyarrow as pa

    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_integer(arrow_type):
        # unsigned too (ClickHouse's count() is UInt64): servlens' counts fit a signed 64-bit integer
        return {8: "TINYINT", 16: "SMALLINT", 32: "INTEGER"}.get(arrow_type.bit_width, "BIGINT")
    if pa.types.is_floating(arrow_type):
        return "REAL" if arrow_type.bit_width == 32 else "DOUBLE"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "VARCHAR"
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMP"   # values come back as naive UTC (plain), the canonical tables' TIMESTAMP
    if pa.types.is_date(arrow_type):
        return "DATE"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        item = duckdb_type(arrow_type.value_type)
        return None if item is None else f"{item}[]"
    return None


def arrow_types(schema) -> dict[str, str]:
    """A result's column types (an Arrow schema) as DuckDB type names, the columns without one left out."""
    found = {}
    for column in schema:
        name = duckdb_type(column.type)
        if name is not None:
            found[column.name] = name
    return found


def empty_lists_as_null(table: pa.Table) -> pa.Table:
    """ClickHouse and Spark have no NULL array: a list aggregated over no row (array_agg, collect_list) is [] there
    and NULL in DuckDB, the reference, so an empty list (or map) column value reads as NULL."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, column in enumerate(table.schema):
        kind = column.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind)):
            continue
        # a value's length from its offsets (list_value_length has no kernel for maps); a NULL has length 0 too
        chunks = [pc.if_else(pa.array(np.diff(chunk.offsets.to_numpy()) == 0), pa.scalar(None, kind), chunk)
                  for chunk in table.column(i).chunks]
        table = table.set_column(i, column.with_nullable(True), pa.chunked_array(chunks, kind))
    return table


def plain_columns(table: pa.Table) -> pa.Table:
    """An Arrow result's columns as `plain` makes each value: timezone-aware timestamps as naive UTC, decimals as
    doubles; and dictionary-encoded columns as their values (polars would read them as categoricals, which sort
    by code, not by value)."""
    import pyarrow as pa

    for i, column in enumerate(table.schema):
        kind, values = column.type, table.column(i)
        if pa.types.is_timestamp(kind) and kind.tz is not None:
            values = values.cast(pa.timestamp(kind.unit))   # Arrow holds UTC instants: dropping the zone keeps them
        elif pa.types.is_decimal(kind):
            # through the decimal's text, as float(Decimal) reads it (plain): Arrow's own cast to double is often
            # an ulp off (1.1 at scale 6 became 1.0999999999999999)
            values = values.cast(pa.string()).cast(pa.float64())
        elif pa.types.is_dictionary(kind):
            values = values.cast(kind.value_type)
        else:
            continue
        table = table.set_column(i, column.with_type(values.type), values)
    return table


def plain(value: Any) -> Any:
    """One value as the DuckDB engine returns it: timezone-aware datetimes as naive UTC, decimals as floats."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "item") and not isinstance(value, (list, dict, str, bytes)):  # numpy scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def same_number(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Parity: two results agree (NaN, inf and None all mean 'no value' in a servlens document)."""
    def blank(v):
        return v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))

    if blank(a) or blank(b):
        return blank(a) and blank(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)
    return a == b


def redact_url(url: str) -> str:
    """An engine URL with any password removed (it goes into documents and messages)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")
