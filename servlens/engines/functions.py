"""servlens' function map: the portable SQL servlens writes (DuckDB's dialect, the reference) in each engine's words.

Generic transpilation is not enough for a gate (issue #17, measured): sqlglot writes DuckDB's exact
`percentile_cont(q) WITHIN GROUP` as Spark's *approximate* `PERCENTILE_APPROX`, writes `quantile_cont(x, q)` as a
`PERCENTILE_CONT(x, q)` that ClickHouse lacks and Spark 4.3 rejects, and casts timestamp literals to ClickHouse's
second-resolution `DateTime`. So servlens parses with sqlglot and then rewrites, itself, every construct whose
meaning it relies on; sqlglot only prints the result. What is mapped, per engine (ClickHouse = chDB and a server):

| servlens SQL (DuckDB)                         | ClickHouse                                   | Spark                                  |
|-----------------------------------------------|----------------------------------------------|----------------------------------------|
| quantile_cont(x, q), percentile_cont(q) WITHIN GROUP (ORDER BY x), median(x) | quantileExactInclusive(q)(x) | percentile(x, q) |
| quantile_cont(x, [q1, q2])[i]                 | quantileExactInclusive(q_i)(x)               | percentile(x, q_i)                     |
| quantile_disc(x, q), quantile_disc(x, [q1, q2]) | the sorted values at max(1, ceil(n·q)) (integer arithmetic); a list is [] over no value | the same with array_sort(collect_list(x)) and element_at |
| list([DISTINCT] x [ORDER BY x]) [FILTER (WHERE c)] | groupArray(If) of 1-tuples (NULLs kept), arrayDistinct, arraySort; [] over no row (no NULL array) | collect_list of structs [FILTER], array_distinct, array_sort; [] over no row |
| epoch_us(t)                                   | toUnixTimestamp64Micro(t)                    | unix_micros(t)                         |
| isfinite(x)                                   | isFinite(x)                                  | NOT (isnan(x) OR abs(x) = inf)         |
| an integer literal beyond 64 bits (2^64)      | toInt128('...') (ClickHouse reads it as Float64) | as written (a DECIMAL literal)      |
| CAST(x AS HUGEINT)                            | Int128                                       | DECIMAL(38, 0)                         |
| date_diff('unit', a, b)                       | dateDiff('unit', a, b)                       | timestampdiff(UNIT, a, b)              |
| date_trunc('unit', t)                         | dateTrunc('unit', t)                         | date_trunc('UNIT', t)                  |
| time_bucket(INTERVAL n SECOND, t)             | toStartOfInterval(t, INTERVAL n SECOND)      | from unix_micros, floored to n s       |
| epoch(t) (seconds, with the fraction)         | toUnixTimestamp64Micro(t) / 1e6              | unix_micros(t) / 1e6                   |
| TIMESTAMP '...' and CAST(x AS TIMESTAMP)      | DateTime64(6, 'UTC') (DateTime drops the µs) | TIMESTAMP_NTZ                          |
| regr_slope(y, x)                              | simpleLinearRegression(x, y).1, NULL on no pair | regr_slope(y, x)                    |
| ts + to_microseconds(n)                       | ts + toIntervalMicrosecond(n)                | timestamp_micros(unix_micros(ts) + n)  |
| labels['k'] (a MAP; NULL when the key is absent) | if(mapContains(labels, 'k'), labels['k'], NULL) | try_element_at(labels, 'k')     |
| a / b                                         | a / b (inf / nan on zero, as DuckDB)         | try_divide(CAST(a AS DOUBLE), b)       |
| avg(x) (a DOUBLE, also of a DECIMAL)          | avg(x)                                       | avg(CAST(x AS DOUBLE))                 |
| printf(fmt, ...)                              | see _ch_printf                               | format_string, see _spark_printf       |
| regexp_full_match(s, p)                       | match(s, '^(?:p)$')                          | s RLIKE '^(?:p)\\z'                     |
| GROUP BY ALL                                  | expanded to the non-aggregate select items   | expanded                               |
| ORDER BY ALL                                  | ORDER BY every select item, NULLS LAST       | the same                               |
| row_number(), ntile(n) OVER (ORDER BY ...)    | the same; NULL order made explicit           | the same; NULLS LAST made explicit     |

DuckDB's quantile_disc is the inverse CDF: the value at sorted position max(1, ceil(n·q)), with q read as the exact
decimal it is written as; ClickHouse's quantileExact* take floor(n·q) in floating point, which differs whenever
n·q is whole (and then some), so the map picks that position itself from the sorted values, in integer arithmetic.

ClickHouse also gets DuckDB's meaning of round (half away from zero), printf('%,d'), regexp_full_match,
split_part, json_extract[_string], TRY_CAST, string_agg/array_agg ORDER BY, concat_ws, a correlated count over no
row, signed window counts and s.* under several joins (docs/engines.md has the full table).

Exact quantiles are exact on every engine and interpolate alike (DuckDB's quantile_cont, ClickHouse's
quantileExactInclusive and Spark's percentile are all the (n-1)·q linear rule), so a p99 agrees to the last digit.
Division by zero is the one known difference (DuckDB and ClickHouse: inf/nan; Spark: NULL): rule SQL divides by
`nullif(b, 0)`, which every engine reads the same way. A function outside this map that the engine does not
have is reported by `servlens engines check`, never rewritten into something approximate.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from servlens.errors import ConfigError

# servlens engine name -> sqlglot dialect
DIALECTS = {"duckdb": "duckdb", "chdb": "clickhouse", "clickhouse": "clickhouse", "spark": "spark"}

_SECONDS_PER_UNIT = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


class UnsupportedSQL(ConfigError):
    """The SQL uses a construct servlens cannot carry to the engine exactly."""


def parse(sql: str) -> exp.Expression:
    try:
        return sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise UnsupportedSQL(f"Cannot parse the SQL: {str(exc).splitlines()[0]}", "Fix the rule's SQL") from exc


def translate(sql: str | exp.Expression, engine: str, copy: bool = True) -> str:
    """`sql` (servlens' portable SQL, DuckDB dialect) as the engine runs it; a tree is rewritten in place with
    copy=False (one the caller parsed for this alone: a copy of a large query costs more than its rewrite)."""
    dialect = DIALECTS[engine]
    tree = parse(sql) if isinstance(sql, str) else (sql.copy() if copy else sql)
    if dialect == "duckdb":
        return tree.sql("duckdb")
    tree = _name_columns(_expand_order_by_all(_expand_group_by_all(tree)))
    if dialect == "clickhouse":
        tree = _expand_join_stars(tree)
    else:
        tree = _alias_bare_tables(tree)
    rewrite = _CLICKHOUSE if dialect == "clickhouse" else _SPARK
    return _bottom_up(tree, rewrite).sql(dialect)


def _bottom_up(node: exp.Expression, table: dict) -> exp.Expression:
    """Rewrite the children first, so a rewritten call still has its arguments rewritten (a timestamp literal
    inside date_diff inside a quantile)."""
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _bottom_up(value, table))
        elif isinstance(value, list):
            node.set(key, [_bottom_up(v, table) if isinstance(v, exp.Expression) else v for v in value])
    return _rewrite(node, table)


def _rewrite(node: exp.Expression, table: dict) -> exp.Expression:
    for kind, function in table.items():
        if isinstance(node, kind):
            replaced = function(node)
            if replaced is not None:
                return replaced
    return node


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces


def _quantile_parts(node: exp.Expression) -> tuple[exp.Expression, exp.Expression] | None:
    """(value expression, quantile) of an exact-quantile aggregate in any of DuckDB's spellings, else None."""
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont):
        order = node.expression
        ordered = order.expressions if isinstance(order, exp.Order) else [order]
        if len(ordered) != 1:
            raise UnsupportedSQL("percentile_cont WITHIN GROUP orders by one expression only", "Order by one column")
        value = ordered[0].this if isinstance(ordered[0], exp.Ordered) else ordered[0]
        return value, node.this.this
    # (a quantile list is rewritten together with its index, at the Bracket)
    if isinstance(node, exp.PercentileCont) and node.expression is not None and not isinstance(node.expression, exp.Array):
        return node.this, node.expression
    if isinstance(node, exp.Median):
        return node.this, exp.Literal.number(0.5)
    return None


