"""vLLM --enable-log-requests / --enable-log-outputs console log, recorded from vLLM 0.32.0 (ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "vllm-log" / "vllm-server.log"


def test_received_and_generated_lines_become_one_row_per_request():
    assert sniffed_name(SAMPLE) == "vllm-request-log"
    source, rows, _ = ingest_rows(SAMPLE, order="t_arrival, request_id")
    # 10 "Received request" ids (the 400 request never got one); no line is a bad line
    assert (source["rows"], source["bad_lines"]) == (10, 0)
    by_id = {r["request_id"]: r for r in rows}
    first = by_id["chatcmpl-9ec1a86974c7dcd1"]
    # no year in the clock: month, day and time kept, in 1970; max_tokens from the SamplingParams text
    assert first["t_arrival"] == datetime(1970, 12, 2, 1, 44, 43) and first["t_end"] == datetime(1970, 12, 2, 1, 44, 43)
    assert (first["max_tokens"], first["finish_reason"], first["endpoint"]) == (16, "length", "/v1/chat/completions")
    assert first["e2e_s"] is None  # answered within its second: unknown, not 0
    streamed = by_id["chatcmpl-8739a15f97d7f848"]
    # the complete line says "streaming_complete"; the reason is on the last delta
    assert (streamed["stream"], streamed["finish_reason_raw"], streamed["e2e_s"]) == (True, "length", 2.0)
    completion = by_id["cmpl-bfcbb41a8316a87f-0"]
    assert completion["t_end"] is None and completion["finish_reason"] is None  # 0.32 logs no output for /v1/completions
    burst = [r for r in rows if r["t_arrival"] == datetime(1970, 12, 2, 1, 44, 46)]
    assert sorted(r["e2e_s"] for r in burst) == [3.0, 3.0, 6.0, 6.0, 6.0, 7.0]  # --max-num-seqs 2: three waves
    assert [r["finish_reason"] for r in burst].count("stop") == 1
    assert all(r["prompt_tokens"] is None and r["completion_tokens"] is None for r in rows)  # not at INFO level
