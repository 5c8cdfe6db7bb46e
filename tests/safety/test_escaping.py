"""Markdown and terminal injection (issue 15, class 6): every log value is escaped for its output; no control
character or ESC sequence reaches a report, the terminal or an error sentence."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from servlens.escape import md_code, md_escape, one_line, strip_controls, terminal_safe
from tests.safety.corpus import request_record, write_lines

# A label that tries everything: a heading, a remote image, a javascript: link, raw HTML, a table break, an OSC
# window title, a screen clear, a hyperlink escape, a carriage return overwrite and a bidi override.
HOSTILE = ("x](javascript:alert(1)) ![p](http://evil.example/p.png) <img src=x onerror=alert(1)> | cell\n"
           "# Heading\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\roverwrite\u202eevil`tick")
_ESC_OR_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_strip_controls_removes_escape_sequences_and_lone_carriage_returns():
    assert strip_controls("a\x1b[31mb\x1b[0m\x1b]0;t\x07c\rd\r\ne\u202ef\tg") == "abc\nd\nef\tg"


def test_terminal_safe_keeps_only_colour():
    assert terminal_safe("\x1b[1;31mCRITICAL\x1b[0m \x1b[2J\x1b]8;;http://x\x07y\x1b]8;;\x07") == \
        "\x1b[1;31mCRITICAL\x1b[0m y"


def test_one_line_turns_breaks_into_spaces():
    assert one_line("a\nb\r\nc\rd\u2028e\x1b[Kf") == "a b c d ef"


def test_md_escape_leaves_no_markup():
    escaped = md_escape(HOSTILE)
    assert "\n" not in escaped and "\r" not in escaped and not _ESC_OR_CONTROL.search(escaped)
    for markup in (r"(?<!\\)\]\(", r"(?<!\\)!(?<!\\)\[", r"(?<!\\)<img", r"(?<!\\)\| cell", r"(?<!\\)# Heading"):
        assert not re.search(markup, escaped), markup
    assert escaped.startswith(r"x\](javascript:alert(1)) \!\[p\](http://evil.example/p.png) \<img")


def test_md_code_cannot_be_closed_early():
    assert md_code("a`b\nc") == "`a'b c`"


def _servlens(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)


def _hostile_log(path, n=120, t0=1795936979.0, slower=1.0, run=HOSTILE):
    records = []
    for i in range(n):
        record = request_record(i, t0, run=run, e2e_s=0.5 * slower, end_ts=t0 + i + 0.5 * slower)
        record["body"]["model"] = HOSTILE
        records.append(json.dumps(record))
    return write_lines(path, records)


def _assert_clean_markdown(text: str) -> None:
    assert not _ESC_OR_CONTROL.search(text) and "\r" not in text
    text = re.sub(r"`[^`\n]*`", "``", text)  # inside a code span nothing is markup
    for markup in (r"(?<!\\)\]\(javascript", r"(?<![\\`])!\[p\]\(http", r"(?<![\\`])<img", r"\n# Heading"):
        assert not re.search(markup, text), markup


@pytest.mark.parametrize("fmt", ["md", "text"])
def test_compare_report_escapes_run_labels(tmp_path, fmt):
    # The run labels come from the logs' `run` field (compare given files labels them before/after itself).
    before = _hostile_log(tmp_path / "before.jsonl", run=HOSTILE + " a")
    after = _hostile_log(tmp_path / "after.jsonl", t0=1795937979.0, slower=1.2, run=HOSTILE + " b")
    assert _servlens(tmp_path, "ingest", str(before), str(after)).returncode == 0
    import duckdb

    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    labels = [r[0] for r in con.execute("SELECT run FROM runs ORDER BY run").fetchall()]
    con.close()
    done = _servlens(tmp_path, "compare", "--before", labels[0], "--after", labels[1], "--format", fmt)
    assert done.returncode in (0, 1, 3), done.stderr
    assert not _ESC_OR_CONTROL.search(done.stdout + done.stderr) and "\r" not in done.stdout
    if fmt == "md":
        _assert_clean_markdown(done.stdout)
        assert ("**before** `x](javascript:alert(1)) ![p](http://evil.example/p.png) <img src=x onerror=alert(1)> | "
                "cell # Headingclick overwrite evil'tick a`") in done.stdout


@pytest.mark.parametrize("fmt", ["md", "text"])
def test_analyze_report_escapes_log_values(tmp_path, fmt):
    log = _hostile_log(tmp_path / "log.jsonl")
    done = _servlens(tmp_path, "analyze", str(log), "--format", fmt)
    assert done.returncode in (0, 1), done.stderr
    assert not _ESC_OR_CONTROL.search(done.stdout + done.stderr) and "\r" not in done.stdout
    if fmt == "md":
        _assert_clean_markdown(done.stdout)


def test_stored_values_hold_no_control_characters(tmp_path):
    log = _hostile_log(tmp_path / "log.jsonl", n=3)
    assert _servlens(tmp_path, "ingest", str(log)).returncode == 0
    import duckdb

    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    runs = con.execute("SELECT DISTINCT run FROM requests").fetchall()
    models = con.execute("SELECT DISTINCT model FROM requests").fetchall()
    con.close()
    assert len(runs) == 1 and len(models) == 1
    for (value,) in runs + models:
        assert not _ESC_OR_CONTROL.search(value) and "\n" not in value and "\r" not in value


def test_error_sentence_about_a_hostile_file_name_is_one_clean_line(tmp_path):
    name = tmp_path / "bad\nname\x1b[2J\x1b]0;pwned\x07\r.xyz"
    name.write_bytes(b"\x00\x01 not a log")
    done = _servlens(tmp_path, "ingest", str(name))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    assert not _ESC_OR_CONTROL.search(done.stderr) and "\r" not in done.stderr and "Traceback" not in done.stderr


def test_click_error_quoting_a_hostile_value_is_clean(tmp_path):
    done = _servlens(tmp_path, "ingest", str(tmp_path / "x.jsonl"), "--from", "no\x1b[2Jsuch\rformat")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert not _ESC_OR_CONTROL.search(done.stderr) and "\r" not in done.stderr