def _quantile_list_item(node: exp.Bracket) -> tuple[exp.Expression, exp.Expression] | None:
    """quantile_cont(x, [q1, q2, ...])[i] (1-based, DuckDB) -> (x, q_i)."""
    inner = node.this
    if not (isinstance(inner, exp.PercentileCont) and isinstance(inner.expression, exp.Array)):
        return None
    index = node.expressions[0] if len(node.expressions) == 1 else None
    if not (isinstance(index, exp.Literal) and not index.is_string):
        raise UnsupportedSQL("A quantile list is indexed by a number literal only", "Write quantile_cont(x, q)")
    items = inner.expression.expressions
    position = int(index.this) - 1
    if not 0 <= position < len(items):
        raise UnsupportedSQL(f"Quantile list index {index.this} is out of range", "Index 1..len(list)")
    return inner.this, items[position]


def _is_map_lookup(node: exp.Bracket) -> bool:
    return len(node.expressions) == 1 and isinstance(node.expressions[0], exp.Literal) and node.expressions[0].is_string


def _unit(node: exp.Expression) -> str:
    unit = node.args.get("unit")
    text = (unit.name if isinstance(unit, (exp.Var, exp.Literal, exp.Identifier, exp.Column)) else str(unit or "day"))
    return text.strip("'").lower()


def _expand_group_by_all(tree: exp.Expression) -> exp.Expression:
    """GROUP BY ALL -> GROUP BY every select item that holds no aggregate (by position, so aliases need no care)."""
    for select in tree.find_all(exp.Select):
        group = select.args.get("group")
        if not group or not group.args.get("all"):
            continue
        positions = [exp.Literal.number(i + 1) for i, item in enumerate(select.expressions)
                     if not item.find(exp.AggFunc) and not isinstance(item.unalias(), exp.Literal)]
        select.set("group", exp.Group(expressions=positions) if positions else None)
    return tree


def _expand_order_by_all(tree: exp.Expression) -> exp.Expression:
    """ORDER BY ALL -> ORDER BY every select item by position, ascending, NULLS LAST (DuckDB's default)."""
    for select in tree.find_all(exp.Select):
        order = select.args.get("order")
        if not order or len(order.expressions) != 1:
            continue
        item = order.expressions[0]
        if not (isinstance(item, exp.Ordered) and isinstance(item.this, exp.Var) and item.this.name.upper() == "ALL"):
            continue
        desc = bool(item.args.get("desc"))
        select.set("order", exp.Order(expressions=[
            exp.Ordered(this=exp.Literal.number(i + 1), desc=desc, nulls_first=False)
            for i in range(len(select.expressions))]))
    return tree


def _decimal_fraction(node: exp.Expression) -> tuple[int, int]:
    """A quantile literal as the exact fraction DuckDB reads it as (a DECIMAL): (numerator, 10^scale)."""
    text = node.this if isinstance(node, exp.Literal) and not node.is_string else None
    if text is None or not all(ch.isdigit() or ch == "." for ch in text) or text.count(".") > 1:
        raise UnsupportedSQL("quantile_disc takes a decimal number literal (or a list of them) as its quantile",
                             "Write quantile_disc(x, 0.5)")
    whole, _, fraction = text.partition(".")
    if len(whole.lstrip("0")) + len(fraction) > 18:
        raise UnsupportedSQL(f"quantile_disc's quantile {text} has more digits than DuckDB reads as a DECIMAL",
                             "Write at most 18 digits")
    return int(whole + fraction or "0"), 10 ** len(fraction)


def _name_columns(tree: exp.Expression) -> exp.Expression:
    """`SELECT r.kind FROM ...` names its column `kind` in DuckDB; ClickHouse names it `r.kind`. Each unaliased
    column of a select list gets its own name as alias, so every engine's result has DuckDB's column names."""
    for select in tree.find_all(exp.Select):
        for item in select.expressions:
            if isinstance(item, exp.Column) and item.table and not isinstance(item.this, exp.Star):
                item.replace(exp.alias_(item.copy(), item.name, quoted=True))
    return tree


def _source_columns(select: exp.Select, name: str) -> list[str] | None:
    """The output column names of the table expression `name` of `select` when the SQL says them (a CTE or a
    subquery whose select list has no star), else None."""
    sources = [select.args.get("from_") or select.args.get("from")] + list(select.args.get("joins") or [])
    for source in sources:
        item = source.this if source is not None else None
        if item is None or item.alias_or_name != name:
            continue
        body = item.this if isinstance(item, exp.Subquery) else None
        if isinstance(item, exp.Table) and not item.db:
            node = select
            while node is not None and body is None:
                with_ = node.args.get("with_") or node.args.get("with")
                if isinstance(with_, exp.With):
                    body = next((cte.this for cte in with_.expressions if cte.alias == item.name), None)
                node = node.parent
        while isinstance(body, exp.SetOperation):
            body = body.this
        if (isinstance(body, exp.Select) and len(body.expressions) == 1 and isinstance(body.expressions[0], exp.Star)
                and not body.args.get("joins") and isinstance((body.args.get("from_") or body.args.get("from")), exp.From)):
            inner = (body.args.get("from_") or body.args.get("from")).this  # SELECT * FROM x [WHERE ...]: x's columns
            return _source_columns(body, inner.alias_or_name)
        if not isinstance(body, exp.Select) or any(isinstance(p, exp.Star) or (isinstance(p, exp.Column) and
                                                  isinstance(p.this, exp.Star)) for p in body.expressions):
            return None
        return [p.alias_or_name for p in body.expressions]
    return None


def _alias_bare_tables(tree: exp.Expression) -> exp.Expression:
    """`FROM t WHERE (c)`: WHERE is not a reserved word in Spark's default (non-ANSI) grammar, so Spark reads it as
    t's alias and `(c)` as its column list, and refuses the query with ASSIGNMENT_ARITY_MISMATCH (t's columns vs
    one name). Every table read without an alias gets its own name as alias, which leaves no room for that."""
    for table in tree.find_all(exp.Table):
        if (table.args.get("alias") is None and not table.db and isinstance(table.this, exp.Identifier)
                and isinstance(table.parent, (exp.From, exp.Join))):
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
    return tree


