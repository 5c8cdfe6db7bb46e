"""The file's sha256 is computed while DuckDB reads it; skip and replace decide exactly as with the hash up front."""

from __future__ import annotations

import hashlib
from pathlib import Path

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store

SLP_RECORDED = Path(__file__).resolve().parents[1] / "data" / "gateways" / "litellm_slp_recorded.jsonl"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sources(con) -> list[tuple]:
    return con.execute("SELECT run, path, sha256, size_bytes, rows FROM sources ORDER BY source_id").fetchall()


def test_new_source_stores_the_real_digest(tmp_path: Path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(SLP_RECORDED.read_bytes())
    con = open_store(None)
    ingest_inputs(con, [str(path)], run="r")
    assert _sources(con) == [("r", str(path), _sha(path), path.stat().st_size, 14)]


def test_same_content_at_another_path_in_the_run_is_skipped(tmp_path: Path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(SLP_RECORDED.read_bytes())
    second.write_bytes(SLP_RECORDED.read_bytes())
    con = open_store(None)
    ingest_inputs(con, [str(first)], run="r")
    report = ingest_inputs(con, [str(second)], run="r").to_dict()
    assert report["sources"][0]["skipped"] is True
    assert _sources(con) == [("r", str(first), _sha(first), first.stat().st_size, 14)]
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 14


def test_same_size_other_content_is_new_and_a_changed_file_replaces(tmp_path: Path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    lines = SLP_RECORDED.read_text().splitlines(keepends=True)
    first.write_text("".join(lines))
    second.write_text("".join(reversed(lines)))  # same bytes, other order: same size, other digest
    assert first.stat().st_size == second.stat().st_size and _sha(first) != _sha(second)
    con = open_store(None)
    ingest_inputs(con, [str(first)], run="r")
    ingest_inputs(con, [str(second)], run="r")
    assert [s[1:3] for s in _sources(con)] == [(str(first), _sha(first)), (str(second), _sha(second))]
    first.write_text("".join(lines[:10]))  # changed in place: its rows are replaced
    report = ingest_inputs(con, [str(first)], run="r").to_dict()
    assert report["sources"][0]["replaced"] is True
    assert sorted(s[1:] for s in _sources(con)) == sorted([
        (str(first), _sha(first), first.stat().st_size, 10), (str(second), _sha(second), second.stat().st_size, 14)])
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 24


def test_runs_named_in_the_file_store_the_real_digest_and_a_second_ingest_skips(shared_data):
    path = shared_data / "real-engine" / "llamacpp" / "requests.jsonl"
    con = open_store(None)
    first = ingest_inputs(con, [str(path)]).to_dict()["sources"][0]
    sources = _sources(con)
    assert len(sources) == len(first["runs"]) > 1
    assert {s[2] for s in sources} == {_sha(path)}
    again = ingest_inputs(con, [str(path)]).to_dict()["sources"][0]
    assert again["skipped"] is True and _sources(con) == sources
