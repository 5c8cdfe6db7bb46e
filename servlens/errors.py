"""The one error type a user sees: a sentence saying what is wrong and what to do, and an exit code.

Anything raised as ServlensError is printed on stderr without a traceback (cli.main). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

# Redaction has one home (servlens.redact); these names stay importable from here for the ingest modules.
from servlens.escape import one_line
from servlens.redact import redact_secrets, redact_sql  # noqa: F401

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
        return one_line(redact_secrets(text))  # one sentence: a file name's line breaks or ESC bytes cannot split it


class InputError(ServlensError):
    """A file, folder or run the user named cannot be read as asked."""


class ConfigError(ServlensError):
    """A profile, rule, policy or option has a bad key or value."""
