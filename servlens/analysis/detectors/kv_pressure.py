"""SL009 KV cache pressure and preemption.

From the engine's scrapes, per scrape: KV usage (vLLM kv_cache_usage_perc, SGLang token_usage, older llama.cpp
kv_cache_usage_ratio; the highest engine), requests waiting (summed over engines; vLLM's waiting_by_reason
"capacity" apart), requests running, and preemptions since the previous scrape (vLLM num_preemptions; SGLang
num_retracted_reqs is a gauge of retracted requests).

The cache is the bottleneck when a preemption happened (vLLM only preempts a running request to free KV blocks: its
work is thrown away and recomputed), or when KV usage sat at or above `kv_high` in at least `min_pressure_scrapes`
scrapes while requests waited. Requests waiting while KV stayed low are waiting on the concurrency cap
(max-num-seqs, --parallel), not on the cache: the rule says so and stays clear (that queueing is SL004's).

With per-request queue times the finding adds how long the requests that were in the queue during the pressure
waited, against the others (the SL004-style queueing it coincides with; the two rules stay independent).
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, rounded, secs, table
from servlens.analysis.runner import DetectorContext
from servlens.analysis.windows import iso
from servlens.store import metric_roles

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "kv_high", "min_pressure_scrapes", "min_preemptions", "critical_preemptions", "min_scrapes"
    ],
    "requires": [],
}

KV_GAUGES = metric_roles.names("kv_usage")
WAITING_GAUGES = metric_roles.names("waiting")
RUNNING_GAUGES = metric_roles.names("running")
PREEMPTION_COUNTER = "vllm:num_preemptions"
RETRACTED_GAUGE = "sglang:num_retracted_reqs"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
MAX_CHART_POINTS = 300


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    kv_name = next((n for n in KV_GAUGES if n in ctx.metrics_present), None)
    has_preemptions = PREEMPTION_COUNTER in ctx.metrics_present or RETRACTED_GAUGE in ctx.metrics_present
    # Per scrape: the gauges (KV: the fullest engine; counts: summed over engines) and the preemptions since the
    # previous scrape. A temp table, because the aggregates, the chart and the per-request join all read it.
    ctx.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE sl009_scrapes AS
        WITH g AS (
            SELECT ts,
                   max(value) FILTER (WHERE name IN ({_names(KV_GAUGES)})) AS kv,
                   sum(value) FILTER (WHERE name IN ({_names(WAITING_GAUGES)})) AS waiting,
                   sum(value) FILTER (WHERE name = '{WAITING_BY_REASON}' AND labels['reason'] = 'capacity') AS waiting_capacity,
                   sum(value) FILTER (WHERE name IN ({_names(RUNNING_GAUGES)})) AS running,
                   sum(value) FILTER (WHERE name = '{RETRACTED_GAUGE}') AS retracted
            FROM scope_metrics
            WHERE series = 'value' AND name IN ({_names(KV_GAUGES + WAITING_GAUGES + RUNNING_GAUGES)},
                                                '{WAITING_BY_REASON}', '{RETRACTED_GAUGE}')
            GROUP BY ts),
        pre AS (SELECT ts, sum(increase) AS preempted FROM scope_counter_increases
                WHERE name = '{PREEMPTION_COUNTER}' AND series = 'value' GROUP BY ts)
        SELECT coalesce(g.ts, pre.ts) AS ts, g.kv, g.waiting, g.waiting_capacity, g.running, g.retracted, pre.preempted
        FROM g FULL OUTER JOIN pre ON g.ts = pre.ts""")
    kv_high = p["kv_high"]
    s = ctx.one(f"""
        SELECT count(*) AS scrapes, count(kv) AS kv_scrapes, max(kv) AS kv_max, {q('kv', 0.5)} AS kv_p50,
               count(*) FILTER (WHERE kv >= {kv_high}) AS pressure_scrapes,
               count(*) FILTER (WHERE kv >= {kv_high} AND coalesce(waiting, waiting_capacity) > 0) AS pressure_waiting_scrapes,
               count(*) FILTER (WHERE kv < {kv_high} AND coalesce(waiting_capacity, waiting) > 0) AS low_kv_waiting_scrapes,
               max(waiting) AS waiting_max, max(waiting_capacity) AS waiting_capacity_max, max(running) AS running_max,
               max(kv) FILTER (WHERE waiting > 0) AS kv_max_while_waiting,
               count(preempted) AS preemption_intervals, sum(preempted) AS preemptions, max(retracted) AS retracted_max,
               min(ts) FILTER (WHERE kv >= {kv_high} OR preempted > 0 OR retracted > 0) AS first_pressure,
               max(ts) FILTER (WHERE kv >= {kv_high} OR preempted > 0 OR retracted > 0) AS last_pressure,
               min(ts) AS t0, max(ts) AS t1
        FROM sl009_scrapes""")
    if s["scrapes"] < p["min_scrapes"]:
        return not_evaluable(f"only {s['scrapes']} scrapes of the KV, waiting and preemption metrics; the rule needs at "
                             f"least {p['min_scrapes']} (min_scrapes)", "Too few scrapes to judge KV cache pressure.")
    preemptions = s["preemptions"] if s["preemption_intervals"] else None
    retracted = s["retracted_max"]
    metrics = {
        "scrapes": s["scrapes"], "kv_metric": kv_name, "kv_usage_max": rounded(s["kv_max"]), "kv_usage_p50": rounded(s["kv_p50"]),
        "pressure_scrapes": s["pressure_scrapes"], "pressure_scrapes_with_waiting": s["pressure_waiting_scrapes"],
        "waiting_max": s["waiting_max"], "waiting_capacity_max": s["waiting_capacity_max"], "running_max": s["running_max"],
        "kv_usage_max_while_waiting": rounded(s["kv_max_while_waiting"]),
        "low_kv_waiting_scrapes": s["low_kv_waiting_scrapes"], "preemptions": preemptions, "retracted_max": retracted,
    }
    thresholds = {k: p[k] for k in ("kv_high", "min_pressure_scrapes", "min_preemptions", "critical_preemptions", "min_scrapes")}
    the_chart = _chart(ctx, s, kv_high, kv_name)
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}

    preempted = (preemptions or 0) >= p["min_preemptions"] or (retracted or 0) >= p["min_preemptions"]
    full_and_waiting = s["pressure_waiting_scrapes"] >= p["min_pressure_scrapes"]
    if kv_name is None and not has_preemptions:
        return not_evaluable("no KV usage gauge and no preemption counter in the scrapes",
                             "KV cache pressure cannot be seen without the engine's KV metrics.")
    if not preempted and not full_and_waiting:
        return {"state": "clear", "evidence": evidence, "summary": _clear_summary(s, kv_name, kv_high, preemptions,
                                                                                   p["min_pressure_scrapes"])}

    findings = []
    if preempted:
        findings.append(f"{preemptions:g} preemptions" if preemptions else f"up to {retracted:g} requests retracted")
    if kv_name is not None:
        findings.append(f"{kv_name} up to {pct(s['kv_max'])}, at or above {pct(kv_high)} in {s['pressure_scrapes']} of "
                        f"{s['scrapes']} scrapes ({s['pressure_waiting_scrapes']} with requests waiting)")
    if s["waiting_max"]:
        findings.append(f"up to {s['waiting_max']:g} requests waiting" +
                        (f" ({s['waiting_capacity_max']:g} for capacity)" if s["waiting_capacity_max"] else "")
                        + (f" while {s['running_max']:g} ran" if s["running_max"] is not None else ""))
    metrics["pressure_start"] = iso(s["first_pressure"])
    metrics["pressure_end"] = iso(s["last_pressure"])
    coincide = _queueing_during(ctx, s)
    metrics |= coincide
    if coincide.get("requests_waiting_during_pressure"):
        findings.append(f"{coincide['requests_waiting_during_pressure']} requests were in the queue during it, waiting p50 "
                        f"{secs(coincide['queue_p50_during_pressure_s'])} against {secs(coincide['queue_p50_others_s'])} "
                        "for the others (the queueing SL004 looks at)")
    summary = "KV cache pressure: " + "; ".join(findings) + "."
    rows = ctx.rows(f"""SELECT ts, kv, waiting, waiting_capacity, running, preempted FROM sl009_scrapes
                        WHERE kv >= {kv_high} OR preempted > 0 OR retracted > 0 ORDER BY ts LIMIT 30""")
    evidence["table"] = table(["scrape", "KV usage", "waiting", "waiting (capacity)", "running", "preemptions since last scrape"],
                              [[iso(r["ts"]), r["kv"], r["waiting"], r["waiting_capacity"], r["running"], r["preempted"]]
                               for r in rows])
    evidence["windows"] = [{"start": iso(s["first_pressure"]), "end": iso(s["last_pressure"])}]
    result = {"state": "fired", "summary": summary, "evidence": evidence, "examples": []}
    if coincide.get("requests_waiting_during_pressure"):
        result["examples"] = ctx.examples(_during(s), "queue_s DESC")
    if (preemptions or 0) >= p["critical_preemptions"]:
        result["severity"] = "critical"
    return result


