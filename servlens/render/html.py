"""Self-contained HTML reports for analyze and compare result documents.

`render_html(doc)` turns a result document (docs/CONTRIBUTING.md "Result documents") into one HTML file that opens
anywhere with no network: CSS inline, charts as inline SVG (servlens/render/charts.py), no scripts at all, and a
Content-Security-Policy that forbids loading anything (default-src 'none'). Every value from the logs goes through
jinja2's autoescape; links are only ever <a href> to http(s) documentation.

Templates are jinja2 files in servlens/render/templates/ with one partial per section (`_finding.html`,
`_gates.html`, ...). A team restyles with `--templates DIR`: a file there replaces the built-in one of the same name,
and a user template can extend a built-in one as `{% extends "default:analyze.html" %}`.

The report's size is bounded (MAX_REPORT_BYTES) whatever went in: long tables, many findings and many cohorts are
cut to a fixed number of rows, and if the page is still too big it is rendered again with tighter limits. What was
left out is said on the page ("showing 50 of 12,408 rows; the JSON has them all").
"""

from __future__ import annotations

import json
import math
import re
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from servlens.documents import (AnalyzeDocument, Chart, CompareDocument, Coverage, Finding, Gate, Improvement, Scope,
                                 Side)
from servlens.errors import ConfigError, InputError
from servlens.escape import bound_fields

MAX_REPORT_BYTES = 2_000_000
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src 'none'; script-src 'none'; "
    "connect-src 'none'; base-uri 'none'; form-action 'none'"
)
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
VERDICT_ORDER = {"fail": 0, "inconclusive": 1, "pass": 2}
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Limits:
    """How much of a long input goes on the page; tightened step by step until the page fits the size bound."""

    table_rows: int = 50
    table_columns: int = 16
    examples: int = 20
    charts: int = 16
    detailed_findings: int = 60
    gate_rows: int = 200
    list_items: int = 60
    cell_chars: int = 300


LIMIT_LEVELS = [
    Limits(),
    Limits(table_rows=20, examples=10, charts=12, detailed_findings=40, gate_rows=120, list_items=40, cell_chars=200),
    Limits(table_rows=8, table_columns=10, examples=5, charts=8, detailed_findings=20, gate_rows=60, list_items=20,
           cell_chars=120),
    Limits(table_rows=3, table_columns=8, examples=3, charts=4, detailed_findings=10, gate_rows=30, list_items=10,
           cell_chars=80),
    Limits(table_rows=0, table_columns=6, examples=0, charts=0, detailed_findings=5, gate_rows=15, list_items=5,
           cell_chars=60),
]


def render_html(doc: dict, templates_dir: str | Path | None = None) -> str:
    """The HTML report for an analyze or compare result document (dispatch on doc["kind"])."""
    if not isinstance(doc, dict):
        raise InputError("A result document must be a JSON object", "Pass the output of `servlens analyze/compare --format json`")
    kind = doc.get("kind")
    if kind not in ("analyze", "compare"):
        raise InputError(
            f"Cannot render a document of kind {kind!r} as an HTML report",
            "HTML reports exist for 'analyze' and 'compare' results",
        )
    import jinja2

    environment = _environment(templates_dir)
    builder = _ReportBuilder(bound_fields(doc))  # one huge field cannot blow the page up (issue 15)
    token = _RELATIVE_CLOCK.set(builder.relative_clock)
    try:
        page = ""
        for limits in LIMIT_LEVELS:
            context = builder.context(limits)
            try:
                page = environment.get_template(f"{kind}.html").render(**context)
            except jinja2.TemplateError as exc:  # a user template: a missing include, a syntax error, a sandbox refusal
                where = f" ({exc.filename}, line {exc.lineno})" if getattr(exc, "lineno", None) else ""
                raise ConfigError(f"The report template cannot be rendered{where}: {exc.message or exc}",
                                  "Check the templates in --templates (docs/security.md says what they may do)") from None
            if len(page.encode("utf-8")) <= MAX_REPORT_BYTES:
                return page
        return page
    finally:
        _RELATIVE_CLOCK.reset(token)


def _environment(templates_dir: str | Path | None):
    """jinja2 environment: the user's folder first, then the built-ins (also reachable as "default:NAME")."""
    import jinja2

    builtin = jinja2.FileSystemLoader(str(TEMPLATES_DIR))
    loaders: list[jinja2.BaseLoader] = []
    if templates_dir is not None:
        folder = Path(templates_dir)
        if not folder.is_dir():
            raise ConfigError(f"Template folder '{folder}' does not exist", "Pass --templates a folder of .html files")
        loaders.append(jinja2.FileSystemLoader(str(folder)))
    loaders.append(jinja2.PrefixLoader({"default": builtin}, delimiter=":"))
    loaders.append(builtin)
    # A user's templates run in jinja2's sandbox (no attribute access to Python internals, no calls of unsafe
    # methods); the built-in ones render as before.
    environment_class = jinja2.Environment
    if templates_dir is not None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment_class = ImmutableSandboxedEnvironment
    environment = environment_class(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        num=format_number,
        seconds=format_seconds,
        pct=format_percent,
        when=format_time,
        span=format_span,
        duration=format_duration,
        cell=format_cell,
        humanize=humanize,
        plural=plural,
        thousands=lambda value: f"{value:,}" if isinstance(value, int) else format_cell(value),
    )
    environment.globals["csp"] = CONTENT_SECURITY_POLICY
    environment.globals["safe_link"] = safe_link
    environment.globals["plural"] = plural
    return environment


