"""DuckDB: the default and the reference. The embedded store (`--db`), or a Parquet export read in place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from servlens.engines.base import Engine
from servlens.engines.schema import empty_relation_sql

if TYPE_CHECKING:
    import pyarrow as pa

# rows per Arrow batch read from DuckDB: reading stops at the batch that reaches the cap (Engine.max_rows)
ARROW_BATCH_ROWS = 100_000


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class DuckDBEngine(Engine):
    name = "duckdb"

    def __init__(self, url: str = "duckdb", con: duckdb.DuckDBPyConnection | None = None, **kwargs):
        super().__init__(url, **kwargs)
        self._own = con is None
        if con is None:
            from servlens.store.schema import store_config

            con = duckdb.connect(":memory:", config=store_config(True))
        self.con = con

    @classmethod
    def for_store(cls, path: str | Path) -> DuckDBEngine:
        """The engine over a servlens store (opened read-only)."""
        from servlens.store.schema import open_store

        engine = cls("duckdb", open_store(path, read_only=True))
        engine._own = True
        return engine

    def bind(self, source, runs=None) -> None:
        """An export is read as a store: the store's schema with `requests` and `metric_samples` as views over the
        Parquet files, and `runs` / `sources` from the manifest, so the runner, workload, chains and goodput run
        on it unchanged (the reference for every other engine)."""
        if source.kind == "parquet":
            import os

            from servlens.store.schema import create_schema

            # The views read the export's files whenever a query runs: a user rule locks the connection down (no
            # file access; servlens/sandbox.py), and the export's folder is the one it may still read.
            folder = os.path.join(os.path.abspath(source.location), "")
            self.con.execute("SET allowed_directories = [?]", [folder])
            create_schema(self.con)
            self.con.execute("DROP TABLE requests")
            self.con.execute("DROP TABLE metric_samples")
        super().bind(source, runs)
        if source.kind == "parquet":
            self._load_manifest(source.location, runs)

    def _load_manifest(self, folder: str, runs: list[str] | None) -> None:
        from servlens.store.export import read_manifest

        for run, meta in read_manifest(folder).get("runs", {}).items():
            if runs is not None and run not in runs:
                continue
            self.con.execute("INSERT INTO runs (run, relative_clock, tz) VALUES (?, ?, ?)",
                             [run, bool(meta.get("relative_clock")), meta.get("tz")])
            for s in meta.get("sources", []):
                self.con.execute(
                    "INSERT INTO sources (source_id, run, kind, path, sha256, size_bytes, format, rows, bad_lines, "
                    "t_min, t_max, time_source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [s["source_id"], run, s["kind"], s["path"], s.get("sha256") or "", s.get("size_bytes"),
                     s.get("format"), s.get("rows"), s.get("bad_lines"), s.get("t_min"), s.get("t_max"),
                     s.get("time_source")])

    def _bind_parquet(self, table: str, dirs: list[Path]) -> None:
        if dirs:
            files = ", ".join(_quote(str(d / "**" / "*.parquet")) for d in dirs)
            # hive_partitioning off: run and day are columns of the files; the folders only prune (by run).
            body = f"SELECT * FROM read_parquet([{files}], hive_partitioning = false, union_by_name = true)"
        else:
            body = empty_relation_sql(table)
        self.con.execute(f"CREATE OR REPLACE VIEW {table} AS {body}")
        self.tables[table] = table

    def _fetch(self, native_sql: str, limit: int) -> list[dict]:
        cursor = self.con.execute(native_sql)
        names = [d[0] for d in cursor.description] if cursor.description else []
        self.last_columns = names
        self.last_types = {}   # DuckDB reads the store itself: no fetched row goes back to it as literals
        return [dict(zip(names, row)) for row in cursor.fetchmany(limit)]

    def _fetch_arrow(self, native_sql: str, limit: int) -> pa.Table:
        import pyarrow as pa

        # a relation, not execute(): DuckDB copies a cursor's rows once more to make Arrow of them
        reader = self.con.sql(native_sql).to_arrow_reader(ARROW_BATCH_ROWS)
        batches, rows = [], 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if rows >= limit:
                break
        return pa.Table.from_batches(batches, reader.schema).slice(0, limit)

    def execute(self, native_sql: str) -> None:
        self.con.execute(native_sql)

    def _columns_of_empty(self, table: str) -> list[str]:
        return [row[0] for row in self.con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()]

    def version(self) -> str:
        return duckdb.__version__

    def functions(self) -> set[str]:
        from servlens.analysis import sql_functions

        sql_functions.register(self.con)  # the rules' statistical functions live on every servlens DuckDB
        return {row[0].lower() for row in self.con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()}

    def close(self) -> None:
        if self._own:
            self.con.close()
