"""Cohorts and the per-cohort summaries DuckDB aggregates for compare.

A cohort is one combination of band values (model × log2 prompt band × …). DuckDB groups the two runs' requests
into cohorts × log-spaced latency bins (latencies) or cohorts × counts (rates); Python receives those aggregates,
never request rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from servlens.compare.policy import LATENCY_METRICS
from servlens.compare.stats import bin_sql

UNKNOWN_BAND = -99   # a NULL token count: its own band, labelled "unknown"
NO_MODEL = "(no model)"

_BAND_SQL = {
    "model": f"coalesce(model, '{NO_MODEL}')",
    "served_model": f"coalesce(served_model, '{NO_MODEL}')",
    "deployment": "coalesce(deployment, '(no deployment)')",
    "provider": "coalesce(provider, '(no provider)')",
    # fixed log2 bands: band b holds [2^b, 2^(b+1)) tokens; 0 tokens is band -1
    "prompt_band": (f"CASE WHEN prompt_tokens IS NULL THEN {UNKNOWN_BAND} WHEN prompt_tokens < 1 THEN -1 "
                    "ELSE CAST(floor(log2(prompt_tokens)) AS INTEGER) END"),
    "output_band": (f"CASE WHEN completion_tokens IS NULL THEN {UNKNOWN_BAND} WHEN completion_tokens < 1 THEN -1 "
                    "ELSE CAST(floor(log2(completion_tokens)) AS INTEGER) END"),
}

# rate metric -> (denominator condition, event condition); NULL is unknown, so it is never in a denominator
RATE_SQL = {
    "error_rate": ("status IS NOT NULL", "status = 'error'"),
    "length_rate": ("finish_reason IS NOT NULL AND finish_reason <> 'unknown' AND status IS DISTINCT FROM 'error'",
                    "finish_reason = 'length'"),
    "timeout_rate": ("status IS NOT NULL",
                     "finish_reason = 'timeout' OR coalesce(http_status IN (408, 504), false) "
                     "OR coalesce(lower(error_type) LIKE '%timeout%', false)"),
    "leakage_rate": ("content_has_reasoning_marker IS NOT NULL AND status IS DISTINCT FROM 'error'",
                     "content_has_reasoning_marker"),
}


def band_label(key: str, value) -> str:
    if key in ("prompt_band", "output_band"):
        noun = "prompt" if key == "prompt_band" else "output"
        if value == UNKNOWN_BAND:
            return f"unknown {noun} length"
        if value == -1:
            return f"0 {noun} tokens"
        lo, hi = 2 ** int(value), 2 ** (int(value) + 1) - 1
        return f"{lo}–{hi} {noun} tokens" if lo != hi else f"{lo} {noun} token"
    return str(value)


def cohort_label(keys: tuple[str, ...], values: tuple) -> str:
    return " / ".join(band_label(k, v) for k, v in zip(keys, values)) or "all requests"


@dataclass
class Histograms:
    """Two runs' latency histograms over the same cohorts and bins."""

    keys: tuple[str, ...]
    cohorts: list[tuple]          # band values per cohort, in cohort-id order
    bins: np.ndarray              # (bins,) sorted bin ids
    counts: np.ndarray            # (2, cohorts, bins): side 0 = before, 1 = after

    @property
    def labels(self) -> list[str]:
        return [cohort_label(self.keys, c) for c in self.cohorts]

    def n(self) -> np.ndarray:
        return self.counts.sum(axis=2)   # (2, cohorts)


@dataclass
class RateCounts:
    keys: tuple[str, ...]
    cohorts: list[tuple]
    totals: np.ndarray            # (2, cohorts) denominators
    events: np.ndarray            # (2, cohorts)

    @property
    def labels(self) -> list[str]:
        return [cohort_label(self.keys, c) for c in self.cohorts]


def _cohort_table(con, keys, aggregated_sql: str, params) -> list[tuple]:
    if not keys:
        return [()]
    rows = con.execute(f"SELECT DISTINCT {', '.join(keys)} FROM ({aggregated_sql}) ORDER BY ALL", params).fetchall()
    return [tuple(r) for r in rows]


