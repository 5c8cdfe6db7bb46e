"""Simulations that measure how `servlens compare` behaves: false-fail rate (A/A), power, mix shift, thin data.

Each trial writes two runs into an in-memory store and runs the real compare (DuckDB aggregation, bootstrap, Holm,
verdicts), so the numbers describe the tool as shipped. Reproduce the table in docs/compare.md with:

    python -m servlens.compare.simulate --trials 60 --seed 1

Scenarios:
  aa-lognormal  both runs from one lognormal TTFT model (σ 0.6), same prompt mix
  aa-azure      the Azure 2023 conversation trace (real token counts), split at random into two halves;
                latency from a prefill/decode model of those tokens
  aa-engine     real per-request latencies recorded from llama.cpp and vLLM (CPU), resampled into both runs
  power         after-TTFT × 1.15 (and × 1.3) at several sizes
  mix           5% → 30% long prompts, identical per-request latency model
  thin          30 requests a side
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from servlens.compare.engine import compare_runs
from servlens.compare.policy import Gate, Policy

REPO = Path(__file__).resolve().parents[2]
AZURE_TRACE = REPO / "tests" / "data" / "shared" / "traces" / "azure_llm_2023_conv_first5000.csv"
ENGINE_LOGS = [REPO / "tests" / "data" / "shared" / "real-engine" / name / "requests.jsonl"
               for name in ("llamacpp", "vllm-cpu")]

# The policy the DESIGN.md figures were measured with: four latency gates, 95% family confidence (Holm).
SIM_POLICY = Policy(gates=(
    Gate("ttft", "p50", 0.10),
    Gate("ttft", "p99", 0.10, critical=True),
    Gate("tpot", "p50", 0.05),
    Gate("e2e", "p99", 0.10),
), source="simulation policy (4 latency gates)", bootstrap_resamples=1000)


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


def latency_model(rng: np.random.Generator, prompt: np.ndarray, output: np.ndarray, ttft_scale: float = 1.0,
                  sigma: float = 0.6, prefill: bool = False) -> dict[str, np.ndarray]:
    """Per-request latencies: TTFT lognormal (σ 0.6, median 0.2 s), or with `prefill` growing with the prompt
    (0.05 s + 50 µs per prompt token, same noise); TPOT lognormal (σ 0.3, median 30 ms); e2e = TTFT + TPOT·(n−1)."""
    n = len(prompt)
    median = (0.05 + prompt / 20000.0) if prefill else 0.2
    ttft = median * np.exp(rng.normal(0.0, sigma, n)) * ttft_scale
    tpot = 0.03 * np.exp(rng.normal(0.0, 0.3, n))
    e2e = ttft + tpot * np.maximum(output - 1, 0)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}


def _rows(rng, prompt, output, model="sim-model", ttft_scale=1.0, prefill=False) -> dict[str, np.ndarray]:
    cols = {"model": np.full(len(prompt), model, dtype=object), "prompt_tokens": prompt.astype(np.int64),
            "completion_tokens": output.astype(np.int64), "status": np.full(len(prompt), "ok", dtype=object),
            "finish_reason": np.full(len(prompt), "stop", dtype=object)}
    cols.update(latency_model(rng, prompt, output, ttft_scale, prefill=prefill))
    return cols


def chat_tokens(rng, n, long_share=0.05) -> tuple[np.ndarray, np.ndarray]:
    """Short chat prompts (median ≈ 300 tokens) with a share of long RAG prompts (median ≈ 6,000 tokens)."""
    long = rng.random(n) < long_share
    prompt = np.where(long, np.exp(rng.normal(np.log(6000), 0.3, n)), np.exp(rng.normal(np.log(300), 0.5, n)))
    output = np.exp(rng.normal(np.log(200), 0.6, n))
    return np.maximum(prompt, 1).astype(np.int64), np.maximum(output, 1).astype(np.int64)


def load_azure_tokens(path: Path = AZURE_TRACE) -> tuple[np.ndarray, np.ndarray]:
    import duckdb

    data = duckdb.execute(f"SELECT ContextTokens, GeneratedTokens FROM read_csv('{path}')").fetchnumpy()
    return np.asarray(data["ContextTokens"], dtype=np.int64), np.asarray(data["GeneratedTokens"], dtype=np.int64)


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
    return out


def run_aa_lognormal(n: int, trials: int, seed: int, policy: Policy = SIM_POLICY) -> dict:
    rng = np.random.default_rng([seed, n, 1])
    docs = []
    for t in range(trials):
        pb, ob = chat_tokens(rng, n)
        pa, oa = chat_tokens(rng, n)
        docs.append(_trial(_rows(rng, pb, ob), _rows(rng, pa, oa), policy, seed + t))
    return {"scenario": "aa-lognormal", "n_per_side": n, **_tally(docs)}


def run_aa_azure(trials: int, seed: int, policy: Policy = SIM_POLICY) -> dict:
    prompt, output = load_azure_tokens()
    rng = np.random.default_rng([seed, 2])
    docs = []
    for t in range(trials):
        order = rng.permutation(len(prompt))
        half = len(prompt) // 2
        lat = _rows(rng, prompt, output, prefill=True)            # one run's latencies, then split in two at random
        first, second = order[:half], order[half:]
        docs.append(_trial({k: v[first] for k, v in lat.items()}, {k: v[second] for k, v in lat.items()},
                           policy, seed + t))
    return {"scenario": "aa-azure", "n_per_side": len(prompt) // 2, **_tally(docs)}


def run_aa_engine(n: int, trials: int, seed: int, policy: Policy | None = None) -> dict:
    """Real engine latencies (llama.cpp and vLLM CPU runs) resampled into two runs of n requests each."""
    pool = load_engine_latencies()
    policy = policy or Policy(gates=(Gate("ttft", "p50", 0.10), Gate("ttft", "p99", 0.10, critical=True),
                                     Gate("e2e", "p99", 0.10)), source="engine A/A", bootstrap_resamples=1000)
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
                          "status": np.full(n, "ok", dtype=object)})
        docs.append(_trial(sides[0], sides[1], policy, seed + t))
    return {"scenario": "aa-engine", "n_per_side": n, "pool": int(size), **_tally(docs)}


def run_power(n: int, factor: float, trials: int, seed: int, policy: Policy = SIM_POLICY) -> dict:
    rng = np.random.default_rng([seed, n, int(factor * 1000), 4])
    docs = []
    for t in range(trials):
        pb, ob = chat_tokens(rng, n)
        pa, oa = chat_tokens(rng, n)
        docs.append(_trial(_rows(rng, pb, ob), _rows(rng, pa, oa, ttft_scale=factor), policy, seed + t))
    return {"scenario": f"power ×{factor:g}", "n_per_side": n, **_tally(docs)}


def run_mix_shift(n: int, seed: int, policy: Policy = SIM_POLICY) -> dict:
    """5% → 30% long prompts; each request's latency depends only on its tokens, the same way in both runs."""
    rng = np.random.default_rng([seed, n, 5])
    pb, ob = chat_tokens(rng, n, long_share=0.05)
    pa, oa = chat_tokens(rng, n, long_share=0.30)
    return _trial(_rows(rng, pb, ob, prefill=True), _rows(rng, pa, oa, prefill=True), policy, seed)


