"""openai-client-log follow-ups, checked on logs recorded from a real llama.cpp server (sample_logs/, recorded by
tools/engine/) and the real vLLM log in tests/data/shared/real-engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"


@pytest.fixture
def con():
    con = open_store(":memory:")
    yield con
    con.close()


def q(con, sql, params=None):
    return con.execute(sql, params or []).fetchall()


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


# ---------------------------------------------------------------------------------------------------------------
# 1. A stream without stream_options.include_usage: token counts from llama.cpp `timings`


def _lines_without_usage(path: Path) -> list[int]:
    """Line numbers of the streamed requests whose last chunk has no `usage` (read straight from the file)."""
    out = []
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            record = json.loads(line)
            if record["body"].get("stream") and "usage" not in (record.get("stream_final_chunk") or {}):
                out.append(number)
    return out


def test_steady_stream_without_usage_gets_tokens_from_timings(con):
    path = SAMPLES / "steady-a" / "requests.jsonl"
    no_usage = _lines_without_usage(path)
    assert no_usage == [5, 6, 8, 11, 12, 13, 18, 21, 22, 25, 28, 34, 35, 38, 39, 43, 50]
    ingest_inputs(con, [str(path)])
    # every one of the 50 requests now has its token counts; TPOT is missing only where one token was generated
    assert one(con, """SELECT count(*), count(completion_tokens), count(prompt_tokens), count(cached_tokens),
        count(tpot_s) FROM requests""") == (50, 50, 50, 50, 49)
    assert one(con, "SELECT source_line, completion_tokens, tpot_s FROM requests WHERE tpot_s IS NULL") == (28, 1, None)
    lines = ", ".join(map(str, no_usage))
    # the 17 usage-less streams: completion = predicted_n, prompt = prompt_n + cache_n, cached = cache_n
    assert one(con, f"""SELECT count(*), sum(completion_tokens), sum(prompt_tokens), sum(cached_tokens) FROM requests
        WHERE source_line IN ({lines})""") == (17, 548, 1487, 53)
    assert one(con, f"""SELECT count(*) FROM requests WHERE source_line IN ({lines})
        AND completion_tokens = (attrs->>'$.llamacpp_predicted_n')::BIGINT
        AND prompt_tokens = (attrs->>'$.llamacpp_prompt_n')::BIGINT + (attrs->>'$.llamacpp_cache_n')::BIGINT
        AND cached_tokens = (attrs->>'$.llamacpp_cache_n')::BIGINT""") == (17,)
    # line 5: timings {cache_n 3, prompt_n 78, predicted_n 64, predicted_ms 210.729}, capped at max_tokens 64
    row = one(con, """SELECT completion_tokens, prompt_tokens, cached_tokens, decode_s, tpot_s, finish_reason
        FROM requests WHERE source_line = 5""")
    assert row[:3] == (64, 81, 3)
    assert row[3] == pytest.approx(0.210729) and row[4] == pytest.approx(0.210729 / 63)
    assert row[5] == "length"


def test_usage_wins_over_timings_and_they_agree_on_every_real_row(con, shared_data):
    # Where both are present the engine's usage is used; on the real llama.cpp log the two never differ.
    ingest_inputs(con, [str(shared_data / "real-engine" / "llamacpp" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(*) FILTER (WHERE completion_tokens = (attrs->>'$.llamacpp_predicted_n')::BIGINT)
        FROM requests WHERE attrs->>'$.llamacpp_predicted_n' IS NOT NULL""") == (170, 170)


