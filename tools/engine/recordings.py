"""The recorded real runs of tests/data/recorded/: a real LiteLLM proxy in front of llama.cpp, and llama.cpp alone.

    python -m tools.engine.recordings list
    SERVLENS_LITELLM=/tmp/venv-litellm/bin/litellm python -m tools.engine.recordings run gw-healthy --out DIR
    python -m tools.engine.recordings run all --out tests/data/recorded

Gateway runs (``gw-*``): llama.cpp servers of this harness (tools/engine/server.py, the tiny model, --threads 1), a
LiteLLM proxy (tools/engine/gateway.py) on 127.0.0.1 whose callback writes each attempt's StandardLoggingPayload to
``litellm_slp.jsonl``, and the load driver (load.py) sending to the proxy with its key; the client log is
``client/requests.jsonl`` (with the proxy's ``x-litellm-*`` response headers). The first backend's ``/metrics``
scrapes, ``props.json`` and ``engine.log`` are at the top of the run folder; any other backend's are in
``backend-<name>/`` (their index names the run ``<run>-<name>``: two servers' counters are different series).
Engine runs (``llamacpp-*``): the same server alone, ``requests.jsonl`` at the top.

Incidents are injected by the recorder, at offsets from the start of the load: a backend killed with SIGKILL (a
crash; in-flight requests are cut) and, for a restart, started again on the same port (as a supervisor would).
Every run also writes ``recording.json`` (versions, flags, the proxy config, the events with their times), then
``facts.json`` and ``README.md`` from the raw files (recording_facts.py, which does not use servlens).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import requests

from .cli import chosen, list_run_parser
from .gateway import (
    GATEWAY_HEADERS,
    GatewayError,
    Proxy,
    closed_port,
    deployment,
    find_litellm,
    free_port,
    litellm_version,
    proxy_config,
)
from .load import MetricsScraper, PlannedRequest, RequestLog, drive
from .model import ModelSpec, ensure_model
from .scenarios import CHAT, THINK_GRAMMAR, _plan, chat_body, poisson_offsets, shared_system_prompt
from .server import RunningServer, ServerConfig, start_server

# ---- plans (seeded: a re-recording sends the same requests) ------------------------------------------------------

def _gw(body: dict, group: str = "chat") -> dict:
    body["model"] = group  # the model group the client asks the proxy for
    return body


def healthy_plan(seed: int = 101) -> list[PlannedRequest]:
    """40 requests at ~1.5/s, 70% streamed: well below what 2 slots serve."""
    rng = random.Random(seed)
    return _plan([(off, CHAT, _gw(chat_body(rng, user_words=rng.randint(10, 80), max_tokens=rng.choice([32, 64]),
                                            stream=rng.random() < 0.7)))
                  for off in poisson_offsets(rng, 1.5, 40)])


def burst_plan(seed: int = 102, background: int = 10, burst: int = 40, burst_at: float = 4.0) -> list[PlannedRequest]:
    """A light background at 1/s and a burst of ``burst`` requests at once (75% not streamed, long answers)."""
    rng = random.Random(seed)
    items = [(off, CHAT, _gw(chat_body(rng, user_words=rng.randint(10, 80), max_tokens=64, stream=rng.random() < 0.5)))
             for off in poisson_offsets(rng, 1.0, background)]
    for _ in range(burst):
        body = _gw(chat_body(rng, user_words=rng.randint(20, 120), max_tokens=rng.choice([128, 256]),
                             stream=rng.random() < 0.25))
        body["ignore_eos"] = True  # llama.cpp: generate exactly max_tokens (LiteLLM passes it through)
        items.append((burst_at, CHAT, body))
    return _plan(items)


def steady_plan(seed: int, n: int, rate: float) -> list[PlannedRequest]:
    """Poisson arrivals, half streamed, short answers."""
    rng = random.Random(seed)
    return _plan([(off, CHAT, _gw(chat_body(rng, user_words=rng.randint(10, 60), max_tokens=rng.choice([16, 32]),
                                            stream=rng.random() < 0.5)))
                  for off in poisson_offsets(rng, rate, n)])


RAMP_STEPS = ((2.0, 16), (4.0, 32), (8.0, 48), (16.0, 64), (32.0, 96))   # (requests per second, requests)


def ramp_plan(seed: int = 108) -> list[PlannedRequest]:
    """Poisson arrivals at a rate that doubles every step (RAMP_STEPS), all streamed (every request has a TTFT),
    max_tokens 64/128: the production counterpart of a concurrency sweep (issue 20)."""
    rng = random.Random(seed)
    items, start = [], 0.0
    for rate, n in RAMP_STEPS:
        offsets = poisson_offsets(rng, rate, n, start)
        items += [(off, CHAT, chat_body(rng, user_words=rng.randint(10, 60), max_tokens=rng.choice([64, 128]),
                                        stream=True)) for off in offsets]
        start = offsets[-1]
    return _plan(items)


def restart_plan(seed: int = 106) -> list[PlannedRequest]:
    """Every request starts with the same ~600-token system prompt (cache_prompt true): a restart empties the cache."""
    rng = random.Random(seed)
    system = shared_system_prompt()
    return _plan([(off, CHAT, chat_body(rng, system=system, user_words=rng.randint(5, 30),
                                        max_tokens=rng.choice([8, 16, 32]), stream=rng.random() < 0.7,
                                        cache_prompt=True))
                  for off in poisson_offsets(rng, 3.0, 60)])


def reasoning_plan(seed: int = 107) -> list[PlannedRequest]:
    """Thinking-shaped output (grammar: <think> 4-24 words </think> answer); 40% of the requests get a budget of
    12 tokens, which the thought alone usually exceeds; half streamed."""
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, 4.0, 40):
        budget = 12 if rng.random() < 0.4 else 160
        items.append((off, CHAT, chat_body(rng, user_words=rng.randint(5, 60), max_tokens=budget,
                                           stream=rng.random() < 0.5, grammar=THINK_GRAMMAR)))
    return _plan(items)


# ---- run definitions -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Backend:
    name: str
    server: ServerConfig
    template: str = "chatml"


@dataclass(frozen=True)
class Event:
    """Something the recorder does to a backend at ``at_s`` seconds after the load starts."""

    at_s: float
    action: str  # "kill" (SIGKILL) | "restart" (start again on the same port)
    backend: str


@dataclass(frozen=True)
class RecordedRun:
    run: str
    description: str
    backends: tuple[Backend, ...]
    plan: Callable[[], list[PlannedRequest]]
    # Gateway runs: (backend name -> its /v1 base URL, a dead endpoint's /v1 base URL) -> model_list
    model_list: Callable[[dict[str, str], str], list[dict]] | None = None
    router_settings: dict = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    client_timeout_s: float = 60.0

    @property
    def gateway(self) -> bool:
        return self.model_list is not None


P2 = ServerConfig(parallel=2, ctx_size=8192)

RUNS: dict[str, RecordedRun] = {r.run: r for r in [
    RecordedRun(
        "gw-healthy",
        "Control run: a LiteLLM proxy in front of one llama.cpp server (--parallel 2), 40 requests at ~1.5/s, 70% "
        "streamed, max_tokens 32/64. Nothing injected.",
        (Backend("primary", P2),),
        healthy_plan,
        model_list=lambda url, dead: [deployment("chat", "dep-primary", url["primary"])],
        router_settings={"num_retries": 2},
    ),
    RecordedRun(
        "gw-timeout-fallback",
        "Group `chat` (one llama.cpp server, --parallel 2) has a 2.5 s timeout; after a background of 10 requests "
        "at 1/s, a burst of 40 requests (max_tokens 128/256 with ignore_eos, 75% not streamed) lands on it at t=4 s. "
        "Failures fall back to group `chat-small`, a second llama.cpp server whose deployment caps every answer at "
        "16 tokens (litellm_params extra_body n_predict 16, which llama.cpp reads before max_tokens; a "
        "deployment's own max_tokens would not do: LiteLLM lets the request's max_tokens override it). "
        "num_retries 0.",
        (Backend("primary", P2), Backend("small", ServerConfig(parallel=4, ctx_size=8192))),
        burst_plan,
        model_list=lambda url, dead: [deployment("chat", "dep-primary", url["primary"], timeout=2.5),
                                      deployment("chat-small", "dep-small", url["small"], timeout=30,
                                                 extra_body={"n_predict": 16})],
        router_settings={"num_retries": 0, "fallbacks": [{"chat": ["chat-small"]}]},
    ),
    RecordedRun(
        "gw-ratelimit-429",
        "Group `chat` (one llama.cpp server, --parallel 2) limited to rpm 15 in the LiteLLM config "
        "(routing_strategy usage-based-routing-v2, which enforces a deployment's rpm); 60 requests at ~2.5/s. "
        "num_retries 0, no fallbacks: requests over the limit get LiteLLM's 429.",
        (Backend("primary", P2),),
        lambda: steady_plan(103, 60, 2.5),
        model_list=lambda url, dead: [deployment("chat", "dep-primary", url["primary"], rpm=15)],
        router_settings={"num_retries": 0, "routing_strategy": "usage-based-routing-v2"},
    ),
    RecordedRun(
        "gw-dead-fallback",
        "Group `chat` (llama.cpp server `primary`) falls back to group `chat-backup`, a pool of two deployments: a "
        "dead endpoint (a closed port on 127.0.0.1) and a live server `backup`. At t=7 s `primary` is killed "
        "(SIGKILL) and stays down; 45 requests at ~2/s. num_retries 0, LiteLLM's default cooldowns.",
        (Backend("primary", P2), Backend("backup", P2)),
        lambda: steady_plan(104, 45, 2.0),
        model_list=lambda url, dead: [deployment("chat", "dep-primary", url["primary"], timeout=10),
                                      deployment("chat-backup", "dep-backup-dead", dead, timeout=10),
                                      deployment("chat-backup", "dep-backup-live", url["backup"], timeout=10)],
        router_settings={"num_retries": 0, "fallbacks": [{"chat": ["chat-backup"]}]},
        events=(Event(7.0, "kill", "primary"),),
    ),
    RecordedRun(
        "gw-retries",
        "Group `chat` (one llama.cpp server, --parallel 2) with num_retries 3; the server is killed (SIGKILL) at "
        "t=7 s and started again on the same port at t=12 s; 45 requests at ~2/s. No fallbacks.",
        (Backend("primary", P2),),
        lambda: steady_plan(105, 45, 2.0),
        model_list=lambda url, dead: [deployment("chat", "dep-primary", url["primary"], timeout=10)],
        router_settings={"num_retries": 3},
        events=(Event(7.0, "kill", "primary"), Event(12.0, "restart", "primary")),
    ),
    RecordedRun(
        "llamacpp-restart-midrun",
        "llama.cpp alone (--parallel 2); 60 requests at ~3/s, all with the same ~600-token system prompt and "
        "cache_prompt true, 70% streamed. The server is killed (SIGKILL) at t=8 s and started again on the same "
        "port at t=11 s with an empty cache; the load and the scraper continue throughout.",
        (Backend("primary", P2),),
        restart_plan,
        events=(Event(8.0, "kill", "primary"), Event(11.0, "restart", "primary")),
    ),
    RecordedRun(
        "llamacpp-concurrency-ramp",
        "llama.cpp alone (--parallel 2); Poisson arrivals at 2, 4, 8, 16 and 32 requests/s (16, 32, 48, 64 and 96 "
        "requests), all streamed, max_tokens 64/128: the load climbs past what 2 slots serve, so requests queue and "
        "TTFT grows with the requests in flight. Nothing injected.",
        (Backend("primary", P2),),
        ramp_plan,
    ),
    *[RecordedRun(
        f"llamacpp-reasoning-{fmt}",
        f"llama.cpp alone (--parallel 2) with the Qwen3-style thinking template and --reasoning-format {fmt}; 40 "
        "requests at ~4/s, half streamed, output shaped by a grammar as '<think> thought </think> answer'; 40% of "
        "the requests have max_tokens 12 (less than most thoughts), the rest 160.",
        (Backend("primary", ServerConfig(parallel=2, ctx_size=8192, reasoning_format=fmt), template="think"),),
        reasoning_plan,
    ) for fmt in ("none", "deepseek", "deepseek-legacy", "auto")],
]}


# ---- running one -----------------------------------------------------------------------------------------------------

class _Backends:
    """The run's llama.cpp servers, each on a fixed port so a restart keeps its address."""

    def __init__(self, run: RecordedRun, run_dir: Path, model_cache: Path | None, seed: int):
        self.run, self.run_dir = run, run_dir
        self.specs = {b.name: b for b in run.backends}
        self.models = {b.name: ensure_model(ModelSpec(seed=seed, template=b.template), model_cache)
                       for b in run.backends}
        self.configs = {b.name: replace(b.server, port=free_port()) for b in run.backends}
        self.servers: dict[str, RunningServer | None] = {}
        self.dirs = {b.name: run_dir if i == 0 else run_dir / f"backend-{b.name}" for i, b in enumerate(run.backends)}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.configs[name].port}"

    def start(self, name: str) -> None:
        self.dirs[name].mkdir(parents=True, exist_ok=True)
        self.servers[name] = start_server(self.models[name], self.configs[name], log_path=self.dirs[name] / "engine.log")

    def kill(self, name: str) -> None:
        server = self.servers.pop(name, None)
        if server is not None:
            os.kill(server.pid, signal.SIGKILL)  # a crash, not a shutdown: in-flight requests are cut
            if server._proc is not None:
                server._proc.wait(10)
            server.stop()  # forgets the PID (already gone)

    def stop_all(self) -> None:
        for name in list(self.servers):
            server = self.servers.pop(name)
            if server is not None:
                server.stop()


