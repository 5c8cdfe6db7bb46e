"""Request-log ingest of every real file in tests/data/shared, with values checked against what the engines and the
trace authors report (README files beside the data)."""

from __future__ import annotations

import json
import math
from datetime import datetime

import pytest

from servlens.ingest.api import ingest_inputs

REAL = "real-engine"


def q(con, sql, params=None):
    return con.execute(sql, params or []).fetchall()


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp client log (servlens-loadgen)


def test_llamacpp_log_splits_into_its_runs_with_every_line(con, shared_data):
    report = ingest_inputs(con, [str(shared_data / REAL / "llamacpp" / "requests.jsonl")])
    source = report.sources[0]
    assert source["format"] == "servlens-loadgen"
    assert source["rows"] == 174 and source["bad_lines"] == 0
    assert report.runs == ["burst50", "fresh_cache", "fresh_nocache", "poisson", "prefix_cache", "prefix_nocache"]
    assert q(con, "SELECT run, count(*) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("burst50", 50), ("fresh_cache", 16), ("fresh_nocache", 16), ("poisson", 60), ("prefix_cache", 16),
        ("prefix_nocache", 16),
    ]
    # one sources row per run of the file, all pointing at the same path
    assert one(con, "SELECT count(*), count(DISTINCT path) FROM sources") == (6, 1)


def test_llamacpp_prompt_is_cache_n_plus_prompt_n_and_prefill_excludes_the_queue(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "llamacpp" / "requests.jsonl")])
    # usage.prompt_tokens == timings.cache_n + timings.prompt_n on every answered request; cached == cache_n
    assert one(con, """SELECT count(*) FROM requests WHERE attrs->>'$.llamacpp_cache_n' IS NOT NULL
        AND prompt_tokens = (attrs->>'$.llamacpp_cache_n')::INT + (attrs->>'$.llamacpp_prompt_n')::INT
        AND cached_tokens = (attrs->>'$.llamacpp_cache_n')::INT""") == (170,)
    # a non-streamed chat request (line 2): prefill = timings.prompt_ms, decode = predicted_ms, no client TTFT
    row = one(con, """SELECT request_id, prompt_tokens, cached_tokens, prefill_s, decode_s, e2e_s, ttft_s, tpot_s,
        completion_tokens, stream, provider FROM requests WHERE source_line = 2""")
    assert row[:3] == ("chatcmpl-xgW9b0PeAjpoPppsCSNRlyxWEDhmq3RO", 266, 0)
    assert row[3] == pytest.approx(0.204553) and row[4] == pytest.approx(0.090608) and row[5] == pytest.approx(0.34611)
    assert row[6] is None  # never TTFT from e2e
    assert row[7] == pytest.approx(0.090608 / 15)
    assert row[8:] == (16, False, "llama.cpp")
    # burst50: 50 requests on 4 slots; the client waited ~3.4 s at the median, prefill itself took < 0.1 s
    queue, prefill, ttft = one(con, """SELECT median(queue_s), median(prefill_s), median(ttft_s) FROM requests
        WHERE run = 'burst50' AND stream AND status = 'ok'""")
    assert queue == pytest.approx(3.408804, abs=1e-6) and prefill == pytest.approx(0.084473, abs=1e-6)
    assert ttft == pytest.approx(3.795861, abs=1e-6)
    assert one(con, "SELECT count(*) FROM requests WHERE ttft_s < prefill_s") == (0,)


def test_llamacpp_context_errors_are_errors_with_their_numbers(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "llamacpp" / "requests.jsonl")])
    rows = q(con, """SELECT source_line, run, http_status, error_type, prompt_tokens, context_window, finish_reason,
        finish_reason_raw, completion_tokens FROM requests WHERE status = 'error' ORDER BY source_line""")
    assert [r[0] for r in rows] == [51, 58, 89, 98]
    assert {r[1:4] for r in rows} == {("poisson", 400, "exceed_context_size_error")}
    assert [r[4] for r in rows] == [2329, 2330, 2307, 2332]
    assert {r[5:] for r in rows} == {(2048, "error", None, None)}
    assert q(con, "SELECT finish_reason, count(*) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("error", 4), ("length", 105), ("stop", 65),
    ]


def test_llamacpp_streams_without_a_content_chunk_have_no_ttft(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "llamacpp" / "requests.jsonl")])
    assert one(con, "SELECT count(*), count(ttft_s) FROM requests WHERE NOT stream") == (52, 0)
    # 120 answered streams; in 10 the first sampled token ended the turn: no content chunk, so no TTFT
    assert one(con, "SELECT count(*), count(ttft_s) FROM requests WHERE stream AND status = 'ok'") == (120, 110)


