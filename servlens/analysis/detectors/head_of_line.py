"""SL008 long prompts holding short ones back (head-of-line blocking).

Long prompts are the scope's requests at or above the `long_quantile` of prompt length and at least `long_ratio`
times the median; short ones are at or below the median. A long request is being prefilled from its prefill start
(first token minus prefill_s; else arrival plus queue_s; else arrival) to its first token. A short request was
exposed when its own wait for the first token (arrival to first token) overlapped some long request's prefill.

The effect is the short requests' TTFT when exposed against when not (p50 and p90), pooled and per log2 prompt band
of the short requests (so a band that is merely longer does not read as blocking). The rule fires when the exposed
p50 is `hol_ratio` times the unexposed p50 and `min_excess_s` more, with at least `min_group` requests each side,
in at least half the bands compared, and a one-sided rank test (Mann-Whitney U) gives p <= `max_p_value`: a few
exposed requests from a heavy tail do not fire it.
All of it is one interval join in DuckDB (IEJoin on the overlap condition), not a loop over requests.
"""

from __future__ import annotations

import math

from servlens.analysis.detectors._common import chart, not_evaluable, q, ratio, rounded, secs, table
from servlens.analysis.runner import DetectorContext

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_requests", "min_group", "long_quantile", "long_ratio", "hol_ratio", "min_excess_s",
        "max_p_value"
    ],
    "requires": [],
}

OK = "prompt_tokens IS NOT NULL AND t_arrival IS NOT NULL AND coalesce(status, 'ok') <> 'error'"
# Short requests need their own TTFT; long ones only a prefill interval (a non-streamed long request still fills
# the batch: its queue_s and prefill_s place its prefill without a TTFT).
BASE = f"ttft_s IS NOT NULL AND {OK}"
# Without a TTFT the prefill is placed by queue_s + prefill_s; an unknown queue leaves it unplaced (not "no wait").
LONG_INTERVAL = "(ttft_s IS NOT NULL OR (prefill_s IS NOT NULL AND queue_s IS NOT NULL))"


