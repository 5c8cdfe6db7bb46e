"""The committed sample_logs/ (recorded by tools/engine): each folder ingests cleanly and shows what its README
promises. No engine needed: these read the recording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.engine.make_sample_logs import FOLDERS

from .records import servlens

SAMPLE_LOGS = Path(__file__).resolve().parents[2] / "sample_logs"


def _records(folder: str) -> list[dict]:
    with open(SAMPLE_LOGS / folder / "requests.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("run,folder", sorted(FOLDERS.items()))
def test_sample_folder_is_complete_and_small(run, folder):
    path = SAMPLE_LOGS / folder
    names = {p.name for p in path.iterdir()}
    assert {"README.md", "requests.jsonl", "metrics_index.jsonl", "props.json"} <= names
    assert any(n.startswith(f"metrics_{run}_") and n.endswith(".prom") for n in names)
    records = _records(folder)
    assert 20 <= len(records) <= 300
    assert {r["run"] for r in records} == {run}
    assert sum(p.stat().st_size for p in path.iterdir()) < 1_500_000


@pytest.fixture(scope="module")
def sample_findings(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("samples") / "analyze.json"
    folders = [SAMPLE_LOGS / f for f in ("prefix-cache-off", "prefix-cache-on", "burst", "steady-a", "max-tokens",
                                         "reasoning-none", "reasoning-deepseek")]
    result = servlens("analyze", *folders, "--select", "SL001,SL002,SL003,SL004", "--format", "json", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    return {(f["rule"], f["scope"]["run"]): f["state"] for f in json.loads(out.read_text())["findings"]}


@pytest.mark.parametrize("rule,run,want", [
    ("SL001", "prefix_nocache", "fired"), ("SL001", "prefix_cache", "clear"),
    ("SL004", "burst", "fired"), ("SL004", "steady_a", "clear"),
    ("SL002", "max_tokens", "fired"),
    ("SL003", "reasoning_none", "fired"), ("SL003", "reasoning_deepseek", "clear"),
])
def test_sample_logs_show_what_their_readmes_say(sample_findings, rule, run, want):
    assert sample_findings.get((rule, run)) == want
