"""The words the rules share, as SQL over the canonical `requests` columns: each is defined here once.

Rules, workload and compare read these; rule SQL reaches them as macros (`sl_failed()`, `sl_wait_s()`, ...,
servlens/analysis/rule_sql.py) that expand to exactly these expressions. Each function takes an optional table
alias that qualifies its columns (`failed("r")` reads r.status, r.http_status, ...).

Every expression is NULL-honest: a column the source lacks is NULL, and an expression over it is NULL (unknown) or
false, never a filled-in 0. DuckDB's `greatest()` / `least()` skip NULL arguments, so they are only applied to a
value already known to be non-NULL.
"""

from __future__ import annotations

from servlens.analysis.failures import ERROR_CLASSES, error_class, failed


def _a(alias: str) -> str:
    return f"{alias}." if alias else ""


def wait_s(alias: str = "") -> str:
    """The wait of one request before the engine worked on it: the engine's queue time, else TTFT minus prefill
    time; clipped to [0, TTFT] because the two clocks differ (client TTFT, engine queue) and a wait longer than the
    TTFT it is part of is clock skew. NULL when neither queue_s nor prefill_s (with ttft_s) is known."""
    a = _a(alias)
    raw = f"coalesce({a}queue_s, {a}ttft_s - {a}prefill_s)"
    return (f"(CASE WHEN {raw} IS NULL THEN NULL "
            f"WHEN {a}ttft_s IS NULL THEN greatest({raw}, 0) "
            f"ELSE least(greatest({raw}, 0), {a}ttft_s) END)")


# Failed requests and their classes live in servlens/analysis/failures.py; a timeout is a failure of the timeout
# class there (HTTP 408/504/524, LiteLLM `Timeout`, finish_reason timeout), read the same way by every rule.
TIMEOUT_STATUSES = next(c[1] for c in ERROR_CLASSES if c[0] == "timeout")
_TIMEOUT_WORDS = next(c[2] for c in ERROR_CLASSES if c[0] == "timeout")


def status_known(alias: str = "") -> str:
    """The request's outcome is known at all (a status, an HTTP status or a finish reason)."""
    a = _a(alias)
    return f"({a}status IS NOT NULL OR {a}http_status IS NOT NULL OR {a}finish_reason IS NOT NULL)"


def timeout(alias: str = "") -> str:
    """A failure whose class, type or status says it ran out of time (NULL-safe)."""
    a = _a(alias)
    text = f"lower(coalesce({a}error_type, '') || ' ' || coalesce({a}error_message, ''))"
    return ("coalesce({a}finish_reason = 'timeout' OR {a}http_status IN ({statuses}) OR "
            "(({failed}) AND ({words})), false)").format(
        a=a, statuses=", ".join(map(str, TIMEOUT_STATUSES)), failed=failed(alias),
        words=" OR ".join(f"{text} LIKE '%{w}%'" for w in _TIMEOUT_WORDS))


def length_band(expr: str) -> str:
    """The log2 band of a token count, one definition for workload, rules and compare: band b holds
    [2^b, 2^(b+1)) tokens, 0 tokens is band -1, an unknown count is NULL (servlens.analysis.vocabulary.band_label
    names a band)."""
    return (f"(CASE WHEN ({expr}) IS NULL THEN NULL WHEN ({expr}) < 1 THEN -1 "
            f"ELSE CAST(floor(log2({expr})) AS INTEGER) END)")


def band_label(band: int | None, noun: str) -> str:
    """A band's words: '16–31 prompt tokens', '0 output tokens', 'unknown prompt length'."""
    if band is None:
        return f"unknown {noun} length"
    if band == -1:
        return f"0 {noun} tokens"
    lo, hi = 2 ** int(band), 2 ** (int(band) + 1) - 1
    return f"{lo}–{hi} {noun} tokens" if lo != hi else f"{lo} {noun} token"


WAIT = wait_s()
STATUS_KNOWN = status_known()
TIMEOUT = timeout()
FAILED = failed()
ERROR_CLASS = error_class()
