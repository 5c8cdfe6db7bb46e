"""Run servlens where the data is (issue #17): one module per engine, and servlens' own function map.

`open_engine(url)` takes what `--engine` takes: `duckdb` (the default: the embedded store, the reference),
`chdb` (ClickHouse in-process), `clickhouse://HOST:PORT/DB` (a server), `spark:local[N]`, `spark://HOST:PORT`
(a standalone cluster), `sc://HOST:PORT` (Spark Connect). `--table` names the canonical requests table, or
`parquet:DIR` for what `servlens export --parquet DIR` wrote; metric_samples sits beside it.
"""

from __future__ import annotations

from servlens.engines.base import Engine, EngineError, TableSource
from servlens.errors import ConfigError

ENGINE_FORMS = ("duckdb", "chdb", "clickhouse://HOST:PORT/DB", "spark:local[N]", "spark://HOST:PORT", "sc://HOST:PORT")


def engine_kind(url: str) -> str:
    """duckdb | chdb | clickhouse | spark for an --engine value; a ConfigError naming the forms otherwise."""
    if url in ("duckdb", "") or url.startswith("duckdb:"):
        return "duckdb"
    if url == "chdb":
        return "chdb"
    if url.startswith(("clickhouse://", "clickhouses://")):
        return "clickhouse"
    if url.startswith(("spark:local", "spark://", "sc://")):
        return "spark"
    raise ConfigError(f"Unknown engine {url!r}", "--engine takes " + ", ".join(ENGINE_FORMS))


def open_engine(url: str | None, store=None, **kwargs) -> Engine:
    """The engine for an --engine value; `duckdb` with `store` opens that servlens store read-only."""
    kind = engine_kind(url or "duckdb")
    if kind == "duckdb":
        from servlens.engines.duckdb_engine import DuckDBEngine

        return DuckDBEngine.for_store(store) if store is not None else DuckDBEngine(**kwargs)
    if kind == "chdb":
        from servlens.engines.clickhouse_engine import ChDBEngine

        return ChDBEngine(**kwargs)
    if kind == "clickhouse":
        from servlens.engines.clickhouse_engine import ClickHouseServerEngine

        return ClickHouseServerEngine(url, **kwargs)
    from servlens.engines.spark_engine import SparkEngine

    return SparkEngine(url, **kwargs)


__all__ = ["ENGINE_FORMS", "Engine", "EngineError", "TableSource", "engine_kind", "open_engine"]