def _expand_join_stars(tree: exp.Expression) -> exp.Expression:
    """`SELECT s.*, ... FROM s JOIN a JOIN b`: with two joins or more ClickHouse names a column of `s.*` that
    another joined table also has `s.capped`, so a query reading the result's `capped` fails. The star is
    written out as `s.capped AS capped, ...` where the SQL says s's columns (a CTE, a subquery)."""
    for select in list(tree.find_all(exp.Select)):
        if len(select.args.get("joins") or []) < 2:
            continue
        items = []
        for item in select.expressions:
            names = (_source_columns(select, item.table)
                     if isinstance(item, exp.Column) and isinstance(item.this, exp.Star) and item.table else None)
            items += ([exp.alias_(exp.column(n, table=item.table, quoted=True), n, quoted=True) for n in names]
                      if names else [item])
        select.set("expressions", items)
    return tree


def _timestamp_type(node: exp.Cast) -> bool:
    types = exp.DataType.Type
    return node.to.this in (types.TIMESTAMP, types.TIMESTAMPNTZ, types.DATETIME, types.DATETIME64)


# ---------------------------------------------------------------------------------------------------------------
# ClickHouse (chDB and a server)


def _ch_quantile(value: exp.Expression, quantile: exp.Expression) -> exp.Expression:
    return exp.ParameterizedAgg(this="quantileExactInclusive", expressions=[quantile.copy()], params=[value.copy()])


def _ch_disc_position(value: exp.Expression, quantile: exp.Expression) -> exp.Expression:
    """DuckDB's quantile_disc position (1-based): max(1, ceil(n·q)), n the non-NULL values, in integer arithmetic."""
    numerator, denominator = _decimal_fraction(quantile)
    n = exp.Anonymous(this="toUInt128", expressions=[exp.Count(this=value.copy())])
    ceiling = exp.Anonymous(this="intDiv", expressions=[
        exp.Add(this=exp.Mul(this=n, expression=exp.Literal.number(numerator)),
                expression=exp.Literal.number(denominator - 1)), exp.Literal.number(denominator)])
    return exp.Anonymous(this="toUInt64", expressions=[
        exp.Anonymous(this="greatest", expressions=[exp.Literal.number(1), ceiling])])


def _ch_quantile_disc(node: exp.PercentileDisc):
    """quantile_disc(x, q) / quantile_disc(x, [q1, ...]): the sorted non-NULL values at DuckDB's positions; NULL
    over no value, as DuckDB."""
    value, quantile = node.this, node.expression
    if quantile is None:
        return None
    ordered = exp.Anonymous(this="arraySort", expressions=[exp.Anonymous(this="groupArray", expressions=[value.copy()])])
    if isinstance(quantile, exp.Array):
        picked = exp.Anonymous(this="arrayMap", expressions=[
            exp.Lambda(this=exp.Bracket(this=ordered, expressions=[exp.to_identifier("i")]),
                       expressions=[exp.to_identifier("i")]),
            exp.Array(expressions=[_ch_disc_position(value, q) for q in quantile.expressions])])
    else:
        picked = exp.Bracket(this=ordered, expressions=[_ch_disc_position(value, quantile)])
    empty = exp.EQ(this=exp.Count(this=value.copy()), expression=exp.Literal.number(0))
    if isinstance(quantile, exp.Array):   # ClickHouse has no NULL array: the empty list over no value
        nothing = exp.Anonymous(this="arraySlice", expressions=[picked.copy(), exp.Literal.number(1),
                                                                exp.Literal.number(0)])
        return exp.If(this=empty, true=nothing, false=picked)
    return exp.If(this=empty, true=exp.Null(), false=picked)


def _list_parts(node: exp.ArrayAgg, engine: str) -> tuple[exp.Expression, list, bool]:
    """list([DISTINCT] x [ORDER BY x]): the value, the ORDER BY keys and whether DISTINCT; the map orders a list by
    its own value, ascending, only."""
    inner = node.this
    value, keys = (inner.this, inner.expressions) if isinstance(inner, exp.Order) else (inner, [])
    distinct = isinstance(value, exp.Distinct)
    if distinct:
        value = value.expressions[0]
    if any(k.this != value or k.args.get("desc") or k.args.get("nulls_first") for k in keys):
        raise UnsupportedSQL(f"On {engine}, list(... ORDER BY ...) orders by the listed value, ascending, only",
                             "Write list(x ORDER BY x)")
    return value, keys, distinct


def _ordered_by_other_keys(node: exp.ArrayAgg) -> bool:
    """array_agg(x ORDER BY k) with keys other than x itself (a rule's), not compare's list(x ORDER BY x)."""
    inner = node.this
    if not isinstance(inner, exp.Order) or isinstance(inner.this, exp.Distinct):
        return False
    return any(k.this != inner.this for k in inner.expressions)


def _ch_list(node: exp.ArrayAgg, condition: exp.Expression | None = None):
    """list([DISTINCT] x [ORDER BY x]) [FILTER (WHERE c)]: groupArray skips NULLs and list() keeps them, so the values
    are collected as 1-tuples (never NULL) and unwrapped. Over no row DuckDB gives NULL and ClickHouse, which has no
    NULL array, the empty list."""
    value, keys, distinct = _list_parts(node, "ClickHouse")
    wrapped = exp.Anonymous(this="tuple", expressions=[value.copy()])
    collected = (exp.Anonymous(this="groupArrayIf", expressions=[wrapped, condition.copy()])
                 if condition is not None else exp.Anonymous(this="groupArray", expressions=[wrapped]))
    collected = exp.Anonymous(this="arrayMap", expressions=[
        exp.Lambda(this=exp.Anonymous(this="tupleElement", expressions=[exp.to_identifier("v"), exp.Literal.number(1)]),
                   expressions=[exp.to_identifier("v")]), collected])
    if distinct:
        collected = exp.Anonymous(this="arrayDistinct", expressions=[collected])
    if keys:
        collected = exp.Anonymous(this="arraySort", expressions=[collected])   # NULLs last, as DuckDB's default
    return collected


def _ch_big_integer(node: exp.Literal):
    """An integer literal beyond 64 bits: ClickHouse reads it as a Float64 (2^64 + 1 == 2^64); as text it is exact."""
    if node.is_string or not node.this.isdigit() or int(node.this) < 2**63:
        return None
    return exp.Anonymous(this="toInt128" if int(node.this) < 2**127 else "toInt256",
                         expressions=[exp.Literal.string(node.this)])


def _ch_percentile(node):
    parts = _quantile_parts(node)
    return _ch_quantile(*parts) if parts else None


def _ch_bracket(node: exp.Bracket):
    item = _quantile_list_item(node)
    if item:
        return _ch_quantile(*item)
    if _is_map_lookup(node):
        # A ClickHouse Map(String, String) gives '' for an absent key: unknown must stay NULL.
        key = node.expressions[0]
        return exp.If(this=exp.Anonymous(this="mapContains", expressions=[node.this.copy(), key.copy()]),
                      true=node.copy(), false=exp.Null())
    return None


def _ch_date_diff(node: exp.DateDiff):
    return exp.Anonymous(this="dateDiff", expressions=[exp.Literal.string(_unit(node)), node.expression.copy(),
                                                       node.this.copy()])


