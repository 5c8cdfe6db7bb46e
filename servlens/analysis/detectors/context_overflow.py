"""SL012 silent truncation and context overflow.

Three marks of requests that do not fit the context they are served with:

- context errors: llama.cpp `exceed_context_size_error` ("request (N tokens) exceeds the available context size
  (C tokens)"), vLLM's "maximum context length is C tokens", LiteLLM `ContextWindowExceededError`, OpenAI
  `context_length_exceeded`; the limit C comes from `context_window` (llama.cpp's error carries n_ctx) or the message;
- answers cut at the context's end: finish `length` below max_tokens with prompt + completion at the limit (llama.cpp
  stops a slot when its context fills; nothing in the response says why);
- prompts at the limit among requests that succeeded: the prompt was truncated to fit (vLLM truncate_prompt_tokens,
  llama.cpp n_keep / context shift), so the model answered without part of it.

llama.cpp divides `--ctx-size` between its `--parallel` slots, so the limit in its errors is one slot's share. With
the slots seen busy at once (`llamacpp:requests_processing`, a lower bound of --parallel) or n_ctx / parallel in the
request attributes, the finding says how many of the rejected requests would have fit the whole context: they fit the
model, not the slot.
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, rounded, table
from servlens.analysis.runner import DetectorContext

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "at_limit_share", "min_affected", "critical_share", "critical_min_requests", "min_requests"
    ],
    "requires": [],
}

CONTEXT_ERROR = """(error_type IN ('exceed_context_size_error', 'ContextWindowExceededError', 'context_length_exceeded')
  OR lower(error_message) LIKE '%exceeds the available context size%'
  OR lower(error_message) LIKE '%maximum context length%'
  OR lower(error_message) LIKE '%context_length_exceeded%'
  OR lower(error_message) LIKE '%context window%exceed%'
  OR lower(error_message) LIKE '%contextwindowexceeded%'
  OR lower(error_message) LIKE '%prompt is too long%'
  OR lower(error_message) LIKE '%input is too long%'
  OR lower(error_message) LIKE '%longer than the model''s context length%'
  OR lower(error_message) LIKE '%tokens + `max_new_tokens` must be <=%')"""
# The limit a context error names, when context_window does not carry it.
# llama.cpp: "request (2329 tokens) exceeds the available context size (2048 tokens)"; vLLM / OpenAI: "maximum context
# length is 2048 tokens. However, your prompt contains at least 2049 input tokens" / "your messages resulted in N
# tokens"; SGLang: "The input (N tokens) is longer than the model's context length (M tokens)"; TGI: "`inputs` tokens +
# `max_new_tokens` must be <= M. Given: N `inputs` tokens"; Anthropic: "prompt is too long: N tokens > M maximum".
LIMIT_FROM_MESSAGE = """coalesce(
  TRY_CAST(regexp_extract(error_message, 'available context size \\((\\d+) tokens\\)', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'maximum context length is (\\d+) tokens', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'context length \\((\\d+) tokens\\)', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'must be <= (\\d+)', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'tokens > (\\d+) maximum', 1) AS BIGINT))"""
PROMPT_FROM_MESSAGE = """coalesce(
  TRY_CAST(regexp_extract(error_message, 'request \\((\\d+) tokens\\)', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'prompt contains at least (\\d+) input tokens', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'resulted in (\\d+) tokens', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'input \\((\\d+) tokens\\)', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'Given: (\\d+) `inputs` tokens', 1) AS BIGINT),
  TRY_CAST(regexp_extract(error_message, 'too long: (\\d+) tokens', 1) AS BIGINT))"""
SLOT_GAUGES = ("llamacpp:requests_processing", "llamacpp:n_busy_slots_per_decode")


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    # Columns absent from a source are NULL in every row, so the expressions need no presence checks.
    # Copied once with the columns read below: through a view, each of the rule's queries filtered the whole
    # requests table to the scope again and re-ran the message patterns.
    ctx.con.execute(f"""
        CREATE OR REPLACE TEMP TABLE sl012_requests AS
        SELECT request_id, provider, status, finish_reason, error_type, error_message, prompt_tokens,
               completion_tokens, max_tokens,
               coalesce({CONTEXT_ERROR}, false) AS is_ctx_error, coalesce(context_window, {LIMIT_FROM_MESSAGE}) AS named_limit,
               coalesce(prompt_tokens, {PROMPT_FROM_MESSAGE}) AS prompt_n
        FROM scope_requests""")
    s = ctx.one("""SELECT count(*) AS n, count(*) FILTER (WHERE is_ctx_error) AS ctx_errors,
                          max(named_limit) AS limit_max, min(named_limit) AS limit_min, count(named_limit) AS limit_n,
                          count(prompt_n) AS with_prompt
                   FROM sl012_requests""")
    if s["n"] < p["min_requests"]:
        return not_evaluable(f"only {s['n']} requests; the rule needs at least {p['min_requests']} (min_requests)",
                             "Too few requests to judge context overflow.")
    limit = s["limit_max"]
    thresholds = {k: p[k] for k in ("at_limit_share", "min_affected", "critical_share", "critical_min_requests",
                                    "min_requests")}
    metrics = {"requests": s["n"], "context_errors": s["ctx_errors"], "context_limit": limit,
               "context_limit_min": s["limit_min"], "requests_naming_the_limit": s["limit_n"]}
    per_request_limit = f"coalesce(named_limit, {limit})" if limit else "named_limit"
    cut = prompts_at = 0
    if limit and ctx.has("prompt_tokens", "completion_tokens"):
        near = f"{per_request_limit} * {p['at_limit_share']}"
        row = ctx.one(f"""SELECT
            count(*) FILTER (WHERE NOT is_ctx_error AND finish_reason = 'length' AND prompt_tokens + completion_tokens >= {near}
                             AND (max_tokens IS NULL OR completion_tokens < max_tokens)) AS cut,
            count(*) FILTER (WHERE NOT is_ctx_error AND coalesce(status, 'ok') = 'ok' AND prompt_tokens >= {near}) AS prompts_at
            FROM sl012_requests""")
        cut, prompts_at = row["cut"], row["prompts_at"]
        metrics |= {"answers_cut_at_context": cut, "prompts_at_limit": prompts_at}
    elif limit and ctx.has("prompt_tokens"):
        prompts_at = ctx.one(f"""SELECT count(*) AS n FROM sl012_requests WHERE NOT is_ctx_error AND coalesce(status, 'ok') = 'ok'
                                 AND prompt_tokens >= {per_request_limit} * {p['at_limit_share']}""")["n"]
        metrics["prompts_at_limit"] = prompts_at
    split = _slot_split(ctx, limit, s["ctx_errors"])
    metrics |= split
    affected = s["ctx_errors"] + cut + prompts_at
    share = affected / s["n"]
    metrics |= {"affected": affected, "affected_share": rounded(share)}
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": _chart(ctx, limit)}
    if affected < p["min_affected"]:
        if limit is None:
            return {"state": "clear", "evidence": evidence,
                    "summary": f"No context errors among {s['n']} requests; the context limit is not in these sources, "
                               "so prompts at the limit (silent truncation) could not be checked."}
        return {"state": "clear", "evidence": evidence,
                "summary": f"No context overflow: no context errors, no answer cut at the {limit:,}-token context and no "
                           f"prompt at it among {s['n']} requests."}

    parts = []
    if s["ctx_errors"]:
        over = ctx.one("""SELECT min(prompt_n) AS lo, max(prompt_n) AS hi, count(prompt_n) AS n,
                                 string_agg(DISTINCT coalesce(error_type, 'error'), ', ') AS types
                          FROM sl012_requests WHERE is_ctx_error""")
        metrics |= {"overflow_prompt_tokens_min": over["lo"], "overflow_prompt_tokens_max": over["hi"],
                    "context_error_types": over["types"]}
        prompts = ("" if not over["n"] else f" (a prompt of {over['lo']:,} tokens)" if over["lo"] == over["hi"]
                   else f" (prompts of {over['lo']:,}-{over['hi']:,} tokens)")
        limit_text = (f" against a {limit:,}-token context" if limit else "")
        parts.append(f"{s['ctx_errors']} request(s) rejected for context length{limit_text}{prompts}: {over['types']}")
    if cut:
        parts.append(f"{cut} answer(s) stopped at the context's end below their max_tokens (finish length, prompt + "
                     f"completion at the limit): silently cut")
    if prompts_at:
        parts.append(f"{prompts_at} successful request(s) with the prompt at the limit (likely truncated to fit)")
    if split.get("fit_whole_context") is not None:
        parts.append(f"llama.cpp splits its context between slots: {split['context_per_slot']:,} tokens per slot x at "
                     f"least {split['slots']} slots = {split['context_total']:,}; {split['fit_whole_context']} of the "
                     f"rejected prompts would fit the whole context, not one slot")
    summary = "Context overflow: " + "; ".join(parts) + f" ({pct(share, 1)} of {s['n']} requests)."
    rows = ctx.rows(f"""SELECT coalesce(error_type, finish_reason) AS kind, count(*) AS n, min(prompt_n) AS lo,
                               max(prompt_n) AS hi, max(named_limit) AS lim
                        FROM sl012_requests WHERE is_ctx_error GROUP BY 1 ORDER BY n DESC LIMIT 10""")
    evidence["table"] = table(["error", "requests", "prompt tokens min", "prompt tokens max", "context limit named"],
                              [[r["kind"], r["n"], r["lo"], r["hi"], r["lim"]] for r in rows])
    cut_where = (f"finish_reason = 'length' AND prompt_tokens + completion_tokens >= {per_request_limit} * {p['at_limit_share']}"
                 if cut else "FALSE")
    result = {"state": "fired", "summary": summary, "evidence": evidence,
              "examples": ctx.examples(f"request_id IN (SELECT request_id FROM sl012_requests WHERE is_ctx_error OR ({cut_where}))",
                                       "prompt_tokens DESC NULLS LAST")}
    # Critical needs many users, not only a share: one over-long prompt among nine requests is a client's mistake.
    if share >= p["critical_share"] and affected >= p["critical_min_requests"]:
        result["severity"] = "critical"
    return result


def _slot_split(ctx: DetectorContext, limit: int | None, ctx_errors: int) -> dict:
    """llama.cpp only: slots seen busy at once (or attrs n_ctx / parallel), the whole context, and the rejected
    requests that would have fit it."""
    if not limit or not ctx_errors:
        return {}
    llama = ctx.one("""SELECT count(*) FILTER (WHERE provider = 'llama.cpp' OR error_type = 'exceed_context_size_error'
                                               OR lower(error_message) LIKE '%exceeds the available context size%') AS n
                       FROM sl012_requests""")["n"]
    if not llama:
        return {}
    slots, source = None, None
    if ctx.has("attrs"):
        row = ctx.one("""SELECT max(TRY_CAST(json_extract_string(attrs, '$.parallel') AS BIGINT)) AS parallel FROM scope_requests""")
        if row["parallel"]:
            slots, source = int(row["parallel"]), "--parallel from the request attributes"
    if slots is None:
        for name in SLOT_GAUGES:
            if name in ctx.metrics_present:
                row = ctx.one("SELECT max(value) AS v FROM scope_metrics WHERE name = ? AND series = 'value'", [name])
                if row["v"] and row["v"] >= 2:
                    slots, source = int(row["v"]), f"max {name} (a lower bound of --parallel)"
                    break
    if slots is None:
        return {}
    total = limit * slots
    fit = ctx.one(f"SELECT count(*) AS n FROM sl012_requests WHERE is_ctx_error AND prompt_n <= {total}")["n"]
    return {"context_per_slot": limit, "slots": slots, "slots_source": source, "context_total": total,
            "fit_whole_context": fit}


def _chart(ctx: DetectorContext, limit: int | None) -> dict | None:
    """Prompt lengths of requests that were served and of requests rejected for context, with the limit marked."""
    top = ctx.one("SELECT max(prompt_n) AS m FROM sl012_requests")["m"]
    if not top:
        return None
    width = max(1, int(max(top, limit or 0) * 1.05 / 40) + 1)
    rows = ctx.rows(f"""SELECT CAST(floor(prompt_n / {width}) AS INTEGER) AS b,
                               count(*) FILTER (WHERE NOT is_ctx_error) AS served, count(*) FILTER (WHERE is_ctx_error) AS rejected
                        FROM sl012_requests WHERE prompt_n IS NOT NULL GROUP BY 1 ORDER BY 1""")
    x = [(r["b"] + 0.5) * width for r in rows]
    return chart("bar", "Prompt length of served and context-rejected requests", "prompt tokens", "requests", [
        {"name": "served", "x": x, "y": [r["served"] for r in rows]},
        {"name": "rejected for context", "x": x, "y": [r["rejected"] for r in rows]},
    ], vspans=[{"x0": limit, "x1": limit + width / 4, "label": f"context limit {limit:,}"}] if limit else [])
