"""The one error type a user sees: a sentence saying what is wrong and what to do, and an exit code.

Anything raised as ServlensError is printed on stderr without a traceback (cli.main). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import re

# Exit codes shared by every command (DESIGN.md "Contracts"): 0 clean/pass, 1 finding at or above --fail-on or a
# compare fail, 2 usage or input error, 3 compare inconclusive.
EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3


class ServlensError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` what to do about it."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        text = self.message.rstrip(".") + "."
        if self.hint:
            text += " " + self.hint.rstrip(".") + "."
        return redact_secrets(text)


class InputError(ServlensError):
    """A file, folder or run the user named cannot be read as asked."""


class ConfigError(ServlensError):
    """A profile, rule, policy or option has a bad key or value."""


# Secrets that show up in provider error messages and headers. Redacted at ingest and in every message we print.
_SECRET_PATTERNS = [
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [REDACTED]"),
    (re.compile(r"\bsk-(?:proj-|ant-|or-)?[A-Za-z0-9_-]{8,}"), "sk-[REDACTED]"),
    (re.compile(r"\b(?:hf|gsk|xai|pplx|ghp|gho|ghs)_[A-Za-z0-9]{12,}"), "[REDACTED]"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{20,}"), "[REDACTED]"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "[REDACTED]"),
    (
        re.compile(r"(?i)((?:api[_-]?key|x-api-key|access[_-]?token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
                   r"[^\s\"',;}]{6,}"),
        r"\1[REDACTED]",
    ),
]


def redact_secrets(text: str) -> str:
    """Replace API keys, bearer tokens and key=value secrets with [REDACTED]."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_sql(expr: str) -> str:
    """The same redaction as a DuckDB expression over `expr`, so ingest redacts without a Python loop over rows.

    The patterns are RE2-compatible (DuckDB's regex engine), so Python and SQL redact alike.
    """
    for pattern, replacement in _SECRET_PATTERNS:
        flags = "gi" if pattern.flags & re.IGNORECASE else "g"
        regex = pattern.pattern.replace("(?i)", "").replace("'", "''")
        expr = f"regexp_replace({expr}, '{regex}', '{replacement.replace(chr(39), chr(39) * 2)}', '{flags}')"
    return expr
