"""A user rule's SQL is locked down (issue 15, class 7), and a Python rule that returns the wrong type is one
sentence naming it (class 8): a --rules folder's SQL is one SELECT over the scope views, checked when the rule is
loaded and again before it runs, on a connection that can no longer touch a file or a setting."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.errors import ConfigError
from servlens.sandbox import check_rule_expression, check_rule_sql, lock_down
from servlens.store.schema import open_store
from tests.safety.corpus import write_requests

USER_RULES = Path(__file__).resolve().parents[1] / "analysis" / "data" / "user_rules"
GOOD_RULE = (USER_RULES / "XY901-high-error-rate.toml").read_text()
GOOD_SQL = GOOD_RULE.split('sql = """', 1)[1].split('"""', 1)[0]
HINT = "A rule's SQL is one SELECT over the scope views (docs/security.md)."
NOT_SELECT = ("is not one SQL query servlens may run: only a SELECT may run (no ATTACH, COPY, INSTALL, LOAD, SET, "
              "PRAGMA or change to the store)")


def _rule_dir(tmp_path: Path, sql: str) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "XY901-high-error-rate.toml").write_text(GOOD_RULE.replace(GOOD_SQL, "\n" + sql + "\n"))
    return folder


@pytest.mark.parametrize(("sql", "refusal"), [
    ("SELECT content AS summary FROM read_text('/etc/passwd')",
     "calls the table function read_text() on '/etc/passwd', which a rule's SQL may not do"),
    ("SELECT count(*) FROM read_csv('/etc/passwd')", "calls the table function read_csv() on '/etc/passwd'"),
    ("SELECT count(*) FROM read_json('/tmp/x.json')", "calls the table function read_json() on '/tmp/x.json'"),
    ("SELECT count(*) FROM read_parquet('/tmp/x.parquet')", "calls the table function read_parquet() on"),
    ("SELECT count(*) FROM glob('/etc/*')", "calls the table function glob() on '/etc/*'"),
    ("SELECT count(*) FROM '/etc/passwd'", "reads the table '/etc/passwd'"),
    ("SELECT count(*) FROM duckdb_settings()", "calls the table function duckdb_settings()"),
    ("SELECT max(run) FROM requests", "reads the table 'requests', which a rule's SQL may not do"),
    ("SELECT count(*) FROM main.scope_requests", "reads the table 'scope_requests'"),
    (("SELECT (SELECT 1 FROM (WITH requests AS (SELECT 1) SELECT * FROM requests)), "
      "(SELECT count(*) FROM requests)"), "reads the table 'requests'"),
    ("SELECT getenv('HOME') AS summary", "calls getenv()"),
    ("SELECT current_setting('temp_directory') AS summary", "calls current_setting()"),
    ("SELECT nextval('source_id_seq') AS summary", "calls nextval()"),
    ("SELECT 'clear' AS state; SELECT 'fired' AS state", "holds 2 SQL statements, not one query"),
    ("SELECT 'clear' AS state; DELETE FROM requests", NOT_SELECT),
    ("ATTACH '/tmp/other.duckdb' AS other", NOT_SELECT),
    ("COPY (SELECT 1) TO '/tmp/out.csv'", NOT_SELECT),
    ("INSTALL httpfs", NOT_SELECT),
    ("LOAD httpfs", NOT_SELECT),
    ("SET enable_external_access = true", NOT_SELECT),
    ("PRAGMA database_list", NOT_SELECT),
    ("DELETE FROM requests", NOT_SELECT),
])
def test_a_user_rule_whose_sql_reaches_outside_the_scope_views_is_refused_at_load(tmp_path, sql, refusal):
    folder = _rule_dir(tmp_path, sql)
    with pytest.raises(ConfigError) as caught:
        load_rules([folder])
    message = str(caught.value)
    assert message.startswith(f"{folder / 'XY901-high-error-rate.toml'}: detector.sql {refusal}"), message
    assert message.endswith(HINT)


@pytest.mark.parametrize("sql", [
    GOOD_SQL,
    "WITH s AS (SELECT count(*) AS n FROM scope_requests) SELECT 'clear' AS state, n FROM s",
    "SELECT 'clear' AS state, count(*) AS n FROM scope_metrics, range(3) r(i), unnest([1, 2]) u(x)",
])
def test_a_rule_over_the_scope_views_passes(sql):
    check_rule_sql(sql, "rule")


def test_a_decide_predicate_is_checked_too():
    check_rule_expression("known < 10 AND share >= 0.5", "XY901: decide.fired")
    with pytest.raises(ConfigError) as caught:
        check_rule_expression("(SELECT count(*) FROM read_text('/etc/passwd')) > 0", "XY901: decide.fired")
    assert str(caught.value).startswith("XY901: decide.fired calls the table function read_text() on '/etc/passwd'")


def _store_with_requests():
    con = open_store(None)
    con.execute("""INSERT INTO requests (run, model, request_id, status, t_arrival)
                   SELECT 'r', 'm', 'q' || i, CASE WHEN i % 4 = 0 THEN 'error' ELSE 'ok' END,
                          TIMESTAMP '2026-11-28 10:00:00' + to_seconds(i) FROM range(40) t(i)""")
    return con


def test_a_user_rule_runs_on_a_locked_down_connection(tmp_path):
    con = _store_with_requests()
    secret = tmp_path / "secret.txt"
    secret.write_text("nothing to see\n")
    assert con.execute(f"SELECT count(*) FROM read_text('{secret}')").fetchone()[0] == 1  # before: ingest may read
    doc = analyze(con, load_rules([USER_RULES]), overrides={})
    assert [f["state"] for f in doc["findings"] if f["rule"] == "XY901"] == ["fired"]
    for statement, error in ((f"SELECT * FROM read_text('{secret}')", duckdb.PermissionException),
                             (f"COPY requests TO '{tmp_path / 'out.csv'}'", duckdb.PermissionException),
                             (f"ATTACH '{tmp_path / 'other.duckdb'}' AS other", duckdb.PermissionException),
                             ("SET enable_external_access = true", duckdb.Error),
                             ("SET threads = 1", duckdb.InvalidInputException)):
        with pytest.raises(error):
            con.execute(statement)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "other.duckdb").exists()
    con.close()


def test_built_in_rules_leave_the_connection_as_it_was():
    con = _store_with_requests()
    analyze(con, load_rules(), overrides={})
    assert con.execute("SELECT current_setting('enable_external_access'), current_setting('lock_configuration')"
                       ).fetchone() == (True, False)
    con.close()


def test_the_sql_is_checked_again_right_before_it_runs(tmp_path):
    # A rule changed after it was loaded (the runner is handed Rule objects) is still checked where it runs.
    con = _store_with_requests()
    rules = [dataclasses.replace(r, sql="SELECT content AS summary FROM read_text('/etc/passwd')")
             if r.id == "XY901" else r for r in load_rules([USER_RULES])]
    with pytest.raises(ConfigError) as caught:
        analyze(con, rules, overrides={})
    assert "detector.sql calls the table function read_text() on '/etc/passwd'" in str(caught.value)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 40
    con.close()


def test_lock_down_is_idempotent():
    con = duckdb.connect()
    lock_down(con)
    lock_down(con)
    assert con.execute("SELECT current_setting('lock_configuration')").fetchone()[0] is True


PY_RULE = GOOD_RULE.replace('[detector]\nsql = """' + GOOD_SQL + '"""',
                            'why_python = "It tests what the runner does with a Python result."\n\n'
                            '[detector]\npython = "xy901_detector:detect"')
PY_MODULE = """
USES = {{"params": ["max_error_share", "min_requests"], "requires": ["status"]}}


