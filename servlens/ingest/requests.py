"""Ingest one request-log file with one profile: compile, insert, keep bad lines, all in one transaction.

DuckDB does the row work (one INSERT ... SELECT per file); Python only decides runs and sources and reads counts.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import duckdb

from servlens.errors import ConfigError, InputError
from servlens.escape import CONTROL_SQL, one_line, one_line_sql
from servlens.ingest import sources as src
from servlens.ingest.compiler import (
    BAD_ROW_STATUS,
    MAX_LINE_BYTES,
    CompileOptions,
    can_number_by_insert_order,
    compile_profile,
    line_longest,
    line_reader_sql,
    sql_str,
)
from servlens.ingest.profiles import Profile, Wrapper
from servlens.redact import redact_candidate_sql, redact_sql
from servlens.sandbox import check_csv_options, check_user_expression, check_user_query
from servlens.store.schema import REQUEST_COLUMNS

# Columns reported as "filled" (the bookkeeping ones are always there).
COVERAGE_COLUMNS = [
    c for c in REQUEST_COLUMNS
    if c not in ("run", "source_id", "source_line", "prompt_text", "content_text", "reasoning_text")
]


@dataclass
class SourceResult:
    """What happened to one file (possibly several runs, when the file names its runs)."""

    path: str
    format: str
    kind: str = "requests"
    runs: list[str] = field(default_factory=list)
    source_ids: list[int] = field(default_factory=list)
    rows: int = 0
    bad_lines: int = 0
    skipped: bool = False  # same content already in the run(s)
    replaced: bool = False  # a changed file at the same path replaced its rows
    t_min: datetime | None = None
    t_max: datetime | None = None
    relative_clock: bool = False
    columns_filled: dict[str, float] = field(default_factory=dict)  # column -> share of rows with a value
    first_errors: list[dict] = field(default_factory=list)
    note: str | None = None
    invalid_values: dict[str, int] = field(default_factory=dict)  # column -> values stored as NULL (impossible)
    unparsed_times: dict[str, int] = field(default_factory=dict)  # column -> times there that did not read (NULL)
    converted_times: dict[str, int] = field(default_factory=dict)  # column -> epochs read in a larger unit
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {
            "path": self.path,
            "format": self.format,
            "kind": self.kind,
            "run": self.runs[0] if len(self.runs) == 1 else self.runs,
            "runs": self.runs,
            "rows": self.rows,
            "bad_lines": self.bad_lines,
            "skipped": self.skipped,
            "replaced": self.replaced,
            "t_min": _iso(self.t_min),
            "t_max": _iso(self.t_max),
            "relative_clock": self.relative_clock,
            "columns_filled": self.columns_filled,
            "errors": self.first_errors,
        }
        if self.note:
            out["note"] = self.note
        if self.invalid_values:
            out["invalid_values"] = self.invalid_values
        if self.unparsed_times:
            out["unparsed_times"] = self.unparsed_times
        if self.converted_times:
            out["converted_times"] = self.converted_times
        out.update(self.extra)
        return out


def _iso(value) -> str | None:
    """A time as ISO text; DuckDB hands a timestamp beyond Python's datetime (year > 9999) over as text."""
    if value is None:
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


# Values no request can have (issue 15): they are stored as NULL, named in the row's attrs.invalid_values and
# counted per column in the ingest summary, so that one bad value never reaches a statistic or a window.
_DURATIONS = ("queue_s", "prefill_s", "ttft_s", "first_content_s", "tpot_s", "decode_s", "e2e_s")
_NOT_ZERO = ("ttft_s", "e2e_s")  # a request cannot answer in no time (a gateway cache hit excepted)
_TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens", "max_tokens", "context_window")
_TIMES = ("t_arrival", "t_first_token", "t_end")
MAX_DURATION_S = 7 * 24 * 3600.0  # a week: beyond it a "duration" is a unit mistake (ns or ms read as seconds)
MAX_TOKENS = 100_000_000_000
# Absolute clocks: a request logged before 2000 or after 2100 is a unit mistake (ms read as seconds) or garbage.
TIME_FLOOR, TIME_CEILING = "2000-01-01", "2100-01-01"


