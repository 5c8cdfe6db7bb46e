"""`servlens compare --engine URL --table T`: the release gate computed where the data is.

compare (servlens/compare) asks its connection for aggregates only: per side × time batch × cohort × log-spaced
bin counts, per-cohort sums of the covariate fit, rate counts, the B − 1 cut points of the time batches, and at most
300 scatter points a side. On an engine, CompareConnection answers those same calls, so compare's SQL and statistics
stay in one place and run unchanged:

- `execute(sql, params)` (EngineConnection): parameters as SQL literals, every query through servlens' function
  map (quantile_disc, list, epoch_us, ... exactly: servlens/engines/functions.py), the views it reads as CTEs;
- `sql(sql, params)`: the same, as the polars frame cohorts._frame reads (aggregate rows only), straight from
  the engine's Arrow result (Engine.query_arrow);
- `register(name, columns)`: the per-model covariate fit (a few rows) as a literal view, nothing created on the
  engine;
- `stored_order`: the tie-break of the time batches. The store breaks ties in arrival time by row id; an export
  holds each run's requests in (source_id, source_line) order (servlens/store/export.py), the order ingest
  numbered them in, so on an engine that order is the tie-break, and the batches are the store's.

`--engine duckdb --table parquet:DIR` runs through the same adapter on DuckDB: the reference for the others.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from servlens.engines.analysis import (
    EngineConnection,
    _value_literal,
    engine_manifest,
    manifest_views,
    with_parameters,
)
from servlens.engines.base import Engine, TableSource, export_runs
from servlens.errors import ConfigError, InputError

# source_id and source_line as one BIGINT in their order (ids < 2^31, lines < 2^32 per file)
EXPORT_ORDER = "(CAST(source_id AS BIGINT) * 4294967296 + source_line)"
# compare's largest answer: a latency's counts per side × time batch (≤ 50) × cohort × occupied 0.5% log bin. It grows
# with the requests until the bins fill (two sides of 1M requests: see benchmarks/RESULTS.md), then stays: about
# 1,400 bins span three decades of latency. The analysis cap (MAX_RESULT_ROWS, 100k) refused a 1M-request pair.
COMPARE_MAX_ROWS = 5_000_000


class CompareConnection(EngineConnection):
    """What compare needs of a DuckDB connection, answered by an engine (only aggregates come back)."""

    stored_order = EXPORT_ORDER
    max_rows = COMPARE_MAX_ROWS  # this connection's queries only: an analysis on the same engine keeps its cap

    def __init__(self, engine: Engine, manifest: dict | None = None, runs: tuple[str, ...] = ()):
        super().__init__(engine)
        # the store's `sources` table as compare reads it (the two runs' request logs), from the export's manifest
        kept = {"runs": {run: {"sources": [s for s in meta.get("sources", []) if s.get("kind") == "requests"]}
                         for run, meta in (manifest or {}).get("runs", {}).items() if not runs or run in runs}}
        self.views = {"sources": manifest_views(kept)["sources"]}

    def sql(self, sql: str, params: dict | list | None = None):
        """The query's result as a polars frame made from the engine's Arrow table, as the store's is made from
        DuckDB's: no Python rows (a 1M-request pair's binned counts are millions of rows), and an empty result keeps
        its columns and their types."""
        import polars as pl

        table = self.engine.query_arrow(with_parameters(sql, params), views=self.views, max_rows=self.max_rows)
        return pl.from_arrow(table)

    def complete(self) -> None:
        """Nothing is left unread: every engine query is fetched whole (cohorts._frame calls this for DuckDB)."""

    def register(self, name: str, columns: dict[str, Any]) -> None:
        """A small frame (numpy columns) as a view of literal rows."""
        names = list(columns)
        arrays = [np.asarray(columns[c]) for c in names]
        types = [_sql_type(a) for a in arrays]
        n = len(arrays[0]) if arrays else 0
        if n == 0:
            self.views[name] = ("SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in zip(names, types))
                                + " WHERE 1 = 0")
            return
        self.views[name] = " UNION ALL ".join(
            "SELECT " + ", ".join(f"CAST({_literal(a[i])} AS {t}) AS {c}" for c, t, a in zip(names, types, arrays))
            for i in range(n))

    def unregister(self, name: str) -> None:
        self.views.pop(name, None)


def _sql_type(values: np.ndarray) -> str:
    kind = values.dtype.kind
    return {"f": "DOUBLE", "i": "BIGINT", "u": "BIGINT", "b": "BOOLEAN"}.get(kind, "VARCHAR")


def _literal(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)   # the shortest text that reads back as the same double on DuckDB and ClickHouse
    return _value_literal(value)


def compare_where_the_data_is(engine_url: str | None, table: str | None, store, before: str, after: str,
                              policy, seed: int = 0, slo: dict | None = None) -> dict:
    """`servlens compare --engine URL --table T --before A --after B`: the compare document, computed on the engine
    (the DuckDB store itself with --engine duckdb and no --table), the engine named in coverage.engine."""
    from servlens.analysis.goodput import goodput_gate
    from servlens.compare.engine import compare_runs
    from servlens.engines import engine_kind, open_engine

    source = TableSource.parse(table)
    kind = engine_kind(engine_url or "duckdb")
    on_store = kind == "duckdb" and source.kind != "parquet"
    if on_store and source.location != "requests":
        raise ConfigError("With the DuckDB store, --table is the store's own requests table",
                          "Drop --table, or pass --table parquet:DIR for an export")
    if slo and kind != "duckdb":
        raise ConfigError(f"--slo's goodput gate is computed on DuckDB only, not on {kind}",
                          "Drop --slo, or run the same export with --engine duckdb --table parquet:DIR")
    if source.kind == "parquet":
        known = export_runs(source.location)
        for run in (before, after):
            if known and run not in known:
                raise InputError(f"The export {source.location} has no run '{run}' (runs: {', '.join(known[:20])})",
                                 "Export the run with 'servlens export --db STORE --parquet DIR --run RUN'")
    engine = open_engine("duckdb", store=store) if on_store else open_engine(engine_url or "duckdb")
    try:
        if on_store:
            con = engine.con   # the store itself: compare's reference path
        else:
            engine.bind(source, [before, after] if source.kind == "parquet" else None)
            con = CompareConnection(engine, engine_manifest(engine), (before, after))
        doc = compare_runs(con, before, after, policy, seed=seed)
        if slo:
            doc["goodput_gate"] = goodput_gate(engine.con, before, after, slo)
        doc["coverage"]["engine"] = engine.describe()
        return doc
    finally:
        engine.close()
