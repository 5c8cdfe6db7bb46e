"""GuideLLM benchmark reports -> one row per request, on a real report cut down by GuideLLM's own tests."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tests.ingest.format_rows import ingest_rows, sniffed_name

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "shared" / "formats" / "guidellm_v0.3_benchmarks_stripped.json"


def test_sniffed_and_units():
    assert sniffed_name(SAMPLE) == "guidellm-benchmarks"
    source, rows, _ = ingest_rows(SAMPLE)
    assert (source["format"], source["rows"], source["bad_lines"]) == ("guidellm-benchmarks", 1, 0)
    row = rows[0]
    assert row["request_id"] == "73054dd1-486f-4894-a861-075750b82453"
    assert (row["model"], row["deployment"], row["endpoint"]) == ("example_model", "example_target", "/v1/completions")
    assert abs((row["t_arrival"] - datetime(2025, 6, 5, 20, 59, 28, 182700)).total_seconds()) <= 1e-6  # Unix s, UTC
    # ttft in seconds, equal to the report's own time_to_first_token_ms / 1000
    assert row["ttft_s"] == pytest.approx(21.281957626342773 / 1000, abs=1e-9)
    assert row["e2e_s"] == pytest.approx(0.6891846656799316, abs=1e-9)
    # TPOT is the inter-token latency (excludes the first token), not time_per_output_token_ms
    assert row["tpot_s"] == pytest.approx(5.258346167136365 / 1000, abs=1e-9)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (257, 128)
    assert row["status"] == "ok" and row["finish_reason"] is None
    assert row["attrs"]["bucket"] == "successful" and row["attrs"]["strategy"] == "synchronous"
    assert row["attrs"]["client_queue_s"] == pytest.approx(1749157168.1818697 - 1749157168.1811602, abs=1e-6)
