"""Ingesting engine metrics into `metric_samples`: Prometheus scrapes, scrape index files, Prometheus HTTP API JSON.

API used by servlens.ingest.api (the `servlens ingest` command and its folder routing):

    fmt = sniff_metrics(path)              # 'prometheus-text' | 'openmetrics' | 'prometheus-api' | 'scrape-index' | None
    index = load_scrape_index(idx_path)    # for a 'scrape-index' file: {scrape file path: IndexEntry(scrape_ts, run)}
    run = cli_run or metrics_run_for(path, index) or <file stem>   # an index's `run` names each file's run
    decision = decide_metrics_source(con, run, path, fmt=fmt, at=at, index=index)   # (decide_source works too)
    summary = ingest_metrics_file(con, path, run=run, decision=decision, fmt=fmt, at=at, index=index)

`ingest_metrics_file` runs inside the caller's transaction: it handles `decision` ('skip' inserts nothing and returns
a summary with action 'skip' -- after checking that identical bytes really are identical samples, see
`decide_metrics_source`; 'replace' deletes the old source's rows first), creates the run, inserts the `sources`
row (kind 'metrics', format, time_source) and all samples in one bulk insert, puts malformed lines in
`ingest_errors` with their line numbers, and returns the per-source summary:

    {"path", "kind": "metrics", "format", "run", "source_id", "action", "rows", "bad_lines", "t_min", "t_max",
     "time_source", "time_source_text", "metrics": [normalised names], "created_dropped", "deprecated_dropped",
     "series_skipped", "instance": the scrape target given to samples without one (None when none needed it)}

An index file is not a source (it holds no samples): route it to `load_scrape_index` and pass the mapping along; when
no index is passed, one beside the scrape file (a `*.jsonl` whose rows name files with a `scrape_ts`) is found and used.

Scrape time (DESIGN.md Decisions), first found wins, recorded in `sources.time_source`:
  'exposition' (sample timestamps: ms in text 0.0.4, s in OpenMetrics) > 'at' (--at) > 'index' (an index file's
  scrape_ts) > 'file_name' (a 10-digit Unix-seconds, 13-digit ms or ISO-8601 token; `_000` is not a time) > 'mtime'.
  Samples without a timestamp in an exposition where others have one take the next source; time_source is then e.g.
  'exposition+file_name'. Prometheus API JSON carries its own times: 'query_result'.

Scrape targets: a Prometheus text or OpenMetrics file saved from /metrics (curl, a recorder) has no `instance`
label -- Prometheus adds it when it scrapes -- so every sample without one gets `instance` = the file's scrape target
(`scrape_target`: an index's `instance`, else the index that names the file, else the folder and the file name
without its time or sequence number).
Two servers' scrapes in one run are then two series, never one interleaved series that "resets" at every scrape;
the scrapes of one target, one file each, stay one series. Samples that carry `instance` (a /federate dump) and
Prometheus API JSON (series as Prometheus stored them) are left as they are.

Counter resets: the store's views `metric_counter_increases` (per-interval increases of every cumulative series; a
drop is a restart and the increase after it is the new value) and `metric_counter_resets` (one row per reset), see
servlens.store.schema.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

import duckdb

from servlens.errors import InputError
from servlens.ingest.prometheus import (
    KNOWN_TYPES,
    OPENMETRICS_FORMAT,
    TEXT_FORMAT,
    LineError,
    MetricRows,
    created_companions,
    normalise_name,
    parse_exposition,
)
from servlens.ingest.sources import (
    SourceDecision,
    compression_of,
    decide_source,
    delete_source,
    ensure_run,
    insert_source,
)
from servlens.redact import redact_secrets, redact_sql

API_FORMAT = "prometheus-api"
INDEX_FORMAT = "scrape-index"
METRIC_FORMATS = (TEXT_FORMAT, OPENMETRICS_FORMAT, API_FORMAT)

TIME_SOURCE_TEXT = {
    "exposition": "the samples' own timestamps",
    "at": "--at",
    "index": "the scrape index file",
    "file_name": "a time in the file name",
    "mtime": "the file's modification time",
    "query_result": "the Prometheus API result's timestamps",
}

_SNIFF_BYTES = 64 * 1024
_SAMPLE_LINE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?[ \t]+(\S+)([ \t]+[-+]?[0-9.eE+]+)?[ \t]*$")


# ---------------------------------------------------------------------------------------------------------------
# reading and sniffing


# One scrape is parsed in Python: its decompressed text is capped (a 6.6 MB zstd bomb once grew past 6 GB).
MAX_SCRAPE_BYTES = 256 * 1024 * 1024


def read_text(path: Path, limit: int | None = None) -> str:
    """The file's text (decompressed for .gz/.zst), or its first `limit` bytes."""
    compression = compression_of(path)
    if compression == "gzip":
        opener = gzip.open(path, "rb")
    elif compression == "zstd":
        import zstandard

        opener = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    else:
        opener = open(path, "rb")
    try:
        with opener as handle:
            data = handle.read(limit) if limit else handle.read(MAX_SCRAPE_BYTES + 1)
    except (OSError, EOFError, ValueError, zlib.error) as exc:  # a truncated or corrupt archive
        raise InputError(f"{path} cannot be decompressed as {compression}: {exc}", "Check that the file is complete") from None
    except Exception as exc:  # zstandard.ZstdError is no OSError
        if type(exc).__name__ != "ZstdError":
            raise
        raise InputError(f"{path} cannot be decompressed as zstd: {exc}", "Check that the file is complete") from None
    if not limit and len(data) > MAX_SCRAPE_BYTES:
        raise InputError(f"{path} holds more than {MAX_SCRAPE_BYTES >> 20} MiB of metrics text (decompressed)",
                         "A scrape is a few MB; split the file, or check that it is a scrape")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", errors="replace")


