"""The ingest entry point for commands and other modules (analyze and compare ingest files on the fly).

    from servlens.ingest.api import ingest_inputs
    report = ingest_inputs(con, ["logs/", "scrapes/*.prom"], run="before")
    report.runs          # the runs this call touched (ingested into, or found already there)
    report.to_dict()     # {"kind": "ingest", "schema_version": 2, "sources": [...], "skipped": [...], "runs": [...]}

Every input is expanded (files, folders, globs), sniffed and routed: request logs to the format profiles
(servlens.ingest.requests), Prometheus scrapes / query_range JSON / scrape index files to servlens.ingest.metrics.
A file the user named that nothing recognises is an error (exit 2) before anything is written; a file found in a
folder that nothing recognises is listed as skipped with the reason.
"""

from __future__ import annotations

import re
import sys
import threading
import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from servlens.documents import SCHEMA_VERSION
from servlens.errors import ConfigError, InputError
from servlens.ingest import metrics
from servlens.ingest import sources as src
from servlens.ingest.engine_info import EngineInfo, apply_engine_info, read_engine_info
from servlens.ingest.profiles import (
    WRAPPERS,
    Profile,
    Wrapper,
    builtin_profiles,
    get_profile,
    load_profile_file,
)
from servlens.ingest.metric_lines import ingest_metric_lines
from servlens.ingest.requests import SourceResult, _stem, column_coverage, ingest_request_file
from servlens.ingest.sniff import (
    FileSample,
    parse_path,
    path_present,
    read_head,
    sample_file,
    score_profile,
    sniff,
    unwrap_sample,
)

PROGRESS_MIN_BYTES = 32 * 1024 * 1024

# Files that sit beside logs and are not data: the reason says so instead of "not recognised".
_NOT_DATA = {
    ".md": "documentation", ".txt": "plain text", ".log": "a server or console log (no per-request records)",
    ".py": "source code", ".sh": "a script", ".toml": "a configuration file", ".yaml": "a configuration file",
    ".yml": "a configuration file",
}


@dataclass
class IngestReport:
    """What one ingest call did: a result per source, the files it skipped and why, the runs it touched."""

    sources: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "kind": "ingest",
            "schema_version": SCHEMA_VERSION,
            "sources": self.sources,
            "skipped": self.skipped,
            "runs": self.runs,
        }

    @property
    def rows(self) -> int:
        return sum(int(s.get("rows") or 0) for s in self.sources if not s.get("skipped"))

    @property
    def bad_lines(self) -> int:
        return sum(int(s.get("bad_lines") or 0) for s in self.sources if not s.get("skipped"))


@dataclass
class _Plan:
    path: Path
    named: bool
    kind: str  # 'requests' | 'metrics' | 'index' | 'engine_info' | 'skip'
    profile: Profile | None = None
    engine_info: EngineInfo | None = None
    sample: FileSample | None = None
    metrics_format: str | None = None
    reason: str | None = None
    wrapper: Wrapper | None = None  # the log store's envelope the records sit in


def parse_start(value: str | datetime | None) -> datetime | None:
    """--start as a naive UTC datetime (ISO-8601; a zone is converted to UTC)."""
    if value is None or isinstance(value, datetime):
        return value.astimezone(timezone.utc).replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value
    text = str(value).strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"--start {text!r} is not a time", "Give an ISO-8601 time such as 2026-11-28T14:00:00Z") from None
    if parsed.tzinfo:
        parsed = parsed.astimezone(timezone.utc).replace(tzinfo=None)
    return parsed


