"""Two more recorded incidents for SL006-SL008: a restart in the middle of traffic, and long prompts among short ones.

    python -m tools.engine.incidents list
    python -m tools.engine.incidents run restart hol --out /tmp/engine
    servlens analyze /tmp/engine/restart/ --select SL006,SL007

Both use the same harness as tools/engine/scenarios.py (the tiny random-weight model, llama.cpp from xllamacpp, the
load driver and the /metrics scraper); they live in their own module because `restart` needs its own run loop.

- `restart` (run `restart`): --parallel 2, every chat request starts with the same ~600-token system prompt and
  sends cache_prompt true, Poisson ~3 req/s for 30 s. At t=12 s the server is stopped (SIGTERM), kept down for
  `down_s` seconds and started again with an empty cache; the clients keep sending to the same address and the
  scraper keeps scraping. Requests sent while it is down fail (connection refused: no HTTP status); the new server's
  counters start again at 0 (a reset in the scrapes). At either start a few clients arrive together (the first
  users; after the restart, clients that waited for it), so both slots take a first request and prefill the whole
  prompt (cold prefix cache). Without that, light traffic fills the second slot whenever two requests first overlap,
  and that cold request lands among the steady ones. Expect: SL006 fires for the restart (errors after it, time to first success),
  SL007 fires at both starts (cold prefix cache).
- `hol` (run `hol`): --parallel 4, 80% short chat requests (10-40 words) and 20% long documents (~1,400 tokens),
  all streamed, Poisson ~3 req/s for 40 s. A short request that arrives while a long prompt is being prefilled
  waits for that batch. Expect: SL008 fires (short requests' TTFT higher while a long prompt is in prefill).
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import requests

from .cli import chosen, list_run_parser
from .load import MetricsScraper, PlannedRequest, RequestLog, _send
from .model import ModelSpec, ensure_model
from .scenarios import CHAT, _plan, chat_body, poisson_offsets, shared_system_prompt
from .server import ServerConfig, start_server


def restart_plan(n: int = 90, rate: float = 3.0, seed: int = 71, burst: int = 3,
                 ready_offset_s: float = 15.0) -> tuple[list[PlannedRequest], list[PlannedRequest]]:
    """(scheduled requests, the burst sent as soon as the restarted server is ready). The schedule opens with a
    burst too; `ready_offset_s` only sets the second burst's nominal offset (it is sent when the server is up)."""
    rng = random.Random(seed)
    system = shared_system_prompt()

    def body() -> dict:
        return chat_body(rng, system=system, user_words=rng.randint(5, 30), max_tokens=rng.choice([8, 16]),
                         stream=True, cache_prompt=True)

    items = [(0.0, CHAT, body()) for _ in range(burst)] + [(0.5 + off, CHAT, body()) for off in poisson_offsets(rng, rate, n)]
    items += [(ready_offset_s, CHAT, body()) for _ in range(burst)]
    planned = _plan(items)
    return planned[:-burst], planned[-burst:]


def hol_plan(n: int = 150, rate: float = 3.0, seed: int = 81, long_share: float = 0.2) -> list[PlannedRequest]:
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, rate, n):
        if rng.random() < long_share:
            body = chat_body(rng, user_words=rng.randint(1000, 1100), max_tokens=8, stream=True)
        else:
            body = chat_body(rng, user_words=rng.randint(10, 40), max_tokens=rng.choice([16, 32]), stream=True)
        items.append((off, CHAT, body))
    return _plan(items)


class _Target:
    """The address the clients and the scraper send to; a restart swaps it (as a Service's endpoint would)."""

    def __init__(self, url: str):
        self.url = url


