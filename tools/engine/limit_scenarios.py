"""Scenarios for the limit detectors (SL011 timeouts at a gateway limit, SL012 context overflow), on the real
llama.cpp server of this harness. Kept apart from scenarios.py: the same pieces, plus a client timeout per run.

    python -m tools.engine.limit_scenarios list
    python -m tools.engine.limit_scenarios run gateway_timeout slot_overflow --out /tmp/limits
    servlens analyze /tmp/limits/ --select SL011,SL012

- gateway_timeout: --parallel 2; a background of 1 req/s and a burst of 40 at t=5 s, all non-streamed (a gateway
  waits for the whole answer), about one in eight with max_tokens 1500 and ignore_eos (a long generation). The client gives up
  after 3 s, like a gateway's fixed request timeout: requests that wait in the queue or generate long fail at ~3 s.
- slot_overflow: --parallel 4 --ctx-size 2048, so each slot holds 512 tokens while the model would take far more:
  prompts of 60-700 words; the long ones get HTTP 400 exceed_context_size_error, and prompts that fit leave less
  room than max_tokens, so their answers stop at the slot's end (finish "length" below the cap).
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import requests

from .cli import chosen, list_run_parser
from .load import MetricsScraper, PlannedRequest, RequestLog, drive
from .model import ModelSpec, ensure_model
from .scenarios import CHAT, _plan, chat_body, poisson_offsets
from .server import ServerConfig, start_server


def gateway_timeout_plan(seed: int = 71) -> list[PlannedRequest]:
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, 1.0, 20):
        items.append((off, CHAT, _body(rng)))
    for _ in range(40):
        items.append((5.0, CHAT, _body(rng)))
    return _plan(items)


def _body(rng: random.Random) -> dict:
    long_answer = rng.random() < 0.12
    body = chat_body(rng, user_words=rng.randint(10, 80), max_tokens=1500 if long_answer else rng.choice([32, 64]),
                     stream=False)
    if long_answer:
        body["ignore_eos"] = True  # llama.cpp: generate exactly max_tokens
    return body


def slot_overflow_plan(n: int = 60, rate: float = 3.0, seed: int = 81) -> list[PlannedRequest]:
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, rate, n):
        pick = rng.random()
        user_words = rng.randint(60, 250) if pick < 0.6 else rng.randint(380, 480) if pick < 0.85 else rng.randint(520, 700)
        body = chat_body(rng, user_words=user_words, max_tokens=rng.choice([64, 128]), stream=rng.random() < 0.5)
        items.append((off, CHAT, body))
    return _plan(items)


@dataclass(frozen=True)
class LimitRun:
    run: str
    server: ServerConfig
    plan: Callable[[], list[PlannedRequest]]
    client_timeout_s: float
    expect: str


RUNS: dict[str, LimitRun] = {r.run: r for r in [
    LimitRun("gateway_timeout", ServerConfig(parallel=2, ctx_size=8192), gateway_timeout_plan, 3.0,
             "SL011 fires: failed requests (client ReadTimeout) cluster at ~3 s; the long ignore_eos answers could "
             "never fit 3 s at the run's TPOT."),
    LimitRun("slot_overflow", ServerConfig(parallel=4, ctx_size=2048), slot_overflow_plan, 120.0,
             "SL012 fires: exceed_context_size_error at 512 tokens per slot (2048 / --parallel 4), and answers that "
             "stop at the slot's end below max_tokens."),
]}


def run_limit(spec: LimitRun, out_dir: Path, model_cache: Path | None = None, seed: int = 1234,
              log: Callable[[str], None] = print) -> dict:
    """One run into out_dir/<run>/ with the same files as scenarios.run_one, and the client timeout of the spec."""
    run_dir = out_dir / spec.run
    if run_dir.exists():
        for f in run_dir.iterdir():
            if f.is_file():
                f.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    model = ensure_model(ModelSpec(seed=seed, template="chatml"), model_cache)
    plan = spec.plan()
    t0 = time.time()
    server = start_server(model, spec.server, log_path=run_dir / "engine.log")
    try:
        base = server.base_url
        for name, route in (("props.json", "/props"), ("models.json", "/v1/models")):
            (run_dir / name).write_text(requests.get(base + route, timeout=10).text, encoding="utf-8")
        scraper = MetricsScraper(base, spec.run, run_dir).start()
        reqlog = RequestLog(run_dir / "requests.jsonl")
        try:
            result = drive(base, spec.run, plan, reqlog, timeout=spec.client_timeout_s)
        finally:
            reqlog.close()
            scraper.stop()
        time.sleep(0.5)  # let the server finish (or drop) what the client gave up on before reading the slots
        (run_dir / f"slots_{spec.run}_end.json").write_text(requests.get(base + "/slots", timeout=10).text,
                                                            encoding="utf-8")
    finally:
        server.stop()
    summary = {"scenario": spec.run, "run": spec.run, "note": spec.expect, "flags": asdict(spec.server),
               "client_timeout_s": spec.client_timeout_s, **result, "scrapes": scraper.n,
               "started_at": t0, "total_s": round(time.time() - t0, 3)}
    with open(out_dir / "summary.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(summary) + "\n")
    log(f"{spec.run}: {summary['requests']} requests in {summary['wall_s']:.1f} s, status {summary['http_status']}, "
        f"{summary['scrapes']} scrapes -> {run_dir}")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap, _ = list_run_parser("python -m tools.engine.limit_scenarios", __doc__, list(RUNS), "run",
                            "the runs and what servlens should find", "run one or more of the runs into OUT/<run>/")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for r in RUNS.values():
            print(f"{r.run}: {asdict(r.server)}, client timeout {r.client_timeout_s:g} s\n  expect: {r.expect}")
        return 0
    names = chosen(args.names, list(RUNS), "run")
    if names is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        run_limit(RUNS[name], args.out, args.model_cache, args.seed)
    return 0

if __name__ == "__main__":
    sys.exit(main())
