"""compare_runs: two runs in a store → the compare result document (verdict, gates, coverage, mix shift).

The flow: DuckDB aggregates each run into time batches × cohorts × log-spaced bins (cohorts.py); cohorts short of
requests are merged with adjacent bands; a latency gate's headline compares quantiles of the covariate-adjusted
latency (log latency on log token counts, per model) of the after run re-weighted to the before run's cohort mix,
with the mix-adjusted and naive ratios beside it; intervals are Woodruff's with a batch-means variance (robust to
serial correlation), rates get Newcombe/Wilson intervals at a batch-means effective size (stats.py); every p-value is
the inversion of the gate's own interval, Holm's step-down sets each gate's interval level, and the release gets one
verdict: fail when any non-advisory gate significantly exceeds its tolerance, pass when every critical gate is shown
within it (non-inferiority, each at the full level), else inconclusive.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np

from servlens import __version__
from servlens.compare import cohorts as co
from servlens.compare import stats
from servlens.compare.policy import (COVARIATES, DEFAULT_BY, DEFAULT_COVARIATES, LATENCY_METRICS, Gate, Policy,
                                     load_policy)
from servlens.documents import SCHEMA_VERSION
from servlens.errors import ConfigError, InputError

# Gate charts: a CDF of at most CDF_MAX_POINTS points a series; past that, the bins where the CDF crosses these
# levels (1% steps to p90, then finer and finer in the tail the p99 gates judge: 137 levels).
CDF_MAX_POINTS = 160
CDF_LEVELS = np.r_[0.001, 0.005, np.arange(1, 91) / 100,          # 0.1%, 0.5%, 1% … 90% by 1%
                   np.arange(181, 199) / 200,                        # 90.5% … 99% by 0.5%
                   np.arange(1981, 1999) / 2000,                     # 99.05% … 99.9% by 0.05%
                   np.arange(9991, 10000) / 10000]                   # 99.91% … 99.99% by 0.01%
MAX_COHORT_ROWS = 200        # per-cohort summaries kept in the document (largest first)
MAX_GATE_COHORTS = 40        # per-cohort diagnostics inside one gate
SCATTER_POINTS = 300         # per run, in the residual check chart
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
                   "min_cohort_requests": policy.min_cohort_requests, "min_change_ms": policy.min_change_ms,
                   "seed": seed, "by": list(policy.by) if policy.by is not None else None},
        "method": _method_text(policy),
        "coverage": None, "mix_shift": None, "gates": [], "improvements": [], "cohorts": [], "merged_bands": [],
        "notes": [],
    }
    mix_keys = policy.by if policy.by is not None else DEFAULT_BY
    clock = co.clock_alignment(con, before, after)
    doc["method"]["batches"] = clock.reason
    _token_notes(con, before, after, policy, doc["notes"])
    mix = co.mix_counts(con, before, after, mix_keys)
    mix_merge = co.merge_bands(mix.keys, mix.cohorts, mix.totals, policy.min_cohort_requests)
    doc["coverage"] = _coverage(mix, mix_merge, policy)

    models_b, models_a = set(runs[before]["models"]), set(runs[after]["models"])
    if "model" in mix_keys and models_b and models_a and not models_b & models_a:
        doc["verdict"] = "inconclusive"
        doc["reason"] = (f"The runs share no model (before: {', '.join(sorted(models_b))}; after: "
                         f"{', '.join(sorted(models_a))}), so there are no matched cohorts to compare; to compare "
                         f"across a model change, band without the model (--by prompt_band)")
        doc["mix_shift"] = _mix_shift(mix, policy, [])
        return doc

    cache: dict = {}
    results: list[dict] = []
    for gate in policy.gates:
        keys = policy.bands_for(gate)
        if gate.is_rate:
            results.extend(_rate_gate(con, before, after, gate, keys, policy, cache, doc))
        else:
            results.extend(_latency_gate(con, before, after, gate, keys, policy, cache, seed, doc, clock))

    judged = [r for r in results if r.get("p_value") is not None]
    levels, adjusted = stats.holm_levels([r["p_value"] for r in judged], alpha) if judged else ([], [])
    for r, level, p_adj in zip(judged, levels, adjusted):
        r["p_value_holm"] = _r(p_adj)
        r["confidence"] = _r(1 - level)
        _interval_and_verdict(r, level, alpha, p_adj)
    for r in results:
        if r["verdict"] is None:
            r["verdict"] = "inconclusive"
        r["rollback_criterion"] = _criterion_text(r, policy)
        r["rule"] = _rule_text(r, policy, len(judged))
    doc["gates"] = [_public(r) for r in results]
    doc["improvements"] = [
        {"gate": r["name"], "cohort": r["cohort"], "change": r.get("ratio", r.get("diff")),
         "summary": r["rollback_criterion"].split(": ", 1)[1]}
        for r in results if r.get("improved")
    ]
    doc["mix_shift"] = _mix_shift(mix, policy, results)
    doc["cohorts"] = _cohort_summaries(mix, mix_merge, cache, policy)
    doc["verdict"], doc["reason"] = _overall(results, doc["coverage"], policy)
    if doc["verdict"] != "fail" and doc["coverage"]["cohorts_compared"] == 0:
        # a gate banded more coarsely (a rate whose failures have no token counts) may still fail the release;
        # short of that, no like-for-like comparison was possible
        doc["verdict"] = "inconclusive"
        doc["reason"] = (f"No cohort ({' × '.join(mix_keys)}) has at least {policy.min_cohort_requests} requests in "
                         f"both runs, even with every band merged, so nothing can be compared like for like")
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
        "latency": ("ratio after/before of a quantile. Headline: covariate-adjusted — log latency regressed on log "
                    "prompt tokens (and log output tokens for e2e and decode) per model and run, each run with its "
                    "own intercept and slopes, and the quantiles of the adjusted latencies compared — when the token "
                    "counts are known for at least 90% of each run's requests; else mix-adjusted (the after run's "
                    "cohorts re-weighted to the before run's mix). Both are re-weighted to the before run's cohort "
                    "mix; the mix-adjusted and naive ratios are reported beside the headline"),
        "intervals": (f"batch means: each run is cut into {stats.MIN_BATCHES}–{stats.MAX_BATCHES} consecutive "
                      "time-ordered batches; the variance of the mixture CDF at the quantile (latencies, Woodruff's "
                      "interval, combined over the two runs by square-and-add on the log scale; where a run's "
                      "interval would reach its most extreme request, intersected with a scale-shift test's "
                      "interval, each at half the level) and of the "
                      "standardised rate (rates, Newcombe's hybrid score interval at the effective size) is the "
                      "spread of the batch sums, never below the independent-requests variance, with Student t on "
                      "B − 1 degrees of freedom; robust to serial correlation (bursts, warm-up). Latencies, when both "
                      "runs have absolute arrival times, each spans at most a day and at least 80% of each run's "
                      "requests arrived at a time of day the other covers: the batches are common time-of-day "
                      "windows (paired) and the two runs' batch-means covariance is taken out, so what they share at "
                      "the same clock time (the day's load, an incident both ran through) cancels; each run's "
                      "variance stays at or above its independent-requests variance, and t has the effective number "
                      "of windows that carry the remaining variance"),
        "thin_tails": (f"a quantile is judged only with at least {stats.TAIL_OBSERVATIONS} requests beyond it on "
                       "each side; otherwise the gate judges the highest quantile (5% steps, at least p50) the data "
                       "supports, and the verdict names it"),
        "p_values": ("each gate's p-value is the smallest level at which its own interval excludes no change, so the "
                     "p-value Holm orders by and the reported interval are one method"),
        "multiplicity": (f"Holm step-down over all judged gates at {policy.confidence:.0%} family confidence; each "
                         "gate's interval is at its Holm level"),
        "binning_error": (f"latencies binned on a log scale, bins {100 * (stats.BIN_RATIO - 1):.1f}% wide: each "
                          f"quantile within ±{100 * stats.BINNING_ERROR:.2f}%, each ratio within "
                          f"±{200 * stats.BINNING_ERROR:.1f}%; latency intervals are widened by that bound"),
        "verdict": ("a gate fails when its change is significant under Holm, its estimate is beyond the tolerance "
                    f"and (latencies) the quantile moved at least min_change_ms ({policy.min_change_ms:g} ms by "
                    "default); it passes when a one-sided test at the full level shows it within the tolerance "
                    "(non-inferiority); inconclusive otherwise. The release fails when any non-advisory gate fails, "
                    "passes when every critical gate passes (intersection–union), else is inconclusive"),
        "context": ("Anderson–Darling k-sample test per latency on the headline values: reported as 'the "
                    "distribution changed', never a gate (it assumes independent requests)"),
    }


def _token_notes(con, before: str, after: str, policy: Policy, notes: list[str]) -> None:
    """Say when the token counts the bands need are mostly unknown: then the mix adjustment cannot see length."""
    keys = {k for g in policy.gates for k in policy.bands_for(g)}
    for key, column in (("prompt_band", "prompt_tokens"), ("output_band", "completion_tokens")):
        if key not in keys:
            continue
        rows = con.execute(f"""SELECT run, avg(CASE WHEN {column} IS NULL THEN 1.0 ELSE 0.0 END) FROM requests
                               WHERE run IN (?, ?) AND {co.SUCCEEDED} GROUP BY run ORDER BY run""",
                           [before, after]).fetchall()
        for run, share in rows:
            if share and share > 0.1:
                notes.append(f"{column} is unknown for {share:.0%} of the successful requests of run '{run}': "
                             f"those requests form an 'unknown length' band, so the mix adjustment cannot "
                             f"account for their lengths")


# --------------------------------------------------------------------------------------------- latency gates


def _cached(cache, key, make):
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _gate_base(gate: Gate, keys) -> dict:
    return {"id": f"{gate.metric}_{gate.statistic}", "metric": gate.metric, "statistic": gate.statistic,
            "name": gate.name, "kind": "rate" if gate.is_rate else "latency",
            "unit": "share" if gate.is_rate else "s", "cohort": None, "by": list(keys),
            "direction": gate.direction, "tolerance": gate.tolerance, "tolerance_text": gate.tolerance_text(),
            "critical": gate.critical, "advisory": gate.advisory, "per_cohort": gate.per_cohort,
            "min_requests": gate.required_requests(), "judged_at": None, "thin_tail": None,
            "before": None, "after": None, "n_before": None, "n_after": None, "p_value": None,
            "verdict": None, "reason": None, "chart": None}


def _latency_gate(con, before, after, gate: Gate, keys, policy: Policy, cache, seed, doc,
                  clock: co.Clock = co.UNPAIRED) -> list[dict]:
    human, column = LATENCY_METRICS[gate.metric][1], LATENCY_METRICS[gate.metric][0]
    raw = _cached(cache, ("hist", gate.metric, keys), lambda: co.latency_histograms(con, before, after,
                                                                                     gate.metric, keys, clock=clock))
    base = _gate_base(gate, keys)
    n = raw.n()
    total_b, total_a = (int(n[0].sum()), int(n[1].sum())) if n.size else (0, 0)
    if total_b == 0 or total_a == 0:
        sides = [name for name, total in (("before", total_b), ("after", total_a)) if total == 0]
        if gate.if_present:
            note = (f"{gate.name} is not gated: {human} is measured in the "
                    f"{'after' if total_b == 0 else 'before'} run only" if len(sides) == 1
                    else f"{gate.name} is not gated: neither run measures {human}")
            if note not in doc["notes"]:
                doc["notes"].append(note)
            return []
        base["reason"] = (f"{human} is not measured in the {' and '.join(sides)} run{'s' if len(sides) > 1 else ''} "
                          f"(no successful request has {column})")
        if len(sides) == 1:
            base["missing_side"] = sides[0]
        return [base]

    covariates = COVARIATES.get(gate.metric, DEFAULT_COVARIATES)
    fit = _cached(cache, ("fit", gate.metric), lambda: co.fit_covariates(con, before, after, gate.metric, covariates))
    adjusted = None
    if fit.usable:
        adjusted = _cached(cache, ("adj", gate.metric, keys),
                           lambda: co.latency_histograms(con, before, after, gate.metric, keys, fit, clock))
    head = adjusted if adjusted is not None else raw
    merge = _cached(cache, ("merge", gate.metric, keys, adjusted is not None),
                    lambda: co.merge_bands(keys, head.cohorts, head.n(), policy.min_cohort_requests))
    _note_merges(doc, human, merge)
    if merge.groups == 0:
        base["reason"] = (f"no cohort has {policy.min_cohort_requests} requests with {human} in both runs, even with "
                          f"every band merged")
        return [base]
    values = stats.bin_values(head.bins)
    sb, sa = head.side(0, merge.group, merge.groups), head.side(1, merge.group, merge.groups)
    base["adjustment"] = _adjustment_info(fit, adjusted is not None)
    if gate.per_cohort:
        out = []
        for g in range(merge.groups):
            r = _gate_base(gate, keys)
            r["cohort"], r["cohort_count"] = merge.labels[g], 1
            r["adjustment"] = base["adjustment"]
            one_b, one_a = _only(sb, g), _only(sa, g)
            nb, na = int(one_b.counts.sum()), int(one_a.counts.sum())
            if min(nb, na) < gate.required_requests():
                continue
            r["coverage"] = {"before": _r(nb / total_b), "after": _r(na / total_a)}
            if _judge_latency(r, one_b, one_a, np.ones(1), values, gate, policy, clock.paired):
                r["chart"] = _distribution_chart(r, one_b.counts, one_a.counts, np.ones(1), values, human, gate)
            out.append(r)
        if not out:
            base["cohort"] = "each cohort"
            base["reason"] = f"no cohort has the {gate.required_requests()} requests per side that {gate.name} needs"
            return [base]
        return out

    w = sb.counts.sum(axis=1) / sb.counts.sum()
    nb, na = int(sb.counts.sum()), int(sa.counts.sum())
    head_n = head.n()
    coverage = {"before": _r(nb / max(int(head_n[0].sum()), 1)), "after": _r(na / max(int(head_n[1].sum()), 1))}
    base["coverage"] = coverage
    base["cohort_count"] = merge.groups
    how = "covariate- and mix-adjusted" if adjusted is not None else "mix-adjusted"
    base["cohort"] = (f"all compared cohorts, {how} ({merge.groups} cohort{'s' if merge.groups != 1 else ''} by "
                      f"{' × '.join(keys) or 'nothing'})")
    if min(nb, na) < gate.required_requests():
        base.update(n_before=nb, n_after=na)
        base["reason"] = (f"too few requests for {gate.name}: the policy asks for {gate.required_requests()} per side "
                          f"in compared cohorts (before has {nb}, after {na})")
        return [base]
    judged = _judge_latency(base, sb, sa, w, values, gate, policy, clock.paired)
    q = base["_q_used"]
    if q is not None:
        base["mix_adjusted"] = _point_ratio(raw, gate, policy, q, cache, keys)
        base["naive"] = _naive(raw, q)
    screen = stats.anderson_darling(sb.counts.sum(axis=0), sa.counts.sum(axis=0), values)
    if screen:
        base["distribution_test"] = {k: (_r(v) if isinstance(v, float) else v) for k, v in screen.items()}
    low_cov = [side for side in ("before", "after") if coverage[side] < policy.min_coverage]
    if low_cov:
        base["low_coverage"] = (f"only {min(coverage[s] for s in low_cov):.0%} of the {' and '.join(low_cov)} "
                                f"run's {human} requests are in cohorts present in both runs (policy minimum "
                                f"{policy.min_coverage:.0%})")
    base["cohorts"] = _gate_cohorts(head, merge, values, q or gate.quantile)
    if judged:
        base["chart"] = _distribution_chart(base, sb.counts, sa.counts, w, values, human, gate)
    if adjusted is not None:
        base["residual_chart"] = _cached(cache, ("scatter", gate.metric),
                                         lambda: _residual_chart(con, before, after, gate.metric, fit, seed))
    return [base]


def _only(side: stats.Side, g: int) -> stats.Side:
    mask = side.cohort == g
    return stats.Side(counts=side.counts[g:g + 1], batch=side.batch[mask], cohort=np.zeros(int(mask.sum()),
                      dtype=np.int64), column=side.column[mask], n=side.n[mask])


def _note_merges(doc, human, merge: co.Merge) -> None:
    for sentence in merge.merged:
        text = f"{human}: {sentence}"
        if text not in doc["merged_bands"]:
            doc["merged_bands"].append(text)


def _adjustment_info(fit: co.CovariateFit, used: bool) -> dict:
    return {"headline": "covariate-adjusted" if used else "mix-adjusted",
            "covariates": [f"log {c.replace('_', ' ')}" for c in fit.covariates],
            "known_share": {"before": _r(fit.known_share[0]), "after": _r(fit.known_share[1])},
            "models": [{"model": m, "slopes": {side: [_r(b) for b in f["beta"][s]] for s, side in
                                                 ((0, "before"), (1, "after")) if s in f["beta"]},
                        "r2": _r(f["r2"]),
                        "n_before": int(f["n"][0]), "n_after": int(f["n"][1])} for m, f in fit.models.items()],
            "reason": None if used else (
                "token counts are known for under 90% of a run's requests" if min(fit.known_share) < 0.9
                else "the token counts do not vary, so there is nothing to adjust for")}


def _judge_latency(r, sb: stats.Side, sa: stats.Side, w, values, gate: Gate, policy: Policy,
                   paired: bool = False) -> bool:
    """Point estimate, the quantile actually judged (thin tails), and the interval state Holm needs."""
    nb, na = int(sb.counts.sum()), int(sa.counts.sum())
    r["n_before"], r["n_after"] = nb, na
    q = stats.supported_quantile(gate.quantile, min(nb, na))
    r["_q_used"] = q
    smallest = min(nb, na)
    if q is None:
        idx_b = stats.mixture_quantile_index(sb.counts, w, [gate.quantile])[0]
        idx_a = stats.mixture_quantile_index(sa.counts, w, [gate.quantile])[0]
        r["before"], r["after"] = _r(values[idx_b]), _r(values[idx_a])
        r["ratio"] = _r(_ratio(values[idx_a], values[idx_b]))
        r["reason"] = (f"{gate.name} cannot be judged with {smallest} requests a side: even the median needs "
                       f"{2 * stats.TAIL_OBSERVATIONS} a side")
        return False
    stat = f"p{round(q * 100)}"
    r["judged_at"] = stat
    if q != gate.quantile:
        r["thin_tail"] = (f"{gate.name} cannot be judged with {smallest} requests a side; "
                          f"{LATENCY_METRICS[gate.metric][1]} {stat} is the highest quantile with "
                          f"{stats.TAIL_OBSERVATIONS} requests beyond it on each side")
    if paired:
        qb, qa, info = stats.paired_quantile_sides(sb, sa, w, q)
        r["batch_means"] = {"paired": True, "windows": max(sb.batches, sa.batches),
                            "effective_windows": _r(info["effective_windows"], 3),
                            "correlation": _r(info["correlation"], 3), "df": qb.df}
    else:
        qb, qa = stats.quantile_side(sb, w, q), stats.quantile_side(sa, w, q)
        r["batch_means"] = {"paired": False, "batches": {"before": sb.batches, "after": sa.batches}}
    r["before"], r["after"] = _r(values[qb.estimate]), _r(values[qa.estimate])
    r["ratio"] = _r(_ratio(values[qa.estimate], values[qb.estimate]))
    ratio = stats.QuantileRatio.build(
        qb, qa, np.log(np.maximum(values, 1e-9)),
        lambda: stats.scale_shift(sb, sa, w, values, q, (qb.estimate, qa.estimate), min(qb.df, qa.df), paired),
        (1 - policy.confidence) / max(len(policy.gates), 1))
    r["_quantile"] = ratio
    # which interval the gate reports (stats.QuantileRatio): a reader can tell why a small gate's interval is what it is
    r["interval_method"] = "woodruff+scale_shift" if ratio.combined else "woodruff"

    def excludes(alpha):
        _, lo, hi = ratio.interval(alpha)
        return lo > 0 or hi < 0
    r["p_value"] = stats.inverted_p_value(excludes)
    r["_min_change"] = gate.min_change if gate.min_change is not None else policy.min_change_ms / 1000
    return True


def _point_ratio(raw: co.Histograms, gate, policy, q, cache, keys) -> dict | None:
    """The mix-adjusted ratio (no covariates) at the judged quantile, beside the headline."""
    merge = _cached(cache, ("merge", gate.metric, keys, False),
                    lambda: co.merge_bands(keys, raw.cohorts, raw.n(), policy.min_cohort_requests))
    if merge.groups == 0:
        return None
    sb, sa = raw.side(0, merge.group, merge.groups), raw.side(1, merge.group, merge.groups)
    w = sb.counts.sum(axis=1) / sb.counts.sum()
    values = stats.bin_values(raw.bins)
    b = float(values[stats.mixture_quantile_index(sb.counts, w, [q])[0]])
    a = float(values[stats.mixture_quantile_index(sa.counts, w, [q])[0]])
    return {"before": _r(b), "after": _r(a), "ratio": _r(_ratio(a, b))}


def _naive(raw: co.Histograms, q) -> dict:
    """Every request of each run pooled, no re-weighting (what a by-eye comparison would use)."""
    values = stats.bin_values(raw.bins)
    one = np.ones(1)
    b = float(values[stats.mixture_quantile_index(raw.counts[0].sum(axis=0, keepdims=True), one, [q])[0]])
    a = float(values[stats.mixture_quantile_index(raw.counts[1].sum(axis=0, keepdims=True), one, [q])[0]])
    return {"before": _r(b), "after": _r(a), "ratio": _r(_ratio(a, b))}


def _residual_chart(con, before, after, metric, fit: co.CovariateFit, seed) -> dict:
    """The residual check: log latency against log prompt tokens, both runs, with each model's fitted slopes."""
    human = LATENCY_METRICS[metric][1]
    points = co.scatter_sample(con, before, after, metric, fit.covariates[0], SCATTER_POINTS, seed)
    series = [{"name": side, "x": [_r(x) for x in points[s][0]], "y": [_r(y) for y in points[s][1]]}
              for s, side in ((0, "before"), (1, "after"))]
    slopes = ", ".join(f"{m}: slope {' → '.join(f'{b[0]:.2f}' for _, b in sorted(f['beta'].items()))}, "
                       f"R² {f['r2']:.2f}" for m, f in list(fit.models.items())[:4])
    return {"type": "scatter", "title": f"{human}: log latency against log prompt tokens ({slopes})",
            "x_label": "ln(prompt tokens)", "y_label": f"ln({human} in s)", "x_time": False, "x_log": False,
            "y_log": False, "series": series, "hlines": [], "vspans": []}


