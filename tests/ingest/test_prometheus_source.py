"""`--prometheus URL` against a tiny local HTTP server that answers like Prometheus 2.42 (the envelope, error
bodies and limits of web/api/v1/api.go; targets/config/range answers recorded from Debian's prometheus 2.42.0
scraping the tools/engine llama.cpp server, in data/prometheus_api/). What is asserted: the requests servlens
sends (series, step, window, auth), what lands in the store (the same rows as the saved answer read as a
file), and the one-sentence failures (exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servlens.errors import InputError
from servlens.ingest.api import ingest_inputs
from servlens.ingest.prometheus_source import (
    MAX_POINTS,
    PrometheusClient,
    PrometheusError,
    chunks,
    open_session,
    parse_duration,
    prometheus_pull,
    scrape_interval,
    step_grid,
    wanted_metrics,
)
from servlens.store.schema import open_store

DATA = Path(__file__).resolve().parent / "data" / "prometheus_api"
REAL_LOG = (
    Path(__file__).resolve().parents[1] / "data" / "shared" / "real-engine" / "llamacpp" / "requests.jsonl"
)
RESOLUTION_ERROR = (
    "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
    "resolution (?step=XX)"
)  # Prometheus' own text (api.go), as the real server sent it


def _json(name: str) -> dict:
    return json.loads((DATA / name).read_text())


class FakePrometheus:
    """Routes by path; each route takes the request's params and returns (status, body, content type)."""

    def __init__(self):
        self.routes: dict = {}
        self.seen: list[dict] = []
        self.max_points = MAX_POINTS
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self, params: dict):
                path = urllib.parse.urlsplit(self.path).path
                fake.seen.append({"path": path, "params": params, "headers": dict(self.headers)})
                route = fake.routes.get(path)
                status, body, ctype = route(params) if route else (404, b"404 page not found\n", "text/plain")
                if isinstance(body, (dict, list)):
                    body = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout test): nothing to answer

            def do_GET(self):
                query = urllib.parse.urlsplit(self.path).query
                self._serve({k: v[-1] for k, v in urllib.parse.parse_qs(query).items()})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = self.rfile.read(length).decode()
                self._serve({k: v[-1] for k, v in urllib.parse.parse_qs(form).items()})

        return Handler

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def range_queries(self) -> list[dict]:
        return [s["params"] for s in self.seen if s["path"] == "/api/v1/query_range"]


def ok(data, warnings=None):
    body = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = warnings
    return 200, body, "application/json"


def error(status, kind, text):
    return status, {"status": "error", "errorType": kind, "error": text}, "application/json"


def series_route(values_of, fake: FakePrometheus, metric=None):
    """A query_range route over a synthetic gauge: values_of(t) gives the string value at step time t."""
    metric = metric or {
        "__name__": "llamacpp:requests_deferred",
        "instance": "127.0.0.1:8080",
        "job": "llamacpp",
    }

    def route(params):
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        n = math.floor((end - start) / step) + 1
        if n > fake.max_points:
            text = RESOLUTION_ERROR.replace("11,000", f"{fake.max_points:,}")
            return error(400, "bad_data", text)
        values = [[round(start + i * step, 3), values_of(start + i * step)] for i in range(n)]
        return ok({"resultType": "matrix", "result": [{"metric": metric, "values": values}]})

    return route


@pytest.fixture
def fake():
    server = FakePrometheus()
    server.routes["/api/v1/targets"] = lambda p: (
        200,
        (DATA / "targets.json").read_bytes(),
        "application/json",
    )
    yield server
    server.close()


