"""Cohorts and the per-cohort summaries DuckDB aggregates for compare.

A cohort is one combination of band values (model × log2 prompt band × …). DuckDB groups the two runs' requests
into cohorts × log-spaced latency bins (latencies) or cohorts × counts (rates); Python receives those aggregates,
never request rows, as polars frames (DuckDB → Arrow → polars, _frame), and hands numpy arrays to stats.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from servlens.analysis.failures import failed
from servlens.analysis.vocabulary import band_label as length_band_label
from servlens.analysis.vocabulary import length_band, status_known, timeout
from servlens.compare.policy import LATENCY_METRICS
from servlens.compare.stats import MAX_BATCHES, MIN_BATCHES, REQUESTS_PER_BATCH, Side, bin_sql, run_slopes

UNKNOWN_BAND = -99   # a NULL token count: its own band, labelled "unknown"
NO_MODEL = "(no model)"

_BAND_SQL = {
    "model": f"coalesce(model, '{NO_MODEL}')",
    "served_model": f"coalesce(served_model, '{NO_MODEL}')",
    "deployment": "coalesce(deployment, '(no deployment)')",
    "provider": "coalesce(provider, '(no provider)')",
    # the log2 bands of servlens/analysis/vocabulary.py (workload and rules read the same); unknown is its own band
    "prompt_band": f"coalesce({length_band('prompt_tokens')}, {UNKNOWN_BAND})",
    "output_band": f"coalesce({length_band('completion_tokens')}, {UNKNOWN_BAND})",
}
# A request that got no answer (servlens/analysis/failures.py): excluded from latencies, counted by error_rate.
SUCCEEDED = f"NOT {failed()}"

# rate metric -> (denominator condition, event condition); NULL is unknown, so it is never in a denominator
RATE_SQL = {
    "error_rate": (status_known(), failed()),
    "length_rate": (f"finish_reason IS NOT NULL AND finish_reason <> 'unknown' AND {SUCCEEDED}",
                    "finish_reason = 'length'"),
    "timeout_rate": (status_known(), timeout()),
    "leakage_rate": (f"content_has_reasoning_marker IS NOT NULL AND {SUCCEEDED}",
                     "content_has_reasoning_marker"),
}


def band_label(key: str, value) -> str:
    if key in ("prompt_band", "output_band"):
        noun = "prompt" if key == "prompt_band" else "output"
        return length_band_label(None if value == UNKNOWN_BAND else int(value), noun)
    return str(value)


def cohort_label(keys: tuple[str, ...], values: tuple) -> str:
    return " / ".join(band_label(k, v) for k, v in zip(keys, values)) or "all requests"


@dataclass
class Histograms:
    """Two runs' latency histograms over the same cohorts and bins, dense and per time batch."""

    keys: tuple[str, ...]
    cohorts: list[tuple]          # band values per cohort, in cohort-id order
    bins: np.ndarray              # (bins,) sorted bin ids
    counts: np.ndarray            # (2, cohorts, bins): side 0 = before, 1 = after
    cells: tuple = ()             # per side: (batch, cohort, column, n) arrays, the batch-means input

    @property
    def labels(self) -> list[str]:
        return [cohort_label(self.keys, c) for c in self.cohorts]

    def n(self) -> np.ndarray:
        return self.counts.sum(axis=2)   # (2, cohorts)

    def side(self, s: int, group: np.ndarray | None = None, groups: int = 0) -> Side:
        """Side s as stats.Side; with `group` (cohort -> merged cohort or -1), cohorts summed into groups."""
        batch, cohort, column, n = self.cells[s]
        counts = self.counts[s]
        if group is not None:
            merged = np.zeros((groups, counts.shape[1]), dtype=np.int64)
            keep = group >= 0
            np.add.at(merged, group[keep], counts[keep])
            counts = merged
            mask = group[cohort] >= 0
            batch, cohort, column, n = batch[mask], group[cohort[mask]], column[mask], n[mask]
        return Side(counts=counts, batch=batch, cohort=cohort, column=column, n=n.astype(np.float64))


@dataclass
class RateCounts:
    keys: tuple[str, ...]
    cohorts: list[tuple]
    totals: np.ndarray            # (2, cohorts) denominators
    events: np.ndarray            # (2, cohorts)
    batch_totals: np.ndarray | None = None   # (2, batches, cohorts)
    batch_events: np.ndarray | None = None

    @property
    def labels(self) -> list[str]:
        return [cohort_label(self.keys, c) for c in self.cohorts]


