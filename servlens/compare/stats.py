"""Statistics on per-cohort summaries: mixture quantiles, batch-means intervals, rate intervals, Holm, screens.

Everything here works on what DuckDB already aggregated (side × time batch × cohort × log-spaced bin counts), never
on request rows, so its cost depends on the number of batches, cohorts and bins, not on the number of requests.

Binning error: a latency x lands in bin floor(ln x / ln 1.005) and is read back as the bin's geometric midpoint, so
every quantile read from a histogram is within ±0.25% of the exact sample quantile (one bin is 0.5% wide), and a
ratio of two quantiles within ±0.5%.

Serial correlation: requests close in time share the engine's state (a burst, a cold cache), so they are not
independent. Every variance here is a batch-means variance: each run is cut into consecutive time-ordered batches,
and the estimator's linearisation is summed per batch; the spread of those batch sums is the variance, with B − 1
degrees of freedom (Student t). It is never taken below the independent-requests variance. When both runs cover the
same hours of the day, the batches are common time-of-day windows and the paired_* functions subtract the two runs'
batch-means covariance (what they share at the same clock time), still never below the independent variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy import stats as sps

_NORMAL = NormalDist()
BIN_RATIO = 1.005
LOG_BIN = math.log(BIN_RATIO)
ZERO_BIN = -(10**6)          # values <= 0 (a latency of exactly zero) get their own bin, read back as 0.0
BINNING_ERROR = (BIN_RATIO**0.5 - 1)   # relative error of one quantile read from the histogram (≈ 0.25%)
# Batches per run: at most 50 (long batches keep the correlation inside them), at least 10 (t with 9 df), and
# about 5 requests a batch in between; a run of fewer than 10 requests has one request a batch.
# Batches are consecutive in arrival order and of about equal size (cohorts._batch_case).
MAX_BATCHES, MIN_BATCHES, REQUESTS_PER_BATCH = 50, 10, 5
TAIL_OBSERVATIONS = 10       # a quantile is judged only with at least this many requests beyond it on each side
POWER_Z = _NORMAL.inv_cdf(0.8)
AD_MAX_PER_SIDE = 50_000   # minimum detectable effect: the change detected 80% of the time


def bin_sql(column: str) -> str:
    """DuckDB expression for a value's bin id (the SQL half of the binning contract above)."""
    return (f"CASE WHEN {column} <= 0 THEN {ZERO_BIN} "
            f"ELSE CAST(floor(ln({column}) / {LOG_BIN!r}) AS BIGINT) END")


def bin_values(bins: np.ndarray) -> np.ndarray:
    """The value each bin id stands for: its geometric midpoint (0.0 for the zero bin)."""
    bins = np.asarray(bins, dtype=np.float64)
    values = np.exp((bins + 0.5) * LOG_BIN)
    return np.where(bins == ZERO_BIN, 0.0, values)


def supported_quantile(q: float, n: int) -> float | None:
    """The highest quantile ≤ q with TAIL_OBSERVATIONS requests beyond it among n (5% steps), or None below p50."""
    if n <= 0:
        return None
    if (1 - q) * n >= TAIL_OBSERVATIONS - 1e-9:
        return q
    top = math.floor(20 * (1 - TAIL_OBSERVATIONS / n) + 1e-9) / 20
    return top if top >= 0.5 else None


# ---------------------------------------------------------------------------------------------------- quantiles


def mixture_quantile_index(counts: np.ndarray, weights: np.ndarray, qs) -> np.ndarray:
    """Column index of each quantile q of the mixture Σ_c w_c · F_c (inverse CDF: smallest x with F(x) ≥ q).

    counts: (cohorts, bins) histogram; weights: (cohorts,) summing to 1; rows with zero count get no weight.
    """
    n = counts.sum(axis=-1, keepdims=True).astype(np.float64)
    share = np.divide(counts, n, out=np.zeros(counts.shape, dtype=np.float64), where=n > 0)
    mix = np.einsum("...cb,c->...b", share, weights)
    cdf = np.cumsum(mix, axis=-1)
    cdf /= cdf[..., -1:]
    idx = np.stack([(cdf < q - 1e-12).sum(axis=-1) for q in qs], axis=-1)
    return np.minimum(idx, counts.shape[-1] - 1)