def sniff_metrics(path: Path) -> str | None:
    """What kind of metrics file this is: 'prometheus-text', 'openmetrics', 'prometheus-api', 'scrape-index' or None."""
    try:
        head = read_text(Path(path), _SNIFF_BYTES)
    except (OSError, EOFError, ValueError, InputError):  # not readable as metrics: the request-log sniffer says why
        return None
    return sniff_metrics_text(head, complete=len(head.encode("utf-8", "replace")) < _SNIFF_BYTES)


def sniff_metrics_text(head: str, complete: bool = True) -> str | None:
    """Sniff from the first bytes of a file (`complete` when that is the whole file)."""
    text = head.lstrip()
    if not text:
        return None
    if text[0] in "{[":
        first_line = text.split("\n", 1)[0]
        try:
            obj = json.loads(first_line)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "file" in obj and "scrape_ts" in obj:
            return INDEX_FORMAT
        if re.search(r'"resultType"\s*:\s*"(matrix|vector)"', text[:_SNIFF_BYTES]) and '"data"' in text:
            return API_FORMAT
        return None
    lines = [line.strip() for line in text.split("\n")]
    if not complete:
        lines = lines[:-1]  # the last line may be cut
    significant = [line for line in lines if line][:200]
    if not significant:
        return None
    # A scrape with a few malformed lines is still a scrape (its bad lines go to ingest_errors); anything else is not.
    declared = valid = invalid = 0
    for line in significant:
        if line.startswith("#"):
            if re.match(r"#\s*(HELP|TYPE|UNIT)\s+[a-zA-Z_:][a-zA-Z0-9_:]*(\s|$)", line) or line == "# EOF":
                declared += 1
            continue
        match = _SAMPLE_LINE.match(line)
        if match and _is_float(match.group(2)):
            valid += 1
        else:
            invalid += 1
    # (families with no children yet give HELP/TYPE lines and no samples: metadata alone is a valid exposition)
    if (valid == 0 and not declared) or (valid < invalid if declared else valid < 4 * invalid):
        return None
    if complete:
        from servlens.ingest.prometheus import detect_format

        return detect_format(head)
    return OPENMETRICS_FORMAT if any(line.startswith("# UNIT ") for line in significant) else TEXT_FORMAT


def _is_float(token: str) -> bool:
    if "_" in token:
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# scrape index files


@dataclass(frozen=True)
class IndexEntry:
    """What an index file says about one scrape file."""

    scrape_ts: float  # Unix seconds
    run: str | None
    index_path: Path
    line: int
    instance: str | None = None  # the scrape target, when the index names it (`instance`)


