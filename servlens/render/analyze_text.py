"""The analyze result document as terminal text: fired findings first (critical, warning, info), then what could
not be evaluated (said loudly, with what is missing), then what is clear. Plain text, so it reads the same in a
terminal, a pipe or a CI log."""

from __future__ import annotations

import textwrap
from typing import Any

from servlens.escape import strip_controls

WIDTH = 110
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def scope_text(scope: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items() if v is not None) or "all"


def value_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def source_text(example: dict) -> str:
    source = example.get("source")
    if not source:
        return example.get("request_id") or "?"
    name = str(source).rsplit("/", 1)[-1]
    return f"{example.get('request_id')} ({name}:{example.get('line')})"


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False) or [indent]


def counts(doc: dict) -> dict:
    findings = doc["findings"]
    fired = [f for f in findings if f["state"] == "fired"]
    return {
        "fired": len(fired),
        "by_severity": {s: sum(1 for f in fired if f["severity"] == s) for s in ("critical", "warning", "info")},
        "not_evaluable": sum(1 for f in findings if f["state"] == "not_evaluable"),
        "clear": sum(1 for f in findings if f["state"] == "clear"),
    }


def headline(doc: dict) -> str:
    c = counts(doc)
    severities = ", ".join(f"{n} {s}" for s, n in c["by_severity"].items() if n)
    fired = f"{c['fired']} fired ({severities})" if c["fired"] else "nothing fired"
    return f"{fired}, {c['not_evaluable']} not evaluable, {c['clear']} clear"


_COLORS = {"CRITICAL": "red", "WARNING": "yellow", "INFO": "blue", "FIRED": None, "NOT EVALUABLE": "yellow"}


def render_analyze_text(doc: dict, color: bool = False) -> str:
    """The report as text; `color` adds ANSI colours to severities and headings (a terminal, never a file or pipe).
    Control characters from log values are stripped before servlens adds its own colours."""
    text = strip_controls(_render_plain(doc))
    return _colorize(text) if color else text


def _render_plain(doc: dict) -> str:
    cover = doc.get("coverage") or {}
    span = cover.get("time_span") or {}
    runs = doc["run"] if isinstance(doc["run"], list) else [doc["run"]]
    lines = [
        f"servlens analyze: {len(runs)} run(s) ({', '.join(runs)}), {cover.get('requests', 0)} requests, "
        f"{len(cover.get('sources') or [])} source(s), {span.get('start') or '?'} to {span.get('end') or '?'}"
        + (" (relative clock)" if span.get("relative_clock") else ""),
        "",
    ]
    findings = doc["findings"]
    fired = sorted((f for f in findings if f["state"] == "fired"),
                   key=lambda f: (_SEVERITY_ORDER[f["severity"]], f["rule"]))
    if fired:
        lines.append("FIRED")
        for f in fired:
            lines.append(f"  {f['severity'].upper():<8} {f['rule']} {f['name']}  [{scope_text(f['scope'])}]")
            lines += _wrap(f["summary"], "    ")
            ev = f.get("evidence") or {}
            if ev.get("windows"):
                shown = ", ".join(f"{w['start']} to {w['end']}" for w in ev["windows"][:3])
                more = f" (+{len(ev['windows']) - 3} more)" if len(ev["windows"]) > 3 else ""
                lines += _wrap(f"windows: {shown}{more}", "    ")
            metrics = {k: v for k, v in (ev.get("metrics") or {}).items() if v is not None}
            if metrics:
                lines += _wrap("evidence: " + ", ".join(f"{k}={value_text(v)}" for k, v in list(metrics.items())[:14]), "    ")
            if ev.get("thresholds"):
                lines += _wrap("lines crossed: " + ", ".join(f"{k}={value_text(v)}" for k, v in ev["thresholds"].items()), "    ")
            if f.get("examples"):
                lines += _wrap("examples: " + ", ".join(source_text(e) for e in f["examples"]), "    ")
            if f.get("remediation"):
                lines += _wrap("what to do: " + f["remediation"], "    ")
            if f.get("rollback"):
                lines += _wrap("rollback: " + f["rollback"], "    ")
            lines.append("")
    not_evaluable = [f for f in findings if f["state"] == "not_evaluable"]
    if not_evaluable:
        lines.append(f"NOT EVALUABLE ({len(not_evaluable)}): these checks had no data to judge; they are not clear")
        for f in not_evaluable:
            lines += _wrap(f"{f['rule']} {f['name']} [{scope_text(f['scope'])}]: {f['reason']}", "  ")
        lines.append("")
    clear = [f for f in findings if f["state"] == "clear"]
    if clear:
        lines.append(f"CLEAR ({len(clear)})")
        for f in clear:
            lines += _wrap(f"{f['rule']} {f['name']} [{scope_text(f['scope'])}]: {f['summary']}", "  ")
        lines.append("")
    workload = (doc.get("workload") or {}).get("summary") or []
    if workload:
        lines.append("WORKLOAD")
        for line in workload:
            lines += _wrap(line, "  ")
        lines.append("")
    lines.append("Summary: " + headline(doc) + ".")
    return "\n".join(lines) + "\n"


def _colorize(text: str) -> str:
    import click

    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        for word, fg in _COLORS.items():
            if stripped.startswith(word):
                line = line.replace(word, click.style(word, fg=fg, bold=True), 1)
                break
        lines.append(line)
    return "\n".join(lines) + "\n"
