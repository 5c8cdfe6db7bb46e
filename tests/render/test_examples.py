"""The committed example reports in reports/examples/ are what the current code makes from sample_logs/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import open_in_chromium

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "reports" / "examples"
MANIFEST = EXAMPLES / "MANIFEST.json"


def _manifest() -> dict:
    if not MANIFEST.is_file():
        pytest.fail("reports/examples/MANIFEST.json is missing: run python reports/make_examples.py and commit")
    return json.loads(MANIFEST.read_text())


def test_examples_are_current():
    manifest = _manifest()
    for scenario in [manifest.get("analyze"), *(manifest.get("compare") or [])]:
        if scenario:
            assert (REPO / scenario).is_dir(), f"{scenario} named in MANIFEST.json is gone"
    done = subprocess.run([sys.executable, str(REPO / "reports" / "make_examples.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr


def test_one_example_per_command_and_they_open_cleanly(chromium, tmp_path):
    _manifest()
    pages = sorted(EXAMPLES.glob("*.html"))
    kinds = sorted(json.loads(page.with_suffix(".json").read_text())["kind"] for page in pages)
    assert kinds == ["analyze", "compare"]
    from conftest import devtools_load

    for page in pages:
        dom, problems = open_in_chromium(chromium, page, tmp_path / page.stem)
        assert problems == [], page.name
        assert "data-verdict=" in dom and "<svg" in dom
        seen = devtools_load(chromium, page, tmp_path / f"{page.stem}-devtools")
        assert (seen["requests"], seen["failed"], seen["log"], seen["exceptions"]) == ([], [], [], []), page.name
        assert seen["dom"]["svg"] >= 1 and seen["dom"]["verdict"]
