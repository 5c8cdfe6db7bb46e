"""Simulations that measure how `servlens compare` behaves: false-fail rate (A/A), power, mix shift, thin data.

Each trial writes two runs into an in-memory store and runs the real compare (DuckDB aggregation, covariate fit,
batch means, Holm, verdicts) under the built-in policy, so the numbers describe the tool as shipped. Reproduce the
tables in docs/compare.md with:

    python -m tools.compare_simulation --trials 60 --seed 1

It lives in tools/ (not the installed package): it reads the recorded engine runs under tests/data/.

The latency model (DESIGN.md targets): log TTFT = a + b·log prompt tokens + noise, lognormal with total σ 0.6 of
which the prompt explains R² ≈ 0.7 (noise σ 0.33); the noise is independent, or AR(1) with φ 0.9 between neighbours
in arrival order (a bursty engine). TPOT lognormal (σ 0.3, median 30 ms); e2e = TTFT + TPOT·(output − 1).

Scenarios:
  aa            both runs from one model, same prompt mix (independent, or AR(1) φ 0.9)
  aa-engine     real per-request latencies recorded from llama.cpp and vLLM (CPU), resampled into both runs
  power         after-TTFT × 1.15 (and × 1.3) at several sizes
  mix           5% → 30% long prompts (naive p99 TTFT moves ≥ 40%), identical per-request latency model
  thin          30 requests a side
  shared-day    a day with the load curve and an incident shared by both runs at the same clock time, bursts and
                AR(1) φ 0.9 of their own: A/A, ×1.15, ×1.25; with time-of-day clocks (paired windows) and with
                relative clocks (unpaired batch means)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from servlens.compare.engine import compare_runs
from servlens.compare.policy import Policy, load_policy

REPO = Path(__file__).resolve().parents[1]
ENGINE_LOGS = [REPO / "tests" / "data" / "shared" / "real-engine" / name / "requests.jsonl"
               for name in ("llamacpp", "vllm-cpu")]
SIGMA, R2 = 0.6, 0.7
PROMPT_LOG_SD = 0.8           # log prompt tokens ~ N(ln 500, 0.8²) in the power and A/A scenarios


def insert_requests(con, run: str, columns: dict[str, np.ndarray]) -> None:
    """Insert canonical rows given as numpy columns (DuckDB scans the arrays; no Python loop over rows)."""
    n = len(next(iter(columns.values())))
    frame = {"run": np.full(n, run, dtype=object)}
    for name, values in columns.items():
        values = np.asarray(values)
        frame[name] = values.astype(object) if values.dtype.kind in "UO" else values
    con.register("_servlens_sim_rows", frame)
    con.execute("INSERT INTO requests BY NAME SELECT * FROM _servlens_sim_rows")
    con.unregister("_servlens_sim_rows")


def noise(rng: np.random.Generator, n: int, sd: float, phi: float = 0.0) -> np.ndarray:
    """N(0, sd²) noise; with phi, an AR(1) series in arrival order with the same marginal sd."""
    e = rng.normal(0.0, sd, n)
    if phi:
        from scipy.signal import lfilter

        # e_t = φ·e_(t−1) + √(1−φ²)·η_t, started from the stationary distribution (e_0 ~ N(0, sd²))
        e[1:] = lfilter([np.sqrt(1 - phi * phi)], [1, -phi], e[1:], zi=[phi * e[0]])[0]
    return e


def latency_model(rng: np.random.Generator, prompt: np.ndarray, output: np.ndarray, ttft_scale: float = 1.0,
                  phi: float = 0.0, slope: float | None = None) -> dict[str, np.ndarray]:
    """Per-request latencies: log TTFT linear in log prompt tokens (σ 0.6 total, R² 0.7 at PROMPT_LOG_SD), noise
    independent or AR(1); TPOT lognormal (σ 0.3, median 30 ms); e2e = TTFT + TPOT·(output − 1)."""
    n = len(prompt)
    b = slope if slope is not None else SIGMA * np.sqrt(R2) / PROMPT_LOG_SD
    log_ttft = np.log(0.2) + b * (np.log(prompt) - np.log(500)) + noise(rng, n, SIGMA * np.sqrt(1 - R2), phi)
    ttft = np.exp(log_ttft) * ttft_scale
    tpot = 0.03 * np.exp(rng.normal(0.0, 0.3, n))
    e2e = ttft + tpot * np.maximum(output - 1, 0)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}


def arrivals(n: int, rate: float = 20.0) -> np.ndarray:
    """Arrival timestamps (µs since the epoch as datetime64) of a Poisson stream at `rate` per second."""
    steps = np.cumsum(np.full(n, 1.0 / rate))
    return (np.datetime64("2026-01-01T00:00:00") + (steps * 1e6).astype("timedelta64[us]"))


def _rows(rng, prompt, output, model="sim-model", ttft_scale=1.0, phi=0.0) -> dict[str, np.ndarray]:
    n = len(prompt)
    cols = {"model": np.full(n, model, dtype=object), "prompt_tokens": prompt.astype(np.int64),
            "completion_tokens": output.astype(np.int64), "status": np.full(n, "ok", dtype=object),
            "finish_reason": np.full(n, "stop", dtype=object), "t_arrival": arrivals(n)}
    cols.update(latency_model(rng, prompt, output, ttft_scale, phi=phi))
    return cols


def prompt_tokens(rng, n) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.exp(rng.normal(np.log(500), PROMPT_LOG_SD, n))
    output = np.exp(rng.normal(np.log(200), 0.6, n))
    return np.maximum(prompt, 1).astype(np.int64), np.maximum(output, 1).astype(np.int64)


def chat_tokens(rng, n, long_share=0.05) -> tuple[np.ndarray, np.ndarray]:
    """Short chat prompts (median ≈ 300 tokens) with a share of long RAG prompts (median ≈ 6,000 tokens)."""
    long = rng.random(n) < long_share
    prompt = np.where(long, np.exp(rng.normal(np.log(6000), 0.3, n)), np.exp(rng.normal(np.log(300), 0.5, n)))
    output = np.exp(rng.normal(np.log(200), 0.6, n))
    return np.maximum(prompt, 1).astype(np.int64), np.maximum(output, 1).astype(np.int64)


def load_engine_latencies() -> dict[str, np.ndarray]:
    """Successful requests recorded from the real engines: model, prompt/output tokens, client TTFT and e2e."""
    import duckdb

    files = ", ".join(f"'{p}'" for p in ENGINE_LOGS)
    data = duckdb.execute(f"""
        SELECT CASE WHEN filename LIKE '%vllm%' THEN 'vllm-cpu' ELSE 'llamacpp' END AS model,
               coalesce(stream_final_chunk.usage.prompt_tokens, response.usage.prompt_tokens) AS prompt_tokens,
               coalesce(stream_final_chunk.usage.completion_tokens, response.usage.completion_tokens) AS out_tokens,
               first_byte_ts - send_ts AS ttft_s, e2e_s
        FROM read_json_auto([{files}], filename = true, union_by_name = true)
        WHERE http_status = 200 AND e2e_s IS NOT NULL""").fetchnumpy()
    return {k: np.asarray(v) for k, v in data.items()}


def _new_store():
    from servlens.store.schema import open_store

    return open_store(None)


def _trial(before: dict, after: dict, policy: Policy, seed: int) -> dict:
    con = _new_store()
    try:
        insert_requests(con, "before", before)
        insert_requests(con, "after", after)
        return compare_runs(con, "before", "after", policy, seed=seed)
    finally:
        con.close()


def _tally(docs: list[dict], gate_id: str = "ttft_p99") -> dict:
    out = {"trials": len(docs)}
    for key, pick in (("overall", lambda d: d["verdict"]),
                      (gate_id, lambda d: next(g["verdict"] for g in d["gates"] if g["id"] == gate_id))):
        verdicts = [pick(d) for d in docs]
        out[key] = {v: round(verdicts.count(v) / len(docs), 3) for v in ("pass", "fail", "inconclusive")}
    out["any_gate_fail"] = round(sum(any(g["verdict"] == "fail" for g in d["gates"]) for d in docs) / len(docs), 3)
    # how often the gate's Holm interval excluded no change: in an A/A, the intervals' own false-alarm rate
    out[f"{gate_id}_significant"] = round(sum(bool(next(g for g in d["gates"] if g["id"] == gate_id).get(
        "significant")) for d in docs) / len(docs), 3)
    return out


def run_aa(n: int, trials: int, seed: int, phi: float = 0.0, policy: Policy | None = None) -> dict:
    policy = policy or load_policy()
    rng = np.random.default_rng([seed, n, int(phi * 100), 1])
    docs = []
    for t in range(trials):
        pb, ob = prompt_tokens(rng, n)
        pa, oa = prompt_tokens(rng, n)
        docs.append(_trial(_rows(rng, pb, ob, phi=phi), _rows(rng, pa, oa, phi=phi), policy, seed + t))
    return {"scenario": f"A/A{' AR(1) φ %g' % phi if phi else ''}", "n_per_side": n, **_tally(docs)}


def run_aa_engine(n: int, trials: int, seed: int, policy: Policy | None = None) -> dict:
    """Real engine latencies (llama.cpp and vLLM CPU runs) resampled into two runs of n requests each."""
    pool = load_engine_latencies()
    policy = policy or load_policy()
    rng = np.random.default_rng([seed, n, 3])
    docs = []
    size = len(pool["e2e_s"])
    for t in range(trials):
        sides = []
        for _ in range(2):
            pick = rng.integers(0, size, n)
            sides.append({"model": pool["model"][pick].astype(object),
                          "prompt_tokens": pool["prompt_tokens"][pick], "completion_tokens": pool["out_tokens"][pick],
                          "ttft_s": pool["ttft_s"][pick], "e2e_s": pool["e2e_s"][pick],
                          "status": np.full(n, "ok", dtype=object), "t_arrival": arrivals(n)})
        docs.append(_trial(sides[0], sides[1], policy, seed + t))
    return {"scenario": "A/A real engine latencies", "n_per_side": n, "pool": int(size), **_tally(docs)}


def run_power(n: int, factor: float, trials: int, seed: int, policy: Policy | None = None) -> dict:
    policy = policy or load_policy()
    rng = np.random.default_rng([seed, n, int(factor * 1000), 4])
    docs = []
    for t in range(trials):
        pb, ob = prompt_tokens(rng, n)
        pa, oa = prompt_tokens(rng, n)
        docs.append(_trial(_rows(rng, pb, ob), _rows(rng, pa, oa, ttft_scale=factor), policy, seed + t))
    return {"scenario": f"power ×{factor:g}", "n_per_side": n, **_tally(docs)}


def _small_rows(rng, n, factor, phi, cold):
    """A run of a few dozen requests on a busy machine: AR(1) load drift on log latency (φ, σ 0.6) and its first
    `cold` requests six times slower (an engine's cold cache), all scaled by `factor`."""
    pb, ob = prompt_tokens(rng, n)
    rows = _rows(rng, pb, ob, ttft_scale=factor, phi=phi)
    rows["ttft_s"][:cold] *= 6.0
    rows["e2e_s"][:cold] += rows["ttft_s"][:cold] * 5 / 6
    return rows


def run_small(n: int, factor: float, trials: int, seed: int, phi: float = 0.9, cold: int = 2,
              policy: Policy | None = None) -> dict:
    """Before/after runs of n requests each, both drifting and both starting cold; the after run's latencies ×factor
    (1: an A/A pair). Gated on TTFT p50, the gate such a small pair can judge."""
    policy = policy or load_policy()
    rng = np.random.default_rng([seed, n, int(factor * 1000), int(phi * 100), cold, 6])
    docs = [_trial(_small_rows(rng, n, 1.0, phi, cold), _small_rows(rng, n, factor, phi, cold), policy, seed + t)
            for t in range(trials)]
    return {"scenario": f"{n} a side, AR(1) φ {phi:g}, {cold} cold, ×{factor:g}", "n_per_side": n,
            **_tally(docs, "ttft_p50")}


DAY_S = 86400


def day_arrivals(rng: np.random.Generator, n: int) -> np.ndarray:
    """n arrival offsets (s, sorted) over one day, at a rate that follows the day: quiet night, busy afternoon."""
    hour = np.arange(DAY_S) / 3600.0
    rate = 0.25 + 0.75 * np.exp(-(((hour - 14.5) / 4.5) ** 2))
    cumulative = np.concatenate([[0.0], np.cumsum(rate)])
    u = np.sort(rng.uniform(0.0, cumulative[-1], n))
    sec = np.clip(np.searchsorted(cumulative, u, side="right") - 1, 0, DAY_S - 1)
    return sec + (u - cumulative[sec]) / rate[sec]


def shared_day_structure(offsets: np.ndarray) -> np.ndarray:
    """What both runs share at the same clock time, on the log TTFT scale: queueing that grows with the day's load
    (+0.8 at the afternoon peak) and an incident both ran through (+1.2 from 14:00 to 14:45)."""
    hour = offsets / 3600.0
    load = np.exp(-(((hour - 14.5) / 4.5) ** 2))
    incident = (hour >= 14.0) & (hour < 14.75)
    return 0.8 * load + 1.2 * incident


def _day_rows(rng, n, ttft_scale=1.0, phi=0.9, paired_clock=True) -> dict[str, np.ndarray]:
    """One run of a day: the shared structure above, plus what is the run's own — three bursts of 4–10 minutes at
    random times (+0.5 on log TTFT) and AR(1) noise in arrival order. With paired_clock False the arrival times are
    a relative clock (seconds since the run's start), so compare cannot pair the runs by time of day."""
    offsets = day_arrivals(rng, n)
    prompt, output = prompt_tokens(rng, n)
    cols = _rows(rng, prompt, output, ttft_scale=ttft_scale, phi=phi)
    own = np.zeros(n)
    for _ in range(3):
        start = rng.uniform(0, DAY_S)
        own += 0.5 * ((offsets >= start) & (offsets < start + rng.uniform(240, 600)))
    shift = np.exp(shared_day_structure(offsets) + own)
    cols["ttft_s"] = cols["ttft_s"] * shift
    cols["e2e_s"] = cols["e2e_s"] + cols["ttft_s"] * (1 - 1 / shift)
    origin = np.datetime64("2026-01-05T00:00:00" if paired_clock else "1970-01-01T00:00:00")
    cols["t_arrival"] = origin + (offsets * 1e6).astype("timedelta64[us]")
    return cols


def run_shared_day(n: int, trials: int, seed: int, factor: float = 1.0, paired_clock: bool = True,
                   policy: Policy | None = None) -> dict:
    """Both runs are a day with the same load curve and incident at the same clock time, each with bursts of its
    own and AR(1) φ 0.9 neighbours; the after run's TTFT × factor (1.0: an A/A)."""
    policy = policy or load_policy()
    rng = np.random.default_rng([seed, n, int(factor * 1000), int(paired_clock), 7])
    docs = [_trial(_day_rows(rng, n, paired_clock=paired_clock),
                   _day_rows(rng, n, ttft_scale=factor, paired_clock=paired_clock), policy, seed + t)
            for t in range(trials)]
    name = "A/A" if factor == 1.0 else f"TTFT ×{factor:g}"
    out = {"scenario": f"{name}, shared day structure ({'time-of-day clock' if paired_clock else 'relative clock'})",
           "n_per_side": n, **_tally(docs)}
    out["paired"] = round(sum(d["gates"][0].get("batch_means", {}).get("paired", False) for d in docs) / trials, 3)
    out["ttft_p50"] = _tally(docs, "ttft_p50")["ttft_p50"]
    return out


def run_mix_shift(n: int, seed: int, policy: Policy | None = None) -> dict:
    """5% → 30% long prompts; each request's latency depends only on its tokens, the same way in both runs."""
    rng = np.random.default_rng([seed, n, 5])
    pb, ob = chat_tokens(rng, n, long_share=0.05)
    pa, oa = chat_tokens(rng, n, long_share=0.30)
    return _trial(_rows(rng, pb, ob), _rows(rng, pa, oa), policy or load_policy(), seed)


def run_mix_trials(n: int, trials: int, seed: int, policy: Policy | None = None) -> dict:
    docs = [run_mix_shift(n, seed + t, policy) for t in range(trials)]
    naive = [next(r for r in d["mix_shift"]["naive_vs_adjusted"] if r["gate"] == "TTFT p99")["naive_change"]
             for d in docs]
    return {"scenario": "mix 5%→30% long", "n_per_side": n, "naive_p99_change_min": round(min(naive), 3),
            **_tally(docs)}


def run_thin(seed: int, policy: Policy | None = None) -> dict:
    rng = np.random.default_rng([seed, 6])
    pb, ob = prompt_tokens(rng, 30)
    pa, oa = prompt_tokens(rng, 30)
    return _trial(_rows(rng, pb, ob), _rows(rng, pa, oa), policy or load_policy(), seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compare_simulation", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="3k a side only")
    args = parser.parse_args(argv)
    sizes = (3000,) if args.quick else (3000, 20000)
    t = args.trials
    cells = [lambda n=n: run_aa(n, t, args.seed) for n in sizes]
    cells += [lambda n=n: run_aa(n, t, args.seed, phi=0.9) for n in sizes]
    cells += [lambda: run_aa_engine(3000, t, args.seed)]
    cells += [lambda n=n: run_power(n, 1.15, t, args.seed) for n in sizes]
    cells += [lambda: run_power(3000, 1.3, t, args.seed)]
    cells += [lambda: run_mix_trials(20000, max(t // 3, 5), args.seed)]
    for clock in (True, False):
        cells += [lambda n=n, f=f, c=clock: run_shared_day(n, t, args.seed, f, c) for n in sizes
                  for f in (1.0, 1.15, 1.25)]
    for cell in cells:
        print(json.dumps(cell()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
