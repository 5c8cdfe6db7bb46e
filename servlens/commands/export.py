"""`servlens export`: the store's canonical tables as Parquet, for `--engine ... --table parquet:DIR`."""

from __future__ import annotations

import click

from servlens.commands._common import resolve_db


@click.command("export", context_settings={"max_content_width": 110})
@click.option("--db", "db", type=click.Path(dir_okay=False), default=None,
              help="The store to export [default: .servlens/store.duckdb].")
@click.option("--parquet", "folder", required=True, type=click.Path(file_okay=False),
              help="Folder to write: requests/ and metric_samples/, partitioned by run and day.")
@click.option("--run", "runs", multiple=True, help="Only these runs [default: all]; a run exported again is replaced.")
@click.pass_context
def export(ctx, db, folder, runs):
    """Write the canonical requests and metric_samples tables as Parquet, partitioned by run and day, so Spark,
    ClickHouse (chDB) or DuckDB can analyse them where they are.

    \b
    Example:
        servlens export --db store.duckdb --parquet out/servlens/
        servlens analyze --engine spark:local[2] --table parquet:out/servlens --run prod-1128
    """
    from servlens.errors import InputError
    from servlens.store.export import export_parquet
    from servlens.store.schema import open_store

    store = resolve_db(ctx, db)
    if not store.exists():
        raise InputError(f"No store at {store}", "Ingest something first with 'servlens ingest', or pass --db")
    con = open_store(store, read_only=True)
    try:
        result = export_parquet(con, folder, list(runs) or None)
    finally:
        con.close()
    for run, counts in result["runs"].items():
        click.echo(f"{run}: {counts['requests']} requests, {counts['metric_samples']} metric samples", err=True)
    click.echo(f"Wrote {result['folder']}", err=True)
