"""SL010 TPOT saturation: time per output token rising with the number of requests decoding at once.

Each request gets the concurrency it decoded under, computed in DuckDB:

- from the requests themselves (overlap): a request is busy on the engine from its start (end minus the engine's
  prefill + decode time when known, else arrival plus queue time, else arrival) to its end; its concurrency is the
  number of requests busy at the midpoint of its decode (itself included). Gateway logs without queue or engine times
  count requests in flight at the gateway, which includes the ones still waiting;
- else from a running-requests gauge (vLLM num_requests_running, llama.cpp requests_processing, SGLang
  num_running_reqs): the last scrape at or before the request's decode midpoint.

Requests are grouped by concurrency level (binned when there are many levels); per level TPOT p50 and p99. The rule
fires when TPOT rises with concurrency (Spearman rank correlation >= `min_rank_corr`, p50 at the highest level >=
`min_growth` x the lowest) and TPOT p99 crosses `target_tpot_p99_s` from a level upward: the crossing concurrency is
the lowest level from which every level above is over the target, and the highest level under it is the concurrency
the target allows. TPOT over the target already at the lowest level is per-token speed, not batching: clear, and the
summary says so.
"""

from __future__ import annotations

import math

from servlens.analysis.detectors._common import chart, not_evaluable, q, rounded, secs, table
from servlens.analysis.runner import DetectorContext

RUNNING_GAUGES = ("vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs")
MAX_LEVELS = 16


