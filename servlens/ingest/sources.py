"""Finding input files and recording them as sources of a run.

Shared by request-log ingest and metrics ingest: expanding files, folders and globs; hashing a file; deciding
whether a file is new to a run, already there (skip), or changed at the same path (replace its rows).
"""

from __future__ import annotations

import atexit
import errno
import glob
import hashlib
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb

from servlens.errors import InputError

COMPRESSED_SUFFIXES = (".gz", ".zst")


# Connections (by id) inside ingest_transaction: the transactions of the files and steps in it join it.
_WHOLE_INGEST: set[int] = set()


class RestartIngest(Exception):
    """Raised inside a whole-ingest transaction where one file would have rolled its own transaction back to read
    the file again another way (a value only try() can read, a CSV dialect to spell out): DuckDB aborts a
    transaction on any error and has no savepoints, so the whole ingest rolls back and starts again, reading that
    file the other way from the start (`retry`: ingest_request_file keyword arguments)."""

    def __init__(self, path: Path, retry: dict) -> None:
        super().__init__(f"read {path} again")
        self.path = path
        self.retry = retry


@contextmanager
def ingest_transaction(con: duckdb.DuckDBPyConnection):
    """One transaction for a whole ingest call (every file of a folder, every scrape, the engine settings): a kill,
    Ctrl-C, a full disk or an error anywhere leaves the store as it was, never some of the files."""
    con.execute("BEGIN TRANSACTION")
    _WHOLE_INGEST.add(id(con))
    try:
        yield
    except BaseException:
        _WHOLE_INGEST.discard(id(con))
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    _WHOLE_INGEST.discard(id(con))
    con.execute("COMMIT")


_DISK_FULL = re.compile(r"(?i)no space left on device|file too large|disk quota exceeded|not enough space")
_FILE_IN_MESSAGE = re.compile(r'file "([^"]+)"')


def disk_full_error(exc: BaseException) -> InputError | None:
    """The one sentence for a write that failed because the disk (or the file size limit) is full, or None for any
    other error. Said after the ingest's transaction rolled back: the store holds what it held before."""
    errno_full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    if not errno_full and not _DISK_FULL.search(str(exc)):
        return None
    found = _FILE_IN_MESSAGE.search(str(exc))
    where = found.group(1) if found else getattr(exc, "filename", None)
    what = f"writing {where}" if where else "writing the store"
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _DISK_FULL.search(str(exc)).group(0)
    return InputError(f"The disk is full or the store reached the file size limit ({what} failed: {reason.lower()}): "
                      "nothing of this ingest was kept and the store holds what it held before",
                      "Free some space (or pass --db a store on another disk) and run the same command again")


def in_ingest_transaction(con: duckdb.DuckDBPyConnection) -> bool:
    return id(con) in _WHOLE_INGEST


@contextmanager
def one_transaction(con: duckdb.DuckDBPyConnection):
    """Commit what the block wrote, or roll all of it back if the block raises (an interrupted ingest leaves the
    store as it was). Inside ingest_transaction the block is part of that one transaction."""
    if in_ingest_transaction(con):
        yield
        return
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    con.execute("COMMIT")


_GLOB_CHARS = re.compile(r"([\[\]*?])")
_alias_dir: str | None = None
_aliases: dict[Path, str] = {}


def duckdb_path(path: Path | str) -> str:
    """`path` as a SQL string literal that DuckDB's readers open as that one file, never as a pattern.

    DuckDB expands `[ ] * ?` in every path it is given (`spend[1].csv` would read `spend1.csv`). Each such
    character is escaped as a one-character class (`[[]`); a path that also holds a backslash cannot be escaped
    that way (DuckDB's glob has no escape for it), so it is read through a symlink with a plain name instead."""
    text = str(path)
    if _GLOB_CHARS.search(text):
        if "\\" in text:
            text = _plain_alias(Path(text))
        else:
            text = _GLOB_CHARS.sub(r"[\1]", text)
    return "'" + text.replace("'", "''") + "'"


def _plain_alias(path: Path) -> str:
    """A symlink to `path` under a private temporary folder (removed at exit), named without glob characters and
    keeping the file's suffixes (DuckDB picks compression and format from them)."""
    global _alias_dir
    if path in _aliases:
        return _aliases[path]
    if _alias_dir is None:
        _alias_dir = tempfile.mkdtemp(prefix="servlens-paths-")
        atexit.register(shutil.rmtree, _alias_dir, True)
    suffixes = "".join(s for s in Path(path.name).suffixes if re.fullmatch(r"\.[A-Za-z0-9]{1,8}", s))
    alias = os.path.join(_alias_dir, f"{len(os.listdir(_alias_dir))}{suffixes}")
    os.symlink(path.resolve(), alias)
    _aliases[path] = alias
    return alias


