"""One bad value poisons nothing (issue 15, classes 2 and 9): an impossible value is NULL with a counted note, a
too-long line is that line's error, a CSV whose last row has an unterminated quote keeps its good rows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.safety.corpus import AZURE_CSV, request_record, write_lines


@pytest.fixture
def con():
    con = open_store(":memory:")
    yield con
    con.close()


def _line(**overrides) -> str:
    return json.dumps(request_record(5, **overrides))


GOOD = [json.dumps(request_record(i)) for i in range(5)]
T0 = 1795936979.0

# name -> (the hostile line, the column that must be NULL on that row)
HOSTILE_LINES = {
    "ms_in_a_seconds_field": (_line(send_ts=T0 * 1000, end_ts=T0 * 1000 + 0.5), "t_arrival"),
    "year_1990": (_line(send_ts=631152000.0, end_ts=631152000.5), "t_arrival"),
    "infinity": (_line().replace('"e2e_s": 0.5', '"e2e_s": Infinity'), "e2e_s"),
    "minus_infinity": (_line().replace('"e2e_s": 0.5', '"e2e_s": -Infinity'), "e2e_s"),
    "1e309": (_line().replace('"e2e_s": 0.5', '"e2e_s": 1e309'), "e2e_s"),
    "nan": (_line().replace('"e2e_s": 0.5', '"e2e_s": NaN'), "e2e_s"),
    "negative_duration": (_line(e2e_s=-3.0, end_ts=T0 + 2), "e2e_s"),
    "zero_duration": (_line(e2e_s=0.0, end_ts=T0 + 5), "e2e_s"),
    "nanoseconds_as_seconds": (_line(e2e_s=500_000_000.0 * 1e3), "e2e_s"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_LINES))
def test_an_impossible_value_is_null_and_counted(tmp_path, con, name):
    line, column = HOSTILE_LINES[name]
    log = write_lines(tmp_path / f"{name}.jsonl", GOOD + [line] + GOOD[:2])
    report = ingest_inputs(con, [str(log)])
    assert report.rows == 8 and report.bad_lines == 0
    source = report.sources[0]
    assert source["invalid_values"].get(column, 0) >= 1
    value, invalid = con.execute(
        f"SELECT {column}, attrs->'$.invalid_values' FROM requests WHERE source_line = 6").fetchone()
    assert value is None and column in json.loads(invalid)
    # the good rows are untouched, and the span of the source is the good rows' span
    assert con.execute(f"SELECT count({column}) FROM requests WHERE source_line <> 6").fetchone()[0] == 7
    t_min, t_max = con.execute("SELECT t_min, t_max FROM sources").fetchone()
    assert t_min.year == t_max.year == 2026


def test_relative_clock_times_near_1970_are_kept(tmp_path, con):
    trace = write_lines(tmp_path / "mooncake_trace.jsonl", [
        json.dumps({"timestamp": i * 1000, "input_length": 10, "output_length": 5, "hash_ids": [i]})
        for i in range(5)])
    report = ingest_inputs(con, [str(trace)], from_format="mooncake-trace")
    assert report.rows == 5 and "invalid_values" not in report.sources[0]
    assert con.execute("SELECT count(t_arrival) FROM requests").fetchone()[0] == 5


def test_runs_and_analyze_work_on_a_store_after_a_year_58000_line(tmp_path):
    log = write_lines(tmp_path / "log.jsonl", GOOD + [HOSTILE_LINES["ms_in_a_seconds_field"][0]])
    db = str(tmp_path / "s.duckdb")
    for args in (["ingest", str(log)], ["runs"], ["analyze", "--db", db, "--run", "log"]):
        done = subprocess.run([sys.executable, "-m", "servlens", "--db", db, *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300, check=False)
        assert done.returncode in (0, 1), (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert "impossible values stored as NULL (named in attrs.invalid_values): t_arrival 1" in subprocess.run(
        [sys.executable, "-m", "servlens", "--db", str(tmp_path / "t.duckdb"), "ingest", str(log)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False).stdout


def test_a_16_mib_line_is_that_lines_error(tmp_path, con):
    huge = _line().replace('"question 5"', '"' + "x" * (16 * 1024 * 1024 + 100) + '"')
    log = write_lines(tmp_path / "huge.jsonl", GOOD + [huge] + GOOD[:2])
    report = ingest_inputs(con, [str(log)])
    assert report.rows == 7 and report.bad_lines == 1
    assert con.execute("SELECT line, reason FROM ingest_errors").fetchall() == [(6, "line longer than 8 MiB")]
    assert [r[0] for r in con.execute("SELECT source_line FROM requests ORDER BY 1").fetchall()] == [1, 2, 3, 4, 5, 7, 8]


@pytest.mark.parametrize("last_row", ['"2023-11-16 18:25:51.0,1,2', '2023-11-16 18:25:51.0,"1,2'])
@pytest.mark.parametrize("final_break", [True, False])
def test_csv_unterminated_quote_on_the_last_row_keeps_the_good_rows(tmp_path, con, last_row, final_break):
    rows = AZURE_CSV.read_text().splitlines()[:300]
    csv = tmp_path / "azure_trace.csv"
    csv.write_text("\n".join(rows + [last_row]) + ("\n" if final_break else ""))
    report = ingest_inputs(con, [str(csv)], from_format="azure-llm-trace")
    # DuckDB's sniffer used to refuse the file: now the 299 good rows are rows, and the broken one is a counted
    # error (or, quoted to the end of the file, a row whose time could not be read)
    assert report.rows + report.bad_lines == 300
    assert con.execute("SELECT count(t_arrival) FROM requests WHERE source_line <= 300").fetchone()[0] == 299
    assert con.execute("SELECT list(line) FROM ingest_errors").fetchone()[0] in (None, [301])
