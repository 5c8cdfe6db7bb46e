"""compare_runs: two runs in a store → the compare result document (verdict, gates, coverage, mix shift).

The flow: DuckDB aggregates each run into cohorts × log-spaced bins (cohorts.py); the headline effect of each
gate re-weights the after run's cohorts to the before run's mix; a stratified bootstrap over the cohort histograms
gives intervals for quantile ratios, Newcombe/Wilson intervals on standardised rates give intervals for rate
differences (stats.py); Holm's step-down sets each gate's interval level so the whole family keeps the policy's
confidence; then each gate gets pass / fail / inconclusive and the release gets one verdict.
"""

from __future__ import annotations

import datetime as dt
import math
import zlib

import numpy as np

from servlens import __version__
from servlens.compare import cohorts as co
from servlens.compare import stats
from servlens.compare.policy import DEFAULT_BY, LATENCY_METRICS, Gate, Policy, load_policy
from servlens.errors import ConfigError, InputError

SCHEMA_VERSION = 1
# Gate charts: a CDF of at most CDF_MAX_POINTS points a series; past that, the bins where the CDF crosses these
# levels (1% steps to p90, then finer and finer in the tail the p99 gates judge: 137 levels).
CDF_MAX_POINTS = 160
CDF_LEVELS = np.r_[0.001, 0.005, np.arange(1, 91) / 100,          # 0.1%, 0.5%, 1% … 90% by 1%
                   np.arange(181, 199) / 200,                        # 90.5% … 99% by 0.5%
                   np.arange(1981, 1999) / 2000,                     # 99.05% … 99.9% by 0.05%
                   np.arange(9991, 10000) / 10000]                   # 99.91% … 99.99% by 0.01%
MAX_COHORT_ROWS = 200        # per-cohort summaries kept in the document (largest first)
MAX_GATE_COHORTS = 40        # per-cohort diagnostics inside one gate
VERDICT_EXIT = {"pass": 0, "fail": 1, "inconclusive": 3}


def compare_runs(con, before: str, after: str, policy: Policy | None = None, seed: int = 0) -> dict:
    """Compare run `after` with run `before` in the store `con`; returns the compare result document."""
    policy = policy or load_policy()
    if before == after:
        raise ConfigError(f"Before and after are the same run ('{before}')", "Name two different runs")
    runs = _run_info(con, before, after)
    alpha = 1 - policy.confidence
    doc = {
        "kind": "compare", "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "servlens_version": __version__,
        "verdict": None, "reason": None,
        "before": runs[before], "after": runs[after],
        "policy": {"source": policy.source, "confidence": policy.confidence, "min_coverage": policy.min_coverage,
                   "min_cohort_requests": policy.min_cohort_requests,
                   "bootstrap_resamples": policy.bootstrap_resamples, "seed": seed,
                   "by": list(policy.by) if policy.by is not None else None},
        "method": _method_text(policy),
        "coverage": None, "mix_shift": None, "gates": [], "improvements": [], "cohorts": [], "notes": [],
    }
    mix_keys = policy.by if policy.by is not None else DEFAULT_BY
    _token_notes(con, before, after, policy, doc["notes"])
    mix = co.mix_counts(con, before, after, mix_keys)
    doc["coverage"] = _coverage(mix, policy)

    models_b, models_a = set(runs[before]["models"]), set(runs[after]["models"])
    if "model" in mix_keys and models_b and models_a and not models_b & models_a:
        doc["verdict"] = "inconclusive"
        doc["reason"] = (f"The runs share no model (before: {', '.join(sorted(models_b))}; after: "
                         f"{', '.join(sorted(models_a))}), so there are no matched cohorts to compare; to compare "
                         f"across a model change, band without the model (--by prompt_band)")
        doc["mix_shift"] = _mix_shift(mix, policy, [])
        return doc
    if doc["coverage"]["cohorts_compared"] == 0:
        doc["verdict"] = "inconclusive"
        doc["reason"] = (f"No cohort ({' × '.join(mix_keys)}) has at least {policy.min_cohort_requests} requests in "
                         f"both runs, so nothing can be compared like for like")
        doc["mix_shift"] = _mix_shift(mix, policy, [])
        return doc

    cache: dict = {}
    results: list[dict] = []
    for gate in policy.gates:
        keys = policy.bands_for(gate)
        if gate.is_rate:
            results.extend(_rate_gate(con, before, after, gate, keys, policy, cache, doc["notes"]))
        else:
            results.extend(_latency_gate(con, before, after, gate, keys, policy, cache, seed))

    judged = [r for r in results if r.get("p_value") is not None]
    levels, adjusted = stats.holm_levels([r["p_value"] for r in judged], alpha) if judged else ([], [])
    for r, level, p_adj in zip(judged, levels, adjusted):
        r["p_value_holm"] = _r(p_adj)
        r["confidence"] = _r(1 - level)
        _interval_and_verdict(r, level)
    for r in results:
        if r["verdict"] is None:
            r["verdict"] = "inconclusive"
        r["rollback_criterion"] = _criterion_text(r, policy)
        r["rule"] = _rule_text(r, policy, len(judged))
    doc["gates"] = [_public(r) for r in results]
    doc["improvements"] = [
        {"gate": r["name"], "cohort": r["cohort"], "change": r.get("ratio", r.get("diff")),
         "summary": r["rollback_criterion"].replace("keep: ", "", 1)}
        for r in results if r.get("improved")
    ]
    doc["mix_shift"] = _mix_shift(mix, policy, results)
    doc["cohorts"] = _cohort_summaries(mix, cache, policy)
    doc["verdict"], doc["reason"] = _overall(results, doc["coverage"], policy)
    return doc


