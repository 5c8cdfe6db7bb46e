"""Times that do not read, and epochs in another unit: counted, never silently NULL (issue 15, class 9).

A profile maps a time column with an expression such as `sl_epoch_s(j->>'$.send_ts')`,
`TRY_CAST(startTime AS TIMESTAMPTZ) AT TIME ZONE 'UTC'` or `CAST("TIMESTAMP" AS TIMESTAMP)`; a value those cannot
read (`"yesterday"`, `2023-13-45`, an epoch beyond any timestamp) comes out NULL. To tell such a value from a field
that is simply absent, the compiler evaluates a twin of the expression beside it in which every time conversion is
replaced by a presence test (`sl_time_present(x)`: a fixed timestamp when x holds a value, else NULL). The time is
*unparsed* when the expression is NULL and its twin is not: the row is kept (with its file and line), the column is
NULL, the row's `attrs.unparsed_times` names it and the ingest summary counts it per column.

`sl_epoch_s` and `sl_epoch_ms` read an epoch in a larger unit by its magnitude (the ranges of seconds,
milliseconds, microseconds and nanoseconds between 2000 and 2100 lie a factor of 1000 apart); a second twin says
when that happened, and the row's `attrs.converted_times` names the column, counted in the summary too.
"""

from __future__ import annotations

import re

TIME_COLUMNS = ("t_arrival", "t_first_token", "t_end")
# Macros: an epoch in microseconds (NULL beyond the timestamp range instead of an overflow error), the unit of an
# epoch read by magnitude, and the presence tests.
TIME_MACROS = {
    "sl_epoch_us": (["us"], ("CASE WHEN isfinite(us) AND abs(us) < 9.2e18 "
                             "THEN make_timestamp(CAST(round(us) AS BIGINT)) END")),
    # A seconds field: >= 1e17 nanoseconds, >= 1e14 microseconds, >= 1e11 milliseconds (1e11 s is the year 5138).
    "sl_epoch_s_to_us": (["v"], ("CASE WHEN abs(v) >= 1e17 THEN v / 1e3 WHEN abs(v) >= 1e14 THEN v "
                                 "WHEN abs(v) >= 1e11 THEN v * 1e3 ELSE v * 1e6 END")),
    "sl_epoch_ms_to_us": (["v"], "CASE WHEN abs(v) >= 1e17 THEN v / 1e3 WHEN abs(v) >= 1e14 THEN v ELSE v * 1e3 END"),
    "sl_time_present": (["x"], "CASE WHEN trim(CAST(x AS VARCHAR)) <> '' THEN TIMESTAMP '2000-01-01' END"),
    "sl_time_scaled_s": (["x"], "CASE WHEN abs(TRY_CAST(x AS DOUBLE)) >= 1e11 THEN TIMESTAMP '2000-01-01' END"),
    "sl_time_scaled_ms": (["x"], "CASE WHEN abs(TRY_CAST(x AS DOUBLE)) >= 1e14 THEN TIMESTAMP '2000-01-01' END"),
}
EPOCH_MACROS = {
    "sl_epoch_s": (["x"], "sl_epoch_us(sl_epoch_s_to_us(TRY_CAST(x AS DOUBLE)))"),
    "sl_epoch_ms": (["x"], "sl_epoch_us(sl_epoch_ms_to_us(TRY_CAST(x AS DOUBLE)))"),
}

# Calls that turn a value into a time: (name, which argument holds the value).
_CONVERSIONS = {"sl_epoch_s": 0, "sl_epoch_ms": 0, "sl_epoch_ns": 0, "strptime": 0, "try_strptime": 0,
                "to_timestamp": 0, "epoch_ms": 0, "make_timestamp": 0}
