"""Reading the harness's raw logs in the e2e tests."""

from __future__ import annotations

from pathlib import Path


def load_records(out: Path, run: str) -> list[dict]:
    """The harness's own request records for one run (the raw log the tests check servlens against)."""
    import json

    with open(out / run / "requests.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def engine_timings(rec: dict) -> dict:
    """llama.cpp's `timings` of one harness record (the streamed final chunk's, else the response's), {} without."""
    return (rec.get("stream_final_chunk") or rec.get("response") or {}).get("timings") or {}


def ttfts_and_cache_hits(out: Path, run: str) -> tuple[list[float], list[int]]:
    """The run's client TTFTs (seconds, sorted) and, per request, the prompt tokens the engine served from cache."""
    ttfts, cached = [], []
    for rec in load_records(out, run):
        if rec.get("ttft_client_s") is not None:
            ttfts.append(rec["ttft_client_s"])
        if engine_timings(rec).get("cache_n") is not None:
            cached.append(engine_timings(rec)["cache_n"])
    return sorted(ttfts), cached


def servlens(*args: str, timeout: float = 300):
    """Run the servlens CLI as a user would (a separate process); returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "servlens", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def max_deferred(run_dir: Path) -> float:
    """The most requests llama.cpp held back for want of a slot in any scrape of the run (0 without scrapes)."""
    import re

    found = [float(m.group(1)) for path in run_dir.glob("metrics_*.prom")
             for m in re.finditer(r"^llamacpp:requests_deferred(?:\{[^}]*\})?\s+([0-9.eE+-]+)", path.read_text(), re.M)]
    return max(found, default=0.0)


def engine_queueing(out: Path, run: str) -> str:
    """What the run's own engine and timings say about queueing: 'queued', 'none' or 'unclear'.

    A busy machine can make a steady run queue for real, so the e2e expectation for SL004 is read from the run
    itself, never from the scenario's intent: 'queued' when llama.cpp deferred requests (requests_deferred >= 2 in a
    scrape) and at least 3 requests waited over a second for a slot (client TTFT minus the engine's prompt time);
    'none' when no scrape saw a deferred request and no request waited half a second; else 'unclear'.
    """
    deferred = max_deferred(out / run)
    waits = []
    for rec in load_records(out, run):
        timings = engine_timings(rec)
        if rec.get("ttft_client_s") is not None and timings.get("prompt_ms") is not None:
            waits.append(rec["ttft_client_s"] - timings["prompt_ms"] / 1000)
    if deferred >= 2 and sum(w > 1.0 for w in waits) >= 3:
        return "queued"
    if deferred == 0 and not any(w > 0.5 for w in waits):
        return "none"
    return "unclear"