@dataclass
class Side:
    """One run's histograms for one metric: dense (cohorts × bins) and per time batch (long form)."""

    counts: np.ndarray        # (cohorts, bins)
    batch: np.ndarray         # (rows,) batch id of each long-form cell
    cohort: np.ndarray        # (rows,) cohort index
    column: np.ndarray        # (rows,) bin column
    n: np.ndarray             # (rows,) requests in the cell

    @property
    def batches(self) -> int:
        return int(self.batch.max()) + 1 if self.batch.size else 0


def _paired_share(v_b: float, v_a: float, shared: float) -> float:
    """λ = (V_b + V_a − 2C) / (V_b + V_a): the share of the two unpaired batch-means variances left once what the
    runs share in the same windows is taken out; each run's variance is scaled by it (sums to the paired one)."""
    total = v_b + v_a
    return max(0.0, total - 2 * shared) / total if total > 0 else 1.0


def _cdf_terms(side: Side, weights: np.ndarray, column: int, batches: int) -> tuple[np.ndarray, float]:
    """Per-batch sums of the mixture CDF's linearisation at bin `column`, and the independent-requests variance.

    The linearisation is Σ_i a_i (1{x_i ≤ x} − F̂_c(i)(x)) with a_i = w_c / n_c; its batch sums add up to zero.
    """
    n_c = side.counts.sum(axis=1).astype(np.float64)
    live = n_c > 0
    below_c = side.counts[:, : column + 1].sum(axis=1)
    f_c = np.divide(below_c, n_c, out=np.zeros_like(n_c), where=live)
    iid = float((weights[live] ** 2 * f_c[live] * (1 - f_c[live]) / n_c[live]).sum())
    a = np.divide(weights, n_c, out=np.zeros_like(n_c), where=live)
    below = side.n * (side.column <= column)
    sums = np.bincount(side.batch, weights=a[side.cohort] * (below - side.n * f_c[side.cohort]),
                       minlength=batches)
    return sums, iid


def cdf_variance(side: Side, weights: np.ndarray, column: int) -> tuple[float, int]:
    """Variance of the mixture CDF F̂(x) = Σ_c w_c F̂_c(x) at the bin `column`, and its degrees of freedom.

    The linearisation Σ_i a_i (1{x_i ≤ x} − F̂_c(i)(x)) with a_i = w_c / n_c is summed per time batch; the variance is
    B/(B−1)·Σ_b S_b², never below the independent-requests variance Σ_c w_c² F_c (1 − F_c) / n_c.
    """
    b = side.batches
    sums, iid = _cdf_terms(side, weights, column, b)
    if b < 2:
        return iid, 1
    bm = float(b / (b - 1) * (sums**2).sum())
    return max(bm, iid), b - 1


def critical(alpha: float, df: int) -> float:
    """Two-sided critical value at level alpha: Student t with the batch-means degrees of freedom."""
    return float(sps.t.ppf(1 - alpha / 2, df))


@dataclass
class QuantileSide:
    """What a side contributes to a quantile interval: the estimate's column, the CDF, and its standard error."""

    cdf: np.ndarray
    estimate: int
    se: float
    df: int
    q: float

    def interval(self, alpha: float) -> tuple[int, int]:
        """Woodruff: invert the CDF at q ± t·se (distribution-free, honest in the tail)."""
        t = critical(alpha, self.df) * self.se
        q = self.q
        last = len(self.cdf) - 1
        lo = int(min(np.searchsorted(self.cdf, q - t - 1e-12), last))
        hi = int(min(np.searchsorted(self.cdf, q + t - 1e-12), last))
        return lo, hi


def _mixture_cdf(side: Side, weights: np.ndarray, q: float) -> tuple[np.ndarray, int]:
    n = side.counts.sum(axis=1, keepdims=True).astype(np.float64)
    share = np.divide(side.counts, n, out=np.zeros(side.counts.shape), where=n > 0)
    cdf = np.cumsum(weights @ share)
    cdf /= cdf[-1]
    return cdf, int(min(np.searchsorted(cdf, q - 1e-12), len(cdf) - 1))