@dataclass
class CovariateFit:
    """Per model: each run's own slopes of log latency on log token counts."""

    covariates: tuple[str, ...]              # canonical columns (prompt_tokens, completion_tokens)
    models: dict       # model -> {"beta" {side: (k,)}, "r2", "centre" (before run's mean log x), "n" [before, after]}
    known_share: tuple[float, float]          # share of each side's rows with every covariate known

    @property
    def usable(self) -> bool:
        return min(self.known_share) >= COVARIATE_MIN_SHARE and any(
            np.any(b != 0) for m in self.models.values() for b in m["beta"].values())


COVARIATE_MIN_SHARE = 0.9   # the adjusted headline needs the covariates on at least 90% of each run's rows


def _frame(con, sql: str, params=None):
    """A query's result as a polars frame: DuckDB → Arrow (its C stream interface; no pyarrow, no Python rows) →
    polars; on an engine, its Arrow result → polars (CompareConnection.sql)."""
    import polars as pl

    con.complete()   # a relation cannot start while an execute() result is unread: run that one to its end first
    return pl.DataFrame(con.sql(sql, params=params))


def _cohort_ids(frame, keys: tuple[str, ...]) -> tuple[list[tuple], np.ndarray]:
    """The cohorts of an aggregate frame (distinct band values, sorted) and each row's cohort index."""
    if not keys:
        return ([()] if frame.height else []), np.zeros(frame.height, dtype=np.int64)
    table = frame.select(keys).unique().sort(keys)
    ids = frame.select(keys).join(table.with_row_index("cohort"), on=list(keys), how="left",
                                  maintain_order="left")["cohort"]
    return table.rows(), ids.to_numpy().astype(np.int64)


def _ints(frame, column: str) -> np.ndarray:
    return frame[column].to_numpy().astype(np.int64)


# The order of a run's requests for its time batches: arrival, ties (a burst sent at once) broken by stored order,
# which sits below the microsecond (× 2^64). In the store, stored order is the row id; an engine has no row id, and
# the connection that runs compare there names the order the export wrote each run in instead (its `stored_order`:
# source file, then line, the order ingest numbered the rows in; servlens/engines/compare.py).
STORED_ORDER = "requests.rowid"
BELOW_THE_MICROSECOND = 18446744073709551616


def _stored_order(con) -> str:
    return getattr(con, "stored_order", STORED_ORDER)


def _order_key(con, time_us: str = "epoch_us(t_arrival)") -> str:
    return f"({time_us}::HUGEINT * {BELOW_THE_MICROSECOND} + {_stored_order(con)})"


DAY_US = 86_400_000_000
ABSOLUTE_CLOCK_FROM = "2000-01-01"   # arrival times before this are a relative clock (seconds since a run's start)
PAIRING_MIN_OVERLAP = 0.8            # share of each run's requests at a time of day the other run covers too


@dataclass
class Clock:
    """How the time batches of the two runs are cut.

    Unpaired: each run on its own, in arrival order. Paired: common time-of-day windows for both runs, so the
    batch-means variance can subtract what the runs share at the same clock time (diurnal load, an incident both
    ran through) — valid only when both runs have absolute arrival times and cover the same hours of the day.
    """

    paired: bool
    reason: str
    origin_us: int | None = None                # the fold of the day: the centre of the before run's hours
    overlap: tuple[float, float] | None = None  # share of each run's requests in hours the other covers

    def folded_sql(self) -> str:
        """A row's time of day relative to origin_us, in µs, folded into [−12 h, 12 h)."""
        half = DAY_US // 2
        return (f"((((epoch_us(t_arrival) - {self.origin_us}) + {half}) % {DAY_US} + {DAY_US}) % {DAY_US} "
                f"- {half})")


UNPAIRED = Clock(False, "unpaired")


