"""Compile a format profile into ONE SQL statement that reads a file and yields canonical request rows.

The statement is a chain of CTEs (docs/profiles.md describes what a profile author sees):

  _raw    the file as rows: raw lines with their 1-based line numbers (jsonl), JSON documents (json), CSV rows or
          Parquet rows. JSON-lines files are read as text lines with DuckDB's CSV reader (no quoting, no delimiter
          that JSON can contain) so every line keeps its number and a bad line is kept, never skipped.
  _valid  json_valid / json_type decide which lines parse; the profile's detect.must paths must be present.
  _paths  every `j->>'$.path'` / `j->'$.path'` in the profile is rewritten to an element of ONE multi-path
          json_extract_string / json_extract call, so each line is parsed once, not once per column
          (measured: 10x faster than one ->> per column on the real llama.cpp log).
  _let    per-document values ([let]) before any explode.
  _explode  explode.path (one row per array element, `e`) or explode.zip (parallel lists, `x.<name>`).
  _s1     stage 1: the profile's expressions, cast to the canonical types; NULL where the profile has none.
  _s2     stage 2: what the profile left out, derived generically where the inputs exist (never TTFT from e2e).
  final   normalised finish_reason and status, redacted error text, prefix_key, leak flags, attrs.

Lines that do not parse (or lack the required fields) come out of the same statement as rows with
status = '__bad__' and the reason in attrs; the ingester moves them to ingest_errors in the same transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from servlens.errors import redact_sql
from servlens.escape import one_line_sql
from servlens.ingest.profiles import MAPPABLE_COLUMNS, Profile, Wrapper
from servlens.ingest.sources import duckdb_path
from servlens.ingest.times import (
    EPOCH_MACROS,
    TIME_COLUMNS,
    TIME_MACROS,
    macro_twins,
    present_twin,
    scaled_twin,
    time_macros_of,
)
from servlens.store.schema import REQUEST_COLUMNS

BAD_ROW_STATUS = "__bad__"
PREFIX_CHARS = 2048
ERROR_MESSAGE_CHARS = 500
EXCERPT_BYTES = 200
# The longest line a JSON-lines file may have (the reader's buffer is twice this, per thread: it sets the peak memory;
# 64 MiB cost 230 MB more RSS than 8 MiB on a 500 MB log). A `json` document gets room for its whole file.
MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_DOCUMENT_BYTES = 1024 * 1024 * 1024

# Markers that mean reasoning text is where it should not be (reference/engines.md §3, D3).
REASONING_MARKERS = (
    r"<think>|</think>|<seed:think>|</seed:think>|<thinking>|</thinking>|<reasoning>|</reasoning>"
    r"|<\|channel\|>|<\|start\|>assistant|<\|end\|>|<\|message\|>|◁think▷|◁/think▷"
    r"|<\|begin_of_thought\|>|<\|end_of_thought\|>|\[THINK\]|\[/THINK\]"
)

_FINISH_MAP = {
    "stop": ("stop", "eos", "eos_token", "end_turn", "stop_sequence", "end", "complete", "completed", "stopped",
             "finish", "finished", "word"),  # llama.cpp stop_type "word": a stop string matched
    "length": ("length", "max_tokens", "limit", "max_length", "model_length", "max_output_tokens", "token_limit",
               "max_completion_tokens"),
    # hyphenated: the Vercel AI SDK's finish reasons ("tool-calls", "content-filter"), as Langfuse stores them
    "tool_calls": ("tool_calls", "tool_call", "function_call", "tool_use", "tool-calls"),
    "content_filter": ("content_filter", "content-filter", "safety", "recitation", "blocklist", "prohibited_content", "spii",
                       "refusal"),
    "abort": ("abort", "aborted", "cancelled", "canceled", "cancel", "client_disconnect", "client_closed"),
    "error": ("error", "failed", "failure", "exception"),
    "timeout": ("timeout", "timed_out", "deadline_exceeded"),
}

# Built-in macros every profile may use (docs/profiles.md lists them).
BUILTIN_MACROS = {
    **TIME_MACROS,
    # Unix seconds / milliseconds / nanoseconds (number or numeric string) -> UTC TIMESTAMP (microseconds). A seconds
    # or milliseconds field holding a larger unit is read in that unit, and said so (servlens/ingest/times.py).
    **EPOCH_MACROS,
    "sl_epoch_ns": (["x"], "make_timestamp(CAST(TRY_CAST(x AS HUGEINT) // 1000 AS BIGINT))"),
    # OpenAI chat messages (a JSON array) -> 'role: content' lines in order; content may be a string or a list of
    # parts ({"type": "text", "text": ...}); non-text parts count as their type name.
    "sl_chat_text": (
        ["msgs"],
        # from_json into a typed list parses the array once (measured 2-5x faster than per-message lookups). A
        # content that is a list of parts comes back as its JSON text; it is read as parts when it parses as a JSON
        # array of objects with a "type" (a plain-text message that is exactly such JSON would be read as parts too).
        "array_to_string(list_transform(from_json(msgs, '[{\"role\": \"VARCHAR\", \"content\": \"VARCHAR\"}]'), "
        "lambda m: coalesce(m.role, '') || ': ' || CASE WHEN starts_with(m.content, '[{') AND json_valid(m.content) "
        "AND json_exists(m.content, '$[0].type') THEN array_to_string(list_transform(from_json(m.content, "
        "'[{\"type\": \"VARCHAR\", \"text\": \"VARCHAR\"}]'), lambda p: coalesce(p.text, '[' || coalesce(p.type, 'part') || ']')), '') "
        "ELSE coalesce(m.content, '') END), chr(10))",
    ),
    # The same from a whole record and the path of its messages: roles and contents come out as two lists (no
    # re-serialising of the messages array: measured 2x faster than sl_chat_text(j->>path) on long prompts). A message
    # without a "content" key would shift the lists: then the exact sl_chat_text is used.
    "sl_chat_text_at": (
        ["doc", "path"],
        "list_transform([struct_pack(r := json_extract_string(doc, path || '[*].role'), "
        "c := json_extract_string(doc, path || '[*].content'))], lambda s: CASE WHEN len(s.r) = len(s.c) THEN "
        "array_to_string(list_transform(list_zip(s.r, s.c), lambda m: coalesce(m[1], '') || ': ' || "
        "CASE WHEN starts_with(m[2], '[{') AND json_valid(m[2]) AND json_exists(m[2], '$[0].type') THEN "
        "array_to_string(list_transform(from_json(m[2], '[{\"type\": \"VARCHAR\", \"text\": \"VARCHAR\"}]'), "
        "lambda p: coalesce(p.text, '[' || coalesce(p.type, 'part') || ']')), '') "
        "ELSE coalesce(m[2], '') END), chr(10)) "
        "ELSE sl_chat_text(json_extract_string(doc, path)) END)[1]",
    ),
    # One chat message as 'role: text' (content a string or a list of parts), the text cut to max_chars.
    "sl_chat_message": (
        ["role", "content", "max_chars"],
        "coalesce(role, '') || ': ' || CASE WHEN starts_with(content, '[{') AND json_valid(content) "
        "AND json_exists(content, '$[0].type') THEN left(array_to_string(list_transform(from_json(content, "
        "'[{\"type\": \"VARCHAR\", \"text\": \"VARCHAR\"}]'), lambda p: coalesce(p.text, '[' || "
        "coalesce(p.type, 'part') || ']')), ''), max_chars) ELSE coalesce(left(content, max_chars), '') END",
    ),
    # The prompt's first 2,048 characters from its first two messages alone, when they are enough (`more`: a third
    # message exists); NULL when they are not. Lets a profile read two messages' fields in its one pass over the
    # line instead of the whole messages array (measured 25% less ingest CPU on long chat prompts).
    "sl_chat_prefix2": (
        ["r0", "c0", "r1", "c1", "more"],
        "list_transform([sl_chat_message(r0, c0, 2048) || CASE WHEN r1 IS NOT NULL THEN chr(10) || "
        "sl_chat_message(r1, c1, 2048) ELSE '' END], lambda t: CASE WHEN NOT coalesce(more, false) "
        "OR length(t) >= 2048 THEN t END)[1]",
    ),
    # A prompt that may be a string or a list of strings (completions API).
    "sl_prompt_text": (
        ["p"],
        "CASE WHEN json_type(p) = 'ARRAY' THEN array_to_string(CAST(p AS VARCHAR[]), chr(10)) "
        "WHEN json_type(p) = 'VARCHAR' THEN p->>'$' END",
    ),
}

_ACCESS_RE = re.compile(r"(?<![\w.])(j|e)\s*(->>|->)\s*'((?:[^']|'')*)'")


@dataclass
class CompileOptions:
    """What the ingester knows about one file when it compiles a profile for it."""

    path: Path
    compression: str | None = None  # 'gzip' | 'zstd' | None
    run: str | None = None  # --run (wins over the profile's run expression)
    default_run: str = "default"  # the file stem
    keep_text: bool = False
    start: datetime | None = None  # --start: the epoch for relative clocks
    tz: str | None = None  # --tz: the zone of naive wall-clock times
    json_multiline: bool = False  # reader json: the file is one document over many lines (sniffed)
    safe: bool = False  # wrap every expression in try() (after the fast path met a conversion error)
    # source_line left NULL for the ingester to set from the insert order; [derived] windows left for after the
    # insert (only where can_number_by_insert_order says so)
    lines_by_insert_order: bool = False
    wrapper: Wrapper | None = None  # a log store's envelope found by sniffing, undone before [unwrap]
    # the typed fast path: read_json with a schema built from the profile's paths instead of the line reader (only
    # where typed_read_eligible says so; the ingester falls back to the line reader on any doubt)
    typed: bool = False


def unwrap_steps(profile: Profile, opts: CompileOptions) -> list[tuple[str, str]]:
    """(kind, path) steps from a line to the profile's records: the log store's wrapper, then the profile's
    own."""
    steps = [(opts.wrapper.kind, opts.wrapper.path)] if opts.wrapper else []
    return steps + list(profile.unwrap.items())


def _unwrap_sql(kind: str, path: str, source: str) -> str:
    """One unwrap step over rows (_line, _text). A line without the wrapper's field is kept whole, so that it
    becomes a bad line with its own keys (never dropped silently); a list of records gives one row per
    record."""
    p = sql_str(path)
    if kind == "record":
        return (f"SELECT _line, coalesce(CAST(try(json_extract(_text, {p})) AS VARCHAR), _text) AS _text "
                f"FROM {source}")
    if kind == "record_text":
        return f"SELECT _line, coalesce(try(json_extract_string(_text, {p})), _text) AS _text FROM {source}"
    func = "json_extract" if kind == "records" else "json_extract_string"
    return (f"SELECT _line, unnest(coalesce(try(CAST({func}(_text, {p}) AS VARCHAR[])), [_text])) AS _text "
            f"FROM {source}")


@dataclass
class CompiledProfile:
    """The CTE chain for one profile and one file; `select()` gives the canonical rows."""

    profile: Profile
    ctes: list[tuple[str, str]]
    final_columns: dict[str, str]  # canonical column -> expression over the last CTE (except run/source_id)
    run_expr: str
    macros: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    lines_by_insert_order: bool = False  # compiled with CompileOptions.lines_by_insert_order
    json_paths: list[str] = field(default_factory=list)  # the paths the one multi-path extraction reads, as text
    typed: bool = False  # reads the file with read_json and a schema from the paths (CompileOptions.typed)

    def _with(self) -> str:
        return "WITH " + ",\n".join(f"{name} AS (\n{body}\n)" for name, body in self.ctes)

    def after_insert_sql(self, where: str) -> list[str]:
        """When compiled with lines_by_insert_order: the statements that finish the rows one INSERT added (`where`
        selects exactly them): line numbers from the insert order, then the windowed [derived] columns over those
        rows. None are needed otherwise."""
        if not self.lines_by_insert_order:
            return []
        statements = [number_lines_sql(where)]
        windowed = _windowed(self.profile)
        if windowed:
            sets = ", ".join(f"{col} = coalesce(requests.{col}, x.{col})" for col in windowed)
            values = ", ".join(f"TRY_CAST(({_LINE_RE.sub('source_line', expr)}) AS {REQUEST_COLUMNS[col]}) AS {col}"
                               for col, expr in windowed.items())
            # Computed into a table first: an UPDATE ... FROM (window query) took 0.67 s for 100k LiteLLM rows, the
            # same window into a table and an UPDATE from it 0.05 s.
            statements += [
                f"CREATE OR REPLACE TEMP TABLE _sl_derived AS SELECT rowid AS _rid, {values} FROM requests WHERE {where}",
                f"UPDATE requests SET {sets} FROM _sl_derived AS x WHERE requests.rowid = x._rid",
                "DROP TABLE _sl_derived",
            ]
        return statements

    def macro_sql(self) -> list[str]:
        """CREATE OR REPLACE TEMP MACRO statements to run before the query."""
        return [
            f"CREATE OR REPLACE TEMP MACRO {name}({', '.join(params)}) AS ({body})"
            for name, (params, body) in self.macros.items()
        ]

    def runs_sql(self) -> str:
        """The distinct run labels of the good rows (used when the run comes from the file)."""
        return (f"{self._with()}\nSELECT DISTINCT {self.run_expr} AS run FROM _last WHERE _ok AND _keep "
                "ORDER BY 1")

    def select(self, source_id_sql: str = "NULL", where_sql: str = "true") -> str:
        """The SELECT yielding REQUEST_COLUMNS in order; `source_id_sql` and `where_sql` may use `_run`."""
        parts = []
        for column, sqltype in REQUEST_COLUMNS.items():
            if column == "run":
                parts.append("_run AS run")
            elif column == "source_id":
                parts.append(f"CAST({source_id_sql} AS INTEGER) AS source_id")
            else:
                parts.append(f"{self.final_columns[column]} AS {column}")
        body = ",\n  ".join(parts)
        return (
            f"{self._with()},\n_runs AS (SELECT *, CASE WHEN _ok THEN {self.run_expr} END AS _run FROM _last)\n"
            f"SELECT\n  {body}\nFROM _runs WHERE (NOT _ok) OR (_keep AND ({where_sql}))"
        )


def sql_str(value: str) -> str:
    """A SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


