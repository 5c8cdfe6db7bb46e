"""The SQL a rule holds, made runnable: vocabulary macros expanded and `$param`s written as SQL literals.

Both steps work on sqlglot's DuckDB tokens, not on text patterns, so a macro name or a `$` inside a string or a
comment is left alone, and the user's SQL is kept as written around them: an expansion is one line, so an error
position DuckDB reports (its `LINE n`) is the line in the rule's SQL. The expanded SQL is standard SQL the
sqlglot transpiler carries to Spark, Trino and ClickHouse (tests/analysis/test_portable_sql.py).

Macros (function-call syntax; `alias` is an optional table alias that qualifies the columns):

    sl_failed([alias])          a request that got no answer                 (failures.failed)
    sl_answered([alias])        a request that got an answer                 (failures.answered)
    sl_timeout([alias])         a failure that ran out of time               (vocabulary.timeout)
    sl_status_known([alias])    the outcome is known at all                  (vocabulary.status_known)
    sl_wait_s([alias])          the wait before the engine worked on it, s   (vocabulary.wait_s)
    sl_error_class([alias])     the class of a failure, NULL when it did not fail (failures.error_class)
    sl_prompt_band(expr)        the log2 band of a prompt length             (vocabulary.length_band)
    sl_output_band(expr)        the log2 band of an output length            (vocabulary.length_band)
    sl_glob_any(expr, $list)    expr matches any glob pattern of a list parameter, case-insensitively
    sl_pct(expr, digits)        a share as percent text: sl_pct(0.1234, 1) = '12.3%' (NULL stays NULL)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from servlens.analysis import failures, vocabulary
from servlens.errors import ConfigError

_ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PARAM_RE = re.compile(r"\$([a-z][a-z0-9_]*)")


def sql_literal(value: Any) -> str:
    """A value as a SQL literal: numbers, booleans, NULL, quoted text, and lists as [..] list literals."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"


@dataclass(frozen=True)
class SqlPosition:
    line: int    # 1-based, in the SQL text
    column: int  # 1-based


def position(sql: str, offset: int) -> SqlPosition:
    line = sql.count("\n", 0, offset) + 1
    return SqlPosition(line, offset - (sql.rfind("\n", 0, offset) + 1) + 1)


class SqlMacroError(ConfigError):
    """A macro called with the wrong arguments, or a parameter that does not exist; carries the position."""

    def __init__(self, message: str, where: SqlPosition):
        super().__init__(message, "See docs/rules-contract.md for the macros and their arguments")
        self.where = where


def _alias_arg(name: str, args: list[str], pos: SqlPosition) -> str:
    if not args:
        return ""
    if len(args) == 1 and _ALIAS_RE.match(args[0].strip()):
        return args[0].strip()
    raise SqlMacroError(f"{name}() takes no argument or one table alias, not ({', '.join(args)})", pos)


def _one_arg(name: str, args: list[str], pos: SqlPosition) -> str:
    if len(args) != 1 or not args[0].strip():
        raise SqlMacroError(f"{name}(expr) takes one expression, got {len(args)} argument(s)", pos)
    return args[0].strip()


def _glob_to_like(pattern: str) -> str:
    """An fnmatch pattern (* and ?) as a LIKE pattern with '!' as the escape character."""
    out = []
    for ch in pattern:
        out.append({"*": "%", "?": "_", "%": "!%", "_": "!_", "!": "!!"}.get(ch, ch))
    return "".join(out)


def _glob_any(name: str, args: list[str], pos: SqlPosition, params: dict[str, Any]) -> str:
    if len(args) != 2:
        raise SqlMacroError(f"{name}(expr, $list) takes an expression and a list parameter", pos)
    expr, ref = args[0].strip(), args[1].strip()
    found = PARAM_RE.fullmatch(ref)
    if not found or found.group(1) not in params or not isinstance(params[found.group(1)], list):
        raise SqlMacroError(f"{name}(): the second argument must be a list parameter ($name), not {ref}", pos)
    patterns = params[found.group(1)]
    if not patterns:
        return "FALSE"
    # ESCAPE only where a pattern has a literal % or _ (ClickHouse's LIKE has no ESCAPE clause).
    likes = [f"lower({expr}) LIKE {sql_literal(_glob_to_like(p.lower()))}"
             + (" ESCAPE '!'" if any(c in p for c in "%_!") else "") for p in patterns]
    return "(" + " OR ".join(likes) + ")"


