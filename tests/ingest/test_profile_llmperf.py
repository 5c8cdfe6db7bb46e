"""llmperf individual_responses: client seconds, no timestamps (values from llmperf's own example notebook)."""

from __future__ import annotations

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "llmperf" / "550_150_individual_responses.json"


def test_per_request_seconds_and_derived_tpot():
    assert sniffed_name(SAMPLE) == "llmperf-responses"
    source, rows, _ = ingest_rows(SAMPLE, order="ttft_s")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    first = rows[0]
    assert first["ttft_s"] == pytest.approx(0.554988) and first["e2e_s"] == pytest.approx(1.610734)
    assert (first["prompt_tokens"], first["completion_tokens"]) == (635, 71)
    # not llmperf's inter_token_latency_s (which includes the TTFT): (e2e - ttft) / (n - 1)
    assert first["tpot_s"] == pytest.approx((1.610734 - 0.554988) / 70)
    assert first["t_arrival"] is None and first["model"] is None  # llmperf saves no clock and no model per request
    assert first["status"] == "ok" and rows[1]["completion_tokens"] == 76
