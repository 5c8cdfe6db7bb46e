"""Shared by the tests/ingest/test_profile_<system>.py tests: ingest one real sample sniffed, read its rows back."""

from __future__ import annotations

import json
from pathlib import Path

from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import builtin_profiles
from servlens.ingest.sniff import sniff
from servlens.store.schema import open_store

FORMATS = Path(__file__).resolve().parents[1] / "data" / "formats"


def sniffed_name(path: Path) -> str | None:
    found = sniff(path, builtin_profiles()).profile
    return found.name if found else None


def ingest_rows(path: Path, order: str = "source_line, t_arrival, request_id", **options):
    """(source summary, rows as dicts with attrs parsed, the store) for one file ingested without --from."""
    con = open_store(None)
    report = ingest_inputs(con, [str(path)], run="t", **options)
    cur = con.execute(f"SELECT * FROM requests ORDER BY {order}")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for row in rows:
        row["attrs"] = json.loads(row["attrs"]) if row["attrs"] else {}
    return report.to_dict()["sources"][0], rows, con