def _ch_trunc(node: exp.TimestampTrunc):
    return exp.Anonymous(this="dateTrunc", expressions=[exp.Literal.string(_unit(node)), node.this.copy()])


def _ch_bucket(node: exp.DateBin):
    return exp.Anonymous(this="toStartOfInterval", expressions=[node.expression.copy(), node.this.copy()])


def _ch_epoch(node: exp.TimeToUnix):
    return exp.Div(this=exp.Anonymous(this="toUnixTimestamp64Micro", expressions=[node.this.copy()]),
                   expression=exp.Literal.number("1e6"))


def _ch_cast(node: exp.Cast):
    if node.to.this == exp.DataType.Type.MAP and isinstance(node.this, exp.Null):
        return exp.Cast(this=exp.Anonymous(this="map"), to=node.to.copy())  # a Map cannot be NULL: an empty one
    if not _timestamp_type(node):
        return None
    if isinstance(node.this, exp.Literal) and node.this.is_string:
        return exp.Anonymous(this="toDateTime64", expressions=[node.this.copy(), exp.Literal.number(6),
                                                               exp.Literal.string("UTC")])
    return exp.Cast(this=node.this.copy(), to=exp.DataType.build("Nullable(DateTime64(6, 'UTC'))", dialect="clickhouse"))


def _ch_regr_slope(node: exp.RegrSlope):
    y, x = node.this, node.expression
    pairs = exp.Anonymous(this="countIf", expressions=[exp.and_(exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())),
                                                               exp.Not(this=exp.Is(this=y.copy(), expression=exp.Null())))])
    slope = exp.Anonymous(this="tupleElement", expressions=[
        exp.Anonymous(this="simpleLinearRegression", expressions=[x.copy(), y.copy()]), exp.Literal.number(1)])
    return exp.If(this=exp.EQ(this=pairs, expression=exp.Literal.number(0)), true=exp.Null(), false=slope)


def _is_to_microseconds(node) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).lower() == "to_microseconds"


_CH_NAMES = {"epoch_us": "toUnixTimestamp64Micro", "isfinite": "isFinite"}


def _ch_anonymous(node: exp.Anonymous):
    if _is_to_microseconds(node):  # DuckDB's INTERVAL of n µs
        return exp.Anonymous(this="toIntervalMicrosecond", expressions=[e.copy() for e in node.expressions])
    if node.name.lower() == "printf":
        return _ch_printf(node)
    renamed = _CH_NAMES.get(str(node.this).lower())
    if renamed:
        return exp.Anonymous(this=renamed, expressions=[e.copy() for e in node.expressions])
    return None


def _ch_string_agg(node: exp.GroupConcat, condition: exp.Expression | None = None):
    """string_agg([DISTINCT] x, sep [ORDER BY k [DESC], ...]) [FILTER (WHERE c)]: ClickHouse aggregates take no ORDER BY, so
    the pairs (x, keys) are collected (groupArrayIf: NULL x skipped, as string_agg does), sorted by the keys (a
    descending key is negated: numbers only) and joined."""
    inner = node.this
    value, keys = (inner.this, inner.expressions) if isinstance(inner, exp.Order) else (inner, [])
    # string_agg(DISTINCT x, ...): each (x, keys) pair once (arrayDistinct keeps the first of each).
    distinct = isinstance(value, exp.Distinct)
    if distinct:
        value = value.expressions[0]
    separator = node.args.get("separator") or exp.Literal.string(",")
    sort_keys = []
    for key in keys:
        term = key.this.copy()
        sort_keys.append(exp.Neg(this=exp.Paren(this=term)) if key.args.get("desc") else term)
    keep = exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))
    if condition is not None:
        keep = exp.and_(keep, exp.Paren(this=condition.copy()))
    pair = exp.Tuple(expressions=[value.copy(), exp.Tuple(expressions=sort_keys or [exp.Literal.number(0)])])
    collected = exp.Anonymous(this="groupArrayIf", expressions=[pair, keep])
    if distinct:
        collected = exp.Anonymous(this="arrayDistinct", expressions=[collected])
    element = exp.Anonymous(this="tupleElement", expressions=[exp.to_identifier("p"), exp.Literal.number(1)])
    ordered = exp.Anonymous(this="arraySort", expressions=[
        exp.Lambda(this=exp.Anonymous(this="tupleElement", expressions=[exp.to_identifier("p"), exp.Literal.number(2)]),
                   expressions=[exp.to_identifier("p")]), collected])
    values = exp.Anonymous(this="arrayMap", expressions=[
        exp.Lambda(this=element, expressions=[exp.to_identifier("p")]), ordered])
    joined = exp.Anonymous(this="arrayStringConcat", expressions=[values, separator.copy()])
    # string_agg over no row is NULL, arrayStringConcat of [] is ''
    return exp.Anonymous(this="nullIf", expressions=[joined, exp.Literal.string("")])


def _ch_array_agg_by_keys(node: exp.ArrayAgg, value: exp.Expression, keys: list) -> exp.Expression:
    """array_agg(x ORDER BY k, ...): the values (NULLs kept, as DuckDB) in the keys' order. ClickHouse's
    aggregates take no ORDER BY: the pairs are collected as tuples (a tuple with a NULL is kept) and sorted."""
    sort_keys = [exp.Neg(this=exp.Paren(this=k.this.copy())) if k.args.get("desc") else k.this.copy() for k in keys]
    pair = exp.Tuple(expressions=[value.copy(), exp.Tuple(expressions=sort_keys)])
    p = exp.to_identifier("p")
    ordered = exp.Anonymous(this="arraySort", expressions=[
        exp.Lambda(this=exp.Anonymous(this="tupleElement", expressions=[p.copy(), exp.Literal.number(2)]),
                   expressions=[p.copy()]), exp.Anonymous(this="groupArray", expressions=[pair])])
    return exp.Anonymous(this="arrayMap", expressions=[
        exp.Lambda(this=exp.Anonymous(this="tupleElement", expressions=[p.copy(), exp.Literal.number(1)]),
                   expressions=[p.copy()]), ordered])


def _ch_window(node: exp.Window):
    """row_number(), rank(), dense_rank() and count(...) OVER (...) are BIGINT in DuckDB but UInt64 in ClickHouse,
    whose UNION with a BIGINT column is a Variant no join can use (SL010's events): signed, as DuckDB's."""
    if isinstance(node.this, (exp.RowNumber, exp.Rank, exp.DenseRank, exp.Count)):
        return exp.Anonymous(this="toInt64", expressions=[node.copy()])
    return None


def _ch_filter(node: exp.Filter):
    if isinstance(node.this, exp.GroupConcat):
        return _ch_string_agg(node.this, node.expression.this)
    if isinstance(node.this, exp.ArrayAgg):
        return _ch_list(node.this, node.expression.this)
    return None


def _ch_array_agg(node: exp.ArrayAgg):
    """array_agg / list: ordered by other keys than the value itself (a rule's `array_agg(x ORDER BY t)`), or
    [DISTINCT] and ordered by the value (compare's `list`)."""
    if isinstance(node.parent, exp.Filter):
        return None
    return _ch_array_agg_by_keys(node, node.this.this, node.this.expressions) if _ordered_by_other_keys(node) else _ch_list(node)


