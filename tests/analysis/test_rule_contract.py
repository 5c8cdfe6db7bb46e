"""The SQL rule contract's pieces: macros and parameters, the scope views (t_window, scope_windows, metric roles),
the statistical functions, strict loading of [views]/[decide]/[summary]/[evidence.*], and rule-SQL errors that name
the file, the key and the position."""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy.stats import binom, mannwhitneyu

from servlens.analysis import failures, vocabulary
from servlens.analysis.rule_sql import SqlMacroError, expand_macros, prepare, substitute_params
from servlens.analysis.rules import load_rule_file
from servlens.analysis.runner import Scope, evaluate, prepare_scope
from servlens.analysis.windows import iso, spec_for
from servlens.errors import ConfigError
from servlens.store import metric_roles
from servlens.store.schema import open_store

UR001 = (Path(__file__).parent / "data" / "sql_user_rules" / "UR001-window-error-rate.toml").read_text()


# --- macros and parameters -----------------------------------------------------------------------------------

def test_macros_expand_to_the_vocabulary_definitions_qualified_by_an_alias():
    assert expand_macros("SELECT sl_failed() FROM t", {}) == f"SELECT ({failures.failed()}) FROM t"
    assert expand_macros("sl_timeout(r)", {}) == f"({vocabulary.timeout('r')})"
    assert "r.queue_s" in expand_macros("sl_wait_s(r)", {}) and "r.ttft_s" in expand_macros("sl_wait_s(r)", {})
    assert expand_macros("sl_prompt_band(r.prompt_tokens)", {}) == f"({vocabulary.length_band('r.prompt_tokens')})"
    # nested: the argument is expanded first
    assert failures.failed() in expand_macros("sl_output_band(CASE WHEN sl_failed() THEN 0 END)", {})


def test_names_in_strings_and_comments_are_left_alone():
    sql = "SELECT 'sl_failed() costs $5' AS s -- sl_failed() and $x\nFROM t WHERE n > $n"
    assert prepare(sql, {"n": 3}) == "SELECT 'sl_failed() costs $5' AS s -- sl_failed() and $x\nFROM t WHERE n > 3"


def test_parameters_become_literals_of_their_type():
    out = substitute_params("SELECT $a, $b, $c, $d, $e", {"a": 0.5, "b": 7, "c": True, "d": "it's", "e": ["x", "y"]})
    assert out == "SELECT 0.5, 7, TRUE, 'it''s', ['x', 'y']"


def test_glob_any_and_pct_match_python():
    import duckdb

    con = duckdb.connect()
    got = con.execute(prepare("SELECT sl_glob_any('Qwen3-4B-Thinking-2507', $p), sl_glob_any('llama-3', $p), "
                              "sl_pct(0.425, 0), sl_pct(1 / 3, 1), sl_pct(0.002, 2), sl_pct(NULL, 1)",
                              {"p": ["*thinking*", "*-r1-*"]})).fetchone()
    assert got == (True, False, f"{0.425:.0%}", f"{1 / 3:.1%}", "0.20%", None)


@pytest.mark.parametrize(("sql", "message", "line", "column"), [
    ("SELECT\n  sl_failed(a, b)", "sl_failed() takes no argument or one table alias, not (a,  b)", 2, 3),
    ("SELECT sl_prompt_band()", "sl_prompt_band(expr) takes one expression, got 0 argument(s)", 1, 8),
    ("SELECT sl_pct(x)", "sl_pct(expr, digits) takes an expression and a digit count 0-6", 1, 8),
    ("SELECT 1\nWHERE x > $nope", "$nope is not a parameter of this rule", 2, 11),
])
def test_a_bad_macro_call_or_parameter_names_its_position(sql, message, line, column):
    with pytest.raises(SqlMacroError) as info:
        prepare(sql, {})
    assert info.value.message == message
    assert (info.value.where.line, info.value.where.column) == (line, column)


# --- scope views ---------------------------------------------------------------------------------------------

def _store_with_requests(count: int = 90, step_s: int = 2):
    con = open_store(None)
    con.execute(f"""INSERT INTO requests (run, model, request_id, source_line, t_arrival, status)
                    SELECT 'r', 'm', 'q' || i, i + 1, TIMESTAMP '2026-11-28 10:00:00' + to_seconds(i * {step_s}),
                           CASE WHEN i % 10 = 0 THEN 'error' ELSE 'ok' END FROM range({count}) t(i)""")
    return con


def test_scope_windows_and_t_window_are_the_window_layout():
    con = _store_with_requests()
    prepare_scope(con, Scope("r", "m", None))
    t0, t1 = con.execute("SELECT min(t_at), max(t_at) FROM scope_requests").fetchone()
    spec = spec_for(t0, t1)
    windows = con.execute("SELECT t_window, w_start, w_end, width_s, is_first FROM scope_windows ORDER BY 1").fetchall()
    assert len(windows) == spec.count and spec.width_s == 5.0
    assert [(w[0], iso(w[1]), iso(w[2])) for w in windows] == [
        (i, spec.bounds(i)["start"], spec.bounds(i)["end"]) for i in range(spec.count)]
    assert windows[0][4] and not any(w[4] for w in windows[1:]) and {w[3] for w in windows} == {5.0}
    # every request sits in the window whose bounds hold it
    outside = con.execute("""SELECT count(*) FROM scope_requests r JOIN scope_windows w USING (t_window)
                             WHERE NOT (r.t_at >= w.w_start AND r.t_at < w.w_end)""").fetchone()[0]
    assert outside == 0


