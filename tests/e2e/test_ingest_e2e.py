"""What the real engine logged, ingested with `servlens ingest`: the derived values agree with the raw records and
behave as the scenario made them behave (directions and states, never absolute latencies)."""

from __future__ import annotations

import json
import statistics

import duckdb
import pytest

from tools.engine.scenarios import burst_plan

from .records import load_records


@pytest.fixture(scope="module")
def con(engine_store):
    c = duckdb.connect(str(engine_store), read_only=True)
    yield c
    c.close()


def _final(rec: dict) -> dict:
    return rec.get("response") or rec.get("stream_final_chunk") or {}


RUNS = ["prefix_nocache", "prefix_cache", "burst", "steady_a", "steady_b", "max_tokens", "reasoning_none",
        "reasoning_deepseek"]


@pytest.mark.parametrize("run", RUNS)
def test_every_logged_request_is_one_row(con, engine_out, run):
    records = load_records(engine_out, run)
    rows = con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests WHERE run = ?", [run]).fetchone()
    assert rows == (len(records), len(records))
    bad = con.execute("SELECT count(*) FROM ingest_errors e JOIN sources s USING (source_id) WHERE s.run = ?",
                      [run]).fetchone()[0]
    assert bad == 0
    scrapes = con.execute("SELECT count(DISTINCT ts) FROM metric_samples WHERE run = ?", [run]).fetchone()[0]
    index = [json.loads(line) for line in (engine_out / run / "metrics_index.jsonl").read_text().splitlines()]
    assert scrapes == sum(1 for e in index if e["file"]) >= 5  # one sample time per scrape file, from the index


def test_prompt_tokens_split_into_cached_and_evaluated(con, engine_out):
    """llama.cpp: prompt = cache_n + prompt_n, and cached_tokens is cache_n, request by request."""
    for run in ("prefix_nocache", "prefix_cache"):
        raw = {r["req_idx"]: _final(r)["timings"] for r in load_records(engine_out, run)}
        got = con.execute("SELECT (attrs->>'$.req_idx')::BIGINT, prompt_tokens, cached_tokens FROM requests "
                          "WHERE run = ?", [run]).fetchall()
        assert len(got) == len(raw)
        for idx, prompt, cached in got:
            assert cached == raw[idx]["cache_n"]
            assert prompt == raw[idx]["cache_n"] + raw[idx]["prompt_n"]


def test_cache_prompt_true_on_a_shared_prefix_reuses_it(con):
    stats = dict(
        (run, (n, hits, share))
        for run, n, hits, share in con.execute(
            "SELECT run, count(*), count(*) FILTER (WHERE cached_tokens > 0), "
            "sum(cached_tokens) / sum(prompt_tokens) FROM requests "
            "WHERE run IN ('prefix_nocache', 'prefix_cache') GROUP BY run").fetchall())
    n, hits, _ = stats["prefix_nocache"]
    assert hits == 0  # cache_prompt=false: nothing reused
    n, hits, share = stats["prefix_cache"]
    # Only the first request on each of the 2 slots (and one racing the first) has to prefill the whole prefix.
    assert hits >= n - 3
    assert share > 0.8


def test_burst_wait_is_client_ttft_minus_engine_prefill(con, engine_out):
    """llama.cpp's timings.prompt_ms excludes the slot wait: queue_s = client TTFT - prompt_ms, and in the burst
    the wait dwarfs the prefill."""
    raw = {r["req_idx"]: r for r in load_records(engine_out, "burst")}
    rows = con.execute("SELECT (attrs->>'$.req_idx')::BIGINT, ttft_s, prefill_s, queue_s FROM requests "
                       "WHERE run = 'burst' AND stream AND ttft_s IS NOT NULL").fetchall()
    assert len(rows) >= 30
    for idx, ttft, prefill, queue in rows:
        rec = raw[idx]
        assert ttft == pytest.approx(rec["first_token_ts"] - rec["send_ts"], abs=1e-5)
        assert prefill == pytest.approx(_final(rec)["timings"]["prompt_ms"] / 1000, abs=1e-9)
        assert queue == pytest.approx(max(ttft - prefill, 0.0), abs=1e-9)
    burst_idx = {p.req_idx for p in burst_plan() if p.offset_s == 4.0}  # the 40 sent at once
    in_burst = [(q, p) for i, _, p, q in rows if i in burst_idx]
    assert len(in_burst) >= 20
    assert statistics.median(q for q, _ in in_burst) > 5 * statistics.median(p for _, p in in_burst)
    # ... and the steady run, sent at 2 req/s into the same 2 slots, barely waits by comparison
    steady = [q for (q,) in con.execute("SELECT queue_s FROM requests WHERE run = 'steady_a' AND queue_s IS NOT NULL"
                                        ).fetchall()]
    assert statistics.median(steady) < statistics.median(q for q, _ in in_burst) / 5


def test_deferred_requests_show_in_the_burst_scrapes(con):
    peak = con.execute("SELECT max(value) FROM metric_samples WHERE run = 'burst' AND name_raw = "
                       "'llamacpp:requests_deferred'").fetchone()[0]
    assert peak is not None and peak > 0


def test_finish_reasons_are_a_stop_length_mix_matching_the_log(con, engine_out):
    raw = load_records(engine_out, "max_tokens")
    want = {fr: sum(1 for r in raw if r["finish_reason"] == fr) for fr in ("stop", "length")}
    got = dict(con.execute("SELECT finish_reason, count(*) FROM requests WHERE run = 'max_tokens' "
                           "GROUP BY finish_reason").fetchall())
    assert got == {k: v for k, v in want.items() if v}
    assert want["stop"] >= 5 and want["length"] >= 5
    # the length finishes are the capped requests reaching their cap
    capped = con.execute("SELECT count(*) FROM requests WHERE run = 'max_tokens' AND finish_reason = 'length' "
                         "AND completion_tokens IS NOT NULL AND completion_tokens <> max_tokens").fetchone()[0]
    assert capped == 0


def test_reasoning_markers_in_content_only_without_a_reasoning_parser(con):
    flags = {run: (n, marker, reasoning) for run, n, marker, reasoning in con.execute(
        "SELECT run, count(*) FILTER (WHERE NOT stream), "
        "count(*) FILTER (WHERE NOT stream AND content_has_reasoning_marker), "
        "count(*) FILTER (WHERE NOT stream AND reasoning_present) FROM requests "
        "WHERE run IN ('reasoning_none', 'reasoning_deepseek') GROUP BY run").fetchall()}
    n, marker, reasoning = flags["reasoning_none"]
    assert n >= 10 and marker == n and reasoning == 0  # --reasoning-format none: <think> stays in content
    n, marker, reasoning = flags["reasoning_deepseek"]
    assert n >= 10 and marker == 0 and reasoning == n  # deepseek + thinking template: split into reasoning_content
