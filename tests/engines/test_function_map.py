"""servlens' function map: what it writes for each engine, and that each engine then gives DuckDB's numbers.

The parity cases run on real recorded runs and on an edge-case run (ties, NULL latencies, one request, a model
with no latency at all) exported with `servlens export`: exact quantiles to 1e-12, time arithmetic to the
microsecond, regression slopes, window ranks and batches, label lookups on an absent key (NULL, never '').
"""

from __future__ import annotations

from datetime import datetime

import pytest

from servlens.analysis.windows import WindowSpec
from servlens.engines.analysis import _windows_sql
from servlens.engines.base import same_number
from servlens.engines.functions import UnsupportedSQL, translate

# (name, portable SQL): every construct the map rewrites, over real data and the edge run.
PARITY_CASES = [
    ("text and rounding: the rules' sentences", """
        WITH g AS (SELECT run, count(*) AS n, sum(completion_tokens) AS tokens, count(ttft_s) AS timed
                   FROM requests GROUP BY run)
        SELECT run, printf('%,d', CAST(round(tokens * 1000.0) AS BIGINT)) AS tokens_text,
               printf('%,d', CAST(-tokens AS BIGINT)) AS negative, printf('%.1f', 100.0 * timed / n) AS pct,
               round(1.0 / 32, 4) AS tie_up, round(-2.5) AS tie_away, round(timed * 1.0 / n, 4) AS share,
               regexp_full_match(CAST(n AS VARCHAR), '[0-9]+') AS digits, regexp_full_match(run, 'gw') AS partial,
               split_part(run, '-', 2) AS second_word, split_part(run, '-', 9) AS past_the_end,
               concat_ws(' and ', run, CASE WHEN n > 100 THEN 'many' END) AS joined,
               (SELECT count(*) FROM requests r WHERE r.run = g.run AND r.ttft_s > 1e9) AS none_this_slow
        FROM g ORDER BY run"""),
    ("exact quantiles, both spellings and a list", """
        SELECT run, model, count(*) AS n, quantile_cont(ttft_s, 0.99) AS p99, quantile_cont(ttft_s, 0.5) AS p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY e2e_s) AS e2e_p90, median(e2e_s) AS e2e_median,
               quantile_cont(e2e_s, [0.5, 0.9, 0.99])[3] AS e2e_p99
        FROM requests GROUP BY ALL ORDER BY run, model NULLS LAST"""),
    ("time arithmetic: date_diff, buckets, truncation, epoch", """
        SELECT run, max(date_diff('microsecond', TIMESTAMP '2026-11-28 00:00:00', t_arrival)) AS max_us,
               min(date_diff('millisecond', t_arrival, t_first_token)) AS min_ttft_ms,
               count(DISTINCT time_bucket(INTERVAL 5 SECOND, t_arrival)) AS buckets_5s,
               count(DISTINCT date_trunc('minute', t_arrival)) AS minutes,
               min(date_trunc('second', t_arrival)) AS first_second,
               max(epoch(t_arrival)) AS last_epoch_s
        FROM requests GROUP BY ALL ORDER BY run"""),
    ("timestamps shifted by microseconds, later and earlier", """
        SELECT run, min(t_arrival - to_microseconds(CAST(1500000 AS BIGINT))) AS earlier,
               max(t_arrival + to_microseconds(250)) AS later
        FROM requests GROUP BY ALL ORDER BY run"""),
    ("adaptive windows as the runner cuts them", """
        SELECT CAST(floor(date_diff('microsecond', TIMESTAMP '2026-12-01 23:11:56.656638', t_arrival) / 1e6 / 5.0)
                    AS INTEGER) AS w, count(*) AS n, quantile_cont(ttft_s, 0.99) AS p99,
               count(*) FILTER (WHERE finish_reason = 'length') AS capped
        FROM requests WHERE run = 'llamacpp-concurrency-ramp' GROUP BY ALL ORDER BY w"""),
    ("regression slopes, with one point and no pair", """
        SELECT run, model, regr_slope(e2e_s, completion_tokens) AS slope, regr_slope(ttft_s, prompt_tokens) AS s2
        FROM requests GROUP BY ALL ORDER BY run, model NULLS LAST"""),
    ("ranks and batch means: row_number and ntile over time", """
        WITH ranked AS (SELECT run, ttft_s, row_number() OVER (PARTITION BY run ORDER BY ttft_s, request_id) AS k,
                               ntile(10) OVER (PARTITION BY run ORDER BY t_arrival, request_id) AS batch
                        FROM requests WHERE ttft_s IS NOT NULL),
             batches AS (SELECT run, batch, avg(ttft_s) AS mean_ttft, count(*) AS n FROM ranked GROUP BY ALL)
        SELECT b.run, count(*) AS batches, min(mean_ttft) AS lo, max(mean_ttft) AS hi, sum(n) AS n,
               max(CASE WHEN r.k = 3 THEN r.ttft_s END) AS third_smallest
        FROM batches b JOIN (SELECT run, k, ttft_s FROM ranked WHERE k = 3) r ON r.run = b.run
        GROUP BY ALL ORDER BY b.run"""),
    ("NULLs order last in a window, as DuckDB orders them", """
        SELECT run, max(CASE WHEN k = 1 THEN ttft_s END) AS first_ordered, count(*) FILTER (WHERE ttft_s IS NULL) AS blanks
        FROM (SELECT run, ttft_s, row_number() OVER (PARTITION BY run ORDER BY ttft_s DESC) AS k FROM requests)
        GROUP BY ALL ORDER BY run"""),
    ("MAP labels: present, absent (NULL) and grouped", """
        SELECT run, labels['model_name'] AS model_name, labels['no_such_label'] AS absent, count(*) AS samples,
               sum(value) AS total
        FROM metric_samples GROUP BY ALL ORDER BY run, model_name NULLS LAST"""),
    ("guarded division and booleans", """
        SELECT run, count(*) FILTER (WHERE finish_reason = 'length') / nullif(count(*), 0) AS length_share,
               sum(completion_tokens) / nullif(sum(CASE WHEN false THEN 1 ELSE 0 END), 0) AS nothing,
               count_if(ttft_s > 1.0) AS slow
        FROM requests GROUP BY ALL ORDER BY run"""),
    ("a share as an average of 1.0 and 0.0 (DECIMALs): a DOUBLE, every digit", """
        SELECT run, avg(CASE WHEN ttft_s > 0.05 THEN 1.0 ELSE 0.0 END) AS slow_share, avg(prompt_tokens) AS mean_prompt
        FROM requests GROUP BY ALL ORDER BY run"""),
    ("a day of one-minute windows, as an engine's scope_windows numbers them", f"""
        SELECT count(*) AS windows, min(w_start) AS first, max(w_end) AS last
        FROM ({_windows_sql(WindowSpec(datetime(2026, 11, 29), datetime(2026, 11, 29, 23, 59, 30), 60.0, 1800.0))})"""),
]