def not_a_regular_file(path: Path) -> str | None:
    """Why `path` cannot be read as a file (a FIFO would block forever, a loop or a dangling link has no content),
    or None for a regular file (or a link to one) and a folder."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if os.path.islink(path):
            if exc.errno == errno.ELOOP:
                return "a symbolic link loop"
            return f"a symbolic link to nothing ({os.readlink(path)})"
        return None  # missing: the caller says so
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return kind


def expand_inputs(inputs: list[str] | tuple[str, ...],
                  skipped: list[dict] | None = None) -> list[tuple[Path, bool]]:
    """Expand files, folders and globs into files, sorted, each with whether the user named it directly.

    A file the user named directly must be readable by some profile (else exit 2); a file found inside a folder or
    by a glob that no profile recognises is listed as skipped instead (DESIGN.md Decisions, Ingest). Entries of a
    folder that are not regular files (FIFOs, sockets, symlink loops, dangling links) go to `skipped` with why.
    """
    found: list[tuple[Path, bool]] = []
    for item in inputs:
        path = Path(item)
        problem = not_a_regular_file(path)
        if problem:
            raise InputError(f"{item} is {problem}, not a file servlens can read", "Name a regular file or a folder")
        if path.is_file():
            found.append((path.resolve(), True))
        elif path.is_dir():
            files = []
            for p in sorted(path.rglob("*")):
                if _hidden(p.relative_to(path)):
                    continue
                problem = not_a_regular_file(p)
                if problem:
                    if skipped is not None:
                        skipped.append({"path": str(p.absolute()), "reason": problem})
                elif p.is_file():
                    files.append(p)
            found.extend((p.resolve(), False) for p in files)
        elif any(ch in item for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(item, recursive=True) if Path(m).is_file())
            if not matches:
                raise InputError(f"No file matches '{item}'", "Check the pattern, or quote it so the shell does not expand it")
            found.extend((m.resolve(), False) for m in matches)
        else:
            raise InputError(f"No such file or folder: {item}", "Check the path")
    seen: set[Path] = set()
    unique = []
    for path, named in found:
        if path not in seen:
            seen.add(path)
            unique.append((path, named))
    return unique


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def base_suffix(path: Path) -> str:
    """The file's format suffix with any compression suffix removed: 'x.jsonl.gz' -> '.jsonl'."""
    name = path.name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path(name).suffix


_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}


def compression_problem(path: Path) -> str | None:
    """Why a .gz / .zst file is not what its name says (e.g. gzip data named .zst), from its first bytes."""
    expected = compression_of(path)
    if expected is None:
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not head or head.startswith(_MAGIC[expected]):
        return None
    actual = next((name for name, magic in _MAGIC.items() if head.startswith(magic)), None)
    if actual:
        return f"named as {expected} but holds {actual} data"
    return f"named as {expected} but is not {expected} data"


def compression_of(path: Path) -> str | None:
    """'gzip', 'zstd' or None, from the file name."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    return None


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_sha256_and_lines(path: Path, chunk: int = 1 << 22, long_line: int | None = None,
                          long_lines: list[int] | None = None) -> tuple[str, int | None]:
    """The file's sha256 and its number of lines (a last line without a line break counts; a compressed file's lines
    are counted in its decompressed text), from one read. The count is independent of DuckDB's reader: the ingester
    checks what it read against it. None when a compressed file cannot be decompressed here (DuckDB will say why).

    With `long_line` (bytes, at least `chunk`), the numbers of the lines longer than that are appended to
    `long_lines`: DuckDB's line reader drops such a line without a reject, so the ingester records it itself."""
    digest = hashlib.sha256()
    since_break = 0  # bytes of the current line so far
    if long_line is not None:
        chunk = min(chunk, long_line)  # a longer line then always spans blocks: one check per block suffices
    compression = compression_of(path)
    lines, last = 0, b"\n"
    decompressor = None
    if compression == "gzip":
        import zlib

        decompressor = zlib.decompressobj(wbits=47)  # gzip or zlib header, concatenated members handled below
    elif compression == "zstd":
        import zstandard

        decompressor = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    try:
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                digest.update(block)
                if decompressor is not None and lines is not None:
                    text = decompressor.decompress(block)
                    while compression == "gzip" and decompressor.eof and decompressor.unused_data:
                        rest = decompressor.unused_data  # next gzip member
                        decompressor = zlib.decompressobj(wbits=47)
                        text += decompressor.decompress(rest)
                    block = text
                if block and lines is not None:
                    if long_line is not None and long_lines is not None:
                        first = block.find(b"\n")
                        if first < 0:
                            since_break += len(block)
                        else:
                            if since_break + first > long_line:
                                long_lines.append(lines + 1)
                            since_break = len(block) - block.rfind(b"\n") - 1
                    lines += block.count(b"\n")
                    last = block[-1:]
    except Exception:  # a corrupt archive: no count; the reader reports the file
        if decompressor is None:
            raise
        lines, digest = None, hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                digest.update(block)
    if lines is not None and last != b"\n":
        lines += 1
        if long_line is not None and long_lines is not None and since_break > long_line:
            long_lines.append(lines)
    return digest.hexdigest(), lines


