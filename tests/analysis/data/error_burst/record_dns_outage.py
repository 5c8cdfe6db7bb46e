"""Record a probe log through a DNS outage, with the real llama.cpp server of tools/engine and the real resolver.

A probe sends a short chat request about three times a second for 15 s. For the middle 5 s the engine's host name
does not resolve (the client is pointed at `llm-engine.invalid`, a name RFC 2606 guarantees never resolves), so
`requests` fails in the resolver with ConnectionError ... NameResolutionError ... Name or service not known, exactly
as a probe whose DNS entry vanished; before and after, the same probe reaches llama.cpp on 127.0.0.1.

    python tests/analysis/data/error_burst/record_dns_outage.py [--out tests/analysis/data/error_burst]
    servlens analyze tests/analysis/data/error_burst/dns_outage/ --select SL013
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from tools.engine.load import RequestLog, drive
from tools.engine.model import ModelSpec, ensure_model
from tools.engine.scenarios import CHAT, _plan, chat_body
from tools.engine.server import ServerConfig, start_server

RUN = "dns_outage"
UNRESOLVABLE = "llm-engine.invalid"
PHASE_S = 5.0
RATE = 3.0


def _phase(rng: random.Random) -> list:
    """One 5 s phase of probes, evenly spaced (a probe runs on a timer), 8-token answers."""
    n = int(PHASE_S * RATE)
    return _plan([(i / RATE, CHAT, chat_body(rng, user_words=rng.randint(8, 20), max_tokens=8, stream=False))
                  for i in range(n)])


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--out", type=Path, default=Path(__file__).parent)
    opts = args.parse_args(argv)
    run_dir = opts.out / RUN
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("*.json*"):
        f.unlink()
    rng = random.Random(13)
    model = ensure_model(ModelSpec(seed=1234, template="chatml"))
    server = start_server(model, ServerConfig(parallel=2, ctx_size=4096), log_path=None)
    summary = []
    try:
        real = server.base_url
        port = real.rsplit(":", 1)[1]
        (run_dir / "props.json").write_text(requests.get(real + "/props", timeout=10).text, encoding="utf-8")
        log = RequestLog(run_dir / "requests.jsonl")
        try:
            for i, base in enumerate((real, f"http://{UNRESOLVABLE}:{port}", real)):
                plan = _phase(rng)
                # Request numbers continue across the phases, so every line is one probe of the same run.
                plan = [type(p)(p.req_idx + i * len(plan), p.offset_s, p.path, p.body, p.prompt_words) for p in plan]
                summary.append(drive(base, RUN, plan, log, max_in_flight=4, timeout=10.0))
        finally:
            log.close()
    finally:
        server.stop()
    print(json.dumps({"run": RUN, "phases": summary, "recorded_at": time.time()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