def _pooled_binomial(side: Side, weights: np.ndarray, q: float) -> float:
    """Every cohort entirely on one side of the estimate: the pooled binomial variance at q."""
    n = side.counts.sum(axis=1).astype(np.float64)
    live = n > 0
    return q * (1 - q) / float((weights[live] ** 2 / n[live]).sum() ** -1)


def quantile_side(side: Side, weights: np.ndarray, q: float) -> QuantileSide:
    cdf, est = _mixture_cdf(side, weights, q)
    var, df = cdf_variance(side, weights, est)
    if var <= 0:
        var = _pooled_binomial(side, weights, q)
    return QuantileSide(cdf=cdf, estimate=est, se=math.sqrt(var), df=df, q=q)


def paired_quantile_sides(before: Side, after: Side, weights: np.ndarray,
                          q: float) -> tuple[QuantileSide, QuantileSide, dict]:
    """Both runs' quantile sides when their batches are common time-of-day windows (batch k = the same hours).

    Var(F̂_a − F̂_b) = V_a + V_b − 2C, where V are the two runs' batch-means variances over the K windows and
    C = K/(K−1)·Σ_k S_b,k S_a,k their batch-means covariance: what both runs share at the same clock time (the
    day's load curve, an incident both ran through) cancels. Each run's Woodruff interval uses its own variance
    scaled by λ = (V_a + V_b − 2C)/(V_a + V_b), never below its independent-requests variance (the A/A guard), so
    the square-and-add combination gets the paired variance. That is exact when the change is a change of scale
    (the log-scale density at the quantile is the same in both runs, as under no change and at a tolerance boundary
    ×(1 + tol)). Taking out the shared part can leave the variance carried by a few windows (a p99 that lives in
    an incident both runs had): t then has the effective number of windows carrying it, 3(Σ D_k²)² / Σ D_k⁴ with
    D_k = S_a,k − S_b,k (K for windows alike, the number of windows that carry it otherwise), less one, and at most
    K − 1. Returns the two sides and a summary for the report (correlation C / √(V_b V_a), effective windows).
    """
    k = max(before.batches, after.batches)
    if k < 2:
        qb, qa = quantile_side(before, weights, q), quantile_side(after, weights, q)
        return qb, qa, {"correlation": 0.0, "effective_windows": float(k)}
    cdf_b, est_b = _mixture_cdf(before, weights, q)
    cdf_a, est_a = _mixture_cdf(after, weights, q)
    sums_b, iid_b = _cdf_terms(before, weights, est_b, k)
    sums_a, iid_a = _cdf_terms(after, weights, est_a, k)
    scale = k / (k - 1)
    v_b, v_a = scale * float((sums_b**2).sum()), scale * float((sums_a**2).sum())
    shared = scale * float((sums_b * sums_a).sum())
    paired = _paired_share(v_b, v_a, shared)
    var_b, var_a = max(paired * v_b, iid_b), max(paired * v_a, iid_a)
    if var_b <= 0:
        var_b = _pooled_binomial(before, weights, q)
    if var_a <= 0:
        var_a = _pooled_binomial(after, weights, q)
    corr = shared / math.sqrt(v_b * v_a) if v_b > 0 and v_a > 0 else 0.0
    diff = sums_a - sums_b
    fourth = float((diff**4).sum())
    effective = min(float(k), 3 * float((diff**2).sum()) ** 2 / fourth) if fourth > 0 else float(k)
    df = int(max(1, min(k - 1, math.floor(effective) - 1)))
    return (QuantileSide(cdf=cdf_b, estimate=est_b, se=math.sqrt(var_b), df=df, q=q),
            QuantileSide(cdf=cdf_a, estimate=est_a, se=math.sqrt(var_a), df=df, q=q),
            {"correlation": corr, "effective_windows": effective})


def log_ratio_interval(before: QuantileSide, after: QuantileSide, logs: np.ndarray,
                       alpha: float) -> tuple[float, float, float]:
    """(estimate, low, high) of log(Q_after / Q_before): each side's Woodruff interval, combined by square-and-add
    (MOVER) on the log scale, then widened by the binning bound so it holds for the exact, unbinned quantiles."""
    lb, hb = before.interval(alpha)
    la, ha = after.interval(alpha)
    eb, ea = logs[before.estimate], logs[after.estimate]
    est = ea - eb
    low = est - math.sqrt((ea - logs[la]) ** 2 + (logs[hb] - eb) ** 2) - LOG_BIN
    high = est + math.sqrt((logs[ha] - ea) ** 2 + (eb - logs[lb]) ** 2) + LOG_BIN
    return est, low, high


