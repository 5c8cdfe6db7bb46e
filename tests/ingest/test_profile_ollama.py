"""Ollama /api/chat final objects, from Ollama's API documentation examples."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "ollama" / "ollama-chat.jsonl"


def test_final_objects_nanoseconds_and_end_time():
    assert sniffed_name(SAMPLE) == "ollama-responses"
    source, rows, _ = ingest_rows(SAMPLE)
    # the streamed chunk (done false) and the load answer are not requests, and not bad lines
    assert (source["rows"], source["bad_lines"]) == (4, 0)
    assert [r["source_line"] for r in rows] == [2, 3, 4, 5]
    plain = rows[1]
    assert plain["t_end"] == datetime(2023, 12, 12, 14, 13, 43, 416799)  # created_at is the end
    assert plain["e2e_s"] == pytest.approx(5.191566416)
    assert plain["t_arrival"] == datetime(2023, 12, 12, 14, 13, 38, 225233)  # end - total_duration
    assert plain["prefill_s"] == pytest.approx(0.383809) and plain["decode_s"] == pytest.approx(4.799921)
    assert plain["tpot_s"] == pytest.approx(4.799921 / 298)
    assert (plain["prompt_tokens"], plain["completion_tokens"], plain["endpoint"]) == (26, 298, "/api/chat")
    assert plain["ttft_s"] is None and plain["finish_reason"] is None
    structured = rows[2]
    assert structured["attrs"]["load_s"] == pytest.approx(0.574751416)  # the cold load, inside total_duration
    assert structured["finish_reason"] == "stop"
    assert rows[3]["attrs"]["tool_calls"] == 1 and rows[3]["content_empty"] is True