def servlens(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "servlens", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


WINDOW = ("2026-12-01T22:54:20Z", "2026-12-01T22:54:40Z")


# ------------------------------------------------------------------------------------------------------------
# what is asked for


def test_a_rule_on_one_engine_pulls_the_same_role_of_every_engine_and_the_workload_gauges():
    wanted = wanted_metrics(["vllm:num_requests_waiting"])
    assert {
        "vllm:num_requests_waiting",
        "llamacpp:requests_deferred",
        "sglang:num_queue_reqs",
        "tgi_queue_size",
    } <= wanted
    assert {"vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs"} <= wanted
    assert "vllm:kv_cache_usage_perc" not in wanted  # no rule named the KV role
    kv = wanted_metrics(["sglang:token_usage"])
    assert {"vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"} <= kv
    # deprecated exposed names are asked for too (vLLM <= 0.10 exposes only the old one) and normalised on
    # ingest
    query = prometheus_pull("http://p:9090", required=["vllm:kv_cache_usage_perc"]).query()
    assert "vllm:gpu_cache_usage_perc" in query and "vllm:kv_cache_usage_perc" in query
    assert query.endswith('(?:_total|_bucket|_sum|_count)?"}')


def test_the_selector_narrows_the_query_and_bad_selectors_are_refused():
    pull = prometheus_pull(
        "http://p:9090",
        required=["llamacpp:requests_deferred"],
        selector='{job="llm", namespace=~"prod|canary"}',
    )
    assert pull.query().endswith(',job="llm", namespace=~"prod|canary"}')
    with pytest.raises(InputError, match="is not a label selector"):
        prometheus_pull("http://p:9090", selector='job="llm"')
    with pytest.raises(InputError, match="may not match __name__"):
        prometheus_pull("http://p:9090", selector='{__name__="up"}')
    with pytest.raises(InputError, match="is not an http"):
        prometheus_pull("prometheus:9090")
    with pytest.raises(InputError, match="go together"):
        prometheus_pull("http://p:9090", start="2026-12-01T00:00:00Z")


def test_durations_and_step_grid():
    assert parse_duration("1s") == 1 and parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    assert parse_duration("15") is None and parse_duration("") is None
    # half a step after the scrape phase: scrapes at .970 s are read at .470 s
    assert step_grid(100.0, 110.0, 1.0, phase=1796165745.970) == (100.47, 109.47)
    assert step_grid(100.0, 110.0, 15.0, phase=None) == (105.0, 105.0)
    assert step_grid(100.2, 100.3, 1.0, phase=None) is None


def test_interval_from_the_targets_then_the_config_then_15_s_with_a_note(fake):
    pull = prometheus_pull(fake.url)
    interval = scrape_interval(PrometheusClient(pull))
    assert (interval.seconds, interval.source, interval.note) == (1.0, "targets", None)
    # lastScrape, nanoseconds kept to µs
    assert interval.phase == pytest.approx(1796165745.970474683, abs=1e-6)
    del fake.routes["/api/v1/targets"]
    fake.routes["/api/v1/status/config"] = lambda p: (
        200,
        (DATA / "config.json").read_bytes(),
        "application/json",
    )
    interval = scrape_interval(PrometheusClient(pull))
    assert (interval.seconds, interval.source, interval.phase) == (1.0, "config", None)
    del fake.routes["/api/v1/status/config"]
    interval = scrape_interval(PrometheusClient(pull))
    assert (interval.seconds, interval.source) == (15.0, "default")
    assert interval.note.startswith("the server did not say its scrape interval")


def test_a_selector_picks_the_targets_whose_interval_counts(fake):
    targets = {
        "activeTargets": [
            {
                "labels": {"job": "node", "instance": "a"},
                "scrapeInterval": "5s",
                "lastScrape": "2026-12-01T22:55:45.1Z",
            },
            {
                "labels": {"job": "llm", "instance": "b"},
                "scrapeInterval": "30s",
                "lastScrape": "2026-12-01T22:55:45.2Z",
            },
        ]
    }
    fake.routes["/api/v1/targets"] = lambda p: ok(targets)
    assert scrape_interval(PrometheusClient(prometheus_pull(fake.url, selector='{job="llm"}'))).seconds == 30
    assert scrape_interval(PrometheusClient(prometheus_pull(fake.url))).seconds == 5


# ------------------------------------------------------------------------------------------------------------
# what is stored


def _rows(con, where="TRUE"):
    return con.execute(
        f"SELECT name, name_raw, type, series, le, labels, ts, value FROM metric_samples WHERE {where} "
        "ORDER BY name_raw, ts"
    ).fetchall()


def test_stored_exactly_as_the_saved_answer_read_as_a_file(fake, tmp_path):
    recorded = _json("range.json")
    fake.routes["/api/v1/query_range"] = lambda p: ok(recorded["data"])
    con = open_store(":memory:")
    pull = prometheus_pull(fake.url, required=["llamacpp:requests_deferred"], start=WINDOW[0], end=WINDOW[1])
    report = ingest_inputs(con, [], run="burst", prometheus=pull)
    pulled = _rows(con)
    saved = tmp_path / "answer.json"
    saved.write_text(json.dumps(recorded))
    other = open_store(":memory:")
    ingest_inputs(other, [], run="burst", metrics_inputs=[str(saved)])
    assert pulled == _rows(other) and len(pulled) == 22
    assert {(r[0], r[1], r[2]) for r in pulled} == {
        ("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_total", "counter"),
        ("llamacpp:requests_deferred", "llamacpp:requests_deferred", "gauge"),
    }
    source = report.sources[0]
    assert source["format"] == "prometheus-api" and source["rows"] == 22 and source["action"] == "new"
    assert source["path"].startswith(f"{fake.url}/api/v1/query_range?query={{__name__=~")
    assert source["path"].endswith("&start=2026-12-01T22:54:20.000Z&end=2026-12-01T22:54:40.000Z&step=1s")
    assert source["prometheus"]["series"] == 2 and source["prometheus"]["points"] == 22
    path, fmt, time_source = con.execute("SELECT path, format, time_source FROM sources").fetchone()
    assert (path, fmt, time_source) == (source["path"], "prometheus-api", "query_result")
    # the query sent: one POST at the targets' 1 s step, half a second after the scrape phase (.970 s)
    (sent,) = fake.range_queries()
    assert sent["step"] == "1" and sent["start"] == "1796165660.470" and sent["end"] == "1796165679.470"
    assert "llamacpp:requests_deferred" in sent["query"]


def test_pulling_the_same_window_again_adds_nothing_and_changed_data_replaces_it(fake):
    value = {"v": "3"}
    fake.routes["/api/v1/query_range"] = series_route(lambda t: value["v"], fake)
    con = open_store(":memory:")
    pull = prometheus_pull(fake.url, start=WINDOW[0], end=WINDOW[1])
    first = ingest_inputs(con, [], run="r", prometheus=pull).sources[0]
    again = ingest_inputs(con, [], run="r", prometheus=pull).sources[0]
    assert (first["action"], again["action"], again["skipped"]) == ("new", "skip", True)
    assert con.execute("SELECT count(*), count(DISTINCT source_id) FROM metric_samples").fetchone() == (20, 1)
    value["v"] = "4"
    changed = ingest_inputs(con, [], run="r", prometheus=pull).sources[0]
    assert changed["action"] == "replace"
    assert con.execute(
        "SELECT count(*), min(value), (SELECT count(*) FROM sources) FROM metric_samples"
    ).fetchone() == (20, 4.0, 1)


def test_nan_and_infinities_as_strings_are_values(fake):
    cycle = ["NaN", "+Inf", "-Inf", "1.5e3"]
    fake.routes["/api/v1/query_range"] = series_route(lambda t: cycle[int(round(t - 0.47)) % 4], fake)
    con = open_store(":memory:")
    ingest_inputs(con, [], run="r", prometheus=prometheus_pull(fake.url, start=WINDOW[0], end=WINDOW[1]))
    values = [v for (v,) in con.execute("SELECT value FROM metric_samples ORDER BY ts").fetchall()]
    assert len(values) == 20 and con.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    assert sum(math.isnan(v) for v in values) == 5
    assert values.count(math.inf) == 5 and values.count(-math.inf) == 5 and values.count(1500.0) == 5


def test_a_counter_that_drops_is_a_reset_as_in_a_scrape(fake):
    metric = {"__name__": "llamacpp:prompt_tokens_total", "instance": "i", "job": "j"}
    fake.routes["/api/v1/query_range"] = series_route(
        lambda t: "50" if t > 1796165670 else "900", fake, metric
    )
    con = open_store(":memory:")
    ingest_inputs(con, [], run="r", prometheus=prometheus_pull(fake.url, start=WINDOW[0], end=WINDOW[1]))
    resets = con.execute("SELECT name, value_before, value_after FROM metric_counter_resets").fetchall()
    assert resets == [("llamacpp:prompt_tokens", 900.0, 50.0)]


def test_a_range_over_11000_points_is_split_into_ranges_that_share_no_point(fake):
    fake.routes["/api/v1/query_range"] = series_route(lambda t: "1", fake)
    assert chunks(0.0, 25_000.0, 1.0) == [(0.0, 10_999.0), (11_000.0, 21_999.0), (22_000.0, 25_000.0)]
    con = open_store(":memory:")
    pull = prometheus_pull(fake.url, start="2026-12-01T00:00:00Z", end="2026-12-01T07:00:00Z")
    source = ingest_inputs(con, [], run="r", prometheus=pull).sources[0]
    sent = fake.range_queries()
    counts = [math.floor((float(q["end"]) - float(q["start"])) / float(q["step"])) + 1 for q in sent]
    assert counts == [11_000, 11_000, 3_200] and source["prometheus"]["points"] == 25_200
    assert con.execute("SELECT count(*), count(DISTINCT ts) FROM metric_samples").fetchone() == (
        25_200,
        25_200,
    )


def test_the_progress_callback_counts_the_range_queries(fake):
    fake.routes["/api/v1/query_range"] = series_route(lambda t: "1", fake)
    session = open_session(prometheus_pull(fake.url))
    told: list[tuple[int, int]] = []
    pulled = session.fetch("r", (1796140800.0, 1796166000.0), on_chunk=lambda *seen: told.append(seen))
    assert told == [(0, 3), (1, 3), (2, 3)] and pulled.points == 25_200
    # two tries of timestamp(up) for the scrape phase (this server has no /api/v1/query), then the 3 ranges
    assert pulled.requests == 5


def test_a_server_with_a_lower_limit_is_split_again_under_it(fake):
    fake.max_points = 4_000
    fake.routes["/api/v1/query_range"] = series_route(lambda t: "1", fake)
    con = open_store(":memory:")
    pull = prometheus_pull(fake.url, start="2026-12-01T00:00:00Z", end="2026-12-01T03:00:00Z")
    ingest_inputs(con, [], run="r", prometheus=pull)
    assert con.execute("SELECT count(*), count(DISTINCT ts) FROM metric_samples").fetchone() == (
        10_800,
        10_800,
    )
    ok_counts = [math.floor((float(q["end"]) - float(q["start"])) / 1) + 1 for q in fake.range_queries()][1:]
    assert max(ok_counts) <= 4_000 and sum(ok_counts) == 10_800


def test_a_vector_answer_and_native_histograms_are_read_or_named(fake):
    fake.routes["/api/v1/query_range"] = lambda p: ok(
        {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"__name__": "llamacpp:requests_processing", "job": "j"},
                    "value": [1796165670.47, "2"],
                },
                {
                    "metric": {"__name__": "vllm:time_to_first_token_seconds", "job": "j"},
                    "histograms": [
                        [1796165670.47, {"count": "3", "sum": "1.5", "buckets": [[0, "0.1", "0.2", "3"]]}]
                    ],
                },
            ],
        }
    )
    con = open_store(":memory:")
    source = ingest_inputs(
        con, [], run="r", prometheus=prometheus_pull(fake.url, start=WINDOW[0], end=WINDOW[1])
    )
    assert con.execute("SELECT name, value FROM metric_samples").fetchall() == [
        ("llamacpp:requests_processing", 2.0)
    ]
    (reason,) = con.execute("SELECT reason FROM ingest_errors").fetchone()
    assert reason == "series 2 (vllm:time_to_first_token_seconds) holds native histograms, which are not read"
    assert source.sources[0]["bad_lines"] == 1


