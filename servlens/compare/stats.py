"""Statistics on per-cohort summaries: mixture quantiles, a stratified bootstrap, rate intervals, Holm.

Everything here works on histograms that DuckDB already aggregated (cohorts × log-spaced bins), never on request
rows, so its cost depends on the number of cohorts and bins, not on the number of requests.

Binning error: a latency x lands in bin floor(ln x / ln 1.005) and is read back as the bin's geometric midpoint, so
every quantile read from a histogram is within ±0.25% of the exact sample quantile (one bin is 0.5% wide), and a
ratio of two quantiles within ±0.5%. The stratified bootstrap resamples each cohort's histogram (multinomial with the
cohort's own count), which is exactly the bootstrap of the binned rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

_NORMAL = NormalDist()
BIN_RATIO = 1.005
LOG_BIN = math.log(BIN_RATIO)
ZERO_BIN = -(10**6)          # values <= 0 (a latency of exactly zero) get their own bin, read back as 0.0
BINNING_ERROR = (BIN_RATIO**0.5 - 1)   # relative error of one quantile read from the histogram (≈ 0.25%)


def bin_sql(column: str) -> str:
    """DuckDB expression for a value's bin id (the SQL half of the binning contract above)."""
    return (f"CASE WHEN {column} <= 0 THEN {ZERO_BIN} "
            f"ELSE CAST(floor(ln({column}) / {LOG_BIN!r}) AS BIGINT) END")


def bin_values(bins: np.ndarray) -> np.ndarray:
    """The value each bin id stands for: its geometric midpoint (0.0 for the zero bin)."""
    bins = np.asarray(bins, dtype=np.float64)
    values = np.exp((bins + 0.5) * LOG_BIN)
    return np.where(bins == ZERO_BIN, 0.0, values)


# ---------------------------------------------------------------------------------------------------- quantiles


