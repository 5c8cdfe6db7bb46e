"""compare on real engine output: vLLM `bench serve --save-detailed` runs (CPU build), ingested through the API."""

from __future__ import annotations

import pytest

from servlens.compare.engine import compare_runs
from servlens.compare.policy import load_policy
from servlens.store.schema import open_store

BENCH = "tests/data/shared/real-engine/vllm-bench"


@pytest.fixture(scope="module")
def doc():
    from servlens.ingest.api import ingest_inputs

    con = open_store(None)
    ingest_inputs(con, [f"{BENCH}/random/random-3.0qps-tiny-20261129-081458.json"], run="poisson")
    ingest_inputs(con, [f"{BENCH}/random_burstiness0.5/random_burstiness0.5-3.0qps-tiny-20261129-081612.json"],
                  run="bursty")
    yield compare_runs(con, "poisson", "bursty", load_policy(), seed=1)
    con.close()


def test_eighty_real_requests_a_side_are_inconclusive_with_reasons(doc):
    assert doc["before"]["requests"] == doc["after"]["requests"] == 80
    assert doc["verdict"] == "inconclusive"
    gates = {g["id"]: g for g in doc["gates"]}
    assert gates["ttft_p99"]["reason"] == ("too few requests for TTFT p99: it needs at least 1000 per side in "
                                           "compared cohorts (before has 80, after 80)")
    assert gates["error_rate_rate"]["reason"] == ("too few requests for the error rate: it needs at least 100 per "
                                                  "side in compared cohorts (before has 80, after 80)")
    # vllm bench records no finish reason: not evaluable, never a pass
    assert gates["length_rate_rate"]["reason"] == "the before and after runs cannot tell the length-finish rate"


def test_the_median_effects_are_estimated_with_intervals(doc):
    gates = {g["id"]: g for g in doc["gates"]}
    for gate_id in ("ttft_p50", "tpot_p50"):
        g = gates[gate_id]
        assert g["n_before"] == g["n_after"] == 80
        assert g["ci_low"] <= g["ratio"] <= g["ci_high"]
        assert g["verdict"] == "pass" and g["change_high"] < 0     # measured: both medians fell, significantly
    assert sorted(i["gate"] for i in doc["improvements"]) == ["TPOT p50", "TTFT p50"]
