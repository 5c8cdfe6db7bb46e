"""Named scenarios: which model and engine flags each run uses, and the load it receives.

Each scenario has one or more runs; each run gets a fresh server (so a cache never carries over between runs), a
scraper, and its own folder ``OUT/<run>/`` with ``requests.jsonl``, ``metrics_<run>_NNN.prom``,
``metrics_index.jsonl``, ``slots_<run>_end.json``, ``props.json``, ``models.json`` and ``engine.log``. Runs that are
meant to be compared use the same seeded plan, so only the engine setting differs. ``OUT/summary.jsonl`` gets one
line per run (flags, counts, wall time).

Keep every run small: tens of requests, tens of seconds, so the whole e2e set fits a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import requests

from .load import MetricsScraper, PlannedRequest, RequestLog, drive
from .model import WORDS, ModelSpec, ensure_model
from .server import ServerConfig, start_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# Output shaped like a thinking model's: a thought inside <think>…</think>, then the answer (GBNF, llama.cpp grammar).
THINK_GRAMMAR = r'''root ::= "<think>" thought "</think>" answer
thought ::= (" " word){4,24} "\n"
answer ::= (" " word){1,40}
word ::= [a-z]+
'''


def text(rng: random.Random, n_words: int) -> str:
    """Sentences of vocabulary words (one token per word), capitalised, with a full stop every 6-16 words."""
    out, left = [], n_words
    while left > 0:
        k = min(left, rng.randint(6, 16))
        words = [rng.choice(WORDS) for _ in range(k)]
        words[0] = words[0][:1].upper() + words[0][1:]
        out.append(" ".join(words) + ".")
        left -= k
    return " ".join(out)


def shared_system_prompt(n_words: int = 450, seed: int = 99) -> str:
    """The long system prompt every request of a 'shared prefix' workload starts with: ~600 tokens, and well over
    the 2,048 characters that servlens' prefix_key hashes."""
    return "You are a helpful assistant for the operations team. " + text(random.Random(seed), n_words)


def poisson_offsets(rng: random.Random, rate: float, n: int, start: float = 0.0) -> list[float]:
    t, out = start, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(round(t, 4))
    return out


def chat_body(rng: random.Random, *, user_words: int, max_tokens: int, stream: bool, include_usage: bool = True,
              system: str | None = None, cache_prompt: bool | None = None, grammar: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text(rng, user_words)}]
    body: dict = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "stream": stream,
                  "temperature": 0.8}
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    if grammar:
        body["grammar"] = grammar
    return body


def _words(body: dict) -> int:
    if "messages" in body:
        return sum(len(m["content"].split()) for m in body["messages"])
    return len(body.get("prompt", "").split())


def _plan(items: list[tuple[float, str, dict]]) -> list[PlannedRequest]:
    return [PlannedRequest(i, off, path, body, _words(body)) for i, (off, path, body) in enumerate(items)]


# ---- plans -------------------------------------------------------------------------------------------------------

def prefix_plan(cache_prompt: bool, n: int = 40, rate: float = 2.0, seed: int = 11) -> list[PlannedRequest]:
    """Every request starts with the same long system prompt; only cache_prompt differs between the two runs."""
    rng = random.Random(seed)
    system = shared_system_prompt()
    offsets = poisson_offsets(rng, rate, n)
    items = []
    for off in offsets:
        body = chat_body(rng, system=system, user_words=rng.randint(5, 40), max_tokens=rng.choice([16, 32, 64]),
                         stream=True, include_usage=rng.random() < 0.7, cache_prompt=cache_prompt)
        items.append((off, CHAT, body))
    return _plan(items)


def steady_plan(n: int = 80, rate: float = 2.5, seed: int = 21) -> list[PlannedRequest]:
    """Poisson arrivals well below what 2 slots serve (a request takes ~0.1-0.4 s); 90% streamed; three quarters
    of the prompts in one length band (50-90 words, 64-127 tokens) so `compare` has a cohort of 40+ streamed
    requests a side, the rest short or long. Queueing stays rare, so no window's TTFT p99 should jump."""
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, rate, n):
        pick = rng.random()
        user_words = (rng.randint(50, 90) if pick < 0.75 else rng.randint(5, 20) if pick < 0.9
                      else rng.randint(150, 300))
        body = chat_body(rng, user_words=user_words, max_tokens=rng.choice([32, 64]),
                         stream=rng.random() < 0.9, include_usage=rng.random() < 0.7)
        items.append((off, CHAT, body))
    return _plan(items)


