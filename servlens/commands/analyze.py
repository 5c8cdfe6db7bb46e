"""`servlens analyze`: run the rules over request logs and engine metrics and report the findings."""

from __future__ import annotations

import json
import sys

import click

from servlens.commands._common import (
    default_out,
    echo_prometheus_notes,
    engine_options,
    import_in_background,
    output_options,
    pick_format,
    prometheus_options,
    prometheus_pull,
    resolve_db,
    write_output,
)
from servlens.errors import ConfigError, InputError

FAIL_ON = ("info", "warning", "critical")


def _split(values: tuple[str, ...]) -> list[str]:
    """Comma-separated and repeated options as one list: --select SL001,SL004 --select SL002."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@click.command("analyze", context_settings={"max_content_width": 110})
@click.argument("paths", nargs=-1)
@click.option("--metrics", "metrics_paths", multiple=True,
              help="Prometheus scrapes (files, folders, globs) to read with the logs; repeatable. A folder in PATHS "
                   "may hold scrapes too.")
@click.option("--db", "db", type=click.Path(dir_okay=False), default=None,
              help="Analyse runs already ingested into this store instead of files.")
@click.option("--run", "runs", multiple=True,
              help="With --db: the run(s) to analyse [default: all]. With PATHS: the run label to ingest as.")
@click.option("--from", "from_format", default=None,
              help="Format of PATHS when sniffing cannot tell ('servlens formats' lists them).")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(file_okay=False),
              help="A folder of your own rule files, added to the built-in ones; repeatable.")
@click.option("--select", "select", multiple=True, help="Only these rules (ids or prefixes, comma-separated).")
@click.option("--ignore", "ignore", multiple=True, help="Skip these rules (ids or prefixes, comma-separated).")
@click.option("--preview", is_flag=True, envvar="SERVLENS_PREVIEW",
              help="Also run the rules whose status is preview (or set SERVLENS_PREVIEW=1).")
@click.option("--set", "settings", multiple=True, metavar="RULE.PARAM=VALUE",
              help="Override a rule parameter, e.g. --set SL004.min_queue_share=0.6; repeatable.")
@click.option("--fail-on", "fail_on", type=click.Choice(FAIL_ON), default=None,
              help="Exit 1 when a finding of this severity or higher fired [default: never].")
@click.option("--slo", "slo", multiple=True, metavar="ttft=2s,tpot=100ms",
              help="SLO targets for goodput and the breaking concurrency (MODEL:ttft=... for one model; repeatable).")
@click.option("--verbose", "-v", is_flag=True,
              help="Text output: each finding's evidence, examples, what to do and rollback, every check with "
                   "its reason, and the full workload profile (JSON, Markdown and HTML always have them).")
@engine_options("Run")
@click.option("--templates", "templates_dir", type=click.Path(file_okay=False), default=None,
              help="With --format html: a folder of templates that replace the built-in ones.")
@prometheus_options()
@output_options
@click.pass_context
def analyze(ctx, paths, metrics_paths, db, runs, from_format, rules_dirs, select, ignore, preview, settings, fail_on,
            slo, verbose, engine_url, table, templates_dir, prometheus_url, prometheus_selector, prometheus_start,
            prometheus_end,
            output_format, out):
    """Find incidents in request logs and engine metrics: run the rules and report each finding with its evidence.

    PATHS are request logs, scrapes, or folders holding both; they are ingested into a temporary in-memory store.
    Without PATHS, runs already in a store are analysed (--db, else .servlens/store.duckdb). Every rule ends in one
    of three states per run and model: fired (with evidence, example requests, what to do and when to roll back),
    clear, or not evaluable (the data it needs is missing; never counted as clear). Exit code: 0, also when rules
    were not evaluable; 1 when a finding at or above --fail-on fired; 2 usage or input error.

    \b
    Example:
        servlens analyze exports/*.jsonl --metrics scrapes/
        servlens analyze incident-1128/
        servlens analyze --db .servlens/store.duckdb --run before
        servlens analyze logs/ --select SL001,SL004 --set SL004.min_queue_share=0.6 --fail-on warning
        servlens analyze logs/ --format md --out summary.md
        servlens analyze incident-1128/ --verbose
        servlens analyze incident-1128/ --prometheus http://prom:9090 --prometheus-selector '{job="llm"}'
        servlens analyze incident-1128/ --slo ttft=2s,tpot=100ms
        servlens analyze --engine spark:local[2] --table parquet:out/servlens --run prod-1128
        servlens analyze --engine chdb --table parquet:out/servlens --run prod-1128
    """
    from servlens.analysis.goodput import parse_slo
    from servlens.analysis.rules import load_rules, parse_overrides, runnable, select_rules
    from servlens.analysis.runner import analyze as run_analysis
    from servlens.analysis.runner import fails

    fmt = pick_format(output_format, out)
    chart_imports = None
    if fmt == "html":
        from servlens.render.charts import CHART_MODULES

        chart_imports = import_in_background(*CHART_MODULES)  # 0.8 s, while DuckDB ingests and runs the rules
    rules = load_rules(list(rules_dirs))
    selected = runnable(select_rules(rules, _split(select), _split(ignore)), _split(select), preview)
    if not selected:
        raise ConfigError("--select and --ignore leave no rule to run", "Known rules: " + ", ".join(r.id for r in rules))
    overrides = parse_overrides(list(settings), rules)
    pull = prometheus_pull(prometheus_url, prometheus_selector, prometheus_start, prometheus_end, selected)
    targets = parse_slo(slo)

    if engine_url or table:
        if paths or metrics_paths or pull:
            raise ConfigError("--engine and --table analyse tables where they are, not files",
                              "Drop the files, or drop --engine/--table")
        from servlens.engines.analysis import analyze_where_the_data_is

        store = resolve_db(ctx, db) if not (table or "").startswith("parquet:") else None
        doc = analyze_where_the_data_is(engine_url, table, store, selected, list(runs), overrides, targets)
        skipped = []
    else:
        con, analysed_runs, skipped = _open(ctx, paths, metrics_paths, db, runs, from_format, pull)
        try:
            doc = run_analysis(con, selected, analysed_runs, overrides, targets)
        finally:
            con.close()
    if skipped:
        doc["coverage"]["skipped"] = skipped
    color = fmt == "text" and out is None and sys.stdout.isatty()
    if chart_imports is not None:
        chart_imports.join()
    rendered = render(doc, fmt, templates_dir, color=color, verbose=verbose)
    write_output(rendered, default_out(fmt, out, "analyze"))
    _warn_not_evaluable(doc)
    ctx.exit(1 if fails(doc, fail_on) else 0)


def render(doc: dict, fmt: str, templates_dir: str | None = None, color: bool = False,
           verbose: bool = False) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False)
    if fmt == "md":
        from servlens.render.analyze_markdown import render_analyze_markdown

        return render_analyze_markdown(doc)
    if fmt == "html":
        from servlens.render.html import render_html

        return render_html(doc, templates_dir)
    from servlens.render.analyze_text import render_analyze_text

    return render_analyze_text(doc, color=color, verbose=verbose)


def _warn_not_evaluable(doc: dict) -> None:
    """Say loudly on stderr when checks could not be evaluated: exit 0 must not read as 'all clear'."""
    missing = [f for f in doc["findings"] if f["state"] == "not_evaluable"]
    if not missing:
        return
    rules = sorted({f["rule"] for f in missing})
    click.echo(
        f"Warning: {len(missing)} of {len(doc['findings'])} checks were not evaluable ({', '.join(rules)}): "
        "the data they need is missing, so they are not clear. The report says what each needs.",
        err=True,
    )


def _open(ctx, paths, metrics_paths, db, runs, from_format, pull=None):
    """(connection, runs to analyse, skipped files): a temporary store from PATHS (and --prometheus), or an
    existing store."""
    from servlens.store.schema import open_store

    if paths or metrics_paths or pull:
        if db and pull and not (paths or metrics_paths):
            raise ConfigError("--prometheus pulls into a temporary store, not into --db",
                              "Keep the pull with 'servlens ingest --prometheus URL --db STORE', "
                              "then analyse --db")
        if db:
            raise ConfigError("Give files to analyse or --db with a store, not both",
                              "Add the files to the store with 'servlens ingest' first, or drop --db")
        if len(runs) > 1:
            raise ConfigError("With files, --run names the one run label to ingest them as", "Pass --run once")
        from servlens.analysis.inputs import ingest_paths

        con = open_store(None)
        try:
            report = ingest_paths(con, list(paths), list(metrics_paths), run=runs[0] if runs else None,
                                  from_format=from_format, prometheus=pull)
        except BaseException:
            con.close()
            raise
        echo_prometheus_notes(report)
        if not report["runs"]:
            con.close()
            raise InputError("Nothing servlens recognises in " + ", ".join(list(paths) + list(metrics_paths)),
                             "Check the paths, or name the format with --from ('servlens formats' lists them)")
        # Files a folder held that are not data (server logs, /slots dumps): listed so nothing disappears silently.
        skipped = [f"{s['path']}: {s['reason']}" for s in report.get("skipped", [])]
        return con, report["runs"], skipped
    store = resolve_db(ctx, db)
    if not store.exists():
        raise InputError(f"Nothing to analyse: no files given and no store at {store}",
                         "Pass request logs or folders, or --db with a store 'servlens ingest' wrote")
    return open_store(store, read_only=True), list(runs) or None, []
