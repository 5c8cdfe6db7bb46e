"""Tracebacks that remain (issue 15, classes 8, 10 and 11): files that are not what they say, outputs that cannot
be written, stores that cannot be opened, Ctrl-C. Each is one sentence on stderr and exit 2 (130 for Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.safety.corpus import write_lines, write_requests


def _servlens(tmp_path, *args, db="s.duckdb", timeout=120):
    return subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / db), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=timeout, check=False)


def _one_sentence(done, exit_code=2) -> str:
    assert done.returncode == exit_code, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    return done.stderr.strip()


def test_a_zst_that_is_really_gzip_is_one_sentence(tmp_path):
    fake = write_requests(tmp_path / "log.jsonl.zst", 5, compress=True)
    assert _one_sentence(_servlens(tmp_path, "ingest", str(fake))) == (
        f"Error: {fake} is named as zstd but holds gzip data. Rename it to match its content, or recompress it.")


def test_a_folder_lists_what_is_not_a_regular_file(tmp_path):
    folder = tmp_path / "logs"
    write_requests(folder / "good.jsonl", 4)
    write_requests(folder / "fake.jsonl.zst", 2, compress=True)
    os.symlink("nowhere", folder / "dangling.jsonl")
    os.symlink("loop2", folder / "loop1")
    os.symlink("loop1", folder / "loop2")
    os.mkfifo(folder / "pipe.jsonl")
    done = _servlens(tmp_path, "ingest", str(folder))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  4 rows, 0 bad lines, 2026-11-29 07:22:59 → 07:23:02 UTC (3.5 s)" in lines
    assert "Skipped 5 files:" in lines
    for text in ("  fake.jsonl.zst: named as zstd but holds gzip data", "  dangling.jsonl: a symbolic link to nothing (nowhere)",
                 "  loop1, loop2: a symbolic link loop", "  pipe.jsonl: a FIFO (named pipe)"):
        assert text in lines


@pytest.mark.parametrize("kind", ["fifo", "loop", "dangling"])
def test_naming_a_file_that_is_not_a_regular_file_says_what_it_is(tmp_path, kind):
    path = tmp_path / "x.jsonl"
    what = {"fifo": "a FIFO (named pipe)", "loop": "a symbolic link loop", "dangling": "a symbolic link to nothing (gone)"}
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        os.symlink(path, path)
    else:
        os.symlink("gone", path)
    assert _one_sentence(_servlens(tmp_path, "ingest", str(path))) == (
        f"Error: {path} is {what[kind]}, not a file servlens can read. Name a regular file or a folder.")


def test_db_pointing_at_a_fifo_is_refused_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "store.fifo")
    assert _one_sentence(_servlens(tmp_path, "runs", db="store.fifo", timeout=30)) == (
        f"Error: The store {tmp_path / 'store.fifo'} is a FIFO (named pipe), not a DuckDB file. Pass --db FILE.")


def test_a_new_store_under_a_file_is_one_sentence(tmp_path):
    log = write_requests(tmp_path / "log.jsonl", 3)
    assert _one_sentence(_servlens(tmp_path, "ingest", str(log), db="log.jsonl/s.duckdb")) == (
        f"Error: Cannot create the store {tmp_path / 'log.jsonl/s.duckdb'}: {log} is not a folder. "
        "Pass --db with a folder that exists.")


@pytest.mark.parametrize("target", ["parent_is_file", "dev_full", "name_too_long", "no_such_root"])
def test_every_out_write_error_is_one_sentence(tmp_path, target):
    log = write_requests(tmp_path / "log.jsonl", 3)
    assert _servlens(tmp_path, "ingest", str(log)).returncode == 0
    out = {"parent_is_file": str(log / "x.txt"), "dev_full": "/dev/full", "name_too_long": "a" * 300 + ".txt",
           "no_such_root": "/proc/none/x.txt"}[target]
    if target == "dev_full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    sentence = _one_sentence(_servlens(tmp_path, "runs", "--out", out))
    assert sentence.startswith(f"Error: Cannot write {out}: ") and sentence.endswith("Pass --out with a writable path.")


def test_an_out_of_range_prometheus_timestamp_is_that_lines_error(tmp_path):
    scrape = write_lines(tmp_path / "m.prom", ["# TYPE x gauge", "x 1 99999999999999999999", "x 2 1795936979000"])
    done = _servlens(tmp_path, "ingest", "--metrics", str(scrape))
    assert done.returncode == 0, done.stderr
    assert "1 samples, 1 bad lines" in done.stdout


def test_ctrl_c_exits_130_quietly_and_leaves_the_store_unchanged(tmp_path):
    small = write_requests(tmp_path / "small.jsonl", 3)
    big = write_requests(tmp_path / "big.jsonl", 400_000)
    assert _servlens(tmp_path, "ingest", str(small)).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "ingest", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    time.sleep(3)  # into the ingest (a 400k-line file takes well over 3 s here)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    runs = _servlens(tmp_path, "runs", "--format", "json")
    assert '"run": "small"' in runs.stdout and '"run": "big"' not in runs.stdout