class _PathRewriter:
    """Rewrites j->>'$.p' / j->'$.p' (and the same on e) into elements of one multi-path extraction."""

    def __init__(self) -> None:
        self.paths: dict[tuple[str, str], list[str]] = {}

    def rewrite(self, expr: str) -> str:
        def replace(match: re.Match) -> str:
            base, op, path = match.group(1), match.group(2), match.group(3).replace("''", "'")
            kind = "s" if op == "->>" else "j"
            if "*" in path or not path.startswith("$"):
                # Wildcards cannot be part of a multi-path call; keep the single call (NULL for bad lines).
                func = "json_extract_string" if kind == "s" else "json_extract"
                return f"{func}({base}, {sql_str(path)})"
            bucket = self.paths.setdefault((base, kind), [])
            if path not in bucket:
                bucket.append(path)
            return f"_{base}{kind}[{bucket.index(path) + 1}]"

        return _ACCESS_RE.sub(replace, expr)

    def columns(self, base: str, guard: str) -> list[str]:
        out = []
        for kind, func in (("s", "json_extract_string"), ("j", "json_extract")):
            paths = self.paths.get((base, kind))
            if paths:
                listed = "[" + ", ".join(sql_str(p) for p in paths) + "]"
                out.append(f"CASE WHEN {guard} THEN {func}({base}, {listed}) END AS _{base}{kind}")
        return out


