"""`servlens runs`: the runs in the store, with their sources, rows, time span and column coverage."""

from __future__ import annotations

import json

import click

from servlens.commands._common import db_option, resolve_db, write_output


def runs_document(con) -> dict:
    """Every run with its sources, request rows, metric samples, bad lines, time span and column coverage."""
    from servlens.ingest.requests import COVERAGE_COLUMNS

    counts = ", ".join(f"count({c})" for c in COVERAGE_COLUMNS)
    coverage = {
        row[0]: (row[1], {c: round(n / row[1], 4) for c, n in zip(COVERAGE_COLUMNS, row[2:]) if n})
        for row in con.execute(f"SELECT run, count(*), {counts} FROM requests GROUP BY run").fetchall()
    }
    runs = []
    for run, relative_clock, tz, created in con.execute(
        "SELECT run, relative_clock, tz, created_at FROM runs ORDER BY created_at, run"
    ).fetchall():
        sources = [
            {"source_id": sid, "path": path, "kind": kind, "format": fmt, "rows": rows, "bad_lines": bad,
             "t_min": t_min.isoformat() if t_min else None, "t_max": t_max.isoformat() if t_max else None}
            for sid, path, kind, fmt, rows, bad, t_min, t_max in con.execute(
                "SELECT source_id, path, kind, format, rows, bad_lines, t_min, t_max FROM sources WHERE run = ? "
                "ORDER BY source_id", [run]
            ).fetchall()
        ]
        t_min = min((s["t_min"] for s in sources if s["t_min"]), default=None)
        t_max = max((s["t_max"] for s in sources if s["t_max"]), default=None)
        request_rows, filled = coverage.get(run, (0, {}))
        metric_rows = sum(s["rows"] or 0 for s in sources if s["kind"] == "metrics")
        runs.append({
            "run": run,
            "relative_clock": bool(relative_clock),
            "tz": tz,
            "sources": sources,
            "requests": request_rows,
            "metric_samples": metric_rows,
            "bad_lines": sum(s["bad_lines"] or 0 for s in sources),
            "t_min": t_min,
            "t_max": t_max,
            "columns_filled": filled,
        })
    return {"runs": runs}


@click.command(short_help="List the runs in the store: sources, rows, time span, column coverage.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write to this file.")
@db_option
@click.pass_context
def runs(ctx, output_format, out, db):
    """List the runs in the store with their sources, request rows, metric samples, bad lines, time span (a
    relative clock shows as +hh:mm:ss) and which canonical columns their requests fill.

    \b
    Example:
        servlens ingest tests/data/shared/real-engine/llamacpp/
        servlens runs
        servlens runs --format json
    """
    from servlens.render.ingest_text import runs_text
    from servlens.store.schema import open_store

    db_path = resolve_db(ctx, db)
    con = open_store(db_path, read_only=True)
    try:
        document = runs_document(con)
    finally:
        con.close()
    if output_format == "json":
        write_output(json.dumps(document, indent=2), out)
        return
    write_output(runs_text(document, str(db_path)), out)
