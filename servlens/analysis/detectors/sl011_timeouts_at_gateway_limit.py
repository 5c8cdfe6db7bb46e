"""SL011 timeouts at the gateway limit.

A fixed request timeout (a gateway's `timeout`, a client's read timeout, a load balancer's idle limit) leaves a mark
in the data. The limit is found from the data, not configured, in one of two ways:

- Failures that say they timed out (vocabulary.TIMEOUT: LiteLLM's error_class `Timeout`, HTTP 408/504/524, a
  finish or message saying timeout): they are timeouts, and the limit is found from them alone. The timer cannot
  fire before its limit and a busy gateway notices it late, so they land at or just past it (recorded behind a
  2.5 s LiteLLM timeout on a loaded machine: 2.62-3.49 s): the densest run of timeouts within `timeout_spread`
  (relative) above the shortest of them is the cluster, and its shortest is the limit (ties: the shorter one).
  Requests that finished after it do not veto it: a timeout that bounds each read (LiteLLM's / httpx's `timeout`)
  lets a stream that keeps sending run past it.
- Otherwise, failures that do not say why (status error, finish error/abort, any HTTP >= 400) with e2e >=
  `min_limit_s`: for each, the failures within `band` (relative) below its own e2e; the densest such band is the
  spike, and its top is the limit (ties: the longer one). It is a limit when it holds at least
  `min_cluster_requests` failures, at least `min_failed_share` of the requests that reached the band failed, and at
  most `max_over_limit_share` of all requests lasted longer than the limit (a hard limit leaves none past it).

Where attempts are traced (trace_id, attempt: a gateway's retries and fallbacks), the timeouts at the limit that a
later attempt answered are counted apart: the client got an answer (late), and severity follows the ones that
reached the client.

For the requests at the limit, the time splits into queue (queue_s), first token (TTFT minus queue) and generation
(e2e minus TTFT) where the columns exist; requests that never got a first token are counted. Every request with a
max_tokens is then checked against the limit: its queue plus the scope's typical no-wait TTFT plus max_tokens at the
typical TPOT of successful requests; the ones over the limit could never finish in time if they generated their cap.
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, rounded, secs, table
from servlens.analysis.failures import failed
from servlens.analysis.runner import DetectorContext, sql_literal
from servlens.analysis.vocabulary import FAILED, TIMEOUT, WAIT

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_limit_s", "timeout_spread", "band", "min_cluster_requests", "min_failed_share",
        "max_over_limit_share", "critical_share", "min_requests"
    ],
    "requires": [],
}


# The two words, evaluated once per request into sl011_requests under these column names (vocabulary.py): the
# limit is found either from the failures that say they timed out or from failures that do not say why.
WORDS = {"failed": FAILED, "timed_out": TIMEOUT}


def num(value: float) -> str:
    """A float as a DOUBLE literal: a bare 120.01546740531921 is a DECIMAL in SQL and overflows when multiplied."""
    return f"CAST({float(value)!r} AS DOUBLE)"


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    # The scope's columns this rule reads, copied once with the two words evaluated: a dozen queries follow, and
    # through the scope view each of them filtered the whole requests table again. Every row is kept (some counts do
    # not require e2e_s).
    ctx.con.execute(f"""CREATE OR REPLACE TEMP TABLE sl011_requests AS
                        SELECT e2e_s, status, finish_reason, http_status, error_type, queue_s, ttft_s, prefill_s,
                               decode_s, tpot_s, completion_tokens, max_tokens, stream, trace_id, attempt,
                               {WORDS['failed']} AS failed, {WORDS['timed_out']} AS timed_out, {WAIT} AS wait_s
                        FROM scope_requests""")
    base = ctx.one(f"""SELECT count(*) AS n, count(*) FILTER (WHERE failed) AS failed,
                              count(*) FILTER (WHERE timed_out) AS timed_out,
                              count(*) FILTER (WHERE failed AND e2e_s >= {num(p['min_limit_s'])}) AS failed_slow,
                              max(e2e_s) FILTER (WHERE failed) AS failed_max, min(e2e_s) FILTER (WHERE failed) AS failed_min
                       FROM sl011_requests WHERE e2e_s IS NOT NULL""")
    if base["n"] < p["min_requests"]:
        return not_evaluable(f"only {base['n']} requests with e2e_s; the rule needs at least {p['min_requests']} "
                             "(min_requests)", "Too few requests to look for a timeout limit.")
    thresholds = {k: p[k] for k in ("min_limit_s", "band", "timeout_spread", "min_cluster_requests",
                                    "min_failed_share", "max_over_limit_share", "critical_share", "min_requests")}
    metrics = {"requests": base["n"], "failed": base["failed"], "timeouts": base["timed_out"],
               "failed_over_min_limit": base["failed_slow"]}
    if base["timed_out"] >= p["min_cluster_requests"]:
        return _from_timeouts(ctx, metrics, thresholds)
    if base["failed_slow"] == 0:
        detail = (f"{base['failed']} failed, all within {secs(base['failed_max'])} (fast rejections, not timeouts)"
                  if base["failed"] else "none failed")
        return {"state": "clear", "evidence": {"metrics": metrics, "thresholds": thresholds},
                "summary": f"No timeouts at a limit: of {base['n']} requests {detail}; nothing failed after "
                           f"{secs(p['min_limit_s'])} or more."}
    band = p["band"]
    spike = ctx.one(f"""
        WITH f AS (SELECT e2e_s FROM sl011_requests WHERE failed AND e2e_s >= {num(p['min_limit_s'])})
        SELECT a.e2e_s AS top, count(*) AS n FROM f a JOIN f b ON b.e2e_s <= a.e2e_s AND b.e2e_s >= a.e2e_s * {num(1 - band)}
        GROUP BY a.e2e_s ORDER BY n DESC, top DESC LIMIT 1""")
    limit = spike["top"]
    lo = limit * (1 - band)
    in_band = f"e2e_s BETWEEN {num(lo)} AND {num(limit)}"
    at_limit = f"failed AND {in_band}"
    s = _around(ctx, in_band, at_limit, limit * (1 + band))
    failed_share = s["at_limit"] / s["reached"] if s["reached"] else 0.0
    over_share = s["over_limit"] / base["n"]
    metrics |= {"limit_s": rounded(limit), "band_start_s": rounded(lo), "failed_at_limit": s["at_limit"],
                "reached_limit": s["reached"], "failed_share_at_limit": rounded(failed_share),
                "over_limit": s["over_limit"], "over_limit_share": rounded(over_share),
                "ok_e2e_p99_s": rounded(s["ok_e2e_p99"]), "ok_e2e_max_s": rounded(s["ok_e2e_max"])}
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": _histogram(ctx, lo, limit, limit)}
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
        said = ("none saying it timed out" if not base["timed_out"] else
                f"{base['timed_out']} saying it timed out (fewer than {p['min_cluster_requests']}, min_cluster_requests)")
        return {"state": "clear", "evidence": evidence,
                "summary": f"No fixed timeout limit: {base['failed_slow']} requests failed after {secs(p['min_limit_s'])} "
                           f"or more, {said}, and their e2e does not pile up at one value ({'; '.join(why)})."}
    first = (f"{s['at_limit']} failed requests end within {pct(band)} below {secs(limit)} and none of the "
             f"{base['n']} requests lasted longer" if s["over_limit"] == 0 else
             f"{s['at_limit']} failed requests end within {pct(band)} below {secs(limit)} ({s['over_limit']} lasted "
             "longer)")
    return _fired(ctx, metrics, evidence, limit, ("failed", in_band), s["at_limit"],
                  [first, f"{pct(failed_share)} of the requests that reached it failed"])


def _around(ctx: DetectorContext, in_band: str, at_limit: str, past: float) -> dict:
    """Requests that reached the band, failed in it, finished past `past`; the finished ones' e2e p99 and max."""
    return ctx.one(f"""SELECT count(*) FILTER (WHERE {in_band}) AS reached, count(*) FILTER (WHERE {at_limit}) AS at_limit,
                              count(*) FILTER (WHERE e2e_s > {num(past)}) AS over_limit,
                              count(*) FILTER (WHERE NOT failed AND e2e_s > {num(past)}) AS ok_over_limit,
                              {q('e2e_s', 0.99)} FILTER (WHERE NOT failed) AS ok_e2e_p99,
                              max(e2e_s) FILTER (WHERE NOT failed) AS ok_e2e_max
                       FROM sl011_requests WHERE e2e_s IS NOT NULL""")


