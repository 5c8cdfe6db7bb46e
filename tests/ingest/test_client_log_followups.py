"""servlens-loadgen follow-ups, checked on logs recorded from a real llama.cpp server (sample_logs/, recorded by
tools/engine/) and the real vLLM log in tests/data/shared/real-engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"


def q(con, sql, params=None):
    return con.execute(sql, params or []).fetchall()


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


# ---------------------------------------------------------------------------------------------------------------
# 1. A stream without stream_options.include_usage: token counts from llama.cpp `timings`


def _lines_without_usage(path: Path) -> list[int]:
    """Line numbers of the streamed requests whose last chunk has no `usage` (read straight from the file)."""
    out = []
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            record = json.loads(line)
            if record["body"].get("stream") and "usage" not in (record.get("stream_final_chunk") or {}):
                out.append(number)
    return out


def test_steady_stream_without_usage_gets_tokens_from_timings(con):
    path = SAMPLES / "steady-a" / "requests.jsonl"
    no_usage = _lines_without_usage(path)
    assert no_usage == [5, 6, 8, 11, 12, 13, 18, 21, 22, 25, 28, 34, 35, 38, 39, 43, 50]
    ingest_inputs(con, [str(path)])
    # every one of the 50 requests now has its token counts; TPOT is missing only where one token was generated
    assert one(con, """SELECT count(*), count(completion_tokens), count(prompt_tokens), count(cached_tokens),
        count(tpot_s) FROM requests""") == (50, 50, 50, 50, 49)
    assert one(con, "SELECT source_line, completion_tokens, tpot_s FROM requests WHERE tpot_s IS NULL") == (28, 1, None)
    lines = ", ".join(map(str, no_usage))
    # the 17 usage-less streams: completion = predicted_n, prompt = prompt_n + cache_n, cached = cache_n
    assert one(con, f"""SELECT count(*), sum(completion_tokens), sum(prompt_tokens), sum(cached_tokens) FROM requests
        WHERE source_line IN ({lines})""") == (17, 548, 1487, 53)
    assert one(con, f"""SELECT count(*) FROM requests WHERE source_line IN ({lines})
        AND completion_tokens = (attrs->>'$.llamacpp_predicted_n')::BIGINT
        AND prompt_tokens = (attrs->>'$.llamacpp_prompt_n')::BIGINT + (attrs->>'$.llamacpp_cache_n')::BIGINT
        AND cached_tokens = (attrs->>'$.llamacpp_cache_n')::BIGINT""") == (17,)
    # line 5: timings {cache_n 3, prompt_n 78, predicted_n 64, predicted_ms 210.729}, capped at max_tokens 64
    row = one(con, """SELECT completion_tokens, prompt_tokens, cached_tokens, decode_s, tpot_s, finish_reason
        FROM requests WHERE source_line = 5""")
    assert row[:3] == (64, 81, 3)
    assert row[3] == pytest.approx(0.210729) and row[4] == pytest.approx(0.210729 / 63)
    assert row[5] == "length"


def test_usage_wins_over_timings_and_they_agree_on_every_real_row(con, shared_data):
    # Where both are present the engine's usage is used; on the real llama.cpp log the two never differ.
    ingest_inputs(con, [str(shared_data / "real-engine" / "llamacpp" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(*) FILTER (WHERE completion_tokens = (attrs->>'$.llamacpp_predicted_n')::BIGINT)
        FROM requests WHERE attrs->>'$.llamacpp_predicted_n' IS NOT NULL""") == (170, 170)