def _impossible_sql(column: str, relative_clock: bool) -> str:
    if column in _DURATIONS:
        zero = f" OR ({column} = 0 AND cache_hit IS NOT TRUE)" if column in _NOT_ZERO else ""
        return f"(isnan({column}) OR isinf({column}) OR {column} < 0 OR {column} > {MAX_DURATION_S}{zero})"
    if column in _TOKENS:
        return f"({column} < 0 OR {column} > {MAX_TOKENS})"
    floor = "" if relative_clock else f"{column} < TIMESTAMP '{TIME_FLOOR}' OR "
    return f"({floor}{column} >= TIMESTAMP '{TIME_CEILING}')"


def null_impossible_values(con: duckdb.DuckDBPyConnection, where: str, relative_clock: bool) -> dict[str, int]:
    """Store impossible values of the rows `where` selects as NULL (Infinity, NaN, 1e309, negative or zero
    durations, negative token counts, times after 2100, or before 2000 beside times in range on an absolute clock);
    return the count per column. A relative clock (offsets from 1970) is only checked against 2100."""
    columns = (*_DURATIONS, *_TOKENS, *_TIMES)
    if not relative_clock:
        # The floor applies to a file with some times in range: an outlier there is a mistake, while a file whose
        # times all sit before 2000 is a clock of its own (a synthetic or replayed trace) and is left as it is.
        relative_clock = not con.execute(
            f"SELECT count(*) FROM requests WHERE ({where}) AND t_arrival >= TIMESTAMP '{TIME_FLOOR}' "
            f"AND t_arrival < TIMESTAMP '{TIME_CEILING}'").fetchone()[0]
    tests = {c: f"coalesce({_impossible_sql(c, relative_clock)}, false)" for c in columns}
    counts = con.execute(
        f"SELECT {', '.join(f'count(*) FILTER ({t})' for t in tests.values())} FROM requests "
        f"WHERE ({where}) AND status <> '{BAD_ROW_STATUS}'"
    ).fetchone()
    found = {c: int(n) for c, n in zip(columns, counts) if n}
    if not found:
        return {}
    names = ", ".join(f"CASE WHEN {tests[c]} THEN '{c}' END" for c in found)
    sets = ", ".join(f"{c} = CASE WHEN {tests[c]} THEN NULL ELSE {c} END" for c in found)
    con.execute(
        f"UPDATE requests SET {sets}, attrs = json_merge_patch(coalesce(attrs, JSON '{{}}'), "
        f"json_object('invalid_values', list_filter([{names}], lambda x: x IS NOT NULL))) "
        f"WHERE ({where}) AND status <> '{BAD_ROW_STATUS}' AND ({' OR '.join(tests[c] for c in found)})"
    )
    return found


def count_time_notes(con: duckdb.DuckDBPyConnection, where: str) -> tuple[dict[str, int], dict[str, int]]:
    """Per column, the times of the rows `where` selects that were there but did not read (attrs.unparsed_times),
    and the epochs read in a larger unit than their field's (attrs.converted_times); servlens/ingest/times.py."""
    counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
    rows = con.execute(
        f"""SELECT kind, column_name, count(*) FROM (
              SELECT 0 AS kind, unnest(CAST(attrs->'$.unparsed_times' AS VARCHAR[])) AS column_name FROM requests
              WHERE ({where}) AND status <> '{BAD_ROW_STATUS}' AND (attrs->'$.unparsed_times') IS NOT NULL
              UNION ALL
              SELECT 1, unnest(CAST(attrs->'$.converted_times' AS VARCHAR[])) FROM requests
              WHERE ({where}) AND status <> '{BAD_ROW_STATUS}' AND (attrs->'$.converted_times') IS NOT NULL)
            GROUP BY ALL ORDER BY 1, 2""").fetchall()
    for kind, column, n in rows:
        counts[kind][column] = int(n)
    return counts


def _typed_rows_complete(con: duckdb.DuckDBPyConnection, inserted: str, job: _DigestJob) -> bool:
    """Whether the typed read's rows are the line reader's: one row per line of the file (read_json passes over a
    blank line, which the line reader counts, so the numbers would shift) and none lacking a required field (the
    line reader keeps such a line as a bad line, with the keys it saw)."""
    lines = job.lines()
    if lines is None or job.long_lines:
        return False
    rows, bad = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE status = '{BAD_ROW_STATUS}') FROM requests WHERE {inserted}"
    ).fetchone()
    return rows == lines and not bad


def _runs_in_file(con: duckdb.DuckDBPyConnection, compiled, default_run: str) -> list[str]:
    runs = [r[0] for r in con.execute(compiled.runs_sql()).fetchall() if r[0] is not None]
    return runs or [default_run]


