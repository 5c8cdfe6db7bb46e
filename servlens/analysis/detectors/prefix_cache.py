"""SL001 prefix cache disabled or ineffective.

Precondition first: do requests share leading content? From `prefix_key` (hash of the first 2,048 characters of the
prompt as sent) the requests whose key was seen before are "repeats": a working prefix cache serves their shared
part from the KV cache. Sources with block hashes (Mooncake `hash_ids`, kept as attrs.prefix_blocks) give the share
of prompt blocks that an earlier request already had. Without sharing a 0% hit rate is expected: clear.

Then the hit signal, in this order of strength:
1. per request: the repeats' cached_tokens / prompt_tokens (vLLM with --enable-prompt-tokens-details, llama.cpp
   `cache_n` / prompt_tokens_details, SGLang with --enable-cache-report); NULL is unknown, never 0;
2. vLLM counters over the run: prefix_cache_queries flat while prompt_tokens grows (caching off: the lookup is
   skipped), or prefix_cache_hits / prefix_cache_queries below the line (on but ineffective); both in tokens since
   vLLM 0.9 (blocks before: a ratio either way);
3. vLLM cache_config_info{enable_prefix_caching="False"}.

Block-size caveat: a shared prefix shorter than one KV block cannot hit, so prefix groups whose shortest prompt is
under the block size are left out (vLLM's block_size label, else the `block_size` parameter).
"""

from __future__ import annotations

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, ratio, rounded, secs, table
from servlens.analysis.runner import DetectorContext

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_shared_share", "min_repeat_requests", "max_hit_rate", "expected_hit_rate", "block_size",
        "trace_block_tokens"
    ],
    "requires": [],
}

BLOCKS_EXPR = "CAST(json_extract(attrs, '$.prefix_blocks') AS BIGINT[])"


def _config(ctx: DetectorContext) -> dict:
    """The last cache_config_info labels (enable_prefix_caching, block_size), if scraped."""
    if not ctx.has_metric("vllm:cache_config_info"):
        return {}
    row = ctx.one("""SELECT labels['enable_prefix_caching'] AS enabled, labels['block_size'] AS block_size
                     FROM scope_metrics WHERE name = 'vllm:cache_config_info' ORDER BY ts DESC LIMIT 1""")
    return row or {}


def _sharing_by_key(ctx: DetectorContext, block_size: int) -> dict:
    return ctx.one(f"""
        WITH g AS (
            SELECT prefix_key, count(*) AS n, min(prompt_tokens) AS shortest
            FROM scope_requests WHERE prefix_key IS NOT NULL GROUP BY prefix_key)
        SELECT sum(n) AS keyed,
               sum(CASE WHEN n >= 2 AND (shortest IS NULL OR shortest >= {block_size}) THEN n ELSE 0 END) AS shared,
               sum(CASE WHEN n >= 2 AND (shortest IS NULL OR shortest >= {block_size}) THEN n - 1 ELSE 0 END) AS repeats,
               sum(CASE WHEN n >= 2 AND shortest < {block_size} THEN n ELSE 0 END) AS too_short,
               count(CASE WHEN n >= 2 THEN 1 END) AS groups
        FROM g""")


