"""The analyze text report (servlens/render/analyze_text.py): by default one line per fired finding, counts per
rule and a line of workload per run; with verbose the evidence, every check's reason and the full profile."""

from __future__ import annotations

import copy

from conftest import HOSTILE_MODEL, SCRIPT, make_analyze_doc

from servlens.render.analyze_text import finding_headline, render_analyze_text, rule_counts, short_reason

GATEWAY = "http://llama-3-1-8b-instruct-{}.inference.svc.cluster.local:8000/v1"


def _gateway_doc() -> dict:
    """Two runs: one engine run, one gateway run whose timeouts fire per deployment, and a workload profile."""
    doc = make_analyze_doc()
    doc["run"] = ["engine", "gateway"]
    doc["findings"][0]["scope"] = {"run": "engine", "model": HOSTILE_MODEL, "deployment": None}
    doc["findings"][3]["scope"] = {"run": "engine", "model": HOSTILE_MODEL, "deployment": None}
    sl002 = doc["findings"][1]
    sl002["scope"] = {"run": "engine", "model": "llama-3.1-8b", "deployment": None}
    timeouts = []
    for i, (limit, failed) in enumerate([(120.13, 7), (120.2, 3)]):
        timeouts.append({
            "rule": "SL011", "name": "timeouts-at-gateway-limit", "title": "Requests failing at a fixed timeout limit",
            "state": "fired", "severity": "warning",
            "scope": {"run": "gateway", "model": "llama-3.1-8b-instruct", "deployment": GATEWAY.format(i)},
            "summary": f"Timeouts at a fixed limit of about {limit:.2f} s: {failed} failed requests end within 5% "
                       f"below {limit:.2f} s and none of the 4363 requests lasted longer; 100% of them are marked "
                       "as timeouts.",
            "reason": None, "evidence": {"metrics": {"failed_at_limit": failed}}, "examples": [],
            "remediation": "Raise the router timeout above the e2e p99.", "rollback": "Roll back if errors rise.",
            "references": []})
    not_evaluable = [
        {"rule": "SL005", "name": "fallback-contract-mismatch", "state": "not_evaluable", "severity": "warning",
         "scope": {"run": run, "model": "llama-3.1-8b", "deployment": None}, "summary": "",
         "reason": "needs one of: attempts grouped by trace (missing trace_id, attempt); fallback markers (missing "
                   "fallback_from); trace ids (missing trace_id)", "evidence": {}, "examples": []}
        for run in ("engine", "gateway")]
    doc["findings"] = [doc["findings"][0], sl002, *timeouts, *not_evaluable, doc["findings"][3],
                       dict(doc["findings"][2], scope={"run": "engine", "model": "llama-3.1-8b"})]
    doc["workload"] = {
        "summary": ["engine: 1,200 requests; over 59.0 min, peak 42/s in 1 s at 2026-11-28T10:21:07.000Z.",
                    "gateway: 20,000 requests; over 24.0 h."],
        "runs": {
            "engine": {"run": "engine", "requests": 1200, "relative_clock": False, "span_s": 3540.0,
                       "error_share": 0.0,
                       "rate": {"bucket_s": 60.0,
                                "peak_1s": {"start": "2026-11-28T10:21:07.000Z", "end": "2026-11-28T10:21:08.000Z",
                                            "requests": 42, "rate_rps": 42.0},
                                "peak_1min": {"start": "2026-11-28T10:21:00.000Z",
                                              "end": "2026-11-28T10:22:00.000Z", "requests": 300, "rate_rps": 5.0},
                                "peak_window": {"start": "2026-11-28T10:20:00.000Z", "end": "2026-11-28T10:34:45Z",
                                                "length_s": 885.0, "requests": 1800, "rate_rps": 2.0339,
                                                "vs_mean_rate": 6.0}},
                       "lengths": {"per_model": {"columns": ["model", "requests", "prompt p50"],
                                                 "rows": [["llama-3.1-8b", 1200.0, 812.0]]}},
                       "concurrency": {"in_flight_max": 41}},
            "gateway": {"run": "gateway", "requests": 20000, "relative_clock": False, "span_s": 86371.2,
                        "error_share": 0.0088,
                        "rate": {"peak_1s": {"start": "2026-11-27T13:00:57.000Z", "end": "2026-11-27T13:00:58.000Z",
                                             "requests": 5, "rate_rps": 5.0},
                                 "peak_1min": None,
                                 "peak_window": {"start": "2026-11-27T13:50:03.021Z", "end": "2026-11-27T14:20:03Z",
                                                 "length_s": 1800.0, "requests": 848, "rate_rps": 0.4711,
                                                 "vs_mean_rate": 2.035}}},
        },
    }
    return doc