def _ch_group_concat(node: exp.GroupConcat):
    return None if isinstance(node.parent, exp.Filter) else _ch_string_agg(node)


def _ch_bool_agg(node):
    """bool_or / bool_and: max / min of the booleans (NULLs skipped, NULL over no known value, as DuckDB)."""
    return exp.Anonymous(this="max" if isinstance(node, exp.LogicalOr) else "min", expressions=[node.this.copy()])


def _ch_regexp_full_match(node: exp.RegexpFullMatch):
    """regexp_full_match(s, re): the whole string matches (ClickHouse's match() searches)."""
    return exp.Anonymous(this="match", expressions=[node.this.copy(), _anchored(node.expression)])


def _anchored(pattern: exp.Expression) -> exp.Expression:
    if isinstance(pattern, exp.Literal) and pattern.is_string:
        return exp.Literal.string(f"^(?:{pattern.this})$")
    return exp.Concat(expressions=[exp.Literal.string("^(?:"), pattern.copy(), exp.Literal.string(")$")])


def _ch_split_part(node: exp.SplitPart):
    """split_part(s, sep, n): the n-th piece, 1-based, '' past the last (an array's default), as DuckDB."""
    pieces = exp.Anonymous(this="splitByString", expressions=[node.args["delimiter"].copy(), node.this.copy()])
    return exp.Anonymous(this="arrayElement", expressions=[pieces, node.args["part_index"].copy()])


def _ch_json_extract(node: exp.JSONExtract):
    """json_extract(j, path): the JSON text at the path, NULL where there is none (ClickHouse gives '')."""
    if isinstance(node.parent, exp.JSONExtract):
        return None
    return exp.Anonymous(this="nullIf", expressions=[node.copy(), exp.Literal.string("")])


def _ch_json_extract_string(node: exp.JSONExtractScalar):
    """json_extract_string(j, path): a JSON string unquoted, any other value as its JSON text, NULL for JSON null
    and a missing path (ClickHouse's JSONExtractString gives '' for a number and for a missing key). The document is
    read as text: on attrs read from Parquet (ClickHouse's JSON type) JSONType answers 'Null' for a key that holds a
    number."""
    keys = node.copy()
    keys.set("this", exp.Anonymous(this="toString", expressions=[node.this.copy()]))
    raw = exp.JSONExtract(this=keys.this.copy(), expression=keys.expression.copy())
    kind = exp.Anonymous(this="JSONType", expressions=[keys.this.copy(), *_json_keys(keys.expression)])
    return exp.Case(ifs=[exp.If(this=exp.EQ(this=kind.copy(), expression=exp.Literal.string("String")), true=keys),
                         exp.If(this=exp.EQ(this=kind, expression=exp.Literal.string("Null")), true=exp.Null())],
                    default=exp.Anonymous(this="nullIf", expressions=[raw, exp.Literal.string("")]))


def _json_keys(path: exp.Expression) -> list[exp.Expression]:
    """A JSONPath ($.a.b, $.a[0]) as ClickHouse's JSON function arguments ('a', 'b'; an index 1-based)."""
    if not isinstance(path, exp.JSONPath):
        raise UnsupportedSQL("A JSON path must be a literal like '$.key'", "Write json_extract(attrs, '$.key')")
    keys = []
    for part in path.expressions:
        if isinstance(part, exp.JSONPathRoot):
            continue
        if isinstance(part, exp.JSONPathKey):
            keys.append(exp.Literal.string(part.this))
        elif isinstance(part, exp.JSONPathSubscript) and isinstance(part.this, int):
            keys.append(exp.Literal.number(part.this + 1))
        else:
            raise UnsupportedSQL(f"JSON path {path.sql()} is not a plain key path", "Use $.key or $.key[0]")
    return keys


def _ch_contains(node: exp.Contains):
    """contains(s, part): position() on the text; attrs read from Parquet is ClickHouse's JSON type, which position()
    refuses, and its text keeps every key in double quotes (the rules look for '"key"')."""
    text = exp.Anonymous(this="toString", expressions=[node.this.copy()])
    found = exp.Anonymous(this="position", expressions=[text, node.expression.copy()])
    return exp.GT(this=found, expression=exp.Literal.number(0))


def _ch_try_cast(node: exp.TryCast):
    """TRY_CAST(x AS T): NULL when x does not convert (ClickHouse's CAST raises)."""
    if _timestamp_type(node):
        return None
    target = node.to.copy()
    text = target.sql("clickhouse")
    if text.startswith("Nullable("):
        text = text[len("Nullable("):-1]
    return exp.Anonymous(this="accurateCastOrNull", expressions=[node.this.copy(), exp.Literal.string(text)])


def _thousands(value: exp.Expression) -> exp.Expression:
    """An integer with thousands separators, as printf('%,d', n): digits reversed, a comma after every three,
    read back (ClickHouse's printf has no ',' flag)."""
    digits = exp.Anonymous(this="reverse", expressions=[exp.Anonymous(this="toString", expressions=[
        exp.Abs(this=value.copy())])])
    grouped = exp.Anonymous(this="replaceRegexpAll", expressions=[digits, exp.Literal.string("(\\d{3})"),
                                                                  exp.Literal.string("\\1,")])
    trimmed = exp.Anonymous(this="trimRight", expressions=[grouped, exp.Literal.string(",")])
    sign = exp.If(this=exp.LT(this=value.copy(), expression=exp.Literal.number(0)), true=exp.Literal.string("-"),
                  false=exp.Literal.string(""))
    return exp.Anonymous(this="concat", expressions=[sign, exp.Anonymous(this="reverse", expressions=[trimmed])])


def _ch_printf(node):
    """printf: ClickHouse's has C's conversions; '%,d' (sl_int's thousands separators) is written out."""
    fmt = node.expressions[0] if node.expressions else None
    if isinstance(fmt, exp.Literal) and fmt.is_string and fmt.this == "%,d" and len(node.expressions) == 2:
        return _thousands(node.expressions[1])
    return None


def _ch_round(node: exp.Round):
    """round(x[, d]) half away from zero on the value scaled by 10^d, as DuckDB's (ClickHouse rounds a float's tie
    to even: round(0.03125, 4) is 0.0312 there, 0.0313 in DuckDB)."""
    digits = node.args.get("decimals")
    scale = exp.Pow(this=exp.Literal.number(10), expression=digits.copy()) if digits is not None else None
    scaled = exp.Mul(this=exp.Paren(this=node.this.copy()), expression=scale) if scale else node.this.copy()
    away = exp.Mul(this=exp.Anonymous(this="sign", expressions=[scaled.copy()]), expression=exp.Floor(
        this=exp.Add(this=exp.Abs(this=scaled), expression=exp.Literal.number(0.5))))
    return exp.Div(this=away, expression=scale.copy()) if scale else away


def _ch_concat_ws(node: exp.ConcatWs):
    """concat_ws(sep, a, b, ...): the NULLs left out, as DuckDB (ClickHouse's concatWithSeparator reads them as '')."""
    separator, *parts = node.expressions
    item = exp.to_identifier("sl_part")
    kept = exp.Anonymous(this="arrayFilter", expressions=[
        exp.Lambda(this=exp.Not(this=exp.Is(this=item.copy(), expression=exp.Null())), expressions=[item.copy()]),
        exp.Array(expressions=[p.copy() for p in parts])])
    return exp.Anonymous(this="arrayStringConcat", expressions=[kept, separator.copy()])


