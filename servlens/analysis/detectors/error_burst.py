"""SL013 error burst: the share of failed requests in the worst window of a scope, split by error class.

Failed requests and their class come from servlens/analysis/failures.py (FAILED, ERROR_CLASS). The scope's windows
(servlens/analysis/windows.py) are cut from its first request. The stretches judged are each window alone, the peak
window (30 min, or a quarter of a shorter span) sliding one window at a time, and the whole scope:

- a burst (warning) when at least `min_failed` of its requests failed and their share is at least `min_share` at
  the lower end of its Wilson score interval (`confidence`), so that 3 failures of 40 at night are not a burst;
- critical when at least `critical_min_failed` requests, `critical_share` of the stretch, got no answer at all: a
  failed attempt whose trace (trace_id) got an answer from another attempt (a retry or a fallback, possibly on
  another deployment) was recovered, and the user did not see it.

The worst stretch is the one at the highest level, then the one whose share is most surely high, then the one with
the most failures, then the earliest. Without an HTTP status, error type, error message or finish reason in the
scope, and from a format that maps none, the outcome is unknown (ingest calls every such request ok): not evaluable.
"""

from __future__ import annotations

from itertools import zip_longest
from statistics import NormalDist

from servlens.analysis.detectors._common import chart, pct, rounded, table
from servlens.analysis.failures import CLASS_NAMES, ERROR_CLASS, FAILED, answered
from servlens.analysis.runner import DetectorContext, sql_literal
from servlens.analysis.windows import iso

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_failed", "min_share", "confidence", "critical_min_failed", "critical_share"
    ],
    "requires": [],
}