def _drive(target: _Target, run: str, plan: list[PlannedRequest], log: RequestLog, max_in_flight: int = 64,
           timeout: float = 120.0, events: list | None = None) -> dict:
    """Like load.drive, but each request reads the current address when it is sent; `events` are
    (offset_s, callable) run on the schedule too (the restart), each given a function that sends a planned request
    at once."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=max_in_flight))
    t0_wall, t0 = time.time(), time.monotonic()
    statuses: dict = {}
    lock = threading.Lock()

    def task(p: PlannedRequest) -> None:
        rec = _send(session, target.url, run, p, t0_wall, timeout)
        log.write(rec)
        with lock:
            statuses[rec["http_status"]] = statuses.get(rec["http_status"], 0) + 1

    schedule = sorted([(p.offset_s, p.req_idx, p) for p in plan] +
                      [(off, -1, fn) for off, fn in (events or [])], key=lambda x: (x[0], x[1]))
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="load") as pool:
        for offset, _, item in schedule:
            delay = offset - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            if callable(item):
                threading.Thread(target=item, args=(lambda p: pool.submit(task, p),), daemon=True).start()
            else:
                pool.submit(task, item)
    session.close()
    return {"run": run, "requests": sum(statuses.values()), "wall_s": round(time.monotonic() - t0, 3),
            "http_status": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))}}


def _prepare(out_dir: Path, run: str) -> Path:
    run_dir = out_dir / run
    if run_dir.exists():
        for f in run_dir.iterdir():
            if f.is_file():
                f.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def run_restart(out_dir: Path, seed: int = 1234, model_cache: Path | None = None, restart_at_s: float = 12.0,
                down_s: float = 3.0, log=print) -> dict:
    run = "restart"
    run_dir = _prepare(out_dir, run)
    config = ServerConfig(parallel=2, ctx_size=8192)
    model = ensure_model(ModelSpec(seed=seed, template="chatml"), model_cache)
    servers = [start_server(model, config, log_path=run_dir / "engine.log")]
    target = _Target(servers[0].base_url)
    (run_dir / "props.json").write_text(requests.get(target.url + "/props", timeout=10).text, encoding="utf-8")
    (run_dir / "models.json").write_text(requests.get(target.url + "/v1/models", timeout=10).text, encoding="utf-8")
    scraper = MetricsScraper(target.url, run, run_dir).start()
    restarted: dict = {}
    plan, after_ready = restart_plan(ready_offset_s=restart_at_s + down_s)

    def restart(send) -> None:
        restarted["stop_ts"] = time.time()
        servers[0].stop()
        time.sleep(down_s)
        # Until the new server is up, clients and scraper keep the old (now closed) address: connection refused.
        servers.append(start_server(model, config, log_path=run_dir / "engine.log"))
        restarted["ready_ts"] = time.time()
        target.url = scraper.base_url = servers[-1].base_url
        for planned in after_ready:
            send(planned)

    reqlog = RequestLog(run_dir / "requests.jsonl")
    t0 = time.time()
    try:
        result = _drive(target, run, plan, reqlog, events=[(restart_at_s, restart)])
        while "ready_ts" not in restarted and time.time() - t0 < 120:
            time.sleep(0.2)
    finally:
        reqlog.close()
        scraper.stop()
        for server in servers:
            server.stop()
    summary = {"scenario": "restart", "run": run, "note": f"server restarted at t={restart_at_s:g} s, down {down_s:g} s",
               "model": Path(model).name, "template": "chatml", "flags": asdict(config), **result,
               "restart": {k: round(v - t0, 3) for k, v in restarted.items()}, "scrapes": scraper.n,
               "started_at": t0, "total_s": round(time.time() - t0, 3)}
    with open(out_dir / "summary.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(summary) + "\n")
    log(f"{run}: {summary['requests']} requests, status {summary['http_status']}, restart {summary['restart']} -> {run_dir}")
    return summary


def run_hol(out_dir: Path, seed: int = 1234, model_cache: Path | None = None, log=print) -> dict:
    run = "hol"
    run_dir = _prepare(out_dir, run)
    config = ServerConfig(parallel=4, ctx_size=8192)
    model = ensure_model(ModelSpec(seed=seed, template="chatml"), model_cache)
    server = start_server(model, config, log_path=run_dir / "engine.log")
    t0 = time.time()
    try:
        target = _Target(server.base_url)
        (run_dir / "props.json").write_text(requests.get(target.url + "/props", timeout=10).text, encoding="utf-8")
        scraper = MetricsScraper(target.url, run, run_dir).start()
        reqlog = RequestLog(run_dir / "requests.jsonl")
        try:
            result = _drive(target, run, hol_plan(), reqlog)
        finally:
            reqlog.close()
            scraper.stop()
    finally:
        server.stop()
    summary = {"scenario": "hol", "run": run, "note": "20% long documents among short chat, --parallel 4",
               "model": Path(model).name, "template": "chatml", "flags": asdict(config), **result,
               "scrapes": scraper.n, "started_at": t0, "total_s": round(time.time() - t0, 3)}
    with open(out_dir / "summary.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(summary) + "\n")
    log(f"{run}: {summary['requests']} requests, status {summary['http_status']} -> {run_dir}")
    return summary


INCIDENTS = {"restart": run_restart, "hol": run_hol}


def main(argv: list[str] | None = None) -> int:
    ap, _ = list_run_parser("python -m tools.engine.incidents", __doc__, list(INCIDENTS), "incident",
                            "the incidents and what servlens should find", "record incidents into OUT/<run>/")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print(__doc__)
        return 0
    names = chosen(args.names, list(INCIDENTS), "incident")
    if names is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        INCIDENTS[name](args.out, args.seed, args.model_cache)
    return 0

if __name__ == "__main__":
    sys.exit(main())
