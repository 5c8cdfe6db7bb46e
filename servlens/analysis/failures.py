"""Failed requests and their error class, as SQL over the canonical request columns (one home for both).

A request failed when ingest marked it an error (status 'error': an HTTP status >= 400, an error type or message,
or an error finish; servlens/ingest/compiler.py), when it finished by error, timeout or abort, or when its HTTP
status is >= 400. Each expression is NULL-safe: a column a source lacks is NULL, and NOT (NULL) would drop the
finished requests from every count.

The class of a failure reads the error type and message before the HTTP status, because gateways put a status on
failures that did not come from the upstream: LiteLLM raises APIConnectionError (connection refused, DNS) with
status 500, and Timeout with 408 (litellm/exceptions.py @ 01f37d8e; the recorded payloads in tests/data/gateways
carry error_code "500" and "OpenAIException - Connection error." for a dead endpoint, the openai SDK's
APIConnectionError message). The first class that matches wins, in ERROR_CLASSES order.
"""

from __future__ import annotations


def failed(alias: str = "") -> str:
    """A request that got no answer (NULL-safe)."""
    a = f"{alias}." if alias else ""
    return (f"coalesce({a}status = 'error' OR {a}finish_reason IN ('error', 'timeout', 'abort') "
            f"OR {a}http_status >= 400, false)")


def answered(alias: str = "") -> str:
    """A request that got an answer; one whose outcome is unknown is neither failed nor answered."""
    a = f"{alias}." if alias else ""
    return (f"coalesce({a}status = 'ok' AND coalesce({a}finish_reason, '') NOT IN ('error', 'timeout', 'abort') "
            f"AND coalesce({a}http_status < 400, true), false)")


FAILED = failed()


def _text(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return f"lower(coalesce({a}error_type, '') || ' ' || coalesce({a}error_message, ''))"

# (class, HTTP statuses, words in the error type or message (lower case), finish reasons, what it usually means).
# Word matches are substrings: 'connectionerror' matches APIConnectionError and ConnectionError.
ERROR_CLASSES: tuple[tuple[str, tuple[int, ...], tuple[str, ...], tuple[str, ...], str], ...] = (
    ("rate_limit", (429,), ("ratelimit", "rate_limit", "rate limit", "too many requests"), (),
     "HTTP 429 / RateLimitError: a deployment's rpm/tpm limit or the engine's admission limit"),
    # Before timeouts and 5xx: a refused connection, a failed DNS lookup or a connect timeout is an endpoint that
    # cannot be reached; it has no HTTP status, or the 500/502/503 a gateway puts on it (CONNECTION_STATUSES).
    ("connection", (), ("connection error", "connectionerror", "connecterror", "connection refused",
                        "connect timeout", "connecttimeout", "connection reset", "failed to establish",
                        "getaddrinfo", "name or service not known", "name resolution", "nodename nor servname",
                        "no route to host", "server disconnected", "remoteprotocolerror"), (),
     "no HTTP response: connection refused or reset, DNS lookup failed, endpoint unreachable"),
    ("timeout", (408, 504, 524), ("timeout", "timed out", "deadline exceeded", "deadline_exceeded"), ("timeout",),
     "HTTP 408/504 / Timeout: a client, gateway or engine time limit"),
    ("context_validation", (400, 404, 413, 422),
     ("contextwindow", "context_length", "context length", "context size", "badrequest", "bad request",
      "unprocessable", "invalid_request", "notfound"), (),
     "HTTP 400/413/422 / ContextWindowExceededError, BadRequestError: the request broke the API's contract"),
    ("auth", (401, 403), ("authentication", "permissiondenied", "permission denied", "unauthorized",
                          "invalid api key"), (),
     "HTTP 401/403: a wrong, expired or unauthorised key"),
    ("client_abort", (499,), (), ("abort",), "HTTP 499 / abort: the client closed the request before the answer"),
    # TGI answers a model shard's failure with 424 Failed Dependency, "Request failed during generation: ..."
    # (router/src/server.rs, InferError::GenerationError): the server failed, whatever the status says.
    ("server_5xx", tuple(range(500, 600)), ("internalserver", "internal server", "serviceunavailable",
                                            "service unavailable", "bad gateway", "badgateway",
                                            "request failed during generation"), (),
     "HTTP 500/502/503: the upstream server failed"),
)
# The only HTTP statuses a connection failure may carry: a 408 whose text also names the fallback's connection error
# ("litellm.Timeout ... Fallback to chat-small also failed: ... Connection error.") is the timeout the client got.
CONNECTION_STATUSES = (500, 502, 503)
OTHER_CLASS = "other"
CLASS_NAMES = tuple(c[0] for c in ERROR_CLASSES) + (OTHER_CLASS,)


def _condition(statuses: tuple[int, ...], words: tuple[str, ...], finishes: tuple[str, ...], alias: str) -> str:
    a = f"{alias}." if alias else ""
    parts = []
    if statuses:
        contiguous = len(statuses) > 3 and statuses == tuple(range(statuses[0], statuses[-1] + 1))
        codes = (f"BETWEEN {statuses[0]} AND {statuses[-1]}" if contiguous
                 else f"IN ({', '.join(map(str, statuses))})")
        parts.append(f"coalesce({a}http_status {codes}, false)")
    parts += [f"{_text(alias)} LIKE '%{w}%'" for w in words]
    if finishes:
        parts.append(f"coalesce({a}finish_reason IN ({', '.join(repr(f) for f in finishes)}), false)")
    return "(" + " OR ".join(parts) + ")"


def _when(name: str, statuses: tuple[int, ...], words: tuple[str, ...], finishes: tuple[str, ...], alias: str) -> str:
    condition = _condition(statuses, words, finishes, alias)
    if name == "connection":
        a = f"{alias}." if alias else ""
        allowed = ", ".join(map(str, CONNECTION_STATUSES))
        condition = f"(coalesce({a}http_status IN ({allowed}), {a}http_status IS NULL) AND {condition})"
    return condition


def error_class(alias: str = "") -> str:
    """The class of a failed request (NULL for a request that did not fail): the first class that matches."""
    return ("CASE WHEN NOT " + failed(alias) + " THEN NULL "
            + " ".join(f"WHEN {_when(name, st, w, fr, alias)} THEN '{name}'" for name, st, w, fr, _ in ERROR_CLASSES)
            + f" ELSE '{OTHER_CLASS}' END")


ERROR_CLASS = error_class()
