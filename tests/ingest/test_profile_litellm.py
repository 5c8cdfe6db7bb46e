"""LiteLLM formats: StandardLoggingPayload JSON lines and LiteLLM_SpendLogs exports (CSV, row_to_json lines).

The recorded fixtures come from a real LiteLLM Router in front of a real llama.cpp server
(tests/data/gateways/README.md); expected values are recomputed here from the raw payloads, so a wrong unit,
a TTFT taken from a non-streamed call or a 0 that should be NULL fails.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import builtin_profiles
from servlens.ingest.sniff import sniff
from servlens.store.schema import open_store

DATA = Path(__file__).resolve().parents[1] / "data" / "gateways"
SLP_RECORDED = DATA / "litellm_slp_recorded.jsonl"
SLP_REFERENCE = DATA / "litellm_slp_reference.jsonl"
SPEND_CSV = DATA / "litellm_spendlogs.csv"
SPEND_JSONL = DATA / "litellm_spendlogs.jsonl"


def _ingest(path: Path, **kwargs):
    con = open_store(None)
    report = ingest_inputs(con, [str(path)], run="t", **kwargs)
    cur = con.execute("SELECT * FROM requests ORDER BY source_line")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for row in rows:
        row["attrs"] = json.loads(row["attrs"]) if row["attrs"] else None
    return con, report, rows


def _utc(seconds: float) -> datetime:
    """Unix seconds -> naive UTC datetime at microsecond precision (what the store holds)."""
    return datetime(1970, 1, 1) + timedelta(microseconds=round(seconds * 1e6))


@pytest.fixture(scope="module")
def slp():
    raw = [json.loads(line) for line in SLP_RECORDED.read_text().splitlines()]
    con, report, rows = _ingest(SLP_RECORDED)
    return raw, report, rows


def test_recorded_payloads_are_sniffed_as_litellm_slp(slp):
    raw, report, rows = slp
    assert sniff(SLP_RECORDED, builtin_profiles()).profile.name == "litellm-slp"
    source = report.to_dict()["sources"][0]
    assert (source["format"], source["rows"], source["bad_lines"]) == ("litellm-slp", 14, 0)
    assert [r["source_line"] for r in rows] == list(range(1, 15))
    assert [r["request_id"] for r in rows] == [p["id"] for p in raw]


def test_ttft_only_for_streamed_successes(slp):
    raw, _, rows = slp
    streamed = [i for i, p in enumerate(raw) if p["stream"] is True]
    assert streamed == [1, 7, 12]  # line 2, the fallback's streamed answer, the longer stream
    for i, (p, row) in enumerate(zip(raw, rows)):
        if i in streamed:
            assert row["stream"] is True
            assert row["ttft_s"] == pytest.approx(p["completionStartTime"] - p["startTime"], abs=1e-9)
            assert row["t_first_token"] == _utc(p["completionStartTime"])
            assert row["tpot_s"] == pytest.approx(
                (p["endTime"] - p["completionStartTime"]) / (p["completion_tokens"] - 1), abs=1e-9)
        else:
            # completionStartTime is a copy of endTime here: never a first-token time.
            assert row["ttft_s"] is None and row["t_first_token"] is None and row["tpot_s"] is None, i
    # The non-streamed success on line 1: completionStartTime == endTime, e2e from the gateway clock.
    first = raw[0]
    assert first["completionStartTime"] == first["endTime"] and first["stream"] is None
    assert rows[0]["stream"] is False  # model_parameters.stream = false
    assert rows[0]["e2e_s"] == pytest.approx(first["endTime"] - first["startTime"], abs=1e-9)
    assert rows[0]["t_arrival"] == _utc(first["startTime"])
    assert rows[0]["t_end"] == _utc(first["endTime"])


def test_failed_attempts_have_unknown_tokens_and_their_error(slp):
    raw, _, rows = slp
    failed = [i for i, p in enumerate(raw) if p["status"] == "failure"]
    assert failed == [2, 3, 5, 6, 8, 9]
    for i in failed:
        assert raw[i]["prompt_tokens"] == 0 and raw[i]["metadata"]["usage_object"] == {}
        row = rows[i]
        assert (row["status"], row["finish_reason"], row["finish_reason_raw"]) == ("error", "error", None)
        assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (None, None, None)
        assert row["ttft_s"] is None
        assert row["e2e_s"] == pytest.approx(raw[i]["endTime"] - raw[i]["startTime"], abs=1e-9)
    # A failed attempt of a streamed request: the payload says stream None, the request asked for a stream.
    assert raw[5]["stream"] is None and raw[5]["model_parameters"]["stream"] is True
    assert rows[5]["stream"] is True and rows[5]["t_first_token"] is None
    assert [(rows[i]["http_status"], rows[i]["error_type"]) for i in failed] == [
        (500, "InternalServerError"), (500, "InternalServerError"), (500, "InternalServerError"),
        (500, "InternalServerError"), (401, "AuthenticationError"), (400, "ContextWindowExceededError"),
    ]
    assert rows[8]["error_message"] == "litellm.AuthenticationError: AuthenticationError: OpenAIException - Invalid API Key"
    assert rows[9]["error_message"].startswith("litellm.ContextWindowExceededError: litellm.BadRequestError")
    # Successes: error_code is "" in the payload -> no HTTP status, no error.
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 8
    assert all(r["http_status"] is None and r["error_type"] is None and r["error_message"] is None for r in ok)


def test_fallback_chain_shares_trace_id(slp):
    raw, _, rows = slp
    # chat-primary (dead port) fails twice (first try + 1 retry), then the fallback group chat-backup answers.
    for first in (2, 5):
        chain = rows[first:first + 3]
        assert len({r["trace_id"] for r in chain}) == 1
        assert [r["model"] for r in chain] == ["chat-primary", "chat-primary", "chat-backup"]
        assert [r["status"] for r in chain] == ["error", "error", "ok"]
        assert [r["deployment"] for r in chain] == ["http://127.0.0.1:18939/v1"] * 2 + ["http://127.0.0.1:18931/v1"]
        assert chain[2]["served_model"] == "tiny-a"
        assert chain[0]["t_arrival"] < chain[1]["t_arrival"] < chain[2]["t_arrival"]
    # Every other request is its own trace.
    traces = [r["trace_id"] for r in rows]
    assert len(set(traces)) == 14 - 4
    # Attempt order within the trace, and the group first asked for on the attempt that fell back.
    assert [(r["attempt"], r["fallback_from"]) for r in rows] == (
        [(1, None)] * 2 + [(1, None), (2, None), (3, "chat-primary")] * 2 + [(1, None)] * 6)


def test_attempts_also_in_safe_mode():
    """The ingester reruns a file with every expression in try() after a conversion error; DuckDB refuses window
    functions inside try(), so the attempt order must still compile and give the same values."""
    from servlens.ingest.profiles import get_profile
    from servlens.ingest.requests import ingest_request_file

    con = open_store(None)
    ingest_request_file(con, SLP_RECORDED, get_profile("litellm-slp"), run="t", safe=True)
    got = con.execute("SELECT source_line, attempt, fallback_from FROM requests ORDER BY source_line").fetchall()
    assert [g[1:] for g in got[2:5]] == [(1, None), (2, None), (3, "chat-primary")]


def test_cache_hit_is_flagged_and_not_a_served_latency(slp):
    raw, _, rows = slp
    hit_i = [i for i, p in enumerate(raw) if p["cache_hit"] is True]
    assert hit_i == [11]
    hit, miss = rows[11], rows[10]
    assert hit["request_id"].startswith(miss["request_id"] + "_cache_hit")
    assert hit["cache_hit"] is True
    assert (hit["t_end"], hit["e2e_s"], hit["ttft_s"], hit["t_first_token"], hit["tpot_s"]) == (None,) * 5
    assert hit["t_arrival"] == _utc(raw[11]["startTime"])
    assert hit["attrs"]["cache_hit_response_s"] == pytest.approx(raw[11]["endTime"] - raw[11]["startTime"], abs=1e-9)
    assert hit["attrs"]["cache_hit_response_s"] < 0.01
    assert hit["trace_id"] != miss["trace_id"]
    # The miss before it was served by the engine: a real latency, not flagged.
    assert miss["cache_hit"] is None and miss["e2e_s"] == pytest.approx(raw[10]["endTime"] - raw[10]["startTime"])
    # No other row is a hit: cache_hit false where LiteLLM said false, unknown (NULL) where it said None.
    assert [r["cache_hit"] for r in rows] == [
        None if p["cache_hit"] is None else p["cache_hit"] for p in raw]


def test_tokens_models_and_limits(slp):
    raw, _, rows = slp
    for p, row in zip(raw, rows):
        if p["status"] == "success":
            usage = p["metadata"]["usage_object"]
            assert row["prompt_tokens"] == usage["prompt_tokens"] == p["prompt_tokens"]
            assert row["completion_tokens"] == p["completion_tokens"]
            assert row["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
            assert row["finish_reason"] == p["response"]["choices"][0]["finish_reason"]
        assert row["max_tokens"] == p["model_parameters"].get("max_tokens")
        assert row["provider"] == "openai"
        assert row["attrs"]["litellm_call_id"] == p["litellm_call_id"]
        assert row["attrs"]["model_id"] == p["model_id"]
    # Streams report completion_tokens_details.reasoning_tokens = 0; non-streamed llama.cpp answers omit it (NULL).
    assert [r["reasoning_tokens"] for r in rows if r["status"] == "ok"] == [None, 0, None, 0, None, None, 0, None]
    # The last request used its whole 64-token cap (random weights rarely sample EOS).
    assert (rows[13]["finish_reason"], rows[13]["completion_tokens"], rows[13]["max_tokens"]) == ("length", 64, 64)
    assert rows[1]["finish_reason"] == "length" and rows[1]["completion_tokens"] == rows[1]["max_tokens"] == 16


def test_text_is_dropped_after_prefix_key(slp):
    _, _, rows = slp
    assert all(r["prompt_text"] is None and r["content_text"] is None for r in rows)
    same_prompt = {r["prefix_key"] for i, r in enumerate(rows) if i not in (9, 10, 11)}
    assert len(same_prompt) == 1 and None not in same_prompt
    assert rows[10]["prefix_key"] == rows[11]["prefix_key"] != rows[0]["prefix_key"]
    assert rows[0]["content_empty"] is False and rows[2]["content_empty"] is None


def test_keep_text_keeps_the_prompt():
    _, _, rows = _ingest(SLP_RECORDED, keep_text=True)
    assert rows[0]["prompt_text"] == "system: You are a terse assistant.\nuser: Say hello to the world."


@pytest.fixture(scope="module")
def slp_reference():
    con, report, rows = _ingest(SLP_REFERENCE)
    return con, report, rows


def test_reference_payloads_old_shape_anthropic_cache_and_reasoning(slp_reference):
    _, _, rows = slp_reference
    row = rows[0]  # a 2025 payload: no litellm_call_id, no status_fields
    assert row["attrs"]["litellm_call_id"] is None
    assert (row["model"], row["served_model"], row["provider"]) == ("claude-sonnet", "claude-sonnet-4-20250514", "anthropic")
    assert row["t_arrival"] == datetime(2025, 11, 28, 12, 0, 0, 250000)
    assert (row["ttft_s"], row["e2e_s"], row["decode_s"]) == (1.25, 6.5, 5.25)
    assert row["tpot_s"] == pytest.approx(5.25 / 349)
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["reasoning_tokens"]) == (2100, 2048, 350, 120)
    assert row["reasoning_present"] is True and row["content_has_reasoning_marker"] is False
    assert row["attrs"]["cache_creation_input_tokens"] == 0 and row["attrs"]["litellm_overhead_ms"] == 12.5


def test_reference_secret_in_error_is_redacted_and_retry_shares_the_trace(slp_reference):
    con, _, rows = slp_reference
    failed, retry = rows[1], rows[2]
    assert failed["trace_id"] == retry["trace_id"] == "5d4c3b2a-1f0e-4d9c-8b7a-665544332211"
    assert (failed["status"], failed["http_status"], failed["error_type"]) == ("error", 429, "RateLimitError")
    assert failed["error_message"] == (
        "litellm.RateLimitError: RateLimitError: Hosted_vllmException - Too many requests for "
        "Authorization: Bearer [REDACTED] (limit 20/min)")
    stored = json.dumps(con.execute("SELECT * FROM requests").fetchall(), default=str)
    assert "sk-live" not in stored and "4f9a8b7c6d5e" not in stored
    assert failed["max_tokens"] == retry["max_tokens"] == 512  # max_completion_tokens
    assert (retry["status"], retry["finish_reason"], retry["stream"], retry["ttft_s"]) == ("ok", "length", False, None)
    assert retry["cached_tokens"] is None  # prompt_tokens_details: null -> unknown, not 0
    assert retry["content_has_reasoning_marker"] is True and retry["reasoning_present"] is False


def test_reference_bad_lines_are_kept_with_their_line_numbers(slp_reference):
    con, report, rows = slp_reference
    assert len(rows) == 3
    assert report.to_dict()["sources"][0]["bad_lines"] == 2
    errors = con.execute("SELECT line, reason FROM ingest_errors ORDER BY line").fetchall()
    assert errors == [(5, "invalid JSON: the line ends before the value does (truncated?)"),
                      (6, "a JSON array, not an object")]


# --- SpendLogs -------------------------------------------------------------------------------------------------------


def _pg_ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.fixture(scope="module", params=["csv", "jsonl"])
def spend(request):
    path = SPEND_CSV if request.param == "csv" else SPEND_JSONL
    with open(SPEND_CSV, newline="", encoding="utf-8") as f:
        raw = list(csv.DictReader(f))
    con, report, rows = _ingest(path)
    return request.param, raw, report, rows


def test_spendlogs_sniffed_and_every_row_read(spend):
    kind, raw, report, rows = spend
    path = SPEND_CSV if kind == "csv" else SPEND_JSONL
    expected = "litellm-spendlogs-csv" if kind == "csv" else "litellm-spendlogs-json"
    assert sniff(path, builtin_profiles()).profile.name == expected
    source = report.to_dict()["sources"][0]
    assert (source["format"], source["rows"], source["bad_lines"]) == (expected, 10, 0)
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in raw]
    # CSV rows count from line 2 (the header is line 1); JSON lines from 1.
    assert [r["source_line"] for r in rows] == list(range(2, 12) if kind == "csv" else range(1, 11))


def test_spendlogs_times_are_utc_milliseconds_and_ttft_only_when_streamed(spend):
    _, raw, _, rows = spend
    streamed = 0
    for r, row in zip(raw, rows):
        start, end = _pg_ts(r["startTime"]), _pg_ts(r["endTime"])
        assert row["t_arrival"] == start
        if r["cache_hit"] == "True":
            continue
        assert row["t_end"] == end
        assert row["e2e_s"] == pytest.approx((end - start).total_seconds(), abs=1e-9)
        first = r["completionStartTime"]
        if first and _pg_ts(first) < end:
            streamed += 1
            assert row["stream"] is True and row["t_first_token"] == _pg_ts(first)
            assert row["ttft_s"] == pytest.approx((_pg_ts(first) - start).total_seconds(), abs=1e-9)
        else:
            # completionStartTime NULL (failure) or a copy of endTime (not streamed): no TTFT, stream unknown.
            assert row["ttft_s"] is None and row["t_first_token"] is None and row["stream"] is None
    assert streamed == 3
    assert rows[0]["t_arrival"] == datetime(2026, 11, 29, 9, 50, 20, 442000)


def test_spendlogs_failures_cache_hit_and_fallback(spend):
    _, raw, _, rows = spend
    by_status = [(r["status"], r["http_status"], r["error_type"]) for r in rows]
    assert by_status.count(("ok", None, None)) == 8
    assert [s for s in by_status if s[0] == "error"] == [("error", 401, "AuthenticationError"),
                                                         ("error", 400, "ContextWindowExceededError")]
    for r, row in zip(raw, rows):
        if r["status"] == "failure":
            assert r["prompt_tokens"] == "0"
            assert (row["prompt_tokens"], row["completion_tokens"]) == (None, None)
            assert row["error_message"].startswith("litellm.")
    hit = [row for row in rows if row["cache_hit"]]
    assert len(hit) == 1 and "_cache_hit" in hit[0]["request_id"]
    assert (hit[0]["e2e_s"], hit[0]["t_end"], hit[0]["ttft_s"]) == (None, None, None)
    raw_hit = next(r for r in raw if r["cache_hit"] == "True")
    assert hit[0]["attrs"]["cache_hit_response_s"] == pytest.approx(
        (_pg_ts(raw_hit["endTime"]) - _pg_ts(raw_hit["startTime"])).total_seconds(), abs=1e-9)
    assert hit[0]["attrs"]["cache_hit_response_s"] <= 0.002
    # cache_hit "None" -> unknown; "False" -> false.
    assert [row["cache_hit"] for row in rows] == [
        True if r["cache_hit"] == "True" else False if r["cache_hit"] == "False" else None for r in raw]
    # The rows that answered after chat-primary failed over: fallback_from from metadata.original_model_group.
    fell_back = [row for row in rows if row["fallback_from"]]
    assert [(row["model"], row["fallback_from"]) for row in fell_back] == [("chat-backup", "chat-primary")] * 2
    assert [(row["attrs"]["attempted_fallbacks"], row["attrs"]["attempted_retries"]) for row in fell_back] == [(1, 0)] * 2
    assert all(row["deployment"] == "http://127.0.0.1:18931/v1" for row in rows if row["model"] == "chat-backup")
    assert [row["cached_tokens"] for row in rows if row["status"] == "ok"] == [123, 123, 123, 123, 21, 21, 123, 123]


def test_spendlogs_csv_and_json_give_the_same_rows():
    _, _, from_csv = _ingest(SPEND_CSV)
    _, _, from_json = _ingest(SPEND_JSONL)
    for a, b in zip(from_csv, from_json):
        a = {k: v for k, v in a.items() if k not in ("source_line", "source_id")}
        b = {k: v for k, v in b.items() if k not in ("source_line", "source_id")}
        assert a == b


def test_spendlogs_agree_with_the_payloads_of_the_same_calls(slp, spend):
    raw_slp, _, slp_rows = slp
    _, _, _, spend_rows = spend
    by_id = {r["request_id"]: r for r in slp_rows}
    matched = 0
    for row in spend_rows:
        other = by_id.get(row["request_id"])
        if other is None:
            continue  # a cache hit's id suffix is built separately by each writer
        matched += 1
        assert row["trace_id"] == other["trace_id"]  # SpendLogs.session_id carries the SLP trace_id
        assert abs((row["t_arrival"] - other["t_arrival"]).total_seconds()) <= 0.0005
        assert (row["prompt_tokens"], row["completion_tokens"], row["status"]) == (
            other["prompt_tokens"], other["completion_tokens"], other["status"])
        assert row["deployment"] == other["deployment"]
    assert matched == 9


def test_spendlogs_payload_dicts_with_string_metadata_and_zoned_times():
    """LiteLLM's own SpendLogsPayload (metadata as a JSON string, ISO times with +00:00, microseconds) reads like
    the Postgres export of the same rows, at microsecond instead of millisecond precision."""
    payloads = DATA / "recording" / "spendlogs_payloads.jsonl"
    raw = [json.loads(line) for line in payloads.read_text().splitlines()]
    assert isinstance(raw[0]["metadata"], str) and raw[0]["startTime"].endswith("+00:00")
    _, report, rows = _ingest(payloads, from_format="litellm-spendlogs-json")
    _, _, exported = _ingest(SPEND_JSONL)
    assert report.to_dict()["sources"][0]["bad_lines"] == 0
    for r, row, exp in zip(raw, rows, exported):
        start = datetime.fromisoformat(r["startTime"]).astimezone(timezone.utc).replace(tzinfo=None)
        assert row["t_arrival"] == start
        assert abs((row["t_arrival"] - exp["t_arrival"]).total_seconds()) <= 0.0005
        for column in ("status", "http_status", "error_type", "error_message", "prompt_tokens", "cached_tokens",
                       "completion_tokens", "fallback_from", "stream", "cache_hit", "model", "deployment"):
            assert row[column] == exp[column], column


def test_redacted_messages_are_unknown_text_not_a_shared_prefix():
    """turn_off_message_logging (recorded): every message and the answer become "redacted-by-litellm". Two different
    prompts must not get one prefix_key (a false shared prefix for SL001), nor the placeholder count as an answer."""
    path = DATA / "litellm_slp_redacted.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert [p["messages"] for p in raw] == [[{"role": "user", "content": "redacted-by-litellm"}]] * 2
    assert {p["response"]["choices"][0]["message"]["content"] for p in raw} == {"redacted-by-litellm"}
    _, _, rows = _ingest(path)
    for row in rows:
        assert (row["prefix_key"], row["content_empty"], row["content_has_reasoning_marker"], row["reasoning_present"]) == (
            None, None, None, None)
    assert [(r["prompt_tokens"], r["completion_tokens"], r["stream"]) for r in rows] == [(71, 6, False), (76, 6, True)]
    assert rows[1]["ttft_s"] == pytest.approx(raw[1]["completionStartTime"] - raw[1]["startTime"], abs=1e-9)


def test_streamed_cache_hit_has_no_ttft():
    """A streamed request answered from LiteLLM's response cache (recorded): stream true, cache_hit true, and a
    completionStartTime seconds after startTime that measures the cache replay, not a model's first token."""
    path = DATA / "litellm_slp_stream_cache_hit.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(p["stream"], p["cache_hit"]) for p in raw] == [(True, False), (True, True)]
    _, _, rows = _ingest(path)
    miss, hit = rows
    assert miss["ttft_s"] == pytest.approx(raw[0]["completionStartTime"] - raw[0]["startTime"], abs=1e-9)
    assert (hit["cache_hit"], hit["stream"], hit["ttft_s"], hit["t_first_token"], hit["e2e_s"], hit["tpot_s"]) == (
        True, True, None, None, None, None)
    assert hit["attrs"]["cache_hit_response_s"] == pytest.approx(raw[1]["endTime"] - raw[1]["startTime"], abs=1e-9)
    assert hit["request_id"].startswith(miss["request_id"] + "_cache_hit") and hit["trace_id"] != miss["trace_id"]


def test_spendlogs_api_answer_reads_like_the_table_export():
    """GET /spend/logs saved to a file: one JSON list, newest first, +00:00 ISO times, nested Json columns."""
    path = DATA / "litellm_spendlogs_api.json"
    listed = json.loads(path.read_text())
    assert isinstance(listed, list) and listed[0]["startTime"].endswith("+00:00")
    assert listed[0]["startTime"] > listed[-1]["startTime"]  # newest first
    assert sniff(path, builtin_profiles()).profile.name == "litellm-spendlogs-api"
    _, report, rows = _ingest(path)
    assert (report.to_dict()["sources"][0]["rows"], report.to_dict()["sources"][0]["bad_lines"]) == (10, 0)
    _, _, exported = _ingest(SPEND_JSONL)
    by_id = {r["request_id"]: r for r in exported}
    assert sorted(by_id) == sorted(r["request_id"] for r in rows)
    for row in rows:
        other = by_id[row["request_id"]]
        assert row["attrs"].pop("index") == [r["request_id"] for r in listed].index(row["request_id"]) + 1
        for column, value in row.items():
            if column not in ("source_line", "source_id"):
                assert value == other[column], column
