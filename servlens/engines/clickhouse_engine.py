"""ClickHouse: in-process through chDB (`chdb`), or a server through clickhouse-connect (`clickhouse://HOST:PORT/DB`).

Both speak ClickHouse SQL, so both go through the same half of the function map. Against a server servlens only reads:
the canonical tables are named (`--table db.requests`, metric_samples beside it) and every scope view is a CTE of the
query, so a read-only user is enough. chDB reads a Parquet export through `file()` views in a scratch database of
its own session (in-process, gone on close).
"""

from __future__ import annotations

import itertools
import logging
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from servlens.engines.base import Engine, empty_lists_as_null
from servlens.engines.functions import translate
from servlens.engines.schema import empty_relation_sql
from servlens.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

# Times are UTC everywhere in servlens; Parquet columns carry no hive partitions (run and day are in the files);
# a column name wins over a select alias of the same name (`count(run) AS run ... WHERE run IN (...)` filters by
# the column, as in standard SQL; ClickHouse's default would read the aggregate there); an outer join's missing side
# is NULL, as in standard SQL (ClickHouse's default fills in 0 and ''); strftime's %M is the minute, as in C and
# DuckDB (ClickHouse's formatDateTime reads it as the month's name by default).
# schema_inference_make_columns_nullable = 1: every column read from Parquet is Nullable, as every canonical column
# is. ClickHouse's default (auto) makes a column Nullable only where the file's statistics show a NULL, so one export
# file without a NULL in `value` read as Float64, and lag() over it gave 0 instead of NULL for a series' first
# sample: a counter "increase" from zero, where DuckDB and Spark have none (unknown is not zero).
SESSION_SETTINGS = {"session_timezone": "UTC", "use_hive_partitioning": 0, "prefer_column_name_to_alias": 1,
                    "join_use_nulls": 1, "formatdatetime_parsedatetime_m_is_month_name": 0,
                    "schema_inference_make_columns_nullable": 1}


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ChDBEngine(Engine):
    name = "chdb"

    def __init__(self, url: str = "chdb", **kwargs):
        super().__init__(url, **kwargs)
        try:
            from chdb import session
        except ImportError:
            raise ConfigError("--engine chdb needs the chdb package", "pip install 'servlens[engines]'") from None
        self._session = session.Session()
        for key, value in SESSION_SETTINGS.items():
            self._session.query(f"SET {key} = {_quote(value) if isinstance(value, str) else value}")
        # chDB sessions of one process share one server: each engine binds its tables (and keeps its scratch tables,
        # materialise()) in databases of its own, so a second engine (a compare beside an analysis) does not rebind
        # the first one's views
        self.database = f"servlens_bound_{next(_DATABASES)}"
        self.scratch = f"{self.database}_scratch"
        self._session.query(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        self._session.query(f"CREATE DATABASE IF NOT EXISTS {self.scratch}")

    def _bind_parquet(self, table: str, dirs: list[Path]) -> None:
        if dirs:
            body = " UNION ALL ".join(f"SELECT * FROM file({_quote(str(d / '**' / '*.parquet'))}, Parquet)" for d in dirs)
        else:
            body = translate(empty_relation_sql(table), "chdb")
        self._session.query(f"CREATE OR REPLACE VIEW {self.database}.{table} AS {body}")
        self.tables[table] = f"{self.database}.{table}"

    def materialise(self, name: str, sql: str, views: dict[str, str] | None = None) -> str | None:
        """A view read by many queries of a scope as a Memory table of this session: ClickHouse inlines a CTE at
        every reference, and a rule's views read one another (SL007, SL010 reached ClickHouse's limit of 10,000
        plan optimisations, after minutes)."""
        native = self._computed_native(sql, views)
        self._computed.clear()  # a probe reading this table by name read the previous scope's rows
        try:
            self._session.query(f"CREATE OR REPLACE TABLE {self.scratch}.{name} ENGINE = Memory AS {native}")
        except Exception:  # noqa: BLE001 (a column a table cannot hold, NULL typed Nothing: then a CTE, whose
            return None    # own error, if it has one, is the one the query reports)
        return f"SELECT * FROM {self.scratch}.{name}"

    def _fetch_arrow(self, native_sql: str, limit: int) -> pa.Table:
        return empty_lists_as_null(self._session.query(native_sql, "ArrowTable"))

    def _columns_of_empty(self, table: str) -> list[str]:
        return [row["name"] for row in self._fetch(f"DESCRIBE TABLE {self.tables[table]}", 10_000)]

    def execute(self, native_sql: str) -> None:
        self._session.query(native_sql)

    def version(self) -> str:
        return str(self._fetch("SELECT version() AS v", 1)[0]["v"])

    def functions(self) -> set[str]:
        return _clickhouse_functions(self._fetch)

    def close(self) -> None:
        self._session.query(f"DROP DATABASE IF EXISTS {self.database}")
        self._session.close()


_DATABASES = itertools.count(1)


class ClickHouseServerEngine(Engine):
    """`clickhouse://[user[:password]@]HOST[:PORT][/DB]` (HTTP port, default 8123; `clickhouses://` for TLS)."""

    name = "clickhouse"

    def __init__(self, url: str, **kwargs):
        super().__init__(url, **kwargs)
        try:
            import clickhouse_connect
        except ImportError:
            raise ConfigError("--engine clickhouse:// needs clickhouse-connect", "pip install 'servlens[engines]'") from None
        parts = urllib.parse.urlsplit(url)
        database = parts.path.strip("/") or "default"
        logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)  # the refusal below is the one message
        try:
            self._client = clickhouse_connect.get_client(
                host=parts.hostname or "127.0.0.1", port=parts.port or 8123, database=database,
                username=urllib.parse.unquote(parts.username or "default"),
                password=urllib.parse.unquote(parts.password or ""), secure=parts.scheme == "clickhouses",
                settings={k: v for k, v in SESSION_SETTINGS.items() if k != "use_hive_partitioning"})
        except Exception as exc:  # noqa: BLE001 (connection refused, auth, TLS: one sentence)
            raise ConfigError(f"Cannot reach ClickHouse at {parts.hostname}:{parts.port or 8123}: "
                              f"{str(exc).splitlines()[0][:200]}", "Check the URL, the port (HTTP, 8123) and the user") from None
        self.database = database

    def _bind_parquet(self, table: str, dirs: list[Path]) -> None:
        raise ConfigError("A ClickHouse server reads its own tables, not a local Parquet export",
                          "Pass --table DB.requests (a table or one of the documented views), or use --engine chdb")

    def _fetch(self, native_sql: str, limit: int) -> list[dict]:
        result = self._client.query(native_sql)
        self.last_columns = list(result.column_names)
        self.last_types = {}   # clickhouse-connect's rows carry no Arrow schema: the literals stay untyped
        return [_null_arrays(dict(zip(result.column_names, row))) for row in result.result_rows]

    def _fetch_arrow(self, native_sql: str, limit: int) -> pa.Table:
        return empty_lists_as_null(self._client.query_arrow(native_sql, use_strings=True))

    def _columns_of_empty(self, table: str) -> list[str]:
        return [row["name"] for row in self._fetch(f"DESCRIBE TABLE {self.tables[table]}", 10_000)]

    def version(self) -> str:
        return str(self._fetch("SELECT version() AS v", 1)[0]["v"])

    def functions(self) -> set[str]:
        return _clickhouse_functions(self._fetch)

    def execute(self, native_sql: str) -> None:
        self._client.command(native_sql)

    def close(self) -> None:
        self._client.close()


def _null_arrays(row: dict) -> dict:
    """A clickhouse-connect row with an empty array as NULL (no list), as empty_lists_as_null reads an Arrow
    result's."""
    return {k: (None if isinstance(v, list) and not v else v) for k, v in row.items()}


def _clickhouse_functions(fetch) -> set[str]:
    """system.functions, plus every aggregate with each combinator (countIf = count + If is listed nowhere)."""
    rows = fetch("SELECT name, alias_to, is_aggregate FROM system.functions", 100_000)
    names = {r["name"].lower() for r in rows} | {r["alias_to"].lower() for r in rows if r.get("alias_to")}
    combinators = [r["name"].lower() for r in fetch("SELECT name FROM system.aggregate_function_combinators", 1000)]
    aggregates = [r["name"].lower() for r in rows if r["is_aggregate"]]
    return names | {a + c for a in aggregates for c in combinators}