def test_no_usage_and_no_timings_stays_null(con, shared_data):
    # vLLM's per-request `metrics` carry no token count: its requests without usage (two failed streams) keep NULL.
    ingest_inputs(con, [str(shared_data / "real-engine" / "vllm-cpu" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(completion_tokens), count(prompt_tokens) FROM requests
        WHERE attrs->>'$.vllm_ttft_ms' IS NULL""") == (4, 0, 0)
    assert one(con, "SELECT count(*), count(completion_tokens) FROM requests WHERE attrs->>'$.vllm_ttft_ms' IS NOT NULL") == (138, 138)


# ---------------------------------------------------------------------------------------------------------------
# 2. Streamed text reassembled by the logger (stream_content, stream_reasoning_content) sets the leak flags


def _flags(con):
    return q(con, """SELECT stream, count(*), count(content_empty), count(content_has_reasoning_marker),
        count(reasoning_present), count(*) FILTER (WHERE content_empty), count(*) FILTER (WHERE content_has_reasoning_marker),
        count(*) FILTER (WHERE reasoning_present), count(*) FILTER (WHERE reasoning_has_marker)
        FROM requests GROUP BY ALL ORDER BY ALL""")


def test_streamed_rows_get_leak_flags_from_the_reassembled_text(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-none" / "requests.jsonl")])
    # --reasoning-format none: <think> stays in content, streamed or not; no reasoning anywhere
    assert _flags(con) == [(False, 29, 29, 29, 29, 0, 29, 0, 0), (True, 11, 11, 11, 11, 0, 11, 0, 0)]
    # the text itself is not kept without --keep-text
    assert one(con, "SELECT count(content_text), count(reasoning_text) FROM requests") == (0, 0)


def test_streamed_reasoning_deltas_count_as_reasoning(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-deepseek" / "requests.jsonl")])
    # --reasoning-format deepseek: the thought arrives as reasoning_content (deltas for streams), content clean.
    # One non-streamed answer is all thought (empty content, finish length).
    assert _flags(con) == [(False, 29, 29, 29, 29, 1, 0, 29, 0), (True, 11, 11, 11, 11, 0, 0, 11, 0)]
    assert one(con, "SELECT stream, finish_reason FROM requests WHERE content_empty") == (False, "length")


def test_streamed_text_is_kept_with_keep_text(con):
    ingest_inputs(con, [str(SAMPLES / "reasoning-deepseek" / "requests.jsonl")], keep_text=True)
    path = SAMPLES / "reasoning-deepseek" / "requests.jsonl"
    records = {n: json.loads(line) for n, line in enumerate(path.open(), start=1)}
    streamed = {n: r for n, r in records.items() if r["body"].get("stream")}
    rows = {line: (content, reasoning) for line, content, reasoning in q(
        con, "SELECT source_line, content_text, reasoning_text FROM requests WHERE stream")}
    assert rows == {n: (r["stream_content"], r["stream_reasoning_content"]) for n, r in streamed.items()}


def test_a_log_without_streamed_text_keeps_stream_flags_unknown(con, shared_data):
    # The older real recording has no stream_content: a streamed answer's flags stay NULL unless it had no characters.
    ingest_inputs(con, [str(shared_data / "real-engine" / "llamacpp" / "requests.jsonl")])
    assert one(con, """SELECT count(*), count(content_has_reasoning_marker), count(reasoning_present),
        count(*) FILTER (WHERE content_empty) FROM requests WHERE stream""") == (122, 10, 0, 10)


def _sl003(folder: str) -> dict:
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules
    from servlens.analysis.runner import analyze

    con = open_store(None)
    try:
        ingest_paths(con, [str(SAMPLES / folder)])
        doc = analyze(con, [r for r in load_rules() if r.id == "SL003"])
    finally:
        con.close()
    (finding,) = [f for f in doc["findings"] if f["rule"] == "SL003"]
    return finding


def test_sl003_judges_streamed_rows_too():
    fired = _sl003("reasoning-none")
    assert fired["state"] == "fired"
    m = fired["evidence"]["metrics"]
    # all 40 responses, the 11 streamed ones included (29 before streamed text was read)
    assert (m["requests"], m["leaking"], m["markers_in_content"], m["main_pattern"]) == (40, 40, 40, "markers_in_content")
    clear = _sl003("reasoning-deepseek")
    assert clear["state"] == "clear"
    m = clear["evidence"]["metrics"]
    assert (m["requests"], m["leaking"], m["responses_with_reasoning"]) == (40, 0, 40)
    # streamed and non-streamed answers split reasoning the same way: the disagreement pattern is not even armed
    # (the SQL SL003 reports the pattern's key with NULL when it is not armed; the Python one left it out)
    assert m.get("stream_mode_disagreement") is None


# ---------------------------------------------------------------------------------------------------------------
# 3. queued_at_client_s is a send time from the start of the run, not a wait


def test_send_offset_is_stored_as_an_offset_not_a_wait(con):
    ingest_inputs(con, [str(SAMPLES / "steady-a" / "requests.jsonl")])
    assert one(con, """SELECT count(*) FROM requests WHERE attrs->>'$.client_wait_before_send_s' IS NOT NULL
        OR attrs->>'$.queued_at_client_s' IS NOT NULL""") == (0,)
    # offset = send time minus the run's start: t_arrival - offset is the same instant on every row (to 1 ms)
    start_spread, n, late_max = one(con, """SELECT max(epoch(t_arrival) - (attrs->>'$.client_send_offset_s')::DOUBLE)
          - min(epoch(t_arrival) - (attrs->>'$.client_send_offset_s')::DOUBLE),
        count(attrs->>'$.client_send_offset_s'), max((attrs->>'$.client_send_late_s')::DOUBLE) FROM requests""")
    assert n == 50 and start_spread < 1e-3
    row = one(con, """SELECT (attrs->>'$.client_send_offset_s')::DOUBLE, (attrs->>'$.client_send_late_s')::DOUBLE
        FROM requests WHERE source_line = 1""")
    assert row == (0.072446, 0.000346)
    assert late_max == max(json.loads(line)["send_late_s"] for line in (SAMPLES / "steady-a" / "requests.jsonl").open())


# ---------------------------------------------------------------------------------------------------------------
# 4. llama.cpp /props and /slots beside a request log: the slot count and the slot context reach the request rows


def test_folder_props_reach_every_request_row(con):
    props = json.loads((SAMPLES / "mixed" / "props.json").read_text())
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (4, 2048)
    report = ingest_inputs(con, [str(SAMPLES / "mixed")])
    (entry,) = [s for s in report.sources if s["kind"] == "engine_info"]
    assert (entry["format"], entry["runs"], entry["slots"], entry["n_ctx_per_slot"], entry["requests_annotated"],
            entry["rows"], entry["skipped"]) == ("llamacpp-props", ["mixed"], 4, 2048, 150, 0, False)
    assert report.rows == 150 + 720  # requests + metric samples: the side file adds no rows
    (requests,) = [s for s in report.sources if s["kind"] == "requests"]
    assert requests["columns_filled"]["context_window"] == 1.0  # coverage read after the side file applied
    skipped = {Path(s["path"]).name: s["reason"] for s in report.skipped}
    assert skipped["slots_mixed_end.json"] == "llama.cpp /slots: 4 slots of 2,048 tokens; agrees with props.json, which is used"
    assert one(con, """SELECT count(*), count(*) FILTER (WHERE (attrs->>'$.parallel')::INT = 4
        AND (attrs->>'$.n_ctx_per_slot')::INT = 2048 AND context_window = 2048) FROM requests""") == (150, 150)
    # other attrs are kept
    assert one(con, "SELECT count(attrs->>'$.req_idx') FROM requests") == (150,)
    assert q(con, "SELECT run, kind, format, rows FROM sources WHERE kind <> 'metrics' ORDER BY kind") == [
        ("mixed", "engine_info", "llamacpp-props", 0), ("mixed", "requests", "servlens-loadgen", 150)]
    # ingesting the folder again adds nothing and changes nothing
    again = ingest_inputs(con, [str(SAMPLES / "mixed")])
    (entry,) = [s for s in again.sources if s["kind"] == "engine_info"]
    assert entry["skipped"] is True and entry["requests_annotated"] == 150
    assert one(con, "SELECT count(*) FROM sources WHERE kind = 'engine_info'") == (1,)


def test_a_value_the_row_has_wins_over_props(con, tmp_path):
    # The two context errors name their slot's context themselves (2048); a props file that says otherwise fills the
    # other rows only. The request log is the real one; only the props copy is edited.
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "requests.jsonl").write_bytes((SAMPLES / "mixed" / "requests.jsonl").read_bytes())
    props = json.loads((SAMPLES / "mixed" / "props.json").read_text())
    props["default_generation_settings"]["n_ctx"] = 1000
    (folder / "props.json").write_text(json.dumps(props))
    ingest_inputs(con, [str(folder)])
    assert q(con, "SELECT context_window, status, count(*) FROM requests GROUP BY ALL ORDER BY ALL") == [
        (1000, "ok", 148), (2048, "error", 2)]


def test_slots_file_alone_gives_the_same_settings(con, tmp_path):
    folder = tmp_path / "steady"
    folder.mkdir()
    for name in ("requests.jsonl", "slots_steady_a_end.json"):
        (folder / name).write_bytes((SAMPLES / "steady-a" / name).read_bytes())
    report = ingest_inputs(con, [str(folder)])
    (entry,) = [s for s in report.sources if s["kind"] == "engine_info"]
    assert (entry["format"], entry["slots"], entry["n_ctx_per_slot"]) == ("llamacpp-slots", 2, 4096)
    assert one(con, """SELECT count(*) FILTER (WHERE (attrs->>'$.parallel')::INT = 2 AND context_window = 4096)
        FROM requests""") == (50,)


def test_props_named_later_annotates_the_log_already_in_the_store(con):
    ingest_inputs(con, [str(SAMPLES / "steady-a" / "requests.jsonl")])
    assert one(con, "SELECT count(attrs->>'$.parallel'), count(context_window) FROM requests") == (0, 0)
    report = ingest_inputs(con, [str(SAMPLES / "steady-a" / "props.json")])
    assert report.runs == ["steady_a"]
    assert one(con, """SELECT count(*) FILTER (WHERE (attrs->>'$.parallel')::INT = 2 AND context_window = 4096)
        FROM requests""") == (50,)


def test_props_without_a_request_log_is_listed_not_applied(con, tmp_path):
    (tmp_path / "props.json").write_bytes((SAMPLES / "burst" / "props.json").read_bytes())
    report = ingest_inputs(con, [str(tmp_path / "props.json")])
    assert report.sources == [] and report.runs == []
    assert report.skipped == [{"path": str((tmp_path / "props.json").resolve()),
                               "reason": "llama.cpp /props: 2 slots of 4,096 tokens; no request log in its folder to apply it to"}]


def test_real_llamacpp_folder_gives_sl012_and_the_workload_the_slot_count(shared_data):
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules
    from servlens.analysis.runner import analyze

    con = open_store(None)
    try:
        ingest_paths(con, [str(shared_data / "real-engine" / "llamacpp")])
        # --parallel 4 --ctx-size 8192: 4 slots of 2,048 on all 174 requests of the six runs
        assert one(con, """SELECT count(*), count(*) FILTER (WHERE (attrs->>'$.parallel')::INT = 4 AND context_window = 2048)
            FROM requests""") == (174, 174)
        assert one(con, "SELECT count(DISTINCT run) FROM sources WHERE kind = 'engine_info'") == (6,)
        doc = analyze(con, [r for r in load_rules() if r.id == "SL012"])
    finally:
        con.close()
    (f,) = [f for f in doc["findings"] if f["rule"] == "SL012" and f["scope"]["run"] == "poisson"]
    m = f["evidence"]["metrics"]
    assert (m["slots"], m["slots_source"], m["context_total"], m["fit_whole_context"]) == (
        4, "--parallel from the request attributes", 8192, 4)
