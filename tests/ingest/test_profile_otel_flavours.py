"""OpenInference (Phoenix), OpenLLMetry and OpenLIT spans in OTLP/JSON (tests/data/formats/otel, ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "otel" / "otel-flavours.jsonl"


@pytest.fixture(scope="module")
def rows():
    source, rows, _ = ingest_rows(SAMPLE, order="t_arrival")
    assert (source["rows"], source["bad_lines"]) == (3, 0)
    return rows


def test_sniffed():
    assert sniffed_name(SAMPLE) == "otel-genai-spans"


def test_openinference_llm_span_is_a_row_and_the_chain_span_is_not(rows):
    llm = rows[0]
    assert llm["attrs"]["span_name"] == "ChatCompletion"  # the CHAIN parent gave no row
    assert (llm["model"], llm["served_model"], llm["provider"]) == ("gpt-4", "gpt-4-0613", "openai")
    assert (llm["prompt_tokens"], llm["completion_tokens"], llm["max_tokens"]) == (97, 52, 200)
    assert llm["finish_reason"] == "stop"  # only inside output.value
    assert llm["t_arrival"] == datetime(2025, 12, 1, 8, 20, 0, 100000) and llm["e2e_s"] == pytest.approx(2.25)


def test_openllmetry_cached_tokens_and_indexed_finish_reason(rows):
    span = rows[1]
    assert (span["prompt_tokens"], span["cached_tokens"], span["completion_tokens"]) == (1200, 1024, 40)
    assert span["finish_reason"] == "stop" and span["stream"] is False and span["status"] == "ok"


def test_openlit_server_ttft_tpot_and_stream_flag(rows):
    span = rows[2]
    assert span["ttft_s"] == pytest.approx(0.412) and span["tpot_s"] == pytest.approx(0.0155)
    assert span["stream"] is True and span["e2e_s"] == pytest.approx(2.0)
    assert span["decode_s"] == pytest.approx(2.0 - 0.412)


OPENLLMETRY = FORMATS / "otel" / "otel-openllmetry-recorded.jsonl"


def test_recorded_openllmetry_spans_from_a_real_engine():
    """opentelemetry-instrumentation-openai 0.62.4 around the openai client calling llama-server (recorded here)."""
    assert sniffed_name(OPENLLMETRY) == "otel-genai-spans"
    source, rows, _ = ingest_rows(OPENLLMETRY, order="t_arrival")
    assert (source["rows"], source["bad_lines"]) == (4, 0)
    plain, streamed, cut, failed = rows
    assert (plain["model"], plain["provider"], plain["deployment"]) == ("tiny", "openai", "http://127.0.0.1:18431/v1")
    # the semconv cached count; the first call filled the slot, the next two reuse 244 of 245 prompt tokens
    assert [(r["prompt_tokens"], r["cached_tokens"]) for r in (plain, streamed, cut)] == [(245, 0), (245, 244), (245, 244)]
    assert (plain["stream"], plain["finish_reason"], plain["completion_tokens"]) == (False, "stop", 6)
    assert plain["ttft_s"] is None  # not streamed: no chunk events, and no TTFT attribute
    # gen_ai.is_streaming, and TTFT from the first gen_ai.content.completion.chunk event
    assert (streamed["stream"], streamed["finish_reason"], streamed["completion_tokens"]) == (True, "length", 24)
    assert streamed["ttft_s"] == pytest.approx(0.068334178) and streamed["e2e_s"] == pytest.approx(0.110024931)
    assert (cut["finish_reason"], cut["max_tokens"]) == ("length", 4)
    # the engine's 400 (prompt larger than the slot's context) as the client raised it
    assert (failed["status"], failed["http_status"], failed["error_type"]) == ("error", 400, "BadRequestError")
    assert "exceeds the available context size" in failed["error_message"]
    assert (failed["prompt_tokens"], failed["finish_reason"]) == (None, "error")


OPENLIT = FORMATS / "otel" / "otel-openlit-recorded.jsonl"


def test_recorded_openlit_spans_keep_server_times_for_streams_only():
    """openlit 1.45.0 around the openai client calling llama-server (recorded here), with its httpx spans beside."""
    assert sniffed_name(OPENLIT) == "otel-genai-spans"
    source, rows, _ = ingest_rows(OPENLIT, order="t_arrival")
    # 8 export lines: each chat span with the httpx POST span under it, which is no row
    assert (source["rows"], source["bad_lines"]) == (4, 0)
    plain, streamed, cut, failed = rows
    assert (plain["deployment"], plain["provider"], plain["stream"]) == ("127.0.0.1:18431", "openai", False)
    # not streamed: OpenLIT's time_to_first_token is the whole call and its TPOT "0": neither is kept
    assert plain["ttft_s"] is None and plain["tpot_s"] is None and plain["e2e_s"] == pytest.approx(0.307324161)
    assert (streamed["stream"], streamed["completion_tokens"], streamed["cached_tokens"]) == (True, 14, 244)
    assert streamed["ttft_s"] == pytest.approx(0.007726907730102539)
    assert streamed["tpot_s"] == pytest.approx(0.0009018103281656901)
    assert (cut["max_tokens"], cut["completion_tokens"], cut["finish_reason"]) == (4, 3, "stop")
    assert (failed["status"], failed["http_status"], failed["error_type"]) == ("error", 400, "BadRequestError")
