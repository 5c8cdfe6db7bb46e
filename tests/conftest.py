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
