"""Gateway request logs at production scale, deterministic from a seed, for the benchmark and the sample logs.

Two output formats, each written exactly as the real systems write them:

- ``litellm``: LiteLLM's StandardLoggingPayload, one JSON object per line (what a custom callback or the s3/gcs
  loggers write): ``startTime``/``endTime``/``completionStartTime`` in Unix seconds, ``completionStartTime ==
  endTime`` when the call was not streamed, ``stream`` true or null (never false), ``status`` success/failure with
  ``error_information`` (empty strings on success), token counts 0 on failure, cached and reasoning tokens in
  ``metadata.usage_object``, the whole response in ``response`` (``{}`` on failure), ``model_parameters.max_tokens``
  only when the client sent it, ``hidden_params.litellm_overhead_time_ms`` in milliseconds.
- ``openai``: the generic OpenAI-style client log, the shape of tests/data/shared/real-engine/*/requests.jsonl
  (``body`` as sent, client times ``send_ts``/``first_token_ts``/``end_ts`` in Unix seconds, ``response`` or
  ``stream_final_chunk`` with ``usage``). ``first_token_ts`` is the first token of any kind (a reasoning model's
  thinking included); ``content_chunk_offsets_s`` lists only the first content chunk's offset from send (the real
  per-chunk list, hundreds of floats a request, would dominate the file), ``[]`` when no content came.

The traffic: several model groups (one a reasoning model) on two deployments each, lognormal prompt and output
lengths, a diurnal arrival rate with bursts (requests arrive by an inhomogeneous Poisson process), queueing that grows
with load, streamed and non-streamed calls, a share of errors (429/500/503, timeouts, context-window 400s), length
finishes where the output cap falls inside the output distribution, tool calls, gateway response-cache hits,
retries that share a ``trace_id``, and a population of long shared system prompts (longer than the 2,048 characters
``prefix_key`` hashes, so requests that share one share a key) that the engine's prefix cache serves.

Message text is abbreviated: a shared system prompt carries its opening 2.4-2.8k characters (enough for the
2,048 that ``prefix_key`` hashes) though it counts 1.5-4k tokens, a user message at most a few hundred characters
whatever its token count, and answers come from a small pool. Token counts are what the engine would report.

Incidents can be injected in a time window (``--incident KIND@HH:MM/DURATION[:MODEL]``):

- ``queue_spike``: requests wait for a slot (KV cache full): queue time rises by seconds, TTFT with it, TPOT stays
  flat; requests pushed past the gateway timeout fail as timeouts.
- ``prefix_cache_off``: the engine stops reusing the shared prefix: ``cached_tokens`` drops to 0, prefill and TTFT rise.
- ``reasoning_leak``: the reasoning model's output is no longer split: ``reasoning_content`` is null, the content
  holds the reasoning and its ``</think>`` end marker, and more answers hit the output cap.

``--pair`` writes a before/after pair from different seeds with one known regression (``--regression``), and a
manifest that states it.

Everything is vectorised: numpy draws the columns (handed to DuckDB as pandas frames of numpy arrays), DuckDB assembles and writes the JSON lines. Large sizes are
written in chunks of at most a million requests, each from its own seeded generator, so memory stays bounded.

Example:
    python benchmarks/generate.py --requests 1M --format litellm --out benchmarks/data/litellm-1M.jsonl
    python benchmarks/generate.py --requests 100k --incident queue_spike@14:00/45m --gz --out /tmp/day.jsonl.gz
    python benchmarks/generate.py --requests 1M --pair --regression ttft=1.25 --out benchmarks/data/pair-1M/
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

CHUNK_ROWS = 1_000_000
DEFAULT_START = "2026-11-27T00:00:00Z"
GATEWAY_TIMEOUT_S = 120.0
FORMATS = ("litellm", "openai")
INCIDENT_KINDS = ("queue_spike", "prefix_cache_off", "reasoning_leak")


@dataclass(frozen=True)
class ModelSpec:
    """One model group behind the gateway and how its engine behaves."""

    group: str  # what clients ask for (LiteLLM model_group)
    served: str  # the engine's served model name
    weight: float  # share of traffic
    prompt_median: float  # tokens, for requests without a shared system prompt
    prompt_sigma: float
    output_median: float  # tokens the model would write if uncapped
    output_sigma: float
    prefill_tok_s: float  # uncached prompt tokens per second
    tpot_s: float  # median time per output token at light load
    context: int
    reasoning: bool = False
    fallback: str | None = None  # model group the router retries on after a failure

    @property
    def litellm_model(self) -> str:
        return f"hosted_vllm/{self.served}"


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct", 0.45, 450, 1.0, 170, 0.9,
              25000, 0.012, 32768),
    ModelSpec("qwen2.5-32b-instruct", "Qwen/Qwen2.5-32B-Instruct", 0.25, 900, 1.0, 240, 0.9,
              9000, 0.030, 32768, fallback="llama-3.1-8b-instruct"),
    ModelSpec("llama-3.3-70b-instruct", "meta-llama/Llama-3.3-70B-Instruct", 0.18, 1200, 1.1, 240, 0.85,
              5000, 0.045, 131072, fallback="qwen2.5-32b-instruct"),
    ModelSpec("deepseek-r1-distill-qwen-14b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", 0.12, 300, 0.9, 900, 0.7,
              14000, 0.020, 32768, reasoning=True),
)
DEPLOYMENTS_PER_MODEL = 2
# max_tokens a client sends (-1: not sent) and how often; 256/512 sit inside the output distribution, so a few
# percent of answers end at the cap.
MAX_TOKENS_CHOICES = np.array([-1, 256, 512, 1024, 2048, 4096])
MAX_TOKENS_WEIGHTS = np.array([0.40, 0.02, 0.06, 0.30, 0.14, 0.08])
SHARED_PROMPTS = 6
SHARED_PROMPT_SHARE = 0.55
STREAM_SHARE = 0.7
ERROR_RATE = 0.008
RESPONSE_CACHE_HIT_RATE = 0.015
TOOL_CALL_RATE = 0.03
PREFIX_BLOCK = 16

# error kinds: (http code, LiteLLM exception class, share of errors, message template)
ERROR_KINDS = (
    ("429", "RateLimitError", 0.30,
     "litellm.RateLimitError: RateLimitError: Hosted_vllmException - Rate limit reached for {group}. "
     "Received Model Group={group}\nAvailable Model Group Fallbacks=None"),
    ("500", "InternalServerError", 0.20,
     "litellm.InternalServerError: InternalServerError: Hosted_vllmException - Connection error."),
    ("503", "ServiceUnavailableError", 0.12,
     "litellm.ServiceUnavailableError: ServiceUnavailableError: Hosted_vllmException - Service Unavailable"),
    ("400", "ContextWindowExceededError", 0.18,
     "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
     "Hosted_vllmException - This model's maximum context length is {context} tokens. However, you requested "
     "more tokens in the messages. Please reduce the length of the messages."),
    ("408", "Timeout", 0.20,
     "litellm.Timeout: APITimeoutError - Request timed out. Error_str: Request timed out. - timeout value="
     "{timeout}, time taken={timeout} seconds"),
)
TIMEOUT_KIND = 4
CONTEXT_KIND = 3
RETRYABLE_KINDS = (0, 1, 2)

WORDS = (
    "the model request latency queue token cache prefix decode prefill batch server engine memory stream answer "
    "question customer order account invoice refund policy document search result summary context window user "
    "system assistant reply please explain describe list steps careful concise format table json field value "
    "error retry timeout region cluster node replica gateway route budget team report incident review release "
    "version config flag metric dashboard alert threshold window percentile median tail rate share trend spike"
).split()


@dataclass
class Incident:
    kind: str
    start_s: float  # seconds from the start of the log
    end_s: float
    model: str | None = None  # model group; None = every model (reasoning_leak: the reasoning models)

    @classmethod
    def parse(cls, text: str) -> "Incident":
        """``KIND@HH:MM/DURATION[:MODEL]``, e.g. ``queue_spike@14:00/45m`` or ``prefix_cache_off@09:30/2h:qwen2.5-32b-instruct``."""
        match = re.fullmatch(r"([a-z_]+)@(\d{1,2}):(\d{2})/(\d+(?:\.\d+)?)([smh])(?::(.+))?", text)
        if not match or match.group(1) not in INCIDENT_KINDS:
            raise SystemExit(f"bad --incident {text!r}: expected KIND@HH:MM/DURATION[:MODEL], "
                             f"KIND one of {', '.join(INCIDENT_KINDS)}, e.g. queue_spike@14:00/45m")
        kind, hh, mm, amount, unit, model = match.groups()
        start = int(hh) * 3600 + int(mm) * 60
        length = float(amount) * {"s": 1, "m": 60, "h": 3600}[unit]
        if model is not None and model not in {m.group for m in MODELS}:
            raise SystemExit(f"bad --incident model {model!r}: one of {', '.join(m.group for m in MODELS)}")
        return cls(kind, float(start), float(start + length), model)


@dataclass
class Regression:
    """A known change between the before and the after run of a pair."""

    ttft: float = 1.0  # multiplies queue + prefill time
    tpot: float = 1.0  # multiplies time per output token
    error_rate: float = 0.0  # added to the error probability

    @classmethod
    def parse(cls, text: str) -> "Regression":
        reg = cls()
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in ("ttft", "tpot", "error_rate"):
                raise SystemExit(f"bad --regression {part!r}: keys are ttft, tpot, error_rate (e.g. ttft=1.25)")
            setattr(reg, key, float(value))
        return reg


@dataclass
class Scenario:
    requests: int
    seed: int = 7
    start: str = DEFAULT_START
    duration_s: float = 86400.0
    incidents: list[Incident] = field(default_factory=list)
    regression: Regression = field(default_factory=Regression)
    run: str = "gateway"
    redact: bool = False  # LiteLLM turn_off_message_logging: message and answer text replaced by redacted-by-litellm

    @property
    def start_epoch(self) -> float:
        return datetime.fromisoformat(self.start.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()


# ---------------------------------------------------------------------------------------------------------------
# Arrivals


def arrival_offsets(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``requests`` arrival offsets (s from start, sorted): an inhomogeneous Poisson process conditioned on its
    count, whose rate follows the day (quiet night, busy afternoon), drifts minute to minute and has bursts."""
    rng = np.random.default_rng([sc.seed, 0xA7])
    seconds = int(np.ceil(sc.duration_s))
    hour = (np.arange(seconds) / 3600.0) % 24
    rate = 0.25 + 0.75 * np.exp(-(((hour - 14.5) / 4.5) ** 2)) + 0.25 * np.exp(-(((hour - 9.5) / 1.5) ** 2))
    minute_noise = rng.lognormal(0.0, 0.15, size=seconds // 60 + 1)
    rate = rate * np.repeat(minute_noise, 60)[:seconds]
    for _ in range(max(1, int(sc.duration_s / 10800))):  # a burst every few hours: 2-8 min at 1.5-2.5x
        b0 = int(rng.uniform(0, seconds))
        b1 = min(seconds, b0 + int(rng.uniform(120, 480)))
        rate[b0:b1] *= rng.uniform(1.5, 2.5)
    cumulative = np.concatenate([[0.0], np.cumsum(rate)])
    u = np.sort(rng.uniform(0.0, cumulative[-1], size=sc.requests))
    sec = np.clip(np.searchsorted(cumulative, u, side="right") - 1, 0, seconds - 1)
    offsets = sec + (u - cumulative[sec]) / rate[sec]
    load = rate / np.quantile(rate, 0.99)  # load per second relative to the busy hours, for queueing
    return offsets, load


# ---------------------------------------------------------------------------------------------------------------
# One chunk of requests


def _in_window(t: np.ndarray, model_idx: np.ndarray, sc: Scenario, kind: str) -> np.ndarray:
    mask = np.zeros(t.shape, dtype=bool)
    for inc in sc.incidents:
        if inc.kind != kind:
            continue
        hit = (t >= inc.start_s) & (t < inc.end_s)
        if inc.model is not None:
            hit &= model_idx == [m.group for m in MODELS].index(inc.model)
        elif kind == "reasoning_leak":
            hit &= np.array([m.reasoning for m in MODELS])[model_idx]
        mask |= hit
    return mask


def simulate_chunk(sc: Scenario, chunk: int, t: np.ndarray, load: np.ndarray, row0: int,
                   system_tokens: np.ndarray) -> pd.DataFrame:
    """The requests arriving at offsets ``t`` (one chunk): every column the writers need, as numpy arrays."""
    rng = np.random.default_rng([sc.seed, 0xC0, chunk])
    n = t.size
    reg = sc.regression
    weights = np.array([m.weight for m in MODELS])
    model_idx = rng.choice(len(MODELS), size=n, p=weights / weights.sum())
    deployment = rng.integers(0, DEPLOYMENTS_PER_MODEL, size=n)

    # Errors first, so a retry can take the model its router falls back to before anything model-specific is drawn.
    error = rng.random(n) < ERROR_RATE + reg.error_rate
    shares = np.array([k[2] for k in ERROR_KINDS])
    error_kind = np.where(error, rng.choice(len(ERROR_KINDS), size=n, p=shares / shares.sum()), -1)
    # Retries: the request after a retryable failure is the router's retry (same trace_id), on the failed group's
    # fallback when it has one.
    trace_row = np.arange(row0, row0 + n)
    retry_of = np.isin(error_kind, RETRYABLE_KINDS) & (rng.random(n) < 0.5)
    retry_of[-1] = False
    retried = np.flatnonzero(retry_of) + 1
    trace_row[retried] = trace_row[retried - 1]
    groups = [m.group for m in MODELS]
    fallback_idx = np.array([groups.index(m.fallback) if m.fallback else i for i, m in enumerate(MODELS)])
    model_idx[retried] = fallback_idx[model_idx[retried - 1]]
    attempt = np.zeros(n, dtype=np.int64)
    attempt[retried] = 1

    def per_model(attr: str) -> np.ndarray:
        return np.array([getattr(m, attr) for m in MODELS], dtype=float)[model_idx]

    is_reasoning = np.array([m.reasoning for m in MODELS])[model_idx]
    # Prompts: a share opens with one of the long shared system prompts (Zipf-like popularity).
    shared = rng.random(n) < SHARED_PROMPT_SHARE
    pop = 1.0 / np.arange(1, SHARED_PROMPTS + 1)
    system_id = np.where(shared, rng.choice(SHARED_PROMPTS, size=n, p=pop / pop.sum()), -1)
    user_tokens = np.maximum(4, rng.lognormal(np.log(150), 0.9, size=n)).astype(np.int64)
    own_prompt = np.maximum(8, rng.lognormal(np.log(per_model("prompt_median")), per_model("prompt_sigma"))).astype(np.int64)
    prompt_tokens = np.where(shared, system_tokens[np.maximum(system_id, 0)] + user_tokens, own_prompt)
    prompt_tokens = np.minimum(prompt_tokens, per_model("context").astype(np.int64) - 4096)

    # Prefix cache: shared prefixes are served from cache (a few misses after eviction); incident switches it off.
    cache_off = _in_window(t, model_idx, sc, "prefix_cache_off")
    prefix_hit = shared & (rng.random(n) < 0.93) & ~cache_off
    cached_tokens = np.where(prefix_hit, (system_tokens[np.maximum(system_id, 0)] // PREFIX_BLOCK) * PREFIX_BLOCK, 0)

    # Output: what the model would write, capped by max_tokens when the client sent one.
    natural_out = np.maximum(1, rng.lognormal(np.log(per_model("output_median")), per_model("output_sigma"))).astype(np.int64)
    leak = _in_window(t, model_idx, sc, "reasoning_leak")
    natural_out = np.where(leak, (natural_out * 1.6).astype(np.int64), natural_out)  # unsplit reasoning runs long
    max_tokens = rng.choice(MAX_TOKENS_CHOICES, size=n, p=MAX_TOKENS_WEIGHTS)
    max_tokens = np.where(is_reasoning & (max_tokens > 0), max_tokens * 4, max_tokens)  # room for the thinking
    capped = (max_tokens > 0) & (natural_out >= max_tokens)
    completion_tokens = np.where(capped, max_tokens, natural_out)
    tool_call = ~capped & ~is_reasoning & (rng.random(n) < TOOL_CALL_RATE)
    finish = np.where(capped, "length", np.where(tool_call, "tool_calls", "stop"))
    reasoning_tokens = np.where(is_reasoning & ~leak,
                                np.minimum(completion_tokens, (completion_tokens * rng.beta(6, 3, size=n)).astype(np.int64)),
                                0)

    # Latency split: gateway overhead + queue (grows with load, spikes in an incident) + prefill, then decode.
    sec = np.clip(t.astype(np.int64), 0, load.size - 1)
    rho = np.minimum(0.97, 0.55 * load[sec])
    overhead_s = rng.lognormal(np.log(0.004), 0.4, size=n)
    queue_s = rng.exponential(1.0, size=n) * 0.02 * rho / (1.0 - rho)
    spike = _in_window(t, model_idx, sc, "queue_spike")
    queue_s = queue_s + np.where(spike, rng.lognormal(np.log(4.0), 0.7, size=n), 0.0)
    # Without prefix reuse every request recomputes its long prefix: the engine saturates and requests queue too.
    queue_s = queue_s + np.where(cache_off, rng.lognormal(np.log(0.6), 0.8, size=n), 0.0)
    prefill_s = (0.008 + (prompt_tokens - cached_tokens) / per_model("prefill_tok_s")) * rng.lognormal(0, 0.15, size=n)
    queue_s, prefill_s = queue_s * reg.ttft, prefill_s * reg.ttft
    tpot_s = per_model("tpot_s") * rng.lognormal(0, 0.2, size=n) * (1 + 0.3 * rho) * reg.tpot
    ttft_s = overhead_s + queue_s + prefill_s
    e2e_s = ttft_s + tpot_s * np.maximum(completion_tokens - 1, 0) + rng.exponential(0.002, size=n)

    # Every request the queue pushed past the gateway timeout fails as a timeout.
    timed_out = e2e_s > GATEWAY_TIMEOUT_S
    error_kind = np.where(timed_out, TIMEOUT_KIND, error_kind)
    error = error_kind >= 0
    fail_s = np.where(error_kind == TIMEOUT_KIND, GATEWAY_TIMEOUT_S + rng.exponential(0.05, size=n),
                      np.where(error_kind == CONTEXT_KIND, overhead_s + 0.01, overhead_s + queue_s + rng.exponential(0.05, size=n)))
    e2e_s = np.where(error, fail_s, e2e_s)

    stream = rng.random(n) < STREAM_SHARE
    cache_hit = ~error & ~is_reasoning & (rng.random(n) < RESPONSE_CACHE_HIT_RATE)
    hit_s = rng.lognormal(np.log(0.006), 0.3, size=n)
    e2e_s = np.where(cache_hit, hit_s, e2e_s)
    ttft_s = np.where(cache_hit, hit_s * 0.8, ttft_s)

    start = sc.start_epoch + t
    start[retried] = start[retried - 1] + e2e_s[retried - 1] + 0.05

    # Clocks read datetime.now(): microsecond resolution.
    start = np.round(start, 6)
    end = np.round(start + e2e_s, 6)
    # LiteLLM: completionStartTime = endTime unless a stream was assembled (not on failures or response-cache hits)
    streamed = stream & ~error & ~cache_hit
    first = np.where(streamed, np.round(start + ttft_s, 6), end)
    order = np.argsort(end, kind="stable")  # callbacks fire when a call ends
    cols = {
        "row": np.arange(row0, row0 + n),
        "trace_row": trace_row,
        "attempt": attempt,
        "model_idx": model_idx,
        "deployment": deployment,
        "start": start,
        "first": first,
        "end": end,
        "overhead_ms": np.round(overhead_s * 1000, 3),
        "stream": streamed,
        "stream_requested": stream,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
        "reasoning_tokens": reasoning_tokens,
        "max_tokens": max_tokens,
        "finish": finish,
        "error_kind": error_kind,
        "cache_hit": cache_hit,
        "system_id": system_id,
        "user_text": rng.integers(0, 256, size=n),
        "answer_text": rng.integers(0, 256, size=n),
        "temperature": rng.choice(np.array([0.0, 0.2, 0.7, 1.0]), size=n),
        "leak": leak & ~error,
        "reasoning": is_reasoning,
        "key_id": rng.integers(0, 24, size=n),
        "cache_off": cache_off,
    }
    return pd.DataFrame({k: v[order] for k, v in cols.items()}, copy=False)


# ---------------------------------------------------------------------------------------------------------------
# Text pools and lookup tables (small: built once, joined by DuckDB)


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(np.array(WORDS)[rng.integers(0, len(WORDS), size=count)])


def text_pools(seed: int) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng([seed, 0x7E])
    system = [f"You are the assistant for workflow {k + 1}. Follow the policy below exactly. " + _words(rng, int(rng.uniform(330, 400)))
              for k in range(SHARED_PROMPTS)]
    users = [_words(rng, int(rng.lognormal(np.log(25), 0.7)) + 3).capitalize() + "?" for _ in range(256)]
    answers = [_words(rng, int(rng.lognormal(np.log(30), 0.6)) + 2).capitalize() + "." for _ in range(256)]
    thoughts = [_words(rng, int(rng.lognormal(np.log(40), 0.5)) + 5).capitalize() + "." for _ in range(256)]
    models = pd.DataFrame({
        "model_idx": list(range(len(MODELS))),
        "group_name": [m.group for m in MODELS],
        "served": [m.served for m in MODELS],
        "litellm_model": [m.litellm_model for m in MODELS],
        "context": [m.context for m in MODELS],
    })
    deployments = []
    for i, m in enumerate(MODELS):
        for d in range(DEPLOYMENTS_PER_MODEL):
            host = re.sub(r"[^a-z0-9]+", "-", m.group.lower())
            deployments.append({"model_idx": i, "deployment": d,
                                "api_base": f"http://{host}-{d}.inference.svc.cluster.local:8000/v1",
                                "model_id": hashlib.sha256(f"{m.group}/{d}".encode()).hexdigest()})
    keys = [{"key_id": k, "key_hash": hashlib.sha256(f"sk-key-{seed}-{k}".encode()).hexdigest(),
             "team": ["search", "support-bot", "coding-assistant", "analytics", "batch-summaries", "internal-tools"][k % 6],
             "ip": f"10.{20 + k % 4}.{k * 7 % 256}.{k * 13 % 256}"} for k in range(24)]
    errors = [{"error_kind": i, "code": k[0], "cls": k[1], "template": k[3]} for i, k in enumerate(ERROR_KINDS)]
    return {
        "system_pool": pd.DataFrame({"system_id": list(range(SHARED_PROMPTS)), "system_text": system}),
        "user_pool": pd.DataFrame({"user_text": list(range(256)), "user": users}),
        "answer_pool": pd.DataFrame({"answer_text": list(range(256)), "answer": answers, "thought": thoughts}),
        "models_t": models,
        "deployments_t": pd.DataFrame(deployments),
        "keys_t": pd.DataFrame(keys),
        "errors_t": pd.DataFrame(errors),
    }


def system_prompt_tokens(seed: int) -> np.ndarray:
    """Tokens of each shared system prompt (agent and RAG instructions run to thousands of tokens; the log carries
    only their opening characters, enough for ``prefix_key``)."""
    rng = np.random.default_rng([seed, 0x5E5])
    return rng.integers(1500, 4000, size=SHARED_PROMPTS).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
# Writers: DuckDB builds each JSON line from the chunk's columns


_JOINED = """
    FROM chunk c
    JOIN models_t m USING (model_idx)
    JOIN deployments_t d USING (model_idx, deployment)
    JOIN keys_t k USING (key_id)
    JOIN user_pool u USING (user_text)
    JOIN answer_pool a USING (answer_text)
    LEFT JOIN system_pool s USING (system_id)
    LEFT JOIN errors_t e USING (error_kind)
"""

_BASE = """c.*, m.group_name, m.served, m.litellm_model, m.context, d.api_base, d.model_id, k.key_hash, k.team, k.ip,
    u.user, a.answer, a.thought, s.system_text, e.code, e.cls"""

_COMMON = """
    lower(md5('id-' || $seed || '-' || c.row)) AS hex_id,
    lower(md5('trace-' || $seed || '-' || c.trace_row)) AS hex_trace,
    lower(md5('call-' || $seed || '-' || c.row)) AS hex_call,
    c.error_kind >= 0 AS failed,
    -- every user message is its own (a ticket number leads it), so only the system prompts are shared prefixes
    CASE WHEN $redact THEN [{'role': 'user', 'content': 'redacted-by-litellm'}]
         WHEN c.system_id >= 0 THEN [{'role': 'system', 'content': s.system_text},
                                     {'role': 'user', 'content': 'Ticket ' || (100000 + c.row) || ': ' || u.user}]
         ELSE [{'role': 'user', 'content': 'Ticket ' || (100000 + c.row) || ': ' || u.user}] END AS messages,
    CASE WHEN c.finish = 'tool_calls' THEN NULL
         WHEN $redact THEN 'redacted-by-litellm'
         WHEN c.leak THEN a.thought || E'\\n</think>\\n\\n' || a.answer
         ELSE a.answer END AS content,
    CASE WHEN c.reasoning AND NOT c.leak THEN CASE WHEN $redact THEN 'redacted-by-litellm' ELSE a.thought END
         END AS reasoning_content,
    CASE WHEN c.finish = 'tool_calls'
         THEN [{'id': 'call_' || substr(md5('tool-' || c.row), 1, 24), 'type': 'function',
                'function': {'name': 'search_documents', 'arguments': '{"query": "' || split_part(u.user, ' ', 1) || '"}'}}]
         END AS tool_calls,
    replace(replace(replace(e.template, '{group}', m.group_name), '{context}', m.context::VARCHAR),
            '{timeout}', '120') AS error_text
"""


def _usage_sql(reasoning_detail: str) -> str:
    """The engine's own usage object (vLLM: prompt_tokens_details.cached_tokens with --enable-prompt-tokens-details)."""
    return f"""json_object(
        'prompt_tokens', prompt_tokens, 'total_tokens', prompt_tokens + completion_tokens,
        'completion_tokens', completion_tokens,
        'prompt_tokens_details', json_object('cached_tokens', cached_tokens),
        'completion_tokens_details', {reasoning_detail})"""


_REASONING_DETAIL = "CASE WHEN reasoning AND NOT leak THEN json_object('reasoning_tokens', reasoning_tokens) END"

# LiteLLM's normalised Usage, as it writes it into `response.usage` (litellm 1.110, recorded in tests/data/gateways/).
_LITELLM_USAGE = """json_object(
        'completion_tokens', completion_tokens, 'prompt_tokens', prompt_tokens,
        'total_tokens', prompt_tokens + completion_tokens,
        'completion_tokens_details', json_object('accepted_prediction_tokens', NULL, 'audio_tokens', NULL,
            'reasoning_tokens', reasoning_tokens, 'rejected_prediction_tokens', NULL,
            'text_tokens', completion_tokens - reasoning_tokens, 'image_tokens', NULL, 'video_tokens', NULL),
        'prompt_tokens_details', json_object('audio_tokens', NULL, 'cached_tokens', cached_tokens, 'image_tokens', NULL,
            'text_tokens', NULL, 'video_tokens', NULL, 'initial_prompt_tokens', NULL))"""

# error_information keys the newest LiteLLM adds after error_message (null unless a budget or rate limit tripped)
_ERROR_NULL_KEYS = (
    "error_provider_request_id", "error_rate_limit_category", "error_rate_limit_type", "error_budget_entity_type",
    "error_budget_entity_id", "error_budget_limit", "error_budget_spend", "error_cooldown_deployments",
    "normalized_error",
)
_METADATA_NULL_KEYS = (
    "user_api_key_spend", "user_api_key_max_budget", "user_api_key_budget_reset_at", "user_api_key_user_spend",
    "user_api_key_user_max_budget", "user_api_key_team_spend", "user_api_key_team_max_budget",
)


def litellm_sql(timeout: float) -> str:
    """One StandardLoggingPayload per row, keys in the order litellm 1.110 writes them (tests/data/gateways/)."""
    usage = _usage_sql(_REASONING_DETAIL)
    message = """json_object('content', content, 'role', 'assistant', 'tool_calls', tool_calls, 'function_call', NULL)"""
    message_reasoning = """json_object('content', content, 'role', 'assistant', 'tool_calls', tool_calls,
        'function_call', NULL, 'reasoning_content', reasoning_content, 'provider_specific_fields',
        json_object('reasoning_content', reasoning_content))"""
    meta_nulls = ", ".join(f"'{k}', NULL" for k in _METADATA_NULL_KEYS)
    error_nulls = ", ".join(f"'{k}', NULL" for k in _ERROR_NULL_KEYS)
    return f"""
WITH b AS (SELECT {_BASE}, {_COMMON} {_JOINED}),
p AS (SELECT *,
    CASE WHEN failed THEN 0.0 ELSE round((prompt_tokens - cached_tokens) * 1.5e-7 + cached_tokens * 0.75e-7
                                         + completion_tokens * 6e-7, 10) END AS cost,
    CASE WHEN failed THEN json_object() ELSE {usage} END AS usage_obj,
    substr(hex_call, 1, 8) || '-' || substr(hex_call, 9, 4) || '-4' || substr(hex_call, 14, 3) || '-a'
      || substr(hex_call, 18, 3) || '-' || substr(hex_call, 21, 12) AS call_uuid
  FROM b)
SELECT
  -- the provider's id; a failed attempt has none and logs its call id; a cache hit rewrites the id
  CASE WHEN failed THEN call_uuid
       WHEN cache_hit THEN 'chatcmpl-' || hex_id || '_cache_hit' || "end"::VARCHAR
       ELSE 'chatcmpl-' || hex_id END AS id,
  call_uuid AS litellm_call_id,
  substr(hex_trace, 1, 8) || '-' || substr(hex_trace, 9, 4) || '-4' || substr(hex_trace, 14, 3) || '-b'
    || substr(hex_trace, 18, 3) || '-' || substr(hex_trace, 21, 12) AS trace_id,
  '' AS session_id,
  'acompletion' AS call_type,
  CASE WHEN cache_hit THEN true WHEN failed OR stream THEN false END AS cache_hit,
  CASE WHEN stream AND NOT cache_hit THEN true END AS stream,
  CASE WHEN failed THEN 'failure' ELSE 'success' END AS status,
  {{'llm_api_status': CASE WHEN failed THEN 'failure' ELSE 'success' END, 'guardrail_status': 'not_run'}} AS status_fields,
  'hosted_vllm' AS custom_llm_provider,
  CASE WHEN cache_hit THEN cost ELSE 0.0 END AS saved_cache_cost,
  start AS startTime,
  "end" AS endTime,
  "first" AS completionStartTime,
  CASE WHEN stream AND NOT cache_hit THEN "first" - start ELSE "end" - start END AS response_time,
  litellm_model AS model,
  json_object('user_api_key_hash', key_hash, 'user_api_key_alias', team || '-prod', {meta_nulls},
              'user_api_key_team_id', 'team-' || team, 'user_api_key_org_id', NULL, 'user_api_key_org_alias', NULL,
              'user_api_key_project_id', NULL, 'user_api_key_project_alias', NULL, 'user_api_key_user_id', NULL,
              'user_api_key_team_alias', team, 'user_api_key_user_email', NULL, 'user_api_key_end_user_id', NULL,
              'user_api_key_request_route', '/v1/chat/completions', 'spend_logs_metadata', NULL,
              'requester_ip_address', ip, 'user_agent', 'OpenAI/Python 1.54.4', 'requester_metadata', json_object(),
              'prompt_management_metadata', NULL, 'applied_guardrails', json_array(), 'mcp_tool_call_metadata', NULL,
              'vector_store_request_metadata', NULL, 'routing_decision', NULL, 'usage_object', usage_obj,
              'requester_custom_headers', NULL, 'cold_storage_object_key', NULL, 'user_api_key_auth_metadata', NULL,
              'team_alias', NULL, 'team_id', NULL, 'kubernetes_pod_routing', NULL, 'used_client_oauth_token', NULL)
    AS metadata,
  CASE WHEN cache_hit THEN md5('ck-' || row) END AS cache_key,
  false AS cost_finalized,
  CASE WHEN cache_hit THEN 0.0 ELSE cost END AS response_cost,
  CASE WHEN failed THEN NULL
       ELSE json_object('total_cost', CASE WHEN cache_hit THEN 0.0 ELSE cost END, 'service_tier', NULL,
                        'data_residency', NULL, 'vertex_location', NULL,
                        'input_cost', CASE WHEN cache_hit THEN 0.0 ELSE round(cost - completion_tokens * 6e-7, 10) END,
                        'output_cost', CASE WHEN cache_hit THEN 0.0 ELSE round(completion_tokens * 6e-7, 10) END,
                        'tool_usage_cost', 0.0, 'original_cost', CASE WHEN cache_hit THEN 0.0 ELSE cost END,
                        'discount_percent', 0.0, 'discount_amount', 0.0, 'margin_percent', 0.0,
                        'margin_fixed_amount', 0.0, 'margin_total_amount', 0.0) END AS cost_breakdown,
  NULL::JSON AS autorouter_savings,
  NULL::JSON AS autorouter_savings_estimate,
  NULL::JSON AS autorouter_baseline_observation,
  CASE WHEN failed THEN 0 ELSE prompt_tokens + completion_tokens END AS total_tokens,
  CASE WHEN failed THEN 0 ELSE prompt_tokens END AS prompt_tokens,
  CASE WHEN failed THEN 0 ELSE completion_tokens END AS completion_tokens,
  ['team:' || team] AS request_tags,
  []::VARCHAR[] AS request_model_access_groups,
  NULL::VARCHAR AS end_user,
  api_base,
  group_name AS model_group,
  model_id,
  ip AS requester_ip_address,
  'OpenAI/Python 1.54.4' AS user_agent,
  messages,
  CASE WHEN failed THEN json_object()
       ELSE json_object('id', 'chatcmpl-' || hex_id, 'created', floor(start)::BIGINT, 'model', served,
                        'object', 'chat.completion', 'system_fingerprint', NULL,
                        'choices', json_array(json_object('finish_reason', finish, 'index', 0,
                            'message', CASE WHEN reasoning THEN {message_reasoning} ELSE {message} END,
                            'provider_specific_fields', json_object())),
                        'usage', {_LITELLM_USAGE}) END AS response,
  -- the client's request parameters; a response-cache hit logs none
  CASE WHEN cache_hit THEN json_object()
       ELSE json_merge_patch(
         json_object('temperature', temperature, 'stream', stream_requested),
         CASE WHEN stream_requested THEN json_object('stream_options', json_object('include_usage', true))
              ELSE json_object() END,
         CASE WHEN max_tokens > 0 THEN json_object('max_tokens', max_tokens) ELSE json_object() END) END
    AS model_parameters,
  CASE WHEN failed
       THEN json_object('model_id', NULL, 'cache_key', NULL, 'api_base', NULL, 'response_cost', 0.0,
                        'additional_headers', NULL, 'litellm_overhead_time_ms', NULL, 'batch_models', NULL,
                        'batch_successful_requests', NULL, 'batch_failed_requests', NULL,
                        'litellm_model_name', NULL, 'usage_object', NULL)
       ELSE json_object('model_id', model_id, 'cache_key', NULL, 'api_base', api_base,
                        'response_cost', CASE WHEN cache_hit THEN 0.0 ELSE cost END,
                        'additional_headers', CASE WHEN cache_hit
                            THEN json_object('x-litellm-model-group', group_name, 'x-litellm-attempted-retries', 0,
                                             'x-litellm-attempted-fallbacks', 0)
                            WHEN stream THEN json_object('llm_provider-date', strftime(to_timestamp(floor(start)), '%a, %d %b %Y %H:%M:%S GMT'),
                                             'llm_provider-server', 'uvicorn', 'llm_provider-content-type', 'text/event-stream; charset=utf-8',
                                             'llm_provider-transfer-encoding', 'chunked')
                            ELSE json_object('llm_provider-date', strftime(to_timestamp(floor("end")), '%a, %d %b %Y %H:%M:%S GMT'),
                                             'llm_provider-server', 'uvicorn', 'llm_provider-content-type', 'application/json',
                                             'x-litellm-model-group', group_name, 'x-litellm-attempted-retries', attempt,
                                             'x-litellm-attempted-fallbacks', 0) END,
                        'litellm_overhead_time_ms', overhead_ms, 'batch_models', NULL,
                        'batch_successful_requests', NULL, 'batch_failed_requests', NULL,
                        'litellm_model_name', litellm_model, 'usage_object', NULL) END AS hidden_params,
  {{'model_map_key': litellm_model, 'model_map_value': NULL::JSON}} AS model_map_information,
  CASE WHEN failed THEN error_text END AS error_str,
  CASE WHEN failed THEN json_object('error_code', code, 'error_class', cls, 'llm_provider', 'hosted_vllm',
                                    'traceback', '  File "litellm/main.py", line 1002, in acompletion\n    raise exception_type(\nlitellm.exceptions.' || cls,
                                    'error_message', error_text, {error_nulls})
       ELSE json_object('error_code', '', 'error_class', '', 'llm_provider', '', 'traceback', '', 'error_message', '',
                        {error_nulls}) END AS error_information,
  NULL::JSON AS response_cost_failure_debug_info,
  NULL::JSON AS zero_cost_diagnostic,
  NULL::JSON AS guardrail_information,
  {{'web_search_options': NULL::JSON, 'file_search': NULL::JSON}} AS standard_built_in_tools_params
FROM p
"""


def openai_sql(run: str) -> str:
    usage = _usage_sql(_REASONING_DETAIL)
    message = """CASE WHEN reasoning THEN json_object('role', 'assistant', 'content', content,
                         'reasoning_content', reasoning_content, 'tool_calls', tool_calls)
                      ELSE json_object('role', 'assistant', 'content', content, 'tool_calls', tool_calls) END"""
    return f"""
WITH b AS (SELECT {_BASE}, {_COMMON} {_JOINED}),
p AS (SELECT *, CASE WHEN failed THEN NULL ELSE {usage} END AS usage_obj,
             stream_requested AND NOT failed AS streamed,
             -- a streamed reply's first content token follows its reasoning; a tool call has no content chunk
             CASE WHEN content IS NULL THEN NULL
                  WHEN reasoning AND NOT leak
                  THEN "first" + ("end" - "first") * reasoning_tokens / greatest(completion_tokens, 1)
                  ELSE "first" END AS first_content
  FROM b)
SELECT
  row AS req_idx,
  '/v1/chat/completions' AS path,
  json_merge_patch(
    json_object('model', group_name, 'messages', messages),
    CASE WHEN max_tokens > 0 THEN json_object('max_tokens', max_tokens) ELSE json_object() END,
    CASE WHEN stream_requested THEN json_object('stream', true, 'temperature', temperature,
                                                'stream_options', json_object('include_usage', true))
         ELSE json_object('stream', false, 'temperature', temperature) END) AS body,
  '{run}' AS run,
  start AS send_ts,
  CASE WHEN failed THEN code::INTEGER ELSE 200 END AS http_status,
  -- a stream sends its headers at once; a plain reply sends headers and body together at the end
  CASE WHEN streamed THEN start + 0.003 ELSE "end" - 0.00006 END AS headers_ts,
  CASE WHEN streamed THEN "first" ELSE "end" - 0.00004 END AS first_byte_ts,
  CASE WHEN streamed THEN "first" END AS first_data_chunk_ts,
  -- first token of any kind (reasoning included); the first content chunk's offset is listed separately
  CASE WHEN streamed AND (content IS NOT NULL OR reasoning_content IS NOT NULL) THEN "first" END AS first_token_ts,
  CASE WHEN streamed THEN CASE WHEN first_content IS NULL THEN []::DOUBLE[]
                               ELSE [round(first_content - start, 6)] END END AS content_chunk_offsets_s,
  CASE WHEN streamed THEN completion_tokens + 1 END AS n_chunks,
  CASE WHEN failed THEN NULL
       WHEN NOT stream_requested THEN json_object('id', 'chatcmpl-' || hex_id, 'object', 'chat.completion',
            'created', floor(start)::BIGINT, 'model', served,
            'choices', json_array(json_object('index', 0, 'message', {message}, 'finish_reason', finish)),
            'usage', usage_obj) END AS response_ok,
  CASE WHEN failed THEN json_object('error', json_object('code', code::INTEGER, 'message', error_text, 'type', cls))
       END AS response_err,
  CASE WHEN streamed
       THEN json_object('id', 'chatcmpl-' || hex_id, 'object', 'chat.completion.chunk', 'created', floor(start)::BIGINT,
                        'model', served, 'choices', json_array(), 'usage', usage_obj) END AS stream_final_chunk,
  CASE WHEN failed THEN NULL ELSE finish END AS finish_reason,
  CASE WHEN failed THEN NULL ELSE length(coalesce(content, '')) END AS output_chars,
  "end" AS end_ts,
  round("end" - start, 6) AS e2e_s,
  CASE WHEN streamed AND (content IS NOT NULL OR reasoning_content IS NOT NULL) THEN round("first" - start, 6)
       END AS ttft_client_s
FROM p
"""


def _openai_final(sql: str) -> str:
    """Drop the keys a real record would not have (non-streamed: no stream fields; streamed: no response)."""
    return f"""
SELECT CASE WHEN stream_final_chunk IS NOT NULL THEN
         json_object('req_idx', req_idx, 'path', path, 'body', body, 'run', run, 'send_ts', send_ts,
                     'http_status', http_status, 'headers_ts', headers_ts, 'finish_reason', finish_reason,
                     'first_byte_ts', first_byte_ts, 'first_data_chunk_ts', first_data_chunk_ts,
                     'first_token_ts', first_token_ts, 'content_chunk_offsets_s', content_chunk_offsets_s,
                     'n_chunks', n_chunks, 'stream_final_chunk', stream_final_chunk,
                     'output_chars', output_chars, 'end_ts', end_ts, 'e2e_s', e2e_s, 'ttft_client_s', ttft_client_s)
       ELSE
         json_object('req_idx', req_idx, 'path', path, 'body', body, 'run', run, 'send_ts', send_ts,
                     'http_status', http_status, 'headers_ts', headers_ts, 'first_byte_ts', first_byte_ts,
                     'response', coalesce(response_ok, response_err), 'finish_reason', finish_reason,
                     'end_ts', end_ts, 'e2e_s', e2e_s) END AS line
FROM ({sql})
"""


def _write_chunk(con: duckdb.DuckDBPyConnection, fmt: str, sc: Scenario, chunk_df: pd.DataFrame, path: Path) -> None:
    con.register("chunk", chunk_df)
    if fmt == "litellm":
        sql = litellm_sql(GATEWAY_TIMEOUT_S)
        con.execute(f"COPY ({sql}) TO '{path}' (FORMAT JSON)", {"seed": str(sc.seed), "redact": sc.redact})
    else:
        sql = _openai_final(openai_sql(sc.run.replace("'", "")))
        # A single JSON column written as CSV without quoting is the JSON text itself, one line per row.
        con.execute(f"COPY ({sql}) TO '{path}' (FORMAT CSV, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\\t')",
                    {"seed": str(sc.seed), "redact": sc.redact})
    con.unregister("chunk")


def generate(sc: Scenario, fmt: str, out: Path, gz: bool | None = None, compresslevel: int = 6) -> dict:
    """Write ``sc.requests`` requests in ``fmt`` to ``out`` (gzip when ``gz`` or the name ends in .gz); return a summary."""
    if fmt not in FORMATS:
        raise SystemExit(f"bad --format {fmt!r}: one of {', '.join(FORMATS)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    gz = bool(gz) or out.name.endswith(".gz")
    pools = text_pools(sc.seed)
    sys_tokens = system_prompt_tokens(sc.seed)
    offsets, load = arrival_offsets(sc)
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    for name, frame in pools.items():
        con.register(name, frame)
    counts = {"requests": 0, "errors": 0, "length": 0, "streamed": 0}
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        sink = gzip.GzipFile(out, "wb", compresslevel=compresslevel, mtime=0) if gz else open(out, "wb")
        with sink:
            for chunk, row0 in enumerate(range(0, sc.requests, CHUNK_ROWS)):
                t = offsets[row0:row0 + CHUNK_ROWS]
                df = simulate_chunk(sc, chunk, t, load, row0, sys_tokens)
                counts["requests"] += len(df)
                counts["errors"] += int((df["error_kind"] >= 0).sum())
                counts["length"] += int(((df["finish"] == "length") & (df["error_kind"] < 0)).sum())
                counts["streamed"] += int(df["stream"].sum())
                part = Path(tmp) / f"part-{chunk}.jsonl"
                _write_chunk(con, fmt, sc, df, part)
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, sink, 8 << 20)
                part.unlink()
    con.close()
    return {"path": str(out), "format": fmt, "bytes": out.stat().st_size, **counts, "seed": sc.seed,
            "redacted": sc.redact,
            "start": sc.start, "duration_s": sc.duration_s, "incidents": [asdict(i) for i in sc.incidents],
            "regression": asdict(sc.regression)}


def generate_pair(sc: Scenario, fmt: str, out_dir: Path, regression: Regression, gz: bool = False) -> dict:
    """A before/after pair: the same traffic model from two seeds; the after run carries ``regression``."""
    out_dir = Path(out_dir)
    suffix = ".jsonl.gz" if gz else ".jsonl"
    before = Scenario(sc.requests, sc.seed, sc.start, sc.duration_s, list(sc.incidents), Regression(), "before",
                      sc.redact)
    after = Scenario(sc.requests, sc.seed + 1, sc.start, sc.duration_s, list(sc.incidents), regression, "after",
                     sc.redact)
    manifest = {"before": generate(before, fmt, out_dir / f"before{suffix}"),
                "after": generate(after, fmt, out_dir / f"after{suffix}"),
                "known_change": asdict(regression)}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def parse_count(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if not match:
        raise SystemExit(f"bad request count {text!r}: e.g. 100k, 1M, 10M or 25000")
    return int(float(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()])


def parse_duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        raise SystemExit(f"bad --duration {text!r}: e.g. 1d, 6h, 30m")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n" + __doc__.split("Example:\n", 1)[1])
    ap.add_argument("--requests", default="100k", help="how many requests: 100k, 1M, 10M, or a number")
    ap.add_argument("--format", default="litellm", choices=FORMATS)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--start", default=DEFAULT_START, help="UTC start of the log (ISO-8601)")
    ap.add_argument("--duration", default="1d", help="time span of the log (e.g. 1d, 6h)")
    ap.add_argument("--incident", action="append", default=[], metavar="KIND@HH:MM/DURATION[:MODEL]",
                    help=f"inject an incident; KIND one of {', '.join(INCIDENT_KINDS)}")
    ap.add_argument("--pair", action="store_true", help="write before/after files and a manifest into --out (a folder)")
    ap.add_argument("--regression", default="ttft=1.25", help="the after run's known change (ttft=, tpot=, error_rate=)")
    ap.add_argument("--run", default="gateway", help="run label written into openai-format records")
    ap.add_argument("--redact", action="store_true",
                    help="no message or answer text, as LiteLLM writes with turn_off_message_logging")
    ap.add_argument("--gz", action="store_true", help="gzip the output")
    ap.add_argument("--out", required=True, help="output file (or folder with --pair)")
    args = ap.parse_args(argv)
    sc = Scenario(parse_count(args.requests), args.seed, args.start, parse_duration(args.duration),
                  [Incident.parse(s) for s in args.incident], Regression(), args.run, args.redact)
    if args.pair:
        summary = generate_pair(sc, args.format, Path(args.out), Regression.parse(args.regression), args.gz)
    else:
        out = Path(args.out)
        if args.gz and not out.name.endswith(".gz"):
            out = out.with_name(out.name + ".gz")
        summary = generate(sc, args.format, out, gz=args.gz)
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