ScrapeIndex = Mapping[Path, IndexEntry]


def load_scrape_index(path: Path) -> dict[Path, IndexEntry]:
    """Read an index file (JSON lines naming each scrape `file` with its `scrape_ts`, optionally its `run` and the
    scrape target's `instance`)."""
    path = Path(path).resolve()
    entries: dict[Path, IndexEntry] = {}
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ts = _timestamp_value(row["scrape_ts"])
            target = (path.parent / str(row["file"])).resolve()
        except (ValueError, KeyError, TypeError):
            continue  # an index line that names no file/time cannot be used; the scrape falls back to other times
        run, instance = row.get("run"), row.get("instance")
        entries[target] = IndexEntry(ts, str(run) if run not in (None, "") else None, path, number,
                                     str(instance) if instance not in (None, "") else None)
    if not entries:
        raise InputError(
            f"{path} has no usable lines (each needs 'file' and 'scrape_ts')",
            "Check that it is a scrape index, or ingest the scrape files without it",
        )
    return entries


def find_scrape_index(path: Path) -> dict[Path, IndexEntry]:
    """The entries of every index file beside `path` (so a scrape named on its own still finds its time and run)."""
    return dict(_index_beside(path))


def _index_beside(path: Path) -> dict[Path, IndexEntry]:
    folder = Path(path).resolve().parent
    candidates = tuple(
        (p, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.jsonl")) if "index" in p.name.lower()
    )
    return _index_of_folder(candidates)


@functools.lru_cache(maxsize=64)
def _index_of_folder(candidates: tuple[tuple[Path, int], ...]) -> dict[Path, IndexEntry]:
    # keyed by the index files and their mtimes: a folder of many scrapes reads its index once
    found: dict[Path, IndexEntry] = {}
    for candidate, _ in candidates:
        if sniff_metrics(candidate) == INDEX_FORMAT:
            try:
                found.update(load_scrape_index(candidate))
            except InputError:
                continue
    return found


def _index_entry(path: Path, index: ScrapeIndex | None) -> IndexEntry | None:
    """The entry for `path` in the given index, else in an index file beside it."""
    path = Path(path).resolve()
    entry = index.get(path) if index else None
    return entry if entry is not None else _index_beside(path).get(path)


def metrics_run_for(path: Path, index: ScrapeIndex | None = None) -> str | None:
    """The run an index names for this scrape file (from `index`, else an index file beside it), or None."""
    entry = _index_entry(path, index)
    return entry.run if entry else None


# ---------------------------------------------------------------------------------------------------------------
# scrape time


def parse_at(value: str | float | datetime) -> float:
    """--at as Unix seconds: ISO-8601 (naive = UTC) or a Unix time in seconds/ms."""
    try:
        return _timestamp_value(value)
    except (ValueError, TypeError):
        raise InputError(
            f"--at {value!r} is not a time",
            "Give an ISO-8601 time such as 2026-11-28T14:05:00Z, or Unix seconds",
        ) from None


def _timestamp_value(value) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    if isinstance(value, bool):
        raise TypeError("not a time")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        if re.fullmatch(r"[-+]?\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            return _timestamp_value(parsed)
    if not math.isfinite(seconds):
        raise ValueError("not finite")
    if abs(seconds) >= 1e11:  # 13-digit values are milliseconds
        seconds /= 1000.0
    return seconds


_ISO_IN_NAME = re.compile(
    r"(?<!\d)(\d{4})-(\d{2})-(\d{2})[T_ ](\d{2})[:\-]?(\d{2})(?:[:\-]?(\d{2})(?:[.,](\d{1,9}))?)?"
    r"(Z|[+-]\d{2}:?\d{2})?(?!\d)"
)
_ISO_BASIC_IN_NAME = re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})?(Z)?(?!\d)")
_UNIX_IN_NAME = re.compile(r"(?<!\d)(\d{13}|\d{10})(?!\d)")


