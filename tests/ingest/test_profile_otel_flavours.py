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
