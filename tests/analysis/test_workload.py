"""The workload profile (servlens/analysis/workload.py): on the public traces with no latencies, on real engine runs,
and on planted rows whose answers are known; and its place in the analyze document and the text/Markdown output."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from datetime import datetime, timedelta

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.analysis.workload import MAX_BUCKETS, bucket_width, workload_profile
from servlens.render.analyze_markdown import render_analyze_markdown
from servlens.render.analyze_text import render_analyze_text
from servlens.store.schema import open_store
from tests.conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"


@pytest.fixture(scope="module")
def traces():
    con = open_store(None)
    ingest_paths(con, [str(TRACES)])
    yield con
    con.close()


def test_mooncake_block_reuse_matches_the_raw_hash_ids(traces):
    profile = workload_profile(traces, ["mooncake_fast25_synthetic_trace"])["runs"]["mooncake_fast25_synthetic_trace"]
    # Recompute from the raw file: a block is reusable when an earlier request (by timestamp) already had its hash.
    with open(TRACES / "mooncake_fast25_synthetic_trace.jsonl") as handle:
        rows = sorted((json.loads(line) for line in handle), key=lambda r: r["timestamp"])
    seen, total, reused = set(), 0, 0
    for row in rows:
        total += len(row["hash_ids"])
        reused += sum(1 for h in row["hash_ids"] if h in seen)
        seen.update(row["hash_ids"])
    sharing = profile["prefix_sharing"]
    assert sharing["prompt_blocks"] == total
    assert sharing["reusable_block_share"] == pytest.approx(reused / total, abs=1e-4)
    assert 0.63 < sharing["reusable_block_share"] < 0.65          # the "about 64%" the data README states
    assert profile["requests"] == len(rows) == 3993
    assert profile["relative_clock"] is True
    # No latencies and no end times: said, not zero.
    assert "no latencies" in profile["latency"]["note"]
    assert "concurrency from the requests is unknown" in profile["concurrency"]["note"]
    assert profile["error_share"] is None                          # no error field in a Mooncake trace


def test_azure_peak_window_counts_the_raw_rows(traces):
    run = "azure_llm_2023_conv_first5000"
    profile = workload_profile(traces, [run])["runs"][run]
    peak = profile["rate"]["peak_window"]
    start = datetime.fromisoformat(peak["start"].rstrip("Z"))
    end = datetime.fromisoformat(peak["end"].rstrip("Z"))
    with open(TRACES / "azure_llm_2023_conv_first5000.csv") as handle:
        times = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in csv.DictReader(handle)]
    assert peak["requests"] == sum(1 for t in times if start <= t < end)
    # A quarter of the 17-minute span, on 30 s buckets: 270 s.
    assert (peak["length_s"], profile["rate"]["bucket_s"]) == (270.0, 30.0)
    chart = profile["rate"]["chart"]
    ys = chart["series"][0]["y"]
    last_covered = max(1.0, profile["span_s"] - (len(ys) - 1) * 30.0)   # the last bucket ends with the data
    assert sum(y * 30.0 for y in ys[:-1]) + ys[-1] * last_covered == pytest.approx(5000, abs=0.01)
    assert chart["vspans"][0]["x0"] == peak["start"]
    lengths = profile["lengths"]["per_model"]
    assert lengths["rows"][0][:3] == ["(no model)", 5000, 5000]
    assert profile["context_budget"]["note"].startswith("no engine context settings")


def test_long_trace_is_bounded(traces):
    run = "burstgpt_v1_first400rows"
    profile = workload_profile(traces, [run])["runs"][run]
    points = len(profile["rate"]["chart"]["series"][0]["x"])
    assert points <= MAX_BUCKETS + 1
    assert profile["rate"]["bucket_s"] == 300.0                     # 10.4 hours in 5-minute buckets
    models = {row[0] for row in profile["lengths"]["per_model"]["rows"]}
    assert models == {"ChatGPT", "GPT-4"}
    assert profile["error_share"] == pytest.approx(17 / 400)        # all-zero token rows are failures
    assert len(json.dumps(profile)) < 60_000


def _raw_arrivals(run: str) -> list[datetime]:
    """Each public trace's arrival times read straight from its file (not through servlens's ingest)."""
    epoch = datetime(1970, 1, 1)
    if run == "mooncake_fast25_synthetic_trace":
        with open(TRACES / f"{run}.jsonl") as handle:   # timestamp: milliseconds from the trace's start
            return [epoch + timedelta(milliseconds=json.loads(line)["timestamp"]) for line in handle]
    with open(TRACES / f"{run}.csv") as handle:
        rows = list(csv.DictReader(handle))
    if run == "burstgpt_v1_first400rows":                       # Timestamp: seconds from the trace's start
        return [epoch + timedelta(seconds=float(r["Timestamp"])) for r in rows]
    return [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]   # Azure: wall clock, 100 ns digits


def _busiest(times: list[datetime], seconds: int) -> tuple[datetime, int]:
    """The clock-aligned second or minute with the most arrivals, the earliest on a tie."""
    per_bin = Counter(t.replace(microsecond=0) if seconds == 1 else t.replace(second=0, microsecond=0)
                      for t in times)
    start, n = min(per_bin.items(), key=lambda item: (-item[1], item[0]))
    return start, n


@pytest.mark.parametrize("run", ["mooncake_fast25_synthetic_trace", "burstgpt_v1_first400rows",
                                 "azure_llm_2023_conv_first5000"])
def test_peak_rate_at_one_second_and_one_minute_matches_the_raw_trace(traces, run):
    rate = workload_profile(traces, [run])["runs"][run]["rate"]
    times = _raw_arrivals(run)
    for key, seconds in (("peak_1s", 1), ("peak_1min", 60)):
        start, n = _busiest(times, seconds)
        end = start + timedelta(seconds=seconds)
        assert rate[key] == {"start": start.isoformat(timespec="milliseconds") + "Z",
                             "end": end.isoformat(timespec="milliseconds") + "Z",
                             "requests": n, "rate_rps": round(n / seconds, 4)}, key
    # The burst the averaged peak window hides (issue 12, class 10): a second at over twice the window's rate.
    assert rate["peak_1s"]["rate_rps"] >= 2.4 * rate["peak_window"]["rate_rps"]


def test_the_raw_peaks_are_the_known_bursts(traces):
    """The numbers themselves: a change in the raw readers cannot make both sides agree on a wrong value."""
    runs = workload_profile(traces, ["mooncake_fast25_synthetic_trace", "azure_llm_2023_conv_first5000",
                                     "burstgpt_v1_first400rows"])["runs"]
    seen = {run: [(p["rate"][k]["requests"], p["rate"][k]["start"][:19]) for k in ("peak_1s", "peak_1min")]
            for run, p in runs.items()}
    assert seen == {
        "mooncake_fast25_synthetic_trace": [(13, "1970-01-01T00:15:46"), (273, "1970-01-01T00:15:00")],
        "azure_llm_2023_conv_first5000": [(13, "2023-11-16T18:24:37"), (347, "2023-11-16T18:18:00")],
        "burstgpt_v1_first400rows": [(2, "1970-01-01T02:59:20"), (8, "1970-01-01T09:28:00")],
    }
    mooncake = next(line for line in workload_profile(traces, ["mooncake_fast25_synthetic_trace"])["summary"])
    # The busiest 4.5 min (9 buckets of 30 s) of the raw trace: 1,116 arrivals from +00:12:00. It was once read as
    # 1,089 from +00:07:00, when the sliding sum was cut short by the filter on its last start (SQL's WHERE runs
    # before the window), so the stretches near the end lost.
    assert ("peak 13/s in 1 s at +00:15:46, 4.55/s in 1 min at +00:15:00, 4.13/s over 4.5 min from +00:12:00 "
            "(1.1x the mean)") in mooncake


def test_a_run_shorter_than_a_minute_has_no_minute_peak(shared_data):
    con = open_store(None)
    try:
        ingest_paths(con, [str(shared_data / "real-engine" / "llamacpp")])
        profiles = workload_profile(con, ["poisson", "burst50"])
        busiest = con.execute("""SELECT date_trunc('second', t_arrival) AS s, count(*) AS n FROM requests
                                 WHERE run = 'poisson' GROUP BY 1 ORDER BY n DESC, s LIMIT 1""").fetchone()
    finally:
        con.close()
    poisson, burst = profiles["runs"]["poisson"], profiles["runs"]["burst50"]
    assert 1 < poisson["span_s"] < 60 and burst["span_s"] < 1
    # Every minute bucket of a 21 s run is cut by its edges and would read below the run's mean: unknown.
    assert poisson["rate"]["peak_1min"] is None and burst["rate"]["peak_1s"] is None
    assert (poisson["rate"]["peak_1s"]["requests"], poisson["rate"]["peak_1s"]["start"]) == (
        busiest[1], busiest[0].isoformat(timespec="milliseconds") + "Z")
    assert "/s in 1 s at " in profiles["summary"][0] and "in 1 min" not in profiles["summary"][0]


def test_bucket_width_steps():
    assert bucket_width(20) == 1.0
    assert bucket_width(3600) == 60.0
    assert bucket_width(24 * 3600) == 600.0
    assert math.ceil(7 * 86400 / bucket_width(7 * 86400)) <= MAX_BUCKETS


def _planted(rows: list[tuple]) -> object:
    con = open_store(None)
    for request_id, arrival, end, model, prompt, output, ttft, attrs in rows:
        con.execute(
            """INSERT INTO requests (run, request_id, t_arrival, t_end, e2e_s, model, prompt_tokens, completion_tokens,
                                     ttft_s, max_tokens, status, http_status, attrs)
               VALUES ('p', ?, ?, ?, ?, ?, ?, ?, ?, 100, 'ok', 200, ?)""",
            [request_id, arrival, end, (end - arrival).total_seconds() if end else None, model, prompt, output, ttft,
             attrs])
    return con


def test_concurrency_sweep_and_context_budget_on_planted_rows():
    t0 = datetime(2026, 11, 28, 10, 0, 0)
    s = timedelta(seconds=1)
    attrs = json.dumps({"n_ctx": 8192, "parallel": 4})
    con = _planted([
        ("a", t0, t0 + 10 * s, "m", 1000, 50, 0.2, attrs),
        ("b", t0 + 1 * s, t0 + 5 * s, "m", 2000, 60, 0.3, attrs),
        ("c", t0 + 2 * s, t0 + 3 * s, "m", 3000, 70, 0.4, attrs),   # 3 in flight at t0+2
        ("d", t0 + 5 * s, t0 + 6 * s, "m", 1900, 80, 0.5, attrs),   # starts as b ends: 2 in flight, not 3
        ("e", t0 + 20 * s, t0 + 21 * s, "n", 100, 10, None, attrs),
    ])
    try:
        profile = workload_profile(con, ["p"])["runs"]["p"]
    finally:
        con.close()
    conc = profile["concurrency"]
    assert conc["in_flight_max"] == 3
    assert conc["source"] == "request arrival..end overlap"
    budget = profile["context_budget"]
    assert (budget["n_ctx"], budget["parallel"], budget["context_per_sequence"]) == (8192, 4, 2048)
    assert budget["requests_with_prompt_over_budget"] == 1                      # c: 3000 > 2048
    assert budget["requests_whose_prompt_plus_max_tokens_exceed_budget"] == 2   # b: 2000 + 100, c
    lengths = {row[0]: row for row in profile["lengths"]["per_model"]["rows"]}
    assert lengths["m"][1:4] == [4, 4, 1950.0]                     # requests, with prompt tokens, p50 of 4 prompts
    latency = {row[0]: row for row in profile["latency"]["per_model"]["rows"]}
    assert latency["m"][1] == 4 and latency["m"][2] == pytest.approx(0.35)
    assert latency["n"][1] == 0 and latency["n"][2] is None         # unknown TTFT stays unknown
    assert profile["prefix_sharing"]["note"].startswith("no prefix keys and no block hashes")


def test_llamacpp_poisson_context_per_slot_and_gauges(shared_data):
    con = open_store(None)
    try:
        ingest_paths(con, [str(shared_data / "real-engine" / "llamacpp")])
        profile = workload_profile(con, ["poisson"])["runs"]["poisson"]
    finally:
        con.close()
    budget = profile["context_budget"]
    # --ctx-size 8192 --parallel 4: the exceed_context_size_error responses name 2048 per slot.
    assert budget["context_per_sequence"] == 2048
    assert budget["requests_with_prompt_over_budget"] == 4
    conc = profile["concurrency"]
    assert conc["engine_running_gauge"] == "llamacpp:requests_processing"
    assert conc["engine_waiting_gauge"] == "llamacpp:requests_deferred"
    assert [s["name"] for s in conc["chart"]["series"]] == [
        "in flight, from the logs (max)", "llamacpp:requests_processing (max)", "llamacpp:requests_deferred (max)"]
    per_window = profile["latency"]["per_window"]
    assert per_window["title"].startswith("TTFT and TPOT per window") and per_window["y_log"] is True
    assert [s["name"] for s in per_window["series"]] == ["TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (s)", "TPOT p99 (s)"]
    peak = profile["rate"]["peak_window"]
    assert peak["ttft_p99_s"] is not None and peak["ttft_p99_s"] >= peak.get("tpot_p99_s", 0)


def test_analyze_document_and_renderings_carry_the_workload(traces):
    doc = analyze(traces, [r for r in load_rules() if r.id == "SL004"])
    assert set(doc["workload"]["runs"]) == {"azure_llm_2023_conv_first5000", "burstgpt_v1_first400rows",
                                            "mooncake_fast25_synthetic_trace"}
    json.dumps(doc)   # plain JSON, no datetimes or decimals
    mooncake = next(line for line in doc["workload"]["summary"] if line.startswith("mooncake"))
    assert "64% of prompt blocks reusable" in mooncake and "no latencies" in mooncake
    assert "from +00:12:00" in mooncake                             # relative clock shown as an offset
    text = render_analyze_text(doc)
    assert "\nWORKLOAD\n  azure_llm_2023_conv_first5000: 5,000 requests over 17.1 min, peak 13/s in 1 s at " in text
    assert ("\n  mooncake_fast25_synthetic_trace: 3,993 requests over 17.0 min, peak 13/s in 1 s at +00:15:46,\n"
            "    4.55/s in 1 min at +00:15:00\n") in text
    verbose = render_analyze_text(doc, verbose=True)
    assert "64% of prompt blocks reusable" in " ".join(verbose.split())
    assert ("      peak_1s: start=1970-01-01T00:15:46.000Z, end=1970-01-01T00:15:47.000Z, requests=13, rate_rps=13\n"
            ) in verbose
    markdown = render_analyze_markdown(doc)
    assert "### Workload" in markdown and "64% of prompt blocks reusable" in markdown
    # The busiest second and minute beside the peak window, in every rendering.
    assert ("| mooncake\\_fast25\\_synthetic\\_trace | 3,993 | 13/s at +00:15:46 | 4.55/s at +00:15:00 | "
            "4.13/s over 4.5 min from +00:12:00 (1.1x the mean) |") in markdown
    assert "| Run | Requests | Peak rate, 1 s | Peak rate, 1 min | Peak window |" in markdown
    from servlens.render.html import render_html

    page = render_html(doc)
    workload = page[page.index('id="workload"'):]
    assert "<h6>Peak 1s</h6>" in workload and "<h6>Peak 1min</h6>" in workload
    mooncake_html = workload[workload.index("<h4>Mooncake"):]
    assert "<dt>Requests</dt><dd>13</dd>" in mooncake_html
    assert "<dt>Requests</dt><dd>273</dd>" in mooncake_html


def test_vllm_context_per_sequence_from_its_cache_config(shared_data):
    con = open_store(None)
    try:
        ingest_paths(con, [str(shared_data / "real-engine" / "vllm-cpu")])
        budget = workload_profile(con, ["poisson"])["runs"]["poisson"]["context_budget"]
    finally:
        con.close()
    # --max-model-len 2048: 131,072 KV tokens hold 64 sequences of full length.
    assert (budget["kv_cache_size_tokens"], budget["kv_cache_max_concurrency"]) == (131072, 64)
    assert budget["context_per_sequence"] == 2048
    assert budget["requests_with_prompt_over_budget"] == 0


def test_requests_without_any_time_still_get_lengths_and_latency():
    con = open_store(None)
    try:
        con.execute("""INSERT INTO requests (run, request_id, model, prompt_tokens, completion_tokens, ttft_s)
                       SELECT 'untimed', 'u' || i, 'm', 100 + i, 10, 0.1 * (1 + i % 3) FROM range(12) t(i)""")
        profile = workload_profile(con, ["untimed"])["runs"]["untimed"]
    finally:
        con.close()
    assert "rate" not in profile and profile["start"] is None
    assert profile["latency"]["note"] == "no arrival, first-token or end times: latency per window is unknown"
    assert profile["latency"]["per_model"]["rows"][0][1] == 12
    assert profile["concurrency"]["note"].startswith("no end times")


def test_llamacpp_props_beside_the_log_give_the_context_per_slot():
    from pathlib import Path

    incidents = Path(__file__).parent / "data" / "engine_incidents"
    con = open_store(None)
    try:
        ingest_paths(con, [str(incidents)])
        runs = workload_profile(con, ["hol", "restart"])["runs"]
    finally:
        con.close()
    # hol: --parallel 4 --ctx-size 8192; restart: --parallel 2 --ctx-size 8192 (their props.json).
    assert (runs["hol"]["context_budget"]["parallel"], runs["hol"]["context_budget"]["context_per_sequence"]) == (4, 2048)
    assert (runs["restart"]["context_budget"]["parallel"],
            runs["restart"]["context_budget"]["context_per_sequence"]) == (2, 4096)