def test_no_usage_and_no_timings_stays_null(con, shared_data):
    # vLLM's per-request `metrics` carry no token count: its requests without usage (two failed streams) keep NULL.
    ingest_inputs(con, [str(shared_data / "real-engine" / "vllm-cpu" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(completion_tokens), count(prompt_tokens) FROM requests
        WHERE attrs->>'$.vllm_ttft_ms' IS NULL""") == (4, 0, 0)
    assert one(con, "SELECT count(*), count(completion_tokens) FROM requests WHERE attrs->>'$.vllm_ttft_ms' IS NOT NULL") == (138, 138)


# ---------------------------------------------------------------------------------------------------------------
# 2. Streamed text reassembled by the logger (stream_content, stream_reasoning_content) sets the leak flags


def _flags(con):
    return q(con, """SELECT stream, count(*), count(content_empty), count(content_has_reasoning_marker),
        count(reasoning_present), count(*) FILTER (WHERE content_empty), count(*) FILTER (WHERE content_has_reasoning_marker),
        count(*) FILTER (WHERE reasoning_present), count(*) FILTER (WHERE reasoning_has_marker)
        FROM requests GROUP BY ALL ORDER BY ALL""")


def test_streamed_rows_get_leak_flags_from_the_reassembled_text(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-none" / "requests.jsonl")])
    # --reasoning-format none: <think> stays in content, streamed or not; no reasoning anywhere
    assert _flags(con) == [(False, 29, 29, 29, 29, 0, 29, 0, 0), (True, 11, 11, 11, 11, 0, 11, 0, 0)]
    # the text itself is not kept without --keep-text
    assert one(con, "SELECT count(content_text), count(reasoning_text) FROM requests") == (0, 0)


def test_streamed_reasoning_deltas_count_as_reasoning(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-deepseek" / "requests.jsonl")])
    # --reasoning-format deepseek: the thought arrives as reasoning_content (deltas for streams), content clean.
    # One non-streamed answer is all thought (empty content, finish length).
    assert _flags(con) == [(False, 29, 29, 29, 29, 1, 0, 29, 0), (True, 11, 11, 11, 11, 0, 0, 11, 0)]
    assert one(con, "SELECT stream, finish_reason FROM requests WHERE content_empty") == (False, "length")


def test_streamed_text_is_kept_with_keep_text(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-deepseek" / "requests.jsonl")], keep_text=True)
    path = SAMPLES / "reasoning-deepseek" / "requests.jsonl"
    records = {n: json.loads(line) for n, line in enumerate(path.open(), start=1)}
    streamed = {n: r for n, r in records.items() if r["body"].get("stream")}
    rows = {line: (content, reasoning) for line, content, reasoning in q(
        con, "SELECT source_line, content_text, reasoning_text FROM requests WHERE stream")}
    assert rows == {n: (r["stream_content"], r["stream_reasoning_content"]) for n, r in streamed.items()}


def test_a_log_without_streamed_text_keeps_stream_flags_unknown(con, shared_data):
    # The older real recording has no stream_content: a streamed answer's flags stay NULL unless it had no characters.
    ingest_inputs(con, [str(shared_data / "real-engine" / "llamacpp" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(content_has_reasoning_marker), count(reasoning_present),
        count(*) FILTER (WHERE content_empty) FROM requests WHERE stream""") == (122, 10, 0, 10)


def _sl003(folder: str) -> dict:
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules
    from servlens.analysis.runner import analyze

    con = open_store(None)
    try:
        ingest_paths(con, [str(SAMPLES / folder)])
        doc = analyze(con, [r for r in load_rules() if r.id == "SL003"])
    finally:
        con.close()
    (finding,) = [f for f in doc["findings"] if f["rule"] == "SL003"]
    return finding


def test_sl003_judges_streamed_rows_too():
    fired = _sl003("reasoning-none")
    assert fired["state"] == "fired"
    m = fired["evidence"]["metrics"]
    # all 40 responses, the 11 streamed ones included (29 before streamed text was read)
    assert (m["requests"], m["leaking"], m["markers_in_content"], m["main_pattern"]) == (40, 40, 40, "markers_in_content")
    clear = _sl003("reasoning-deepseek")
    assert clear["state"] == "clear"
    m = clear["evidence"]["metrics"]
    assert (m["requests"], m["leaking"], m["responses_with_reasoning"]) == (40, 0, 40)
    # streamed and non-streamed answers split reasoning the same way: the disagreement pattern is not even armed
    assert "stream_mode_disagreement" not in m


# ---------------------------------------------------------------------------------------------------------------
# 3. queued_at_client_s is a send time from the start of the run, not a wait


def test_send_offset_is_stored_as_an_offset_not_a_wait(con):
    ingest_inputs(con, [str(SAMPLES / "steady-a" / "requests.jsonl")])
    assert one(con, """SELECT count(*) FROM requests WHERE attrs->>'$.client_wait_before_send_s' IS NOT NULL
        OR attrs->>'$.queued_at_client_s' IS NOT NULL""") == (0,)
    # offset = send time minus the run's start: t_arrival - offset is the same instant on every row (to 1 ms)
    start_spread, n, late_max = one(con, """SELECT max(epoch(t_arrival) - (attrs->>'$.client_send_offset_s')::DOUBLE)
          - min(epoch(t_arrival) - (attrs->>'$.client_send_offset_s')::DOUBLE),
        count(attrs->>'$.client_send_offset_s'), max((attrs->>'$.client_send_late_s')::DOUBLE) FROM requests""")
    assert n == 50 and start_spread < 1e-3
    row = one(con, """SELECT (attrs->>'$.client_send_offset_s')::DOUBLE, (attrs->>'$.client_send_late_s')::DOUBLE
        FROM requests WHERE source_line = 1""")
    assert row == (0.072446, 0.000346)
    assert late_max == max(json.loads(line)["send_late_s"] for line in (SAMPLES / "steady-a" / "requests.jsonl").open())
