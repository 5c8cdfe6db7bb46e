"""SL005-SL008 on real data: the recorded LiteLLM Router payloads (tests/data/gateways), the llama.cpp and vLLM runs
in tests/data/shared, the public traces, and two incidents recorded from llama.cpp by tools/engine/incidents.py
(tests/analysis/data/engine_incidents). Each dataset is ingested once through the normal ingest path; the expected
numbers are the ones those recordings show (their READMEs say what happened)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.store.schema import open_store
from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
GATEWAYS = REPO / "tests" / "data" / "gateways"
INCIDENTS = Path(__file__).parent / "data" / "engine_incidents"
REAL = SHARED_DATA / "real-engine"
MINE = ("SL005", "SL006", "SL007", "SL008")


def _analyze(*paths, run: str | None = None) -> dict:
    con = open_store(None)
    try:
        ingest_paths(con, [str(p) for p in paths], run=run)
        return analyze(con, [r for r in load_rules() if r.id in MINE])
    finally:
        con.close()


def _finding(doc: dict, rule: str, run: str, **scope) -> dict:
    found = [f for f in doc["findings"] if f["rule"] == rule and f["scope"]["run"] == run
             and all(f["scope"].get(k) == v for k, v in scope.items())]
    assert len(found) == 1, [f["scope"] for f in doc["findings"] if f["rule"] == rule]
    return found[0]


@pytest.fixture(scope="module")
def incidents() -> dict:
    return _analyze(INCIDENTS)


@pytest.fixture(scope="module")
def llamacpp() -> dict:
    return _analyze(REAL / "llamacpp")


@pytest.fixture(scope="module")
def litellm() -> dict:
    return _analyze(GATEWAYS / "litellm_slp_recorded.jsonl", run="slp")


# --- SL005 ---------------------------------------------------------------------------------------------------------

def test_sl005_recorded_router_dead_primary_in_the_pool(litellm):
    f = _finding(litellm, "SL005", "slp", model="chat-primary")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and m["problem"] == "dead endpoint in the fallback pool"
    # 4 attempts to the dead port (2 client requests x first try + 1 retry), all 500 connection refused.
    assert (m["attempts_here"], m["attempts_failed_share"], m["traces_answered_elsewhere"]) == (4, 1.0, 2)
    # The backup answered 2.67 s and 2.48 s after the first try (LiteLLM's retry backoff): p50 2.577 s.
    assert m["added_latency_p50_s"] == pytest.approx(2.577, abs=0.001)
    assert m["added_latency_max_s"] == pytest.approx(2.672, abs=0.001)
    assert [e["line"] for e in f["examples"]] == [3, 4, 6, 7]
    assert "allowed_fails" in f["remediation"]
    rows = f["evidence"]["table"]["rows"]
    assert [(r[1], r[2], r[7]) for r in rows[:3]] == [(1, "chat-primary", "error"), (2, "chat-primary", "error"),
                                                    (3, "chat-backup", "ok")]


def test_sl005_recorded_router_backup_and_keyed_group_are_clear(litellm):
    backup = _finding(litellm, "SL005", "slp", model="chat-backup")
    assert backup["state"] == "clear"
    assert backup["evidence"]["metrics"]["fallbacks_in"] == 2
    assert backup["evidence"]["metrics"]["fallbacks_smaller_cap"] == 0   # max_tokens 10 asked, 10 given
    assert _finding(litellm, "SL005", "slp", model="chat-keyed")["summary"].endswith(
        "no request fell back to or from this scope.")


def test_sl005_litellm_otel_spans_cannot_show_fallbacks():
    doc = _analyze(GATEWAYS / "otel_litellm_recorded.jsonl", run="otel")
    states = {f["scope"]["model"]: (f["state"], f["reason"]) for f in doc["findings"] if f["rule"] == "SL005"}
    assert set(states) == {"chat-primary", "chat-backup", "chat-keyed"}
    for state, reason in states.values():
        assert state == "not_evaluable"
        assert reason.startswith("2 attempt(s) failed in this run, but every trace_id has one attempt")


def test_sl005_engine_logs_have_no_traces(llamacpp):
    f = _finding(llamacpp, "SL005", "poisson")
    assert f["state"] == "not_evaluable" and "missing trace_id" in f["reason"]


# --- SL006 ---------------------------------------------------------------------------------------------------------

def test_sl006_restart_mid_run_fires(incidents):
    f = _finding(incidents, "SL006", "restart")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired"
    assert m["restarts_in_metrics"] == 1 and m["start_kind"] == "restart (counter reset of 7 series)"
    raw = [json.loads(line) for line in _zst_lines(INCIDENTS / "restart" / "requests.jsonl.zst")]
    failed = [r for r in raw if r["http_status"] is None]
    assert m["early_errors"] == len(failed) == 22
    assert m["error_kinds"] == "no HTTP response" and m["never_ready"] is False
    assert m["time_to_first_success_s"] == pytest.approx(4.416, abs=0.001)
    assert len(f["examples"]) == 5


def test_sl006_clear_without_restart_and_client_errors_do_not_count(incidents, llamacpp):
    assert _finding(incidents, "SL006", "hol")["state"] == "clear"
    poisson = _finding(llamacpp, "SL006", "poisson")
    # 4 requests got HTTP 400 exceed_context_size_error right from the start: client errors, not readiness.
    assert poisson["state"] == "clear"
    assert "no readiness error came before the first successes" in poisson["summary"]


def test_sl006_recorded_router_dead_port_never_ready(litellm):
    f = _finding(litellm, "SL006", "slp", model="chat-primary")
    assert f["state"] == "fired" and f["evidence"]["metrics"]["never_ready"] is True
    assert "never became ready (500)" in f["summary"]


def test_sl006_traces_without_outcomes_are_not_evaluable_burstgpt_is_judged():
    doc = _analyze(SHARED_DATA / "traces")
    states = {f["scope"]["run"]: f["state"] for f in doc["findings"] if f["rule"] == "SL006"}
    assert states["mooncake_fast25_synthetic_trace"] == "not_evaluable"
    assert states["azure_llm_2023_conv_first5000"] == "not_evaluable"
    assert states["burstgpt_v1_first400rows"] == "clear"   # its 17 failures are not clustered at the start
    for rule in ("SL007", "SL008"):
        assert {f["state"] for f in doc["findings"] if f["rule"] == rule} == {"not_evaluable"}


def _zst_lines(path: Path) -> list[str]:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=50_000_000).decode().splitlines()


# --- SL007 ---------------------------------------------------------------------------------------------------------

def test_sl007_cold_prefix_cache_after_start_and_restart(incidents):
    f = _finding(incidents, "SL007", "restart")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and m["cold_starts"] == 2 and m["restarts_in_metrics"] == 1
    assert m["cause"].startswith("a cold prefix cache")
    assert m["slow_first_cached_share"] == 0.0 and m["steady_cached_share"] > 0.9
    assert m["first_max_s"] == pytest.approx(1.034, abs=0.001)
    assert len(f["evidence"]["windows"]) == 2


def test_sl007_on_the_shared_llamacpp_runs(llamacpp):
    fresh = _finding(llamacpp, "SL007", "fresh_cache")
    assert fresh["state"] == "fired"
    assert fresh["evidence"]["metrics"]["first_max_s"] == pytest.approx(0.559, abs=0.001)
    assert fresh["evidence"]["metrics"]["slow_first_requests"] == 2        # each of the 2 slots' first request
    # 11 steady requests, none past the line: q = 1/12; P(2 or more of 5) = 0.0586, not significant alone ...
    q = 1 / 12
    assert fresh["evidence"]["metrics"]["p_value"] == pytest.approx(1 - (1 - q) ** 5 - 5 * q * (1 - q) ** 4, abs=1e-6)
    assert fresh["evidence"]["metrics"]["cause"].startswith("a cold prefix cache")  # ... the measured cause fires it
    assert _finding(llamacpp, "SL007", "fresh_nocache")["state"] == "clear"  # slow from first to last: no cache
    assert _finding(llamacpp, "SL007", "burst50")["state"] == "clear"        # the burst waits; prefill is not cold
    poisson = _finding(llamacpp, "SL007", "poisson")
    assert poisson["state"] == "clear" and "p99 of" in poisson["summary"]


def test_sl007_heavy_tailed_gateway_day_has_no_false_cold_start():
    # A day of gateway traffic (sample_logs/gateway-day, benchmark generator): TTFT has a heavy tail, so a first
    # request past the steady p90 happens by chance; only a binomial test or a measured cause may fire the rule.
    doc = _analyze(REPO / "sample_logs" / "gateway-day")
    states = [f["state"] for f in doc["findings"] if f["rule"] == "SL007"]
    assert len(states) == 8 and set(states) == {"clear"}


def test_sl007_vllm_prefix_cache_run_starts_cold():
    doc = _analyze(REAL / "vllm-cpu")
    f = _finding(doc, "SL007", "prefix_cache")
    assert f["state"] == "fired" and f["evidence"]["metrics"]["cause"].startswith("a cold prefix cache")
    assert _finding(doc, "SL007", "noprefixcaching_nocache")["state"] == "clear"


# --- SL008 ---------------------------------------------------------------------------------------------------------

def test_sl008_long_documents_hold_short_chat_back(incidents):
    f = _finding(incidents, "SL008", "hol")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired"
    assert (m["long_requests"], m["short_exposed"], m["short_not_exposed"]) == (12, 14, 46)
    assert m["short_ttft_p50_exposed_s"] == pytest.approx(0.4467, abs=0.0001)
    assert m["short_ttft_p50_not_exposed_s"] == pytest.approx(0.0096, abs=0.0001)
    assert m["bands_worse_when_exposed"] == m["bands_compared"] == 2
    assert m["p_value"] < 1e-6
    assert f["evidence"]["chart"]["type"] == "bar"


def test_sl008_restart_run_has_no_long_prompts(incidents):
    f = _finding(incidents, "SL008", "restart")
    assert f["state"] == "clear" and f["summary"].startswith("No long prompts to hold others back")


def test_sl008_mixed_sample_log_fires():
    doc = _analyze(REPO / "sample_logs" / "mixed")
    f = _finding(doc, "SL008", "mixed")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired" and m["short_exposed"] == 11 and m["p_value"] < 1e-4
    assert m["short_ttft_p50_exposed_s"] > 10 * m["short_ttft_p50_not_exposed_s"]


def test_sl008_rank_test_matches_scipy_with_ties():
    """The rule's own SQL (rank sums with mid-ranks, tie-corrected normal approximation) against scipy."""
    from scipy.stats import mannwhitneyu

    from servlens.analysis.rule_sql import prepare
    from servlens.analysis.sql_functions import register

    rule = next(r for r in load_rules() if r.id == "SL008")
    params = {name: param.default for name, param in rule.params.items()}
    exposed = [0.35, 0.2, 0.2, 0.05, 0.9, 0.012]
    clear = [0.01, 0.012, 0.012, 0.2, 0.03, 0.011, 0.05, 0.02, 0.015, 0.3]
    con = open_store(None)
    try:
        register(con)
        values = ", ".join([f"(TRUE, {v})" for v in exposed] + [f"(FALSE, {v})" for v in clear])
        # The views the detector reads, holding just the short requests' TTFTs (one band, nothing long).
        con.execute(f"""CREATE TEMP VIEW hol_short AS SELECT exposed, ttft_s, 4 AS band, 0.0 AS queue_s
                        FROM (VALUES {values}) AS t(exposed, ttft_s)""")
        con.execute("CREATE TEMP VIEW hol_ok AS SELECT ttft_s FROM hol_short")
        con.execute("CREATE TEMP VIEW hol_cut AS SELECT 20.0 AS p50, 80.0 AS long_min")
        con.execute("CREATE TEMP VIEW hol_long AS SELECT 1 AS lid WHERE FALSE")
        p_value = con.execute(f"SELECT p_value FROM ({prepare(rule.sql, params)})").fetchone()[0]
        expected = mannwhitneyu(exposed, clear, alternative="greater", method="asymptotic", use_continuity=True).pvalue
        assert p_value == pytest.approx(expected, rel=1e-9)
    finally:
        con.close()
