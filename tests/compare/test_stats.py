"""Statistics on cohort histograms, checked against exact values and against textbook results."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest

from servlens.compare import stats


def _hist(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bins = np.floor(np.log(values) / stats.LOG_BIN).astype(np.int64)
    ids, counts = np.unique(bins, return_counts=True)
    return ids, counts


def test_duckdb_binning_matches_the_python_contract():
    values = np.array([1e-4, 0.0123, 0.2, 0.2000001, 1.0, 3.7, 512.25])
    con = duckdb.connect()
    got = con.execute(f"SELECT {stats.bin_sql('v')} FROM (SELECT unnest(?::DOUBLE[]) AS v)",
                      [values.tolist()]).fetchnumpy()
    expected = np.floor(np.log(values) / stats.LOG_BIN).astype(np.int64)
    assert list(next(iter(got.values()))) == list(expected)
    assert con.execute(f"SELECT {stats.bin_sql('0.0')}").fetchone()[0] == stats.ZERO_BIN
    assert stats.bin_values(np.array([stats.ZERO_BIN]))[0] == 0.0


def test_histogram_quantiles_are_within_the_stated_binning_error():
    rng = np.random.default_rng(3)
    values = np.exp(rng.normal(np.log(0.2), 0.6, 50_000))
    ids, counts = _hist(values)
    qs = [0.5, 0.9, 0.99, 0.999]
    idx = stats.mixture_quantile_index(counts[None, :], np.ones(1), qs)
    got = stats.bin_values(ids[idx])
    exact = np.quantile(values, qs, method="inverted_cdf")
    assert np.all(np.abs(got / exact - 1) <= stats.BINNING_ERROR + 1e-12)
    assert stats.BINNING_ERROR == pytest.approx(0.0025, abs=1e-5)


def test_mixture_quantile_reweights_cohorts():
    # cohort 0 all at bin 0, cohort 1 all at bin 1; weights 0.7/0.3 -> p50 in bin 0, p80 in bin 1
    counts = np.array([[10, 0], [0, 1000]])
    assert list(stats.mixture_quantile_index(counts, np.array([0.7, 0.3]), [0.5, 0.7, 0.8])) == [0, 0, 1]
    assert list(stats.mixture_quantile_index(counts, np.array([0.2, 0.8]), [0.5])) == [1]


def _side(values: np.ndarray, batches: int) -> tuple[stats.Side, np.ndarray]:
    """One cohort's values in time order as a stats.Side with `batches` consecutive batches, on a bin grid."""
    bins = np.floor(np.log(values) / stats.LOG_BIN).astype(np.int64)
    grid = np.arange(bins.min(), bins.max() + 1)
    column = bins - grid[0]
    batch = (np.arange(len(values)) * batches // len(values)).astype(np.int64)
    cells, n = np.unique(np.stack([batch, column]), axis=1, return_counts=True)
    counts = np.bincount(column, minlength=len(grid))[None, :]
    side = stats.Side(counts=counts, batch=cells[0], cohort=np.zeros(cells.shape[1], dtype=np.int64),
                      column=cells[1], n=n.astype(np.float64))
    return side, stats.bin_values(grid)


def test_batch_means_variance_is_the_binomial_one_for_independent_requests():
    """For independent requests the batch-means variance of F̂ at the median estimates q(1−q)/n (it is never
    taken below it)."""
    n = 20_000
    ratios = []
    for seed in range(20):
        side, _ = _side(np.exp(np.random.default_rng(seed).normal(0, 0.6, n)), 50)
        qs = stats.quantile_side(side, np.ones(1), 0.5)
        ratios.append(qs.se ** 2 / (0.25 / n))
        assert qs.df == 49
    assert np.mean(ratios) == pytest.approx(1.0, abs=0.15)
    assert min(ratios) >= 0.999          # never below the binomial variance (at F̂ of the estimate, ≈ q)


def test_batch_means_variance_sees_serial_correlation():
    """AR(1) φ 0.9 log latencies: the variance of F̂ at the median is several times the binomial one, and the
    batch-means estimate finds that factor (measured by brute force over 300 simulated runs)."""
    from scipy.signal import lfilter

    n, phi = 5000, 0.9

    def run(seed):
        e = np.random.default_rng(seed).normal(0, 1, n)
        return np.exp(0.6 * lfilter([np.sqrt(1 - phi * phi)], [1, -phi], e))
    medians = [np.mean(run(s) <= 1.0) for s in range(300)]      # F̂(true median) across runs
    true_var = np.var(medians)
    assert true_var > 4 * 0.25 / n
    estimates = [stats.quantile_side(_side(run(1000 + s), 50)[0], np.ones(1), 0.5).se ** 2 for s in range(20)]
    assert np.mean(estimates) == pytest.approx(true_var, rel=0.35)


def test_p_value_and_interval_are_one_method():
    """At any level, the reported interval excludes no change exactly when the gate's p-value is below it."""
    rng = np.random.default_rng(4)
    # on a common grid (one pooled set of bins)
    base = np.exp(rng.normal(0, 0.6, 6000))
    values_b, values_a = base[:3000], base[3000:] * 1.08
    allv = np.r_[values_b, values_a]
    bins = np.floor(np.log(allv) / stats.LOG_BIN).astype(np.int64)
    grid = np.arange(bins.min(), bins.max() + 1)
    sides = []
    for part in (bins[:3000], bins[3000:]):
        column = part - grid[0]
        batch = (np.arange(3000) * 50 // 3000).astype(np.int64)
        cells, n = np.unique(np.stack([batch, column]), axis=1, return_counts=True)
        sides.append(stats.Side(counts=np.bincount(column, minlength=len(grid))[None, :], batch=cells[0],
                                cohort=np.zeros(cells.shape[1], dtype=np.int64), column=cells[1],
                                n=n.astype(np.float64)))
    logs = np.log(stats.bin_values(grid))
    for q in (0.5, 0.9, 0.99):
        qb, qa = stats.quantile_side(sides[0], np.ones(1), q), stats.quantile_side(sides[1], np.ones(1), q)

        def excludes(alpha):
            _, lo, hi = stats.log_ratio_interval(qb, qa, logs, alpha)
            return lo > 0 or hi < 0
        p = stats.inverted_p_value(excludes)
        for level in (0.001, 0.01, 0.05, 0.2):
            if abs(level - p) > 1e-6 * p:
                assert excludes(level) == (p < level), (q, p, level)


def _pair(values_b: np.ndarray, values_a: np.ndarray, batches: int) -> tuple[list[stats.Side], np.ndarray]:
    """Two runs (one cohort each, values in time order) as stats.Sides on one common bin grid."""
    bins = np.floor(np.log(np.r_[values_b, values_a]) / stats.LOG_BIN).astype(np.int64)
    grid = np.arange(bins.min(), bins.max() + 1)
    sides = []
    for part in (bins[:len(values_b)], bins[len(values_b):]):
        column = part - grid[0]
        batch = (np.arange(len(part)) * batches // len(part)).astype(np.int64)
        cells, n = np.unique(np.stack([batch, column]), axis=1, return_counts=True)
        sides.append(stats.Side(counts=np.bincount(column, minlength=len(grid))[None, :], batch=cells[0],
                                cohort=np.zeros(cells.shape[1], dtype=np.int64), column=cells[1],
                                n=n.astype(np.float64)))
    return sides, stats.bin_values(grid)


def _ratio(sides, values, q, reference_alpha=0.05 / 8):
    one = np.ones(1)
    qb, qa = stats.quantile_side(sides[0], one, q), stats.quantile_side(sides[1], one, q)
    return stats.QuantileRatio.build(
        qb, qa, np.log(values),
        lambda: stats.scale_shift(sides[0], sides[1], one, values, q, (qb.estimate, qa.estimate),
                                  min(qb.df, qa.df)), reference_alpha)


def test_a_cold_start_and_a_drifting_load_do_not_hide_a_fall_eight_times_over():
    """The shape CI recorded from llama.cpp on a busy machine (40 requests a side, prefix cache off → on): before,
    TTFT drifts from 0.25 s to 0.6 s with the load; after, 37 requests at 26–45 ms and the three that found the
    cache cold at 0.3–0.66 s, all at the start. Each run's Woodruff interval reaches its run's extreme request
    (after's cold 0.66 s), which alone would say ×0.05 to ×2.6; the gate must show the fall."""
    rng = np.random.default_rng(12)
    before = np.sort(rng.uniform(0.25, 0.6, 40))          # the load rises through the run
    after = np.r_[0.66, 0.45, 0.3, rng.uniform(0.026, 0.045, 37)]
    sides, values = _pair(before, after, 10)
    ratio = _ratio(sides, values, 0.5)
    woodruff = stats.log_ratio_interval(ratio.before, ratio.after, ratio.logs, 0.05 / 8)
    assert math.exp(woodruff[2]) > 1                     # on its own: "inconclusive"
    assert ratio.combined
    est, lo, hi = ratio.interval(0.05 / 8)
    assert math.exp(est) == pytest.approx(np.median(after) / np.median(before), rel=0.1)
    assert lo <= est <= hi and math.exp(hi) < 0.3


def test_well_inside_the_data_the_gate_is_woodruffs_alone():
    """3,000 a side at p99 (30 beyond it): no run's interval reaches its extreme request, so the scale-shift test is
    never built and the interval is exactly each run's Woodruff interval combined."""
    rng = np.random.default_rng(13)
    sides, values = _pair(np.exp(rng.normal(0, 0.6, 3000)), np.exp(rng.normal(0.1, 0.6, 3000)), 50)
    ratio = _ratio(sides, values, 0.99)
    assert not ratio.combined
    assert ratio.interval(0.01) == stats.log_ratio_interval(ratio.before, ratio.after, ratio.logs, 0.01)


def test_a_combined_gates_p_value_and_interval_are_one_method():
    rng = np.random.default_rng(14)
    before = np.exp(rng.normal(0, 0.2, 40) + np.linspace(0, 1.5, 40))     # both drift with the load
    after = np.exp(rng.normal(-0.4, 0.2, 40) + np.linspace(0, 1.5, 40))
    after[:2] *= 8
    sides, values = _pair(before, after, 10)
    ratio = _ratio(sides, values, 0.5)
    assert ratio.combined

    def excludes(alpha):
        _, lo, hi = ratio.interval(alpha)
        return lo > 0 or hi < 0
    p = stats.inverted_p_value(excludes)
    assert 1e-6 < p < 1
    for level in (0.001, 0.01, 0.05, 0.2, 0.5):
        if abs(level - p) > 1e-6 * p:
            assert excludes(level) == (p < level), (p, level)


def test_supported_quantile_keeps_ten_requests_beyond_it():
    assert stats.supported_quantile(0.99, 1000) == 0.99
    assert stats.supported_quantile(0.99, 999) == 0.95          # 1 − 10/999 = 0.98999 → 5% steps
    assert stats.supported_quantile(0.99, 80) == 0.85           # 1 − 10/80 = 0.875
    assert stats.supported_quantile(0.99, 38) == 0.70
    assert stats.supported_quantile(0.5, 20) == 0.5
    assert stats.supported_quantile(0.5, 19) is None
    assert stats.supported_quantile(0.99, 19) is None


def _sums(x, y):
    return {"n": len(x), "x": np.array([x.sum()]), "y": y.sum(), "xx": np.array([[x @ x]]), "xy": np.array([x @ y]),
            "yy": y @ y}


def test_run_slopes_recover_each_runs_regression_and_ignore_run_levels():
    """Two runs with different intercepts (the effect) and a common slope: each run's fit finds the slope."""
    rng = np.random.default_rng(2)
    sums = {}
    for side, level in ((0, 0.0), (1, 0.5)):
        x = rng.normal(6, 0.8, 5000)
        sums[side] = _sums(x, level + 0.7 * x + rng.normal(0, 0.3, 5000))
    slopes, r2 = stats.run_slopes(sums)
    assert slopes[0][0] == pytest.approx(0.7, abs=0.02) and slopes[1][0] == pytest.approx(0.7, abs=0.02)
    assert r2 == pytest.approx(0.7**2 * 0.64 / (0.7**2 * 0.64 + 0.09), abs=0.03)
    # no spread in the covariate: nothing to adjust for
    flat = {s: dict(v, xx=np.array([[v["x"][0] ** 2 / v["n"]]]), xy=np.array([v["x"][0] * v["y"] / v["n"]]))
            for s, v in sums.items()}
    slopes, _ = stats.run_slopes(flat)
    assert slopes[0][0] == slopes[1][0] == 0.0


def test_run_slopes_keep_a_slope_the_change_itself_altered():
    """The prefix cache case, recorded on llama.cpp: before, TTFT does not follow the prompt (noise only); after, it
    follows the uncached suffix, a steep slope in log total tokens. Each run keeps its own slope, and adjusting a
    run by its own slope never widens its spread of log latency."""
    rng = np.random.default_rng(3)
    x_b, x_a = rng.normal(6.4, 0.04, 40), rng.normal(6.4, 0.04, 40)
    y_b = -2.2 + rng.normal(0, 0.1, 40)
    y_a = -4.0 + 9.0 * (x_a - 6.4) + rng.normal(0, 0.1, 40)
    slopes, _ = stats.run_slopes({0: _sums(x_b, y_b), 1: _sums(x_a, y_a)})
    assert abs(slopes[0][0]) < 1.5 and slopes[1][0] == pytest.approx(9.0, abs=1.5)
    for x, y, b in ((x_b, y_b, slopes[0][0]), (x_a, y_a, slopes[1][0])):
        assert np.std(y - b * (x - x_b.mean())) <= np.std(y)


def test_anderson_darling_sees_a_tail_only_change():
    rng = np.random.default_rng(6)
    a = np.exp(rng.normal(0, 0.6, 5000))
    b = np.exp(rng.normal(0, 0.6, 5000))
    b[b > np.quantile(b, 0.9)] *= 1.5                      # only the top 10% slower
    allv = np.r_[a, b]
    bins = np.floor(np.log(allv) / stats.LOG_BIN).astype(np.int64)
    grid = np.arange(bins.min(), bins.max() + 1)
    ca = np.bincount(bins[:5000] - grid[0], minlength=len(grid))
    cb = np.bincount(bins[5000:] - grid[0], minlength=len(grid))
    values = stats.bin_values(grid)
    changed = stats.anderson_darling(ca, cb, values)
    assert changed["p_value"] <= 0.001 and changed["p_value_bounded"]
    same = stats.anderson_darling(ca, ca, values)
    assert same["p_value"] >= 0.25


def test_clustered_events_raise_the_design_effect():
    """About 2% errors in 1,000 requests: drawn independently, the design effect is about 1; the same number all
    in one burst, the effective size collapses and the interval widens."""
    totals = np.full((50, 1), 20.0)
    spread = np.random.default_rng(8).binomial(20, 0.02, (50, 1)).astype(float)
    events = spread.sum()
    burst = np.zeros((50, 1))
    burst[10] = events
    w = np.ones(1)
    even = stats.standardised_rate(np.array([events]), np.array([1000.0]), w, spread, totals)
    clustered = stats.standardised_rate(np.array([events]), np.array([1000.0]), w, burst, totals)
    assert even.design_effect == pytest.approx(1.0, abs=0.6)
    assert clustered.design_effect > 10
    assert clustered.effective_n < even.effective_n / 10


def test_wilson_clopper_pearson_and_newcombe_textbook_values():
    # Wilson 10/100 and Clopper-Pearson 0/10 (Newcombe 1998, Stat Med 17:857, Table I)
    assert stats.proportion_interval(0.1, 100, 0.05) == pytest.approx((0.0552, 0.1744), abs=1e-4)
    assert stats.proportion_interval(0.0, 10, 0.05) == pytest.approx((0.0, 0.3085), abs=1e-4)
    # Newcombe 1998 (Stat Med 17:873) example: 56/70 − 48/80, method 10: 0.0524 to 0.3339
    before = stats.standardised_rate(np.array([48]), np.array([80]), np.ones(1))
    after = stats.standardised_rate(np.array([56]), np.array([70]), np.ones(1))
    assert before.effective_n == pytest.approx(80)
    assert stats.newcombe_interval(before, after, 0.05) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    p = stats.newcombe_p_value(before, after)
    lo, _ = stats.newcombe_interval(before, after, p)
    assert lo == pytest.approx(0.0, abs=1e-6)


def test_standardised_rate_uses_the_given_mix():
    events, totals = np.array([10, 90]), np.array([1000, 1000])
    rate = stats.standardised_rate(events, totals, np.array([0.9, 0.1]))
    assert rate.rate == pytest.approx(0.9 * 0.01 + 0.1 * 0.09)
    assert rate.variance == pytest.approx(0.81 * 0.01 * 0.99 / 1000 + 0.01 * 0.09 * 0.91 / 1000)


def test_holm_levels_and_adjusted_p_values():
    levels, adjusted = stats.holm_levels([0.01, 0.04, 0.03, 0.005], 0.05)
    # 0.005 ≤ .05/4 and 0.01 ≤ .05/3 are rejected; 0.03 > .05/2 stops: it and the rest get .05/4
    assert levels == pytest.approx([0.05 / 3, 0.0125, 0.0125, 0.0125])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_woodruff_interval_is_the_order_statistic_interval_for_one_cohort():
    """One cohort, 1,000 distinct values: the 95% interval for the median spans ranks 500 ± 1.96·√250."""
    counts = np.ones((1, 1000), dtype=np.int64)
    low, est, high = stats.woodruff_interval(counts, np.ones(1), 0.5, 0.05)
    assert est == 499                      # the 500th value (0-based column 499)
    assert (low, high) == (469, 530)       # F in [0.5 − 0.031, 0.5 + 0.031]: ranks 470 and 531
    low, est, high = stats.woodruff_interval(counts, np.ones(1), 0.99, 0.05)
    assert est == 989 and low == 983 and high == 996     # F in [0.99 − 0.0062, 0.99 + 0.0062]