def ingest_request_file(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    profile: Profile,
    *,
    run: str | None = None,
    keep_text: bool = False,
    strict: bool = False,
    start: datetime | None = None,
    tz: str | None = None,
    json_multiline: bool = False,
    safe: bool = False,
    wrapper: Wrapper | None = None,
    typed: bool = True,
    _digest: _DigestJob | None = None,
) -> SourceResult:
    """Ingest `path` with `profile` into the store. Same content in the same run is skipped; a changed file at the
    same path replaces that source's rows; everything for this file happens in one transaction.

    With `typed` a JSON-lines file is read by the typed fast path first (compiler._typed_read) where the profile
    allows it; its rows are kept only when the line reader could not have given other ones (no reader or conversion
    error, one row per line of the file, no line lacking a required field), else the file is read again by the
    line reader, which names every bad line."""
    path = Path(path).resolve()
    opts = CompileOptions(
        path=path,
        compression=src.compression_of(path),
        run=run,
        default_run=_stem(path),
        keep_text=keep_text,
        start=start,
        tz=tz,
        json_multiline=json_multiline,
        safe=safe,
        wrapper=wrapper,
    )
    # Lines are numbered by insert order where the profile allows it (one row per line, in line order).
    opts = replace(opts, lines_by_insert_order=can_number_by_insert_order(profile, opts))
    opts = replace(opts, typed=typed and not safe and opts.lines_by_insert_order)
    if not profile.builtin:
        check_csv_options(profile.name, profile.csv_options)
        for name, (_, body) in profile.macros.items():
            check_user_expression(body, f"Profile {profile.name}: macro {name}")
    compiled = compile_profile(profile, opts)
    if not profile.builtin:
        # the line reader is read_csv over the file; the typed fast path reads the same file with read_json
        reader = "read_parquet" if profile.reader == "parquet" else "read_json" if compiled.typed else "read_csv"
        check_user_query(compiled.select(source_id_sql="0", where_sql="true"), f"Profile {profile.name}",
                         readers={reader: src.duckdb_path(path)[1:-1].replace("''", "'")})
    relative = profile.clock == "relative" and start is None
    result = SourceResult(path=str(path), format=profile.name, relative_clock=relative)
    if wrapper is not None:
        result.extra["wrapper"] = wrapper.name
    for statement in compiled.macro_sql():
        try:
            con.execute(statement)
        except duckdb.Error as exc:
            raise ConfigError(f"Profile {profile.name}: a macro does not compile: {_first_line(exc)}") from exc

    # The file's sha256 (and line count) is computed in a thread while DuckDB reads the file; it is only awaited
    # before the insert when the run already holds a source of the same size (same content could be skipped).
    job = _digest or _DigestJob(path, line_longest(profile, opts))
    size = path.stat().st_size
    # Runs named inside the file are learnt from the rows once they are inserted (one pass over the file). Only when
    # this exact content was ingested before does a cheap pre-pass find its runs, to skip without inserting.
    learn_runs = run is None and profile.run is not None
    runs: list[str] | None = [run if run is not None else opts.default_run]
    retry = dict(run=run, keep_text=keep_text, strict=strict, start=start, tz=tz, json_multiline=json_multiline,
                 safe=True, wrapper=wrapper, typed=False, _digest=job)
    by_lines = dict(retry, safe=safe)  # the same file through the line reader (the typed read did not fit it)
    if learn_runs:
        runs = None
        seen = con.execute(
            "SELECT count(*) FROM sources WHERE kind = 'requests' AND path = ? AND size_bytes = ?", [str(path), size]
        ).fetchone()[0] and con.execute(
            "SELECT count(*) FROM sources WHERE kind = 'requests' AND path = ? AND sha256 = ?", [str(path), job.sha256()]
        ).fetchone()[0]
        if seen:
            try:
                runs = _runs_in_file(con, compile_profile(profile, replace(opts, typed=False)) if compiled.typed
                                     else compiled, opts.default_run)
            except _CONVERSION_ERRORS as exc:
                if safe:
                    raise _profile_error(profile, path, exc) from exc
                return _read_again(con, path, profile, retry)
            except duckdb.Error as exc:
                raise _profile_error(profile, path, exc) from exc

    # Inside a whole-ingest transaction (a folder, several files) this file's work is part of it (sources.py).
    joined = src.in_ingest_transaction(con)
    if not joined:
        con.execute("BEGIN TRANSACTION")
    try:
        ids: dict[str, int] = {}
        naive_tz = tz if profile.clock == "naive" else None
        if runs is not None:
            for label in runs:
                decision = src.decide_source(con, label, "requests", path, sha256=_digest_to_decide(con, label, size, job))
                if decision.action == "skip":
                    continue
                if decision.action == "replace":
                    src.delete_source(con, decision.old_source_id)
                    result.replaced = True
                src.ensure_run(con, label, relative_clock=relative, tz=naive_tz)
                ids[label] = src.insert_source(con, run=label, kind="requests", path=path, decision=decision,
                                               fmt=profile.name)
            result.runs = list(runs)
            if not ids:
                if not joined:
                    con.execute("ROLLBACK")  # nothing was written
                result.skipped = True
                result.note = "already ingested: same content in the same run(s); nothing added"
                _fill_from_existing(con, result, runs, path)
                return result
            first_id = next(iter(ids.values()))
            source_sql = "CASE _run " + " ".join(f"WHEN {sql_str(k)} THEN {v}" for k, v in ids.items()) + f" ELSE {first_id} END"
            where = "_run IN (" + ", ".join(sql_str(k) for k in ids) + ")"
        else:
            # A provisional source holds every row until the runs are known.
            pending = src.SourceDecision("new", _PENDING_SHA256, size)
            first_id = src.insert_source(con, run=_PENDING_RUN, kind="requests", path=path, decision=pending,
                                         fmt=profile.name)
            source_sql, where = str(first_id), "true"
        con.execute("DROP TABLE IF EXISTS _sl_csv_rejects; DROP TABLE IF EXISTS _sl_csv_reject_scans")
        # Numbering lines by insert order needs every row the query yields to be inserted: with a run of the file
        # skipped (same content already stored), row_number() numbers them instead.
        if opts.lines_by_insert_order and runs is not None and len(ids) != len(runs):
            compiled = compile_profile(profile, replace(opts, lines_by_insert_order=False, typed=False))
        sql = compiled.select(source_id_sql=source_sql, where_sql=where)
        inserted = f"source_id IN ({', '.join(str(v) for v in ids.values())})" if ids else f"source_id = {first_id}"
        try:
            con.execute(f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)})\n{sql}")
        except duckdb.Error as exc:
            if compiled.typed:
                # Whatever read_json or a cast refused (a bad line, a value of another type): the line reader decides.
                return _read_again(con, path, profile, by_lines, in_transaction=True)
            if not isinstance(exc, _CONVERSION_ERRORS):
                raise _profile_error(profile, path, exc) from exc
            fixed = _explicit_csv_dialect(profile, path, exc)
            if fixed is not None:
                # DuckDB's CSV sniffer gives up on a file whose last row has an unterminated quote: read it with
                # the dialect spelt out, so the good rows are rows and the broken one is a counted reject.
                return _read_again(con, path, fixed, retry, in_transaction=True)
            if opts.safe:
                raise _profile_error(profile, path, exc) from exc
            # A value an expression cannot convert: redo this file with every expression in try() (slower, exact).
            return _read_again(con, path, profile, retry, in_transaction=True)
        if compiled.typed and not _typed_rows_complete(con, inserted, job):
            return _read_again(con, path, profile, by_lines, in_transaction=True)
        result.extra["reader"] = "typed" if compiled.typed else "lines"
        for statement in compiled.after_insert_sql(inserted):
            con.execute(statement)
        redact_rows(con, inserted)
        result.invalid_values = null_impossible_values(con, inserted, relative_clock=profile.clock == "relative")
        result.unparsed_times, result.converted_times = count_time_notes(con, inserted)
        if runs is None:
            ids = _assign_learnt_runs(con, result, path, profile, first_id, job.sha256(), relative, naive_tz)
            if not ids:
                if joined:
                    src.delete_source(con, first_id)  # the provisional source and what is left of its rows
                else:
                    con.execute("ROLLBACK")
                result.skipped = True
                result.note = "already ingested: same content in the same run(s); nothing added"
                _fill_from_existing(con, result, result.runs, path)
                return result
            first_id = next(iter(ids.values()))
        id_list = ", ".join(str(v) for v in ids.values())
        con.execute(
            f"""INSERT INTO ingest_errors (source_id, path, line, byte_length, reason, keys_seen, excerpt)
            SELECT source_id, ?, source_line, CAST(attrs->>'$.byte_length' AS BIGINT), attrs->>'$.reason',
                   attrs->>'$.keys_seen', attrs->>'$.excerpt'
            FROM requests WHERE source_id IN ({id_list}) AND status = '{BAD_ROW_STATUS}'
              AND attrs->>'$.reason' <> 'blank'""",
            [str(path)],
        )
        con.execute(f"DELETE FROM requests WHERE source_id IN ({id_list}) AND status = '{BAD_ROW_STATUS}'")
        if profile.reader != "parquet":
            if profile.reader != "csv" and job.lines() is not None and job.long_lines:
                _add_long_line_rejects(con, job.long_lines)
            _move_csv_rejects(con, list(ids.values()), path, keep_text, lines=profile.reader != "csv")
        redact_errors(con, f"source_id IN ({id_list})")
        file_lines = job.lines()
        if file_lines is not None and profile.reader in ("jsonl", "json") and not json_multiline:
            _check_every_line_read(con, list(ids.values()), path, opts.compression, line_longest(profile, opts),
                                   file_lines)
        # Sources decided before the hash was ready get it now, inside the transaction.
        con.execute(f"UPDATE sources SET sha256 = ? WHERE source_id IN ({id_list}) AND sha256 = ?",
                    [job.sha256(), _PENDING_SHA256])
        for source_id in ids.values():
            src.update_source_counts(con, source_id)
        bad = con.execute(f"SELECT count(*) FROM ingest_errors WHERE source_id IN ({id_list})").fetchone()[0]
        if strict and bad:
            first = con.execute(
                f"SELECT line, reason FROM ingest_errors WHERE source_id IN ({id_list}) ORDER BY line NULLS FIRST LIMIT 1"
            ).fetchone()
            if not joined:
                con.execute("ROLLBACK")
            where_line = f"line {first[0]}" if first[0] is not None else "the file"
            raise InputError(
                f"{path} has {bad} malformed line(s) (first: {where_line}: {first[1]}); --strict keeps nothing from it",
                "Fix the lines, or drop --strict to ingest the good lines and keep the bad ones in ingest_errors",
            )
        if not joined:
            con.execute("COMMIT")
    except BaseException:
        if not joined:  # else the whole ingest rolls back
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
        raise
    result.runs = list(ids)
    result.source_ids = list(ids.values())
    _fill_counts(con, result)
    return result


