"""OpenTelemetry GenAI spans in OTLP/JSON (collector file exporter lines) -> canonical rows.

The fixture (tests/data/gateways/otel_genai_spans.jsonl) is shaped per reference/gateways.md §2: nanosecond strings,
attribute key/value lists, intValue as string and as number, an arrayValue of finish reasons, deprecated aliases,
status.code 2, non-GenAI spans beside GenAI ones, lines out of time order, and a truncated last line.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import builtin_profiles
from servlens.ingest.sniff import sniff
from servlens.store.schema import open_store

OTLP = Path(__file__).resolve().parents[1] / "data" / "gateways" / "otel_genai_spans.jsonl"


def _ns_to_utc(ns: str) -> datetime:
    """Unix ns (decimal string) -> naive UTC datetime, truncated to the microsecond (exact integer arithmetic)."""
    return datetime(1970, 1, 1) + timedelta(microseconds=int(ns) // 1000)


@pytest.fixture(scope="module")
def otel():
    con = open_store(None)
    report = ingest_inputs(con, [str(OTLP)], run="t")
    cur = con.execute("SELECT * FROM requests ORDER BY t_arrival")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for row in rows:
        row["attrs"] = json.loads(row["attrs"])
    by_span = {row["attrs"]["span_id"]: row for row in rows}
    return con, report, rows, by_span


def _span(line: int, span_id: str) -> dict:
    doc = json.loads(OTLP.read_text().splitlines()[line - 1])
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                if sp["spanId"].lower() == span_id:
                    return sp
    raise KeyError(span_id)


def test_sniffed_one_row_per_inference_span_and_bad_line_kept(otel):
    con, report, rows, by_span = otel
    assert sniff(OTLP, builtin_profiles()).profile.name == "otel-genai-spans"
    source = report.to_dict()["sources"][0]
    assert (source["format"], source["rows"], source["bad_lines"]) == ("otel-genai-spans", 4, 1)
    # The HTTP server span, the agent span and the tool span are not LLM calls.
    assert sorted(by_span) == ["00f067aa0ba902b9", "b7ad6b7169203331", "b7ad6b7169203332", "eee19b7ec3c1b174"]
    assert sorted(r["attrs"]["operation"] for r in rows) == ["chat", "chat", "chat", "embeddings"]
    assert con.execute("SELECT line, reason FROM ingest_errors").fetchall() == [
        (4, "invalid JSON: the line ends before the value does (truncated?)")]
    # Lines are not in time order in the file; each row points back to its line.
    assert [(r["attrs"]["span_id"], r["source_line"]) for r in rows] == [
        ("b7ad6b7169203331", 2), ("b7ad6b7169203332", 2), ("eee19b7ec3c1b174", 1), ("00f067aa0ba902b9", 3)]


def test_nanosecond_times_are_exact_utc(otel):
    _, _, _, by_span = otel
    chat = by_span["eee19b7ec3c1b174"]
    span = _span(1, "eee19b7ec3c1b174")
    assert span["startTimeUnixNano"] == "1795945530505645123"
    assert chat["t_arrival"] == datetime(2026, 11, 29, 9, 45, 30, 505645) == _ns_to_utc(span["startTimeUnixNano"])
    assert chat["t_end"] == datetime(2026, 11, 29, 9, 45, 31, 755645) == _ns_to_utc(span["endTimeUnixNano"])
    # Duration from the integer nanoseconds, not from the microsecond-rounded timestamps.
    assert chat["e2e_s"] == (1795945531755645999 - 1795945530505645123) / 1e9 == 1.250000876
    assert by_span["b7ad6b7169203331"]["e2e_s"] == 0.2500005


def test_streamed_chat_span_current_names(otel):
    _, _, _, by_span = otel
    row = by_span["eee19b7ec3c1b174"]
    assert row["request_id"] == "5b8efff798038103d269b633813fc60c:eee19b7ec3c1b174"  # hex lower-cased
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert (row["model"], row["served_model"], row["provider"]) == ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", "openai")
    assert row["deployment"] == "api.openai.com:443"  # server.port sent as a JSON number
    assert (row["stream"], row["ttft_s"]) == (True, 0.412)
    assert row["t_first_token"] == datetime(2026, 11, 29, 9, 45, 30, 917645)
    assert row["tpot_s"] == pytest.approx((1.250000876 - 0.412) / 86)
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["reasoning_tokens"]) == (1200, 1024, 87, 0)
    assert (row["max_tokens"], row["finish_reason"], row["status"]) == (256, "stop", "ok")
    assert row["attrs"]["finish_reasons"] == ["stop"]
    assert row["attrs"]["response_id"] == "chatcmpl-AbC123"
    assert (row["attrs"]["service_name"], row["attrs"]["scope_name"]) == ("chat-api", "opentelemetry.instrumentation.openai_v2")
    assert row["attrs"]["parent_span_id"] == "eee19b7ec3c1b173"
    # Captured messages give the prefix key and the leak flags, then are dropped.
    assert row["prefix_key"] is not None and row["prompt_text"] is None and row["content_text"] is None
    assert row["content_has_reasoning_marker"] is True and row["reasoning_present"] is False


def test_deprecated_aliases_error_status_and_retry(otel):
    _, _, _, by_span = otel
    failed, retry = by_span["b7ad6b7169203331"], by_span["b7ad6b7169203332"]
    assert failed["trace_id"] == retry["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    # gen_ai.system -> provider; gen_ai.usage.prompt_tokens (a JSON number) / completion_tokens (a string).
    assert (retry["provider"], retry["prompt_tokens"], retry["completion_tokens"]) == ("vertex_ai", 512, 1024)
    assert retry["max_tokens"] == 1024 and retry["served_model"] is None
    # No gen_ai.request.stream and no time_to_first_chunk: unknown, and no TTFT from the duration.
    assert (retry["stream"], retry["ttft_s"], retry["t_first_token"], retry["tpot_s"]) == (None, None, None, None)
    assert retry["e2e_s"] == 2.5
    # finish_reasons has one entry per choice: the first is mapped, the list kept.
    assert (retry["finish_reason"], retry["attrs"]["finish_reasons"]) == ("length", ["length", "stop"])
    assert (retry["status"], retry["attrs"]["status_code"]) == ("ok", 0)  # UNSET is not an error
    # status.code 2 = ERROR, error.type "429" is an HTTP status; the key in status.message is redacted.
    assert (failed["status"], failed["http_status"], failed["error_type"], failed["finish_reason"]) == (
        "error", 429, "429", "error")
    assert failed["error_message"] == "429 Quota exceeded for aiplatform.googleapis.com; request used key=[REDACTED]"
    assert (failed["prompt_tokens"], failed["completion_tokens"]) == (None, None)
    # Two inference spans in one trace: attempts in start order.
    assert (failed["attempt"], retry["attempt"]) == (1, 2)
    assert by_span["eee19b7ec3c1b174"]["attempt"] == 1


def test_embeddings_span_and_empty_status(otel):
    con, _, _, by_span = otel
    row = by_span["00f067aa0ba902b9"]
    assert (row["model"], row["prompt_tokens"], row["completion_tokens"], row["finish_reason"]) == (
        "text-embedding-3-small", 9, None, None)
    assert (row["status"], row["attrs"]["status_code"], row["stream"]) == ("ok", None, None)
    assert row["e2e_s"] == 0.045
    stored = json.dumps(con.execute("SELECT * FROM requests").fetchall(), default=str)
    assert "AIza" not in stored and "KV cache" not in stored  # no key, no prompt text


# --- spans recorded from LiteLLM's own OpenTelemetry integration (tests/data/gateways/README.md) ---------------------

LITELLM_OTLP = OTLP.parent / "otel_litellm_recorded.jsonl"


@pytest.fixture(scope="module")
def litellm_otel():
    con = open_store(None)
    report = ingest_inputs(con, [str(LITELLM_OTLP)], run="t")
    cur = con.execute("SELECT * FROM requests ORDER BY t_arrival")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for row in rows:
        row["attrs"] = json.loads(row["attrs"])
    spans = []
    for line in LITELLM_OTLP.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans.extend(ss["spans"])
    return report, rows, spans


def test_litellm_spans_one_row_per_call_not_per_raw_request(litellm_otel):
    report, rows, spans = litellm_otel
    assert sniff(LITELLM_OTLP, builtin_profiles()).profile.name == "otel-genai-spans"
    source = report.to_dict()["sources"][0]
    assert (source["rows"], source["bad_lines"]) == (7, 0)
    assert [s["name"] for s in spans].count("litellm_request") == 7
    assert [s["name"] for s in spans].count("raw_gen_ai_request") == 5  # llm.openai.* only: not a second row
    assert {r["attrs"]["span_name"] for r in rows} == {"litellm_request"}
    # LiteLLM names the operation by its call type, not a semconv operation.
    assert {r["attrs"]["operation"] for r in rows} == {"acompletion"}
    by_start = sorted((s for s in spans if s["name"] == "litellm_request"), key=lambda s: int(s["startTimeUnixNano"]))
    for row, span in zip(rows, by_start):
        assert row["t_arrival"] == _ns_to_utc(span["startTimeUnixNano"])
        assert row["request_id"] == f"{span['traceId']}:{span['spanId']}"


def test_litellm_spans_values(litellm_otel):
    _, rows, _ = litellm_otel
    assert [r["model"] for r in rows] == ["chat-backup", "chat-backup", "chat-primary", "chat-backup", "chat-keyed",
                                          "chat-backup", "chat-backup"]
    # llm.is_streaming is the string "True"/"False"; no time_to_first_chunk: TTFT unknown, never the span duration.
    assert [r["stream"] for r in rows] == [False, True, True, True, False, False, False]
    assert all(r["ttft_s"] is None and r["t_first_token"] is None for r in rows)
    # finish_reasons arrives as a JSON-array string.
    assert [r["finish_reason"] for r in rows] == ["length", "length", "error", "length", "error", "length", "length"]
    assert rows[0]["attrs"]["finish_reasons"] == ["length"]
    assert [(r["status"], r["http_status"], r["error_type"]) for r in rows if r["status"] == "error"] == [
        ("error", 500, "InternalServerError"), ("error", 401, "AuthenticationError")]
    assert rows[4]["error_message"] == "litellm.AuthenticationError: AuthenticationError: OpenAIException - Invalid API Key"
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["served_model"] == "tiny-a" and r["deployment"] == "http://127.0.0.1:18931/v1" for r in ok)
    assert [(r["prompt_tokens"], r["completion_tokens"], r["max_tokens"]) for r in ok] == [
        (124, 12, 12), (124, 16, 16), (124, 10, 10), (73, 8, 8), (73, 8, None)]
    # Each attempt is its own trace in LiteLLM's OTel output: the fallback chain cannot be rebuilt from trace ids.
    assert len({r["trace_id"] for r in rows}) == 7
    assert {r["attempt"] for r in rows} == {1}


def test_litellm_span_cache_hit(litellm_otel):
    _, rows, spans = litellm_otel
    hit, miss = rows[6], rows[5]
    assert (hit["cache_hit"], miss["cache_hit"]) == (True, False)
    assert (hit["e2e_s"], hit["t_end"]) == (None, None)
    span = next(s for s in spans if s["spanId"] == hit["attrs"]["span_id"])
    assert hit["attrs"]["cache_hit_response_s"] == (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
    assert hit["attrs"]["response_id"] == miss["attrs"]["response_id"]  # the cached answer's id
    assert miss["e2e_s"] > hit["attrs"]["cache_hit_response_s"]


def test_repeated_attribute_key_keeps_the_first_value_and_the_file(tmp_path):
    """OTLP requires unique keys, but a malformed exporter must not fail the whole file."""
    def kv(k, v):
        return {"key": k, "value": {"stringValue": v} if isinstance(v, str) else {"intValue": str(v)}}
    span = {"traceId": "AA" * 16, "spanId": "BB" * 8, "name": "chat m", "kind": 3,
            "startTimeUnixNano": "1795945500000000000", "endTimeUnixNano": "1795945501000000000",
            "attributes": [kv("gen_ai.operation.name", "chat"), kv("gen_ai.provider.name", "openai"),
                           kv("gen_ai.request.model", "m"), kv("gen_ai.usage.input_tokens", 10),
                           kv("gen_ai.usage.input_tokens", 99)], "status": {}}
    good = dict(span, spanId="CC" * 8, attributes=span["attributes"][:4])
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [span, good]}]}]}) + "\n")
    con = open_store(None)
    ingest_inputs(con, [str(path)], run="t", from_format="otel-genai-spans")
    assert con.execute("SELECT request_id, prompt_tokens, e2e_s FROM requests ORDER BY request_id").fetchall() == [
        ("aa" * 16 + ":" + "bb" * 8, 10, 1.0), ("aa" * 16 + ":" + "cc" * 8, 10, 1.0)]


def test_vllm_llm_request_spans_give_the_latency_split():
    """vLLM's own tracing (--otlp-traces-endpoint): one SERVER span `llm_request` per request with gen_ai.latency.*
    in seconds and no model, provider or operation (fixture shaped from vllm/v1/engine/output_processor.py)."""
    path = OTLP.parent / "otel_vllm_spans.jsonl"
    con = open_store(None)
    ingest_inputs(con, [str(path)], run="t")
    rows = con.execute(
        "SELECT provider, model, queue_s, prefill_s, ttft_s, decode_s, tpot_s, e2e_s, prompt_tokens, completion_tokens, "
        "max_tokens, stream, status, attrs->>'$.engine_request_id' FROM requests ORDER BY t_arrival").fetchall()
    assert rows == [
        ("vllm", None, 0.000412, 0.03125, 0.032125, 0.4125, 0.4125 / 127, 0.445875, 512, 128, 128, None, "ok", "chatcmpl-vllm-1"),
        ("vllm", None, 3.25, 0.0625, 3.313, 0.375, 0.375 / 95, 3.6885, 1024, 96, 256, None, "ok", "chatcmpl-vllm-2"),
    ]


def test_pre_2022_instrumentation_library_spans(tmp_path):
    """Collectors before OTLP 0.15 wrote instrumentationLibrarySpans / instrumentationLibrary."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "00f067aa0ba902b7", "name": "chat m", "kind": 3,
            "startTimeUnixNano": "1700000000123456789", "endTimeUnixNano": "1700000001123456789",
            "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}},
                           {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-3.5-turbo"}},
                           {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "42"}}],
            "status": {"code": 2, "message": "timeout"}}
    doc = {"resourceSpans": [{"resource": {"attributes": []}, "instrumentationLibrarySpans": [
        {"instrumentationLibrary": {"name": "opentelemetry.instrumentation.openai", "version": "0.10.0"},
         "spans": [span]}]}]}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    con = open_store(None)
    ingest_inputs(con, [str(path)], run="t")
    assert con.execute(
        "SELECT t_arrival, e2e_s, provider, model, prompt_tokens, status, error_type, error_message, "
        "attrs->>'$.scope_name' FROM requests").fetchall() == [
        (datetime(2023, 11, 14, 22, 13, 20, 123456), 1.0, "openai", "gpt-3.5-turbo", 42, "error", "error", "timeout",
         "opentelemetry.instrumentation.openai")]