def _ratio(a: float, b: float) -> float:
    floor = 1e-9
    return max(float(a), floor) / max(float(b), floor)


def _gate_cohorts(hist, merge: co.Merge, values, q) -> list[dict]:
    rows = []
    for g in range(min(merge.groups, MAX_GATE_COHORTS)):
        members = np.flatnonzero(merge.group == g)
        cb, ca = hist.counts[0, members].sum(axis=0), hist.counts[1, members].sum(axis=0)
        row = {"cohort": merge.labels[g], "n_before": int(cb.sum()), "n_after": int(ca.sum()), "compared": True,
               "before": None, "after": None, "ratio": None}
        if cb.sum() and ca.sum():
            qb = float(values[stats.mixture_quantile_index(cb[None, :], np.ones(1), [q])[0]])
            qa = float(values[stats.mixture_quantile_index(ca[None, :], np.ones(1), [q])[0]])
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
    q, before_q = r.get("_q_used") or gate.quantile, r["before"]
    stat = r.get("judged_at") or gate.statistic
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


def _rate_gate(con, before, after, gate: Gate, keys, policy: Policy, cache, doc) -> list[dict]:
    notes = doc["notes"]
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
    counts = _cached(cache, ("rate", gate.metric, keys),
                     lambda: co.rate_counts(con, before, after, gate.metric, keys))
    base = _gate_base(gate, keys)
    base["unit"] = "share"
    totals, events = counts.totals, counts.events
    total_b, total_a = (int(totals[0].sum()), int(totals[1].sum())) if totals.size else (0, 0)
    if total_b == 0 or total_a == 0:
        sides = [name for name, t in (("before", total_b), ("after", total_a)) if t == 0]
        if gate.if_present:
            note = f"{gate.name} is not gated: the {' and '.join(sides)} run cannot tell it"
            if note not in notes:
                notes.append(note)
            return []
        base["reason"] = f"the {' and '.join(sides)} run{'s' if len(sides) > 1 else ''} cannot tell the {gate.name}"
        if len(sides) == 1:
            base["missing_side"] = sides[0]
        return [base]
    merge = co.merge_bands(keys, counts.cohorts, totals, policy.min_cohort_requests)
    for sentence in merge.merged:
        text = f"{gate.name}: {sentence}"
        if text not in doc["merged_bands"]:
            doc["merged_bands"].append(text)
    if merge.groups == 0:
        base["reason"] = f"no cohort has {policy.min_cohort_requests} requests in both runs, even with every band merged"
        return [base]
    required = gate.required_requests()
    g_tot = np.zeros((2, merge.groups))
    g_ev = np.zeros((2, merge.groups))
    b_tot = np.zeros((2, counts.batch_totals.shape[1], merge.groups))
    b_ev = np.zeros_like(b_tot)
    keep = merge.group >= 0
    for s in (0, 1):
        np.add.at(g_tot[s], merge.group[keep], totals[s, keep])
        np.add.at(g_ev[s], merge.group[keep], events[s, keep])
        for b in range(b_tot.shape[1]):
            np.add.at(b_tot[s, b], merge.group[keep], counts.batch_totals[s, b, keep])
            np.add.at(b_ev[s, b], merge.group[keep], counts.batch_events[s, b, keep])

    def fill(r, idx):
        w = g_tot[0, idx] / g_tot[0, idx].sum()
        rb = stats.standardised_rate(g_ev[0, idx], g_tot[0, idx], w, b_ev[0][:, idx], b_tot[0][:, idx])
        ra = stats.standardised_rate(g_ev[1, idx], g_tot[1, idx], w, b_ev[1][:, idx], b_tot[1][:, idx])
        r["before"], r["after"], r["diff"] = _r(rb.rate), _r(ra.rate), _r(ra.rate - rb.rate)
        r["n_before"], r["n_after"] = int(g_tot[0, idx].sum()), int(g_tot[1, idx].sum())
        r["events_before"], r["events_after"] = int(g_ev[0, idx].sum()), int(g_ev[1, idx].sum())
        r["design_effect"] = {"before": _r(rb.design_effect), "after": _r(ra.design_effect)}
        r["_rates"] = (rb, ra)
        r["p_value"] = stats.newcombe_p_value(rb, ra)

    if gate.per_cohort:
        out = []
        for g in range(merge.groups):
            if g_tot[0, g] < required or g_tot[1, g] < required:
                continue
            r = _gate_base(gate, keys)
            r["cohort"], r["cohort_count"] = merge.labels[g], 1
            fill(r, np.array([g]))
            r["coverage"] = {"before": _r(g_tot[0, g] / total_b), "after": _r(g_tot[1, g] / total_a)}
            out.append(r)
        if out:
            return out
        base["cohort"] = "each cohort"
        base["reason"] = f"no cohort has the {required} requests per side that {gate.name} needs"
        return [base]
    idx = np.arange(merge.groups)
    base["cohort_count"] = merge.groups
    base["cohort"] = (f"all compared cohorts, mix-adjusted ({merge.groups} cohort{'s' if merge.groups != 1 else ''} "
                      f"by {' × '.join(keys) or 'nothing'})")
    nb, na = int(g_tot[0].sum()), int(g_tot[1].sum())
    coverage = {"before": _r(nb / total_b), "after": _r(na / total_a)}
    base["coverage"] = coverage
    if nb < required or na < required:
        base.update(n_before=nb, n_after=na)
        base["reason"] = (f"too few requests for the {gate.name}: the policy asks for {required} per side in "
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
    order = np.argsort(-g_tot[0])[:30]
    base["cohorts"] = [{"cohort": merge.labels[c], "n_before": int(g_tot[0, c]), "n_after": int(g_tot[1, c]),
                        "before": _r(g_ev[0, c] / g_tot[0, c]), "after": _r(g_ev[1, c] / g_tot[1, c]),
                        "compared": True} for c in order]
    base["chart"] = {"type": "bar", "title": f"{gate.name} by cohort, before vs after",
                     "x_label": "cohort", "y_label": f"{gate.name} (%)", "x_time": False, "x_log": False,
                     "y_log": False,
                     "series": [{"name": side, "x": [merge.labels[c] for c in order],
                                 "y": [_r(100 * g_ev[s, c] / g_tot[s, c]) for c in order]}
                                for s, side in ((0, "before"), (1, "after"))],
                     "hlines": [], "vspans": []}
    return [base]


# ------------------------------------------------------------------------------------------------- verdicts


def _bounds(r: dict, alpha: float) -> tuple[float, float, float]:
    """(change, low, high) of the gate's interval at level alpha, on the reported scale (ratio − 1 or pp)."""
    if r["kind"] == "latency":
        est, lo, hi = r["_quantile"].interval(alpha)
        return math.exp(est) - 1, math.exp(lo) - 1, math.exp(hi) - 1
    rb, ra = r["_rates"]
    lo, hi = stats.newcombe_interval(rb, ra, alpha)
    return ra.rate - rb.rate, lo, hi


def _interval_and_verdict(r: dict, level: float, alpha: float, p_holm: float) -> None:
    change, lo_c, hi_c = _bounds(r, level)
    r["ci_low"], r["ci_high"] = (_r(1 + lo_c), _r(1 + hi_c)) if r["kind"] == "latency" else (_r(lo_c), _r(hi_c))
    r["change"], r["change_low"], r["change_high"] = _r(change), _r(lo_c), _r(hi_c)
    # non-inferiority: the one-sided bound at the full level (the two-sided interval at 2·alpha), no Holm split
    _, ni_lo, ni_hi = _bounds(r, min(2 * alpha, 0.999))
    r["noninferiority_bound"] = _r(ni_hi if r["direction"] != "decrease" else ni_lo)
    tol, direction = r["tolerance"], r["direction"]
    significant = p_holm <= alpha
    if direction == "increase":
        beyond, within, improved = change > tol, ni_hi <= tol, significant and change < 0
    elif direction == "decrease":
        beyond, within, improved = change < -tol, ni_lo >= -tol, significant and change > 0
    else:
        beyond, within, improved = abs(change) > tol, (ni_lo >= -tol and ni_hi <= tol), False
    floor_ok = True
    if r["kind"] == "latency":
        moved = abs((r["after"] or 0) - (r["before"] or 0))
        floor_ok = moved >= r["_min_change"]
    r["significant"] = bool(significant)
    if significant and beyond and floor_ok:
        r["verdict"] = "fail"
    elif within and not r.get("low_coverage"):
        r["verdict"] = "pass"
    else:
        r["verdict"] = "inconclusive"
        if r.get("low_coverage"):
            r["reason"] = r["low_coverage"]
        elif significant and beyond:
            r["reason"] = (f"the change is significant and beyond the tolerance, but the quantile moved only "
                           f"{_secs(moved)} (the policy's floor is {_secs(r['_min_change'])})")
        elif beyond:
            r["reason"] = f"the estimate is beyond the {r['tolerance_text']} tolerance but the change is not significant"
        else:
            r["reason"] = f"the one-sided bound reaches beyond the {r['tolerance_text']} tolerance"
        _detectable(r, level)
    r["improved"] = bool(improved and r["verdict"] != "fail")


def _detectable(r: dict, level: float) -> None:
    """Minimum detectable effect at this size (80% power at the gate's Holm level), and the requests per side that
    would detect the tolerance, from the observed interval width (width ∝ 1/√n)."""
    if r["kind"] == "latency":
        _, lo, hi = r["_quantile"].interval(level)
        t = stats.critical(level, r["_quantile"].df)
        se = max((hi - lo - 2 * stats.LOG_BIN) / (2 * t), 1e-12)
        mde_scale = (t + stats.POWER_Z) * se
        r["detectable_change"] = _r(math.exp(mde_scale) - 1)
        target = math.log1p(r["tolerance"]) if r["tolerance"] > 0 else None
        t = stats.critical(level, 10**9)     # at the size that would detect the tolerance, t is the normal z
    else:
        rb, ra = r["_rates"]
        lo, hi = stats.newcombe_interval(rb, ra, level)
        t = stats.critical(level, 10**9)
        se = max((hi - lo) / (2 * t), 1e-12)
        mde_scale = (t + stats.POWER_Z) * se
        r["detectable_change"] = _r(mde_scale)
        target = r["tolerance"] if r["tolerance"] > 0 else None
    if target:
        n = max(r["n_before"], r["n_after"])
        r["requests_needed"] = max(n, math.ceil(n * ((t + stats.POWER_Z) * se / target) ** 2))


def _pct(change: float) -> str:
    return f"{change * 100:+.1f}%".replace("-", "−")


def _times(ratio: float) -> str:
    return f"×{ratio:.3g}"


def _pp(change: float) -> str:
    return f"{change * 100:+.2f} pp".replace("-", "−")


def _share(value: float) -> str:
    return f"{value * 100:.2f}%"


def _criterion_text(r: dict, policy: Policy) -> str:
    """The gate's outcome as a rollback criterion in words (roll back / keep / hold)."""
    where = r["name"] if not r["per_cohort"] else f"{r['name']} in cohort {r['cohort']}"
    judged = where
    if r.get("judged_at") and r["judged_at"] != r["statistic"]:
        judged = f"{LATENCY_METRICS[r['metric']][1]} {r['judged_at']}"
        if r["per_cohort"]:
            judged += f" in cohort {r['cohort']}"
    if r["cohort"] and not r["per_cohort"] and r.get("cohort_count"):
        how = r.get("adjustment", {}).get("headline", "mix-adjusted")
        judged += f" ({how} over {r['cohort_count']} cohort{'s' if r['cohort_count'] != 1 else ''})"
    prefix = f"{r['thin_tail'].split(';')[0]}; " if r.get("thin_tail") else ""
    if r.get("change") is None:
        return f"hold: {where} cannot be judged: {r['reason']}"
    level = f"{policy.confidence:.0%} CI"
    moved = "rose" if r["change"] > 0 else "fell" if r["change"] < 0 else "did not change"
    if r["kind"] == "latency":
        big = r["ratio"] >= 2 or r["ratio"] <= 0.5
        if big:
            amount = _times(r["ratio"])
            interval = f"[{level} {_times(r['ci_low'])} to {_times(r['ci_high'])}]"
        else:
            amount = f"{abs(r['change']) * 100:.1f}%"
            interval = f"[{level} {_pct(r['change_low'])} to {_pct(r['change_high'])}]"
        values = f"({_secs(r['before'])} → {_secs(r['after'])})"
    else:
        amount = f"{abs(r['change']) * 100:.2f} pp"
        interval = f"[{level} {_pp(r['change_low'])} to {_pp(r['change_high'])}]"
        values = f"({_share(r['before'])} → {_share(r['after'])})"
    head = (f"{prefix}{judged} {moved} {amount} {values} {interval}" if r["change"]
            else f"{prefix}{judged} did not change {values} {interval}")
    tol = r["tolerance_text"]
    if r["verdict"] == "fail":
        if r.get("advisory"):
            return f"note: {head}, beyond the {tol} tolerance (advisory gate: reported, does not fail the release)"
        return f"roll back: {head}, beyond the {tol} tolerance"
    if r["verdict"] == "pass":
        better = "; a clear improvement" if r.get("improved") else ""
        bound = r["noninferiority_bound"]
        shown = (_pct(bound) if r["kind"] == "latency" else _pp(bound))
        return (f"keep: {head}, within the {tol} tolerance (one-sided {policy.confidence:.0%} bound {shown})"
                f"{better}")
    extra = ""
    if r.get("detectable_change") is not None:
        d = r["detectable_change"]
        mde = ((f"{d * 100:.1f}%" if d < 1 else _times(1 + d)) if r["kind"] == "latency" else f"{d * 100:.2f} pp")
        extra = f"; at this size it detects changes of about {mde}"
        if r.get("requests_needed"):
            extra += f", and about {r['requests_needed']:,} requests a side would detect the {tol} tolerance"
    return f"hold: {head}: {r['reason']}{extra}"


def _secs(value: float) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 0.001:
        return f"{value * 1000:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def _rule_text(r: dict, policy: Policy, m: int) -> str:
    what = "higher" if r["direction"] == "increase" else "lower" if r["direction"] == "decrease" else "different"
    scope = (f"in cohort {r['cohort']}" if r["per_cohort"]
             else "of the after run re-weighted to the before run's cohort mix")
    size = (f"by more than {r['tolerance'] * 100:g}%" if r["kind"] == "latency"
            else f"by more than {r['tolerance'] * 100:g} percentage points")
    floor = ""
    if r["kind"] == "latency":
        floor = f" and by at least {_secs(r.get('_min_change', policy.min_change_ms / 1000))}"
    role = ("advisory: reported, never fails the release" if r.get("advisory")
            else "critical: must be shown within tolerance for the release to pass, and fails it when it fails"
            if r["critical"] else "not critical: fails the release when it fails, not needed for a pass")
    return (f"Roll back if {r['name']} {scope} is significantly {what} than before (Holm over {m} gate"
            f"{'s' if m != 1 else ''} at {policy.confidence:.0%} family confidence) and {what} {size}{floor}; "
            f"{role}")


def _overall(results: list[dict], coverage: dict, policy: Policy) -> tuple[str, str]:
    critical = [r for r in results if r["critical"]]
    failed = [r for r in results if r["verdict"] == "fail" and not r.get("advisory")]
    if failed:
        return "fail", (f"{len(failed)} gate{'s' if len(failed) > 1 else ''} failed: "
                        + "; ".join(r["rollback_criterion"] for r in failed) + ".")
    if not coverage["sufficient"]:
        return "inconclusive", coverage["explanation"] + "."
    one_sided = [r for r in results if r.get("missing_side")]
    if one_sided:
        # a metric logged on one side only: the logging changed with the release, so the gate cannot be trusted
        return "inconclusive", ("A gated metric is missing on one side: "
                                + "; ".join(r["rollback_criterion"] for r in one_sided) + ".")
    if not critical:
        return "inconclusive", "The policy has no critical gate, so nothing can pass the release."
    open_ = [r for r in critical if r["verdict"] != "pass"]
    if open_:
        return "inconclusive", (f"No gate failed, but {len(open_)} critical gate{'s' if len(open_) > 1 else ''} "
                                f"could not be shown within tolerance: "
                                + "; ".join(r["rollback_criterion"] for r in open_) + ".")
    return "pass", f"All {len(critical)} critical gates pass."


# ------------------------------------------------------------------------------------------ coverage and mix


def _coverage(mix: co.RateCounts, merge: co.Merge, policy: Policy) -> dict:
    n = mix.totals
    compared = merge.group >= 0
    total_b, total_a = int(n[0].sum()), int(n[1].sum())
    share_b = float(n[0, compared].sum() / total_b) if total_b else 0.0
    share_a = float(n[1, compared].sum() / total_a) if total_a else 0.0
    sufficient = share_b >= policy.min_coverage and share_a >= policy.min_coverage
    labels = mix.labels
    out = {
        "by": list(mix.keys),
        "before": {"requests": total_b, "compared": int(n[0, compared].sum()), "share": _r(share_b)},
        "after": {"requests": total_a, "compared": int(n[1, compared].sum()), "share": _r(share_a)},
        "cohorts_total": len(labels), "cohorts_compared": merge.groups, "bands_compared": int(compared.sum()),
        "merged": merge.merged,
        "before_only": [labels[c] for c in np.flatnonzero((n[0] > 0) & (n[1] == 0))][:20],
        "after_only": [labels[c] for c in np.flatnonzero((n[1] > 0) & (n[0] == 0))][:20],
        "min_coverage": policy.min_coverage, "sufficient": bool(sufficient), "explanation": None,
    }
    if not sufficient:
        out["explanation"] = (f"Too little of the traffic is in cohorts present in both runs: {share_b:.0%} of the "
                              f"before run and {share_a:.0%} of the after run (policy minimum "
                              f"{policy.min_coverage:.0%}, cohorts need {policy.min_cohort_requests} requests a side, after merging bands)")
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


def _cohort_summaries(mix: co.RateCounts, merge: co.Merge, cache: dict, policy: Policy) -> list[dict]:
    """Per-cohort table for the report: requests and share per side, the merged cohort it went into, and latency
    quantiles where banded alike."""
    n = mix.totals
    compared = merge.group >= 0
    total = np.maximum(n.sum(axis=1), 1)
    order = np.argsort(-(n[0] + n[1]))[:MAX_COHORT_ROWS]
    rows = {}
    for c in order:
        rows[mix.cohorts[c]] = {"cohort": mix.labels[c],
                                "bands": {k: (v if not isinstance(v, np.generic) else v.item())
                                          for k, v in zip(mix.keys, mix.cohorts[c])},
                                "n_before": int(n[0, c]), "n_after": int(n[1, c]),
                                "share_before": _r(n[0, c] / total[0]), "share_after": _r(n[1, c] / total[1]),
                                "compared": bool(compared[c]),
                                "merged_into": merge.labels[merge.group[c]] if compared[c] else None,
                                "latency": {}}
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
