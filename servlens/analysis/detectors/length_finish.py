"""SL002 length-limit finishes.

A request is cut at the output limit when its finish_reason is `length`, or when its completion tokens reach its
max_tokens even though the source says otherwise. The share is judged per scope (model), broken down by cap, and
explained:

- the cap sits inside the output distribution when answers that ended naturally (finish stop) were often longer
  than the cap: the cap is too low for this traffic;
- reasoning consumed the budget when capped requests have empty content and reasoning present (or reasoning
  tokens close to all completion tokens);
- a fallback model (served_model differs, or fallback_from set) with a smaller cap fails the retry too;
- llama.cpp reports `length` for any stop that is not EOS or a stop word (e.g. the slot's context filled), so
  `length` below the cap is counted apart;
- fixed-output benchmark runs (vllm bench's random dataset forces ignore_eos) finish by length by design: clear.
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, ratio, rounded, table
from servlens.analysis.runner import DetectorContext

CAPPED = ("(finish_reason = 'length' OR (completion_tokens IS NOT NULL AND max_tokens IS NOT NULL "
          "AND completion_tokens >= max_tokens))")
# Requests that finished: failed ones (HTTP errors, aborts, timeouts) produced no answer to cut, and vLLM's
# request_success counter leaves them out too, so the share is over finished requests on both paths.
KNOWN = ("(coalesce(status, 'ok') <> 'error' AND coalesce(finish_reason, '') NOT IN ('error', 'abort', 'timeout') "
         "AND (finish_reason IS NOT NULL OR (completion_tokens IS NOT NULL AND max_tokens IS NOT NULL)))")
REASONING_ATE = ("((content_empty AND reasoning_present) OR (reasoning_tokens IS NOT NULL AND completion_tokens > 0 "
                 "AND reasoning_tokens >= 0.9 * completion_tokens))")
CHART_CAPS = 30          # bars in the by-cap chart: the caps with the most length finishes
BENCH_FORMATS = ("vllm-bench", "sglang-bench", "guidellm")


def _is_benchmark(ctx: DetectorContext) -> bool:
    if any(any(b in fmt for b in BENCH_FORMATS) for fmt in ctx.source_formats):
        return True
    if ctx.has("attrs"):
        row = ctx.one("SELECT count(*) AS n FROM scope_requests WHERE json_extract_string(attrs, '$.ignore_eos') = 'true'")
        return bool(row["n"])
    return False


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    thresholds = {k: p[k] for k in ("max_length_share", "critical_share", "min_length_requests", "min_requests",
                                    "cap_inside_share")}
    per_request = ctx.path_available("finish_reasons") or ctx.path_available("tokens_vs_max_tokens")
    benchmark = _is_benchmark(ctx)
    if not per_request:
        return _from_counter(ctx, thresholds, benchmark)

    s = ctx.one(f"""
        SELECT count(*) FILTER (WHERE {KNOWN}) AS known,
               count(*) FILTER (WHERE {KNOWN} AND {CAPPED}) AS capped,
               count(*) FILTER (WHERE finish_reason = 'length') AS reported_length,
               count(*) FILTER (WHERE finish_reason IS DISTINCT FROM 'length' AND completion_tokens >= max_tokens) AS reached_cap_reported_otherwise,
               count(*) FILTER (WHERE finish_reason = 'length' AND completion_tokens < max_tokens) AS length_below_cap,
               count(*) FILTER (WHERE {CAPPED} AND {REASONING_ATE}) AS reasoning_ate_budget,
               count(*) FILTER (WHERE {CAPPED} AND content_empty) AS capped_empty_content,
               count(DISTINCT max_tokens) AS caps,
               count(*) FILTER (WHERE {CAPPED} AND completion_tokens IS NOT NULL) AS capped_with_tokens,
               min(completion_tokens) FILTER (WHERE {CAPPED}) AS capped_min_tokens,
               max(completion_tokens) FILTER (WHERE {CAPPED}) AS capped_max_tokens
        FROM scope_requests""")
    known, capped = s["known"], s["capped"]
    if known < p["min_requests"]:
        return not_evaluable(f"only {known} requests with a finish reason or completion tokens and max_tokens; "
                             f"the rule needs at least {p['min_requests']} (min_requests)",
                             "Too few finished requests to judge length finishes.")
    share = capped / known
    metrics = {"requests": known, "length_finishes": capped, "length_share": rounded(share),
               "reported_length": s["reported_length"],
               "reached_cap_reported_otherwise": s["reached_cap_reported_otherwise"],
               "length_below_cap": s["length_below_cap"], "reasoning_ate_budget": s["reasoning_ate_budget"],
               "capped_with_empty_content": s["capped_empty_content"], "benchmark_run": benchmark,
               "target_length_share": p["max_length_share"]}

    if ctx.has_metric("vllm:request_success"):
        # The engine's own count over the same run, as a cross-check of the request logs.
        counted = ctx.one("""SELECT sum(increase) AS n, sum(CASE WHEN labels['finished_reason'] = 'length' THEN increase END) AS length
                             FROM scope_counter_increases WHERE name = 'vllm:request_success' AND series = 'value'""")
        metrics["metric_length_share"] = rounded(ratio(counted.get("length") or 0, counted.get("n")))

    by_cap = ctx.rows(f"""
        WITH natural_out AS (SELECT completion_tokens AS c FROM scope_requests
                         WHERE finish_reason = 'stop' AND completion_tokens IS NOT NULL)
        SELECT max_tokens AS cap, count(*) AS n, count(*) FILTER (WHERE {CAPPED}) AS capped,
               {q('completion_tokens', 0.5)} AS out_p50, {q('completion_tokens', 0.99)} AS out_p99,
               (SELECT count(*) FROM natural_out) AS natural_n,
               (SELECT count(*) FROM natural_out WHERE c > max_tokens) AS natural_longer
        FROM scope_requests WHERE {KNOWN} GROUP BY max_tokens ORDER BY capped DESC, cap NULLS LAST""")
    cap_rows = []
    inside = []
    for row in by_cap:
        row_share = ratio(row["capped"], row["n"])
        longer = ratio(row["natural_longer"], row["natural_n"]) if row["cap"] is not None else None
        cap_rows.append([row["cap"], row["n"], row["capped"], row_share, row["out_p50"], row["out_p99"], longer])
        if row["capped"] and longer is not None and longer >= p["cap_inside_share"]:
            inside.append((row["cap"], longer))
    top = next((r for r in by_cap if r["capped"]), None)
    metrics["top_cap"] = top["cap"] if top else None
    metrics["top_cap_length_share"] = rounded(ratio(top["capped"], top["n"])) if top else None
    # A fallback attempt is marked by fallback_from (gateways); a served_model that merely differs from the requested
    # name is how engines answer ("tiny" served as "models/small.gguf") and says nothing about fallbacks. Its cap is
    # compared with the cap of the first attempt of its own trace (clients send different caps: a scope-wide median
    # would call a 32-token request's fallback "smaller" than the 96 others asked for). first_attempt has only
    # trace_id and primary_cap, so CAPPED and KNOWN read the fallback's own columns unqualified.
    fallback = ctx.rows(f"""
        WITH first_attempt AS (
            SELECT trace_id, arg_min(max_tokens, coalesce(attempt, 0)) AS primary_cap FROM requests
            WHERE run = ? AND trace_id IS NOT NULL AND fallback_from IS NULL GROUP BY trace_id)
        SELECT f.served_model, f.max_tokens AS cap, p.primary_cap, count(*) AS n,
               count(*) FILTER (WHERE {CAPPED}) AS capped
        FROM scope_requests f JOIN first_attempt p USING (trace_id)
        WHERE {KNOWN} AND f.fallback_from IS NOT NULL AND f.max_tokens < p.primary_cap
        GROUP BY 1, 2, 3 ORDER BY capped DESC LIMIT 3""", [ctx.scope.run]) if ctx.has("fallback_from", "trace_id") else []
    smaller_fallback = [f for f in fallback if f["capped"]]
    # 'length' below the cap the request asked for has two causes. llama.cpp reports length for any stop that is not
    # EOS or a stop word, so a filled slot context ends answers where prompt + completion reaches the context: the
    # sum is constant while prompts vary. A cap applied on the way (a gateway deployment's or fallback's max_tokens,
    # an engine default) ends them at one completion length whatever the prompt.
    below = ctx.one(f"""
        WITH b AS (SELECT completion_tokens AS c, prompt_tokens AS pr, fallback_from FROM scope_requests
                   WHERE finish_reason = 'length' AND completion_tokens < max_tokens)
        SELECT count(*) AS n, mode(c) AS tokens, count(*) FILTER (WHERE c = (SELECT mode(c) FROM b)) AS at_tokens,
               count(pr) AS with_prompt, count(DISTINCT pr) AS prompts,
               count(*) FILTER (WHERE pr + c = (SELECT mode(pr + c) FROM b)) AS at_context,
               count(*) FILTER (WHERE fallback_from IS NOT NULL AND c = (SELECT mode(c) FROM b)) AS fallback_at_tokens
        FROM b""") if s["length_below_cap"] else {}
    one_length = bool(below.get("n")) and below["n"] >= p["min_length_requests"] and below["at_tokens"] >= 0.8 * below["n"]
    prompts_vary = bool(below.get("n")) and below["with_prompt"] >= 0.8 * below["n"] and below["prompts"] >= 2
    context_filled = prompts_vary and below["at_context"] >= 0.8 * below["n"]
    enforced_cap = below["tokens"] if one_length and prompts_vary and not context_filled else None

    # Bars in cap order (8, 16, 32, …, then requests without a cap), so the eye reads along the limit; the caps with
    # the most length finishes are the ones kept when there are more than a chart can show.
    charted = sorted(cap_rows[:CHART_CAPS], key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0))
    the_chart = chart("bar", "Share of requests ended by the output limit, by max_tokens", "max_tokens",
                      "length-finish share", [{"name": "length-finish share",
                                               "x": [("unset" if r[0] is None else str(r[0])) for r in charted],
                                               "y": [rounded(r[3]) for r in charted]}],
                      hlines=[{"y": p["max_length_share"],
                               "label": f"fires at {100 * p['max_length_share']:g}% overall (max_length_share)"}])
    the_table = table(["max_tokens", "requests", "length finishes", "share", "completion p50", "completion p99",
                       "natural answers longer than the cap"], cap_rows[:20])
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart, "table": the_table}

    # Every request capped at one length: what a fixed-output benchmark looks like (production rarely does this).
    fixed = (capped == known and s["capped_with_tokens"] and s["capped_min_tokens"] == s["capped_max_tokens"]
             and s["caps"] <= 1)
    if benchmark and share > 0:
        return {"state": "clear",
                "summary": f"{pct(share)} of requests ended by length, by design: this is a benchmark run with fixed "
                           "output lengths (ignore_eos), not production traffic.",
                "evidence": evidence}
    if share < p["max_length_share"] or capped < p["min_length_requests"]:
        return {"state": "clear",
                "summary": f"{pct(share, 1)} of {known} requests ended at the output limit (line: "
                           f"{pct(p['max_length_share'])} and at least {p['min_length_requests']} requests).",
                "evidence": evidence}

    parts = [f"{pct(share)} of {known} requests ended at the output limit ({capped} requests)"]
    if top and top["cap"] is not None:
        parts.append(f"max_tokens={top['cap']} cut {pct(ratio(top['capped'], top['n']))} of its requests")
    if inside:
        cap, longer = inside[0]
        parts.append(f"the cap {cap} sits inside the output distribution: {pct(longer)} of answers that ended "
                     "naturally were longer")
    if s["reasoning_ate_budget"]:
        metrics["reasoning_ate_budget_share"] = rounded(s["reasoning_ate_budget"] / capped)
        parts.append(f"reasoning consumed the budget in {pct(s['reasoning_ate_budget'] / capped)} of them "
                     "(empty content, reasoning present)")
    if smaller_fallback:
        f = smaller_fallback[0]
        metrics |= {"fallback_model": f["served_model"], "fallback_cap": f["cap"], "primary_cap": f["primary_cap"]}
        parts.append(f"fallback model {f['served_model']} has a smaller cap ({f['cap']} vs {f['primary_cap']:g} on "
                     f"the first attempt of the same requests) and {pct(ratio(f['capped'], f['n']))} of its answers "
                     "hit it, so the retry fails too")
    remediation = None
    cut_on_the_way = 0
    if enforced_cap is not None:
        cut_on_the_way = below["at_tokens"]
        metrics["enforced_cap"] = enforced_cap
        parts.append(f"{below['at_tokens']} answers stopped at exactly {enforced_cap} tokens, below the max_tokens "
                     "they asked for, whatever their prompt length: a smaller cap was applied on the way (a gateway "
                     "deployment's or fallback's max_tokens, an engine default)")
        remediation = (f"Find where the {enforced_cap}-token cap is set: a gateway deployment's litellm_params "
                       "max_tokens (often a fallback's), or the engine's default output limit, and raise it to at "
                       "least the requests' own max_tokens; give any fallback model at least the primary's cap.")
    elif s["length_below_cap"]:
        cause = ("prompt + completion reached the same total, so the sequence's context filled" if context_filled
                 else f"{below['at_tokens']} of them at exactly {below['tokens']} tokens: a cap applied on the way "
                      "(gateway deployment, fallback) or a filled slot context" if one_length
                 else "e.g. the slot's context filled")
        parts.append(f"{s['length_below_cap']} 'length' finishes came below the cap (llama.cpp reports length for any "
                     f"stop that is not EOS or a stop word; {cause})")
        # A fallback attempt cut at one length below its request's cap is a retry that could not fit.
        cut_on_the_way = below["fallback_at_tokens"] if one_length else 0
        if context_filled or (not one_length and s["length_below_cap"] >= capped / 2):
            remediation = ("Most of these answers stopped below their max_tokens where the sequence's context "
                           "filled. On llama.cpp give each slot more context (raise -c, or lower -np: -c is split "
                           "between the slots); elsewhere raise the model's context or shorten prompts.")
    if s["reached_cap_reported_otherwise"]:
        parts.append(f"{s['reached_cap_reported_otherwise']} requests reached max_tokens though the source did not say length")
    if fixed:
        metrics["all_capped_at_same_length"] = s["capped_min_tokens"]
        parts.append(f"every request ran to exactly {s['capped_min_tokens']} tokens: if this is a fixed-length "
                     "benchmark (ignore_eos), length finishes are by design")
    result = {"state": "fired", "summary": "; ".join(parts) + ".", "evidence": evidence,
              "examples": ctx.examples(CAPPED, "completion_tokens DESC NULLS LAST")}
    if remediation:
        result["remediation"] = remediation
    # Severity follows user impact: an answer cut at a cap the client chose is still an answer (a warning with the
    # share); empty content, a budget the reasoning used up, or a fallback cap the retry cannot fit is a broken one.
    broken = s["capped_empty_content"] + sum(f["capped"] for f in smaller_fallback) + cut_on_the_way
    metrics["broken_answers"] = broken
    metrics["broken_share"] = rounded(broken / known)
    if broken >= p["min_length_requests"] and broken / known >= p["critical_share"]:
        result["severity"] = "critical"
    return result


def _from_counter(ctx: DetectorContext, thresholds: dict, benchmark: bool) -> dict:
    """vLLM's request_success counter by finished_reason, when there is no per-request data."""
    p = ctx.params
    # Benchmark result files save neither finish reasons nor caps: say why that is no loss for vllm bench.
    bench_note = (" (benchmark result files save neither finish reasons nor caps; with vllm bench's random dataset "
                  "every request runs to its drawn output length because ignore_eos is forced, so length finishes "
                  "there are by design)") if benchmark else ""
    if not ctx.has_metric("vllm:request_success"):
        return not_evaluable("no finish_reason, no max_tokens and no vllm:request_success counter" + bench_note,
                             "Cannot tell which requests were cut at the output limit.")
    rows = ctx.rows("""SELECT labels['finished_reason'] AS reason, sum(increase) AS n FROM scope_counter_increases
                       WHERE name = 'vllm:request_success' AND series = 'value' GROUP BY 1""")
    if not rows:
        return not_evaluable("no per-request finish reasons, and vllm:request_success has no increase to measure "
                             "(a counter needs at least two scrapes of one process)" + bench_note,
                             "Cannot tell which requests were cut at the output limit.")
    total = sum(r["n"] or 0 for r in rows)
    length = sum(r["n"] or 0 for r in rows if r["reason"] == "length")
    if total < p["min_requests"]:
        return not_evaluable(f"no per-request finish reasons, and vllm:request_success grew by only {total:g} requests "
                             f"(needs {p['min_requests']})", "Too few finished requests to judge length finishes.")
    share = length / total
    metrics = {"requests": total, "length_finishes": length, "length_share": rounded(share), "source": "vllm:request_success",
               "target_length_share": p["max_length_share"], "benchmark_run": benchmark}
    evidence = {"metrics": metrics, "thresholds": thresholds}
    if benchmark or share < p["max_length_share"] or length < p["min_length_requests"]:
        return {"state": "clear", "summary": f"{pct(share, 1)} of {total:g} requests ended by length (vLLM counter).",
                "evidence": evidence}
    result = {"state": "fired", "evidence": evidence,
              "summary": f"{pct(share)} of {total:g} requests ended at the output limit (vllm:request_success by "
                         "finished_reason; no per-request data, so caps and examples are unknown)."}
    if share >= p["critical_share"]:
        result["severity"] = "critical"
    return result