def _occupied(cdf: np.ndarray) -> tuple[int, int]:
    """The first and last columns of a CDF that hold requests."""
    mass = np.flatnonzero(np.diff(np.r_[0.0, cdf]) > 0)
    return int(mass[0]), int(mass[-1])


@dataclass
class QuantileRatio:
    """The interval a latency gate reports for log(Q_after / Q_before).

    The runs' own Woodruff intervals, combined on the log scale (log_ratio_interval), are the method — unless, at
    the smallest level Holm can give the gate (`reference_alpha`), one of them reaches its run's most extreme
    request: t·se then passes the distance from q to the CDF's end (a few dozen requests in ten batches, a
    cold-start request, a load spike), and the interval reads that one request, so a ×8 fall could read "anything
    from ×0.05 to ×2.6". Such a gate intersects it with the scale-shift test's interval (ScaleShift), each at half
    the level (Bonferroni: the intersection covers at the full level). The scale-shift test compares the runs only
    where they overlap; at a tail quantile its statistic cannot exceed 2·(1 − q), which is why it does not replace
    Woodruff. The choice depends on each run's own spread, not on the difference between them, and is made once
    per gate, so the interval still narrows as the level grows and the inverted p-value stays one method with it.
    """

    before: QuantileSide
    after: QuantileSide
    logs: np.ndarray
    shift: "ScaleShift | None"     # only for a combined gate (its cost grows with batches × cohorts × bins)

    @property
    def combined(self) -> bool:
        return self.shift is not None

    @classmethod
    def build(cls, before: QuantileSide, after: QuantileSide, logs: np.ndarray, make_shift,
              reference_alpha: float) -> "QuantileRatio":
        def at_an_end(side: QuantileSide) -> bool:
            lo, hi = side.interval(reference_alpha)
            first, last = _occupied(side.cdf)
            return lo <= first or hi >= last
        return cls(before, after, logs, make_shift() if at_an_end(before) or at_an_end(after) else None)

    @property
    def df(self) -> int:
        # the scale-shift test uses min(before.df, after.df) too (engine._judge_latency)
        return min(self.before.df, self.after.df)

    def interval(self, alpha: float) -> tuple[float, float, float]:
        if not self.combined:
            return log_ratio_interval(self.before, self.after, self.logs, alpha)
        est, lo_w, hi_w = log_ratio_interval(self.before, self.after, self.logs, alpha / 2)
        _, lo_s, hi_s = self.shift.interval(alpha / 2)
        return est, max(lo_w, lo_s), min(hi_w, hi_s)


@dataclass
class ScaleShift:
    """The interval of log(Q_after / Q_before) by inverting a two-sample test over scale shifts of the after run.

    For each shift k (in bins, a ratio of e^(k·LOG_BIN)), the after run is divided by that ratio and the two mixture
    CDFs are compared at their pooled q-quantile x*: D(k) = F̂_a(x*·r) − F̂_b(x*), whose variance is each run's
    batch-means variance of its CDF at that point (paired: less twice their covariance), never below the
    independent-requests variance at q. The interval is the run of shifts around the estimate that the test does
    not reject at t(df) — a generalised median test, inverted the way Hodges–Lehmann invert a rank test. Where one
    run has no requests its CDF is exactly 0 or 1 and contributes no variance (QuantileRatio says when it is used).
    """

    shifts: np.ndarray        # (K,) candidate shifts in bins, ascending
    z: np.ndarray             # (K,) |D(k)| / se(k)
    estimate: int             # index of the point estimate's shift (the ratio of the two mixture quantiles)
    df: int

    def interval(self, alpha: float) -> tuple[float, float, float]:
        """(estimate, low, high) of the log ratio at level alpha, widened by the binning bound so it holds for the
        exact, unbinned quantiles."""
        t = critical(alpha, self.df)
        rejected = self.z > t
        rejected[self.estimate] = False
        below = np.flatnonzero(rejected[: self.estimate])
        above = np.flatnonzero(rejected[self.estimate + 1:])
        lo = int(below[-1]) + 1 if below.size else 0
        hi = self.estimate + int(above[0]) if above.size else len(self.shifts) - 1
        est = float(self.shifts[self.estimate]) * LOG_BIN
        return est, float(self.shifts[lo]) * LOG_BIN - LOG_BIN, float(self.shifts[hi]) * LOG_BIN + LOG_BIN


