"""OpenAI-compatible response bodies recorded from vLLM and llama.cpp (tests/data/formats/openai-bodies)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "openai-bodies" / "response-bodies.jsonl"


def test_bodies_with_engine_timings():
    assert sniffed_name(SAMPLE) == "openai-response-body"
    source, rows, con = ingest_rows(SAMPLE)
    # 9 lines: the two error bodies have no time, id or model: kept as bad lines, not dropped
    assert (source["rows"], source["bad_lines"]) == (7, 2)
    assert [r[0] for r in con.execute("SELECT line FROM ingest_errors ORDER BY line").fetchall()] == [5, 9]
    by_id = {r["request_id"]: r for r in rows}
    queued = by_id["chatcmpl-94034a7e1bb6c89c"]  # vLLM, waited 3.18 s for a slot in burst50
    assert (queued["provider"], queued["endpoint"], queued["stream"]) == ("vllm", "/v1/chat/completions", False)
    assert queued["t_arrival"] == datetime(2026, 11, 29, 7, 29, 43)  # `created` 1795937383, whole seconds
    assert queued["queue_s"] == pytest.approx(3.18228767100004)
    assert queued["prefill_s"] == pytest.approx(0.25708412800008773)
    # TTFT from arrival = queue + vLLM's time_to_first_token_ms (which is measured from scheduling)
    assert queued["ttft_s"] == pytest.approx(3.18228767100004 + 0.25708412800008773)
    assert queued["decode_s"] == pytest.approx(0.1144057060000705)
    assert queued["tpot_s"] == pytest.approx(0.010400518727279135)
    assert (queued["prompt_tokens"], queued["cached_tokens"], queued["completion_tokens"]) == (753, 0, 12)
    assert queued["finish_reason"] == "stop"
    llama = [r for r in rows if r["provider"] == "llama.cpp"]
    assert len(llama) == 3
    cached = next(r for r in llama if r["cached_tokens"])
    # llama.cpp: `created` is the end; cached tokens = timings.cache_n; no TTFT without the slot wait
    assert cached["t_end"] == datetime(2026, 11, 29, 7, 22, 59)  # created 1795936979
    assert cached["cached_tokens"] == cached["attrs"]["llamacpp_cache_n"] > 0
    assert cached["ttft_s"] is None and cached["queue_s"] is None
    assert {r["finish_reason"] for r in rows} == {"stop", "length"}


COMPLETION = FORMATS / "llamacpp-completion" / "completion-bodies.jsonl"


def test_llamacpp_completion_bodies_recorded_from_llama_server():
    assert sniffed_name(COMPLETION) == "llamacpp-completion-body"
    source, rows, con = ingest_rows(COMPLETION)
    # the 400 answer (exceed_context_size_error) has none of the body's fields: a counted bad line
    assert (source["rows"], source["bad_lines"]) == (5, 1)
    (line, reason), = con.execute("SELECT line, reason FROM ingest_errors").fetchall()
    assert line == 6 and "missing" in reason
    first, limit, word, eos1, uncached = rows
    assert (first["provider"], first["endpoint"], first["model"], first["stream"]) == ("llama.cpp", "/completion", "tiny", False)
    # tokens_cached (168) is n_past, not the cache hit: the hit is timings.cache_n
    assert (first["prompt_tokens"], first["cached_tokens"], first["attrs"]["n_past"]) == (161, 0, 168)
    assert (limit["prompt_tokens"], limit["cached_tokens"], limit["attrs"]["prompt_uncached"]) == (160, 156, 4)
    assert (limit["finish_reason"], limit["finish_reason_raw"], limit["max_tokens"]) == ("length", "limit", 16)
    assert (word["finish_reason"], word["finish_reason_raw"], word["attrs"]["stopping_word"]) == ("stop", "word", "e")
    assert (eos1["finish_reason"], eos1["completion_tokens"]) == ("stop", 1)
    assert (uncached["cached_tokens"], uncached["prompt_tokens"]) == (0, 161)  # cache_prompt false
    # engine timings (ms -> s); no clock and no TTFT in the body
    assert first["prefill_s"] == pytest.approx(0.119419) and first["decode_s"] == pytest.approx(0.00429)
    assert first["e2e_s"] == pytest.approx(0.123709)
    assert all(r["t_arrival"] is None and r["ttft_s"] is None and r["request_id"] is None for r in rows)