def _sharing_by_blocks(ctx: DetectorContext) -> dict:
    """Share of prompt blocks (and of requests) that an earlier request already had (unbounded cache)."""
    return ctx.one(f"""
        WITH r AS (
            SELECT row_number() OVER (ORDER BY t_at, source_line, request_id) AS seq, {BLOCKS_EXPR} AS blocks
            FROM scope_requests WHERE json_extract(attrs, '$.prefix_blocks') IS NOT NULL),
        b AS (SELECT seq, unnest(blocks) AS block FROM r),
        firsts AS (SELECT block, min(seq) AS first_seq FROM b GROUP BY block),
        marked AS (SELECT b.seq, b.seq > f.first_seq AS reused FROM b JOIN firsts f USING (block))
        SELECT count(*) AS blocks, sum(CASE WHEN reused THEN 1 ELSE 0 END) AS reused_blocks,
               count(DISTINCT seq) AS requests,
               count(DISTINCT CASE WHEN reused THEN seq END) AS requests_reusing
        FROM marked""")


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    config = _config(ctx)
    block_size = int(config["block_size"]) if (config.get("block_size") or "").isdigit() else p["block_size"]
    metrics: dict = {"block_size_tokens": block_size}
    thresholds = {k: p[k] for k in ("min_shared_share", "min_repeat_requests", "max_hit_rate", "block_size")}

    # 1. Do requests share prefixes?
    sharing = None          # None = unknown
    share = None
    texts = []
    has_blocks = ctx.has("attrs") and ctx.one(
        "SELECT count(*) AS n FROM scope_requests WHERE json_extract(attrs, '$.prefix_blocks') IS NOT NULL")["n"]
    if ctx.has("prefix_key"):
        s = _sharing_by_key(ctx, block_size)
        share = ratio(s["shared"], s["keyed"])
        metrics |= {"requests_with_prefix_key": s["keyed"], "shared_prefix_share": rounded(share),
                    "shared_prefix_groups": s["groups"], "repeat_requests": s["repeats"],
                    "requests_in_groups_shorter_than_a_block": s["too_short"]}
        sharing = share is not None and share >= p["min_shared_share"] and s["repeats"] >= p["min_repeat_requests"]
        texts.append(f"{pct(share)} of requests share their leading 2,048 characters with another request")
    if has_blocks:
        b = _sharing_by_blocks(ctx)
        block_share = ratio(b["reused_blocks"], b["blocks"])
        metrics |= {"prompt_blocks": b["blocks"], "reusable_block_share": rounded(block_share),
                    "requests_with_blocks": b["requests"], "requests_reusing_a_block": b["requests_reusing"],
                    "trace_block_tokens": p["trace_block_tokens"]}
        if sharing is None:
            sharing = block_share is not None and block_share >= p["min_shared_share"]
        texts.append(f"{pct(block_share)} of prompt blocks ({p['trace_block_tokens']} tokens each) were already seen "
                     "in an earlier request")
    sharing_text = " and ".join(texts)

    # 2. Hit signals.
    per_request = None
    if sharing and ctx.has("prefix_key", "cached_tokens", "prompt_tokens"):
        per_request = ctx.one(f"""
            WITH r AS (
                SELECT *, row_number() OVER (PARTITION BY prefix_key ORDER BY t_at, source_line, request_id) AS nth,
                       count(*) OVER (PARTITION BY prefix_key) AS n, min(prompt_tokens) OVER (PARTITION BY prefix_key) AS shortest
                FROM scope_requests WHERE prefix_key IS NOT NULL)
            SELECT count(cached_tokens) AS known, sum(cached_tokens) / nullif(sum(CASE WHEN cached_tokens IS NOT NULL THEN prompt_tokens END), 0) AS hit_rate,
                   avg(CASE WHEN cached_tokens IS NULL THEN NULL WHEN cached_tokens < {block_size} THEN 1.0 ELSE 0.0 END) AS miss_share,
                   {q('ttft_s', 0.5)} AS ttft_p50, {q('ttft_s', 0.99)} AS ttft_p99,
                   {q('prompt_tokens', 0.5)} AS prompt_p50, {q('prefill_s', 0.5)} AS prefill_p50
            FROM r WHERE nth > 1 AND n >= 2 AND (shortest IS NULL OR shortest >= {block_size})""")
        if not per_request["known"]:
            per_request = None
    counters = {}
    if ctx.has_metric("vllm:prefix_cache_queries", "vllm:prompt_tokens"):
        counters = {"queries": ctx.counter_increase("vllm:prefix_cache_queries"),
                    "hits": ctx.counter_increase("vllm:prefix_cache_hits") if ctx.has_metric("vllm:prefix_cache_hits") else None,
                    "prompt": ctx.counter_increase("vllm:prompt_tokens")}
        metrics |= {"metric_prefix_cache_queries_increase": counters["queries"],
                    "metric_prefix_cache_hits_increase": counters["hits"],
                    "metric_prompt_tokens_increase": counters["prompt"],
                    "metric_hit_rate": rounded(ratio(counters["hits"], counters["queries"]))}
    if config.get("enabled") is not None:
        metrics["cache_config_enable_prefix_caching"] = config["enabled"]
    config_off = str(config.get("enabled", "")).lower() == "false"
    counters_flat = bool(counters.get("prompt")) and counters.get("queries") == 0
    metric_hit_rate = ratio(counters.get("hits"), counters.get("queries"))

    off_signals = []
    if config_off:
        off_signals.append("vllm:cache_config_info says enable_prefix_caching=False")
    if counters_flat:
        off_signals.append(f"vllm:prefix_cache_queries stayed flat while {counters['prompt']:g} prompt tokens were processed")

    if sharing is None:
        if off_signals:
            return not_evaluable(
                "prefix caching looks off (" + "; ".join(off_signals) + "), but without prefix_key or block hashes in "
                "request logs servlens cannot tell whether requests share prefixes",
                "Prefix caching is off; whether it matters depends on shared prefixes, which these sources do not show.",
                {"metrics": metrics, "thresholds": thresholds})
        if metric_hit_rate is not None and metric_hit_rate > p["max_hit_rate"]:
            return {"state": "clear", "summary": f"The prefix cache works: vLLM counters show a {pct(metric_hit_rate)} hit rate.",
                    "evidence": {"metrics": metrics, "thresholds": thresholds}}
        return not_evaluable("no prefix_key and no block hashes in the request logs, so servlens cannot tell whether "
                             "requests share prefixes (a low hit rate is normal when they do not)",
                             "Cannot tell whether requests share prefixes.", {"metrics": metrics, "thresholds": thresholds})
    if not sharing:
        return {"state": "clear",
                "summary": f"Requests do not share prefixes enough for a prefix cache to matter: {sharing_text} "
                           f"(the line is {pct(p['min_shared_share'])} with at least {p['min_repeat_requests']} repeats).",
                "evidence": {"metrics": metrics, "thresholds": thresholds}}

    # Sharing established: judge the hit rate.
    if per_request:
        hit_rate = per_request["hit_rate"]
        metrics |= {"hit_rate": rounded(hit_rate), "repeat_miss_share": rounded(per_request["miss_share"]),
                    "repeat_requests_with_cached_tokens": per_request["known"],
                    "cohort_ttft_p50_s": rounded(per_request["ttft_p50"]), "cohort_ttft_p99_s": rounded(per_request["ttft_p99"]),
                    "cohort_prompt_tokens_p50": rounded(per_request["prompt_p50"]),
                    "cohort_prefill_p50_s": rounded(per_request["prefill_p50"]),
                    "cohort_ttft_ms_per_1k_prompt_tokens": rounded(1e6 * ratio(per_request["ttft_p50"], per_request["prompt_p50"]))
                    if per_request["ttft_p50"] is not None and per_request["prompt_p50"] else None}
        failing = hit_rate is not None and hit_rate <= p["max_hit_rate"]
        hit_text = f"the repeats' cached tokens are {pct(hit_rate, 1)} of their prompt tokens"
    elif off_signals or metric_hit_rate is not None:
        hit_rate = 0.0 if off_signals else metric_hit_rate
        metrics["hit_rate"] = rounded(hit_rate)
        failing = bool(off_signals) or metric_hit_rate <= p["max_hit_rate"]
        hit_text = "; ".join(off_signals) if off_signals else f"vLLM counters show a {pct(metric_hit_rate, 1)} hit rate"
    else:
        return not_evaluable(
            "requests share prefixes, but there is no cached_tokens field and no prefix-cache metric "
            "(vllm:prefix_cache_queries, vllm:cache_config_info), so the hit rate is unknown",
            f"Prefix sharing found ({sharing_text}); the cache hit rate cannot be judged from these sources.",
            {"metrics": metrics, "thresholds": thresholds})
    metrics["expected_hit_rate"] = p["expected_hit_rate"]
    if off_signals and per_request:
        hit_text += "; " + "; ".join(off_signals)

    caveat = (f"A shared prefix shorter than one KV block ({block_size} tokens) cannot hit"
              + (f"; {metrics['requests_in_groups_shorter_than_a_block']} requests in such groups were left out"
                 if metrics.get("requests_in_groups_shorter_than_a_block") else "") + ".")
    if not failing:
        return {"state": "clear",
                "summary": f"The prefix cache works: {sharing_text}, and {hit_text}.",
                "evidence": {"metrics": metrics, "thresholds": thresholds}}

    summary = f"Prefix cache {'disabled' if off_signals else 'ineffective'}: {sharing_text}, yet {hit_text}"
    if per_request and per_request["ttft_p50"] is not None:
        summary += (f"; those requests take {secs(per_request['ttft_p50'])} to first token at a median "
                    f"{per_request['prompt_p50']:.0f} prompt tokens")
    summary += ". " + caveat
    result = {"state": "fired", "summary": summary,
              "evidence": {"metrics": metrics, "thresholds": thresholds}}
    if per_request:
        result["evidence"]["chart"] = _scatter(ctx, block_size)
        result["evidence"]["table"] = _groups_table(ctx, block_size)
        result["examples"] = ctx.examples(
            f"""prefix_key IS NOT NULL AND cached_tokens IS NOT NULL AND cached_tokens < {block_size}
                AND prefix_key IN (SELECT prefix_key FROM scope_requests GROUP BY prefix_key HAVING count(*) >= 2)""",
            "ttft_s DESC NULLS LAST")
    return result


