"""Gateway attempts in the right order, and timeouts seen as timeouts (issue 12, classes 3 and 4).

LiteLLM behind its proxy writes a streamed fallback's success with the client request's startTime (the proxy's
Logging object is shared by every attempt; see the header of servlens/profiles/litellm-slp.toml for the source), so
attempts are ordered by endTime. The proxy-shaped trace below is the recorded SDK chain of
tests/data/gateways/litellm_slp_recorded.jsonl (lines 6-8: two failed attempts on chat-primary, then a streamed
answer from chat-backup) with the answer's startTime moved to the client request's start, as the proxy writes it;
the real proxy recordings (tests/data/recorded/gw-*) are used when they are present.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path

import pytest
import zstandard

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store

ROOT = Path(__file__).resolve().parents[2]
SLP_SDK = ROOT / "tests" / "data" / "gateways" / "litellm_slp_recorded.jsonl"
RECORDED = ROOT / "tests" / "data" / "recorded"
TIMEOUT_FALLBACK = RECORDED / "gw-timeout-fallback" / "litellm_slp.jsonl.zst"


def _read_jsonl(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if path.suffix == ".zst":
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def _ingest(path: Path, run: str = "t"):
    con = open_store(None)
    ingest_inputs(con, [str(path)], run=run)
    return con


def _rows(con) -> list[dict]:
    cur = con.execute("SELECT request_id, trace_id, model, attempt, fallback_from, source_line FROM requests "
                      "ORDER BY source_line")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _proxy_shaped_chain(tmp_path: Path) -> tuple[Path, list[dict]]:
    """The recorded streamed fallback chain, its answer's startTime set 8 ms before the first failed attempt's."""
    payloads = _read_jsonl(SLP_SDK)[5:8]
    assert [(p["status"], p["model_group"], p["stream"]) for p in payloads] == [
        ("failure", "chat-primary", None), ("failure", "chat-primary", None), ("success", "chat-backup", True)]
    payloads[2]["startTime"] = payloads[0]["startTime"] - 0.008
    path = tmp_path / "proxy_chain.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in payloads))
    return path, payloads


def test_streamed_fallback_with_the_client_start_time_is_the_last_attempt(tmp_path):
    path, payloads = _proxy_shaped_chain(tmp_path)
    rows = _rows(_ingest(path))
    assert [r["request_id"] for r in rows] == [p["id"] for p in payloads]
    # Ordered by startTime the answer came first and the two failures read as fallbacks from chat-backup.
    assert [(r["model"], r["attempt"], r["fallback_from"]) for r in rows] == [
        ("chat-primary", 1, None), ("chat-primary", 2, None), ("chat-backup", 3, "chat-primary")]


def _expected_by_end_time(payloads: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Per trace, (group, status) of its attempts ordered by endTime: computed from the raw payloads."""
    traces: dict[str, list[dict]] = defaultdict(list)
    for p in payloads:
        traces[p["trace_id"]].append(p)
    return {t: [(p["model_group"], p["status"]) for p in sorted(ps, key=lambda p: p["endTime"])]
            for t, ps in traces.items()}


@pytest.mark.skipif(not TIMEOUT_FALLBACK.exists(), reason="the gw-timeout-fallback recording is not merged yet")
def test_real_proxy_fallbacks_all_go_from_the_primary_to_the_small_group():
    payloads = _read_jsonl(TIMEOUT_FALLBACK)
    expected = _expected_by_end_time(payloads)
    # What the recording holds (its README): every group change is chat -> chat-small, and in some traces the
    # answer's startTime is before the failed attempt's.
    changes = [tuple(g for g, _ in chain) for chain in expected.values() if len(chain) > 1]
    assert set(changes) == {("chat", "chat-small")}
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for p in payloads:
        by_trace[p["trace_id"]].append(p)
    inverted = sum(1 for ps in by_trace.values() if len(ps) > 1
                   and sorted(ps, key=lambda p: p["startTime"]) != sorted(ps, key=lambda p: p["endTime"]))
    assert inverted > 0

    rows = _rows(_ingest(TIMEOUT_FALLBACK))
    fell_back = [r for r in rows if r["fallback_from"] is not None]
    assert len(fell_back) == len(changes)
    assert {(r["model"], r["fallback_from"]) for r in fell_back} == {("chat-small", "chat")}
    got: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in rows:
        got[r["trace_id"]].append((r["attempt"], r["model"]))
    assert {t: [m for _, m in sorted(a)] for t, a in got.items()} == {
        t: [g for g, _ in chain] for t, chain in expected.items()}


def _analyze(path: Path, rules: tuple[str, ...]) -> dict:
    con = open_store(None)
    try:
        ingest_paths(con, [str(path)], run="gw")
        return analyze(con, [r for r in load_rules() if r.id in rules])
    finally:
        con.close()