CLASS_LABELS = {
    "rate_limit": "rate limit", "connection": "connection/DNS", "timeout": "timeout",
    "context_validation": "context/validation", "auth": "auth", "client_abort": "client abort",
    "server_5xx": "server 5xx", "other": "other failure",
}
WHAT_TO_DO = {
    "rate_limit": "raise the deployment's rpm/tpm limit or add deployments to the model group, and make clients "
                  "back off (honour Retry-After) instead of retrying at once",
    "connection": "the endpoint could not be reached: check the deployment's api_base, its DNS name and that the "
                  "server is up, and keep it out of the pool (cooldown) until it answers",
    "timeout": "requests ran into a time limit: see SL011 for the limit and where the time went, and add capacity "
               "or cut queueing (SL004) before raising the timeout",
    "context_validation": "the client broke the API's contract: keep prompt + max_tokens within the context "
                          "(SL012) and send valid parameters and model names",
    "auth": "fix or rotate the key the gateway or client uses for this deployment",
    "client_abort": "clients gave up before the answer: compare their timeouts with the latency they saw",
    "server_5xx": "the upstream failed: read the engine's log around the window and check for restarts (SL006) "
                  "and out-of-memory kills",
    "other": "failures without a status or error type: read the example requests",
}


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    spec = ctx.window
    thresholds = {k: p[k] for k in ("min_failed", "min_share", "confidence", "critical_min_failed", "critical_share")}
    if spec is None:
        return {"state": "not_evaluable", "summary": "Errors cannot be placed in time.",
                "reason": "no request has an arrival, first-token or end time (t_arrival, t_first_token, t_end)"}
    if not ctx.has("http_status") and not ctx.has("error_type") and not ctx.has("error_message") \
            and not ctx.has("finish_reason") and not _source_records_outcome(ctx):
        return {"state": "not_evaluable", "summary": "The source does not say which requests failed.",
                "reason": "missing http_status, error_type, error_message and finish_reason in every request, and "
                          "the source's format does not map a status (ingest calls every such request ok)"}
    per = max(1, round(spec.peak_s / spec.width_s))        # windows in one stretch
    starts = max(1, spec.count - per + 1)
    recovered = _recovered_sql(ctx)
    z = NormalDist().inv_cdf(0.5 + p["confidence"] / 2)
    z2 = z * z
    ctx.con.execute(f"""CREATE OR REPLACE TEMP TABLE sl013_requests AS
        SELECT {spec.index_sql()} AS w, t_at, {ERROR_CLASS} AS error_class, {recovered} AS recovered
        FROM scope_requests r WHERE t_at IS NOT NULL""")
    ctx.con.execute(f"""CREATE OR REPLACE TEMP TABLE sl013_stretches AS
        WITH win AS (SELECT w, count(*) AS n, count(error_class) AS failed,
                            count(*) FILTER (WHERE error_class IS NOT NULL AND NOT recovered) AS unanswered
                     FROM sl013_requests GROUP BY w),
             s AS (SELECT st.range AS s, {per} AS len, sum(n) AS n, sum(failed) AS failed,
                          sum(unanswered) AS unanswered
                   FROM range(0, {starts}) st JOIN win ON win.w BETWEEN st.range AND st.range + {per - 1}
                   GROUP BY st.range
                   -- the whole scope too (in a short run the peak window is a sliver of it), and each window
                   -- alone (a one-minute outage in a day-long log would be diluted in any 30 min)
                   UNION ALL SELECT 0, {spec.count}, sum(n), sum(failed), sum(unanswered) FROM win
                   UNION ALL SELECT w, 1, n, failed, unanswered FROM win),
             b AS (SELECT *, failed / n AS share, unanswered / n AS unanswered_share,
                          -- the Wilson score interval's lower end: 3 failures of 40 are 7.5% but could be chance
                          (failed / n + {z2} / (2 * n) - {z} * sqrt(failed / n * (1 - failed / n) / n
                           + {z2} / (4 * n * n))) / (1 + {z2} / n) AS share_low
                   FROM s)
        SELECT *, CASE WHEN unanswered >= {int(p['critical_min_failed'])}
                            AND unanswered_share >= {float(p['critical_share'])} THEN 2
                       WHEN failed >= {int(p['min_failed'])} AND share_low >= {float(p['min_share'])} THEN 1
                       ELSE 0 END AS level
        FROM b""")
    # The highest level, then the share most surely high (with no burst: the stretch closest to the line).
    worst = ctx.one(f"""SELECT * FROM sl013_stretches ORDER BY level DESC, failed >= {int(p['min_failed'])} DESC,
                                   share_low DESC, failed DESC, s, len LIMIT 1""")
    total = ctx.one("""SELECT count(*) AS n, count(error_class) AS failed,
                              count(*) FILTER (WHERE error_class IS NOT NULL AND recovered) AS recovered
                       FROM sl013_requests""")
    first, last = worst["s"], min(worst["s"] + worst["len"] - 1, spec.count - 1)
    bounds = spec.bounds(first, last)
    in_worst = f"w BETWEEN {first} AND {last}"
    classes = ctx.rows(f"""SELECT error_class, count(*) FILTER (WHERE {in_worst}) AS in_window, count(*) AS in_scope,
                                  count(*) FILTER (WHERE recovered) AS recovered
                           FROM sl013_requests WHERE error_class IS NOT NULL GROUP BY error_class
                           ORDER BY in_window DESC, in_scope DESC, error_class""")
    window_classes = [c for c in classes if c["in_window"]]
    metrics = {
        "requests": total["n"], "failed": total["failed"], "failed_share": rounded(total["failed"] / total["n"]),
        "recovered": total["recovered"], "window_s": spec.width_s, "peak_window_s": rounded(per * spec.width_s),
        "worst_window_s": rounded((last - first + 1) * spec.width_s),
        "worst_window": _span((last - first + 1) * spec.width_s),
        "worst_window_start": bounds["start"], "worst_window_end": bounds["end"],
        "worst_requests": worst["n"], "worst_failed": worst["failed"], "worst_share": rounded(worst["share"]),
        "worst_share_low": rounded(worst["share_low"]),
        "worst_unanswered": worst["unanswered"], "worst_unanswered_share": rounded(worst["unanswered_share"]),
        "top_class": window_classes[0]["error_class"] if window_classes else None,
    } | {f"failed_{name}": 0 for name in CLASS_NAMES} | {f"failed_{c['error_class']}": c["in_scope"] for c in classes}
    split = ", ".join(f"{CLASS_LABELS[c['error_class']]} {c['in_window']}" for c in window_classes)
    whole = worst["len"] >= spec.count
    where = (f"the whole scope ({_span(spec.count * spec.width_s)})" if whole else
             f"the worst {_span(worst['len'] * spec.width_s)} ({_clock(spec, first, ctx)})")
    stretch = (f"{where} had {worst['failed']} of {worst['n']} requests failed ({pct(worst['share'], 1)}"
               + (f", {pct(worst['share_low'], 1)} at the lower end of its {pct(p['confidence'])} interval"
                  if worst["failed"] else "") + (f": {split})" if split else ")"))
    if worst["level"] == 0:
        line = (f"a burst needs at least {p['min_failed']} failures in a window and a failed share of at least "
                f"{pct(p['min_share'])} at the lower end of its interval")
        if not total["failed"]:
            summary = f"No error burst: none of {total['n']} requests failed."
        elif whole:
            summary = (f"No error burst: {total['failed']} of {total['n']} requests failed "
                       f"({pct(worst['share'], 1)}, {pct(worst['share_low'], 1)} at the lower end of its "
                       f"{pct(p['confidence'])} interval: {split}); {line}.")
        else:
            summary = (f"No error burst: {total['failed']} of {total['n']} requests failed "
                       f"({pct(total['failed'] / total['n'], 1)}); {stretch}; {line}.")
        return {"state": "clear", "evidence": {"metrics": metrics, "thresholds": thresholds}, "summary": summary}
    recovered_note = ""
    in_window_recovered = worst["failed"] - worst["unanswered"]
    if in_window_recovered:
        recovered_note = (f"; {in_window_recovered} of them got an answer from a retry or fallback in the same trace"
                          if worst["unanswered"] else "; every one got an answer from a retry or fallback in the same "
                                                      "trace")
    summary = f"Error burst: {stretch}{recovered_note}." + ("" if whole else (
        f" Over the scope {total['failed']} of {total['n']} failed ({pct(total['failed'] / total['n'])})."))
    evidence = {"metrics": metrics, "thresholds": thresholds, "windows": [bounds],
                "table": _class_table(ctx, classes, in_worst), "chart": _chart(ctx, spec, bounds)}
    # Up to five examples, taken in turn from each class of the worst window (the largest first).
    per_class = [ctx.examples(f"{ERROR_CLASS} = {sql_literal(c['error_class'])} AND "
                              f"{spec.index_sql()} BETWEEN {first} AND {last}", "t_at") for c in window_classes]
    examples = [e for turn in zip_longest(*per_class) for e in turn if e is not None][:5]
    remediation = "; ".join(f"{CLASS_LABELS[c['error_class']]} ({c['in_window']}): {WHAT_TO_DO[c['error_class']]}"
                            for c in window_classes) + "."
    return {"state": "fired", "severity": "critical" if worst["level"] == 2 else "warning", "summary": summary,
            "evidence": evidence, "examples": examples, "remediation": remediation[0].upper() + remediation[1:]}