def test_a_scope_without_times_has_no_windows():
    con = open_store(None)
    con.execute("INSERT INTO requests (run, model, request_id) VALUES ('r', 'm', 'a')")
    prepare_scope(con, Scope("r", "m", None))
    assert con.execute("SELECT count(*) FROM scope_windows").fetchone()[0] == 0
    assert con.execute("SELECT t_window FROM scope_requests").fetchone()[0] is None


def test_metric_roles_come_from_the_one_file_and_join_the_scope_samples():
    assert metric_roles.names("waiting") == ("vllm:num_requests_waiting", "llamacpp:requests_deferred",
                                             "sglang:num_queue_reqs", "tgi_queue_size", "nv_trt_llm_request_metrics",
                                             "num_requests_waiting", "trtllm_num_requests_waiting")
    assert metric_roles.names("kv_usage")[0] == "vllm:kv_cache_usage_perc"
    con = open_store(None)
    con.execute("""INSERT INTO metric_samples (run, ts, name, type, series, labels, value) VALUES
                   ('r', TIMESTAMP '2026-11-28 10:00:00', 'llamacpp:requests_deferred', 'gauge', 'value', MAP {}, 3),
                   ('r', TIMESTAMP '2026-11-28 10:00:00', 'process_cpu_seconds', 'counter', 'value', MAP {}, 1)""")
    prepare_scope(con, Scope("r", None, None))
    assert con.execute("SELECT role, engine, preference, value FROM scope_role_samples").fetchall() == [
        ("waiting", "llamacpp", 2, 3.0)]


def test_a_role_with_a_label_takes_only_the_series_with_that_label():
    # Triton's TRT-LLM backend: one gauge family, the statistic in request_type
    con = open_store(None)
    con.execute("""INSERT INTO metric_samples (run, ts, name, type, series, labels, value)
                   SELECT 'r', TIMESTAMP '2026-11-28 10:00:00', 'nv_trt_llm_request_metrics', 'gauge', 'value',
                          MAP {'request_type': t}, v
                   FROM (VALUES ('waiting', 6), ('scheduled', 4), ('max', 512), ('active', 10)) x(t, v)""")
    prepare_scope(con, Scope("r", None, None))
    assert con.execute("SELECT role, engine, value FROM scope_role_samples ORDER BY role").fetchall() == [
        ("running", "triton-trtllm", 4.0), ("waiting", "triton-trtllm", 6.0)]
    with pytest.raises(ConfigError, match=r"x\.toml: role\[0\]: labels must be one label = value"):
        metric_roles.parse_roles({"role": [{"role": "a", "engine": "e", "name": "n", "kind": "gauge", "source": "s",
                                            "labels": {"a": "1", "b": "2"}}]}, "x.toml")


def test_the_roles_file_is_validated():
    with pytest.raises(ConfigError, match=r"x\.toml: role\[0\]: kind 'level' is not a kind"):
        metric_roles.parse_roles({"role": [{"role": "a", "engine": "e", "name": "n", "kind": "level",
                                            "source": "s"}]}, "x.toml")


# --- statistical functions ------------------------------------------------------------------------------------

def test_statistical_functions_match_scipy():
    con = open_store(None)
    prepare_scope(con, Scope("r", None, None))
    binom_p, mw_p = con.execute("SELECT sl_binom_sf(7, 20, 0.2), sl_mannwhitney_less_p([1.0, 2, 3, 4], "
                                "[3.5, 5, 6, 7, 8])").fetchone()
    assert binom_p == pytest.approx(float(binom.sf(6, 20, 0.2)), rel=1e-12)
    assert mw_p == pytest.approx(float(mannwhitneyu([1, 2, 3, 4], [3.5, 5, 6, 7, 8], alternative="less").pvalue))
    assert con.execute("SELECT sl_fisher_greater_p(3, 0, 0, 7)").fetchone()[0] == pytest.approx(1 / 120)


# --- loading ---------------------------------------------------------------------------------------------------

def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "UR001-window-error-rate.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_rule_file(path)
    return str(info.value).replace(str(path), "FILE")