def _scatter(ctx: DetectorContext, block_size: int) -> dict:
    """TTFT against prompt length, repeats with and without a hit and first-of-prefix requests (<= 300 points each)."""
    found = ctx.rows(f"""
        WITH r AS (
            SELECT prompt_tokens, ttft_s, request_id,
                   CASE WHEN row_number() OVER (PARTITION BY prefix_key ORDER BY t_at, source_line, request_id) = 1
                             THEN 'first of its prefix'
                        WHEN cached_tokens >= {block_size} THEN 'repeated prefix, cache hit'
                        ELSE 'repeated prefix, no cache hit' END AS cohort
            FROM scope_requests WHERE prefix_key IS NOT NULL AND cached_tokens IS NOT NULL),
        ranked AS (SELECT *, row_number() OVER (PARTITION BY cohort ORDER BY hash(request_id)) AS k FROM r
                   WHERE prompt_tokens IS NOT NULL AND ttft_s IS NOT NULL)
        SELECT cohort, list(prompt_tokens ORDER BY prompt_tokens) AS x, list(ttft_s ORDER BY prompt_tokens) AS y
        FROM ranked WHERE k <= 300 GROUP BY cohort ORDER BY cohort""")
    series = [{"name": row["cohort"], "x": row["x"], "y": [rounded(v) for v in row["y"]]} for row in found]
    return chart("scatter", "TTFT against prompt length, by prefix reuse", "prompt tokens", "TTFT (s)", series)


def _groups_table(ctx: DetectorContext, block_size: int) -> dict:
    found = ctx.rows(f"""
        SELECT substr(prefix_key, 1, 12) AS key, count(*) AS n, {q('prompt_tokens', 0.5)} AS prompt_p50,
               sum(cached_tokens) / nullif(sum(CASE WHEN cached_tokens IS NOT NULL THEN prompt_tokens END), 0) AS hit_rate,
               {q('ttft_s', 0.5)} AS ttft_p50
        FROM scope_requests WHERE prefix_key IS NOT NULL
        GROUP BY prefix_key HAVING count(*) >= 2 ORDER BY n DESC, key LIMIT 10""")
    return table(["prefix key", "requests", "prompt tokens p50", "hit rate", "TTFT p50 (s)"],
                 [[r["key"], r["n"], r["prompt_p50"], r["hit_rate"], r["ttft_p50"]] for r in found])
