"""compare on before/after pairs recorded from real engines (llama.cpp via xllamacpp, vLLM CPU), 40–120 requests
a side, asserting the exit code each pair's raw numbers call for.

The raw numbers (duckdb over the ingested rows, streamed requests have TTFT):
- sample_logs/prefix-cache-on → prefix-cache-off: 40 a side, TTFT median 41 ms → 840 ms (×20), p90 111 ms → 1.86 s.
- sample_logs/steady-a ↔ steady-b: the same steady load twice, 50 a side; TTFT medians 52 / 38 ms, p90 161 / 164 ms.
- sample_logs/steady-a → burst: 50 vs 58; TTFT median 52 ms → 1.60 s (×31): 40 requests at once into 2 slots.
- real-engine poisson → burst50 (llama.cpp + vLLM): 120 vs 100; TTFT median 112 ms → 4.79 s (×43).
- sample_logs/reasoning-none → max-tokens: the same tiny model and prompt lengths (20–76 vs 19–101 tokens), the
  client capping 70% of requests at max_tokens 24: length finishes 2/40 (5%) → 22/50 (44%).
"""

from __future__ import annotations

import pytest

from servlens.cli import cli
from servlens.compare.engine import compare_runs, exit_code
from servlens.store.schema import open_store

SAMPLES = ("prefix-cache-on", "prefix-cache-off", "steady-a", "steady-b", "burst", "max-tokens", "reasoning-none",
           "reasoning-deepseek")
ENGINES = "tests/data/shared/real-engine"


@pytest.fixture(scope="module")
def con():
    from servlens.ingest.api import ingest_inputs

    con = open_store(None)
    for name in SAMPLES:
        ingest_inputs(con, [f"sample_logs/{name}"], run=name)
    # both engines' logs: runs poisson, burst50, prefix_cache, … from the recorded run field
    ingest_inputs(con, [f"{ENGINES}/llamacpp/requests.jsonl", f"{ENGINES}/vllm-cpu/requests.jsonl"])
    yield con
    con.close()


def _gates(doc):
    return {g["id"]: g for g in doc["gates"]}


def test_prefix_cache_turned_off_fails_on_ttft(con):
    doc = compare_runs(con, "prefix-cache-on", "prefix-cache-off", seed=1)
    assert exit_code(doc) == 1
    gates = _gates(doc)
    p50, p99 = gates["ttft_p50"], gates["ttft_p99"]
    assert p50["verdict"] == "fail" and p50["ratio"] > 5 and p50["ci_low"] > 1
    # 38 streamed requests a side: p99 cannot be judged, p70 (11 beyond it) is, and the verdict names it
    assert p99["judged_at"] == "p70" and p99["verdict"] == "fail"
    assert p99["rollback_criterion"].startswith(
        "roll back: TTFT p99 cannot be judged with 38 requests a side; TTFT p70 (covariate-adjusted over 1 cohort) "
        "rose ×")
    assert p99["p_value_holm"] <= 0.05 and p99["ci_low"] > 1.1


def test_prefix_cache_turned_on_does_not_fail(con):
    doc = compare_runs(con, "prefix-cache-off", "prefix-cache-on", seed=1)
    assert exit_code(doc) != 1
    gates = _gates(doc)
    assert gates["ttft_p50"]["improved"] and gates["ttft_p50"]["ratio"] < 0.2
    assert not [g for g in doc["gates"] if g["verdict"] == "fail"]


@pytest.mark.parametrize("before, after", [("steady-a", "steady-b"), ("steady-b", "steady-a")])
def test_the_same_steady_load_twice_never_fails(con, before, after):
    doc = compare_runs(con, before, after, seed=1)
    assert exit_code(doc) in (0, 3)
    assert not [g for g in doc["gates"] if g["verdict"] == "fail"]
    # bands were merged so the runs could be compared at all (50 requests over five log2 prompt bands)
    assert "TTFT: tiny / 16–511 prompt tokens: 5 prompt bands merged" in doc["merged_bands"]
    assert _gates(doc)["ttft_p50"]["change"] is not None


def test_a_burst_fails_and_the_way_back_does_not(con):
    doc = compare_runs(con, "steady-a", "burst", seed=1)
    assert exit_code(doc) == 1
    p99 = _gates(doc)["ttft_p99"]
    assert p99["verdict"] == "fail" and p99["judged_at"] == "p75" and p99["ratio"] > 5
    back = compare_runs(con, "burst", "steady-a", seed=1)
    assert exit_code(back) != 1


def test_both_engines_poisson_then_burst_fails(con):
    doc = compare_runs(con, "poisson", "burst50", seed=1)
    assert exit_code(doc) == 1
    gates = _gates(doc)
    assert gates["ttft_p50"]["verdict"] == "fail" and gates["ttft_p50"]["ratio"] > 5


def test_a_length_finish_jump_fails(con):
    doc = compare_runs(con, "reasoning-none", "max-tokens", seed=1)
    assert exit_code(doc) == 1
    length = _gates(doc)["length_rate_rate"]
    assert (length["events_before"], length["n_before"], length["events_after"], length["n_after"]) == (2, 40, 22, 50)
    assert length["verdict"] == "fail" and length["change_low"] > 0.01
    assert doc["reason"].startswith("1 gate failed: roll back: length-finish rate")