def mixture_quantile_index(counts: np.ndarray, weights: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Column index of each quantile q of the mixture Σ_c w_c · F_c (inverse CDF: smallest x with F(x) ≥ q).

    counts: (cohorts, bins) histogram; weights: (cohorts,) summing to 1; rows with zero count get no weight.
    Accepts a leading batch axis on counts: (batch, cohorts, bins) -> (batch, len(qs)).
    """
    n = counts.sum(axis=-1, keepdims=True).astype(np.float64)
    share = np.divide(counts, n, out=np.zeros(counts.shape, dtype=np.float64), where=n > 0)
    mix = np.einsum("...cb,c->...b", share, weights)
    cdf = np.cumsum(mix, axis=-1)
    cdf /= cdf[..., -1:]
    idx = np.stack([(cdf < q - 1e-12).sum(axis=-1) for q in qs], axis=-1)
    return np.minimum(idx, counts.shape[-1] - 1)


def bootstrap_quantile_index(counts: np.ndarray, weights: np.ndarray, qs, resamples: int,
                             rng: np.random.Generator, block: int = 250) -> np.ndarray:
    """Stratified bootstrap of the mixture quantiles: each cohort's histogram is resampled with its own count.

    Returns (resamples, len(qs)) column indices. Cost is cohorts × bins × resamples binomial draws, whatever the
    number of requests. Bins far from every quantile (where the mixture CDF is more than 8 worst-case standard
    errors away from q) are merged before resampling: merging bins never moves a resampled quantile that stays
    inside the kept window, and if one ever leaves it the resampling is redone at full resolution.
    """
    qs = np.asarray(qs, dtype=np.float64)
    n = counts.sum(axis=1).astype(np.float64)
    share = np.divide(counts, n[:, None], out=np.zeros(counts.shape), where=n[:, None] > 0)
    cdf = np.cumsum(weights @ share)
    live = (n > 0) & (weights > 0)
    delta = 8 * math.sqrt(float((weights[live] ** 2 * 0.25 / n[live]).sum()))
    keep = np.zeros(counts.shape[1], dtype=bool)
    for q in qs:
        lo = int(np.searchsorted(cdf, q - delta - 1e-12))
        hi = int(np.searchsorted(cdf, q + delta))
        keep[lo:hi + 1] = True
    # one reduced column per kept bin, and one per run of merged bins
    starts = np.flatnonzero(np.r_[True, keep[1:] | keep[:-1] | (keep[1:] != keep[:-1])])
    reduced = np.add.reduceat(counts, starts, axis=1)
    kept_col = keep[starts]
    idx = _bootstrap_indices(reduced, weights, qs, resamples, rng, block)
    if not kept_col[idx].all():
        return _bootstrap_indices(counts, weights, qs, resamples, rng, block)
    return starts[idx]


def _bootstrap_indices(counts, weights, qs, resamples, rng, block):
    n_cohorts, n_bins = counts.shape
    n = counts.sum(axis=1)
    out = np.empty((resamples, len(qs)), dtype=np.int64)
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        mix = np.zeros((size, n_bins))
        for c in range(n_cohorts):
            if n[c] == 0 or weights[c] == 0:
                continue
            nonzero = np.flatnonzero(counts[c])
            p = counts[c, nonzero] / n[c]
            draws = rng.multinomial(int(n[c]), p / p.sum(), size=size)
            mix[:, nonzero] += draws * (weights[c] / n[c])
        cdf = np.cumsum(mix, axis=1)
        cdf /= cdf[:, -1:]
        idx = np.stack([(cdf < q - 1e-12).sum(axis=1) for q in qs], axis=1)
        out[start:start + size] = np.minimum(idx, n_bins - 1)
    return out


def woodruff_interval(counts: np.ndarray, weights: np.ndarray, q: float, alpha: float) -> tuple[int, int, int]:
    """Column indices (low, estimate, high) of Woodruff's interval for a quantile of a stratified mixture.

    The distribution-free interval for a quantile inverts the CDF: {x : |F̂(x) − q| ≤ z·se(F̂(Q̂))} with
    se² = Σ_c w_c² F_c(Q̂)(1 − F_c(Q̂))/n_c — with one cohort, the normal form of the binomial order-statistic
    interval. It needs no density estimate and stays honest in the tail, where a bootstrap of few tail
    observations is too narrow.
    """
    n = counts.sum(axis=1).astype(np.float64)
    share = np.divide(counts, n[:, None], out=np.zeros(counts.shape), where=n[:, None] > 0)
    per_cohort = np.cumsum(share, axis=1)
    cdf = weights @ per_cohort
    est = int(min(np.searchsorted(cdf, q - 1e-12), counts.shape[1] - 1))
    live = n > 0
    at = per_cohort[live, est]
    se = math.sqrt(float((weights[live] ** 2 * at * (1 - at) / n[live]).sum()))
    if se == 0:      # every cohort entirely on one side of the estimate: fall back to the pooled binomial error
        se = math.sqrt(q * (1 - q) / float((weights[live] ** 2 / n[live]).sum() ** -1))
    z = _NORMAL.inv_cdf(1 - alpha / 2)
    last = counts.shape[1] - 1
    low = int(min(np.searchsorted(cdf, q - z * se - 1e-12), last))
    high = int(min(np.searchsorted(cdf, q + z * se - 1e-12), last))
    return low, est, high


def percentile_interval(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_p_value(samples: np.ndarray) -> float:
    """Two-sided bootstrap p-value for 'no change' (0 on the log scale), consistent with percentile intervals.

    Beyond the bootstrap's resolution (fewer than 10 resamples on the far side of 0) the normal approximation
    2·Φ(−|mean|/sd) takes over, so Holm over many gates (per-cohort policies) can still reject: a tail share can
    never go below 1/(B+1), which would cap the number of gates that can ever fail.
    """
    b = len(samples)
    n_below, n_above = np.count_nonzero(samples <= 0), np.count_nonzero(samples >= 0)
    if min(n_below, n_above) >= 10:
        return float(min(1.0, 2 * (min(n_below, n_above) + 1) / (b + 1)))
    mean, sd = float(np.mean(samples)), float(np.std(samples))
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return float(min(1.0, 2 * _NORMAL.cdf(-abs(mean) / sd)))


# ---------------------------------------------------------------------------------------------- location test


def van_elteren(before: np.ndarray, after: np.ndarray) -> dict:
    """Stratified Wilcoxon rank-sum test (van Elteren) over cohort histograms on a common bin grid.

    before, after: (cohorts, bins). Ties are the bins themselves (tie-corrected variance). Returns the two-sided
    p-value and the probability that an after request is slower than a before one of the same cohort (ties ½),
    averaged with the van Elteren weights.
    """
    stat = var = weight_sum = prob = 0.0
    for b, a in zip(before.astype(np.float64), after.astype(np.float64)):
        n1, n2 = b.sum(), a.sum()
        if n1 == 0 or n2 == 0:
            continue
        total = n1 + n2
        below_b = np.cumsum(b) - b
        u = float((a * (below_b + 0.5 * b)).sum())      # pairs (after > before) + ½ ties
        t = a + b
        tie = float((t**3 - t).sum())
        v = n1 * n2 / 12.0 * ((total + 1) - tie / (total * (total - 1))) if total > 1 else 0.0
        w = 1.0 / (total + 1)
        stat += w * (u - n1 * n2 / 2)
        var += w * w * v
        prob += w * u
        weight_sum += w * n1 * n2
    if var <= 0:
        return {"name": "van Elteren (stratified Wilcoxon)", "p_value": 1.0, "prob_after_slower": None}
    z = stat / math.sqrt(var)
    return {"name": "van Elteren (stratified Wilcoxon)", "p_value": float(2 * _NORMAL.cdf(-abs(z))),
            "z": float(z), "prob_after_slower": prob / weight_sum if weight_sum else None}


# ------------------------------------------------------------------------------------------------------- rates


@dataclass
class StandardisedRate:
    rate: float
    variance: float
    effective_n: float


def standardised_rate(events: np.ndarray, totals: np.ndarray, weights: np.ndarray) -> StandardisedRate:
    """Directly standardised rate Σ w_c x_c/n_c with its variance and Kish-style effective sample size."""
    events = np.asarray(events, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    keep = totals > 0
    p = np.zeros_like(events)
    p[keep] = events[keep] / totals[keep]
    rate = float((weights * p).sum())
    variance = float((weights[keep] ** 2 * p[keep] * (1 - p[keep]) / totals[keep]).sum())
    base_n = 1.0 / float((weights[keep] ** 2 / totals[keep]).sum())
    if variance > 0 and 0 < rate < 1:
        effective_n = rate * (1 - rate) / variance
    else:
        effective_n = base_n
    return StandardisedRate(rate, variance, effective_n)


def proportion_interval(rate: float, n: float, alpha: float) -> tuple[float, float]:
    """Wilson score interval at (effective) n; Clopper-Pearson (exact) when fewer than 10 events or non-events."""
    from scipy.special import betaincinv

    x = rate * n
    if x < 10 or n - x < 10:
        lo = 0.0 if x <= 0 else float(betaincinv(x, n - x + 1, alpha / 2))
        hi = 1.0 if x >= n else float(betaincinv(x + 1, n - x, 1 - alpha / 2))
        return lo, hi
    z = _NORMAL.inv_cdf(1 - alpha / 2)
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_interval(before: StandardisedRate, after: StandardisedRate, alpha: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval for after − before, from the two single-rate intervals."""
    lb, ub = proportion_interval(before.rate, before.effective_n, alpha)
    la, ua = proportion_interval(after.rate, after.effective_n, alpha)
    d = after.rate - before.rate
    lo = d - math.sqrt((after.rate - la) ** 2 + (ub - before.rate) ** 2)
    hi = d + math.sqrt((ua - after.rate) ** 2 + (before.rate - lb) ** 2)
    return lo, hi


def newcombe_p_value(before: StandardisedRate, after: StandardisedRate) -> float:
    """The smallest alpha at which the Newcombe interval excludes 0 (found by bisection on log alpha)."""
    if after.rate == before.rate:
        return 1.0
    def excludes(alpha: float) -> bool:
        lo, hi = newcombe_interval(before, after, alpha)
        return lo > 0 or hi < 0
    lo_a, hi_a = 1e-12, 0.999999
    if excludes(lo_a):
        return lo_a
    if not excludes(hi_a):
        return 1.0
    for _ in range(60):
        mid = math.sqrt(lo_a * hi_a)
        if excludes(mid):
            hi_a = mid
        else:
            lo_a = mid
    return hi_a


# -------------------------------------------------------------------------------------------------------- Holm


def holm_levels(p_values: list[float], alpha: float) -> tuple[list[float], list[float]]:
    """Per-test interval level and Holm-adjusted p-value.

    Tests are taken in order of p; the i-th (0-based) of m gets alpha/(m−i) while Holm keeps rejecting. From the
    first test Holm does not reject, every remaining test gets the Bonferroni level alpha/m, so its interval cannot
    exclude 'no change' where Holm would not reject (intervals and decisions agree).
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    levels = [alpha / m] * m
    adjusted = [1.0] * m
    running = 0.0
    stopped = False
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
        if not stopped and p_values[i] <= alpha / (m - rank):
            levels[i] = alpha / (m - rank)
        else:
            stopped = True
            levels[i] = alpha / m
    return levels, adjusted
