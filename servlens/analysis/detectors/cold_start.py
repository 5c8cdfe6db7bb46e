"""SL007 cold start.

Starts of a scope, as in SL006: its first request in the data (a deploy, a scale-up, or the start of the export)
and every restart its counters show (a reset between two scrapes). After each start, the first `cold_requests`
requests that have a latency are "cold"; the requests after them until the next start are "steady".

The latency compared is the engine's work on the first token without the wait for a slot: prefill_s, else TTFT
minus queue_s, else TTFT (then a burst at the start could look like a cold start, and the finding says so). A first
request is slow when it is above the steady p99, `cold_ratio` times the steady p50 and `min_excess_s` more.

A heavy-tailed steady state has slow requests too, so slowness alone is not enough. The start is cold when
- the number of slow first requests is unlikely by chance: under the steady distribution a request passes the slow
  line with probability q = (steady requests past it + 1) / (steady requests + 1), and P(Binomial(first, q) >= slow)
  must be at most `max_p_value`; or
- the mechanism is measured: the slow first requests had a cached share of their prompt at least 30 points below
  the steady requests' (a cold prefix cache, from cached_tokens).
Otherwise the cause is named as engine warm-up. First requests with prompts `prompt_growth_limit` times the steady
median are explained by their length: the rule is clear then.
"""

from __future__ import annotations

import math

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, ratio, rounded, secs, table
from servlens.analysis.runner import DetectorContext
from servlens.analysis.windows import iso

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "cold_requests", "cold_ratio", "min_excess_s", "min_steady_requests", "prompt_growth_limit",
        "max_p_value"
    ],
    "requires": [],
}

# The slow first requests' cached share this far below the steady one (30 points) measures a cold prefix cache.
COLD_CACHE_GAP = 0.3


