"""The typed result documents (servlens/documents.py) and the JSON Schemas shipped from them.

Every analyze, compare and ingest document and every finding the rest of the suite produces is validated by the
autouse hook in tests/conftest.py (tests/documents.py); these tests check the schemas themselves, the hook, the
documents committed in reports/examples, and that the small checker `servlens report` runs agrees with jsonschema.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from servlens.documents import KINDS, SCHEMA_VERSION, load_schema, problems
from tests.documents import assert_valid, validator
from tests.render.conftest import make_analyze_doc, make_compare_doc
from tools.make_schemas import schema_text

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_schema_is_the_one_the_types_generate(kind):
    shipped = (REPO / "servlens" / "schemas" / f"{kind}.schema.json").read_text(encoding="utf-8")
    assert shipped == schema_text(kind), "run python tools/make_schemas.py"
    jsonschema.Draft202012Validator.check_schema(load_schema(kind))
    assert load_schema(kind)["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert load_schema(kind)["properties"]["kind"] == {"const": kind}


def test_the_schemas_are_package_data_of_an_installed_build():
    from importlib import resources

    files = {p.name for p in resources.files("servlens.schemas").iterdir()}
    assert {f"{kind}.schema.json" for kind in KINDS} <= files
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"servlens.schemas" = ["*.schema.json"]' in pyproject and '"servlens.schemas",' in pyproject


@pytest.mark.parametrize("name", ["incident-prefix-cache-off.json", "gate-prefix-cache-on-vs-prefix-cache-off.json"])
def test_the_committed_examples_validate(name):
    doc = json.loads((REPO / "reports" / "examples" / name).read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert_valid(doc, doc["kind"])
    assert problems(doc, doc["kind"]) == []


def test_the_renderer_fixtures_are_real_documents():
    assert_valid(make_analyze_doc(), "analyze")
    assert_valid(make_compare_doc(), "compare")


def test_the_hook_is_active_and_catches_a_finding_of_the_wrong_shape():
    from servlens.analysis import runner

    assert getattr(runner.evaluate, "__wrapped_for_schema__", False)
    finding = copy.deepcopy(make_analyze_doc()["findings"][0])
    assert_valid(finding, "analyze", "Finding")
    finding["evidence"]["table"] = {"columns": ["a"], "rows": [[1]], "note": "made up"}
    with pytest.raises(AssertionError, match=r"\$\.evidence\.table.*'note' was unexpected"):
        assert_valid(finding, "analyze", "Finding")


def _mutations():
    """(label, document) pairs, each one change away from a valid document."""
    def changed(make, edit):
        doc = make()
        edit(doc)
        return doc

    analyze, compare = make_analyze_doc, make_compare_doc
    return [
        ("valid analyze", analyze()),
        ("valid compare", compare()),
        ("unknown state", changed(analyze, lambda d: d["findings"][0].__setitem__("state", "maybe"))),
        ("severity missing", changed(analyze, lambda d: d["findings"][1].pop("severity"))),
        ("extra evidence key", changed(analyze, lambda d: d["findings"][0]["evidence"].__setitem__("raw", 1))),
        ("chart without series", changed(analyze, lambda d: d["findings"][0]["evidence"]["chart"].pop("series"))),
        ("a string for a count", changed(analyze, lambda d: d["coverage"].__setitem__("requests", "4812"))),
        ("a boolean for a line", changed(analyze, lambda d: d["findings"][0]["examples"][0].__setitem__("line", True))),
        ("run as a number", changed(analyze, lambda d: d.__setitem__("run", 7))),
        ("a float count", changed(analyze, lambda d: d["coverage"].__setitem__("requests", 4812.0))),
        ("gate verdict", changed(compare, lambda d: d["gates"][0].__setitem__("verdict", "ok"))),
        ("gate kind", changed(compare, lambda d: d["gates"][1].__setitem__("kind", "ratio"))),
        ("extra gate key (open)", changed(compare, lambda d: d["gates"][1].__setitem__("detectable_change", 0.2))),
        ("notes not strings", changed(compare, lambda d: d.__setitem__("notes", [{"text": "x"}]))),
        ("old version", changed(compare, lambda d: d.__setitem__("schema_version", 1))),
    ]


@pytest.mark.parametrize(("label", "doc"), _mutations(), ids=[label for label, _ in _mutations()])
def test_the_report_checker_agrees_with_jsonschema(label, doc):
    expected = not list(validator(doc["kind"]).iter_errors(doc))
    found = problems(doc, doc["kind"])
    assert (not found) == expected, (label, found)
    assert expected == label.startswith("valid") or label.endswith("(open)") or label == "a float count"


def test_the_checker_names_the_place_in_one_sentence():
    doc = make_analyze_doc()
    doc["findings"][2]["evidence"]["windows"] = [{"start": "2026-11-28T10:00:00Z"}]
    assert problems(doc, "analyze") == ["$.findings[2].evidence.windows[0] lacks the key 'end'"]
    doc = make_compare_doc()
    doc["gates"][0]["critical"] = "yes"
    assert problems(doc, "compare") == ["$.gates[0].critical is a string, not a boolean"]
