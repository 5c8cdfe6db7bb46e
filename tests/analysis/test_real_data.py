"""The four detectors on real data: llama.cpp and vLLM (CPU) runs recorded on this machine, vllm bench results and
the Mooncake trace (tests/data/shared, see its README). Each dataset is ingested once through the normal ingest path."""

from __future__ import annotations

import json

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.store.schema import open_store
from tests.conftest import SHARED_DATA

REAL = SHARED_DATA / "real-engine"


def _analyze(*paths) -> dict:
    con = open_store(None)
    try:
        ingest_paths(con, [str(p) for p in paths])
        return analyze(con, load_rules())
    finally:
        con.close()


def _finding(doc: dict, rule: str, run: str) -> dict:
    found = [f for f in doc["findings"] if f["rule"] == rule and f["scope"]["run"] == run]
    assert len(found) == 1, [f["scope"] for f in doc["findings"] if f["rule"] == rule]
    return found[0]


def _raw(engine: str, run: str) -> list[dict]:
    with open(REAL / engine / "requests.jsonl") as handle:
        return [r for r in map(json.loads, handle) if r["run"] == run]


def _usage(record: dict) -> dict:
    return (record.get("response") or record.get("stream_final_chunk") or {}).get("usage") or {}


@pytest.fixture(scope="module")
def llamacpp() -> dict:
    return _analyze(REAL / "llamacpp")


@pytest.fixture(scope="module")
def vllm_cpu() -> dict:
    return _analyze(REAL / "vllm-cpu")


# --- SL004 ---------------------------------------------------------------------------------------------------------

def test_llamacpp_burst_of_50_is_a_queue_driven_cold_start_spike(llamacpp):
    f = _finding(llamacpp, "SL004", "burst50")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and f["severity"] == "critical"
    assert m["cold_start"] is True and m["spike_kind"] == "queue-driven"
    assert "cold start or initial burst" in f["summary"]
    # 50 requests on 4 slots: the README measured a client-side wait of about 3.3 s at the median.
    assert 2.5 < m["wait_p50_s"] < 5.0
    assert m["queue_share"] > 0.9
    # llamacpp:requests_deferred saw the queue; --parallel 4 caps the busy slots.
    assert m["waiting_max"] > 30 and m["running_max"] == 4
    assert len(f["examples"]) == 5 and all(e["source"].endswith("requests.jsonl") and e["line"] for e in f["examples"])
    # One burst is one window: the chart shows each request's TTFT and its no-wait part instead of a one-point line.
    chart = f["evidence"]["chart"]
    assert chart["type"] == "scatter" and [s["name"] for s in chart["series"]] == ["TTFT (s)", "TTFT without waiting (s)"]
    assert len(chart["series"][0]["x"]) == m["requests"] and max(chart["series"][0]["y"]) == pytest.approx(m["worst_ttft_p99_s"], rel=0.05)
    assert "roll back if it does not fall below" in f["rollback"]


def test_llamacpp_poisson_arrivals_do_not_fire_the_queue_rule(llamacpp):
    f = _finding(llamacpp, "SL004", "poisson")
    assert f["state"] == "clear"
    assert "prefill-driven, not queue-driven" in f["summary"]


def test_vllm_burst_of_50_is_queue_driven_with_the_engine_gauges_at_the_cap(vllm_cpu):
    f = _finding(vllm_cpu, "SL004", "burst50")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and m["cold_start"] is True
    # --max-num-seqs 4: four running, the other requests counted as waiting by vLLM itself.
    assert m["running_max"] == 4 and m["waiting_max"] >= 40
    assert m["wait_source"].startswith("queue_s")


# --- SL001 ---------------------------------------------------------------------------------------------------------

def test_llamacpp_shared_prefix_without_cache_prompt_fires(llamacpp):
    f = _finding(llamacpp, "SL001", "prefix_nocache")
    m = f["evidence"]["metrics"]
    raw = _raw("llamacpp", "prefix_nocache")
    assert all(_usage(r)["prompt_tokens_details"]["cached_tokens"] == 0 for r in raw)
    assert f["state"] == "fired"
    assert m["shared_prefix_share"] == 1.0 and m["repeat_requests"] == len(raw) - 1 and m["hit_rate"] == 0.0
    assert 0.3 < m["cohort_ttft_p50_s"] < 1.0
    assert f["evidence"]["chart"]["type"] == "scatter"


def test_llamacpp_shared_prefix_with_cache_prompt_is_clear_with_the_real_hit_rate(llamacpp):
    f = _finding(llamacpp, "SL001", "prefix_cache")
    raw = sorted(_raw("llamacpp", "prefix_cache"), key=lambda r: r["send_ts"])[1:]   # the repeats
    expected = sum(_usage(r)["prompt_tokens_details"]["cached_tokens"] for r in raw) / sum(_usage(r)["prompt_tokens"] for r in raw)
    assert f["state"] == "clear" and "The prefix cache works" in f["summary"]
    assert f["evidence"]["metrics"]["hit_rate"] == pytest.approx(expected, abs=1e-4)


