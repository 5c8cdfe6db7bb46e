"""compare on real engine output: vLLM `bench serve --save-detailed` runs (CPU build), ingested through the API.

Measured on these files (duckdb over the ingested rows): 80 requests a side, no errors, no finish reasons; TTFT
median 103 ms (Poisson arrivals) vs 55 ms (burstiness 0.5), TPOT median 12.0 ms vs 10.3 ms.
"""

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


def test_eighty_real_requests_a_side_judge_the_tail_they_support(doc):
    assert doc["before"]["requests"] == doc["after"]["requests"] == 80
    gates = {g["id"]: g for g in doc["gates"]}
    p99 = gates["ttft_p99"]
    assert p99["judged_at"] == "p85"
    assert p99["thin_tail"].startswith("TTFT p99 cannot be judged with 80 requests a side; TTFT p85 is the highest")
    # nothing failed, but the critical gates are not shown within tolerance at 80 a side: inconclusive, not pass
    assert not [g for g in doc["gates"] if g["verdict"] == "fail"]
    assert doc["verdict"] == "inconclusive"
    err = gates["error_rate_rate"]
    assert (err["events_before"], err["events_after"]) == (0, 0)
    assert err["verdict"] == "inconclusive" and err["requests_needed"] > 80
    assert "requests a side would detect the +0.5 pp tolerance" in err["rollback_criterion"]
    # vllm bench records no finish reason: not evaluable, never a pass
    assert gates["length_rate_rate"]["reason"] == "the before and after runs cannot tell the length-finish rate"


def test_the_median_effects_are_estimated_with_intervals(doc):
    gates = {g["id"]: g for g in doc["gates"]}
    for gate_id in ("ttft_p50", "tpot_p50"):
        g = gates[gate_id]
        assert g["n_before"] == g["n_after"] == 80
        assert g["ci_low"] <= g["ratio"] <= g["ci_high"]
        assert g["adjustment"]["headline"] == "covariate-adjusted"
        assert g["naive"]["ratio"] < 1 and g["mix_adjusted"]["ratio"] < 1
    tpot = gates["tpot_p50"]
    assert tpot["verdict"] == "pass" and tpot["change_high"] < 0     # measured: TPOT fell, significantly
    assert [i["gate"] for i in doc["improvements"]] == ["TPOT p50"]