def burst_plan(seed: int = 31) -> list[PlannedRequest]:
    """A light steady background (1.5 req/s for 12 s) and, at t=4 s, 40 requests at once into 2 slots."""
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, 1.5, 18):
        body = chat_body(rng, user_words=rng.randint(10, 120), max_tokens=rng.choice([32, 64]), stream=True)
        items.append((off, CHAT, body))
    for _ in range(40):
        body = chat_body(rng, user_words=rng.randint(10, 120), max_tokens=rng.choice([64, 128]),
                         stream=rng.random() < 0.85)
        items.append((4.0, CHAT, body))
    return _plan(items)


def max_tokens_plan(n: int = 50, rate: float = 4.0, seed: int = 41) -> list[PlannedRequest]:
    """Most requests capped at 24 tokens, inside the model's natural answer lengths (mean ~40), the rest at 512."""
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, rate, n):
        cap = 24 if rng.random() < 0.7 else 512
        body = chat_body(rng, user_words=rng.randint(5, 80), max_tokens=cap, stream=rng.random() < 0.5)
        items.append((off, CHAT, body))
    return _plan(items)


def reasoning_plan(n: int = 40, rate: float = 4.0, seed: int = 51) -> list[PlannedRequest]:
    """Grammar-shaped thinking output (<think> thought </think> answer); mostly non-streamed so the text is logged."""
    rng = random.Random(seed)
    items = []
    for off in poisson_offsets(rng, rate, n):
        body = chat_body(rng, user_words=rng.randint(5, 60), max_tokens=160, stream=rng.random() < 0.2,
                         grammar=THINK_GRAMMAR)
        items.append((off, CHAT, body))
    return _plan(items)


def mixed_plan(n: int = 150, rate: float = 3.0, seed: int = 61) -> list[PlannedRequest]:
    """Production-like mix: half the chat requests carry the shared system prompt, a few prompts are longer than a
    slot's context (HTTP 400 exceed_context_size_error), a fifth use /v1/completions, max_tokens 16-256."""
    rng = random.Random(seed)
    system = shared_system_prompt()
    items = []
    for off in poisson_offsets(rng, rate, n):
        stream = rng.random() < 0.6
        max_tokens = rng.choice([16, 32, 64, 128, 256])
        if rng.random() < 0.2:
            body = {"model": "tiny", "prompt": text(rng, rng.randint(5, 200)), "max_tokens": max_tokens,
                    "stream": stream, "temperature": 0.8}
            if stream and rng.random() < 0.7:
                body["stream_options"] = {"include_usage": True}
            items.append((off, COMPLETIONS, body))
            continue
        user_words = 2200 if rng.random() < 0.03 else rng.choice([rng.randint(5, 40), rng.randint(50, 300)])
        body = chat_body(rng, system=system if rng.random() < 0.5 else None, user_words=user_words,
                         max_tokens=max_tokens, stream=stream, include_usage=rng.random() < 0.7)
        items.append((off, CHAT, body))
    return _plan(items)


# ---- scenarios ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    run: str
    template: str
    server: ServerConfig
    plan: Callable[[], list[PlannedRequest]]
    note: str


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    expect: str  # what servlens should find
    runs: tuple[RunSpec, ...] = field(default_factory=tuple)


