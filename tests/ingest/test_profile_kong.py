"""Kong AI Gateway log entries: Kong's documented and spec'd `ai` objects in a constructed envelope (ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "kong" / "kong-file-log.jsonl"


def test_proxied_call_is_the_row_in_both_spellings():
    assert sniffed_name(SAMPLE) == "kong-ai-log"
    source, rows, _ = ingest_rows(SAMPLE, order="source_line")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    docs, spec = rows
    # the docs' singular prompt_token / completion_token; the transformer's own LLM call is not this row
    assert (docs["model"], docs["provider"], docs["prompt_tokens"], docs["completion_tokens"]) == ("command", "cohere", 28, 20)
    assert docs["attrs"]["ai_plugins"] == "ai-proxy,ai-request-transformer"
    assert docs["tpot_s"] == pytest.approx(0.133) and docs["attrs"]["llm_latency_ms"] == 2670
    assert docs["e2e_s"] == pytest.approx(2.702) and docs["t_arrival"] == datetime(2024, 9, 19, 22, 10, 39)
    # Kong's spec: plural names, the served model differs from the one asked for
    assert (spec["prompt_tokens"], spec["completion_tokens"]) == (25, 12)
    assert (spec["model"], spec["served_model"], spec["http_status"]) == ("gpt-3.5-turbo", "gpt-3.5-turbo-0613", 200)
    assert spec["ttft_s"] is None and spec["finish_reason"] is None