def _same_rows(reference: list[dict], other: list[dict]) -> list[str]:
    problems = []
    if len(reference) != len(other):
        return [f"{len(reference)} rows on DuckDB, {len(other)} here"]
    for i, (a, b) in enumerate(zip(reference, other)):
        if list(a) != list(b):
            problems.append(f"row {i}: columns {list(a)} vs {list(b)}")
            continue
        for key in a:
            if not same_number(a[key], b[key], rel=1e-12):
                problems.append(f"row {i} {key}: DuckDB {a[key]!r}, here {b[key]!r}")
    return problems


def check_parity(reference_engine, engine) -> None:
    failures = []
    for name, sql in PARITY_CASES:
        expected = reference_engine.query(sql)
        assert expected, f"{name}: the reference returned no rows"
        got = engine.query(sql)
        failures += [f"{name}: {p}" for p in _same_rows(expected, got)]
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------------------------
# What the map writes (no engine needed)


def test_exact_quantiles_never_become_approximate():
    sql = "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY ttft_s), quantile_cont(e2e_s, 0.5) FROM requests"
    assert translate(sql, "spark") == ("SELECT PERCENTILE(ttft_s, 0.99), PERCENTILE(e2e_s, 0.5) "
                                       "FROM requests AS requests")
    assert translate(sql, "chdb") == ("SELECT quantileExactInclusive(0.99)(ttft_s), quantileExactInclusive(0.5)(e2e_s) "
                                      "FROM requests")
    assert "median" not in translate("SELECT median(x) FROM t", "clickhouse").lower()  # ClickHouse median samples


def test_timestamps_keep_microseconds_on_clickhouse():
    out = translate("SELECT date_diff('microsecond', TIMESTAMP '2026-11-28 10:00:00.5', t_at) FROM r", "chdb")
    assert out == "SELECT dateDiff('microsecond', toDateTime64('2026-11-28 10:00:00.5', 6, 'UTC'), t_at) FROM r"


