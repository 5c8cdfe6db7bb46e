"""`servlens analyze LOG --metrics DIR`: the scrapes given with one request log are that log's run (DESIGN.md,
round 2 "Runs"); only --run, a run field or several logs make several runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from servlens.cli import cli

REPO = Path(__file__).resolve().parents[1]
GATEWAY = REPO / "tests" / "data" / "recorded" / "gw-timeout-fallback"
STEADY = REPO / "sample_logs" / "steady-a"


def _analyze(args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / "a.json"
    result = CliRunner().invoke(cli, ["analyze", *args, "--format", "json", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return json.loads(out.read_text())


def test_a_gateway_log_and_its_backends_scrapes_are_one_run(tmp_path):
    """The scrape index names the recorder's label ("gw-timeout-fallback"); the payload file has no run field, so its
    run is its stem. Before, every scrape became a run of its own or the index's, and SL004 lost the queue gauge."""
    scrapes = sorted(str(p) for p in GATEWAY.glob("metrics_*"))
    doc = _analyze([str(GATEWAY / "litellm_slp.jsonl.zst"), "--metrics", *scrapes[:1], *scrapes[1:]], tmp_path)
    assert doc["coverage"]["runs"] == ["litellm_slp"]
    assert {f["scope"]["run"] for f in doc["findings"]} == {"litellm_slp"}
    assert "llamacpp:requests_deferred" in doc["coverage"]["metrics_present"]


def test_scrapes_in_a_folder_of_their_own_join_the_one_log(tmp_path):
    """A request log copied away from its scrapes, the scrapes passed as --metrics DIR without an index: one run."""
    logs, scrapes = tmp_path / "logs", tmp_path / "scrapes"
    logs.mkdir()
    scrapes.mkdir()
    shutil.copy(STEADY / "requests.jsonl", logs / "requests.jsonl")
    for path in STEADY.glob("metrics_*.prom"):
        shutil.copy(path, scrapes / path.name)
    doc = _analyze([str(logs / "requests.jsonl"), "--metrics", str(scrapes)], tmp_path)
    assert doc["coverage"]["runs"] == ["steady_a"]
    assert len({f["scope"]["run"] for f in doc["findings"]}) == 1
