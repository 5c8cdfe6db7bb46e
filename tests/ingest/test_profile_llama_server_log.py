"""llama-server console log, read by the line reader, checked against the client's record of the same requests.

Both files are servlens' recordings of one real llama-server run (tests/data/shared/real-engine/llamacpp): the
log's print_timing lines and the `timings` each response carried must agree request for request.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from servlens.errors import ConfigError
from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.ingest.format_rows import ingest_rows, sniffed_name

REAL = Path(__file__).resolve().parents[1] / "data" / "shared" / "real-engine" / "llamacpp"
LOG = REAL / "llama-server.log"


@pytest.fixture(scope="module")
def log_rows():
    source, rows, _ = ingest_rows(LOG, order="t_arrival")
    return source, rows


def test_one_row_per_task_relative_clock(log_rows):
    assert sniffed_name(LOG) == "llama-server-log"
    source, rows = log_rows
    assert (source["format"], source["rows"], source["bad_lines"], source["relative_clock"]) == (
        "llama-server-log", 138, 0, True)
    first = rows[0]
    # "0.00.467.377 ... launch_slot_ ... task 4" .. "0.00.763.319 ... total time = 295.65 ms / 25 tokens"
    task4 = next(r for r in rows if r["request_id"] == "task-4")
    assert task4["t_arrival"] == datetime(1970, 1, 1, 0, 0, 0, 467377)
    assert task4["t_end"] == datetime(1970, 1, 1, 0, 0, 0, 763319)
    assert task4["e2e_s"] == pytest.approx(0.763319 - 0.467377)
    assert (task4["prefill_s"], task4["decode_s"]) == (pytest.approx(0.20421), pytest.approx(0.09144))
    assert (task4["prompt_tokens"], task4["cached_tokens"], task4["completion_tokens"]) == (9, 0, 16)
    assert task4["ttft_s"] is None and task4["queue_s"] is None  # the wait for a slot is not in the log
    assert first["attrs"]["slot"] is not None
    # "0.01.012.631": minutes.seconds.ms.us
    assert next(r for r in rows if r["request_id"] == "task-3")["t_end"] == datetime(1970, 1, 1, 0, 0, 1, 12690)


def test_the_log_agrees_with_the_clients_record_of_the_same_requests(log_rows):
    _, rows = log_rows
    from_log = Counter((round(r["prefill_s"] * 1000, 2), r["completion_tokens"], r["cached_tokens"], r["prompt_tokens"])
                       for r in rows)
    from_client = Counter()
    for line in (REAL / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        timings = (record.get("response") or record.get("stream_final_chunk") or {}).get("timings")
        if timings:
            from_client[(round(timings["prompt_ms"], 2), timings["predicted_n"], timings["cache_n"],
                         timings["cache_n"] + timings["prompt_n"])] += 1
    # every task in this log is one of the client's requests (the others ran against llama-server-prefix-fresh.log)
    assert sum((from_log & from_client).values()) == 138 == sum(from_log.values())
    assert sum(1 for key in from_log if key[2] > 0) > 0  # prefix-cache hits are among them


def test_a_console_log_in_a_folder_is_listed_not_read(tmp_path):
    (tmp_path / "llama-server.log").write_text(LOG.read_text())
    (tmp_path / "ollama.jsonl").write_text((REAL.parents[2] / "formats" / "ollama" / "ollama-chat.jsonl").read_text())
    report = ingest_inputs(open_store(None), [str(tmp_path)], run="t")
    assert report.skipped == [{"path": str(tmp_path / "llama-server.log"), "reason": (
        "llama.cpp llama-server console log (slot print_timing lines, relative clock): name the file to read it "
        "(llama-server-log)")}]


def test_a_lines_pattern_needs_named_captures(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("name = 'x'\nreader = 'lines'\n[lines]\npatterns = ['^(\\\\d+) ok']\n")
    with pytest.raises(ConfigError, match="has no named capture"):
        ingest_inputs(open_store(None), [str(LOG)], profile_file=str(profile))
