"""Goodput and SLO attainment from logs, and the concurrency where each target breaks (issue 20).

Goodput (DistServe, Zhong et al. OSDI 2024) counts a request only when it meets its TTFT and TPOT targets together;
benchmark tools measure it against their own synthetic load, this measures it from production logs:

- targets come from `--slo ttft=2s,tpot=100ms` (repeatable; `MODEL:ttft=...` sets one model's), default none —
  then the section shows attainment curves (the share meeting each of a ladder of thresholds) instead;
- a request is *judged* when it failed (a known miss) or when every latency its targets need is known: TTFT needs
  a first-token time (non-streamed answers have none), TPOT needs an answer of two tokens or more. Unjudged
  requests are counted and left out (unknown is not zero);
- attainment = met / judged, overall, per window (the analysis windows), per cohort (model and deployment, and
  prompt-length band); goodput = requests met per second of the run; the peak windows where attainment fell;
- misses by cause, the first that applies: failed; waited in the queue (queue_s known and TTFT without it meets the
  target); long prefill (TTFT over the target even without the queue); slow first token when the sources do not
  split queue from prefill; slow decode (TPOT over the target);
- capacity: each request's in-flight count at its arrival (requests of the same run, model and deployment whose
  arrival..end interval covers it, itself included, those arriving at the same moment counted in log order; from
  the logs' own times, an end time or arrival + e2e) groups
  the requests into concurrency levels; per level the TTFT/TPOT p99 and the attainment. A target breaks at the
  lowest level (with MIN_LEVEL_REQUESTS judged) whose share meeting it falls below the objective (99% for a single
  target — its p99 is over the target; 90% for both together, DistServe's attainment goal). The confidence says how
  sure: `high` when the Wilson 95% upper bound of that share is below the objective and a lower level held (its
  lower bound at or above the objective's point estimate); `medium` when the upper bound is below the objective but
  no lower level held with enough requests; `low` when only the point estimate is below.

Every aggregate is DuckDB SQL; Python shapes the small results.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

import duckdb

from servlens.analysis.detectors._common import chart, rounded
from servlens.analysis.failures import FAILED, answered
from servlens.analysis.runner import sql_literal
from servlens.analysis.windows import iso, window_width
from servlens.analysis.vocabulary import band_label, length_band
from servlens.errors import ConfigError

OBJECTIVE = {"ttft": 0.99, "tpot": 0.99, "both": 0.90}
MIN_LEVEL_REQUESTS = 5
MIN_WINDOW_REQUESTS = 3
FELL_BY = 0.10          # a window "fell" when its attainment is this far under the run's
MAX_FELL_WINDOWS = 5
MIN_BIN_REQUESTS = 10   # in-flight counts are merged into levels of at least this many requests
TTFT_LADDER_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
TPOT_LADDER_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)
MISS_CAUSES = ("failed", "queue", "long_prefill", "slow_first_token", "slow_decode")
MISS_WORDS = {"failed": "failed", "queue": "waited in the queue", "long_prefill": "long prefill",
              "slow_first_token": "slow first token (queue and prefill not split in these sources)",
              "slow_decode": "slow decode"}

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*$")


def parse_duration(text: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise ValueError(text)
    value = float(m.group(1))
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]


def parse_slo(values: list[str] | tuple[str, ...]) -> dict | None:
    """`--slo` values as targets: {"default": {"ttft_s", "tpot_s"}, "per_model": {model: {...}}}, or None."""
    if not values:
        return None
    targets: dict[str, Any] = {"default": {}, "per_model": {}}
    for value in values:
        model, _, spec = value.rpartition(":") if re.search(r":(ttft|tpot)=", value) else ("", "", value)
        found: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, amount = part.partition("=")
            key = key.strip().lower()
            if key not in ("ttft", "tpot") or not amount:
                raise ConfigError(f"--slo {value!r}: {part!r} is not ttft=DURATION or tpot=DURATION",
                                  "Example: --slo ttft=2s,tpot=100ms (or MODEL:ttft=1s for one model)")
            try:
                seconds = parse_duration(amount)
            except ValueError:
                raise ConfigError(f"--slo {value!r}: {amount!r} is not a duration",
                                  "Durations: 250ms, 2s, 1.5s, 1m") from None
            if seconds <= 0:
                raise ConfigError(f"--slo {value!r}: a target must be above zero", "Example: --slo ttft=2s")
            found[f"{key}_s"] = seconds
        if not found:
            raise ConfigError(f"--slo {value!r} sets no target", "Example: --slo ttft=2s,tpot=100ms")
        (targets["per_model"].setdefault(model, {}) if model else targets["default"]).update(found)
    return targets


def _target_sql(targets: dict | None, key: str) -> str:
    """The row's target for `key` (ttft_s / tpot_s): its model's, else the default, else NULL."""
    if not targets:
        return "CAST(NULL AS DOUBLE)"
    default = targets["default"].get(key)
    cases = " ".join(f"WHEN model = {sql_literal(m)} THEN {t[key]!r}" for m, t in targets["per_model"].items()
                     if key in t)
    fallback = "NULL" if default is None else repr(default)
    return f"CAST(CASE {cases} ELSE {fallback} END AS DOUBLE)" if cases else f"CAST({fallback} AS DOUBLE)"


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _prepare(con: duckdb.DuckDBPyConnection, runs: list[str], targets: dict | None) -> None:
    run_list = ", ".join(sql_literal(r) for r in runs)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE gp_requests AS
        WITH base AS (
            SELECT run, model, deployment, source_id, source_line, prompt_tokens, completion_tokens,
                   ttft_s, tpot_s, queue_s, prefill_s,
                   coalesce(t_arrival, t_first_token, t_end) AS t_at,
                   coalesce(t_end, t_arrival + to_microseconds(CAST(e2e_s * 1e6 AS BIGINT))) AS t_done,
                   {FAILED} AS is_failed, {answered()} AS is_answered,
                   {_target_sql(targets, 'ttft_s')} AS ttft_target, {_target_sql(targets, 'tpot_s')} AS tpot_target
            FROM requests WHERE run IN ({run_list})),
        -- The sweep's partitions are numbered: sorting two million events by run, model and deployment text
        -- (deployment URLs that share their first dozens of bytes) took twice as long (3.3 -> 1.6 s CPU at 1M).
        scopes AS (
            SELECT run, model, deployment, row_number() OVER () AS scope_id
            FROM (SELECT DISTINCT run, model, deployment FROM base)),
        timed AS (
            SELECT s.scope_id, b.run, b.source_id, b.source_line, b.t_at, b.t_done FROM base b
            JOIN scopes s ON s.run = b.run AND s.model IS NOT DISTINCT FROM b.model
                         AND s.deployment IS NOT DISTINCT FROM b.deployment
            WHERE b.t_at IS NOT NULL AND b.t_done IS NOT NULL),
        ev AS (
            SELECT scope_id, run, source_id, source_line, t_at AS t, 1 AS d FROM timed
            UNION ALL
            SELECT scope_id, NULL, NULL, NULL, greatest(t_done, t_at), -1 FROM timed),
        sweep AS (
            -- ends before arrivals at equal times: back-to-back requests do not overlap; arrivals at equal times
            -- count in log order (unordered, a rerun could swap their in-flight counts)
            SELECT source_id, source_line, run,
                   sum(d) OVER (PARTITION BY scope_id ORDER BY t, d, source_id, source_line
                                ROWS UNBOUNDED PRECEDING) AS inflight
            FROM ev),
        judged AS (
            SELECT b.*, s.inflight,
                   ttft_target IS NOT NULL AND NOT is_failed AND ttft_s IS NULL AS ttft_unknown,
                   tpot_target IS NOT NULL AND NOT is_failed AND tpot_s IS NULL
                     AND coalesce(completion_tokens, 2) > 1 AS tpot_unknown,
                   coalesce(ttft_s <= ttft_target, true) AS ttft_ok,
                   coalesce(tpot_s <= tpot_target, true) AS tpot_ok
            FROM base b LEFT JOIN sweep s ON s.run = b.run AND s.source_id = b.source_id
                                           AND s.source_line = b.source_line)
        SELECT *,
               (is_failed OR (is_answered AND NOT ttft_unknown AND NOT tpot_unknown))
                 AND (ttft_target IS NOT NULL OR tpot_target IS NOT NULL) AS judged,
               is_answered AND NOT ttft_unknown AND NOT tpot_unknown AND ttft_ok AND tpot_ok AS met,
               CASE WHEN is_failed THEN 'failed'
                    WHEN NOT ttft_ok AND queue_s IS NOT NULL AND ttft_s - queue_s <= ttft_target THEN 'queue'
                    WHEN NOT ttft_ok AND (queue_s IS NOT NULL OR prefill_s IS NOT NULL) THEN 'long_prefill'
                    WHEN NOT ttft_ok THEN 'slow_first_token'
                    WHEN NOT tpot_ok THEN 'slow_decode' END AS miss_cause,
               {length_band('prompt_tokens')} AS prompt_band
        FROM judged""")


