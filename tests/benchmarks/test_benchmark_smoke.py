"""Smoke checks of the benchmark data generator and harness (tiny sizes; nothing about time is asserted).

The generator must write the real formats exactly (so the LiteLLM and OpenAI-style profiles read it), be
deterministic from its seed, and put injected incidents where it says; the harness must run every step that exists
and, once ingest exists, the generated log must ingest with one row per request.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


run = _load("servlens_bench_run", REPO / "benchmarks" / "run.py")  # benchmarks/ is not a package
generate = run.generate

REAL_CLIENT_LOG = REPO / "tests/data/shared/real-engine/llamacpp/requests.jsonl"
DAY = 86400.0


def _rows(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def litellm_day(tmp_path_factory) -> tuple[Path, list[dict], generate.Scenario]:
    sc = generate.Scenario(6000, seed=11, incidents=[
        generate.Incident.parse("queue_spike@14:00/1h"),
        generate.Incident.parse("prefix_cache_off@08:00/2h:qwen2.5-32b-instruct"),
        generate.Incident.parse("reasoning_leak@18:00/2h"),
    ])
    path = tmp_path_factory.mktemp("gen") / "day.jsonl"
    summary = generate.generate(sc, "litellm", path)
    assert summary["requests"] == 6000
    return path, _rows(path), sc


def _hour(row: dict, sc: generate.Scenario) -> float:
    return (row["startTime"] - sc.start_epoch) / 3600.0


def test_litellm_payload_keys_match_a_recorded_litellm(litellm_day):
    """Key order and nesting as litellm 1.110 wrote them through a real Router (tests/data/gateways/)."""
    _, rows, _ = litellm_day
    real = _rows(REPO / "tests/data/gateways/litellm_slp_recorded.jsonl")
    for mine in (rows[0], next(r for r in rows if r["status"] == "failure")):
        assert list(mine) == list(real[0])
        assert list(mine["metadata"]) == list(real[0]["metadata"])
        assert list(mine["error_information"]) == list(real[0]["error_information"])
        assert sorted(mine["hidden_params"]) == sorted(real[0]["hidden_params"])
    streamed = next(r for r in real if r["stream"])
    ours = next(r for r in rows if r["stream"])
    for part in ("completion_tokens_details", "prompt_tokens_details"):
        assert list(ours["response"]["usage"][part]) == list(streamed["response"]["usage"][part])
    assert ours["model_parameters"]["stream_options"] == streamed["model_parameters"]["stream_options"]


def test_litellm_payload_fields_follow_litellm(litellm_day):
    _, rows, _ = litellm_day
    assert len(rows) == 6000
    for r in rows:
        assert r["startTime"] <= r["completionStartTime"] <= r["endTime"]
        assert r["stream"] in (True, None)  # LiteLLM writes None, never False
        if r["stream"] is None:
            assert r["completionStartTime"] == r["endTime"]
            assert r["response_time"] == pytest.approx(r["endTime"] - r["startTime"], abs=1e-6)
        else:
            assert r["response_time"] == pytest.approx(r["completionStartTime"] - r["startTime"], abs=1e-6)
        if r["status"] == "failure":
            assert r["response"] == {} and r["prompt_tokens"] == 0 and r["completion_tokens"] == 0
            assert r["error_information"]["error_code"] in {"400", "408", "429", "500", "503"}
            assert r["error_str"] == r["error_information"]["error_message"]
            assert r["metadata"]["usage_object"] == {}
        else:
            assert r["status"] == "success"
            info = r["error_information"]
            assert {info[k] for k in ("error_code", "error_class", "llm_provider", "traceback", "error_message")} == {""}
            usage, normalised = r["metadata"]["usage_object"], r["response"]["usage"]
            for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                assert usage[key] == normalised[key] == r[key]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert cached == normalised["prompt_tokens_details"]["cached_tokens"]
            assert 0 <= cached <= r["prompt_tokens"]
            finish = r["response"]["choices"][0]["finish_reason"]
            if finish == "length" and not r["cache_hit"]:
                assert r["completion_tokens"] == r["model_parameters"]["max_tokens"]
            assert r["hidden_params"]["litellm_overhead_time_ms"] > 0.5  # milliseconds, not seconds
        assert r["total_tokens"] == r["prompt_tokens"] + r["completion_tokens"]
        assert r["model_group"] in {m.group for m in generate.MODELS}
        assert r["model"].startswith("hosted_vllm/")
        if r["cache_hit"]:
            assert "_cache_hit" in r["id"] and r["model_parameters"] == {} and r["stream"] is None
    statuses = [r["status"] for r in rows]
    assert 0.003 < statuses.count("failure") / len(rows) < 0.05
    assert 0.6 < sum(r["stream"] is True for r in rows) / len(rows) < 0.8
    lengths = sum(r["status"] == "success" and r["response"]["choices"][0]["finish_reason"] == "length" for r in rows)
    assert 0.01 < lengths / len(rows) < 0.15
    assert len({r["trace_id"] for r in rows}) < len(rows)  # some retries share their trace


def test_shared_system_prompts_outlast_the_prefix_key(litellm_day):
    _, rows, _ = litellm_day
    systems = [r["messages"][0]["content"] for r in rows if r["messages"][0]["role"] == "system"]
    assert 0.45 < len(systems) / len(rows) < 0.65
    assert len(set(systems)) == generate.SHARED_PROMPTS
    assert min(len(s) for s in systems) > 2048


def test_incidents_land_in_their_windows(litellm_day):
    _, rows, sc = litellm_day
    ok = [r for r in rows if r["status"] == "success" and r["stream"] and not r["cache_hit"]]
    spike = [r["completionStartTime"] - r["startTime"] for r in ok if 14 <= _hour(r, sc) < 15]
    calm = [r["completionStartTime"] - r["startTime"] for r in ok if 10 <= _hour(r, sc) < 13]
    assert statistics.median(spike) > 10 * statistics.median(calm)

    qwen = [r for r in rows if r["status"] == "success" and r["model_group"] == "qwen2.5-32b-instruct"]
    cached_in = [r["metadata"]["usage_object"]["prompt_tokens_details"]["cached_tokens"] for r in qwen if 8 <= _hour(r, sc) < 10]
    cached_out = [r["metadata"]["usage_object"]["prompt_tokens_details"]["cached_tokens"] for r in qwen if 11 <= _hour(r, sc) < 13]
    assert cached_in and set(cached_in) == {0}
    assert sum(c > 0 for c in cached_out) / len(cached_out) > 0.4

    reasoning = [r for r in rows if r["status"] == "success" and r["model_group"].startswith("deepseek")]
    leaked = [r for r in reasoning if "</think>" in (r["response"]["choices"][0]["message"]["content"] or "")]
    assert leaked and all(18 <= _hour(r, sc) < 20 for r in leaked)
    assert all(r["response"]["choices"][0]["message"]["reasoning_content"] is None for r in leaked)
    assert all(r["response"]["choices"][0]["message"]["reasoning_content"] for r in reasoning
               if not 18 <= _hour(r, sc) < 20 and r["response"]["choices"][0]["finish_reason"] != "tool_calls")


def test_openai_client_log_has_the_real_shape(tmp_path):
    path = tmp_path / "client.jsonl.gz"
    generate.generate(generate.Scenario(1500, seed=3, run="bench"), "openai", path)
    rows = _rows(path)
    real = _rows(REAL_CLIENT_LOG)
    real_keys = set().union(*(r.keys() for r in real))
    assert len(rows) == 1500
    for r in rows:
        assert set(r) <= real_keys, set(r) - real_keys
        assert r["run"] == "bench" and r["path"] == "/v1/chat/completions"
        assert r["send_ts"] <= r["headers_ts"] <= r["first_byte_ts"] <= r["end_ts"]
        assert r["e2e_s"] == pytest.approx(r["end_ts"] - r["send_ts"], abs=2e-6)
        if "stream_final_chunk" in r:
            assert r["body"]["stream"] is True and r["body"]["stream_options"] == {"include_usage": True}
            assert "response" not in r
            if r["first_token_ts"] is not None:
                assert r["ttft_client_s"] == pytest.approx(r["first_token_ts"] - r["send_ts"], abs=2e-6)
        elif r["http_status"] == 200:
            assert r["response"]["choices"][0]["finish_reason"] == r["finish_reason"]
        else:
            assert set(r["response"]) == {"error"} and r["finish_reason"] is None
    streamed = {tuple(sorted(r)) for r in rows if "stream_final_chunk" in r}
    real_streamed = {k for r in real if "stream_final_chunk" in r for k in r}
    assert all(set(keys) <= real_streamed for keys in streamed)


def test_generator_is_deterministic_from_its_seed(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    generate.generate(generate.Scenario(800, seed=5), "litellm", a)
    generate.generate(generate.Scenario(800, seed=5), "litellm", b)
    generate.generate(generate.Scenario(800, seed=6), "litellm", c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_pair_carries_its_known_regression(tmp_path):
    manifest = generate.generate_pair(generate.Scenario(5000, seed=21), "litellm", tmp_path,
                                      generate.Regression.parse("ttft=1.5"))
    assert manifest["known_change"] == {"ttft": 1.5, "tpot": 1.0, "error_rate": 0.0}
    assert json.loads((tmp_path / "manifest.json").read_text())["known_change"]["ttft"] == 1.5

    def ttft_minus_overhead(path: Path) -> float:
        return statistics.median(r["completionStartTime"] - r["startTime"] - r["hidden_params"]["litellm_overhead_time_ms"] / 1000
                                 for r in _rows(path) if r["stream"] and not r["cache_hit"])

    ratio = ttft_minus_overhead(tmp_path / "after.jsonl") / ttft_minus_overhead(tmp_path / "before.jsonl")
    assert 1.35 < ratio < 1.65


def test_cli_rejects_a_bad_incident():
    with pytest.raises(SystemExit, match="KIND@HH:MM/DURATION"):
        generate.Incident.parse("queue_spike@noon")


def test_harness_smoke(tmp_path):
    available = {cmd: run.command_available(cmd) for cmd in ("ingest", "analyze", "compare")}
    result = run.bench_size(2000, "litellm", tmp_path / "data", tmp_path / "work", repeat=1, pandas_max=10_000,
                            available=available, niceness=0)
    m = result["measures"]
    assert m["scan"].exit_codes == [0] and m["scan2"].exit_codes == [0] and m["pandas"].exit_codes == [0]
    assert m["scan"].peak_rss > 10
    if available["ingest"]:
        assert m["ingest"].exit_codes == [0], m["ingest"].note
        assert m["ingest"].extra["rows"] == 2000
        assert m["ingest"].extra["readers"] == ["typed"]  # the generated log has no bad line: the fast path
    else:
        assert m["ingest"].wall_s == [] and "not available" in m["ingest"].note
    if available["analyze"]:
        assert m["analyze"].exit_codes[0] in (0, 1), m["analyze"].note
        assert 0 < m["analyze"].extra["report_bytes"] <= 2_000_000
    if available["compare"]:
        assert m["compare"].exit_codes[0] in (0, 1, 3), m["compare"].note
    table = run.tables([result], 1)
    assert "| 2000 | " not in table
    assert "fast path read 1/1 files" in table
    scan_row = f"| 2k litellm | {result['file_bytes'] / 1e6:.0f} MB | scan | {m['scan'].median:.2f} | - | {m['scan'].cpu_median:.2f} |"
    assert scan_row in table
    # CPU time is the command's own (user + system): positive, and at most every core for the whole wall time
    assert all(0 < meas.cpu_s[0] <= meas.wall_s[0] * (os.cpu_count() or 1) for meas in m.values() if meas.cpu_s)
    assert "| size | ingest / scan | analyze / scan | pandas / analyze | compare / scan both |" in table
    out = tmp_path / "RESULTS.md"
    run.write_results(out, [result], ["--smoke"], 1, table, 0)
    assert "Command: `python benchmarks/run.py --smoke`" in out.read_text()


def test_lean_formats_name_the_generator_and_its_text(tmp_path):
    assert run.split_format("litellm-lean") == ("litellm", True)
    assert run.split_format("openai") == ("openai", False)
    assert run.split_format("openai", redact=True) == ("openai", True)
    assert set(run.FORMAT_CHOICES) == {"litellm", "litellm-lean", "openai", "openai-lean"}


def test_floor_times_every_stage_on_the_same_rows(capsys):
    """benchmarks/floor.py on a real llama.cpp client log: every stage reads every request (the ratios compare like
    with like), and the table names each stage."""
    floor = _load("servlens_bench_floor", REPO / "benchmarks" / "floor.py")
    requests = sum(1 for line in REAL_CLIENT_LOG.read_text().splitlines() if line.strip())
    measured = floor.measure([str(REAL_CLIENT_LOG), "--repeat", "1"])
    assert list(measured) == ["scan", "lines", next(k for k in measured if k.startswith("lines + present")),
                              next(k for k in measured if k.startswith("lines + all")), "read_json as text",
                              "ingest query", "typed read", "fast path"]
    assert {name: rows for name, (_, rows) in measured.items()} == dict.fromkeys(measured, requests)
    present = int(next(k for k in measured if k.startswith("lines + present")).split("(")[1].rstrip(")"))
    every = int(next(k for k in measured if k.startswith("lines + all")).split("(")[1].rstrip(")"))
    assert 0 < present < every  # a llama.cpp log has no vLLM metrics paths
    out = capsys.readouterr().out
    assert "requests.jsonl: 1 repetitions" in out and out.count("\n") == len(measured) + 2