def _during(s: dict) -> str:
    """Requests in the queue at some point of the pressure: arrived before its end and still waiting at its start
    (a burst that arrived earlier and waited through it counts; arrival time alone would miss it)."""
    start, end = s["first_pressure"].isoformat(sep=" "), s["last_pressure"].isoformat(sep=" ")
    return (f"queue_s IS NOT NULL AND t_at <= TIMESTAMP '{end}' "
            f"AND date_diff('microsecond', t_at, TIMESTAMP '{start}') / 1e6 <= queue_s")


def _queueing_during(ctx: DetectorContext, s: dict) -> dict:
    """Queue time of the requests that were waiting during the pressure, against the others'."""
    if not ctx.has("queue_s") or s["first_pressure"] is None:
        return {}
    during = _during(s)
    row = ctx.one(f"""SELECT count(*) FILTER (WHERE {during}) AS n_in,
                             {q('queue_s', 0.5)} FILTER (WHERE {during}) AS in_p50,
                             {q('queue_s', 0.5)} FILTER (WHERE queue_s IS NOT NULL AND NOT ({during})) AS out_p50
                      FROM scope_requests""")
    return {"requests_waiting_during_pressure": row["n_in"], "queue_p50_during_pressure_s": rounded(row["in_p50"]),
            "queue_p50_others_s": rounded(row["out_p50"])}