def test_default_text_is_one_line_per_finding_then_counts_per_rule_then_workload():
    text = render_analyze_text(_gateway_doc())
    assert "FIRED (4): severity, rule [run / model / deployment (….inference.svc.cluster.local:8000/v1)]: " \
           "what happened\n" in text
    fired = text[text.index("FIRED (4)"):text.index("CHECKS BY RULE")].splitlines()[1:]
    assert fired == [
        f"  CRITICAL SL004 queue-driven-ttft-spike [engine / {HOSTILE_MODEL}]: TTFT p99 rose to 3.41",
        "           s while TPOT stayed flat",
        "  WARNING  SL002 truncated-by-output-limit [engine / llama-3.1-8b]: 4.2% of requests ended with",
        "           finish_reason=length at max_tokens=256",
        "  WARNING  SL011 timeouts-at-gateway-limit [gateway / llama-3.1-8b-instruct / llama-3-1-8b-instruct-0]:",
        "           Timeouts at a fixed limit of about 120.13 s",
        "  WARNING  SL011 timeouts-at-gateway-limit [gateway / llama-3.1-8b-instruct / llama-3-1-8b-instruct-1]:",
        "           Timeouts at a fixed limit of about 120.20 s",
        "",
    ]
    checks = text[text.index("CHECKS BY RULE"):text.index("WORKLOAD")].splitlines()
    assert checks == [
        "CHECKS BY RULE (8: each rule on each run, model and deployment)",
        ("  SL001 prefix-cache-off: 0 fired, 0 clear, 1 not evaluable (no cached-token field and no prefix-cache "
         "metric"),
        f"    in these sources {SCRIPT})",
        "  SL002 truncated-by-output-limit: 1 fired, 0 clear, 0 not evaluable",
        "  SL003 reasoning-leak: 0 fired, 1 clear, 0 not evaluable",
        "  SL004 queue-driven-ttft-spike: 1 fired, 0 clear, 0 not evaluable",
        "  SL005 fallback-contract-mismatch: 0 fired, 0 clear, 2 not evaluable (needs attempts grouped by trace,",
        "    fallback markers or trace ids)",
        "  SL011 timeouts-at-gateway-limit: 2 fired, 0 clear, 0 not evaluable",
        "",
    ]
    workload = text[text.index("WORKLOAD"):].splitlines()
    assert workload == [
        "WORKLOAD",
        "  engine: 1,200 requests over 59.0 min, peak 42/s in 1 s at 2026-11-28T10:21:07.000Z,",
        "    5/s in 1 min at 2026-11-28T10:21:00.000Z, up to 41 in flight",
        "  gateway: 20,000 requests over 24.0 h, peak 5/s in 1 s at 2026-11-27T13:00:57.000Z, 0.9% errors",
        "",
        "Summary: 4 fired (1 critical, 3 warning), 3 not evaluable, 1 clear.",
        "--verbose adds each finding's evidence, examples, what to do and rollback, and the reason of every check.",
    ]
    # The evidence, what to do and the clear/not-evaluable lists are for --verbose (and JSON, Markdown, HTML).
    assert "what to do:" not in text and "CLEAR (" not in text and "evidence:" not in text


