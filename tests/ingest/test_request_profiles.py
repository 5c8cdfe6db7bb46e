"""Each built-in request profile on fixtures shaped exactly like the real thing, with its traps; the ingest
mechanics (bad lines, compression, re-ingest, replace, transactions, user profiles, sniffing)."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import datetime
from pathlib import Path

import pytest
import zstandard

from servlens.errors import ConfigError, InputError
from servlens.ingest import sources as src
from servlens.ingest.api import ingest_inputs
from servlens.ingest.compiler import CompileOptions, compile_profile, filled_columns
from servlens.ingest.profiles import builtin_profiles, get_profile, load_profile_file
from servlens.store.schema import open_store

REAL = Path(__file__).resolve().parents[1] / "data" / "shared" / "real-engine"


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


def real_lines(engine: str) -> list[dict]:
    return [json.loads(line) for line in (REAL / engine / "requests.jsonl").read_text().splitlines()]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def prefix(text: str) -> str:
    return hashlib.md5(text[:2048].encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# servlens-loadgen traps


def _vllm_chat(content, reasoning=None, finish="stop", details=None, completion_details=None):
    """A non-streamed vLLM chat record, shaped like tests/data/shared/real-engine/vllm-cpu/requests.jsonl."""
    record = next(r for r in real_lines("vllm-cpu") if "response" in r and r["http_status"] == 200
                  and r["path"] == "/v1/chat/completions")
    record = json.loads(json.dumps(record))
    message = {"role": "assistant", "content": content, "tool_calls": []}
    if reasoning is not None:
        message["reasoning"] = reasoning
    record["response"]["choices"] = [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": None}]
    record["response"]["usage"]["prompt_tokens_details"] = details
    record["response"]["usage"]["completion_tokens_details"] = completion_details
    record["finish_reason"] = finish
    return record


def test_nullable_usage_details_stay_null_and_reasoning_tokens_are_read(con, tmp_path):
    records = [
        _vllm_chat("hi", details=None, completion_details=None),
        _vllm_chat("hi", details={"cached_tokens": None}, completion_details={"reasoning_tokens": None}),
        _vllm_chat("hi", reasoning="thinking", details={"cached_tokens": 16}, completion_details={"reasoning_tokens": 12}),
    ]
    ingest_inputs(con, [str(write_jsonl(tmp_path / "c.jsonl", records))], run="r")
    rows = con.execute("SELECT cached_tokens, reasoning_tokens, reasoning_present FROM requests ORDER BY source_line").fetchall()
    assert rows == [(None, None, False), (None, None, False), (16, 12, True)]


def test_leak_flags_from_the_text_which_is_then_dropped(con, tmp_path):
    records = [
        _vllm_chat("The answer is 4.", reasoning="2+2 is 4"),                    # clean split
        _vllm_chat("Let me think</think>The answer is 4.", reasoning=None, finish="length"),  # marker leaked
        _vllm_chat(None, reasoning="Okay, the user wants", finish="stop"),       # answer swallowed into reasoning
        _vllm_chat("<|channel|>analysis<|message|>hmm", reasoning=""),            # harmony markers in content
        _vllm_chat("x", reasoning="a </think> b"),                               # marker inside the reasoning
    ]
    ingest_inputs(con, [str(write_jsonl(tmp_path / "leak.jsonl", records))], run="r")
    rows = con.execute("""SELECT content_empty, content_has_reasoning_marker, reasoning_present, reasoning_has_marker,
        finish_reason, content_text FROM requests ORDER BY source_line""").fetchall()
    assert rows == [
        (False, False, True, False, "stop", None),
        (False, True, False, False, "length", None),
        (True, False, True, False, "stop", None),
        (False, True, False, False, "stop", None),
        (False, False, True, True, "stop", None),
    ]


def test_keep_text_stores_the_text(con, tmp_path):
    record = _vllm_chat("Answer", reasoning="Because")
    ingest_inputs(con, [str(write_jsonl(tmp_path / "k.jsonl", [record]))], run="r", keep_text=True)
    prompt, content, reasoning, key = one(con, "SELECT prompt_text, content_text, reasoning_text, prefix_key FROM requests")
    expected_prompt = "\n".join(f"{m['role']}: {m['content']}" for m in record["body"]["messages"])
    assert (prompt, content, reasoning) == (expected_prompt, "Answer", "Because")
    assert key == prefix(expected_prompt)


def test_prefix_key_is_the_hash_of_the_first_2048_characters_as_sent(con, tmp_path):
    base = real_lines("llamacpp")
    completion = next(r for r in base if r["path"] == "/v1/completions")
    chat = next(r for r in base if r["path"] == "/v1/chat/completions" and r["http_status"] == 200)
    listed = json.loads(json.dumps(completion))
    listed["body"]["prompt"] = ["first", "second"]
    parts = json.loads(json.dumps(chat))
    parts["body"]["messages"] = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                               {"type": "image_url", "image_url": {"url": "x"}}]}]
    long_shared = "S" * 3000
    a, b = json.loads(json.dumps(chat)), json.loads(json.dumps(chat))
    a["body"]["messages"] = [{"role": "system", "content": long_shared}, {"role": "user", "content": "one"}]
    b["body"]["messages"] = [{"role": "system", "content": long_shared}, {"role": "user", "content": "two"}]
    ingest_inputs(con, [str(write_jsonl(tmp_path / "p.jsonl", [completion, listed, parts, chat, a, b]))], run="r")
    keys = [r[0] for r in con.execute("SELECT prefix_key FROM requests ORDER BY source_line").fetchall()]
    chat_text = "\n".join(f"{m['role']}: {m['content']}" for m in chat["body"]["messages"])
    assert keys[:4] == [prefix(completion["body"]["prompt"]), prefix("first\nsecond"), prefix("user: look[image_url]"),
                        prefix(chat_text)]
    assert keys[4] == keys[5] == prefix("system: " + long_shared)  # a shared long system prompt: one key


def test_finish_reasons_are_normalised_and_the_raw_value_kept(con, tmp_path):
    raws = ["stop", "length", "tool_calls", "content_filter", "abort", "MAX_TOKENS", "end_turn", "repetition"]
    records = []
    for raw in raws:
        record = _vllm_chat("x", finish=raw)
        record["finish_reason"] = raw
        records.append(record)
    ingest_inputs(con, [str(write_jsonl(tmp_path / "f.jsonl", records))], run="r")
    rows = con.execute("SELECT finish_reason, finish_reason_raw FROM requests ORDER BY source_line").fetchall()
    assert rows == [("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"),
                    ("content_filter", "content_filter"), ("abort", "abort"), ("length", "MAX_TOKENS"),
                    ("stop", "end_turn"), ("unknown", "repetition")]


def test_secrets_in_error_messages_are_redacted_and_long_messages_cut(con, tmp_path):
    record = next(r for r in real_lines("vllm-cpu") if r["http_status"] == 400)
    record = json.loads(json.dumps(record))
    record["response"]["error"]["message"] = "Incorrect API key provided: sk-proj-abcdef1234567890. " + "x" * 900
    ingest_inputs(con, [str(write_jsonl(tmp_path / "e.jsonl", [record]))], run="r")
    message, status, http = one(con, "SELECT error_message, status, http_status FROM requests")
    assert message.startswith("Incorrect API key provided: sk-[REDACTED]. xxx") and len(message) == 500
    assert (status, http) == ("error", 400)


def test_a_value_that_cannot_convert_becomes_null_not_a_failed_file(con, tmp_path):
    records = real_lines("vllm-cpu")[:3]
    records[1]["http_status"] = "two hundred"
    report = ingest_inputs(con, [str(write_jsonl(tmp_path / "v.jsonl", records))], run="r")
    assert report.sources[0]["rows"] == 3 and report.sources[0]["bad_lines"] == 0
    assert [r[0] for r in con.execute("SELECT http_status FROM requests ORDER BY source_line").fetchall()] == [200, None, 200]


# ---------------------------------------------------------------------------------------------------------------
# bad lines


def test_bad_lines_are_kept_with_line_number_length_reason_and_keys(con, tmp_path):
    good = real_lines("vllm-cpu")[:2]
    lines = [
        good[0],
        '{"send_ts": 1795937383.1, "body": {"model": "tiny"',   # truncated
        "",                                                      # blank: not a record, not an error
        "not json at all",
        "[1, 2]",
        {"send_ts": 1795937383.2, "http_status": 200},           # valid, but not this format's record
        good[1],
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    report = ingest_inputs(con, [str(path)], run="r")
    assert report.sources[0]["rows"] == 2 and report.sources[0]["bad_lines"] == 4
    errors = con.execute("SELECT line, byte_length, reason, keys_seen, excerpt FROM ingest_errors ORDER BY line").fetchall()
    assert errors == [
        (2, 50, "invalid JSON: the line ends before the value does (truncated?)", "send_ts,body,model", None),
        (4, 15, "invalid JSON", None, None),
        (5, 6, "a JSON array, not an object", None, None),
        (6, 45, "missing field(s) the servlens-loadgen profile requires: $.body.model", "send_ts,http_status", None),
    ]
    assert [r[0] for r in con.execute("SELECT source_line FROM requests ORDER BY 1").fetchall()] == [1, 7]


def test_keep_text_keeps_a_redacted_excerpt_of_bad_lines(con, tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [real_lines("vllm-cpu")[0], 'oops Authorization: Bearer abcdefghijklmnop'])
    ingest_inputs(con, [str(path)], run="r", keep_text=True)
    assert one(con, "SELECT excerpt FROM ingest_errors") == ("oops Authorization: Bearer [REDACTED]",)


def test_strict_keeps_nothing_from_a_file_with_a_bad_line(con, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [real_lines("vllm-cpu")[0], "garbage"])
    with pytest.raises(InputError, match=r"s.jsonl has 1 malformed line\(s\) \(first: line 2: invalid JSON\); "
                                         r"--strict keeps nothing from it"):
        ingest_inputs(con, [str(path)], run="r", strict=True)
    assert one(con, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM sources), "
                    "(SELECT count(*) FROM ingest_errors), (SELECT count(*) FROM runs)") == (0, 0, 0, 0)


# ---------------------------------------------------------------------------------------------------------------
# compression, re-ingest, replace, transactions


def test_gzip_and_zstd_give_the_same_rows_as_plain(con, tmp_path):
    data = (REAL / "llamacpp" / "requests.jsonl").read_bytes()
    (tmp_path / "l.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "l.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    for name, run in (("l.jsonl.gz", "gz"), ("l.jsonl.zst", "zst")):
        report = ingest_inputs(con, [str(tmp_path / name)], run=run)
        assert report.sources[0]["format"] == "servlens-loadgen" and report.sources[0]["rows"] == 174
    assert one(con, """SELECT count(*) FROM (SELECT source_line, request_id, ttft_s, prompt_tokens, prefix_key FROM requests
        WHERE run = 'gz' EXCEPT SELECT source_line, request_id, ttft_s, prompt_tokens, prefix_key FROM requests
        WHERE run = 'zst')""") == (0,)


def test_reingesting_the_same_content_adds_nothing(con, tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", real_lines("vllm-cpu")[:5])
    first = ingest_inputs(con, [str(path)], run="r")
    again = ingest_inputs(con, [str(path)], run="r")
    assert first.sources[0]["skipped"] is False and again.sources[0]["skipped"] is True
    assert again.sources[0]["note"] == "already ingested: same content in the same run(s); nothing added"
    assert again.sources[0]["rows"] == 5 and again.runs == ["r"]
    assert one(con, "SELECT count(*) FROM requests") == (5,)
    # the same content into another run is a new source
    ingest_inputs(con, [str(path)], run="other")
    assert one(con, "SELECT count(*) FROM requests") == (10,)


def test_a_changed_file_at_the_same_path_replaces_its_rows(con, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", real_lines("vllm-cpu")[:5] + ["bad"])
    ingest_inputs(con, [str(path)], run="r")
    write_jsonl(path, real_lines("vllm-cpu")[:3])
    report = ingest_inputs(con, [str(path)], run="r")
    assert report.sources[0]["replaced"] is True and report.sources[0]["rows"] == 3
    assert one(con, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM sources), "
                    "(SELECT count(*) FROM ingest_errors)") == (3, 1, 0)


def test_an_interrupted_ingest_leaves_the_store_as_it_was(con, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "i.jsonl", real_lines("vllm-cpu")[:5])
    ingest_inputs(con, [str(path)], run="r")
    write_jsonl(path, real_lines("vllm-cpu")[:2])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(src, "update_source_counts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ingest_inputs(con, [str(path)], run="r")
    assert one(con, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM sources), "
                    "(SELECT rows FROM sources)") == (5, 1, 5)


# ---------------------------------------------------------------------------------------------------------------
# vllm-bench traps


def _bench_document(**changes) -> dict:
    path = next((REAL / "vllm-bench" / "random").glob("*.json"))
    document = json.loads(path.read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                "generated_texts", "errors"):
        document[key] = document[key][:3]
    document.update(changes)
    return document


def test_bench_failed_requests_have_unknown_timings_and_both_goodput_spellings(con, tmp_path):
    document = _bench_document()
    document["errors"][1] = "Traceback (most recent call last):\n  aiohttp.ClientResponseError: 500, api_key=abcdef123456"
    document["ttfts"][1], document["itls"][1], document["output_lens"][1], document["latencies"][1] = 0.0, [], 0, 0.0
    typo = _bench_document()
    del typo["request_goodput"]
    typo["request_goodput:"] = 2.5
    path = tmp_path / "bench-3.0qps-tiny-20261129-081458.json"
    path.write_text(json.dumps(document) + "\n" + json.dumps(typo) + "\n")  # --append-result: one document per line
    report = ingest_inputs(con, [str(path)], run="b")
    assert report.sources[0]["format"] == "vllm-bench" and report.sources[0]["rows"] == 6
    rows = con.execute("""SELECT source_line, (attrs->>'$.index')::INT, status, ttft_s, e2e_s, completion_tokens,
        error_message, attrs->>'$.request_goodput' FROM requests ORDER BY source_line, 2""").fetchall()
    assert rows[1][:6] == (1, 2, "error", None, None, None)
    assert rows[1][6].endswith("500, api_key=[REDACTED]")
    assert rows[0][2:4] == ("ok", document["ttfts"][0])
    assert [r[7] for r in rows] == [None, None, None, "2.5", "2.5", "2.5"]


def test_bench_pretty_printed_document_is_read_too(con, tmp_path):
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(_bench_document(), indent=2))
    report = ingest_inputs(con, [str(path)], run="b")
    assert report.sources[0]["format"] == "vllm-bench" and report.sources[0]["rows"] == 3
    assert one(con, "SELECT min(source_line), max(source_line) FROM requests") == (1, 1)


def test_bench_start_option_sets_the_epoch(con, tmp_path):
    path = tmp_path / "b.json"
    document = _bench_document()
    path.write_text(json.dumps(document))
    ingest_inputs(con, [str(path)], run="b", start="2026-11-29T08:14:30+01:00")
    first, second = [r[0] for r in con.execute("SELECT t_arrival FROM requests ORDER BY t_arrival LIMIT 2").fetchall()]
    assert first == datetime(2026, 11, 29, 7, 14, 30)
    offset = sorted(document["start_times"])[1] - min(document["start_times"])
    assert (second - first).total_seconds() == pytest.approx(offset, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# CSV and Mooncake bad rows


def test_csv_rows_duckdb_cannot_split_are_kept_as_bad_lines(con, tmp_path):
    path = tmp_path / "azure_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109,7,8\n2023-11-16 18:15:51.0000000,10,20\n")
    report = ingest_inputs(con, [str(path)], run="a")
    assert report.sources[0]["rows"] == 2 and report.sources[0]["bad_lines"] == 1
    assert one(con, "SELECT line, reason FROM ingest_errors") == (
        3, "TOO MANY COLUMNS: Expected Number of Columns: 3 Found: 4")
    assert con.execute("SELECT source_line, prompt_tokens FROM requests ORDER BY 1").fetchall() == [(2, 374), (4, 10)]


def test_mooncake_line_without_its_fields_is_a_bad_line(con, tmp_path):
    lines = (Path(__file__).resolve().parents[1] / "data" / "shared" / "traces" /
             "mooncake_fast25_synthetic_trace.jsonl").read_text().splitlines()[:3]
    path = write_jsonl(tmp_path / "mooncake.jsonl", [lines[0], {"timestamp": 5, "input_length": 10}, lines[1], lines[2]])
    report = ingest_inputs(con, [str(path)], from_format="mooncake-trace", run="m")
    assert report.sources[0]["rows"] == 3 and report.sources[0]["bad_lines"] == 1
    assert one(con, "SELECT line, reason FROM ingest_errors") == (
        2, "missing field(s) the mooncake-trace profile requires: $.output_length")


# ---------------------------------------------------------------------------------------------------------------
# sniffing, --from, user profiles


def test_a_named_file_nobody_recognises_names_the_formats_and_the_nearest(con, tmp_path):
    path = write_jsonl(tmp_path / "gateway.jsonl", [{"send_ts": 1.0, "request": {"model": "m"}}] * 3)
    with pytest.raises(InputError) as caught:
        ingest_inputs(con, [str(path)])
    assert str(caught.value) == (
        f"{path} is not in a format servlens knows (no format profile recognises it; nearest: servlens-loadgen "
        "(missing fields $.body.model)). Known formats: " + ", ".join(p.name for p in builtin_profiles())
        + ", plus Prometheus text/OpenMetrics and query_range JSON; name one with --from NAME or describe yours "
        "with --profile FILE (docs/profiles.md).")
    assert one(con, "SELECT count(*) FROM sources") == (0,)


def test_a_folder_skips_what_it_does_not_know_and_ingests_the_rest(con, tmp_path):
    write_jsonl(tmp_path / "requests.jsonl", real_lines("vllm-cpu")[:4])
    (tmp_path / "notes.md").write_text("# notes\n")
    write_jsonl(tmp_path / "other.jsonl", [{"a": 1}])
    report = ingest_inputs(con, [str(tmp_path)], run="f")
    assert [s["rows"] for s in report.sources] == [4]
    assert sorted((Path(s["path"]).name, s["reason"]) for s in report.skipped) == [
        ("notes.md", "documentation"), ("other.jsonl", "no format profile recognises it")]


def test_from_unknown_name_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"No format profile named 'vllm-bnch'. Did you mean 'vllm-bench'\?"):
        get_profile("vllm-bnch")


def test_user_profile_from_the_docs_example(con, tmp_path):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "profiles.md").read_text()
    start = docs.index("```toml\nname = \"my-gateway\"") + len("```toml\n")
    profile_text = docs[start:docs.index("```", start)]
    profile_path = tmp_path / "my-gateway.toml"
    profile_path.write_text(profile_text)
    log = write_jsonl(tmp_path / "gw.jsonl", [
        {"id": "a1", "req": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "ts_start": 1795936979.5,
         "ts_end": 1795936980.5, "ttft_ms": 250, "usage": {"in": 10, "out": 5}, "finish": "stop", "status": 200,
         "resp": {"text": "<think>x</think>ok"}, "tenant": "t1"},
    ])
    ingest_inputs(con, [str(log)], profile_file=str(profile_path), run="gw")
    row = one(con, """SELECT request_id, model, ttft_s, e2e_s, decode_s, tpot_s, prefix_key, content_has_reasoning_marker,
        attrs->>'$.tenant', t_first_token FROM requests""")
    assert row[:6] == ("a1", "m", 0.25, 1.0, 0.75, 0.75 / 4)
    assert row[6:9] == (prefix("user: hi"), True, "t1")
    assert row[9] == datetime(2026, 11, 29, 7, 22, 59, 750000)
    assert one(con, "SELECT format FROM sources") == ("my-gateway",)


def test_profile_errors_are_one_sentence(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nreader = "xml"\n')
    with pytest.raises(ConfigError, match="Profile x: reader 'xml' is not one of jsonl, json, csv, parquet"):
        load_profile_file(bad)
    bad.write_text('name = "x"\nreader = "jsonl"\n[columns]\nttft = "1"\n')
    with pytest.raises(ConfigError, match="not canonical columns: ttft"):
        load_profile_file(bad)
    bad.write_text('name = "x"\nreader = "jsonl"\n[attrs]\nprompt = "j->>\'$.p\'"\n')
    with pytest.raises(ConfigError, match="attrs.prompt looks like request or response text"):
        load_profile_file(bad)


# ---------------------------------------------------------------------------------------------------------------
# the compiler


def test_each_record_is_parsed_once(tmp_path):
    compiled = compile_profile(get_profile("servlens-loadgen"), CompileOptions(path=tmp_path / "x.jsonl"))
    sql = compiled.select()
    # one multi-path extraction for every field the profile reads; no per-field ->> on the line
    assert sql.count("json_extract_string(_text, [") == 1
    assert "json_valid" not in sql.split("_checked0")[0]
    assert "->>" not in sql.split("_s1 AS")[1].split("FROM _elements")[0].replace("->>'$'", "")


def test_ttft_is_never_derived_from_e2e(tmp_path):
    profile = load_profile_file(_write(tmp_path / "p.toml", """
