"""Text for people about what is in the store: the ingest summary, the runs listing, and their pieces (time spans,
absolute or +hh:mm:ss on a relative clock, and column coverage)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path

EPOCH = datetime(1970, 1, 1)


def _as_datetime(value) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    return datetime.fromisoformat(str(value)).replace(tzinfo=None)


def relative(value) -> str:
    """A relative-clock time (offset from 1970-01-01) as +hh:mm:ss(.fff)."""
    moment = _as_datetime(value)
    seconds = (moment - EPOCH).total_seconds()
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"+{int(hours):02d}:{int(minutes):02d}:{int(secs):02d}"
    fraction = secs - int(secs)
    return text + (f".{int(round(fraction * 1000)):03d}" if fraction >= 0.0005 else "")


def format_span(t_min, t_max, relative_clock: bool) -> str:
    start, end = _as_datetime(t_min), _as_datetime(t_max)
    if start is None:
        return "no times"
    if relative_clock:
        return f"{relative(start)} → {relative(end)} (relative clock)"
    duration = (end - start).total_seconds() if end else 0
    same_day = end is not None and end.date() == start.date()
    end_text = end.strftime("%H:%M:%S") if same_day else end.strftime("%Y-%m-%d %H:%M:%S")
    return f"{start.strftime('%Y-%m-%d %H:%M:%S')} → {end_text} UTC ({_duration(duration)})"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def coverage_text(columns_filled: dict[str, float], width: int = 100) -> list[str]:
    """'filled: a, b, c' and 'partly: x 63%, y 2%' lines."""
    full = [c for c, share in columns_filled.items() if share >= 0.9995]
    partial = [f"{c} {share * 100:.0f}%" if share >= 0.01 else f"{c} <1%" for c, share in columns_filled.items() if share < 0.9995]
    lines = []
    if full:
        lines.append("filled: " + ", ".join(full))
    if partial:
        lines.append("partly: " + ", ".join(partial))
    return lines or ["no canonical column filled"]


def _short(runs: list[str], limit: int = 6) -> str:
    if len(runs) <= limit:
        return ", ".join(runs)
    return ", ".join(runs[:limit]) + f", … ({len(runs)} runs)"


def _namer(paths: list[str]):
    """Paths shown relative to the folder they all share (so sibling folders' requests.jsonl stay apart)."""
    import os

    if len(paths) < 2:
        return lambda p: Path(p).name
    try:
        base = os.path.commonpath(paths)
    except ValueError:
        return str
    if base in paths:
        base = str(Path(base).parent)
    return lambda p: os.path.relpath(p, base)


def ingest_text(report: dict, db_path: str | None = None) -> str:
    """The text summary of an ingest report: one block per request source, metrics grouped, then what was skipped."""
    lines: list[str] = []
    sources = report.get("sources", [])
    name_of = _namer([s["path"] for s in sources] + [s["path"] for s in report.get("skipped") or []])
    requests = [s for s in sources if s.get("kind", "requests") == "requests"]
    metrics = [s for s in sources if s.get("kind") == "metrics"]
    if db_path:
        lines.append(f"Store: {db_path}")
    for source in requests:
        runs = source.get("runs") or []
        name = name_of(source["path"])
        fmt = source["format"] + (f" in {source['wrapper']}" if source.get("wrapper") else "")
        lines.append(f"{name}  [{fmt}]  run{'s' if len(runs) != 1 else ''} {_short(runs)}")
        if source.get("skipped"):
            lines.append(f"  already ingested: same content in the same run; nothing added ({source['rows']} rows there)")
            continue
        verb = "replaced the earlier version: " if source.get("replaced") else ""
        lines.append(f"  {verb}{source['rows']} rows, {source['bad_lines']} bad lines, "
                     f"{format_span(source.get('t_min'), source.get('t_max'), source.get('relative_clock'))}")
        for text in coverage_text(source.get("columns_filled") or {}):
            lines.append(f"  {text}")
        if source.get("invalid_values"):
            counts = ", ".join(f"{c} {n:,}" for c, n in source["invalid_values"].items())
            lines.append(f"  impossible values stored as NULL (named in attrs.invalid_values): {counts}")
        if source.get("unparsed_times"):
            counts = ", ".join(f"{c} {n:,}" for c, n in source["unparsed_times"].items())
            lines.append(f"  times that do not read, stored as NULL (named in attrs.unparsed_times): {counts}")
        if source.get("converted_times"):
            counts = ", ".join(f"{c} {n:,}" for c, n in source["converted_times"].items())
            lines.append(f"  epochs in a larger unit than their field's, read in that unit (named in "
                         f"attrs.converted_times): {counts}")
        if source.get("bad_lines"):
            first = (source.get("errors") or [{}])[0]
            where = f"line {first.get('line')}" if first.get("line") is not None else "the file"
            lines.append(f"  bad lines are kept in ingest_errors (first: {where}: {first.get('reason')}); "
                         "--strict makes them an error")
    if metrics:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for source in metrics:
            groups[(source.get("format"), source.get("run"))].append(source)
        for (fmt, run), members in groups.items():
            new = [m for m in members if not m.get("skipped")]
            samples = sum(int(m.get("rows") or 0) for m in new)
            bad = sum(int(m.get("bad_lines") or 0) for m in new)
            time_sources = sorted({str(m.get("time_source")) for m in new if m.get("time_source")})
            text = f"{len(members)} metrics file{'s' if len(members) != 1 else ''}  [{fmt}]  run {run}: "
            if new:
                text += f"{samples} samples, {bad} bad lines"
                if time_sources:
                    text += f", scrape time from {', '.join(time_sources)}"
                t_min = min((m["t_min"] for m in new if m.get("t_min")), default=None)
                t_max = max((m["t_max"] for m in new if m.get("t_max")), default=None)
                if t_min:
                    text += f", {format_span(t_min, t_max, False)}"
            skipped = len(members) - len(new)
            if skipped:
                text += ("; " if new else "") + f"{skipped} already ingested (nothing added)"
            lines.append(text)
    for source in sources:
        if source.get("kind") == "engine_info":
            runs = source.get("runs") or []
            lines.append(f"{name_of(source['path'])}  [{source['format']}]  {source['slots']} slots of "
                         f"{source['n_ctx_per_slot']:,} tokens: applied to the {source['requests_annotated']} requests "
                         f"of its folder (run{'s' if len(runs) != 1 else ''} {_short(runs)}; attrs.parallel, "
                         "context_window)")
    skipped = report.get("skipped") or []
    if skipped:
        lines.append(f"Skipped {len(skipped)} file{'s' if len(skipped) != 1 else ''}:")
        by_reason: dict[str, list[str]] = defaultdict(list)
        for item in skipped:
            by_reason[item["reason"]].append(name_of(item["path"]))
        for reason, names in by_reason.items():
            if len(names) == 1:
                lines.append(f"  {names[0]}: {reason}")
            else:
                shown = ", ".join(names[:4]) + (f", … ({len(names)} files)" if len(names) > 4 else "")
                lines.append(f"  {shown}: {reason}")
    if not requests and not metrics:
        lines.append("Nothing ingested.")
    return "\n".join(lines)


def runs_text(document: dict, db_path: str) -> str:
    """`servlens runs` as text: per run its sources by kind, counts, time span, column coverage and request files."""
    if not document["runs"]:
        return f"No runs in {db_path}. Ingest something with 'servlens ingest'."
    lines = [f"Store: {db_path}", ""]
    for run in document["runs"]:
        kinds: dict[str, list[dict]] = {}
        for source in run["sources"]:
            kinds.setdefault(source["kind"], []).append(source)
        parts = []
        for kind, members in kinds.items():
            formats = sorted({m["format"] for m in members})
            parts.append(f"{len(members)} {kind} source{'s' if len(members) != 1 else ''} ({', '.join(formats)})")
        lines.append(f"{run['run']}: {'; '.join(parts) or 'no sources'}")
        lines.append(f"  {run['requests']} requests, {run['metric_samples']} metric samples, {run['bad_lines']} bad lines")
        lines.append(f"  {format_span(run['t_min'], run['t_max'], run['relative_clock'])}")
        if run["requests"]:
            for text in coverage_text(run["columns_filled"]):
                lines.append(f"  {text}")
        request_files = sorted({Path(s["path"]).name for s in run["sources"] if s["kind"] == "requests"})
        if request_files:
            lines.append(f"  from {', '.join(request_files)}")
        lines.append("")
    return "\n".join(lines).rstrip()
