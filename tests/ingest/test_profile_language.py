"""The profile language's `where`, `extends` and `[unwrap]`, and files that are recognised yet give no row."""

from __future__ import annotations

import pytest

from servlens.errors import ConfigError, InputError
from servlens.ingest.api import check_something_ingested, ingest_inputs
from servlens.store.schema import open_store
from tests.ingest.format_rows import FORMATS, ingest_rows

HELICONE_CSV = FORMATS / "helicone" / "helicone-export.csv"
HTTP_ONLY_SPANS = '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"ab","spanId":"cd","name":"GET /"}]}]}]}\n'


def test_where_filters_csv_rows(tmp_path):
    profile = tmp_path / "ok-only.toml"
    profile.write_text('extends = "helicone-export-csv"\nname = "helicone-ok"\nwhere = "response_status = \'200\'"\n')
    source, rows, con = ingest_rows(HELICONE_CSV, profile_file=str(profile))
    assert (source["format"], source["rows"], source["bad_lines"]) == ("helicone-ok", 1, 0)
    assert rows[0]["http_status"] == 200 and rows[0]["e2e_s"] == pytest.approx(1.812)  # the parent's columns


def test_extends_an_unknown_profile_is_a_config_error(tmp_path):
    profile = tmp_path / "bad.toml"
    profile.write_text('extends = "no-such-format"\nname = "x"\n')
    with pytest.raises(ConfigError, match="extends 'no-such-format', which is not a built-in profile"):
        ingest_inputs(open_store(None), [str(HELICONE_CSV)], profile_file=str(profile))


def test_unwrap_records_in_a_user_profile(tmp_path):
    profile = tmp_path / "wrapped.toml"
    profile.write_text('extends = "ollama-responses"\nname = "ollama-wrapped"\nreader = "json"\n'
                       '[unwrap]\nrecords = "$.items[*]"\n[detect]\nmust = ["$.items"]\n')
    doc = tmp_path / "page.json"
    lines = (FORMATS / "ollama" / "ollama-chat.jsonl").read_text().splitlines()
    doc.write_text('{"items": [' + ",".join(lines) + "]}\n")
    source, rows, _ = ingest_rows(doc, profile_file=str(profile))
    assert source["rows"] == 4 and {r["source_line"] for r in rows} == {1}


def test_a_named_file_recognised_but_without_rows_is_exit_2(tmp_path):
    path = tmp_path / "http-only.jsonl"
    path.write_text(HTTP_ONLY_SPANS)
    con = open_store(None)
    with pytest.raises(InputError) as caught:
        ingest_inputs(con, [str(path)], run="t")
    assert str(caught.value).startswith(
        f"{path} looks like otel-genai-spans but gave no rows: no record holds an element the profile reads as a "
        "request.")
    assert caught.value.exit_code == 2
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 0


def test_a_folder_with_nothing_ingested_is_exit_2_and_lists_why(tmp_path):
    (tmp_path / "http-only.jsonl").write_text(HTTP_ONLY_SPANS)
    (tmp_path / "notes.txt").write_text("hello\n")
    report = ingest_inputs(open_store(None), [str(tmp_path)], run="t")
    with pytest.raises(InputError) as caught:
        check_something_ingested(report, [str(tmp_path)])
    assert str(caught.value).startswith(
        f"Nothing was ingested from {tmp_path}: 2 file(s) skipped (http-only.jsonl: otel-genai-spans, but no rows: "
        "no record holds an element the profile reads as a request; notes.txt: plain text).")


def test_a_folder_keeps_the_good_files_and_lists_the_rowless_one(tmp_path):
    (tmp_path / "http-only.jsonl").write_text(HTTP_ONLY_SPANS)
    (tmp_path / "ollama.jsonl").write_text((FORMATS / "ollama" / "ollama-chat.jsonl").read_text())
    report = ingest_inputs(open_store(None), [str(tmp_path)], run="t")
    assert [s["rows"] for s in report.sources] == [4]
    assert report.skipped == [{"path": str(tmp_path / "http-only.jsonl"), "reason": (
        "otel-genai-spans, but no rows: no record holds an element the profile reads as a request")}]


def test_servlens_ingest_of_a_folder_that_gave_nothing_exits_2(tmp_path):
    import subprocess
    import sys

    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "http-only.jsonl").write_text(HTTP_ONLY_SPANS)
    done = subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "ingest", str(folder)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"Error: Nothing was ingested from {folder}: 1 file(s) skipped (http-only.jsonl: "
                                  "otel-genai-spans, but no rows:")
