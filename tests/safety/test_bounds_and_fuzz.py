"""Bounded outputs and inputs (issue 15, class 10), and a fuzz test of the line reader and the Prometheus parser:
whatever the bytes, every line is a row or a counted error, and nothing escapes as a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servlens.errors import ServlensError
from servlens.escape import MAX_FIELD_CHARS, md_escape
from servlens.ingest.api import ingest_inputs
from servlens.ingest.prometheus import parse_exposition
from servlens.store.schema import open_store
from tests.safety.corpus import request_record, write_lines


def test_a_markdown_field_is_bounded_and_says_so():
    text = md_escape("m" * 2_000_000)
    assert len(text) < MAX_FIELD_CHARS + 40 and text.endswith("… (1,999,000 more characters)")


def test_a_two_megabyte_model_name_gives_a_small_markdown_report(tmp_path):
    records = [request_record(i) for i in range(30)]
    for record in records:
        record["body"]["model"] = "m" * 2_000_000
    log = write_lines(tmp_path / "log.jsonl", [json.dumps(r) for r in records])
    done = subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "analyze", str(log),
                           "--format", "md"], capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    assert len(done.stdout) < 200_000


@pytest.mark.parametrize("args", [["--format", "html"], ["--format", "text", "--verbose"]])
def test_a_two_megabyte_model_name_gives_a_small_html_or_text_report(tmp_path, args):
    records = [request_record(i) for i in range(12)]
    for record in records:
        record["body"]["model"] = "m" * 2_000_000
    log = write_lines(tmp_path / "log.jsonl", [json.dumps(r) for r in records])
    out = tmp_path / "report.out"
    done = subprocess.run([sys.executable, "-m", "servlens", "analyze", str(log), *args, "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    report = out.read_text()
    assert len(report) < 200_000  # 28 MB (HTML) and 36 MB (text --verbose) before fields were cut
    assert "m" * MAX_FIELD_CHARS + "… (1,999,000 more characters)" in report


@pytest.mark.slow
def test_a_zstd_scrape_bomb_is_refused_with_a_sentence(tmp_path):
    import zstandard

    line = b'vllm:num_requests_running{model_name="m"} 1\n'
    bomb = tmp_path / "bomb.prom.zst"
    with open(bomb, "wb") as handle, zstandard.ZstdCompressor(level=1).stream_writer(handle) as writer:
        block = line * 100_000
        for _ in range(300 * 1024 * 1024 // len(block) + 1):
            writer.write(block)
    assert bomb.stat().st_size < 2 * 1024 * 1024
    con = open_store(":memory:")
    with pytest.raises(ServlensError) as caught:
        ingest_inputs(con, [], metrics_inputs=[str(bomb)], at="2026-11-29T07:00:00Z")
    assert str(caught.value).startswith(f"{bomb} holds more than 256 MiB of metrics text (decompressed)")


_LINE = st.one_of(
    st.builds(lambda i: json.dumps(request_record(i)), st.integers(0, 10_000)),
    st.text(max_size=60),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.sampled_from(['{"send_ts": Infinity}', "{", "null", "[]", '{"body": {"model": "\\u0000"}}', "\u2028", "\r"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_LINE, min_size=1, max_size=12))
def test_fuzz_every_line_is_a_row_or_a_counted_error(tmp_path_factory, lines):
    folder = tmp_path_factory.mktemp("fuzz")
    body = "\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines) + "\n"
    log = folder / "log.jsonl"
    log.write_bytes(body.encode("utf-8", "surrogatepass"))
    # the file must look like the format for a forced profile to read it; lines are counted as the reader counts them
    con = open_store(":memory:")
    try:
        report = ingest_inputs(con, [str(log)], from_format="openai-client-log")
    except ServlensError:
        return  # refused with a sentence (e.g. no line has the profile's fields): fine
    non_blank = sum(1 for line in body.split("\n")[:-1] if line.strip(" "))  # DuckDB trim(): spaces only
    assert report.rows + report.bad_lines == non_blank


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80), st.sampled_from([
    "# TYPE x gauge", "x 1", "x{a=\"b\"} NaN", "x 1 99999999999999999999", "x{a=\"\\\"\"} +Inf 1795936979000",
    "# EOF", "x{", "x 1e309", "# HELP x \\n"])), max_size=20))
def test_fuzz_the_prometheus_parser_never_raises(lines):
    for fmt in ("prometheus-text", "openmetrics"):
        exposition = parse_exposition("\n".join(lines) + "\n", fmt)
        assert len(exposition.rows.name) == len(exposition.rows.timestamp)