_CASTS = {"cast", "try_cast"}
_TIME_TYPE = re.compile(r"(?is)\s+AS\s+TIMESTAMP(?:TZ|_NS|_MS|_S|\s+WITH\s+TIME\s+ZONE)?\s*$")
_CALL = re.compile(r"(?i)\b([a-z_][a-z0-9_]*)\s*\(")
_TIME_BODY = re.compile(r"(?i)\b(?:try_)?cast\s*\(|\bsl_epoch_|\bstrptime\s*\(|\bto_timestamp\s*\(|::\s*timestamp")


def _skip_quoted(text: str, i: int) -> int:
    quote = text[i]
    i += 1
    while i < len(text):
        if text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return i


def _closing(text: str, start: int) -> int:
    """The index of the parenthesis closing the one at `start` (quotes respected), or -1."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_quoted(text, i)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _split_arguments(text: str) -> list[str]:
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_quoted(text, i)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def rewrite_conversions(expr: str, replace) -> str:
    """`expr` with every time conversion call replaced by `replace(name, value_expr)` (a SQL text, or None to keep
    the call as it is), innermost conversions first; text inside quotes is never touched."""
    out, i = [], 0
    while i < len(expr):
        ch = expr[i]
        if ch in "'\"":
            end = _skip_quoted(expr, i)
            out.append(expr[i:end])
            i = end
            continue
        match = _CALL.match(expr, i) if (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_.")) else None
        if match:
            name = match.group(1).lower()
            open_at = match.end() - 1
            close_at = _closing(expr, open_at)
            if close_at > 0:
                inner = expr[open_at + 1:close_at]
                value = None
                if name in _CASTS and _TIME_TYPE.search(inner):
                    value = _TIME_TYPE.sub("", inner)
                elif name in _CONVERSIONS:
                    arguments = _split_arguments(inner)
                    value = arguments[_CONVERSIONS[name]] if len(arguments) > _CONVERSIONS[name] else None
                if value is not None:
                    replaced = replace(name, rewrite_conversions(value, replace))
                    if replaced is not None:
                        out.append(replaced)
                        i = close_at + 1
                        continue
                out.append(expr[i:open_at + 1] + rewrite_conversions(inner, replace) + ")")
                i = close_at + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def time_macros_of(macros: dict[str, tuple[list[str], str]]) -> set[str]:
    """The profile's own macros that convert a value to a time (litellm_ts, hc_utc ...)."""
    return {name for name, (_, body) in macros.items() if _TIME_BODY.search(body)}


def _with_macro_twins(expr: str, time_macros: set[str], suffix: str) -> str:
    """Calls of the profile's time macros point at their twins (`name` + suffix)."""
    if not time_macros:
        return expr
    names = "|".join(re.escape(m) for m in sorted(time_macros, key=len, reverse=True))
    return re.sub(rf"(?i)(?<![A-Za-z0-9_.])({names})(\s*\()", rf"\1{suffix}\2", expr)


def present_twin(expr: str, time_macros: set[str]) -> str:
    """The expression with every conversion replaced by a presence test: not NULL when its values are there."""
    return rewrite_conversions(_with_macro_twins(expr, time_macros, "__present"),
                               lambda name, value: f"sl_time_present({value})")


def scaled_twin(expr: str) -> str | None:
    """Not NULL when an sl_epoch_s / sl_epoch_ms of the expression read its value in a larger unit; None when the
    expression has no such call."""
    if not re.search(r"(?i)\bsl_epoch_(?:s|ms)\s*\(", expr):
        return None
    return rewrite_conversions(expr, lambda name, value: (
        f"sl_time_scaled_s({value})" if name == "sl_epoch_s" else f"sl_time_scaled_ms({value})"
        if name == "sl_epoch_ms" else "CAST(NULL AS TIMESTAMP)"))


def macro_twins(macros: dict[str, tuple[list[str], str]], time_macros: set[str]) -> dict[str, tuple[list[str], str]]:
    """For each time macro m(p, ...), m__present(p, ...): its body with the conversions replaced by presence tests."""
    return {f"{name}__present": (params, present_twin(body, time_macros - {name}))
            for name, (params, body) in macros.items() if name in time_macros}