def _dense_cdf_terms(side: Side, weights: np.ndarray, pos: np.ndarray, length: int,
                     batches: int) -> tuple[np.ndarray, np.ndarray, float]:
    """A run's mixture CDF on the dense bin grid, the per-batch sums of its linearisation at every grid point
    (batches × grid), and its independent-requests variance factor Σ_c w_c² / n_c (cohort weights renormalised over
    the cohorts this run has)."""
    n_c = side.counts.sum(axis=1).astype(np.float64)
    live = n_c > 0
    w = np.where(live, weights, 0.0)
    w = w / w.sum() if w.sum() > 0 else w
    dense = np.zeros((side.counts.shape[0], length))
    dense[:, pos] = side.counts
    f_c = np.divide(np.cumsum(dense, axis=1), n_c[:, None], out=np.zeros_like(dense), where=live[:, None])
    cdf = w @ f_c
    a = np.divide(w, n_c, out=np.zeros_like(n_c), where=live)
    below = np.zeros((batches, length))
    np.add.at(below, (side.batch, pos[side.column]), a[side.cohort] * side.n)
    in_batch = np.zeros((batches, side.counts.shape[0]))
    np.add.at(in_batch, (side.batch, side.cohort), side.n)
    sums = np.cumsum(below, axis=1) - (in_batch * a) @ f_c
    return cdf, sums, float((w[live] ** 2 / n_c[live]).sum())


def scale_shift(before: Side, after: Side, weights: np.ndarray, values: np.ndarray, q: float,
                estimates: tuple[int, int], df: int, paired: bool = False) -> ScaleShift:
    """The scale-shift test of ScaleShift for every shift between full separation either way.

    values: the bin values of the sides' columns; estimates: the two runs' quantile columns (before, after).
    """
    positive = values > 0
    ids = np.where(positive, np.rint(np.log(np.where(positive, values, 1.0)) / LOG_BIN - 0.5), 0).astype(np.int64)
    if positive.any() and not positive.all():     # latencies of exactly 0: one bin below the smallest
        ids[~positive] = ids[positive].min() - 1
    origin = int(ids.min())
    pos = ids - origin
    length = int(pos.max()) + 1
    k_windows = max(before.batches, after.batches, 1)
    cdf_b, sums_b, iid_b = _dense_cdf_terms(before, weights, pos, length, k_windows)
    cdf_a, sums_a, iid_a = _dense_cdf_terms(after, weights, pos, length, k_windows)
    def scale(b: int) -> float:      # the batch-means factor B/(B−1); one batch has no spread to measure
        return b / (b - 1) if b > 1 else 0.0
    bm_b, bm_a = scale(before.batches) * (sums_b**2).sum(axis=0), scale(after.batches) * (sums_a**2).sum(axis=0)
    floor = q * (1 - q) * (iid_b + iid_a)

    (b_lo, b_hi), (a_lo, a_hi) = _occupied(cdf_b), _occupied(cdf_a)
    shifts = np.arange(a_lo - b_hi - 1, a_hi - b_lo + 2)

    def at(cdf, x):
        """A CDF on the grid, extended: 0 left of it, 1 right of it."""
        inside = np.clip(x, 0, length - 1)
        return np.where(x < 0, 0.0, np.where(x >= length, 1.0, cdf[inside]))

    # x*(k): the smallest grid point where the pooled CDF reaches q (bisection, all shifts at once)
    lo = np.full(shifts.shape, min(0, -int(shifts.max())) - 1)
    hi = np.full(shifts.shape, length + max(0, -int(shifts.min())) + 1)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        reached = (at(cdf_a, mid + shifts) + at(cdf_b, mid)) / 2 >= q - 1e-12
        hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid + 1)
    xb, xa = lo, lo + shifts
    d = at(cdf_a, xa) - at(cdf_b, xb)
    inside_b, inside_a = (xb >= 0) & (xb < length), (xa >= 0) & (xa < length)
    cb, ca = np.clip(xb, 0, length - 1), np.clip(xa, 0, length - 1)
    v_b = np.where(inside_b, bm_b[cb], 0.0)
    v_a = np.where(inside_a, bm_a[ca], 0.0)
    if paired:
        shared = scale(k_windows) * np.where(inside_b & inside_a, (sums_b[:, cb] * sums_a[:, ca]).sum(axis=0), 0.0)
        var = np.maximum(v_b + v_a - 2 * shared, floor)
    else:
        var = np.maximum(v_b, q * (1 - q) * iid_b) + np.maximum(v_a, q * (1 - q) * iid_a)
    z = np.abs(d) / np.sqrt(np.maximum(var, 1e-300))
    k_hat = int(pos[estimates[1]] - pos[estimates[0]])
    return ScaleShift(shifts=shifts, z=z, estimate=int(np.clip(k_hat - shifts[0], 0, len(shifts) - 1)), df=df)


