"""One bad value poisons nothing (issue 15, classes 2 and 9): an impossible value is NULL with a counted note, a
too-long line is that line's error, a CSV whose last row has an unterminated quote keeps its good rows."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest

from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.safety.corpus import AZURE_CSV, FORMATS, request_record, write_lines


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
    # 5e20 in a seconds field reads as nanoseconds (the largest unit) and is still the year 17814
    "year_17814": (_line(send_ts=5e20, end_ts=5e20 + 0.5), "t_arrival"),
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


def test_runs_and_analyze_work_on_a_store_after_a_year_17814_line(tmp_path):
    log = write_lines(tmp_path / "log.jsonl", GOOD + [HOSTILE_LINES["year_17814"][0]])
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


@pytest.mark.parametrize(("scale", "unit"), [(1e3, "ms"), (1e6, "us"), (1e9, "ns")])
def test_an_epoch_in_a_larger_unit_is_read_in_that_unit_and_counted(tmp_path, con, scale, unit):
    # send_ts is Unix seconds; a recorder that wrote milliseconds, microseconds or nanoseconds there is read right
    log = write_lines(tmp_path / f"{unit}.jsonl", GOOD + [_line(send_ts=(T0 + 5) * scale)] + GOOD[:2])
    report = ingest_inputs(con, [str(log)])
    assert report.rows == 8 and report.sources[0]["converted_times"] == {"t_arrival": 1}
    assert "unparsed_times" not in report.sources[0] and "invalid_values" not in report.sources[0]
    t_arrival, converted = con.execute(
        "SELECT t_arrival, attrs->>'$.converted_times' FROM requests WHERE source_line = 6").fetchone()
    assert t_arrival == datetime(2026, 11, 29, 7, 23, 4) and json.loads(converted) == ["t_arrival"]


@pytest.mark.parametrize("value", ["yesterday", "2026-11-29T07:23:04", "1e400", "0x1F"])
def test_a_json_time_that_does_not_read_is_counted_and_its_row_kept(tmp_path, con, value):
    log = write_lines(tmp_path / "log.jsonl", GOOD + [_line(send_ts=value)] + GOOD[:2])
    report = ingest_inputs(con, [str(log)])
    assert report.rows == 8 and report.bad_lines == 0
    assert report.sources[0]["unparsed_times"] == {"t_arrival": 1}
    row = con.execute("SELECT t_arrival, t_end, attrs->>'$.unparsed_times', s.path FROM requests "
                      "JOIN sources s USING (source_id) WHERE source_line = 6").fetchone()
    assert row[0] is None and row[1] is not None  # the row is kept: its other times still read
    assert json.loads(row[2]) == ["t_arrival"] and row[3] == str(log)


@pytest.mark.parametrize("absent", [None, "", "drop"])
def test_an_absent_time_is_not_counted(tmp_path, con, absent):
    record = request_record(5)
    if absent == "drop":
        del record["first_token_ts"]
    else:
        record["first_token_ts"] = absent
    log = write_lines(tmp_path / "log.jsonl", GOOD + [json.dumps(record)])
    report = ingest_inputs(con, [str(log)])
    assert report.rows == 6 and "unparsed_times" not in report.sources[0]
    assert con.execute("SELECT t_first_token FROM requests WHERE source_line = 6").fetchone()[0] is None


def test_csv_times_that_do_not_read_are_counted_with_their_lines(tmp_path, con):
    rows = AZURE_CSV.read_text().splitlines()[:11]
    rows[3] = "2023-13-45 18:15:50.9951690,396,109"
    rows[5] = "not a time,1,2"
    csv = tmp_path / "azure_trace.csv"
    csv.write_text("\n".join(rows) + "\n")
    report = ingest_inputs(con, [str(csv)], from_format="azure-llm-trace")
    assert report.rows == 10 and report.bad_lines == 0
    assert report.sources[0]["unparsed_times"] == {"t_arrival": 2}
    assert con.execute("SELECT source_line, attrs->>'$.unparsed_times' FROM requests WHERE t_arrival IS NULL "
                       "ORDER BY 1").fetchall() == [(4, '["t_arrival"]'), (6, '["t_arrival"]')]


def test_iso_times_that_do_not_read_are_counted_per_column(tmp_path, con):
    records = [json.loads(line) for line in (FORMATS / "langfuse" / "observations-export.jsonl").read_text().splitlines()]
    records[2]["startTime"] = "2026-02-30T99:00:00Z"
    records[2]["endTime"] = "soon"
    log = write_lines(tmp_path / "observations-export.jsonl", [json.dumps(r) for r in records])
    report = ingest_inputs(con, [str(log)])
    assert report.sources[0]["format"] == "langfuse-observations"
    assert report.sources[0]["unparsed_times"] == {"t_arrival": 1, "t_end": 1}
    assert con.execute("SELECT source_line, t_arrival, t_end, attrs->>'$.unparsed_times' FROM requests "
                       "WHERE source_line = 3").fetchone() == (3, None, None, '["t_arrival","t_end"]')


def test_the_ingest_summary_says_how_many_times_did_not_read_or_were_converted(tmp_path):
    log = write_lines(tmp_path / "log.jsonl", GOOD + [_line(send_ts="yesterday"), _line(send_ts=(T0 + 5) * 1e9)])
    done = subprocess.run([sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "ingest", str(log)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "  times that do not read, stored as NULL (named in attrs.unparsed_times): t_arrival 1" in done.stdout
    assert ("  epochs in a larger unit than their field's, read in that unit (named in attrs.converted_times): "
            "t_arrival 1") in done.stdout