def _prepare(run_dir: Path) -> None:
    if run_dir.exists():  # a re-recording replaces the run folder, but only one this recorder made
        if any(run_dir.iterdir()) and not (run_dir / "recording.json").exists():
            raise SystemExit(f"Error: {run_dir} exists and was not made by this recorder; choose another --out.")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _versions(litellm_bin: Path | None) -> dict:
    out = {"xllamacpp": importlib.metadata.version("xllamacpp"), "python": platform.python_version(),
           "requests": importlib.metadata.version("requests")}
    if litellm_bin is not None:
        out["litellm"] = litellm_version(litellm_bin)
    return out


def record(run: RecordedRun, out_dir: Path, model_cache: Path | None = None, seed: int = 1234,
           litellm: str | None = None, log: Callable[[str], None] = print) -> Path:
    run_dir = Path(out_dir) / run.run
    litellm_bin = find_litellm(litellm) if run.gateway else None
    _prepare(run_dir)
    backends = _Backends(run, run_dir, model_cache, seed)
    plan = run.plan()
    scrapers: list[MetricsScraper] = []
    proxy: Proxy | None = None
    events_log: list[dict] = []
    meta: dict = {"run": run.run, "description": run.description, "recorded_at": time.time(),
                  "versions": _versions(litellm_bin), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                  "load_average_at_start": list(os.getloadavg()), "seed_model": seed,
                  "backends": [{"name": b.name, "template": b.template, "model": backends.models[b.name].name,
                                "flags": asdict(backends.configs[b.name]),
                                "folder": str(backends.dirs[b.name].relative_to(run_dir)) or "."}
                               for b in run.backends],
                  "client_timeout_s": run.client_timeout_s, "requests_planned": len(plan)}
    try:
        for b in run.backends:
            backends.start(b.name)
            base, folder = backends.url(b.name), backends.dirs[b.name]
            for name, route in (("props.json", "/props"), ("models.json", "/v1/models")):
                (folder / name).write_text(requests.get(base + route, timeout=10).text, encoding="utf-8")
        if run.gateway:
            dead = f"http://127.0.0.1:{closed_port()}/v1"
            urls = {name: backends.url(name) + "/v1" for name in backends.specs}
            config = proxy_config(run.model_list(urls, dead), urls[run.backends[0].name], run.router_settings)
            meta["dead_endpoint"] = dead if dead in json.dumps(config) else None
            meta["litellm_config"] = config
            proxy = Proxy(litellm_bin, config, run_dir / "litellm_slp.jsonl", run_dir / "proxy.log")
            t = time.time()
            proxy.start()
            proxy.warm_up()
            proxy.resume()
            meta["proxy"] = {"base_url": proxy.base_url, "ready_s": round(time.time() - t, 1),
                             "warm_up": "6 requests to group 'warmup' (dep-warmup, first backend), not recorded"}
        for i, b in enumerate(run.backends):
            label = run.run if i == 0 else f"{run.run}-{b.name}"
            scrapers.append(MetricsScraper(backends.url(b.name), label, backends.dirs[b.name]).start())
        client_dir = run_dir / "client" if run.gateway else run_dir
        client_dir.mkdir(exist_ok=True)
        reqlog = RequestLog(client_dir / "requests.jsonl")
        t0 = time.time()

        def inject() -> None:
            for ev in sorted(run.events, key=lambda e: e.at_s):
                time.sleep(max(0.0, t0 + ev.at_s - time.time()))
                started = time.time()
                if ev.action == "kill":
                    backends.kill(ev.backend)
                else:
                    backends.start(ev.backend)
                events_log.append({**asdict(ev), "done_ts": time.time(), "started_ts": started,
                                   "t_rel_s": round(started - t0, 3), "took_s": round(time.time() - started, 3)})

        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
        try:
            target = proxy.base_url if proxy else backends.url(run.backends[0].name)
            result = drive(target, run.run, plan, reqlog, timeout=run.client_timeout_s,
                           headers=proxy.auth_headers if proxy else None,
                           record_headers=GATEWAY_HEADERS if proxy else ())
            injector.join(120)
        finally:
            reqlog.close()
        meta["load"] = {**result, "started_ts": t0}
        time.sleep(2.0)  # the proxy's callbacks run after the response: let the last ones land
    finally:
        for s in scrapers:
            s.stop()
        if proxy is not None:
            proxy.stop()
        backends.stop_all()
    meta["events"] = events_log
    if proxy is not None:
        _check_no_key(run_dir, proxy.auth_headers["Authorization"].split()[-1])
    (run_dir / "recording.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    from .recording_facts import write_facts_and_readme

    facts = write_facts_and_readme(run_dir)
    log(f"{run.run}: {result['requests']} requests in {result['wall_s']:.1f} s, client status "
        f"{result['http_status']}; {facts.get('gateway', {}).get('attempts', '-')} gateway attempts -> {run_dir}")
    return run_dir


def _check_no_key(run_dir: Path, key: str) -> None:
    """The proxy's master key must not be in any recorded file (LiteLLM logs a hash or an alias, never the key)."""
    for path in run_dir.rglob("*"):
        if path.is_file() and key.encode() in path.read_bytes():
            raise SystemExit(f"Error: the proxy's key was written into {path}; the run is not kept.")


def main(argv: list[str] | None = None) -> int:
    ap, sub = list_run_parser("python -m tools.engine.recordings", __doc__, list(RUNS), "run",
                              "the runs and what each injects", "record runs into OUT/<run>/")
    for name, p in sub.choices.items():
        if name == "run":
            p.add_argument("--litellm", default=None, help="the litellm executable of the proxy's own venv "
                                                           "(default: $SERVLENS_LITELLM, then PATH)")
    facts = sub.add_parser("facts", help="recompute facts.json and README.md of recorded run folders")
    facts.add_argument("folders", nargs="+", type=Path)
    index = sub.add_parser("index", help="write FOLDER/README.md, one row per recorded run in it")
    index.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for r in RUNS.values():
            print(f"{r.run}:\n  {r.description}")
        return 0
    if args.cmd == "facts":
        from .recording_facts import write_facts_and_readme

        for folder in args.folders:
            write_facts_and_readme(folder)
        return 0
    if args.cmd == "index":
        from .recording_facts import write_index

        print(write_index(args.folder))
        return 0
    names = chosen(args.names, list(RUNS), "run")
    if names is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            record(RUNS[name], args.out, args.model_cache, args.seed, args.litellm)
    except GatewayError as exc:
        print(f"Error: {exc}.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
