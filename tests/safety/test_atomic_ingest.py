"""An ingest call is one transaction (issue 15, classes 3 and 4): a folder ingest killed half-way, failing in a
later file, or hitting a full disk leaves the store exactly as it was, with one sentence saying so; a file that
must be read a second way (a value only try() reads, a CSV dialect spelt out) still ends as one copy of its rows."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.safety.corpus import AZURE_CSV, request_lines, request_record, write_lines, write_requests


def _servlens(tmp_path, *args, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
                          preexec_fn=preexec_fn)


def _store_state(tmp_path) -> tuple:
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                     for table in ("runs", "sources", "requests", "ingest_errors", "metric_samples")) + (
            con.execute("SELECT list(run ORDER BY run) FROM runs").fetchone()[0],)
    finally:
        con.close()


def _one_sentence(done) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    return done.stderr.strip()


def test_a_killed_folder_ingest_leaves_the_store_unchanged(tmp_path):
    assert _servlens(tmp_path, "ingest", str(write_requests(tmp_path / "small.jsonl", 50))).returncode == 0
    before = _store_state(tmp_path)
    folder = tmp_path / "logs"
    for i in range(400):
        write_requests(folder / f"part-{i:03}.jsonl", 1500)
    proc = subprocess.Popen([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "ingest",
                             str(folder), "--run", "folder"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    time.sleep(2)  # into the folder: 400 files take far longer, even on the typed fast path; one file a fraction
    assert proc.poll() is None, "the ingest ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    # Before: every file was its own transaction, and the files done when it died stayed (7,559 of 10,000).
    assert _store_state(tmp_path) == before
    assert _servlens(tmp_path, "runs").returncode == 0


def test_a_folder_failing_in_a_later_file_keeps_none_of_it(tmp_path):
    assert _servlens(tmp_path, "ingest", str(write_requests(tmp_path / "small.jsonl", 50))).returncode == 0
    before = _store_state(tmp_path)
    folder = tmp_path / "logs"
    write_requests(folder / "a.jsonl", 30)
    write_requests(folder / "b.jsonl", 40)
    write_lines(folder / "c.jsonl", request_lines(5) + ["{broken"])
    done = _servlens(tmp_path, "ingest", str(folder), "--strict")
    assert _one_sentence(done).startswith(f"Error: {folder / 'c.jsonl'} has 1 malformed line(s) (first: line 6: ")
    assert _store_state(tmp_path) == before  # a.jsonl and b.jsonl were committed before


def test_a_file_read_again_in_safe_mode_restarts_the_folder_and_is_stored_once(tmp_path):
    con = open_store(":memory:")
    folder = tmp_path / "logs"
    write_requests(folder / "a.jsonl", 7)
    # "yesterday" in send_ts fails a strict cast of the fast path: the file is read again with every value in try()
    write_lines(folder / "b.jsonl", request_lines(4) + [json.dumps(request_record(4, send_ts="yesterday"))])
    write_requests(folder / "c.jsonl", 3)
    report = ingest_inputs(con, [str(folder)], run="r")
    assert [(s["path"].rsplit("/", 1)[1], s["rows"]) for s in report.sources] == [("a.jsonl", 7), ("b.jsonl", 5),
                                                                               ("c.jsonl", 3)]
    assert report.sources[1]["unparsed_times"] == {"t_arrival": 1}
    assert con.execute("SELECT count(*), count(DISTINCT source_id) FROM requests").fetchone() == (15, 3)
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 3
    con.close()


def test_a_csv_read_again_with_its_dialect_spelt_out_in_a_folder(tmp_path):
    con = open_store(":memory:")
    folder = tmp_path / "traces"
    rows = AZURE_CSV.read_text().splitlines()
    write_lines(folder / "a_trace.csv", rows[:101])
    (folder / "b_trace.csv").write_text("\n".join(rows[:201] + ['"2023-11-16 18:25:51.0,1,2']) + "\n")
    report = ingest_inputs(con, [str(folder)], from_format="azure-llm-trace", run="r")
    assert [s["rows"] + s["bad_lines"] for s in report.sources] == [100, 201]
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 2
    assert con.execute("SELECT count(t_arrival) FROM requests").fetchone()[0] == 300
    con.close()


def _file_size_limit(limit: int):
    def apply() -> None:  # RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full disk (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("as_folder", [False, True])
def test_a_full_disk_is_one_sentence_and_the_store_stays_as_it_was(tmp_path, as_folder):
    assert _servlens(tmp_path, "ingest", str(write_requests(tmp_path / "small.jsonl", 50))).returncode == 0
    before = _store_state(tmp_path)
    size = os.path.getsize(tmp_path / "s.duckdb")
    if as_folder:
        target = tmp_path / "logs"
        write_requests(target / "a.jsonl", 200)
        write_requests(target / "b.jsonl", 40_000)
    else:
        target = write_requests(tmp_path / "big.jsonl", 40_000)
    done = _servlens(tmp_path, "ingest", str(target), preexec_fn=_file_size_limit(size + 512 * 1024))
    assert _one_sentence(done) == (
        f"Error: The disk is full or the store reached the file size limit (writing {tmp_path / 's.duckdb'} failed: "
        "file too large): nothing of this ingest was kept and the store holds what it held before. Free some space "
        "(or pass --db a store on another disk) and run the same command again.")
    assert _store_state(tmp_path) == before
    # No trap: with the disk still as full, a small ingest goes through; with space again, the big one does too.
    small = write_requests(tmp_path / "small2.jsonl", 60)
    assert _servlens(tmp_path, "ingest", str(small), preexec_fn=_file_size_limit(size + 512 * 1024)).returncode == 0
    assert _servlens(tmp_path, "ingest", str(target)).returncode == 0
    runs = _store_state(tmp_path)[-1]
    assert runs == (["a", "b", "small", "small2"] if as_folder else ["big", "small", "small2"])


def test_running_out_of_memory_is_one_sentence_saying_what_to_set(tmp_path):
    """DuckDB's limit reached where it cannot spill is the machine's limit, not a traceback nor the rule's fault
    (a rule's SQL error is reported as the rule's: an out-of-memory inside one is not)."""
    assert _servlens(tmp_path, "ingest", str(write_requests(tmp_path / "small.jsonl", 400))).returncode == 0
    done = subprocess.run([sys.executable, "-m", "servlens", "analyze", "--db", str(tmp_path / "s.duckdb"),
                           "--format", "json"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          check=False, env=os.environ | {"SERVLENS_MEMORY_LIMIT": "2MB"})
    sentence = _one_sentence(done)
    assert sentence.startswith("Error: DuckDB ran out of memory (") and sentence.endswith(
        " used). Set SERVLENS_MEMORY_LIMIT higher (e.g. SERVLENS_MEMORY_LIMIT=4GB) and run the command again.")