def clock_alignment(con, before: str, after: str) -> Clock:
    """Paired time-of-day windows when both runs have absolute arrival times for every request, each spans at
    most a day, and at least PAIRING_MIN_OVERLAP of each run's requests arrived at a time of day the other run
    also covers (its 1st to 99th percentile of the folded time of day); else unpaired, with the reason."""
    rows = {r[0]: r[1:] for r in con.execute(f"""
        SELECT run, count(*), count(t_arrival), min(t_arrival) < TIMESTAMP '{ABSOLUTE_CLOCK_FROM}',
               epoch_us(quantile_disc(t_arrival, 0.01)), epoch_us(quantile_disc(t_arrival, 0.99))
        FROM requests WHERE run IN (?, ?) GROUP BY run""", [before, after]).fetchall()}
    for run in (before, after):
        n, timed, relative, lo, hi = rows.get(run, (0, 0, None, None, None))
        if not n or timed < n:
            return Clock(False, f"unpaired: arrival times are unknown for {n - timed:,} of run '{run}''s "
                                f"{n:,} requests, so time batches follow each run's stored order")
        if relative:
            return Clock(False, f"unpaired: run '{run}' has relative arrival times (before {ABSOLUTE_CLOCK_FROM}), "
                                "which do not say at what time of day its requests ran")
        if hi - lo > DAY_US:
            return Clock(False, f"unpaired: run '{run}' spans more than a day, so a time of day is not one window")
    lo_b, hi_b = rows[before][3], rows[before][4]
    probe = Clock(True, "", origin_us=(lo_b + hi_b) // 2)
    folded = probe.folded_sql()
    spans = {r[0]: (r[1], r[2]) for r in con.execute(f"""
        SELECT run, quantile_cont({folded}, 0.01), quantile_cont({folded}, 0.99)
        FROM requests WHERE run IN (?, ?) GROUP BY run""", [before, after]).fetchall()}
    (lo0, hi0), (lo1, hi1) = spans[before], spans[after]
    share_b, share_a = con.execute(f"""
        SELECT avg(CASE WHEN {folded} BETWEEN {lo1} AND {hi1} THEN 1.0 ELSE 0.0 END) FILTER (WHERE run = $before),
               avg(CASE WHEN {folded} BETWEEN {lo0} AND {hi0} THEN 1.0 ELSE 0.0 END) FILTER (WHERE run = $after)
        FROM requests WHERE run IN ($before, $after)""", {"before": before, "after": after}).fetchone()
    overlap = (float(share_b), float(share_a))
    if min(overlap) < PAIRING_MIN_OVERLAP:
        return Clock(False, f"unpaired: the runs cover different hours of the day ({overlap[0]:.0%} of the before "
                            f"run's and {overlap[1]:.0%} of the after run's requests arrived at a time of day the "
                            f"other run covers; pairing needs {PAIRING_MIN_OVERLAP:.0%})", overlap=overlap)
    return Clock(True, f"paired by time of day: {overlap[0]:.0%} of the before run's and {overlap[1]:.0%} of the "
                       "after run's requests arrived at a time of day the other run covers",
                 origin_us=probe.origin_us, overlap=overlap)


def _batch_count(n: int) -> int:
    return min(MAX_BATCHES, max(min(n, MIN_BATCHES), n // REQUESTS_PER_BATCH)) if n else 1


def _batch_case(con, before: str, after: str, where: str, params: dict, join: str = "",
                clock: Clock = UNPAIRED) -> str:
    """SQL for the time batch of each row selected by `where`.

    Unpaired: 10–50 consecutive batches of about equal size per run (about 5 requests a batch in between,
    stats.MAX_BATCHES …), in arrival order with ties (a burst sent at once) broken by stored order; stored order
    alone when some arrival times are unknown. Paired (`clock.paired`): the same time-of-day windows for both
    runs, cut at the pooled quantiles of the folded time of day, as many as the smaller run would get; batch k of
    the before run and batch k of the after run then cover the same hours.

    The cut points are quantiles of the order key over the selected rows (one aggregate, no row numbering), so the
    query that uses them only compares each row's key with constants.
    """
    if clock.paired:
        sizes = dict(con.execute(f"SELECT run, count(*) FROM requests {join} WHERE ({where}) GROUP BY run",
                                 params).fetchall())
        batches = _batch_count(min(sizes.get(before, 0), sizes.get(after, 0)))
        key = _order_key(con, clock.folded_sql())
        if batches <= 1:
            return "0"
        levels = [k / batches for k in range(1, batches)]
        # the cuts come back as text: a 128-bit integer has no Arrow type every engine returns
        cuts = con.execute(f"SELECT CAST(quantile_disc({key}, {levels}) AS VARCHAR[]) FROM requests {join} "
                           f"WHERE ({where})", params).fetchone()[0]
        steps = " ".join(f"WHEN {key} < {int(c)}::HUGEINT THEN {i}" for i, c in enumerate(cuts))
        return f"(CASE {steps} ELSE {len(cuts)} END)"
    cases = []
    for run in (before, after):
        n, timed = con.execute(f"SELECT count(*), count(t_arrival) FROM requests {join} WHERE ({where}) "
                               f"AND run = $run", {**params, "run": run}).fetchone()
        batches = _batch_count(n)
        key = _order_key(con) if n and timed == n else _stored_order(con)
        cuts = []
        if batches > 1:
            levels = [k / batches for k in range(1, batches)]
            cuts = con.execute(f"SELECT CAST(quantile_disc({key}, {levels}) AS VARCHAR[]) FROM requests {join} "
                               f"WHERE ({where}) AND run = $run", {**params, "run": run}).fetchone()[0]
        steps = " ".join(f"WHEN {key} < {int(c)}::HUGEINT THEN {i}" for i, c in enumerate(cuts))
        inner = f"CASE {steps} ELSE {len(cuts)} END" if cuts else "0"
        cases.append(f"WHEN run = '{run.replace(chr(39), chr(39) * 2)}' THEN ({inner})")
    return f"(CASE {' '.join(cases)} END)"


def _latency_where(column: str) -> str:
    return (f"run IN ($before, $after) AND {column} IS NOT NULL AND isfinite({column}) "
            f"AND {SUCCEEDED}")


def fit_covariates(con, before: str, after: str, metric: str, covariates: tuple[str, ...]) -> CovariateFit:
    """Regress log latency on log covariates per model and run (one DuckDB pass; stats.run_slopes says why per run)."""
    column = LATENCY_METRICS[metric][0]
    known = " AND ".join(f"{c} IS NOT NULL AND {c} > 0" for c in covariates)
    xs = [f"ln({c})" for c in covariates]
    k = len(xs)
    sums = [f"sum({x})" for x in xs] + [f"sum({xs[i]} * {xs[j]})" for i in range(k) for j in range(k)]
    sums += [f"sum({x} * ln({column}))" for x in xs]
    rows = con.execute(f"""
        SELECT coalesce(model, '{NO_MODEL}') AS m, CASE WHEN run = $before THEN 0 ELSE 1 END AS side,
               count(*) FILTER (WHERE {known} AND {column} > 0) AS n_known, count(*) AS n_all,
               {', '.join(f"coalesce({s} FILTER (WHERE {known} AND {column} > 0), 0)" for s in sums)},
               coalesce(sum(ln({column})) FILTER (WHERE {known} AND {column} > 0), 0),
               coalesce(sum(ln({column}) * ln({column})) FILTER (WHERE {known} AND {column} > 0), 0)
        FROM requests WHERE {_latency_where(column)} GROUP BY ALL ORDER BY m, side""",
                       {"before": before, "after": after}).fetchall()   # models in name order on every engine
    per_model: dict = {}
    known_n, all_n = [0, 0], [0, 0]
    for row in rows:
        model, side, n_known, n_all = row[:4]
        values = np.asarray(row[4:], dtype=np.float64)
        known_n[side] += n_known
        all_n[side] += n_all
        x = values[:k]
        xx = values[k:k + k * k].reshape(k, k)
        xy = values[k + k * k:k + k * k + k]
        y, yy = values[-2], values[-1]
        per_model.setdefault(model, {})[side] = {"n": n_known, "x": x, "y": y, "xx": xx, "xy": xy, "yy": yy}
    models = {}
    for model, by_side in per_model.items():
        beta, r2 = run_slopes(by_side)
        ref = by_side.get(0) or by_side.get(1)
        centre = ref["x"] / ref["n"] if ref["n"] else np.zeros(k)
        models[model] = {"beta": beta, "r2": r2, "centre": centre,
                         "n": [by_side.get(s, {"n": 0})["n"] for s in (0, 1)]}
    share = tuple(known_n[s] / all_n[s] if all_n[s] else 0.0 for s in (0, 1))
    return CovariateFit(tuple(covariates), models, share)


def latency_histograms(con: duckdb.DuckDBPyConnection, before: str, after: str, metric: str,
                       keys: tuple[str, ...], fit: CovariateFit | None = None,
                       clock: Clock = UNPAIRED) -> Histograms:
    """Per side × time batch × cohort × bin counts of a latency metric (successful requests, value known and finite).

    With `fit`, the value binned is the covariate-adjusted latency exp(ln y − β·(ln x − x̄)), β the request's run's
    own slopes and x̄ the before run's mean log covariate of the model: the latency each request would have had at
    the before run's typical lengths.
    Only rows with every covariate known enter then. `clock` says how the time batches are cut (_batch_case).
    """
    column = LATENCY_METRICS[metric][0]
    bands = ", ".join(f"{_BAND_SQL[k]} AS {k}" for k in keys)
    select_bands = (bands + ", ") if bands else ""
    params = {"before": before, "after": after}
    value, join, where = column, "", _latency_where(column)
    if fit is not None:
        rows = [(m, side, *[float(b) for b in beta], *[float(c) for c in f["centre"]])
                for m, f in fit.models.items() for side, beta in f["beta"].items()]
        k = len(fit.covariates)
        names = [f"b{j}" for j in range(k)] + [f"c{j}" for j in range(k)]
        frame = {"m": np.array([r[0] for r in rows], dtype=object),
                 "side": np.array([r[1] for r in rows], dtype=np.int64)}
        for j, name in enumerate(names):
            frame[name] = np.array([r[2 + j] for r in rows], dtype=np.float64)
        con.register("_servlens_cmp_fit", frame)
        shift = " + ".join(f"f.b{j} * (ln({c}) - f.c{j})" for j, c in enumerate(fit.covariates))
        value = f"exp(ln({column}) - ({shift}))"
        join = (f"JOIN _servlens_cmp_fit f ON f.m = coalesce(requests.model, '{NO_MODEL}') "
                f"AND f.side = CASE WHEN run = $before THEN 0 ELSE 1 END")
        where += f" AND {column} > 0 AND " + " AND ".join(f"{c} IS NOT NULL AND {c} > 0" for c in fit.covariates)
    batch = _batch_case(con, before, after, where, params, join, clock)
    agg = f"""
        WITH base AS (
            SELECT CASE WHEN run = $before THEN 0 ELSE 1 END AS side, {select_bands}{value} AS v, {batch} AS batch
            FROM requests {join} WHERE {where})
        SELECT side, {', '.join(keys) + ', ' if keys else ''}batch, {bin_sql('v')} AS bin, count(*) AS n
        FROM base GROUP BY ALL"""
    # in one order every time: the batch means sum these cells in floating point, and a GROUP BY answers in
    # whatever order its threads finish (the same compare twice differed in a p-value's last digit)
    frame = _frame(con, agg, params)
    frame = frame.sort(frame.columns[:-1], nulls_last=True)
    if fit is not None:
        con.unregister("_servlens_cmp_fit")
    if frame.height == 0:
        empty = (np.zeros(0, dtype=np.int64),) * 3 + (np.zeros(0),)
        return Histograms(keys, [], np.zeros(0, dtype=np.int64), np.zeros((2, 0, 0), dtype=np.int64),
                          (empty, empty))
    cohorts, cohort = _cohort_ids(frame, keys)
    bins, column_of = np.unique(_ints(frame, "bin"), return_inverse=True)
    side, batch, n = _ints(frame, "side"), _ints(frame, "batch"), _ints(frame, "n")
    counts = np.zeros((2, len(cohorts), len(bins)), dtype=np.int64)
    np.add.at(counts, (side, cohort, column_of), n)
    cells = tuple((batch[side == s], cohort[side == s], column_of[side == s], n[side == s]) for s in (0, 1))
    return Histograms(keys, cohorts, bins, counts, cells)


def scatter_sample(con, before: str, after: str, metric: str, covariate: str, per_side: int = 300,
                   seed: int = 0) -> dict:
    """Up to `per_side` (log covariate, log latency) points per run, for the residual check chart: a pseudo-random
    sample by the md5 of each request's id, line and the seed (md5 is the one hash every engine computes alike)."""
    column = LATENCY_METRICS[metric][0]
    out = {}
    for s, run in ((0, before), (1, after)):
        rows = con.execute(f"""
            SELECT ln({covariate}), ln({column}) FROM requests
            WHERE run = ? AND {column} > 0 AND isfinite({column}) AND {SUCCEEDED}
              AND {covariate} > 0
            ORDER BY md5(coalesce(request_id, '') || source_line::VARCHAR || ?::VARCHAR), {_stored_order(con)}
            LIMIT {int(per_side)}""",
                           [run, str(seed)]).fetchall()
        out[s] = ([r[0] for r in rows], [r[1] for r in rows])
    return out


# --------------------------------------------------------------------------------------------- merging bands


BAND_KEYS = ("prompt_band", "output_band")


@dataclass
class Merge:
    """Cohorts after merging adjacent bands: cohort -> group (−1: not compared), group labels, what was merged."""

    group: np.ndarray
    labels: list[str]
    merged: list[str]          # sentences: which bands were merged, or dropped

    @property
    def groups(self) -> int:
        return len(self.labels)


def merge_bands(keys: tuple[str, ...], cohorts: list[tuple], n: np.ndarray, minimum: int) -> Merge:
    """Merge adjacent log2 bands until every cohort has `minimum` requests on both sides.

    Within each combination of the other keys (model, …), adjacent bands of the last band key are merged, smallest
    first, into its smaller neighbour; if a group still falls short, that band key is dropped for the combination
    and the previous band key is merged the same way. A combination short even with every band dropped is not
    compared. The 'unknown length' band is never merged with known lengths.
    """
    band_pos = [i for i, k in enumerate(keys) if k in BAND_KEYS]
    ident_pos = [i for i, k in enumerate(keys) if k not in BAND_KEYS]
    group = np.full(len(cohorts), -1, dtype=np.int64)
    labels: list[str] = []
    merged: list[str] = []
    by_ident: dict[tuple, list[int]] = {}
    for c, values in enumerate(cohorts):
        by_ident.setdefault(tuple(values[i] for i in ident_pos), []).append(c)
    for ident, members in by_ident.items():
        ident_text = " / ".join(str(v) for v in ident)
        for depth in range(len(band_pos), -1, -1):
            active = band_pos[:depth]
            plan = _plan(cohorts, members, active, n, minimum)
            if plan is not None or depth == 0:
                break
        if plan is None:      # even all bands together: not compared
            continue
        for segments, outer in plan:
            for seg in segments:
                gid = len(labels)
                for c in seg:
                    group[c] = gid
                parts = [str(v) for v in ident]
                for i in active[:-1] if active else []:
                    parts.append(band_label(keys[i], cohorts[seg[0]][i]))
                if active:
                    i = active[-1]
                    bands = sorted({cohorts[c][i] for c in seg})
                    parts.append(_range_label(keys[i], bands))
                labels.append(" / ".join(parts) or "all requests")
                if active and len({cohorts[c][active[-1]] for c in seg}) > 1:
                    merged.append(f"{labels[-1]}: {len({cohorts[c][active[-1]] for c in seg})} "
                                  f"{keys[active[-1]].replace('_', ' ')}s merged")
        dropped = [keys[i] for i in band_pos[len(active):]]
        if dropped:
            merged.append(f"{ident_text or 'all requests'}: too few requests per band, so "
                          f"{' and '.join(d.replace('_', ' ') for d in dropped)} dropped")
    return Merge(group, labels, merged)


def _plan(cohorts, members, active, n, minimum):
    """Segments per outer combination when merging along active[-1], or None when one stays short."""
    if not active:
        return [([members], ())] if _enough(members, n, minimum) else None
    last = active[-1]
    outer: dict[tuple, dict] = {}
    for c in members:
        key = tuple(cohorts[c][i] for i in active[:-1])
        outer.setdefault(key, {}).setdefault(cohorts[c][last], []).append(c)
    plan = []
    for key, by_band in outer.items():
        segments: list[list[int]] = []
        known = sorted(b for b in by_band if b != UNKNOWN_BAND)
        runs = [[c for c in by_band[b]] for b in known]
        runs = _merge_adjacent(runs, n, minimum)
        if runs is None:
            return None
        segments.extend(runs)
        if UNKNOWN_BAND in by_band:
            seg = by_band[UNKNOWN_BAND]
            if _enough(seg, n, minimum):
                segments.append(seg)
        plan.append((segments, key))
    return plan


def _merge_adjacent(runs: list[list[int]], n: np.ndarray, minimum: int):
    if not runs:
        return []
    runs = [list(r) for r in runs]
    while len(runs) > 1:
        short = [i for i in range(len(runs)) if not _enough(runs[i], n, minimum)]
        if not short:
            break
        smallest = min(short, key=lambda i: _size(runs[i], n))
        if smallest == 0:
            other = 1
        elif smallest == len(runs) - 1:
            other = smallest - 1
        else:
            left, right = _size(runs[smallest - 1], n), _size(runs[smallest + 1], n)
            other = smallest - 1 if left <= right else smallest + 1
        lo, hi = sorted((smallest, other))
        runs[lo:hi + 1] = [runs[lo] + runs[hi]]
    return runs if all(_enough(r, n, minimum) for r in runs) else None


def _size(seg, n) -> int:
    return int(n[:, seg].sum(axis=1).min())     # the short side's requests


def _enough(seg, n, minimum) -> bool:
    """At least `minimum` requests a side, and most of each side's requests in bands the other side also has:
    merging a band seen only before with one seen only after would compare unlike requests."""
    counts = n[:, seg]
    if counts.sum(axis=1).min() < minimum:
        return False
    shared = (counts[0] > 0) & (counts[1] > 0)
    return all(counts[s, shared].sum() >= 0.5 * counts[s].sum() for s in (0, 1))


def _range_label(key: str, bands: list) -> str:
    if len(bands) == 1:
        return band_label(key, bands[0])
    noun = "prompt" if key == "prompt_band" else "output"
    lo = 0 if bands[0] == -1 else 2 ** int(bands[0])
    hi = 2 ** (int(bands[-1]) + 1) - 1
    return f"{lo}–{hi} {noun} tokens"


def rate_counts(con: duckdb.DuckDBPyConnection, before: str, after: str, metric: str,
                keys: tuple[str, ...]) -> RateCounts:
    """Denominators and events per side × cohort, and per side × time batch × cohort (batch-means input)."""
    denominator, event = RATE_SQL[metric]
    bands = ", ".join(f"{_BAND_SQL[k]} AS {k}" for k in keys)
    select_bands = (bands + ", ") if bands else ""
    where = f"run IN ($before, $after) AND ({denominator})"
    batch = _batch_case(con, before, after, where, {"before": before, "after": after})
    rows_sql = f"""
        WITH base AS (
            SELECT {select_bands}CASE WHEN run = $before THEN 0 ELSE 1 END AS side, coalesce({event}, false) AS hit,
                   {batch} AS batch
            FROM requests WHERE run IN ($before, $after) AND ({denominator}))
        SELECT {', '.join(keys) + ', ' if keys else ''}side, batch, count(*) AS n, count(*) FILTER (WHERE hit) AS x
        FROM base GROUP BY ALL ORDER BY ALL"""
    frame = _frame(con, rows_sql, {"before": before, "after": after})
    cohorts, cohort = _cohort_ids(frame, keys)
    side, batch = _ints(frame, "side"), _ints(frame, "batch")
    batches = int(batch.max()) + 1 if frame.height else 0
    bt = np.zeros((2, max(batches, 1), len(cohorts)), dtype=np.int64)
    be = np.zeros_like(bt)
    np.add.at(bt, (side, batch, cohort), _ints(frame, "n"))
    np.add.at(be, (side, batch, cohort), _ints(frame, "x"))
    return RateCounts(keys, cohorts, bt.sum(axis=1), be.sum(axis=1), bt, be)


def events_without_band(con, before: str, after: str, metric: str, key: str) -> int:
    """How many events of a rate metric lack the token count a band needs (e.g. failed requests with no usage)."""
    denominator, event = RATE_SQL[metric]
    column = "prompt_tokens" if key == "prompt_band" else "completion_tokens"
    return con.execute(
        f"SELECT count(*) FROM requests WHERE run IN (?, ?) AND ({denominator}) AND ({event}) AND {column} IS NULL",
        [before, after]).fetchall()[0][0]


def mix_counts(con, before: str, after: str, keys: tuple[str, ...]) -> RateCounts:
    """Requests per cohort and side (all requests), for coverage and the mix-shift test."""
    bands = ", ".join(f"{_BAND_SQL[k]} AS {k}" for k in keys)
    select_bands = (bands + ", ") if bands else ""
    frame = _frame(con, f"""
        SELECT {select_bands}CASE WHEN run = $before THEN 0 ELSE 1 END AS side, count(*) AS n
        FROM requests WHERE run IN ($before, $after) GROUP BY ALL""", {"before": before, "after": after})
    cohorts, cohort = _cohort_ids(frame, keys)
    totals = np.zeros((2, len(cohorts)), dtype=np.int64)
    np.add.at(totals, (_ints(frame, "side"), cohort), _ints(frame, "n"))
    return RateCounts(keys, cohorts, totals, np.zeros_like(totals))
