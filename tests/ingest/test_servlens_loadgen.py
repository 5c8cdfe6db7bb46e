"""The servlens-loadgen profile (tools/engine/load.py's log): its old name, and how it reads reasoning and first-token
times, on logs recorded from real llama.cpp servers (sample_logs/, tests/data/recorded/) and the real vLLM log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servlens.errors import ConfigError
from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import get_profile

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"


def one(con, sql, params=None):
    return con.execute(sql, params or []).fetchone()


# ---------------------------------------------------------------------------------------------------------------
# The name says what it is; the old one still works with --from


def test_the_old_name_still_selects_the_profile(con):
    assert get_profile("openai-client-log").name == "servlens-loadgen"
    report = ingest_inputs(con, [str(SAMPLES / "burst" / "requests.jsonl")], from_format="openai-client-log")
    assert [(s["format"], s["rows"]) for s in report.sources] == [("servlens-loadgen", 58)]


def test_an_unknown_name_is_still_an_error():
    with pytest.raises(ConfigError, match="No format profile named 'openai-client'"):
        get_profile("openai-client")
