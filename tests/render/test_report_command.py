"""`servlens report`: re-render a saved result; format from --format or --out; clear errors for bad files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_servlens(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servlens", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_report_rerenders_saved_json_as_html(tmp_path, compare_doc):
    saved = tmp_path / "gate.json"
    saved.write_text(json.dumps(compare_doc))
    out = tmp_path / "reports" / "gate.html"
    done = run_servlens("report", str(saved), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"Wrote {out}"
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'data-verdict="fail"' in page


def test_format_wins_over_the_out_extension_and_templates_apply(tmp_path, analyze_doc):
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(analyze_doc))
    templates = tmp_path / "team"
    templates.mkdir()
    (templates / "_header.html").write_text("<header><h1>ACME incident {{ title }}</h1></header>")
    out = tmp_path / "report.txt"
    done = run_servlens("report", str(saved), "--format", "html", "--out", str(out), "--templates", str(templates))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "<h1>ACME incident Incident report: incident-1128</h1>" in page
    done = run_servlens("report", str(saved), "--format", "json")
    assert done.returncode == 0 and json.loads(done.stdout) == analyze_doc


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)"),
        ('{"kind": "ingest", "schema_version": 1}', "is not an analyze or compare result (kind: 'ingest')"),
        ('[1, 2]', "is not an analyze or compare result (kind: None)"),
        ('{"kind": "analyze", "schema_version": 9}', "uses result schema 9, newer than this servlens reads (2)"),
        # version 1 was untyped: its documents are written again, not rendered half
        ('{"kind": "analyze", "schema_version": 1, "findings": []}',
         "uses result schema 1, older than this servlens reads (2)"),
        ('{"kind": "compare", "schema_version": 2, "generated_at": "2026-11-28T12:00:00Z"}',
         "is not a valid compare result: $ lacks the key 'servlens_version'"),
    ],
)
def test_bad_result_files_are_one_sentence_and_exit_2(tmp_path, content, message):
    saved = tmp_path / "bad.json"
    saved.write_text(content)
    done = run_servlens("report", str(saved), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"Error: '{saved}' {message}.")
    assert "Traceback" not in done.stderr and not (tmp_path / "r.html").exists()


def test_missing_file_and_unknown_extension(tmp_path):
    done = run_servlens("report", str(tmp_path / "nope.json"), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and f"Result file '{tmp_path / 'nope.json'}' does not exist" in done.stderr
    saved = tmp_path / "ok.json"
    saved.write_text('{"kind": "analyze", "schema_version": 2, "findings": []}')
    done = run_servlens("report", str(saved), "--out", str(tmp_path / "r.pdf"))
    assert done.returncode == 2 and "Cannot tell the output format from" in done.stderr


def test_a_hand_edited_document_names_the_first_wrong_place(tmp_path, analyze_doc):
    analyze_doc["findings"][1]["state"] = "maybe"
    saved = tmp_path / "edited.json"
    saved.write_text(json.dumps(analyze_doc))
    done = run_servlens("report", str(saved), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (f"Error: '{saved}' is not a valid analyze result: $.findings[1].state is \"maybe\", not one "
                           'of "fired", "clear", "not_evaluable". Pass the JSON servlens wrote, unedited.\n')


def test_help_has_an_example():
    done = run_servlens("report", "--help")
    assert done.returncode == 0 and "Example:" in done.stdout and "servlens report results.json" in done.stdout
