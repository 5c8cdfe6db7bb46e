"""Reading the harness's raw logs in the e2e tests."""

from __future__ import annotations

from pathlib import Path


def load_records(out: Path, run: str) -> list[dict]:
    """The harness's own request records for one run (the raw log the tests check servlens against)."""
    import json

    with open(out / run / "requests.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def servlens(*args: str, timeout: float = 300):
    """Run the servlens CLI as a user would (a separate process); returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "servlens", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