# ---------------------------------------------------------------- formatting (also used as jinja filters)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return None if (isinstance(value, float) and (math.isnan(value) or math.isinf(value))) else float(value)
    return None


def format_number(value: Any, digits: int = 4) -> str:
    """A number with `digits` significant digits and thousands separators; unknown stays visibly unknown."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    number = _finite(value)
    if number is None:
        return str(value)
    if number == 0:
        return "0"
    if number.is_integer() and abs(number) >= 1000 or abs(number) >= 10 ** digits:
        return f"{number:,.0f}"
    text = f"{number:.{digits}g}"
    if "e" in text:
        return f"{number:.{digits - 1}e}"
    return text


def format_seconds(value: Any) -> str:
    """Seconds as an engineer reads them: 85 ms, 1.24 s, 3 min 5 s."""
    number = _finite(value)
    if number is None:
        return "—" if value is None else str(value)
    magnitude = abs(number)
    if magnitude < 1:
        return f"{number * 1000:.3g} ms"
    if magnitude < 120:
        return f"{number:.3g} s"
    return format_duration(number)


def format_percent(value: Any, digits: int = 2) -> str:
    """A fraction (0.0123) as a percentage (1.23%)."""
    number = _finite(value)
    if number is None:
        return "—" if value is None else str(value)
    return f"{number * 100:.{digits}f}%"


def format_duration(seconds: Any) -> str:
    number = _finite(seconds)
    if number is None:
        return "—"
    total = int(round(abs(number)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{number:.3g} s"


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace(" ", "T", 1)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def format_time(value: Any, relative_clock: bool = False) -> str:
    """A timestamp as UTC wall clock, or +hh:mm:ss on a run with no absolute clock (DESIGN.md "Times")."""
    moment = parse_time(value)
    if moment is None:
        return "—" if value is None else str(value)
    if relative_clock:
        offset = int((moment - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds())
        return f"+{offset // 3600:02d}:{offset % 3600 // 60:02d}:{offset % 60:02d}"
    moment = moment.astimezone(timezone.utc)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond // 1000:03d}"
    return text + " UTC"


def format_span(start: Any, end: Any, relative_clock: bool = False) -> str:
    """A window as `start → end`, the end without its date when it is the same day."""
    first, last = format_time(start, relative_clock), format_time(end, relative_clock)
    if not relative_clock and first[:11] == last[:11] and first.endswith(" UTC") and last.endswith(" UTC"):
        return f"{first[:-4]} → {last[11:]}"
    return f"{first} → {last}"


def format_cell(value: Any, limit: int = 300) -> str:
    """Any JSON value as short text for a table cell."""
    if value is None:
        return "—"
    if isinstance(value, (bool, int, float)):
        return format_number(value)
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# A value already formatted as a quantity (41 ms, ×18.7, +0.20 pp, 12.5%): aligned right like a number.
_FORMATTED_NUMBER = re.compile(r"^[+\-−×]?[\d.,]+ ?(ms|s|%|pp)?$")
# Set while a document on a relative clock (DESIGN.md "Times") renders: its timestamps read +hh:mm:ss everywhere.
_RELATIVE_CLOCK: ContextVar[bool] = ContextVar("relative_clock", default=False)
_ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")


def format_keyed(key: Any, value: Any, limit: int = 300) -> str:
    """A value formatted by what its name says it is: `*_s` seconds, shares and rates as percentages,
    ISO timestamps as UTC clock time; anything else as format_cell."""
    name = str(key).lower()
    if _finite(value) is not None:
        if name.endswith("_s") or "_s_" in name or name in ("seconds", "s"):
            return format_seconds(value)
        if any(word in name for word in ("share", "rate", "fraction", "ratio_of")) and 0 <= abs(value) <= 1:
            return format_percent(value)
    if isinstance(value, str) and _ISO_TIME.match(value.strip()):
        return format_time(value, _RELATIVE_CLOCK.get())
    return format_cell(value, limit)


METRIC_NAMES = {
    "ttft_s": "TTFT", "ttft": "TTFT", "tpot_s": "TPOT", "tpot": "TPOT", "itl_s": "ITL", "e2e_s": "e2e latency",
    "e2e": "e2e latency", "queue_s": "queue time", "prefill_s": "prefill time", "decode_s": "decode time",
    "first_content_s": "time to first content", "error_rate": "error rate", "length_rate": "length-finish rate",
    "length_finish_rate": "length-finish rate", "timeout_rate": "timeout rate", "leak_rate": "leakage rate",
    "leakage_rate": "leakage rate",
}


def metric_name(metric: Any) -> str:
    return METRIC_NAMES.get(str(metric), str(metric).replace("_", " "))


_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "kv": "KV", "e2e": "e2e", "nowait": "no-wait",
             "slo": "SLO", "id": "id", "ci": "CI", "tvd": "TVD"}


def humanize(name: Any) -> str:
    """`run_ttft_p99_s` → `Run TTFT p99` (the unit shows in the formatted value, so a trailing `_s` goes)."""
    text = str(name)
    if text.endswith("_s") and len(text) > 2:
        text = text[:-2]
    words = [_ACRONYMS.get(word.lower(), word) for word in text.replace("_", " ").split()]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


_LABELLED_URL = re.compile(r"^(?P<label>.*?)[:\s]\s*(?P<url>https?://\S+)\s*$", re.S)


def reference(text: str) -> dict:
    """A reference as {label, link}: a bare URL, or "label: URL" as the rule files write them."""
    stripped = text.strip()
    if safe_link(stripped):
        return {"label": stripped, "link": stripped}
    match = _LABELLED_URL.match(stripped)
    if match and match.group("label").strip():
        return {"label": match.group("label").strip().rstrip(":"), "link": safe_link(match.group("url"))}
    return {"label": stripped, "link": None}


def plural(count: Any, word: str, words: str | None = None) -> str:
    number = count if isinstance(count, int) else 0
    return f"{format_number(count)} {word if number == 1 else (words or word + 's')}"


def safe_link(url: Any) -> str | None:
    """Only http(s) documentation links become <a href>; anything else (javascript:, data:) stays plain text."""
    if isinstance(url, str) and url.strip().lower().startswith(("https://", "http://")):
        return url.strip()
    return None


def is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


# ---------------------------------------------------------------- building the page's context


class _ReportBuilder:
    """Turns a result document into what the templates show, under given limits. Charts are drawn once and reused
    across the size-bound retries."""

    def __init__(self, doc: dict):
        self.doc = doc
        self._svg_cache: dict[int, dict] = {}
        # compare documents carry no clock of their own: their runs' times are not shown on a time axis
        self.relative_clock = doc["kind"] == "analyze" and doc["coverage"]["time_span"]["relative_clock"]

    # -- charts

    def chart(self, chart: Chart | None, budget: list[int], placeholder: bool = True) -> dict | None:
        """The rendered chart ({svg, title, notes}) if there is one and the page's chart budget allows; past the
        budget a placeholder saying so (or None when `placeholder` is false)."""
        if chart is None:
            return None
        if budget[0] <= 0:
            if not placeholder:
                return None
            return {"svg": None, "title": chart["title"], "notes": ["chart left out to keep the report small"]}
        budget[0] -= 1
        key = id(chart)
        if key not in self._svg_cache:
            from markupsafe import Markup

            from servlens.render.charts import chart_svg

            svg, notes = chart_svg(chart, f"c{len(self._svg_cache) + 1}", relative_clock=self.relative_clock)
            self._svg_cache[key] = {"svg": Markup(svg), "title": chart["title"], "notes": notes}
        return self._svg_cache[key]

    # -- tables

    def table(self, columns: Any, rows: Any, limits: Limits, note_total: int | None = None) -> dict:
        columns = [str(c) for c in (columns or [])]
        rows = [r for r in (rows or []) if isinstance(r, (list, tuple))]
        shown_columns = columns[: limits.table_columns]
        shown = [[format_keyed(shown_columns[i] if i < len(shown_columns) else "", cell, limits.cell_chars)
                  for i, cell in enumerate(row[: len(shown_columns) or None])]
                 for row in rows[: limits.table_rows]]
        numeric = [
            bool(rows) and all(_finite(row[i]) is not None or row[i] is None
                               or isinstance(row[i], str) and _FORMATTED_NUMBER.match(row[i])
                               for row in rows[:50] if i < len(row))
            for i in range(len(shown_columns))
        ]
        times = [
            bool(rows) and all(isinstance(row[i], str) and _ISO_TIME.match(row[i].strip()) or row[i] is None
                               for row in rows[:50] if i < len(row))
            for i in range(len(shown_columns))
        ]
        total = note_total if note_total is not None else len(rows)
        return {
            "columns": shown_columns,
            "numeric": numeric,
            "times": times,
            "rows": shown,
            "total_rows": total,
            "hidden_rows": max(0, total - len(shown)),
            "hidden_columns": max(0, len(columns) - len(shown_columns)),
        }

    def records_table(self, records: list, limits: Limits) -> dict:
        """A table from a list of dicts: columns in order of first appearance; nested dicts flattened one level
        ("bands model"), per-cohort latency summaries as "TTFT p50 before → after" columns."""
        records = [_flatten_record(record) for record in records[: max(limits.table_rows, 1) * 4 + 200]] \
            if any(any(isinstance(v, dict) and not _is_chart_value(v) for v in r.values()) for r in records[:50]) \
            else records
        columns: list[str] = []
        for record in records[:200]:
            for key in record:
                if key not in columns and not _is_chart_value(record[key]):
                    columns.append(key)
        rows = [[_unit_aware(record, column) for column in columns] for record in records]
        table = self.table(columns, rows, limits)
        table["columns"] = [humanize(c) for c in table["columns"]]
        return table

    # -- generic blocks (workload, coverage and mix-shift sections whose shape belongs to other modules)

    def blocks(self, value: Any, limits: Limits, budget: list[int], title: str | None = None, depth: int = 0) -> list:
        """Render any JSON value as a list of blocks: kv (scalars), table, chart, list, section (nested)."""
        out: list[dict] = []
        if _is_chart_value(value):
            return [{"kind": "chart", "title": title, "chart": self.chart(value, budget)}]
        if isinstance(value, dict):
            if isinstance(value.get("columns"), list) and isinstance(value.get("rows"), list):
                return [{"kind": "table", "title": title, "table": self.table(value["columns"], value["rows"], limits)}]
            if isinstance(value.get("before"), dict) and isinstance(value.get("after"), dict):
                # {"before": {...}, "after": {...}} reads best side by side.
                keys = list(dict.fromkeys([*value["before"], *value["after"]]))
                keys = [k for k in keys if is_scalar(value["before"].get(k)) and is_scalar(value["after"].get(k))]
                rows = [[humanize(k), format_keyed(k, value["before"].get(k)), format_keyed(k, value["after"].get(k))]
                        for k in keys]
                out.append({"kind": "table", "title": title, "table": self.table(["", "before", "after"], rows, limits)})
                title = None
                value = {k: v for k, v in value.items() if k not in ("before", "after")}
            # A null in a generic section is an absent note (no explanation, no summary), not a measurement.
            scalars = [(humanize(k), format_keyed(k, v, limits.cell_chars * 4)) for k, v in value.items()
                       if is_scalar(v) and v is not None]
            lists = {k: v for k, v in value.items() if isinstance(v, list) and v and all(is_scalar(x) for x in v)}
            # Short values (model names, band labels) read as one line; sentences (skipped files and why) as a list.
            long_lists = {k: v for k, v in lists.items() if any(len(format_cell(x)) > 40 for x in v)}
            scalar_lists = [
                (humanize(k), ", ".join(format_cell(item, 80) for item in v[: limits.list_items])
                 + (f" … and {len(v) - limits.list_items} more" if len(v) > limits.list_items else ""))
                for k, v in lists.items() if k not in long_lists
            ]
            if scalars or scalar_lists:
                out.append({"kind": "kv", "title": title, "items": scalars + scalar_lists})
                title = None
            for key, items in long_lists.items():
                out.append({"kind": "list", "title": humanize(key),
                            "items": [format_cell(x, limits.cell_chars) for x in items[: limits.list_items]],
                            "hidden": max(0, len(items) - limits.list_items)})
            nested = [(k, v) for k, v in value.items()
                      if not (is_scalar(v) or (isinstance(v, list) and all(is_scalar(x) for x in v)))]
            if len(nested) > limits.list_items:
                # e.g. a workload profile of thousands of runs: the first ones, and a count of the rest
                out.append({"kind": "list", "title": None, "items": [],
                            "hidden": len(nested) - limits.list_items})
                nested = nested[: limits.list_items]
            for key, item in nested:
                if depth >= 4:
                    out.append({"kind": "kv", "title": None, "items": [(humanize(key), format_cell(item, 200))]})
                    continue
                inner = self.blocks(item, limits, budget, None, depth + 1)
                if len(inner) == 1 and inner[0]["kind"] == "chart":
                    out.append(inner[0])  # a chart carries its own title; "Chart" / "Prompt histogram" adds nothing
                elif inner:
                    out.append({"kind": "section", "title": humanize(key), "blocks": inner, "depth": depth})
            if title and out and out[0].get("title") is None:
                out[0]["title"] = title
            return out
        if isinstance(value, list):
            if not value:
                return [{"kind": "kv", "title": title, "items": [("", "none")]}] if title else []
            if all(_is_chart_value(item) for item in value):
                charts = [self.chart(item, budget, placeholder=False) for item in value]
                return [{"kind": "chart", "title": title if index == 0 else None, "chart": rendered}
                        for index, rendered in enumerate(charts) if rendered is not None]
            if all(isinstance(item, dict) for item in value):
                table = self.records_table(value, limits)
                out.append({"kind": "table", "title": title, "table": table})
                for item in value[: limits.table_rows]:
                    for key, nested in item.items():
                        rendered = self.chart(nested, budget, placeholder=False) if _is_chart_value(nested) else None
                        if rendered is not None:
                            out.append({"kind": "chart", "title": None, "chart": rendered})
                return out
            if all(is_scalar(item) for item in value):
                return [{"kind": "kv", "title": title,
                         "items": [("", ", ".join(format_cell(v, 80) for v in value[: limits.list_items]))]}]
            for index, item in enumerate(value[: limits.list_items]):
                out.extend(self.blocks(item, limits, budget, f"{title or 'item'} {index + 1}", depth + 1))
            return out
        return [{"kind": "kv", "title": title, "items": [("", format_cell(value, limits.cell_chars))]}]

    # -- the two documents

    def context(self, limits: Limits) -> dict:
        budget = [limits.charts]
        common = {
            "doc": self.doc,
            "kind": self.doc["kind"],
            "limits": limits,
            "generated_at": self.doc["generated_at"],
            "servlens_version": self.doc["servlens_version"],
            "schema_version": self.doc["schema_version"],
            "relative_clock": self.relative_clock,
        }
        if self.doc["kind"] == "analyze":
            common.update(self._analyze(limits, budget))
        else:
            common.update(self._compare(limits, budget))
        return common

    def _analyze(self, limits: Limits, budget: list[int]) -> dict:
        doc: AnalyzeDocument = self.doc
        findings = doc["findings"]
        fired = sorted((f for f in findings if f["state"] == "fired"),
                       key=lambda f: (SEVERITY_ORDER[f["severity"]], f["rule"], _scope_text(f["scope"])))
        not_evaluable = sorted((f for f in findings if f["state"] == "not_evaluable"),
                               key=lambda f: (f["rule"], _scope_text(f["scope"])))
        clear = sorted((f for f in findings if f["state"] == "clear"), key=lambda f: (f["rule"], _scope_text(f["scope"])))

        detailed = [self._finding(f, index, limits, budget)
                    for index, f in enumerate(fired[: limits.detailed_findings], start=1)]
        by_severity: dict[str, int] = {}
        for finding in fired:
            by_severity[finding["severity"]] = by_severity.get(finding["severity"], 0) + 1

        runs = doc["run"] if isinstance(doc["run"], list) else [doc["run"]]
        return {
            "title": "Incident report" + (f": {', '.join(str(r) for r in runs)}" if runs else ""),
            "runs": runs,
            "coverage": self._coverage(doc["coverage"], limits),
            "fired": detailed,
            "fired_total": len(fired),
            "fired_not_detailed": [
                {"anchor": f"finding-{i}", **_finding_head(f)}
                for i, f in enumerate(fired[limits.detailed_findings:], start=limits.detailed_findings + 1)
            ][: max(limits.gate_rows, 15)],
            "fired_hidden": max(0, len(fired) - limits.detailed_findings - max(limits.gate_rows, 15)),
            "by_severity": [(s, by_severity[s]) for s in sorted(by_severity, key=SEVERITY_ORDER.__getitem__)],
            "top_severity": min((f["severity"] for f in fired), key=SEVERITY_ORDER.__getitem__, default=None),
            "not_evaluable": [_finding_head(f) for f in not_evaluable[: limits.gate_rows]],
            "not_evaluable_total": len(not_evaluable),
            "clear": [_finding_head(f) for f in clear[: limits.gate_rows]],
            "clear_total": len(clear),
            "workload": self.blocks(doc["workload"], limits, budget),
            "story": self._story(limits, budget),
        }

    def _story(self, limits: Limits, budget: list[int]) -> dict | None:
        """The cause chains (paragraph and links) and goodput with the capacity charts (issue 20)."""
        from servlens.render import story

        chains = [{"summary": c["summary"], "links": self.table(story.LINK_COLUMNS, story.link_rows(c), limits)}
                  for c in story.chains(self.doc)]
        g = story.goodput(self.doc)
        if not chains and not g:
            return None
        goodput = None
        if g:
            capacity = g.get("capacity", {})
            scopes = [{"name": story.scope_name(s), "chart": self.chart(s.get("chart"), budget, placeholder=False),
                       "table": self.table(story.CAPACITY_COLUMNS, story.capacity_rows(s), limits)}
                      for s in capacity.get("scopes", [])]
            goodput = {"summary": g["summary"], "note": capacity.get("note"),
                       "window_chart": self.chart(g.get("per_window", {}).get("chart"), budget, placeholder=False),
                       "curves_chart": self.chart((g.get("curves") or {}).get("chart"), budget, placeholder=False),
                       "scopes": scopes}
        return {"chains": chains, "goodput": goodput}

    def _coverage(self, coverage: Coverage, limits: Limits) -> dict:
        sources = coverage["sources"]
        span = coverage["time_span"]
        start, end = parse_time(span["start"]), parse_time(span["end"])
        columns_present = coverage["columns_present"]
        from servlens.store.schema import REQUEST_COLUMNS

        known = [c for c in REQUEST_COLUMNS if c not in ("run", "source_id", "source_line", "attrs")]
        columns_absent = [c for c in known if c not in columns_present] if columns_present else []
        extra = {"skipped": coverage["skipped"]} if "skipped" in coverage else {}
        return {
            "sources": self.records_table(_group_scrapes(sources), replace(limits, table_rows=max(limits.table_rows, 10))),
            "source_files": len(sources),
            "bad_lines": sum(s["bad_lines"] for s in sources),
            "runs": _clip_list(coverage["runs"], limits),
            "requests": coverage["requests"],
            "start": span["start"],
            "end": span["end"],
            "duration_s": (end - start).total_seconds() if start and end else None,
            "relative_clock": span["relative_clock"],
            "models": _clip_list(coverage["models"], limits),
            "columns_present": columns_present,
            "columns_absent": columns_absent,
            "metrics_present": _clip_list(coverage["metrics_present"], limits, 4),
            "extra": self.blocks(extra, limits, [0]) if extra else [],
        }

    def _finding(self, finding: Finding, index: int, limits: Limits, budget: list[int]) -> dict:
        evidence = finding["evidence"]
        table = evidence["table"]
        examples = finding["examples"]
        return {
            **_finding_head(finding),
            "anchor": f"finding-{index}",
            # A metric the scope cannot give (NULL) is not a measurement: shown as in the text and Markdown, not at all.
            "metrics": [(humanize(k), format_keyed(k, v, limits.cell_chars)) for k, v in evidence["metrics"].items()
                        if v is not None],
            "thresholds": [(humanize(k), format_keyed(k, v, limits.cell_chars))
                           for k, v in evidence["thresholds"].items()],
            "windows": evidence["windows"][: limits.list_items],
            "table": self.table(table["columns"], table["rows"], limits) if table else None,
            "chart": self.chart(evidence["chart"], budget),
            "examples": [
                {"request_id": format_cell(e["request_id"], 120), "source": format_cell(e["source"], 200),
                 "line": e["line"]}
                for e in examples[: limits.examples]
            ],
            "examples_total": len(examples),
            "remediation": _clip(finding["remediation"], limits.cell_chars * 20),
            "rollback": _clip(finding["rollback"], limits.cell_chars * 20),
            "references": [reference(r) for r in finding["references"]][:10],
        }

    def _compare(self, limits: Limits, budget: list[int]) -> dict:
        doc: CompareDocument = self.doc
        gates = doc["gates"]
        ordered = sorted(enumerate(gates),
                         key=lambda pair: (VERDICT_ORDER[pair[1]["verdict"]], not pair[1]["critical"], pair[0]))
        gate_rows = [self._gate(gate, limits) for _, gate in ordered[: limits.gate_rows]]
        gate_charts = []
        with_detail = [gate for _, gate in ordered if gate.get("chart") is not None or gate.get("cohorts")]
        hidden_charts = 0
        residual_drawn: set[str] = set()
        for gate in with_detail[: limits.gate_rows]:
            rendered = self.chart(gate.get("chart"), budget, placeholder=False)
            if rendered is None and gate.get("chart") is not None:
                hidden_charts += 1
            cohorts = self._gate_cohorts(gate, limits)
            if rendered is None and cohorts is None:
                continue
            # the covariate adjustment's check (log latency against log prompt tokens), once per metric
            residual = None
            if gate.get("residual_chart") is not None and gate["metric"] not in residual_drawn:
                residual = self.chart(gate["residual_chart"], budget, placeholder=False)
                residual_drawn.add(gate["metric"])
            gate_charts.append({"gate": self._gate(gate, limits), "chart": rendered, "cohorts": cohorts,
                                "residual": residual})
        counts: dict[str, int] = {}
        for gate in gates:
            counts[gate["verdict"]] = counts.get(gate["verdict"], 0) + 1
        rollback = [
            {"verdict": gate["verdict"], "critical": gate["critical"], "name": gate["name"],
             "text": _clip(gate["rollback_criterion"], limits.cell_chars * 10),
             "rule": _clip(gate["rule"], limits.cell_chars * 10)}
            for _, gate in ordered
        ][: limits.gate_rows]
        before, after = doc["before"], doc["after"]
        # what the page has no section of its own for (the goodput gate of --slo)
        extra = {"goodput_gate": doc["goodput_gate"]} if "goodput_gate" in doc else {}
        cohorts = doc["cohorts"]
        # notes: sentences on what the comparison could not see (unknown token counts, rates banded coarser), and
        # the bands merged to reach the minimum cohort size; method: one sentence per aspect of the statistics.
        notes = doc["notes"] + [f"bands merged to reach {doc['policy']['min_cohort_requests']} requests a side: {m}"
                                for m in doc["merged_bands"]]
        notes = [format_cell(n, limits.cell_chars * 5) for n in notes]
        method_items = [(humanize(k), format_cell(v, limits.cell_chars * 15)) for k, v in doc["method"].items()]
        return {
            "title": "Release gate: " + " → ".join(_side_label(side) for side in (before, after)),
            "verdict": doc["verdict"],
            "reason": _clip(doc["reason"], limits.cell_chars * 20),
            "before": before,
            "after": after,
            "sides": self._sides(before, after, limits),
            "coverage": self.blocks(doc["coverage"], limits, budget),
            "mix_shift": self.blocks(doc["mix_shift"], limits, budget),
            "gates": gate_rows,
            "gates_total": len(gates),
            "verdict_counts": [(v, counts[v]) for v in sorted(counts, key=lambda v: VERDICT_ORDER.get(v, 3))],
            "gate_charts": gate_charts,
            "gate_charts_hidden": hidden_charts,
            "rollback": rollback,
            "improvements": self._improvements(doc["improvements"], limits),
            "cohorts": self.blocks(cohorts, limits, budget) if cohorts else [],
            "cohorts_total": len(cohorts),
            "policy": self.blocks(doc["policy"], limits, budget),
            "notes": notes[: limits.list_items],
            "notes_hidden": max(0, len(notes) - limits.list_items),
            "method": method_items,
            "extra": self.blocks(extra, limits, budget) if extra else [],
        }

    def _sides(self, before: Side, after: Side, limits: Limits) -> list[tuple[str, str, str]]:
        """Before and after run summaries side by side: run, requests, models, sources."""
        return [(humanize(key), _side_value(key, before[key], limits), _side_value(key, after[key], limits))
                for key in ("run", "requests", "models", "sources")]

    def _improvements(self, improvements: list[Improvement], limits: Limits) -> list:
        """Clear improvements, one sentence each (the gate named once)."""
        if not improvements:
            return []
        items = [format_cell(i["summary"] if i["summary"].startswith(i["gate"]) else f"{i['gate']}: {i['summary']}",
                             limits.cell_chars * 3) for i in improvements]
        return [{"kind": "list", "title": None, "items": items[: limits.list_items],
                 "hidden": max(0, len(items) - limits.list_items)}]

    def _gate_cohorts(self, gate: Gate, limits: Limits) -> dict | None:
        """A gate's per-cohort results (the diagnostics behind a mix-adjusted headline) as a table."""
        cohorts = gate.get("cohorts", [])
        if not cohorts:
            return None
        latency = gate["kind"] == "latency"
        value = format_seconds if latency else format_percent
        rows = []
        for cohort in cohorts:
            if cohort.get("ratio") is not None:
                change = _signed_percent_from_ratio(cohort["ratio"]) if cohort["ratio"] < 2 else _multiple(cohort["ratio"])
            elif cohort.get("diff") is not None:
                change = _signed_points(cohort["diff"])
            elif cohort.get("before") is not None and cohort.get("after") is not None and not latency:
                change = _signed_points(cohort["after"] - cohort["before"])
            else:
                change = "—"
            rows.append([format_cell(cohort.get("cohort"), limits.cell_chars), format_number(cohort.get("n_before")),
                         format_number(cohort.get("n_after")), value(cohort.get("before")),
                         value(cohort.get("after")), change,
                         "yes" if cohort.get("compared", True) else "no (too few requests)"])
        table = self.table(["cohort", "n before", "n after", "before", "after", "change", "compared"], rows, limits)
        table["numeric"] = [False, True, True, True, True, True, False]
        return table

    def _gate(self, gate: Gate, limits: Limits) -> dict:
        metric, statistic = gate["metric"], gate["statistic"]
        # a latency gate is a ratio after/before, a rate gate a difference of shares (servlens.documents.Gate)
        is_ratio = gate["kind"] == "latency"
        if is_ratio:
            ratio, high = _finite(gate.get("ratio")), _finite(gate.get("ci_high"))
            # Past 2× a multiple reads better than "+3808.9%".
            as_multiple = (ratio is not None and ratio >= 2) or (high is not None and high >= 3)
            show = _multiple if as_multiple else _signed_percent_from_ratio
            change = show(gate.get("ratio"))
            interval = (show(gate.get("ci_low")), show(gate.get("ci_high")))
            tolerance = _tolerance_text(gate.get("tolerance"), ratio=True)
        else:
            change = _signed_points(gate.get("diff"))
            interval = (_signed_points(gate.get("ci_low")), _signed_points(gate.get("ci_high")))
            tolerance = _tolerance_text(gate.get("tolerance"), ratio=False)
        tolerance = gate.get("tolerance_text") or tolerance
        value = {"s": format_seconds, "share": format_percent}.get(gate["unit"], format_number)
        note = gate.get("reason")
        if gate.get("thin_tail"):
            note = f"{gate['thin_tail']}" + (f"; {note}" if note else "")
        if gate.get("requests_needed"):
            note = (f"{note or 'undecided'}; about {gate['requests_needed']:,} requests a side would detect the "
                    f"tolerance")
        return {
            "name": gate["name"],
            "metric": metric,
            "statistic": statistic,
            "cohort": format_cell(gate["cohort"] if gate["cohort"] is not None else "all (mix-adjusted)",
                                  limits.cell_chars),
            "before": value(gate["before"]),
            "after": value(gate["after"]),
            "change": change,
            "interval": interval if any(part != "—" for part in interval) else None,
            "tolerance": tolerance,
            "critical": gate["critical"],
            "verdict": gate["verdict"],
            "n_before": gate.get("n_before"),
            "n_after": gate.get("n_after"),
            "note": _clip(note, limits.cell_chars * 3),
        }


