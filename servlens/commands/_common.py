"""Options and helpers shared by the commands, so every command spells them the same way."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import click

from servlens.errors import ConfigError
from servlens.escape import terminal_safe

OUTPUT_FORMATS = ("text", "json", "md", "html")


def db_option(func):
    """`--db PATH` on a subcommand; falls back to the group's --db, then .servlens/store.duckdb."""
    return click.option(
        "--db",
        "db",
        type=click.Path(dir_okay=False),
        default=None,
        help="The DuckDB store [default: .servlens/store.duckdb].",
    )(func)


def resolve_db(ctx: click.Context, db: str | None) -> Path:
    """The store path: the subcommand's --db, else the group's --db / $SERVLENS_DB, else the default."""
    from servlens.store.schema import DEFAULT_DB_PATH

    root = ctx.find_root()
    group_db = (root.obj or {}).get("db") if root.obj else None
    path = Path(db or group_db or DEFAULT_DB_PATH)
    check_store_path(path)
    return path


def check_store_path(path: Path) -> None:
    """Refuse a store path DuckDB would hang on (a FIFO) or fail on with a traceback (a folder, a parent that is a
    file, a folder that cannot be written), with one sentence."""
    from servlens.ingest.sources import not_a_regular_file

    problem = not_a_regular_file(path)
    if problem or path.is_dir():
        raise ConfigError(f"The store {path} is {problem or 'a folder'}, not a DuckDB file", "Pass --db FILE")
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not path.exists() and not parent.is_dir():
        raise ConfigError(f"Cannot create the store {path}: {parent} is not a folder", "Pass --db with a folder that exists")
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"Cannot create the store {path}: {parent} is not writable", "Pass --db in a writable folder")


def output_options(func):
    """`--format` and `--out`; --format wins over the --out extension; with neither, text on stdout."""
    func = click.option(
        "--out",
        "out",
        type=click.Path(dir_okay=False, writable=True),
        default=None,
        help="Write the result to this file; .json, .md, .html or .txt pick the format. HTML without --out goes "
        "to reports/KIND-TIMESTAMP.html.",
    )(func)
    func = click.option(
        "--format",
        "output_format",
        type=click.Choice(OUTPUT_FORMATS),
        default=None,
        help="Output format [default: from --out's extension, else text].",
    )(func)
    return func


def pick_format(output_format: str | None, out: str | None) -> str:
    """Resolve the output format from --format and --out (DESIGN.md Decisions: --format wins)."""
    if output_format:
        return output_format
    if out:
        suffix = Path(out).suffix.lower()
        by_suffix = {".json": "json", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".txt": "text"}
        if suffix not in by_suffix:
            raise ConfigError(
                f"Cannot tell the output format from '{out}'",
                "Use a .json, .md, .html or .txt file name, or pass --format",
            )
        return by_suffix[suffix]
    return "text"


# An HTML page printed on a terminal helps nobody: without --out it goes here (the folder's real output is
# git-ignored). Redirected or piped, stdout still gets it (`servlens analyze x --format html > r.html`).
DEFAULT_REPORTS_DIR = Path("reports")


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def default_out(fmt: str, out: str | None, kind: str) -> str | None:
    """--out as given; for HTML without --out on a terminal, reports/KIND-YYYYmmdd-HHMMSS.html in the working
    directory."""
    if out is not None or fmt != "html" or not stdout_is_terminal():
        return out
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return str(DEFAULT_REPORTS_DIR / f"{kind}-{stamp}.html")


def write_output(text: str, out: str | None) -> None:
    """Write to --out (creating its folder) or to stdout; no control character from a log value gets through
    (servlens.escape.terminal_safe keeps only colours)."""
    text = terminal_safe(text)
    if out:
        path = Path(out)
        parent = next((p for p in path.parents if p.exists()), Path("."))
        if not parent.is_dir():
            raise ConfigError(f"Cannot write {out}: {parent} is a file, not a folder", "Pass --out with a writable path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:  # read-only folder, a parent that is a file, a full disk, a name too long
            raise ConfigError(f"Cannot write {out}: {exc.strerror or exc}", "Pass --out with a writable path") from None
        click.echo(f"Wrote {path}", err=True)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def import_in_background(*modules: str) -> threading.Thread:
    """Import `modules` in a daemon thread while the caller's DuckDB work (which releases the GIL) runs; join the
    thread before using them. A failed import is left for the caller's own import to report."""

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:
                return

    thread = threading.Thread(target=run, name="servlens-imports", daemon=True)
    thread.start()
    return thread


def engine_options(verb: str):
    """`--engine URL` and `--table T`: `verb` ("Run", "Compare") where the data is instead of in the store."""

    def decorate(func):
        func = click.option(
            "--table", "table", default=None, metavar="TABLE|parquet:DIR",
            help="With --engine: the canonical requests table (metric_samples beside it), or parquet:DIR (what "
                 "'servlens export --parquet DIR' wrote).",
        )(func)
        return click.option(
            "--engine", "engine_url", default=None, metavar="URL",
            help=f"{verb} where the data is: duckdb (default), chdb, clickhouse://HOST:PORT/DB, spark:local[N], "
                 "spark://HOST:PORT or sc://HOST:PORT; only aggregates come back.",
        )(func)

    return decorate


def prometheus_options(window: bool = True):
    """`--prometheus URL` and `--prometheus-selector`, plus `--prometheus-start/-end` with `window`."""

    def decorate(func):
        if window:
            func = click.option(
                "--prometheus-end", "prometheus_end", default=None, metavar="TIME",
                help="End of the window to pull (ISO-8601 or Unix s) [default: the logs' last request "
                     "+ 2 min].",
            )(func)
            func = click.option(
                "--prometheus-start", "prometheus_start", default=None, metavar="TIME",
                help="Start of the window to pull [default: the logs' first request - 2 min].",
            )(func)
        func = click.option(
            "--prometheus-selector", "prometheus_selector", default=None, metavar="'{LABELS}'",
            help="Label matchers narrowing the pulled series, e.g. '{job=\"llm\"}'.",
        )(func)
        func = click.option(
            "--prometheus", "prometheus_url", default=None, metavar="URL",
            help="Pull the engine metrics the rules need from this Prometheus-compatible server "
                 "(auth: $SERVLENS_PROMETHEUS_TOKEN, or _USER and _PASSWORD).",
        )(func)
        return func

    return decorate


def prometheus_pull(url: str | None, selector: str | None, start: str | None = None, end: str | None = None,
                    rules=None):
    """The --prometheus request for ingest_inputs (None without --prometheus); series from `rules`' needs (all
    built-in rules when None)."""
    if url is None:
        if selector or start or end:
            raise ConfigError("--prometheus-selector, --prometheus-start and --prometheus-end need "
                              "--prometheus URL", "Add --prometheus http://HOST:9090")
        return None
    from servlens.ingest.prometheus_source import prometheus_pull as build
    from servlens.ingest.prometheus_source import required_by

    if rules is None:
        from servlens.analysis.rules import load_rules

        rules = load_rules()
    return build(url, required=required_by(rules), selector=selector, start=start, end=end)


def echo_prometheus_notes(report: dict) -> None:
    """Say on stderr what a Prometheus pull noted (an assumed interval, server warnings, no series found)."""
    for source in report.get("sources", []):
        info = source.get("prometheus") or {}
        for text in info.get("notes", []) + [f"the server warned: {w}" for w in info.get("warnings", [])]:
            click.echo(f"Note ({source['run']}): {text}.", err=True)
