"""The runs a command works on: the ones the store (or an engine's tables) holds, checked against what was asked."""

from __future__ import annotations

import duckdb

from servlens.errors import ConfigError


def list_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run with requests, metric samples or a runs row, in order."""
    return [row[0] for row in con.execute(
        """SELECT run FROM (SELECT run FROM requests UNION SELECT run FROM metric_samples UNION SELECT run FROM runs)
           WHERE run IS NOT NULL ORDER BY run"""
    ).fetchall()]


def select_runs(known: list[str], requested: list[str] | None, where: str, empty: tuple[str, str]) -> list[str]:
    """`requested` (default: every known run), each of them known; `where` names the place in the error ("the
    store", "chdb's tables"), `empty` is the (message, hint) when there is nothing to work on."""
    unknown = [r for r in requested or [] if r not in known]
    if unknown:
        raise ConfigError(f"No run named {', '.join(map(repr, unknown))} in {where}",
                          f"Runs in {where}: " + (", ".join(known) or "none"))
    selected = list(requested or known)
    if not selected:
        raise ConfigError(*empty)
    return selected