def time_from_file_name(name: str) -> float | None:
    """A time written in a file name: ISO-8601 (extended or basic), 10-digit Unix seconds or 13-digit ms."""
    for pattern in (_ISO_IN_NAME, _ISO_BASIC_IN_NAME):
        for match in pattern.finditer(name):
            year, month, day, hour, minute = (int(g) for g in match.groups()[:5])
            second = int(match.group(6) or 0)
            fraction = match.group(7) if pattern is _ISO_IN_NAME else None
            zone = match.groups()[-1]
            try:
                moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
            except ValueError:
                continue
            seconds = moment.timestamp() + (float("0." + fraction) if fraction else 0.0)
            if zone and zone != "Z":
                sign = 1 if zone[0] == "+" else -1
                digits = zone[1:].replace(":", "")
                seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
            return seconds
    match = _UNIX_IN_NAME.search(name)
    if match:
        digits = match.group(1)
        return int(digits) / 1000.0 if len(digits) == 13 else float(int(digits))
    return None


def resolve_scrape_time(path: Path, *, at: float | None, index: ScrapeIndex | None) -> tuple[float, str]:
    """The time of a scrape without sample timestamps, and where it came from: at > index > file_name > mtime."""
    if at is not None:
        return at, "at"
    entry = _index_entry(path, index)
    if entry is not None:
        return entry.scrape_ts, "index"
    from_name = time_from_file_name(Path(path).name)
    if from_name is not None:
        return from_name, "file_name"
    return Path(path).stat().st_mtime, "mtime"


# ---------------------------------------------------------------------------------------------------------------
# scrape target


_COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,11}$")
_TRAILING_NUMBER = re.compile(r"\d+$")
_SEPARATORS = "_-. "


def _time_span_in_name(stem: str) -> tuple[int, int] | None:
    """Where a scrape time is written in a file-name stem (the forms time_from_file_name reads), or None."""
    for pattern in (_ISO_IN_NAME, _ISO_BASIC_IN_NAME, _UNIX_IN_NAME):
        found = list(pattern.finditer(stem))
        if found:
            return found[-1].span()
    return None


def target_of_file_name(name: str) -> str:
    """The scrape target a file name stands for: its stem without the per-scrape part, which is a time written in
    the name (ISO-8601, 10-digit seconds, 13-digit ms) or else the trailing sequence number. So
    metrics_gw-retries_000.prom .. _030.prom are all `metrics_gw-retries`, vllm-1795940000.prom is `vllm`, and
    vllm-0_000.prom and vllm-1_000.prom are two targets. Only one part is removed: a per-target number before a
    time or a sequence number stays."""
    stem = name
    for suffix in _COMPRESSION_SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    stem = _EXTENSION.sub("", stem) or stem
    span = _time_span_in_name(stem)
    if span is None:
        number = _TRAILING_NUMBER.search(stem)
        span = number.span() if number else None
    if span is not None:
        head, tail = stem[: span[0]].rstrip(_SEPARATORS), stem[span[1]:].lstrip(_SEPARATORS)
        stem = head + ("_" if head and tail else "") + tail
    return stem


def scrape_target(path: Path, index: ScrapeIndex | None = None) -> str:
    """The `instance` given to the samples of a scrape file that carry none.

    Prometheus adds `instance` (and `job`) when it scrapes; a /metrics page saved by curl or a recorder has neither,
    so two servers' scrapes ingested into one run would be one series, interleaved in time (70, 0, 70, 0, ...: a
    counter reset at every scrape). The target, first found wins:

    - the `instance` an index file names for the scrape;
    - the index file that names it: a recorder writes one index per scrape loop, so the scrapes one index names in
      one folder are one target, whatever their file names (`vllm-cpu/metrics_index.jsonl` for the scrapes of one
      server across several runs, metrics_burst50_000.prom .. metrics_poisson_012.prom);
    - the file's folder and its name without the per-scrape part (target_of_file_name): `scrapes/vllm` for
      scrapes/vllm-1795940000.prom .. vllm-1795940045.prom.

    Every scrape of one target written as one file per scrape gets the same value, whichever file is ingested first
    and in which call, so it stays one series; two folders are two targets unless an index says otherwise."""
    path = Path(path).resolve()
    entry = _index_entry(path, index)
    folder = path.parent.name
    if entry is not None:
        return entry.instance or (f"{folder}/{entry.index_path.name}" if folder else entry.index_path.name)
    target = target_of_file_name(path.name)
    return f"{folder}/{target}" if folder and target else (folder or target or path.name)