def _from_timeouts(ctx: DetectorContext, metrics: dict, thresholds: dict) -> dict:
    """The limit from the failures that say they timed out, alone (module docstring)."""
    p = ctx.params
    spread = p["timeout_spread"]
    cluster = ctx.one(f"""
        WITH t AS (SELECT e2e_s FROM sl011_requests WHERE timed_out AND e2e_s IS NOT NULL)
        SELECT a.e2e_s AS low, count(*) AS n, max(b.e2e_s) AS high
        FROM t a JOIN t b ON b.e2e_s >= a.e2e_s AND b.e2e_s <= a.e2e_s * {num(1 + spread)}
        GROUP BY a.e2e_s ORDER BY n DESC, low LIMIT 1""")
    limit, high = cluster["low"], cluster["high"]
    in_band = f"e2e_s BETWEEN {num(limit)} AND {num(limit * (1 + spread))}"
    at_limit = f"timed_out AND {in_band}"
    s = _around(ctx, in_band, at_limit, high)
    kinds = ctx.rows(f"""SELECT CASE WHEN error_type IS NOT NULL
                                     THEN error_type || coalesce(' (HTTP ' || http_status || ')', '')
                                     WHEN http_status IS NOT NULL THEN 'HTTP ' || http_status
                                     WHEN finish_reason = 'timeout' THEN 'finish_reason timeout'
                                     ELSE 'error text says timeout' END AS kind, count(*) AS n
                         FROM sl011_requests WHERE {at_limit} GROUP BY 1 ORDER BY n DESC, kind LIMIT 4""")
    metrics |= {"limit_s": rounded(limit), "band_start_s": rounded(limit), "band_end_s": rounded(high),
                "limit_from": "failures that say they timed out", "failed_at_limit": s["at_limit"],
                "reached_limit": s["reached"],
                "failed_share_at_limit": rounded(s["at_limit"] / s["reached"]) if s["reached"] else None,
                "over_limit": s["over_limit"], "finished_over_limit": s["ok_over_limit"],
                "over_limit_share": rounded(s["over_limit"] / metrics["requests"]),
                "ok_e2e_p99_s": rounded(s["ok_e2e_p99"]), "ok_e2e_max_s": rounded(s["ok_e2e_max"])}
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": _histogram(ctx, limit, high, limit)}
    if s["at_limit"] < p["min_cluster_requests"]:
        return {"state": "clear", "evidence": evidence,
                "summary": f"No fixed timeout limit: {metrics['timeouts']} requests timed out, but at most "
                           f"{s['at_limit']} within {pct(spread)} of one another (fewer than "
                           f"{p['min_cluster_requests']}): timeouts at different times, not one limit."}
    kinds_text = ", ".join(f"{k['kind']}: {k['n']}" for k in kinds)
    parts = [(f"{s['at_limit']} requests timed out ({kinds_text}) between "
              f"{secs(limit)} and {secs(high)}, of {metrics['timeouts']} timeouts")]
    if s["ok_over_limit"]:
        parts.append(f"{s['ok_over_limit']} finished requests ran longer (up to {secs(s['ok_e2e_max'])}): a timeout "
                     "on each read lets a stream that keeps sending run past it")
    return _fired(ctx, metrics, evidence, limit, ("timed_out", in_band), s["at_limit"], parts)