@pytest.mark.parametrize(("old", "new", "message"), [
    ('[summary]\nfired = ', '[summary]\nfird = ', "FILE: summary.fird is not a known key. Allowed: fired, clear, "
                                                  "not_evaluable"),
    ('order_by = "t_at"', 'order = "t_at"', "FILE: evidence.examples.order is not a known key. Allowed: where, "
                                             "order_by, from, limit, always"),
    ('hlines_sql = "SELECT $max_error_rate', 'hlines_sql = "SELECT $max_err_rate',
     "FILE: evidence.chart.hlines_sql uses undeclared parameter(s) $max_err_rate. Allowed: declare each as "
     "[params.NAME]"),
    ('level = "critical"', 'level = "high"', "FILE: decide.severity[0].level 'high' is not a severity. Allowed: "
                                             "info, warning, critical"),
    ('type = "line"', 'type = "pie"', "FILE: evidence.chart.type 'pie' is not a chart type. Allowed: line, step, "
                                      "bar, scatter, cdf"),
    ('[views]\nerror_windows', '[views]\nscope_errors', "FILE: views.scope_errors is not a name a rule's view may "
                                                         "take."),
    ('id = "outcome"\n', '', "FILE: requires[0].id is missing. Allowed: a snake_case id the detector code refers "
                             "to"),
    ('not_evaluable = "Too few', 'not_evaluble = "Too few', "FILE: summary.not_evaluble is not a known key."),
    ('id = "UR001"', 'id = "UR001"\nwhy_python = "x"', "FILE: why_python is given for a SQL detector."),
    ('[detector]\nsql = \'\'\'', '[detector]\npython = "m:f"\nignored = \'\'\'', "FILE: detector.ignored is not a "
                                                                                   "known key."),
])
def test_contract_errors_name_the_file_the_key_and_what_is_allowed(tmp_path, old, new, message):
    assert old in UR001
    assert _load(tmp_path, UR001.replace(old, new, 1)).startswith(message)


def test_a_python_rule_cannot_carry_decide_and_needs_why_python(tmp_path):
    text = UR001.replace("[detector]\nsql = '''", "[detector]\npython = \"mod:detect\"\n[unused]\nsql = '''", 1)
    assert "unknown key 'unused'" in _load(tmp_path, text)
    python_rule = UR001.split("[views]")[0] + "[detector]\npython = \"mod:detect\"\n" + UR001.split("[[requires]]")[1]
    python_rule = python_rule.replace('id = "outcome"', '[[requires]]\nid = "outcome"', 1)
    assert _load(tmp_path, python_rule).startswith("FILE: why_python is missing (detector.python needs it)")
    with_decide = python_rule.replace("[detector]", "why_python = \"stats\"\n[decide]\nfired = \"true\"\n[detector]")
    assert _load(tmp_path, with_decide).startswith("FILE: decide applies to SQL detectors only")


# --- running --------------------------------------------------------------------------------------------------

def _rule(tmp_path: Path, text: str):
    path = tmp_path / "UR001-window-error-rate.toml"
    path.write_text(text)
    return load_rule_file(path)


def test_broken_rule_sql_names_the_file_the_key_and_the_line_and_column(tmp_path):
    rule = _rule(tmp_path, UR001.replace("count(*) FILTER (WHERE bad) AS bad_windows",
                                         "count(*) FILTER (WHERE badd) AS bad_windows"))
    con = _store_with_requests()
    with pytest.raises(ConfigError) as info:
        evaluate(con, rule, Scope("r", "m", None), rule.default_params())
    message = str(info.value)
    assert message.startswith(f"{rule.path}: detector.sql at line 1, column 74: Binder Error: Referenced column "
                              '"badd" not found in FROM clause!')


def test_a_detector_must_return_one_row(tmp_path):
    rule = _rule(tmp_path, UR001.replace("FROM error_windows\n'''\n\n[decide]",
                                         "FROM error_windows GROUP BY t_window\n'''\n\n[decide]"))
    con = _store_with_requests()
    with pytest.raises(ConfigError, match=r"detector\.sql: returned \d+ rows; the detector returns exactly one row"):
        evaluate(con, rule, Scope("r", "m", None), rule.default_params())


def test_decide_evaluates_not_evaluable_then_fired_then_severity(tmp_path):
    rule = _rule(tmp_path, UR001)
    con = _store_with_requests()  # 10% of the requests fail, spread evenly
    scope = Scope("r", "m", None)
    found = evaluate(con, rule, scope, rule.default_params())
    assert (found["state"], found["severity"]) == ("fired", "warning")
    assert found["evidence"]["metrics"]["worst_rate"] == pytest.approx(1 / 3, rel=1e-3)
    assert found["examples"] and found["evidence"]["windows"]
    upgraded = evaluate(con, rule, scope, rule.default_params() | {"critical_rate": 0.3})
    assert upgraded["severity"] == "critical"
    clear = evaluate(con, rule, scope, rule.default_params() | {"max_error_rate": 0.4})
    assert clear["state"] == "clear" and clear["evidence"]["table"] is None and clear["examples"] == []
    too_few = evaluate(con, rule, scope, rule.default_params() | {"min_requests": 1000})
    assert (too_few["state"], too_few["reason"]) == (
        "not_evaluable", "only 90 requests with a known outcome; the rule needs 1000")
    # the views and the metrics table are gone after each rule
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'error_windows'").fetchone()[0] == 0