P2 = ServerConfig(parallel=2, ctx_size=8192)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario(
        "prefix",
        "40 streamed chat requests at ~2/s, all starting with the same ~600-token system prompt, --parallel 2; "
        "run prefix_nocache sends cache_prompt=false, run prefix_cache cache_prompt=true (same plan).",
        "SL001 fires on prefix_nocache (shared prefix, no cached tokens) and is clear on prefix_cache; compare "
        "prefix_nocache -> prefix_cache shows TTFT falling.",
        (RunSpec("prefix_nocache", "chatml", P2, lambda: prefix_plan(False), "cache_prompt=false"),
         RunSpec("prefix_cache", "chatml", P2, lambda: prefix_plan(True), "cache_prompt=true")),
    ),
    Scenario(
        "burst",
        "--parallel 2: a light background (1.5 req/s) and at t=4 s a burst of 40 requests (max_tokens 64/128).",
        "SL004 fires: TTFT p99 in the burst windows is mostly slot wait (client TTFT minus timings.prompt_ms); "
        "llamacpp:requests_deferred > 0 in the scrapes.",
        (RunSpec("burst", "chatml", P2, burst_plan, "burst of 40 at t=4s"),),
    ),
    Scenario(
        "steady_ab",
        "Two identical runs (same seeded plan, fresh server each): Poisson 2.5 req/s, 50 requests, --parallel 2, "
        "mixed prompt lengths (three quarters 64-127 tokens), 90% streamed.",
        "SL004 clear on both; compare steady_a -> steady_b does not fail (pass or inconclusive at this size).",
        (RunSpec("steady_a", "chatml", P2, steady_plan, "steady"),
         RunSpec("steady_b", "chatml", P2, steady_plan, "steady, identical")),
    ),
    Scenario(
        "max_tokens",
        "50 requests at ~4/s; 70% capped at max_tokens=24, inside the model's natural answer lengths (mean ~40 "
        "tokens), 30% at 512.",
        "SL002 fires: the capped requests end by length at about 1-(1-1/40)^24 ~ 45% (the exact share is in the "
        "log); the 512-token requests almost never do.",
        (RunSpec("max_tokens", "chatml", P2, max_tokens_plan, "max_tokens 24 vs 512"),),
    ),
    Scenario(
        "reasoning",
        "Thinking template (Qwen3-style), grammar-shaped output '<think> thought </think> answer', 40 requests (80% not streamed); "
        "run reasoning_none with --reasoning-format none, run reasoning_deepseek with deepseek (same plan).",
        "SL003 fires on reasoning_none (<think> markers in content) and is clear on reasoning_deepseek (the thought "
        "is in reasoning_content).",
        (RunSpec("reasoning_none", "think", ServerConfig(parallel=2, ctx_size=8192, reasoning_format="none"),
                 reasoning_plan, "--reasoning-format none"),
         RunSpec("reasoning_deepseek", "think", ServerConfig(parallel=2, ctx_size=8192, reasoning_format="deepseek"),
                 reasoning_plan, "--reasoning-format deepseek")),
    ),
    Scenario(
        "mixed",
        "Production-like: 150 requests at ~3/s, --parallel 4 --ctx-size 8192 (2048 per slot): half the chat "
        "requests share a long system prompt, a fifth use /v1/completions, a few prompts exceed a slot's context.",
        "Ingest shows HTTP 400 exceed_context_size_error rows, cached tokens on the shared prefix, a stop/length mix.",
        (RunSpec("mixed", "chatml", ServerConfig(parallel=4, ctx_size=8192), mixed_plan, "production-like"),),
    ),
]}

E2E_SCENARIOS = ("prefix", "burst", "steady_ab", "max_tokens", "reasoning")


def run_scenario(name: str, out_dir: Path, model_cache: Path | None = None, seed: int = 1234,
                 log: Callable[[str], None] = print) -> list[dict]:
    """Run every run of scenario ``name`` into ``out_dir/<run>/``; return the per-run summaries."""
    scenario = SCENARIOS[name]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = []
    for spec in scenario.runs:
        summaries.append(run_one(spec, out_dir, scenario, model_cache, seed, log))
    return summaries


def run_one(spec: RunSpec, out_dir: Path, scenario: Scenario, model_cache: Path | None, seed: int,
            log: Callable[[str], None], before_stop: Callable[[], None] | None = None) -> dict:
    """One run into ``out_dir/<run>/``; ``before_stop`` is called once the load is done and the last scrape
    taken, while the engine still runs (an external Prometheus waits there for its own last scrape)."""
    run_dir = out_dir / spec.run
    if run_dir.exists():  # a rerun replaces the run's files instead of appending to them
        for f in run_dir.iterdir():
            if f.is_file():
                f.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    model = ensure_model(ModelSpec(seed=seed, template=spec.template), model_cache)
    plan = spec.plan()
    t0 = time.time()
    server = start_server(model, spec.server, log_path=run_dir / "engine.log")
    try:
        base = server.base_url
        for name, route in (("props.json", "/props"), ("models.json", "/v1/models")):
            (run_dir / name).write_text(requests.get(base + route, timeout=10).text, encoding="utf-8")
        scraper = MetricsScraper(base, spec.run, run_dir).start() if spec.server.metrics else None
        reqlog = RequestLog(run_dir / "requests.jsonl")
        try:
            result = drive(base, spec.run, plan, reqlog)
        finally:
            reqlog.close()
            if scraper:
                scraper.stop()
        (run_dir / f"slots_{spec.run}_end.json").write_text(requests.get(base + "/slots", timeout=10).text,
                                                            encoding="utf-8")
        if before_stop is not None:
            before_stop()
    finally:
        server.stop()
    summary = {"scenario": scenario.name, "run": spec.run, "note": spec.note, "model": Path(model).name,
               "template": spec.template, "flags": asdict(spec.server), **result,
               "scrapes": scraper.n if scraper else 0, "started_at": t0, "total_s": round(time.time() - t0, 3)}
    with open(out_dir / "summary.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(summary) + "\n")
    log(f"{spec.run}: {summary['requests']} requests in {summary['wall_s']:.1f} s, "
        f"status {summary['http_status']}, {summary['scrapes']} scrapes -> {run_dir}")
    return summary
