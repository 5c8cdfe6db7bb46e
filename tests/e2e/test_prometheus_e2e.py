"""`--prometheus URL` against a real Prometheus (Debian's `prometheus` package) and a real VictoriaMetrics
(Debian's `victoria-metrics`) that both scraped a real llama.cpp server (tools/engine) during the burst
scenario, beside the harness's own scrape files of the same run.

What must hold follows from the run itself: the SL004 state comes from what the engine's scrapes and timings
show (records.engine_queueing); analyze with --prometheus gives the same state and severity for every rule as
analyze with the scrape files, the same request-derived SL004 evidence, and the waiting gauge's maximum as
Prometheus recorded it; what `servlens ingest --prometheus --db` stores is Prometheus' raw samples one for
one, and re-analysing the store without the server gives the same findings.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import pytest
import requests

from .records import engine_queueing, servlens

NEEDS_ENGINE = True

from tools.engine.prometheus import server_binary  # noqa: E402 - conftest put the checkout on sys.path

KINDS = [
    pytest.param(
        kind,
        marks=pytest.mark.skipif(
            server_binary(kind) is None,
            reason=(f"no {kind} binary: apt-get install {kind} (.ci/run installs both)"),
        ),
    )
    for kind in ("prometheus", "victoria-metrics")
]

# Evidence of SL004 read from engine gauges: sampled at other instants by Prometheus than by the harness's
# scraper.
GAUGE_EVIDENCE = ("waiting_max", "running_max", "kv_cache_usage_max", "preemptions")


@pytest.fixture(scope="module")
def burst_run(tmp_path_factory):
    """The burst run with every installed metric server scraping the engine each second: (servers by kind, run
    folder, the same folder without the harness's scrapes)."""
    from tools.engine.prometheus import run_scraped

    kinds = tuple(k for k in ("prometheus", "victoria-metrics") if server_binary(k))
    if not kinds:
        pytest.skip("no prometheus binary: apt-get install prometheus (.ci/run does)")
    out = tmp_path_factory.mktemp("prom-engine")
    servers, _ = run_scraped(
        "burst",
        out,
        out / "servers",
        interval_s=1.0,
        kinds=kinds,
        log=lambda msg: print(msg, file=sys.stderr),
    )
    try:
        run_dir = out / "burst"
        logs = out / "logs-only"  # metrics come from the server only
        logs.mkdir()
        for path in run_dir.iterdir():
            if not path.name.startswith("metrics_"):
                shutil.copy(path, logs / path.name)
        yield servers, run_dir, logs
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(params=KINDS)
def scraped(request, burst_run):
    servers, run_dir, logs = burst_run
    return servers[request.param], run_dir, logs


def _analyze(tmp_path, *args) -> dict:
    out = tmp_path / f"analyze-{time.monotonic_ns()}.json"
    done = servlens("analyze", *args, "--format", "json", "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return {f["rule"]: f for f in json.loads(out.read_text())["findings"]}


def _raw(prom, query: str, end: float, span_s: int = 900) -> list[dict]:
    """The server's raw samples (a range selector evaluated once: every scrape with its own time).
    VictoriaMetrics returns the staleness marker written when the engine stopped as a last "NaN"; it is no
    sample."""
    answer = requests.post(
        prom.url + "/api/v1/query", data={"query": f"{query}[{span_s}s]", "time": end}, timeout=30
    ).json()
    assert answer["status"] == "success", answer
    for series in answer["data"]["result"]:
        while series["values"] and series["values"][-1][1] == "NaN":
            series["values"].pop()
    return answer["data"]["result"]


def test_analyze_with_prometheus_gives_the_findings_of_the_scrape_files(scraped, tmp_path):
    prom, run_dir, logs = scraped
    with_files = _analyze(tmp_path, run_dir)
    with_prometheus = _analyze(tmp_path, logs, "--prometheus", prom.url)
    assert {r: (f["state"], f["severity"]) for r, f in with_prometheus.items()} == {
        r: (f["state"], f["severity"]) for r, f in with_files.items()
    }
    seen = engine_queueing(run_dir.parent, "burst")
    assert seen == "queued", "the burst scenario did not make the engine queue: the scenario is broken"
    assert with_prometheus["SL004"]["state"] == "fired"
    files_metrics = with_files["SL004"]["evidence"]["metrics"]
    prom_metrics = with_prometheus["SL004"]["evidence"]["metrics"]
    assert {k: v for k, v in prom_metrics.items() if k not in GAUGE_EVIDENCE} == {
        k: v for k, v in files_metrics.items() if k not in GAUGE_EVIDENCE
    }
    # the waiting gauge as each source sampled it: the harness's scrape files, and Prometheus' own scrapes
    file_max = max(
        float(line.split()[-1])
        for path in run_dir.glob("metrics_*.prom")
        for line in path.read_text().splitlines()
        if line.startswith("llamacpp:requests_deferred")
    )
    assert files_metrics["waiting_max"] == file_max
    (deferred,) = _raw(prom, "llamacpp:requests_deferred", time.time())
    prom_max = max(float(v) for _, v in deferred["values"])
    assert prom_max >= 2, "Prometheus did not see the queue the harness's scrapes saw"
    assert prom_metrics["waiting_max"] == prom_max
    assert "llamacpp:requests_deferred" in with_prometheus["SL004"]["summary"]


def test_ingest_keeps_prometheus_raw_samples_for_offline_reanalysis(scraped, tmp_path):
    prom, run_dir, logs = scraped
    db = tmp_path / "incident.duckdb"
    done = servlens("ingest", logs, "--prometheus", prom.url, "--db", db, "--format", "json")
    assert done.returncode == 0, done.stderr
    (pulled,) = [s for s in json.loads(done.stdout)["sources"] if s["format"] == "prometheus-api"]
    info = pulled["prometheus"]
    # Prometheus lists each target's interval; VictoriaMetrics 1.79's targets do not, its config does
    assert (info["step_s"], info["interval_from"]) == (
        1.0,
        "targets" if prom.kind == "prometheus" else "config",
    )
    print(
        f"{prom.kind}: pulled for run burst: {info['series']} series, {info['points']} points, "
        f"{info['bytes']} bytes, "
        f"{info['http_requests']} requests, {info['seconds']} s",
        file=sys.stderr,
    )

    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute(
        """SELECT name_raw, labels['instance'], epoch(ts), value FROM metric_samples
                            WHERE source_id = ? ORDER BY name_raw, ts""",
        [pulled["source_id"]],
    ).fetchall()
    con.close()
    # every raw sample once, in order, read at most one interval after its scrape
    query = pulled["path"].split("?query=", 1)[1].split("&start=", 1)[0]  # the selector servlens sent
    raw = {
        (s["metric"]["__name__"], s["metric"]["instance"]): s["values"]
        for s in _raw(prom, query, time.time())
    }
    by_series: dict = {}
    for name, instance, ts, value in stored:
        by_series.setdefault((name, instance), []).append((ts, value))
    assert set(by_series) == set(raw) and len(raw) == info["series"] == 5
    for key, points in by_series.items():
        scraped_values = [(float(t), float(v)) for t, v in raw[key]]
        assert [v for _, v in points] == [v for _, v in scraped_values], key
        assert all(0 <= ts - t < 1.0 for (ts, _), (t, _) in zip(points, scraped_values)), key
    # the counters' last value is the harness's last scrape: both were taken after the load ended
    last_file = sorted(run_dir.glob("metrics_burst_*.prom"))[-1].read_text()
    final = float(
        next(
            line.split()[-1]
            for line in last_file.splitlines()
            if line.startswith("llamacpp:prompt_tokens_total")
        )
    )
    assert by_series[("llamacpp:prompt_tokens_total", prom.targets[0])][-1][1] == final

    # pulling the same window again adds nothing: the grid comes from a stored scrape, so the answer is the
    # same
    again = servlens("ingest", logs, "--prometheus", prom.url, "--db", db)
    assert again.returncode == 0 and "1 already ingested (nothing added)" in again.stdout, again.stdout
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM sources WHERE format = 'prometheus-api'").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM metric_samples").fetchone()[0] == len(stored)
    con.close()
    offline = _analyze(tmp_path, "--db", db)
    online = _analyze(tmp_path, logs, "--prometheus", prom.url)
    assert {r: (f["state"], f["severity"], f.get("summary")) for r, f in offline.items()} == {
        r: (f["state"], f["severity"], f.get("summary")) for r, f in online.items()
    }
