"""Secrets (issue 15, class 5): one list of patterns (servlens.redact), applied at ingest to every text column,
attrs, ingest_errors and metric labels, so no output format can show them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from servlens.ingest.api import ingest_inputs
from servlens.redact import SECRET_PATTERNS, redact_secrets, redact_sql
from servlens.store.schema import open_store
from tests.safety.corpus import write_lines

GATEWAYS = Path(__file__).resolve().parents[1] / "data" / "gateways"

# pattern name -> (text holding a secret, the secret part that must be gone, what must remain)
CASES = {
    "url-userinfo": ("https://alice:hunter2pass@proxy.example.com/v1", "hunter2pass", "https://[REDACTED]@proxy"),
    "url-query-secret": ("https://generativelanguage.googleapis.com/v1beta/models/x?alt=sse&key=Q9zTopSecretValue1",
                         "Q9zTopSecretValue1", "alt=sse&key=[REDACTED]"),
    "bearer": ("Authorization: Bearer abc.def-ghi_jkl123", "abc.def-ghi_jkl123", "Bearer [REDACTED]"),
    "basic-auth": ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA", "Basic [REDACTED]"),
    "openai-style-key": ("Incorrect API key provided: sk-proj-AbCdEfGh12345678", "AbCdEfGh12345678", "sk-[REDACTED]"),
    "stripe-key": ("charge failed for sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc", "for [REDACTED]"),
    "slack-token": ("posting with xoxb-123456789012-AbCdEfGhIjKl", "123456789012-AbCdEfGhIjKl", "with [REDACTED]"),
    "google-oauth-token": ("token ya29.a0AfH6SMBxAbCdEfGhIjKlMnOp", "a0AfH6SMBxAbCdEfGhIjKlMnOp", "token [REDACTED]"),
    "google-api-key": ("AIzaSyA1234567890abcdefghijklmnopq", "SyA1234567890abcdefghij", "[REDACTED]"),
    "aws-access-key-id": ("id AKIAIOSFODNN7EXAMPLE here", "IOSFODNN7EXAMPLE", "id [REDACTED] here"),
    "vendor-token": ("hf_AbCdEfGhIjKlMnOpQrSt and glpat-AbCdEfGhIjKlMn", "AbCdEfGhIjKl", "[REDACTED] and [REDACTED]"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "dozjgNryP4J3jVmNHl0w5N", "[REDACTED]"),
    "secret-key-value": ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                         "wJalrXUtnFEMI", "aws_secret_access_key=[REDACTED]"),
}

CLEAN = [
    "prompt_tokens=123456 completion_tokens: 99999999",
    "http://localhost:8000/v1/chat/completions",
    "model=gpt-4o-mini finish_reason=length",
    "Qwen/Qwen2.5-0.5B-Instruct",
    '{"max_tokens": 1024, "stream": true}',
]


def test_every_pattern_has_a_case():
    assert {name for name, _, _ in SECRET_PATTERNS} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_redacts_in_python_and_in_sql_alike(name):
    text, secret, kept = CASES[name]
    redacted = redact_secrets(text)
    assert secret not in redacted and kept in redacted
    assert duckdb.execute(f"SELECT {redact_sql('$1')}", [text]).fetchone()[0] == redacted


@pytest.mark.parametrize("text", CLEAN)
def test_clean_text_is_unchanged(text):
    assert redact_secrets(text) == text
    assert duckdb.execute(f"SELECT {redact_sql('$1')}", [text]).fetchone()[0] == text


def test_redacted_json_stays_json():
    doc = json.dumps({"api_key": 'abcdefgh"ij', "secret": "s3cr3tvalue", "url": "https://u:p4ss@h/x?key=zzzzzz"})
    assert json.loads(redact_secrets(doc)) == {"api_key": "[REDACTED]\"ij", "secret": "[REDACTED]",
                                               "url": "https://[REDACTED]@h/x?key=[REDACTED]"}


SECRETS = ["hunter2pass", "Q9zTopSecretValue1", "4eC39HqLyjWDarjtT1zdp7dc", "123456789012-AbCdEfGhIjKl",
           "a0AfH6SMBxAbCdEfGhIjKlMnOp", "AbCdEfGh12345678", "wJalrXUtnFEMI"]


def _hostile_litellm(path: Path) -> Path:
    """The recorded LiteLLM payloads with secrets where a misconfigured proxy puts them."""
    lines = []
    for i, line in enumerate((GATEWAYS / "litellm_slp_recorded.jsonl").read_text().splitlines()):
        record = json.loads(line)
        record["api_base"] = "https://alice:hunter2pass@proxy.example.com/v1?key=Q9zTopSecretValue1"
        record["end_user"] = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
        record["request_tags"] = ["xoxb-123456789012-AbCdEfGhIjKl"]
        record["metadata"]["user_api_key_alias"] = "ya29.a0AfH6SMBxAbCdEfGhIjKlMnOp"
        if i == 0:
            record["status"] = "failure"
            record["error_str"] = "Incorrect API key provided: sk-proj-AbCdEfGh12345678"
            record["error_information"] = {"error_message": "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfi",
                                           "error_class": "AuthenticationError"}
        lines.append(json.dumps(record))
    lines.append('{"api_base": "https://alice:hunter2pass@x", "broken": ')  # a bad line that quotes a secret
    return write_lines(path, lines)


def _store_text(con) -> str:
    parts = []
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall():
        parts.append(str(con.execute(f"SELECT * FROM {table}").fetchall()))
    return "\n".join(parts)


def test_no_secret_reaches_the_store(tmp_path):
    log = _hostile_litellm(tmp_path / "litellm.jsonl")
    con = open_store(":memory:")
    report = ingest_inputs(con, [str(log)], keep_text=True)
    assert report.rows == 14 and report.bad_lines == 1
    stored = _store_text(con)
    assert "[REDACTED]" in stored
    for secret in SECRETS:
        assert secret not in stored, secret
    deployment = con.execute("SELECT DISTINCT deployment FROM requests").fetchall()
    assert deployment == [("https://[REDACTED]@proxy.example.com/v1?key=[REDACTED]",)]


def test_metric_labels_are_redacted(tmp_path):
    scrape = write_lines(tmp_path / "m.prom", [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{endpoint="https://bob:hunter2pass@10.0.0.1/v1",api_key="sk-AbCdEfGh12345678"} 3',
    ])
    con = open_store(":memory:")
    ingest_inputs(con, [], metrics_inputs=[str(scrape)], at="2026-11-29T07:00:00Z")
    labels = con.execute("SELECT labels FROM metric_samples").fetchone()[0]
    assert labels == {"api_key": "sk-[REDACTED]", "endpoint": "https://[REDACTED]@10.0.0.1/v1",
                      "instance": f"{tmp_path.name}/m"}


def test_no_secret_in_any_output_format(tmp_path):
    log = _hostile_litellm(tmp_path / "litellm.jsonl")
    db = str(tmp_path / "s.duckdb")
    # ingest's two output formats, runs, then analyze in each of its four (one store: a command per format, not
    # a store per format)
    commands = [(["ingest", str(log), "--format", "text"], None), (["ingest", str(log), "--format", "json"], None),
                (["runs"], None)]
    for fmt in ("text", "json", "md", "html"):
        out = tmp_path / f"report.{ {'text': 'txt'}.get(fmt, fmt) }"
        commands.append((["analyze", str(log), "--out", str(out), "--format", fmt], out))
    for args, out in commands:
        done = subprocess.run([sys.executable, "-m", "servlens", "--db", db, *args], capture_output=True, text=True,
                              check=False, cwd=tmp_path, timeout=300)
        assert done.returncode in (0, 1), done.stderr
        shown = done.stdout + done.stderr + (out.read_text() if out is not None else "")
        for secret in SECRETS:
            assert secret not in shown, (args, secret)