# ------------------------------------------------------------------------------------------------------ runs


def _run_info(con, before: str, after: str) -> dict:
    rows = con.execute("""SELECT run, count(*), list(DISTINCT model ORDER BY model) FILTER (WHERE model IS NOT NULL)
                          FROM requests WHERE run IN (?, ?) GROUP BY run""", [before, after]).fetchall()
    found = {run: (n, models or []) for run, n, models in rows}
    for label in (before, after):
        if label not in found:
            known = [r[0] for r in con.execute("SELECT DISTINCT run FROM requests ORDER BY run").fetchall()]
            listing = ", ".join(known[:20]) if known else "none"
            raise InputError(f"The store has no requests for run '{label}' (runs with requests: {listing})",
                             "Check the run label with 'servlens runs', or ingest the run first")
    info = {}
    for label in (before, after):
        sources = con.execute("""SELECT path, format, rows, bad_lines FROM sources
                                 WHERE run = ? AND kind = 'requests' ORDER BY source_id""", [label]).fetchall()
        info[label] = {"run": label, "requests": found[label][0], "models": found[label][1],
                       "sources": [{"path": p, "format": f, "rows": n, "bad_lines": b} for p, f, n, b in sources]}
    return info


def _method_text(policy: Policy) -> dict:
    return {
        "latency": ("ratio after/before of a quantile; the after run's cohorts re-weighted to the before run's mix; "
                    f"interval: the union of a stratified bootstrap percentile interval ({policy.bootstrap_resamples} "
                    "resamples of each cohort's histogram) and Woodruff's distribution-free interval combined over the "
                    "two runs by square-and-add on the log scale; location test: van Elteren stratified Wilcoxon"),
        "rates": ("difference after − before of the directly standardised rate (before run's mix); Newcombe "
                  "hybrid score interval from Wilson intervals at the effective sample size (Clopper-Pearson "
                  "below 10 events)"),
        "multiplicity": (f"Holm step-down over all judged gates at {policy.confidence:.0%} family confidence; each "
                         "gate's interval is at its Holm level"),
        "binning_error": (f"latencies binned on a log scale, bins {100 * (stats.BIN_RATIO - 1):.1f}% wide: each "
                          f"quantile within ±{100 * stats.BINNING_ERROR:.2f}%, each ratio within "
                          f"±{200 * stats.BINNING_ERROR:.1f}%; latency intervals are widened by that bound"),
        "verdict": ("fail: the interval excludes no change and the estimate is beyond the tolerance; pass: the whole "
                    "interval within the tolerance; inconclusive otherwise. Overall: fail if a critical gate fails, "
                    "inconclusive if a critical gate is inconclusive, else pass"),
    }


def _token_notes(con, before: str, after: str, policy: Policy, notes: list[str]) -> None:
    """Say when the token counts the bands need are mostly unknown: then the mix adjustment cannot see length."""
    keys = {k for g in policy.gates for k in policy.bands_for(g)}
    for key, column in (("prompt_band", "prompt_tokens"), ("output_band", "completion_tokens")):
        if key not in keys:
            continue
        rows = con.execute(f"""SELECT run, avg(CASE WHEN {column} IS NULL THEN 1.0 ELSE 0.0 END) FROM requests
                               WHERE run IN (?, ?) AND status IS DISTINCT FROM 'error' GROUP BY run ORDER BY run""",
                           [before, after]).fetchall()
        for run, share in rows:
            if share and share > 0.1:
                notes.append(f"{column} is unknown for {share:.0%} of the successful requests of run '{run}': "
                             f"those requests form an 'unknown length' band, so the mix adjustment cannot "
                             f"account for their lengths")


# --------------------------------------------------------------------------------------------- latency gates


def _rng(seed: int, *parts) -> np.random.Generator:
    """A generator per (metric, bands, cohort), so results do not depend on the order of the gates."""
    return np.random.default_rng([seed, zlib.crc32(repr(parts).encode())])


def _histograms(con, before, after, metric, keys, cache):
    key = ("hist", metric, keys)
    if key not in cache:
        cache[key] = co.latency_histograms(con, before, after, metric, keys)
    return cache[key]


def _quantiles_needed(policy: Policy, metric: str) -> list[float]:
    return sorted({g.quantile for g in policy.gates if g.metric == metric and not g.is_rate})


