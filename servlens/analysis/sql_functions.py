"""Statistical functions rule SQL may call, registered on the DuckDB connection (one home for each).

    sl_fisher_greater_p(a, b, c, d)        one-sided Fisher exact test on [[a, b], [c, d]]: P(X >= a) for X
                                           hypergeometric with the table's margins (the first row's share of the
                                           first column is greater than the second row's)
    sl_binom_sf(k, n, p)                   P(X >= k) for X ~ Binomial(n, p)
    sl_normal_sf(z)                        P(Z >= z) for a standard normal Z (0.5 erfc(z / sqrt 2)): the tail of a
                                           rank test's normal approximation computed in SQL (SL008)
    sl_mannwhitney_less_p(xs, ys)          one-sided Mann-Whitney U test that xs tend to be smaller than ys
                                           (scipy.stats.mannwhitneyu(xs, ys, alternative="less"), asymptotic with
                                           tie and continuity correction for large samples, exact for small ones)

Portable definitions (docs/rules-contract.md): each is a closed form another engine can carry as a UDF of its own
(Spark: a pandas UDF calling scipy; Trino/ClickHouse: the formulas below), and a rule that calls one is portable
only where that engine has it. Fisher's tail is sum_{x=a}^{min(r1,c1)} C(c1,x) C(N-c1,r1-x) / C(N,r1) with
r1 = a+b, c1 = a+c, N = a+b+c+d; the binomial tail is sum_{x=k}^{n} C(n,x) p^x (1-p)^(n-x). scipy.stats is
imported on first call only (about a second), so a run whose rules never call these does not pay for it.
A NULL argument gives NULL.
"""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb


def fisher_exact_greater(a: int, b: int, c: int, d: int) -> float:
    """One-sided Fisher's exact test on [[a, b], [c, d]] (alternative: the first row's share of the first column is
    greater): P(X >= a) for X hypergeometric with the table's margins, summed exactly in integers.

    The same p-value as scipy.stats.fisher_exact(..., alternative="greater") (to its last digits; below 1e-259
    scipy's own value drifts), without importing scipy.stats for small tables. A large first row (an early window
    of thousands of requests) makes the integers huge: scipy then.
    """
    a, b, c, d = (int(v) for v in (a, b, c, d))
    row1, col1, total = a + b, a + c, a + b + c + d
    if (min(row1, col1) - a + 1) * min(row1, total - row1) > 200_000:
        from scipy.stats import fisher_exact

        return float(fisher_exact([[a, b], [c, d]], alternative="greater").pvalue)
    tail = sum(math.comb(col1, x) * math.comb(total - col1, row1 - x) for x in range(a, min(row1, col1) + 1))
    return float(Fraction(tail, math.comb(total, row1)))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact for n up to 2000, scipy's binom.sf beyond."""
    k, n, p = int(k), int(n), float(p)
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if n > 2000:
        from scipy.stats import binom

        return float(binom.sf(k - 1, n, p))
    return min(1.0, sum(math.comb(n, x) * p ** x * (1 - p) ** (n - x) for x in range(k, n + 1)))


def normal_sf(z: float) -> float:
    """P(Z >= z) for a standard normal Z: the upper tail a rank test's normal approximation reads."""
    return 0.5 * math.erfc(float(z) / math.sqrt(2))


def mannwhitney_less_p(xs: list[float], ys: list[float]) -> float | None:
    """One-sided Mann-Whitney U p-value that xs are stochastically smaller than ys; NULL with an empty side."""
    xs = [float(v) for v in xs if v is not None]
    ys = [float(v) for v in ys if v is not None]
    if not xs or not ys:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(xs, ys, alternative="less").pvalue)


FUNCTIONS = (
    ("sl_fisher_greater_p", fisher_exact_greater, ["BIGINT", "BIGINT", "BIGINT", "BIGINT"], "DOUBLE"),
    ("sl_binom_sf", binom_sf, ["BIGINT", "BIGINT", "DOUBLE"], "DOUBLE"),
    ("sl_mannwhitney_less_p", mannwhitney_less_p, ["DOUBLE[]", "DOUBLE[]"], "DOUBLE"),
    ("sl_normal_sf", normal_sf, ["DOUBLE"], "DOUBLE"),
)
FUNCTION_NAMES = tuple(name for name, *_ in FUNCTIONS)


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Register the functions on `con` once (a second call is a no-op)."""
    # A probe, not a catalog listing (this runs once per scope): the last function registered binds, so all do.
    name, _, args, _ = FUNCTIONS[-1]
    try:
        con.execute(f"SELECT {name}({', '.join(f'CAST(NULL AS {a})' for a in args)}) WHERE FALSE")
        return
    except duckdb.CatalogException:
        pass
    present = {row[0] for row in con.execute(
        "SELECT function_name FROM duckdb_functions() WHERE function_name LIKE 'sl\\_%' ESCAPE '\\'").fetchall()}
    for name, function, args, returns in FUNCTIONS:
        if name not in present:
            con.create_function(name, function, args, returns, side_effects=False)