def _fired(ctx: DetectorContext, metrics: dict, evidence: dict, limit: float, at: tuple[str, str], n_at_limit: int,
           parts: list[str]) -> dict:
    """The finding for a limit found either way (`at`: the word, 'failed' or 'timed_out', and the band): the time split,
    who could never fit, who got an answer anyway."""
    p = ctx.params
    word, in_band = at
    at_limit = f"{word} AND {in_band}"
    split = _time_split(ctx, at_limit, limit)
    metrics |= split
    fit = _never_fit(ctx, limit)
    metrics |= fit
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
                     + ("queue + " if fit["queue_known"] else "")
                     + ("typical first token + " if fit["ttft_p50_s"] is not None else "")
                     + f"max_tokens at the typical {secs(fit['tpot_p50_s'])} per token"
                     + ("" if fit["ttft_p50_s"] is not None else "; first token unknown, not counted") + ")")
    answered = _answered_later(ctx, at_limit)
    reached_client = n_at_limit - (answered or 0)
    metrics |= {"answered_by_a_later_attempt": answered, "reached_client": reached_client}
    if answered:
        parts.append(f"{answered} of them were answered by a later attempt (retry or fallback), "
                     f"{reached_client} reached the client as errors")
    summary = f"Timeouts at a fixed limit of about {secs(limit)}: " + "; ".join(parts) + "."
    share = reached_client / metrics["requests"]
    metrics["timeout_share"] = rounded(n_at_limit / metrics["requests"])
    metrics["client_timeout_share"] = rounded(share)
    evidence["table"] = _per_cap(ctx, limit, at_limit)
    evidence["windows"] = []
    result = {"state": "fired", "summary": summary, "evidence": evidence,
              "examples": ctx.examples(f"({WORDS[word]}) AND {in_band}", "e2e_s DESC")}
    if share >= p["critical_share"]:
        result["severity"] = "critical"
    return result


