"""SL003 reasoning/content leakage.

Reads the leak flags ingest computes from the text before dropping it (content_empty, content_has_reasoning_marker,
reasoning_present, reasoning_has_marker) with finish_reason and reasoning_tokens. Patterns (reference/engines.md D3):

- markers_in_content: `<think>`/`</think>` (or another parser's tag) in the answer: no parser, the wrong parser, or
  llama.cpp `--reasoning-format none|deepseek-legacy`;
- truncated_thought_in_content: finish length, no reasoning, non-empty content, on a model that otherwise returns
  reasoning: a parser that sends a thought without its end tag to content (vLLM qwen3 parser before PR #35230);
- answer_swallowed_into_reasoning: finish stop, empty content, reasoning present without markers (deepseek_r1-style
  parser with thinking disabled);
- answer_inside_reasoning: finish stop, empty content, and reasoning that carries the markers: thought, end tag and
  answer all went to the reasoning field (a streaming parser that decides by token ids and missed the end tag);
- reasoning_missing: a thinking model (reasoning tokens reported, or a name in `thinking_models`) with no reasoning on
  any response while content is non-empty: the template puts `<think>` in the prompt and the parser needs the start tag;
- stream_mode_disagreement: reasoning split on (nearly) every streamed response and missing on (nearly) every
  non-streamed one, or the reverse: the parser's two paths disagree.

The share of requests showing any pattern fires the rule; the co-occurrence with length finishes is reported.
"""

from __future__ import annotations

import fnmatch

from servlens.analysis.detectors._common import chart, not_evaluable, pct, ratio, rounded, table
from servlens.analysis.runner import DetectorContext

