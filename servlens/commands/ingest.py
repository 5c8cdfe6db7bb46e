"""`servlens ingest`: read request logs and metrics into the store."""

from __future__ import annotations

import json
import sys

import click

from servlens.commands._common import (
    db_option,
    echo_prometheus_notes,
    prometheus_options,
    prometheus_pull,
    resolve_db,
    write_output,
)


@click.command(short_help="Read request logs and engine metrics into the store.")
@click.argument("inputs", nargs=-1, type=str)
@click.option("--run", "run", default=None, help="Run label [default: the log's own run field, else the file stem].")
@click.option("--from", "from_format", default=None, metavar="NAME", help="Read every named file with this format (see 'servlens formats').")
@click.option("--profile", "profile_file", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Read with your own format profile (docs/profiles.md).")
@click.option("--metrics", "metrics_inputs", multiple=True, metavar="PATH",
              help="Prometheus scrapes / OpenMetrics / query_range JSON (file, folder or glob); repeatable.")
@click.option("--keep-text", is_flag=True, help="Also store prompt and response text (not stored by default).")
@click.option("--strict", is_flag=True, help="Any malformed line is an error (exit 2) and nothing is kept from that file.")
@click.option("--start", default=None, metavar="TIME", help="Epoch for sources with a relative clock (ISO-8601).")
@click.option("--tz", default=None, metavar="ZONE", help="Time zone of naive wall-clock times [default: UTC].")
@click.option("--at", default=None, metavar="TIME", help="Scrape time for metrics files that carry none (ISO-8601 or Unix s).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the summary to this file.")
@prometheus_options()
@db_option
@click.pass_context
def ingest(ctx, inputs, run, from_format, profile_file, metrics_inputs, keep_text, strict, start, tz, at,
           output_format, out, prometheus_url, prometheus_selector, prometheus_start, prometheus_end, db):
    """Ingest request logs (any known format, or your --profile) and Prometheus metrics.

    INPUTS are files, folders or globs; .gz and .zst are read directly. A folder ingests what servlens recognises
    and lists what it skipped; a file you name that no format fits is an error. Re-ingesting the same content into
    the same run adds nothing; a changed file at the same path replaces its rows.

    \b
    Example:
        servlens ingest exports/litellm-2026-11-28.jsonl.gz --run before
        servlens ingest --from vllm-bench results/*.json --run bench-a
        servlens ingest tests/data/shared/real-engine/llamacpp/
        servlens ingest --metrics scrapes/ --run before
        servlens ingest incident/ --prometheus http://prometheus:9090 --db incident.duckdb
    """
    from servlens.ingest.api import check_something_ingested, ingest_inputs
    from servlens.render.ingest_text import ingest_text
    from servlens.store.schema import open_store

    pull = prometheus_pull(prometheus_url, prometheus_selector, prometheus_start, prometheus_end)
    db_path = resolve_db(ctx, db)
    con = open_store(db_path)
    try:
        report = ingest_inputs(
            con, list(inputs), run=run, from_format=from_format, profile_file=profile_file, keep_text=keep_text,
            strict=strict, start=start, tz=tz, at=at, metrics_inputs=list(metrics_inputs),
            progress=sys.stderr.isatty() and output_format == "text", prometheus=pull,
        )
    finally:
        con.close()
    check_something_ingested(report, [*inputs, *metrics_inputs])
    document = report.to_dict()
    echo_prometheus_notes(document)
    if output_format == "json":
        text = json.dumps(document, indent=2, default=str)
    else:
        text = ingest_text(document, str(db_path))
    write_output(text, out)
