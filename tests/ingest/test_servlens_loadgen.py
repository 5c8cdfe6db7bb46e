"""The servlens-loadgen profile (tools/engine/load.py's log): its old name, and how it reads reasoning and first-token
times, on logs recorded from real llama.cpp servers (sample_logs/, tests/data/recorded/) and the real vLLM log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.errors import ConfigError
from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import get_profile

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


# ---------------------------------------------------------------------------------------------------------------
# The name says what it is; the old one still works with --from


def test_the_old_name_still_selects_the_profile(con):
    assert get_profile("openai-client-log").name == "servlens-loadgen"
    report = ingest_inputs(con, [str(SAMPLES / "burst" / "requests.jsonl")], from_format="openai-client-log")
    assert [(s["format"], s["rows"]) for s in report.sources] == [("servlens-loadgen", 58)]


def test_an_unknown_name_is_still_an_error():
    with pytest.raises(ConfigError, match="No format profile named 'openai-client'"):
        get_profile("openai-client")


# ---------------------------------------------------------------------------------------------------------------
# Reasoning under every name a real engine or logger uses (issue 12, class 5)
#
# vLLM names the field `reasoning` (ChatMessage / DeltaMessage; current releases copy it to a deprecated
# `reasoning_content`), older vLLM and llama.cpp `reasoning_content`; a logger may keep the reassembled stream as
# `stream_reasoning_content` (load.py) or `stream_reasoning`. The records below are real llama.cpp answers
# (sample_logs/reasoning-deepseek, --reasoning-format deepseek) with only the field names changed.

DEEPSEEK = SAMPLES / "reasoning-deepseek" / "requests.jsonl"
RECORDED = REPO / "tests" / "data" / "recorded"


def _records(path: Path) -> list[dict]:
    with path.open() as fh:
        return [json.loads(line) for line in fh]


def _write(tmp_path: Path, name: str, records: list[dict]) -> str:
    out = tmp_path / name
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(out)


def _message(record: dict) -> dict:
    return record["response"]["choices"][0]["message"]


def _as_vllm(record: dict, both: bool) -> dict:
    """The same answer as current vLLM writes it: `reasoning` (and, with `both`, the deprecated copy)."""
    record = json.loads(json.dumps(record))
    if record["body"].get("stream"):
        record["stream_reasoning"] = record.pop("stream_reasoning_content")
    elif record.get("response") and "reasoning_content" in _message(record):
        message = _message(record)
        message["reasoning"] = message.pop("reasoning_content")
        if both:
            message["reasoning_content"] = message["reasoning"]
    return record


FLAGS = """SELECT source_line, stream, content_empty, content_has_reasoning_marker, reasoning_present, reasoning_has_marker
           FROM requests ORDER BY source_line"""


def test_every_reasoning_name_gives_the_same_flags(con, tmp_path):
    records = _records(DEEPSEEK)
    ingest_inputs(con, [str(DEEPSEEK)], run="original")
    expected = con.execute(FLAGS).fetchall()
    # 11 streamed and 29 non-streamed answers, every one with its thought in reasoning
    assert sum(1 for r in expected if r[4]) == 40 and sum(1 for r in expected if r[1]) == 11
    for both in (False, True):
        con.execute("DELETE FROM requests")
        ingest_inputs(con, [_write(tmp_path, f"vllm-{both}.jsonl", [_as_vllm(r, both) for r in records])])
        assert con.execute(FLAGS).fetchall() == expected


def test_an_empty_reasoning_name_does_not_hide_the_filled_one(con, tmp_path):
    # A logger that writes both names, one of them empty (load.py writes stream_reasoning_content even when it got none)
    records = _records(DEEPSEEK)
    for r in records:
        if r["body"].get("stream"):
            r["stream_reasoning"], r["stream_reasoning_content"] = r["stream_reasoning_content"], ""
        else:
            _message(r)["reasoning"] = ""
    ingest_inputs(con, [_write(tmp_path, "both.jsonl", records)], keep_text=True)
    assert one(con, "SELECT count(*), count(*) FILTER (WHERE reasoning_present) FROM requests") == (40, 40)
    line4 = records[3]
    assert one(con, "SELECT reasoning_text FROM requests WHERE source_line = 4") == (line4["stream_reasoning"],)


def test_a_stream_that_went_all_into_reasoning_has_an_empty_answer(con, tmp_path):
    # Everything went into reasoning: the logger kept a reasoning text and got no content delta at all (no
    # stream_content, or null). The answer is known to be empty, not unknown.
    records = [r for r in _records(DEEPSEEK) if r["body"].get("stream")]
    for n, r in enumerate(records):
        r["stream_reasoning"] = r.pop("stream_reasoning_content") + r.pop("stream_content")
        if n % 2:
            r["stream_content"] = None
    ingest_inputs(con, [_write(tmp_path, "all-reasoning.jsonl", records)])
    assert one(con, """SELECT count(*), count(*) FILTER (WHERE content_empty), count(*) FILTER (WHERE reasoning_present)
        FROM requests""") == (11, 11, 11)


@pytest.mark.parametrize("variant, streamed, reasoning", [
    ("none", 18, 0), ("deepseek", 18, 40), ("deepseek-legacy", 18, 40), ("auto", 18, 40)])
def test_recorded_reasoning_format_runs(con, variant, streamed, reasoning):
    path = RECORDED / f"llamacpp-reasoning-{variant}" / "requests.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not recorded yet")
    ingest_inputs(con, [str(path)])
    # every answer's flags are known; the thought is in reasoning_content except with --reasoning-format none
    assert one(con, """SELECT count(*), count(content_empty), count(reasoning_present), count(*) FILTER (WHERE stream),
        count(*) FILTER (WHERE reasoning_present) FROM requests""") == (40, 40, 40, streamed, reasoning)


# ---------------------------------------------------------------------------------------------------------------
# TTFT is the first output token of any kind, reasoning included (DESIGN.md; issue 12, class 9)


def _with_first_output_ts(record: dict) -> dict:
    """The same streamed answer as a client that records both times writes it: `first_output_ts` at the first
    generated text of any kind, `first_token_ts` at the first content text (and no load.py offsets)."""
    record = json.loads(json.dumps(record))
    record["first_output_ts"] = record["first_token_ts"]
    record["first_token_ts"] = record["send_ts"] + record["content_chunk_offsets_s"][0]
    del record["ttft_client_s"], record["content_chunk_offsets_s"]
    return record


def test_ttft_counts_reasoning_tokens_and_first_content_is_kept_apart(con, tmp_path):
    # Real llama.cpp streams with --reasoning-format deepseek: the thought streams first as reasoning_content.
    streamed = [r for r in _records(DEEPSEEK) if r["body"].get("stream") and r.get("content_chunk_offsets_s")]
    assert len(streamed) == 11
    ingest_inputs(con, [_write(tmp_path, "both-times.jsonl", [_with_first_output_ts(r) for r in streamed])])
    rows = con.execute("SELECT source_line, ttft_s, first_content_s FROM requests ORDER BY source_line").fetchall()
    for (line, ttft, first_content), record in zip(rows, streamed, strict=True):
        assert ttft == pytest.approx(record["first_token_ts"] - record["send_ts"], abs=1e-6), line
        assert first_content == pytest.approx(record["content_chunk_offsets_s"][0], abs=1e-6), line
    # line 1 (req_idx 3): the first thought token at 0.088 s, the first answer token at 0.601 s
    assert rows[0][1] == pytest.approx(0.087629, abs=1e-6) and rows[0][2] == pytest.approx(0.600523, abs=1e-6)
    # TTFT reads the same with either client: the reasoning parser does not move it
    con.execute("DELETE FROM requests")
    ingest_inputs(con, [_write(tmp_path, "loadgen.jsonl", streamed)])
    again = con.execute("SELECT source_line, ttft_s, first_content_s FROM requests ORDER BY source_line").fetchall()
    assert len(again) == len(rows) and all(a == pytest.approx(b, abs=1e-6) for a, b in zip(again, rows))