def _latency_gate(con, before, after, gate: Gate, keys, policy: Policy, cache, seed) -> list[dict]:
    hist = _histograms(con, before, after, gate.metric, keys, cache)
    base = _gate_base(gate, keys)
    human, column = LATENCY_METRICS[gate.metric][1], LATENCY_METRICS[gate.metric][0]
    n = hist.n()
    total_b, total_a = (int(n[0].sum()), int(n[1].sum())) if n.size else (0, 0)
    if total_b == 0 or total_a == 0:
        sides = [name for name, total in (("before", total_b), ("after", total_a)) if total == 0]
        base["reason"] = (f"{human} is not measured in the {' and '.join(sides)} run{'s' if len(sides) > 1 else ''} "
                          f"(no successful request has {column})")
        if len(sides) == 1:
            base["missing_side"] = sides[0]
        return [base]
    compared = (n[0] >= policy.min_cohort_requests) & (n[1] >= policy.min_cohort_requests)
    if not compared.any():
        base["reason"] = (f"no cohort has {policy.min_cohort_requests} requests with {human} in both runs")
        return [base]
    required = gate.required_requests()
    qs = _quantiles_needed(policy, gate.metric)
    qi = qs.index(gate.quantile)
    values = stats.bin_values(hist.bins)
    if gate.per_cohort:
        out = []
        for c in np.flatnonzero(compared):
            if n[0, c] < required or n[1, c] < required:
                continue
            r = _gate_base(gate, keys)
            r["cohort"] = hist.labels[c]
            r["cohort_count"] = 1
            cb, ca = hist.counts[0, c:c + 1], hist.counts[1, c:c + 1]
            w = np.ones(1)
            boot = _boot(cache, ("boot", gate.metric, keys, int(c)), cb, ca, w, values, qs, policy, seed)
            _fill_latency(r, cb, ca, w, values, gate, boot[:, qi], int(n[0, c]), int(n[1, c]))
            r["coverage"] = {"before": _r(n[0, c] / total_b), "after": _r(n[1, c] / total_a)}
            r["chart"] = _distribution_chart(r, cb, ca, w, values, human, gate)
            out.append(r)
        if not out:
            base["cohort"] = "each cohort"
            base["reason"] = f"no cohort has the {required} requests per side that {gate.name} needs"
            return [base]
        return out

    cb, ca = hist.counts[0, compared], hist.counts[1, compared]
    w = cb.sum(axis=1) / cb.sum()
    nb, na = int(cb.sum()), int(ca.sum())
    coverage = {"before": _r(nb / total_b), "after": _r(na / total_a)}
    base["coverage"] = coverage
    base["cohort_count"] = int(compared.sum())
    base["cohort"] = (f"all compared cohorts, mix-adjusted ({base['cohort_count']} cohort"
                      f"{'s' if base['cohort_count'] != 1 else ''} by {' × '.join(keys) or 'nothing'})")
    if nb < required or na < required:
        base.update(n_before=nb, n_after=na)
        _fill_point(base, cb, ca, w, values, gate)
        base["reason"] = (f"too few requests for {gate.name}: it needs at least {required} per side in compared "
                          f"cohorts (before has {nb}, after {na})")
        return [base]
    boot = _boot(cache, ("boot", gate.metric, keys), cb, ca, w, values, qs, policy, seed)
    _fill_latency(base, cb, ca, w, values, gate, boot[:, qi], nb, na)
    # naive: every request of each run pooled, no re-weighting (what a by-eye comparison would use)
    all_b, all_a = hist.counts[0].sum(axis=0, keepdims=True), hist.counts[1].sum(axis=0, keepdims=True)
    one = np.ones(1)
    naive_b = float(values[stats.mixture_quantile_index(all_b, one, [gate.quantile])[0]])
    naive_a = float(values[stats.mixture_quantile_index(all_a, one, [gate.quantile])[0]])
    base["naive"] = {"before": _r(naive_b), "after": _r(naive_a), "ratio": _r(_ratio(naive_a, naive_b))}
    base["location_test"] = {k: (_r(v) if isinstance(v, float) else v)
                             for k, v in stats.van_elteren(cb, ca).items()}
    low_cov = [side for side in ("before", "after") if coverage[side] < policy.min_coverage]
    if low_cov:
        base["low_coverage"] = (f"only {min(coverage[s] for s in low_cov):.0%} of the {' and '.join(low_cov)} "
                                f"run's {human} requests are in cohorts present in both runs (policy minimum "
                                f"{policy.min_coverage:.0%})")
    base["cohorts"] = _gate_cohorts(hist, compared, values, gate)
    base["chart"] = _distribution_chart(base, cb, ca, w, values, human, gate)
    return [base]


def _boot(cache, key, cb, ca, w, values, qs, policy: Policy, seed) -> np.ndarray:
    """Bootstrap log-ratios (resamples, quantiles) of a metric's compared cohorts, computed once per metric."""
    if key not in cache:
        rng = _rng(seed, *key)
        ib = stats.bootstrap_quantile_index(cb, w, np.asarray(qs), policy.bootstrap_resamples, rng)
        ia = stats.bootstrap_quantile_index(ca, w, np.asarray(qs), policy.bootstrap_resamples, rng)
        logs = np.log(np.maximum(values, 1e-9))
        cache[key] = logs[ia] - logs[ib]
    return cache[key]


