"""Regenerate sample_logs/: scenario folders recorded from the real llama.cpp server by this harness.

    python -m tools.engine.make_sample_logs            # all folders (~3 minutes on 2 cores)
    python -m tools.engine.make_sample_logs burst      # only the folders of these scenarios

Each run of a scenario becomes one folder (``sample_logs/<folder>/``) holding the request log, the /metrics scrapes
with their index, the engine's /props, /v1/models and end-of-run /slots answers and its server log, and a README
saying what happened — with the numbers measured from this recording — and what servlens should find. The times
and the gibberish text change from one recording to the next; the shapes (cache hits, waits, finish reasons,
markers) do not. Folders of other scenarios, and anything else in sample_logs/, are left alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .scenarios import SCENARIOS, run_scenario

REPO = Path(__file__).resolve().parents[2]
SAMPLE_LOGS = REPO / "sample_logs"

# run -> folder name in sample_logs/ (the names the README and `servlens --help` use)
FOLDERS = {
    "prefix_nocache": "prefix-cache-off",
    "prefix_cache": "prefix-cache-on",
    "burst": "burst",
    "steady_a": "steady-a",
    "steady_b": "steady-b",
    "max_tokens": "max-tokens",
    "reasoning_none": "reasoning-none",
    "reasoning_deepseek": "reasoning-deepseek",
    "mixed": "mixed",
}
SAMPLE_SCENARIOS = ("prefix", "burst", "steady_ab", "max_tokens", "reasoning", "mixed")

# What servlens should find, per run (the README's second half).
EXPECT = {
    "prefix_nocache": "SL001 (prefix cache disabled or ineffective) fires: every request shares the long system "
                      "prompt, yet none reuses it. Prefill of the whole prompt on every request also makes requests "
                      "wait for a slot, so SL004 may fire too — the cache-off incident seen from the queue side. "
                      "`servlens compare sample_logs/prefix-cache-off/ sample_logs/prefix-cache-on/` shows TTFT "
                      "falling.",
    "prefix_cache": "SL001 is clear: the shared prefix is served from the slots' KV cache (cached tokens are most "
                    "of each prompt).",
    "burst": "SL004 (queue-driven TTFT spike) fires on the burst windows: client TTFT minus `timings.prompt_ms` (the "
             "slot wait) is most of the slow requests' TTFT, and `llamacpp:requests_deferred` rises in the scrapes.",
    "steady_a": "SL004 is clear (waits stay short). `servlens compare sample_logs/steady-a/ sample_logs/steady-b/` "
                "does not fail: the two runs are the same workload.",
    "steady_b": "Same as steady-a: SL004 clear; compare against steady-a does not fail.",
    "max_tokens": "SL002 (length-limit finishes) fires: max_tokens=24 sits inside the model's answer lengths, so "
                  "about half of the capped requests end by `length`; the requests capped at 512 do not.",
    "reasoning_none": "SL003 (reasoning/content leakage) fires: `<think>` and `</think>` are in the answers' "
                      "content, because the server does not split reasoning out (`--reasoning-format none`).",
    "reasoning_deepseek": "SL003 is clear: with a thinking chat template and `--reasoning-format deepseek`, the "
                          "thought is in `reasoning_content` and the content holds only the answer.",
    "mixed": "A production-like mix to explore: HTTP 400 rows (`exceed_context_size_error`, prompts longer than a "
             "slot's 2,048-token context), cached tokens on the requests that share the system prompt, a stop/length "
             "mix across max_tokens, streamed and non-streamed, chat and text completions.",
}


def _final(rec: dict) -> dict:
    return rec.get("response") or rec.get("stream_final_chunk") or {}


def measured(run_dir: Path, run: str) -> list[str]:
    """Facts measured from the recorded log, for the README."""
    recs = [json.loads(line) for line in open(run_dir / "requests.jsonl", encoding="utf-8")]
    ok = [r for r in recs if r.get("http_status") == 200]
    status: dict = {}
    for r in recs:
        status[str(r.get("http_status"))] = status.get(str(r.get("http_status")), 0) + 1
    finish: dict = {}
    for r in ok:
        finish[str(r.get("finish_reason"))] = finish.get(str(r.get("finish_reason")), 0) + 1
    span = max(r["end_ts"] for r in recs) - min(r["send_ts"] for r in recs)
    def counts(d: dict) -> str:
        return ", ".join(f"{k} × {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))

    lines = [f"- {len(recs)} requests over {span:.0f} s ({sum(1 for r in recs if r['body'].get('stream'))} streamed); "
             f"HTTP status: {counts(status)}; finish reasons: {counts(finish)}."]
    timings = [_final(r).get("timings") for r in ok if _final(r).get("timings")]
    if timings:
        cached = sum(t["cache_n"] for t in timings)
        total = sum(t["cache_n"] + t["prompt_n"] for t in timings)
        lines.append(f"- Prompt tokens {total}, of which reused from the KV cache {cached} ({cached / total:.0%}); "
                     f"median prefill (timings.prompt_ms) {statistics.median(t['prompt_ms'] for t in timings):.0f} "
                     f"ms.")
    waits = [r["ttft_client_s"] - _final(r)["timings"]["prompt_ms"] / 1000 for r in ok
             if r.get("ttft_client_s") is not None and _final(r).get("timings")]
    ttfts = [r["ttft_client_s"] for r in ok if r.get("ttft_client_s") is not None]
    if ttfts:
        lines.append(f"- Client TTFT (streams with a content chunk, n={len(ttfts)}): median "
                     f"{statistics.median(ttfts):.3f} s, max {max(ttfts):.3f} s; slot wait (TTFT minus prompt_ms): "
                     f"median {statistics.median(waits):.3f} s, max {max(waits):.3f} s.")
    with_marker = [r for r in ok if "<think>" in (((r.get("response") or {}).get("choices") or [{}])[0]
                                                  .get("message", {}).get("content") or "")]
    with_reasoning = [r for r in ok if (((r.get("response") or {}).get("choices") or [{}])[0]
                                        .get("message", {}).get("reasoning_content"))]
    if with_marker or with_reasoning:
        n = sum(1 for r in ok if not r["body"].get("stream"))
        lines.append(f"- Non-streamed answers: {len(with_marker)} of {n} have `<think>` in content, "
                     f"{len(with_reasoning)} have reasoning_content.")
    return lines


def write_readme(folder: Path, run: str, scenario, spec) -> None:
    flags = asdict(spec.server)
    text = [
        f"# {folder.name} — run `{run}` of scenario `{scenario.name}`",
        "",
        "Recorded from a real llama.cpp server (the `xllamacpp` wheel) serving a tiny random-weight model generated "
        "from a seed by `tools/engine/model.py` (so the text is gibberish; timings, usage, cache hits, queueing and "
        "finish reasons are the engine's own). Regenerate with `python -m tools.engine.make_sample_logs "
        f"{scenario.name}`.",
        "",
        "## What happened",
        "",
        scenario.description,
        "",
        f"Engine: `--parallel {flags['parallel']} --ctx-size {flags['ctx_size']} --reasoning-format "
        f"{flags['reasoning_format']} --metrics`, chat template `{spec.template}`; this run: {spec.note}.",
        "",
        *measured(folder, run),
        "",
        "## What servlens should find",
        "",
        EXPECT[run],
        "",
        "## Files",
        "",
        "- `requests.jsonl` — one line per request, as a gateway would log it: the request body, client times "
        "(Unix s: `send_ts`, `first_token_ts`, `end_ts`, …), `http_status`, `finish_reason`, and the response or the "
        "final stream chunk with `usage` and llama.cpp `timings`. See tools/engine/load.py for every key.",
        f"- `metrics_{run}_NNN.prom` + `metrics_index.jsonl` — `/metrics` scraped about once a second, with the "
        "scrape time.",
        f"- `props.json`, `models.json`, `slots_{run}_end.json` — the engine's `/props`, `/v1/models`, and `/slots` "
        "after the run; `engine.log` — the server's own log.",
        "",
    ]
    (folder / "README.md").write_text("\n".join(text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.engine.make_sample_logs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", default=list(SAMPLE_SCENARIOS), help="scenarios to (re)record")
    ap.add_argument("--dest", type=Path, default=SAMPLE_LOGS)
    ap.add_argument("--readme-only", action="store_true", help="rewrite the READMEs of the existing folders")
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.readme_only:
        for name in args.scenarios:
            for spec in SCENARIOS[name].runs:
                write_readme(args.dest / FOLDERS[spec.run], spec.run, SCENARIOS[name], spec)
        return 0
    with tempfile.TemporaryDirectory(prefix="servlens-samples-") as tmp:
        for name in args.scenarios:
            scenario = SCENARIOS[name]
            summaries = run_scenario(name, Path(tmp))
            for spec, summary in zip(scenario.runs, summaries):
                folder = args.dest / FOLDERS[spec.run]
                if folder.exists():
                    shutil.rmtree(folder)
                shutil.copytree(Path(tmp) / spec.run, folder)
                write_readme(folder, spec.run, scenario, spec)
                print(f"{folder}: {summary['requests']} requests", file=sys.stderr)
    print(f"sample logs written in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
