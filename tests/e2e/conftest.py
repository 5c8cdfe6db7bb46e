"""End-to-end tests against a real llama.cpp server (xllamacpp wheel) serving a tiny model generated from a seed.

Every test here is marked ``e2e``. Those that drive the engine are skipped, with the reason, only when it cannot be
imported; the checks of the committed sample_logs/ need no engine.
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
    try:
        _found = importlib.util.find_spec(_mod) is not None
    except (ImportError, ValueError):
        _found = False
    if not _found:
        ENGINE_MISSING = f"the real-engine tests need the '{_mod}' package (pip install -e '.[test]')"
        break


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.e2e)
        needs_engine = getattr(item.module, "NEEDS_ENGINE", False) or {"engine_out", "engine_store"} & set(
            getattr(item, "fixturenames", ()))
        if ENGINE_MISSING and needs_engine:
            item.add_marker(pytest.mark.skip(reason=ENGINE_MISSING))


def _runs_done(out: Path, names) -> bool:
    from tools.engine.scenarios import SCENARIOS

    return all((out / r.run / "requests.jsonl").exists() for n in names for r in SCENARIOS[n].runs)


@pytest.fixture(scope="session")
def engine_out(tmp_path_factory) -> Path:
    """Drive the real server through every e2e scenario once per session; returns OUT (one folder per run).

    SERVLENS_E2E_OUT=DIR keeps the logs in DIR and reuses them when every run is already there (for working on
    the tests without re-driving the engine); by default they go to a fresh tmp dir.
    """
    import os
    import time

    if ENGINE_MISSING:
        pytest.skip(ENGINE_MISSING)
    from tools.engine.scenarios import E2E_SCENARIOS, run_scenario

    env = os.environ.get("SERVLENS_E2E_OUT")
    out = Path(env) if env else tmp_path_factory.mktemp("engine")
    if env and _runs_done(out, E2E_SCENARIOS):
        return out
    from tools.engine import server as engine_server

    t0 = time.time()
    for name in E2E_SCENARIOS:
        run_scenario(name, out, log=lambda msg: print(msg, file=sys.stderr))
    print(f"e2e scenarios driven in {time.time() - t0:.1f} s", file=sys.stderr)
    assert not engine_server._RUNNING, f"engine servers left running: {sorted(engine_server._RUNNING)}"
    return out


@pytest.fixture(scope="session")
def engine_store(engine_out, tmp_path_factory) -> Path:
    """All e2e runs ingested with `servlens ingest` into one store (runs labelled by the log's run field)."""
    from .records import servlens

    db = tmp_path_factory.mktemp("store") / "engine.duckdb"
    result = servlens("ingest", engine_out, "--db", db)
    assert result.returncode == 0, result.stdout + result.stderr
    return db