def _gate_base(gate: Gate, keys) -> dict:
    return {"id": f"{gate.metric}_{gate.statistic}", "metric": gate.metric, "statistic": gate.statistic,
            "name": gate.name, "kind": "rate" if gate.is_rate else "latency",
            "unit": "share" if gate.is_rate else "s", "cohort": None, "by": list(keys),
            "direction": gate.direction, "tolerance": gate.tolerance, "tolerance_text": gate.tolerance_text(),
            "critical": gate.critical, "per_cohort": gate.per_cohort, "min_requests": gate.required_requests(),
            "before": None, "after": None, "n_before": None, "n_after": None, "p_value": None,
            "verdict": None, "reason": None, "chart": None}


def _fill_point(r, cb, ca, w, values, gate):
    qb = float(values[stats.mixture_quantile_index(cb, w, [gate.quantile])[0]])
    qa = float(values[stats.mixture_quantile_index(ca, w, [gate.quantile])[0]])
    r["before"], r["after"], r["ratio"] = _r(qb), _r(qa), _r(_ratio(qa, qb))


def _fill_latency(r, cb, ca, w, values, gate, log_ratio_samples, nb, na):
    _fill_point(r, cb, ca, w, values, gate)
    r["n_before"], r["n_after"] = nb, na
    r["_samples"] = log_ratio_samples
    r["_woodruff"] = (cb, ca, w, values, gate.quantile)
    r["p_value"] = stats.bootstrap_p_value(log_ratio_samples)


def _woodruff_log_ratio(cb, ca, w, values, q, alpha) -> tuple[float, float]:
    logs = np.log(np.maximum(values, 1e-9))
    lb, eb, hb = (logs[i] for i in stats.woodruff_interval(cb, w, q, alpha))
    la, ea, ha = (logs[i] for i in stats.woodruff_interval(ca, w, q, alpha))
    est = ea - eb
    return (est - math.sqrt((ea - la) ** 2 + (hb - eb) ** 2),
            est + math.sqrt((ha - ea) ** 2 + (eb - lb) ** 2))


def _ratio(a: float, b: float) -> float:
    floor = 1e-9
    return max(a, floor) / max(b, floor)


def _gate_cohorts(hist, compared, values, gate) -> list[dict]:
    n = hist.n()
    order = np.argsort(-n[0])[:MAX_GATE_COHORTS]
    rows = []
    for c in order:
        if n[0, c] == 0 and n[1, c] == 0:
            continue
        row = {"cohort": hist.labels[c], "n_before": int(n[0, c]), "n_after": int(n[1, c]),
               "compared": bool(compared[c]), "before": None, "after": None, "ratio": None}
        if n[0, c] and n[1, c]:
            qb = float(values[stats.mixture_quantile_index(hist.counts[0, c:c + 1], np.ones(1), [gate.quantile])[0]])
            qa = float(values[stats.mixture_quantile_index(hist.counts[1, c:c + 1], np.ones(1), [gate.quantile])[0]])
            row.update(before=_r(qb), after=_r(qa), ratio=_r(_ratio(qa, qb)))
        rows.append(row)
    return rows


def _cdf_points(counts: np.ndarray, weights: np.ndarray, values: np.ndarray) -> tuple[list, list]:
    """The mixture's empirical CDF Σ_c w_c·F_c as (latency, cumulative share) points, at most CDF_MAX_POINTS.

    With few distinct bins every bin is a point, so the chart is the exact CDF of the binned data; with more, the
    bins where the CDF crosses CDF_LEVELS (1% steps, finer in the tail) are kept, so the tail the gates judge keeps
    its shape. The zero bin (a latency of exactly 0) has no place on a log axis: it counts in the shares but is not
    drawn.
    """
    n = counts.sum(axis=1, keepdims=True).astype(np.float64)
    share = np.divide(counts, n, out=np.zeros(counts.shape, dtype=np.float64), where=n > 0)
    mix = weights @ share
    cdf = np.cumsum(mix)
    if cdf.size == 0 or cdf[-1] <= 0:
        return [], []
    cdf /= cdf[-1]
    present = np.flatnonzero((mix > 0) & (values > 0))
    if len(present) > CDF_MAX_POINTS:
        picks = np.searchsorted(cdf, CDF_LEVELS - 1e-12)
        present = np.unique(np.r_[present[0], np.minimum(picks, len(cdf) - 1), present[-1]])
        present = present[(mix[present] > 0) & (values[present] > 0)]
    return [_r(v) for v in values[present]], [_r(min(y, 1.0)) for y in cdf[present]]


