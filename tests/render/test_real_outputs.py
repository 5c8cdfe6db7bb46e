"""HTML reports of what `servlens analyze` and `servlens compare` really emit on recorded engine data (not
hand-made documents): every finding and gate shows up, nothing loads from the network, and Chromium renders
them without a console message."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servlens.render.html import render_html

from conftest import open_in_chromium
from test_html import network_references, scan

REPO = Path(__file__).resolve().parents[2]
LLAMACPP = REPO / "tests" / "data" / "shared" / "real-engine" / "llamacpp"
BENCH = REPO / "tests" / "data" / "shared" / "real-engine" / "vllm-bench"


def servlens(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servlens", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def analyze_result(tmp_path_factory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("analyze")
    done = servlens("analyze", str(LLAMACPP), "--format", "json", "--out", str(folder / "result.json"), cwd=folder)
    assert done.returncode == 0, done.stderr
    return json.loads((folder / "result.json").read_text()), folder


@pytest.fixture(scope="module")
def compare_result(tmp_path_factory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("compare")
    done = servlens("compare", str(BENCH / "random_burstiness0.5"), str(BENCH / "random_burstiness0.5_seed1"),
                    "--format", "json", "--out", str(folder / "result.json"), cwd=folder)
    assert done.returncode in (0, 1, 3), done.stderr
    return json.loads((folder / "result.json").read_text()), folder


def test_real_analyze_result_shows_every_finding(analyze_result):
    doc, _ = analyze_result
    page = render_html(doc)
    parsed = scan(page)
    fired = [f for f in doc["findings"] if f["state"] == "fired"]
    assert fired, "the llama.cpp recording has incidents (burst50 queueing, length finishes)"
    articles = [attrs for tag, attrs in parsed.tags if tag == "article"]
    assert len(articles) == len(fired)
    assert sorted(a["data-rule"] for a in articles) == sorted(f["rule"] for f in fired)
    severities = {"critical": 0, "warning": 1, "info": 2}
    top = min((f["severity"] for f in fired), key=severities.get)
    assert [attrs["data-verdict"] for _, attrs in parsed.tags if "data-verdict" in attrs] == [top]
    text = " ".join(parsed.text)
    for finding in fired:
        assert finding["summary"] in text
        assert finding["rollback"] in text
    for finding in doc["findings"]:
        if finding["state"] == "not_evaluable":
            assert finding["reason"] in text
    charts = sum(1 for f in fired if (f.get("evidence") or {}).get("chart"))
    findings = page[page.index('id="findings"'): page.index('id="not-evaluable"')]
    assert findings.count("<svg") == min(charts, 16)
    if doc.get("workload"):  # the workload profile (issue 8) draws its charts after the findings
        assert page.count("<svg") >= findings.count("<svg") + 1
    assert network_references(page) == []


def test_real_compare_result_shows_every_gate(compare_result):
    doc, _ = compare_result
    page = render_html(doc)
    text = " ".join(scan(page).text)
    assert f'data-verdict="{doc["verdict"]}"' in page
    assert doc["reason"] in text
    rows = re.findall(r'<tr class="(fail|pass|inconclusive)">', page)
    assert sorted(rows) == sorted(g["verdict"] for g in doc["gates"])
    for gate in doc["gates"]:
        assert gate["name"] in text
        assert gate["rollback_criterion"] in text
    # one chart per gate, and the covariate check once per adjusted latency metric
    residuals = len({g["metric"] for g in doc["gates"] if g.get("residual_chart")})
    assert page.count("<svg") == min(sum(1 for g in doc["gates"] if g.get("chart")) + residuals, 16)
    assert network_references(page) == []


def test_real_reports_open_cleanly_in_chromium(chromium, tmp_path, analyze_result, compare_result):
    for name, (doc, _) in (("analyze", analyze_result), ("compare", compare_result)):
        page = tmp_path / f"{name}.html"
        page.write_text(render_html(doc), encoding="utf-8")
        dom, problems = open_in_chromium(chromium, page, tmp_path / f"profile-{name}")
        assert problems == [], name
        assert "data-verdict=" in dom
        assert len(re.findall(r"<svg\b", dom)) >= 1


def test_analyze_and_report_commands_write_the_same_html(analyze_result):
    """`servlens report results.json` re-renders exactly what analyze would have written as HTML."""
    doc, folder = analyze_result
    done = servlens("report", str(folder / "result.json"), "--out", str(folder / "again.html"), cwd=folder)
    assert done.returncode == 0, done.stderr
    assert (folder / "again.html").read_text() == render_html(doc)


@pytest.mark.parametrize("fmt", ["md", "text"])
def test_report_command_rerenders_real_results_in_every_format(analyze_result, compare_result, fmt):
    for doc, folder in (analyze_result, compare_result):
        done = servlens("report", str(folder / "result.json"), "--format", fmt, cwd=folder)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()
        if doc["kind"] == "compare":
            assert doc["verdict"] in done.stdout.lower()


def test_relative_clock_trace_reads_as_offsets_everywhere(tmp_path):
    """Mooncake's trace has no absolute clock (DESIGN.md "Times"): no 1970 dates anywhere, +hh:mm:ss instead,
    and with no latencies the workload section still describes the traffic."""
    trace = REPO / "tests" / "data" / "shared" / "traces" / "mooncake_fast25_synthetic_trace.jsonl"
    done = servlens("analyze", str(trace), "--format", "json", "--out", str(tmp_path / "r.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["coverage"]["time_span"]["relative_clock"] is True
    page = render_html(doc)
    assert "1970" not in page
    assert "+00:00:00 → +00:17:02" in page
    if doc.get("workload"):
        workload = page[page.index('id="workload"'):]
        assert "<svg" in workload and ">+00:05:00<" in workload