def _flatten_record(record: dict) -> dict:
    flat: dict = {}
    for key, value in record.items():
        if key == "latency" and isinstance(value, dict):
            for metric, sides in value.items():
                if not isinstance(sides, dict):
                    continue
                before, after = sides.get("before") or {}, sides.get("after") or {}
                for statistic in ("p50", "p99"):
                    if statistic in before or statistic in after:
                        flat[f"{metric_name(metric)} {statistic} before → after"] = (
                            f"{format_seconds(before.get(statistic))} → {format_seconds(after.get(statistic))}")
        elif key == "bands" and isinstance(value, dict) and isinstance(record.get("cohort"), str):
            continue  # compare's cohort label already names its bands ("qwen3-8b / 256–511 prompt tokens")
        elif isinstance(value, dict) and not _is_chart_value(value):
            for inner_key, inner in value.items():
                if is_scalar(inner):
                    flat[f"{key} {inner_key}"] = inner
        else:
            flat[key] = value
    return flat


def _unit_aware(record: dict, column: str) -> Any:
    """A record that states its unit ("s" or "share", as compare's naive-vs-adjusted rows do) has its
    before/after values and its change formatted in that unit; other values pass through."""
    value, unit = record.get(column), record.get("unit")
    number = _finite(value)
    if unit not in ("s", "share") or number is None:
        return value
    name = column.lower()
    if "change" in name:
        if unit == "s":  # ratio − 1
            return _multiple(1 + number) if number >= 1 else _signed_percent_from_ratio(1 + number)
        return _signed_points(number)
    if "before" in name or "after" in name:
        return format_seconds(number) if unit == "s" else format_percent(number)
    return value