def goodput_section(con: duckdb.DuckDBPyConnection, runs: list[str], targets: dict | None) -> dict:
    """The document's `goodput` key."""
    _prepare(con, runs, targets)
    try:
        out: dict[str, Any] = {"targets": targets, "objective": dict(OBJECTIVE),
                               "min_level_requests": MIN_LEVEL_REQUESTS}
        counts = _rows(con, """SELECT count(*) AS n, count(t_at) AS timed, count(t_done) AS with_end,
                                      count(ttft_s) AS with_ttft, count(tpot_s) AS with_tpot,
                                      count(*) FILTER (WHERE is_failed OR is_answered) AS with_outcome
                               FROM gp_requests""")[0]
        out["requests"] = counts["n"]
        if not counts["n"]:
            out["note"] = "no request logs: goodput is not evaluable"
            return out
        latencies = bool(counts["with_ttft"] or counts["with_tpot"])
        if targets:
            if not latencies or not counts["with_outcome"]:
                out["attainment"] = {"state": "not_evaluable",
                                     "reason": "no TTFT or TPOT in these sources (arrivals only)" if not latencies
                                     else "no request outcome (status, finish reason) in these sources"}
            else:
                out["attainment"] = _attainment(con)
                out["per_window"] = _per_window(con, out["attainment"])
                out["per_cohort"] = _per_cohort(con)
                out["goodput_rps"] = out["attainment"].get("goodput_rps")
        else:
            out["note"] = ("no SLO targets (give --slo ttft=2s,tpot=100ms): the attainment curves show the share "
                           "meeting each threshold instead")
            out["curves"] = _curves(con) if latencies else None
        out["capacity"] = _capacity(con, targets, counts)
        out["breaking_concurrency"] = [
            {"run": c["run"], "model": c["model"], "deployment": c["deployment"], **c["breaking"]}
            for c in out["capacity"].get("scopes", [])]
        out["summary"] = goodput_summary(out)
        return out
    finally:
        con.execute("DROP TABLE IF EXISTS gp_requests")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a share k/n."""
    if not n:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _span_s(con: duckdb.DuckDBPyConnection, where: str = "TRUE") -> float:
    lo, hi = con.execute(f"SELECT min(t_at), max(coalesce(t_done, t_at)) FROM gp_requests WHERE {where}").fetchone()
    return max(1.0, (hi - lo).total_seconds()) if lo is not None else 0.0


def _attainment(con: duckdb.DuckDBPyConnection) -> dict:
    causes = ", ".join(f"count(*) FILTER (WHERE judged AND NOT met AND miss_cause = '{c}') AS {c}" for c in MISS_CAUSES)
    row = _rows(con, f"""SELECT count(*) AS requests, count(*) FILTER (WHERE judged) AS judged,
                                count(*) FILTER (WHERE judged AND met) AS met,
                                count(*) FILTER (WHERE NOT judged AND ttft_unknown) AS no_ttft,
                                count(*) FILTER (WHERE NOT judged AND tpot_unknown AND NOT ttft_unknown) AS no_tpot,
                                {causes} FROM gp_requests""")[0]
    span = _span_s(con)
    judged, met = row["judged"], row["met"]
    lo, hi = wilson(met, judged)
    return {
        "state": "evaluated" if judged else "not_evaluable",
        "reason": None if judged else "no request has the latencies its targets need",
        "requests": row["requests"], "judged": judged, "met": met,
        "share": rounded(met / judged) if judged else None, "share_low": rounded(lo), "share_high": rounded(hi),
        "unjudged": {"no_ttft": row["no_ttft"], "no_tpot": row["no_tpot"]},
        "missed_by_cause": {c: row[c] for c in MISS_CAUSES},
        "span_s": rounded(span, 3), "goodput_rps": rounded(met / span) if span else None,
        "request_rate_rps": rounded(row["requests"] / span) if span else None,
    }


def _per_window(con: duckdb.DuckDBPyConnection, overall: dict) -> dict:
    t0 = con.execute("SELECT min(t_at) FROM gp_requests").fetchone()[0]
    width = window_width(_span_s(con))
    offset = f"(date_diff('microsecond', TIMESTAMP '{t0.isoformat(sep=' ')}', t_at) / 1e6)"
    rows = _rows(con, f"""SELECT CAST(floor({offset} / {width}) AS INTEGER) AS w, count(*) AS requests,
                                 count(*) FILTER (WHERE judged) AS judged, count(*) FILTER (WHERE judged AND met) AS met
                          FROM gp_requests WHERE t_at IS NOT NULL GROUP BY 1 ORDER BY 1""")
    windows = [{"start": iso(t0 + timedelta(seconds=r["w"] * width)),
                "end": iso(t0 + timedelta(seconds=(r["w"] + 1) * width)), "requests": r["requests"],
                "judged": r["judged"], "met": r["met"],
                "share": rounded(r["met"] / r["judged"]) if r["judged"] else None,
                "rate_rps": rounded(r["requests"] / width), "goodput_rps": rounded(r["met"] / width)} for r in rows]
    fell = []
    if overall.get("share") is not None:
        fell = sorted((w for w in windows if w["judged"] >= MIN_WINDOW_REQUESTS and w["share"] is not None
                       and w["share"] <= overall["share"] - FELL_BY),
                      key=lambda w: (w["share"], -w["rate_rps"]))[:MAX_FELL_WINDOWS]
    x = [w["start"] for w in windows]
    the_chart = chart("line", f"SLO attainment and goodput per window ({width:g} s)", "time", "share / requests per s", [
        {"name": "attainment (share meeting the targets)", "x": x, "y": [w["share"] for w in windows]},
        {"name": "goodput (req/s)", "x": x, "y": [w["goodput_rps"] for w in windows]},
        {"name": "request rate (req/s)", "x": x, "y": [w["rate_rps"] for w in windows]},
    ], x_time=True, vspans=[{"x0": w["start"], "x1": w["end"], "label": "attainment fell"} for w in fell[:3]])
    return {"window_s": width, "windows": windows, "fell": fell, "chart": the_chart}


def _per_cohort(con: duckdb.DuckDBPyConnection) -> list[dict]:
    rows = _rows(con, """SELECT run, model, deployment, prompt_band, grouping(prompt_band) AS total, count(*) AS requests,
                                count(*) FILTER (WHERE judged) AS judged, count(*) FILTER (WHERE judged AND met) AS met
                         FROM gp_requests GROUP BY GROUPING SETS ((run, model, deployment),
                                                                 (run, model, deployment, prompt_band))
                         ORDER BY run, model NULLS LAST, deployment NULLS LAST, total DESC, prompt_band NULLS LAST""")
    return [{"run": r["run"], "model": r["model"], "deployment": r["deployment"],
             "prompt_band": None if r["total"] else band_label(r["prompt_band"], "prompt"),
             "requests": r["requests"], "judged": r["judged"], "met": r["met"],
             "share": rounded(r["met"] / r["judged"]) if r["judged"] else None} for r in rows
            if r["total"] or r["judged"]]


def _curves(con: duckdb.DuckDBPyConnection) -> dict:
    """Without targets: the share of answered requests whose TTFT (TPOT) meets each threshold of a ladder."""
    ttft = ", ".join(f"avg(CASE WHEN ttft_s <= {t} THEN 1.0 ELSE 0.0 END) FILTER (WHERE ttft_s IS NOT NULL) AS t{i}"
                     for i, t in enumerate(TTFT_LADDER_S))
    tpot = ", ".join(f"avg(CASE WHEN tpot_s <= {t} THEN 1.0 ELSE 0.0 END) FILTER (WHERE tpot_s IS NOT NULL) AS p{i}"
                     for i, t in enumerate(TPOT_LADDER_S))
    row = _rows(con, f"SELECT {ttft}, {tpot} FROM gp_requests WHERE is_answered")[0]
    return {"ttft": [{"threshold_s": t, "share": rounded(row[f"t{i}"])} for i, t in enumerate(TTFT_LADDER_S)],
            "tpot": [{"threshold_s": t, "share": rounded(row[f"p{i}"])} for i, t in enumerate(TPOT_LADDER_S)],
            "chart": chart("line", "Attainment curves: share meeting each threshold", "threshold (s)", "share", [
                {"name": "TTFT ≤ threshold", "x": list(TTFT_LADDER_S), "y": [rounded(row[f"t{i}"]) for i in range(len(TTFT_LADDER_S))]},
                {"name": "TPOT ≤ threshold", "x": list(TPOT_LADDER_S), "y": [rounded(row[f"p{i}"]) for i in range(len(TPOT_LADDER_S))]},
            ], x_log=True)}


def _level_bins(con: duckdb.DuckDBPyConnection, judged: bool) -> None:
    """gp_levels: each scope's in-flight counts merged into levels of at least MIN_BIN_REQUESTS requests (judged
    requests, when `judged`).

    Exact counts where the data is dense, consecutive counts merged where it is sparse (a short burst leaves one
    request at each of many counts, and a level of one request says nothing about a p99)."""
    # With targets a level is as large as its judged requests make it (an unjudged one says nothing of a target).
    weight = "count(*) FILTER (WHERE judged)" if judged else "count(*)"
    counts = con.execute(f"""SELECT run, model, deployment, inflight, {weight} FROM gp_requests
                             WHERE inflight IS NOT NULL GROUP BY ALL ORDER BY 1, 2 NULLS LAST, 3 NULLS LAST, 4""").fetchall()
    bins, current, key = [], [], None
    for run, model, deployment, inflight, n in counts:
        if (run, model, deployment) != key:
            if current:
                bins.append(current)
            current, key = [], (run, model, deployment)
        if current and current[-1][5] >= MIN_BIN_REQUESTS:
            bins.append(current)
            current = []
        lo = current[0][4] if current else inflight
        total = (current[-1][5] if current else 0) + n
        current.append((run, model, deployment, inflight, lo, total))
    if current:
        bins.append(current)
    # A sparse last bin joins the one before it in the same scope.
    merged: list[list] = []
    for b in bins:
        if merged and b[-1][5] < MIN_BIN_REQUESTS and merged[-1][0][:3] == b[0][:3]:
            merged[-1] = merged[-1] + b
        else:
            merged.append(b)
    con.execute("CREATE OR REPLACE TEMP TABLE gp_levels (run VARCHAR, model VARCHAR, deployment VARCHAR, "
                "inflight BIGINT, level_from BIGINT, level_to BIGINT)")
    rows = [(r[0], r[1], r[2], r[3], b[0][4], b[-1][3]) for b in merged for r in b]
    if rows:
        con.executemany("INSERT INTO gp_levels VALUES (?, ?, ?, ?, ?, ?)", rows)


def _capacity(con: duckdb.DuckDBPyConnection, targets: dict | None, counts: dict) -> dict:
    if not counts["with_end"] or not counts["timed"]:
        return {"note": "no end times or durations in these sources: requests in flight are unknown, so capacity is "
                        "not evaluable", "scopes": []}
    _level_bins(con, bool(targets))
    rows = _rows(con, """
        SELECT g.run, g.model, g.deployment, level_from, level_to, count(*) AS requests,
               quantile_cont(ttft_s, 0.99) AS ttft_p99, quantile_cont(tpot_s, 0.99) AS tpot_p99,
               count(ttft_s) AS with_ttft, count(tpot_s) AS with_tpot,
               count(*) FILTER (WHERE ttft_target IS NOT NULL AND (is_failed OR NOT ttft_unknown)) AS ttft_judged,
               count(*) FILTER (WHERE ttft_target IS NOT NULL AND is_answered AND NOT ttft_unknown AND ttft_ok) AS ttft_met,
               count(*) FILTER (WHERE tpot_target IS NOT NULL AND (is_failed OR NOT tpot_unknown)) AS tpot_judged,
               count(*) FILTER (WHERE tpot_target IS NOT NULL AND is_answered AND NOT tpot_unknown AND tpot_ok) AS tpot_met,
               count(*) FILTER (WHERE judged) AS both_judged, count(*) FILTER (WHERE judged AND met) AS both_met,
               max(ttft_target) AS ttft_target, max(tpot_target) AS tpot_target
        FROM gp_requests g JOIN gp_levels l ON l.run = g.run AND l.inflight = g.inflight
             AND l.model IS NOT DISTINCT FROM g.model AND l.deployment IS NOT DISTINCT FROM g.deployment
        GROUP BY ALL ORDER BY 1, 2 NULLS LAST, 3 NULLS LAST, level_from""")
    con.execute("DROP TABLE gp_levels")
    scopes: dict[tuple, dict] = {}
    for r in rows:
        key = (r["run"], r["model"], r["deployment"])
        s = scopes.setdefault(key, {"run": key[0], "model": key[1], "deployment": key[2], "levels": [],
                                    "ttft_target_s": r["ttft_target"], "tpot_target_s": r["tpot_target"]})
        level = {"in_flight": r["level_to"], "in_flight_from": r["level_from"], "requests": r["requests"],
                 "ttft_p99_s": rounded(r["ttft_p99"]), "tpot_p99_s": rounded(r["tpot_p99"], 6)}
        for t in ("ttft", "tpot", "both"):
            judged, met = r[f"{t}_judged"], r[f"{t}_met"]
            level[f"{t}_judged"] = judged
            level[f"{t}_share"] = rounded(met / judged) if judged else None
            level[f"{t}_met"] = met
        s["levels"].append(level)
    out = []
    for s in scopes.values():
        s["breaking"] = {t: _breaking(s["levels"], t, targets) for t in ("ttft", "tpot", "both")}
        s["chart"] = _capacity_chart(s)
        out.append(s)
    return {"source": "in flight at arrival, from the logs' arrival and end times (same run, model, deployment)",
            "scopes": out}


def _breaking(levels: list[dict], target: str, targets: dict | None) -> dict:
    objective = OBJECTIVE[target]
    judged_levels = [lv for lv in levels if lv[f"{target}_judged"] >= MIN_LEVEL_REQUESTS]
    if not targets:
        return {"in_flight": None, "state": "not_evaluable", "reason": "no SLO targets (--slo)"}
    if not judged_levels:
        return {"in_flight": None, "state": "not_evaluable",
                "reason": f"no concurrency level has {MIN_LEVEL_REQUESTS} requests judged against this target"}
    held = None
    for lv in judged_levels:
        n, k = lv[f"{target}_judged"], lv[f"{target}_met"]
        low, high = wilson(k, n)
        if k / n < objective:
            confidence = "low" if high >= objective else "high" if held is not None else "medium"
            return {"in_flight": lv["in_flight_from"], "state": "broken", "share": rounded(k / n),
                    "share_high": rounded(high), "requests": n, "confidence": confidence,
                    "held_up_to": held["in_flight"] if held else None}
        held = {"in_flight": lv["in_flight"], "low": low}
    # Held everywhere: sure when even the top level's lower bound is near the objective, else too few requests.
    return {"in_flight": None, "state": "held", "held_up_to": held["in_flight"],
            "confidence": "high" if held["low"] >= objective - 0.05 else "low"}


def _capacity_chart(s: dict) -> dict:
    x = [lv["in_flight"] for lv in s["levels"]]
    series = [{"name": "TTFT p99 (s)", "x": x, "y": [lv["ttft_p99_s"] for lv in s["levels"]]},
              {"name": "TPOT p99 (s)", "x": x, "y": [lv["tpot_p99_s"] for lv in s["levels"]]}]
    series = [se for se in series if any(v is not None for v in se["y"])]
    hlines = [{"y": s[f"{t}_target_s"], "label": f"{t.upper()} target"} for t in ("ttft", "tpot")
              if s.get(f"{t}_target_s")]
    where = " / ".join(str(v) for v in (s["model"], s["deployment"]) if v) or s["run"]
    return chart("line", f"Latency p99 by requests in flight: {where}", "requests in flight at arrival", "seconds",
                 series, y_log=True, hlines=hlines)


def _secs(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:g} s"


def targets_text(targets: dict | None) -> str:
    if not targets:
        return "no SLO targets"
    parts = [", ".join(f"{k[:-2].upper()} ≤ {_secs(v)}" for k, v in targets["default"].items())]
    parts += [f"{m}: " + ", ".join(f"{k[:-2].upper()} ≤ {_secs(v)}" for k, v in t.items())
              for m, t in targets["per_model"].items()]
    return "; ".join(p for p in parts if p)


def _joined(names: list[str]) -> str:
    return "every target" if len(names) == 3 else " and ".join(names)


def goodput_summary(g: dict) -> str:
    """One paragraph: attainment, goodput, misses by cause, and where each target breaks."""
    if not g.get("targets"):
        text = "No SLO targets given (--slo ttft=2s,tpot=100ms): attainment curves only."
    else:
        a = g.get("attainment") or {}
        if a.get("state") != "evaluated":
            text = f"SLO attainment ({targets_text(g['targets'])}) is not evaluable: {a.get('reason')}."
        else:
            misses = ", ".join(f"{v} {MISS_WORDS[c]}" for c, v in a["missed_by_cause"].items() if v) or "none"
            text = (f"{a['met']} of {a['judged']} judged requests ({100 * a['share']:.1f}%) met "
                    f"{targets_text(g['targets'])}; goodput {a['goodput_rps']:g} req/s of "
                    f"{a['request_rate_rps']:g} req/s; missed: {misses}")
            unjudged = sum(a["unjudged"].values())
            text += f"; {unjudged} not judged (latency unknown)." if unjudged else "."
            fell = (g.get("per_window") or {}).get("fell") or []
            if fell:
                text += f" Attainment fell to {100 * fell[0]['share']:.0f}% in the window from {fell[0]['start']}."
    breaks = []
    names = {"ttft": "TTFT", "tpot": "TPOT", "both": "both targets"}
    given = {k for t in ([(g.get("targets") or {}).get("default") or {}]
                         + list(((g.get("targets") or {}).get("per_model") or {}).values())) for k in t}
    # With one kind of target, "both" is that target again: not said twice.
    shown = ("ttft", "tpot", "both") if len(given) > 1 else ("ttft", "tpot")
    listed = g.get("breaking_concurrency") or []
    several_runs = len({b["run"] for b in listed}) > 1
    # A model served by several deployments is named with its deployment, so the lines do not read the same.
    shared_model = {b["model"] for b in listed if sum(o["model"] == b["model"] and o["run"] == b["run"] for o in listed) > 1}
    for b in listed:
        deployment = b["deployment"] if b["model"] in shared_model or not b["model"] else None
        where = " / ".join(str(v) for v in ((b["run"] if several_runs else None), b["model"], deployment) if v) \
            or b["run"]
        said: dict[str, list[str]] = {}
        for t in shown:
            r = b.get(t) or {}
            if r.get("state") == "broken":
                said.setdefault(f"{{}} at {r['in_flight']} in flight ({r['confidence']} confidence)", []).append(names[t])
            elif r.get("state") == "held":
                said.setdefault(f"{{}} held up to {r['held_up_to']} in flight", []).append(names[t])
        parts = [(form.format(_joined(ts)) if "held" in form else _joined(ts) + " "
                  + ("break" if len(ts) == 2 or ts == ["both targets"] else "breaks") + form.format("")) for form, ts in said.items()]
        if parts:
            breaks.append(f"{where}: " + ", ".join(parts))
    if breaks:
        text += " " + "; ".join(breaks) + "."
    elif (g.get("capacity") or {}).get("note"):
        text += " " + g["capacity"]["note"][0].upper() + g["capacity"]["note"][1:] + "."
    return text


# ---------------------------------------------------------------- compare: the goodput change between two runs

GATE_TOLERANCE = 0.02   # the attainment may drop by 2 points before the change counts as a regression


def goodput_gate(con: duckdb.DuckDBPyConnection, before: str, after: str, targets: dict,
                 tolerance: float = GATE_TOLERANCE) -> dict:
    """The change in SLO attainment from `before` to `after`, judged like compare's rate gates.

    The interval is Newcombe's hybrid score interval for a difference of two shares (from each side's Wilson
    interval). It treats requests as independent, which a burst is not (DESIGN.md asks for intervals robust to
    serial correlation), so the gate is `advisory`: shown with its verdict, never failing the comparison.
    Verdict: fail when the interval excludes no change and the drop is beyond the tolerance; pass when the whole
    interval is above minus the tolerance; inconclusive otherwise or when a side has nothing judged.
    """
    sides = {}
    for name, run in (("before", before), ("after", after)):
        _prepare(con, [run], targets)
        try:
            a = _attainment(con)
        finally:
            con.execute("DROP TABLE IF EXISTS gp_requests")
        sides[name] = {"run": run, "judged": a["judged"], "met": a["met"], "share": a["share"],
                       "goodput_rps": a["goodput_rps"], "request_rate_rps": a["request_rate_rps"]}
    gate: dict[str, Any] = {"gate": "goodput attainment", "kind": "rate", "advisory": True, "targets": targets,
                            "tolerance": tolerance, **sides, "change": None, "change_low": None, "change_high": None}
    b, a = sides["before"], sides["after"]
    if not b["judged"] or not a["judged"]:
        side = "before" if not b["judged"] else "after"
        return gate | {"verdict": "inconclusive",
                       "reason": f"no request of the {side} run could be judged against {targets_text(targets)}"}
    p1, p2 = b["met"] / b["judged"], a["met"] / a["judged"]
    l1, u1 = wilson(b["met"], b["judged"])
    l2, u2 = wilson(a["met"], a["judged"])
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    if high < 0 and d < -tolerance:
        verdict = "fail"
    elif low >= -tolerance:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    words = {"fail": "dropped beyond", "pass": "held within", "inconclusive": "cannot be told from"}[verdict]
    reason = (f"attainment of {targets_text(targets)} went from {100 * p1:.1f}% to {100 * p2:.1f}% "
              f"({100 * d:+.1f} points, 95% interval {100 * low:+.1f} … {100 * high:+.1f})".replace("-", "−")
              + f": {words} the tolerance of {100 * tolerance:g} points; goodput {b['goodput_rps']:g} → "
              f"{a['goodput_rps']:g} req/s")
    return gate | {"change": rounded(d), "change_low": rounded(low), "change_high": rounded(high),
                   "verdict": verdict, "reason": reason}