# Text columns a secret can reach (an api_base in attrs, a key in an error, a token pasted as a user id). Not the
# run label (sources and runs key on it; it comes from --run or the file name) nor the values servlens computes.
_REDACTED_COLUMNS = [c for c, t in REQUEST_COLUMNS.items()
                     if t in ("VARCHAR", "JSON") and c not in ("run", "status", "finish_reason", "prefix_key")]
_MULTILINE_COLUMNS = ("prompt_text", "content_text", "reasoning_text", "error_message")


def redact_rows(con: duckdb.DuckDBPyConnection, where: str) -> None:
    """Redact secrets in every text column and attrs of the rows `where` selects, and drop control characters
    from the one-line columns (a model name or request id cannot break a report line or reach the terminal as an
    ESC sequence). One UPDATE; rows without a candidate are not rewritten. Redacted attrs that would no longer be
    JSON are kept as a JSON string."""
    sets, candidates = [], []
    for column in _REDACTED_COLUMNS:
        kind = REQUEST_COLUMNS[column]
        text = f"CAST({column} AS VARCHAR)" if kind == "JSON" else column
        redacted = redact_sql(text)
        candidate = redact_candidate_sql(text)
        if kind == "JSON":
            redacted = f"CASE WHEN json_valid({redacted}) THEN CAST({redacted} AS JSON) ELSE to_json({redacted}) END"
        elif column not in _MULTILINE_COLUMNS:
            redacted = one_line_sql(redacted)
            candidate = f"({candidate} OR coalesce(regexp_matches({column}, '{CONTROL_SQL}'), false))"
        sets.append(f"{column} = CASE WHEN {candidate} THEN {redacted} ELSE {column} END")
        candidates.append(candidate)
    con.execute(f"UPDATE requests SET {', '.join(sets)} WHERE ({where}) AND ({' OR '.join(candidates)})")