def _measure(ctx: DetectorContext) -> tuple[str, str, bool]:
    """(SQL expression, description, includes waiting) of the latency compared."""
    if ctx.has("prefill_s"):
        return "prefill_s", "prefill time (prefill_s, without the wait for a slot)", False
    if ctx.has("ttft_s", "queue_s"):
        return "(ttft_s - queue_s)", "TTFT minus queue time", False
    return "ttft_s", "TTFT (including any wait for a slot)", True


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    if ctx.window is None:
        return not_evaluable("no request has an arrival, first-token or end time (t_arrival, t_first_token, t_end)",
                             "The first requests cannot be told from the rest.")
    latency, described, includes_wait = _measure(ctx)
    restarts = ctx.rows("""SELECT prev_ts AS t_start, count(*) AS series
                           FROM scope_counter_increases WHERE is_reset GROUP BY prev_ts ORDER BY prev_ts""")
    first = ctx.one(f"SELECT min(t_at) AS t FROM scope_requests WHERE {latency} IS NOT NULL")["t"]
    if first is None:
        return not_evaluable(f"no request has a {described}", "No first-token latency to compare.")
    starts = [(first, "first request in the data")] + [(r["t_start"], f"restart (counter reset of {r['series']} series)")
                                                       for r in restarts if r["t_start"] > first]
    values = ", ".join(f"({i}, TIMESTAMP '{t.isoformat(sep=' ')}')" for i, (t, _) in enumerate(starts))
    k = int(p["cold_requests"])
    cached = "coalesce(cached_tokens, 0)"
    # Only the columns read below: copying whole rows (attrs JSON included) was most of this rule's time.
    ctx.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE sl007_ranked AS
        WITH s AS (SELECT * FROM (VALUES {values}) AS v(i, t_start)),
             b AS (SELECT i, t_start, lead(t_start) OVER (ORDER BY t_start) AS t_next FROM s)
        SELECT b.i, b.t_start, r.request_id, r.t_at, r.prompt_tokens, r.cached_tokens, {latency} AS lat,
               row_number() OVER (PARTITION BY b.i ORDER BY r.t_at, r.source_line, r.request_id) AS rank
        FROM b JOIN scope_requests r ON r.t_at >= b.t_start AND (b.t_next IS NULL OR r.t_at < b.t_next)
        WHERE {latency} IS NOT NULL AND coalesce(r.status, 'ok') <> 'error'""")
    per_start = ctx.rows(f"""
        WITH st AS (SELECT i, count(*) AS n, {q('lat', 0.5)} AS p50, {q('lat', 0.9)} AS p90, {q('lat', 0.99)} AS p99,
                           {q('prompt_tokens', 0.5)} AS prompt_p50,
                           sum({cached}) FILTER (WHERE cached_tokens IS NOT NULL)
                             / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS cached_share
                    FROM sl007_ranked WHERE rank > {k} GROUP BY i),
             co AS (SELECT i, count(*) AS n, max(lat) AS worst, {q('lat', 0.5)} AS p50,
                           {q('prompt_tokens', 0.5)} AS prompt_p50, max(t_at) AS t_last,
                           sum({cached}) FILTER (WHERE cached_tokens IS NOT NULL)
                             / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS cached_share
                    FROM sl007_ranked WHERE rank <= {k} GROUP BY i)
        SELECT co.i, co.n AS cold_n, co.worst AS cold_max, co.p50 AS cold_p50, co.prompt_p50 AS cold_prompt_p50,
               co.cached_share AS cold_cached_share, co.t_last AS cold_until,
               st.n AS steady_n, st.p50 AS steady_p50, st.p90 AS steady_p90, st.p99 AS steady_p99, st.prompt_p50 AS steady_prompt_p50,
               st.cached_share AS steady_cached_share
        FROM co LEFT JOIN st USING (i) ORDER BY co.i""")
    judged = []
    for row in per_start:
        start_t, kind = starts[row["i"]]
        if not row["steady_n"] or row["steady_n"] < p["min_steady_requests"]:
            judged.append(row | {"t": start_t, "kind": kind, "judgeable": False, "cold": False})
            continue
        line = max(row["steady_p99"], p["cold_ratio"] * row["steady_p50"], row["steady_p50"] + p["min_excess_s"])
        slow = ctx.one(f"""SELECT count(*) AS n, {q('prompt_tokens', 0.5)} AS prompt_p50,
                                  sum({cached}) FILTER (WHERE cached_tokens IS NOT NULL)
                                    / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS cached_share
                           FROM sl007_ranked WHERE i = {row['i']} AND rank <= {k} AND lat >= {line}""")
        past = ctx.one(f"SELECT count(*) AS n FROM sl007_ranked WHERE i = {row['i']} AND rank > {k} AND lat >= {line}")["n"]
        chance = (past + 1) / (row["steady_n"] + 1)
        p_value = binomial_tail(row["cold_n"], chance, slow["n"]) if slow["n"] else 1.0
        growth = ratio(slow["prompt_p50"], row["steady_prompt_p50"])
        longer = growth is not None and growth >= p["prompt_growth_limit"]
        cache_cold = (slow["cached_share"] is not None and row["steady_cached_share"] is not None
                      and row["steady_cached_share"] - slow["cached_share"] >= COLD_CACHE_GAP)
        cold = bool(slow["n"] and not longer and (p_value <= p["max_p_value"] or cache_cold))
        judged.append(row | {"t": start_t, "kind": kind, "judgeable": True, "line": line, "slow_n": slow["n"],
                             "slow_prompt_growth": growth, "slow_cached_share": slow["cached_share"],
                             "p_value": p_value, "chance": chance, "cache_cold": cache_cold,
                             "explained_by_length": bool(slow["n"]) and longer, "cold": cold})
    thresholds = {k_: p[k_] for k_ in ("cold_requests", "cold_ratio", "min_excess_s", "min_steady_requests",
                                        "prompt_growth_limit", "max_p_value")}
    usable = [j for j in judged if j["judgeable"]]
    if not usable:
        n = max((j["steady_n"] or 0 for j in judged), default=0)
        return not_evaluable(f"only {n} requests with a {described} after the first {k} of a start; the rule needs "
                             f"at least {p['min_steady_requests']} (min_steady_requests) to know the steady state",
                             "Too few requests to tell a cold start from the steady state.")
    table_rows = [[iso(j["t"]), j["kind"], j["cold_n"], j["cold_p50"], j["cold_max"], j["steady_n"], j["steady_p50"],
                   j["steady_p99"], j.get("slow_n"), rounded(j.get("p_value"), 6), j["cold_cached_share"], j["steady_cached_share"],
                   j["cold_prompt_p50"], j["steady_prompt_p50"]] for j in judged]
    the_table = table(["start", "kind", "first requests", "first p50 (s)", "first max (s)", "steady requests",
                       "steady p50 (s)", "steady p99 (s)", "slow first requests", "p (binomial)", "first cached share",
                       "steady cached share", "first prompt p50", "steady prompt p50"], table_rows)
    fired = [j for j in usable if j["cold"]]
    worst = max(fired or usable, key=lambda j: j["cold_max"] / max(j["steady_p50"], 1e-9))
    metrics = {"latency": described, "starts": len(judged), "restarts_in_metrics": len(restarts),
               "cold_starts": len(fired), "first_max_s": rounded(worst["cold_max"]),
               "first_p50_s": rounded(worst["cold_p50"]), "steady_p50_s": rounded(worst["steady_p50"]),
               "steady_p90_s": rounded(worst["steady_p90"]), "steady_p99_s": rounded(worst["steady_p99"]),
               "slow_line_s": rounded(worst.get("line")), "chance_past_line": rounded(worst.get("chance")),
               "p_value": rounded(worst.get("p_value"), 6),
               "cold_ratio_observed": rounded(ratio(worst["cold_max"], worst["steady_p50"])),
               "slow_first_requests": worst.get("slow_n"),
               "first_cached_share": rounded(worst["cold_cached_share"]),
               "slow_first_cached_share": rounded(worst.get("slow_cached_share")),
               "steady_cached_share": rounded(worst["steady_cached_share"])}
    if not fired:
        if any(j["explained_by_length"] for j in usable):
            j = next(j for j in usable if j["explained_by_length"])
            text = (f"the first requests after {j['kind']} were slower, but their prompts were "
                    f"{j['slow_prompt_growth']:.1f}x the steady median: explained by length, not by a cold start")
        else:
            text = (f"the first {k} requests after each of {len(usable)} start(s) took at most "
                    f"{secs(worst['cold_max'])} against a steady p50 of {secs(worst['steady_p50'])} and p99 of "
                    f"{secs(worst['steady_p99'])} ({described})"
                    + (f"; {worst['slow_n']} past the slow line is within chance (p={worst['p_value']:.2g})"
                       if worst.get("slow_n") else ""))
        return {"state": "clear", "summary": f"No cold start: {text}.",
                "evidence": {"metrics": metrics, "thresholds": thresholds, "table": the_table}}

    cause = _cause(worst, p)
    metrics["cause"] = cause
    metrics["excess_s"] = rounded(worst["cold_max"] - worst["steady_p50"])
    summary = (f"Cold start after {worst['kind']} at {iso(worst['t'])}: {worst['slow_n']} of the first "
               f"{worst['cold_n']} requests were slow, up to {secs(worst['cold_max'])} against a steady p50 of "
               f"{secs(worst['steady_p50'])} ({metrics['cold_ratio_observed']:.1f}x, {described}; chance of as many "
               f"slow first requests in steady state p={worst['p_value']:.2g}); cause: {cause}."
               + (f" {len(fired)} cold starts in all." if len(fired) > 1 else "")
               + (" TTFT includes waiting here: check SL004 for a burst at the start." if includes_wait else "")
               + " Reported apart so warm-up neither hides nor reads as a regression.")
    points = ctx.rows(f"""SELECT rank, lat FROM sl007_ranked WHERE i = {[j['i'] for j in judged].index(worst['i'])}
                          AND rank <= 300 ORDER BY rank""")
    the_chart = chart("scatter", f"{described.split(' (')[0]} per request after the start, in arrival order",
                      "request after the start", "seconds",
                      [{"name": "request", "x": [r["rank"] for r in points], "y": [rounded(r["lat"]) for r in points]}],
                      hlines=[{"y": rounded(worst["steady_p50"]), "label": "steady p50"},
                              {"y": rounded(worst["line"]), "label": "slow line (steady p99, at least "
                                                                     f"{p['cold_ratio']:g}x steady p50)"}],
                      vspans=[{"x0": 0.5, "x1": k + 0.5, "label": f"first {k} requests"}])
    return {
        "state": "fired", "summary": summary,
        "evidence": {"metrics": metrics, "thresholds": thresholds, "table": the_table, "chart": the_chart,
                     "windows": [{"start": iso(j["t"]), "end": iso(j["cold_until"])} for j in fired]},
        "examples": ctx.examples(
            f"request_id IN (SELECT request_id FROM sl007_ranked WHERE i = {worst['i']} AND rank <= {k} "
            f"AND lat >= {worst['line']})", f"{latency} DESC"),
    }


def binomial_tail(n: int, q: float, m: int) -> float:
    """P(X >= m) for X ~ Binomial(n, q): the chance that m or more of n first requests pass the slow line."""
    return min(1.0, sum(math.comb(n, x) * q ** x * (1 - q) ** (n - x) for x in range(m, n + 1)))


def _cause(j: dict, p: dict) -> str:
    first, steady = j.get("slow_cached_share"), j.get("steady_cached_share")
    if j.get("cache_cold"):
        return (f"a cold prefix cache (the slow first requests had {pct(first)} of their prompt cached, later ones "
                f"{pct(steady)})")
    return "engine warm-up (same prompt lengths and cache as later, still slower: graph capture, JIT, lazy loading)"
