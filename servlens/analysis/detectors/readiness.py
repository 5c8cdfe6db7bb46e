"""SL006 not ready after restart.

Start points of a scope: its first request in the data (the first request a deployment got: a deploy, a scale-up,
or the start of the export), and every restart its metrics show (a counter reset between two scrapes: the process
restarted somewhere in (last scrape before, first scrape after]). After each start, the requests of its not-ready
period are the "early" ones: until `ready_successes` requests in a row pass without a readiness error (a readiness
probe's success threshold), at most `ready_window_s`. The rest until the next start are "later".

A start is not ready when its early requests fail with readiness errors (server errors, timeouts, connection
failures, 404/503 while the model loads; not client errors such as 400 context exceeded, 401, 403, 422, 429, which
say nothing about readiness) at least `min_errors` times and `min_error_share` of the time, clearly more than later
(`error_ratio` times the later share, and Fisher's exact test on the counts at p <= `max_p_value`). When no request after the start ever succeeded, the deployment never became
ready. The time to ready is the first success after the start.
"""

from __future__ import annotations

from datetime import timedelta

from servlens.analysis.detectors._common import chart, not_evaluable, pct, rounded, secs, table
from servlens.analysis.runner import DetectorContext
from servlens.analysis.sql_functions import fisher_exact_greater
from servlens.analysis.windows import iso

CLIENT_ERROR_STATUSES = (400, 401, 403, 413, 422, 429)
CLIENT_ERROR_WORDS = ("context", "auth", "ratelimit", "rate_limit", "badrequest", "invalid_request", "permission",
                      "contentpolicy", "content_filter")
_words = " OR ".join(f"lower(coalesce(error_type, '')) LIKE '%{w}%'" for w in CLIENT_ERROR_WORDS)
READINESS_ERROR = (f"((status = 'error' OR finish_reason = 'timeout') AND coalesce(http_status, 0) NOT IN "
                   f"({', '.join(map(str, CLIENT_ERROR_STATUSES))}) AND NOT ({_words}))")