def _seconds(expr: str) -> str:
    return f"to_microseconds(CAST(({expr}) * 1e6 AS BIGINT))"


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    n = ctx.one(f"SELECT count(*) AS n FROM scope_requests WHERE {BASE}")["n"]
    if n < p["min_requests"]:
        return not_evaluable(f"only {n} successful requests with TTFT, prompt tokens and arrival time; the rule needs "
                             f"at least {p['min_requests']} (min_requests)", "Too few requests to compare cohorts.")
    cut = ctx.one(f"""SELECT {q('prompt_tokens', 0.5)} AS p50, {q('prompt_tokens', p['long_quantile'])} AS pl
                      FROM scope_requests WHERE {OK}""")
    long_min = max(cut["pl"], p["long_ratio"] * cut["p50"])
    prefill_start = ("CASE WHEN prefill_s IS NOT NULL AND ttft_s IS NOT NULL THEN t_arrival + " +
                     _seconds("ttft_s - prefill_s") + " WHEN queue_s IS NOT NULL THEN t_arrival + " + _seconds("queue_s") +
                     " ELSE t_arrival END")
    prefill_end = ("CASE WHEN ttft_s IS NOT NULL THEN t_arrival + " + _seconds("ttft_s") + " ELSE t_arrival + " +
                   _seconds("queue_s + prefill_s") + " END")
    # Only the columns read from sl008_short (whole rows, attrs JSON included, made the copy slow).
    ctx.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE sl008_short AS
        SELECT s.request_id, s.t_arrival, s.ttft_s, s.prompt_tokens, s.queue_s, s.prefill_s,
               t_arrival + {_seconds('ttft_s')} AS t_ft,
               CASE WHEN prompt_tokens <= 16 THEN 16 ELSE CAST(pow(2, ceil(log2(prompt_tokens))) AS BIGINT) END AS band,
               EXISTS (SELECT 1 FROM (
                           SELECT request_id AS lid, {prefill_start} AS p0, {prefill_end} AS p1
                           FROM scope_requests WHERE {OK} AND {LONG_INTERVAL} AND prompt_tokens >= {long_min}) l
                       WHERE l.p0 < s.t_arrival + {_seconds('s.ttft_s')} AND l.p1 > s.t_arrival
                         AND l.lid IS DISTINCT FROM s.request_id) AS exposed
        FROM scope_requests s WHERE {BASE} AND prompt_tokens <= {cut['p50']}""")
    long_n = ctx.one(f"""SELECT count(*) AS n FROM scope_requests
                         WHERE {OK} AND {LONG_INTERVAL} AND prompt_tokens >= {long_min}""")["n"]
    groups = {r["exposed"]: r for r in ctx.rows(f"""
        SELECT exposed, count(*) AS n, {q('ttft_s', 0.5)} AS p50, {q('ttft_s', 0.9)} AS p90,
               {q('prompt_tokens', 0.5)} AS prompt_p50,
               avg(queue_s) AS queue_mean, avg(prefill_s) AS prefill_mean
        FROM sl008_short GROUP BY exposed""")}
    exposed, clear_ = groups.get(True), groups.get(False)
    metrics = {"requests": n, "prompt_p50_tokens": rounded(cut["p50"]), "long_prompt_min_tokens": rounded(long_min),
               "long_requests": long_n, "short_exposed": exposed["n"] if exposed else 0,
               "short_not_exposed": clear_["n"] if clear_ else 0}
    thresholds = {k: p[k] for k in ("long_quantile", "long_ratio", "hol_ratio", "min_excess_s", "min_group",
                                    "min_requests", "max_p_value")}
    if not long_n:
        return {"state": "clear", "evidence": {"metrics": metrics, "thresholds": thresholds},
                "summary": f"No long prompts to hold others back: none of {n} requests reached {long_min:.0f} tokens "
                           f"({p['long_ratio']:g}x the median of {cut['p50']:.0f})."}
    if not exposed or not clear_ or exposed["n"] < p["min_group"] or clear_["n"] < p["min_group"]:
        return not_evaluable(
            f"{metrics['short_exposed']} short request(s) waited while one of the {long_n} long prompts (>= "
            f"{long_min:.0f} tokens) was prefilled and {metrics['short_not_exposed']} did not; each side needs "
            f"{p['min_group']} (min_group)", "Too few short requests on one side to measure a head-of-line effect.",
            {"metrics": metrics, "thresholds": thresholds})
    effect = ratio(exposed["p50"], clear_["p50"])
    excess = exposed["p50"] - clear_["p50"]
    bands = ctx.rows(f"""
        SELECT band, count(*) FILTER (WHERE exposed) AS n_exposed, count(*) FILTER (WHERE NOT exposed) AS n_clear,
               {q('ttft_s', 0.5)} FILTER (WHERE exposed) AS p50_exposed,
               {q('ttft_s', 0.5)} FILTER (WHERE NOT exposed) AS p50_clear,
               {q('ttft_s', 0.9)} FILTER (WHERE exposed) AS p90_exposed,
               {q('ttft_s', 0.9)} FILTER (WHERE NOT exposed) AS p90_clear
        FROM sl008_short GROUP BY band ORDER BY band""")
    compared = [b for b in bands if b["n_exposed"] >= 2 and b["n_clear"] >= 2]
    bands_worse = sum(1 for b in compared if b["p50_exposed"] > b["p50_clear"])
    metrics |= {"short_ttft_p50_exposed_s": rounded(exposed["p50"]), "short_ttft_p50_not_exposed_s": rounded(clear_["p50"]),
                "short_ttft_p90_exposed_s": rounded(exposed["p90"]), "short_ttft_p90_not_exposed_s": rounded(clear_["p90"]),
                "hol_ratio_observed": rounded(effect), "excess_s": rounded(excess),
                "exposed_share": rounded(exposed["n"] / (exposed["n"] + clear_["n"])),
                "bands_compared": len(compared), "bands_worse_when_exposed": bands_worse,
                "exposed_queue_mean_s": rounded(exposed["queue_mean"]),
                "not_exposed_queue_mean_s": rounded(clear_["queue_mean"])}
    band_table = table(["short prompt band (tokens, upper)", "exposed", "not exposed", "TTFT p50 exposed (s)",
                        "TTFT p50 not exposed (s)", "TTFT p90 exposed (s)", "TTFT p90 not exposed (s)"],
                       [[b["band"], b["n_exposed"], b["n_clear"], b["p50_exposed"], b["p50_clear"], b["p90_exposed"],
                         b["p90_clear"]] for b in bands])
    the_chart = chart("bar", "Short requests' TTFT with and without a long prompt in prefill",
                      "short prompt band (tokens, upper edge)", "TTFT p50 (s)",
                      [{"name": "while a long prompt was prefilled", "x": [str(b["band"]) for b in bands],
                        "y": [rounded(b["p50_exposed"]) for b in bands]},
                       {"name": "no long prompt in prefill", "x": [str(b["band"]) for b in bands],
                        "y": [rounded(b["p50_clear"]) for b in bands]}])
    evidence = {"metrics": metrics, "thresholds": thresholds, "table": band_table, "chart": the_chart}
    p_value = _rank_test(ctx, exposed["n"], clear_["n"])
    metrics["p_value"] = rounded(p_value, 6)
    fired = effect is not None and effect >= p["hol_ratio"] and excess >= p["min_excess_s"] and (
        not compared or bands_worse * 2 >= len(compared)) and p_value <= p["max_p_value"]
    if not fired:
        return {"state": "clear", "evidence": evidence,
                "summary": (f"Long prompts do not hold short ones back: short requests' TTFT p50 is "
                            f"{secs(exposed['p50'])} while a long prompt (>= {long_min:.0f} tokens) is prefilled and "
                            f"{secs(clear_['p50'])} otherwise ({effect:.2f}x, rank test p={p_value:.2g})."
                            if effect is not None else
                            "Long prompts do not hold short ones back.")}
    queue_note = ""
    if exposed["queue_mean"] is not None and clear_["queue_mean"] is not None:
        queue_note = (f"; they waited {secs(exposed['queue_mean'])} on average for a slot against "
                      f"{secs(clear_['queue_mean'])}")
    window = ctx.one("SELECT min(t_arrival) AS a, max(t_ft) AS b FROM sl008_short WHERE exposed")
    summary = (f"Long prompts hold short ones back: {exposed['n']} short requests (<= {cut['p50']:.0f} prompt "
               f"tokens) that waited while a long prompt (>= {long_min:.0f} tokens) was prefilled had TTFT p50 "
               f"{secs(exposed['p50'])} (p90 {secs(exposed['p90'])}) against {secs(clear_['p50'])} (p90 "
               f"{secs(clear_['p90'])}) for the {clear_['n']} that did not: {effect:.1f}x, +{secs(excess)}"
               f"{queue_note}; worse in {bands_worse} of {len(compared)} prompt bands compared (rank test "
               f"p={p_value:.2g}).")
    return {
        "state": "fired", "summary": summary,
        "evidence": evidence | {"windows": [{"start": window["a"], "end": window["b"]}]},
        "examples": ctx.examples("request_id IN (SELECT request_id FROM sl008_short WHERE exposed)", "ttft_s DESC"),
    }


def _rank_test(ctx: DetectorContext, n_exposed: int, n_clear: int) -> float:
    """One-sided Mann-Whitney U test that exposed short requests have longer TTFTs: the rank sum comes from SQL
    (mid-ranks for ties), the p-value from the normal approximation with the tie correction."""
    row = ctx.one("""
        WITH r AS (SELECT exposed, ttft_s, rank() OVER (ORDER BY ttft_s) AS rk,
                          count(*) OVER (PARTITION BY ttft_s) AS ties FROM sl008_short),
             t AS (SELECT ttft_s, min(ties) AS ties FROM r GROUP BY ttft_s)
        SELECT (SELECT sum(rk + (ties - 1) / 2.0) FROM r WHERE exposed) AS rank_sum,
               (SELECT sum(ties * ties * ties - ties) FROM t) AS tie_term""")
    n1, n2 = n_exposed, n_clear
    n = n1 + n2
    u = float(row["rank_sum"]) - n1 * (n1 + 1) / 2
    variance = n1 * n2 / 12 * ((n + 1) - float(row["tie_term"] or 0) / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)   # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))
