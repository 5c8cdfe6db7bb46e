"""`servlens engines`: what the engines servlens can run on support (`engines check`)."""

from __future__ import annotations

import json

import click

from servlens.commands._common import resolve_db, write_output


@click.group("engines", context_settings={"max_content_width": 110})
def engines():
    """Check an engine servlens can run on: DuckDB (the store), chDB, a ClickHouse server, Spark.

    \b
    Example:
        servlens engines check --engine chdb --table parquet:out/servlens
        servlens engines check --engine spark:local[2]
        servlens engines check --engine clickhouse://127.0.0.1:8123/default --table servlens.requests
    """


@engines.command("check")
@click.option("--engine", "engine_url", default="duckdb", show_default=True,
              help="duckdb, chdb, clickhouse://HOST:PORT/DB, spark:local[N], spark://HOST:PORT or sc://HOST:PORT.")
@click.option("--table", "table", default=None,
              help="The canonical requests table, or parquet:DIR (an export). With it, the probes also run there.")
@click.option("--db", "db", type=click.Path(dir_okay=False), default=None,
              help="With --engine duckdb: the store [default: .servlens/store.duckdb].")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(file_okay=False),
              help="A folder of your own rule files, added to the built-in ones; repeatable.")
@click.option("--format", "output_format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.pass_context
def check(ctx, engine_url, table, db, rules_dirs, output_format):
    """Can the engine run every rule? Which functions does it lack? Probes the engine's version and function list,
    translates every SQL servlens would send through servlens' function map and names what is missing. Exit 0 when
    everything runs there, 1 when something does not, 2 on a usage error.
    """
    from servlens.analysis.rules import load_rules
    from servlens.engines import TableSource, engine_kind, open_engine
    from servlens.engines.check import check_engine, render_check

    rules = load_rules(list(rules_dirs))
    store = None
    if engine_kind(engine_url) == "duckdb" and not (table or "").startswith("parquet:"):
        path = resolve_db(ctx, db)
        store = path if path.exists() else None
    engine = open_engine(engine_url, store=store)
    try:
        bound = False
        if table or store is not None:
            engine.bind(TableSource.parse(table))
            bound = True
        doc = check_engine(engine, rules, bound)
    finally:
        engine.close()
    write_output(json.dumps(doc, indent=2) if output_format == "json" else render_check(doc), None)
    ctx.exit(0 if doc["ok"] else 1)
