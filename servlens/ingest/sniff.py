"""Recognising a file: which profile reads it best, judged from its first lines or its header.

Sniffing reads a bounded sample (the first lines of a JSON-lines file, a JSON document up to 64 MiB, a CSV header) and
scores each profile: its detect.must paths present (and must_not absent) in most sampled records, plus its
detect.may paths, a file-name match and its priority. Only the sample is parsed in Python; rows are DuckDB's job.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from servlens.ingest.profiles import WRAPPERS, Profile, Wrapper
from servlens.ingest.sources import base_suffix, compression_of, duckdb_path

SAMPLE_LINES = 50
HEAD_BYTES = 4 * 1024 * 1024
WHOLE_JSON_BYTES = 64 * 1024 * 1024
MATCH_SHARE = 0.5  # a profile must fit at least half the sampled records


@dataclass
class FileSample:
    """What sniffing saw of one file."""

    shape: str | None  # 'jsonl' | 'json' | 'csv' | 'parquet' | 'text' | 'binary' | None (empty)
    records: list = field(default_factory=list)  # parsed JSON values (jsonl lines or json documents)
    header: list[str] = field(default_factory=list)  # CSV / Parquet column names
    json_multiline: bool = False  # one JSON document over many lines
    lines: list[str] = field(default_factory=list)  # text: the first lines (for line-reader profiles)
    problem: str | None = None  # why nothing could be sampled


@dataclass
class SniffResult:
    profile: Profile | None
    sample: FileSample
    score: float = 0.0
    nearest: str | None = None  # 'name (missing $.a, $.b)' for an unrecognised file
    wrapper: Wrapper | None = None  # the log store's envelope the records were found in


def open_decompressed(path: Path):
    compression = compression_of(path)
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def read_head(path: Path, limit: int = HEAD_BYTES) -> bytes:
    with open_decompressed(path) as handle:
        data = handle.read(limit)
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data


def sample_file(path: Path) -> FileSample:
    """Read the first part of a file and say what shape it has."""
    suffix = base_suffix(path)
    if suffix == ".parquet":
        try:
            import duckdb

            names = [r[0] for r in duckdb.execute(f"DESCRIBE SELECT * FROM read_parquet({duckdb_path(path)})").fetchall()]
        except Exception as exc:  # noqa: BLE001 - any read failure is "not a readable parquet"
            return FileSample("binary", problem=f"not a readable Parquet file ({str(exc).splitlines()[0]})")
        return FileSample("parquet", header=names)
    try:
        head = read_head(path)
    except (OSError, EOFError, ValueError) as exc:
        return FileSample(None, problem=f"cannot be read ({exc})")
    if not head.strip():
        return FileSample(None, problem="empty")
    if b"\x00" in head[:4096]:
        return FileSample("binary", problem="binary, not text")
    text = head.decode("utf-8", errors="replace")
    complete = len(head) < HEAD_BYTES
    if suffix in (".csv", ".tsv"):
        first = text.splitlines()[0] if text else ""
        delimiter = "\t" if suffix == ".tsv" else ","
        header = next(csv.reader(io.StringIO(first), delimiter=delimiter), [])
        return FileSample("csv", header=[h.strip() for h in header])
    stripped = text.lstrip()
    # "[2026-12-07 19:00:32] ..." is a console log's bracketed time (SGLang's logging formatter), not a JSON array
    if stripped[:1] not in ("{", "[") or _BRACKETED_TIME_RE.match(stripped):
        lines = text.splitlines()
        return FileSample("text", problem="plain text, not JSON or CSV",
                          lines=lines[:-1] if not complete else lines)
    lines = text.splitlines()
    if not complete:
        lines = lines[:-1]  # the last line may be cut off
    records = []
    first_bad = False
    sampled = [line for line in lines if line.strip()][:SAMPLE_LINES]
    for index, line in enumerate(sampled):
        try:
            records.append(json.loads(line))
        except ValueError:
            if index == 0:
                first_bad = True
    if not first_bad and records:
        shape = "json" if suffix == ".json" and len(records) == 1 else "jsonl"
        return FileSample(shape, records=records)
    # The first line is not a JSON value on its own: one document over many lines (pretty-printed), or JSON lines
    # whose first line is broken (most of the others are objects: the bad line is kept as one, with its number).
    objects = [r for r in records if isinstance(r, dict)]
    lines_of_objects = len(objects) >= 2 and 2 * len(objects) >= len(sampled)
    if complete or path.stat().st_size <= WHOLE_JSON_BYTES:
        try:
            with open_decompressed(path) as handle:
                document = json.loads(handle.read(WHOLE_JSON_BYTES + 1))
        except ValueError as exc:
            if lines_of_objects:
                return FileSample("jsonl", records=objects)
            return FileSample("json", json_multiline=True, problem=f"not valid JSON ({exc})")
        return FileSample("json", records=[document], json_multiline=True)
    if lines_of_objects:
        return FileSample("jsonl", records=objects)
    return FileSample("json", json_multiline=True, problem="a JSON document too large to sniff; name its format with --from")


_BRACKETED_TIME_RE = re.compile(r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")
_TOKEN_RE = re.compile(r'\.(?:"((?:[^"\\]|\\.)*)"|([A-Za-z0-9_@:$-]+))|\[(\*|-?\d+)\]')


def parse_path(path: str) -> list:
    """'$.a.b[0]."c d"[*]' -> ['a', 'b', 0, 'c d', '*']."""
    if not path.startswith("$"):
        raise ValueError(f"a JSON path starts with '$': {path}")
    tokens, pos = [], 1
    while pos < len(path):
        match = _TOKEN_RE.match(path, pos)
        if not match:
            raise ValueError(f"cannot read JSON path {path!r} at {path[pos:]!r}")
        if match.group(3) is not None:
            tokens.append("*" if match.group(3) == "*" else int(match.group(3)))
        else:
            tokens.append(match.group(1) if match.group(1) is not None else match.group(2))
        pos = match.end()
    return tokens


def path_present(value, tokens: list) -> bool:
    """Whether the path leads to a non-null value (any element for '*')."""
    if not tokens:
        return value is not None
    head, rest = tokens[0], tokens[1:]
    if head == "*":
        return isinstance(value, list) and any(path_present(v, rest) for v in value)
    if isinstance(head, int):
        return isinstance(value, list) and -len(value) <= head < len(value) and path_present(value[head], rest)
    return isinstance(value, dict) and head in value and path_present(value[head], rest)


def path_values(value, tokens: list) -> list:
    """Every non-null value the path leads to ('*' fans out)."""
    if not tokens:
        return [] if value is None else [value]
    head, rest = tokens[0], tokens[1:]
    if head == "*":
        return [v for item in value for v in path_values(item, rest)] if isinstance(value, list) else []
    if isinstance(head, int):
        ok = isinstance(value, list) and -len(value) <= head < len(value)
        return path_values(value[head], rest) if ok else []
    return path_values(value[head], rest) if isinstance(value, dict) and head in value else []


def unwrap_sample(sample: FileSample, wrapper: Wrapper) -> FileSample | None:
    """The records inside a log store's envelope, when most sampled lines have that envelope (else None)."""
    records = [r for r in sample.records if isinstance(r, dict)]
    detect = [parse_path(p) for p in wrapper.detect]
    wrapped = [r for r in records if all(path_present(r, t) for t in detect)]
    if not records or len(wrapped) / len(records) < MATCH_SHARE:
        return None
    inner = []
    for record in wrapped:
        for value in path_values(record, parse_path(wrapper.path)):
            if wrapper.kind.endswith("_text"):
                try:
                    value = json.loads(value) if isinstance(value, str) else None
                except ValueError:
                    value = None
            if isinstance(value, dict):
                inner.append(value)
    if not inner:
        return None
    # The inner records are read one per record, whatever the envelope's layout (a _search answer is one
    # document).
    return FileSample("jsonl", records=inner[:SAMPLE_LINES], json_multiline=False)