def _ch_subquery(node: exp.Subquery):
    """A scalar `(SELECT count(...) FROM ... WHERE <correlated>)` is NULL in ClickHouse when no row matches (the
    correlated subquery becomes an outer join); a count over no row is 0."""
    body = node.this
    if (node.alias or not isinstance(body, exp.Select) or len(body.expressions) != 1 or body.args.get("group")
            or not isinstance(body.expressions[0].unalias(), exp.Count)
            or isinstance(node.parent, (exp.From, exp.Join, exp.In, exp.Exists, exp.CTE, exp.Union))):
        return None
    return exp.Coalesce(this=node.copy(), expressions=[exp.Literal.number(0)])


_CLICKHOUSE = {
    exp.Literal: _ch_big_integer,
    exp.PercentileDisc: _ch_quantile_disc,
    exp.Window: _ch_window,
    exp.ArrayAgg: _ch_array_agg,
    exp.ConcatWs: _ch_concat_ws,
    exp.Subquery: _ch_subquery,
    exp.Round: _ch_round,
    exp.RegexpFullMatch: _ch_regexp_full_match,
    exp.SplitPart: _ch_split_part,
    exp.JSONExtract: _ch_json_extract,
    exp.JSONExtractScalar: _ch_json_extract_string,
    exp.TryCast: _ch_try_cast,
    exp.Contains: _ch_contains,
    exp.LogicalOr: _ch_bool_agg,
    exp.LogicalAnd: _ch_bool_agg,
    exp.Filter: _ch_filter,
    exp.GroupConcat: _ch_group_concat,
    exp.Anonymous: _ch_anonymous,
    exp.WithinGroup: _ch_percentile,
    exp.PercentileCont: _ch_percentile,
    exp.Median: _ch_percentile,
    exp.Bracket: _ch_bracket,
    exp.DateDiff: _ch_date_diff,
    exp.TimestampTrunc: _ch_trunc,
    exp.DateBin: _ch_bucket,
    exp.TimeToUnix: _ch_epoch,
    exp.Cast: _ch_cast,
    exp.RegrSlope: _ch_regr_slope,
}


# ---------------------------------------------------------------------------------------------------------------
# Spark (classic, standalone cluster, Connect)


def _spark_quantile(value: exp.Expression, quantile: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this="percentile", expressions=[value.copy(), quantile.copy()])


def _spark_percentile(node):
    parts = _quantile_parts(node)
    return _spark_quantile(*parts) if parts else None


def _spark_bracket(node: exp.Bracket):
    item = _quantile_list_item(node)
    if item:
        return _spark_quantile(*item)
    if _is_map_lookup(node):
        # labels['k'] raises on an absent key under ANSI mode (Spark 4's default); try_element_at gives NULL.
        return exp.Anonymous(this="try_element_at", expressions=[node.this.copy(), node.expressions[0].copy()])
    return None


def _spark_date_diff(node: exp.DateDiff):
    return exp.Anonymous(this="timestampdiff", expressions=[exp.Var(this=_unit(node).upper()), node.expression.copy(),
                                                            node.this.copy()])


def _micros(ts: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this="unix_micros", expressions=[exp.Cast(this=ts.copy(), to=exp.DataType.build("TIMESTAMP"))])


def _spark_bucket(node: exp.DateBin):
    interval = node.this
    if not isinstance(interval, exp.Interval):
        raise UnsupportedSQL("time_bucket takes an INTERVAL literal", "Write time_bucket(INTERVAL 5 SECOND, t)")
    width_us = float(interval.this.name) * _SECONDS_PER_UNIT[interval.unit.name.lower().rstrip("s")] * 1e6
    floored = exp.Mul(this=exp.Floor(this=exp.Div(this=_micros(node.expression), expression=exp.Literal.number(width_us))),
                      expression=exp.Literal.number(width_us))
    stamp = exp.Anonymous(this="timestamp_micros", expressions=[exp.Cast(this=floored, to=exp.DataType.build("BIGINT"))])
    return exp.Cast(this=stamp, to=exp.DataType.build("TIMESTAMP_NTZ", dialect="spark"))


def _spark_epoch(node: exp.TimeToUnix):
    return exp.Div(this=_micros(node.this), expression=exp.Literal.number("1e6"))


def _spark_div(node: exp.Div):
    # DuckDB's / is a DOUBLE division whatever the operands (1.0 is a DECIMAL in both engines); Spark's keeps a
    # DECIMAL, which prints and rounds differently (and which format_string's %f refuses).
    dividend = exp.Cast(this=node.this, to=exp.DataType.build("DOUBLE"))
    return exp.Anonymous(this="try_divide", expressions=[dividend, node.expression])


def _spark_avg(node: exp.Avg):
    # DuckDB averages a DECIMAL (every 1.0 in `avg(CASE WHEN ... THEN 1.0 ELSE 0.0 END)`) into a DOUBLE; Spark keeps a
    # DECIMAL four places wider, so a share of 0.011712493 came back as 0.01171
    if isinstance(node.this, exp.Cast) and node.this.to.is_type("double"):
        return None
    return exp.Avg(this=exp.Cast(this=node.this.copy(), to=exp.DataType.build("DOUBLE")))


def _spark_add(node: exp.Add | exp.Sub):
    """ts ± to_microseconds(n) -> the timestamp n µs later or earlier (Spark has no µs interval constructor for
    any n)."""
    if not _is_to_microseconds(node.expression):
        return None
    shifted = type(node)(this=_micros(node.this), expression=node.expression.expressions[0].copy())
    stamp = exp.Anonymous(this="timestamp_micros", expressions=[exp.Cast(this=shifted, to=exp.DataType.build("BIGINT"))])
    return exp.Cast(this=stamp, to=exp.DataType.build("TIMESTAMP_NTZ", dialect="spark"))


def _spark_disc_position(value: exp.Expression, quantile: exp.Expression) -> exp.Expression:
    """DuckDB's quantile_disc position (1-based): max(1, ceil(n·q)) in exact decimal arithmetic."""
    numerator, denominator = _decimal_fraction(quantile)
    n = exp.Cast(this=exp.Count(this=value.copy()), to=exp.DataType.build("DECIMAL(38, 0)"))
    ceiling = exp.IntDiv(this=exp.Paren(this=exp.Add(this=exp.Mul(this=n, expression=exp.Literal.number(numerator)),
                                                     expression=exp.Literal.number(denominator - 1))),
                         expression=exp.Literal.number(denominator))
    return exp.Cast(this=exp.Greatest(this=exp.Literal.number(1), expressions=[ceiling]),
                    to=exp.DataType.build("INT"))