def test_llamacpp_fresh_server_runs(llamacpp):
    assert _finding(llamacpp, "SL001", "fresh_nocache")["state"] == "fired"
    assert _finding(llamacpp, "SL001", "fresh_cache")["state"] == "clear"
    # burst50 and poisson prompts are all different: nothing to cache, so clear rather than fired.
    assert "do not share prefixes" in _finding(llamacpp, "SL001", "burst50")["summary"]


def test_vllm_without_prefix_caching_fires_from_requests_config_and_counters(vllm_cpu):
    f = _finding(vllm_cpu, "SL001", "noprefixcaching_nocache")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and f["summary"].startswith("Prefix cache disabled")
    assert m["cache_config_enable_prefix_caching"] == "False"
    assert m["metric_prefix_cache_queries_increase"] == 0.0 and m["metric_prompt_tokens_increase"] > 0
    # The CPU backend runs 128-token blocks; the rule takes the size from cache_config_info, not its default of 16.
    assert m["hit_rate"] == 0.0 and m["block_size_tokens"] == 128 and "(128 tokens) cannot hit" in f["summary"]


def test_vllm_with_prefix_caching_is_clear(vllm_cpu):
    f = _finding(vllm_cpu, "SL001", "prefix_cache")
    m = f["evidence"]["metrics"]
    assert f["state"] == "clear"
    assert m["hit_rate"] > 0.8 and m["cache_config_enable_prefix_caching"] == "True"
    assert m["metric_hit_rate"] > 0.5


def test_mooncake_shows_shared_prefixes_but_no_hit_rate():
    doc = _analyze(SHARED_DATA / "traces" / "mooncake_fast25_synthetic_trace.jsonl")
    (f,) = [f for f in doc["findings"] if f["rule"] == "SL001"]
    m = f["evidence"]["metrics"]
    assert f["state"] == "not_evaluable"
    assert "no cached_tokens field and no prefix-cache metric" in f["reason"]
    # The trace's README: about 64% of prompt blocks are reusable with an unbounded cache.
    assert m["reusable_block_share"] == pytest.approx(0.64, abs=0.01)
    assert m["prompt_blocks"] > 3993
    assert all(g["state"] == "not_evaluable" for g in doc["findings"])


# --- SL002 and SL003 -----------------------------------------------------------------------------------------------

def test_llamacpp_length_finishes_at_max_tokens_16(llamacpp):
    f = _finding(llamacpp, "SL002", "burst50")
    raw = _raw("llamacpp", "burst50")
    length = sum(1 for r in raw if r.get("finish_reason") == "length")
    assert f["state"] == "fired"
    assert f["evidence"]["metrics"]["length_finishes"] >= length
    assert f["evidence"]["metrics"]["top_cap"] == 16
    # 16-request runs are below min_requests: not evaluable, not clear.
    assert _finding(llamacpp, "SL002", "prefix_cache")["state"] == "not_evaluable"


def test_vllm_length_share_from_the_logs_matches_the_engine_counter(vllm_cpu):
    # Two independent sources: the client's finish_reason per request and vllm:request_success{finished_reason}.
    for run in ("burst50", "poisson"):
        m = _finding(vllm_cpu, "SL002", run)["evidence"]["metrics"]
        assert m["length_share"] == pytest.approx(m["metric_length_share"], abs=1e-4)
    # poisson: 4 of 60 requests failed with HTTP 400 (prompt over the context): not in the share.
    assert _finding(vllm_cpu, "SL002", "poisson")["evidence"]["metrics"]["requests"] == 56


def test_vllm_bench_random_runs_cannot_be_judged_for_length_finishes():
    doc = _analyze(REAL / "vllm-bench" / "random")
    requests_runs = [f for f in doc["findings"] if f["rule"] == "SL002" and f["scope"]["run"].startswith("random")]
    assert [f["state"] for f in requests_runs] == ["not_evaluable"]
    assert "ignore_eos is forced" in requests_runs[0]["reason"]


def test_real_engine_responses_leak_no_reasoning(llamacpp, vllm_cpu):
    for doc in (llamacpp, vllm_cpu):
        f = _finding(doc, "SL003", "burst50")
        assert f["state"] == "clear" and f["evidence"]["metrics"]["leaking"] == 0


def test_vllm_scrapes_alone_show_the_burst_through_the_histograms():
    """No request log: vLLM's TTFT, queue and prefill histograms (sum/count increases between scrapes)."""
    vllm = REAL / "vllm-cpu"
    con = open_store(None)
    try:
        ingest_paths(con, [], sorted(str(p) for p in vllm.glob("metrics_burst50_*.prom")) + [str(vllm / "metrics_index.jsonl")])
        doc = analyze(con, [r for r in load_rules() if r.id == "SL004"])
    finally:
        con.close()
    (f,) = doc["findings"]
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and f["scope"] == {"run": "burst50", "model": "tiny", "deployment": None}
    assert m["requests"] == 50 and m["cold_start"] is True and m["queue_share"] > 0.9
    assert "From the engine's histograms only" in f["summary"] and f["examples"] == []
