"""HTML without --out, on a terminal, goes to reports/ (the issue's default folder); redirected, and in every other
format, stdout keeps it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from servlens.cli import cli
from tests.conftest import REPO

PREFIX_ON = str(REPO / "sample_logs" / "prefix-cache-on")


def _terminal(monkeypatch) -> None:
    monkeypatch.setattr("servlens.commands._common.stdout_is_terminal", lambda: True)


def test_analyze_html_without_out_goes_to_reports(cli_runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _terminal(monkeypatch)
    result = cli_runner.invoke(cli, ["analyze", PREFIX_ON, "--select", "SL001", "--format", "html"],
                               catch_exceptions=False)
    assert result.exit_code == 0, result.output
    written = list((tmp_path / "reports").glob("*.html"))
    assert len(written) == 1 and re.fullmatch(r"analyze-\d{8}-\d{6}\.html", written[0].name)
    assert written[0].read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert f"Wrote reports/{written[0].name}" in result.stderr
    assert "<html" not in result.stdout


def test_report_html_names_the_file_by_kind_and_json_keeps_stdout(cli_runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _terminal(monkeypatch)
    result = cli_runner.invoke(cli, ["analyze", PREFIX_ON, "--select", "SL001", "--format", "json"],
                               catch_exceptions=False)
    assert not Path("reports").exists()  # JSON (like text and Markdown) still goes to stdout
    Path("result.json").write_text(result.stdout, encoding="utf-8")
    assert json.loads(result.stdout)["kind"] == "analyze"
    again = cli_runner.invoke(cli, ["report", "result.json"], catch_exceptions=False)
    assert again.exit_code == 0 and not Path("reports").exists()  # no --out, no --format: text
    html = cli_runner.invoke(cli, ["report", "result.json", "--format", "html"], catch_exceptions=False)
    assert html.exit_code == 0
    (written,) = Path("reports").glob("analyze-*.html")
    assert "SL001" in written.read_text(encoding="utf-8")


def test_redirected_html_still_goes_to_stdout(cli_runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("servlens.commands._common.stdout_is_terminal", lambda: False)
    result = cli_runner.invoke(cli, ["analyze", PREFIX_ON, "--select", "SL001", "--format", "html"],
                               catch_exceptions=False)
    assert result.stdout.startswith("<!DOCTYPE html>") and not Path("reports").exists()
