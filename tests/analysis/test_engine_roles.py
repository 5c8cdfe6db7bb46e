"""SL004, SL009 and SL010 read every engine's scrape through the metric roles (servlens/store/metric_roles.toml), not
vLLM's names: SGLang and Triton/TensorRT-LLM from the example scrapes their own docs print, TGI and NIM from the
scrapes DataDog's integrations carry as test fixtures (tests/data/formats/metrics/ATTRIBUTION.md), each scraped six
times. The requests beside them are written here (the rules' request side is tested on real logs elsewhere): what is
under test is that each engine's names are found, in the right series (Triton tells waiting from running by a label),
and judged on the values the scrape holds."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.ingest.metrics import decide_metrics_source, ingest_metrics_file
from servlens.store.schema import open_store

SCRAPES = Path(__file__).resolve().parents[1] / "data" / "formats" / "metrics"
T0 = datetime(2026, 11, 28, 10, 0, 0)
RULES = ("SL004", "SL009", "SL010")
N_SCRAPES = 6


def _real_scrape(file: str, running_series: str):
    """The engine's real scrape; for SL010 with its running series set to another value."""
    text = (SCRAPES / file).read_text()

    def scrape(running: int | None) -> str:
        if running is None:
            return text
        return re.sub(rf"^({re.escape(running_series)}) \S+$", rf"\g<1> {running}", text, count=1, flags=re.M)
    return scrape


ENGINES = {
    "sglang": _real_scrape("sglang-docs-metrics.prom",
                           'sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"}'),
    "triton": _real_scrape("triton-trtllm-docs-metrics.prom",
                           'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"}'),
    "tgi": _real_scrape("tgi-datadog-fixture-metrics.prom", "tgi_batch_current_size"),
    "nim": _real_scrape("nim-datadog-fixture-metrics.prom",
                        'num_requests_running{model_name="meta/llama-3.1-8b-instruct"}'),
}


def _store(tmp_path: Path, engine: str, with_arrival: bool):
    con = open_store(None)
    for i in range(N_SCRAPES):
        path = tmp_path / f"{engine}-{i}.prom"
        # SL010 needs concurrency that moves: 4 running in the first half, 12 in the second
        path.write_text(ENGINES[engine](None if with_arrival else (4 if i < N_SCRAPES // 2 else 12)))
        at = T0 + timedelta(seconds=10 * i)
        decision = decide_metrics_source(con, "r", path, at=at.isoformat() + "Z")
        con.execute("BEGIN")
        ingest_metrics_file(con, path, run="r", decision=decision, at=at.isoformat() + "Z")
        con.execute("COMMIT")
    # 40 requests over the scrapes' 50 s: TTFT 0.2 s, TPOT 40 ms, 64 tokens; no queue or prefill time of their own
    for i in range(40):
        arrival = T0 + timedelta(seconds=1.25 * i)
        row = {"run": "r", "source_id": 1, "source_line": i + 1, "request_id": f"q{i}", "status": "ok",
               "finish_reason": "stop", "t_arrival": arrival if with_arrival else None,
               "t_end": arrival + timedelta(seconds=2.72), "ttft_s": 0.2, "tpot_s": 0.04, "completion_tokens": 64}
        con.execute(f"INSERT INTO requests ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                    list(row.values()))
    return con


def _findings(con) -> dict[str, dict]:
    doc = analyze(con, [r for r in load_rules() if r.id in RULES])
    return {f["rule"]: f for f in doc["findings"]}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_each_engines_scrape_is_judged_by_sl004_sl009_sl010(tmp_path, engine):
    con = _store(tmp_path, engine, with_arrival=True)
    found = _findings(con)
    # SL004 (requests with TTFT but no wait of their own): the engine's waiting gauge tells queueing from prefill
    waiting = {"sglang": "sglang:num_queue_reqs", "triton": "nv_trt_llm_request_metrics", "tgi": "tgi_queue_size",
               "nim": "num_requests_waiting"}[engine]
    assert found["SL004"]["state"] == "clear", found["SL004"]["reason"]
    assert found["SL004"]["evidence"]["metrics"]["wait_source"] == waiting
    sl009 = found["SL009"]
    if engine == "tgi":
        # TGI exports no KV-cache gauge and no preemption metric (docs/source/reference/metrics.md): said so
        assert sl009["state"] == "not_evaluable"
        assert "KV cache usage gauge (missing role:kv_usage" in sl009["reason"]
        return
    metrics = sl009["evidence"]["metrics"]
    expected = {  # (KV metric, KV max, waiting max, running max) as each scrape says
        "sglang": ("sglang:token_usage", 0.28, 2826.0, 162.0),
        # the labelled series, not the family's sum (request_type max = 512, active, context ...)
        "triton": ("nv_trt_llm_kv_cache_block_metrics", 0.4875, 1.0, 1.0),
        # one request running, none waiting, the cache at 0.000285 (0.0003 as the evidence rounds it)
        "nim": ("gpu_cache_usage_perc", 0.0003, 0.0, 1.0),
    }[engine]
    assert (metrics["kv_metric"], metrics["kv_usage_max"], metrics["waiting_max"], metrics["running_max"]) == expected
    assert metrics["scrapes"] == N_SCRAPES
    if engine == "nim":
        # an idle server: no pressure and nobody waiting
        assert sl009["state"] == "clear" and metrics["pressure_scrapes"] == 0
        assert sl009["summary"] == ("No KV cache pressure: gpu_cache_usage_perc peaked at 0% over 6 scrapes, "
                                    "no preemption counter; no request waited for capacity.")
    else:
        # requests waited while the cache stayed under 90%: the concurrency cap, not the cache
        assert sl009["state"] == "clear" and "they waited on the concurrency cap" in sl009["summary"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_sl010_takes_concurrency_from_each_engines_running_gauge(tmp_path, engine):
    # requests with an end and a TPOT but no arrival: the running gauge is the only concurrency there is
    con = _store(tmp_path, engine, with_arrival=False)
    sl010 = _findings(con)["SL010"]
    gauge = {"sglang": "sglang:num_running_reqs", "triton": "nv_trt_llm_request_metrics",
             "tgi": "tgi_batch_current_size", "nim": "num_requests_running"}[engine]
    assert sl010["state"] in ("clear", "fired"), sl010["reason"]
    metrics = sl010["evidence"]["metrics"]
    assert metrics["concurrency_source"] == f"{gauge} (last scrape before each request's decode)"
    # the running series alone (Triton's family also holds max = 512, active, context ...)
    assert (metrics["concurrency_max"], metrics["levels"], metrics["requests"]) == (12, 2, 40)