def test_group_by_all_is_expanded_by_position():
    out = translate("SELECT run, labels['m'] AS m, count(*) AS n FROM metric_samples GROUP BY ALL", "spark")
    assert out == ("SELECT run, TRY_ELEMENT_AT(labels, 'm') AS m, COUNT(*) AS n FROM metric_samples AS metric_samples "
                   "GROUP BY 1, 2")


def test_regr_slope_on_clickhouse_is_null_without_pairs():
    out = translate("SELECT regr_slope(y, x) FROM t", "clickhouse")
    assert out == ("SELECT CASE WHEN countIf(NOT (x IS NULL) AND NOT (y IS NULL)) = 0 THEN NULL "
                   "ELSE tupleElement(simpleLinearRegression(x, y), 1) END FROM t")


def test_a_quantile_list_needs_a_literal_index():
    with pytest.raises(UnsupportedSQL, match="indexed by a number literal"):
        translate("SELECT quantile_cont(x, [0.5, 0.9])[i] FROM t", "spark")


def test_duckdb_is_left_as_written():
    sql = "SELECT quantile_cont(x, 0.99) FROM t GROUP BY ALL"
    assert translate(sql, "duckdb") == "SELECT QUANTILE_CONT(x, 0.99) FROM t GROUP BY ALL"


# ---------------------------------------------------------------------------------------------------------------
# Parity on the engines


def test_chdb_gives_duckdbs_numbers(duckdb_engine, chdb_engine):
    check_parity(duckdb_engine, chdb_engine)


@pytest.mark.engines
def test_spark_local_gives_duckdbs_numbers(duckdb_engine, spark_local_engine):
    check_parity(duckdb_engine, spark_local_engine)


@pytest.mark.engines
def test_spark_standalone_cluster_gives_duckdbs_numbers(duckdb_engine, spark_cluster_engine, spark_cluster):
    assert spark_cluster_engine.spark.sparkContext.master == spark_cluster["url"]
    check_parity(duckdb_engine, spark_cluster_engine)
    executors = spark_cluster_engine.spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    assert executors == 3  # the driver and one executor on each of the two workers


@pytest.mark.engines
def test_clickhouse_server_gives_duckdbs_numbers(duckdb_engine, clickhouse_server_engine):
    check_parity(duckdb_engine, clickhouse_server_engine)


# compare's constructs (servlens/compare/cohorts.py), mapped for ClickHouse; on Spark they are not mapped yet.
CLICKHOUSE_CASES = [
    ("quantile_disc: DuckDB's inverse-CDF position, n·q whole included (60 · 0.05 = 3)", """
        SELECT run, count(completion_tokens) AS n, quantile_disc(completion_tokens, 0.05) AS p5,
               quantile_disc(completion_tokens, 0.5) AS p50, quantile_disc(ttft_s, 0.99) AS p99,
               epoch_us(quantile_disc(t_arrival, 0.01)) AS first_percent_us
        FROM requests GROUP BY ALL ORDER BY ALL"""),
    ("quantile_disc over a list of levels, on compare's 128-bit order key, cuts back as text", """
        SELECT run, CAST(quantile_disc((epoch_us(t_arrival)::HUGEINT * 18446744073709551616
                                        + (CAST(source_id AS BIGINT) * 4294967296 + source_line)),
                                       [0.1, 0.2, 0.3333333333333333, 0.5, 0.98]) AS VARCHAR[]) AS cuts
        FROM requests WHERE t_arrival IS NOT NULL GROUP BY ALL ORDER BY ALL"""),
    ("list(DISTINCT x ORDER BY x) FILTER, isfinite", """
        SELECT run, list(DISTINCT model ORDER BY model) FILTER (WHERE model IS NOT NULL) AS models,
               count(*) FILTER (WHERE isfinite(e2e_s)) AS finite
        FROM requests GROUP BY ALL ORDER BY ALL"""),
]


def test_discrete_quantiles_take_duckdbs_position_on_clickhouse():
    out = translate("SELECT quantile_disc(x, 0.05) FROM t", "chdb")
    assert out == ("SELECT CASE WHEN COUNT(x) = 0 THEN NULL ELSE arraySort(groupArray(x))[toUInt64(greatest(1, "
                   "intDiv(toUInt128(COUNT(x)) * 5 + 99, 100)))] END FROM t")
    with pytest.raises(UnsupportedSQL, match="quantile_disc takes a decimal number literal"):
        translate("SELECT quantile_disc(x, q) FROM t", "chdb")


def test_big_integers_stay_exact_on_clickhouse():
    assert translate("SELECT 18446744073709551616 * k, 9223372036854775807 FROM t", "chdb") == (
        "SELECT toInt128('18446744073709551616') * k, 9223372036854775807 FROM t")