def _add_instance(rows: MetricRows, instance: str) -> int:
    """Give `instance` to every sample that has no such label (label keys stay sorted); how many got it."""
    added = 0
    for keys, values in zip(rows.label_keys, rows.label_values):
        if "instance" in keys:
            continue
        at = next((i for i, key in enumerate(keys) if key > "instance"), len(keys))
        keys.insert(at, "instance")
        values.insert(at, instance)
        added += 1
    return added


# ---------------------------------------------------------------------------------------------------------------
# ingest


def ingest_metrics_file(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    *,
    run: str,
    decision: SourceDecision,
    fmt: str | None = None,
    at: float | str | datetime | None = None,
    index: ScrapeIndex | None = None,
    keep_text: bool = False,
) -> dict:
    """Ingest one metrics file into `metric_samples` inside the caller's transaction; returns its summary dict."""
    path = Path(path).resolve()
    fmt = fmt or sniff_metrics(path)
    if fmt not in METRIC_FORMATS:
        what = "a scrape index (it names scrape files; pass it as index=)" if fmt == INDEX_FORMAT else "not a metrics file"
        raise InputError(
            f"{path} is {what}",
            "Metrics files are Prometheus text/OpenMetrics scrapes or Prometheus API query/query_range JSON",
        )
    summary = {
        "path": str(path), "kind": "metrics", "format": fmt, "run": run, "source_id": None,
        "action": decision.action, "rows": 0, "bad_lines": 0, "t_min": None, "t_max": None,
        "time_source": None, "time_source_text": None, "metrics": [], "created_dropped": 0,
        "deprecated_dropped": 0, "series_skipped": 0, "instance": None,
    }
    if decision.action == "skip":
        decision = _recheck_skip(con, run, path, decision, fmt, at, index)
        summary["action"] = decision.action
    if decision.action == "skip":
        summary["source_id"] = decision.old_source_id
        return summary
    if decision.action == "replace" and decision.old_source_id is not None:
        delete_source(con, decision.old_source_id)
    ensure_run(con, run)
    text = read_text(path)
    if fmt == API_FORMAT:
        _check_api_answer(con, text, path)
        time_source = "query_result"
        source_id = insert_source(con, run=run, kind="metrics", path=path, decision=decision, fmt=fmt, time_source=time_source)
        errors, skipped = _ingest_api(con, text, path, run, source_id)
        _insert_errors(con, source_id, path, errors, keep_text)
        extra = {"series_skipped": skipped}
    else:
        at_seconds = parse_at(at) if at is not None else None
        exposition = parse_exposition(text, fmt)
        rows, errors = exposition.rows, exposition.errors
        fallback_ts, fallback_source = resolve_scrape_time(path, at=at_seconds, index=index)
        with_ts = sum(ts is not None for ts in rows.timestamp)
        if with_ts == 0:
            time_source = fallback_source
        elif with_ts == len(rows):
            time_source = "exposition"
        else:
            time_source = f"exposition+{fallback_source}"
        rows.timestamp = [fallback_ts if ts is None else ts for ts in rows.timestamp]
        errors = errors + _drop_impossible_times(rows)
        instance = scrape_target(path, index)
        extra = {"created_dropped": exposition.created_dropped, "deprecated_dropped": exposition.deprecated_dropped,
                 "instance": instance if _add_instance(rows, instance) else None}
        source_id = insert_source(con, run=run, kind="metrics", path=path, decision=decision, fmt=fmt, time_source=time_source)
        _insert_rows(con, run, source_id, rows)
        _insert_errors(con, source_id, path, errors, keep_text)
    # The counts of this source only (update_source_counts would also scan the requests table for every scrape).
    con.execute(
        """
        UPDATE sources SET
          rows = (SELECT count(*) FROM metric_samples WHERE source_id = $id),
          bad_lines = (SELECT count(*) FROM ingest_errors WHERE source_id = $id),
          t_min = (SELECT min(ts) FROM metric_samples WHERE source_id = $id),
          t_max = (SELECT max(ts) FROM metric_samples WHERE source_id = $id)
        WHERE source_id = $id
        """,
        {"id": source_id},
    )
    counts = con.execute(
        "SELECT rows, bad_lines, t_min, t_max FROM sources WHERE source_id = ?", [source_id]
    ).fetchone()
    names = con.execute(
        "SELECT DISTINCT name FROM metric_samples WHERE source_id = ? ORDER BY name", [source_id]
    ).fetchall()
    summary.update(extra)
    summary.update(
        source_id=source_id,
        rows=counts[0],
        bad_lines=counts[1],
        t_min=counts[2].isoformat() + "Z" if counts[2] else None,
        t_max=counts[3].isoformat() + "Z" if counts[3] else None,
        time_source=time_source,
        time_source_text="scrape time from " + " and ".join(TIME_SOURCE_TEXT[s] for s in time_source.split("+")),
        metrics=[n[0] for n in names],
    )
    return summary


