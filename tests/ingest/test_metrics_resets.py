"""Counter resets: the views metric_counter_increases and metric_counter_resets, on a fixture and on real restarts."""

from __future__ import annotations

import math
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from servlens.ingest.metrics import METRIC_FORMATS, ingest_metrics_file, sniff_metrics
from servlens.ingest.sources import decide_source

RESTART = Path(__file__).parent / "data" / "metrics" / "restart"


def ingest_folder_as_one_run(con, folder, run):
    for path in sorted(Path(folder).iterdir()):
        if sniff_metrics(path) in METRIC_FORMATS:
            path = path.resolve()
            con.execute("BEGIN")
            ingest_metrics_file(con, path, run=run, decision=decide_source(con, run, "metrics", path))
            con.execute("COMMIT")


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def test_increases_treat_a_drop_as_a_restart(store):
    ingest_folder_as_one_run(store, RESTART, "restart")
    rows = store.execute(
        "SELECT name, series, le, labels['finished_reason'], list(increase ORDER BY ts), list(is_reset ORDER BY ts), "
        "list(interval_s ORDER BY ts) FROM metric_counter_increases WHERE run = 'restart' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    nothing, reset_third = [False, False, False, False], [False, False, True, False]
    intervals = [None, 15.0, 15.0, 15.0]
    assert rows == [
        ("vllm:prompt_tokens", "value", None, None, [None, 150.0, 40.0, 50.0], reset_third, intervals),
        ("vllm:request_success", "value", None, "length", [None, 0.0, 0.0, 2.0], nothing, intervals),
        ("vllm:request_success", "value", None, "stop", [None, 4.0, 1.0, 3.0], reset_third, intervals),
        ("vllm:time_to_first_token_seconds", "bucket", 1.0, None, [None, 10.0, 2.0, 4.0], reset_third, intervals),
        ("vllm:time_to_first_token_seconds", "bucket", math.inf, None, [None, 10.0, 3.0, 5.0], reset_third, intervals),
        ("vllm:time_to_first_token_seconds", "count", None, None, [None, 10.0, 3.0, 5.0], reset_third, intervals),
        ("vllm:time_to_first_token_seconds", "sum", None, None, [None, 4.75, 1.5, 2.5], reset_third, intervals),
    ]
    # gauges are not cumulative: never in the view
    assert store.execute(
        "SELECT count(*) FROM metric_counter_increases WHERE name IN ('vllm:num_requests_running', 'process_start_time_seconds')"
    ).fetchone() == (0,)


def test_resets_listed_per_series(store):
    ingest_folder_as_one_run(store, RESTART, "restart")
    resets = store.execute(
        "SELECT name, series, le, labels['finished_reason'], last_ts_before, first_ts_after, value_before, value_after "
        "FROM metric_counter_resets ORDER BY ALL"
    ).fetchall()
    before, after = utc(1795940015), utc(1795940030)
    assert resets == [
        ("vllm:prompt_tokens", "value", None, None, before, after, 250.0, 40.0),
        ("vllm:request_success", "value", None, "stop", before, after, 9.0, 1.0),
        ("vllm:time_to_first_token_seconds", "bucket", 1.0, None, before, after, 15.0, 2.0),
        ("vllm:time_to_first_token_seconds", "bucket", math.inf, None, before, after, 20.0, 3.0),
        ("vllm:time_to_first_token_seconds", "count", None, None, before, after, 20.0, 3.0),
        ("vllm:time_to_first_token_seconds", "sum", None, None, before, after, 9.25, 1.5),
    ]
    # the restart agrees with the process start time the engine exposes
    starts = store.execute(
        "SELECT DISTINCT value FROM metric_samples WHERE name = 'process_start_time_seconds' ORDER BY 1"
    ).fetchall()
    assert starts == [(1795939990.0,), (1795940021.0,)]
    assert before < utc(1795940021.0) < after


def test_separate_runs_never_see_each_others_values(store, shared_data):
    # Each vllm-cpu run in its own run label (from the index): no resets, although the server restarted between runs.
    for path in sorted((shared_data / "real-engine" / "vllm-cpu").iterdir()):
        if sniff_metrics(path) in METRIC_FORMATS:
            from servlens.ingest.metrics import metrics_run_for

            run = metrics_run_for(path)
            store.execute("BEGIN")
            ingest_metrics_file(store, path.resolve(), run=run, decision=decide_source(store, run, "metrics", path.resolve()))
            store.execute("COMMIT")
    assert store.execute("SELECT count(*) FROM metric_counter_resets").fetchone() == (0,)


def test_real_vllm_restart_between_runs_found_when_ingested_as_one_run(store, shared_data):
    ingest_folder_as_one_run(store, shared_data / "real-engine" / "vllm-cpu", "day")
    # process_start_time_seconds changes from 1795937337.78 to 1795937429.18 between poisson_012 and noprefixcaching_000
    restart_scrape = utc(1795937474.6061904)  # metrics_index.jsonl: metrics_noprefixcaching_nocache_000.prom
    prompt = store.execute(
        "SELECT last_ts_before, first_ts_after, value_before, value_after FROM metric_counter_resets "
        "WHERE name = 'vllm:prompt_tokens'"
    ).fetchall()
    assert len(prompt) == 1
    assert prompt[0][2:] == (43073.0, 0.0)  # metrics_poisson_012.prom -> metrics_noprefixcaching_nocache_000.prom
    assert abs((prompt[0][1] - restart_scrape).total_seconds()) <= 1e-6  # float seconds -> microseconds
    # across the whole day the prompt tokens counted are the two processes' totals added
    assert store.execute(
        "SELECT sum(increase) FROM metric_counter_increases WHERE name = 'vllm:prompt_tokens'"
    ).fetchone() == (43073.0 + 15550.0,)
    # every reset of a vLLM series happens at the restart scrape (series present then) or at the series' first
    # appearance after it (the chat-completions handler series first reappear one scrape later)
    times = store.execute("SELECT DISTINCT first_ts_after FROM metric_counter_resets ORDER BY 1").fetchall()
    assert times[0][0] == prompt[0][1] and len(times) == 2
    assert store.execute(
        "SELECT DISTINCT name FROM metric_counter_resets WHERE first_ts_after = ? ORDER BY 1", [times[1][0]]
    ).fetchall() == [("http_request_duration_seconds",), ("http_request_size_bytes",), ("http_requests",), ("http_response_size_bytes",)]


def test_real_llamacpp_restart_label_less_counters(store, shared_data):
    ingest_folder_as_one_run(store, shared_data / "real-engine" / "llamacpp", "day")
    resets = store.execute(
        "SELECT name, value_before, value_after FROM metric_counter_resets ORDER BY name"
    ).fetchall()
    # the server was restarted for the fresh_* runs: metrics_prefix_cache_001.prom -> metrics_fresh_cache_000.prom
    assert [r[0] for r in resets] == [
        "llamacpp:n_decode", "llamacpp:n_tokens_max", "llamacpp:prompt_seconds", "llamacpp:prompt_tokens",
        "llamacpp:prompt_tokens_cached", "llamacpp:tokens_predicted", "llamacpp:tokens_predicted_seconds",
    ]
    assert dict((r[0], r[1:]) for r in resets)["llamacpp:prompt_tokens"] == (47427.0, 0.0)
    assert store.execute("SELECT DISTINCT last_ts_before, first_ts_after FROM metric_counter_resets").fetchall() == [
        (utc(1795937018.1996317), utc(1795937019.6788747))  # metrics_index.jsonl: prefix_cache_001, fresh_cache_000
    ]
    # fresh_cache_000 has the same bytes as burst50_000 (a fresh server, every counter 0) and is still a scrape of its own
    assert store.execute("SELECT count(*) FROM sources").fetchone() == (38,)


BENCH_FOLDERS = ("random", "prefix_repetition", "random_burstiness0.5", "random_burstiness0.5_seed1")


def test_vllm_bench_scrapes_of_one_server_have_no_reset(store, shared_data, tmp_path):
    # One scrape in each of four folders, no index: four scrape targets as far as the files say (a folder per target
    # is the usual layout), each with one sample: no interval, so no increase and no reset.
    for folder in BENCH_FOLDERS:
        ingest_folder_as_one_run(store, shared_data / "real-engine" / "vllm-bench" / folder, "bench")
    assert store.execute("SELECT count(*) FROM metric_counter_resets").fetchone() == (0,)
    assert store.execute(
        "SELECT list(labels['instance'] ORDER BY ts), list(increase ORDER BY ts) FROM metric_counter_increases "
        "WHERE name = 'vllm:request_success' AND labels['finished_reason'] = 'length'"
    ).fetchone() == ([f"{folder}/vllm" for folder in BENCH_FOLDERS], [None] * 4)
    # The same four scrapes of the one server (its README: one instance at a time, 127.0.0.1:8091) in one folder,
    # named vllm-<time>.prom: one target, one series. Length finishes per interval (80 -> 116 -> 196 -> 276).
    together = tmp_path / "bench"
    together.mkdir()
    for folder in BENCH_FOLDERS:
        for scrape in (shared_data / "real-engine" / "vllm-bench" / folder).glob("vllm-*.prom"):
            shutil.copy(scrape, together / scrape.name)
    ingest_folder_as_one_run(store, together, "together")
    assert store.execute("SELECT count(*) FROM metric_counter_resets").fetchone() == (0,)
    assert store.execute(
        "SELECT list(DISTINCT labels['instance']), list(increase ORDER BY ts) FROM metric_counter_increases "
        "WHERE run = 'together' AND name = 'vllm:request_success' AND labels['finished_reason'] = 'length'"
    ).fetchone() == (["bench/vllm"], [None, 36.0, 80.0, 80.0])


def test_restarts_one_row_per_restart(store, shared_data):
    ingest_folder_as_one_run(store, shared_data / "real-engine" / "vllm-cpu", "vday")
    ingest_folder_as_one_run(store, shared_data / "real-engine" / "llamacpp", "lday")
    ingest_folder_as_one_run(store, RESTART, "fixture")
    rows = store.execute(
        "SELECT run, instance, epoch(last_ts_before), epoch(first_ts_after), series_reset FROM metric_restarts ORDER BY run"
    ).fetchall()
    vllm_resets = store.execute("SELECT count(*) FROM metric_counter_resets WHERE run = 'vday'").fetchone()[0]
    assert rows == [
        # the scrape target of each (the files carry no `instance`): the folder and file name without the scrape
        # time, or the index naming the scrapes (one server across several runs' scrapes)
        ("fixture", "restart/vllm", 1795940015.0, 1795940030.0, 6),
        ("lday", "llamacpp/metrics_index.jsonl", pytest.approx(1795937018.1996317, abs=1e-6),
         pytest.approx(1795937019.6788747, abs=1e-6), 7),
        # metrics_index.jsonl: poisson_012 then noprefixcaching_nocache_000 (the server restarted without prefix caching)
        ("vday", "vllm-cpu/metrics_index.jsonl", pytest.approx(1795937423.357976, abs=1e-6),
         pytest.approx(1795937474.6061904, abs=1e-6), vllm_resets),
    ]
