"""A console log's gauge lines as metric samples: a profile's [metric_lines] (reader "lines") read from the same
file as its request rows, e.g. vLLM's periodic "Engine 000: ... Running: N reqs, Waiting: N reqs, ... KV cache usage:
x%" line. The samples are a `metrics` source of that file, so a changed log replaces them and the rules read them
like a scrape (servlens/store/metric_roles.toml names their roles).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb

from servlens.errors import ConfigError
from servlens.ingest import sources as src
from servlens.ingest.compiler import (
    CompileOptions,
    _ident,
    _time_adjust,
    compile_profile,
    line_captures,
    line_longest,
    line_reader_sql,
    sql_str,
)
from servlens.ingest.profiles import Profile
from servlens.sandbox import check_user_expression

FORMAT_SUFFIX = "metric-lines"  # the metrics source's format: "<profile> metric-lines"


def metric_lines_sql(profile: Profile, opts: CompileOptions) -> str:
    """SELECT ts, name, labels, value: one row per gauge of each matching line (a NULL time or value gives none)."""
    spec = profile.metric_lines
    assert spec is not None
    matched, captures, any_match = line_captures(spec.patterns, spec.names)
    fields = [f"{_ident(name)} := {expr}" for name, expr in captures.items()]
    reader = line_reader_sql(opts.path, opts.compression, line_longest(profile, opts), store_rejects=False)
    # a label whose value is NULL (not in this line) is left out, not stored empty
    entries = ", ".join(f"struct_pack(key := {sql_str(k)}, value := CAST(({v}) AS VARCHAR))"
                        for k, v in spec.labels.items())
    labels = (f"map_from_entries(list_filter([{entries}], lambda e: e.value IS NOT NULL))" if entries
              else "CAST(MAP {} AS MAP(VARCHAR, VARCHAR))")
    gauges = ", ".join(f"struct_pack(name := {sql_str(k)}, value := TRY_CAST(({v}) AS DOUBLE))"
                       for k, v in spec.gauges.items())
    ts = _time_adjust(profile, f"CAST(({spec.ts}) AS TIMESTAMP)", opts)
    return f"""
WITH _matched AS (SELECT {', '.join(matched)} FROM {reader} AS r(_text)),
_lines AS (SELECT struct_pack({', '.join(fields)}) AS m FROM _matched WHERE {any_match}),
_samples AS (SELECT {ts} AS ts, {labels} AS labels, unnest([{gauges}]) AS g FROM _lines)
SELECT ts, g.name AS name, labels, g.value AS value FROM _samples WHERE ts IS NOT NULL AND g.value IS NOT NULL"""


def ingest_metric_lines(con: duckdb.DuckDBPyConnection, path: Path, profile: Profile, *, run: str,
                        start: datetime | None = None, tz: str | None = None) -> dict:
    """The file's gauge lines into metric_samples, as a `metrics` source of `run`; its summary dict (the shape of
    servlens.ingest.metrics.ingest_metrics_file's)."""
    path = Path(path).resolve()
    spec = profile.metric_lines
    assert spec is not None
    if not profile.builtin:
        for what, expr in [("ts", spec.ts), *spec.gauges.items(), *spec.labels.items()]:
            check_user_expression(expr, f"Profile {profile.name}: metric_lines {what}")
    fmt = f"{profile.name} {FORMAT_SUFFIX}"
    opts = CompileOptions(path=path, compression=src.compression_of(path), run=run, start=start, tz=tz)
    relative = profile.clock == "relative" and start is None
    summary = {"path": str(path), "kind": "metrics", "format": fmt, "run": run, "runs": [run], "source_id": None,
               "rows": 0, "bad_lines": 0, "skipped": False, "replaced": False, "t_min": None, "t_max": None,
               "time_source": "log", "time_source_text": "sample time from the log line's clock", "metrics": [],
               "relative_clock": relative}
    for statement in compile_profile(profile, opts).macro_sql():  # the profile's macros (the clock's) and servlens'
        con.execute(statement)
    decision = src.decide_source(con, run, "metrics", path)
    if decision.action == "skip":
        summary.update(skipped=True, source_id=decision.old_source_id,
                       note="already ingested: same content in the same run; nothing added")
        return summary
    with src.one_transaction(con):
        if decision.action == "replace" and decision.old_source_id is not None:
            src.delete_source(con, decision.old_source_id)
            summary["replaced"] = True
        src.ensure_run(con, run, relative_clock=relative, tz=tz if profile.clock == "naive" else None)
        source_id = src.insert_source(con, run=run, kind="metrics", path=path, decision=decision, fmt=fmt,
                                      time_source="log")
        try:
            con.execute(
                "INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, le, labels, value) "
                f"SELECT ?, ?, ts, name, name, 'gauge', 'value', NULL, labels, value FROM ({metric_lines_sql(profile, opts)})",
                [run, source_id])
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"Profile {profile.name}: [metric_lines] does not read {path.name}: {first}") from exc
        con.execute(
            """UPDATE sources SET rows = (SELECT count(*) FROM metric_samples WHERE source_id = $id), bad_lines = 0,
                 t_min = (SELECT min(ts) FROM metric_samples WHERE source_id = $id),
                 t_max = (SELECT max(ts) FROM metric_samples WHERE source_id = $id)
               WHERE source_id = $id""", {"id": source_id})
        rows, t_min, t_max = con.execute("SELECT rows, t_min, t_max FROM sources WHERE source_id = ?",
                                         [source_id]).fetchone()
        if not rows:
            src.delete_source(con, source_id)  # no gauge line: no metrics source
            return summary
    names = con.execute("SELECT DISTINCT name FROM metric_samples WHERE source_id = ? ORDER BY name",
                        [source_id]).fetchall()
    summary.update(source_id=source_id, rows=rows, metrics=[n[0] for n in names],
                   t_min=t_min.isoformat() + "Z" if t_min else None, t_max=t_max.isoformat() + "Z" if t_max else None)
    return summary