def decide_metrics_source(
    con: duckdb.DuckDBPyConnection,
    run: str,
    path: Path,
    *,
    fmt: str | None = None,
    at: float | str | datetime | None = None,
    index: ScrapeIndex | None = None,
) -> SourceDecision:
    """decide_source for a metrics file: identical bytes are a duplicate only if they would give identical samples.

    Two scrapes of an idle server are byte-identical (every counter unchanged) yet are different samples when their
    time comes from outside the content (an index, the file name, --at, the mtime): the real llama.cpp recordings have
    such pairs (metrics_burst50_000.prom and metrics_fresh_cache_000.prom). So same content at another path is skipped
    only when the time is in the content (sample timestamps, API JSON) or resolves to the same scrape time.
    """
    path = Path(path).resolve()
    decision = decide_source(con, run, "metrics", path)
    if decision.action == "skip":
        decision = _recheck_skip(con, run, path, decision, fmt, at, index)
    return decision


def _recheck_skip(con, run, path, decision, fmt, at, index) -> SourceDecision:
    rows = con.execute(
        "SELECT source_id, path, time_source, t_min, t_max FROM sources WHERE run = ? AND kind = 'metrics' AND sha256 = ?",
        [run, decision.sha256],
    ).fetchall()
    if not rows or any(row[1] == str(path) for row in rows):
        return decision
    if fmt is None:
        fmt = sniff_metrics(path)
    if fmt == API_FORMAT:
        return decision
    if any(row[2] == "exposition" for row in rows):
        return decision  # every sample carries its time: the same bytes are the same samples
    at_seconds = parse_at(at) if at is not None else None
    when, _ = resolve_scrape_time(path, at=at_seconds, index=index)
    for _, _, _, t_min, t_max in rows:
        if t_min is not None and t_min == t_max and abs((t_min - _EPOCH).total_seconds() - when) < 1e-6:
            return decision
    same_path = con.execute(
        "SELECT source_id FROM sources WHERE run = ? AND kind = 'metrics' AND path = ?", [run, str(path)]
    ).fetchone()
    if same_path:
        return SourceDecision("replace", decision.sha256, decision.size_bytes, same_path[0])
    return SourceDecision("new", decision.sha256, decision.size_bytes)


_EPOCH = datetime(1970, 1, 1)
# Label values are redacted like request text (a URL with a password in an `endpoint` label, a key in `api_base`).
_REDACTED_LABELS = "list_transform({values}, lambda v: " + redact_sql("v").replace("{", "{{").replace("}", "}}") + ")"


# A sample time outside 2000-2100 is a unit mistake (ns or ms read as seconds) or garbage: that line's error.
_SCRAPE_TIME_RANGE = (946684800.0, 4102444800.0)


def _drop_impossible_times(rows: MetricRows) -> list[LineError]:
    """Remove the samples whose time is out of range (NaN and infinities included) and return them as errors."""
    low, high = _SCRAPE_TIME_RANGE
    bad = [i for i, ts in enumerate(rows.timestamp) if ts is not None and not (low <= ts < high)]
    if not bad:
        return []
    errors = [LineError(rows.line[i], None, f"sample time {rows.timestamp[i]!r} s is not between 2000 and 2100", "")
              for i in bad]
    dropped = set(bad)
    keep = [i for i in range(len(rows)) if i not in dropped]
    for name in ("name", "name_raw", "type", "series", "le", "label_keys", "label_values", "value", "timestamp", "line"):
        column = getattr(rows, name)
        setattr(rows, name, [column[i] for i in keep])
    return errors


