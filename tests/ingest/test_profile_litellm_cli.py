"""The gateway fixtures through `servlens ingest` as a user runs it (a subprocess): every gateway file is
recognised by its own profile, bad lines are counted, --strict refuses a file with a truncated line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GATEWAYS = Path(__file__).resolve().parents[1] / "data" / "gateways"


def servlens(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servlens", "--db", str(tmp_path / "store.duckdb"), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )


def test_ingest_the_gateway_folder(tmp_path):
    done = servlens(tmp_path, "ingest", str(GATEWAYS), "--run", "gw", "--format", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["kind"], document["runs"]) == ("ingest", ["gw"])
    got = {Path(s["path"]).name: (s["format"], s["rows"], s["bad_lines"]) for s in document["sources"]}
    assert got == {
        "litellm_slp_recorded.jsonl": ("litellm-slp", 14, 0),
        "litellm_slp_reference.jsonl": ("litellm-slp", 3, 2),
        "litellm_slp_redacted.jsonl": ("litellm-slp", 2, 0),
        "litellm_slp_stream_cache_hit.jsonl": ("litellm-slp", 2, 0),
        "litellm_spendlogs.csv": ("litellm-spendlogs-csv", 10, 0),
        "litellm_spendlogs.jsonl": ("litellm-spendlogs-json", 10, 0),
        "litellm_spendlogs_api.json": ("litellm-spendlogs-api", 10, 0),
        "spendlogs_payloads.jsonl": ("litellm-spendlogs-json", 10, 0),
        "otel_genai_spans.jsonl": ("otel-genai-spans", 4, 1),
        "otel_litellm_recorded.jsonl": ("otel-genai-spans", 7, 0),
        "otel_vllm_spans.jsonl": ("otel-genai-spans", 2, 0),
    }
    skipped = {Path(s["path"]).name for s in document["skipped"]}
    assert "README.md" in skipped and "record.py" in skipped


def test_strict_refuses_a_file_with_a_truncated_line(tmp_path):
    done = servlens(tmp_path, "ingest", str(GATEWAYS / "otel_genai_spans.jsonl"), "--strict")
    assert done.returncode == 2
    assert done.stderr.startswith(f"Error: {GATEWAYS / 'otel_genai_spans.jsonl'} has 1 malformed line(s) (first: line 4: "
                                  "invalid JSON: the line ends before the value does (truncated?)); --strict keeps nothing")
    assert "Traceback" not in done.stderr


def test_compressed_gateway_exports(tmp_path):
    import gzip

    import zstandard

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "litellm-2026-11-28.jsonl.gz").write_bytes(
        gzip.compress((GATEWAYS / "litellm_slp_recorded.jsonl").read_bytes()))
    (tmp_path / "in" / "spend.csv.gz").write_bytes(gzip.compress((GATEWAYS / "litellm_spendlogs.csv").read_bytes()))
    (tmp_path / "in" / "otel.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress((GATEWAYS / "otel_litellm_recorded.jsonl").read_bytes()))
    done = servlens(tmp_path, "ingest", str(tmp_path / "in"), "--run", "z", "--format", "json")
    assert done.returncode == 0, done.stderr
    got = {Path(s["path"]).name: (s["format"], s["rows"], s["bad_lines"]) for s in json.loads(done.stdout)["sources"]}
    assert got == {"litellm-2026-11-28.jsonl.gz": ("litellm-slp", 14, 0), "spend.csv.gz": ("litellm-spendlogs-csv", 10, 0),
                   "otel.jsonl.zst": ("otel-genai-spans", 7, 0)}