def run_thin(seed: int, policy: Policy = SIM_POLICY) -> dict:
    rng = np.random.default_rng([seed, 6])
    pb, ob = chat_tokens(rng, 30)
    pa, oa = chat_tokens(rng, 30)
    return _trial(_rows(rng, pb, ob), _rows(rng, pa, oa), policy, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servlens.compare.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer cells (3k and 5k only)")
    args = parser.parse_args(argv)
    sizes = (3000, 5000) if args.quick else (3000, 5000, 20000)
    cells = [lambda n=n: run_aa_lognormal(n, args.trials, args.seed) for n in sizes]
    cells += [lambda: run_aa_azure(args.trials, args.seed), lambda: run_aa_engine(3000, args.trials, args.seed)]
    cells += [lambda n=n: run_power(n, 1.15, args.trials, args.seed) for n in sizes]
    cells += [lambda: run_power(3000, 1.3, args.trials, args.seed)]
    for cell in cells:
        print(json.dumps(cell()), flush=True)
    mix = run_mix_shift(50000, args.seed)
    print(json.dumps({"scenario": "mix 5%→30% long", "verdict": mix["verdict"],
                      "mix_shift": {k: mix["mix_shift"][k] for k in ("significant", "total_variation")},
                      "naive_vs_adjusted": mix["mix_shift"]["naive_vs_adjusted"]}))
    thin = run_thin(args.seed)
    print(json.dumps({"scenario": "thin 30/side", "verdict": thin["verdict"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
