"""TGI router --json-output: Rust Duration strings in mixed units, Success and error events (see ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "tgi" / "tgi-router.jsonl"


def test_durations_in_mixed_units_become_seconds():
    assert sniffed_name(SAMPLE) == "tgi-router-json"
    source, rows, _ = ingest_rows(SAMPLE)
    # the two "Connected" startup lines are not requests (where), and not bad lines either
    assert (source["rows"], source["bad_lines"]) == (3, 0)
    ok, failed, real_error = rows
    assert ok["e2e_s"] == pytest.approx(0.357867572, abs=1e-12)
    assert ok["queue_s"] == pytest.approx(49.382e-6, abs=1e-12)  # "49.382µs"
    assert ok["attrs"]["validation_s"] == pytest.approx(1.96844e-3, abs=1e-12)
    assert ok["attrs"]["tgi_time_per_token_s"] == pytest.approx(14.827082e-3, abs=1e-12)
    assert ok["completion_tokens"] == 24  # round(355.849981 / 14.827082)
    assert ok["ttft_s"] is None and ok["prompt_tokens"] is None and ok["model"] is None
    assert ok["t_end"] == datetime(2024, 7, 1, 5, 12, 41, 583307)
    assert ok["t_arrival"] == datetime(2024, 7, 1, 5, 12, 41, 225439)  # end - total_time, to the microsecond
    assert (ok["max_tokens"], ok["stream"], ok["status"]) == (512, False, "ok")
    assert (failed["status"], failed["error_type"], failed["http_status"]) == ("error", "validation", 422)
    assert failed["t_arrival"] is None and failed["e2e_s"] is None and failed["stream"] is True
    assert failed["finish_reason"] == "error"
    # a real TGI --json-output error line: the bare validation message from text_generation_router::infer
    assert (real_error["status"], real_error["error_type"], real_error["http_status"]) == ("error", "validation", 422)
    assert real_error["t_end"] == datetime(2024, 10, 25, 22, 35, 49, 174225) and real_error["stream"] is True
    assert real_error["error_message"].startswith("`inputs` tokens + `max_new_tokens` must be <= 2048")
