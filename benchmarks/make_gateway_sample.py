"""Regenerate sample_logs/gateway-day/: one day of LiteLLM gateway traffic with one incident window.

20,000 requests (StandardLoggingPayload JSON lines, as a LiteLLM custom callback writes them) on 2026-11-27 UTC, from
benchmarks/generate.py with a fixed seed; from 16:00 to 17:30 UTC the engines serving deepseek-r1-distill-qwen-14b
run without their reasoning parser (as after a deploy that dropped ``--reasoning-parser``): the thinking and its
``</think>`` marker land in the answer's content, ``reasoning_content`` is empty, and more answers hit the output cap. Compressed with zstd (servlens reads .zst directly): the payloads carry message text so that
prefix keys and leak flags can be computed, and at about 5 kB a request gzip could not keep the file near 4 MB,
while zstd's larger window does (about 3.4 MB).

Example:
    python benchmarks/make_gateway_sample.py            # rewrites sample_logs/gateway-day/
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import zstandard

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE.parent / "sample_logs" / "gateway-day"
LOG_NAME = "litellm-gateway-2026-11-27.jsonl.zst"
REQUESTS = 20_000
SEED = 27
INCIDENT = "reasoning_leak@16:00/90m"


def _load_generator():
    spec = importlib.util.spec_from_file_location("servlens_bench_generate", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    generate = _load_generator()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    sc = generate.Scenario(REQUESTS, SEED, "2026-11-27T00:00:00Z", 86400.0, [generate.Incident.parse(INCIDENT)],
                           run="gateway-day")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "day.jsonl"
        summary = generate.generate(sc, "litellm", plain)
        target = OUT_DIR / LOG_NAME
        with open(plain, "rb") as src, open(target, "wb") as dst:
            # level 19, one thread, no content size header variance: the same input gives the same bytes
            zstandard.ZstdCompressor(level=19, threads=0).copy_stream(src, dst)
    print(f"wrote {target} ({target.stat().st_size / 1e6:.2f} MB): {summary['requests']} requests, "
          f"{summary['errors']} errors, {summary['length']} length finishes, {summary['streamed']} streamed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