def test_shared_prefix_gives_one_prefix_key_and_the_cache_shows_in_cached_tokens(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "llamacpp" / "requests.jsonl")])
    assert q(con, """SELECT run, count(DISTINCT prefix_key), sum(cached_tokens), sum(prompt_tokens) FROM requests
        WHERE run LIKE '%cache' GROUP BY 1 ORDER BY 1""") == [
        ("fresh_cache", 1, 14602, 17125), ("fresh_nocache", 1, 0, 17121),
        ("prefix_cache", 1, 16688, 17126), ("prefix_nocache", 1, 0, 17133),
    ]
    assert one(con, "SELECT count(DISTINCT prefix_key) FROM requests WHERE run = 'burst50'") == (50,)
    # text is not stored by default
    assert one(con, "SELECT count(prompt_text), count(content_text), count(reasoning_text) FROM requests") == (0, 0, 0)


# ---------------------------------------------------------------------------------------------------------------
# vLLM client log with per-request metrics


def test_vllm_metrics_give_queue_and_prefill_and_the_client_ttft_covers_both(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "vllm-cpu" / "requests.jsonl")])
    assert q(con, "SELECT run, count(*) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("burst50", 50), ("noprefixcaching_nocache", 16), ("poisson", 60), ("prefix_cache", 16),
    ]
    row = one(con, """SELECT queue_s, prefill_s, ttft_s, decode_s, e2e_s, tpot_s, reasoning_tokens, cached_tokens,
        provider FROM requests WHERE request_id = 'chatcmpl-b3be19a883e69ef2'""")
    assert row[0] == pytest.approx(2.3478320730000632) and row[1] == pytest.approx(0.02438816299991231)
    assert row[2] == pytest.approx(2.49699) and row[3] == pytest.approx(0.3320172440000988)
    assert row[4] == pytest.approx(2.829005) and row[5] == pytest.approx(0.3320172440000988 / 31)
    assert row[6:] == (None, 0, "vllm")  # completion_tokens_details is null: reasoning unknown, not 0
    # time_to_first_token_ms excludes queue_time_ms: the client's TTFT is queue + prefill + a small overhead
    n, low, mid = one(con, """SELECT count(*), min(ttft_s - queue_s - prefill_s), median(ttft_s - queue_s - prefill_s)
        FROM requests WHERE stream AND ttft_s IS NOT NULL""")
    assert n == 80 and low > 0 and mid == pytest.approx(0.012563, abs=1e-5)


def test_vllm_prefix_cache_only_in_the_cached_run(con, shared_data):
    ingest_inputs(con, [str(shared_data / REAL / "vllm-cpu" / "requests.jsonl")])
    assert q(con, "SELECT run, sum(cached_tokens) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("burst50", 0), ("noprefixcaching_nocache", 0), ("poisson", 0), ("prefix_cache", 13440),
    ]
    assert one(con, "SELECT count(*) FROM requests WHERE status = 'error' AND error_type = 'BadRequestError'") == (4,)


# ---------------------------------------------------------------------------------------------------------------
# vllm bench serve


@pytest.mark.parametrize("folder", ["random", "prefix_repetition", "random_burstiness0.5", "random_burstiness0.5_seed1"])
def test_vllm_bench_lists_become_rows_in_seconds_matching_the_ms_aggregates(con, shared_data, folder):
    path = next((shared_data / REAL / "vllm-bench" / folder).glob("*.json"))
    document = json.loads(path.read_text())
    report = ingest_inputs(con, [str(path)])
    source = report.sources[0]
    assert source["format"] == "vllm-bench" and source["rows"] == 80 and source["relative_clock"] is True
    n, prompt, completion, ttft_p50, e2e_p50, tpot_mean, first = one(con, """SELECT count(*), sum(prompt_tokens),
        sum(completion_tokens), median(ttft_s), median(e2e_s), avg(tpot_s), min(t_arrival) FROM requests""")
    assert (n, prompt, completion) == (80, document["total_input_tokens"], document["total_output_tokens"])
    # per-request seconds against the document's own millisecond aggregates
    assert ttft_p50 * 1000 == pytest.approx(document["median_ttft_ms"], rel=1e-9)
    assert e2e_p50 * 1000 == pytest.approx(document["median_e2el_ms"], rel=1e-9)
    assert tpot_mean * 1000 == pytest.approx(document["mean_tpot_ms"], rel=1e-9)
    # perf_counter start times become a relative clock starting at +0
    assert first == datetime(1970, 1, 1)
    span = (max(document["start_times"]) - min(document["start_times"]))
    last = one(con, "SELECT max(t_arrival) FROM requests")[0]
    assert (last - first).total_seconds() == pytest.approx(span, abs=1e-6)
    # the client's --max-concurrency wait is not the engine's queue
    assert one(con, "SELECT count(queue_s), count(attrs->>'$.client_queue_s') FROM requests") == (0, 80)
    assert one(con, "SELECT relative_clock FROM runs")[0] is True


