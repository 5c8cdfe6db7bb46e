"""Facts read straight from a recorded run's raw files, without servlens: what the truth matrix is written from.

    python -m tools.truth.raw_facts sample_logs/burst/

Reads the load generator's client log (requests.jsonl: one line per request with the body as sent, the client's
clock and the engine's own `timings` / `usage`) and the scrapes' text (`metrics_*.prom`), and prints the numbers a
reader needs to say what each rule should find: outcomes, finish reasons against caps, cache reuse, how long
requests waited for a slot (client TTFT minus the engine's prompt time), the waiting and running gauges, restarts.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path


def _q(values: list[float], quantile: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(quantile * len(values)))]


def _gauges(folder: Path) -> dict:
    """Max and last value of every llama.cpp / vLLM gauge over the scrape files (plain text parsing)."""
    found: dict[str, list[float]] = {}
    for path in sorted(folder.glob("metrics_*.prom")):
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)", line)
            if m and any(k in m.group(1) for k in ("deferred", "processing", "waiting", "running", "kv_cache", "preempt",
                                                    "prompt_tokens_total", "prefix_cache")):
                found.setdefault(m.group(1), []).append(float(m.group(3)))
    return {k: {"max": max(v), "scrapes": len(v)} for k, v in found.items()}


def facts(folder: Path) -> dict:
    log = folder / "requests.jsonl"
    if log.exists():
        text = log.read_text()
    else:
        import zstandard

        text = zstandard.ZstdDecompressor().stream_reader(open(folder / "requests.jsonl.zst", "rb")).read().decode()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    out: dict = {}
    for run in sorted({r.get("run") for r in rows}, key=str):
        rs = [r for r in rows if r.get("run") == run]
        finish = Counter(r.get("finish_reason") for r in rs)
        status = Counter(r.get("http_status") for r in rs)
        caps = Counter((r.get("body") or {}).get("max_tokens") for r in rs)
        final = [(r.get("stream_final_chunk") or r.get("response") or {}) for r in rs]
        timings = [f.get("timings") or {} for f in final]
        usage = [f.get("usage") or {} for f in final]
        cached = [t.get("cache_n") for t in timings if t.get("cache_n") is not None]
        prompt_n = [t.get("prompt_n", 0) + t.get("cache_n", 0) for t in timings if t.get("prompt_n") is not None]
        completion = [u.get("completion_tokens") for u in usage if u.get("completion_tokens") is not None]
        at_cap = sum(1 for r, u in zip(rs, usage) if u.get("completion_tokens") is not None
                     and (r.get("body") or {}).get("max_tokens") is not None
                     and u["completion_tokens"] >= r["body"]["max_tokens"])
        ttft = [r["ttft_client_s"] for r in rs if r.get("ttft_client_s") is not None]
        waits = [r["ttft_client_s"] - t["prompt_ms"] / 1000 for r, t in zip(rs, timings)
                 if r.get("ttft_client_s") is not None and t.get("prompt_ms") is not None]
        think_in_content = sum(1 for r in rs if "<think>" in (r.get("stream_content") or "")
                               or "<think>" in json.dumps((r.get("response") or {}).get("choices", "")))
        reasoning = sum(1 for r in rs if r.get("stream_reasoning_content")
                        or any((c.get("message") or {}).get("reasoning_content")
                               for c in (r.get("response") or {}).get("choices", [])))
        out[run] = {
            "requests": len(rs), "http_status": dict(status), "finish_reason": dict(finish),
            "caps": {str(k): v for k, v in caps.items()}, "completion_at_cap": at_cap,
            "length_share": round(finish.get("length", 0) / max(1, sum(v for k, v in finish.items() if k)), 3),
            "cached_token_share": round(sum(cached) / sum(prompt_n), 3) if prompt_n and sum(prompt_n) else None,
            "ttft_p50_s": _q(ttft, 0.5), "ttft_max_s": max(ttft) if ttft else None,
            "wait_p50_s": _q(waits, 0.5), "wait_max_s": max(waits) if waits else None,
            "waited_over_0.5s": sum(1 for w in waits if w > 0.5),
            "completion_p50": statistics.median(completion) if completion else None,
            "think_in_content": think_in_content, "reasoning_field_present": reasoning,
            "client_errors": sum(1 for r in rs if r.get("error")),
            "streamed": sum(1 for r in rs if (r.get("body") or {}).get("stream")),
        }
    out["_gauges"] = _gauges(folder)
    return out


if __name__ == "__main__":
    print(json.dumps(facts(Path(sys.argv[1])), indent=1, default=str))
