"""The analyze result document as Markdown for an incident ticket, a pull-request comment or a CI step summary:
a headline, one table of fired findings, a section per fired finding, and collapsed lists of what was not
evaluable and what was clear. Log values are escaped so a request id cannot break the table or inject markup."""

from __future__ import annotations

from servlens.analysis.workload import peak_rates
from servlens.render import story
from servlens.escape import md_escape as _md_escape
from servlens.escape import strip_controls
from servlens.render.analyze_text import headline, scope_text, value_text

_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def md_escape(value) -> str:
    """A log value as literal Markdown on one line (servlens.escape); numbers as the text report shows them."""
    return _md_escape(value_text(value) if not isinstance(value, str) else value)


def render_analyze_markdown(doc: dict) -> str:
    cover = doc.get("coverage") or {}
    span = cover.get("time_span") or {}
    runs = doc["run"] if isinstance(doc["run"], list) else [doc["run"]]
    findings = doc["findings"]
    fired = sorted((f for f in findings if f["state"] == "fired"),
                   key=lambda f: (_SEVERITY_ORDER[f["severity"]], f["rule"]))
    out = [f"## servlens analyze: {headline(doc)}", "",
           f"Runs: {', '.join(md_escape(r) for r in runs)} · {cover.get('requests', 0)} requests · "
           f"{md_escape(span.get('start') or '?')} to {md_escape(span.get('end') or '?')}"
           + (" (relative clock)" if span.get("relative_clock") else ""), ""]
    out += _story(doc)
    keys = story.chain_keys(doc)
    if fired:
        out += ["| Severity | Rule | Scope | Finding |", "|---|---|---|---|"]
        for f in fired:
            chain = story.chain_of(f, keys)
            out.append(f"| {_ICON[f['severity']]} {f['severity']} | {f['rule']} {md_escape(f['name'])}"
                       + (f" (chain {chain})" if chain else "") + " | "
                       f"{md_escape(scope_text(f['scope']))} | {md_escape(f['summary'])} |")
        out.append("")
        for f in fired:
            ev = f.get("evidence") or {}
            out += [f"### {_ICON[f['severity']]} {f['rule']} {md_escape(f['title'])} ({md_escape(scope_text(f['scope']))})",
                    "", md_escape(f["summary"]), ""]
            metrics = {k: v for k, v in (ev.get("metrics") or {}).items() if v is not None}
            if metrics:
                out += ["| Evidence | Value |", "|---|---|"]
                out += [f"| {md_escape(k)} | {md_escape(v)} |" for k, v in metrics.items()]
                out.append("")
            if ev.get("thresholds"):
                out += ["Lines: " + ", ".join(f"{md_escape(k)} = {md_escape(v)}" for k, v in ev["thresholds"].items()), ""]
            if ev.get("windows"):
                out += ["Windows: " + ", ".join(f"{md_escape(w['start'])} to {md_escape(w['end'])}" for w in ev["windows"][:5]), ""]
            if f.get("examples"):
                out.append("Example requests:")
                for e in f["examples"]:
                    where = f" ({md_escape(str(e['source']).rsplit('/', 1)[-1])}:{e['line']})" if e.get("source") else ""
                    out.append(f"- {md_escape(e.get('request_id') or '?')}{where}")
                out.append("")
            out += [f"**What to do:** {md_escape(f['remediation'])}", "",
                    f"**Rollback criteria:** {md_escape(f['rollback'])}", ""]
    else:
        out += ["No rule fired.", ""]
    not_evaluable = [f for f in findings if f["state"] == "not_evaluable"]
    if not_evaluable:
        out += [f"<details><summary>⚠️ Not evaluable ({len(not_evaluable)}): no data to judge, not clear</summary>", "",
                "| Rule | Scope | Missing |", "|---|---|---|"]
        out += [f"| {f['rule']} {md_escape(f['name'])} | {md_escape(scope_text(f['scope']))} | {md_escape(f['reason'])} |"
                for f in not_evaluable]
        out += ["", "</details>", ""]
    clear = [f for f in findings if f["state"] == "clear"]
    if clear:
        out += [f"<details><summary>Clear ({len(clear)})</summary>", "", "| Rule | Scope | Summary |", "|---|---|---|"]
        out += [f"| {f['rule']} {md_escape(f['name'])} | {md_escape(scope_text(f['scope']))} | {md_escape(f['summary'])} |"
                for f in clear]
        out += ["", "</details>", ""]
    workload = doc.get("workload") or {}
    if workload.get("summary"):
        out += ["### Workload", ""] + _peak_table(workload.get("runs") or {})
        out += [f"- {md_escape(line)}" for line in workload["summary"]] + [""]
    return strip_controls("\n".join(out))


MAX_PEAK_ROWS = 20


def _story(doc: dict) -> list[str]:
    """The chains (a paragraph and a table of links each), then goodput and the capacity per scope."""
    out = []
    chains = story.chains(doc)
    if chains:
        out += ["### Cause chains", ""]
        for number, chain in enumerate(chains, start=1):
            out += [f"{number}. {md_escape(chain['summary'])}", ""]
            out += ["   | " + " | ".join(story.LINK_COLUMNS) + " |", "   |" + "---|" * len(story.LINK_COLUMNS)]
            out += ["   | " + " | ".join(md_escape(v) for v in row) + " |" for row in story.link_rows(chain)]
            out.append("")
    g = story.goodput(doc)
    if g:
        out += ["### Goodput and capacity", "", md_escape(g["summary"]), ""]
        for scope in (g.get("capacity") or {}).get("scopes") or []:
            rows = story.capacity_rows(scope)
            if not rows:
                continue
            out += [f"Requests in flight at arrival, {md_escape(story.scope_name(scope))}:", "",
                    "| " + " | ".join(story.CAPACITY_COLUMNS) + " |", "|" + "---|" * len(story.CAPACITY_COLUMNS)]
            out += ["| " + " | ".join(md_escape(v) for v in row) + " |" for row in rows[:MAX_PEAK_ROWS]]
            out.append("")
    return out


def _peak_table(profiles: dict) -> list[str]:
    """Each run's peak request rate at 1 s, 1 min and over the peak window: a one-second burst does not hide
    behind a 30-minute mean."""
    rows = []
    for run, profile in profiles.items():
        peaks = peak_rates(profile)
        if peaks:
            cells = [peaks.get(k, f"n/a (run under {k})") for k in ("1 s", "1 min", "window")]
            rows.append(f"| {md_escape(run)} | {profile.get('requests', 0):,} | "
                        + " | ".join(md_escape(c) for c in cells) + " |")
    if not rows:
        return []
    hidden = len(rows) - MAX_PEAK_ROWS
    more = ["", f"{hidden} more runs in the JSON result."] if hidden > 0 else []
    return (["| Run | Requests | Peak rate, 1 s | Peak rate, 1 min | Peak window |", "|---|---|---|---|---|"]
            + rows[:MAX_PEAK_ROWS] + more + [""])