def line_longest(profile: Profile, opts: CompileOptions) -> int:
    """The longest line the line reader accepts for this file (a `json` document gets room for its whole file)."""
    if profile.reader != "json":
        return MAX_LINE_BYTES
    try:
        size = opts.path.stat().st_size * (20 if opts.compression else 1)
    except OSError:
        size = 0
    return min(max(MAX_LINE_BYTES, size + 1024 * 1024), MAX_DOCUMENT_BYTES)


def line_reader_sql(path: Path, compression: str | None, longest: int, store_rejects: bool = True) -> str:
    """DuckDB's CSV reader as a line splitter: one VARCHAR column `line`, no quoting, one row per line; a line it
    cannot take (too long, not UTF-8) becomes a reject row with its line number.

    No `new_line` option, on purpose: with new_line='\\r\\n' on a file whose lines end in a bare \\n, a line break
    that falls on the first byte of a read buffer makes the reader skip the next line, without a reject (DuckDB 1.x/2.0
    buffer-boundary handling; 1 line lost in 100k on a 705 MB log). Without the option the reader ends lines at \\n
    or \\r\\n (the \\r is not kept) and reads every line at every buffer boundary (tests/ingest/test_line_reader.py);
    the ingester still checks the count of lines it got against the file's (requests.py)."""
    rejects = ("store_rejects=true, rejects_table='_sl_csv_rejects', rejects_scan='_sl_csv_reject_scans'"
               if store_rejects else "store_rejects=false")
    return (
        f"read_csv({duckdb_path(path)}, columns={{'line': 'VARCHAR'}}, header=false, auto_detect=false, "
        "delim='\\x1f', quote='', escape='', strict_mode=false, null_padding=true, "
        f"compression={sql_str(compression or 'none')}, max_line_size={longest}, buffer_size={2 * longest}, "
        f"ignore_errors=true, {rejects})"
    )


def _raw_source(profile: Profile, opts: CompileOptions) -> tuple[str, bool]:
    """The _raw CTE body and whether its rows are JSON text (`_text`)."""
    path = duckdb_path(opts.path)  # never a glob pattern
    longest = line_longest(profile, opts)
    # row_number() OVER () makes DuckDB run the whole extraction on one thread (11.7 s against 6.8 s for 1M lines
    # on 2 cores). Where the rows come out one per line in line order, the ingester numbers them instead by their
    # insert order (an INSERT keeps the file's order: preserve_insertion_order).
    number = "CAST(NULL AS BIGINT)" if opts.lines_by_insert_order else "row_number() OVER ()"
    lines = f"SELECT {number} AS _line, line AS _text FROM {line_reader_sql(opts.path, opts.compression, longest)}"
    if profile.reader in ("jsonl", "json") and not opts.json_multiline:
        # One JSON value per line (a vLLM bench result is one line; --append-result adds one line per run).
        return lines, True
    if profile.reader in ("jsonl", "json"):
        # One pretty-printed document spread over many lines: the document is line 1.
        return f"SELECT 1 AS _line, string_agg(_text, chr(10) ORDER BY _line) AS _text FROM ({lines}) HAVING count(*) > 0", True
    if profile.reader == "lines":
        return lines, False
    if profile.reader == "csv":
        options = {"header": True, "all_varchar": True, "compression": opts.compression or "none"}
        options.update(profile.csv_options)
        rendered = ", ".join(
            f"{k}={'true' if v is True else 'false' if v is False else sql_str(v) if isinstance(v, str) else v}"
            for k, v in options.items()
        )
        header = 1 if options.get("header", True) else 0
        return (
            f"SELECT row_number() OVER () + {header} AS _line, * FROM read_csv({path}, {rendered}, "
            "store_rejects=true, rejects_table='_sl_csv_rejects', rejects_scan='_sl_csv_reject_scans')",
            False,
        )
    return f"SELECT file_row_number + 1 AS _line, * EXCLUDE (file_row_number) FROM read_parquet({path}, file_row_number=true)", False


_WINDOW_RE = re.compile(r"\bover\s*\(", re.IGNORECASE)
_LINE_RE = re.compile(r"\b_line\b")


def number_lines_sql(where: str) -> str:
    """Set source_line of the rows one INSERT just added (`where` selects exactly them) from their insert order:
    their rowids are consecutive and in the reader's order. Lines the reader rejected are shifted in afterwards,
    as with row_number()."""
    return (f"UPDATE requests SET source_line = rowid - (SELECT min(rowid) FROM requests WHERE {where}) + 1 "
            f"WHERE {where}")


# Columns the query itself finishes after [derived] (status, flags, ...): a [derived] window may not set them, since
# it runs after the insert when lines are numbered by insert order.
_FINISHED_IN_QUERY = {"source_line", "status", "finish_reason", "finish_reason_raw", "error_message", "error_type",
                      "prefix_key", "content_empty", "content_has_reasoning_marker", "reasoning_present",
                      "reasoning_has_marker", "attrs"}


def _windowed(profile: Profile) -> dict[str, str]:
    return {col: expr for col, expr in profile.derived.items() if _WINDOW_RE.search(expr)}


def can_number_by_insert_order(profile: Profile, opts: CompileOptions) -> bool:
    """Whether the rows come out in line order, one per line, and nothing reads _line before the insert: a line
    reader, no explode, no window function (a window reorders rows) and no expression naming _line - except
    [derived] windows, which then run after the insert over the inserted rows."""
    if profile.explode_path or profile.explode_zip or profile.where or any(
            kind.startswith("records") for kind, _ in unwrap_steps(profile, opts)):
        return False  # a filtered, exploded or unwrapped-list file does not give one row per line
    if not (profile.reader == "jsonl" or (profile.reader == "json" and not opts.json_multiline)):
        return False
    windowed = _windowed(profile)
    if set(windowed) & _FINISHED_IN_QUERY:
        return False
    expressions = [*profile.let.values(), *profile.columns.values(), *profile.text.values(), *profile.attrs.values(),
                   *(e for c, e in profile.derived.items() if c not in windowed),
                   *(body for _, body in profile.macros.values())]
    if profile.run:
        expressions.append(profile.run)
    return not any(_WINDOW_RE.search(e) or _LINE_RE.search(e) for e in expressions)