# The outcome columns a format profile may map; a profile that maps one records failures, even when none occurred
# (vllm bench's `errors` list is all empty strings on a clean run, so error_message is NULL everywhere).
OUTCOME_COLUMNS = ("status", "http_status", "error_type", "error_message", "finish_reason")


def _source_records_outcome(ctx: DetectorContext) -> bool:
    """Whether every source of the scope was read with a format profile that maps an outcome column."""
    from servlens.errors import ConfigError
    from servlens.ingest.profiles import get_profile

    formats = [r["format"] for r in ctx.rows("""SELECT DISTINCT s.format FROM sources s
                                                WHERE s.source_id IN (SELECT source_id FROM scope_requests)""")]
    if not formats:
        return False
    for name in formats:
        try:
            profile = get_profile(name)
        except ConfigError:
            return False
        if not any(column in profile.columns for column in OUTCOME_COLUMNS):
            return False
    return True


def _recovered_sql(ctx: DetectorContext) -> str:
    """Whether a request's trace got an answer from another attempt (anywhere in the run: a fallback may be served
    by another deployment). Without a trace_id nothing is known to be recovered."""
    if not ctx.has("trace_id"):
        return "false"
    return (f"coalesce(r.trace_id IN (SELECT o.trace_id FROM requests o WHERE o.run = {sql_literal(ctx.scope.run)} "
            f"AND o.trace_id IS NOT NULL AND {answered('o')}), false)")


def _class_table(ctx: DetectorContext, classes: list[dict], in_worst: str) -> dict:
    """Per class: failures in the worst stretch and in the scope, recovered ones, the statuses and types seen."""
    seen = {r["error_class"]: r for r in ctx.rows(f"""
        SELECT {ERROR_CLASS} AS error_class,
               string_agg(DISTINCT CAST(http_status AS VARCHAR), ', ' ORDER BY CAST(http_status AS VARCHAR)) AS statuses,
               string_agg(DISTINCT error_type, ', ' ORDER BY error_type) AS types
        FROM scope_requests WHERE {FAILED} GROUP BY 1""")}
    return table(["class", "failed in the worst window", "failed in the scope", "answered by a retry or fallback",
                  "HTTP statuses", "error types", "what to do"],
                 [[CLASS_LABELS[c["error_class"]], c["in_window"], c["in_scope"], c["recovered"],
                   seen.get(c["error_class"], {}).get("statuses"), seen.get(c["error_class"], {}).get("types"),
                   WHAT_TO_DO[c["error_class"]]] for c in classes])


def _chart(ctx: DetectorContext, spec, bounds: dict) -> dict:
    """Answered and failed requests (per class) per window, the worst stretch shaded."""
    rows = ctx.rows("""SELECT w, coalesce(error_class, 'answered') AS k, count(*) AS n FROM sl013_requests
                       GROUP BY 1, 2 ORDER BY 1""")
    xs = sorted({r["w"] for r in rows})
    names = ["answered"] + [c for c in CLASS_NAMES if any(r["k"] == c for r in rows)]
    counts = {(r["w"], r["k"]): r["n"] for r in rows}
    x = [iso(spec.start(w)) for w in xs]
    return chart("bar", f"Requests per {_span(spec.width_s)} window by outcome", "time", "requests",
                 [{"name": CLASS_LABELS.get(k, k), "x": x, "y": [counts.get((w, k), 0) for w in xs]} for k in names],
                 x_time=True, vspans=[{"x0": bounds["start"], "x1": bounds["end"], "label": "worst window"}])


def _span(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:g} min"


def _clock(spec, first: int, ctx: DetectorContext) -> str:
    """Where the stretch starts as people read it: the time of day, or seconds from the start on a relative clock."""
    offset = first * spec.width_s
    if ctx.relative_clock:
        return f"from {_span(offset)} into the run"
    start = spec.start(first).isoformat(sep=" ", timespec="seconds")
    return f"from {start}, the first request" if first == 0 else f"from {start}, {_span(offset)} after the first request"
