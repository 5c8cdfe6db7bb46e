"""Escaping for every text servlens prints: log values (run labels, model names, file names, request ids) are
untrusted, so each output escapes them for its own syntax at the output boundary.

- terminal and text files: no control characters (ESC sequences could move the cursor, retitle the window, hide
  text or write a hyperlink; a bare \\r overwrites the line; bidirectional overrides reorder what is shown);
- Markdown: no markup either (headings, links, images, raw HTML, tables), and no line breaks inside a field;
- one-line messages (stderr sentences): the same, with line breaks shown as spaces.
HTML is escaped by jinja2's autoescape (servlens/render/html.py).
"""

from __future__ import annotations

import re

# ESC sequences: CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), and two-byte ESC x.
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# The colours servlens itself adds on a terminal (SGR only: they cannot move the cursor or hide anything else).
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# C0 controls but \t and \n, DEL, C1 controls, and the Unicode bidirectional overrides and isolates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAK = re.compile(r"\r\n|[\r\n\t\v\f\x85\u2028\u2029]")

# Characters that start Markdown markup inside a line: emphasis, code, links and images, raw HTML and entities,
# tables, headings, strike-through. A field never holds a line break, so line-start markup cannot begin.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#!~&])")


def strip_controls(text: str) -> str:
    """`text` without ESC sequences and control characters; line breaks (\\n) and tabs are kept, \\r\\n and a
    lone \\r become \\n."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def terminal_safe(text: str) -> str:
    """A rendered document for stdout or a file: as strip_controls, but colour (SGR) sequences are kept — the
    renderers strip log values before adding their own colours, so only servlens's colours remain."""
    if "\x1b" not in text and "\r" not in text and not _CONTROL.search(text):
        return text
    parts = re.split(f"({_SGR.pattern})", text)
    return "".join(part if i % 2 else strip_controls(part) for i, part in enumerate(parts))


def one_line(value) -> str:
    """A field on one line: line breaks and tabs become spaces, other controls are dropped."""
    text = _ESCAPE_SEQUENCE.sub("", str(value))
    return _CONTROL.sub("", _LINE_BREAK.sub(" ", text))


# The control characters of _CONTROL (and the Unicode line separators) as an RE2 class for DuckDB.
CONTROL_SQL = "[\\x00-\\x1f\\x7f-\\x9f\\x{202a}-\\x{202e}\\x{2066}-\\x{2069}\\x{2028}\\x{2029}]+"


def one_line_sql(expr: str) -> str:
    """one_line as a DuckDB expression (a run label read from a log), without a Python loop over rows."""
    sequences = _ESCAPE_SEQUENCE.pattern.replace("'", "''")
    return f"regexp_replace(regexp_replace({expr}, '{sequences}', '', 'g'), '{CONTROL_SQL}', ' ', 'g')"


# A Markdown report stays a comment, not a dump: one field shows at most this many characters (a 2 MB model name
# would otherwise make a 2 MB table cell).
MAX_FIELD_CHARS = 1000


def bounded(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def bound_fields(value, limit: int = MAX_FIELD_CHARS):
    """A result document with every text (values and keys) cut to `limit` characters, saying how much was left
    out: a report shows a bounded number of fields, so one huge field (a 2 MB model name repeated in every finding's
    scope) cannot make the report huge. The JSON output keeps the document whole."""
    if isinstance(value, str):
        return bounded(value, limit)
    if isinstance(value, dict):
        return {bounded(k, limit) if isinstance(k, str) else k: bound_fields(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bound_fields(item, limit) for item in value]
    return value


def md_escape(value) -> str:
    """A field as literal Markdown text, on one line (safe in a table cell, a heading or a list item)."""
    return _MD_SPECIAL.sub(r"\\\1", bounded(one_line(value)))


def md_code(value) -> str:
    """A field as a Markdown code span: inside it nothing is markup; a backtick would end it, so it is replaced."""
    text = bounded(one_line(value), 200).replace("`", "'")
    return f"`{text}`" if text else "``"
