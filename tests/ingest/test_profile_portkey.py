"""Portkey's open-source gateway log stream, recorded in front of a real llama.cpp server (ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "portkey" / "portkey-gateway-log-stream.sse"


def test_one_row_per_client_request_from_the_served_attempt():
    assert sniffed_name(SAMPLE) == "portkey-gateway-log-stream"
    source, rows, _ = ingest_rows(SAMPLE, order="source_line")
    # 4 `event: log` records; `event: connected`, the ids and blank lines are neither rows nor bad lines
    assert (source["rows"], source["bad_lines"]) == (4, 0)
    first, second, fallback, _ = rows
    assert (first["request_id"], first["model"], first["provider"]) == (
        "chatcmpl-qgmOvi1qa16oE4mt22PaFgL1gsIeWBiU", "tiny", "openai")
    # createdAt (UTC, ms), not the gateway's locale-formatted local `time`
    assert first["t_arrival"] == datetime(2026, 12, 2, 2, 32, 43, 140000)
    assert first["attrs"]["gateway_local_time"] == "12/2/2026, 2:32:43 AM"
    assert first["e2e_s"] == pytest.approx(0.087) and first["stream"] is False
    assert (first["prompt_tokens"], first["completion_tokens"], first["cached_tokens"]) == (17, 24, 0)
    assert (first["finish_reason"], first["max_tokens"], first["http_status"]) == ("length", 24, 200)
    assert second["cached_tokens"] == 16 and second["finish_reason"] == "stop"


def test_fallback_answer_sits_on_the_first_attempt_but_the_last_one_served_it():
    _, rows, _ = ingest_rows(SAMPLE, order="source_line")
    fallback = rows[2]
    assert fallback["attrs"]["attempts"] == 2 and fallback["attrs"]["served_option"] == "config.targets[1]"
    # the dead first target (127.0.0.1:9) is not the deployment; the answer's tokens are still read
    deployment = fallback["deployment"]
    assert deployment.startswith("http://127.0.0.1:") and not deployment.endswith(":9")
    assert (fallback["completion_tokens"], fallback["e2e_s"]) == (24, pytest.approx(0.036))
    assert fallback["t_arrival"] == datetime(2026, 12, 2, 2, 32, 43, 333000)
