"""Every built-in rule's cases (rules/*.cases.toml), one test each, with ids like SL004::case_name."""

from __future__ import annotations

import pytest

from servlens.analysis.cases import collect, run_case, rules_without_cases

PAIRS = collect()


@pytest.mark.parametrize(("rule", "case"), PAIRS, ids=[case.id for _, case in PAIRS])
def test_rule_case(rule, case):
    result = run_case(rule, case)
    assert result.passed, result.message


def test_every_builtin_rule_has_cases_that_fire_and_cases_that_do_not():
    assert rules_without_cases() == []
    by_rule: dict[str, set[str]] = {}
    for rule, case in PAIRS:
        expect = case.data["expect"]
        states = {expect} if isinstance(expect, str) else {e["state"] for e in expect}
        by_rule.setdefault(rule.id, set()).update(states)
    for rule_id, states in by_rule.items():
        assert {"fired", "clear", "not_evaluable"} <= states, f"{rule_id} lacks a case for {sorted({'fired', 'clear', 'not_evaluable'} - states)}"
