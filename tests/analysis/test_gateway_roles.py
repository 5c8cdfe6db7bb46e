"""The gateways' rows of the metric roles (servlens/store/metric_roles.toml): a real LiteLLM proxy scrape recorded
here and the exposition Envoy AI Gateway's admin-server test prints (tests/data/formats/metrics/ATTRIBUTION.md) are
ingested as any scrape is, and their series play the roles with the values the files hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from servlens.analysis.runner import Scope, prepare_scope
from servlens.ingest.api import ingest_inputs
from servlens.store import metric_roles
from servlens.store.schema import open_store

SCRAPES = Path(__file__).resolve().parents[1] / "data" / "formats" / "metrics"
LITELLM = SCRAPES / "litellm-proxy-metrics.prom"
ENVOY = SCRAPES / "envoy-ai-gateway-admin-test-metrics.prom"
AT = "2026-12-03T07:37:53Z"


def _scope(path: Path, run: str):
    con = open_store(None)
    report = ingest_inputs(con, [str(path)], run=run, at=AT).to_dict()
    (source,) = report["sources"]
    assert (source["kind"], source["format"], source["bad_lines"]) == ("metrics", "prometheus-text", 0)
    prepare_scope(con, Scope(run, None, None))
    return con, source


def _by(con, role: str, *keys: str, series: str = "value") -> dict:
    """role's samples of one series, keyed by the label values `keys`."""
    cols = ", ".join(f"labels['{k}']" for k in keys)
    rows = con.execute(f"SELECT {cols}, value FROM scope_role_samples WHERE role = ? AND series = ?",
                       [role, series]).fetchall()
    assert len({r[:-1] for r in rows}) == len(rows), f"{role}: {keys} do not tell its series apart"
    return {(r[0] if len(keys) == 1 else tuple(r[:-1])): r[-1] for r in rows}


def test_the_litellm_scrape_plays_the_deployment_cooldown_and_fallback_roles():
    con, source = _scope(LITELLM, "lite")
    assert source["rows"] == 500
    # stored under the suffix-free names the roles name (_total stripped, _created dropped)
    kinds = dict(con.execute("SELECT DISTINCT role, type FROM scope_role_samples WHERE engine = 'litellm'").fetchall())
    assert kinds == {"deployment_state": "gauge", "deployment_cooldowns": "counter", "fallbacks_ok": "counter",
                     "fallbacks_failed": "counter", "deployment_successes": "counter",
                     "deployment_failures": "counter", "failed_requests": "counter", "e2e_histogram": "histogram",
                     "ttft_histogram": "histogram", "gateway_queue_time_histogram": "histogram"}
    assert kinds == {r.role: r.kind for r in metric_roles.load_roles() if r.engine == "litellm"}
    # 0 healthy, 1 a failed call, 2 cooled down; the 404 deployment has both: its call's and its cooldown's series
    assert _by(con, "deployment_state", "model_id", "litellm_model_name") == {
        ("dep-live", "tiny"): 0.0, ("dep-backup-live", "tiny"): 0.0, ("dep-pool-live", "tiny"): 0.0,
        ("dep-chat-dead", "tiny"): 1.0, ("dep-lonely-dead", "tiny"): 1.0, ("dep-pool-404", "tiny"): 1.0,
        ("dep-pool-404", "pool"): 2.0}
    assert _by(con, "deployment_cooldowns", "model_id", "exception_status") == {("dep-pool-404", "404"): 1.0}
    assert _by(con, "fallbacks_ok", "requested_model", "fallback_model") == {("chat", "chat-backup"): 2.0}
    assert _by(con, "fallbacks_failed", "requested_model", "fallback_model") == {
        ("chat", "chat-backup"): 4.0, ("lonely", "lonely-backup"): 3.0}
    assert _by(con, "deployment_successes", "model_id") == {"dep-live": 6.0, "dep-backup-live": 2.0,
                                                             "dep-pool-live": 5.0}
    assert _by(con, "deployment_failures", "model_id", "exception_status") == {
        ("dep-chat-dead", "500"): 6.0, ("dep-lonely-dead", "500"): 3.0, ("dep-pool-404", "404"): 1.0}
    # the client requests that got no success: 4 + 3 + 1 of 21
    assert _by(con, "failed_requests", "requested_model", "exception_status") == {
        ("chat", "500"): 4.0, ("lonely", "500"): 3.0, ("pool", "404"): 1.0}