name = "e2e-only"
reader = "jsonl"
[detect]
must = ["$.start"]
[columns]
t_arrival = "sl_epoch_s(j->>'$.start')"
e2e_s = "(j->>'$.e2e')::DOUBLE"
completion_tokens = "(j->>'$.n')::BIGINT"
"""))
    assert "ttft_s" not in filled_columns(profile) and "tpot_s" not in filled_columns(profile)
    con = open_store(":memory:")
    log = write_jsonl(tmp_path / "e.jsonl", [{"start": 100, "e2e": 2.0, "n": 11}])
    ingest_inputs(con, [str(log)], profile_file=str(tmp_path / "p.toml"), run="r")
    assert one(con, "SELECT ttft_s, t_first_token, decode_s, tpot_s, e2e_s, t_end FROM requests") == (
        None, None, None, None, 2.0, datetime(1970, 1, 1, 0, 1, 42))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_builtin_profiles_are_package_data():
    from importlib import resources

    names = sorted(e.name for e in resources.files("servlens.profiles").iterdir() if e.name.endswith(".toml"))
    assert {"servlens-loadgen.toml", "vllm-bench.toml", "mooncake-trace.toml", "azure-llm-trace.toml",
            "burstgpt-trace.toml"} <= set(names)
    assert {p.name for p in builtin_profiles()} >= {"servlens-loadgen", "vllm-bench", "mooncake-trace",
                                                     "azure-llm-trace", "burstgpt-trace"}


def test_a_file_naming_its_runs_is_skipped_or_replaced_per_run(con, tmp_path):
    records = real_lines("llamacpp")
    path = write_jsonl(tmp_path / "requests.jsonl", records)
    first = ingest_inputs(con, [str(path)])
    assert first.sources[0]["rows"] == 174 and len(first.runs) == 6
    again = ingest_inputs(con, [str(path)])
    assert again.sources[0]["skipped"] is True and again.runs == first.runs
    # the file changes: only its poisson lines remain, plus one bad line (which has no run)
    write_jsonl(path, [r for r in records if r["run"] == "poisson"] + ["{broken"])
    changed = ingest_inputs(con, [str(path)])
    assert changed.sources[0]["replaced"] is True and changed.runs == ["poisson"]
    assert changed.sources[0]["rows"] == 60 and changed.sources[0]["bad_lines"] == 1
    # the poisson source was replaced; the other runs' sources from the old content stay as they were
    assert con.execute("SELECT run, count(*) FROM requests GROUP BY 1 ORDER BY 1").fetchall() == [
        ("burst50", 50), ("fresh_cache", 16), ("fresh_nocache", 16), ("poisson", 60), ("prefix_cache", 16),
        ("prefix_nocache", 16)]
    assert one(con, "SELECT count(*) FROM sources WHERE run = 'poisson'") == (1,)
    assert one(con, "SELECT count(*) FROM sources WHERE run LIKE '%pending%'") == (0,)


def test_re_ingesting_one_missing_run_of_a_file_keeps_its_line_numbers(con, tmp_path):
    """Same content again with one of its runs (from the middle of the file) gone from the store: only that run's
    rows are inserted, so they cannot be numbered by insert order; each must still carry the line it came from."""
    records = real_lines("llamacpp")
    path = write_jsonl(tmp_path / "requests.jsonl", records)
    ingest_inputs(con, [str(path)])
    (source_id,) = one(con, "SELECT source_id FROM sources WHERE run = 'prefix_cache'")
    src.delete_source(con, source_id)
    again = ingest_inputs(con, [str(path)])
    assert again.runs == ["prefix_cache"] and [s["rows"] for s in again.sources] == [16]
    stored = con.execute("SELECT source_line FROM requests WHERE run = 'prefix_cache' ORDER BY 1").fetchall()
    assert [line for (line,) in stored] == [i for i, r in enumerate(records, 1) if r["run"] == "prefix_cache"]


def test_a_user_profile_can_read_parquet(con, tmp_path):
    import duckdb

    data = tmp_path / "gw.parquet"
    duckdb.execute(f"""COPY (SELECT 'r' || i AS id, TIMESTAMP '2026-11-28 14:00:00' + INTERVAL (i) SECOND AS ts,
        i * 10 AS prompt, CASE WHEN i = 2 THEN 'max_tokens' ELSE 'stop' END AS finish
        FROM range(1, 4) t(i)) TO '{data}' (FORMAT parquet)""")
    profile = _write(tmp_path / "pq.toml", """