SUCCESS = "(status = 'ok' AND coalesce(finish_reason, '') NOT IN ('error', 'timeout', 'abort'))"


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    if ctx.window is None:
        return not_evaluable("no request has an arrival, first-token or end time (t_arrival, t_first_token, t_end)",
                             "Errors after a start cannot be placed in time.")
    ready_s = float(p["ready_window_s"])
    restarts = ctx.rows("""SELECT prev_ts AS t_start, min(ts) AS t_seen, count(*) AS series
                           FROM scope_counter_increases WHERE is_reset GROUP BY prev_ts ORDER BY prev_ts""")
    starts = [{"t": ctx.one("SELECT min(t_at) AS t FROM scope_requests")["t"], "kind": "first request in the data",
               "seen": None}]
    starts += [{"t": r["t_start"], "kind": f"restart (counter reset of {r['series']} series)", "seen": r["t_seen"]}
               for r in restarts]
    starts.sort(key=lambda s: s["t"])
    values = ", ".join(f"({i}, TIMESTAMP '{s['t'].isoformat(sep=' ')}')" for i, s in enumerate(starts))
    n_ok = int(p["ready_successes"])
    # The not-ready period of a start ends where `ready_successes` requests in a row pass without a readiness error
    # (a readiness probe's success threshold), at the latest `ready_window_s` after it. Judging a fixed window
    # instead would let the minutes of normal traffic after a short outage dilute its errors below any share.
    per_start = ctx.rows(f"""
        WITH s AS (SELECT * FROM (VALUES {values}) AS v(i, t_start)),
             b AS (SELECT i, t_start, lead(t_start) OVER (ORDER BY t_start) AS t_next FROM s),
             r AS (SELECT b.i, b.t_start, q.t_at, q.source_line, q.request_id, q.http_status, q.error_type,
                          q.finish_reason, {READINESS_ERROR} AS is_error, {SUCCESS} AS is_success,
                          date_diff('microsecond', b.t_start, q.t_at) / 1e6 AS since_s
                   FROM b JOIN scope_requests q ON q.t_at >= b.t_start AND (b.t_next IS NULL OR q.t_at < b.t_next)),
             -- Only a request within ready_window_s of its start can end the period early, and it looks at most
             -- ready_successes - 1 requests ahead: the window needs those rows, not the whole run sorted (arg_min
             -- takes at least one; with ready_successes = 1 that one row is a candidate past the cap, so harmless).
             near AS (SELECT i, t_at, source_line, request_id, is_error, since_s FROM r WHERE since_s < {ready_s}
                      UNION ALL
                      SELECT unnest(arg_min(struct_pack(i, t_at, source_line, request_id, is_error, since_s),
                                            struct_pack(t_at, source_line, request_id), {max(n_ok - 1, 1)}), recursive := true)
                      FROM r WHERE since_s >= {ready_s} GROUP BY i),
             runs AS (SELECT *, count(*) FILTER (WHERE is_error) OVER w AS errors_ahead, count(*) OVER w AS ahead
                      FROM near WINDOW w AS (PARTITION BY i ORDER BY t_at, source_line, request_id
                                             ROWS BETWEEN CURRENT ROW AND {n_ok - 1} FOLLOWING)),
             ready AS (SELECT i, least(coalesce(min(since_s) FILTER (WHERE errors_ahead = 0 AND ahead = {n_ok}),
                                                {ready_s}), {ready_s}) AS period_s
                       FROM runs GROUP BY i),
             e AS (SELECT r.*, ready.period_s, r.since_s < ready.period_s AS early,
                          coalesce(CAST(http_status AS VARCHAR), error_type,
                                   CASE WHEN finish_reason = 'timeout' THEN 'timeout' END, 'no HTTP response') AS kind
                   FROM r JOIN ready USING (i))
        SELECT i, min(t_start) AS t_start,
               count(*) FILTER (WHERE early) AS early,
               count(*) FILTER (WHERE early AND is_error) AS early_errors,
               count(*) FILTER (WHERE NOT early) AS later,
               count(*) FILTER (WHERE NOT early AND is_error) AS later_errors,
               min(period_s) AS period_s,
               min(since_s) FILTER (WHERE is_success) AS first_success_s,
               max(since_s) FILTER (WHERE early AND is_error) AS last_early_error_s,
               count(*) FILTER (WHERE is_success) AS successes,
               string_agg(DISTINCT kind, ', ' ORDER BY kind) FILTER (WHERE is_error) AS error_kinds
        FROM e GROUP BY i ORDER BY i""")
    by_index = {row["i"]: row for row in per_start}
    judged = []
    for i, start in enumerate(starts):
        row = by_index.get(i)
        if not row:
            continue
        early_share = row["early_errors"] / row["early"] if row["early"] else 0.0
        later_share = row["later_errors"] / row["later"] if row["later"] else None
        never = row["successes"] == 0
        # With traffic after the early period, the difference must also be beyond chance (Fisher's exact test on
        # the 2x2 counts, one-sided): a handful of errors in a quiet start is not a cluster.
        p_value = None
        if row["later"]:
            p_value = fisher_exact_greater(row["early_errors"], row["early"] - row["early_errors"],
                                           row["later_errors"], row["later"] - row["later_errors"])
        clustered = (row["early_errors"] >= p["min_errors"] and early_share >= p["min_error_share"]
                     and (later_share is None or (early_share >= p["error_ratio"] * later_share
                                                  and p_value <= p["max_p_value"])))
        judged.append(start | row | {"early_share": early_share, "later_share": later_share, "never_ready": never,
                                     "p_value": p_value, "fired": clustered})
    fired = [j for j in judged if j["fired"]]
    restarts_seen = len(restarts)
    metrics = {"starts": len(judged), "restarts_in_metrics": restarts_seen}
    thresholds = {k: p[k] for k in ("ready_window_s", "ready_successes", "min_errors", "min_error_share", "error_ratio", "max_p_value")}
    rows = [[iso(j["t"]), j["kind"], rounded(j["period_s"]), j["early"], j["early_errors"], rounded(j["early_share"]),
             j["later"], rounded(j["later_share"]), rounded(j["first_success_s"]), j["error_kinds"]] for j in judged]
    the_table = table(["start", "kind", "not-ready period (s)", "requests in it", "readiness errors", "error share",
                       "requests later", "later error share", "first success after (s)", "errors"], rows)
    if not fired:
        worst = max(judged, key=lambda j: j["early_share"], default=None)
        text = (f"no readiness errors cluster after the {len(judged)} start(s) seen"
                + (f" ({restarts_seen} restart(s) in the metrics)" if restarts_seen else " (no restart in the metrics)")
                + (f"; the worst, {worst['kind']}, had {worst['early_errors']} readiness error(s) in "
                   f"{worst['early']} requests before {n_ok} in a row succeeded" if worst and worst["early_errors"]
                   else "; no readiness error came before the first successes"))
        metrics |= {"worst_early_error_share": rounded(worst["early_share"]) if worst else None}
        return {"state": "clear", "summary": f"Ready after every start: {text}.",
                "evidence": {"metrics": metrics, "thresholds": thresholds, "table": the_table}}

    worst = max(fired, key=lambda j: (j["early_errors"], j["early_share"]))
    never = worst["never_ready"]
    recovery = worst["first_success_s"]
    metrics |= {
        "not_ready_starts": len(fired), "start_kind": worst["kind"], "start": iso(worst["t"]),
        "not_ready_period_s": rounded(worst["period_s"]), "early_requests": worst["early"],
        "early_errors": worst["early_errors"],
        "early_error_share": rounded(worst["early_share"]), "later_error_share": rounded(worst["later_share"]),
        "time_to_first_success_s": rounded(recovery), "last_early_error_s": rounded(worst["last_early_error_s"]),
        "never_ready": never, "error_kinds": worst["error_kinds"], "p_value": rounded(worst["p_value"], 8),
    }
    if never:
        how = f"no request after it ever succeeded: the deployment never became ready ({worst['error_kinds']})"
    else:
        later = (f"against {pct(worst['later_share'])} later" if worst["later_share"] is not None
                 else "with no traffic after that to compare")
        until = (f"in the {secs(worst['period_s'])} before {n_ok} in a row succeeded" if worst["period_s"] < ready_s
                 else f"in the first {ready_s:g} s (never {n_ok} successes in a row)")
        how = (f"{worst['early_errors']} of its {worst['early']} requests failed {until} "
               f"({pct(worst['early_share'])}, {worst['error_kinds']}) {later}; the first success came "
               f"{secs(recovery)} after the start")
    summary = (f"Not ready after {worst['kind']} at {iso(worst['t'])}: {how}."
               + (f" {len(fired)} start(s) like this." if len(fired) > 1 else ""))
    t0 = worst["t"]
    lo, hi = t0, t0 + timedelta(seconds=worst["period_s"])
    spec = ctx.window
    series_rows = ctx.rows(f"""
        SELECT {spec.index_sql()} AS w, count(*) AS n, count(*) FILTER (WHERE {READINESS_ERROR}) AS errors
        FROM scope_requests WHERE t_at IS NOT NULL GROUP BY 1 ORDER BY 1""")
    x = [iso(spec.start(r["w"])) for r in series_rows]
    last = ctx.one("SELECT max(t_at) AS t FROM scope_requests")["t"]
    # The early period, cut at the last request so the time axis covers the data, not an empty 5 minutes after it.
    vspans = [{"x0": iso(j["t"]), "x1": iso(min(j["t"] + timedelta(seconds=j["period_s"]), last)),
               "label": f"not ready after {j['kind']}"} for j in fired]
    the_chart = chart("bar", "Requests and readiness errors per window", "time", "requests",
                      [{"name": "requests", "x": x, "y": [r["n"] for r in series_rows]},
                       {"name": "readiness errors", "x": x, "y": [r["errors"] for r in series_rows]}],
                      x_time=True, vspans=vspans)
    window_where = f"t_at >= TIMESTAMP '{lo.isoformat(sep=' ')}' AND t_at < TIMESTAMP '{hi.isoformat(sep=' ')}'"
    result = {
        "state": "fired", "summary": summary,
        "evidence": {"metrics": metrics, "thresholds": thresholds, "table": the_table, "chart": the_chart,
                     "windows": [{"start": iso(j["t"]), "end": iso(min(j["t"] + timedelta(seconds=j["period_s"]), last))}
                                 for j in fired]},
        "examples": ctx.examples(f"{READINESS_ERROR} AND {window_where}", "t_at"),
    }
    if never:
        result["rollback"] = ("After the change, watch this deployment's first requests: roll back (or take it out of "
                              "rotation) if it still fails every request in the first {ready_window_s:.0f} s, or if "
                              "the gateway's error rate rises above today's.")
    return result