def _spark_quantile_disc(node: exp.PercentileDisc):
    """quantile_disc(x, q) / quantile_disc(x, [q1, ...]): the sorted non-NULL values at DuckDB's positions (Spark's
    percentile_disc reads the level as a double); NULL over no value, as DuckDB."""
    value, quantile = node.this, node.expression
    if quantile is None:
        return None
    ordered = exp.Anonymous(this="array_sort", expressions=[exp.Anonymous(this="collect_list", expressions=[value.copy()])])

    def at(q):
        return exp.Anonymous(this="element_at", expressions=[ordered.copy(), _spark_disc_position(value, q)])

    picked = (exp.Array(expressions=[at(q) for q in quantile.expressions]) if isinstance(quantile, exp.Array)
              else at(quantile))
    empty = exp.EQ(this=exp.Count(this=value.copy()), expression=exp.Literal.number(0))
    return exp.If(this=empty, true=exp.Null(), false=picked)


def _spark_list(node: exp.ArrayAgg, condition: exp.Expression | None = None):
    """list([DISTINCT] x [ORDER BY x]) [FILTER (WHERE c)]: collect_list skips NULLs and list() keeps them, so the
    values are collected in a struct (never NULL) and unwrapped; over no row Spark gives [] (DuckDB: NULL)."""
    value, keys, distinct = _list_parts(node, "Spark")
    collected = exp.Anonymous(this="collect_list", expressions=[
        exp.Anonymous(this="named_struct", expressions=[exp.Literal.string("v"), value.copy()])])
    if condition is not None:
        collected = exp.Filter(this=collected, expression=exp.Where(this=condition.copy()))
    out = exp.Anonymous(this="transform", expressions=[
        collected, exp.Lambda(this=exp.Dot(this=exp.to_identifier("e"), expression=exp.to_identifier("v")),
                              expressions=[exp.to_identifier("e")])])
    if distinct:
        out = exp.Anonymous(this="array_distinct", expressions=[out])
    if keys:
        out = exp.Anonymous(this="array_sort", expressions=[out])   # NULLs last, as DuckDB's default
    return out


def _spark_filter(node: exp.Filter):
    if isinstance(node.this, exp.ArrayAgg):
        return _spark_list(node.this, node.expression.this)
    if isinstance(node.this, exp.GroupConcat):
        return _spark_distinct_string_agg(node.this, node.expression.this)
    return None


def _spark_distinct_string_agg(node: exp.GroupConcat, condition: exp.Expression | None = None):
    """string_agg(DISTINCT x, sep [ORDER BY x]) [FILTER (WHERE c)]: Spark 4's analyzer fails on two LISTAGG(DISTINCT
    ...) WITHIN GROUP of different values in one query, and on one with a FILTER (ClassCastException:
    AttributeReference cannot be cast to SortOrder; rule SL006). The distinct values are collected, sorted and
    joined instead; NULLs are skipped as string_agg skips them, and no value is NULL, as DuckDB's."""
    inner = node.this
    order = inner if isinstance(inner, exp.Order) else None
    distinct = order.this if order is not None else inner
    if not isinstance(distinct, exp.Distinct) or len(distinct.expressions) != 1:
        return None
    value = distinct.expressions[0]
    keys = order.expressions if order is not None else []
    if any(k.this != value for k in keys) or len({bool(k.args.get("desc")) for k in keys}) > 1:
        return None   # ordered by something else: left to Spark as written
    items = exp.Anonymous(this="collect_list", expressions=[value.copy()])
    if condition is not None:
        items = exp.Filter(this=items, expression=exp.Where(this=condition.copy()))
    ordered = exp.Anonymous(this="array_sort", expressions=[exp.Anonymous(this="array_distinct", expressions=[items])])
    if keys and keys[0].args.get("desc"):
        ordered = exp.Anonymous(this="reverse", expressions=[ordered])
    separator = node.args.get("separator") or exp.Literal.string(",")
    empty = exp.EQ(this=exp.Anonymous(this="size", expressions=[ordered.copy()]), expression=exp.Literal.number(0))
    return exp.Case(ifs=[exp.If(this=empty, true=exp.Null())],
                    default=exp.Anonymous(this="array_join", expressions=[ordered, separator.copy()]))


def _spark_group_concat(node: exp.GroupConcat):
    if isinstance(node.parent, exp.Filter):
        return None   # rewritten with its filter (_spark_filter)
    return _spark_distinct_string_agg(node)


def _spark_array_agg_by_keys(node: exp.ArrayAgg):
    """array_agg(x ORDER BY k): Spark's collect_list has no order (and drops NULLs): the (k, x) structs are sorted
    and their x taken, a NULL x kept as DuckDB keeps it."""
    inner = node.this
    if not isinstance(inner, exp.Order):
        return None
    keys = inner.expressions
    if any(k.args.get("desc") for k in keys):
        raise UnsupportedSQL("array_agg(... ORDER BY k DESC) is not mapped for Spark", "Order ascending")
    fields = [exp.PropertyEQ(this=exp.to_identifier(f"k{i}"), expression=k.this.copy()) for i, k in enumerate(keys)]
    fields.append(exp.PropertyEQ(this=exp.to_identifier("v"), expression=inner.this.copy()))
    collected = exp.Anonymous(this="collect_list", expressions=[exp.Struct(expressions=fields)])
    sorted_ = exp.Anonymous(this="array_sort", expressions=[collected])
    take = exp.Lambda(this=exp.Dot(this=exp.to_identifier("sl_s"), expression=exp.to_identifier("v")),
                      expressions=[exp.to_identifier("sl_s")])
    return exp.Anonymous(this="transform", expressions=[sorted_, take])


def _spark_array_agg(node: exp.ArrayAgg):
    """array_agg ordered by other keys than the value (a rule's), or list([DISTINCT] x [ORDER BY x]) (compare's)."""
    if isinstance(node.parent, exp.Filter):
        return None
    return _spark_array_agg_by_keys(node) if _ordered_by_other_keys(node) else _spark_list(node)


# printf: Spark's format_string is Java's Formatter. It prints NULL as 'null' (DuckDB's printf gives NULL), refuses a
# DECIMAL for %f, rounds %.Nf half-up on the shortest decimal form (0.125 -> '0.13', 0.35 -> '0.4'; DuckDB and
# Python round the exact binary value, half to even: '0.12', '0.3'), and its %g keeps trailing zeros ('30.0000'
# for C's '30'). So a %f value is rounded exactly first, and %g's zeros are stripped as C strips them.
_CONVERSION = re.compile(r"%([-#+ 0,(]*)(\d*)(?:\.(\d+))?([a-zA-Z%])")
_SPLITTER = 134217729.0  # 2^27 + 1: Veltkamp's split of a double into two 26-bit halves


