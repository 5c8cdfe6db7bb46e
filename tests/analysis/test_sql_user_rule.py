"""A user's rule written only in TOML and SQL (tests/analysis/data/sql_user_rules/UR001-window-error-rate.toml),
run through `servlens analyze --rules DIR` on a real recording: its finding is as rich as a built-in one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from servlens.cli import cli

REPO = Path(__file__).resolve().parents[2]
RULE = Path(__file__).parent / "data" / "sql_user_rules" / "UR001-window-error-rate.toml"
# 60 requests against a deployment limited to 15 rpm: 46 failed with RateLimitError 429 (the recording's README).
RECORDING = REPO / "tests" / "data" / "recorded" / "gw-ratelimit-429" / "litellm_slp.jsonl"


def test_a_toml_and_sql_rule_gives_examples_windows_a_table_a_chart_and_a_severity_upgrade(tmp_path):
    rules_dir = tmp_path / "my-rules"
    rules_dir.mkdir()
    shutil.copy(RULE, rules_dir / RULE.name)
    out = tmp_path / "analyze.json"
    result = CliRunner().invoke(cli, ["analyze", str(RECORDING), "--rules", str(rules_dir), "--select", "UR001",
                                      "--format", "json", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    findings = {f["scope"]["deployment"]: f for f in json.loads(out.read_text())["findings"]}
    # The gateway's rejections carry no deployment (the router had none to give): that scope is all failures.
    rejected, served = findings[""], findings["http://127.0.0.1:59983/v1"]
    assert (rejected["state"], rejected["severity"]) == ("fired", "critical")  # [[decide.severity]] upgrade
    assert rejected["summary"] == "8 window(s) above 5% failed; the worst 100.0% (46 of 46 failed overall)."
    assert rejected["remediation"] == "Look at the failed requests of the worst window (100.0% failed)."
    evidence = rejected["evidence"]
    assert evidence["metrics"] == {"requests": 46, "failed": 46, "bad_windows": 8, "worst_rate": 1.0}
    assert evidence["thresholds"]["max_error_rate"] == 0.05
    assert len(evidence["windows"]) == 8
    assert evidence["windows"][0] == {"start": "2026-12-01T22:05:25.999Z", "end": "2026-12-01T22:05:26.999Z"}
    assert evidence["table"]["columns"] == ["window start", "requests", "failed", "error rate"]
    assert [row[1:] for row in evidence["table"]["rows"]][:2] == [[8, 8, 1.0], [3, 3, 1.0]]
    assert sum(row[1] for row in evidence["table"]["rows"]) == 32
    chart = evidence["chart"]
    assert (chart["type"], chart["x_time"], chart["hlines"]) == ("line", True, [{"y": 0.05, "label": "limit"}])
    assert [s["name"] for s in chart["series"]] == ["error rate"] and set(chart["series"][0]["y"]) == {1.0}
    examples = rejected["examples"]
    assert len(examples) == 5 and all(e["source"].endswith("litellm_slp.jsonl") and e["line"] for e in examples)
    assert [e["line"] for e in examples] == sorted(e["line"] for e in examples)
    # The served requests all succeeded: clear, with no evidence computed for a clear finding.
    assert (served["state"], served["summary"]) == ("clear", "No window above 5% failed (0 of 14 failed overall).")
    assert served["evidence"]["table"] is None and served["examples"] == []