def _clear_summary(s: dict, kv_name: str | None, kv_high: float, preemptions: float | None, min_scrapes: int) -> str:
    kv_text = f"{kv_name} peaked at {pct(s['kv_max'])}" if kv_name and s["kv_max"] is not None else "no KV usage gauge"
    pre_text = "no preemptions" if preemptions == 0 else ("no preemption counter" if preemptions is None else
                                                          f"{preemptions:g} preemptions (below min_preemptions)")
    parts = []
    if s["low_kv_waiting_scrapes"]:
        parts.append(f"requests waited (up to {s['waiting_max'] or s['waiting_capacity_max']:g}) in "
                     f"{s['low_kv_waiting_scrapes']} scrape(s) while KV usage was under {pct(kv_high)}"
                     + (f" and up to {s['running_max']:g} ran" if s["running_max"] is not None else "")
                     + ": they waited on the concurrency cap (max-num-seqs / --parallel), not on the cache (see SL004)")
    if s["pressure_waiting_scrapes"]:
        parts.append(f"KV usage at or above {pct(kv_high)} with requests waiting in only {s['pressure_waiting_scrapes']} "
                     f"scrape(s) (min_pressure_scrapes {min_scrapes})")
    elif s["pressure_scrapes"]:
        parts.append(f"KV usage at or above {pct(kv_high)} in {s['pressure_scrapes']} scrape(s) but no request waited then "
                     "and nothing was preempted: the cache is full, not yet limiting")
    if not parts:
        parts.append("no request waited for capacity")
    return f"No KV cache pressure: {kv_text} over {s['scrapes']} scrapes, {pre_text}; " + "; ".join(parts) + "."


def _chart(ctx: DetectorContext, s: dict, kv_high: float, kv_name: str | None) -> dict:
    """KV usage, waiting and running per scrape; downsampled to at most MAX_CHART_POINTS buckets (max per bucket)."""
    span = max((s["t1"] - s["t0"]).total_seconds(), 1e-6)
    step = span / MAX_CHART_POINTS if s["scrapes"] > MAX_CHART_POINTS else None
    bucket = (f"floor(date_diff('microsecond', TIMESTAMP '{s['t0'].isoformat(sep=' ')}', ts) / 1e6 / {step})"
              if step else "epoch_us(ts)")
    rows = ctx.rows(f"""SELECT min(ts) AS ts, max(kv) AS kv, max(waiting) AS waiting, max(running) AS running,
                               sum(preempted) AS preempted
                        FROM sl009_scrapes GROUP BY {bucket} ORDER BY 1""")
    x = [iso(r["ts"]) for r in rows]
    series = []
    if kv_name:
        series.append({"name": "KV usage (%)", "x": x, "y": [rounded(100 * r["kv"], 2) if r["kv"] is not None else None for r in rows]})
    series.append({"name": "requests waiting", "x": x, "y": [r["waiting"] for r in rows]})
    series.append({"name": "requests running", "x": x, "y": [r["running"] for r in rows]})
    if any(r["preempted"] for r in rows):
        series.append({"name": "preemptions per scrape", "x": x, "y": [r["preempted"] for r in rows]})
    return chart("line", "KV cache usage, waiting and running requests per scrape", "time", "percent / requests", series,
                 x_time=True, hlines=[{"y": 100 * kv_high, "label": f"KV high ({pct(kv_high)})"}] if kv_name else [])