def detect(ctx):
    return {result}
"""


@pytest.mark.parametrize(("result", "message"), [
    ("['fired']", "Rule XY901's detector (python xy901_detector:detect) returned a list, not a dict"),
    ("None", "Rule XY901's detector (python xy901_detector:detect) returned None, not a dict"),
    ("{'state': 'fired', 'summary': 'x', 'evidence': [1, 2]}",
     "Rule XY901's detector (python xy901_detector:detect) returned evidence as a list, not a dict"),
    ("{'state': 'fired', 'summary': 3}",
     "Rule XY901's detector (python xy901_detector:detect) returned summary as a int, not text"),
])
def test_a_python_rule_returning_the_wrong_type_is_one_sentence(tmp_path, result, message):
    folder = tmp_path / "rules"
    folder.mkdir()
    assert PY_RULE != GOOD_RULE
    (folder / "XY901-high-error-rate.toml").write_text(PY_RULE)
    (tmp_path / "xy901_detector.py").write_text(PY_MODULE.format(result=result))
    log = write_requests(tmp_path / "log.jsonl", 20)
    done = subprocess.run([sys.executable, "-m", "servlens", "analyze", str(log), "--rules", str(folder),
                           "--select", "XY901", "--preview"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"Error: {message}. A detector returns a dict: state"), done.stderr