def _insert_rows(con: duckdb.DuckDBPyConnection, run: str, source_id: int, rows: MetricRows) -> None:
    """One INSERT for the whole file: the columns go in as DuckDB lists and are unnested side by side."""
    if not len(rows):
        return
    con.execute(
        f"""
        INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, le, labels, value)
        SELECT $run, $source_id, make_timestamp(CAST(round(ts * 1e6) AS BIGINT)), name, name_raw, type, series, le,
               map(label_keys, {_REDACTED_LABELS.format(values="label_values")}), value
        FROM (SELECT unnest($ts::DOUBLE[]) AS ts, unnest($name::VARCHAR[]) AS name,
                     unnest($name_raw::VARCHAR[]) AS name_raw, unnest($type::VARCHAR[]) AS type,
                     unnest($series::VARCHAR[]) AS series, unnest($le::DOUBLE[]) AS le,
                     unnest($label_keys::VARCHAR[][]) AS label_keys, unnest($label_values::VARCHAR[][]) AS label_values,
                     unnest($value::DOUBLE[]) AS value)
        """,
        {
            "run": run, "source_id": source_id, "ts": rows.timestamp, "name": rows.name, "name_raw": rows.name_raw,
            "type": rows.type, "series": rows.series, "le": rows.le, "label_keys": rows.label_keys,
            "label_values": rows.label_values, "value": rows.value,
        },
    )


def _insert_errors(con, source_id: int, path: Path, errors: list[LineError], keep_text: bool) -> None:
    if not errors:
        return
    con.execute(
        """
        INSERT INTO ingest_errors (source_id, path, line, byte_length, reason, keys_seen, excerpt)
        SELECT $source_id, $path, unnest($line::BIGINT[]), unnest($length::BIGINT[]), unnest($reason::VARCHAR[]),
               NULL, unnest($excerpt::VARCHAR[])
        """,
        {
            "source_id": source_id, "path": str(path),
            "line": [e.line for e in errors], "length": [e.byte_length for e in errors],
            "reason": [redact_secrets(e.reason) for e in errors],
            "excerpt": [redact_secrets(e.text[:200]) if keep_text and e.text else None for e in errors],
        },
    )


# ---------------------------------------------------------------------------------------------------------------
# Prometheus HTTP API JSON (query_range matrix, query vector)


def _check_api_answer(con: duckdb.DuckDBPyConnection, text: str, path: Path) -> None:
    try:
        status, error_type, error, result_type = con.execute(
            "SELECT d->>'$.status', d->>'$.errorType', d->>'$.error', d->>'$.data.resultType' FROM (SELECT ?::JSON AS d)",
            [text],
        ).fetchone()
    except duckdb.Error:
        raise InputError(f"{path} is not valid JSON", "Save the Prometheus API answer as it was returned") from None
    if status == "error":
        raise InputError(f"{path} is a Prometheus API error answer ({error_type}: {error})", "Re-run the query and save a success")
    if result_type not in ("matrix", "vector"):
        raise InputError(
            f"{path} holds a Prometheus '{result_type}' result, not series",
            "Save a query_range (matrix) or query (vector) answer",
        )


