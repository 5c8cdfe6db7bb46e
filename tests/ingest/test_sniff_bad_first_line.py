"""A JSON-lines log whose first line is broken is still JSON lines: read with that line counted and kept, not
refused whole as an unknown format (it was taken for a pretty-printed document that failed to parse)."""

from __future__ import annotations

from pathlib import Path

from servlens.analysis.inputs import ingest_paths
from servlens.ingest.sniff import sample_file
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "sample_logs" / "mixed" / "requests.jsonl"


def _broken_first_line(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"id": "cut off by a crash\n' + "".join(LOG.read_text().splitlines(keepends=True)[:20]))
    return path


def test_the_file_samples_as_json_lines(tmp_path):
    sample = sample_file(_broken_first_line(tmp_path))
    assert sample.shape == "jsonl" and len(sample.records) == 20 and sample.problem is None


def test_its_rows_are_read_and_the_bad_line_is_kept_with_its_number(tmp_path):
    con = open_store(None)
    try:
        ingest_paths(con, [str(_broken_first_line(tmp_path))])
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 20
        assert con.execute("SELECT line FROM ingest_errors").fetchall() == [(1,)]
    finally:
        con.close()


def test_a_pretty_printed_document_that_does_not_parse_is_still_reported_as_one(tmp_path):
    path = tmp_path / "answer.json"
    path.write_text('{\n  "data": [\n    {"a": 1},\n    {"b": 2}\n  ],\n')
    sample = sample_file(path)
    assert sample.shape == "json" and sample.problem.startswith("not valid JSON")