def _distribution_chart(r, cb, ca, w, values, human, gate: Gate) -> dict:
    """Before and after (mix-adjusted) CDFs on a log latency axis, with the gated quantile and its tolerance.

    The horizontal line is the gate's quantile level (0.99 for p99); the vertical lines are the before run's value
    there and the tolerance limit(s): where the after curve crosses the horizontal line right of the limit, the
    estimate is beyond the tolerance. The share axis is logit-scaled (charts draw y_logit), so p50, p90 and p99 are
    evenly spaced and a p99 gate is not squeezed into the top pixel.
    """
    adjusted = "" if len(w) == 1 else " (mix-adjusted)"
    where = f" — {r['cohort']}" if r["per_cohort"] else ""
    bx, by = _cdf_points(cb, w, values)
    ax, ay = _cdf_points(ca, w, values)
    q, before_q = gate.quantile, r["before"]
    stat = gate.statistic
    vlines = []
    if before_q is not None and before_q > 0:
        vlines.append({"x": before_q, "label": f"before {stat} {_secs(before_q)}", "style": "reference"})
        size = gate.tolerance_text()[1:]            # "10%" (the sign is the gate's direction)
        signs = {"increase": (1,), "decrease": (-1,), "either": (-1, 1)}[gate.direction]
        for sign in signs:
            limit = before_q * (1 + sign * gate.tolerance)
            if limit > 0:
                vlines.append({"x": _r(limit), "label": f"{'+' if sign > 0 else '−'}{size} tolerance {_secs(limit)}",
                               "style": "threshold"})
    return {"type": "cdf", "title": f"{human} distribution, before vs after{adjusted}{where}",
            "x_label": f"{human} (s, log scale)", "y_label": "share of requests ≤ x",
            "x_time": False, "x_log": True, "y_log": False, "y_logit": True,
            "series": [{"name": "before", "x": bx, "y": by},
                       {"name": f"after{adjusted}", "x": ax, "y": ay}],
            "hlines": [{"y": q, "label": stat, "style": "reference"}], "vlines": vlines, "vspans": []}


# ------------------------------------------------------------------------------------------------ rate gates


def _rate_gate(con, before, after, gate: Gate, keys, policy: Policy, cache, notes) -> list[dict]:
    for band in ("prompt_band", "output_band"):
        if band in keys:
            missing = co.events_without_band(con, before, after, gate.metric, band)
            if missing:
                keys = tuple(k for k in keys if k != band)
                note = (f"{gate.name}: {missing} of the counted events have no "
                        f"{'prompt' if band == 'prompt_band' else 'output'} token count, so this rate is banded by "
                        f"{' × '.join(keys) or 'nothing'} only (an 'unknown length' band would hide them)")
                if note not in notes:
                    notes.append(note)
    key = ("rate", gate.metric, keys)
    if key not in cache:
        cache[key] = co.rate_counts(con, before, after, gate.metric, keys)
    counts = cache[key]
    base = _gate_base(gate, keys)
    base["unit"] = "share"
    totals, events = counts.totals, counts.events
    total_b, total_a = (int(totals[0].sum()), int(totals[1].sum())) if totals.size else (0, 0)
    if total_b == 0 or total_a == 0:
        sides = [name for name, t in (("before", total_b), ("after", total_a)) if t == 0]
        base["reason"] = f"the {' and '.join(sides)} run{'s' if len(sides) > 1 else ''} cannot tell the {gate.name}"
        if len(sides) == 1:
            base["missing_side"] = sides[0]
        return [base]
    compared = (totals[0] >= policy.min_cohort_requests) & (totals[1] >= policy.min_cohort_requests)
    if not compared.any():
        base["reason"] = f"no cohort has {policy.min_cohort_requests} requests in both runs"
        return [base]
    required = gate.required_requests()

    def fill(r, idx):
        w = totals[0, idx] / totals[0, idx].sum()
        rb = stats.standardised_rate(events[0, idx], totals[0, idx], w)
        ra = stats.standardised_rate(events[1, idx], totals[1, idx], w)
        r["before"], r["after"], r["diff"] = _r(rb.rate), _r(ra.rate), _r(ra.rate - rb.rate)
        r["n_before"], r["n_after"] = int(totals[0, idx].sum()), int(totals[1, idx].sum())
        r["events_before"], r["events_after"] = int(events[0, idx].sum()), int(events[1, idx].sum())
        r["_rates"] = (rb, ra)
        r["p_value"] = stats.newcombe_p_value(rb, ra)

    if gate.per_cohort:
        out = []
        for c in np.flatnonzero(compared):
            if totals[0, c] < required or totals[1, c] < required:
                continue
            r = _gate_base(gate, keys)
            r["cohort"], r["cohort_count"] = counts.labels[c], 1
            fill(r, np.array([c]))
            r["coverage"] = {"before": _r(totals[0, c] / total_b), "after": _r(totals[1, c] / total_a)}
            out.append(r)
        if out:
            return out
        base["cohort"] = "each cohort"
        base["reason"] = f"no cohort has the {required} requests per side that {gate.name} needs"
        return [base]
    idx = np.flatnonzero(compared)
    base["cohort_count"] = len(idx)
    base["cohort"] = (f"all compared cohorts, mix-adjusted ({len(idx)} cohort{'s' if len(idx) != 1 else ''} "
                      f"by {' × '.join(keys) or 'nothing'})")
    nb, na = int(totals[0, idx].sum()), int(totals[1, idx].sum())
    coverage = {"before": _r(nb / total_b), "after": _r(na / total_a)}
    base["coverage"] = coverage
    if nb < required or na < required:
        base.update(n_before=nb, n_after=na)
        base["reason"] = (f"too few requests for the {gate.name}: it needs at least {required} per side in "
                          f"compared cohorts (before has {nb}, after {na})")
        return [base]
    fill(base, idx)
    raw_b, raw_a = events[0].sum() / total_b, events[1].sum() / total_a
    base["naive"] = {"before": _r(raw_b), "after": _r(raw_a), "diff": _r(raw_a - raw_b)}
    low_cov = [side for side in ("before", "after") if coverage[side] < policy.min_coverage]
    if low_cov:
        base["low_coverage"] = (f"only {min(coverage[s] for s in low_cov):.0%} of the {' and '.join(low_cov)} "
                                f"run's requests are in cohorts present in both runs (policy minimum "
                                f"{policy.min_coverage:.0%})")
    order = idx[np.argsort(-totals[0, idx])][:30]
    base["cohorts"] = [{"cohort": counts.labels[c], "n_before": int(totals[0, c]), "n_after": int(totals[1, c]),
                        "before": _r(events[0, c] / totals[0, c]), "after": _r(events[1, c] / totals[1, c]),
                        "compared": True} for c in order]
    base["chart"] = {"type": "bar", "title": f"{gate.name} by cohort, before vs after",
                     "x_label": "cohort", "y_label": f"{gate.name} (%)", "x_time": False, "x_log": False,
                     "y_log": False,
                     "series": [{"name": side, "x": [counts.labels[c] for c in order],
                                 "y": [_r(100 * events[s, c] / totals[s, c]) for c in order]}
                                for s, side in ((0, "before"), (1, "after"))],
                     "hlines": [], "vspans": []}
    return [base]