def _ingest_api(con: duckdb.DuckDBPyConnection, text: str, path: Path, run: str, source_id: int) -> tuple[list[LineError], int]:
    """Insert a query_range/query answer. Series metadata (few rows) is normalised in Python; DuckDB expands, casts
    and inserts the points. Returns the errors and the number of series skipped."""
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _sl_api_series AS "
        "SELECT generate_subscripts(r, 1) AS sidx, unnest(r) AS s "
        "FROM (SELECT from_json((?::JSON)->'$.data.result', '[\"JSON\"]') AS r)",
        [text],
    )
    try:
        metas = con.execute(
            "SELECT sidx, (s->'$.metric')::VARCHAR, (s->'$.histograms') IS NOT NULL FROM _sl_api_series ORDER BY sidx"
        ).fetchall()
        metrics = [json.loads(m) if m else {} for _, m, _ in metas]
        names = {m.get("__name__") for m in metrics if m.get("__name__")}
        created = created_companions(names, {})
        errors: list[LineError] = []
        meta: dict[str, list] = {k: [] for k in ("sidx", "name", "raw", "type", "series", "le", "k", "v")}
        skipped = 0
        for (sidx, _, has_native), metric in zip(metas, metrics):
            name_raw = metric.get("__name__")
            if not name_raw:
                errors.append(LineError(None, None, f"series {sidx} has no __name__ (a computed expression); only raw series are read", ""))
                skipped += 1
                continue
            if name_raw in created:
                skipped += 1
                continue
            if has_native:
                errors.append(LineError(None, None, f"series {sidx} ({name_raw}) holds native histograms, which are not read", ""))
            labels = {k: str(v) for k, v in metric.items() if k != "__name__"}
            mtype, series, base, le = _infer_api_series(name_raw, labels, names)
            keys = sorted(labels)
            for key, value in zip(meta, (sidx, normalise_name(base), name_raw, mtype, series, le, keys, [labels[k] for k in keys])):
                meta[key].append(value)
        if not meta["sidx"]:
            return errors, skipped
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _sl_api_meta AS SELECT unnest($sidx::BIGINT[]) sidx, unnest($name::VARCHAR[]) name, "
            "unnest($raw::VARCHAR[]) name_raw, unnest($type::VARCHAR[]) type, unnest($series::VARCHAR[]) series, "
            "unnest($le::DOUBLE[]) le, unnest($k::VARCHAR[][]) k, unnest($v::VARCHAR[][]) v",
            meta,
        )
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _sl_api_points AS
            SELECT sidx, try_cast(p[1]::VARCHAR AS DOUBLE) AS ts, p[2]->>'$' AS value_text,
                   try_cast(p[2]->>'$' AS DOUBLE) AS value
            FROM (SELECT sidx, unnest(coalesce(from_json(s->'$.values', '[["JSON"]]'),
                                               [from_json(s->'$.value', '["JSON"]')])) AS p
                  FROM _sl_api_series)
            WHERE p IS NOT NULL
            """
        )
        con.execute(
            f"""
            INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, le, labels, value)
            SELECT ?, ?, make_timestamp(CAST(round(p.ts * 1e6) AS BIGINT)), m.name, m.name_raw, m.type, m.series, m.le,
                   map(m.k, {_REDACTED_LABELS.format(values="m.v")}), p.value
            FROM _sl_api_points p JOIN _sl_api_meta m USING (sidx)
            WHERE p.ts IS NOT NULL AND p.value IS NOT NULL
            ORDER BY p.sidx, p.ts
            """,
            [run, source_id],
        )
        bad = con.execute(
            "SELECT p.sidx, m.name_raw, count(*), min(p.value_text) FROM _sl_api_points p JOIN _sl_api_meta m USING (sidx) "
            "WHERE p.ts IS NULL OR p.value IS NULL GROUP BY ALL ORDER BY p.sidx"
        ).fetchall()
        for sidx, name_raw, count, example in bad:
            errors.append(LineError(None, None, f"series {sidx} ({name_raw}) has {count} point(s) that are not [time, number], e.g. {example!r}", ""))
        return errors, skipped
    finally:
        for table in ("_sl_api_series", "_sl_api_meta", "_sl_api_points"):
            con.execute(f"DROP TABLE IF EXISTS {table}")


def _infer_api_series(name: str, labels: dict[str, str], names: set[str]) -> tuple[str, str, str, float | None]:
    """(type, series, base name, le) of a raw series from the Prometheus API, which carries no TYPE: by suffix."""
    if name.endswith("_bucket") and "le" in labels:
        return "histogram", "bucket", name[: -len("_bucket")], _label_number(labels.pop("le"))
    for suffix, series in (("_sum", "sum"), ("_count", "count")):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            # A summary exposes its quantiles under the bare name; otherwise _sum/_count belong to a histogram.
            return ("summary" if base in names else "histogram"), series, base, None
    if "quantile" in labels and (f"{name}_sum" in names or f"{name}_count" in names):
        return "summary", "quantile", name, _label_number(labels.pop("quantile"))
    if name.endswith("_total"):
        return "counter", "value", name[: -len("_total")], None
    known = KNOWN_TYPES.get(name) or ("gauge" if name.endswith("_info") else "untyped")
    return known, "value", name, None


def _label_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
