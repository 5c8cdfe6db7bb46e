"""servlens' statistical functions on an engine without them: the engine returns the argument tuples (aggregates),
Python computes them with DuckDB's very functions, and the query reads the values back as literals."""

from __future__ import annotations

import pytest

from servlens.analysis.sql_functions import binom_sf, fisher_exact_greater, normal_sf
from servlens.engines.functions import UnsupportedSQL

GROUPS = """WITH g AS (SELECT model, count(*) AS n, count(ttft_s) AS k, avg(e2e_s) AS e2e FROM requests
                       WHERE run = 'edge' GROUP BY model)"""


def test_values_are_duckdbs_and_only_the_argument_tuples_move(chdb_engine):
    expected = {r["model"]: r for r in chdb_engine.query(f"{GROUPS} SELECT * FROM g")}
    before = chdb_engine.stats.rows_moved
    got = chdb_engine.query(f"""{GROUPS}
        SELECT model, sl_binom_sf(k, n, 0.5) AS binom, sl_normal_sf(e2e - 2) AS z,
               CASE WHEN n > 1 THEN sl_fisher_greater_p(k, n - k, 1, 3) END AS fisher
        FROM g ORDER BY model""")
    # three probes of at most one tuple per model, then the three result rows
    assert chdb_engine.stats.rows_moved - before <= 3 * len(expected) + len(expected)
    assert [r["model"] for r in got] == ["blank", "single", "tied"]
    for row in got:
        g = expected[row["model"]]
        assert row["binom"] == binom_sf(g["k"], g["n"], 0.5)
        assert row["z"] == (None if g["e2e"] is None else normal_sf(g["e2e"] - 2))
        assert row["fisher"] == (fisher_exact_greater(g["k"], g["n"] - g["k"], 1, 3) if g["n"] > 1 else None)
    assert got[0]["z"] is None and 0 < got[2]["binom"] < 1e-5  # NULL in, NULL out; and a real tail


def test_a_call_reading_another_calls_view_is_computed_after_it(chdb_engine):
    views = {"p": f"{GROUPS} SELECT model, sl_binom_sf(k, n, 0.5) AS binom FROM g"}
    got = chdb_engine.query("SELECT model, sl_normal_sf(binom) AS z FROM p ORDER BY model", views=views)
    tied = chdb_engine.query(f"{GROUPS} SELECT k, n FROM g WHERE model = 'tied'")[0]
    assert got[2]["z"] == normal_sf(binom_sf(tied["k"], tied["n"], 0.5))


def test_a_call_on_rows_is_refused(chdb_engine):
    with pytest.raises(UnsupportedSQL, match=r"^sl_normal_sf\(\) inside an aggregate or a window reads rows"):
        chdb_engine.query("SELECT sum(sl_normal_sf(ttft_s)) AS s FROM requests")
    with pytest.raises(UnsupportedSQL, match=r"^sl_normal_sf\(\) is computed by servlens .* only in a select list"):
        chdb_engine.query("SELECT count(*) AS n FROM requests WHERE sl_normal_sf(ttft_s) < 0.5")
