"""GenAI-Perf profile_export.json: GenAI-Perf's own fixtures, checked against GenAI-Perf's own expected metrics."""

from __future__ import annotations

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

OPENAI = FORMATS / "genai-perf" / "openai_profile_export.json"
TRITON = FORMATS / "genai-perf" / "triton_profile_export.json"


def test_openai_chunks_without_content_are_not_tokens():
    assert sniffed_name(OPENAI) == "genai-perf-profile-export"
    source, rows, _ = ingest_rows(OPENAI, order="source_line, ttft_s")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    # GenAI-Perf's test: time_to_first_tokens [5 - 1, 7 - 2], request_latencies [12 - 1, 15 - 2] (ns); the role-only
    # first chunk, the empty final delta and [DONE] do not count
    assert [r["ttft_s"] for r in rows] == pytest.approx([4e-9, 5e-9])
    assert [r["e2e_s"] for r in rows] == pytest.approx([11e-9, 13e-9])
    assert all(r["model"] == "llama-2-7b" and r["stream"] is True and r["endpoint"] == "v1/chat/completions"
               for r in rows)
    assert [r["attrs"]["content_chunks"] for r in rows] == [3, 3] and rows[0]["completion_tokens"] is None
    assert rows[0]["attrs"]["experiment_mode"] == "concurrency" and rows[0]["attrs"]["experiment_value"] == 10


def test_triton_sweep_keeps_each_experiment():
    source, rows, _ = ingest_rows(TRITON, order="source_line, attrs")
    assert (source["format"], source["rows"]) == ("genai-perf-profile-export", 4)
    by_level = {}
    for r in rows:
        by_level.setdefault(r["attrs"]["experiment_mode"], []).append((r["ttft_s"], r["e2e_s"]))
    # GenAI-Perf's test: concurrency 10 -> TTFT [2, 2], latency [7, 9]; request_rate 2.0 -> [2, 3], [13, 8]
    assert sorted(by_level["concurrency"]) == pytest.approx([(2e-9, 7e-9), (2e-9, 9e-9)])
    assert sorted(by_level["request_rate"]) == pytest.approx([(2e-9, 13e-9), (3e-9, 8e-9)])