def check_tz(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InputError(f"--tz {value!r} is not a time zone", "Use an IANA name such as UTC or America/Los_Angeles") from None
    return value


def _plan(path: Path, named: bool, profiles: list[Profile], forced: Profile | None, metrics_only: bool) -> _Plan:
    problem = src.compression_problem(path)
    if problem:
        if named:
            raise InputError(f"{path} is {problem}", "Rename it to match its content, or recompress it")
        return _Plan(path, named, "skip", reason=problem)
    metrics_format = metrics.sniff_metrics(path)
    if metrics_format == metrics.INDEX_FORMAT:
        return _Plan(path, named, "index", metrics_format=metrics_format)
    if metrics_format and not (forced and named):
        return _Plan(path, named, "metrics", metrics_format=metrics_format)
    if metrics_only:
        return _Plan(path, named, "skip", reason="not a Prometheus scrape, OpenMetrics file or query_range JSON")
    # An engine's settings beside its request log (llama.cpp /props, /slots) are never a request log themselves.
    engine_info = read_engine_info(path)
    if engine_info is not None:
        return _Plan(path, named, "engine_info", engine_info=engine_info)
    sample = sample_file(path)
    if forced is not None:
        return _plan_forced(path, named, profiles, forced, sample, metrics_format)
    result = sniff(path, profiles, sample)
    if result.profile is not None and result.profile.reader == "lines" and not result.profile.line_request_log \
            and not named:
        # A console log mostly repeats what the request log beside it says: read only when named.
        return _Plan(path, named, "skip", sample=sample,
                     reason=f"{result.profile.title}: name the file to read it ({result.profile.name})")
    if result.profile is not None:
        return _Plan(path, named, "requests", profile=result.profile, sample=sample, wrapper=result.wrapper)
    if sample.problem and sample.shape in (None, "text", "binary"):
        reason = _NOT_DATA.get(src.base_suffix(path)) or sample.problem
    else:
        reason = "no format profile recognises it"
    if result.nearest:
        reason += f"; nearest: {result.nearest}"
    return _Plan(path, named, "skip", sample=sample, reason=reason)


_SHAPES = {"jsonl": "JSON lines", "json": "a JSON document", "csv": "CSV", "parquet": "Parquet"}
_READS = {"jsonl": "JSON lines", "json": "JSON documents", "csv": "CSV", "parquet": "Parquet",
          "lines": "console lines"}


def _plan_forced(path: Path, named: bool, profiles: list[Profile], forced: Profile, sample: FileSample,
                 metrics_format: str | None = None) -> _Plan:
    """A profile named with --from / --profile. A file whose shape or fields show it is not in that format: a file the
    user named is an error (one sentence naming what is missing); one found in a folder is skipped with the reason.
    A file whose shape could not be told (a CSV without a .csv suffix, say) is read with the profile as asked."""
    fits = forced.reader == sample.shape or (forced.reader in ("json", "jsonl") and sample.shape in ("json", "jsonl"))
    known_shape = sample.shape in _SHAPES and not sample.problem
    if known_shape and sample.shape in ("jsonl", "json") and score_profile(forced, sample, path.name)[2]:
        # The records may sit inside a log store's envelope: the forced format is then read inside it.
        for wrapper in WRAPPERS:
            inner = unwrap_sample(sample, wrapper)
            if inner is not None and not score_profile(forced, inner, path.name)[2]:
                return _Plan(path, named, "requests", profile=forced, sample=sample, wrapper=wrapper)
    problem = None
    if known_shape and not fits:
        problem = f"{_SHAPES[sample.shape]}, but the {forced.name} profile reads {_READS[forced.reader]}"
    elif known_shape:
        _, _, missing = score_profile(forced, sample, path.name)
        if missing and sample.shape in ("csv", "parquet"):
            problem = (f"missing the column(s) the {forced.name} profile needs: {', '.join(missing[:6])}"
                       f"{', …' if len(missing) > 6 else ''} (it has: {', '.join(sample.header[:8])}"
                       f"{', …' if len(sample.header) > 8 else ''})")
        elif missing:
            problem = (f"none of its first {len(sample.records)} record(s) has the field(s) the {forced.name} profile "
                       f"requires: {', '.join(missing[:6])}")
    # Text that is not JSON (sniffing reads JSON by content, whatever the suffix) or bytes that are not text cannot
    # be JSON records; only a CSV profile (a CSV with another suffix) or a line reader may read text.
    if problem is None and sample.shape in ("text", "binary") and (
            forced.reader not in ("csv", "lines") or sample.shape == "binary"):
        problem = f"{sample.problem or sample.shape}, but the {forced.name} profile reads {_READS[forced.reader]}"
    if problem is None and not known_shape and not fits and not named:
        problem = sample.problem or f"{sample.shape or 'empty'}, not {_READS[forced.reader]}"
    if problem is None:
        return _Plan(path, named, "requests", profile=forced, sample=sample)
    if not named:
        return _Plan(path, named, "skip", sample=sample, reason=f"not readable as {forced.name}: {problem}")
    found = sniff(path, [p for p in profiles if p.name != forced.name], sample)
    if metrics_format:
        hint = f"It looks like metrics ({metrics_format}): leave out --from to read it as metrics"
    elif found.profile is not None:
        hint = f"It looks like {found.profile.name}: leave out --from to detect it, or name that format"
    else:
        hint = "Name the format that fits with --from NAME (see 'servlens formats'), or describe yours with --profile FILE (docs/profiles.md)"
    raise InputError(f"{path} is not in the {forced.name} format: {problem}", hint)


def ingest_inputs(
    con: duckdb.DuckDBPyConnection,
    inputs: list[str] | tuple[str, ...],
    *,
    run: str | None = None,
    from_format: str | None = None,
    profile_file: str | Path | None = None,
    keep_text: bool = False,
    strict: bool = False,
    start: str | datetime | None = None,
    tz: str | None = None,
    at: str | float | datetime | None = None,
    metrics_inputs: list[str] | tuple[str, ...] = (),
    progress: bool = False,
    prometheus=None,
) -> IngestReport:
    """Ingest files, folders and globs into the store behind `con`; see the module docstring.

    `prometheus` (a servlens.ingest.prometheus_source.PrometheusPull) also pulls engine metrics from that
    server for each run's time span; the server is reached before any file is read, so one that is down
    writes nothing."""
    if from_format and profile_file:
        raise ConfigError("--from and --profile both name a format", "Pass one of them")
    forced = load_profile_file(profile_file) if profile_file else get_profile(from_format) if from_format else None
    profiles = builtin_profiles()
    start_dt = parse_start(start)
    tz = check_tz(tz)
    if not inputs and not metrics_inputs and prometheus is None:
        raise InputError("Nothing to ingest", "Name files, folders or globs")
    session = None
    if prometheus is not None:
        from servlens.ingest.prometheus_source import open_session

        session = open_session(prometheus)

    plans: list[_Plan] = []
    seen: set[Path] = set()
    not_files: list[dict] = []
    for group, metrics_only in ((inputs, False), (metrics_inputs, True)):
        if not group:
            continue
        for path, named in src.expand_inputs(list(group), not_files):
            if path in seen:
                continue
            seen.add(path)
            plans.append(_plan(path, named, profiles, forced, metrics_only))

    unknown = [p for p in plans if p.kind == "skip" and p.named]
    if unknown:
        first = unknown[0]
        names = ", ".join(p.name for p in profiles)
        raise InputError(
            f"{first.path} is not in a format servlens knows ({first.reason})",
            f"Known formats: {names}, plus Prometheus text/OpenMetrics and query_range JSON; "
            "name one with --from NAME or describe yours with --profile FILE (docs/profiles.md)",
        )

    # DuckDB's own progress bar prints to stdout (it would break --format json); ours goes to stderr, on a TTY only.
    try:
        con.execute("SET enable_progress_bar_print = false")
    except duckdb.Error:
        pass
    # One transaction for the whole call: a folder ingest that dies half-way (kill, Ctrl-C, a full disk, an error in
    # its 7,000th file) leaves the store as it was, never some of its files. A file that must be read again another
    # way restarts the whole call, reading that file the other way from the start (sources.RestartIngest).
    redo: dict[Path, dict] = {}
    while True:
        try:
            with src.ingest_transaction(con):
                return _ingest_plans(con, plans, not_files, redo, run=run, keep_text=keep_text, strict=strict,
                                     start=start_dt, tz=tz, at=at, progress=progress, session=session)
        except src.RestartIngest as restart:
            redo[restart.path] = restart.retry
        except (duckdb.IOException, duckdb.FatalException, OSError) as exc:
            full = src.disk_full_error(exc)
            if full is None:
                raise
            raise full from None


def _ingest_plans(con: duckdb.DuckDBPyConnection, plans: list[_Plan], not_files: list[dict], redo: dict[Path, dict],
                  *, run, keep_text, strict, start, tz, at, progress, session) -> IngestReport:
    """Ingest the planned files in order (request logs first), then the engine settings, then the Prometheus pull;
    `redo` holds how to read a file another way (ingest_request_file arguments) after a restart."""
    start_dt = start
    report = IngestReport()
    report.skipped = [{"path": str(p.path), "reason": p.reason} for p in plans if p.kind == "skip"] + not_files
    index: dict = {}
    for plan in plans:
        if plan.kind == "index":
            index.update(metrics.load_scrape_index(plan.path))
            report.skipped.append({"path": str(plan.path), "reason": "scrape index: used for the scrape files' times and runs"})

    # Request logs first: a scrape that names no run of its own joins the run of the request log it came with.
    work = [p for p in plans if p.kind == "requests"] + [p for p in plans if p.kind == "metrics"]
    total_bytes = sum(p.path.stat().st_size for p in work)
    bar = _Progress(total_bytes, con) if progress and total_bytes >= PROGRESS_MIN_BYTES else None
    touched: list[str] = []
    request_results: list[tuple[int, SourceResult]] = []
    try:
        for plan in work:
            if bar:
                bar.start_file(plan.path)
            if plan.kind == "requests":
                if plan.path in redo:
                    result = ingest_request_file(con, plan.path, **redo[plan.path])
                else:
                    result = ingest_request_file(
                        con, plan.path, plan.profile, run=run, keep_text=keep_text, strict=strict, start=start_dt,
                        tz=tz, json_multiline=bool(plan.sample and plan.sample.json_multiline), wrapper=plan.wrapper,
                    )
                gauges = None
                if plan.profile.metric_lines is not None:
                    # the same log's gauge lines (vLLM's stats line): a metrics source of the log's run
                    gauges = ingest_metric_lines(con, plan.path, plan.profile, start=start_dt, tz=tz,
                                                 run=(result.runs or [run or _stem(plan.path)])[0])
                    if gauges["rows"] or gauges["skipped"]:
                        touched.append(gauges["run"])
                    else:
                        gauges = None
                if result.rows == 0 and not result.skipped and gauges:
                    _drop_rowless_source(con, result, plan.profile)  # a console log of gauges only: no request
                    report.sources.append(gauges)
                    continue
                if result.rows == 0 and not result.skipped:
                    # Recognised, yet not one row: a named file is an error, a file in a folder a listed skip.
                    reason = _drop_rowless_source(con, result, plan.profile, plan.sample, plan.wrapper)
                    if plan.named:
                        raise InputError(
                            f"{plan.path} looks like {plan.profile.name} but gave no rows: {reason}",
                            "Name the format that fits with --from NAME (see 'servlens formats'), or "
                            "describe yours with --profile FILE (docs/profiles.md)")
                    report.skipped.append({"path": str(plan.path),
                                           "reason": f"{plan.profile.name}, but no rows: {reason}"})
                    continue
                request_results.append((len(report.sources), result))
                report.sources.append(result.to_dict())
                touched.extend(result.runs)
                if gauges:
                    report.sources.append(gauges)
            else:
                label = run or _scrape_run(metrics.metrics_run_for(plan.path, index or None), plan, request_results)
                summary = _ingest_metrics(con, plan, run=label, at=at, index=index or None,
                                          keep_text=keep_text, strict=strict)
                report.sources.append(summary)
                touched.append(summary["run"])
            if bar:
                bar.end_file(plan.path)
    finally:
        if bar:
            bar.close()
    # After every request log is in: the engine settings apply to the request rows of their folder.
    infos = [p.engine_info for p in plans if p.kind == "engine_info" and p.engine_info is not None]
    if infos:
        entries, skipped = apply_engine_info(con, infos)
        report.sources.extend(entries)
        report.skipped.extend(skipped)
        for entry in entries:
            touched.extend(entry["runs"])
        # The request logs of those folders now have more columns filled: their coverage is read again.
        folders = {Path(e["path"]).parent for e in entries}
        for position, result in request_results:
            if result.source_ids and Path(result.path).parent in folders:
                ids = ", ".join(str(int(i)) for i in result.source_ids)
                result.columns_filled = column_coverage(con, f"source_id IN ({ids})")
                report.sources[position] = result.to_dict()
    if session is not None:
        from servlens.ingest.prometheus_source import run_windows

        windows = run_windows(con, session, list(dict.fromkeys(touched)), run)
        pulled = session.pull_into(con, windows, progress=progress)
        report.sources.extend(pulled)
        touched.extend(s["run"] for s in pulled)
    report.runs = list(dict.fromkeys(touched))
    return report


def _scrape_run(indexed: str | None, plan: _Plan, request_results: list[tuple[int, SourceResult]]) -> str | None:
    """A scrape's run without --run: the run its index names when a request log of this call has that run (a
    recorder that labelled several runs in one log and its scrapes alike) or when there are no request logs; else
    the run of the request log it came with; else the index's label."""
    logged = {run for _, r in request_results for run in r.runs}
    if indexed is not None and (indexed in logged or not logged):
        return indexed
    return _run_of_request_log(plan, request_results) or indexed


def _run_of_request_log(plan: _Plan, request_results: list[tuple[int, SourceResult]]) -> str | None:
    """The run a scrape belongs to when nothing names one (DESIGN.md, round 2 "Runs"): the one run of the request
    logs in its folder; else, for scrapes kept apart (--metrics DIR), the one run of every request log of this call.
    Several runs there (a run field, several logs) leave the scrape to its own label."""
    results = [r for _, r in request_results]
    beside = {run for r in results if Path(r.path).parent == plan.path.parent for run in r.runs}
    if len(beside) == 1:
        return beside.pop()
    if not beside:
        every = {run for r in results for run in r.runs}
        if len(every) == 1:
            return every.pop()
    return None


def check_something_ingested(report: IngestReport, inputs: list[str] | tuple[str, ...]) -> None:
    """`servlens ingest` of folders or globs that held nothing servlens could read is an input error (exit 2), not
    "Nothing ingested" and exit 0; the first reasons for the skips say why. (A file the user named that gave
    nothing has already raised.) analyze and compare say it in their own words."""
    if report.sources or not report.skipped or all(Path(i).is_file() for i in inputs):
        return  # something was read, or only named files were given (each was judged on its own)
    # Files that were recognised and still gave no row say the most: they come first.
    shown = sorted(report.skipped, key=lambda item: ", but no rows: " not in item["reason"])[:3]
    detail = "; ".join(f"{Path(item['path']).name}: {item['reason']}" for item in shown)
    raise InputError(f"Nothing was ingested from {', '.join(str(i) for i in inputs)}: "
                     f"{len(report.skipped)} file(s) skipped ({detail})",
                     "Name the format with --from NAME (see 'servlens formats') or describe yours with "
                     "--profile FILE")


def _drop_rowless_source(con: duckdb.DuckDBPyConnection, result: SourceResult, profile: Profile,
                         sample: FileSample | None = None, wrapper=None) -> str:
    """Remove the sources of a file that gave no row (and runs left empty); say why it gave none."""
    if result.bad_lines and result.first_errors:
        first = result.first_errors[0]
        where = f"line {first['line']}" if first.get("line") is not None else "the file"
        reason = f"all {result.bad_lines} record line(s) are bad (first: {where}: {first['reason']})"
    elif profile.reader == "csv" and not _csv_has_rows(Path(result.path)):
        reason = "the file holds no record (a header only)"
    elif profile.reader == "lines" and not _a_line_matches(profile, Path(result.path)):
        reason = "no line of the file matches the profile's [lines] patterns"
    elif profile.where:
        reason = "no record passed the profile's row filter (where)" + _where_fields_missing(profile, sample, wrapper)
    elif profile.reader == "lines":
        reason = "no line of the file matches the profile's [lines] patterns"
    elif profile.explode_path or profile.explode_zip:
        reason = "no record holds an element the profile reads as a request"
    else:
        reason = "the file holds no record"
    with src.one_transaction(con):
        for source_id in result.source_ids:
            src.delete_source(con, source_id)
        for run in result.runs:
            con.execute("DELETE FROM runs WHERE run = ? AND NOT EXISTS (SELECT 1 FROM sources WHERE run = ?)",
                        [run, run])
    return reason


def _a_line_matches(profile: Profile, path: Path) -> bool:
    """Whether a line of the file's head matches one of a line reader's patterns (said before the row filter: a
    file none of whose lines is a record has nothing for `where` to filter)."""
    try:
        patterns = [re.compile(p) for p in profile.line_patterns]
    except re.error:      # RE2 syntax Python does not share: let the row filter's message stand
        return True
    text = read_head(path, 1 << 20).decode("utf-8", errors="replace")
    return any(p.search(line) for line in text.splitlines() for p in patterns)


def _csv_has_rows(path: Path) -> bool:
    """Whether a CSV has a line after its header (a line break inside a quoted header field aside)."""
    return sum(1 for line in read_head(path, 1 << 16).splitlines() if line.strip()) > 1


_WHERE_PATH_RE = re.compile(r"'(\$[^']*)'")


def _where_fields_missing(profile: Profile, sample: FileSample | None, wrapper) -> str:
    """The fields the row filter reads that no sampled record has (JSON records), or the captures it needs (a line
    reader): the words that tell a user which fields the file lacks."""
    if profile.reader == "lines":
        needed = sorted(set(re.findall(r"\bm\.(\w+)\s+IS NOT NULL", profile.where or "")))
        if needed:
            return (f": no line gave the capture(s) {', '.join(needed)} (its [lines] patterns match none of the "
                    "file's lines, or not all of them)")
        return ""
    if sample is None or not sample.records:
        return ""
    if wrapper is not None:
        sample = unwrap_sample(sample, wrapper) or sample
    records = [r for r in sample.records if isinstance(r, dict)]
    missing = []
    for path in dict.fromkeys(_WHERE_PATH_RE.findall(profile.where or "")):
        try:
            tokens = parse_path(path)
        except ValueError:
            continue
        if records and not any(path_present(r, tokens) for r in records):
            missing.append(path)
    if not missing:
        return ""
    return f": none of the first {len(records)} record(s) has {', '.join(missing)}"


def _ingest_metrics(con, plan: _Plan, *, run, at, index, keep_text: bool, strict: bool) -> dict:
    label = run or plan.path.name.split(".")[0]
    decision = metrics.decide_metrics_source(con, label, plan.path, fmt=plan.metrics_format, at=at, index=index)
    with src.one_transaction(con):
        summary = metrics.ingest_metrics_file(
            con, plan.path, run=label, decision=decision, fmt=plan.metrics_format, at=at, index=index,
            keep_text=keep_text,
        )
        if strict and summary.get("bad_lines"):
            raise InputError(
                f"{plan.path} has {summary['bad_lines']} malformed line(s); --strict keeps nothing from it",
                "Fix the lines, or drop --strict to ingest the good ones and keep the bad ones in ingest_errors",
            )
    summary = dict(summary)
    summary["skipped"] = summary.get("action") == "skip"
    summary["replaced"] = summary.get("action") == "replace"
    summary["runs"] = [label]
    if summary["skipped"]:
        summary["note"] = "already ingested: same content in the same run; nothing added"
    return summary


class _Progress:
    """A rich progress bar on stderr: bytes of input done, advanced inside a file by DuckDB's query progress."""

    def __init__(self, total: int, con: duckdb.DuckDBPyConnection) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.con = con
        try:
            con.execute("SET enable_progress_bar = true")  # query_progress() needs it; printing stays off
        except duckdb.Error:
            pass
        self.progress = Progress(
            TextColumn("[bold]ingest[/] {task.fields[name]}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
            console=Console(file=sys.stderr), transient=True,
        )
        self.task = self.progress.add_task("ingest", total=total, name="")
        self.done = 0
        self.current = 0
        self.stop = threading.Event()
        self.progress.start()
        self.thread: threading.Thread | None = None

    def start_file(self, path: Path) -> None:
        self.current = path.stat().st_size
        self.progress.update(self.task, name=path.name, completed=self.done)
        self.stop.clear()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.2):
            try:
                share = self.con.query_progress()
            except Exception:  # noqa: BLE001 - progress is cosmetic
                share = -1
            if share and share > 0:
                self.progress.update(self.task, completed=self.done + self.current * min(share, 100) / 100)

    def end_file(self, path: Path) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join()
        self.done += self.current
        self.progress.update(self.task, completed=self.done)

    def close(self) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join()
        self.progress.stop()