name = "gw-parquet"
reader = "parquet"
[detect]
columns = ["id", "ts", "prompt"]
[columns]
request_id = "id"
t_arrival = "ts"
prompt_tokens = "prompt"
finish_reason = "finish"
""")
    report = ingest_inputs(con, [str(data)], profile_file=str(profile), run="p")
    assert report.sources[0]["rows"] == 3
    assert con.execute("SELECT source_line, request_id, t_arrival, prompt_tokens, finish_reason FROM requests "
                       "ORDER BY 1").fetchall() == [
        (1, "r1", datetime(2026, 11, 28, 14, 0, 1), 10, "stop"),
        (2, "r2", datetime(2026, 11, 28, 14, 0, 2), 20, "length"),
        (3, "r3", datetime(2026, 11, 28, 14, 0, 3), 30, "stop")]


def test_crlf_line_ends_keep_line_numbers(con, tmp_path):
    lines = (REAL / "vllm-cpu" / "requests.jsonl").read_text().splitlines()[:3]
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(("\r\n".join([lines[0], "oops", "", lines[1], lines[2]]) + "\r\n").encode())
    report = ingest_inputs(con, [str(path)], run="c")
    assert report.sources[0]["rows"] == 3 and report.sources[0]["bad_lines"] == 1
    assert one(con, "SELECT line, byte_length FROM ingest_errors") == (2, 4)
    assert [r[0] for r in con.execute("SELECT source_line FROM requests ORDER BY 1").fetchall()] == [1, 4, 5]


def test_lines_too_long_or_not_utf8_are_bad_lines_not_a_failed_file(con, tmp_path):
    from servlens.ingest.compiler import MAX_LINE_BYTES

    lines = (REAL / "vllm-cpu" / "requests.jsonl").read_text().splitlines()[:3]
    huge = json.loads(lines[1])
    huge["body"]["padding"] = "x" * (MAX_LINE_BYTES + 10)
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"\n".join([lines[0].encode(), json.dumps(huge).encode(),
                                 b'{"send_ts": 1.0, "body": {"model": "t\xff"}}', lines[2].encode()]) + b"\n")
    report = ingest_inputs(con, [str(path)], run="o")
    assert report.sources[0]["rows"] == 2 and report.sources[0]["bad_lines"] == 2
    assert con.execute("SELECT line, byte_length, reason FROM ingest_errors ORDER BY line").fetchall() == [
        (2, None, "line longer than 8 MiB"), (3, 41, "not UTF-8 text")]
    assert [r[0] for r in con.execute("SELECT source_line FROM requests ORDER BY 1").fetchall()] == [1, 4]


def test_line_numbers_hold_across_buffers_and_threads(con, tmp_path):
    # ~40 MB: many reader buffers, read by several threads; every row must point back at its own line
    lines = (REAL / "llamacpp" / "requests.jsonl").read_text().splitlines()
    path = tmp_path / "big.jsonl"
    with open(path, "w") as handle:
        for copy in range(60):
            for number, line in enumerate(lines):
                record = json.loads(line)
                record["req_idx"] = copy * 1000 + number
                handle.write(json.dumps(record) + "\n")
    con.execute("SET threads = 4")
    report = ingest_inputs(con, [str(path)], run="big")
    assert report.sources[0]["rows"] == 60 * len(lines)
    assert one(con, f"""SELECT count(*) FROM requests WHERE (attrs->>'$.req_idx')::INT
        <> ((source_line - 1) // {len(lines)}) * 1000 + (source_line - 1) % {len(lines)}""") == (0,)


def test_compressed_csv_and_json_documents(con, tmp_path):
    traces = Path(__file__).resolve().parents[1] / "data" / "shared" / "traces"
    (tmp_path / "azure_conv.csv.gz").write_bytes(gzip.compress((traces / "azure_llm_2023_conv_first5000.csv").read_bytes()))
    bench = next((REAL / "vllm-bench" / "random").glob("*.json"))
    (tmp_path / "bench.json.zst").write_bytes(zstandard.ZstdCompressor().compress(bench.read_bytes()))
    report = ingest_inputs(con, [str(tmp_path / "azure_conv.csv.gz"), str(tmp_path / "bench.json.zst")])
    assert [(s["format"], s["run"], s["rows"]) for s in report.sources] == [
        ("azure-llm-trace", "azure_conv", 5000), ("vllm-bench", "bench", 80)]


@pytest.mark.parametrize("keep_text", [False, True])
def test_prefix_key_with_many_messages_and_either_path(con, tmp_path, keep_text):
    chat = next(r for r in real_lines("llamacpp") if r["path"] == "/v1/chat/completions" and r["http_status"] == 200)
    conversations = [
        [{"role": "system", "content": "short"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
         {"role": "user", "content": "again " * 500}],                                  # first two too short: all read
        [{"role": "system", "content": "S" * 1500}, {"role": "user", "content": "U" * 1000},
         {"role": "user", "content": "later"}],                                          # first two are enough
        [{"role": "user", "content": [{"type": "text", "text": "T" * 100}]}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "x"}],                                              # parts, short
        [{"role": "user", "content": "only one"}],
    ]
    records = []
    for messages in conversations:
        record = json.loads(json.dumps(chat))
        record["body"]["messages"] = messages
        records.append(record)
    ingest_inputs(con, [str(write_jsonl(tmp_path / "m.jsonl", records))], run="m", keep_text=keep_text)

    def text(messages):
        def content(c):
            return "".join(p.get("text", f"[{p['type']}]") for p in c) if isinstance(c, list) else (c or "")
        return "\n".join(f"{m['role']}: {content(m['content'])}" for m in messages)

    keys = [r[0] for r in con.execute("SELECT prefix_key FROM requests ORDER BY source_line").fetchall()]
    assert keys == [prefix(text(m)) for m in conversations]
    if keep_text:
        assert [r[0] for r in con.execute("SELECT prompt_text FROM requests ORDER BY source_line").fetchall()] == [
            text(m) for m in conversations]


def test_lines_numbered_by_insert_order_after_other_sources_and_a_replace(con, tmp_path):
    # servlens-loadgen numbers its lines by insert order (row_number() would keep DuckDB on one thread): the
    # numbers must not depend on the rows already in the store, nor on the rows a replaced source left behind.
    from servlens.ingest.compiler import CompileOptions, can_number_by_insert_order
    from servlens.ingest.profiles import get_profile

    options = CompileOptions(path=tmp_path / "x.jsonl")
    assert can_number_by_insert_order(get_profile("servlens-loadgen"), options)
    assert can_number_by_insert_order(get_profile("litellm-slp"), options)  # its windows run after the insert
    assert not can_number_by_insert_order(get_profile("otel-genai-spans"), options)  # many rows a line

    lines = (REAL / "llamacpp" / "requests.jsonl").read_text().splitlines()
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("\n".join(lines[:50]) + "\n")
    second.write_text("\n".join([lines[60], "{oops", lines[61], "", lines[62]]) + "\n")
    ingest_inputs(con, [str(first)], run="a")
    ingest_inputs(con, [str(second)], run="b")

    def numbered() -> list[tuple[int, int]]:
        return con.execute("SELECT source_line, (attrs->>'$.req_idx')::INT FROM requests WHERE run = 'b' "
                           "ORDER BY 1").fetchall()

    idx = [json.loads(line)["req_idx"] for line in lines]
    assert numbered() == [(1, idx[60]), (3, idx[61]), (5, idx[62])]
    assert con.execute("SELECT line FROM ingest_errors ORDER BY 1").fetchall() == [(2,)]
    second.write_text("\n".join(["", lines[63], lines[64]]) + "\n")  # changed content: the source is replaced
    ingest_inputs(con, [str(second)], run="b")
    assert numbered() == [(2, idx[63]), (3, idx[64])]
    assert [r[0] for r in con.execute("SELECT source_line FROM requests WHERE run = 'a' ORDER BY 1").fetchall()] == \
        list(range(1, 51))


@pytest.mark.parametrize("source, fmt", [
    (REAL / "llamacpp" / "requests.jsonl", "servlens-loadgen"),
    (REAL / "vllm-cpu" / "requests.jsonl", "servlens-loadgen"),
    (Path(__file__).resolve().parents[1] / "data" / "gateways" / "litellm_slp_recorded.jsonl", "litellm-slp"),
])
def test_insert_order_numbering_gives_the_same_rows_as_row_number(tmp_path, monkeypatch, source, fmt):
    # The fast path (lines by insert order, [derived] windows after the insert) against the plain one.
    from servlens.ingest import requests as ingest_requests
    from servlens.ingest.compiler import can_number_by_insert_order
    from servlens.store.schema import REQUEST_COLUMNS

    lines = source.read_text().splitlines()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines[:3] + ["{broken", ""] + lines[3:]) + "\n")
    columns = ", ".join(c for c in REQUEST_COLUMNS if c != "source_id")

    def rows(fast: bool) -> list[tuple]:
        monkeypatch.setattr(ingest_requests, "can_number_by_insert_order",
                            can_number_by_insert_order if fast else lambda profile, opts: False)
        con = open_store(None)
        ingest_inputs(con, [str(path)], run="r", from_format=fmt)
        got = con.execute(f"SELECT {columns} FROM requests ORDER BY source_line").fetchall()
        errors = con.execute("SELECT line, reason FROM ingest_errors ORDER BY line").fetchall()
        con.close()
        return got + errors

    fast, plain = rows(True), rows(False)
    assert fast == plain and len(fast) == len(lines) + 1