def _answered_later(ctx: DetectorContext, at_limit: str) -> int | None:
    """Timeouts at the limit whose trace has a later attempt that answered (in any scope of the run); None when
    none of them carries a trace and attempt (then whether the client got an answer is unknown: counted as not)."""
    if not (ctx.has("trace_id") and ctx.has("attempt")):
        return None
    # "a later attempt answered" is "the trace's last answered attempt comes after this one": a join to one row
    # per trace, where a correlated EXISTS inside the count is refused by ClickHouse
    row = ctx.one(f"""
        SELECT count(*) FILTER (WHERE t.trace_id IS NOT NULL AND t.attempt IS NOT NULL) AS traced,
               count(*) FILTER (WHERE a.last_answered > t.attempt) AS answered
        FROM sl011_requests t LEFT JOIN (
            SELECT o.trace_id, max(o.attempt) AS last_answered FROM requests o
            WHERE o.run = {sql_literal(ctx.scope.run)} AND o.trace_id IS NOT NULL AND NOT {failed('o')}
            GROUP BY o.trace_id) a ON a.trace_id = t.trace_id
        WHERE {at_limit}""")
    return row["answered"] if row["traced"] else None


# Where a request's time went: the wait (vocabulary.WAIT: queue_s, else TTFT - prefill; NULL when neither is known),
# the first token without it (TTFT - wait, else the engine's prefill), and generation (e2e - TTFT, else the engine's
# decode time: non-streamed requests have no TTFT but engines report both). An unknown wait is not 0: a request
# whose wait is unknown is split only into first token (wait included) and generation.
FIRST_NO_WAIT = "coalesce(ttft_s - wait_s, prefill_s)"
GENERATION = "coalesce(e2e_s - ttft_s, decode_s)"


def _split(ctx: DetectorContext, where: str) -> dict | None:
    """Wait, first-token and generation shares of e2e summed over the requests matching `where` that have them:
    over those whose wait is known when any is; else first token (wait included) and generation."""
    if not (ctx.has("ttft_s") or ctx.has("prefill_s") or ctx.has("decode_s")):
        return None
    full = ctx.one(f"""SELECT count(*) AS n, sum(wait_s) AS queue_sum, sum({FIRST_NO_WAIT}) AS first_sum,
                              sum({GENERATION}) AS gen_sum, sum(e2e_s) AS e2e_sum, {q('wait_s', 0.5)} AS queue_p50
                       FROM sl011_requests WHERE {where} AND wait_s IS NOT NULL AND {FIRST_NO_WAIT} IS NOT NULL
                         AND {GENERATION} IS NOT NULL""")
    if full["n"] and full["e2e_sum"]:
        return {"n": full["n"], "queue_share": full["queue_sum"] / full["e2e_sum"],
                "first_token_share": full["first_sum"] / full["e2e_sum"],
                "generation_share": full["gen_sum"] / full["e2e_sum"], "queue_p50_s": full["queue_p50"]}
    row = ctx.one(f"""SELECT count(*) AS n, sum(ttft_s) AS first_sum, sum(e2e_s - ttft_s) AS gen_sum,
                             sum(e2e_s) AS e2e_sum
                      FROM sl011_requests WHERE {where} AND ttft_s IS NOT NULL AND e2e_s IS NOT NULL""")
    if not row["n"] or not row["e2e_sum"]:
        return None
    return {"n": row["n"], "queue_share": None, "first_token_share": row["first_sum"] / row["e2e_sum"],
            "generation_share": row["gen_sum"] / row["e2e_sum"], "queue_p50_s": None}


def _time_split(ctx: DetectorContext, at_limit: str, limit: float) -> dict:
    """The split of the failed requests at the limit; when they carry no times (a client gave up and got no
    response), the split of the finished requests that took at least half the limit, named as such."""
    out: dict = {}
    if ctx.has("ttft_s"):
        # Only streams can show a missing first token: a non-streamed request has no TTFT to miss.
        out["no_first_token"] = ctx.one(f"""SELECT count(*) AS n FROM sl011_requests
                                             WHERE {at_limit} AND ttft_s IS NULL AND stream""")["n"]
    split, of = _split(ctx, at_limit), "failed at the limit"
    if split is None:
        split, of = _split(ctx, f"NOT failed AND e2e_s >= {num(limit / 2)}"), f"finished in {secs(limit / 2)} or more"
    if split is None:
        return out
    return out | {"split_of": of, "split_requests": split["n"], "queue_share": rounded(split["queue_share"]),
                  "first_token_share": rounded(split["first_token_share"]),
                  "generation_share": rounded(split["generation_share"]), "queue_p50_s": rounded(split["queue_p50_s"])}


