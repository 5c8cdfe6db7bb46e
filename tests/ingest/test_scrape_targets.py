"""Scrape targets: a saved /metrics page has no `instance` label (Prometheus adds it when it scrapes), so ingest gives
each sample without one the scrape target it came from (servlens.ingest.metrics.scrape_target). Two servers' scrapes
in one run are then two series, never one series interleaved in time that "resets" at every scrape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.analysis.inputs import ingest_paths
from servlens.ingest.metrics import ingest_metrics_file, scrape_target, target_of_file_name
from servlens.ingest.sources import decide_source

RECORDED = Path(__file__).parents[1] / "data" / "recorded"
T0_MS = 1795940000000  # 2026-11-29T07:33:20Z


def llamacpp_scrape(prompt_tokens: float, deferred: float, extra: str = "") -> str:
    """A llama.cpp /metrics page (no label at all), as curl saves it."""
    return (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        f"llamacpp:prompt_tokens_total {prompt_tokens}\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        f"llamacpp:requests_deferred {deferred}\n" + extra
    )


def write_scrapes(folder: Path, stem: str, values: list[float], offset_ms: int = 0) -> None:
    """One file per scrape, one a second, the time in the name (13-digit ms) as a scrape loop writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, value in enumerate(values):
        (folder / f"{stem}_{T0_MS + 1000 * i + offset_ms}.prom").write_text(llamacpp_scrape(value, 0))


def two_servers(tmp_path: Path, small: list[float]) -> Path:
    """A primary at 70 prompt tokens and more, a second server with `small`, scraped 1 ms after it (interleaved)."""
    write_scrapes(tmp_path / "rec", "metrics_primary", [70, 120, 300, 450, 600])
    write_scrapes(tmp_path / "rec" / "backend-small", "metrics_small", small, offset_ms=1)
    return tmp_path / "rec"


def test_two_unlabelled_targets_interleaved_make_no_reset(con, tmp_path):
    folder = two_servers(tmp_path, [0, 0, 16, 40, 90])
    ingest_paths(con, [str(folder)], [], run="both")
    assert con.execute(
        "SELECT labels['instance'], count(*) FROM metric_samples WHERE name = 'llamacpp:prompt_tokens' GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("backend-small/metrics_small", 5), ("rec/metrics_primary", 5)]
    # Without a target per file the one series would read 70, 0, 120, 0, 300, 16, ...: a reset at every other scrape.
    assert con.execute("SELECT count(*) FROM metric_counter_resets").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM metric_restarts").fetchone() == (0,)
    increases = con.execute(
        "SELECT labels['instance'], list(increase ORDER BY ts) FROM metric_counter_increases "
        "WHERE name = 'llamacpp:prompt_tokens' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert increases == [("backend-small/metrics_small", [None, 0.0, 16.0, 24.0, 50.0]),
                         ("rec/metrics_primary", [None, 50.0, 180.0, 150.0, 150.0])]


def test_a_real_restart_of_one_target_is_still_one_reset(con, tmp_path):
    folder = two_servers(tmp_path, [5, 9, 2, 4, 8])  # the small server restarted between its 2nd and 3rd scrape
    ingest_paths(con, [str(folder)], [], run="both")
    resets = con.execute(
        "SELECT labels['instance'], value_before, value_after, epoch_ms(last_ts_before), epoch_ms(first_ts_after) "
        "FROM metric_counter_resets"
    ).fetchall()
    assert resets == [("backend-small/metrics_small", 9.0, 2.0, T0_MS + 1001, T0_MS + 2001)]
    assert con.execute("SELECT instance, series_reset FROM metric_restarts").fetchall() == [
        ("backend-small/metrics_small", 1)]
    # the increase after the restart is the new value (counted from zero), the primary's series is untouched
    assert con.execute(
        "SELECT labels['instance'], sum(increase) FROM metric_counter_increases GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("backend-small/metrics_small", 4.0 + 2.0 + 2.0 + 4.0), ("rec/metrics_primary", 530.0)]


def test_one_target_written_as_many_files_stays_one_series(con, tmp_path):
    # numbered scrapes (a recorder's _000 .. _004), ingested one file per call in any order
    folder = tmp_path / "scrapes"
    folder.mkdir()
    for i, value in enumerate([10, 20, 35, 50, 80]):
        (folder / f"metrics_run-7_{i:03d}.prom").write_text(llamacpp_scrape(value, i))
    for i in (3, 0, 4, 1, 2):
        path = (folder / f"metrics_run-7_{i:03d}.prom").resolve()
        con.execute("BEGIN")
        ingest_metrics_file(con, path, run="r", decision=decide_source(con, "r", "metrics", path),
                            at=f"2026-11-29T07:00:0{i}Z")
        con.execute("COMMIT")
    assert con.execute("SELECT DISTINCT labels FROM metric_samples").fetchall() == [({"instance": "scrapes/metrics_run-7"},)]
    assert con.execute(
        "SELECT list(increase ORDER BY ts) FROM metric_counter_increases WHERE name = 'llamacpp:prompt_tokens'"
    ).fetchone() == ([None, 10.0, 15.0, 15.0, 30.0],)


def test_samples_with_an_instance_keep_it(con, tmp_path):
    # a /federate dump carries Prometheus' instance; a sample without one gets the file's target
    path = tmp_path / "fed" / "federate_001.prom"
    path.parent.mkdir()
    path.write_text(
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{instance="10.0.0.7:8000",job="vllm",model_name="m"} 3\n'
        'vllm:num_requests_waiting{model_name="m"} 1\n'
    )
    summary = ingest_paths(con, [], [str(path)], run="r", at="2026-11-29T07:00:00Z")
    assert con.execute("SELECT labels, value FROM metric_samples ORDER BY value").fetchall() == [
        ({"instance": "fed/federate", "model_name": "m"}, 1.0),
        ({"instance": "10.0.0.7:8000", "job": "vllm", "model_name": "m"}, 3.0),
    ]
    assert summary["sources"][0]["instance"] == "fed/federate"


def test_prometheus_api_series_are_left_as_stored(con, tmp_path):
    # Prometheus' own series: their labels are what Prometheus stored, with or without an instance (a series written
    # by remote write or a recording rule may have none); the file is a query answer, not a scrape target.
    path = Path(__file__).parent / "data" / "metrics" / "query_range_vllm_burst50.json"
    ingest_paths(con, [], [str(path)], run="api")
    assert con.execute("SELECT DISTINCT labels['instance'] FROM metric_samples ORDER BY 1").fetchall() == [
        ("localhost:8000",), ("localhost:8001",)]
    answer = tmp_path / "query_range.json"
    answer.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm:prompt_tokens_total", "model_name": "m"},
         "values": [[1795937384, "0"], [1795937385, "1995"]]}]}}))
    ingest_paths(con, [], [str(answer)], run="api2")
    assert con.execute("SELECT DISTINCT labels FROM metric_samples WHERE run = 'api2'").fetchall() == [
        ({"model_name": "m"},)]