def line_captures(patterns: list[str], names: list[list[str]]) -> tuple[list[str], dict[str, str], str]:
    """The named regex captures of a line reader over `_text`: the select items `_p<i>` (pattern i's captures as a
    struct, NULL when it does not match), each capture name's value (the first matching pattern's, '' as NULL) and
    the condition that some pattern matched. Request lines and metric lines read captures this one way."""
    matched = []
    for i, (pattern, group) in enumerate(zip(patterns, names)):
        listed = "[" + ", ".join(sql_str(n) for n in group) + "]"
        matched.append(f"CASE WHEN regexp_matches(_text, {sql_str(pattern)}) THEN "
                       f"regexp_extract(_text, {sql_str(pattern)}, {listed}) END AS _p{i}")
    captures = {}
    for name in dict.fromkeys(n for group in names for n in group):
        parts = [f"_p{i}.{_ident(name)}" for i, group in enumerate(names) if name in group]
        captures[name] = f"nullif(coalesce({', '.join(parts)}), '')"
    any_match = " OR ".join(f"_p{i} IS NOT NULL" for i in range(len(patterns)))
    return matched, captures, any_match


def _line_records(profile: Profile) -> list[tuple[str, str]]:
    """Reader "lines": the lines matching one of the profile's patterns, their named captures as `m.<name>`
    (text); with lines.key, the lines sharing the key's captures are one record (each capture from its first
    line). Lines no pattern matches are other log lines: not records, not bad lines — unless they start like a
    record (lines.record_start): those are bad lines, counted and kept with their line number."""
    matched, captures, any_match = line_captures(profile.line_patterns, profile.line_names)
    names = list(captures)
    fields = [f"{expr} AS {_ident(name)}" for name, expr in captures.items()]
    start = profile.line_record_start
    if start is not None:
        reason = sql_str(f"the line starts like a {profile.name} record but matches none of its [lines] patterns")
        bad = (f"CASE WHEN NOT ({any_match}) THEN json_object('reason', {reason}, "
               f"'byte_length', octet_length(encode(_text))) END")
        ctes = [
            ("_matched", "SELECT _line, _text, " + ", ".join(matched) + " FROM _raw"),
            ("_fields", f"SELECT _line, {', '.join(fields)}, ({any_match}) AS _ok, {bad} AS _bad FROM _matched "
                        f"WHERE {any_match} OR regexp_matches(_text, {sql_str(start)})"),
        ]
        packed = ", ".join(f"{_ident(n)} := {_ident(n)}" for n in names)
        ctes.append(("_checked", f"SELECT _line, struct_pack({packed}) AS m, _ok, _bad FROM _fields"))
        return ctes
    ctes = [
        ("_matched", "SELECT _line, " + ", ".join(matched) + " FROM _raw"),
        ("_fields", f"SELECT _line, {', '.join(fields)} FROM _matched WHERE {any_match}"),
    ]
    if profile.line_key:
        key = [_ident(k) for k in profile.line_key]
        others = [_ident(n) for n in names if n not in profile.line_key]
        picks = ", ".join(f"arg_min({n}, _line) FILTER (WHERE {n} IS NOT NULL) AS {n}" for n in others)
        present = " AND ".join(f"{k} IS NOT NULL" for k in key)
        columns = ", ".join(key) + (", " + picks if picks else "")
        ctes.append(("_records", f"SELECT min(_line) AS _line, {columns} FROM _fields WHERE {present} "
                                 f"GROUP BY {', '.join(key)}"))
        source = "_records"
    else:
        source = "_fields"
    packed = ", ".join(f"{_ident(n)} := {_ident(n)}" for n in names)
    ctes.append(("_checked", f"SELECT _line, struct_pack({packed}) AS m, true AS _ok, "
                             f"CAST(NULL AS JSON) AS _bad FROM {source}"))
    return ctes


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _try(expr: str, opts: CompileOptions) -> str:
    """In safe mode, try(): a value the expression cannot convert becomes NULL instead of failing the file. The fast
    path runs without it (try() costs about a fifth of the ingest); the ingester reruns a file in safe mode when the
    fast path hits a conversion error. DuckDB refuses window functions inside try(), so a window expression (a
    [derived] attempt order within trace_id) always runs bare."""
    return f"try({expr})" if opts.safe and not _WINDOW_RE.search(expr) else f"({expr})"


def _time_adjust(profile: Profile, expr: str, opts: CompileOptions) -> str:
    if profile.clock == "relative" and opts.start is not None:
        start = opts.start.replace(tzinfo=None).isoformat(sep=" ")
        return f"({expr} + (TIMESTAMP {sql_str(start)} - TIMESTAMP '1970-01-01 00:00:00'))"
    if profile.clock == "naive" and opts.tz:
        return f"(({expr}) AT TIME ZONE {sql_str(opts.tz)}) AT TIME ZONE 'UTC'"
    return expr


# The typed fast path. The line reader parses each line's text and looks every path up as text; read_json with an
# explicit schema parses straight into columns, about 1.5x faster, but cannot name a bad line. So a file is first read
# with read_json, each path a column of the schema; the ingester keeps the result only when nothing could differ
# from the line reader's (ingest/requests.py: no reader or conversion error, every line a row, no row missing a
# required field) and otherwise reads the file again with the line reader. Leaves the profile reads as text (->>)
# are VARCHAR: read_json gives a value of any JSON type as the same text json_extract_string does (numbers,
# objects, escapes; tests/ingest/test_typed_read.py), so the profile's own casts see what they see today. A leaf
# read as typed numbers would not: read_json turns true into 1 and 12.5 into 12 where the text cast gives NULL
# and 13. The schema is the union of every path the profile reads, so files of different shapes share one read.
_PATH_STEP_RE = re.compile(r'\.(?:([A-Za-z_][A-Za-z0-9_]*)|"([^"\\]*)")|\[(\d+)\]')
_STRING_LITERAL_RE = re.compile(r"'(?:[^']|'')*'")
_DOC_REF_RE = re.compile(r"(?<![\w.])j(?!\w)")


def _path_steps(path: str) -> list[str | int] | None:
    """'$.a."b-c"[0].d' -> ['a', 'b-c', 0, 'd']; None for what a schema cannot express (wildcards, a root index)."""
    if not path.startswith("$"):
        return None
    steps: list[str | int] = []
    pos = 1
    while pos < len(path):
        match = _PATH_STEP_RE.match(path, pos)
        if not match:
            return None
        index = match.group(3)
        steps.append(int(index) if index is not None else (match.group(1) or match.group(2)))
        pos = match.end()
    return steps if steps and isinstance(steps[0], str) else None


