"""`servlens export --parquet DIR`: the canonical tables as Parquet, partitioned by run and day, for the engines
that run where the data is (servlens/engines).

Layout (Hive-style, so Spark, ClickHouse, DuckDB, Trino and Athena all read it):

    DIR/requests/run=<run>/day=<YYYY-MM-DD>/data_0.parquet       day of t_at = arrival, else first token, else end
    DIR/metric_samples/run=<run>/day=<YYYY-MM-DD>/data_0.parquet  day of ts
    DIR/_servlens.json                                            schema version; per run: rows per table, clock
                                                                  (relative or not, tz) and source files

Every file holds every canonical column, `run` included, with the store's types (timestamps are UTC microseconds
without a zone, labels a MAP, attrs JSON text), so an engine reading the files needs no partition inference; the
folders are there to prune: one run's analysis opens only that run's folder, and a day's only that day's. A row
with no time at all goes under day=__HIVE_DEFAULT_PARTITION__ (Hive's name for NULL). Run values in folder names are
percent-encoded (servlens.engines.base.partition_value). Exporting a run again replaces that run's folders only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb

from servlens.engines.base import partition_value
from servlens.errors import ConfigError
from servlens.store.runs import list_runs, select_runs

MANIFEST = "_servlens.json"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"   # Hive's folder name for a NULL partition value
# (table, its day expression, the row order inside a file: ingest order for requests, time for samples)
TABLES = (
    ("requests", "CAST(coalesce(t_arrival, t_first_token, t_end) AS DATE)", "source_id, source_line"),
    ("metric_samples", "CAST(ts AS DATE)", "ts, source_id, name, series, le"),
)


def export_parquet(con: duckdb.DuckDBPyConnection, folder: str | Path, runs: list[str] | None = None) -> dict:
    """Write the store's canonical tables under `folder`; the manifest written (runs, rows per table and run)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"Cannot export to {folder}: it is a file", "Pass --parquet with a folder")
    selected = select_runs(list_runs(con), runs, "the store",
                           ("The store holds no runs to export", "Ingest request logs or scrapes first"))
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("runs", {})
    for run in selected:
        counts = {}
        for table, day, order in TABLES:
            target = folder / table / f"run={partition_value(run)}"
            if target.exists():
                shutil.rmtree(target)
            # each day's rows, counted in the same pass that finds the days
            days = con.execute(f"SELECT {day} AS d, count(*) FROM {table} WHERE run = ? GROUP BY d ORDER BY d",
                               [run]).fetchall()
            counts[table] = sum(int(n) for _, n in days)
            # One sorted COPY per day, not one COPY with PARTITION_BY (day): DuckDB's partitioned writer of a sorted
            # query ran out of the default 768 MiB on a 10M-request day, where a sorted COPY to one file spills.
            # `day` is not a canonical column: it only names the folder.
            for value, _ in days:
                part = target / f"day={HIVE_NULL if value is None else value.isoformat()}"
                part.mkdir(parents=True)
                where = f"{day} IS NULL" if value is None else f"{day} = DATE '{value.isoformat()}'"
                con.execute(f"COPY (SELECT * FROM {table} WHERE run = ? AND {where} ORDER BY {order}) "
                            f"TO {_literal(part / 'data_0.parquet')} (FORMAT PARQUET, COMPRESSION zstd)", [run])
        manifest["runs"][run] = counts | _run_meta(con, run)
    from servlens.store.schema import SCHEMA_VERSION

    manifest["schema_version"] = SCHEMA_VERSION
    manifest["layout"] = "TABLE/run=RUN/day=YYYY-MM-DD/*.parquet"
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {"folder": str(folder), "runs": {r: manifest["runs"][r] for r in selected}}


def _run_meta(con: duckdb.DuckDBPyConnection, run: str) -> dict:
    """What the analysis document says about a run besides its rows: its clock and its source files."""
    meta = con.execute("SELECT relative_clock, tz FROM runs WHERE run = ?", [run]).fetchone()
    keys = ("source_id", "kind", "path", "sha256", "size_bytes", "format", "rows", "bad_lines", "t_min", "t_max",
            "time_source")
    sources = [dict(zip(keys, row)) for row in con.execute(
        f"SELECT {', '.join(keys[:8])}, CAST(t_min AS VARCHAR), CAST(t_max AS VARCHAR), time_source FROM sources "
        "WHERE run = ? ORDER BY source_id", [run]).fetchall()]
    return {"relative_clock": bool(meta[0]) if meta else False, "tz": meta[1] if meta else None, "sources": sources}


def read_manifest(folder: str | Path) -> dict:
    """An export's manifest ({} when the folder has none: Parquet written by another tool in the same layout)."""
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"