def redact_errors(con: duckdb.DuckDBPyConnection, where: str) -> None:
    """The same for the ingest_errors rows of a source (their reason quotes the line; keys can be secrets)."""
    sets = ", ".join(f"{c} = {redact_sql(c)}" for c in ("reason", "keys_seen", "excerpt"))
    con.execute(f"UPDATE ingest_errors SET {sets} WHERE {where}")


class _DigestJob:
    """src.file_sha256_and_lines(path) in a thread: hashlib releases the GIL, so hashing overlaps DuckDB's read."""

    def __init__(self, path: Path, long_line: int | None = None) -> None:
        self._result: tuple[str, int | None] | None = None
        self._error: BaseException | None = None
        self.long_line = long_line
        self.long_lines: list[int] = []  # lines longer than long_line (DuckDB's reader drops them without a word)
        self._thread = threading.Thread(target=self._run, args=(path,), name="servlens-sha256", daemon=True)
        self._thread.start()

    def _run(self, path: Path) -> None:
        try:
            self._result = src.file_sha256_and_lines(path, long_line=self.long_line, long_lines=self.long_lines)
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> tuple[str, int | None]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def sha256(self) -> str:
        return self.result()[0]

    def lines(self) -> int | None:
        return self.result()[1]


# Stands for the file's sha256 in a sources row until the hash is ready (replaced before COMMIT; never matches a
# real digest, so decide_source with it can only answer 'new' or 'replace').
_PENDING_SHA256 = "pending"