@dataclass
class _SchemaNode:
    uses: set = field(default_factory=set)  # 's' (read as text, ->>) and/or 'j' (read as JSON, ->)
    keys: dict = field(default_factory=dict)  # object members: name -> node
    element: _SchemaNode | None = None  # list elements (every index read shares one element type)

    @property
    def as_json(self) -> bool:
        """Read as one JSON value (its paths then looked up in it): read as JSON, or both read and looked into,
        or looked into both as an object and as a list."""
        inner = bool(self.keys) or self.element is not None
        return "j" in self.uses or (bool(self.uses) and inner) or (bool(self.keys) and self.element is not None)

    def ddl(self) -> str:
        if self.as_json:
            return "JSON"
        if self.keys:
            return "STRUCT(" + ", ".join(f"{_ident(k)} {v.ddl()}" for k, v in self.keys.items()) + ")"
        if self.element is not None:
            return self.element.ddl() + "[]"
        return "VARCHAR"


def _json_path(steps: list[str | int]) -> str:
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else (f".{s}" if re.fullmatch(r"[A-Za-z_]\w*", s)
                                                                else f'."{s}"') for s in steps)


def _typed_read(profile: Profile, opts: CompileOptions, rw: _PathRewriter, must_refs: list[str],
                must: list[str]) -> tuple[str, list[str], list[str], str, str] | None:
    """(read_json call, an expression per text path, an expression per JSON path, the required-fields test, the
    missing-fields text) when the typed fast path can read this file for this profile, else None."""
    if not opts.lines_by_insert_order or opts.json_multiline or unwrap_steps(profile, opts):
        return None
    if profile.reader not in ("jsonl", "json"):
        return None
    rewritten = [rw.rewrite(e) for e in (*profile.columns.values(), *profile.text.values(), *profile.attrs.values(),
                                         *profile.let.values(), profile.run or "", profile.where or "")]
    if any(_DOC_REF_RE.search(_STRING_LITERAL_RE.sub("''", e)) for e in rewritten):
        return None  # the profile reads the whole document (j itself, a wildcard path): only the line reader has it
    if rw.paths.get(("e", "s")) or rw.paths.get(("e", "j")):
        return None
    root = _SchemaNode()
    wanted: list[tuple[str, list[str | int]]] = []
    for kind in ("s", "j"):
        for path in rw.paths.get(("j", kind), []):
            steps = _path_steps(path)
            if steps is None:
                return None
            node = root
            for step in steps:
                if isinstance(step, int):
                    node.element = node.element or _SchemaNode()
                    node = node.element
                else:
                    node = node.keys.setdefault(step, _SchemaNode())
            node.uses.add(kind)
            wanted.append((kind, steps))

    columns = "{" + ", ".join(f"{sql_str(k)}: {sql_str(v.ddl())}" for k, v in root.keys.items()) + "}"
    read = (f"SELECT * FROM read_json({duckdb_path(opts.path)}, format='newline_delimited', records=true, "
            f"columns={columns}, compression={sql_str(opts.compression or 'none')}, "
            f"maximum_object_size={MAX_LINE_BYTES})")
    # The paths inside a value read as JSON: one multi-path lookup per value and kind (one parse, as the line
    # reader does for the whole line), its elements then read by index.
    inner: dict[tuple[str, str], list[str]] = {}

    def access(kind: str, steps: list[str | int]) -> str:
        node, expr = root, None
        for i, step in enumerate(steps):
            if isinstance(step, int):
                node, expr = node.element, f"{expr}[{step + 1}]"
            else:
                node, expr = node.keys[step], (_ident(step) if expr is None else f"{expr}[{sql_str(step)}]")
            if node.as_json:
                rest = _json_path(steps[i + 1:])
                if kind == "j" and rest == "$":
                    return expr
                listed = inner.setdefault((kind, expr), [])
                if rest not in listed:
                    listed.append(rest)
                return f"_tn{list(inner).index((kind, expr)) + 1}[{listed.index(rest) + 1}]"
        return expr

    string_exprs = [access(k, st) for k, st in wanted if k == "s"]
    json_exprs = [access(k, st) for k, st in wanted if k == "j"]
    lookups = [f"{'json_extract_string' if kind == 's' else 'json_extract'}({expr}, "
               f"[{', '.join(sql_str(r) for r in rests)}]) AS _tn{n + 1}"
               for n, ((kind, expr), rests) in enumerate(inner.items())]
    if lookups:
        read = f"SELECT *, {', '.join(lookups)} FROM ({read})"
    if must_refs:
        ok = " AND ".join(f"({ref}) IS NOT NULL" for ref in must_refs)
        missing = "array_to_string(list_filter([" + ", ".join(
            f"CASE WHEN ({ref}) IS NULL THEN {sql_str(p)} END" for ref, p in zip(must_refs, must)
        ) + "], lambda v: v IS NOT NULL), ', ')"
    else:
        ok, missing = "true", "''"
    return read, string_exprs, json_exprs, ok, missing


_DOC_CALL_RE = re.compile(r"\b(json_type|json_extract_string|json_extract|sl_chat_text_at)\(\s*j\s*,\s*('(?:[^'*]|'')*')\s*\)")


def _without_document_calls(profile: Profile) -> Profile:
    """The profile with calls on the whole document and one literal path (json_type(j, '$.p'), sl_chat_text_at(j,
    '$.p'), ...) written as calls on that path's value, which a schema can give: json_type(j, p) is
    json_type(j->p), and sl_chat_text_at(j, p) looks p's messages up as sl_chat_text_at(j->p, '$') does."""
    def rewrite(expr: str) -> str:
        def one(match: re.Match) -> str:
            func, path = match.group(1), match.group(2)
            if func == "json_type":
                return f"json_type(j->{path})"
            if func == "sl_chat_text_at":
                return f"sl_chat_text_at(j->{path}, '$')"
            return f"(j{'->>' if func == 'json_extract_string' else '->'}{path})"
        return _DOC_CALL_RE.sub(one, expr)

    def table(values: dict[str, str]) -> dict[str, str]:
        return {k: rewrite(v) for k, v in values.items()}

    return replace(profile, columns=table(profile.columns), text=table(profile.text), attrs=table(profile.attrs),
                   let=table(profile.let), run=rewrite(profile.run) if profile.run else profile.run)


_TYPED_REF_RE = re.compile(r"(?<![\w.])_j(s|j)\[(\d+)\]")


def _use_typed_read(compiled: CompiledProfile, read: str, string_exprs: list[str], json_exprs: list[str],
                    ok: str, missing: str) -> None:
    """Replace the line reader and its extraction (every CTE up to _checked) by the typed read; the rest of the
    chain reads the paths as columns instead of list elements."""
    def columns(sql: str) -> str:
        return _TYPED_REF_RE.sub(lambda m: f"_t{m.group(1)}{m.group(2)}", sql)

    values = [f"{e} AS _ts{i + 1}" for i, e in enumerate(string_exprs)]
    values += [f"{e} AS _tj{i + 1}" for i, e in enumerate(json_exprs)]
    first = [name for name, _ in compiled.ctes].index("_checked") + 1
    bad = (f"json_object('reason', 'missing field(s) the {compiled.profile.name} profile requires: ' || {columns(missing)})")
    head = [
        ("_raw", read),
        ("_paths", "SELECT CAST(NULL AS BIGINT) AS _line, " + ", ".join(values or ["NULL AS _ts0"]) + " FROM _raw"),
        ("_checked0", f"SELECT *, ({columns(ok)}) AS _ok FROM _paths"),
        ("_checked", f"SELECT *, CASE WHEN NOT _ok THEN {bad} END AS _bad FROM _checked0"),
    ]
    compiled.ctes = head + [(name, columns(body)) for name, body in compiled.ctes[first:]]
    compiled.final_columns = {k: columns(v) for k, v in compiled.final_columns.items()}
    compiled.run_expr = columns(compiled.run_expr)
    compiled.typed = True


