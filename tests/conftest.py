"""Shared fixtures: paths to the real data, a fresh store, and a CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Real public traces and real engine output, copied from the project's shared data folder with their licences.
SHARED_DATA = REPO / "tests" / "data" / "shared"


@pytest.fixture
def shared_data() -> Path:
    return SHARED_DATA


@pytest.fixture
def store(tmp_path):
    """A fresh on-disk store, closed after the test."""
    from servlens.store.schema import open_store

    con = open_store(tmp_path / "store.duckdb")
    yield con
    con.close()


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


# ------------------------------------------------------------------ every document the suite produces is validated


@pytest.fixture(autouse=True)
def validate_documents(monkeypatch):
    """Wrap the document builders (and the commands' renderers, which see what a command adds) so every analyze,
    compare and ingest document and every finding a test produces is checked against the shipped JSON Schema."""
    from tests.documents import wrap_builders

    wrap_builders(monkeypatch)


# ------------------------------------------------------------------ two workers (pytest -n 2 --dist loadgroup)


def pytest_collection_modifyitems(config, items):
    """Under xdist, a module's tests stay on one worker (its module fixtures, such as the truth matrix's analysed
    runs, are computed once), and so do all tests of the real llama.cpp engine and of the engines' exports, whose
    session fixtures record a run or export the recordings: each is done once, not once per worker."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        group = parts[0] if parts[0] in ("e2e", "engines") else "/".join(parts)
        item.add_marker(pytest.mark.xdist_group(group))
