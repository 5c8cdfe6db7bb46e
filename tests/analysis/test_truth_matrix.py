"""Every rule on every recorded real run: `servlens analyze` as a user runs it, checked cell by cell against
tests/truth/TRUTH.toml (written from the raw files; format and cell grammar in tools/truth/matrix.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tools/ is not installed; the matrix is imported from the checkout
    sys.path.insert(0, str(REPO))

from tools.truth.matrix import Cell, cells_for, load_truth, matches  # noqa: E402
from tools.truth.matrix import documents as analyze_each_command  # noqa: E402

ENTRIES = load_truth()


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[tuple, dict]:
    return analyze_each_command(ENTRIES, tmp_path_factory.mktemp("truth"))


def test_the_matrix_covers_at_least_20_runs_and_every_rule_of_each():
    from servlens.analysis.rules import load_rules

    rule_ids = {r.id for r in load_rules()}
    assert len(ENTRIES) >= 20
    for entry in ENTRIES:
        written = {k for k in entry if k.startswith("SL")}
        assert written == rule_ids, f"{entry['name']}: cells missing for {sorted(rule_ids - written)}"
        assert entry.get("raw"), f"{entry['name']}: say what the raw data shows"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_every_cell_of_the_run(entry, documents):
    cells, misses = cells_for(entry, documents[tuple(entry["analyze"])])
    wrong = [f"{c.rule} [{c.scope}]: expected {c.expected}, got {c.got or 'no result'}" for c in cells if not c.right]
    assert not wrong and not misses, "\n".join(wrong + misses)


def test_a_cell_grammar_that_can_fail():
    assert matches("fired", "fired:critical") and matches("clear|not_evaluable", "not_evaluable")
    assert not matches("fired:warning", "fired:critical") and not matches("clear", "not_evaluable")
    assert not Cell("r", "SL001", "*", "either", []).right  # a rule that gave no result is never right
