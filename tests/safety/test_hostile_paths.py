"""Glob characters in file names (issue 15, class 1): DuckDB reads `[ ] * ?` in a path as a pattern, so
`spend[1].csv` used to store the rows of `spend1.csv`. Every reader must read exactly the file it was given."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.safety.corpus import (
    GLOB_NAMES,
    copy_vllm_bench,
    parquet_profile,
    write_azure_csv,
    write_parquet,
    write_requests,
    write_scrape,
)


@pytest.fixture
def con():
    con = open_store(":memory:")
    yield con
    con.close()


def _decoy(stem: str) -> str:
    """The name a glob in `stem` would match instead (spend[1] -> spend1, a*b -> aXb, [!x] -> y)."""
    return {"spend[1]": "spend1", "a*b": "aXb", "a?b": "aXb", "x[ab]": "xa", "[!x]": "y", "b\\s[1]": "b\\s1"}[stem]


def _rows_by_path(con) -> dict[str, int]:
    return dict(con.execute(
        "SELECT s.path, count(r.source_id) FROM sources s LEFT JOIN requests r USING (source_id) GROUP BY 1"
    ).fetchall())


@pytest.mark.parametrize("stem", GLOB_NAMES)
@pytest.mark.parametrize("compress", [False, True])
def test_jsonl_with_glob_characters_reads_its_own_lines(tmp_path, con, stem, compress):
    suffix = ".jsonl.gz" if compress else ".jsonl"
    own = write_requests(tmp_path / f"{stem}{suffix}", 7, compress)
    write_requests(tmp_path / f"{_decoy(stem)}{suffix}", 3, compress)
    report = ingest_inputs(con, [str(own)])
    assert report.rows == 7 and report.bad_lines == 0
    assert _rows_by_path(con) == {str(own): 7}


@pytest.mark.parametrize("stem", GLOB_NAMES)
def test_csv_with_glob_characters_reads_its_own_rows(tmp_path, con, stem):
    own = write_azure_csv(tmp_path / f"{stem}.csv", 60)
    write_azure_csv(tmp_path / f"{_decoy(stem)}.csv", 25)
    report = ingest_inputs(con, [str(own)], from_format="azure-llm-trace")
    assert report.rows == 60
    assert _rows_by_path(con) == {str(own): 60}


@pytest.mark.parametrize("stem", ["spend[1]", "a*b", "b\\s[1]"])
def test_parquet_with_glob_characters_reads_its_own_rows(tmp_path, con, stem):
    own = write_parquet(tmp_path / f"{stem}.parquet", 11)
    write_parquet(tmp_path / f"{_decoy(stem)}.parquet", 4)
    report = ingest_inputs(con, [str(own)], profile_file=parquet_profile(tmp_path))
    assert report.rows == 11
    assert _rows_by_path(con) == {str(own): 11}


@pytest.mark.parametrize("stem", ["random-3.0qps-tiny-20261129-081458[1]", "random-3.0qps-tiny-20261129-081458*"])
def test_json_document_with_glob_characters_is_read(tmp_path, con, stem):
    own = copy_vllm_bench(tmp_path / f"{stem}.json")
    report = ingest_inputs(con, [str(own)])
    assert report.rows == 80 and report.bad_lines == 0  # the 80 requests of the real bench result
    assert _rows_by_path(con) == {str(own): 80}


@pytest.mark.parametrize("stem", ["metrics[1]", "metrics*"])
def test_prometheus_scrape_with_glob_characters_is_read(tmp_path, con, stem):
    own = write_scrape(tmp_path / f"{stem}.prom", 5)
    write_scrape(tmp_path / "metrics1.prom", 2)
    ingest_inputs(con, [], metrics_inputs=[str(own)], at="2026-11-29T07:00:00Z")
    assert con.execute("SELECT s.path, count(*) FROM metric_samples m JOIN sources s USING (source_id) GROUP BY 1"
                       ).fetchall() == [(str(own), 5)]


def test_folder_with_glob_characters_stores_each_file_once(tmp_path, con):
    folder = tmp_path / "logs[2026]"
    sizes = {"req[1].jsonl": 5, "req1.jsonl": 2, "req*.jsonl": 3, "req?.jsonl": 4, "b\\s[1].jsonl": 6}
    for name, n in sizes.items():
        write_requests(folder / name, n)
    write_requests(tmp_path / "logs2" / "req1.jsonl", 9)  # what logs[2026]/ would match as a pattern: not read
    report = ingest_inputs(con, [str(folder)], run="r")
    assert report.rows == sum(sizes.values())
    assert _rows_by_path(con) == {str(folder / name): n for name, n in sizes.items()}


def test_cli_ingest_of_a_bracket_name_stores_its_own_rows(tmp_path):
    own = write_azure_csv(tmp_path / "spend[1].csv", 60)
    write_azure_csv(tmp_path / "spend1.csv", 25)
    done = subprocess.run(
        [sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "ingest", str(own),
         "--from", "azure-llm-trace"], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "  60 rows, 0 bad lines" in done.stdout.splitlines()[2]
