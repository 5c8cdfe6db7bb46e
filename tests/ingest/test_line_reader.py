"""Every line of a JSON-lines file is read, at every read-buffer boundary, whatever its line endings.

DuckDB's CSV reader, used as a line splitter, once dropped the line after a line break that fell on the first byte
of a read buffer (new_line='\\r\\n' on a \\n file): 100,000 requests became 99,999 rows with "0 bad lines". The
small-buffer test puts a line break on every byte around a boundary; the ingest test builds a file larger than the
real 16 MiB buffer with a line break exactly on its first byte; the guard test makes the reader's count disagree
with the file's and expects a loud failure that keeps nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from servlens.errors import InputError
from servlens.ingest import sources as src
from servlens.ingest.api import ingest_inputs
from servlens.ingest.compiler import MAX_LINE_BYTES, line_reader_sql
from servlens.store.schema import open_store

SLP_RECORDED = Path(__file__).resolve().parents[1] / "data" / "gateways" / "litellm_slp_recorded.jsonl"
BUFFER = 2 * MAX_LINE_BYTES  # the line reader's buffer_size


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("trailing", [True, False], ids=["trailing-break", "no-trailing-break"])
def test_small_buffers_lose_no_line_at_any_boundary(tmp_path: Path, eol: bytes, trailing: bool):
    longest = 64  # buffer of 128 bytes: the first line's length moves every later break across the boundaries
    con = duckdb.connect()
    for shift in range(0, 64):
        lines = [b"x" * shift] + [bytes([97 + i % 26]) * (1 + (i * 37 + shift) % 60) for i in range(25)]
        path = tmp_path / "lines.txt"
        path.write_bytes(eol.join(lines) + (eol if trailing else b""))
        got = [r[0] or "" for r in con.execute(
            f"SELECT line FROM {line_reader_sql(path, None, longest, store_rejects=False)}").fetchall()]
        assert got == [line.decode() for line in lines], f"shift {shift}"
        assert src.file_sha256_and_lines(path)[1] == len(lines)


def _slp_file(path: Path, eol: bytes, trailing: bool) -> tuple[list[str], int]:
    """Recorded LiteLLM payloads, each with a fresh id, until the file passes one read buffer; one line is padded so
    that the line break before line `boundary_line` starts exactly at byte BUFFER (the first byte of buffer 2)."""
    payloads = [json.loads(line) for line in SLP_RECORDED.read_text().splitlines()]
    ids, chunks, size, padded = [], [], 0, False
    i = 0
    while size < BUFFER + 200_000:
        payload = dict(payloads[i % len(payloads)], id=f"req-{i:06d}")
        line = json.dumps(payload).encode()
        if not padded and size + len(line) + len(line) > BUFFER:
            # pad this line so that its line break begins at byte BUFFER
            pad = BUFFER - size - len(line) - len(',"_pad":""')
            assert pad > 0
            line = line[:-1] + b',"_pad":"' + b"p" * pad + b'"}'
            assert size + len(line) == BUFFER
            padded, boundary_line = True, i + 2
        ids.append(payload["id"])
        chunks.append(line)
        size += len(line) + len(eol)
        i += 1
    path.write_bytes(eol.join(chunks) + (eol if trailing else b""))
    return ids, boundary_line


@pytest.mark.parametrize(
    "eol,trailing", [(b"\n", True), (b"\n", False), (b"\r\n", True)], ids=["lf", "lf-no-trailing-break", "crlf"]
)
def test_line_break_on_a_buffer_boundary_keeps_every_request(tmp_path: Path, eol: bytes, trailing: bool):
    path = tmp_path / "gateway.jsonl"
    ids, boundary_line = _slp_file(path, eol, trailing)
    con = open_store(None)
    report = ingest_inputs(con, [str(path)], run="t").to_dict()
    source = report["sources"][0]
    assert (source["format"], source["rows"], source["bad_lines"]) == ("litellm-slp", len(ids), 0)
    rows = con.execute("SELECT source_line, request_id FROM requests ORDER BY source_line").fetchall()
    assert rows == [(n, request_id) for n, request_id in enumerate(ids, start=1)]
    assert rows[boundary_line - 1] == (boundary_line, ids[boundary_line - 1])


def test_a_reader_that_loses_a_line_fails_the_file_and_keeps_nothing(tmp_path: Path, monkeypatch):
    path = tmp_path / "gateway.jsonl"
    path.write_bytes(SLP_RECORDED.read_bytes())
    real = src.file_sha256_and_lines

    def one_more_line(p, **options):  # as if DuckDB's reader had lost one line
        digest, lines = real(p, **options)
        return digest, lines + 1

    monkeypatch.setattr(src, "file_sha256_and_lines", one_more_line)
    con = open_store(None)
    with pytest.raises(InputError) as caught:
        ingest_inputs(con, [str(path)], run="t")
    assert str(caught.value).startswith(f"{path} has 15 lines but DuckDB's line reader gave 14: nothing was kept")
    assert con.execute("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM sources)").fetchone() == (0, 0)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_files_are_counted_in_their_text_and_checked(tmp_path: Path, suffix: str):
    import gzip

    import zstandard

    text = SLP_RECORDED.read_bytes().replace(b"\n", b"\r\n")
    # two gzip members / two zstd frames, the second without a trailing line break: 14 lines either way
    first, second = text[: text.index(b"\r\n") + 2], text[text.index(b"\r\n") + 2:].rstrip(b"\r\n")
    pack = gzip.compress if suffix == ".gz" else zstandard.ZstdCompressor().compress
    path = tmp_path / f"gateway.jsonl{suffix}"
    path.write_bytes(pack(first) + pack(second))
    assert src.file_sha256_and_lines(path)[1] == 14
    con = open_store(None)
    source = ingest_inputs(con, [str(path)], run="t").to_dict()["sources"][0]
    assert (source["rows"], source["bad_lines"]) == (14, 0)
    assert con.execute("SELECT max(source_line) FROM requests").fetchone()[0] == 14


def test_a_corrupt_archive_has_no_count_and_the_same_digest(tmp_path: Path):
    path = tmp_path / "broken.jsonl.gz"
    path.write_bytes(b"not gzip at all\n")
    assert src.file_sha256_and_lines(path) == (src.file_sha256(path), None)


def test_bad_lines_after_a_rejected_line_keep_their_own_numbers(tmp_path: Path):
    good = SLP_RECORDED.read_bytes().split(b"\n")
    # line 2 is not UTF-8 (a reader reject), line 4 is not JSON (a bad row), line 6 blank: numbers are the file's
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join([good[0], b'{"id": "\xff\xfe"}', good[1], b"{not json", good[2], b""]) + b"\n")
    con = open_store(None)
    source = ingest_inputs(con, [str(path)], run="t", from_format="litellm-slp").to_dict()["sources"][0]
    assert (source["rows"], source["bad_lines"]) == (3, 2)
    assert con.execute("SELECT source_line FROM requests ORDER BY 1").fetchall() == [(1,), (3,), (5,)]
    assert con.execute("SELECT line, reason FROM ingest_errors ORDER BY 1").fetchall() == [
        (2, "not UTF-8 text"), (4, "invalid JSON: the line ends before the value does (truncated?)")]
