"""SL011 timeouts at the gateway limit.

A fixed request timeout (a gateway's `timeout`, a client's read timeout, a load balancer's idle limit) leaves a mark
in the data: failed requests whose end-to-end time piles up just under one value, and no request that lasted longer.
The limit is found from the data, not configured:

1. failed requests (status error/timeout, finish error/abort/timeout, HTTP 408/499/504/524) with e2e >= `min_limit_s`;
2. for each of them, the failures whose e2e falls within `band` (relative) below its own e2e; the densest such band
   is the spike, and its top is the limit (ties: the longer one);
3. the spike is a limit when it holds at least `min_cluster_requests` failures, at least `min_failed_share` of the
   requests that reached the band failed, and at most `max_over_limit_share` of all requests lasted longer than the
   limit (a hard limit leaves none past it).

For the requests at the limit, the time splits into queue (queue_s), first token (TTFT minus queue) and generation
(e2e minus TTFT) where the columns exist; requests that never got a first token are counted. Every request with a
max_tokens is then checked against the limit: its queue plus the scope's typical no-wait TTFT plus max_tokens at the
typical TPOT of successful requests; the ones over the limit could never finish in time if they generated their cap.
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, rounded, secs, table
from servlens.analysis.runner import DetectorContext

# NULL-safe: a column a source lacks is NULL, and NOT (NULL) would drop the finished requests from every count.
FAILED = ("coalesce(status IN ('error', 'timeout') OR finish_reason IN ('error', 'abort', 'timeout') "
          "OR http_status IN (408, 499, 504, 524), false)")


def num(value: float) -> str:
    """A float as a DOUBLE literal: a bare 120.01546740531921 is a DECIMAL in SQL and overflows when multiplied."""
    return f"CAST({float(value)!r} AS DOUBLE)"


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    # The scope's columns this rule reads, copied once: a dozen queries follow, and through the scope view each of
    # them filtered the whole requests table again. Every row is kept (some counts do not require e2e_s).
    ctx.con.execute("""CREATE OR REPLACE TEMP TABLE sl011_requests AS
                       SELECT e2e_s, status, finish_reason, http_status, queue_s, ttft_s, prefill_s, decode_s, tpot_s,
                              completion_tokens, max_tokens
                       FROM scope_requests""")
    base = ctx.one(f"""SELECT count(*) AS n, count(*) FILTER (WHERE {FAILED}) AS failed,
                              count(*) FILTER (WHERE {FAILED} AND e2e_s >= {num(p['min_limit_s'])}) AS failed_slow,
                              max(e2e_s) FILTER (WHERE {FAILED}) AS failed_max, min(e2e_s) FILTER (WHERE {FAILED}) AS failed_min
                       FROM sl011_requests WHERE e2e_s IS NOT NULL""")
    if base["n"] < p["min_requests"]:
        return not_evaluable(f"only {base['n']} requests with e2e_s; the rule needs at least {p['min_requests']} "
                             "(min_requests)", "Too few requests to look for a timeout limit.")
    thresholds = {k: p[k] for k in ("min_limit_s", "band", "min_cluster_requests", "min_failed_share",
                                    "max_over_limit_share", "critical_share", "min_requests")}
    metrics = {"requests": base["n"], "failed": base["failed"], "failed_over_min_limit": base["failed_slow"]}
    if base["failed_slow"] == 0:
        detail = (f"{base['failed']} failed, all within {secs(base['failed_max'])} (fast rejections, not timeouts)"
                  if base["failed"] else "none failed")
        return {"state": "clear", "evidence": {"metrics": metrics, "thresholds": thresholds},
                "summary": f"No timeouts at a limit: of {base['n']} requests {detail}; nothing failed after "
                           f"{secs(p['min_limit_s'])} or more."}
    band = p["band"]
    spike = ctx.one(f"""
        WITH f AS (SELECT e2e_s FROM sl011_requests WHERE {FAILED} AND e2e_s >= {num(p['min_limit_s'])})
        SELECT a.e2e_s AS top, count(*) AS n FROM f a JOIN f b ON b.e2e_s <= a.e2e_s AND b.e2e_s >= a.e2e_s * {num(1 - band)}
        GROUP BY a.e2e_s ORDER BY n DESC, top DESC LIMIT 1""")
    limit = spike["top"]
    lo = limit * (1 - band)
    in_band = f"e2e_s BETWEEN {num(lo)} AND {num(limit)}"
    at_limit = f"{FAILED} AND {in_band}"
    s = ctx.one(f"""SELECT count(*) FILTER (WHERE {in_band}) AS reached, count(*) FILTER (WHERE {at_limit}) AS at_limit,
                           count(*) FILTER (WHERE e2e_s > {num(limit * (1 + band))}) AS over_limit,
                           count(*) FILTER (WHERE NOT ({FAILED})) AS ok,
                           {q('e2e_s', 0.99)} FILTER (WHERE NOT ({FAILED})) AS ok_e2e_p99,
                           max(e2e_s) FILTER (WHERE NOT ({FAILED})) AS ok_e2e_max
                    FROM sl011_requests WHERE e2e_s IS NOT NULL""")
    failed_share = s["at_limit"] / s["reached"] if s["reached"] else 0.0
    over_share = s["over_limit"] / base["n"]
    metrics |= {"limit_s": rounded(limit), "band_start_s": rounded(lo), "failed_at_limit": s["at_limit"],
                "reached_limit": s["reached"], "failed_share_at_limit": rounded(failed_share),
                "over_limit": s["over_limit"], "over_limit_share": rounded(over_share),
                "ok_e2e_p99_s": rounded(s["ok_e2e_p99"]), "ok_e2e_max_s": rounded(s["ok_e2e_max"])}
    the_chart = _histogram(ctx, limit, band)
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}
    is_limit = (s["at_limit"] >= p["min_cluster_requests"] and failed_share >= p["min_failed_share"]
                and over_share <= p["max_over_limit_share"])
    if not is_limit:
        why = []
        if s["at_limit"] < p["min_cluster_requests"]:
            why.append(f"only {s['at_limit']} failures end within {pct(band)} below {secs(limit)}")
        if failed_share < p["min_failed_share"]:
            why.append(f"{pct(failed_share)} of the requests that lasted that long failed")
        if over_share > p["max_over_limit_share"]:
            why.append(f"{s['over_limit']} requests ({pct(over_share, 1)}) lasted longer than it")
        return {"state": "clear", "evidence": evidence,
                "summary": f"No fixed timeout limit: {base['failed_slow']} requests failed after {secs(p['min_limit_s'])} "
                           f"or more, but their e2e does not pile up at one value ({'; '.join(why)})."}

    split = _time_split(ctx, at_limit, limit)
    metrics |= split
    fit = _never_fit(ctx, limit)
    metrics |= fit
    parts = [f"{s['at_limit']} failed requests end within {pct(band)} below {secs(limit)} and none of the "
             f"{base['n']} requests lasted longer" if s["over_limit"] == 0 else
             f"{s['at_limit']} failed requests end within {pct(band)} below {secs(limit)} ({s['over_limit']} lasted longer)",
             f"{pct(failed_share)} of the requests that reached it failed"]
    if split.get("split_requests"):
        shares = (f"queue {pct(split['queue_share'])}, first token {pct(split['first_token_share'])}, "
                  f"generation {pct(split['generation_share'])}" if split["queue_share"] is not None else
                  f"first token (queue unknown, included) {pct(split['first_token_share'])}, "
                  f"generation {pct(split['generation_share'])}")
        parts.append(f"their time went to {shares}" if split["split_of"] == "failed at the limit" else
                     f"the failed ones carry no times; the {split['split_requests']} requests that {split['split_of']} "
                     f"spent {shares}")
    if split.get("no_first_token"):
        parts.append(f"{split['no_first_token']} never got a first token")
    if fit.get("never_fit") is not None:
        parts.append(f"{fit['never_fit']} of {fit['with_max_tokens']} requests could never fit it ("
                     + ("queue + " if ctx.has("queue_s") else "")
                     + f"typical first token + max_tokens at the typical {secs(fit['tpot_p50_s'])} per token)")
    summary = f"Timeouts at a fixed limit of about {secs(limit)}: " + "; ".join(parts) + "."
    share = s["at_limit"] / base["n"]
    metrics["timeout_share"] = rounded(share)
    evidence["table"] = _per_cap(ctx, limit, at_limit)
    evidence["windows"] = []
    result = {"state": "fired", "summary": summary, "evidence": evidence,
              "examples": ctx.examples(at_limit, "e2e_s DESC")}
    if share >= p["critical_share"]:
        result["severity"] = "critical"
    return result


# Where a request's time went. First token without the queue: TTFT - queue, else the engine's prefill; generation:
# e2e - TTFT, else the engine's decode time (non-streamed requests have no TTFT but engines report both).
QUEUE = "coalesce(queue_s, 0)"
FIRST = "coalesce(ttft_s - coalesce(queue_s, 0), prefill_s)"
GENERATION = "coalesce(e2e_s - ttft_s, decode_s)"


def _split(ctx: DetectorContext, where: str) -> dict | None:
    """Queue, first-token and generation shares of e2e summed over the requests matching `where` that have them."""
    if not (ctx.has("ttft_s") or ctx.has("prefill_s") or ctx.has("decode_s")):
        return None
    row = ctx.one(f"""SELECT count(*) AS n, sum({QUEUE}) AS queue_sum, sum({FIRST}) AS first_sum,
                             sum({GENERATION}) AS gen_sum, sum(e2e_s) AS e2e_sum, {q(QUEUE, 0.5)} AS queue_p50
                      FROM sl011_requests WHERE {where} AND {FIRST} IS NOT NULL AND {GENERATION} IS NOT NULL""")
    if not row["n"] or not row["e2e_sum"]:
        return None
    # Without queue_s the wait is unknown, not zero: it stays inside the first-token share.
    return {"n": row["n"], "queue_share": row["queue_sum"] / row["e2e_sum"] if ctx.has("queue_s") else None,
            "first_token_share": row["first_sum"] / row["e2e_sum"],
            "generation_share": row["gen_sum"] / row["e2e_sum"], "queue_p50_s": row["queue_p50"]}


def _time_split(ctx: DetectorContext, at_limit: str, limit: float) -> dict:
    """The split of the failed requests at the limit; when they carry no times (a client gave up and got no
    response), the split of the finished requests that took at least half the limit, named as such."""
    out: dict = {}
    if ctx.has("ttft_s"):
        out["no_first_token"] = ctx.one(f"SELECT count(*) AS n FROM sl011_requests WHERE {at_limit} AND ttft_s IS NULL")["n"]
    split, of = _split(ctx, at_limit), "failed at the limit"
    if split is None:
        split, of = _split(ctx, f"NOT ({FAILED}) AND e2e_s >= {num(limit / 2)}"), f"finished in {secs(limit / 2)} or more"
    if split is None:
        return out
    return out | {"split_of": of, "split_requests": split["n"], "queue_share": rounded(split["queue_share"]),
                  "first_token_share": rounded(split["first_token_share"]),
                  "generation_share": rounded(split["generation_share"]), "queue_p50_s": rounded(split["queue_p50_s"]) if ctx.has("queue_s") else None}


def _never_fit(ctx: DetectorContext, limit: float) -> dict:
    """Requests whose queue + typical no-wait TTFT + max_tokens x typical TPOT exceed the limit."""
    if not ctx.has("max_tokens"):
        return {}
    queue = "coalesce(queue_s, 0)" if ctx.has("queue_s") else "0"
    typical = ctx.one(f"""SELECT {q('tpot_s', 0.5)} AS tpot, {q(f'ttft_s - {queue}', 0.5)} AS ttft,
                                 {q(f'(e2e_s - {queue}) / completion_tokens', 0.5)} AS per_token
                          FROM sl011_requests WHERE NOT ({FAILED}) AND e2e_s IS NOT NULL""")
    # TPOT from the requests that finished; else their e2e per completion token (an upper bound: includes prefill).
    tpot = typical["tpot"] or typical["per_token"]
    if not tpot:
        return {"never_fit": None}
    ttft, per_token, line = num(typical["ttft"] or 0), num(tpot), num(limit)
    row = ctx.one(f"""SELECT count(*) AS n,
                             count(*) FILTER (WHERE {queue} + {ttft} + max_tokens * {per_token} > {line}) AS never,
                             count(*) FILTER (WHERE {ttft} + max_tokens * {per_token} > {line}) AS never_even_unqueued
                      FROM sl011_requests WHERE max_tokens IS NOT NULL""")
    return {"with_max_tokens": row["n"], "never_fit": row["never"], "never_fit_without_queue": row["never_even_unqueued"],
            "tpot_p50_s": rounded(tpot), "max_tokens_that_fit": int(max(0.0, limit - (typical["ttft"] or 0)) / tpot)}


def _per_cap(ctx: DetectorContext, limit: float, at_limit: str) -> dict | None:
    """Per max_tokens cap: requests, failures at the limit, e2e p99 of the ones that finished (per-task limits)."""
    if not ctx.has("max_tokens"):
        return None
    rows = ctx.rows(f"""SELECT max_tokens, count(*) AS n, count(*) FILTER (WHERE {at_limit}) AS at_limit,
                               {q('e2e_s', 0.99)} FILTER (WHERE NOT ({FAILED})) AS ok_p99
                        FROM sl011_requests WHERE e2e_s IS NOT NULL GROUP BY max_tokens
                        ORDER BY at_limit DESC, n DESC LIMIT 15""")
    return table(["max_tokens", "requests", f"failed at the {secs(limit)} limit", "e2e p99 of those that finished (s)"],
                 [[r["max_tokens"], r["n"], r["at_limit"], r["ok_p99"]] for r in rows])


def _histogram(ctx: DetectorContext, limit: float, band: float) -> dict:
    """e2e of finished and failed requests in 40 bins, the limit on the edge of bin 36 (bins close on the right, so a
    request that ran exactly to the limit sits below it); anything past 40/36 of the limit goes to the last bin."""
    width = limit / 36
    rows = ctx.rows(f"""SELECT least(greatest(CAST(ceil(e2e_s / {num(width)} - 1e-9) AS INTEGER) - 1, 0), 39) AS b,
                               count(*) FILTER (WHERE NOT ({FAILED})) AS ok, count(*) FILTER (WHERE {FAILED}) AS failed
                        FROM sl011_requests WHERE e2e_s IS NOT NULL GROUP BY 1 ORDER BY 1""")
    x = [rounded((r["b"] + 0.5) * width, 3) for r in rows]
    return chart("bar", "End-to-end time of finished and failed requests", "e2e (s)", "requests", [
        {"name": "finished", "x": x, "y": [r["ok"] for r in rows]},
        {"name": "failed", "x": x, "y": [r["failed"] for r in rows]},
    ], vspans=[{"x0": rounded(limit * (1 - band), 3), "x1": rounded(limit, 3), "label": f"limit ~{secs(limit)}"}])