def test_verbose_keeps_the_evidence_every_check_and_the_full_workload():
    doc = _gateway_doc()
    text = render_analyze_text(doc, verbose=True)
    assert f"FIRED (4)\n  CRITICAL SL004 queue-driven-ttft-spike [run=engine, model={HOSTILE_MODEL}]\n" in text
    assert "    what to do: Raise the router timeout above the e2e p99.\n" in text
    assert "    evidence: failed_at_limit=7\n" in text
    assert ("NOT EVALUABLE (3): these checks had no data to judge; they are not clear\n"
            "  SL005 fallback-contract-mismatch [run=engine, model=llama-3.1-8b]: needs one of: attempts grouped by"
            ) in text
    assert (f"CLEAR (1)\n  SL003 reasoning-leak [run=engine, model={HOSTILE_MODEL}]: No reasoning markers in\n"
            "  content.\n") in text
    workload = text[text.index("WORKLOAD"):]
    assert ("  engine: 1,200 requests; over 59.0 min, peak 42/s in 1 s at 2026-11-28T10:21:07.000Z.\n"
            "    rate: bucket_s=60\n"
            "      peak_1s: start=2026-11-28T10:21:07.000Z, end=2026-11-28T10:21:08.000Z, requests=42, rate_rps=42\n"
            "      peak_1min: start=2026-11-28T10:21:00.000Z, end=2026-11-28T10:22:00.000Z, requests=300, rate_rps=5\n"
            ) in workload
    assert ("    lengths:\n      per model:\n        model         requests  prompt p50\n"
            "        llama-3.1-8b  1200      812\n") in workload
    assert ("  gateway: 20,000 requests; over 24.0 h.\n    rate: peak_1min=n/a\n"
            "      peak_1s: start=2026-11-27T13:00:57.000Z") in workload
    assert "--verbose adds" not in text


def test_many_runs_are_cut_in_the_default_workload_only():
    doc = _gateway_doc()
    engine = doc["workload"]["runs"]["engine"]
    doc["workload"]["runs"] = {f"r{i}": dict(copy.deepcopy(engine), run=f"r{i}") for i in range(30)}
    doc["workload"]["summary"] = [f"r{i}: 1,200 requests." for i in range(30)]
    text = render_analyze_text(doc)
    assert text.count("  r") == 12 and "  … and 18 more runs (--verbose lists every one)\n" in text
    assert render_analyze_text(doc, verbose=True).count("requests.\n") == 30


def test_reasons_and_headlines_in_a_few_words():
    assert short_reason("needs one of: per-request queue time (missing queue_s); per-request prefill time (missing "
                        "prefill_s); vLLM waiting-requests gauge (missing vllm:num_requests_waiting); llama.cpp "
                        "deferred-requests gauge (missing llamacpp:requests_deferred)") == (
        "needs per-request queue time, per-request prefill time or one of 2 other sources")
    assert short_reason("needs vLLM KV usage gauge (missing vllm:kv_cache_usage_perc)") == "needs vLLM KV usage gauge"
    assert short_reason("only 11 successful requests with TTFT; the rule needs at least 20 (min_requests)") == (
        "only 11 successful requests with TTFT")
    # A long first clause that opens with its own headline is cut to it; a bare label keeps its numbers.
    assert finding_headline({"summary": "Prefix cache ineffective: 100% of requests share their leading 2,048 "
                                        "characters with another request, yet the repeats' cached tokens are 0%; "
                                        "more"}) == "Prefix cache ineffective"
    assert finding_headline({"summary": "Context overflow: 2 request(s) rejected for context length against a "
                                        "32,768-token context: ContextWindowExceededError (0.2% of 1289 requests)."
                             }) == ("Context overflow: 2 request(s) rejected for context length against a "
                                    "32,768-token context: ContextWindowExceededError (0.2% of 1289 requests)")
    # Reasons that differ by scope: the commonest, and where the others are.
    checks = [{"rule": "SL008", "name": "hol", "state": "not_evaluable", "reason": r}
              for r in ("only 11 requests; needs 20", "only 11 requests; needs 20", "0 short requests waited")]
    assert rule_counts(checks + [{"rule": "SL008", "name": "hol", "state": "clear"}]) == [
        "SL008 hol: 0 fired, 1 clear, 3 not evaluable (2 of 3: only 11 requests; --verbose lists the others' reasons)"]
