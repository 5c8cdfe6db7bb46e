"""Goodput, SLO attainment and the breaking concurrency (issue 20): a unit store with every number worked out by
hand, the real recordings (gateway burst, llama.cpp burst, vLLM max-num-seqs 4) and the public arrival traces."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from servlens.analysis.goodput import goodput_section, parse_slo, wilson
from servlens.errors import ConfigError
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "tests" / "data" / "recorded" / "gw-timeout-fallback"
TRACES = REPO / "tests" / "data" / "shared" / "traces"
T0 = datetime(2026, 1, 1, 12, 0, 0)


def test_parse_slo():
    assert parse_slo([]) is None
    assert parse_slo(["ttft=2s,tpot=100ms"]) == {"default": {"ttft_s": 2.0, "tpot_s": 0.1}, "per_model": {}}
    assert parse_slo(["ttft=1.5", "chat:ttft=250ms", "chat:tpot=0.05s"]) == {
        "default": {"ttft_s": 1.5}, "per_model": {"chat": {"ttft_s": 0.25, "tpot_s": 0.05}}}
    assert parse_slo(["org/model:v1:tpot=1m"])["per_model"] == {"org/model:v1": {"tpot_s": 60.0}}


@pytest.mark.parametrize(("value", "message"), [
    ("ttft=fast", "--slo 'ttft=fast': 'fast' is not a duration"),
    ("e2e=2s", "--slo 'e2e=2s': 'e2e=2s' is not ttft=DURATION or tpot=DURATION"),
    ("ttft=0s", "--slo 'ttft=0s': a target must be above zero"),
    (",", "--slo ',' sets no target"),
])
def test_parse_slo_says_what_is_wrong(value, message):
    with pytest.raises(ConfigError) as error:
        parse_slo([value])
    assert error.value.args[0] == message


def test_wilson_interval():
    low, high = wilson(16, 16)
    assert round(low, 4) == 0.8064 and high == 1.0
    # scipy.stats.binomtest(1, 19).proportion_ci(method="wilson"): (0.00935, 0.24639)
    assert [round(v, 4) for v in wilson(1, 19)] == [0.0094, 0.2464]


def _row(i: int, start: float, end: float, **values) -> dict:
    return {"run": "u", "model": "m", "deployment": "d", "source_id": 1, "source_line": i + 1, "request_id": f"r{i}",
            "status": "ok", "finish_reason": "stop", "completion_tokens": 10, "ttft_s": 0.5, "tpot_s": 0.05,
            "t_arrival": T0 + timedelta(seconds=start), "t_end": T0 + timedelta(seconds=end)} | values


def _unit_rows() -> list[dict]:
    """15 quiet requests one at a time, one long request, and a burst of 20 while it runs (in flight 2..21)."""
    rows = [_row(i, 10 * i, 10 * i + 1) for i in range(15)]
    rows.append(_row(15, 199, 220))
    burst = {5: {"status": "error", "finish_reason": "error", "ttft_s": None, "tpot_s": None, "http_status": 503},
             6: {"status": "error", "finish_reason": "error", "ttft_s": None, "tpot_s": None, "http_status": 503},
             7: {"ttft_s": 0.5, "tpot_s": 0.3},                 # slow decode
             8: {"ttft_s": 2.0, "queue_s": 0.2},                # long prefill: over even without the queue
             9: {"ttft_s": None, "tpot_s": None},               # not streamed: not judged
             10: {"ttft_s": 3.0, "queue_s": None}}              # slow first token, queue not known
    for j in range(20):
        rows.append(_row(16 + j, 200 + 0.1 * j, 215, **({"ttft_s": 3.0, "queue_s": 2.5} | burst.get(j, {}))))
    return rows


@pytest.fixture
def unit(tmp_path):
    con = open_store(tmp_path / "unit.duckdb")
    for row in _unit_rows():
        con.execute(f"INSERT INTO requests ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))
    yield con
    con.close()


def test_attainment_goodput_and_misses_by_cause(unit):
    g = goodput_section(unit, ["u"], parse_slo(["ttft=1s,tpot=100ms"]))
    a = g["attainment"]
    assert (a["requests"], a["judged"], a["met"], a["share"]) == (36, 35, 16, 0.4571)
    assert a["missed_by_cause"] == {"failed": 2, "queue": 14, "long_prefill": 1, "slow_first_token": 1,
                                    "slow_decode": 1}
    assert a["unjudged"] == {"no_ttft": 1, "no_tpot": 0}
    assert (a["span_s"], a["goodput_rps"], a["request_rate_rps"]) == (220.0, 0.0727, 0.1636)
    assert g["goodput_rps"] == 0.0727
    assert g["summary"].startswith("16 of 35 judged requests (45.7%) met TTFT ≤ 1 s, TPOT ≤ 100 ms; goodput 0.0727 "
                                   "req/s of 0.1636 req/s; missed: 2 failed, 14 waited in the queue, 1 long prefill, "
                                   "1 slow first token (queue and prefill not split in these sources), 1 slow "
                                   "decode; 1 not judged (latency unknown).")
    # Per cohort: the scope, then its prompt bands (no prompt lengths here: one band, unknown).
    assert g["per_cohort"][0] == {"run": "u", "model": "m", "deployment": "d", "prompt_band": None,
                                        "requests": 36, "judged": 35, "met": 16, "share": 0.4571}


def test_the_window_where_attainment_fell(unit):
    g = goodput_section(unit, ["u"], parse_slo(["ttft=1s,tpot=100ms"]))
    w = g["per_window"]
    assert w["window_s"] == 5.0
    fell = w["fell"]
    assert [(f["start"], f["judged"], f["met"], f["share"]) for f in fell] == [
        ("2026-01-01T12:03:20.000Z", 19, 0, 0.0)]
    assert "Attainment fell to 0% in the window from 2026-01-01T12:03:20.000Z." in g["summary"]


def test_the_concurrency_where_each_target_breaks(unit):
    g = goodput_section(unit, ["u"], parse_slo(["ttft=1s,tpot=100ms"]))
    scope = g["capacity"]["scopes"][0]
    assert [(lv["in_flight_from"], lv["in_flight"], lv["requests"]) for lv in scope["levels"]] == [(1, 1, 16),
                                                                                                   (2, 21, 20)]
    low, burst = scope["levels"]
    assert (low["ttft_share"], low["tpot_share"], low["both_share"]) == (1.0, 1.0, 1.0)
    assert (burst["ttft_judged"], burst["ttft_met"], burst["tpot_judged"], burst["tpot_met"]) == (19, 1, 19, 16)
    assert burst["ttft_p99_s"] == 3.0
    [breaking] = g["breaking_concurrency"]
    assert breaking["ttft"] == {"in_flight": 2, "state": "broken", "share": 0.0526, "share_high": 0.2464,
                                "requests": 19, "confidence": "high", "held_up_to": 1}
    assert breaking["tpot"]["in_flight"] == 2 and breaking["tpot"]["confidence"] == "high"
    assert breaking["both"]["in_flight"] == 2
    assert "m: every target breaks at 2 in flight (high confidence)." in g["summary"]
    chart = scope["chart"]
    assert [s["name"] for s in chart["series"]] == ["TTFT p99 (s)", "TPOT p99 (s)"]
    assert chart["hlines"] == [{"y": 1.0, "label": "TTFT target"}, {"y": 0.1, "label": "TPOT target"}]


def test_a_models_own_target_wins_over_the_default(unit):
    g = goodput_section(unit, ["u"], parse_slo(["ttft=1s", "m:ttft=5s"]))
    assert (g["attainment"]["judged"], g["attainment"]["met"]) == (35, 33)
    # The burst's 17 answers all meet 5 s; its 2 failures still break the p99 reading (17 of 19).
    ttft = g["breaking_concurrency"][0]["ttft"]
    assert (ttft["in_flight"], ttft["state"], ttft["share"]) == (2, "broken", 0.8947)


def test_without_targets_the_attainment_curves(unit):
    g = goodput_section(unit, ["u"], None)
    assert "attainment" not in g and g["targets"] is None
    ttft = {c["threshold_s"]: c["share"] for c in g["curves"]["ttft"]}
    # 33 answered requests with a TTFT: 17 at 0.5 s, 1 at 2 s, 15 at 3 s.
    assert (ttft[0.2], ttft[0.5], ttft[2], ttft[5]) == (0.0, 0.5152, 0.5455, 1.0)
    assert g["breaking_concurrency"][0]["ttft"] == {"in_flight": None, "state": "not_evaluable",
                                                    "reason": "no SLO targets (--slo)"}
    assert g["summary"] == "No SLO targets given (--slo ttft=2s,tpot=100ms): attainment curves only."


# ---------------------------------------------------------------- real recordings


def _analyze(paths: list[str], tmp_path, metrics: list[str] = (), slo=("ttft=2s,tpot=100ms",)) -> dict:
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules
    from servlens.analysis.runner import analyze

    con = open_store(tmp_path / "store.duckdb")
    try:
        ingest_paths(con, paths, list(metrics))
        return analyze(con, load_rules(), slo=parse_slo(list(slo)))
    finally:
        con.close()


def test_gateway_burst_misses_are_the_37_timeouts_and_slow_first_tokens(tmp_path):
    doc = _analyze([str(GATEWAY / "litellm_slp.jsonl.zst")], tmp_path, [str(GATEWAY / "metrics_*")])
    a = doc["goodput"]["attainment"]
    assert a["missed_by_cause"]["failed"] == 37           # facts.json: 37 Timeouts on chat
    assert a["judged"] == a["met"] + sum(a["missed_by_cause"].values())
    by_scope = {b["model"]: b for b in doc["goodput"]["breaking_concurrency"]}
    assert set(by_scope) == {"chat", "chat-small"}
    assert by_scope["chat"]["both"]["state"] == "broken"
    assert json.loads(json.dumps(doc))["goodput"]["targets"] == {"default": {"ttft_s": 2.0, "tpot_s": 0.1},
                                                                  "per_model": {}}


def test_llamacpp_burst_breaks_ttft_past_the_two_slots_with_confidence(tmp_path):
    doc = _analyze([str(REPO / "sample_logs" / "burst")], tmp_path)
    [b] = doc["goodput"]["breaking_concurrency"]
    # --parallel 2 and a burst of 40: TTFT holds while few are in flight and breaks once the queue builds.
    assert b["ttft"]["state"] == "broken" and b["ttft"]["confidence"] == "high"
    assert b["ttft"]["held_up_to"] >= 2 and b["ttft"]["in_flight"] > b["ttft"]["held_up_to"]
    assert b["tpot"]["state"] == "held"
    a = doc["goodput"]["attainment"]
    assert a["missed_by_cause"]["queue"] == a["judged"] - a["met"]     # llama.cpp logs split the queue wait out
    assert doc["goodput"]["per_window"]["fell"]


def test_vllm_max_num_seqs_4_burst_waits_in_the_queue(tmp_path):
    doc = _analyze([str(REPO / "tests" / "data" / "shared" / "real-engine" / "vllm-cpu")], tmp_path)
    by_run = {b["run"]: b for b in doc["goodput"]["breaking_concurrency"]}
    assert by_run["burst50"]["ttft"]["state"] == "broken"
    assert by_run["prefix_cache"]["ttft"]["state"] == "held"
    assert doc["goodput"]["attainment"]["missed_by_cause"]["queue"] >= 20
    cohorts = {c["run"]: c for c in doc["goodput"]["per_cohort"] if c["prompt_band"] is None}
    assert cohorts["burst50"]["share"] == 0.0


@pytest.mark.parametrize("trace", ["azure_llm_2023_conv_first5000.csv", "burstgpt_v1_first400rows.csv"])
def test_arrival_traces_are_not_evaluable_and_say_why(trace, tmp_path):
    doc = _analyze([str(TRACES / trace)], tmp_path)
    g = doc["goodput"]
    assert g["attainment"] == {"state": "not_evaluable", "reason": "no TTFT or TPOT in these sources (arrivals only)"}
    assert g["capacity"]["note"].startswith("no end times or durations in these sources")
    assert g["breaking_concurrency"] == []


# ---------------------------------------------------------------- compare: the advisory goodput gate


def test_compare_gates_the_goodput_change_when_targets_are_given(cli_runner):
    from servlens.cli import cli

    steady, burst = str(REPO / "sample_logs" / "steady-a"), str(REPO / "sample_logs" / "burst")
    done = cli_runner.invoke(cli, ["compare", steady, burst, "--slo", "ttft=2s,tpot=100ms", "--format", "json"],
                             catch_exceptions=False)
    doc = json.loads(done.stdout)
    g = doc["goodput_gate"]
    # steady-a: every judged request met both targets; the llama.cpp burst: 34 of 52 (65.4%).
    assert (g["before"]["met"], g["before"]["judged"], g["after"]["met"], g["after"]["judged"]) == (
        g["before"]["judged"], g["before"]["judged"], 34, 52)
    assert g["verdict"] == "fail" and g["advisory"] is True
    assert g["change"] == round(34 / 52 - 1, 4) and g["change_high"] < -g["tolerance"]
    assert g["reason"].startswith("attainment of TTFT ≤ 2 s, TPOT ≤ 100 ms went from 100.0% to 65.4% (−34.6 points")
    assert "dropped beyond the tolerance of 2 points" in g["reason"]
    # Advisory: the comparison's own verdict and exit code are what the gates decide, as without --slo.
    plain = cli_runner.invoke(cli, ["compare", steady, burst, "--format", "json"], catch_exceptions=False)
    assert done.exit_code == plain.exit_code and doc["verdict"] == json.loads(plain.stdout)["verdict"]
    assert "goodput_gate" not in json.loads(plain.stdout)
    text = cli_runner.invoke(cli, ["compare", steady, burst, "--slo", "ttft=2s,tpot=100ms"]).stdout
    assert "Goodput gate (advisory, does not decide the verdict): fail: attainment of" in text


def test_llamacpp_concurrency_ramp_is_a_production_concurrency_sweep(tmp_path):
    """Recorded for this issue: Poisson arrivals doubling from 2 to 32 requests/s on --parallel 2 (README.md)."""
    ramp = REPO / "tests" / "data" / "recorded" / "llamacpp-concurrency-ramp"
    facts = json.loads((ramp / "facts.json").read_text())
    doc = _analyze([str(ramp)], tmp_path, slo=("ttft=1s,tpot=50ms",))
    g = doc["goodput"]
    a = g["attainment"]
    # facts.json (not servlens): 250 streamed answers carry a TTFT, 6 do not.
    assert a["judged"] == facts["client"]["ttft_client_s_streamed_200"]["n"] == 250
    assert a["unjudged"]["no_ttft"] == facts["client"]["streamed_200_without_ttft"] == 6
    assert a["missed_by_cause"]["queue"] == a["judged"] - a["met"] > 0      # every miss waited for a slot
    [scope] = g["capacity"]["scopes"]
    gauges = facts["engine_metrics"]["."]["gauge_max"]
    top = scope["levels"][-1]["in_flight"]
    # The logs' own in-flight count agrees with the engine: running (2 slots) + deferred, plus the arriving request.
    running, deferred = gauges["llamacpp:requests_processing"]["max"], gauges["llamacpp:requests_deferred"]["max"]
    assert deferred <= top <= running + deferred + 1
    p99 = [lv["ttft_p99_s"] for lv in scope["levels"]]
    assert p99[-1] > 10 * p99[0]
    [b] = g["breaking_concurrency"]
    assert b["ttft"]["state"] == "broken" and b["ttft"]["confidence"] == "high"
    assert b["ttft"]["in_flight"] > running and b["ttft"]["held_up_to"] == b["ttft"]["in_flight"] - 1
    assert b["tpot"]["state"] == "held" and b["tpot"]["held_up_to"] == top
