"""Langfuse observations: real observations downloaded from Langfuse Cloud (trace download JSON, API page) and the
batch export JSONL / CSV (built from the source): tests/data/formats/langfuse/ATTRIBUTION.md."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

EXPORT = FORMATS / "langfuse" / "observations-export.jsonl"
API = FORMATS / "langfuse" / "observations-api-page.json"
AGENTS_TRACE = FORMATS / "langfuse" / "trace-openai-agents-2025-09-30.json"
VERCEL_TRACE = FORMATS / "langfuse" / "trace-vercel-aisdk-2025-11-17.json"


def test_export_generations_become_rows_with_units():
    path, fmt = EXPORT, "langfuse-observations"
    assert sniffed_name(path) == fmt
    source, rows, _ = ingest_rows(path, order="t_arrival")
    # the SPAN observation is not a model call (where); nothing is a bad line
    assert (source["format"], source["rows"], source["bad_lines"]) == (fmt, 2, 0)
    gen, failed = rows
    assert gen["t_arrival"] == datetime(2026, 4, 4, 6, 21, 9, 835000)
    # e2e from the timestamps (export `latency` is ms, the API's is s: both kept raw only)
    assert gen["e2e_s"] == pytest.approx(7.878) and gen["ttft_s"] == pytest.approx(6.322)
    assert gen["attrs"]["latency_raw"] == 7878
    # usageDetails.input (24) excludes the cached 1000: prompt = the input* sum
    assert (gen["prompt_tokens"], gen["cached_tokens"], gen["attrs"]["usage_input_uncached"]) == (1024, 1000, 24)
    assert (gen["completion_tokens"], gen["reasoning_tokens"]) == (1407, 1029)
    assert (gen["finish_reason"], gen["stream"], gen["status"]) == ("stop", True, "ok")
    # 0 tokens on a failed generation mean "not reported"
    assert (failed["status"], failed["prompt_tokens"], failed["completion_tokens"]) == ("error", None, None)
    assert failed["error_message"].startswith("429 Resource has been exhausted")
    assert failed["ttft_s"] is None and failed["max_tokens"] == 512 and failed["finish_reason"] == "error"


def test_csv_export_reads_the_same_generations():
    path = FORMATS / "langfuse" / "observations-export.csv"
    assert sniffed_name(path) == "langfuse-observations-csv"
    source, rows, _ = ingest_rows(path, order="t_arrival")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    gen, failed = rows
    assert (gen["prompt_tokens"], gen["cached_tokens"], gen["completion_tokens"]) == (1024, 1000, 1407)
    assert gen["ttft_s"] == pytest.approx(6.322) and gen["e2e_s"] == pytest.approx(7.878)
    assert (failed["status"], failed["prompt_tokens"]) == ("error", None)


def test_real_api_page_reads_otel_usage_keys_and_unreported_counts():
    assert sniffed_name(API) == "langfuse-observations-api"
    source, rows, _ = ingest_rows(API, order="t_arrival")
    # 7 GENERATION observations; BeeAI's two `.finish-16` / `.success-16` echoes of its start-16 call give no row
    assert (source["rows"], source["bad_lines"]) == (5, 0)
    crewai, gemini, bee14, bee15, bee16 = rows
    assert [r["attrs"]["observation_name"] for r in (bee14, bee15, bee16)] == [
        "backend.openai.chat.start-14", "backend.openai.chat.start-15", "backend.openai.chat.start-16"]
    # CrewAI over OTel: prompt_details.cache_read is the cached part (0 here, known); modelParameters.stream "false"
    assert (crewai["prompt_tokens"], crewai["cached_tokens"], crewai["completion_tokens"]) == (190, 0, 164)
    assert crewai["stream"] is False and crewai["model"] == "gpt-4o-mini"
    assert crewai["e2e_s"] == pytest.approx(3.694) and crewai["attrs"]["latency_raw"] == pytest.approx(3.694)
    # Gemini: completion_details.reasoning (1104) is inside output (input 6 + output 2055 = total 2061)
    assert (gemini["prompt_tokens"], gemini["completion_tokens"], gemini["reasoning_tokens"]) == (6, 2055, 1104)
    assert gemini["cached_tokens"] is None and gemini["t_arrival"] == datetime(2025, 8, 1, 13, 22, 0, 147000)
    # BeeAI reported input only: outputUsage 0 is "not reported", not 0 tokens
    assert (bee15["prompt_tokens"], bee15["completion_tokens"]) == (1988, None)
    assert bee15["e2e_s"] == pytest.approx(13.859) and bee15["status"] == "ok"
    assert all(r["ttft_s"] is None and r["finish_reason"] is None for r in rows)


def test_real_trace_download_is_sniffed_and_keeps_model_calls_only():
    assert sniffed_name(AGENTS_TRACE) == "langfuse-trace-download"
    source, rows, _ = ingest_rows(AGENTS_TRACE, order="t_arrival")
    # 2 AGENT and 1 TOOL observation are not model calls
    assert (source["format"], source["rows"], source["bad_lines"]) == ("langfuse-trace-download", 2, 0)
    first, second = rows
    assert first["trace_id"] == second["trace_id"] == "fee618f96dc31e0ca38b2f7b26eb8b29"
    assert (first["request_id"], first["model"]) == ("98870087af69bf06", "gpt-4.1-2025-04-14")
    assert (first["prompt_tokens"], first["cached_tokens"], first["completion_tokens"]) == (55, 0, 15)
    assert first["e2e_s"] == pytest.approx(1.036) and second["e2e_s"] == pytest.approx(1.15)


def test_vercel_wrapper_generation_is_not_a_second_call():
    source, rows, _ = ingest_rows(VERCEL_TRACE, order="t_arrival")
    # ai.generateText wraps ai.generateText.doGenerate (the provider call): one row, not two
    assert (source["rows"], source["bad_lines"]) == (1, 0)
    (call,) = rows
    assert call["attrs"]["observation_name"] == "ai.generateText.doGenerate"
    assert (call["prompt_tokens"], call["completion_tokens"], call["model"]) == (62, 85, "gpt-5")
    # the Vercel AI SDK's hyphenated finish reason
    assert (call["finish_reason_raw"], call["finish_reason"]) == ("tool-calls", "tool_calls")