PATTERNS = {
    "markers_in_content": (
        "content_has_reasoning_marker",
        "reasoning markers (<think>, </think>) in the answer",
        "no reasoning parser, a parser that does not match the model, or llama.cpp --reasoning-format none / "
        "deepseek-legacy",
    ),
    "truncated_thought_in_content": (
        "finish_reason = 'length' AND reasoning_present = false AND content_empty = false AND {thinking}",
        "a thought cut by the output limit returned as the answer",
        "the reasoning parser sends a thought without its end tag to content (vLLM qwen3 parser before PR #35230, "
        "also seen in omlx, Rapid-MLX, lmdeploy)",
    ),
    "answer_swallowed_into_reasoning": (
        "finish_reason = 'stop' AND content_empty = true AND reasoning_present = true "
        "AND NOT coalesce(reasoning_has_marker, false)",
        "the answer swallowed into reasoning (content empty, finish stop)",
        "a deepseek_r1-style parser with thinking disabled (enable_thinking=false) puts the answer in reasoning",
    ),
    # The end tag is in the reasoning field, so the model did close its thought: the parser did not split there.
    "answer_inside_reasoning": (
        "finish_reason = 'stop' AND content_empty = true AND reasoning_has_marker = true",
        "the answer inside the reasoning field with its markers (content empty, finish stop)",
        "the streaming reasoning parser missed the end tag (vLLM's parsers split a stream by token ids: a </think> "
        "that arrives as text, across deltas or spelled with ordinary tokens is not seen) and sent thought, tag and "
        "answer to reasoning; use the parser that matches the model's tokenizer, or compare with stream=false",
    ),
    "stream_mode_disagreement": (
        "(set per scope)",
        "reasoning split in one of streaming / non-streaming and missing in the other",
        "the parser's streaming and non-streaming paths disagree (vLLM #35221 class); follow the path that splits "
        "correctly and upgrade the parser",
    ),
    "reasoning_missing": (
        "reasoning_present = false AND content_empty = false AND {missing_everywhere}",
        "no reasoning on any response of a thinking model",
        "the chat template puts <think> in the prompt and the parser needs the start tag (use the deepseek_r1 parser, "
        "or llama.cpp --jinja with --reasoning-format deepseek)",
    ),
}


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    known_where = "(content_has_reasoning_marker IS NOT NULL OR (content_empty IS NOT NULL AND reasoning_present IS NOT NULL))"
    s = ctx.one(f"""SELECT count(*) FILTER (WHERE {known_where}) AS known,
                           count(*) FILTER (WHERE reasoning_present) AS with_reasoning,
                           count(*) FILTER (WHERE reasoning_tokens > 0) AS with_reasoning_tokens,
                           count(*) FILTER (WHERE content_has_reasoning_marker) AS with_markers,
                           count(*) FILTER (WHERE reasoning_has_marker) AS reasoning_with_markers,
                           count(*) FILTER (WHERE reasoning_has_marker AND content_empty = false) AS markers_beside_answer,
                           count(*) FILTER (WHERE finish_reason = 'length') AS length_n,
                           count(*) FILTER (WHERE finish_reason IS NOT NULL) AS finish_known
                    FROM scope_requests""")
    known = s["known"]
    if known < p["min_requests"]:
        return not_evaluable(f"only {known} requests with leak flags (content_has_reasoning_marker, content_empty, "
                             f"reasoning_present); the rule needs at least {p['min_requests']} (min_requests)",
                             "Too few responses with leak flags to judge reasoning leakage.")
    model = ctx.scope.model or ""
    named_thinking = any(fnmatch.fnmatch(model.lower(), pattern.lower()) for pattern in p["thinking_models"])
    reasons_somewhere = bool(s["with_reasoning"] or s["with_reasoning_tokens"] or s["with_markers"])
    # Reasoning never present, yet the model thinks: reasoning tokens reported, or a known thinking model's name.
    missing_everywhere = not s["with_reasoning"] and (bool(s["with_reasoning_tokens"]) or named_thinking)
    thinking = "TRUE" if (s["with_reasoning"] or s["with_reasoning_tokens"]) else "FALSE"
    missing_sql = "TRUE" if missing_everywhere else "FALSE"
    patterns = {name: where.format(thinking=thinking, missing_everywhere=missing_sql)
                for name, (where, _, _) in PATTERNS.items() if name != "stream_mode_disagreement"}
    if not ctx.has("reasoning_present"):
        # Only marker flags known: the other patterns need reasoning_present.
        patterns = {"markers_in_content": patterns["markers_in_content"]}
    elif ctx.has("stream"):
        # Streaming and non-streaming take different parser paths (vLLM #35221 class): reasoning split on one path
        # and missing on the other for the same model is a parser bug on the path where it is missing.
        modes = {r["stream"]: r for r in ctx.rows(
            """SELECT stream, count(*) AS n, avg(CASE WHEN reasoning_present THEN 1.0 ELSE 0.0 END) AS share
               FROM scope_requests WHERE stream IS NOT NULL AND reasoning_present IS NOT NULL
                 AND content_empty = false GROUP BY stream""")}
        if len(modes) == 2 and min(m["n"] for m in modes.values()) >= p["min_leak_requests"]:
            low = min(modes.values(), key=lambda m: m["share"])
            high = max(modes.values(), key=lambda m: m["share"])
            if high["share"] >= 0.8 and low["share"] <= 0.2:
                patterns["stream_mode_disagreement"] = (
                    f"stream = {'true' if low['stream'] else 'false'} AND reasoning_present = false AND content_empty = false")
    counts = ", ".join(
        f"count(*) FILTER (WHERE {where}) AS {name}, "
        f"count(*) FILTER (WHERE ({where}) AND finish_reason = 'length') AS {name}_length"
        for name, where in patterns.items())
    any_leak = " OR ".join(f"({w})" for w in patterns.values())
    c = ctx.one(f"""SELECT {counts}, count(*) FILTER (WHERE {any_leak}) AS leaking,
                           count(*) FILTER (WHERE ({any_leak}) AND finish_reason = 'length') AS leaking_length
                    FROM scope_requests WHERE {known_where}""")
    leaking = c["leaking"]
    share = leaking / known
    length_share = ratio(s["length_n"], s["finish_known"])
    leak_length_share = ratio(c["leaking_length"], leaking)
    metrics = {"requests": known, "leaking": leaking, "leak_share": rounded(share),
               "responses_with_reasoning": s["with_reasoning"], "reasoning_with_markers": s["reasoning_with_markers"],
               "thinking_model": bool(reasons_somewhere or named_thinking),
               "leaks_with_length_finish_share": rounded(leak_length_share),
               "length_finish_share_all": rounded(length_share), "target_leak_share": p["max_leak_share"]}
    rows = []
    for name in patterns:
        metrics[name] = c[name]
        if c[name]:
            rows.append([name, c[name], c[name] / known, ratio(c[f"{name}_length"], c[name]), PATTERNS[name][2]])
    thresholds = {k: p[k] for k in ("max_leak_share", "min_leak_requests", "min_requests")}
    the_chart = chart("bar", "Responses showing each leak pattern", "pattern", "requests",
                      [{"name": "requests", "x": list(patterns), "y": [c[n] for n in patterns]}])
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart,
                "table": table(["pattern", "requests", "share", "with finish length", "likely cause"], rows)}
    if share < p["max_leak_share"] or leaking < p["min_leak_requests"]:
        note = (f"; {s['markers_beside_answer']} reasoning fields still carry their tags beside the answer (cosmetic)"
                if s["markers_beside_answer"] else "")
        return {"state": "clear",
                "summary": f"No reasoning leakage: {leaking} of {known} responses ({pct(share, 2)}) show a leak pattern "
                           f"(line: {pct(p['max_leak_share'], 2)} and at least {p['min_leak_requests']}){note}.",
                "evidence": evidence}
    main = max(rows, key=lambda r: r[1])
    parts = [f"{pct(share, 1)} of {known} responses leak reasoning into content or content into reasoning"]
    for name, n, pshare, with_length, _ in sorted(rows, key=lambda r: -r[1]):
        parts.append(f"{PATTERNS[name][1]}: {n} ({pct(pshare, 1)})")
    if leak_length_share is not None and length_share is not None:
        parts.append(f"{pct(leak_length_share)} of the leaking responses ended by length (all responses: {pct(length_share)})")
    parts.append(f"likely cause: {main[4]}")
    metrics["main_pattern"] = main[0]
    return {"state": "fired", "summary": "; ".join(parts) + ".", "evidence": evidence,
            "examples": ctx.examples(any_leak, "finish_reason = 'length' DESC, t_at")}