def _finding(doc: dict, rule: str, model: str) -> dict:
    found = [f for f in doc["findings"] if f["rule"] == rule and f["scope"]["model"] == model]
    assert len(found) == 1, [f["scope"] for f in doc["findings"] if f["rule"] == rule]
    return found[0]


@pytest.mark.skipif(not TIMEOUT_FALLBACK.exists(), reason="the gw-timeout-fallback recording is not merged yet")
def test_real_proxy_fallbacks_to_the_16_token_group_are_a_contract_mismatch():
    payloads = _read_jsonl(TIMEOUT_FALLBACK)
    answers = [p for p in payloads if p["model_group"] == "chat-small" and p["status"] == "success"]
    cut = [p for p in answers if p["response"]["choices"][0]["finish_reason"] == "length"
           and p["response"]["usage"]["completion_tokens"] < p["model_parameters"]["max_tokens"]]
    timed_out = [p for p in payloads if p["status"] == "failure"]
    doc = _analyze(TIMEOUT_FALLBACK, ("SL005",))
    small = _finding(doc, "SL005", "chat-small")
    m = small["evidence"]["metrics"]
    assert (small["state"], small["severity"]) == ("fired", "critical")
    assert (m["fallbacks_in"], m["fallbacks_cut_below_asked"], m["fallback_cut_at_most_tokens"]) == (
        len(answers), len(cut), max(p["response"]["usage"]["completion_tokens"] for p in cut))
    primary = _finding(doc, "SL005", "chat")
    # Every trace that tried the primary and fell back was answered elsewhere (arrival order lost the streamed ones).
    assert primary["state"] == "clear"
    assert primary["evidence"]["metrics"]["traces_answered_elsewhere"] == len(answers)
    assert primary["evidence"]["metrics"]["attempts_failed_share"] == round(
        len(timed_out) / sum(p["model_group"] == "chat" for p in payloads), 4)


@pytest.mark.skipif(not TIMEOUT_FALLBACK.exists(), reason="the gw-timeout-fallback recording is not merged yet")
def test_real_router_timeouts_are_found_from_the_timeouts_alone():
    payloads = _read_jsonl(TIMEOUT_FALLBACK)
    timeouts = [p for p in payloads if p["status"] == "failure"
                and (p["error_information"] or {}).get("error_class") == "Timeout"]
    durations = sorted(p["endTime"] - p["startTime"] for p in timeouts)
    # Finished attempts on the same deployment that ran past every timeout (streams: the timeout bounds each read).
    longer = [p for p in payloads if p["status"] == "success" and p["model_group"] == "chat"
              and p["endTime"] - p["startTime"] > durations[-1]]
    assert longer, "the recording holds finished requests past the timeouts (what vetoed the rule)"
    answered = {p["trace_id"] for p in payloads if p["status"] == "success"}
    doc = _analyze(TIMEOUT_FALLBACK, ("SL011",))
    f = _finding(doc, "SL011", "chat")
    m = f["evidence"]["metrics"]
    assert f["state"] == "fired"
    assert (m["timeouts"], m["failed_at_limit"], m["finished_over_limit"]) == (len(timeouts), len(timeouts), len(longer))
    assert (m["limit_s"], m["band_end_s"]) == (round(durations[0], 4), round(durations[-1], 4))
    # The router's 2.5 s timeout, seen late by a busy gateway: the limit is read as at most the shortest timeout.
    assert 2.5 <= m["limit_s"] < 3.0
    rescued = sum(1 for p in timeouts if p["trace_id"] in answered)
    assert (m["answered_by_a_later_attempt"], m["reached_client"]) == (rescued, len(timeouts) - rescued)
    assert f["severity"] == ("critical" if (len(timeouts) - rescued) / m["requests"] >= 0.05 else "warning")


GATEWAY_RUNS = ("gw-timeout-fallback", "gw-dead-fallback", "gw-retries", "gw-ratelimit-429", "gw-healthy")


def _slp_of(run: str) -> Path:
    folder = RECORDED / run
    return next(iter(sorted(folder.glob("litellm_slp.jsonl*"))), folder / "litellm_slp.jsonl")


@pytest.mark.parametrize("run", GATEWAY_RUNS)
def test_every_recorded_proxy_run_numbers_attempts_in_end_time_order(run):
    path = _slp_of(run)
    if not path.exists():
        pytest.skip(f"the {run} recording is not merged yet")
    expected = _expected_by_end_time(_read_jsonl(path))
    rows = _rows(_ingest(path))
    got: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in rows:
        got[r["trace_id"]].append((r["attempt"], r["model"]))
    assert {t: [m for _, m in sorted(a)] for t, a in got.items()} == {t: [g for g, _ in c] for t, c in expected.items()}
    # A fallback is a change of group within the trace, from the group first asked for.
    changes = sum(1 for c in expected.values() for g, _ in c[1:] if g != c[0][0])
    assert sum(1 for r in rows if r["fallback_from"] is not None) == changes