def _digest_to_decide(con: duckdb.DuckDBPyConnection, run: str, size: int, job: _DigestJob) -> str:
    """The digest decide_source needs: the real one only when the run holds a requests source of this size (same
    content is then possible and must be skipped); otherwise no content can match, and the placeholder lets the
    insert start without waiting for the hash."""
    same_size = con.execute(
        "SELECT count(*) FROM sources WHERE run = ? AND kind = 'requests' AND size_bytes = ?", [run, size]
    ).fetchone()[0]
    return job.sha256() if same_size else _PENDING_SHA256


_CONVERSION_ERRORS = (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.OutOfRangeException)
_PENDING_RUN = "\x00pending"


def _assign_learnt_runs(con, result: SourceResult, path: Path, profile: Profile, pending_id: int, digest: str,
                        relative: bool, naive_tz: str | None) -> dict[str, int]:
    """Split the provisional source's rows into one source per run found in them (skip/replace decided per run)."""
    found = [r[0] for r in con.execute(
        "SELECT DISTINCT run FROM requests WHERE source_id = ? AND run IS NOT NULL ORDER BY 1", [pending_id]
    ).fetchall()]
    result.runs = found or [_stem(path)]
    ids: dict[str, int] = {}
    for label in result.runs:
        decision = src.decide_source(con, label, "requests", path, sha256=digest)
        if decision.action == "skip":
            con.execute("DELETE FROM requests WHERE source_id = ? AND run = ?", [pending_id, label])
            continue
        if decision.action == "replace":
            src.delete_source(con, decision.old_source_id)
            result.replaced = True
        src.ensure_run(con, label, relative_clock=relative, tz=naive_tz)
        if not ids:
            # the first run keeps the provisional source (and the bad lines, which have no run)
            con.execute("UPDATE sources SET run = ? WHERE source_id = ?", [label, pending_id])
            ids[label] = pending_id
        else:
            ids[label] = src.insert_source(con, run=label, kind="requests", path=path, decision=decision,
                                           fmt=profile.name)
            con.execute("UPDATE requests SET source_id = ? WHERE source_id = ? AND run = ?",
                        [ids[label], pending_id, label])
    return ids


def _read_again(con: duckdb.DuckDBPyConnection, path: Path, profile: Profile, retry: dict,
                in_transaction: bool = False) -> SourceResult:
    """Read the file again another way (`profile` with its dialect spelt out, every expression in try()). Its own
    transaction is rolled back first; inside a whole-ingest transaction, which the failed statement has aborted,
    the whole ingest starts again instead (sources.RestartIngest)."""
    if src.in_ingest_transaction(con):
        raise src.RestartIngest(path, dict(retry, profile=profile))
    if in_transaction:
        con.execute("ROLLBACK")
    return ingest_request_file(con, path, profile, **retry)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in src.COMPRESSED_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return one_line(Path(name).stem or name)  # a run label: no line breaks or ESC sequences from a file name


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_MISSING_COLUMN_RE = re.compile(r'Referenced column "((?:[^"]|"")*)" not found')


