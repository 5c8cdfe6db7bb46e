"""`servlens ingest`, `servlens formats` and `servlens runs` run as a user runs them (a subprocess), for success and
for each bad-input path: exit codes and exact messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parent / "data" / "shared" / "real-engine"
TRACES = Path(__file__).resolve().parent / "data" / "shared" / "traces"


def servlens(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servlens", "--db", str(tmp_path / "store.duckdb"), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )


def test_ingest_a_folder_then_list_runs(tmp_path):
    done = servlens(tmp_path, "ingest", str(REAL / "llamacpp"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Store: {tmp_path / 'store.duckdb'}"
    assert lines[1] == ("requests.jsonl  [servlens-loadgen]  runs burst50, fresh_cache, fresh_nocache, poisson, "
                        "prefix_cache, prefix_nocache")
    assert lines[2] == "  174 rows, 0 bad lines, 2026-11-29 07:22:59 → 07:23:51 UTC (52 s)"
    assert lines[3].startswith("  filled: request_id, model, endpoint, stream, t_arrival, t_end, e2e_s, prompt_tokens")
    assert lines[4].startswith("  partly: served_model 98%, provider 98%, t_first_token 63%")
    assert ("9 metrics files  [prometheus-text]  run burst50: 135 samples, 0 bad lines, scrape time from index, "
            "2026-11-29 07:22:59 → 07:23:06 UTC (7.5 s)") in lines
    # the engine's /props reaches the request rows of its folder; its /slots files agree and are listed
    assert ("props.json  [llamacpp-props]  4 slots of 2,048 tokens: applied to the 174 requests of its folder (runs "
            "burst50, fresh_cache, fresh_nocache, poisson, prefix_cache, prefix_nocache; attrs.parallel, context_window)"
            in lines)
    assert "Skipped 11 files:" in lines
    assert ("  llama-server-prefix-fresh.log, llama-server.log: llama.cpp llama-server console log (slot print_timing "
            "lines, relative clock): name the file to read it (llama-server-log)" in lines)
    assert "  models.json, summary.jsonl: no format profile recognises it" in lines
    assert ("  slots_burst50_end.json, slots_fresh_cache_end.json, slots_fresh_nocache_end.json, slots_poisson_end.json, "
            "… (6 files): llama.cpp /slots: 4 slots of 2,048 tokens; agrees with props.json, which is used") in lines

    runs = servlens(tmp_path, "runs")
    assert runs.returncode == 0, runs.stderr
    text = runs.stdout
    assert ("burst50: 1 requests source (servlens-loadgen); 9 metrics sources (prometheus-text); 1 engine_info source "
            "(llamacpp-props)") in text
    assert "  50 requests, 135 metric samples, 0 bad lines" in text
    assert "  2026-11-29 07:22:59 → 07:23:06 UTC (7.5 s)" in text

    document = json.loads(servlens(tmp_path, "runs", "--format", "json").stdout)
    assert [r["run"] for r in document["runs"]] == ["burst50", "fresh_cache", "fresh_nocache", "poisson",
                                                    "prefix_cache", "prefix_nocache"]
    assert document["runs"][0]["requests"] == 50 and document["runs"][0]["columns_filled"]["queue_s"] == 1.0


def test_ingest_json_document(tmp_path):
    bench = next((REAL / "vllm-bench" / "random").glob("*.json"))
    done = servlens(tmp_path, "ingest", "--from", "vllm-bench", str(bench), "--run", "bench-a", "--format", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["kind"] == "ingest" and document["schema_version"] == 2
    source = document["sources"][0]
    assert {k: source[k] for k in ("format", "run", "rows", "bad_lines", "skipped", "t_min", "relative_clock")} == {
        "format": "vllm-bench", "run": "bench-a", "rows": 80, "bad_lines": 0, "skipped": False,
        "t_min": "1970-01-01T00:00:00", "relative_clock": True}
    assert source["columns_filled"]["ttft_s"] == 1.0 and "queue_s" not in source["columns_filled"]
    assert document["skipped"] == [] and document["runs"] == ["bench-a"]
    runs = servlens(tmp_path, "runs").stdout
    assert "  +00:00:00 → +00:00:27.758 (relative clock)" in runs


def test_reingest_says_so_and_adds_nothing(tmp_path):
    trace = str(TRACES / "burstgpt_v1_first400rows.csv")
    assert servlens(tmp_path, "ingest", trace).returncode == 0
    again = servlens(tmp_path, "ingest", trace)
    assert again.returncode == 0
    assert again.stdout.splitlines()[1:] == [
        "burstgpt_v1_first400rows.csv  [burstgpt-trace]  run burstgpt_v1_first400rows",
        "  already ingested: same content in the same run; nothing added (400 rows there)",
    ]


def test_changed_file_replaces_its_rows(tmp_path):
    log = tmp_path / "client.jsonl"
    lines = (REAL / "vllm-cpu" / "requests.jsonl").read_text().splitlines()
    log.write_text("\n".join(lines[:6]) + "\n")
    assert servlens(tmp_path, "ingest", str(log), "--run", "r").returncode == 0
    log.write_text("\n".join(lines[:4]) + "\n")
    done = servlens(tmp_path, "ingest", str(log), "--run", "r")
    assert done.returncode == 0
    assert done.stdout.splitlines()[2].startswith("  replaced the earlier version: 4 rows, 0 bad lines")


def test_malformed_lines_are_counted_and_strict_refuses_them(tmp_path):
    log = tmp_path / "client.jsonl"
    lines = (REAL / "vllm-cpu" / "requests.jsonl").read_text().splitlines()
    log.write_text("\n".join(lines[:3] + ['{"send_ts": 1795937383.1, "body": {'] + lines[3:5]) + "\n")
    done = servlens(tmp_path, "ingest", str(log), "--run", "r")
    assert done.returncode == 0
    assert done.stdout.splitlines()[2].startswith("  5 rows, 1 bad lines,")
    assert ("  bad lines are kept in ingest_errors (first: line 4: invalid JSON: the line ends before the value does "
            "(truncated?)); --strict makes them an error") in done.stdout.splitlines()

    strict = servlens(tmp_path, "ingest", str(log), "--run", "strict-run", "--strict")
    assert strict.returncode == 2
    assert strict.stderr == (
        f"Error: {log} has 1 malformed line(s) (first: line 4: invalid JSON: the line ends before the value does "
        "(truncated?)); --strict keeps nothing from it. Fix the lines, or drop --strict to ingest the good lines and "
        "keep the bad ones in ingest_errors.\n")
    assert "strict-run" not in servlens(tmp_path, "runs").stdout


def test_unknown_format_exits_2_naming_the_formats(tmp_path):
    models = REAL / "llamacpp" / "models.json"
    done = servlens(tmp_path, "ingest", str(models))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"Error: {models} is not in a format servlens knows (no format profile recognises it). Known formats: "
        + _others() + "plus Prometheus text/OpenMetrics and query_range JSON; name "
        "one with --from NAME or describe yours with --profile FILE (docs/profiles.md).\n")


def _others() -> str:
    from servlens.ingest.profiles import builtin_profiles

    names = [p.name for p in builtin_profiles()]
    return "".join(f"{n}, " for n in names)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope.jsonl"], "Error: No such file or folder: nope.jsonl. Check the path.\n"),
        (["missing/*.jsonl"], "Error: No file matches 'missing/*.jsonl'. Check the pattern, or quote it so the shell "
                              "does not expand it.\n"),
        (["--from", "vllm-bnch", "x.jsonl"], "Error: No format profile named 'vllm-bnch'. Did you mean 'vllm-bench'? "
                                             "Known formats: @ALL@ (see 'servlens formats').\n"),
        (["--profile", "none.toml", "x.jsonl"], "Error: No profile file at none.toml. Check the path given to --profile.\n"),
        (["--tz", "Mars/Olympus", "x.jsonl"], "Error: --tz 'Mars/Olympus' is not a time zone. Use an IANA name such as "
                                              "UTC or America/Los_Angeles.\n"),
        (["--start", "yesterday", "x.jsonl"], "Error: --start 'yesterday' is not a time. Give an ISO-8601 time such as "
                                              "2026-11-28T14:00:00Z.\n"),
        ([], "Error: Nothing to ingest. Name files, folders or globs.\n"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(tmp_path, args, message):
    (tmp_path / "x.jsonl").write_text((REAL / "vllm-cpu" / "requests.jsonl").read_text().splitlines()[0] + "\n")
    done = servlens(tmp_path, "ingest", *args)
    assert done.returncode == 2
    from servlens.ingest.profiles import builtin_profiles

    assert done.stderr == message.replace("@ALL@", ", ".join(p.name for p in builtin_profiles()))
    assert "Traceback" not in done.stderr


def test_formats_lists_every_profile_and_what_it_fills(tmp_path):
    done = servlens(tmp_path, "formats")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "Request-log formats (servlens ingest --from NAME):"
    index = lines.index("vllm-bench  [json, relative clock]")
    assert lines[index + 2] == ("  fills: request_id, model, stream, t_arrival, t_first_token, t_end, ttft_s, tpot_s, "
                                "decode_s, e2e_s, prompt_tokens, completion_tokens, status, error_message, "
                                "content_empty, attrs")
    assert "mooncake-trace  [jsonl, relative clock]" in lines
    assert "azure-llm-trace  [csv, naive clock]" in lines
    assert "prometheus-text  Prometheus text exposition 0.0.4 scrape (one file per scrape; .prom/.txt, .gz/.zst)" in lines
    document = json.loads(servlens(tmp_path, "formats", "--format", "json").stdout)
    by_name = {f["name"]: f for f in document["formats"]}
    assert by_name["servlens-loadgen"]["reader"] == "jsonl"
    assert "queue_s" in by_name["servlens-loadgen"]["columns"]


def test_runs_on_an_empty_or_missing_store(tmp_path):
    done = servlens(tmp_path, "runs")
    assert done.returncode == 2
    assert done.stderr == (f"Error: No store at {tmp_path / 'store.duckdb'}. Ingest something first with "
                           "'servlens ingest', or pass --db.\n")


def test_help_has_examples(tmp_path):
    for command in ("ingest", "formats", "runs"):
        done = servlens(tmp_path, command, "-h")
        assert done.returncode == 0 and "Example:" in done.stdout


def test_metrics_option_reads_scrapes_and_skips_the_rest(tmp_path):
    bench = REAL / "vllm-bench" / "random"
    done = servlens(tmp_path, "ingest", "--metrics", str(bench), "--run", "before", "--format", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert [(s["kind"], s["format"], s["run"]) for s in document["sources"]] == [("metrics", "prometheus-text", "before")]
    reasons = {Path(s["path"]).name: s["reason"] for s in document["skipped"]}
    assert reasons[next(bench.glob("*.json")).name] == "not a Prometheus scrape, OpenMetrics file or query_range JSON"


# A format forced onto a file of another shape: one sentence naming what is missing and what to do, nothing stored.
SAMPLE_REQUESTS = Path(__file__).resolve().parents[1] / "sample_logs" / "steady-a" / "requests.jsonl"
BURSTGPT = TRACES / "burstgpt_v1_first400rows.csv"
SCRAPE = SAMPLE_REQUESTS.parent / "metrics_steady_a_000.prom"
_DETECT = "It looks like {0}: leave out --from to detect it, or name that format.\n"
_NAME_ONE = ("Name the format that fits with --from NAME (see 'servlens formats'), or describe yours with --profile FILE "
             "(docs/profiles.md).\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "litellm-spendlogs-csv", str(SAMPLE_REQUESTS)],
         f"Error: {SAMPLE_REQUESTS} is not in the litellm-spendlogs-csv format: JSON lines, but the litellm-spendlogs-csv "
         "profile reads CSV. " + _DETECT.format("servlens-loadgen")),
        (["--from", "servlens-loadgen", str(BURSTGPT)],
         f"Error: {BURSTGPT} is not in the servlens-loadgen format: CSV, but the servlens-loadgen profile reads JSON "
         "lines. " + _DETECT.format("burstgpt-trace")),
        (["--from", "azure-llm-trace", str(BURSTGPT)],
         f"Error: {BURSTGPT} is not in the azure-llm-trace format: missing the column(s) the azure-llm-trace profile "
         "needs: TIMESTAMP, ContextTokens, GeneratedTokens (it has: Timestamp, Model, Request tokens, Response tokens, "
         "Total tokens, Log Type). " + _DETECT.format("burstgpt-trace")),
        (["--from", "vllm-bench", str(SAMPLE_REQUESTS)],
         f"Error: {SAMPLE_REQUESTS} is not in the vllm-bench format: none of its first 50 record(s) has the field(s) the "
         "vllm-bench profile requires: $.ttfts, $.input_lens, $.output_lens, $.start_times. "
         + _DETECT.format("servlens-loadgen")),
        (["--from", "servlens-loadgen", "notes.txt"],
         "Error: @TMP@/notes.txt is not in the servlens-loadgen format: plain text, not JSON or CSV, but the "
         "servlens-loadgen profile reads JSON lines. " + _NAME_ONE),
        (["--from", "servlens-loadgen", str(SCRAPE)],
         f"Error: {SCRAPE} is not in the servlens-loadgen format: plain text, not JSON or CSV, but the "
         "servlens-loadgen profile reads JSON lines. It looks like metrics (prometheus-text): leave out --from to read "
         "it as metrics.\n"),
        # a CSV without a .csv suffix is read as asked; its header lacks what the profile reads
        (["--from", "litellm-spendlogs-csv", "burstgpt.txt"],
         "Error: @TMP@/burstgpt.txt has no column \"status\", which the built-in profile litellm-spendlogs-csv reads. "
         + _NAME_ONE),
    ],
)
def test_forced_format_on_another_shape_exits_2_with_one_sentence(tmp_path, args, message):
    (tmp_path / "notes.txt").write_text("not a log\n")
    (tmp_path / "burstgpt.txt").write_text("\n".join(BURSTGPT.read_text().splitlines()[:5]) + "\n")
    done = servlens(tmp_path, "ingest", *args)
    assert done.returncode == 2, done.stdout
    assert done.stderr == message.replace("@TMP@", str(tmp_path.resolve()))
    assert "Traceback" not in done.stderr and "Binder Error" not in done.stderr
    runs = servlens(tmp_path, "runs", "--format", "json")
    assert json.loads(runs.stdout)["runs"] == []  # nothing stored


def test_forced_format_on_a_folder_skips_the_files_of_other_shapes(tmp_path):
    folder = Path(__file__).resolve().parents[1] / "sample_logs" / "steady-a"
    done = servlens(tmp_path, "ingest", "--from", "litellm-spendlogs-csv", str(folder), "--format", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    skipped = {Path(s["path"]).name: s["reason"] for s in document["skipped"]}
    assert skipped["requests.jsonl"] == ("not readable as litellm-spendlogs-csv: JSON lines, but the "
                                         "litellm-spendlogs-csv profile reads CSV")
    assert skipped["README.md"] == "not readable as litellm-spendlogs-csv: plain text, not JSON or CSV"
    assert [s["kind"] for s in document["sources"]] == ["metrics"] * 21
