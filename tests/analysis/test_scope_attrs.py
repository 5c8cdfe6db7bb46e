"""The scope table keeps only the attrs keys built-in rules read (servlens/analysis/runner.py, BUILTIN_ATTRS_KEYS),
unless a selected user rule may read others: every value a rule reads is the one the store holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servlens.analysis.rules import load_rule_file, load_rules
from servlens.analysis.runner import (
    BUILTIN_ATTRS_KEYS,
    Scope,
    attrs_copy_for,
    prepare_scope,
    reads_all_attrs,
    run_rules,
)
from servlens.store.schema import open_store

DETECTORS = Path(__file__).resolve().parents[2] / "servlens" / "analysis" / "detectors"
SQL_USER_RULE = Path(__file__).parent / "data" / "sql_user_rules" / "UR001-window-error-rate.toml"
# every way a built-in rule may touch attrs: a guard on a key's text, or one key's value
ATTRS_USE = re.compile(r"""contains\(attrs,\s*'"(\w+)"'\)|json_extract(?:_string)?\(attrs,\s*'\$\.(\w+)'\)""")


def _without_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def test_built_in_rules_read_only_the_kept_attrs_keys():
    rules = load_rules([])
    readers = set()
    for rule in rules:
        sql = _without_comments("\n".join(sql for _, sql in rule.sql_items()))
        for match in ATTRS_USE.finditer(sql):
            key = match.group(1) or match.group(2)
            assert key in BUILTIN_ATTRS_KEYS, f"{rule.id} reads attrs key {key!r}: add it to BUILTIN_ATTRS_KEYS"
            readers.add(rule.id)
        # attrs named any other way (a whole-object read, a list of paths) would read keys the copy dropped
        assert len(re.findall(r"\battrs\b", sql)) == len(ATTRS_USE.findall(sql)), rule.id
        assert not reads_all_attrs(rule)
    assert readers == {"SL001", "SL002", "SL012"}
    for detector in DETECTORS.glob("*.py"):
        code = "\n".join(line.split("#")[0] for line in detector.read_text().splitlines())
        assert not re.search(r"\battrs\b", _without_comments(code)), detector.name


def test_a_user_rule_that_names_attrs_gets_all_of_them(tmp_path):
    assert not reads_all_attrs(load_rule_file(SQL_USER_RULE))
    text = SQL_USER_RULE.read_text().replace("sl_status_known(r)", "sl_status_known(r) AND (r.attrs IS NULL OR TRUE)", 1)
    assert text != SQL_USER_RULE.read_text()
    named = tmp_path / "UR001-window-error-rate.toml"
    named.write_text(text)
    assert reads_all_attrs(load_rule_file(named))


def _store():
    con = open_store(None)
    con.execute("""INSERT INTO requests (run, model, request_id, source_line, attrs) VALUES
                   ('r', 'm', 'a', 1, '{"prefix_blocks": [1, 2], "team": "x"}'),
                   ('r', 'm', 'b', 2, '{"team": "y", "user": "z"}'),
                   ('r', 'm', 'c', 3, NULL),
                   ('r', 'm', 'd', 4, '{"ignore_eos": true}'),
                   ('r', 'm', 'e', 5, '{"parallel": 4}')""")
    return con


@pytest.mark.parametrize(("attrs_copy", "expected"), [
    ("all", ['{"prefix_blocks": [1, 2], "team": "x"}', '{"team": "y", "user": "z"}', None, '{"ignore_eos": true}',
            '{"parallel": 4}']),
    ("keys", ['{"prefix_blocks": [1, 2], "team": "x"}', '{}', None, '{"ignore_eos": true}', '{"parallel": 4}']),
    ("none named", ['{}', '{}', None, '{}', '{}']),  # the copy for runs where no row names a key
])
def test_the_scope_copy_of_attrs(attrs_copy, expected):
    con = _store()
    columns, _ = prepare_scope(con, Scope("r", "m", None), attrs_copy)
    got = con.execute("SELECT CAST(attrs AS VARCHAR) FROM scope_requests ORDER BY source_line").fetchall()
    assert [row[0] for row in got] == expected
    assert con.execute("SELECT typeof(attrs) FROM scope_requests LIMIT 1").fetchone()[0] == "JSON"
    assert "attrs" in columns


def test_the_copy_is_chosen_from_the_rules_and_the_runs(tmp_path):
    con = _store()
    rules = load_rules([])
    assert attrs_copy_for(con, rules, "'r'") == "keys"
    con.execute("UPDATE requests SET attrs = '{\"team\": \"y\"}' WHERE attrs IS NOT NULL")
    assert attrs_copy_for(con, rules, "'r'") == "none named"
    named = tmp_path / "UR001-window-error-rate.toml"
    named.write_text(SQL_USER_RULE.read_text().replace("sl_status_known(r)", "sl_status_known(r) AND r.attrs IS NULL", 1))
    assert attrs_copy_for(con, [*rules, load_rule_file(named)], "'r'") == "all"


def test_findings_are_the_same_with_every_attrs_copied(tmp_path):
    """The SL001 block-hash path, SL002's ignore_eos and SL012's parallel, on rows that carry other keys too."""
    con = open_store(None)
    con.execute("""INSERT INTO requests (run, model, request_id, source_line, t_arrival, t_end, prompt_tokens,
                                         completion_tokens, max_tokens, finish_reason, status, attrs)
                   SELECT 'r', 'm', 'q' || i, i + 1, TIMESTAMP '2026-11-28 10:00:00' + to_seconds(i),
                          TIMESTAMP '2026-11-28 10:00:01' + to_seconds(i), 600, 64, 64,
                          CASE WHEN i % 3 = 0 THEN 'length' ELSE 'stop' END, 'ok',
                          CASE i % 4 WHEN 0 THEN json_object('prefix_blocks', [1, 2, i % 5], 'team', 't')
                                     WHEN 1 THEN json_object('team', 'u')
                                     WHEN 2 THEN json_object('parallel', 2) END
                   FROM range(200) t(i)""")
    con.execute("INSERT INTO runs (run) VALUES ('r')")
    rules = load_rules([])
    params = {r.id: r.default_params() for r in rules}
    kept = run_rules(con, rules, ["r"], params)
    named = tmp_path / "UR001-window-error-rate.toml"
    named.write_text(SQL_USER_RULE.read_text().replace("sl_status_known(r)", "sl_status_known(r) AND (r.attrs IS NULL OR TRUE)", 1))
    user = load_rule_file(named)
    everything = run_rules(con, [*rules, user], ["r"], params | {user.id: user.default_params()})
    assert [f for f in everything if f["rule"] != user.id] == kept
    assert {f["rule"]: f["state"] for f in kept}["SL002"] == "fired"