def _let(name: str, value: str, body: str) -> str:
    """`body` with `name` bound to `value`, which is computed once: a lambda over a one-element array."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


def _split_sql(value: str) -> tuple[str, str]:
    high = f"({_SPLITTER}D * {value} - ({_SPLITTER}D * {value} - {value}))"
    return high, f"({value} - {high})"


def _exact_round_sql(x: str, scale: str) -> str:
    """SQL rounding the DOUBLE `x` (>= 0, finite) to the decimals of `scale` (10^digits, a DOUBLE: exact up to 22
    digits) as DuckDB's printf does: the exact binary value, half to even on an exact tie. x * scale is computed
    with its rounding error (Dekker's product: p + e is x * scale exactly), so a tie is a tie of the exact value,
    not of the rounded product. Written out, not bound by lambdas: Spark's optimizer inlines nested lambdas."""
    p = f"({x} * {scale})"
    xh, xl = _split_sql(x)
    sh, sl = _split_sql(scale)
    e = f"(((({xh} * {sh} - {p}) + {xh} * {sl}) + {xl} * {sh}) + {xl} * {sl})"
    n = f"CAST(floor({p}) AS DOUBLE)"
    d = f"(({p} - {n}) - 0.5D)"
    up = f"({d} > 0 OR ({d} = 0 AND ({e} > 0 OR ({e} = 0 AND {n} % 2 = 1))))"
    return f"CASE WHEN {p} >= 4.0e15D THEN {x} ELSE ({n} + CASE WHEN {up} THEN 1.0D ELSE 0.0D END) / {scale} END"


def _fixed_sql(x: str, digits: int) -> str:
    """%.Nf of the DOUBLE `x`, rounded as DuckDB rounds it (the rounded value then prints exactly in Java)."""
    rounded = _exact_round_sql(f"abs({x})", f"{float(10 ** digits)!r}D")
    return f"CASE WHEN isnan({x}) OR abs({x}) = double('infinity') THEN {x} ELSE sign({x}) * {rounded} END"


def _general_sql(x: str, precision: int) -> str:
    """C's %.Pg of the DOUBLE `x`: Java's %g has C's choice of notation and digits but keeps the trailing zeros
    (C strips them) and spells nan and inf its own way. Its rounding is Java's (half-up on the shortest decimal):
    exact rounding as for %f made the expression too large for Spark to compile in reasonable time."""
    text = f"format_string('%.{max(precision, 1)}g', {x})"
    stripped = f"regexp_replace(regexp_replace({text}, '([.][0-9]*?)0+(e|$)', '$1$2'), '[.](e|$)', '$1')"
    return (f"CASE WHEN isnan({x}) THEN 'nan' WHEN {x} = double('infinity') THEN 'inf' "
            f"WHEN {x} = double('-infinity') THEN '-inf' ELSE {stripped} END")


def _bound_once(value: exp.Expression, body_sql: str) -> exp.Expression:
    """`body_sql` (over the variable sl_x) applied to `value` as a DOUBLE, `value` written once."""
    template = sqlglot.parse_one(_let("sl_x", "CAST(sl_value AS DOUBLE)", body_sql), read="spark")
    for column in template.find_all(exp.Column):
        if column.name == "sl_value":
            column.replace(value.copy())
            break
    return template


def _spark_printf(node: exp.Anonymous) -> exp.Expression:
    fmt, args = node.expressions[0], node.expressions[1:]
    if not (isinstance(fmt, exp.Literal) and fmt.is_string):
        raise UnsupportedSQL("printf takes a literal format on Spark", "Write the format as a string literal")
    pieces, values, position = [], [], 0
    for match in _CONVERSION.finditer(fmt.this):
        flags, width, precision, kind = match.groups()
        if kind == "%":
            continue
        if position >= len(args):
            raise UnsupportedSQL(f"printf format {fmt.this!r} has more conversions than arguments", "Pass one per %")
        arg = args[position]
        position += 1
        if kind == "d":
            values.append(exp.Cast(this=arg.copy(), to=exp.DataType.build("BIGINT")))
        elif kind == "s":
            values.append(arg.copy())
        elif kind == "f" and not width and flags in ("", ","):
            values.append(_bound_once(arg, _fixed_sql("sl_x", int(precision or 6))))
        elif kind == "g" and not flags and not width:
            # C's %g is no Java conversion: the text is made in SQL and printed with %s
            values.append(_bound_once(arg, _general_sql("sl_x", 6 if precision is None else int(precision))))
            pieces.append((match.start(), match.end(), "%s"))
            continue
        else:
            raise UnsupportedSQL(f"printf conversion {match.group(0)!r} is not mapped for Spark",
                                 "Use %d, %,d, %s, %.Nf or %.Ng")
    text = fmt.this
    for start, end, replacement in reversed(pieces):
        text = text[:start] + replacement + text[end:]
    call = exp.Anonymous(this="format_string", expressions=[exp.Literal.string(text), *values])
    if not args:
        return call
    # DuckDB's printf is NULL when an argument is; Java prints 'null'
    unknown = exp.or_(*[exp.Is(this=a.copy(), expression=exp.Null()) for a in args])
    return exp.Case(ifs=[exp.If(this=unknown, true=exp.Null())], default=call)


def _spark_regexp_full_match(node: exp.RegexpFullMatch):
    """regexp_full_match(s, p): the whole string matches (RE2's FullMatch); Java's \\z is the very end."""
    pattern = node.expression
    anchored = (exp.Literal.string(f"^(?:{pattern.this})\\z") if isinstance(pattern, exp.Literal) else
                exp.Concat(expressions=[exp.Literal.string("^(?:"), pattern.copy(), exp.Literal.string(")\\z")]))
    return exp.RegexpLike(this=node.this.copy(), expression=anchored)


def _spark_cast(node: exp.Cast):
    if node.to.this == exp.DataType.Type.INT128:   # Spark's widest exact integer: DECIMAL(38, 0), 126 bits
        return exp.Cast(this=node.this.copy(), to=exp.DataType.build("DECIMAL(38, 0)"))
    return None


def _spark_anonymous(node: exp.Anonymous):
    name = str(node.this).lower()
    if name == "printf":
        return _spark_printf(node)
    if name == "epoch_us":
        return _micros(node.expressions[0])
    if name == "isfinite":   # NULL stays NULL, as DuckDB's isfinite
        x = node.expressions[0]
        infinite = exp.EQ(this=exp.Abs(this=x.copy()),
                          expression=exp.Cast(this=exp.Literal.string("Infinity"), to=exp.DataType.build("DOUBLE")))
        return exp.Not(this=exp.Paren(this=exp.Or(this=exp.Anonymous(this="isnan", expressions=[x.copy()]),
                                                  expression=infinite)))
    return None


_SPARK = {
    exp.PercentileDisc: _spark_quantile_disc,
    exp.Filter: _spark_filter,
    exp.ArrayAgg: _spark_array_agg,
    exp.GroupConcat: _spark_group_concat,
    exp.Cast: _spark_cast,
    exp.Anonymous: _spark_anonymous,
    exp.RegexpFullMatch: _spark_regexp_full_match,
    exp.Add: _spark_add,
    exp.Sub: _spark_add,
    exp.WithinGroup: _spark_percentile,
    exp.PercentileCont: _spark_percentile,
    exp.Median: _spark_percentile,
    exp.Bracket: _spark_bracket,
    exp.DateDiff: _spark_date_diff,
    exp.DateBin: _spark_bucket,
    exp.TimeToUnix: _spark_epoch,
    exp.Div: _spark_div,
    exp.Avg: _spark_avg,
}

# What the map rewrites, for `servlens engines check` (the names a rule writes, DuckDB's spelling).
MAPPED_FUNCTIONS = ("quantile_cont", "quantile_disc", "percentile_cont", "median", "list", "date_diff", "date_trunc",
                    "time_bucket", "epoch", "epoch_us", "isfinite", "regr_slope", "map subscript", "division", "avg",
                    "GROUP BY ALL", "ORDER BY ALL")