def _concurrency_table(ctx: DetectorContext) -> str:
    """Create sl010_requests (request_id, source_line, tpot_s, conc) and return how concurrency was measured."""
    spec = ctx.window
    end = spec.offset_sql("t_end")
    # Busy from the start of prefill; with prefill unknown, from the start of decode (the part known to be busy);
    # else from arrival after the known queue, else from arrival.
    start = (f"coalesce({end} - (prefill_s + decode_s), {end} - decode_s, {spec.offset_sql('t_arrival')} + queue_s, "
             f"{spec.offset_sql('t_arrival')})")
    decode_start = f"coalesce({spec.offset_sql('t_first_token')}, {end} - decode_s, {start})"
    # Every request with an end occupies the engine (streamed or not, with a TPOT or not); the ones with a TPOT are judged.
    everyone = f"""SELECT request_id, source_line, tpot_s, decode_s, completion_tokens, {start} AS s, {end} AS e, (coalesce({decode_start}, {end}) + {end}) / 2 AS mid
                   FROM scope_requests WHERE t_end IS NOT NULL"""
    # TPOT over a handful of tokens is one or two inter-token gaps: a single stall decides it, so short answers are
    # not judged (they still occupy the engine above). Unknown token counts are kept.
    base = (f"SELECT * FROM ({everyone}) WHERE tpot_s IS NOT NULL "
            f"AND coalesce(completion_tokens, {int(ctx.params['min_completion_tokens'])}) >= {int(ctx.params['min_completion_tokens'])}")
    if ctx.path_available("tpot_overlap"):
        # With the engine's own times, a request without them (a client timeout, an error) has no known busy
        # interval: from arrival to its end it was mostly waiting, and counting it would inflate the concurrency.
        engine_only = "AND decode_s IS NOT NULL" if ctx.has("decode_s") else ""
        # Requests busy at each midpoint (s <= mid < e) as a running count over one time-ordered pass: +1 at each
        # start, -1 at each end, both sorted before a midpoint at the same instant; a range join compared every
        # request with every other. An interval that ends before it starts is never busy, so it is left out.
        ctx.con.execute(f"""
            CREATE OR REPLACE TEMP TABLE sl010_requests AS
            WITH r AS (SELECT row_number() OVER () AS rid, * FROM ({base}) WHERE mid IS NOT NULL),
                 busy AS (SELECT s, e FROM ({everyone}) WHERE s IS NOT NULL {engine_only} AND s <= e),
                 events AS (SELECT s AS t, 0 AS ord, 1 AS step, CAST(NULL AS BIGINT) AS rid FROM busy
                            UNION ALL SELECT e, 0, -1, NULL FROM busy
                            UNION ALL SELECT mid, 1, 0, rid FROM r),
                 counted AS (SELECT rid, sum(step) OVER (ORDER BY t, ord ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                                     AS busy_n
                             FROM events)
            SELECT r.request_id, r.source_line, r.tpot_s, CAST(sum(c.busy_n) AS BIGINT) AS conc
            FROM r JOIN counted c ON c.rid = r.rid
            GROUP BY r.request_id, r.source_line, r.tpot_s HAVING sum(c.busy_n) > 0""")
        if ctx.has("decode_s"):
            return "request overlap (engine prefill + decode time before each end)"
        return "request overlap (arrival" + (" + queue time" if ctx.has("queue_s") else "") + " to end)"
    gauge = next(n for n in RUNNING_GAUGES if n in ctx.metrics_present)
    # The last scrape at or before each request's decode midpoint: requests and scrapes in one time order, the
    # running value carried forward (portable: last_value ... IGNORE NULLS over a sorted union).
    ctx.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE sl010_requests AS
        WITH r AS ({base}),
             g AS (SELECT {spec.offset_sql('ts')} AS t, sum(value) AS running FROM scope_metrics
                   WHERE name = '{gauge}' AND series = 'value' GROUP BY ts),
             pts AS (SELECT t, running, NULL AS request_id, NULL AS source_line, NULL AS tpot_s FROM g
                     UNION ALL SELECT mid, NULL, request_id, source_line, tpot_s FROM r WHERE mid IS NOT NULL),
             carried AS (SELECT *, last_value(running IGNORE NULLS) OVER (ORDER BY t, running NULLS LAST
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS conc FROM pts)
        SELECT request_id, source_line, tpot_s, CAST(round(conc) AS BIGINT) AS conc
        FROM carried WHERE request_id IS NOT NULL AND conc IS NOT NULL AND conc >= 1""")
    return f"{gauge} (last scrape before each request's decode)"


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    if ctx.window is None:
        return not_evaluable("no request has an arrival, first-token or end time", "TPOT cannot be placed in time.")
    source = _concurrency_table(ctx)
    s = ctx.one("SELECT count(*) AS n, max(conc) AS conc_max, min(conc) AS conc_min FROM sl010_requests")
    if s["n"] < p["min_requests"]:
        return not_evaluable(f"only {s['n']} requests with TPOT and a concurrency ({source}); the rule needs at least "
                             f"{p['min_requests']} (min_requests)", "Too few requests to relate TPOT to concurrency.")
    width = max(1, math.ceil(s["conc_max"] / MAX_LEVELS))
    level = f"(CAST(floor((conc - 1) / {width}) AS BIGINT) * {width} + 1)"
    levels = ctx.rows(f"""SELECT {level} AS lo, {level} + {width - 1} AS hi, count(*) AS n,
                                 {q('tpot_s', 0.5)} AS p50, {q('tpot_s', 0.99)} AS p99
                          FROM sl010_requests GROUP BY 1 ORDER BY 1""")
    # Spearman's rank correlation: Pearson on average ranks (ties share the mean of their ranks).
    corr = ctx.one("""SELECT corr(rc, rt) AS rho FROM (
                          SELECT rank() OVER (ORDER BY conc) + (count(*) OVER (PARTITION BY conc) - 1) / 2.0 AS rc,
                                 rank() OVER (ORDER BY tpot_s) + (count(*) OVER (PARTITION BY tpot_s) - 1) / 2.0 AS rt
                          FROM sl010_requests)""")["rho"]
    valid = [lv for lv in levels if lv["n"] >= p["min_level_requests"]]
    target = p["target_tpot_p99_s"]
    thresholds = {k: p[k] for k in ("target_tpot_p99_s", "min_growth", "min_rank_corr", "min_level_requests", "min_requests",
                                    "min_completion_tokens")}
    metrics = {"requests": s["n"], "concurrency_source": source, "concurrency_max": s["conc_max"],
               "levels": len(levels), "levels_judged": len(valid), "level_width": width, "rank_corr": rounded(corr)}
    label = (lambda lv: f"{lv['lo']}" if width == 1 else f"{lv['lo']}-{lv['hi']}")
    the_chart = chart("line", "TPOT by concurrency (requests decoding at once)", "concurrency", "TPOT (s)", [
        {"name": "TPOT p50 (s)", "x": [lv["lo"] for lv in valid], "y": [rounded(lv["p50"]) for lv in valid]},
        {"name": "TPOT p99 (s)", "x": [lv["lo"] for lv in valid], "y": [rounded(lv["p99"]) for lv in valid]},
    ], hlines=[{"y": target, "label": f"target TPOT p99 ({secs(target)})"}])
    the_table = table(["concurrency", "requests", "TPOT p50 (s)", "TPOT p99 (s)", "judged"],
                      [[label(lv), lv["n"], lv["p50"], lv["p99"], lv["n"] >= p["min_level_requests"]] for lv in levels])
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart, "table": the_table}
    if len(valid) < 2:
        return not_evaluable(f"only {len(valid)} concurrency level(s) with at least {p['min_level_requests']} requests "
                             f"(min_level_requests) among {s['n']} requests; TPOT cannot be related to concurrency",
                             "All requests decoded at about the same concurrency.", evidence)
    low, high = valid[0], valid[-1]
    growth = high["p50"] / low["p50"] if low["p50"] else None
    crossing = None
    for i, lv in enumerate(valid):
        if all(v["p99"] > target for v in valid[i:]):
            crossing = lv
            break
    allowed = max((v for v in valid if crossing is None or v["lo"] < crossing["lo"]), key=lambda v: v["lo"], default=None)
    metrics |= {"tpot_p50_lowest_level_s": rounded(low["p50"]), "tpot_p50_highest_level_s": rounded(high["p50"]),
                "tpot_p99_highest_level_s": rounded(high["p99"]), "growth": rounded(growth),
                "lowest_level": label(low), "highest_level": label(high),
                "crossing_concurrency": crossing["lo"] if crossing else None,
                "allowed_concurrency": (allowed["hi"] if allowed and crossing else None)}
    rises = (corr or 0) >= p["min_rank_corr"] and (growth or 0) >= p["min_growth"]
    rise_text = (f"TPOT p50 goes from {secs(low['p50'])} at concurrency {label(low)} to {secs(high['p50'])} at "
                 f"{label(high)} ({growth:.1f}x, rank correlation {corr:.2f})")
    if crossing is not None and crossing is low:
        return {"state": "clear", "evidence": evidence,
                "summary": f"TPOT p99 is over the {secs(target)} target already at the lowest concurrency ({label(low)}: "
                           f"{secs(low['p99'])}): per-token speed (model, hardware, long contexts), not the batch size; "
                           f"{rise_text}."}
    if not rises:
        return {"state": "clear", "evidence": evidence,
                "summary": f"No TPOT saturation: TPOT does not rise with concurrency ({rise_text}; needs {p['min_growth']:g}x "
                           f"and a rank correlation of {p['min_rank_corr']:g})."}
    if crossing is None:
        return {"state": "clear", "evidence": evidence,
                "summary": f"TPOT rises with concurrency but stays under the target: {rise_text}; TPOT p99 at most "
                           f"{secs(max(v['p99'] for v in valid))} against {secs(target)}."}
    # Levels under the crossing that were over the target once: a noisy p99 of few requests, named, not hidden.
    noisy = [label(v) for v in valid if v["lo"] < crossing["lo"] and v["p99"] > target]
    metrics["levels_over_target_below_crossing"] = noisy
    summary = (f"TPOT saturates with concurrency: {rise_text}; TPOT p99 crosses the {secs(target)} target from "
               f"concurrency {label(crossing)} ({secs(crossing['p99'])}) upward, so the target allows about "
               f"{allowed['hi']} requests decoding at once"
               + (f" (level {', '.join(noisy)} also went over it, not sustained)" if noisy else "")
               + (f" (concurrency {_span(allowed['hi'] + 1, crossing['lo'] - 1)} had too few requests to judge)"
                  if crossing["lo"] - allowed["hi"] > 1 else "")
               + f"; concurrency from {source}.")
    result = {"state": "fired", "summary": summary, "evidence": evidence,
              "examples": ctx.examples(f"tpot_s IS NOT NULL AND request_id IN (SELECT request_id FROM sl010_requests "
                                       f"WHERE conc >= {crossing['lo']})", "tpot_s DESC")}
    if high["p99"] >= p["critical_ratio"] * target:
        result["severity"] = "critical"
    return result


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}-{hi}"
