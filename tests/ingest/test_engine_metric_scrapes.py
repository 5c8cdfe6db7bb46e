"""Engine scrapes that came from the engines (tests/data/formats/metrics/ATTRIBUTION.md): their role metrics parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from servlens.ingest.metrics import TEXT_FORMAT, ingest_metrics_file, sniff_metrics
from servlens.ingest.sources import decide_source

SCRAPES = Path(__file__).resolve().parents[1] / "data" / "formats" / "metrics"


def _ingest(con, name: str, run: str):
    """One real scrape from SCRAPES, sniffed as the text exposition format and ingested as run `run`."""
    path = SCRAPES / name
    assert sniff_metrics(path) == TEXT_FORMAT
    decision = decide_source(con, run, "metrics", path.resolve())
    con.execute("BEGIN")
    ingest_metrics_file(con, path.resolve(), run=run, decision=decision)
    con.execute("COMMIT")


def test_sglang_docs_scrape_role_metrics(con):
    _ingest(con, "sglang-docs-metrics.prom", "sglang-docs")
    values = dict(con.execute(
        "SELECT name, value FROM metric_samples WHERE type IN ('gauge', 'counter')").fetchall())
    # the roles: waiting, running, KV usage (a 0-1 fraction), prefix-cache hit rate (a gauge, not counters)
    assert values["sglang:num_queue_reqs"] == 2826.0
    assert values["sglang:num_running_reqs"] == 162.0
    assert values["sglang:token_usage"] == pytest.approx(0.28)
    assert values["sglang:cache_hit_rate"] == pytest.approx(0.007507552643049313)
    # counters are stored under their family name (the exposition adds _total)
    assert values["sglang:prompt_tokens"] == 8.128902e06
    types = dict(con.execute("SELECT DISTINCT name, type FROM metric_samples").fetchall())
    assert types["sglang:num_queue_reqs"] == "gauge" and types["sglang:prompt_tokens"] == "counter"
    ttft_inf = con.execute(
        "SELECT value FROM metric_samples WHERE name = 'sglang:time_to_first_token_seconds' "
        "AND series = 'bucket' AND isinf(le)").fetchone()
    assert ttft_inf == (11008.0,)
    # the older histogram name is stored under the current one, the raw name kept
    renamed = con.execute("SELECT DISTINCT name FROM metric_samples "
                          "WHERE name_raw = 'sglang:time_per_output_token_seconds_bucket'").fetchall()
    assert renamed == [("sglang:inter_token_latency_seconds",)]


def test_tgi_scrape_role_metrics(con):
    _ingest(con, "tgi-datadog-fixture-metrics.prom", "tgi-real")
    values = dict(con.execute(
        "SELECT name, value FROM metric_samples WHERE type IN ('gauge', 'counter') AND map_keys(labels) = ['instance']"
    ).fetchall())
    # an idle router after 111 requests: 109 succeeded, the 2 others failed validation (111 = 109 + 2)
    assert (values["tgi_queue_size"], values["tgi_batch_current_size"]) == (0.0, 0.0)
    assert (values["tgi_request_count"], values["tgi_request_success"]) == (111.0, 109.0)
    failed = con.execute("SELECT labels['err'], value FROM metric_samples WHERE name = 'tgi_request_failure'").fetchall()
    assert failed == [("validation", 2.0)]
    # metrics-exporter-prometheus writes counters without _total and histograms in seconds with 35 buckets
    types = dict(con.execute("SELECT DISTINCT name, type FROM metric_samples").fetchall())
    assert types["tgi_request_success"] == "counter" and types["tgi_request_queue_duration"] == "histogram"
    queue = dict(con.execute("SELECT series, value FROM metric_samples WHERE name = 'tgi_request_queue_duration' "
                             "AND series IN ('sum', 'count')").fetchall())
    assert queue == {"sum": pytest.approx(295.275961956), "count": 109.0}
    buckets = con.execute("SELECT count(*), max(value) FILTER (WHERE isinf(le)) FROM metric_samples "
                          "WHERE name = 'tgi_request_duration' AND series = 'bucket'").fetchone()
    assert buckets == (36, 109.0)


def test_nim_scrape_role_metrics(con):
    _ingest(con, "nim-datadog-fixture-metrics.prom", "nim-real")
    values = dict(con.execute(
        "SELECT name, value FROM metric_samples WHERE type IN ('gauge', 'counter')").fetchall())
    # vLLM's V0 names without the vllm: prefix; the KV usage is a 0-1 share despite its name
    assert (values["num_requests_running"], values["num_requests_waiting"]) == (1.0, 0.0)
    assert values["gpu_cache_usage_perc"] == pytest.approx(0.0002848191398461977)
    assert (values["prompt_tokens"], values["generation_tokens"]) == (109.0, 174.0)
    labels = con.execute("SELECT DISTINCT labels['model_name'] FROM metric_samples").fetchall()
    assert labels == [("meta/llama-3.1-8b-instruct",)]
    ttft = dict(con.execute("SELECT series, value FROM metric_samples WHERE name = 'time_to_first_token_seconds' "
                            "AND series IN ('sum', 'count')").fetchall())
    assert ttft == {"sum": pytest.approx(0.6119842529296875), "count": 5.0}