def inverted_p_value(excludes_zero, floor: float = 1e-12) -> float:
    """The smallest alpha at which an interval method excludes 'no change' (bisection on log alpha).

    The p-value Holm orders by and the interval the gate reports are then one method: at any level, the interval
    excludes no change exactly when p is below that level.
    """
    if excludes_zero(floor):
        return floor
    if not excludes_zero(0.999999):
        return 1.0
    lo, hi = floor, 0.999999
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if excludes_zero(mid):
            hi = mid
        else:
            lo = mid
    return hi


def woodruff_interval(counts: np.ndarray, weights: np.ndarray, q: float, alpha: float) -> tuple[int, int, int]:
    """Column indices (low, estimate, high) of Woodruff's interval for independent requests (one batch a request)."""
    side = Side(counts=counts, batch=np.zeros(0, dtype=np.int64), cohort=np.zeros(0, dtype=np.int64),
                column=np.zeros(0, dtype=np.int64), n=np.zeros(0))
    qs = quantile_side(side, weights, q)
    qs.df = 10**9
    lo, hi = qs.interval(alpha)
    return lo, qs.estimate, hi


# ---------------------------------------------------------------------------------------------- screens


def anderson_darling(before: np.ndarray, after: np.ndarray, values: np.ndarray) -> dict | None:
    """Anderson–Darling k-sample test (midrank, ties = bins) of two pooled histograms on a common bin grid.

    Context only ("the distribution changed"), never a gate: it assumes independent requests, and it reacts to any
    difference in shape, including ones no gate's quantile sees. Above AD_MAX_PER_SIDE requests a side the
    histograms are scaled down to that size first (same shape, fewer requests: a less sensitive screen, and a
    bounded cost).
    """
    import warnings

    if before.sum() < 2 or after.sum() < 2:
        return None
    for name in ("before", "after"):
        counts = before if name == "before" else after
        if counts.sum() > AD_MAX_PER_SIDE:
            scaled = np.round(counts * (AD_MAX_PER_SIDE / counts.sum()))
            before, after = (scaled, after) if name == "before" else (before, scaled)
    a = np.repeat(values, before.astype(np.int64))
    b = np.repeat(values, after.astype(np.int64))
    if np.unique(np.r_[a, b]).size < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # scipy warns when p is beyond its table (0.001 … 0.25): we say so
        res = sps.anderson_ksamp([a, b])
    p = float(res.pvalue)
    return {"name": "Anderson–Darling k-sample", "statistic": float(res.statistic),
            "p_value": p, "p_value_bounded": bool(p <= 0.001 or p >= 0.25)}


# ------------------------------------------------------------------------------------------------------- rates


@dataclass
class StandardisedRate:
    rate: float
    variance: float
    effective_n: float
    design_effect: float = 1.0


