"""compare_runs end to end on canonical rows: verdicts, reasons, rollback sentences, coverage, mix shift, shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servlens.compare.engine import compare_runs, exit_code
from servlens.compare.policy import Gate, Policy, load_policy
from tools.compare_simulation import arrivals, chat_tokens, insert_requests, latency_model
from servlens.errors import ConfigError, InputError
from servlens.store.schema import open_store


@pytest.fixture
def con():
    con = open_store(None)
    yield con
    con.close()


def add_run(con, run, n, seed, ttft_scale=1.0, model="qwen3-8b", error_rate=0.0, long_share=0.05, drop=()):
    rng = np.random.default_rng(seed)
    prompt, output = chat_tokens(rng, n, long_share=long_share)
    cols = {"model": np.full(n, model, dtype=object), "prompt_tokens": prompt, "completion_tokens": output,
            "finish_reason": np.full(n, "stop", dtype=object), "t_arrival": arrivals(n)}
    cols.update(latency_model(rng, prompt, output, ttft_scale))
    errors = rng.random(n) < error_rate
    cols["status"] = np.where(errors, "error", "ok").astype(object)
    for name in drop:
        cols.pop(name)
    insert_requests(con, run, cols)


FAST = load_policy()


def gate(doc, gate_id):
    return next(g for g in doc["gates"] if g["id"] == gate_id)


def test_identical_large_runs_pass(con):
    add_run(con, "before", 20000, 1)
    add_run(con, "after", 20000, 2)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "pass", doc["reason"]
    assert exit_code(doc) == 0
    assert doc["reason"] == "All 2 critical gates pass."
    p99 = gate(doc, "ttft_p99")
    assert p99["verdict"] == "pass"
    assert p99["ci_low"] < 1 < p99["ci_high"]
    assert p99["rollback_criterion"].startswith("keep: TTFT p99 (covariate-adjusted over ")
    assert "within the +10% tolerance" in p99["rollback_criterion"]
    assert doc["coverage"]["sufficient"] is True
    assert doc["mix_shift"]["significant"] is False


def test_the_same_compare_gives_the_same_document(con):
    """Seeded means byte for byte: the batch means sum the histogram cells in one order, whatever order DuckDB's
    threads answer the GROUP BY in (before, a p-value differed in its last digit in about a third of runs)."""
    add_run(con, "before", 20000, 1)
    add_run(con, "after", 20000, 2)
    con.execute("SET threads = 4")
    docs = []
    for _ in range(6):
        doc = compare_runs(con, "before", "after", FAST, seed=5)
        doc.pop("generated_at")
        docs.append(json.dumps(doc, sort_keys=True, default=str))
    assert len(set(docs)) == 1


def test_a_30_percent_slower_ttft_fails_with_a_rollback_sentence(con):
    add_run(con, "before", 5000, 1)
    add_run(con, "after", 5000, 2, ttft_scale=1.3)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "fail"
    assert exit_code(doc) == 1
    p99 = gate(doc, "ttft_p99")
    assert p99["verdict"] == "fail" and p99["significant"] is True
    assert p99["change_low"] > 0 and p99["change"] > 0.10
    assert p99["ci_low"] == pytest.approx(1 + p99["change_low"], rel=1e-5)
    text = p99["rollback_criterion"]
    assert text.startswith("roll back: TTFT p99 (covariate-adjusted over ")
    assert f"rose {p99['change'] * 100:.1f}%" in text and text.endswith("beyond the +10% tolerance")
    # TTFT p50 fails too: any gate that fails fails the release (Holm keeps the family-wise rate)
    assert gate(doc, "ttft_p50")["verdict"] == "fail"
    assert doc["reason"].startswith("2 gates failed: roll back: TTFT p50")
    # TPOT did not change: it passes, and e2e (dominated by decode) stays within tolerance
    assert gate(doc, "tpot_p50")["verdict"] == "pass"


def test_a_faster_release_is_reported_as_an_improvement(con):
    add_run(con, "before", 20000, 1)
    add_run(con, "after", 20000, 2, ttft_scale=0.7)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "pass"
    names = [i["gate"] for i in doc["improvements"]]
    assert "TTFT p50" in names and "TTFT p99" in names
    assert gate(doc, "ttft_p50")["rollback_criterion"].endswith("a clear improvement")


def test_thirty_requests_a_side_is_inconclusive_not_pass(con):
    add_run(con, "before", 30, 1)
    add_run(con, "after", 30, 2)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "inconclusive"
    assert exit_code(doc) == 3
    assert all(g["verdict"] != "pass" for g in doc["gates"] if g["critical"])


def test_a_thin_tail_is_judged_at_the_highest_quantile_the_data_supports(con):
    policy = Policy(gates=(Gate("ttft", "p99", 0.1, critical=True),), by=("model",))
    add_run(con, "before", 300, 1)
    add_run(con, "after", 300, 2, ttft_scale=3.0)
    doc = compare_runs(con, "before", "after", policy, seed=1)
    p99 = gate(doc, "ttft_p99")
    # 300 a side: p95 has 15 requests beyond it, p99 only 3
    assert p99["judged_at"] == "p95"
    assert p99["thin_tail"] == ("TTFT p99 cannot be judged with 300 requests a side; TTFT p95 is the highest "
                                "quantile with 10 requests beyond it on each side")
    assert p99["verdict"] == "fail"
    assert p99["rollback_criterion"].startswith(
        "roll back: TTFT p99 cannot be judged with 300 requests a side; TTFT p95 (covariate-adjusted over 1 "
        f"cohort) rose ×{p99['ratio']:.3g} (")
    assert doc["verdict"] == "fail"


def test_below_twenty_a_side_no_quantile_is_judged(con):
    policy = Policy(gates=(Gate("ttft", "p99", 0.1, critical=True),), by=("model",))
    add_run(con, "before", 15, 1)
    add_run(con, "after", 15, 2)
    doc = compare_runs(con, "before", "after", policy.__class__(gates=policy.gates, by=("model",),
                                                                  min_cohort_requests=10), seed=1)
    p99 = gate(doc, "ttft_p99")
    assert p99["verdict"] == "inconclusive" and p99["p_value"] is None
    assert p99["reason"] == "TTFT p99 cannot be judged with 15 requests a side: even the median needs 20 a side"


def test_a_metric_missing_on_one_side_is_inconclusive(con):
    add_run(con, "before", 5000, 1)
    add_run(con, "after", 5000, 2, drop=("ttft_s",))
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    p99 = gate(doc, "ttft_p99")
    assert p99["verdict"] == "inconclusive"
    assert p99["reason"] == "TTFT is not measured in the after run (no successful request has ttft_s)"
    assert doc["verdict"] == "inconclusive"
    assert "TTFT p99 cannot be judged: TTFT is not measured in the after run" in doc["reason"]


def test_different_models_only_is_inconclusive_with_an_explanation(con):
    add_run(con, "before", 2000, 1, model="llama-3-8b")
    add_run(con, "after", 2000, 2, model="qwen3-8b")
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "inconclusive"
    assert doc["reason"] == ("The runs share no model (before: llama-3-8b; after: qwen3-8b), so there are no matched "
                             "cohorts to compare; to compare across a model change, band without the model "
                             "(--by prompt_band)")
    assert doc["gates"] == []
    # banding without the model compares them
    doc = compare_runs(con, "before", "after", FAST.with_by(("prompt_band",)), seed=1)
    assert doc["gates"] and doc["coverage"]["by"] == ["prompt_band"]


def test_no_overlapping_cohorts(con):
    rng = np.random.default_rng(0)
    for run, prompt in (("before", 100), ("after", 5000)):
        n = 500
        insert_requests(con, run, {"model": np.full(n, "m", dtype=object), "prompt_tokens": np.full(n, prompt),
                                   "ttft_s": rng.lognormal(0, 0.5, n), "status": np.full(n, "ok", dtype=object)})
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    assert doc["verdict"] == "inconclusive"
    assert doc["reason"] == ("No cohort (model × prompt_band) has at least 30 requests in both runs, even with every "
                             "band merged, so nothing can be compared like for like")
    assert doc["coverage"]["before_only"] == ["m / 64–127 prompt tokens"]
    assert doc["coverage"]["after_only"] == ["m / 4096–8191 prompt tokens"]


def test_unknown_run_and_same_run_are_usage_errors(con):
    add_run(con, "before", 100, 1)
    with pytest.raises(InputError) as err:
        compare_runs(con, "before", "canary", FAST)
    assert str(err.value) == ("The store has no requests for run 'canary' (runs with requests: before). Check the run "
                              "label with 'servlens runs', or ingest the run first.")
    with pytest.raises(ConfigError, match="Before and after are the same run"):
        compare_runs(con, "before", "before", FAST)


def test_error_rate_gate_fails_on_a_real_increase(con):
    add_run(con, "before", 20000, 1, error_rate=0.01)
    add_run(con, "after", 20000, 2, error_rate=0.03)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    err = gate(doc, "error_rate_rate")
    assert err["verdict"] == "fail"
    assert err["diff"] == pytest.approx(err["after"] - err["before"], abs=1e-6)
    assert err["change_low"] > 0.005 or err["change"] > 0.005
    assert err["rollback_criterion"].startswith("roll back: error rate (mix-adjusted over ")
    assert "pp" in err["rollback_criterion"] and err["rollback_criterion"].endswith("beyond the +0.5 pp tolerance")
    assert doc["verdict"] == "fail"


def test_failed_requests_without_token_counts_band_rates_by_model_only(con):
    add_run(con, "before", 5000, 1)
    insert_requests(con, "after", {"model": np.full(200, "qwen3-8b", dtype=object),
                                   "status": np.full(200, "error", dtype=object)})
    add_run(con, "after", 5000, 2)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    err = gate(doc, "error_rate_rate")
    assert err["by"] == ["model"]
    assert err["verdict"] == "fail"          # 0% -> 3.8%: not hidden in an 'unknown length' band
    assert any("error rate: 200 of the counted events have no prompt token count" in n for n in doc["notes"])


def test_mix_shift_is_adjusted_away_and_reported(con):
    """5% → 30% long prompts, identical per-request latency: naive p99 moves a lot, the adjusted verdict passes."""
    add_run(con, "before", 50000, 1, long_share=0.05)
    add_run(con, "after", 50000, 2, long_share=0.30)
    policy = Policy(gates=(Gate("ttft", "p50", 0.10), Gate("ttft", "p90", 0.10), Gate("ttft", "p99", 0.10,
                                                                                        critical=True)))
    doc = compare_runs(con, "before", "after", policy, seed=1)
    rows = {r["gate"]: r for r in doc["mix_shift"]["naive_vs_adjusted"]}
    assert rows["TTFT p99"]["naive_change"] > 0.4
    assert rows["TTFT p90"]["naive_change"] > 0.4
    for name in ("TTFT p50", "TTFT p90", "TTFT p99"):
        assert abs(rows[name]["adjusted_change"]) < 0.05, rows[name]
    assert doc["mix_shift"]["significant"] is True
    assert doc["mix_shift"]["summary"].startswith("The cohort mix shifted (total variation ")
    assert gate(doc, "ttft_p99")["verdict"] == "pass"
    assert doc["verdict"] == "pass"


def test_per_cohort_gates_run_holm_over_every_cohort(con):
    policy = Policy(gates=(Gate("ttft", "p50", 0.10, critical=True, per_cohort=True),))
    add_run(con, "before", 5000, 1)
    add_run(con, "after", 5000, 2)
    doc = compare_runs(con, "before", "after", policy, seed=1)
    cohorts = [g["cohort"] for g in doc["gates"]]
    assert len(cohorts) >= 3 and all(c.startswith("qwen3-8b / ") for c in cohorts)
    assert all(g["per_cohort"] for g in doc["gates"])
    m = len(doc["gates"])
    assert all(g["rule"].startswith(f"Roll back if TTFT p50 in cohort {g['cohort']} is significantly higher "
                                    f"than before (Holm over {m} gates") for g in doc["gates"])
    assert min(g["confidence"] for g in doc["gates"]) == pytest.approx(1 - 0.05 / m, rel=1e-4)


def test_document_shape_is_stable_and_bounded(con):
    add_run(con, "before", 3000, 1)
    add_run(con, "after", 3000, 2)
    doc = compare_runs(con, "before", "after", FAST, seed=7)
    again = compare_runs(con, "before", "after", FAST, seed=7)
    doc.pop("generated_at"), again.pop("generated_at")
    assert doc == again                                    # seeded: identical
    json.dumps(doc)                                        # plain JSON types only
    assert doc["kind"] == "compare" and doc["schema_version"] == 2
    for key in ("verdict", "reason", "before", "after", "policy", "method", "coverage", "mix_shift", "gates",
                "improvements", "cohorts", "merged_bands", "notes"):
        assert key in doc
    for g in doc["gates"]:
        for key in ("metric", "statistic", "cohort", "before", "after", "ci_low", "ci_high", "tolerance",
                    "critical", "verdict", "rollback_criterion", "rule", "chart"):
            assert key in g
        assert ("ratio" in g) != ("diff" in g)
        chart = g["chart"]
        if chart:
            assert chart["type"] == ("cdf" if g["kind"] == "latency" else "bar")
            assert all(len(s["x"]) == len(s["y"]) <= 300 for s in chart["series"])
    p99 = gate(doc, "ttft_p99")
    ttft = p99["chart"]
    assert ttft["x_log"] is True and ttft["y_logit"] is True
    assert [s["name"] for s in ttft["series"]] == ["before", "after (mix-adjusted)"]
    assert ttft["hlines"] == [{"y": 0.99, "label": "p99", "style": "reference"}]
    assert ttft["vlines"] == [
        {"x": p99["before"], "label": f"before p99 {p99['before'] * 1000:.3g} ms", "style": "reference"},
        {"x": pytest.approx(p99["before"] * 1.1, rel=1e-5),
         "label": f"+10% tolerance {p99['before'] * 1100:.3g} ms", "style": "threshold"}]
    assert doc["cohorts"][0]["latency"]["ttft"]["before"]["p50"] > 0
    assert doc["method"]["binning_error"] == ("latencies binned on a log scale, bins 0.5% wide: each quantile "
                                              "within ±0.25%, each ratio within ±0.5%; latency intervals are widened by "
                                              "that bound")


def test_a_non_critical_metric_missing_on_one_side_is_inconclusive_too(con):
    """DESIGN.md Decisions: a gated metric missing on one side is exit 3, critical or not."""
    add_run(con, "before", 20000, 1)
    add_run(con, "after", 20000, 2, drop=("tpot_s",))
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    tpot = gate(doc, "tpot_p50")
    assert tpot["missing_side"] == "after" and not tpot["critical"]
    assert gate(doc, "ttft_p99")["verdict"] == "pass"
    assert doc["verdict"] == "inconclusive"
    assert doc["reason"] == ("A gated metric is missing on one side: hold: TPOT p50 cannot be judged: TPOT is not "
                             "measured in the after run (no successful request has tpot_s).")


def test_many_per_cohort_gates_can_still_fail(con):
    """Dozens of cohort gates: Holm's first level is tiny; a 50% slowdown still fails the large cohorts, and the
    Holm-adjusted p-values agree with the intervals (p-values are the intervals' inversion, not a resampling)."""
    policy = Policy(gates=(Gate("ttft", "p50", 0.10, critical=True, per_cohort=True),))
    for i in range(12):
        add_run(con, "before", 2000, 100 + i, model=f"model-{i:02d}")
        add_run(con, "after", 2000, 200 + i, model=f"model-{i:02d}", ttft_scale=1.5)
    doc = compare_runs(con, "before", "after", policy, seed=1)
    m = len(doc["gates"])
    assert m >= 36
    failed = [g for g in doc["gates"] if g["verdict"] == "fail"]
    assert len(failed) >= 24                     # every model's large cohorts
    assert all(g["p_value_holm"] <= 0.05 for g in failed)
    assert doc["verdict"] == "fail"


def test_gate_chart_is_the_cdf_of_the_histograms():
    """The before series is the run's empirical CDF: with few distinct values, every value is a point and its
    share is exact; the after series is re-weighted to the before run's cohort mix."""
    from servlens.compare.engine import _cdf_points
    from servlens.compare.stats import bin_values

    bins = np.array([-10**6, 0, 100, 200])          # the zero bin, then values 1.0, 1.65, 2.72 s (bin midpoints)
    values = bin_values(bins)
    counts = np.array([[1, 3, 0, 6],                 # cohort A: 10 requests
                       [0, 0, 4, 0]])                # cohort B: 4 requests
    x, y = _cdf_points(counts, np.array([0.5, 0.5]), values)
    # the zero bin counts in the shares (5% of A's half) but has no place on a log axis
    assert x == [round(values[1], 5), round(values[2], 5), round(values[3], 5)]
    assert y == [pytest.approx(0.2), pytest.approx(0.7), 1.0]
    x, y = _cdf_points(counts, np.array([1.0, 0.0]), values)
    assert y == [pytest.approx(0.4), 1.0] and len(x) == 2


def test_gate_chart_stays_bounded_and_keeps_the_tail():
    from servlens.compare.engine import CDF_MAX_POINTS, _cdf_points
    from servlens.compare.stats import bin_values

    rng = np.random.default_rng(3)
    bins = np.arange(-1500, 1500)
    counts = rng.integers(1, 50, size=(1, len(bins)))
    x, y = _cdf_points(counts, np.ones(1), bin_values(bins))
    assert len(x) <= CDF_MAX_POINTS and x == sorted(x) and y == sorted(y) and y[-1] == 1.0
    # every level the gates judge is within one level step of a drawn point
    for q, step in ((0.5, 0.01), (0.9, 0.005), (0.99, 0.0005), (0.999, 0.0001)):
        assert min(abs(v - q) for v in y) <= step, q


def test_zero_to_seventeen_percent_errors_at_fifty_a_side_fails(con):
    """Rates have no size floor: 0/50 → 9/50 failures spread over the run is decisive under Holm (exact intervals);
    the same failures in one burst widen the interval (batch-means design effect) and no longer decide."""
    def run(label, failed):
        status = np.full(50, "ok", dtype=object)
        status[failed] = "error"
        insert_requests(con, label, {"model": np.full(50, "m", dtype=object), "prompt_tokens": np.full(50, 300),
                                     "status": status, "t_arrival": arrivals(50)})
    run("before", [])
    run("spread", np.linspace(2, 47, 9).astype(int))
    run("burst", np.arange(20, 29))
    doc = compare_runs(con, "before", "spread", FAST, seed=1)
    err = gate(doc, "error_rate_rate")
    assert (err["events_before"], err["events_after"]) == (0, 9)
    assert err["verdict"] == "fail" and err["p_value_holm"] <= 0.05
    assert exit_code(doc) == 1
    clustered = gate(compare_runs(con, "before", "burst", FAST, seed=1), "error_rate_rate")
    assert clustered["design_effect"]["after"] > 2
    assert clustered["change_low"] < err["change_low"]


def test_a_sub_millisecond_change_cannot_fail(con):
    """min_change_ms: a queue p50 that doubles from 0.9 µs to 1.8 µs is significant and beyond tolerance, but moved
    far less than the 5 ms floor, so it is inconclusive, not a failure."""
    policy = Policy(gates=(Gate("queue", "p50", 0.10),))
    rng = np.random.default_rng(1)
    for label, scale in (("before", 0.9e-6), ("after", 1.8e-6)):
        insert_requests(con, label, {"model": np.full(2000, "m", dtype=object),
                                     "prompt_tokens": np.full(2000, 300), "status": np.full(2000, "ok", dtype=object),
                                     "queue_s": scale * np.exp(rng.normal(0, 0.3, 2000)), "t_arrival": arrivals(2000)})
    doc = compare_runs(con, "before", "after", policy, seed=1)
    q = gate(doc, "queue_p50")
    assert q["significant"] and q["change"] > 0.5
    assert q["verdict"] == "inconclusive"
    assert q["reason"].startswith("the change is significant and beyond the tolerance, but the quantile moved only")
    assert doc["verdict"] != "fail"


def test_advisory_gates_are_reported_but_never_fail(con):
    policy = Policy(gates=(Gate("ttft", "p50", 0.10, advisory=True), Gate("ttft", "p99", 0.10, critical=True)))
    add_run(con, "before", 3000, 1)
    add_run(con, "after", 3000, 2, ttft_scale=1.3)
    doc = compare_runs(con, "before", "after", policy, seed=1)
    p50 = gate(doc, "ttft_p50")
    assert p50["verdict"] == "fail" and p50["advisory"]
    assert p50["rollback_criterion"].startswith("note: TTFT p50")
    assert p50["rollback_criterion"].endswith("(advisory gate: reported, does not fail the release)")
    assert doc["reason"].startswith("1 gate failed: roll back: TTFT p99")


def test_the_headline_is_covariate_adjusted_with_mix_adjusted_and_naive_beside(con):
    add_run(con, "before", 3000, 1)
    add_run(con, "after", 3000, 2, ttft_scale=1.3)
    doc = compare_runs(con, "before", "after", FAST, seed=1)
    p99 = gate(doc, "ttft_p99")
    adj = p99["adjustment"]
    assert adj["headline"] == "covariate-adjusted" and adj["covariates"] == ["log prompt tokens"]
    (model,) = adj["models"]
    assert model["slopes"]["before"][0] == pytest.approx(0.63, abs=0.05) and model["r2"] > 0.4
    assert model["slopes"]["after"][0] == pytest.approx(0.63, abs=0.05)
    assert p99["interval_method"] == "woodruff"          # 3,000 a side: well inside each run's data
    assert p99["mix_adjusted"]["ratio"] > 1.1 and p99["naive"]["ratio"] > 1.1
    assert p99["distribution_test"]["name"] == "Anderson–Darling k-sample"
    chart = p99["residual_chart"]
    assert chart["type"] == "scatter" and [s["name"] for s in chart["series"]] == ["before", "after"]
    assert all(len(s["x"]) == len(s["y"]) == 300 for s in chart["series"])
    e2e = gate(doc, "e2e_p99")["adjustment"]
    assert e2e["covariates"] == ["log prompt tokens", "log completion tokens"]
