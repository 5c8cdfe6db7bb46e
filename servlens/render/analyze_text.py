"""The analyze result document as terminal text.

By default a page a person reads at once: one line per fired finding (critical, warning, info: severity,
rule, scope, headline), then per rule how many checks fired, were clear and were not evaluable (with what they
need), then one line per run of workload. `verbose` adds each finding's evidence, examples, what to do and
rollback, every not-evaluable and clear check with its reason, and the full workload profile; JSON, Markdown and
HTML always keep everything. Plain text, so it reads the same in a terminal, a pipe or a CI log.
"""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from typing import Any

from servlens.analysis.workload import duration, peak_rates
from servlens.render import story
from servlens.escape import bound_fields, strip_controls

WIDTH = 110
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
# Runs listed in the default workload section; --verbose lists every one.
MAX_WORKLOAD_RUNS = 12
# The workload sections the verbose text spells out, in the order the profile computes them.
_PROFILE_SECTIONS = ("rate", "lengths", "prefix_sharing", "concurrency", "latency", "context_budget")


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


def _wrap(text: str, indent: str, hanging: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent,
                         subsequent_indent=indent if hanging is None else hanging,
                         break_on_hyphens=False, break_long_words=False) or [indent]


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


def _clauses(text: str) -> list[str]:
    """`text` split at '; ' outside parentheses: a summary's clauses, a reason's alternatives."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    return [p.strip() for p in parts + [text[start:]] if p.strip()]


def finding_headline(finding: dict) -> str:
    """The first clause of a finding's summary: what happened, without the supporting numbers. A long clause
    that opens with its own headline ('Timeouts at a fixed limit of about 120 s: 10 failed requests ...') is
    cut to that headline; a bare label ('Context overflow: ...') keeps its numbers."""
    clauses = _clauses(finding.get("summary") or "")
    if not clauses:
        return finding.get("title") or finding["name"]
    first = clauses[0].rstrip(".")
    lead, colon, _ = first.partition(": ")
    return lead if colon and len(first) > 100 and len(lead) >= 20 else first


def short_reason(reason: str | None) -> str:
    """A not-evaluable reason in a few words: the evidence a rule needs, without the columns it lacks."""
    if not reason:
        return "no reason given"
    if reason.startswith("needs "):
        body = reason[len("needs "):].removeprefix("one of: ")
        names = [alt.split(" (missing ", 1)[0] for alt in _clauses(body)]
        if len(names) > 3:
            return f"needs {', '.join(names[:2])} or one of {len(names) - 2} other sources"
        return "needs " + (f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0])
    return _clauses(reason)[0].rstrip(".")


def rule_counts(findings: list[dict]) -> list[str]:
    """One line per rule: its checks fired, clear and not evaluable, and what the not-evaluable ones need."""
    by_rule: dict[tuple[str, str], list[dict]] = {}
    for f in findings:
        by_rule.setdefault((f["rule"], f["name"]), []).append(f)
    lines = []
    for (rule, name), checks in sorted(by_rule.items()):
        states = Counter(f["state"] for f in checks)
        line = (f"{rule} {name}: {states['fired']} fired, {states['clear']} clear, "
                f"{states['not_evaluable']} not evaluable")
        reasons = Counter(short_reason(f.get("reason")) for f in checks if f["state"] == "not_evaluable")
        if len(reasons) == 1:
            line += f" ({next(iter(reasons))})"
        elif reasons:
            reason, n = reasons.most_common(1)[0]
            line += f" ({n} of {states['not_evaluable']}: {reason}; --verbose lists the others' reasons)"
        lines.append(line)
    return lines


def workload_parts(p: dict) -> list[str]:
    """One run's workload as the phrases of one line: requests, span, the peak rate at 1 s and 1 min (the peak
    window when the run is shorter than a second), concurrency, errors."""
    if not p.get("requests"):
        return [f"{p['run']}: no request logs (metrics only)"]
    span = f" over {duration(p['span_s'])}" if p.get("span_s") else ""
    parts = [f"{p['run']}: {p['requests']:,} requests{span}"]
    peaks = peak_rates(p, named=True)
    window = peaks.pop("window", None)
    peaks = list(peaks.values()) or ([window] if window else [])
    parts += [f"peak {peaks[0]}", *peaks[1:]] if peaks else []
    if (p.get("concurrency") or {}).get("in_flight_max") is not None:
        parts.append(f"up to {p['concurrency']['in_flight_max']} in flight")
    if p.get("error_share"):
        parts.append(f"{p['error_share']:.1%} errors")
    return parts


def _wrap_parts(parts: list[str], indent: str, hanging: str) -> list[str]:
    """Phrases joined by ', ' and wrapped between phrases, never inside one ('in 1 min at T' stays whole)."""
    lines, current = [], indent
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else "")
        if current.strip() and len(current) + 1 + len(piece) > WIDTH:
            lines.append(current)
            current = hanging + piece
        else:
            current += (" " if current.strip() else "") + piece
    return lines + [current]


_COLORS = {"CRITICAL": "red", "WARNING": "yellow", "INFO": "blue", "FIRED": None, "NOT EVALUABLE": "yellow"}


def render_analyze_text(doc: dict, color: bool = False, verbose: bool = False) -> str:
    """The report as text; `color` adds ANSI colours to severities and headings (a terminal, never a file or
    pipe); `verbose` adds the evidence of each finding, every check with its reason and the full workload.
    Control characters from log values are stripped before servlens adds its own colours."""
    text = strip_controls(_render_plain(bound_fields(doc), verbose))  # a huge field is cut (issue 15)
    return _colorize(text) if color else text


def _render_plain(doc: dict, verbose: bool = False) -> str:
    cover = doc.get("coverage") or {}
    span = cover.get("time_span") or {}
    runs = doc["run"] if isinstance(doc["run"], list) else [doc["run"]]
    lines = _wrap(
        f"servlens analyze: {len(runs)} run(s) ({', '.join(runs)}), {cover.get('requests', 0)} requests, "
        f"{len(cover.get('sources') or [])} source(s), {span.get('start') or '?'} to {span.get('end') or '?'}"
        + (" (relative clock)" if span.get("relative_clock") else ""), "", "  ") + [""]
    lines += _story_lines(doc, verbose)
    findings = doc["findings"]
    fired = sorted((f for f in findings if f["state"] == "fired"),
                   key=lambda f: (_SEVERITY_ORDER[f["severity"]], f["rule"]))
    if fired:
        suffix = "" if verbose else deployment_suffix(fired)
        scopes = ("run / " if len(runs) > 1 else "") + "model / deployment"
        scopes += f" (…{suffix})" if suffix else ""
        lines += (["FIRED (" + str(len(fired)) + ")"] if verbose
                  else _wrap(f"FIRED ({len(fired)}): severity, rule [{scopes}]: what happened", "", "  "))
        keys = story.chain_keys(doc)
        for f in fired:
            lines += _fired_lines(f, verbose, one_run=len(runs) == 1, suffix=suffix, chain=story.chain_of(f, keys))
        lines += [""] if not verbose else []
    if findings:
        lines.append(f"CHECKS BY RULE ({len(findings)}: each rule on each run, model and deployment)")
        for line in rule_counts(findings):
            lines += _wrap(line, "  ", "    ")
        lines.append("")
    if verbose:
        lines += _verbose_checks(findings)
    lines += _workload_lines(doc.get("workload") or {}, verbose)
    lines.append("Summary: " + headline(doc) + ".")
    if not verbose and findings:
        lines.append("--verbose adds each finding's evidence, examples, what to do and rollback, and the reason "
                     "of every check.")
    return "\n".join(lines) + "\n"


def short_scope(scope: dict, one_run: bool, common_suffix: str = "") -> str:
    """A scope's values for the one-line view: run / model / deployment, without the run when the report has
    only one, and a deployment without its URL scheme and the host suffix every deployment shares."""
    values = []
    for key, value in scope.items():
        if value is None or (one_run and key == "run"):
            continue
        if key == "deployment":
            value = str(value).split("://", 1)[-1]
            value = value[: -len(common_suffix)] if common_suffix and value.endswith(common_suffix) else value
        values.append(str(value))
    return " / ".join(values) or "all"


def deployment_suffix(findings: list[dict]) -> str:
    """The host suffix all the findings' deployments share ('.inference.svc.cluster.local:8000/v1'), cut at a
    dot, when at least two differ: said once in the heading instead of on every line."""
    names = sorted({str(f["scope"]["deployment"]).split("://", 1)[-1] for f in findings
                    if f["scope"].get("deployment")})
    if len(names) < 2:
        return ""
    suffix = os.path.commonprefix([name[::-1] for name in names])[::-1]
    suffix = suffix[suffix.find("."):] if "." in suffix else ""
    return suffix if len(suffix) >= 8 and all(len(n) > len(suffix) for n in names) else ""


def _fired_lines(f: dict, verbose: bool, one_run: bool = False, suffix: str = "", chain: int | None = None) -> list[str]:
    in_chain = f" (chain {chain})" if chain else ""
    if not verbose:
        scope = short_scope(f["scope"], one_run, suffix)
        lead = f"{f['severity'].upper():<8} {f['rule']} {f['name']} [{scope}]{in_chain}"
        return _wrap(f"{lead}: {finding_headline(f)}", "  ", " " * 11)
    lead = f"{f['severity'].upper():<8} {f['rule']} {f['name']} [{scope_text(f['scope'])}]{in_chain}"
    lines = ["  " + lead]
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
        lines += _wrap("lines crossed: " + ", ".join(f"{k}={value_text(v)}" for k, v in ev["thresholds"].items()),
                       "    ")
    if f.get("examples"):
        lines += _wrap("examples: " + ", ".join(source_text(e) for e in f["examples"]), "    ")
    if f.get("remediation"):
        lines += _wrap("what to do: " + f["remediation"], "    ")
    if f.get("rollback"):
        lines += _wrap("rollback: " + f["rollback"], "    ")
    return lines + [""]


def _verbose_checks(findings: list[dict]) -> list[str]:
    lines = []
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
    return lines


def _story_lines(doc: dict, verbose: bool) -> list[str]:
    """The chains first (one paragraph each), then goodput and where each target breaks."""
    lines = []
    chains = story.chains(doc)
    if chains:
        lines.append(f"CAUSE CHAINS ({len(chains)}): what caused what; the findings below marked (chain N) are its "
                     "links, the others stand alone")
        for number, chain in enumerate(chains, start=1):
            lines += _wrap(f"{number}. {chain['summary']}", "  ", "     ")
            if verbose:
                for row in story.link_rows(chain):
                    lines += _wrap(f"step {row[0]}: {row[1]} [{row[2]}] {row[3]} requests"
                                   + (f", {row[4]} shared with the cause: {row[5]}" if row[4] is not None else ""),
                                   "     ", "       ")
        lines.append("")
    g = story.goodput(doc)
    if g and (g.get("targets") or verbose):
        lines.append("GOODPUT AND CAPACITY")
        lines += _wrap(g["summary"], "  ")
        if verbose:
            for scope in (g.get("capacity") or {}).get("scopes") or []:
                lines.append(f"  in flight at arrival, {story.scope_name(scope)}: "
                             + " | ".join(story.CAPACITY_COLUMNS))
                for row in story.capacity_rows(scope):
                    lines.append("    " + " | ".join(_cell(v) for v in row))
        lines.append("")
    return lines


def _workload_lines(workload: dict, verbose: bool) -> list[str]:
    profiles = list((workload.get("runs") or {}).values())
    summaries = workload.get("summary") or []
    if not profiles and not summaries:
        return []
    lines = ["WORKLOAD"]
    if verbose or not profiles:
        # The full sentence of each run, then its profile section by section (charts are in the HTML report).
        for index, summary in enumerate(summaries):
            lines += _wrap(summary, "  ")
            if index < len(profiles):
                lines += _profile_lines(profiles[index])
        return lines + [""]
    for p in profiles[:MAX_WORKLOAD_RUNS]:
        lines += _wrap_parts(workload_parts(p), "  ", "    ")
    if len(profiles) > MAX_WORKLOAD_RUNS:
        lines.append(f"  … and {len(profiles) - MAX_WORKLOAD_RUNS} more runs (--verbose lists every one)")
    return lines + [""]


def _profile_lines(p: dict) -> list[str]:
    lines = []
    for key in _PROFILE_SECTIONS:
        section = p.get(key)
        if not isinstance(section, dict):
            continue
        lines += _section_lines(key.replace("_", " "), section, "    ")
    if p.get("note"):
        lines += _wrap(f"note: {p['note']}", "    ")
    return lines


def _section_lines(title: str, section: dict, indent: str) -> list[str]:
    """A profile section as text: its scalars on a line, nested values (peaks, tables) below; no charts."""
    # A null is unknown (a peak the run is too short for, a count without its field): n/a, not dropped.
    scalars = [f"{k}={value_text(v)}" for k, v in section.items() if not isinstance(v, (dict, list))]
    lines = _wrap(f"{title}: " + ", ".join(scalars), indent, indent + "  ") if scalars else [indent + title + ":"]
    for key, value in section.items():
        if not isinstance(value, dict) or "series" in value:
            continue
        if isinstance(value.get("columns"), list) and isinstance(value.get("rows"), list):
            lines += _table_lines(key.replace("_", " "), value, indent + "  ")
        else:
            lines += _section_lines(key, value, indent + "  ")
    return lines


def _table_lines(title: str, table: dict, indent: str) -> list[str]:
    columns = [str(c) for c in table["columns"]]
    rows = [[_cell(v) for v in row] for row in table["rows"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    out = [f"{indent}{title}:"]
    for row in [columns, *rows]:
        out.append(indent + "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return out


def _cell(value: Any) -> str:
    """A table cell: counts and token lengths as whole numbers, seconds with four significant digits."""
    if isinstance(value, float) and (value.is_integer() or abs(value) >= 1000):
        return f"{value:.0f}"
    return value_text(value)


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
