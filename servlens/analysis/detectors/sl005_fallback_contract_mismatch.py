"""SL005 fallback contract mismatch.

A fallback crosses scopes (the request asked `chat-primary`, `chat-backup` answered), so this detector reads the
scope's whole run from `requests`, grouped by trace_id, and judges the scope from both sides:

- as a fallback target: attempts that are fallbacks (fallback_from set, or a model other than the trace's first
  attempt) and that failed or ended by length although the trace's first attempt asked for more than this target
  gives (a smaller max_tokens, a context_window under the prompt, a context-exceeded error, or an answer cut by
  length before the max_tokens it asked for: the deployment's own cap, e.g. a llama.cpp n_predict in the
  deployment's litellm_params, which the request's max_tokens does not show): the retry could not succeed. Also fallbacks that failed the same way as the attempt before them (the same deployment, or the same
  error type), or while the target was failing half or more of its own requests within `domain_window_s`: the same
  failure domain, so the fallback bought nothing.
- as a pool member: a deployment whose attempts (nearly) all fail while its traces are answered elsewhere is a dead
  endpoint left in the pool; every request that tries it pays the retries and backoff before its fallback. The
  added latency is measured per trace: from the first attempt here to the attempt that answered.

LiteLLM's `model` is the model group and `served_model` the deployment's model name, so they differ on every
request, fallback or not: served_model is not read as a fallback signal.

Attempts are taken in their `attempt` order, never by arrival: behind LiteLLM's proxy a streamed fallback's answer
carries the client request's start time (servlens/profiles/litellm-slp.toml), so it "arrives" before the attempt it
followed; the time a dead member adds then runs to the end of the attempt before that answer.
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, rounded, secs, table
from servlens.analysis.failures import failed
from servlens.analysis.runner import DetectorContext, sql_literal
from servlens.analysis.vocabulary import FAILED

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_mismatches", "min_same_domain", "dead_error_share", "min_dead_attempts", "min_fallbacks",
        "max_excess_bad_share", "domain_window_s", "critical_share"
    ],
    "requires": [],
}


# An answer cut by length before the max_tokens it asked for (or, unknown there, the first attempt asked for): a
# cap of the deployment's own, smaller than the request's.
CUT_BELOW_ASKED = ("(finish_reason = 'length' AND completion_tokens < coalesce(max_tokens, first_max_tokens))")
# Whether an attempt failed or was cut by length can be told: SpendLogs rows often have no finish_reason (unknown,
# not "stopped"), so an answer without one does not count as a good fallback.
KNOWN_OUTCOME = f"({FAILED} OR finish_reason IS NOT NULL)"
CONTEXT_ERROR = ("(lower(coalesce(error_type, '')) LIKE '%context%' OR lower(coalesce(error_message, '')) LIKE "
                 "'%context%' OR lower(coalesce(finish_reason_raw, '')) LIKE '%context%')")


def _attempts_sql(run: str) -> str:
    """The attempts of the run's multi-attempt traces, each with its trace's first attempt and the attempt before it
    (window functions); single-attempt traces hold no fallback and are read from scope_requests."""
    return f"""
        CREATE OR REPLACE TEMP TABLE sl005_attempts AS
        WITH multi AS (
            -- only traces that can hold a fallback: several attempts, or a fallback_from (a SpendLogs row)
            SELECT trace_id FROM requests WHERE run = {sql_literal(run)} AND trace_id IS NOT NULL
            GROUP BY trace_id HAVING count(*) > 1 OR count(fallback_from) > 0),
        a AS (
            -- only the columns read from sl005_attempts: whole rows (attrs JSON included) made this copy slow
            SELECT r.request_id, r.source_id, r.source_line, trace_id, r.attempt, r.fallback_from, r.model,
                   r.deployment, r.max_tokens, r.context_window, r.prompt_tokens, r.status, r.http_status,
                   r.finish_reason,
                   r.finish_reason_raw, r.error_type, r.error_message, r.t_end, r.completion_tokens,
                   coalesce(t_arrival, t_first_token, t_end) AS t_at
            FROM requests r JOIN multi USING (trace_id)
            WHERE r.run = {sql_literal(run)}),
        o AS (
            SELECT *, row_number() OVER w AS k, count(*) OVER (PARTITION BY trace_id) AS tries,
                   first_value(model) OVER w AS first_model, first_value(deployment) OVER w AS first_deployment,
                   first_value(max_tokens) OVER w AS first_max_tokens,
                   first_value(prompt_tokens) OVER w AS first_prompt_tokens,
                   first_value(t_at) OVER w AS first_t_at,
                   lag(deployment) OVER w AS prev_deployment, lag(error_type) OVER w AS prev_error_type,
                   lag({FAILED}) OVER w AS prev_failed, lag(t_end) OVER w AS prev_t_end
            FROM a
            -- the source's attempt order; without one, end time (a start can be the client request's). No frame:
            -- first_value reads the partition's first row under any frame, and ClickHouse and Spark refuse lag and
            -- row_number over an explicit one
            WINDOW w AS (PARTITION BY trace_id ORDER BY attempt, coalesce(t_end, t_at), t_at, source_line))
        SELECT *, (fallback_from IS NOT NULL OR (k > 1 AND model IS DISTINCT FROM first_model)) AS is_fallback,
               coalesce(fallback_from, first_model) AS origin_model
        FROM o"""


def _attempts(ctx: DetectorContext, run: str) -> dict:
    """Materialise the run's attempts once and reuse them for every scope of the run (the window functions over the
    whole run are the expensive part); rebuilt when the run's rows change (count and last source differ).

    Returns the run's trace markers (rows, traced rows, attempt numbers, fallback_from, distinct traces), counted
    with the attempts and kept beside their stamp: the same for every scope of the run.
    """
    stamp = ctx.one(f"""SELECT {sql_literal(run)} || ':' || count(*) || ':' || coalesce(max(source_id), 0)
                              || ':' || coalesce(CAST(max(source_line) AS VARCHAR), '') AS s
                       FROM requests WHERE run = {sql_literal(run)}""")["s"]
    if not (ctx.has_temp_table("sl005_attempts_stamp") and ctx.one("SELECT max(stamp) AS s FROM sl005_attempts_stamp")["s"] == stamp):
        ctx.con.execute(_attempts_sql(run))
        ctx.con.execute(f"""CREATE OR REPLACE TEMP TABLE sl005_attempts_stamp AS
                            SELECT ? AS stamp, count(*) AS n, count(trace_id) AS traced, count(attempt) AS attempts,
                                   count(fallback_from) AS marked, count(DISTINCT trace_id) AS traces
                            FROM requests WHERE run = {sql_literal(run)}""", [stamp])
    return ctx.one("SELECT n, traced, attempts, marked, traces FROM sl005_attempts_stamp")


def _span(low: int | None, high: int | None) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


def _interval(seconds: float) -> str:
    return f"to_microseconds(CAST({seconds * 1e6:.0f} AS BIGINT))"


def _in_scope(ctx: DetectorContext, alias: str = "") -> str:
    s = ctx.scope
    prefix = f"{alias}." if alias else ""
    model = f"{prefix}model IS NULL" if s.model is None else f"{prefix}model = {sql_literal(s.model)}"
    dep = f"{prefix}deployment IS NULL" if s.deployment is None else f"{prefix}deployment = {sql_literal(s.deployment)}"
    return f"({model} AND {dep})"


# An attempt of the scope that is not itself a fallback (its own traffic), `d` being scope_requests.
NOT_A_FALLBACK = ("NOT EXISTS (SELECT 1 FROM sl005_attempts f WHERE f.is_fallback AND "
                  "f.request_id IS NOT DISTINCT FROM d.request_id AND f.source_id IS NOT DISTINCT FROM d.source_id "
                  "AND f.source_line IS NOT DISTINCT FROM d.source_line)")


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    run = ctx.scope.run
    markers = _attempts(ctx, run)
    multi = ctx.one("SELECT count(DISTINCT trace_id) AS n FROM sl005_attempts WHERE tries > 1")["n"]
    if not markers["marked"] and not multi:
        # No trace with a second attempt and no fallback_from: fine when nothing failed (fallbacks follow failures),
        # unknown when attempts failed, since some sources give each attempt its own trace.
        failures = ctx.one(f"SELECT count(*) AS n FROM requests WHERE run = {sql_literal(run)} AND {FAILED}")["n"]
        if failures:
            return not_evaluable(
                f"{failures} attempt(s) failed in this run, but every trace_id has one attempt and no fallback_from is "
                "set, so whether they fell back cannot be seen (LiteLLM's OpenTelemetry spans give each attempt its "
                "own trace)", "Fallbacks are invisible in these sources.")
        return {"state": "clear", "summary": "No fallback contract problem: no attempt failed in this run, so nothing "
                                             "fell back.",
                "evidence": {"metrics": {"failed_attempts_in_run": 0, "traces": markers["traces"]}}}
    inbound, direct, pool = _inbound(ctx), _direct(ctx), _pool(ctx)
    failed_share = (pool["failed"] or 0) / pool["attempts"] if pool["attempts"] else None
    dead = bool(pool["attempts"] and pool["attempts"] >= p["min_dead_attempts"] and failed_share >= p["dead_error_share"]
                and pool["answered_elsewhere"])
    # Over attempts whose outcome is known: SpendLogs rows often have no finish_reason (unknown, not "stopped").
    fb_bad_share = (inbound["failed"] + inbound["length"]) / inbound["known"] if inbound["known"] else None
    direct_bad_share = direct["bad"] / direct["n"] if direct["n"] else None
    metrics = {
        "fallbacks_in": inbound["fallbacks"], "fallback_origins": inbound["origins"],
        "fallbacks_failed": inbound["failed"], "fallbacks_ended_by_length": inbound["length"],
        "fallbacks_mismatched": inbound["mismatched"], "fallbacks_smaller_cap": inbound["smaller_cap"],
        "fallbacks_cut_below_asked": inbound["cut_below_asked"], "fallback_cut_at_most_tokens": inbound["cut_at_most"],
        "fallbacks_context_short": inbound["context_short"], "fallbacks_same_failure_domain": inbound["same_domain"],
        "fallbacks_while_target_failing": inbound["target_failing_then"],
        "fallback_bad_share": rounded(fb_bad_share), "direct_bad_share": rounded(direct_bad_share),
        "attempts_here": pool["attempts"], "attempts_failed_share": rounded(failed_share),
        "traces_answered_elsewhere": pool["answered_elsewhere"], "added_latency_p50_s": rounded(pool["added_p50_s"]),
        "added_latency_max_s": rounded(pool["added_max_s"]),
    }
    thresholds = {k: p[k] for k in ("min_mismatches", "min_same_domain", "dead_error_share", "min_dead_attempts",
                                    "min_fallbacks", "max_excess_bad_share", "domain_window_s", "critical_share")}
    # Without the model's own requests (every request here is a fallback) the comparison is unknown, not 0%.
    excess = (fb_bad_share - direct_bad_share) if fb_bad_share is not None and direct_bad_share is not None else None
    worse_than_direct = bool(inbound["fallbacks"] >= p["min_fallbacks"] and excess is not None
                             and excess > p["max_excess_bad_share"])
    problems = _problems(ctx, inbound, pool, (fb_bad_share, direct_bad_share, failed_share), worse_than_direct, dead)
    if problems:
        return _fired(ctx, markers, inbound, problems, (worse_than_direct, dead), metrics, thresholds)
    if inbound["fallbacks"]:
        text = (f"{inbound['fallbacks']} fallback(s) from {inbound['origins']} landed here; "
                f"{pct(fb_bad_share)} failed or ended by length against {pct(direct_bad_share)} of this model's own "
                "requests (of those with a known outcome), with no smaller cap or context than asked")
    elif pool["answered_elsewhere"]:
        text = (f"{pool['answered_elsewhere']} request(s) fell back from here, but only {pct(failed_share)} of "
                f"{pool['attempts']} attempts failed: not a dead endpoint")
    else:
        text = "no request fell back to or from this scope"
    return {"state": "clear", "summary": f"No fallback contract problem: {text}.",
            "evidence": {"metrics": metrics, "thresholds": thresholds}}


def _inbound(ctx: DetectorContext) -> dict:
    """As a fallback target: this scope's fallbacks, what they got against what was asked, and whether they failed
    in the same failure domain as the attempt before them."""
    window = float(ctx.params["domain_window_s"])
    return ctx.one(f"""
        WITH fb AS (SELECT * FROM sl005_attempts WHERE {_in_scope(ctx)} AND is_fallback),
             -- the target's own (non-fallback) attempts around each fallback: was it failing at the same time?
             -- Counted as running totals over one time-ordered pass (a probe at each fallback's window start
             -- sorts before the requests at that instant, one at its end after them), not by a range join,
             -- which compared every fallback with every request of the scope.
             -- the probe's id in a stated order: Spark refuses an unordered row_number()
             probe AS (SELECT row_number() OVER (ORDER BY t_at, source_id, source_line) AS pid, request_id, trace_id,
                              t_at FROM fb),
             -- BIGINT counts: ClickHouse sums small literals as unsigned, and `-sum` of those is a Variant
             d AS (SELECT t_at, CAST(CASE WHEN request_id IS NOT NULL THEN 1 ELSE 0 END AS BIGINT) AS dn,
                          CAST(CASE WHEN {failed('d')} THEN 1 ELSE 0 END AS BIGINT) AS df
                   FROM scope_requests d WHERE t_at IS NOT NULL AND {NOT_A_FALLBACK}),
             events AS (SELECT t_at AS t, 1 AS ord, dn, df, CAST(NULL AS BIGINT) AS pid FROM d
                        UNION ALL SELECT t_at - {_interval(window)}, 0, 0, 0, pid FROM probe WHERE t_at IS NOT NULL
                        UNION ALL SELECT t_at + {_interval(window)}, 2, 0, 0, pid FROM probe WHERE t_at IS NOT NULL),
             running AS (SELECT pid, ord, sum(dn) OVER w AS dn_sum, sum(df) OVER w AS df_sum FROM events
                         WINDOW w AS (ORDER BY t, ord ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
             per_probe AS (SELECT pid, sum(CASE WHEN ord = 2 THEN dn_sum ELSE -dn_sum END) AS n,
                                  sum(CASE WHEN ord = 2 THEN df_sum ELSE -df_sum END) AS failed_n
                           FROM running WHERE pid IS NOT NULL GROUP BY pid),
             around AS (SELECT probe.request_id, probe.trace_id, CAST(coalesce(sum(per_probe.n), 0) AS BIGINT) AS n,
                               CAST(coalesce(sum(per_probe.failed_n), 0) AS BIGINT) AS failed_n
                        FROM probe LEFT JOIN per_probe USING (pid)
                        GROUP BY probe.request_id, probe.trace_id)
        SELECT count(*) AS fallbacks, count(CASE WHEN {KNOWN_OUTCOME} THEN 1 END) AS known,
               count(CASE WHEN {FAILED} THEN 1 END) AS failed,
               count(CASE WHEN finish_reason = 'length' THEN 1 END) AS length,
               count(CASE WHEN ({FAILED} OR finish_reason = 'length') AND (
                            max_tokens < first_max_tokens OR context_window < first_prompt_tokens OR {CONTEXT_ERROR}
                            OR {CUT_BELOW_ASKED})
                     THEN 1 END) AS mismatched,
               count(CASE WHEN max_tokens < first_max_tokens THEN 1 END) AS smaller_cap,
               count(CASE WHEN {CUT_BELOW_ASKED} THEN 1 END) AS cut_below_asked,
               max(CASE WHEN {CUT_BELOW_ASKED} THEN completion_tokens END) AS cut_at_most,
               min(CASE WHEN {CUT_BELOW_ASKED} THEN coalesce(max_tokens, first_max_tokens) END) AS cut_asked_min,
               max(CASE WHEN {CUT_BELOW_ASKED} THEN coalesce(max_tokens, first_max_tokens) END) AS cut_asked_max,
               count(CASE WHEN context_window < first_prompt_tokens OR ({FAILED} AND {CONTEXT_ERROR}) THEN 1 END)
                 AS context_short,
               count(CASE WHEN {FAILED} AND ((prev_failed AND (deployment = prev_deployment
                                                              OR error_type = prev_error_type))
                                             OR (around.n >= 2 AND around.failed_n >= 0.5 * around.n))
                     THEN 1 END) AS same_domain,
               count(CASE WHEN {FAILED} AND around.n >= 2 AND around.failed_n >= 0.5 * around.n THEN 1 END)
                 AS target_failing_then,
               string_agg(DISTINCT origin_model, ', ') AS origins
        FROM fb LEFT JOIN around USING (request_id, trace_id)""")


def _direct(ctx: DetectorContext) -> dict:
    """The scope's own requests (not fallbacks): how many have a known outcome, how many failed or were cut."""
    return ctx.one(f"""
        SELECT count(CASE WHEN {KNOWN_OUTCOME} THEN 1 END) AS n,
               count(CASE WHEN {FAILED} OR finish_reason = 'length' THEN 1 END) AS bad
        FROM scope_requests d WHERE {NOT_A_FALLBACK}""")


def _pool(ctx: DetectorContext) -> dict:
    """As a pool member: this scope's attempts, and whether their traces were answered elsewhere afterwards."""
    return ctx.one(f"""
        WITH mine AS (SELECT trace_id, arg_min(t_at, k) AS t_first_here, min(k) AS k_first_here
                      FROM sl005_attempts WHERE {_in_scope(ctx)} GROUP BY trace_id),
             here AS (SELECT count(*) AS n, count(CASE WHEN {FAILED} THEN 1 END) AS failed FROM scope_requests),
             -- the first later attempt elsewhere that answered, from its start; a start before the end of the
             -- attempt it followed is the client request's (a streamed answer behind the proxy), and then the end
             -- of that attempt is the latest it can have started (a lower bound: it drops any backoff)
             answered AS (SELECT m.trace_id,
                                 arg_min(CASE WHEN a.prev_t_end IS NULL OR a.t_at >= a.prev_t_end THEN a.t_at
                                              ELSE a.prev_t_end END, a.k) AS t_answer_start,
                                 min(m.t_first_here) AS t_first_here
                          FROM mine m JOIN sl005_attempts a ON a.trace_id = m.trace_id
                          WHERE NOT {_in_scope(ctx, 'a')} AND a.k > m.k_first_here AND NOT {failed('a')}
                          GROUP BY m.trace_id),
             added AS (SELECT date_diff('microsecond', t_first_here, t_answer_start) / 1e6 AS added_s FROM answered)
        SELECT (SELECT n FROM here) AS attempts, (SELECT failed FROM here) AS failed,
               (SELECT count(*) FROM mine) AS traces, (SELECT count(*) FROM answered) AS answered_elsewhere,
               (SELECT {q('added_s', 0.5)} FROM added) AS added_p50_s, (SELECT max(added_s) FROM added) AS added_max_s""")


def _problems(ctx: DetectorContext, inbound: dict, pool: dict, shares: tuple, worse_than_direct: bool,
              dead: bool) -> list[str]:
    """The sentence of each problem found: mismatched contract (or worse than direct), same domain, dead member."""
    p = ctx.params
    fb_bad_share, direct_bad_share, failed_share = shares
    problems = []
    if inbound["mismatched"] >= p["min_mismatches"]:
        problems.append(f"{inbound['mismatched']} of {inbound['fallbacks']} fallback(s) from {inbound['origins']} "
                        f"failed or ended by length with a smaller contract than the request asked for "
                        f"({inbound['smaller_cap']} of the {inbound['fallbacks']} got a smaller max_tokens, "
                        + (f"{inbound['cut_below_asked']} were cut by length at {inbound['cut_at_most']} tokens or "
                           f"fewer where the request asked for {_span(inbound['cut_asked_min'], inbound['cut_asked_max'])}, "
                           if inbound["cut_below_asked"] else "")
                        + f"{inbound['context_short']} a context short of the prompt)")
    elif worse_than_direct:
        problems.append(f"fallbacks from {inbound['origins']} failed or ended by length {pct(fb_bad_share)} of the "
                        f"time against {pct(direct_bad_share)} for this model's own requests")
    if inbound["same_domain"] >= p["min_same_domain"]:
        problems.append(f"{inbound['same_domain']} fallback(s) failed like the attempt before them (same deployment "
                        f"or the same error type) or while this deployment was failing its own requests "
                        f"({inbound['target_failing_then']} within {float(p['domain_window_s']):g} s): the same "
                        "failure domain")
    if dead:
        problems.append(f"every client request that tried this deployment was answered elsewhere: {pct(failed_share)} "
                        f"of its {pool['attempts']} attempts failed, adding {secs(pool['added_p50_s'])} (p50, max "
                        f"{secs(pool['added_max_s'])}) before the fallback answered - a dead endpoint left in the pool")
    return problems


def _fired(ctx: DetectorContext, markers: dict, inbound: dict, problems: list[str], kinds: tuple[bool, bool],
           metrics: dict, thresholds: dict) -> dict:
    """The fired finding: the fallback traces as table, chart and examples; severity and remediation by kind."""
    p = ctx.params
    worse_than_direct, dead = kinds
    me = _in_scope(ctx)
    fallback_traces = f"trace_id IN (SELECT trace_id FROM sl005_attempts WHERE {me} AND (is_fallback OR tries > 1))"
    rows = ctx.rows(f"""
        SELECT trace_id, k AS attempt, model, deployment, max_tokens, context_window, prompt_tokens, status,
               coalesce(error_type, finish_reason) AS outcome, t_at
        FROM sl005_attempts WHERE {fallback_traces}
        ORDER BY first_t_at, trace_id, k LIMIT 30""")
    trace_table = table(["trace", "attempt", "model", "deployment", "max_tokens", "context window", "prompt tokens",
                         "status", "outcome", "arrival"],
                        [[r["trace_id"], r["attempt"], r["model"], r["deployment"], r["max_tokens"],
                          r["context_window"], r["prompt_tokens"], r["status"], r["outcome"], r["t_at"]] for r in rows])
    per_trace = ctx.rows(f"""
        SELECT trace_id, min(t_at) AS t0, max(k) AS attempts,
               date_diff('microsecond', min(t_at), max(coalesce(t_end, t_at))) / 1e6 AS total_s
        FROM sl005_attempts WHERE {fallback_traces}
        GROUP BY trace_id ORDER BY t0 LIMIT 300""")
    the_chart = chart("scatter", "Client requests that fell back: time from first attempt to the answer",
                      "time", "seconds (first attempt to last byte)",
                      [{"name": "fallback traces", "x": [r["t0"] for r in per_trace],
                        "y": [rounded(r["total_s"]) for r in per_trace]}], x_time=True)
    window = ctx.one(f"SELECT min(t_at) AS a, max(coalesce(t_end, t_at)) AS b FROM sl005_attempts WHERE {me}")
    kind = ("dead endpoint in the fallback pool" if dead and len(problems) == 1
            else "fallback contract mismatch" if inbound["mismatched"] >= p["min_mismatches"] or worse_than_direct
            else "fallback into the same failure domain" if len(problems) == 1 else "fallback problems")
    metrics["problem"] = kind
    result = {
        "state": "fired",
        "summary": f"Fallback problem ({kind}): " + "; ".join(problems) + ".",
        "evidence": {"metrics": metrics, "thresholds": thresholds, "table": trace_table, "chart": the_chart,
                     "windows": [{"start": window["a"], "end": window["b"]}]},
        "examples": ctx.examples(f"{fallback_traces} AND ({FAILED} OR finish_reason = 'length')", "t_at"),
    }
    # Severity follows the users hit: a fallback that cannot give what was asked is a broken answer for every
    # client request that lands on it.
    broken_share = inbound["mismatched"] / markers["traces"] if markers["traces"] else None
    metrics["mismatched_share_of_client_requests"] = rounded(broken_share)
    if broken_share is not None and inbound["mismatched"] >= p["min_mismatches"] and broken_share >= p["critical_share"]:
        result["severity"] = "critical"
    if dead and not (inbound["mismatched"] or worse_than_direct):
        result["remediation"] = (
            "Take the dead deployment out of the pool (or fix it): every request that reaches it waits for its "
            "retries and backoff before the fallback answers. Put a health check or cooldown in front of it "
            "(LiteLLM: allowed_fails and cooldown_time on the Router, or remove the deployment from model_list), "
            "and set num_retries low for connection errors so a refused connection fails over at once.")
        result["rollback"] = (
            "After removing or fixing it, watch the time from first attempt to answer for requests to this model "
            "group: roll back if the error rate of the group rises above today's, or if requests still take about "
            "{added_latency_p50_s:.2f} s longer than the fallback's own latency within 30 minutes.")
    return result
