"""sl_fisher_greater_p (SL006's one-sided Fisher test) without scipy.stats: the same p-values as scipy on the tables readiness builds."""

import pytest
from scipy.stats import fisher_exact

from servlens.analysis.sql_functions import fisher_exact_greater


@pytest.mark.parametrize("table", [
    (0, 13, 0, 5965), (1, 26, 0, 22627), (1, 22, 1, 12614), (5, 3, 2, 900), (8, 0, 0, 40), (0, 0, 3, 10),
    (3, 0, 0, 0), (2, 2, 30, 30), (40, 60, 15, 98000), (12, 300, 700, 120000),
    (0, 1000, 1000, 998000), (900, 2000, 3000, 990000),  # large early windows: scipy's own route
])
def test_matches_scipy(table):
    a, b, c, d = table
    expected = float(fisher_exact([[a, b], [c, d]], alternative="greater").pvalue)
    assert fisher_exact_greater(a, b, c, d) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_all_errors_early_is_the_hypergeometric_tail():
    # 3 errors, all in the first 3 of 10 requests: P = 1 / C(10, 3).
    assert fisher_exact_greater(3, 0, 0, 7) == pytest.approx(1 / 120, rel=1e-15)
