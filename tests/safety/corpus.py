"""The hostile-input corpus: files written at test time (no committed blobs), each the smallest file that shows one
way input goes wrong (issue 15). Bombs are built here too, sized by the caller."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "tests" / "data" / "shared"
VLLM_BENCH = SHARED / "real-engine" / "vllm-bench" / "random" / "random-3.0qps-tiny-20261129-081458.json"
PROM_SCRAPE = SHARED / "real-engine" / "llamacpp" / "metrics_burst50_000.prom"
AZURE_CSV = SHARED / "traces" / "azure_llm_2023_conv_first5000.csv"
FORMATS = REPO / "tests" / "data" / "formats"

# Names DuckDB would read as patterns, and one it cannot escape (a backslash with a glob character).
GLOB_NAMES = ["spend[1]", "a*b", "a?b", "x[ab]", "[!x]", "b\\s[1]"]

# A parquet reader has no built-in profile: this one reads the Azure trace's columns from a parquet file.
PARQUET_PROFILE = """
name = "azure-parquet-test"
title = "The Azure trace's columns, from parquet"
reader = "parquet"
clock = "naive"

[detect]
columns = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]

[columns]
t_arrival = "CAST(\\"TIMESTAMP\\" AS TIMESTAMP)"
prompt_tokens = "CAST(\\"ContextTokens\\" AS BIGINT)"
completion_tokens = "CAST(\\"GeneratedTokens\\" AS BIGINT)"
"""


def request_record(i: int, t0: float = 1795936979.0, **overrides) -> dict:
    """One openai-client-log record (the shape tools/engine writes), request i of a run starting at t0."""
    record = {
        "req_idx": i, "path": "/v1/chat/completions",
        "body": {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 16},
        "run": None, "send_ts": t0 + i, "http_status": 200, "first_token_ts": t0 + i + 0.2,
        "end_ts": t0 + i + 0.5, "e2e_s": 0.5, "finish_reason": "stop",
        "response": {"model": "tiny", "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
    }
    record.pop("run")
    record.update(overrides)
    return record


def request_lines(n: int, t0: float = 1795936979.0) -> list[str]:
    return [json.dumps(request_record(i, t0)) for i in range(n)]


def write_lines(path: Path, lines: list[str], compress: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_requests(path: Path, n: int, compress: bool = False) -> Path:
    return write_lines(path, request_lines(n), compress)


def write_azure_csv(path: Path, n: int) -> Path:
    lines = AZURE_CSV.read_text().splitlines()
    return write_lines(path, lines[: n + 1])


def write_parquet(path: Path, n: int) -> Path:
    import duckdb

    csv = write_azure_csv(path.with_name("_source.csv.tmp"), n)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM read_csv('{csv}', all_varchar=true)) TO '{path.with_name('_out.parquet.tmp')}' "
                "(FORMAT parquet)")
    con.close()
    path.with_name("_out.parquet.tmp").rename(path)
    csv.unlink()
    return path


def parquet_profile(folder: Path) -> Path:
    path = folder / "azure-parquet.toml"
    path.write_text(PARQUET_PROFILE)
    return path


def copy_vllm_bench(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(VLLM_BENCH, path)
    return path


def write_scrape(path: Path, samples: int) -> Path:
    """A Prometheus text scrape with `samples` gauge samples of one family."""
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m{i}"}} {i}' for i in range(samples)]
    return write_lines(path, lines)
