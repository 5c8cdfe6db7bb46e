"""OpenRouter /api/v1/generation answers (documented example + a published partial answer: ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "openrouter" / "generation-stats.jsonl"


def test_generation_stats_native_counts_and_raw_latencies():
    assert sniffed_name(SAMPLE) == "openrouter-generation"
    source, rows, _ = ingest_rows(SAMPLE, order="source_line")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    documented, partial = rows
    assert (documented["request_id"], documented["model"], documented["provider"]) == (
        "gen-3bhGkxlo4XFrqiabUM7NDtwDzWwG", "sao10k/l3-stheno-8b", "Infermatic")
    assert documented["t_arrival"] == datetime(2024, 7, 15, 23, 33, 19, 433273)
    assert (documented["prompt_tokens"], documented["cached_tokens"]) == (10, 3)
    assert (documented["completion_tokens"], documented["reasoning_tokens"]) == (25, 5)
    assert (documented["finish_reason"], documented["stream"]) == ("stop", True)
    # what latency / generation_time measure is not documented: raw in attrs, not TTFT or e2e
    assert (documented["attrs"]["latency_ms"], documented["attrs"]["generation_time_ms"]) == (1250, 1200)
    assert documented["ttft_s"] is None and documented["e2e_s"] is None
    # the published partial answer: only the normalised prompt count, no model, no time
    assert (partial["prompt_tokens"], partial["cached_tokens"], partial["provider"]) == (2, 0, "Anthropic")
    assert partial["t_arrival"] is None and partial["completion_tokens"] is None


def test_prometheus_api_answers_are_not_openrouter_generations():
    # {"status": "success", "data": {...}}: a Prometheus HTTP API answer, once read as a generation (1 row, exit 0)
    api = FORMATS.parent.parent / "ingest" / "data" / "prometheus_api"
    for name in ("config.json", "targets.json", "range.json"):
        assert sniffed_name(api / name) != "openrouter-generation", name