# ------------------------------------------------------------------------------------------------- verdicts


def _interval_and_verdict(r: dict, level: float) -> None:
    if r["kind"] == "latency":
        lo, hi = stats.percentile_interval(r["_samples"], level)
        # the union with the distribution-free (Woodruff) interval, combined over the two sides by square-and-add
        # (MOVER) on the log scale: the bootstrap alone is too narrow when few observations lie beyond the quantile
        w_lo, w_hi = _woodruff_log_ratio(*r["_woodruff"], level)
        lo, hi = min(lo, w_lo), max(hi, w_hi)
        # widen by the binning bound (±0.5% on a ratio), so the verdict holds for the exact, unbinned quantiles
        lo, hi = lo - stats.LOG_BIN, hi + stats.LOG_BIN
        change, lo_c, hi_c = r["ratio"] - 1, math.exp(lo) - 1, math.exp(hi) - 1
        r["ci_low"], r["ci_high"] = _r(1 + lo_c), _r(1 + hi_c)
    else:
        rb, ra = r["_rates"]
        lo_c, hi_c = stats.newcombe_interval(rb, ra, level)
        change = ra.rate - rb.rate
        r["ci_low"], r["ci_high"] = _r(lo_c), _r(hi_c)
    r["change"], r["change_low"], r["change_high"] = _r(change), _r(lo_c), _r(hi_c)
    tol, direction = r["tolerance"], r["direction"]
    significant = lo_c > 0 or hi_c < 0
    if direction == "increase":
        beyond, within, improved = change > tol, hi_c <= tol, hi_c < 0
    elif direction == "decrease":
        beyond, within, improved = change < -tol, lo_c >= -tol, lo_c > 0
    else:
        beyond, within, improved = abs(change) > tol, (lo_c >= -tol and hi_c <= tol), False
    r["significant"] = bool(significant)
    if significant and beyond:
        r["verdict"] = "fail"
    elif within and not r.get("low_coverage"):
        r["verdict"] = "pass"
    else:
        r["verdict"] = "inconclusive"
        if r.get("low_coverage"):
            r["reason"] = r["low_coverage"]
        elif beyond:
            r["reason"] = f"the estimate is beyond the {r['tolerance_text']} tolerance but the change is not significant"
        else:
            r["reason"] = f"the interval reaches beyond the {r['tolerance_text']} tolerance"
            # requests per side that would narrow the interval to the tolerance if the estimate held (width ∝ 1/√n)
            edge, room = ((hi_c, tol - change) if direction != "decrease" else (lo_c, change + tol))
            if room > 0:
                factor = (abs(edge - change) / room) ** 2
                r["requests_needed"] = math.ceil(max(r["n_before"], r["n_after"]) * factor)
    r["improved"] = bool(improved and r["verdict"] == "pass")


def _pct(change: float) -> str:
    return f"{change * 100:+.1f}%".replace("-", "−")


def _pp(change: float) -> str:
    return f"{change * 100:+.2f} pp".replace("-", "−")


def _share(value: float) -> str:
    return f"{value * 100:.2f}%"


