"""The rule loader (strict, messages naming file, key and what is allowed), parameter overrides, the runner's
document shape and states, SQL detectors, and the window layout."""

from __future__ import annotations

import json
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from servlens.analysis.cases import collect, run_case
from servlens.analysis.rules import (
    DOC_HEADINGS, builtin_rules_dir, load_rule_file, load_rules, parse_overrides, select_rules,
)
from servlens.analysis.runner import analyze, fails, fill_template
from servlens.analysis.windows import peak_length, spec_for, window_width
from servlens.errors import ConfigError
from servlens.store.schema import open_store

USER_RULES = Path(__file__).parent / "data" / "user_rules"
GOOD = (USER_RULES / "XY901-high-error-rate.toml").read_text()


def _write(tmp_path: Path, text: str, name: str = "XY901-high-error-rate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _message(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_rule_file(path)
    return str(info.value)


# --- loader ------------------------------------------------------------------------------------------------------

def test_builtin_rules_load_with_stable_ids_and_every_heading():
    rules = load_rules()
    assert [(r.id, r.name) for r in rules][:4] == [
        ("SL001", "prefix-cache-disabled"), ("SL002", "length-limit-finishes"),
        ("SL003", "reasoning-content-leakage"), ("SL004", "queue-driven-ttft-spike"),
    ]
    for rule in rules:
        assert rule.path.parent == builtin_rules_dir()
        assert all(f"## {h}" in rule.documentation for h in DOC_HEADINGS)
        assert rule.references() and all(ref for ref in rule.references())
        assert all(p.reason for p in rule.params.values())


def test_an_unknown_key_names_the_file_the_key_and_the_allowed_keys(tmp_path):
    path = _write(tmp_path, "severty = 'warning'\n" + GOOD)
    message = _message(path)
    assert message.startswith(f"{path}: unknown key 'severty' (did you mean 'severity'?). Allowed keys: id, name, title")


def test_a_bad_severity_says_what_is_allowed(tmp_path):
    path = _write(tmp_path, GOOD.replace('severity = "critical"', 'severity = "high"'))
    assert _message(path) == f"{path}: severity 'high' is not a severity. Allowed: info, warning, critical."


def test_a_name_must_be_kebab_case(tmp_path):
    path = _write(tmp_path, GOOD.replace('name = "high-error-rate"', 'name = "HighErrorRate"'))
    assert "name 'HighErrorRate' is not kebab-case" in _message(path)


def test_a_missing_documentation_heading_is_named(tmp_path):
    path = _write(tmp_path, GOOD.replace("## Rollback criteria\n", "## Rollback\n"))
    assert _message(path) == (f"{path}: documentation lacks the heading(s) '## Rollback criteria'. Allowed: these "
                              "headings in this order: " + ", ".join(DOC_HEADINGS) + ".")


def test_an_unknown_param_key_and_an_undeclared_sql_parameter_are_rejected(tmp_path):
    path = _write(tmp_path, GOOD.replace('reason = "One request in twenty', 'reasn = "x"\nreason = "One request in twenty'))
    assert _message(path) == (f"{path}: params.max_error_share.reasn is not a known key (did you mean 'reason'?). "
                              "Allowed: default, reason, min, max, choices.")
    path = _write(tmp_path, GOOD.replace("count(*) < $min_requests THEN 'not_evaluable'", "count(*) < $min_rows THEN 'not_evaluable'"))
    assert _message(path) == (f"{path}: detector.sql uses undeclared parameter(s) $min_rows. "
                              "Allowed: declare each as [params.NAME].")


def test_a_default_outside_its_bounds_and_an_unknown_column_are_rejected(tmp_path):
    path = _write(tmp_path, GOOD.replace("default = 0.05", "default = 1.5"))
    assert _message(path) == (f"{path}: params.max_error_share.default 1.5 is outside its own bounds. "
                              "Allowed: a number from 0 to 1.")
    path = _write(tmp_path, GOOD.replace('columns = ["status"]', 'columns = ["stauts"]'))
    assert "requires[0].columns names 'stauts', which is not a canonical request column (did you mean 'status'?)" in _message(path)


def test_the_file_name_must_start_with_the_id_and_ids_are_unique(tmp_path):
    path = _write(tmp_path, GOOD, name="high-error-rate.toml")
    assert _message(path) == (f"{path}: the file name must start with the rule id 'XY901-'. "
                              "Rename it to XY901-high-error-rate.toml.")
    clash = tmp_path / "clash"
    clash.mkdir()
    _write(clash, GOOD.replace('id = "XY901"', 'id = "SL004"').replace('name = "high-error-rate"', 'name = "other-thing"'),
           name="SL004-other-thing.toml")
    with pytest.raises(ConfigError, match=r"Rule id SL004 is defined twice: .*SL004-queue-driven-ttft-spike.toml and .*SL004-other-thing.toml"):
        load_rules([clash])


def test_set_overrides_are_typed_and_bad_ones_are_one_sentence():
    rules = load_rules()
    assert parse_overrides(["SL004.min_queue_share=0.6", "SL003.thinking_models=a*,b*"], rules) == {
        "SL004": {"min_queue_share": 0.6}, "SL003": {"thinking_models": ["a*", "b*"]}}
    cases = {
        "XX009.x=1": "--set names an unknown rule 'XX009'. Known rules: " + ", ".join(r.id for r in rules) + ".",
        "SL004.min_queue_shar=0.6": "SL004 has no parameter 'min_queue_shar' (did you mean 'min_queue_share'?). SL004 "
                                    "parameters: min_requests, min_window_requests, spike_ratio, min_excess_s, "
                                    "min_queue_share, tail_quantile, prompt_growth_limit, critical_ratio, critical_share, "
                                    "warmup_max_requests.",
        "SL004.min_queue_share=1.5": "SL004.min_queue_share must be a number from 0 to 1, not '1.5'.",
        "SL004.min_requests=2.5": "SL004.min_requests must be an integer of at least 1, not '2.5'.",
        "SL004.min_queue_share": "--set 'SL004.min_queue_share' is not RULE.param=value. For example --set SL004.min_queue_share=0.6.",
    }
    for setting, message in cases.items():
        with pytest.raises(ConfigError) as info:
            parse_overrides([setting], rules)
        assert str(info.value) == message


def test_select_and_ignore_take_ids_and_prefixes():
    rules = load_rules()
    assert [r.id for r in select_rules(rules, ["SL001", "SL004"], None)] == ["SL001", "SL004"]
    # A prefix selects every rule it starts (SL001-SL009 as the built-in set grows); --ignore drops one of them.
    assert [r.id for r in select_rules(rules, ["SL00"], ["SL002"])] == [
        r.id for r in rules if r.id.startswith("SL00") and r.id != "SL002"]
    assert [r.id for r in select_rules(rules, ["SL00"], ["SL002"])][:3] == ["SL001", "SL003", "SL004"]
    with pytest.raises(ConfigError, match="--select names an unknown rule 'SL099'"):
        select_rules(rules, ["SL099"], None)


# --- runner ------------------------------------------------------------------------------------------------------

def _store_with(rows_sql: str):
    con = open_store(None)
    con.execute(rows_sql)
    return con


def test_the_document_has_the_documented_shape_and_sorts_fired_first():
    con = _store_with("""INSERT INTO requests (run, model, request_id, status, t_arrival)
                         SELECT 'r', 'm', 'q' || i, CASE WHEN i % 4 = 0 THEN 'error' ELSE 'ok' END,
                                TIMESTAMP '2026-11-28 10:00:00' + to_seconds(i) FROM range(40) t(i)""")
    try:
        doc = analyze(con, load_rules([USER_RULES]))
    finally:
        con.close()
    assert set(doc) == {"kind", "schema_version", "generated_at", "servlens_version", "run", "coverage", "findings",
                        "workload", "chains", "goodput"}
    assert doc["kind"] == "analyze" and doc["schema_version"] == 2 and doc["run"] == "r"
    assert doc["workload"]["runs"]["r"]["requests"] == 40
    assert set(doc["coverage"]) == {"sources", "runs", "requests", "time_span", "models", "columns_present", "metrics_present"}
    assert doc["coverage"]["requests"] == 40 and doc["coverage"]["time_span"]["start"] == "2026-11-28T10:00:00.000Z"
    first = doc["findings"][0]
    assert (first["rule"], first["state"], first["severity"]) == ("XY901", "fired", "critical")
    assert set(first) == {"rule", "name", "title", "state", "severity", "scope", "summary", "reason", "evidence",
                          "examples", "remediation", "rollback", "references"}
    assert set(first["evidence"]) == {"metrics", "thresholds", "windows", "table", "chart"}
    assert first["scope"] == {"run": "r", "model": "m", "deployment": None}
    assert first["remediation"] == "Look at the error types; the error share was 25.0%."
    assert first["rollback"] == "Roll back if the error share does not fall below 5% within 30 minutes."
    assert first["references"] == ["https://example.org/runbook"]
    states = [f["state"] for f in doc["findings"]]
    assert states == sorted(states, key=["fired", "not_evaluable", "clear"].index)
    # Every builtin rule without its data says not_evaluable with a reason naming columns, never clear.
    for f in doc["findings"]:
        if f["rule"].startswith("SL"):
            assert f["state"] == "not_evaluable" and "missing" in f["reason"]
    json.dumps(doc)  # JSON-safe
    assert fails(doc, "critical") and fails(doc, "info") and not fails(doc, None)


def test_fail_on_compares_severities():
    doc = {"findings": [{"state": "fired", "severity": "warning"}, {"state": "clear", "severity": "critical"}]}
    assert fails(doc, "warning") and fails(doc, "info") and not fails(doc, "critical")


def test_an_unknown_run_is_an_input_error_listing_the_runs():
    con = _store_with("INSERT INTO requests (run, model) VALUES ('before', 'm')")
    try:
        with pytest.raises(ConfigError, match=r"No run named 'after' in the store. Runs in the store: before."):
            analyze(con, load_rules(), ["after"])
    finally:
        con.close()


def test_templates_fill_missing_values_with_na():
    assert fill_template("p99 {x:.2f} s, share {y:.0%}, {z}", {"x": 1.23456, "y": None}) == "p99 1.23 s, share n/a, n/a"


def test_user_rule_cases_run_through_the_harness():
    results = [run_case(rule, case) for rule, case in collect(USER_RULES)]
    assert [(r.case.id, r.passed) for r in results] == [
        ("XY901::one_in_five_failing_fires", True), ("XY901::all_ok_is_clear", True),
        ("XY901::no_status_is_not_evaluable", True)]


def test_a_failing_case_reports_what_differed(tmp_path):
    (tmp_path / "XY901-high-error-rate.toml").write_text(GOOD)
    cases = (USER_RULES / "XY901-high-error-rate.cases.toml").read_text().replace(
        'metrics = { requests = 50, error_share = 0.2 }', 'metrics = { requests = 50, error_share = 0.3 }')
    (tmp_path / "XY901-high-error-rate.cases.toml").write_text(cases)
    result = run_case(*collect(tmp_path)[0])
    assert not result.passed
    assert result.message == "scope r/m: metric error_share = 0.2, expected 0.3"


def test_every_case_file_is_valid_toml_beside_its_rule():
    for rule in load_rules():
        assert rule.cases_path is not None and rule.cases_path.name == f"{rule.path.stem}.cases.toml"
        with open(rule.cases_path, "rb") as handle:
            assert tomllib.load(handle)["rule"] == rule.id


# --- windows ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("span", "width"), [(0, 1), (20, 1), (59, 1), (60, 2), (119, 2), (150, 5), (600, 20),
                                             (1799, 30), (3600, 60), (86400, 60)])
def test_window_width_gives_30_to_75_windows_between_1_s_and_1_min(span, width):
    assert window_width(span) == width
    if 30 <= span <= 3600:
        assert 30 <= span / width <= 75


def test_peak_window_is_30_minutes_or_a_quarter_of_a_shorter_run():
    assert peak_length(86400, 60) == 1800
    assert peak_length(3600, 60) == 900
    assert peak_length(2, 1) == 1
    spec = spec_for(datetime(2026, 11, 28, 10), datetime(2026, 11, 28, 11))
    assert (spec.width_s, spec.peak_s, spec.count) == (60.0, 900.0, 61)
    assert spec.bounds(2, 3) == {"start": "2026-11-28T10:02:00.000Z", "end": "2026-11-28T10:04:00.000Z"}
