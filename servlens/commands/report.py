"""`servlens report`: re-render a saved analyze or compare JSON result as HTML, Markdown, text or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click

from servlens.commands._common import default_out, output_options, pick_format, write_output
from servlens.errors import InputError


@click.command("report", context_settings={"max_content_width": 110})
@click.argument("result", type=click.Path(dir_okay=False))
@click.option("--templates", "templates_dir", type=click.Path(file_okay=False), default=None,
              help="With HTML output: a folder of templates that replace the built-in ones of the same name "
                   "(a template there can also {% extends \"default:analyze.html\" %}).")
@output_options
def report(result, templates_dir, output_format, out):
    """Re-render a saved result (`servlens analyze|compare --format json`) without the logs or the store.

    The document's `kind` picks the report: an incident report for analyze, a release gate for compare. The HTML
    report is one self-contained file (no scripts, no network, a strict Content-Security-Policy) that opens offline
    and prints cleanly. --format wins over --out's extension; with neither, text goes to stdout.

    \b
    Example:
        servlens analyze exports/ --format json --out results.json
        servlens report results.json --out reports/incident-1128.html
        servlens report results.json --out report.html --templates my-templates/
        servlens report gate.json --format md
    """
    fmt = pick_format(output_format, out)
    doc = load_result(Path(result))
    write_output(render_result(doc, fmt, templates_dir), default_out(fmt, out, doc["kind"]))


def load_result(path: Path) -> dict:
    """Read a saved result document, with one clear sentence for each way it can be wrong."""
    if not path.is_file():
        raise InputError(f"Result file '{path}' does not exist",
                         "Save one with `servlens analyze ... --format json --out results.json`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"'{path}' is not UTF-8 text", "Pass the JSON written by analyze or compare") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"'{path}' is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                         "Pass the JSON written by analyze or compare with --format json") from None
    if not isinstance(doc, dict) or doc.get("kind") not in ("analyze", "compare"):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        raise InputError(
            f"'{path}' is not an analyze or compare result (kind: {kind!r})",
            "Pass the JSON written by `servlens analyze` or `servlens compare` with --format json",
        )
    from servlens.documents import SCHEMA_VERSION, problems

    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InputError(f"'{path}' has no integer schema_version", "Pass a result written by servlens")
    if version > SCHEMA_VERSION:
        raise InputError(f"'{path}' uses result schema {version}, newer than this servlens reads ({SCHEMA_VERSION})",
                         "Upgrade servlens to render it")
    if version < SCHEMA_VERSION:
        # Version 1 was untyped (the renderer guessed its shape); its documents are written again, not half-read.
        raise InputError(f"'{path}' uses result schema {version}, older than this servlens reads ({SCHEMA_VERSION})",
                         f"Write it again with this servlens: `servlens {doc['kind']} ... --format json`")
    found = problems(doc, doc["kind"], limit=1)
    if found:
        raise InputError(f"'{path}' is not a valid {doc['kind']} result: {found[0]}",
                         "Pass the JSON servlens wrote, unedited")
    return doc


def render_result(doc: dict, fmt: str, templates_dir: str | None = None) -> str:
    """The document in `fmt`; HTML here, the other formats from the command that wrote the document."""
    if fmt == "html":
        from servlens.render.html import render_html

        return render_html(doc, templates_dir)
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False)
    if doc["kind"] == "analyze":
        from servlens.commands.analyze import render
    else:
        from servlens.commands.compare import render
    return render(doc, fmt)
