"""Metrics ingest on the real scrapes in tests/data/shared, on a Prometheus API fixture, and on each scrape-time source.

Expected counts were taken from the files with grep (sample lines minus `_created` lines), not from servlens.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from servlens.errors import InputError
from servlens.ingest.metrics import (
    API_FORMAT,
    INDEX_FORMAT,
    METRIC_FORMATS,
    OPENMETRICS_FORMAT,
    TEXT_FORMAT,
    decide_metrics_source,
    ingest_metrics_file,
    load_scrape_index,
    metrics_run_for,
    sniff_metrics,
    time_from_file_name,
)
from servlens.ingest.sources import decide_source

FIXTURES = Path(__file__).parent / "data" / "metrics"


def ingest(con, path, run=None, **options):
    """What `servlens ingest --metrics` does per file (H1 wires the same calls): run, decision, one transaction."""
    path = Path(path).resolve()
    run = run or metrics_run_for(path, options.get("index")) or path.stem
    decision = decide_source(con, run, "metrics", path)
    con.execute("BEGIN")
    try:
        summary = ingest_metrics_file(con, path, run=run, decision=decision, **options)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return summary


def ingest_folder(con, folder, run=None):
    summaries = []
    for path in sorted(Path(folder).iterdir()):
        if sniff_metrics(path) in METRIC_FORMATS:
            summaries.append(ingest(con, path, run=run))
    return summaries


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


# ---------------------------------------------------------------------------------------------------------------
# sniffing


def test_sniff_tells_each_real_file_apart(shared_data, tmp_path):
    engine = shared_data / "real-engine"
    assert sniff_metrics(engine / "vllm-cpu" / "metrics_burst50_006.prom") == TEXT_FORMAT
    assert sniff_metrics(engine / "llamacpp" / "metrics_poisson_003.prom") == TEXT_FORMAT
    assert sniff_metrics(engine / "vllm-bench" / "random" / "vllm-1795940098.prom") == TEXT_FORMAT
    assert sniff_metrics(shared_data / "formats" / "vllm_v0.x_metrics_scrape_partial_aibrix_docs.prom") == TEXT_FORMAT
    assert sniff_metrics(engine / "vllm-cpu" / "metrics_index.jsonl") == INDEX_FORMAT
    assert sniff_metrics(FIXTURES / "query_range_vllm_burst50.json") == API_FORMAT
    for not_metrics in [
        engine / "vllm-cpu" / "requests.jsonl",
        engine / "vllm-cpu" / "summary.jsonl",
        engine / "vllm-cpu" / "models.json",
        engine / "vllm-cpu" / "vllm-server.log",
        engine / "llamacpp" / "props.json",
        engine / "vllm-bench" / "random" / "random-3.0qps-tiny-20261129-081458.json",
        engine / "vllm-bench" / "random" / "bench_stdout.log",
        engine / "vllm-bench" / "random" / "run_info.txt",
        shared_data / "traces" / "burstgpt_v1_first400rows.csv",
        shared_data / "traces" / "mooncake_fast25_synthetic_trace.jsonl",
        shared_data / "formats" / "vllm_v0.26.0_metric_families_inference-perf.txt",
    ]:
        assert sniff_metrics(not_metrics) is None, not_metrics
    om = tmp_path / "scrape.txt"
    om.write_text("# TYPE a counter\na_total 1\n# EOF\n")
    assert sniff_metrics(om) == OPENMETRICS_FORMAT
    compressed = tmp_path / "scrape.prom.gz"
    compressed.write_bytes(gzip.compress((engine / "llamacpp" / "metrics_poisson_003.prom").read_bytes()))
    assert sniff_metrics(compressed) == TEXT_FORMAT


# ---------------------------------------------------------------------------------------------------------------
# real scrapes


def test_vllm_cpu_folder_every_run_from_the_index(store, shared_data):
    summaries = ingest_folder(store, shared_data / "real-engine" / "vllm-cpu")
    assert len(summaries) == 33
    assert {s["time_source"] for s in summaries} == {"index"}
    assert {s["bad_lines"] for s in summaries} == {0}
    by_run = dict(store.execute("SELECT run, count(*) FROM metric_samples GROUP BY run").fetchall())
    # sample lines minus `_created` lines, per run (grep over the files)
    assert by_run == {"burst50": 5206, "noprefixcaching_nocache": 1894, "poisson": 5394, "prefix_cache": 828}
    assert store.execute("SELECT count(*) FROM metric_samples WHERE name_raw LIKE '%\\_created' ESCAPE '\\'").fetchone()[0] == 0
    assert sum(s["created_dropped"] for s in summaries) == 729 + 241 + 805 + 122
    assert store.execute("SELECT count(*), sum(rows) FROM sources WHERE kind = 'metrics'").fetchone() == (33, 13322)

    one = next(s for s in summaries if s["path"].endswith("metrics_burst50_006.prom"))
    assert one["run"] == "burst50" and one["format"] == TEXT_FORMAT and one["rows"] == 403
    assert one["t_min"] == one["t_max"] == "2026-11-29T07:29:49.293533Z"  # scrape_ts 1795937389.2935328 in the index
    assert one["time_source_text"] == "scrape time from the scrape index file"
    assert "vllm:kv_cache_usage_perc" in one["metrics"] and "vllm:iteration_tokens_total" in one["metrics"]

    source_id = one["source_id"]
    assert store.execute(
        "SELECT name, name_raw, type, series, labels, value FROM metric_samples WHERE source_id = ? AND name = 'vllm:prompt_tokens'",
        [source_id],
    ).fetchall() == [("vllm:prompt_tokens", "vllm:prompt_tokens_total", "counter", "value",
                      # the file has no `instance` (a saved /metrics page): its target is the index naming it
                      {"engine": "0", "instance": "vllm-cpu/metrics_index.jsonl", "model_name": "tiny"}, 6391.0)]
    assert one["instance"] == "vllm-cpu/metrics_index.jsonl"
    ttft = store.execute(
        "SELECT series, le, value FROM metric_samples WHERE source_id = ? AND name = 'vllm:time_to_first_token_seconds' "
        "ORDER BY series, le",
        [source_id],
    ).fetchall()
    buckets = [(le, v) for series, le, v in ttft if series == "bucket"]
    assert len(buckets) == 23 and buckets[-1] == (math.inf, 25.0)
    assert [v for series, _, v in ttft if series == "count"] == [25.0]
    assert [v for series, _, v in ttft if series == "sum"] == [66.30264282226562]
    assert all(b[1] <= a[1] for a, b in zip(buckets[1:], buckets[:-1]))  # cumulative
    waiting = store.execute(
        "SELECT labels['reason'], value FROM metric_samples WHERE source_id = ? AND name = 'vllm:num_requests_waiting_by_reason' "
        "ORDER BY 1",
        [source_id],
    ).fetchall()
    assert waiting == [("capacity", 25.0), ("deferred", 0.0)]
    # the iteration histogram keeps `_total` in its name; the engine-less admission counter has only model_name
    assert store.execute(
        "SELECT DISTINCT type FROM metric_samples WHERE name = 'vllm:iteration_tokens_total'"
    ).fetchall() == [("histogram",)]
    assert store.execute(
        "SELECT DISTINCT labels FROM metric_samples WHERE name = 'vllm:admission_rejections' AND source_id = ? ORDER BY 1",
        [source_id],
    ).fetchall() == [({"instance": "vllm-cpu/metrics_index.jsonl", "model_name": "tiny", "reason": "max_num_queued_reqs"},),
                     ({"instance": "vllm-cpu/metrics_index.jsonl", "model_name": "tiny", "reason": "max_num_queued_tokens"},)]


def test_vllm_cache_config_info_keeps_its_labels(store, shared_data):
    ingest_folder(store, shared_data / "real-engine" / "vllm-cpu")
    info = store.execute(
        "SELECT run, labels['enable_prefix_caching'], labels['block_size'], labels['num_gpu_blocks'], count(*), min(value) "
        "FROM metric_samples WHERE name = 'vllm:cache_config_info' GROUP BY ALL ORDER BY run"
    ).fetchall()
    assert info == [
        ("burst50", "True", "128", "1024", 13, 1.0),
        ("noprefixcaching_nocache", "False", "128", "1024", 5, 1.0),
        ("poisson", "True", "128", "1024", 13, 1.0),
        ("prefix_cache", "True", "128", "1024", 2, 1.0),
    ]
    n_labels = store.execute(
        "SELECT DISTINCT cardinality(labels) FROM metric_samples WHERE name = 'vllm:cache_config_info'"
    ).fetchall()
    assert n_labels == [(38,)]  # its 37 labels and the scrape target's `instance`


def test_llamacpp_label_less_metrics(store, shared_data):
    summaries = ingest_folder(store, shared_data / "real-engine" / "llamacpp")
    assert len(summaries) == 38
    by_run = dict(store.execute("SELECT run, count(*) FROM metric_samples GROUP BY run").fetchall())
    assert by_run == {"burst50": 135, "fresh_cache": 45, "fresh_nocache": 90, "poisson": 180, "prefix_cache": 30, "prefix_nocache": 90}
    # no label at all on llama.cpp's metrics: every sample gets only the scrape target, one for the folder's server
    assert store.execute("SELECT DISTINCT map_keys(labels), labels['instance'] FROM metric_samples").fetchall() == [
        (["instance"], "llamacpp/metrics_index.jsonl")]
    names = dict(store.execute("SELECT DISTINCT name, type FROM metric_samples").fetchall())
    assert len(names) == 15
    assert names["llamacpp:prompt_tokens"] == "counter"
    assert names["llamacpp:n_tokens_max"] == "counter"  # exposed without _total, as a counter
    assert names["llamacpp:requests_deferred"] == "gauge"
    row = store.execute(
        "SELECT ts, value FROM metric_samples m JOIN sources s USING (source_id) "
        "WHERE s.path LIKE '%metrics_burst50_003.prom' AND name = 'llamacpp:requests_deferred'"
    ).fetchone()
    assert row[1] == 27.0
    index = load_scrape_index(shared_data / "real-engine" / "llamacpp" / "metrics_index.jsonl")
    entry = index[(shared_data / "real-engine" / "llamacpp" / "metrics_burst50_003.prom").resolve()]
    assert entry.run == "burst50"
    assert (row[0] - datetime(1970, 1, 1)).total_seconds() == pytest.approx(entry.scrape_ts, abs=1e-6)


def test_vllm_bench_scrape_time_from_file_name(store, shared_data):
    path = shared_data / "real-engine" / "vllm-bench" / "random" / "vllm-1795940098.prom"
    summary = ingest(store, path, run="bench-a")
    assert summary["time_source"] == "file_name"
    assert summary["time_source_text"] == "scrape time from a time in the file name"
    assert summary["t_min"] == summary["t_max"] == "2026-11-29T08:14:58Z"
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert summary["rows"] == len(lines) - sum("_created" in line.split(" ")[0].split("{")[0] for line in lines)
    assert store.execute(
        "SELECT value FROM metric_samples WHERE run = 'bench-a' AND name = 'vllm:request_success' AND labels['finished_reason'] = 'length'"
    ).fetchone() == (80.0,)


def test_old_vllm_names_normalised_with_raw_names_kept(store, shared_data, tmp_path):
    path = shared_data / "formats" / "vllm_v0.x_metrics_scrape_partial_aibrix_docs.prom"
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    os.utime(copy, (1738217335.0, 1738217335.0))
    summary = ingest(store, copy, run="v0")
    assert summary["time_source"] == "mtime"  # no time in the name, no index, no timestamps
    assert summary["t_min"] == "2025-01-30T06:08:55Z"
    assert summary["rows"] == 29 and summary["bad_lines"] == 0
    gpu = store.execute(
        "SELECT name, name_raw, type, value FROM metric_samples WHERE name_raw = 'vllm:gpu_cache_usage_perc'"
    ).fetchall()
    assert gpu == [("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "gauge", 0.0)]
    assert store.execute(
        "SELECT labels['enable_prefix_caching'], labels['num_gpu_blocks'] FROM metric_samples WHERE name = 'vllm:cache_config_info'"
    ).fetchone() == ("False", "81767")
    assert store.execute(
        "SELECT labels FROM metric_samples WHERE name = 'vllm:lora_requests_info'"
    ).fetchone() == ({"instance": f"{tmp_path.name}/vllm_v0.x_metrics_scrape_partial_aibrix_docs",
                      "max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""},)
    assert store.execute(
        "SELECT value FROM metric_samples WHERE name = 'vllm:gpu_prefix_cache_hit_rate'"
    ).fetchone() == (-1.0,)


# ---------------------------------------------------------------------------------------------------------------
# scrape time: first found wins


def _scrape(tmp_path, name, body="a_gauge 1\n", mtime=1795000000.0):
    path = tmp_path / name
    path.write_text(body)
    os.utime(path, (mtime, mtime))
    return path


def test_time_precedence_exposition_then_at_then_index_then_name_then_mtime(store, tmp_path):
    stamped = _scrape(tmp_path, "vllm-1795936979.prom", "a_gauge 1 1795937000500\n")
    summary = ingest(store, stamped, run="r", at="2026-11-28T14:05:00Z")
    assert (summary["time_source"], summary["t_min"]) == ("exposition", "2026-11-29T07:23:20.500000Z")

    at = _scrape(tmp_path, "vllm-1795936980.prom", "a_gauge 2\n")
    (tmp_path / "metrics_index.jsonl").write_text(json.dumps({"file": at.name, "run": "idx", "scrape_ts": 1795936990.25}) + "\n")
    summary = ingest(store, at, run="r", at="2026-11-28T14:05:00Z")
    assert (summary["time_source"], summary["t_min"]) == ("at", "2026-11-28T14:05:00Z")
    assert summary["time_source_text"] == "scrape time from --at"

    summary = ingest(store, at, run="r2")  # the index beside it is found
    assert (summary["time_source"], summary["t_min"]) == ("index", "2026-11-29T07:23:10.250000Z")

    named = _scrape(tmp_path, "metrics-2026-11-28T14:05:00Z.prom", "a_gauge 4\n")
    summary = ingest(store, named, run="r")
    assert (summary["time_source"], summary["t_min"]) == ("file_name", "2026-11-28T14:05:00Z")

    plain = _scrape(tmp_path, "metrics_poisson_000.prom", "a_gauge 3\n", mtime=1795937000.0)  # `_000` is not a time
    summary = ingest(store, plain, run="r")
    assert (summary["time_source"], summary["t_min"]) == ("mtime", "2026-11-29T07:23:20Z")
    assert summary["time_source_text"] == "scrape time from the file's modification time"

    mixed = _scrape(tmp_path, "m-1795936979123.prom", "a 1 1795937000000\nb 2\n")  # 13 digits: milliseconds
    summary = ingest(store, mixed, run="r")
    assert summary["time_source"] == "exposition+file_name"
    assert store.execute(
        "SELECT name, epoch_ms(ts) FROM metric_samples WHERE source_id = ? ORDER BY name", [summary["source_id"]]
    ).fetchall() == [("a", 1795937000000), ("b", 1795936979123)]
    assert store.execute("SELECT time_source FROM sources WHERE source_id = ?", [summary["source_id"]]).fetchone() == (
        "exposition+file_name",
    )


@pytest.mark.parametrize(
    "name, expected",
    [
        ("vllm-1795936979.prom", 1795936979.0),
        ("scrape_1795936979123.prom", 1795936979.123),
        ("metrics-2026-11-28T14:05:00Z.prom", datetime.fromisoformat("2026-11-28T14:05:00+00:00").timestamp()),
        ("metrics-2026-11-28T14-05-00Z.prom", datetime.fromisoformat("2026-11-28T14:05:00+00:00").timestamp()),
        ("metrics-2026-11-28T16:05:00+02:00.prom", datetime.fromisoformat("2026-11-28T14:05:00+00:00").timestamp()),
        ("metrics-20261128T140500Z.prom", datetime.fromisoformat("2026-11-28T14:05:00+00:00").timestamp()),
        ("metrics_burst50_000.prom", None),
        ("metrics_12345678901234.prom", None),  # 14 digits: not a Unix time
        ("metrics.prom", None),
    ],
)
def test_time_from_file_name(name, expected):
    assert time_from_file_name(name) == expected


def test_index_run_names_the_run_and_run_option_overrides(store, shared_data):
    folder = shared_data / "real-engine" / "vllm-cpu"
    assert metrics_run_for(folder / "metrics_poisson_004.prom") == "poisson"
    summary = ingest(store, folder / "metrics_poisson_004.prom", run="before")
    assert summary["run"] == "before" and summary["time_source"] == "index"
    assert store.execute("SELECT DISTINCT run FROM metric_samples").fetchall() == [("before",)]


# ---------------------------------------------------------------------------------------------------------------
# Prometheus HTTP API JSON


def test_query_range_matrix_matches_the_scrapes_it_came_from(store, shared_data):
    summary = ingest(store, FIXTURES / "query_range_vllm_burst50.json", run="prom")
    assert summary["format"] == API_FORMAT and summary["time_source"] == "query_result"
    assert summary["series_skipped"] == 1  # the _created companion
    assert summary["bad_lines"] == 0
    assert summary["rows"] == 7 * 5 + 3
    assert summary["t_min"] == "2026-11-29T07:29:44Z" and summary["t_max"] == "2026-11-29T07:29:48Z"
    prompt = store.execute(
        "SELECT epoch(ts)::BIGINT, value, type, series, labels FROM metric_samples WHERE name = 'vllm:prompt_tokens' ORDER BY ts"
    ).fetchall()
    assert [p[:2] for p in prompt] == [(1795937384, 0.0), (1795937385, 1995.0), (1795937386, 2475.0), (1795937387, 3145.0), (1795937388, 4309.0)]
    assert prompt[0][2:] == ("counter", "value", {"engine": "0", "instance": "localhost:8000", "job": "vllm", "model_name": "tiny"})
    # each step's value equals the latest real scrape before it
    ingest(store, shared_data / "real-engine" / "vllm-cpu" / "metrics_burst50_004.prom", run="scrape")
    assert store.execute(
        "SELECT value FROM metric_samples WHERE run = 'scrape' AND name = 'vllm:prompt_tokens'"
    ).fetchone() == (4309.0,)
    hist = store.execute(
        "SELECT type, series, le, value FROM metric_samples WHERE run = 'prom' AND name = 'vllm:time_to_first_token_seconds' "
        "AND epoch(ts) = 1795937388 ORDER BY series, le"
    ).fetchall()
    scrape = store.execute(
        "SELECT type, series, le, value FROM metric_samples WHERE run = 'scrape' AND name = 'vllm:time_to_first_token_seconds' "
        "AND (le IS NULL OR le IN (0.1, 5.0, 'inf'::DOUBLE)) ORDER BY series, le"
    ).fetchall()
    assert hist == scrape and [h[2] for h in hist if h[1] == "bucket"] == [0.1, 5.0, math.inf]
    old = store.execute(
        "SELECT name, name_raw, type, value FROM metric_samples WHERE name_raw = 'vllm:gpu_cache_usage_perc' ORDER BY ts"
    ).fetchall()
    assert [o[:3] for o in old] == [("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "gauge")] * 3
    assert old[0][3] == 0.25 and math.isnan(old[1][3]) and old[2][3] == 0.5


def test_instant_query_vector_and_unreadable_series(store, tmp_path):
    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "vllm:num_requests_running", "model_name": "m"}, "value": [1795937384.781, "3"]},
                {"metric": {"model_name": "m"}, "value": [1795937384.781, "0.5"]},  # rate(...): no __name__
                {"metric": {"__name__": "up"}, "value": [1795937384.781, "+Inf"]},
                {"metric": {"__name__": "broken"}, "value": [1795937384.781, "abc"]},
            ],
        },
        "warnings": ["PromQL info: metric might not be a counter"],
    }
    path = tmp_path / "instant.json"
    path.write_text(json.dumps(doc))
    summary = ingest(store, path, run="q")
    assert summary["rows"] == 2 and summary["bad_lines"] == 2 and summary["series_skipped"] == 1
    assert store.execute("SELECT name, value, epoch_ms(ts) FROM metric_samples ORDER BY name").fetchall() == [
        ("up", math.inf, 1795937384781),
        ("vllm:num_requests_running", 3.0, 1795937384781),
    ]
    assert [r[0] for r in store.execute("SELECT reason FROM ingest_errors ORDER BY reason").fetchall()] == [
        "series 2 has no __name__ (a computed expression); only raw series are read",
        "series 4 (broken) has 1 point(s) that are not [time, number], e.g. 'abc'",
    ]
    # types where the API gives none: a known engine gauge; an unknown bare name stays untyped
    assert store.execute("SELECT name, type FROM metric_samples ORDER BY name").fetchall() == [
        ("up", "untyped"), ("vllm:num_requests_running", "gauge")
    ]


def test_api_error_answer_is_an_input_error_and_leaves_the_store_as_it_was(store, tmp_path):
    path = tmp_path / "err.json"
    path.write_text(json.dumps({"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\"", "data": {"resultType": "matrix"}}))
    with pytest.raises(InputError) as caught:
        ingest(store, path, run="q", fmt=API_FORMAT)
    assert str(caught.value) == (
        f"{path} is a Prometheus API error answer (bad_data: invalid parameter \"query\"). Re-run the query and save a success."
    )
    assert store.execute("SELECT count(*) FROM sources").fetchone() == (0,)
    scalar = tmp_path / "scalar.json"
    scalar.write_text(json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1795937384, "1"]}}))
    with pytest.raises(InputError, match="holds a Prometheus 'scalar' result, not series"):
        ingest(store, scalar, run="q", fmt=API_FORMAT)


# ---------------------------------------------------------------------------------------------------------------
# bad lines, skip and replace


def test_malformed_lines_go_to_ingest_errors_with_line_numbers(store, tmp_path):
    path = _scrape(
        tmp_path,
        "bad-1795936979.prom",
        '# TYPE a gauge\na 1\na{x="unterminated} 2\nb 3 4 5\nc sk-abcdefghijklmnop\nd 4\n',
    )
    summary = ingest(store, path, run="r")
    assert (summary["rows"], summary["bad_lines"]) == (2, 3)
    assert store.execute("SELECT line, byte_length, reason, excerpt FROM ingest_errors ORDER BY line").fetchall() == [
        (3, 20, "unterminated quoted string", None),
        (4, 7, "sample b has 3 fields after the labels (value and optional timestamp expected)", None),
        (5, 21, "value of c is not a number: 'sk-[REDACTED]'", None),
    ]
    store.execute("DELETE FROM sources")
    store.execute("DELETE FROM ingest_errors")
    store.execute("DELETE FROM metric_samples")
    ingest(store, path, run="r", keep_text=True)
    assert store.execute("SELECT excerpt FROM ingest_errors WHERE line = 5").fetchone() == ("c sk-[REDACTED]",)


def test_same_file_is_skipped_and_a_changed_file_replaces_its_rows(store, tmp_path):
    path = _scrape(tmp_path, "vllm-1795936979.prom", "a 1\nb 2\n")
    first = ingest(store, path, run="r")
    again = ingest(store, path, run="r")
    assert again["action"] == "skip" and again["rows"] == 0 and again["source_id"] == first["source_id"]
    assert store.execute("SELECT count(*) FROM metric_samples").fetchone() == (2,)
    path.write_text("a 5\n")
    replaced = ingest(store, path, run="r")
    assert replaced["action"] == "replace"
    assert store.execute("SELECT name, value FROM metric_samples").fetchall() == [("a", 5.0)]
    assert store.execute("SELECT count(*) FROM sources").fetchone() == (1,)


def test_a_scrape_index_is_not_a_source(store, shared_data):
    with pytest.raises(InputError, match="is a scrape index"):
        ingest(store, shared_data / "real-engine" / "vllm-cpu" / "metrics_index.jsonl", run="r")


def test_identical_bytes_are_a_duplicate_only_when_they_give_identical_samples(store, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    idle = "llamacpp:prompt_tokens_total 0\n"
    first = ingest(store, _scrape(tmp_path / "a", "s-1795936979.prom", idle), run="r")
    later = ingest(store, _scrape(tmp_path / "a", "s-1795937079.prom", idle), run="r")  # same bytes, 100 s later
    assert (first["action"], later["action"]) == ("new", "new")
    copy = ingest(store, _scrape(tmp_path / "b", "s-1795936979.prom", idle), run="r")  # a copy: same bytes, same time
    assert copy["action"] == "skip" and copy["source_id"] == first["source_id"]
    stamped = "a 1 1795937000000\n"
    ingest(store, _scrape(tmp_path / "a", "t-1.prom", stamped), run="r")
    assert ingest(store, _scrape(tmp_path / "b", "t-2.prom", stamped), run="r")["action"] == "skip"
    assert store.execute("SELECT count(*), count(DISTINCT ts) FROM metric_samples").fetchone() == (3, 3)
    assert decide_metrics_source(store, "r", tmp_path / "b" / "s-1795936979.prom").action == "skip"


@pytest.mark.parametrize(
    "folder, prom, finished_length",
    [
        ("random", "vllm-1795940098.prom", 80.0),  # ignore_eos forced by the random dataset: every request hits the cap
        ("prefix_repetition", "vllm-1795940138.prom", 116.0),  # 80 + 36 of these 80 (no ignore_eos)
        ("random_burstiness0.5", "vllm-1795940172.prom", 196.0),
        ("random_burstiness0.5_seed1", "vllm-1795940218.prom", 276.0),
    ],
)
def test_every_vllm_bench_scrape(store, shared_data, folder, prom, finished_length):
    path = shared_data / "real-engine" / "vllm-bench" / folder / prom
    summary = ingest(store, path, run=folder)
    stamp = int(prom.split("-")[1].split(".")[0])
    assert summary["time_source"] == "file_name"
    assert summary["t_min"] == datetime.utcfromtimestamp(stamp).isoformat() + "Z"
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    created = sum(line.split("{")[0].split(" ")[0].endswith("_created") for line in lines)
    assert (summary["rows"], summary["bad_lines"], summary["created_dropped"]) == (len(lines) - created, 0, created)
    # the same server served the four runs one after another: its counter keeps growing across the files
    assert store.execute(
        "SELECT sum(value) FROM metric_samples WHERE name = 'vllm:request_success' AND labels['finished_reason'] = 'length'"
    ).fetchone() == (finished_length,)


def test_compressed_scrapes(store, shared_data, tmp_path):
    import zstandard

    raw = (shared_data / "real-engine" / "vllm-cpu" / "metrics_burst50_006.prom").read_bytes()
    gz = tmp_path / "vllm-1795937389.prom.gz"
    gz.write_bytes(gzip.compress(raw))
    zst = tmp_path / "vllm-1795937390.prom.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert sniff_metrics(zst) == TEXT_FORMAT
    first, second = ingest(store, gz, run="z"), ingest(store, zst, run="z")
    assert (first["rows"], second["rows"]) == (403, 403)
    assert (first["time_source"], second["t_min"]) == ("file_name", "2026-11-29T07:29:50Z")


def test_at_option_values(store, tmp_path):
    from servlens.ingest.metrics import parse_at

    assert parse_at("2026-11-28T14:05:00Z") == parse_at("2026-11-28 14:05:00") == 1795874700.0  # naive = UTC
    assert parse_at("2026-11-28T16:05:00+02:00") == 1795874700.0
    assert parse_at("1795874700") == parse_at("1795874700000") == parse_at(1795874700.0) == 1795874700.0
    with pytest.raises(InputError) as caught:
        ingest(store, _scrape(tmp_path, "x.prom"), run="r", at="yesterday")
    assert str(caught.value) == (
        "--at 'yesterday' is not a time. Give an ISO-8601 time such as 2026-11-28T14:05:00Z, or Unix seconds."
    )
    assert store.execute("SELECT count(*) FROM sources").fetchone() == (0,)


def test_sniff_a_scrape_that_starts_with_many_empty_families(tmp_path):
    # prometheus_client writes HELP/TYPE for a labelled family with no children yet (a fresh vLLM server)
    head = "".join(f"# HELP vllm:f{i} Help.\n# TYPE vllm:f{i} histogram\n" for i in range(40))
    path = tmp_path / "fresh.prom"
    path.write_text(head + 'vllm:num_requests_running{engine="0"} 0.0\n')
    assert sniff_metrics(path) == TEXT_FORMAT
    path.write_text("# just a comment\n# another\n")
    assert sniff_metrics(path) is None
    path.write_text("# TYPE a gauge\nthis is not a sample\nnor this\n")
    assert sniff_metrics(path) is None