def compile_profile(profile: Profile, opts: CompileOptions) -> CompiledProfile:
    """Turn a profile into the CTE chain and final projection for one file (with opts.typed: the typed fast path
    where the profile allows it, else the line reader)."""
    if opts.typed:
        compiled = _compile(_without_document_calls(profile), opts)
        return compiled if compiled.typed else _compile(profile, replace(opts, typed=False))
    return _compile(profile, opts)


def _compile(profile: Profile, opts: CompileOptions) -> CompiledProfile:
    rw = _PathRewriter()
    columns = {name: rw.rewrite(expr) for name, expr in profile.columns.items()}
    text = {name: rw.rewrite(expr) for name, expr in profile.text.items()}
    attrs = {name: rw.rewrite(expr) for name, expr in profile.attrs.items()}
    lets = {name: rw.rewrite(expr) for name, expr in profile.let.items()}
    run_expr_profile = rw.rewrite(profile.run) if profile.run else None
    where_expr = rw.rewrite(profile.where) if profile.where else None
    # detect.must paths are required of every record; a profile that unwraps its own records ([unwrap]) names
    # the outer document's paths there instead (for sniffing), so its records are not held to them.
    must = list(profile.detect_must) if profile.reader in ("jsonl", "json") and not profile.unwrap else []
    must_refs = [rw.rewrite(f"j->>{sql_str(p)}") for p in must]
    zip_lists = {}
    for name, value in profile.explode_zip.items():
        if value.strip().startswith("$"):
            zip_lists[name] = f"coalesce(TRY_CAST(json_extract(j, {sql_str(value.strip())}) AS JSON[]), [])"
        else:
            zip_lists[name] = f"coalesce({rw.rewrite(value)}, [])"

    raw, is_json = _raw_source(profile, opts)
    ctes: list[tuple[str, str]] = [("_raw", raw)]
    if is_json:
        for n, (kind, path) in enumerate(unwrap_steps(profile, opts)):
            ctes[-1] = (f"_raw{n}", ctes[-1][1])
            ctes.append(("_raw", _unwrap_sql(kind, path, f"_raw{n}")))
        # Each line is parsed once: the multi-path extraction itself, inside try() so a line that is not JSON gives
        # NULL instead of failing the file (json_valid first would parse every line twice). "Is an object" is read
        # from the first character. There is no WHERE (DuckDB would push it below the parse): blank lines come out
        # as bad rows marked 'blank' and the ingester drops them.
        string_paths = rw.paths.get(("j", "s"), [])
        listed = "[" + ", ".join(sql_str(p) for p in string_paths or ["$"]) + "]"
        ctes.append((
            "_typed",
            f"SELECT _line, coalesce(_text, '') AS _text, try(json_extract_string(_text, {listed})) AS _js FROM _raw",
        ))
        is_object = "(_js IS NOT NULL AND (starts_with(_text, '{') OR regexp_matches(_text, '^\\s*\\{')))"
        if profile.explode_path and profile.explode_path.startswith("$["):
            # A profile that explodes a top-level array (explode.path "$[*]", e.g. an API answer that is a JSON
            # list of rows) takes an array as its document.
            is_object = "(_js IS NOT NULL AND (starts_with(_text, '{') OR starts_with(_text, '[') OR regexp_matches(_text, '^\\s*[\\{\\[]')))"
        ctes.append((
            "_valid",
            f"SELECT _line, _text, _js, {is_object} AS _parsed, CASE WHEN {is_object} THEN _text END AS j FROM _typed",
        ))
        json_cols = [c for c in rw.columns("j", "_parsed") if c.endswith(" AS _jj")]
        ctes.append(("_paths", "SELECT *" + "".join(", " + c for c in json_cols) + " FROM _valid"))
        if must_refs:
            ok = "_parsed AND " + " AND ".join(f"({ref}) IS NOT NULL" for ref in must_refs)
            missing = "array_to_string(list_filter([" + ", ".join(
                f"CASE WHEN ({ref}) IS NULL THEN {sql_str(p)} END" for ref, p in zip(must_refs, must)
            ) + "], lambda v: v IS NOT NULL), ', ')"
        else:
            ok, missing = "_parsed", "''"
        reason = (
            "CASE WHEN trim(_text) = '' THEN 'blank' "
            "WHEN NOT json_valid(_text) THEN CASE WHEN left(ltrim(_text), 1) IN ('{', '[') AND "
            "right(rtrim(_text), 1) NOT IN ('}', ']') THEN 'invalid JSON: the line ends before the value does "
            "(truncated?)' ELSE 'invalid JSON' END "
            "WHEN NOT _parsed THEN 'a JSON ' || lower(json_type(_text)) || ', not an object' "
            f"ELSE 'missing field(s) the {profile.name} profile requires: ' || {missing} END"
        )
        ctes.append(("_checked0", f"SELECT *, ({ok}) AS _ok FROM _paths"))
        # What a bad line looks like is worked out here, so the raw text need not travel further.
        ctes.append(("_checked", f"SELECT * EXCLUDE (_text), CASE WHEN NOT _ok THEN {_bad_info(reason, opts)} END AS _bad FROM _checked0"))
        last = "_checked"
    elif profile.reader == "lines":
        ctes.extend(_line_records(profile))
        last = "_checked"
    else:
        ctes.append(("_checked", "SELECT *, true AS _ok, CAST(NULL AS JSON) AS _bad FROM _raw"))
        last = "_checked"

    if lets:
        packed = ", ".join(f"{name} := ({expr})" for name, expr in lets.items())
        ctes.append(("_let", f"SELECT *, CASE WHEN _ok THEN struct_pack({packed}) END AS d FROM {last}"))
        last = "_let"

    if profile.explode_path:
        ctes.append((
            "_lists",
            f"SELECT *, CASE WHEN _ok THEN coalesce(TRY_CAST(json_extract(j, {sql_str(profile.explode_path)}) AS JSON[]), []) "
            f"ELSE [NULL] END AS _elist FROM {last}",
        ))
        ctes.append((
            "_explode",
            "SELECT * EXCLUDE (_elist), unnest(_elist) AS e, unnest(range(1, len(_elist) + 1)) AS _i FROM _lists",
        ))
        element_cols = rw.columns("e", "_ok")
        ctes.append(("_elements", "SELECT *" + "".join(", " + c for c in element_cols) + " FROM _explode"))
        last = "_elements"
    elif zip_lists:
        lists = ", ".join(f"CASE WHEN _ok THEN {expr} ELSE [NULL] END AS _z_{name}" for name, expr in zip_lists.items())
        ctes.append(("_lists", f"SELECT *, {lists} FROM {last}"))
        longest = "greatest(" + ", ".join(f"len(_z_{n})" for n in zip_lists) + ")" if len(zip_lists) > 1 else f"len(_z_{next(iter(zip_lists))})"
        unnests = ", ".join(f"unnest(_z_{n}) AS _u_{n}" for n in zip_lists)
        excluded = ", ".join(f"_z_{n}" for n in zip_lists)
        ctes.append((
            "_explode",
            f"SELECT * EXCLUDE ({excluded}), {unnests}, unnest(range(1, {longest} + 1)) AS _i FROM _lists",
        ))
        packed = ", ".join(f"{n} := _u_{n}" for n in zip_lists)
        ctes.append(("_elements", f"SELECT *, struct_pack({packed}) AS x FROM _explode"))
        last = "_elements"
    else:
        ctes.append(("_elements", f"SELECT *, CAST(NULL AS BIGINT) AS _i FROM {last}"))
        last = "_elements"

    # Stage 1: the profile's own expressions, cast to canonical types; NULL for what it does not map.
    s1 = ["_line", "_ok", "_bad", "_i"]
    time_macros = time_macros_of(profile.macros)
    for column in MAPPABLE_COLUMNS:
        sqltype = REQUEST_COLUMNS[column]
        if column in columns:
            expr = f"TRY_CAST({_try(columns[column], opts)} AS {sqltype})"
            if column in TIME_COLUMNS:
                expr = _time_adjust(profile, expr, opts)
                # the twins that tell an unreadable time from an absent one, and an epoch in a larger unit
                s1.append(f"CASE WHEN _ok THEN ({_try(present_twin(columns[column], time_macros), opts)}) "
                          f"IS NOT NULL ELSE false END AS _present_{column}")
                scaled = scaled_twin(columns[column])
                s1.append(f"CASE WHEN _ok THEN ({_try(scaled, opts)}) IS NOT NULL ELSE false END AS _scaled_{column}"
                          if scaled else f"false AS _scaled_{column}")
            s1.append(f"CASE WHEN _ok THEN {expr} END AS {column}")
        else:
            s1.append(f"CAST(NULL AS {sqltype}) AS {column}")
            if column in TIME_COLUMNS:
                s1 += [f"false AS _present_{column}", f"false AS _scaled_{column}"]
    for name in ("prompt", "content", "reasoning"):
        if name in text:
            s1.append(f"CASE WHEN _ok THEN CAST({_try(text[name], opts)} AS VARCHAR) END AS _{name}")
        else:
            s1.append(f"CAST(NULL AS VARCHAR) AS _{name}")
    if attrs:
        s1.append("CASE WHEN _ok THEN json_object(" + ", ".join(f"{sql_str(k)}, {_try(v, opts)}" for k, v in attrs.items()) + ") END AS _attrs")
    else:
        s1.append("CAST(NULL AS JSON) AS _attrs")
    s1.append(f"CASE WHEN _ok THEN CAST(({run_expr_profile}) AS VARCHAR) END AS _run_profile" if run_expr_profile
              else "CAST(NULL AS VARCHAR) AS _run_profile")
    # The profile's row filter: a record it rejects is neither a row nor a bad line (bad lines are kept).
    keep = f"coalesce(CAST({_try(where_expr, opts)} AS BOOLEAN), false)" if where_expr else "true"
    s1.append(f"CASE WHEN _ok THEN {keep} ELSE true END AS _keep")
    ctes.append(("_s1", "SELECT " + ",\n  ".join(s1) + f" FROM {last}"))

    # Stage 2: the time split, derived only from what is there. TTFT never comes from e2e.
    ctes.append(("_s2", """SELECT * REPLACE (
  coalesce(e2e_s, epoch(t_end - t_arrival)) AS e2e_s,
  coalesce(t_end, t_arrival + to_microseconds(CAST(round(e2e_s * 1e6) AS BIGINT))) AS t_end,
  coalesce(ttft_s, epoch(t_first_token - t_arrival)) AS ttft_s,
  coalesce(t_first_token, t_arrival + to_microseconds(CAST(round(ttft_s * 1e6) AS BIGINT))) AS t_first_token
) FROM _s1"""))
    ctes.append(("_s3", """SELECT * REPLACE (
  coalesce(decode_s, CASE WHEN e2e_s >= ttft_s THEN e2e_s - ttft_s END) AS decode_s
) FROM _s2"""))
    ctes.append(("_s4", """SELECT * REPLACE (
  coalesce(tpot_s, CASE WHEN completion_tokens > 1 AND decode_s IS NOT NULL THEN decode_s / (completion_tokens - 1) END) AS tpot_s
) FROM _s3"""))
    last = "_s4"
    # With lines numbered by insert order, windowed [derived] columns are set after the insert (after_insert_sql).
    derived = {col: expr for col, expr in profile.derived.items()
               if not (opts.lines_by_insert_order and col in _windowed(profile))}
    if derived:
        replaced = ", ".join(
            f"coalesce({col}, TRY_CAST({_try(expr, opts)} AS {REQUEST_COLUMNS[col]})) AS {col}"
            for col, expr in derived.items()
        )
        ctes.append(("_s5", f"SELECT * REPLACE ({replaced}) FROM _s4"))
        last = "_s5"
    # Normalised once here, not once per use in the final projection.
    ctes.append(("_norm", f"SELECT *, lower(trim(finish_reason)) AS _fr FROM {last}"))
    ctes.append(("_last", f"SELECT *, {_STATUS_SQL} AS _status FROM _norm"))

    final = _final_columns(profile, opts)
    if opts.run is not None:
        run_expr = sql_str(opts.run)
    else:
        run_expr = f"coalesce({one_line_sql('_run_profile')}, {sql_str(opts.default_run)})"  # a label from a log
    macros = dict(BUILTIN_MACROS)
    if not opts.keep_text:
        # Without --keep-text only the first 2,048 characters of a prompt are used (prefix_key): cut each message
        # before joining them (same first 2,048 characters, far less copying of long prompts).
        params, body = macros["sl_chat_text"]
        macros["sl_chat_text"] = (params, body.replace("ELSE coalesce(m.content, '') END",
                                                       f"ELSE coalesce(left(m.content, {PREFIX_CHARS}), '') END"))
        params, body = macros["sl_chat_text_at"]
        macros["sl_chat_text_at"] = (params, body.replace("ELSE coalesce(m[2], '') END",
                                                          f"ELSE coalesce(left(m[2], {PREFIX_CHARS}), '') END"))
    # Whether the text is kept (--keep-text): a profile may take a cheaper path to the prompt's prefix when it is not.
    macros["sl_keep_text"] = ([], "true" if opts.keep_text else "false")
    macros.update(profile.macros)
    macros.update(macro_twins(profile.macros, time_macros))
    compiled = CompiledProfile(profile=profile, ctes=ctes, final_columns=final, run_expr=run_expr, macros=macros,
                               lines_by_insert_order=opts.lines_by_insert_order,
                               json_paths=list(rw.paths.get(("j", "s"), [])) if is_json else [])
    if opts.typed:
        typed = _typed_read(profile, opts, rw, must_refs, must)
        if typed is not None:
            _use_typed_read(compiled, *typed)
    return compiled