def _never_fit(ctx: DetectorContext, limit: float) -> dict:
    """Requests whose wait + typical no-wait TTFT + max_tokens x typical TPOT exceed the limit. Each part is a lower
    bound where it is unknown (a wait, the typical first token): the count is of requests that certainly never fit."""
    if not ctx.has("max_tokens"):
        return {}
    typical = ctx.one(f"""SELECT {q('tpot_s', 0.5)} AS tpot, {q(FIRST_NO_WAIT, 0.5)} AS ttft,
                                 {q('(e2e_s - wait_s) / completion_tokens', 0.5)} AS per_token
                          FROM sl011_requests WHERE NOT failed AND e2e_s IS NOT NULL""")
    # TPOT from the requests that finished; else their e2e without the wait per completion token (an upper bound:
    # it includes prefill), only where the wait is known.
    tpot = typical["tpot"] or typical["per_token"]
    if not tpot:
        return {"never_fit": None}
    ttft, per_token, line = num(typical["ttft"] or 0), num(tpot), num(limit)
    unqueued = f"{ttft} + max_tokens * {per_token} > {line}"
    row = ctx.one(f"""SELECT count(*) AS n, count(wait_s) AS wait_known,
                             count(*) FILTER (WHERE {unqueued} OR wait_s + {ttft} + max_tokens * {per_token} > {line})
                               AS never,
                             count(*) FILTER (WHERE {unqueued}) AS never_even_unqueued
                      FROM sl011_requests WHERE max_tokens IS NOT NULL""")
    return {"with_max_tokens": row["n"], "never_fit": row["never"], "never_fit_without_queue": row["never_even_unqueued"],
            "queue_known": row["wait_known"], "tpot_p50_s": rounded(tpot), "ttft_p50_s": rounded(typical["ttft"]),
            "max_tokens_that_fit": int(max(0.0, limit - (typical["ttft"] or 0)) / tpot)}


def _per_cap(ctx: DetectorContext, limit: float, at_limit: str) -> dict | None:
    """Per max_tokens cap: requests, failures at the limit, e2e p99 of the ones that finished (per-task limits)."""
    if not ctx.has("max_tokens"):
        return None
    rows = ctx.rows(f"""SELECT max_tokens, count(*) AS n, count(*) FILTER (WHERE {at_limit}) AS at_limit,
                               {q('e2e_s', 0.99)} FILTER (WHERE NOT failed) AS ok_p99
                        FROM sl011_requests WHERE e2e_s IS NOT NULL GROUP BY max_tokens
                        ORDER BY at_limit DESC, n DESC LIMIT 15""")
    return table(["max_tokens", "requests", f"failed at the {secs(limit)} limit", "e2e p99 of those that finished (s)"],
                 [[r["max_tokens"], r["n"], r["at_limit"], r["ok_p99"]] for r in rows])


def _histogram(ctx: DetectorContext, lo: float, hi: float, limit: float) -> dict:
    """e2e of finished and failed requests in 40 bins, the band's top on the edge of bin 36 (bins close on the right,
    so a request that ran exactly to it sits below it); anything past 40/36 of it goes to the last bin."""
    width = hi / 36
    rows = ctx.rows(f"""SELECT least(greatest(CAST(ceil(e2e_s / {num(width)} - 1e-9) AS INTEGER) - 1, 0), 39) AS b,
                               count(*) FILTER (WHERE NOT failed) AS ok, count(*) FILTER (WHERE failed) AS failed
                        FROM sl011_requests WHERE e2e_s IS NOT NULL GROUP BY 1 ORDER BY 1""")
    x = [rounded((r["b"] + 0.5) * width, 3) for r in rows]
    return chart("bar", "End-to-end time of finished and failed requests", "e2e (s)", "requests", [
        {"name": "finished", "x": x, "y": [r["ok"] for r in rows]},
        {"name": "failed", "x": x, "y": [r["failed"] for r in rows]},
    ], vspans=[{"x0": rounded(lo, 3), "x1": rounded(hi, 3), "label": f"limit ~{secs(limit)}"}])
