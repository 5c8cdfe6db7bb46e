"""servlens' statistical functions (sl_fisher_greater_p, sl_binom_sf, sl_normal_sf) on an engine that lacks them.

DuckDB runs them as Python UDFs (servlens/analysis/sql_functions.py). Another engine would need each formula as a
UDF of its own, written again per engine, and would agree with scipy only as far as its own lgamma or erf does. Their
arguments are aggregates (a start's early and later counts, a rank test's z), so servlens evaluates them in two
phases instead, the same on every engine:

1. the probe: the SELECT that calls the function, with the call written as NULL and its arguments added as
   columns, under the CTEs it can see; the engine returns its DISTINCT argument tuples (a handful of rows);
2. Python computes each tuple with DuckDB's very function, and the call becomes a lookup of literals,
   `CASE WHEN a = 12 AND b = 3 ... THEN 0.0123... END`, that the engine runs with the rest of the query.

So a p-value is bit for bit DuckDB's for the same arguments. A floating-point argument matches within 1e-12
relative, because an engine's parallel sum may differ in its last bits from one run of the query to the next.
The function must be called in a select list, not inside an aggregate or a window (its arguments are then rows,
not aggregates); sl_mannwhitney_less_p takes the samples themselves and is not computed this way.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from sqlglot import exp

from servlens.analysis.sql_functions import FUNCTIONS
from servlens.engines.functions import UnsupportedSQL

# name -> (function, argument types as DuckDB casts them)
COMPUTED = {name: (function, args) for name, function, args, _ in FUNCTIONS if "[]" not in "".join(args)}
# More distinct argument tuples than this and the function is being called per row, not on aggregates.
MAX_ARGUMENT_TUPLES = 2_000
# Relative tolerance of a floating-point argument's match (an engine's float sums are not bit-stable).
FLOAT_MATCH_REL = 1e-12
_ARG = "__sl_arg"


def _is_computed(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() in COMPUTED


def calls(tree: exp.Expression) -> list[exp.Anonymous]:
    return [node for node in tree.find_all(exp.Anonymous) if _is_computed(node)]


def _visible_ctes(select: exp.Select) -> list[exp.CTE]:
    """The CTEs the SELECT can read, outermost WITH first, each WITH's CTEs before the one holding the SELECT."""
    found: list[list[exp.CTE]] = []
    path, node = [select], select.parent
    while node is not None:
        with_ = node.args.get("with_") or node.args.get("with")
        if isinstance(with_, exp.With):
            ctes = list(with_.expressions)
            holder = next((i for i, cte in enumerate(ctes) if any(cte is p for p in path)), None)
            found.append(ctes[:holder] if holder is not None else ctes)
        path.append(node)
        node = node.parent
    return [cte for level in reversed(found) for cte in level]


def _check_position(call: exp.Anonymous, select: exp.Select) -> None:
    name = call.name.lower()
    node = call
    while node.parent is not None and node.parent is not select:
        if isinstance(node.parent, (exp.AggFunc, exp.Window)):
            raise UnsupportedSQL(f"{name}() inside an aggregate or a window reads rows, not aggregates: servlens "
                                 "computes it only on an engine's aggregates", f"Aggregate first, then call {name}()")
        node = node.parent
    if node.arg_key != "expressions":
        raise UnsupportedSQL(f"{name}() is computed by servlens on engines other than DuckDB, and only in a select "
                             "list", f"Compute {name}() in a select list (a CTE), then filter on its column")


