"""vLLM's periodic stats line ("Engine 000: ... Running: N reqs, Waiting: N reqs, CPU KV cache usage: x%") as gauge
samples, from two real vLLM 0.32 console logs: the one recorded with request logging (tests/data/formats/vllm-log)
and the shared vLLM CPU run's server log (stats lines only, no request lines)."""

from __future__ import annotations

from datetime import datetime

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.errors import ConfigError
from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import parse_profile
from servlens.store.schema import open_store
from tests.conftest import SHARED_DATA
from tests.ingest.format_rows import FORMATS

RECORDED = FORMATS / "vllm-log" / "vllm-server.log"
STATS_ONLY = SHARED_DATA / "real-engine" / "vllm-cpu" / "vllm-server.log"


def _samples(con) -> list[tuple]:
    return con.execute("SELECT ts, name, labels['engine'], value FROM metric_samples "
                       "WHERE type = 'gauge' AND series = 'value' ORDER BY ts, name").fetchall()


def test_recorded_log_gives_requests_and_its_three_stats_lines():
    con = open_store(None)
    report = ingest_inputs(con, [str(RECORDED)], run="t").to_dict()
    kinds = [(s["kind"], s["format"], s["rows"]) for s in report["sources"]]
    assert kinds == [("requests", "vllm-request-log", 10), ("metrics", "vllm-request-log metric-lines", 9)]
    # lines 152, 179 and 180 of the log, on the requests' relative clock (1 January of an unnamed year + MM-DD)
    at = [datetime(1970, 12, 2, 1, 44, 46), datetime(1970, 12, 2, 1, 44, 56), datetime(1970, 12, 2, 1, 45, 6)]
    assert _samples(con) == [
        (at[0], "vllm:kv_cache_usage_perc", "0", 0.0), (at[0], "vllm:num_requests_running", "0", 1.0),
        (at[0], "vllm:num_requests_waiting", "0", 0.0),
        (at[1], "vllm:kv_cache_usage_perc", "0", 0.0), (at[1], "vllm:num_requests_running", "0", 0.0),
        (at[1], "vllm:num_requests_waiting", "0", 0.0),
        (at[2], "vllm:kv_cache_usage_perc", "0", 0.0), (at[2], "vllm:num_requests_running", "0", 0.0),
        (at[2], "vllm:num_requests_waiting", "0", 0.0),
    ]
    assert con.execute("SELECT DISTINCT run FROM metric_samples").fetchall() == [("t",)]
    assert con.execute("SELECT relative_clock FROM runs WHERE run = 't'").fetchone() == (True,)
    # the same content again: both sources skipped, nothing added
    again = ingest_inputs(con, [str(RECORDED)], run="t").to_dict()
    assert [s["skipped"] for s in again["sources"]] == [True, True]
    assert con.execute("SELECT count(*) FROM metric_samples").fetchone() == (9,)


def test_stats_only_log_is_gauges_with_start_moving_their_clock():
    con = open_store(None)
    report = ingest_inputs(con, [str(STATS_ONLY)], start="2025-01-01T00:00:00Z").to_dict()
    # no request line: no request source, and not "no rows" either
    assert [(s["kind"], s["rows"]) for s in report["sources"]] == [("metrics", 12)]
    values = {(ts.strftime("%H:%M:%S"), name): v for ts, name, _, v in _samples(con)}
    # "INFO 11-29 07:29:52 ... Running: 3 reqs, Waiting: 17 reqs, CPU KV cache usage: 1.3%"
    assert values[("07:29:52", "vllm:num_requests_running")] == 3.0
    assert values[("07:29:52", "vllm:num_requests_waiting")] == 17.0
    assert values[("07:29:52", "vllm:kv_cache_usage_perc")] == pytest.approx(0.013)
    assert values[("07:30:02", "vllm:kv_cache_usage_perc")] == pytest.approx(0.002)
    first = con.execute("SELECT min(ts) FROM metric_samples").fetchone()[0]
    assert first == datetime(2025, 11, 29, 7, 29, 52)  # --start is the epoch of the relative clock (1 January): MM-DD kept
    assert con.execute("SELECT relative_clock FROM runs").fetchone() == (False,)


def test_sl009_reads_the_stats_lines_roles():
    con = open_store(None)
    ingest_paths(con, [str(STATS_ONLY)])
    doc = analyze(con, [r for r in load_rules() if r.id == "SL009"])
    (finding,) = doc["findings"]
    assert finding["state"] == "clear"
    metrics = finding["evidence"]["metrics"]
    assert (metrics["kv_metric"], metrics["scrapes"], metrics["waiting_max"], metrics["running_max"]) == (
        "vllm:kv_cache_usage_perc", 4, 17.0, 3.0)
    assert metrics["kv_usage_max"] == pytest.approx(0.013)
    assert "they waited on the concurrency cap" in finding["summary"]


def test_metric_lines_section_is_checked():
    base = {"name": "x", "reader": "lines", "lines": {"patterns": ["(?P<a>a)"]}}
    with pytest.raises(ConfigError, match=r"\[metric_lines\] needs ts"):
        parse_profile({**base, "metric_lines": {"patterns": ["(?P<v>\\d+)"], "gauges": {"g": "m.v"}}}, "x")
    with pytest.raises(ConfigError, match="is not a Prometheus metric name"):
        parse_profile({**base, "metric_lines": {"patterns": ["(?P<v>\\d+)"], "ts": "now()",
                                                "gauges": {"bad name": "m.v"}}}, "x")
    with pytest.raises(ConfigError, match="needs reader 'lines'"):
        parse_profile({"name": "x", "reader": "jsonl", "metric_lines": {
            "patterns": ["(?P<v>\\d+)"], "ts": "now()", "gauges": {"g": "m.v"}}}, "x")
