"""Langfuse observations: batch export JSONL and public API page (samples built from the source: ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

EXPORT = FORMATS / "langfuse" / "observations-export.jsonl"
API = FORMATS / "langfuse" / "observations-api-page.json"


@pytest.mark.parametrize("path, fmt", [(EXPORT, "langfuse-observations"), (API, "langfuse-observations-api")])
def test_generations_become_rows_with_units(path, fmt):
    assert sniffed_name(path) == fmt
    source, rows, _ = ingest_rows(path, order="t_arrival")
    # the SPAN observation is not a model call (where); nothing is a bad line
    assert (source["format"], source["rows"], source["bad_lines"]) == (fmt, 2, 0)
    gen, failed = rows
    assert gen["t_arrival"] == datetime(2026, 4, 4, 6, 21, 9, 835000)
    # e2e from the timestamps (export `latency` is ms, the API's is s: both kept raw only)
    assert gen["e2e_s"] == pytest.approx(7.878) and gen["ttft_s"] == pytest.approx(6.322)
    assert gen["attrs"]["latency_raw"] == (7878 if fmt == "langfuse-observations" else 7.878)
    # usageDetails.input (24) excludes the cached 1000: prompt = the input* sum
    assert (gen["prompt_tokens"], gen["cached_tokens"], gen["attrs"]["usage_input_uncached"]) == (1024, 1000, 24)
    assert (gen["completion_tokens"], gen["reasoning_tokens"]) == (1407, 1029)
    assert (gen["finish_reason"], gen["stream"], gen["status"]) == ("stop", True, "ok")
    # 0 tokens on a failed generation mean "not reported"
    assert (failed["status"], failed["prompt_tokens"], failed["completion_tokens"]) == ("error", None, None)
    assert failed["error_message"].startswith("429 Resource has been exhausted")
    assert failed["ttft_s"] is None and failed["max_tokens"] == 512 and failed["finish_reason"] == "error"


def test_csv_export_reads_the_same_generations():
    path = FORMATS / "langfuse" / "observations-export.csv"
    assert sniffed_name(path) == "langfuse-observations-csv"
    source, rows, _ = ingest_rows(path, order="t_arrival")
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    gen, failed = rows
    assert (gen["prompt_tokens"], gen["cached_tokens"], gen["completion_tokens"]) == (1024, 1000, 1407)
    assert gen["ttft_s"] == pytest.approx(6.322) and gen["e2e_s"] == pytest.approx(7.878)
    assert (failed["status"], failed["prompt_tokens"]) == ("error", None)