def _rate_parts(events, totals, weights):
    events = np.asarray(events, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    keep = totals > 0
    p = np.zeros_like(events)
    p[keep] = events[keep] / totals[keep]
    rate = float((weights * p).sum())
    variance = float((weights[keep] ** 2 * p[keep] * (1 - p[keep]) / totals[keep]).sum())
    base_n = 1.0 / float((weights[keep] ** 2 / totals[keep]).sum())
    effective_n = rate * (1 - rate) / variance if variance > 0 and 0 < rate < 1 else base_n
    a = np.divide(weights, totals, out=np.zeros_like(totals), where=keep)
    return rate, variance, effective_n, p, a


def _rate_batch_sums(p, a, batch_events, batch_totals) -> np.ndarray:
    """Per-batch sums of the standardised rate's linearisation Σ_i a_c (hit_i − p_c); they add up to zero."""
    return ((np.asarray(batch_events, dtype=np.float64) - batch_totals * p[None, :]) * a[None, :]).sum(axis=1)


def _with_design_effect(rate, variance, effective_n, batch_variance: float | None) -> StandardisedRate:
    deff = max(1.0, batch_variance / variance) if batch_variance is not None and variance > 0 else 1.0
    return StandardisedRate(rate, variance * deff, effective_n / deff, deff)


def standardised_rate(events: np.ndarray, totals: np.ndarray, weights: np.ndarray,
                      batch_events: np.ndarray | None = None,
                      batch_totals: np.ndarray | None = None) -> StandardisedRate:
    """Directly standardised rate Σ w_c x_c/n_c with its variance and effective sample size.

    batch_events/batch_totals (batches × cohorts) give the batch-means variance; the effective n is the Kish n
    divided by the design effect (batch-means variance / independent variance, never below 1).
    """
    rate, variance, effective_n, p, a = _rate_parts(events, totals, weights)
    batch_variance = None
    if batch_events is not None and variance > 0:
        live_batches = batch_totals.sum(axis=1) > 0
        batch_events, batch_totals = batch_events[live_batches], batch_totals[live_batches]
        b = batch_events.shape[0]
        if b >= 2:
            sums = _rate_batch_sums(p, a, batch_events, batch_totals)
            batch_variance = float(b / (b - 1) * (sums**2).sum())
    return _with_design_effect(rate, variance, effective_n, batch_variance)


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
    """The smallest alpha at which the Newcombe interval excludes 0."""
    if after.rate == before.rate:
        return 1.0

    def excludes(alpha: float) -> bool:
        lo, hi = newcombe_interval(before, after, alpha)
        return lo > 0 or hi < 0
    return inverted_p_value(excludes)


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


# ------------------------------------------------------------------------------------------------- regression


def _centred(s: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """One run's centred cross-products (Sxx, Sxy, Syy) from its sums."""
    mx, my = s["x"] / s["n"], s["y"] / s["n"]
    return s["xx"] - s["n"] * np.outer(mx, mx), s["xy"] - s["n"] * mx * my, float(s["yy"] - s["n"] * my * my)


def run_slopes(sums: dict) -> tuple[dict, float]:
    """Each run's own slopes of y on the covariates, and the within R² of those fits (both runs together).

    sums: per run, {"n", "x" (k,), "y", "xx" (k,k), "xy" (k,), "yy"}: the sufficient statistics DuckDB computes.
    Each run gets its own slopes because the change under test can change how latency grows with length (a prefix
    cache makes TTFT follow the uncached part of the prompt only): one slope pooled over both runs then adds the
    slope difference times the covariate's spread to each run's values, where a run's own least-squares slope only
    ever takes variance out. A covariate with (almost) no spread in a run gets slope 0 there: it explains nothing.
    """
    k = len(next(iter(sums.values()))["x"])
    slopes, explained, total = {}, 0.0, 0.0
    for side, s in sums.items():
        beta = np.zeros(k)
        slopes[side] = beta
        if s["n"] < k + 2:     # fewer rows than a slope and a residual need
            continue
        sxx, sxy, syy = _centred(s)
        total += max(syy, 0.0)
        usable = np.diag(sxx) > 1e-6 * max(1.0, s["n"])
        if not usable.any():
            continue
        try:
            beta[usable] = np.linalg.solve(sxx[np.ix_(usable, usable)], sxy[usable])
        except np.linalg.LinAlgError:
            beta[:] = 0.0
        explained += float(beta @ sxy)
    r2 = explained / total if total > 0 else 0.0
    return slopes, max(0.0, min(1.0, r2))