def latency_histograms(con: duckdb.DuckDBPyConnection, before: str, after: str, metric: str,
                       keys: tuple[str, ...]) -> Histograms:
    """Per side × cohort × bin counts of a latency metric (successful requests, value known and finite)."""
    column = LATENCY_METRICS[metric][0]
    bands = ", ".join(f"{_BAND_SQL[k]} AS {k}" for k in keys)
    select_bands = (bands + ", ") if bands else ""
    agg = f"""
        SELECT CASE WHEN run = $before THEN 0 ELSE 1 END AS side, {select_bands}{bin_sql(column)} AS bin,
               count(*) AS n
        FROM requests
        WHERE run IN ($before, $after) AND {column} IS NOT NULL AND isfinite({column})
          AND status IS DISTINCT FROM 'error'
        GROUP BY ALL"""
    params = {"before": before, "after": after}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _servlens_cmp_hist AS {agg}", params)
    cohorts = _cohort_table(con, keys, "SELECT * FROM _servlens_cmp_hist", {})
    if keys:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE _servlens_cmp_cohort AS
            SELECT {', '.join(keys)}, (row_number() OVER (ORDER BY {', '.join(keys)}) - 1)::INTEGER AS cohort_id
            FROM (SELECT DISTINCT {', '.join(keys)} FROM _servlens_cmp_hist)""")
        data = con.execute(f"""SELECT c.cohort_id, h.side, h.bin, h.n FROM _servlens_cmp_hist h
            JOIN _servlens_cmp_cohort c USING ({', '.join(keys)})""").fetchnumpy()
    else:
        data = con.execute("SELECT 0 AS cohort_id, side, bin, n FROM _servlens_cmp_hist").fetchnumpy()
    con.execute("DROP TABLE IF EXISTS _servlens_cmp_hist")
    con.execute("DROP TABLE IF EXISTS _servlens_cmp_cohort")
    if len(data["bin"]) == 0:
        return Histograms(keys, [], np.zeros(0, dtype=np.int64), np.zeros((2, 0, 0), dtype=np.int64))
    bins, column_of = np.unique(np.asarray(data["bin"], dtype=np.int64), return_inverse=True)
    counts = np.zeros((2, len(cohorts), len(bins)), dtype=np.int64)
    np.add.at(counts, (np.asarray(data["side"], dtype=np.int64), np.asarray(data["cohort_id"], dtype=np.int64),
                       column_of), np.asarray(data["n"], dtype=np.int64))
    return Histograms(keys, cohorts, bins, counts)


def rate_counts(con: duckdb.DuckDBPyConnection, before: str, after: str, metric: str,
                keys: tuple[str, ...]) -> RateCounts:
    denominator, event = RATE_SQL[metric]
    bands = ", ".join(f"{_BAND_SQL[k]} AS {k}" for k in keys)
    select_bands = (bands + ", ") if bands else ""
    order = ", ".join(keys) if keys else "side"
    rows_sql = f"""
        SELECT {select_bands}CASE WHEN run = $before THEN 0 ELSE 1 END AS side,
               count(*) AS n, count(*) FILTER (WHERE {event}) AS x
        FROM requests
        WHERE run IN ($before, $after) AND ({denominator})
        GROUP BY ALL ORDER BY {order}, side"""
    result = con.execute(rows_sql, {"before": before, "after": after}).fetchall()
    cohort_index: dict[tuple, int] = {}
    # Aggregated rows (cohorts × 2 sides), not request rows.
    for row in result:
        cohort_index.setdefault(tuple(row[: len(keys)]), len(cohort_index))
    totals = np.zeros((2, len(cohort_index)), dtype=np.int64)
    events = np.zeros((2, len(cohort_index)), dtype=np.int64)
    for row in result:
        c = cohort_index[tuple(row[: len(keys)])]
        side, n, x = row[len(keys):]
        totals[side, c] = n
        events[side, c] = x
    return RateCounts(keys, list(cohort_index), totals, events)


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
    order = ", ".join(keys) if keys else "side"
    result = con.execute(f"""
        SELECT {select_bands}CASE WHEN run = $before THEN 0 ELSE 1 END AS side, count(*) AS n
        FROM requests WHERE run IN ($before, $after) GROUP BY ALL ORDER BY {order}, side""",
                         {"before": before, "after": after}).fetchall()
    cohort_index: dict[tuple, int] = {}
    for row in result:
        cohort_index.setdefault(tuple(row[: len(keys)]), len(cohort_index))
    totals = np.zeros((2, len(cohort_index)), dtype=np.int64)
    for row in result:
        totals[row[len(keys)], cohort_index[tuple(row[: len(keys)])]] = row[len(keys) + 1]
    return RateCounts(keys, list(cohort_index), totals, np.zeros_like(totals))
