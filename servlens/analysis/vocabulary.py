"""The words the rules share, as SQL over the canonical `requests` columns: each is defined here once.

Every expression is NULL-honest: a column the source lacks is NULL, and an expression over it is NULL (unknown) or
false, never a filled-in 0. DuckDB's `greatest()` / `least()` skip NULL arguments, so they are only applied to a
value already known to be non-NULL.
"""

from __future__ import annotations

from servlens.analysis.failures import ERROR_CLASSES, FAILED

# The wait of one request before the engine worked on it: the engine's queue time, else TTFT minus prefill time;
# clipped to [0, TTFT] because the two clocks differ (client TTFT, engine queue) and a wait longer than the TTFT it is
# part of is clock skew. NULL when neither queue_s nor prefill_s (with ttft_s) is known.
_RAW_WAIT = "coalesce(queue_s, ttft_s - prefill_s)"
WAIT = (f"(CASE WHEN {_RAW_WAIT} IS NULL THEN NULL "
        f"WHEN ttft_s IS NULL THEN greatest({_RAW_WAIT}, 0) "
        f"ELSE least(greatest({_RAW_WAIT}, 0), ttft_s) END)")

# Failed requests and their classes live in servlens/analysis/failures.py; a timeout is a failure of the timeout
# class there (HTTP 408/504/524, LiteLLM `Timeout`, finish_reason timeout), read the same way by every rule.
TIMEOUT_STATUSES = next(c[1] for c in ERROR_CLASSES if c[0] == "timeout")
_TIMEOUT_WORDS = next(c[2] for c in ERROR_CLASSES if c[0] == "timeout")
_type_text = "lower(coalesce(error_type, '') || ' ' || coalesce(error_message, ''))"

STATUS_KNOWN = "(status IS NOT NULL OR http_status IS NOT NULL OR finish_reason IS NOT NULL)"

# A failure whose class, type or status says it ran out of time.
TIMEOUT = ("coalesce(finish_reason = 'timeout' OR http_status IN ({statuses}) OR "
           "(({failed}) AND ({words})), false)").format(
    statuses=", ".join(map(str, TIMEOUT_STATUSES)), failed=FAILED,
    words=" OR ".join(f"{_type_text} LIKE '%{w}%'" for w in _TIMEOUT_WORDS))