def _reader_fits(profile: Profile, sample: FileSample) -> bool:
    if sample.shape == "jsonl":
        return profile.reader in ("jsonl", "json")
    if sample.shape == "json":
        return profile.reader == "json" or (profile.reader == "jsonl" and not sample.json_multiline)
    return profile.reader == sample.shape


def score_profile(profile: Profile, sample: FileSample, name: str) -> tuple[float, float, list[str]]:
    """(score, share of must-paths found in the best record, paths missing there); score 0 = no match."""
    filename_bonus = 5.0 if profile.detect_filename and re.search(profile.detect_filename, name) else 0.0
    if profile.reader == "lines" or sample.shape == "text":
        # A console log: the profile's detect.line must match one of the first lines.
        if profile.reader != "lines" or sample.shape != "text" or not profile.detect_line:
            return 0.0, 0.0, []
        found = any(re.search(profile.detect_line, line) for line in sample.lines)
        return (100.0 + filename_bonus, 1.0, []) if found else (0.0, 0.0, [])
    if sample.shape in ("csv", "parquet"):
        header = set(sample.header)
        missing = [c for c in profile.detect_columns if c not in header]
        found_share = 1 - len(missing) / len(profile.detect_columns) if profile.detect_columns else 0.0
        if missing or not profile.detect_columns or not _reader_fits(profile, sample):
            return 0.0, found_share, missing
        may = profile.detect_may_columns
        bonus = 10.0 * sum(c in header for c in may) / len(may) if may else 0.0
        return 100.0 + bonus + filename_bonus, 1.0, []
    # A profile exploding "$[*]" reads a top-level JSON list (an API answer) as its document.
    takes_list = bool(profile.explode_path and profile.explode_path.startswith("$["))
    records = [r for r in sample.records if isinstance(r, dict) or (takes_list and isinstance(r, list))]
    if not records or not profile.detect_must:
        return 0.0, 0.0, list(profile.detect_must)
    must = [(p, parse_path(p)) for p in profile.detect_must]
    must_not = [parse_path(p) for p in profile.detect_must_not]
    may = [parse_path(p) for p in profile.detect_may]
    matched, best_share, best_missing = 0, 0.0, [p for p, _ in must]
    may_hits = 0.0
    for record in records:
        # A record with a field the profile rules out is another format, not a near miss of this one.
        if any(path_present(record, tokens) for tokens in must_not):
            continue
        missing = [p for p, tokens in must if not path_present(record, tokens)]
        share = 1 - len(missing) / len(must)
        if share > best_share or (share == best_share and len(missing) < len(best_missing)):
            best_share, best_missing = share, missing
        if missing:
            continue
        matched += 1
        if may:
            may_hits += sum(path_present(record, tokens) for tokens in may) / len(may)
    if not matched or matched / len(records) < MATCH_SHARE or not _reader_fits(profile, sample):
        return 0.0, best_share, best_missing
    return 100.0 * matched / len(records) + 10.0 * may_hits / matched + filename_bonus, best_share, best_missing