def test_chdb_gives_duckdbs_discrete_quantiles_and_lists(duckdb_engine, chdb_engine):
    failures = []
    for name, sql in CLICKHOUSE_CASES:
        expected = duckdb_engine.query(sql)
        assert len(expected) == 4, name   # three recorded runs and the edge run
        failures += [f"{name}: {p}" for p in _same_rows(expected, chdb_engine.query(sql))]
    assert not failures, "\n".join(failures)
    edge = next(r for r in duckdb_engine.query(CLICKHOUSE_CASES[0][1]) if r["run"] == "edge")
    assert (edge["n"], edge["p5"]) == (60, 12)   # the 3rd of 10..69: ClickHouse's quantileExact would give 13


def test_a_timestamp_minus_microseconds_is_shifted_in_microseconds_on_spark():
    """Spark has no interval of n µs: ts ± to_microseconds(n) is done on unix_micros, earlier as well as later."""
    out = translate("SELECT t - to_microseconds(CAST(30 AS BIGINT)) AS a FROM r", "spark")
    assert out == ("SELECT CAST(TIMESTAMP_MICROS(CAST(UNIX_MICROS(CAST(t AS TIMESTAMP)) - CAST(30 AS BIGINT) AS BIGINT))"
                   " AS TIMESTAMP_NTZ) AS a FROM r AS r")


# ---------------------------------------------------------------------------------------------------------------
# printf on Spark (Java's Formatter): NULL stays NULL, %f rounds as DuckDB does, %g loses C's trailing zeros


def test_an_average_is_a_double_on_spark():
    """DuckDB's avg of a DECIMAL (1.0 is one) is a DOUBLE; Spark's a DECIMAL of four more places (0.011712493 read
    0.01171)."""
    out = translate("SELECT avg(CASE WHEN ok THEN 1.0 ELSE 0.0 END) AS share, avg(CAST(x AS DOUBLE)) AS m FROM t", "spark")
    assert out == ("SELECT AVG(CAST(CASE WHEN ok THEN 1.0 ELSE 0.0 END AS DOUBLE)) AS share, AVG(CAST(x AS DOUBLE)) AS m "
                   "FROM t AS t")


def test_spark_printf_keeps_null_and_divides_as_doubles():
    out = translate("SELECT printf('%,d', CAST(round(n) AS BIGINT)) AS s, a / b AS r FROM t", "spark")
    assert out.startswith("SELECT CASE WHEN CAST(ROUND(n) AS BIGINT) IS NULL THEN NULL ELSE FORMAT_STRING('%,d', ")
    assert out.endswith("TRY_DIVIDE(CAST(a AS DOUBLE), b) AS r FROM t AS t")


def test_spark_printf_refuses_a_conversion_it_does_not_map():
    from servlens.engines.functions import UnsupportedSQL

    with pytest.raises(UnsupportedSQL, match="printf conversion '%x' is not mapped for Spark"):
        translate("SELECT printf('%x', n) FROM t", "spark")


# ties of the exact binary value (0.125, 42.5), near-ties whose shortest decimal is a tie (0.295, 0.35, 2.675), a
# negative zero after rounding, integers and values for both notations of %g
PRINTF_VALUES = [0.295, 42.5, 0.25, 0.125, 2.675, 0.15, 0.05, 0.35, 1.0005, 30.0, 1234567.0, 0.0001234567, 1.234e-05,
                 0.0456, -2.5, 0.0, -0.04, 100000.0, 1e6, 1e-7, 0.30000000000000004, 99.95, 7.0 / 3, None]


@pytest.mark.engines
def test_spark_printf_prints_what_duckdb_prints(duckdb_engine, spark_local_engine):
    rows = " UNION ALL ".join(f"SELECT {i} AS i, CAST({'NULL' if v is None else repr(v)} AS DOUBLE) AS v"
                              for i, v in enumerate(PRINTF_VALUES))
    sql = (f"SELECT i, printf('%.0f', v) AS f0, printf('%.1f', v) AS f1, printf('%.2f%%', v) AS f2, "
           f"printf('%g s', v) AS g, printf('%,d', CAST(round(v * 1000) AS BIGINT)) AS d FROM ({rows}) t ORDER BY i")
    expected = duckdb_engine.query(sql)
    got = spark_local_engine.query(sql)
    assert got == expected
    assert [r["f1"] for r in got][:4] == ["0.3", "42.5", "0.2", "0.1"] and got[-1]["g"] is None