_STATUS_SQL = (
    "CASE WHEN status IS NULL THEN CASE WHEN coalesce(http_status >= 400 OR error_type IS NOT NULL "
    "OR error_message IS NOT NULL OR _fr IN ('error', 'failed', 'failure', 'exception'), false) THEN 'error' ELSE 'ok' END "
    "WHEN lower(trim(status)) IN ('ok', 'success', 'succeeded', 'successful', 'true', '200', 'unset') "
    "THEN 'ok' ELSE 'error' END"
)


def _finish_reason_sql(raw: str, is_error: str) -> str:
    """`raw` is already lower-cased and trimmed."""
    whens = " ".join(
        f"WHEN {raw} IN ({', '.join(sql_str(v) for v in values)}) THEN {sql_str(norm)}"
        for norm, values in _FINISH_MAP.items()
    )
    return f"CASE WHEN {raw} IS NULL THEN CASE WHEN {is_error} THEN 'error' END {whens} ELSE 'unknown' END"


def _bad_info(reason: str, opts: CompileOptions) -> str:
    """JSON describing a bad line: reason, byte length, keys seen, and (--keep-text) a redacted excerpt."""
    keys_seen = (
        "CASE WHEN _parsed THEN array_to_string(json_keys(_text)[1:40], ',') "
        "WHEN NOT json_valid(_text) THEN nullif(array_to_string(list_filter(@KEYS@, lambda k, i: list_position(@KEYS@, k) = i)[1:40], ','), '') END"
    )
    # Keys of a line that is not valid JSON: the quoted names before a colon, in order of appearance.
    keys_seen = keys_seen.replace("@KEYS@", "regexp_extract_all(left(_text, 65536), '\"([A-Za-z0-9_.:@-]{1,64})\"\\s*:', 1)")
    excerpt = f"{redact_sql(f'left(_text, {EXCERPT_BYTES})')}" if opts.keep_text else "NULL"
    return (
        f"json_object('reason', {reason}, 'byte_length', octet_length(encode(_text)), "
        f"'keys_seen', {keys_seen}, 'excerpt', {excerpt})"
    )


