"""The committed recordings of tests/data/recorded/ (real LiteLLM proxy and llama.cpp runs, tools/engine/recordings.py):
each folder is small and complete, its facts.json is what recording_facts.py computes from its raw files today, and
each run holds the incident its README names. No engine or proxy needed: these read the recordings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools.engine.recording_facts import run_facts
from tools.engine.recordings import RUNS

RECORDED = Path(__file__).resolve().parents[2] / "tests" / "data" / "recorded"


def _facts(run: str) -> dict:
    return json.loads((RECORDED / run / "facts.json").read_text(encoding="utf-8"))


def test_every_defined_run_is_recorded_and_indexed():
    assert sorted(p.name for p in RECORDED.iterdir() if p.is_dir()) == sorted(RUNS)
    index = (RECORDED / "README.md").read_text(encoding="utf-8")
    for run in RUNS:
        assert f"[{run}]({run}/README.md)" in index


@pytest.mark.parametrize("run", sorted(RUNS))
def test_folder_is_small_complete_and_its_facts_follow_from_the_raw_files(run):
    folder = RECORDED / run
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 2_000_000
    assert all(p.stat().st_size <= 1_000_000 for p in files if p.suffix != ".zst")
    names = {str(p.relative_to(folder)) for p in files}
    assert {"README.md", "recording.json", "facts.json", "metrics_index.jsonl", "props.json"} <= names
    if RUNS[run].gateway:
        assert names & {"litellm_slp.jsonl", "litellm_slp.jsonl.zst"} and "client/requests.jsonl" in names
    else:
        assert "requests.jsonl" in names
    assert run_facts(folder) == _facts(run)
    key = re.compile(rb"sk-[0-9a-f]{48}")  # the shape of the proxy's throwaway master key
    assert not [p for p in files if p.suffix != ".zst" and key.search(p.read_bytes())]


def test_healthy_gateway_run_has_no_failure_anywhere():
    f = _facts("gw-healthy")
    assert f["client"]["http_status"] == {"200": 40}
    assert f["gateway"]["status"] == {"success": 40}
    assert f["engine_metrics"]["."]["gauge_max"]["llamacpp:requests_deferred"]["max"] == 0


def test_timeout_run_has_tens_of_timeouts_at_the_limit_and_fallbacks_cut_at_16_tokens():
    g = _facts("gw-timeout-fallback")["gateway"]
    assert g["timeouts"]["count"] == g["error_class"]["Timeout"] >= 30
    assert g["timeouts"]["duration_s"]["min"] >= 2.5
    assert g["traces"]["fallbacks_by_end_time"]["chat -> chat-small (success)"] >= 30
    small = {k.split()[1]: v for k, v in g["finish_reason_by_model_group"].items() if k.startswith("chat-small ")}
    assert small["length"] > 3 * small.get("stop", 0)
    assert g["traces"]["traces_where_start_time_order_differs_from_end_time_order"] > 0


def test_ratelimit_run_answers_most_requests_with_429():
    f = _facts("gw-ratelimit-429")
    assert f["client"]["http_status"]["429"] > f["client"]["requests"] / 2
    assert f["gateway"]["error_class"] == {"RateLimitError": f["client"]["http_status"]["429"]}


def test_dead_fallback_run_fails_requests_whose_fallback_hit_the_dead_endpoint():
    f = _facts("gw-dead-fallback")
    assert f["client"]["errors_saying_fallback_also_failed"] == f["client"]["http_status"]["500"] > 0
    # LiteLLM wrote no payload for the failed fallback attempts: the dead deployment is in no payload.
    assert not [k for k in f["gateway"]["status_by_model_id"] if k.startswith("dep-backup-dead")]
    assert f["proxy_log"]["call_exception_lines"]["litellm.InternalServerError"] > f["gateway"]["status"]["failure"]


def test_retries_run_retried_while_the_backend_was_down():
    f = _facts("gw-retries")
    assert f["client"]["gateway_headers"]["attempted_retries_sum"] > 0
    assert f["engine_metrics"]["."]["scrapes_failed"] > 0
    assert max(c["drops"] for c in f["engine_metrics"]["."]["counters"].values()) == 1


def test_restart_run_has_refused_connections_then_not_ready_then_cold_prefill():
    f = _facts("llamacpp-restart-midrun")
    c = f["client"]
    assert c["errors"]["ConnectionError"] > 0 and c["http_status"]["503"] > 0
    restart_at = next(e["at_s"] for e in f["events"] if e["action"] == "restart")
    assert [t for t in c["cache_n_zero_sent_at_s"] if t > restart_at]


@pytest.mark.parametrize("fmt", ["deepseek", "deepseek-legacy", "auto"])
def test_reasoning_split_runs_have_answers_that_spent_the_budget_on_reasoning(fmt):
    c = _facts(f"llamacpp-reasoning-{fmt}")["client"]
    assert c["content_empty_and_reasoning_present"] > 0
    assert c["think_markers_in_content"] == 0
    assert c["reasoning_field_names"].keys() == {"reasoning_content", "stream_reasoning_content"}


def test_reasoning_none_keeps_the_markers_in_content():
    c = _facts("llamacpp-reasoning-none")["client"]
    assert c["think_markers_in_content"] == c["answers_200"] and c["reasoning_present"] == 0
