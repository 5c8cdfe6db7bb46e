"""The command line the harness's entry points share: `list`, and `run NAME... --out --seed --model-cache`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def list_run_parser(prog: str, doc: str, names: list[str], noun: str, list_help: str,
                    run_help: str) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """A parser with `list` and `run NAME... --out OUT [--seed] [--model-cache]` (the names land in args.names);
    the subparsers object is returned so an entry point can add commands of its own."""
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help=list_help)
    run = sub.add_parser("run", help=run_help)
    run.add_argument("names", nargs="+", metavar=noun.upper(), help=f"one of: {', '.join(names)}, or all")
    run.add_argument("--out", required=True, type=Path, help="output folder")
    run.add_argument("--seed", type=int, default=1234, help="model seed (default 1234)")
    run.add_argument("--model-cache", type=Path, default=None, help="where generated models are kept")
    return ap, sub


def chosen(requested: list[str], names: list[str], noun: str) -> list[str] | None:
    """The names to run (`all` is every one); None, after one sentence on stderr, when one is unknown."""
    picked = list(names) if requested == ["all"] else requested
    unknown = [n for n in picked if n not in names]
    if unknown:
        print(f"Error: unknown {noun} {', '.join(unknown)}; choose from {', '.join(names)}.", file=sys.stderr)
        return None
    return picked
