"""Amazon Bedrock model invocation logs (two records published by their users: tests/data/formats/bedrock)."""

from __future__ import annotations

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "bedrock" / "bedrock-invocation-logs.jsonl"


def test_invocation_log_records_sniffed_with_units():
    assert sniffed_name(SAMPLE) == "bedrock-invocation-log"
    source, rows, _ = ingest_rows(SAMPLE, order="source_line")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    bare, converse = rows
    # text delivery off: counts only, no latency, no finish reason; `timestamp` is when the call was logged
    assert (bare["model"], bare["provider"], bare["endpoint"], bare["deployment"]) == (
        "apac.amazon.nova-micro-v1:0", "bedrock", "Converse", "ap-northeast-1")
    assert (bare["prompt_tokens"], bare["cached_tokens"], bare["completion_tokens"]) == (1, 0, 8)
    assert bare["e2e_s"] is None and bare["finish_reason"] is None and bare["t_arrival"] is None
    assert str(bare["t_end"]) == "2026-09-08 12:10:33" and bare["stream"] is False
    # the Converse body: metrics.latencyMs and stopReason
    assert converse["e2e_s"] == pytest.approx(3.64)
    assert (converse["finish_reason"], converse["finish_reason_raw"]) == ("stop", "end_turn")
    assert (converse["prompt_tokens"], converse["completion_tokens"], converse["status"]) == (35, 446, "ok")
    # the published stamp "2025-04-99T23:00:17Z" is no date: unknown, the row kept
    assert converse["t_end"] is None and converse["attrs"]["logged_at_raw"] == "2025-04-99T23:00:17Z"