def test_a_reasoning_parser_change_is_not_a_ttft_regression(con):
    """reasoning-none → deepseek: content now arrives after the thought. TTFT is first output of any kind, so it
    does not move by construction; first content is its own gate (too few streamed requests here to judge)."""
    doc = compare_runs(con, "reasoning-none", "reasoning-deepseek", seed=1)
    assert exit_code(doc) != 1
    ttft = con.execute("""SELECT count(*) FILTER (WHERE ttft_s > first_content_s) FROM requests
                          WHERE run IN ('reasoning-none', 'reasoning-deepseek')""").fetchone()[0]
    assert ttft == 0
    assert "first_content_p50" in _gates(doc)


def test_the_cli_exit_codes_on_recorded_runs(cli_runner):
    result = cli_runner.invoke(cli, ["compare", "sample_logs/prefix-cache-on", "sample_logs/prefix-cache-off"],
                               catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("servlens compare: FAIL (exit 1)")
    result = cli_runner.invoke(cli, ["compare", "sample_logs/steady-a", "sample_logs/steady-b"],
                               catch_exceptions=False)
    assert result.exit_code in (0, 3), result.output


def test_the_canary_policy_passes_the_cache_coming_back(con):
    """The README's pass: prefix cache off → on, 40 a side, under docs/canary-policy.toml (×2 and +10 points)."""
    from servlens.compare.policy import load_policy

    policy = load_policy("docs/canary-policy.toml")
    doc = compare_runs(con, "prefix-cache-off", "prefix-cache-on", policy, seed=1)
    assert exit_code(doc) == 0, doc["reason"]
    assert doc["reason"] == "All 2 critical gates pass."
    back = compare_runs(con, "prefix-cache-on", "prefix-cache-off", policy, seed=1)
    assert exit_code(back) == 1


GATEWAY = "tests/data/recorded"


@pytest.mark.skipif(not __import__("pathlib").Path(f"{GATEWAY}/gw-dead-fallback").is_dir(),
                    reason="the recorded gateway runs (tests/data/recorded/) are not in this checkout")
def test_a_gateway_whose_primary_dies_fails_on_errors():
    """LiteLLM in front of llama.cpp: gw-healthy (40 attempts, no failure) → gw-dead-fallback (primary killed at 7 s:
    33 of 45 attempts on group 'chat' failed; the client saw 7 of 45 requests fail). Failed attempts carry no token
    counts and fallbacks land on another model name, so no latency cohort matches; the error-rate gate bands those
    failures by model only and decides on its own. The way back does not fail."""
    from servlens.ingest.api import ingest_inputs

    con = open_store(None)
    try:
        ingest_inputs(con, [f"{GATEWAY}/gw-healthy/litellm_slp.jsonl"], run="healthy")
        ingest_inputs(con, [f"{GATEWAY}/gw-dead-fallback/litellm_slp.jsonl"], run="dead")
        doc = compare_runs(con, "healthy", "dead", seed=1)
        back = compare_runs(con, "dead", "healthy", seed=1)
    finally:
        con.close()
    assert exit_code(back) != 1
    assert exit_code(doc) == 1
    err = _gates(doc)["error_rate_rate"]
    assert (err["events_before"], err["n_before"], err["events_after"], err["n_after"]) == (0, 40, 33, 45)
    assert err["verdict"] == "fail"


BUSY = "tests/data/busy-machine"


@pytest.mark.parametrize("pair", ["prefix-1", "prefix-3"])
def test_a_busy_machines_cache_fall_is_shown(pair):
    """tests/data/busy-machine: the load drifted through both runs and the after run started cold. Its records
    decide the question — the engine served no prefix from cache before and most of it after, and the after run's
    p75 TTFT is below the before run's p25 — so TTFT p50's interval must exclude no change and the gate pass."""
    from pathlib import Path

    from servlens.ingest.api import ingest_inputs
    from tests.e2e.records import ttfts_and_cache_hits

    before, before_cached = ttfts_and_cache_hits(Path(BUSY, pair), "prefix_nocache")
    after, after_cached = ttfts_and_cache_hits(Path(BUSY, pair), "prefix_cache")
    assert not any(before_cached) and sorted(after_cached)[len(after_cached) // 2] > 0
    assert after[3 * len(after) // 4] < before[len(before) // 4]
    con = open_store(None)
    for run in ("prefix_nocache", "prefix_cache"):
        ingest_inputs(con, [f"{BUSY}/{pair}/{run}/requests.jsonl"], run=run)
    doc = compare_runs(con, "prefix_nocache", "prefix_cache", seed=1)
    p50 = _gates(doc)["ttft_p50"]
    assert p50["ci_high"] < 1 and p50["verdict"] == "pass" and p50["improved"], p50
    # ten batches of four: a run's Woodruff interval alone would reach its most extreme request
    assert p50["interval_method"] == "woodruff+scale_shift"
    assert exit_code(doc) != 1