def test_vllm_bench_ttft_plus_itls_is_the_latency(con, shared_data):
    path = next((shared_data / REAL / "vllm-bench" / "random").glob("*.json"))
    ingest_inputs(con, [str(path)])
    # decode = latency - ttft; the saved itls add up to it exactly (README: ttft + sum(itl) == latency)
    document = json.loads(path.read_text())
    decodes = [lat - ttft for lat, ttft in zip(document["latencies"], document["ttfts"])]
    stored = [r[0] for r in q(con, "SELECT decode_s FROM requests ORDER BY (attrs->>'$.index')::INT")]
    assert stored == pytest.approx(decodes, abs=1e-9)
    assert [sum(i) for i in document["itls"]] == pytest.approx(decodes, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# public traces


def test_mooncake_trace_rows_and_prefix_blocks(con, shared_data):
    report = ingest_inputs(con, [str(shared_data / "traces" / "mooncake_fast25_synthetic_trace.jsonl")])
    assert report.sources[0]["format"] == "mooncake-trace"
    assert report.sources[0]["rows"] == 3993 and report.sources[0]["relative_clock"] is True
    assert one(con, "SELECT prompt_tokens, completion_tokens, t_arrival FROM requests WHERE source_line = 1") == (
        40160, 6, datetime(1970, 1, 1))
    assert one(con, "SELECT max(t_arrival) FROM requests") == (datetime(1970, 1, 1, 0, 17, 2, 25000),)
    # len(hash_ids) == ceil(input_length / 512) on every row, kept as attrs.prefix_blocks
    assert one(con, """SELECT count(*) FROM requests
        WHERE json_array_length(attrs->'$.prefix_blocks') = ceil(prompt_tokens / 512)""") == (3993,)
    # requests that start with the same 512-token block share a prefix_key
    blocks = one(con, "SELECT count(DISTINCT attrs->>'$.prefix_blocks[0]') FROM requests")[0]
    assert one(con, "SELECT count(DISTINCT prefix_key) FROM requests") == (blocks,)
    assert one(con, "SELECT count(ttft_s), count(e2e_s) FROM requests") == (0, 0)  # no latencies in a trace


def test_azure_trace_keeps_sub_second_times_and_reads_naive_times_as_utc(con, shared_data):
    path = str(shared_data / "traces" / "azure_llm_2023_conv_first5000.csv")
    report = ingest_inputs(con, [path])
    assert report.sources[0]["format"] == "azure-llm-trace" and report.sources[0]["rows"] == 5000
    # 2023-11-16 18:15:46.6805900 (7 fractional digits) -> microseconds kept
    assert one(con, "SELECT t_arrival, prompt_tokens, completion_tokens FROM requests WHERE source_line = 2") == (
        datetime(2023, 11, 16, 18, 15, 46, 680590), 374, 44)
    # every sub-second part survives, to the microsecond, computed here independently from the text
    import csv

    with open(path, newline="") as handle:
        expected = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in csv.DictReader(handle)]
    stored = [r[0] for r in q(con, "SELECT t_arrival FROM requests ORDER BY source_line")]
    assert stored == expected
    assert sum(1 for t in stored if t.microsecond) == sum(1 for t in expected if t.microsecond) > 4900


def test_azure_trace_with_tz(con, shared_data):
    path = str(shared_data / "traces" / "azure_llm_2023_conv_first5000.csv")
    ingest_inputs(con, [path], tz="America/Los_Angeles", run="pst")
    # November: PST is UTC-8
    assert one(con, "SELECT t_arrival FROM requests WHERE source_line = 2") == (datetime(2023, 11, 17, 2, 15, 46, 680590),)
    assert one(con, "SELECT tz, relative_clock FROM runs WHERE run = 'pst'") == ("America/Los_Angeles", False)