def _explicit_csv_dialect(profile: Profile, path: Path, exc: Exception) -> Profile | None:
    """The profile with the CSV dialect and columns spelt out (no sniffing), when sniffing is what failed."""
    if profile.reader != "csv" or "sniffing" not in str(exc) or "auto_detect" in profile.csv_options:
        return None
    import csv

    from servlens.ingest.sniff import read_head

    delim = str(profile.csv_options.get("delim", ","))
    quote = str(profile.csv_options.get("quote", '"'))
    head = read_head(path).decode("utf-8", "replace").splitlines()
    if not head or not profile.csv_options.get("header", True):
        return None
    header = next(csv.reader([head[0]], delimiter=delim[:1] or ",", quotechar=quote[:1] or '"'))
    if not header or len(set(header)) != len(header):
        return None
    options = dict(profile.csv_options, auto_detect=False, delim=delim, quote=quote,
                   escape=str(profile.csv_options.get("escape", quote)), columns=dict.fromkeys(header, "VARCHAR"))
    return replace(profile, csv_options=options)


def _profile_error(profile: Profile, path: Path, exc: Exception) -> Exception:
    full = src.disk_full_error(exc)
    if full is not None:  # not the profile's fault (issue 15)
        return full
    text = str(exc)
    if "Could not read" in text or "No files found" in text or "decompress" in text.lower() or "zstd" in text.lower():
        return InputError(f"Cannot read {path}: {_first_line(exc)}", "Check that the file is complete and not corrupted")
    origin = "your profile" if not profile.builtin else f"the built-in profile {profile.name}"
    missing = _MISSING_COLUMN_RE.search(text)
    if isinstance(exc, duckdb.BinderException) and missing and profile.reader in ("csv", "parquet"):
        # The file has other columns than the profile reads: a file in another format, not a broken profile.
        hint = ("Name the format that fits with --from NAME (see 'servlens formats'), or describe yours with --profile "
                "FILE (docs/profiles.md)") if profile.builtin else "Check the column names in your profile against the file's header"
        return InputError(f"{path} has no column \"{missing.group(1)}\", which {origin} reads", hint)
    return ConfigError(
        f"Reading {path} with {origin} failed: {_first_line(exc)}",
        "Check the profile's SQL expressions (docs/profiles.md), or pick another format with --from",
    )


def _check_every_line_read(con: duckdb.DuckDBPyConnection, source_ids: list[int], path: Path, compression: str | None,
                           longest: int, file_lines: int) -> None:
    """The lines DuckDB's reader gave (rows plus rejects) must be the file's lines, counted independently while
    hashing it: a reader that loses a line without a reject (it happened, see compiler.line_reader_sql) fails the file
    loudly instead of storing one request fewer and "0 bad lines".

    Lines are numbered as the reader emits them (plus its rejects), so a lost line lowers the last number: when the
    last line of the file is in the store (a row or a bad line) nothing was lost, at no cost. Otherwise (a blank last
    line, a last line of a skipped run) the reader's lines are counted again."""
    id_list = ", ".join(str(i) for i in source_ids)
    last = con.execute(
        f"SELECT max(line) FROM (SELECT max(source_line) AS line FROM requests WHERE source_id IN ({id_list}) "
        f"UNION ALL SELECT max(line) FROM ingest_errors WHERE source_id IN ({id_list}))"
    ).fetchone()[0]
    if last == file_lines:
        return
    read = con.execute(f"SELECT count(*) FROM {line_reader_sql(path, compression, longest, store_rejects=False)}").fetchone()[0]
    has_rejects = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = '_sl_csv_rejects'"
    ).fetchone()[0]
    if has_rejects:
        read += con.execute("SELECT count(DISTINCT line) FROM _sl_csv_rejects").fetchone()[0]
    if read != file_lines:
        raise InputError(
            f"{path} has {file_lines} lines but DuckDB's line reader gave {read}: nothing was kept from it, so that no "
            "line is silently lost",
            "Report this with the file's size and line endings; converting a lone \\r line ending to \\n may help",
        )


