"""Statistics on cohort histograms, checked against exact values and against textbook results."""

from __future__ import annotations

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


def test_bootstrap_spread_matches_the_asymptotic_quantile_error():
    """SE of log p99 of a lognormal (σ) is σ·sqrt(q(1−q)/n)/φ(z_q); the histogram bootstrap must reproduce it."""
    from statistics import NormalDist

    rng = np.random.default_rng(7)
    n, sigma, q = 20_000, 0.6, 0.99
    values = np.exp(rng.normal(0, sigma, n))
    ids, counts = _hist(values)
    idx = stats.bootstrap_quantile_index(counts[None, :], np.ones(1), [0.5, q], 2000, np.random.default_rng(1))
    logs = np.log(stats.bin_values(ids))
    se_boot = logs[idx].std(axis=0)
    z = NormalDist().inv_cdf(q)
    theory = [sigma * np.sqrt(p * (1 - p) / n) / NormalDist().pdf(NormalDist().inv_cdf(p)) for p in (0.5, q)]
    assert se_boot[0] == pytest.approx(theory[0], rel=0.15)
    assert se_boot[1] == pytest.approx(theory[1], rel=0.15)
    assert z > 2.3


def test_windowed_bootstrap_equals_full_resolution_in_distribution():
    rng = np.random.default_rng(5)
    counts = np.stack([_dense(rng, 300, 0.0), _dense(rng, 3000, 0.5)])
    w = np.array([0.4, 0.6])
    windowed = stats.bootstrap_quantile_index(counts, w, [0.5, 0.99], 3000, np.random.default_rng(2))
    full = stats._bootstrap_indices(counts, w, np.array([0.5, 0.99]), 3000, np.random.default_rng(3), 250)
    for col in range(2):
        assert np.mean(windowed[:, col]) == pytest.approx(np.mean(full[:, col]), abs=1.5)
        assert np.std(windowed[:, col]) == pytest.approx(np.std(full[:, col]), rel=0.1)


def _dense(rng, n, shift):
    values = np.exp(rng.normal(shift, 0.6, n))
    bins = np.floor(np.log(values) / stats.LOG_BIN).astype(np.int64) + 500
    return np.bincount(bins, minlength=1000)[:1000]


def test_bootstrap_p_value():
    rng = np.random.default_rng(0)
    samples = rng.normal(0.0, 1.0, 2000)
    far = min(np.count_nonzero(samples <= 0), np.count_nonzero(samples >= 0))
    assert stats.bootstrap_p_value(samples) == pytest.approx(2 * (far + 1) / 2001)
    assert stats.bootstrap_p_value(np.zeros(10)) == 1.0
    # beyond the resolution of 2,000 resamples: the normal approximation, far below 1/2001
    far_away = rng.normal(0.5, 0.05, 2000)
    assert stats.bootstrap_p_value(far_away) == pytest.approx(2 * 7.6e-24, rel=0.5)
    assert stats.bootstrap_p_value(far_away) < 0.05 / 1000


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


def test_van_elteren_reduces_to_mann_whitney_for_one_cohort():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(1)
    a = rng.integers(0, 40, 300)
    b = rng.integers(3, 43, 250)
    before = np.bincount(a, minlength=50)[None, :]
    after = np.bincount(b, minlength=50)[None, :]
    got = stats.van_elteren(before, after)
    ref = mannwhitneyu(b, a, use_continuity=False, method="asymptotic")
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert got["prob_after_slower"] == pytest.approx(ref.statistic / (len(a) * len(b)))


def test_woodruff_interval_is_the_order_statistic_interval_for_one_cohort():
    """One cohort, 1,000 distinct values: the 95% interval for the median spans ranks 500 ± 1.96·√250."""
    counts = np.ones((1, 1000), dtype=np.int64)
    low, est, high = stats.woodruff_interval(counts, np.ones(1), 0.5, 0.05)
    assert est == 499                      # the 500th value (0-based column 499)
    assert (low, high) == (469, 530)       # F in [0.5 − 0.031, 0.5 + 0.031]: ranks 470 and 531
    low, est, high = stats.woodruff_interval(counts, np.ones(1), 0.99, 0.05)
    assert est == 989 and low == 983 and high == 996     # F in [0.99 − 0.0062, 0.99 + 0.0062]