def test_an_index_names_the_target(con, tmp_path):
    # A recorder writes one index per scrape loop: the scrapes it names are one target, whatever their names (one
    # server's scrapes across runs: metrics_burst50_*, metrics_poisson_*), unless a row names the `instance`.
    folder = tmp_path / "server"
    folder.mkdir()
    rows = []
    for i, (name, value) in enumerate([("metrics_a_000.prom", 10), ("metrics_a_001.prom", 30), ("metrics_b_000.prom", 45)]):
        (folder / name).write_text(llamacpp_scrape(value, 0))
        rows.append({"file": name, "run": "day", "scrape_ts": T0_MS / 1000 + i})
    (folder / "metrics_index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ingest_paths(con, [], [str(folder)], run="day")
    assert con.execute(
        "SELECT labels['instance'], list(increase ORDER BY ts) FROM metric_counter_increases GROUP BY 1"
    ).fetchall() == [("server/metrics_index.jsonl", [None, 20.0, 15.0])]
    rows[2]["instance"] = "10.0.0.7:8080"
    (folder / "metrics_index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert scrape_target(folder / "metrics_b_000.prom") == "10.0.0.7:8080"
    assert scrape_target(folder / "metrics_a_000.prom") == "server/metrics_index.jsonl"


@pytest.mark.parametrize("name, target", [
    ("metrics_gw-timeout-fallback_000.prom", "metrics_gw-timeout-fallback"),
    ("metrics_gw-ratelimit-429_017.prom.gz", "metrics_gw-ratelimit-429"),  # only the last number is the sequence
    ("metrics_burst50_003.prom", "metrics_burst50"),
    ("vllm-1795940000.prom", "vllm"),                                     # 10-digit Unix seconds
    ("vllm-0_1795940000123.prom", "vllm-0"),                              # 13-digit ms; the pod ordinal stays
    ("vllm-0_000.prom", "vllm-0"),
    ("scrape-2026-11-28T14:05:00Z.prom", "scrape"),
    ("metrics_20261128T140500Z_node-a.txt", "metrics_node-a"),            # a time in the middle
    ("scrape_12.txt", "scrape"),
    ("metrics.prom", "metrics"),
    ("1795940000.prom", ""),                                              # the folder alone names the target
])
def test_target_of_file_name(name, target):
    assert target_of_file_name(name) == target


def test_the_recorded_two_backend_folder_has_no_restart(con):
    # gw-timeout-fallback: a LiteLLM proxy in front of two llama.cpp servers (the primary's scrapes in the folder,
    # the fallback's in backend-small/, one index each; no server restarted). As one run the two were one series
    # before: 19 restarts in the metrics, and SL006 fired on the gateway's own timeouts.
    ingest_paths(con, [str(RECORDED / "gw-timeout-fallback")], [], run="gw")
    assert con.execute(
        "SELECT labels['instance'], count(DISTINCT source_id) FROM metric_samples GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("backend-small/metrics_index.jsonl", 17), ("gw-timeout-fallback/metrics_index.jsonl", 17)]
    assert con.execute("SELECT count(*) FROM metric_counter_resets").fetchone() == (0,)
    # each server's counters end where its own last scrape says (README: prompt_tokens_total last 2545 and 3142)
    assert con.execute(
        "SELECT labels['instance'], arg_max(value, ts) FROM metric_samples WHERE name = 'llamacpp:prompt_tokens' "
        "GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("backend-small/metrics_index.jsonl", 3142.0), ("gw-timeout-fallback/metrics_index.jsonl", 2545.0)]