def test_burstgpt_all_zero_token_rows_are_failures(con, shared_data):
    report = ingest_inputs(con, [str(shared_data / "traces" / "burstgpt_v1_first400rows.csv")])
    assert report.sources[0]["format"] == "burstgpt-trace" and report.sources[0]["rows"] == 400
    assert q(con, "SELECT status, count(*), count(prompt_tokens), count(completion_tokens) FROM requests GROUP BY 1 ORDER BY 1") == [
        ("error", 17, 0, 0), ("ok", 383, 383, 383)]
    assert one(con, "SELECT t_arrival, model, prompt_tokens, completion_tokens, attrs->>'$.log_type' FROM requests "
                    "WHERE source_line = 2") == (datetime(1970, 1, 1, 0, 0, 5), "ChatGPT", 472, 18, "Conversation log")
    assert q(con, "SELECT model, count(*) FROM requests GROUP BY 1 ORDER BY 1") == [("ChatGPT", 320), ("GPT-4", 80)]


def test_relative_clock_with_start(con, shared_data):
    ingest_inputs(con, [str(shared_data / "traces" / "burstgpt_v1_first400rows.csv")], start="2026-11-28T14:00:00Z",
                  run="burst")
    assert one(con, "SELECT min(t_arrival) FROM requests") == (datetime(2026, 11, 28, 14, 0, 5),)
    assert one(con, "SELECT relative_clock FROM runs") == (False,)


# ---------------------------------------------------------------------------------------------------------------
# folders: requests and metrics together, the rest listed


def test_llamacpp_folder_ingests_requests_and_metrics_and_lists_the_rest(con, shared_data):
    report = ingest_inputs(con, [str(shared_data / REAL / "llamacpp")])
    document = report.to_dict()
    assert document["kind"] == "ingest" and document["schema_version"] == 2
    kinds = [s["kind"] for s in document["sources"]]
    assert kinds.count("requests") == 1 and kinds.count("metrics") == 38 and kinds.count("engine_info") == 1
    skipped = {item["path"].rsplit("/", 1)[-1]: item["reason"] for item in document["skipped"]}
    assert skipped["llama-server.log"] == ("llama.cpp llama-server console log (slot print_timing lines, relative "
                                           "clock): name the file to read it (llama-server-log)")
    assert skipped["summary.jsonl"] == "no format profile recognises it"
    assert skipped["metrics_index.jsonl"] == "scrape index: used for the scrape files' times and runs"
    assert skipped["slots_poisson_end.json"] == ("llama.cpp /slots: 4 slots of 2,048 tokens; agrees with props.json, "
                                                 "which is used")
    assert len(skipped) == 11
    # the scrapes land in the same runs as the requests (the index names them); props.json applies to all six
    assert q(con, "SELECT run, count(DISTINCT kind) FROM sources GROUP BY 1 ORDER BY 1") == [
        ("burst50", 3), ("fresh_cache", 3), ("fresh_nocache", 3), ("poisson", 3), ("prefix_cache", 3),
        ("prefix_nocache", 3),
    ]


def test_vllm_bench_folder_ingests_the_result_and_its_scrape(con, shared_data):
    report = ingest_inputs(con, [str(shared_data / REAL / "vllm-bench" / "random")], run="bench-a")
    formats = sorted(s["format"] for s in report.sources)
    assert formats == ["prometheus-text", "vllm-bench"]
    assert report.runs == ["bench-a"]
    skipped = sorted(item["path"].rsplit("/", 1)[-1] for item in report.skipped)
    assert skipped == ["bench_stdout.log", "cmd.txt", "run_info.txt"]


def test_every_real_request_file_is_recognised(con, shared_data):
    files = [
        shared_data / REAL / "llamacpp" / "requests.jsonl",
        shared_data / REAL / "vllm-cpu" / "requests.jsonl",
        *sorted((shared_data / REAL / "vllm-bench").glob("*/*.json")),
        *sorted((shared_data / "traces").iterdir()),
    ]
    report = ingest_inputs(con, [str(f) for f in files])
    assert [s["rows"] for s in report.sources] == [174, 142, 80, 80, 80, 80, 5000, 400, 3993]
    assert report.bad_lines == 0
    assert one(con, "SELECT count(*) FROM requests") == (174 + 142 + 320 + 5000 + 400 + 3993,)
    assert not math.isnan(one(con, "SELECT avg(e2e_s) FROM requests")[0])