def _final_columns(profile: Profile, opts: CompileOptions) -> dict[str, str]:
    """Expressions over _last for every canonical column except run and source_id."""
    out: dict[str, str] = {}
    for column in REQUEST_COLUMNS:
        if column in ("run", "source_id"):
            continue
        out[column] = column
    out["source_line"] = "_line"
    out["status"] = f"CASE WHEN NOT _ok THEN '{BAD_ROW_STATUS}' ELSE _status END"
    out["finish_reason"] = _finish_reason_sql("_fr", "_status = 'error'")
    out["finish_reason_raw"] = "coalesce(finish_reason_raw, finish_reason)"
    # Truncate before redacting (bounded regex work), redact, then cut to the stored length.
    out["error_message"] = f"left({redact_sql(f'left(error_message, {ERROR_MESSAGE_CHARS * 4})')}, {ERROR_MESSAGE_CHARS})"
    out["error_type"] = f"left({redact_sql('error_type')}, 200)"
    out["prefix_key"] = f"coalesce(prefix_key, left(md5(left(_prompt, {PREFIX_CHARS})), 16))"
    out["content_empty"] = "coalesce(content_empty, trim(_content) = '')"
    # Every marker has one of these characters: a cheap search first, the regex only where one occurs.
    prefilter = "(contains({0}, '<') OR contains({0}, '[') OR contains({0}, '◁'))"
    out["content_has_reasoning_marker"] = (
        f"coalesce(content_has_reasoning_marker, CASE WHEN _content IS NOT NULL THEN {prefilter.format('_content')} "
        f"AND regexp_matches(_content, {sql_str(REASONING_MARKERS)}) END)"
    )
    out["reasoning_present"] = (
        "coalesce(reasoning_present, CASE WHEN reasoning_tokens > 0 THEN true ELSE trim(_reasoning) <> '' END)"
    )
    out["reasoning_has_marker"] = (
        f"coalesce(reasoning_has_marker, CASE WHEN _reasoning IS NOT NULL THEN {prefilter.format('_reasoning')} "
        f"AND regexp_matches(_reasoning, {sql_str(REASONING_MARKERS)}) END)"
    )
    attrs = ("CASE WHEN _i IS NOT NULL THEN coalesce(json_merge_patch(_attrs, json_object('index', _i)), "
             "json_object('index', _i)) ELSE _attrs END")
    # A time that is there but does not read, or an epoch read in a larger unit, is named in attrs (times.py).
    unparsed = [f"_present_{c} AND {c} IS NULL" for c in TIME_COLUMNS]
    converted = [f"_scaled_{c} AND {c} IS NOT NULL" for c in TIME_COLUMNS]

    def named(tests: list[str]) -> str:
        names = ", ".join(f"CASE WHEN {t} THEN '{c}' END" for t, c in zip(tests, TIME_COLUMNS))
        return f"list_filter([{names}], lambda x: x IS NOT NULL)"

    noted = (f"json_merge_patch(coalesce({attrs}, JSON '{{}}'), "
             f"json_merge_patch(CASE WHEN {' OR '.join(unparsed)} THEN json_object('unparsed_times', {named(unparsed)}) "
             f"ELSE JSON '{{}}' END, CASE WHEN {' OR '.join(converted)} THEN json_object('converted_times', "
             f"{named(converted)}) ELSE JSON '{{}}' END))")
    out["attrs"] = (f"CASE WHEN NOT _ok THEN _bad WHEN {' OR '.join(unparsed + converted)} THEN {noted} "
                    f"ELSE {attrs} END")
    for name in ("prompt", "content", "reasoning"):
        out[f"{name}_text"] = f"_{name}" if opts.keep_text else "CAST(NULL AS VARCHAR)"
    return out


def filled_columns(profile: Profile) -> list[str]:
    """The canonical columns a profile can fill (mapped, derived generically, or computed from its text)."""
    have = set(profile.columns) | set(profile.derived)
    have |= {"run", "source_id", "source_line", "status"}
    if "finish_reason" in have:
        have.add("finish_reason_raw")
    if {"t_end", "t_arrival"} <= have or "e2e_s" in have:
        have.add("e2e_s")
    if {"t_arrival", "e2e_s"} <= have:
        have.add("t_end")
    if {"t_first_token", "t_arrival"} <= have:
        have.add("ttft_s")
    if {"t_arrival", "ttft_s"} <= have:
        have.add("t_first_token")
    if {"e2e_s", "ttft_s"} <= have:
        have.add("decode_s")
    if {"decode_s", "completion_tokens"} <= have:
        have.add("tpot_s")
    if "prompt" in profile.text:
        have.add("prefix_key")
    if "content" in profile.text:
        have |= {"content_empty", "content_has_reasoning_marker"}
    if "reasoning" in profile.text:
        have |= {"reasoning_present", "reasoning_has_marker"}
    if profile.attrs or profile.explode_path or profile.explode_zip:
        have.add("attrs")
    return [c for c in REQUEST_COLUMNS if c in have]