def _criterion_text(r: dict, policy: Policy) -> str:
    """The gate's outcome as a rollback criterion in words (roll back / keep / hold)."""
    where = r["name"] if not r["per_cohort"] else f"{r['name']} in cohort {r['cohort']}"
    if r["cohort"] and not r["per_cohort"] and r.get("cohort_count"):
        where += f" (mix-adjusted over {r['cohort_count']} cohort{'s' if r['cohort_count'] != 1 else ''})"
    if r.get("change") is None:
        return f"hold: {where} cannot be judged: {r['reason']}"
    level = f"{policy.confidence:.0%} CI"
    if r["kind"] == "latency":
        moved = "rose" if r["change"] > 0 else "fell" if r["change"] < 0 else "did not change"
        amount = f"{abs(r['change']) * 100:.1f}%"
        interval = f"[{level} {_pct(r['change_low'])} to {_pct(r['change_high'])}]"
        values = f"({_secs(r['before'])} → {_secs(r['after'])})"
    else:
        moved = "rose" if r["change"] > 0 else "fell" if r["change"] < 0 else "did not change"
        amount = f"{abs(r['change']) * 100:.2f} pp"
        interval = f"[{level} {_pp(r['change_low'])} to {_pp(r['change_high'])}]"
        values = f"({_share(r['before'])} → {_share(r['after'])})"
    head = f"{where} {moved} {amount} {values} {interval}" if r["change"] else f"{where} did not change {values} {interval}"
    tol = r["tolerance_text"]
    if r["verdict"] == "fail":
        return f"roll back: {head}, beyond the {tol} tolerance"
    if r["verdict"] == "pass":
        better = "; a clear improvement" if r.get("improved") else ""
        return f"keep: {head}, within the {tol} tolerance{better}"
    extra = ""
    if r.get("requests_needed"):
        extra = f"; about {r['requests_needed']:,} requests a side would settle it"
    return f"hold: {head}: {r['reason']}{extra}"


def _secs(value: float) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.3g} s"
    return f"{value * 1000:.3g} ms"


def _rule_text(r: dict, policy: Policy, m: int) -> str:
    what = "higher" if r["direction"] == "increase" else "lower" if r["direction"] == "decrease" else "different"
    scope = (f"in cohort {r['cohort']}" if r["per_cohort"]
             else "of the after run re-weighted to the before run's cohort mix")
    size = (f"by more than {r['tolerance'] * 100:g}%" if r["kind"] == "latency"
            else f"by more than {r['tolerance'] * 100:g} percentage points")
    crit = "critical: a failure fails the release" if r["critical"] else "not critical: a failure is a warning"
    return (f"Roll back if {r['name']} {scope} is significantly {what} than before (Holm over {m} gate"
            f"{'s' if m != 1 else ''} at {policy.confidence:.0%} family confidence) and {what} {size}; "
            f"at least {r['min_requests']:,} requests a side; {crit}")


def _overall(results: list[dict], coverage: dict, policy: Policy) -> tuple[str, str]:
    critical = [r for r in results if r["critical"]]
    failed = [r for r in critical if r["verdict"] == "fail"]
    other_fails = [r for r in results if r["verdict"] == "fail" and not r["critical"]]
    warn = ""
    if other_fails:
        warn = (f" Non-critical gate{'s' if len(other_fails) > 1 else ''} failed: "
                + "; ".join(r["rollback_criterion"] for r in other_fails) + ".")
    if failed:
        return "fail", (f"{len(failed)} critical gate{'s' if len(failed) > 1 else ''} failed: "
                        + "; ".join(r["rollback_criterion"] for r in failed) + "." + warn)
    if not coverage["sufficient"]:
        return "inconclusive", coverage["explanation"] + "." + warn
    one_sided = [r for r in results if r.get("missing_side")]
    if one_sided:
        # a metric logged on one side only: the logging changed with the release, so the gate cannot be trusted
        return "inconclusive", ("A gated metric is missing on one side: "
                                + "; ".join(r["rollback_criterion"] for r in one_sided) + "." + warn)
    if not critical:
        return "inconclusive", "The policy has no critical gate, so nothing can pass the release." + warn
    open_ = [r for r in critical if r["verdict"] == "inconclusive"]
    if open_:
        return "inconclusive", (f"No critical gate failed, but {len(open_)} could not be decided: "
                                + "; ".join(r["rollback_criterion"] for r in open_) + "." + warn)
    return "pass", f"All {len(critical)} critical gates pass." + warn


# ------------------------------------------------------------------------------------------ coverage and mix


def _coverage(mix: co.RateCounts, policy: Policy) -> dict:
    n = mix.totals
    compared = (n[0] >= policy.min_cohort_requests) & (n[1] >= policy.min_cohort_requests)
    total_b, total_a = int(n[0].sum()), int(n[1].sum())
    share_b = float(n[0, compared].sum() / total_b) if total_b else 0.0
    share_a = float(n[1, compared].sum() / total_a) if total_a else 0.0
    sufficient = share_b >= policy.min_coverage and share_a >= policy.min_coverage
    labels = mix.labels
    out = {
        "by": list(mix.keys),
        "before": {"requests": total_b, "compared": int(n[0, compared].sum()), "share": _r(share_b)},
        "after": {"requests": total_a, "compared": int(n[1, compared].sum()), "share": _r(share_a)},
        "cohorts_total": len(labels), "cohorts_compared": int(compared.sum()),
        "before_only": [labels[c] for c in np.flatnonzero((n[0] > 0) & (n[1] == 0))][:20],
        "after_only": [labels[c] for c in np.flatnonzero((n[1] > 0) & (n[0] == 0))][:20],
        "min_coverage": policy.min_coverage, "sufficient": bool(sufficient), "explanation": None,
    }
    if not sufficient:
        out["explanation"] = (f"Too little of the traffic is in cohorts present in both runs: {share_b:.0%} of the "
                              f"before run and {share_a:.0%} of the after run (policy minimum "
                              f"{policy.min_coverage:.0%}, cohorts need {policy.min_cohort_requests} requests a side)")
    return out


