"""The `servlens` command line: a thin click group that parses options and delegates.

Each command lives in servlens/commands/<name>.py and is imported only when it runs, so `servlens -h` starts fast
(duckdb, polars, scipy and matplotlib are imported lazily by the commands that need them).
"""

from __future__ import annotations

import importlib
import sys

import click

from servlens import __version__
from servlens.errors import ServlensError, redact_secrets
from servlens.escape import one_line

# command name -> "module:attribute". Order is the order `servlens -h` lists them.
COMMANDS: dict[str, str] = {
    "ingest": "servlens.commands.ingest:ingest",
    "analyze": "servlens.commands.analyze:analyze",
    "compare": "servlens.commands.compare:compare",
    "report": "servlens.commands.report:report",
    "runs": "servlens.commands.runs:runs",
    "formats": "servlens.commands.formats:formats",
    "rules": "servlens.commands.rules:rules",
    "export": "servlens.commands.export:export",
    "engines": "servlens.commands.engines:engines",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS) + sorted(set(super().list_commands(ctx)) - set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="servlens")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="SERVLENS_DB",
    help="The DuckDB store [default: .servlens/store.duckdb in the working directory].",
)
@click.pass_context
def cli(ctx: click.Context, db: str | None) -> None:
    """Find incidents in LLM serving logs and gate releases on before/after statistics.

    \b
    Example:
        servlens ingest sample_logs/prefix-cache-off/ --run incident
        servlens analyze sample_logs/prefix-cache-off/
        servlens compare sample_logs/steady-a/ sample_logs/steady-b/
    """
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


def _out_of_memory(exc: Exception) -> bool:
    duckdb = sys.modules.get("duckdb")  # not imported here: the CLI starts without DuckDB
    return duckdb is not None and isinstance(exc, duckdb.OutOfMemoryException)


def main() -> None:
    """Entry point: run the group, turning ServlensError into one line on stderr and its exit code."""
    try:
        # standalone_mode=False returns a command's ctx.exit(code) instead of exiting; keep that code (compare: 1, 3)
        code = cli.main(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except ServlensError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        # Ctrl-C: the transaction in progress was rolled back; nothing else to say
        sys.exit(130)
    except RuntimeError as exc:
        if "Query interrupted" not in str(exc):  # DuckDB's answer to Ctrl-C during a query
            raise
        sys.exit(130)
    except click.ClickException as exc:
        exc.message = one_line(redact_secrets(exc.message))  # it can quote a file name or an option's value
        exc.show()
        sys.exit(2 if exc.exit_code == 1 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:  # a file system error no command turned into a sentence: still one line, exit 2
        where = f" ({one_line(exc.filename)})" if exc.filename else ""
        click.echo(f"Error: {one_line(exc.strerror or exc)}{where}.", err=True)
        sys.exit(2)
    except Exception as exc:
        if not _out_of_memory(exc):
            raise
        # a step that could not spill: what to change, not a traceback (every store write is one transaction)
        from servlens.store.schema import MEMORY_LIMIT_ENV

        used = str(exc).split("(", 1)[1].split(")", 1)[0] if "(" in str(exc) else "its limit"
        click.echo(f"Error: DuckDB ran out of memory ({used}). Set {MEMORY_LIMIT_ENV} higher (e.g. "
                   f"{MEMORY_LIMIT_ENV}=4GB) and run the command again.", err=True)
        sys.exit(2)
    sys.exit(0)
