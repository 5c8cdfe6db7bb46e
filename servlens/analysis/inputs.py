"""Files to analyse: ingest them into a (temporary) store through the normal ingest path.

`servlens analyze PATHS` and rule cases with `logs = [...]` both come here, so what analyze sees is exactly what
`servlens ingest` would have stored.
"""

from __future__ import annotations

import duckdb


def ingest_paths(con: duckdb.DuckDBPyConnection, paths: list[str], metrics_paths: list[str] = (),
                 run: str | None = None, **options) -> dict:
    """Ingest request logs (and scrapes found beside them) plus `metrics_paths`; the ingest report as a dict."""
    from servlens.ingest.api import ingest_inputs

    report = ingest_inputs(con, list(paths), run=run, metrics_inputs=list(metrics_paths), **options)
    return report.to_dict()