def _clip(text: Any, limit: int) -> Any:
    """Free text cut to `limit` characters (a log can put megabytes into a message); None stays None."""
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip_list(values: Any, limits: Limits, factor: int = 1) -> list[str]:
    """A list of names for one line of the coverage header, with a count of what did not fit."""
    items = [format_cell(v, 120) for v in (values or [])]
    keep = limits.list_items * factor
    return items if len(items) <= keep else items[:keep] + [f"… and {len(items) - keep:,} more"]


def _group_scrapes(sources: list[dict]) -> list[dict]:
    """Request-log sources one per row; Prometheus scrapes (often one file a second) one row per folder and format."""
    rows: list[dict] = []
    groups: dict[tuple, dict] = {}
    for source in sources:
        if source.get("kind") != "metrics":
            # One file split into several runs is listed once, with its rows summed.
            key = ("requests", source.get("path"), source.get("format"), source.get("kind"))
            group = groups.get(key)
            if group is None:
                group = groups[key] = {**source, "rows": 0, "bad_lines": 0, "_runs": 0}
                rows.append(group)
            group["_runs"] += 1
            group["rows"] += int(source.get("rows") or 0)
            group["bad_lines"] += int(source.get("bad_lines") or 0)
            continue
        path = str(source.get("path") or "")
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else "./"
        key = (folder, source.get("format"))
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"path": path, "format": source.get("format"), "kind": "metrics", "rows": 0,
                                   "bad_lines": 0, "_files": 0, "_folder": folder}
            rows.append(group)
        group["_files"] += 1
        group["rows"] += int(source.get("rows") or 0)
        group["bad_lines"] += int(source.get("bad_lines") or 0)
    for row in rows:
        if row.get("_files", 0) > 1:
            row["path"] = f"{row['_folder']} ({row['_files']} scrape files)"
        if row.get("_runs", 0) > 1:
            row["path"] = f"{row['path']} ({row['_runs']} runs)"
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def _side_label(side: Side) -> str:
    """What a run is called in the title: its label, or where it came from when the label is just before/after."""
    label = side["run"]
    paths = [s["path"] for s in side["sources"]]
    if label in ("before", "after") and paths:
        folders = {p.rsplit("/", 1)[0] if "/" in p else p for p in paths}
        # The folder's name; its full path is in the runs table below the verdict.
        return folders.pop().rstrip("/").rsplit("/", 1)[-1] if len(folders) == 1 else f"{label} ({len(paths)} files)"
    return label


