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