def _pct(name: str, args: list[str], pos: SqlPosition) -> str:
    if len(args) != 2 or not args[1].strip().isdigit() or int(args[1]) > 6:
        raise SqlMacroError(f"{name}(expr, digits) takes an expression and a digit count 0-6", pos)
    expr, digits = args[0].strip(), int(args[1])
    # printf rounds like Python's format (the templates' {x:.1%}), half to even on an exact tie: 42.5 -> '42'.
    return f"printf('%.{digits}f', 100.0 * ({expr})) || '%'"


def _with_alias(build: Callable[[str], str]) -> Callable:
    return lambda name, args, pos, params: build(_alias_arg(name, args, pos))


def _with_expr(build: Callable[[str], str]) -> Callable:
    return lambda name, args, pos, params: build(_one_arg(name, args, pos))


MACROS: dict[str, Callable[[str, list[str], SqlPosition, dict], str]] = {
    "sl_failed": _with_alias(failures.failed),
    "sl_answered": _with_alias(failures.answered),
    "sl_timeout": _with_alias(vocabulary.timeout),
    "sl_status_known": _with_alias(vocabulary.status_known),
    "sl_wait_s": _with_alias(vocabulary.wait_s),
    "sl_error_class": _with_alias(failures.error_class),
    "sl_prompt_band": _with_expr(vocabulary.length_band),
    "sl_output_band": _with_expr(vocabulary.length_band),
    "sl_glob_any": _glob_any,
    "sl_pct": lambda name, args, pos, params: _pct(name, args, pos),
}


def _tokens(sql: str):
    try:
        return DuckDB().tokenize(sql)
    except TokenError as exc:
        raise SqlMacroError(f"the SQL cannot be read: {exc}", SqlPosition(1, 1)) from exc


def expand_macros(sql: str, params: dict[str, Any]) -> str:
    """`sql` with every vocabulary macro call replaced by its expression (arguments expanded first)."""
    tokens = _tokens(sql)
    out, cursor, i = [], 0, 0
    while i < len(tokens):
        tok = tokens[i]
        name = tok.text.lower()
        if (name in MACROS and tok.token_type == TokenType.VAR and i + 1 < len(tokens)
                and tokens[i + 1].token_type == TokenType.L_PAREN):
            depth, j, arg_start, args = 0, i + 1, tokens[i + 1].end + 1, []
            while j < len(tokens):
                kind = tokens[j].token_type
                if kind == TokenType.L_PAREN:
                    depth += 1
                elif kind == TokenType.R_PAREN:
                    depth -= 1
                    if depth == 0:
                        args.append(sql[arg_start:tokens[j].start])
                        break
                elif kind == TokenType.COMMA and depth == 1:
                    args.append(sql[arg_start:tokens[j].start])
                    arg_start = tokens[j].end + 1
                j += 1
            else:
                raise SqlMacroError(f"{tok.text}( is never closed", position(sql, tok.start))
            args = [a for a in args if a.strip()] if len(args) == 1 else args
            args = [expand_macros(a, params) for a in args]
            out.append(sql[cursor:tok.start])
            out.append("(" + MACROS[name](name, args, position(sql, tok.start), params) + ")")
            cursor = tokens[j].end + 1
            i = j + 1
            continue
        i += 1
    out.append(sql[cursor:])
    return "".join(out)


def substitute_params(sql: str, params: dict[str, Any]) -> str:
    """`sql` with every `$name` written as the parameter's SQL literal, so the SQL runs on any engine."""
    tokens = _tokens(sql)
    out, cursor = [], 0
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.PARAMETER and tok.text == "$" and i + 1 < len(tokens):
            nxt = tokens[i + 1]
            if nxt.start != tok.end + 1:
                continue
            if nxt.text not in params:
                raise SqlMacroError(f"${nxt.text} is not a parameter of this rule", position(sql, tok.start))
            out.append(sql[cursor:tok.start])
            out.append(sql_literal(params[nxt.text]))
            cursor = nxt.end + 1
    out.append(sql[cursor:])
    return "".join(out)


def prepare(sql: str, params: dict[str, Any]) -> str:
    """Macros expanded, then parameters substituted: the SQL servlens runs."""
    return substitute_params(expand_macros(sql, params), params)


def used_params(sql: str) -> set[str]:
    """The `$name`s the SQL uses (outside strings and comments)."""
    tokens = _tokens(sql)
    return {tokens[i + 1].text for i, tok in enumerate(tokens[:-1])
            if tok.token_type == TokenType.PARAMETER and tok.text == "$" and tokens[i + 1].start == tok.end + 1}
