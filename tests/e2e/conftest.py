"""End-to-end tests against a real llama.cpp server (xllamacpp wheel) serving a tiny model generated from a seed.

Every test here is marked ``e2e``. They are skipped, with the reason, only when the engine cannot be imported.
The scenarios are driven once per session (see ``scenario_runs``) and their logs cached under a tmp dir.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tools/ is not installed; the harness is imported from the checkout
    sys.path.insert(0, str(REPO))

HERE = Path(__file__).resolve().parent
ENGINE_MISSING = None
for _mod in ("xllamacpp", "gguf", "requests"):
    if importlib.util.find_spec(_mod) is None:
        ENGINE_MISSING = f"the real-engine tests need the '{_mod}' package (pip install -e '.[test]')"
        break


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.e2e)
        if ENGINE_MISSING:
            item.add_marker(pytest.mark.skip(reason=ENGINE_MISSING))
