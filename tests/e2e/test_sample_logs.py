"""The committed sample_logs/ (recorded by tools/engine): each folder ingests cleanly and shows what its README
promises. No engine needed: these read the recording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.engine.make_sample_logs import FOLDERS

from .records import servlens

SAMPLE_LOGS = Path(__file__).resolve().parents[2] / "sample_logs"


def _records(folder: str) -> list[dict]:
    with open(SAMPLE_LOGS / folder / "requests.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("run,folder", sorted(FOLDERS.items()))
def test_sample_folder_is_complete_and_small(run, folder):
    path = SAMPLE_LOGS / folder
    names = {p.name for p in path.iterdir()}
    assert {"README.md", "requests.jsonl", "metrics_index.jsonl", "props.json"} <= names
    assert any(n.startswith(f"metrics_{run}_") and n.endswith(".prom") for n in names)
    records = _records(folder)
    assert 20 <= len(records) <= 300
    assert {r["run"] for r in records} == {run}
    assert sum(p.stat().st_size for p in path.iterdir()) < 1_500_000


@pytest.fixture(scope="module")
def sample_findings(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("samples") / "analyze.json"
    folders = [SAMPLE_LOGS / f for f in ("prefix-cache-off", "prefix-cache-on", "burst", "steady-a", "max-tokens",
                                         "reasoning-none", "reasoning-deepseek")]
    result = servlens("analyze", *folders, "--select", "SL001,SL002,SL003,SL004", "--format", "json", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    return {(f["rule"], f["scope"]["run"]): f["state"] for f in json.loads(out.read_text())["findings"]}


@pytest.mark.parametrize("rule,run,want", [
    ("SL001", "prefix_nocache", "fired"), ("SL001", "prefix_cache", "clear"),
    ("SL004", "burst", "fired"), ("SL004", "steady_a", "clear"),
    ("SL002", "max_tokens", "fired"),
    ("SL003", "reasoning_none", "fired"), ("SL003", "reasoning_deepseek", "clear"),
])
def test_sample_logs_show_what_their_readmes_say(sample_findings, rule, run, want):
    assert sample_findings.get((rule, run)) == want


def test_mixed_sample_context_overflows_are_errors_with_the_slot_context(tmp_path):
    """llama.cpp splits --ctx-size between the --parallel slots (8192 / 4 = 2048 here): a longer prompt is refused
    with HTTP 400 exceed_context_size_error, which ingest keeps as an error row with the slot's context window."""
    import duckdb

    raw = [r for r in _records("mixed") if r["http_status"] == 400]
    assert raw, "the mixed recording has over-long prompts"
    db = tmp_path / "mixed.duckdb"
    result = servlens("ingest", SAMPLE_LOGS / "mixed", "--db", db)
    assert result.returncode == 0, result.stdout + result.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT status, error_type, context_window, prompt_tokens, finish_reason FROM requests "
                           "WHERE http_status = 400 ORDER BY prompt_tokens").fetchall()
        ok_unknown = con.execute("SELECT count(*) FROM requests WHERE http_status = 200 AND status <> 'ok'"
                                 ).fetchone()[0]
    finally:
        con.close()
    want = sorted((r["response"]["error"]["n_prompt_tokens"], r["response"]["error"]["n_ctx"]) for r in raw)
    assert [(p, c) for _, _, c, p, _ in rows] == want
    assert all(c == 2048 for _, c in want)
    assert {(s, e) for s, e, _, _, _ in rows} == {("error", "exceed_context_size_error")}
    assert ok_unknown == 0