def probe(tree: exp.Expression, call: exp.Anonymous) -> exp.Select | None:
    """The query giving the call's distinct argument tuples (None while it still reads another such call)."""
    select = call.find_ancestor(exp.Select)
    if select is None:
        raise UnsupportedSQL(f"{call.name}() outside a SELECT", "Call it in a select list")
    _check_position(call, select)
    if any(_is_computed(node) for arg in call.expressions for node in arg.find_all(exp.Anonymous)):
        return None
    inner = select.copy()
    for node in calls(inner):
        if node.find_ancestor(exp.Select) is inner:  # this select's calls (all in its select list) are not read
            node.replace(exp.Null())
    if calls(inner):
        return None
    for i, arg in enumerate(call.expressions):
        inner.append("expressions", exp.alias_(arg.copy(), f"{_ARG}{i}"))
    ctes = [cte.copy() for cte in _visible_ctes(select)]
    if any(calls(cte) for cte in ctes):
        return None
    query = exp.select(*[exp.column(f"{_ARG}{i}") for i in range(len(call.expressions))]).distinct().from_(
        exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("__sl_probe"))))
    if ctes:
        query.set("with_" if "with_" in type(query).arg_types else "with", exp.With(expressions=ctes))
    return query


def value(name: str, args: tuple) -> Any:
    """The function on one argument tuple as DuckDB calls it: arguments cast to the declared types, NULL in, NULL
    out. An argument tuple the function rejects (a row the query's CASE never reads) has no value."""
    function, types = COMPUTED[name]
    if any(a is None for a in args):
        return None
    try:
        cast = [int(round(a)) if t == "BIGINT" else float(a) for a, t in zip(args, types)]
        result = function(*cast)
    except (ValueError, OverflowError, ZeroDivisionError, TypeError):
        return None
    return None if result is None else float(result)


def _match(arg: exp.Expression, literal: Any) -> exp.Expression:
    if isinstance(literal, float) and literal != 0.0 and math.isfinite(literal):
        return exp.LTE(this=exp.Abs(this=exp.Sub(this=exp.Paren(this=arg.copy()), expression=_number(literal))),
                       expression=_number(FLOAT_MATCH_REL * abs(literal)))
    return exp.EQ(this=exp.Paren(this=arg.copy()), expression=_number(literal))


def _number(v: Any) -> exp.Expression:
    text = repr(v)
    return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") else exp.Literal.number(text)


def lookup(call: exp.Anonymous, rows: list[tuple]) -> exp.Expression:
    """The call as a CASE over the computed values (NULL for an argument tuple without one)."""
    name = call.name.lower()
    if len(rows) > MAX_ARGUMENT_TUPLES:
        raise UnsupportedSQL(f"{name}() is called on {len(rows)} distinct arguments: servlens computes it on an "
                             f"engine's aggregates only (at most {MAX_ARGUMENT_TUPLES})", "Aggregate before calling it")
    ifs = []
    for args in rows:
        result = value(name, args)
        if result is None or not math.isfinite(result) or any(isinstance(a, float) and not math.isfinite(a)
                                                              for a in args):
            continue
        condition = exp.and_(*[_match(arg, a) for arg, a in zip(call.expressions, args)])
        ifs.append(exp.If(this=condition, true=_number(result)))
    if not ifs:
        return exp.Cast(this=exp.Null(), to=exp.DataType.build("DOUBLE"))
    return exp.Case(ifs=ifs, default=exp.Null())


def compute_calls(tree: exp.Expression, run: Callable[[exp.Expression], list[dict]],
                  cache: dict[str, list[tuple]] | None = None) -> exp.Expression:
    """`tree` with every call of a computed function replaced by its values' lookup; `run` runs a probe on the
    engine. Calls another one's probe reads go first (a CTE before the query reading it)."""
    cache = {} if cache is None else cache
    while True:
        pending = calls(tree)
        if not pending:
            return tree
        for call in pending:
            query = probe(tree, call)
            if query is None:
                continue
            key = query.sql("duckdb")
            if key not in cache:
                if len(cache) > 500:
                    cache.clear()
                cache[key] = [tuple(row.values()) for row in run(query)]
            replacement, select = lookup(call, cache[key]), call.find_ancestor(exp.Select)
            for same in calls(tree):
                if same == call and same.find_ancestor(exp.Select) is select:
                    same.replace(replacement.copy())
            break
        else:
            raise UnsupportedSQL(f"{pending[0].name}() calls cannot be ordered (each reads another's result)",
                                 "Compute one in a CTE the other reads")
