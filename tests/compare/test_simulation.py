"""The statistics measured by simulation (seeded): A/A false-fail rate, power, on real and modelled data.

DESIGN.md ("Compare gates") records what a correct gate does here: A/A never fails; ×1.15 on TTFT fails about 58%
at 3k requests a side and 75% at 5k; ×1.3 fails 95% at 3k. docs/compare.md has the full table and the command
that reproduces it (python -m servlens.compare.simulate).
"""

from __future__ import annotations

import pytest

from servlens.compare import simulate


@pytest.mark.slow
def test_aa_lognormal_never_fails_more_than_nominal():
    result = simulate.run_aa_lognormal(3000, trials=40, seed=11)
    assert result["overall"]["fail"] <= 0.05
    assert result["any_gate_fail"] <= 0.05
    assert result["ttft_p99"]["pass"] + result["ttft_p99"]["inconclusive"] >= 0.95


@pytest.mark.slow
def test_aa_on_the_real_azure_trace_split_in_two():
    result = simulate.run_aa_azure(trials=20, seed=12)
    assert result["any_gate_fail"] <= 0.05
    assert result["overall"]["fail"] == 0.0


@pytest.mark.slow
def test_aa_on_real_engine_latencies_resampled():
    result = simulate.run_aa_engine(3000, trials=20, seed=13)
    assert result["pool"] >= 250                      # every successful request recorded from both engines
    assert result["any_gate_fail"] <= 0.05
    assert result["overall"]["fail"] == 0.0


@pytest.mark.slow
def test_power_at_1_15_and_1_3():
    at_5k = simulate.run_power(5000, 1.15, trials=40, seed=14)
    assert at_5k["ttft_p99"]["fail"] >= 0.5           # DESIGN.md: 75% at 5k; measured 65% (60 trials)
    assert at_5k["ttft_p99"]["pass"] == 0.0           # a real 15% regression never passes
    at_3k = simulate.run_power(3000, 1.3, trials=30, seed=15)
    assert at_3k["ttft_p99"]["fail"] >= 0.8           # DESIGN.md: 95% at 3k; measured 92% (60 trials)


def test_thin_data_is_inconclusive_not_pass():
    doc = simulate.run_thin(seed=16)
    assert doc["verdict"] == "inconclusive"
    assert all(g["verdict"] == "inconclusive" for g in doc["gates"])


def test_mix_shift_scenario_reports_the_shift():
    doc = simulate.run_mix_shift(5000, seed=17)
    assert doc["mix_shift"]["significant"] is True
    rows = {r["gate"]: r for r in doc["mix_shift"]["naive_vs_adjusted"]}
    assert rows["TTFT p99"]["naive_change"] > 0.5
    assert abs(rows["TTFT p99"]["adjusted_change"]) < 0.1
    assert doc["verdict"] != "fail"