def sniff(path: Path, profiles: list[Profile], sample: FileSample | None = None,
          look_inside: bool = True) -> SniffResult:
    """The best-fitting profile for `path` (None if nothing fits, with the nearest miss named)."""
    sample = sample or sample_file(path)
    best: tuple[float, int, Profile] | None = None
    nearest: tuple[float, int, Profile, list[str]] | None = None
    for profile in profiles:
        score, share, missing = score_profile(profile, sample, path.name)
        if score > 0 and (best is None or (score, profile.priority) > best[:2]):
            best = (score, profile.priority, profile)
        # A "nearest" format shares at least half of its required fields: one common key (`id`) is no hint.
        if share >= 0.5 and (nearest is None or (share, profile.priority) > nearest[:2]):
            nearest = (share, profile.priority, profile, missing)
    if best:
        return SniffResult(best[2], sample, best[0])
    if look_inside and sample.shape in ("jsonl", "json"):
        # No format fits the lines themselves: look inside the envelopes of the log stores.
        for wrapper in WRAPPERS:
            inner = unwrap_sample(sample, wrapper)
            if inner is None:
                continue
            found = sniff(path, profiles, inner, look_inside=False)
            if found.profile is not None:
                return SniffResult(found.profile, sample, found.score, wrapper=wrapper)
    near = None
    if nearest:
        what = "columns" if sample.shape in ("csv", "parquet") else "fields"
        near = f"{nearest[2].name} (missing {what} {', '.join(nearest[3][:4])})" if nearest[3] else nearest[2].name
    return SniffResult(None, sample, 0.0, near)
