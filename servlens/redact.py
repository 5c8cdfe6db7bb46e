"""The one list of secret patterns, applied at ingest (SQL, no Python loop over rows) and to every message printed.

Each pattern is RE2-compatible (DuckDB's regex engine) so Python's `re` and DuckDB redact alike; each has a test
(tests/safety/test_redaction.py). What is redacted is listed in docs/security.md: keep the two in step.
"""

from __future__ import annotations

import re

REDACTED = "[REDACTED]"

# (name, pattern, replacement). Order matters where patterns overlap: URLs first (their query keys and passwords
# are cut before the key=value rule sees them), then token shapes, then key=value pairs. No pattern eats a quote or
# a backslash, so redacting JSON text (attrs) leaves it valid JSON.
SECRET_PATTERNS: list[tuple[str, re.Pattern, str]] = [
    # scheme://user:password@host (a LiteLLM api_base, a database URL): the whole userinfo goes.
    ("url-userinfo", re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,15}://)[^/\s:@\"'\\]+:[^/\s@\"'\\]*@"), r"\1" + REDACTED + "@"),
    # ?key=... / &api_key=... / &sig=... in a URL (Gemini's ?key=, Azure SAS sig=, presigned X-Amz-Signature=).
    ("url-query-secret", re.compile(
        r"(?i)([?&](?:api[_-]?key|key|access[_-]?token|token|auth|code|sig|signature|password|pass|secret|"
        r"client[_-]?secret|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&\s\"'#<>\\]+"), r"\1" + REDACTED),
    ("bearer", re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    ("basic-auth", re.compile(r"(?i)\b(basic)\s+[A-Za-z0-9+/]{8,}={0,2}"), r"\1 " + REDACTED),
    ("openai-style-key", re.compile(r"\bsk-(?:proj-|ant-|or-|svcacct-|admin-)?[A-Za-z0-9_-]{8,}"), "sk-" + REDACTED),
    ("stripe-key", re.compile(r"\b[rsp]k_(?:live|test)_[A-Za-z0-9]{8,}"), REDACTED),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}"), REDACTED),
    ("google-oauth-token", re.compile(r"\bya29\.[A-Za-z0-9_-]{16,}"), REDACTED),
    ("google-api-key", re.compile(r"\bAIza[0-9A-Za-z_-]{20,}"), REDACTED),
    ("aws-access-key-id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    ("vendor-token", re.compile(r"\b(?:(?:hf|gsk|xai|pplx|ghp|gho|ghs|ghu|github_pat)_|glpat-)[A-Za-z0-9_-]{12,}"),
     REDACTED),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # key: value / key=value with a secret-looking key name (JSON, headers, env lines, CLI flags).
    ("secret-key-value", re.compile(
        r"(?i)((?:api[_-]?key|x-api-key|aws[_-]?secret[_-]?access[_-]?key|secret[_-]?access[_-]?key|"
        r"access[_-]?key[_-]?id|access[_-]?token|refresh[_-]?token|session[_-]?token|auth[_-]?token|id[_-]?token|"
        r"client[_-]?secret|secret|password|passwd)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}&\\]{6,}"),
        r"\1" + REDACTED),
]

# Any of the patterns could match: one test (RE2 runs an alternation in one linear pass) that lets SQL skip the
# replacements on the clean values. It is the patterns themselves, case-insensitive, so it is a superset of them by
# construction; a looser word list ("key", "token", "://") matched nearly every gateway row (api_base, metadata
# keys) and made ingest rewrite every row through every replacement (100k LiteLLM rows: 4.4 s -> 12.4 s).
_PREFILTER = re.compile("(?i)" + "|".join(f"(?:{pattern.pattern.replace('(?i)', '')})"
                                          for _, pattern, _ in SECRET_PATTERNS))


def redact_secrets(text: str) -> str:
    """`text` with every secret replaced by [REDACTED]."""
    if not text or not _PREFILTER.search(text):
        return text
    for _, pattern, replacement in SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _sql_regex(pattern: re.Pattern) -> tuple[str, str]:
    flags = "gi" if pattern.flags & re.IGNORECASE else "g"
    return pattern.pattern.replace("(?i)", "").replace("'", "''"), flags


def redact_candidate_sql(expr: str) -> str:
    """A DuckDB condition: true when `expr` may hold a secret (the cheap test before the replacements)."""
    prefilter, _ = _sql_regex(_PREFILTER)
    return f"coalesce(regexp_matches({expr}, '{prefilter}', 'i'), false)"


def redact_sql(expr: str) -> str:
    """The same redaction as a DuckDB expression over `expr` (VARCHAR), skipping values no pattern can match.
    `expr` is evaluated once (a parameter or a long expression goes through a one-element lambda)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", expr):
        return f"list_transform([{expr}], lambda _sl_v: {redact_sql('_sl_v')})[1]"
    replaced = expr
    for _, pattern, replacement in SECRET_PATTERNS:
        regex, flags = _sql_regex(pattern)
        replaced = f"regexp_replace({replaced}, '{regex}', '{replacement.replace(chr(39), chr(39) * 2)}', '{flags}')"
    return f"CASE WHEN {redact_candidate_sql(expr)} THEN {replaced} ELSE {expr} END"
