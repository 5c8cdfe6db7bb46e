"""Engine settings recorded beside a request log: llama.cpp's /props and /slots answers.

A llama.cpp recording folder (tools/engine, tests/data/shared/real-engine/llamacpp) holds `props.json` (the server's
/props: `total_slots` = --parallel, `default_generation_settings.n_ctx` = the context of one slot) and
`slots_*.json` (/slots: one object per slot, each with its `n_ctx`). Neither has per-request rows, but both say what
every request in that folder was served with, which the request logs do not: the slot count (SL012 and the workload
profile read `attrs.parallel`) and the context one request can use.

When such a file is ingested, the request rows of the request logs in the SAME folder (ingested in this call or
before) get, in one UPDATE:

- attrs.parallel = total_slots, attrs.n_ctx_per_slot = the slot context (a value the row already has wins);
- context_window = the slot context where the row has none (llama.cpp's context errors already name the same
  per-slot size; the slot context is what a request can use, whether or not the KV cache is unified).

The whole --ctx-size is not stored: it is slots x n_ctx only when the KV cache is split between slots, and /props
does not say which. Rows whose provider is known and is not llama.cpp are left alone. The file is recorded as a
source of kind 'engine_info' for each run it annotated (rows = 0: it adds no rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import duckdb

from servlens.ingest import sources as src

ENGINE_INFO_KIND = "engine_info"
PROPS_FORMAT = "llamacpp-props"
SLOTS_FORMAT = "llamacpp-slots"
# /props and /slots answers are a few kilobytes; anything much larger is not one.
MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class EngineInfo:
    """What one side file says about the server that answered the requests beside it."""

    path: Path
    format: str  # PROPS_FORMAT | SLOTS_FORMAT
    slots: int
    n_ctx_per_slot: int

    def describe(self) -> str:
        what = "llama.cpp /props" if self.format == PROPS_FORMAT else "llama.cpp /slots"
        return f"{what}: {self.slots} slots of {self.n_ctx_per_slot:,} tokens"


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_engine_info(path: Path) -> EngineInfo | None:
    """The engine settings in `path` if it is a llama.cpp /props or /slots answer, else None (never raises)."""
    if src.base_suffix(path) != ".json" or src.compression_of(path):
        return None
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if isinstance(doc, dict):
        slots = _positive_int(doc.get("total_slots"))
        settings = doc.get("default_generation_settings")
        n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if slots and n_ctx:
            return EngineInfo(path, PROPS_FORMAT, slots, n_ctx)
        return None
    if isinstance(doc, list) and doc and all(isinstance(s, dict) and "id" in s and "is_processing" in s for s in doc):
        sizes = {_positive_int(s.get("n_ctx")) for s in doc}
        if len(sizes) == 1 and None not in sizes:
            return EngineInfo(path, SLOTS_FORMAT, len(doc), sizes.pop())
    return None


def _folder_sources(con: duckdb.DuckDBPyConnection, folder: Path) -> list[int]:
    """Request sources whose file sits directly in `folder` (not in a sub-folder)."""
    prefix = str(folder).rstrip("/") + "/"
    rows = con.execute(
        "SELECT source_id FROM sources WHERE kind = 'requests' AND starts_with(path, ?) "
        "AND NOT contains(substr(path, ?), '/') ORDER BY source_id",
        [prefix, len(prefix) + 1],
    ).fetchall()
    return [r[0] for r in rows]


def apply_engine_info(con: duckdb.DuckDBPyConnection, infos: list[EngineInfo]) -> tuple[list[dict], list[dict]]:
    """Annotate the request rows of each file's folder; returns (report entries, skipped entries).

    One file per folder is used: /props when there is one (it is the server's own statement of its settings), else
    the first /slots file; the others are listed as skipped with the reason."""
    by_folder: dict[Path, list[EngineInfo]] = {}
    for info in infos:
        by_folder.setdefault(info.path.parent, []).append(info)
    entries: list[dict] = []
    skipped: list[dict] = []
    for folder, found in by_folder.items():
        found.sort(key=lambda i: (i.format != PROPS_FORMAT, i.path.name))
        info = found[0]
        for other in found[1:]:
            agree = (other.slots, other.n_ctx_per_slot) == (info.slots, info.n_ctx_per_slot)
            skipped.append({"path": str(other.path), "reason": f"{other.describe()}; "
                            f"{'agrees with' if agree else 'differs from'} {info.path.name}, which is used"})
        source_ids = _folder_sources(con, folder)
        if not source_ids:
            skipped.append({"path": str(info.path), "reason": f"{info.describe()}; no request log in its folder to apply it to"})
            continue
        entries.append(_apply_one(con, info, source_ids))
    return entries, skipped


def _apply_one(con: duckdb.DuckDBPyConnection, info: EngineInfo, source_ids: list[int]) -> dict:
    ids = ", ".join(str(int(i)) for i in source_ids)
    where = f"source_id IN ({ids}) AND coalesce(provider, 'llama.cpp') = 'llama.cpp'"
    digest = src.file_sha256(info.path)
    with src.one_transaction(con):
        per_run = con.execute(f"SELECT run, count(*) FROM requests WHERE {where} GROUP BY run ORDER BY run").fetchall()
        # Values the row already has win (json_merge_patch: the second argument's keys override the first's).
        con.execute(
            f"""UPDATE requests SET
                  attrs = json_merge_patch(json_object('parallel', $slots, 'n_ctx_per_slot', $n_ctx),
                                           coalesce(attrs, '{{}}'::JSON)),
                  context_window = coalesce(context_window, $n_ctx)
                WHERE {where}""",
            {"slots": info.slots, "n_ctx": info.n_ctx_per_slot},
        )
        new_runs = []
        for run, _ in per_run:
            decision = src.decide_source(con, run, ENGINE_INFO_KIND, info.path, sha256=digest)
            if decision.action == "skip":
                continue
            if decision.action == "replace":
                src.delete_source(con, decision.old_source_id)
            src.insert_source(con, run=run, kind=ENGINE_INFO_KIND, path=info.path, decision=decision, fmt=info.format)
            new_runs.append(run)
    runs = [r for r, _ in per_run]
    return {
        "path": str(info.path), "format": info.format, "kind": ENGINE_INFO_KIND,
        "run": runs[0] if len(runs) == 1 else runs, "runs": runs,
        "rows": 0, "bad_lines": 0, "skipped": not new_runs,
        "slots": info.slots, "n_ctx_per_slot": info.n_ctx_per_slot,
        "requests_annotated": sum(n for _, n in per_run),
    }
