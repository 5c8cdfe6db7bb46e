"""SL003 on real llama.cpp answers in every shape a real engine or logger gives reasoning (issue 12, class 5).

The answers are real llama.cpp output (sample_logs/reasoning-*, tests/data/recorded/llamacpp-reasoning-*). Where a
test needs a parser failure llama.cpp did not make, it moves the real text between the fields exactly as that failure
does, and says so; the counts it expects are read from the raw records, not from servlens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"
RECORDED = REPO / "tests" / "data" / "recorded"


def _sl003(path: Path) -> dict:
    con = open_store(None)
    try:
        ingest_paths(con, [str(path)])
        doc = analyze(con, [r for r in load_rules() if r.id == "SL003"])
    finally:
        con.close()
    assert len(doc["findings"]) == 1
    return doc["findings"][0]


def _records(path: Path) -> list[dict]:
    with path.open() as fh:
        return [json.loads(line) for line in fh]


def _write(tmp_path: Path, records: list[dict]) -> Path:
    out = tmp_path / "requests.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


def _text(record: dict) -> str:
    """The whole answer llama.cpp returned with --reasoning-format none: '<think> thought </think> answer'."""
    if record["body"].get("stream"):
        return record["stream_content"]
    return record["response"]["choices"][0]["message"]["content"]


def test_answer_inside_reasoning_with_its_markers_is_a_leak(tmp_path):
    # A streaming parser that decides by token ids and misses the end tag sends thought, </think> and answer to
    # reasoning (vLLM's `reasoning`, kept by the logger as `stream_reasoning`), content gets no delta; the
    # non-streaming path splits at the `</think>` string correctly. Built from the real --reasoning-format none run.
    records = _records(SAMPLES / "reasoning-none" / "requests.jsonl")
    for r in records:
        text = _text(r)
        if r["body"].get("stream"):
            r["stream_reasoning"] = text
            del r["stream_content"], r["stream_reasoning_content"]
        else:
            thought, answer = text.split("</think>", 1)
            r["response"]["choices"][0]["message"].update(content=answer, reasoning=thought.replace("<think>", ""))
    streamed_stop = sum(1 for r in records if r["body"].get("stream") and r["finish_reason"] == "stop")
    assert (len(records), streamed_stop) == (40, 10)
    f = _sl003(_write(tmp_path, records))
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired"
    assert (m["requests"], m["leaking"], m["answer_inside_reasoning"], m["answer_swallowed_into_reasoning"],
            m["markers_in_content"], m["main_pattern"]) == (40, 10, 10, 0, 0, "answer_inside_reasoning")
    assert "the answer inside the reasoning field with its markers (content empty, finish stop): 10 (25.0%)" in f["summary"]
    assert "likely cause: the streaming reasoning parser missed the end tag" in f["summary"]


def test_answers_swallowed_into_reasoning_are_counted_under_every_name(tmp_path):
    # deepseek_r1-style parser with thinking disabled: the answer lands in reasoning, content null, finish stop. Half
    # the answers are rewritten that way, the non-streamed ones with vLLM's `reasoning`, the streamed ones kept as
    # `stream_reasoning` with no content: every one of them counts, not only those under one name.
    records = _records(SAMPLES / "reasoning-deepseek" / "requests.jsonl")
    swallowed = 0
    for r in records:
        if r["req_idx"] % 2:
            continue
        if r["body"].get("stream"):
            r["stream_reasoning"] = r.pop("stream_content")
            del r["stream_reasoning_content"]
        else:
            message = r["response"]["choices"][0]["message"]
            message["reasoning"], message["content"] = message.pop("content"), None
            del message["reasoning_content"]
        swallowed += r["finish_reason"] == "stop"
    assert swallowed == 19
    f = _sl003(_write(tmp_path, records))
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired"
    assert (m["requests"], m["answer_swallowed_into_reasoning"], m["answer_inside_reasoning"], m["leaking"],
            m["main_pattern"]) == (40, 19, 0, 19, "answer_swallowed_into_reasoning")
    assert "the answer swallowed into reasoning (content empty, finish stop): 19 (47.5%)" in f["summary"]


@pytest.mark.parametrize("variant, state, leaking", [
    ("none", "fired", 40), ("deepseek", "clear", 0), ("deepseek-legacy", "clear", 0), ("auto", "clear", 0)])
def test_recorded_reasoning_format_runs(variant, state, leaking):
    # Real llama.cpp runs with each --reasoning-format; 40% of the requests have max_tokens 12, so many end by length
    # with the thought only (content empty): the budget, not a leak.
    path = RECORDED / f"llamacpp-reasoning-{variant}"
    if not path.exists():
        pytest.skip(f"{path} is not recorded yet")
    f = _sl003(path / "requests.jsonl")
    m = f["evidence"]["metrics"]
    assert (f["state"], m["requests"], m["leaking"]) == (state, 40, leaking)
    if state == "fired":
        assert (m["markers_in_content"], m["main_pattern"]) == (40, "markers_in_content")