def test_the_litellm_scrape_plays_the_latency_roles_after_the_engines():
    con, _ = _scope(LITELLM, "lite")
    # the 13 successes, from arrival at the proxy; TTFT for the 6 streamed ones only
    assert _by(con, "e2e_histogram", "requested_model", series="count") == {
        "live": 6.0, "chat-backup": 2.0, "pool": 5.0}
    assert _by(con, "e2e_histogram", "requested_model", series="sum") == {
        "live": pytest.approx(2.6868790907745366), "chat-backup": pytest.approx(0.10740609761047362),
        "pool": pytest.approx(0.1568350882873535)}
    assert _by(con, "ttft_histogram", "requested_model", series="count") == {
        "live": 3.0, "chat-backup": 1.0, "pool": 2.0}
    assert _by(con, "ttft_histogram", "requested_model", series="sum") == {
        "live": pytest.approx(0.50812), "chat-backup": pytest.approx(0.007035), "pool": pytest.approx(0.012752)}
    assert _by(con, "gateway_queue_time_histogram", "requested_model", series="count") == {
        "live": 6.0, "chat-backup": 2.0, "pool": 5.0}
    live_buckets = con.execute("""SELECT le, value FROM scope_role_samples WHERE role = 'ttft_histogram'
                                  AND series = 'bucket' AND labels['requested_model'] = 'live' ORDER BY le""").fetchall()
    assert live_buckets[0] == (0.005, 0.0) and live_buckets[-1] == (float("inf"), 3.0) and len(live_buckets) == 18
    # an engine's own histogram comes first; the proxy's wait is not an engine queue (SL004 reads queue_time_histogram)
    assert metric_roles.names("ttft_histogram")[-2:] == ("litellm_llm_api_time_to_first_token_metric",
                                                         "gen_ai_server_time_to_first_token_seconds")
    assert metric_roles.names("e2e_histogram")[0] == "sglang:e2e_request_latency_seconds"
    assert "litellm_request_queue_time_seconds" not in metric_roles.names("queue_time_histogram")
    # left out: a streamed call's TTFT divided by its tokens is no time between tokens
    assert con.execute("SELECT count(*) FROM scope_role_samples WHERE name = 'litellm_deployment_latency_per_output_"
                       "token'").fetchone()[0] == 0


def test_the_envoy_ai_gateway_exposition_plays_the_latency_and_token_roles():
    con, source = _scope(ENVOY, "envoy")
    assert source["rows"] == 9
    assert _by(con, "e2e_histogram", "gen_ai_request_model", series="sum") == {"qwen2.5:0.5b": 10.808095311}
    assert _by(con, "e2e_histogram", "gen_ai_request_model", series="count") == {"qwen2.5:0.5b": 1.0}
    # one histogram family, the token kind in a label: each role takes its own series
    assert _by(con, "prompt_tokens_histogram", "gen_ai_token_type", series="sum") == {"input": 44.0}
    assert _by(con, "completion_tokens_histogram", "gen_ai_token_type", series="sum") == {"output": 14.0}
    engines = con.execute("SELECT DISTINCT engine, type FROM scope_role_samples").fetchall()
    assert engines == [("envoy-ai-gateway", "histogram")]
    # the streamed-response histograms it has no sample of are named as genai.go's OTel names export them
    assert {"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds"} <= {
        r.name for r in metric_roles.load_roles() if r.engine == "envoy-ai-gateway"}