def test_warnings_are_kept_and_said(fake, tmp_path):
    fake.routes["/api/v1/query_range"] = lambda p: ok(
        {"resultType": "matrix", "result": []}, warnings=["PromQL info: metric might not be a counter"]
    )
    db = tmp_path / "s.duckdb"
    done = servlens(
        tmp_path,
        "ingest",
        "--prometheus",
        fake.url,
        "--prometheus-start",
        WINDOW[0],
        "--prometheus-end",
        WINDOW[1],
        "--run",
        "incident",
        "--db",
        str(db),
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    (source,) = json.loads(done.stdout)["sources"]
    assert source["prometheus"]["warnings"] == ["PromQL info: metric might not be a counter"]
    assert "Note (incident): the server warned: PromQL info: metric might not be a counter." in done.stderr
    assert "Note (incident): the server has none of the series servlens reads" in done.stderr


# ------------------------------------------------------------------------------------------------------------
# windows from the request logs


def test_the_window_is_each_runs_request_span_padded_by_two_minutes(fake):
    fake.routes["/api/v1/query_range"] = series_route(lambda t: "0", fake)
    con = open_store(":memory:")
    report = ingest_inputs(con, [str(REAL_LOG)], prometheus=prometheus_pull(fake.url))
    spans = dict(
        (
            (run, (t0.timestamp(), t1.timestamp()))
            for run, t0, t1 in con.execute(
                "SELECT run, min(t_arrival) AT TIME ZONE 'UTC', max(coalesce(t_end, t_arrival)) AT TIME "
                "ZONE 'UTC' "
                "FROM requests GROUP BY run"
            ).fetchall()
        )
    )
    pulled = {s["run"]: s for s in report.sources if s.get("format") == "prometheus-api"}
    assert (
        set(pulled)
        == set(spans)
        == {"burst50", "fresh_cache", "fresh_nocache", "poisson", "prefix_cache", "prefix_nocache"}
    )
    for query in fake.range_queries():
        assert float(query["end"]) - float(query["start"]) <= max(b - a for a, b in spans.values()) + 240
    for run, (t0, t1) in spans.items():
        info = pulled[run]["prometheus"]
        from datetime import datetime

        start = datetime.fromisoformat(info["start"].replace("Z", "+00:00")).timestamp()
        end = datetime.fromisoformat(info["end"].replace("Z", "+00:00")).timestamp()
        assert start == pytest.approx(t0 - 120, abs=0.01) and end == pytest.approx(t1 + 120, abs=0.01)


def test_no_window_and_no_logs_is_an_error(fake):
    con = open_store(":memory:")
    with pytest.raises(InputError, match="--prometheus needs a time window and no request log gives one"):
        ingest_inputs(con, [], prometheus=prometheus_pull(fake.url))


# ------------------------------------------------------------------------------------------------------------
# failures: one sentence, exit 2, nothing written


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_that_is_down_is_one_sentence_and_nothing_is_written(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    db = tmp_path / "s.duckdb"
    done = servlens(tmp_path, "ingest", str(REAL_LOG), "--prometheus", url, "--db", str(db))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"Error: Cannot read Prometheus at {url} after 4 tries: connection refused. "
        "Check the URL and that the server is up; nothing was written."
    )
    con = open_store(db, read_only=True)
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 0  # not even the request log
    analyzed = servlens(tmp_path, "analyze", str(REAL_LOG), "--prometheus", url)
    assert (
        analyzed.returncode == 2 and analyzed.stderr.count("\n") == 1 and "Traceback" not in analyzed.stderr
    )


def test_unauthorised_names_the_variables_and_never_echoes_the_token(fake, tmp_path):
    fake.routes["/api/v1/targets"] = lambda p: (401, b"Unauthorized\n", "text/plain; charset=utf-8")
    secret = "s3cr3t-t0ken-value"
    done = servlens(
        tmp_path,
        "ingest",
        "--prometheus",
        fake.url,
        "--prometheus-start",
        WINDOW[0],
        "--prometheus-end",
        WINDOW[1],
        "--db",
        str(tmp_path / "s.duckdb"),
        env={"SERVLENS_PROMETHEUS_TOKEN": secret},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"Error: Prometheus at {fake.url} refused the request (HTTP 401): the credentials given were "
        "refused. Set "
        "SERVLENS_PROMETHEUS_TOKEN (a bearer token) or SERVLENS_PROMETHEUS_USER and "
        "SERVLENS_PROMETHEUS_PASSWORD; "
        "nothing was written."
    )
    assert secret not in done.stderr + done.stdout
    assert fake.seen[0]["headers"]["Authorization"] == f"Bearer {secret}"


def test_basic_auth_from_the_environment_or_the_url_and_the_url_is_stored_without_it(fake):
    import base64

    fake.routes["/api/v1/query_range"] = series_route(lambda t: "1", fake)
    user_url = fake.url.replace("http://", "http://ops:pa%40ss@")
    pull = prometheus_pull(user_url, start=WINDOW[0], end=WINDOW[1], env={})
    assert "pa@ss" not in repr(pull) and "pa%40ss" not in repr(pull) and pull.url == fake.url
    con = open_store(":memory:")
    source = ingest_inputs(con, [], run="r", prometheus=pull).sources[0]
    assert fake.seen[-1]["headers"]["Authorization"] == "Basic " + base64.b64encode(b"ops:pa@ss").decode()
    assert "ops" not in source["path"] and source["path"].startswith(fake.url + "/api/v1/query_range?")
    env_pull = prometheus_pull(
        fake.url, env={"SERVLENS_PROMETHEUS_USER": "u", "SERVLENS_PROMETHEUS_PASSWORD": "p"}
    )
    assert env_pull.auth == "Basic " + base64.b64encode(b"u:p").decode()


def test_a_promql_error_is_one_sentence_and_nothing_is_written(fake, tmp_path):
    fake.routes["/api/v1/query_range"] = lambda p: error(
        422, "execution", "query processing would load too many samples into memory in query execution"
    )
    db = tmp_path / "s.duckdb"
    done = servlens(
        tmp_path,
        "ingest",
        "--prometheus",
        fake.url,
        "--prometheus-start",
        WINDOW[0],
        "--prometheus-end",
        WINDOW[1],
        "--db",
        str(db),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"Error: Prometheus at {fake.url} answered /api/v1/query_range with an error (execution: query "
        "processing "
        "would load too many samples into memory in query execution). Check --prometheus-selector; nothing "
        "was "
        "written."
    )
    assert open_store(db, read_only=True).execute("SELECT count(*) FROM sources").fetchone()[0] == 0


def test_one_run_failing_writes_no_run(fake):
    calls = []

    def flaky(params):
        calls.append(params)
        return (
            series_route(lambda t: "1", fake)(params) if len(calls) == 1 else error(400, "bad_data", "boom")
        )

    fake.routes["/api/v1/query_range"] = flaky
    con = open_store(":memory:")
    session = open_session(prometheus_pull(fake.url))
    windows = {"a": (1796165660.0, 1796165680.0), "b": (1796165700.0, 1796165720.0)}
    with pytest.raises(PrometheusError, match="bad_data: boom"):
        session.pull_into(con, windows)
    assert len(calls) == 2
    assert con.execute(
        "SELECT (SELECT count(*) FROM sources), (SELECT count(*) FROM metric_samples)"
    ).fetchone() == (0, 0)


def test_timeouts_and_503_are_retried_with_backoff_then_said(fake):
    answers = iter(["slow", "slow", "ok"])

    def slow_then_ok(params):
        if next(answers) == "slow":
            time.sleep(0.6)
        return ok({"resultType": "matrix", "result": []})

    fake.routes["/api/v1/query_range"] = slow_then_ok
    pauses: list[float] = []
    pull = prometheus_pull(fake.url)
    client = PrometheusClient(type(pull)(**{**pull.__dict__, "timeout_s": 0.3}), sleep=pauses.append)
    assert client.get("/api/v1/query_range", [("query", "up")], post=True) == {
        "resultType": "matrix",
        "result": [],
    }
    assert pauses == [0.5, 1.0] and client.requests == 3
    fake.routes["/api/v1/query_range"] = lambda p: error(
        503, "timeout", "query timed out in expression evaluation"
    )
    pauses.clear()
    with pytest.raises(PrometheusError) as caught:
        client.get("/api/v1/query_range", [("query", "up")], post=True)
    assert pauses == [0.5, 1.0, 2.0]
    assert str(caught.value) == (
        f"Prometheus at {fake.url} answered /api/v1/query_range with an error (timeout: "
        "query timed out in expression evaluation). Check --prometheus-selector; nothing "
        "was written."
    )


def test_a_url_that_is_not_a_prometheus_api_says_so(fake):
    fake.routes["/api/v1/targets"] = lambda p: (200, b"<html>Grafana</html>", "text/html")
    fake.routes["/api/v1/query_range"] = lambda p: (200, b"<html>Grafana</html>", "text/html")
    session = open_session(prometheus_pull(fake.url))
    assert session.interval.source == "default"
    with pytest.raises(
        PrometheusError, match=r"did not answer /api/v1/query_range as a Prometheus API \(HTTP 200"
    ):
        session.pull_into(open_store(":memory:"), {"r": (1796165660.0, 1796165680.0)})


def test_compare_pulls_each_sides_own_window(fake, tmp_path):
    fake.routes["/api/v1/query_range"] = series_route(lambda t: "0", fake)
    samples = Path(__file__).resolve().parents[2] / "sample_logs"
    before, after = samples / "steady-a" / "requests.jsonl", samples / "steady-b" / "requests.jsonl"
    done = servlens(
        tmp_path, "compare", str(before), str(after), "--prometheus", fake.url, "--format", "json"
    )
    assert done.returncode in (0, 1, 3), done.stderr
    spans = []
    for log in (before, after):
        con = open_store(":memory:")
        ingest_inputs(con, [str(log)], run="x")
        t0, t1 = con.execute(
            "SELECT epoch(min(t_arrival)), epoch(max(coalesce(t_end, t_arrival))) FROM requests "
            "WHERE run = 'x'"
        ).fetchone()
        spans.append((t0 - 120, t1 + 120))
    sent = fake.range_queries()
    assert len(sent) == 2
    for query, (start, end) in zip(sent, spans):
        assert start <= float(query["start"]) < start + 1 and end - 1 < float(query["end"]) <= end
    refused = servlens(
        tmp_path,
        "compare",
        "--db",
        str(tmp_path / "none.duckdb"),
        "--before",
        "a",
        "--after",
        "b",
        "--prometheus",
        fake.url,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "Error: --prometheus pulls metrics for BEFORE and AFTER files or folders, not "
        "for runs in a store. Keep them with 'servlens ingest --prometheus URL --db "
        "STORE' first, or give the files."
    )
