"""Envoy AI Gateway JSON access log, from the entries in the AI Gateway's own documentation."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "envoy-ai-gateway" / "access-log.jsonl"


def test_llm_route_is_a_row_and_the_mcp_route_is_not():
    assert sniffed_name(SAMPLE) == "envoy-ai-gateway-access-log"
    source, rows, _ = ingest_rows(SAMPLE)
    assert (source["rows"], source["bad_lines"]) == (1, 0)
    row = rows[0]
    assert row["request_id"] == "83b63da3-45a9-4196-98b8-1a7f697d6d8d"
    assert (row["model"], row["served_model"], row["endpoint"]) == ("gpt-4o-mini", None, "/v1/chat/completions")
    assert row["provider"] == "default/tars/route/aigw-run/rule/0/ref/0"
    assert row["t_arrival"] == datetime(2025, 8, 30, 16, 51, 37, 894000)
    assert row["e2e_s"] == pytest.approx(1.526)  # duration is ms
    assert (row["prompt_tokens"], row["completion_tokens"], row["http_status"], row["status"]) == (15, 7, 200, "ok")
    assert row["ttft_s"] is None and row["attrs"]["upstream_service_time_ms"] == 451.0