def _side_value(key: str, value: Any, limits: Limits) -> str:
    if key == "sources":
        shown = [f"{v['path']} ({v['format'] or 'unknown format'}, {format_number(v['rows'])} rows)"
                 for v in value[: limits.list_items]]
        more = f" … and {len(value) - len(shown)} more" if len(value) > len(shown) else ""
        return "; ".join(shown) + more
    if isinstance(value, list):
        return ", ".join(format_cell(v, 80) for v in value[: limits.list_items])
    return format_keyed(key, value, limits.cell_chars)


def _is_chart_value(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("type"), str) and isinstance(value.get("series"), list)


def _signed_percent_from_ratio(ratio: Any) -> str:
    number = _finite(ratio)
    if number is None:
        return "—"
    return f"{(number - 1) * 100:+.1f}%"


def _multiple(ratio: Any) -> str:
    number = _finite(ratio)
    return "—" if number is None else f"×{number:.3g}"


def _signed_points(diff: Any) -> str:
    """A difference of two rates (fractions) in percentage points."""
    number = _finite(diff)
    if number is None:
        return "—"
    return f"{number * 100:+.2f} pp"


def _tolerance_text(tolerance: Any, ratio: bool) -> str:
    """Tolerance as the policy states it: +10% for a ratio (given as 0.10 or 1.10), +0.50 pp for a rate."""
    number = _finite(tolerance)
    if number is None:
        return "—" if tolerance is None else format_cell(tolerance)
    if ratio:
        relative = number - 1 if number >= 1 else number
        return f"{relative * 100:+.0f}%" if float(relative * 100).is_integer() else f"{relative * 100:+.1f}%"
    return f"{number * 100:+.2f} pp"


def _scope_text(scope: Scope) -> str:
    return " · ".join(f"{k} {v}" for k, v in scope.items() if v is not None)


def _finding_head(finding: Finding) -> dict:
    """What every listing of a finding shows: rule, name, title, severity, state, scope, summary, reason."""
    return {
        "rule": format_cell(finding["rule"], 40),
        "name": format_cell(finding["name"], 80),
        "title": _clip(finding["title"], 300),
        "severity": finding["severity"],
        "state": finding["state"],
        "scope": _scope_text(finding["scope"]) or "all traffic",
        "summary": _clip(finding["summary"], 6000),
        "reason": _clip(finding["reason"], 3000),
    }