def _mix_shift(mix: co.RateCounts, policy: Policy, results: list[dict]) -> dict:
    from scipy.special import chdtrc

    n = mix.totals.astype(np.float64)
    keep = n.sum(axis=0) > 0
    n = n[:, keep]
    labels = [label for label, k in zip(mix.labels, keep) if k]
    share = n / n.sum(axis=1, keepdims=True)
    tvd = float(0.5 * np.abs(share[0] - share[1]).sum()) if n.shape[1] else 0.0
    p_value = 1.0
    if n.shape[1] > 1 and n.sum() > 0:
        expected = n.sum(axis=1, keepdims=True) * n.sum(axis=0, keepdims=True) / n.sum()
        statistic = float(((n - expected) ** 2 / expected).sum())
        p_value = float(chdtrc(n.shape[1] - 1, statistic))
    significant = p_value < 1 - policy.confidence and tvd >= policy.mix_shift_min_tvd
    order = np.argsort(-np.abs(share[0] - share[1]))[:20]
    adjusted = []
    for r in results:
        if r.get("naive") and r.get("change") is not None:
            # one shape for latencies and rates: change = ratio − 1 (latency) or after − before (rate)
            naive_change = r["naive"]["ratio"] - 1 if r["kind"] == "latency" else r["naive"]["diff"]
            adjusted.append({"gate": r["name"], "kind": r["kind"], "unit": r["unit"],
                             "naive_before": r["naive"]["before"], "naive_after": r["naive"]["after"],
                             "naive_change": _r(naive_change),
                             "adjusted_before": r["before"], "adjusted_after": r["after"],
                             "adjusted_change": r["change"]})
    summary = None
    if significant:
        top = order[0]
        p_text = f"p={p_value:.2g}" if p_value >= 1e-10 else "p<1e-10"
        summary = (f"The cohort mix shifted (total variation {tvd:.0%}, {p_text}): "
                   f"{labels[top]} went from {share[0, top]:.1%} to {share[1, top]:.1%} of requests")
        if adjusted:
            summary += "; the headline effects are re-weighted to the before run's mix (naive numbers beside them)"
    return {"by": list(mix.keys), "significant": bool(significant), "total_variation": _r(tvd),
            "p_value": _r(p_value), "test": "chi-square test of homogeneity of the cohort counts",
            "min_total_variation": policy.mix_shift_min_tvd, "summary": summary,
            "cohorts": [{"cohort": labels[c], "before_share": _r(share[0, c]), "after_share": _r(share[1, c])}
                        for c in order],
            "naive_vs_adjusted": adjusted}


def _cohort_summaries(mix: co.RateCounts, cache: dict, policy: Policy) -> list[dict]:
    """Per-cohort table for the report: requests and share per side, and latency quantiles where banded alike."""
    n = mix.totals
    compared = (n[0] >= policy.min_cohort_requests) & (n[1] >= policy.min_cohort_requests)
    total = np.maximum(n.sum(axis=1), 1)
    order = np.argsort(-(n[0] + n[1]))[:MAX_COHORT_ROWS]
    rows = {}
    for c in order:
        rows[mix.cohorts[c]] = {"cohort": mix.labels[c],
                                "bands": {k: (v if not isinstance(v, np.generic) else v.item())
                                          for k, v in zip(mix.keys, mix.cohorts[c])},
                                "n_before": int(n[0, c]), "n_after": int(n[1, c]),
                                "share_before": _r(n[0, c] / total[0]), "share_after": _r(n[1, c] / total[1]),
                                "compared": bool(compared[c]), "latency": {}}
    for key, hist in cache.items():
        if key[0] != "hist" or hist.keys != mix.keys or not hist.cohorts:
            continue
        metric = key[1]
        values = stats.bin_values(hist.bins)
        hn = hist.n()
        for c, cohort in enumerate(hist.cohorts):
            row = rows.get(cohort)
            if row is None:
                continue
            entry = {}
            for side, name in ((0, "before"), (1, "after")):
                if hn[side, c]:
                    idx = stats.mixture_quantile_index(hist.counts[side, c:c + 1], np.ones(1), [0.5, 0.9, 0.99])
                    entry[name] = {"n": int(hn[side, c]), "p50": _r(values[idx[0]]), "p90": _r(values[idx[1]]),
                                   "p99": _r(values[idx[2]])}
            row["latency"][metric] = entry
    return [rows[mix.cohorts[c]] for c in order]


# --------------------------------------------------------------------------------------------------- helpers


def _public(r: dict) -> dict:
    return {k: v for k, v in r.items() if not k.startswith("_") and k != "low_coverage"}


def _r(value, digits: int = 6):
    """Round to `digits` significant digits, so documents are compact and stable."""
    if value is None:
        return None
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return value if math.isfinite(value) else None
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def exit_code(doc: dict) -> int:
    return VERDICT_EXIT[doc["verdict"]]
