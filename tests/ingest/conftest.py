"""Fixtures shared by the ingest tests."""

from __future__ import annotations

import pytest

from servlens.store.schema import open_store


@pytest.fixture
def con():
    """A fresh in-memory store."""
    con = open_store(":memory:")
    yield con
    con.close()