@dataclass
class SourceDecision:
    """What to do with one file for one run."""

    action: str  # 'new' | 'skip' (same content already in the run) | 'replace' (same path, changed content)
    sha256: str
    size_bytes: int
    old_source_id: int | None = None


def decide_source(
    con: duckdb.DuckDBPyConnection, run: str, kind: str, path: Path, sha256: str | None = None
) -> SourceDecision:
    """Same content in the same run is skipped; a changed file at the same path replaces that source's rows.

    `sha256`: the file's digest when the caller already has it (one file, several runs: hash it once)."""
    sha = sha256 or file_sha256(path)
    size = path.stat().st_size
    same_content = con.execute(
        "SELECT source_id FROM sources WHERE run = ? AND kind = ? AND sha256 = ?", [run, kind, sha]
    ).fetchone()
    if same_content:
        return SourceDecision("skip", sha, size, same_content[0])
    same_path = con.execute(
        "SELECT source_id FROM sources WHERE run = ? AND kind = ? AND path = ?", [run, kind, str(path)]
    ).fetchone()
    if same_path:
        return SourceDecision("replace", sha, size, same_path[0])
    return SourceDecision("new", sha, size)


def delete_source(con: duckdb.DuckDBPyConnection, source_id: int) -> None:
    """Remove a source and every row that came from it (call inside the replacing transaction)."""
    for table in ("requests", "metric_samples", "ingest_errors"):
        con.execute(f"DELETE FROM {table} WHERE source_id = ?", [source_id])
    con.execute("DELETE FROM sources WHERE source_id = ?", [source_id])


def ensure_run(con: duckdb.DuckDBPyConnection, run: str, relative_clock: bool = False, tz: str | None = None) -> None:
    """Create the run if new; a run becomes relative-clock if any of its sources has no absolute clock."""
    con.execute(
        "INSERT INTO runs (run, relative_clock, tz) VALUES (?, ?, ?) ON CONFLICT (run) DO UPDATE SET "
        "relative_clock = runs.relative_clock OR excluded.relative_clock",
        [run, relative_clock, tz],
    )


def insert_source(
    con: duckdb.DuckDBPyConnection,
    *,
    run: str,
    kind: str,
    path: Path,
    decision: SourceDecision,
    fmt: str,
    time_source: str | None = None,
) -> int:
    """Insert the sources row (rows/bad_lines/time span filled later by update_source_counts); returns its id."""
    return con.execute(
        "INSERT INTO sources (run, kind, path, sha256, size_bytes, format, rows, bad_lines, time_source) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?) RETURNING source_id",
        [run, kind, str(path), decision.sha256, decision.size_bytes, fmt, time_source],
    ).fetchone()[0]


def update_source_counts(con: duckdb.DuckDBPyConnection, source_id: int) -> None:
    """Fill rows, bad_lines and the time span of a source from what landed in the store."""
    con.execute(
        """
        UPDATE sources SET
          rows = coalesce((SELECT count(*) FROM requests WHERE source_id = $id), 0)
               + coalesce((SELECT count(*) FROM metric_samples WHERE source_id = $id), 0),
          bad_lines = (SELECT count(*) FROM ingest_errors WHERE source_id = $id),
          t_min = least((SELECT min(t_arrival) FROM requests WHERE source_id = $id),
                        (SELECT min(ts) FROM metric_samples WHERE source_id = $id)),
          t_max = greatest((SELECT max(coalesce(t_end, t_arrival)) FROM requests WHERE source_id = $id),
                           (SELECT max(ts) FROM metric_samples WHERE source_id = $id))
        WHERE source_id = $id
        """,
        {"id": source_id},
    )
