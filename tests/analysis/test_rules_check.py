"""`servlens rules check` finds every problem of a broken rule with its position; `rules test` treats broken SQL
and non-canonical case rows as errors (exit 2), not failed cases; Python detectors' USES is checked against the
TOML, so a renamed or deleted entry is a load error naming the file and the key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from servlens.analysis.rules import load_rule_file
from servlens.cli import cli
from servlens.errors import ConfigError

DATA = Path(__file__).parent / "data"
UR001 = (DATA / "sql_user_rules" / "UR001-window-error-rate.toml").read_text()
UR001_CASES = """rule = "UR001"

[[case]]
name = "one_in_three_failing_fires"
expect = "fired"
[case.requests]
defaults = { run = "r", model = "m" }
[[case.requests.generate]]
count = 30
columns = { request_id = "'q' || i", t_arrival = "TIMESTAMP '2026-11-28 10:00:00' + to_milliseconds(i * 100)", status = "CASE WHEN i % 3 = 0 THEN 'error' ELSE 'ok' END" }
"""


def _rules_dir(tmp_path: Path, text: str, cases: str | None = None) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(parents=True)
    (folder / "UR001-window-error-rate.toml").write_text(text)
    if cases:
        (folder / "UR001-window-error-rate.cases.toml").write_text(cases)
    return folder


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_check_reports_every_problem_with_file_line_and_column(tmp_path):
    broken = (UR001.replace('fired = "bad_windows > 0"', 'fired = "bad_windows >> > 0"')
              .replace("the worst {worst_rate:.1%}", "the worst {worst_rat:.1%}")
              .replace('where = "sl_failed() AND', 'where = "sl_failed(a, b) AND')
              .replace("count(*) FILTER (WHERE bad) AS bad_windows", "count(*) FILTER (WHERE badd) AS bad_windows"))
    folder = _rules_dir(tmp_path, broken)
    result = _cli("rules", "check", str(folder))
    path = folder / "UR001-window-error-rate.toml"
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f'{path}:40:74: detector.sql: Binder Error: Referenced column "badd" not found in FROM clause! '
        'Candidate bindings: "bad", "failed", "rate"',
        f'{path}:48:25: decide.fired: Parser Error: syntax error at or near ">"',
        f"{path}:78:10: evidence.examples.where: sl_failed() takes no argument or one table alias, not (a,  b)",
        "1 rule files checked, 3 problem(s)",
    ]


def test_check_names_template_fields_and_a_broken_view_once(tmp_path):
    broken = (UR001.replace("the worst {worst_rate:.1%}", "the worst {worst_rat:.1%}")
              .replace("GROUP BY w.t_window, w.w_start, w.w_end", "GROUP BY w.t_window, w.w_start, w.w_endd"))
    folder = _rules_dir(tmp_path, broken)
    lines = _cli("rules", "check", str(folder)).output.splitlines()
    path = folder / "UR001-window-error-rate.toml"
    # the view's error is reported once, not again for every SQL that reads the view
    assert lines == [f'{path}:35:33: views.error_windows: Binder Error: Values list "w" does not have a column '
                     'named "w_endd"', "1 rule files checked, 1 problem(s)"]
    lines = _cli("rules", "check", str(_rules_dir(tmp_path / "t", UR001.replace(
        "the worst {worst_rate:.1%}", "the worst {worst_rat:.1%}")))).output.splitlines()
    assert lines[0].endswith(":55:10: summary.fired: names {worst_rat}, which is neither a column of the detector's "
                             "row nor a parameter (columns: requests, failed, bad_windows, worst_rate)")


def test_check_passes_the_builtin_and_the_sample_rules_and_reports_load_errors():
    assert _cli("rules", "check").output.endswith("rule files checked, 0 problem(s)\n")
    for folder in ("user_rules", "sql_user_rules"):
        assert _cli("rules", "check", str(DATA / folder)).exit_code == 0


def test_check_lists_a_load_error_of_each_file(tmp_path):
    folder = _rules_dir(tmp_path, UR001.replace('type = "line"', 'type = "pie"'))
    (folder / "UR002-other.toml").write_text(UR001.replace('id = "UR001"', 'id = "UR002"')
                                             .replace('name = "window-error-rate"', 'name = "other-rate"')
                                             .replace('level = "critical"', 'level = "urgent"'))
    result = _cli("rules", "check", str(folder))
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"{folder / 'UR001-window-error-rate.toml'}: evidence.chart.type 'pie' is not a chart type",
        f"{folder / 'UR002-other.toml'}: decide.severity[0].level 'urgent' is not a severity",
        "2 rule files checked, 2 problem(s)",
    ]


def test_rules_test_runs_cases_like_analyze_and_broken_sql_is_exit_2(tmp_path):
    good = _cli("rules", "test", str(_rules_dir(tmp_path / "good", UR001, UR001_CASES)))
    assert (good.exit_code, good.output.splitlines()[-1]) == (0, "1 passed, 0 failed, 1 cases")
    broken = _rules_dir(tmp_path / "bad", UR001.replace("sum(failed) AS failed", "sum(faild) AS failed"), UR001_CASES)
    result = _cli("rules", "test", str(broken))
    assert result.exit_code == 2
    assert result.output.splitlines()[0].startswith(
        f"ERROR UR001::one_in_three_failing_fires: {broken / 'UR001-window-error-rate.toml'}: detector.sql at line 1, "
        'column 32: Binder Error: Referenced column "faild" not found')
    assert result.output.splitlines()[-1] == "0 passed, 0 failed, 1 errors, 1 cases"


def test_case_rows_must_hold_values_ingest_writes(tmp_path):
    cases = UR001_CASES.replace("THEN 'error' ELSE 'ok'", "THEN 'failed' ELSE 'ok'")
    result = _cli("rules", "test", str(_rules_dir(tmp_path, UR001, cases)))
    assert result.exit_code == 2
    assert "one_in_three_failing_fires.requests: 10 row(s) have status = 'failed', which ingest never writes. " \
           "Use ok or error." in result.output


# --- USES: a Python detector against its TOML ------------------------------------------------------------------

DETECTOR = '''
USES = {"params": ["max_error_rate"], "requires": ["outcome"]}


def detect(ctx):
    ctx.path_available("outcome")
    return {"state": "clear", "summary": f"line {ctx.params['max_error_rate']}"}
'''
PYTHON_RULE = UR001.split("[views]")[0] + '''why_python = "a test"

[detector]
python = "sl_uses_probe:detect"

[[requires]]
id = "outcome"
name = "request outcome"
columns = ["status"]

[params.max_error_rate]
default = 0.05
reason = "One in twenty."
'''


@pytest.fixture
def probe(tmp_path, monkeypatch):
    (tmp_path / "sl_uses_probe.py").write_text(DETECTOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sl_uses_probe", raising=False)
    path = tmp_path / "UR001-window-error-rate.toml"

    def load(text: str) -> str:
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_rule_file(path)
        return str(info.value).replace(str(path), "FILE")

    path.write_text(PYTHON_RULE)
    assert load_rule_file(path).uses == {"params": ("max_error_rate",), "requires": ("outcome",)}
    return load


def test_a_renamed_requirement_is_a_load_error_not_a_silent_state_flip(probe):
    assert probe(PYTHON_RULE.replace('id = "outcome"', 'id = "outcomes"')) == (
        "FILE: no [[requires]] entry has id 'outcome', and sl_uses_probe:detect refers to it (USES) (did you mean "
        "'outcomes'?). Requirement ids: outcomes.")


def test_a_deleted_or_unused_parameter_is_a_load_error_not_a_key_error(probe):
    deleted = PYTHON_RULE.split("[params.max_error_rate]")[0]
    assert probe(deleted).startswith("FILE: params.max_error_rate is missing, and sl_uses_probe:detect uses it (USES)")
    extra = PYTHON_RULE + '\n[params.min_requests]\ndefault = 3\nreason = "x"\n'
    assert probe(extra).startswith("FILE: params.min_requests is declared but sl_uses_probe:detect does not use it")


# --- lifecycle: preview rules and aliases -----------------------------------------------------------------------

RECORDING = Path(__file__).resolve().parents[2] / "tests" / "data" / "recorded" / "gw-ratelimit-429" / "litellm_slp.jsonl"


def _analyze(tmp_path: Path, rules_dir: Path, *args: str, env: dict | None = None):
    out = tmp_path / "out.json"
    result = CliRunner().invoke(cli, ["analyze", str(RECORDING), "--rules", str(rules_dir), "--format", "json",
                                      "--out", str(out), *args], env=env, catch_exceptions=False)
    import json

    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_a_preview_rule_runs_only_with_preview(tmp_path):
    folder = _rules_dir(tmp_path, UR001.replace('status = "stable"', 'status = "preview"'))

    result = CliRunner().invoke(cli, ["analyze", str(RECORDING), "--rules", str(folder), "--select", "UR001"])
    assert result.exit_code != 0 and "UR001 is a preview rule and runs only with --preview" in str(result.exception)
    _, doc = _analyze(tmp_path, folder, "--select", "UR0,SL013")  # a prefix skips it quietly
    assert {f["rule"] for f in doc["findings"]} == {"SL013"}
    _, doc = _analyze(tmp_path, folder, "--select", "UR001", "--preview")
    assert {f["rule"] for f in doc["findings"]} == {"UR001"}
    _, doc = _analyze(tmp_path, folder, "--select", "UR001", env={"SERVLENS_PREVIEW": "1"})
    assert {f["rule"] for f in doc["findings"]} == {"UR001"}


def test_an_alias_selects_the_rule_and_takes_its_settings(tmp_path):
    folder = _rules_dir(tmp_path, UR001.replace('id = "UR001"', 'id = "UR001"\naliases = ["UR901"]'))
    _, doc = _analyze(tmp_path, folder, "--select", "UR901", "--set", "UR901.critical_rate=1.0")
    (rejected,) = [f for f in doc["findings"] if f["state"] == "fired"]
    assert (rejected["rule"], rejected["severity"]) == ("UR001", "critical")   # worst window 100% >= 1.0
    _, doc = _analyze(tmp_path, folder, "--select", "UR901", "--set", "UR901.critical_rate=1.0",
                      "--set", "UR901.max_error_rate=1.0")
    assert {f["state"] for f in doc["findings"]} == {"clear"}


def test_an_alias_may_not_name_another_rule(tmp_path):
    folder = _rules_dir(tmp_path, UR001.replace('id = "UR001"', 'id = "UR001"\naliases = ["SL004"]'))
    result = CliRunner().invoke(cli, ["rules", "list", "--rules", str(folder)])
    assert "alias SL004 is already the id or an alias of" in str(result.exception)


def test_engines_names_tested_engines_only(tmp_path):
    """`engines` says where a rule's parity with DuckDB is tested: a list of known engines that includes duckdb."""
    folder = _rules_dir(tmp_path, UR001.replace('id = "UR001"', 'id = "UR001"\nengines = ["duckdb", "oracle"]'))
    result = CliRunner().invoke(cli, ["rules", "list", "--rules", str(folder)])
    assert str(result.exception).endswith("UR001-window-error-rate.toml: engines must be a list of engine names "
                                          'that includes duckdb. Allowed: e.g. engines = ["duckdb", "chdb"] '
                                          "(duckdb, chdb, spark).")
    folder = _rules_dir(tmp_path / "ok", UR001.replace('id = "UR001"', 'id = "UR001"\nengines = ["chdb", "duckdb"]'))
    result = CliRunner().invoke(cli, ["rules", "list", "--rules", str(folder)])
    assert result.exit_code == 0 and "duckdb,chdb" in next(l for l in result.output.splitlines() if "UR001" in l)