def _add_long_line_rejects(con: duckdb.DuckDBPyConnection, long_lines: list[int]) -> None:
    """Record the lines too long for the line reader as its rejects (it skips them without one), so each is a
    counted error with its line number and the lines after it keep theirs."""
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _sl_csv_rejects (line BIGINT, column_idx BIGINT, error_type VARCHAR, "
                "csv_line VARCHAR, error_message VARCHAR)")
    known = {r[0] for r in con.execute("SELECT DISTINCT line FROM _sl_csv_rejects").fetchall()}
    for line in long_lines:
        if line not in known:
            con.execute("INSERT INTO _sl_csv_rejects (line, column_idx, error_type, csv_line, error_message) "
                        "VALUES (?, 1, 'LINE SIZE OVER MAXIMUM', NULL, 'line too long')", [line])


def _move_csv_rejects(con: duckdb.DuckDBPyConnection, source_ids: list[int], path: Path, keep_text: bool,
                      lines: bool = False) -> None:
    """Rows the CSV reader rejected are kept in ingest_errors with their line number: CSV rows it could not split,
    or (`lines`: a JSON-lines file read as lines) a line too long or not UTF-8."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = '_sl_csv_rejects'"
    ).fetchone()[0]
    if not exists:
        return
    excerpt = redact_sql("left(csv_line, 200)") if keep_text else "NULL"
    reason = "error_type || ': ' || error_message"
    if lines:
        reason = (f"CASE WHEN error_type = 'LINE SIZE OVER MAXIMUM' THEN 'line longer than {MAX_LINE_BYTES // 1048576} MiB' "
                  "WHEN error_type = 'INVALID ENCODING' THEN 'not UTF-8 text' ELSE lower(error_type) || ': ' || error_message END")
    id_list = ", ".join(str(i) for i in source_ids)
    # Good and bad rows were numbered as they came out of the reader; shift them past each rejected line (few).
    for (line,) in con.execute("SELECT DISTINCT line FROM _sl_csv_rejects ORDER BY line").fetchall():
        for table, column in (("requests", "source_line"), ("ingest_errors", "line")):
            con.execute(f"UPDATE {table} SET {column} = {column} + 1 WHERE source_id IN ({id_list}) AND {column} >= ?",
                        [line])
    con.execute(
        f"""INSERT INTO ingest_errors (source_id, path, line, byte_length, reason, keys_seen, excerpt)
        SELECT ?, ?, line, CASE WHEN error_type <> 'LINE SIZE OVER MAXIMUM' THEN octet_length(encode(csv_line)) END,
               {reason}, NULL, {excerpt}
        FROM (SELECT *, row_number() OVER (PARTITION BY line ORDER BY column_idx) AS n FROM _sl_csv_rejects) WHERE n = 1""",
        [source_ids[0], str(path)],
    )


def _fill_counts(con: duckdb.DuckDBPyConnection, result: SourceResult) -> None:
    if not result.source_ids:
        return
    id_list = ", ".join(str(i) for i in result.source_ids)
    rows, bad, t_min, t_max = con.execute(
        f"SELECT sum(rows), sum(bad_lines), min(t_min), max(t_max) FROM sources WHERE source_id IN ({id_list})"
    ).fetchone()
    result.rows, result.bad_lines, result.t_min, result.t_max = int(rows or 0), int(bad or 0), t_min, t_max
    result.columns_filled = column_coverage(con, f"source_id IN ({id_list})") if result.rows else {}
    result.first_errors = [
        {"line": line, "reason": reason, "byte_length": length}
        for line, reason, length in con.execute(
            f"SELECT line, reason, byte_length FROM ingest_errors WHERE source_id IN ({id_list}) "
            "ORDER BY line NULLS FIRST LIMIT 5"
        ).fetchall()
    ]


def _fill_from_existing(con: duckdb.DuckDBPyConnection, result: SourceResult, runs: list[str], path: Path) -> None:
    ids = [
        r[0] for r in con.execute(
            "SELECT source_id FROM sources WHERE kind = 'requests' AND path = ? AND list_contains(?, run)",
            [str(path), runs],
        ).fetchall()
    ]
    result.source_ids = ids
    _fill_counts(con, result)


def column_coverage(con: duckdb.DuckDBPyConnection, where: str) -> dict[str, float]:
    """Share of rows (0..1, rounded) with a non-NULL value, for every canonical column that has any."""
    counts = ", ".join(f"count({c})" for c in COVERAGE_COLUMNS)
    row = con.execute(f"SELECT count(*), {counts} FROM requests WHERE {where}").fetchone()
    total = row[0] or 0
    if not total:
        return {}
    return {c: round(n / total, 4) for c, n in zip(COVERAGE_COLUMNS, row[1:]) if n}
