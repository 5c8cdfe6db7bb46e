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
