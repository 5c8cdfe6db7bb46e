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


SHARED_LLAMACPP = Path(__file__).resolve().parents[2] / "tests" / "data" / "shared" / "real-engine" / "llamacpp"


def _kind(rec: dict) -> str:
    return "error" if rec.get("http_status") != 200 else "stream" if rec["body"].get("stream") else "plain"


def test_harness_records_have_the_shared_recordings_keys():
    """The harness writes the record format of the shared llama.cpp recording (the shape the ingest profile reads):
    every key that recording has for a kind of request, the harness has too, with the same meaning of the times."""
    shared: dict = {}
    for line in open(SHARED_LLAMACPP / "requests.jsonl", encoding="utf-8"):
        rec = json.loads(line)
        shared.setdefault(_kind(rec), set()).update(k for k in rec if k not in ("ttft_client_s", "cache_prompt"))
    ours: dict = {}
    for folder in FOLDERS.values():
        for rec in _records(folder):
            ours.setdefault(_kind(rec), []).append(rec)
    for kind, keys in shared.items():
        assert ours.get(kind), f"no {kind} request in sample_logs"
        for rec in ours[kind]:
            assert keys <= set(rec), f"{kind}: missing {sorted(keys - set(rec))}"
    for rec in ours["stream"] + ours["plain"]:
        assert rec["send_ts"] <= rec["headers_ts"] <= rec["first_byte_ts"] <= rec["end_ts"]
        assert rec["e2e_s"] == pytest.approx(rec["end_ts"] - rec["send_ts"], abs=1e-5)
        if rec.get("first_token_ts") is not None:
            assert rec["first_byte_ts"] <= rec["first_token_ts"] <= rec["end_ts"]
    # queued_at_client_s is when the client sent the request, from the start of the run (as in the shared file)
    for folder in FOLDERS.values():
        recs = sorted(_records(folder), key=lambda r: r["send_ts"])
        first = recs[0]["send_ts"] - recs[0]["queued_at_client_s"]
        assert all(abs(r["send_ts"] - r["queued_at_client_s"] - first) < 1e-3 for r in recs)
    index_keys = set(json.loads(open(SHARED_LLAMACPP / "metrics_index.jsonl").readline()))
    for folder in FOLDERS.values():
        assert set(json.loads(open(SAMPLE_LOGS / folder / "metrics_index.jsonl").readline())) == index_keys


def test_streams_and_full_responses_split_reasoning_the_same_way():
    """The harness reassembles streamed deltas: with --reasoning-format none the markers arrive in content deltas,
    with deepseek (thinking template) the thought arrives as reasoning_content deltas — as in the full responses."""
    for folder, in_content, in_reasoning in (("reasoning-none", True, False), ("reasoning-deepseek", False, True)):
        recs = _records(folder)
        streams = [r for r in recs if r["body"]["stream"] and r["http_status"] == 200]
        plain = [r["response"]["choices"][0]["message"] for r in recs if not r["body"]["stream"]]
        assert len(streams) >= 5 and len(plain) >= 20
        assert all(("<think>" in r["stream_content"]) is in_content for r in streams)
        assert all(bool(r["stream_reasoning_content"]) is in_reasoning for r in streams)
        assert all(("<think>" in m["content"]) is in_content for m in plain)
        assert all(bool(m.get("reasoning_content")) is in_reasoning for m in plain)
        # a stream's reassembled content has exactly the characters of its content chunks
        assert all(len(r["stream_content"]) == r["output_chars"] for r in streams)
