"""`servlens compare`: before/after statistics on matched request cohorts, as a release gate."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from servlens.commands._common import (
    default_out,
    engine_options,
    output_options,
    pick_format,
    prometheus_options,
    prometheus_pull,
    resolve_db,
    write_output,
)
from servlens.errors import ConfigError, InputError


@click.command("compare", context_settings={"max_content_width": 110})
@click.argument("before", required=False)
@click.argument("after", required=False)
@click.option("--db", "db", type=click.Path(dir_okay=False), default=None,
              help="A store that already holds both runs (with --before/--after, or run labels as arguments).")
@click.option("--before", "before_run", default=None, help="Run label of the before run in --db.")
@click.option("--after", "after_run", default=None, help="Run label of the after run in --db.")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False), default=None,
              help="Gate policy (TOML) [default: the built-in policy; see docs/compare.md].")
@click.option("--by", "by", default=None,
              help="Cohort bands, comma-separated: model, served_model, deployment, provider, prompt_band, "
                   "output_band [default: model,prompt_band; e2e adds output_band].")
@click.option("--from", "from_format", default=None,
              help="Format of BEFORE and AFTER files when sniffing cannot tell ('servlens formats' lists them).")
@click.option("--templates", "templates_dir", type=click.Path(file_okay=False), default=None,
              help="With --format html: a folder of templates that replace the built-in ones of the same name.")
@output_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the points sampled for the covariate chart (results repeat exactly).")
@click.option("--slo", "slo", multiple=True, metavar="ttft=2s,tpot=100ms",
              help="SLO targets: adds the change in goodput attainment as an advisory gate (MODEL:ttft=... for one model).")
@engine_options("Compare")
@prometheus_options(window=False)
@click.pass_context
def compare(ctx, before, after, db, before_run, after_run, policy_path, by, from_format, templates_dir,
            output_format, out, seed, slo, engine_url, table, prometheus_url, prometheus_selector):
    """Compare an AFTER run with a BEFORE run on matched cohorts and gate the release.

    BEFORE and AFTER are files or folders of request logs (ingested into a temporary store), or run labels in
    --db. Exit code: 0 pass, 1 fail, 3 inconclusive (too little data, no overlapping cohorts, a gated metric
    missing on one side), 2 usage or input error.

    \b
    Example:
        servlens compare before/ after/
        servlens compare --db store.duckdb --before prod-1127 --after canary-1128
        servlens compare before.jsonl after.jsonl --policy gates.toml --format md --out compare.md
        servlens compare before/ after/ --out gate.html --templates my-templates/
        servlens compare before/ after/ --prometheus http://prometheus:9090   (each side's own window)
        servlens compare --engine chdb --table parquet:out/servlens --before prod-1127 --after canary-1128

    With --engine and --table, BEFORE and AFTER are run labels in those tables (an export from 'servlens export
    --db STORE --parquet DIR', or the canonical table on ClickHouse or Spark): the same verdicts and document as
    on the store, computed there.
    """
    from servlens.compare.engine import compare_runs, exit_code
    from servlens.compare.policy import load_policy, parse_by

    fmt = pick_format(output_format, out)
    if fmt == "html" and templates_dir is not None and not Path(templates_dir).is_dir():
        # Before any ingest or statistics: a mistyped folder should not cost the whole comparison.
        raise ConfigError(f"Template folder '{templates_dir}' does not exist", "Pass --templates a folder of .html files")
    from servlens.analysis.goodput import goodput_gate, parse_slo

    targets = parse_slo(slo)
    policy = load_policy(policy_path)
    if by is not None:
        policy = policy.with_by(parse_by(by))
    pull = prometheus_pull(prometheus_url, prometheus_selector)

    if engine_url or table:
        doc = _compare_on_engine(ctx, engine_url, table, db, before, after, before_run, after_run, policy, seed,
                                 targets, pull, from_format)
        write_output(render(doc, fmt, templates_dir), default_out(fmt, out, "compare"))
        ctx.exit(exit_code(doc))

    scratch = tempfile.TemporaryDirectory(prefix="servlens-compare-")
    try:
        con, before_label, after_label = _open_runs(ctx, before, after, db, before_run, after_run, from_format,
                                                    Path(scratch.name), pull)
        try:
            doc = compare_runs(con, before_label, after_label, policy, seed=seed)
            if targets:
                doc["goodput_gate"] = goodput_gate(con, before_label, after_label, targets)
        finally:
            con.close()
    finally:
        scratch.cleanup()
    write_output(render(doc, fmt, templates_dir), default_out(fmt, out, "compare"))
    ctx.exit(exit_code(doc))


def render(doc: dict, fmt: str, templates_dir: str | None = None) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False)
    if fmt == "md":
        from servlens.render.compare_markdown import render_compare_markdown

        return render_compare_markdown(doc)
    if fmt == "html":
        from servlens.render.html import render_html

        return render_html(doc, templates_dir)
    from servlens.render.compare_text import render_compare_text

    return render_compare_text(doc)


def _compare_on_engine(ctx, engine_url, table, db, before, after, before_run, after_run, policy, seed, targets,
                       pull, from_format) -> dict:
    """--engine/--table: two run labels compared where the tables are (servlens/engines/compare.py)."""
    from servlens.engines.compare import compare_where_the_data_is

    if pull is not None or from_format:
        raise ConfigError("--engine and --table compare runs where they are; --prometheus and --from read files",
                          "Drop --prometheus/--from, or drop --engine/--table")
    if before_run or after_run:
        if before or after:
            raise ConfigError("Give either two run labels as arguments or --before/--after, not both",
                              "Example: servlens compare --engine chdb --table parquet:out/servlens "
                              "--before prod --after canary")
        before, after = before_run, after_run
    if not (before and after):
        raise ConfigError("--engine and --table compare two runs: name them with --before and --after",
                          "Example: servlens compare --engine chdb --table parquet:out/servlens "
                          "--before prod --after canary")
    if any(Path(x).exists() for x in (before, after)):
        raise ConfigError("--engine and --table compare runs where they are, not files",
                          "Name two runs of the table, or drop --engine/--table")
    store = resolve_db(ctx, db) if not (table or "").startswith("parquet:") else None
    return compare_where_the_data_is(engine_url, table, store, before, after, policy, seed, targets)


def _open_runs(ctx, before, after, db, before_run, after_run, from_format, scratch: Path, pull=None):
    """A connection and the two run labels: from --db and labels, or a temporary store ingested from paths.

    The temporary store is a file in `scratch` (removed afterwards), so DuckDB can spill large inputs to disk.
    """
    from servlens.store.schema import open_store

    labels_only = before and after and not any(map(_looks_like_path, (before, after)))
    if pull is not None and (before_run or after_run or labels_only):
        raise ConfigError("--prometheus pulls metrics for BEFORE and AFTER files or folders, not for runs "
                          "in a store", "Keep them with 'servlens ingest --prometheus URL --db STORE' first, "
                          "or give the files")
    if before_run or after_run:
        if before or after:
            raise ConfigError("Give either two paths or run labels as arguments, or --before/--after, not both",
                              "Example: servlens compare --db store.duckdb --before prod --after canary")
        if not (before_run and after_run):
            raise ConfigError("--before and --after go together", "Name both runs")
        return open_store(resolve_db(ctx, db), read_only=True), before_run, after_run
    if not (before and after):
        raise ConfigError("compare needs a BEFORE and an AFTER",
                          "Example: servlens compare before/ after/  (or --db store.duckdb --before A --after B)")
    paths = [_looks_like_path(x) for x in (before, after)]
    if not any(paths):
        store = resolve_db(ctx, db)
        if not store.exists():
            raise InputError(f"No such file or folder: {before if not paths[0] else after}",
                             "Give two files or folders, or run labels with --db")
        return open_store(store, read_only=True), before, after
    if not all(paths):
        missing = after if paths[0] else before
        raise InputError(f"No such file or folder: {missing}",
                         "Give two files or folders, or two run labels with --db")
    con = open_store(scratch / "compare.duckdb")
    try:
        for label, path in (("before", before), ("after", after)):
            _ingest(con, path, label, from_format, pull)
    except BaseException:
        con.close()
        raise
    return con, "before", "after"


def _looks_like_path(value: str) -> bool:
    return Path(value).exists() or any(ch in value for ch in "*?[")


def _ingest(con, path: str, run: str, from_format: str | None, pull=None) -> None:
    """Ingest a file or folder into the temporary store as run `run` (servlens.ingest.api); with `pull`, the
    engine metrics of that run's own time span from Prometheus too."""
    from servlens.commands._common import echo_prometheus_notes
    from servlens.ingest.api import ingest_inputs

    report = ingest_inputs(con, [path], run=run, from_format=from_format, progress=sys.stderr.isatty(),
                           prometheus=pull)
    echo_prometheus_notes(report.to_dict())
    rows = con.execute("SELECT count(*) FROM requests WHERE run = ?", [run]).fetchall()[0][0]
    if rows == 0:
        raise InputError(f"{path} holds no request log that servlens recognises",
                         "Check the path, or name the format with --from ('servlens formats' lists them)")
