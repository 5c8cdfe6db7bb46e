"""The declarative part of a SQL rule: `[views]`, `[decide]`, `[summary]` and `[evidence.*]` (docs/rules-contract.md).

    [views]                        # optional: temp views the rule's SQL reads, created in this order per scope
    leak_requests = '''SELECT ... FROM scope_requests ...'''

    [decide]                       # SQL predicates over the metrics row (the detector's one row) and $params
    not_evaluable = "known < $min_requests"      # optional; needs reason and summary.not_evaluable
    reason = "only {known} requests ..."         # template over metrics + params
    fired = "share >= $max_share"                # required; NULL is false
    [[decide.severity]]                          # optional; the last matching entry wins
    level = "critical"
    when = "share >= $critical_share"

    [summary]                      # templates (str.format over metrics + params; None prints n/a)
    fired = "..."
    clear = "..."
    not_evaluable = "..."

    [evidence.table]     sql                      rows = the table, column names = its headers
    [evidence.chart]     type title x_label y_label [x_time x_log y_log y_logit] sql [hlines_sql vlines_sql
                         vspans_sql]             columns x and y [series], or x and one column per series
    [evidence.windows]   sql                      columns start, end [, label]
    [evidence.examples]  where [order_by from limit]   a predicate over `from` (default scope_requests)
                         each evidence table may say always = true to be computed for clear findings too
                         (never for not-evaluable ones)

Validation is strict like the rest of the rule file: every error names the file, the key and what is allowed.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servlens.analysis.rule_sql import used_params
from servlens.errors import ConfigError

SEVERITIES = ("info", "warning", "critical")
CHART_TYPES = ("line", "step", "bar", "scatter", "cdf")
_VIEW_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Views the runner makes for every rule: a rule's own view may not shadow them.
RESERVED_VIEWS = ("scope_requests", "scope_metrics", "scope_counter_increases", "scope_windows", "scope_role_samples",
                  "metric_roles", "rule_metrics", "requests", "metric_samples", "sources", "runs")

DECIDE_KEYS = ("not_evaluable", "reason", "fired", "severity")
SEVERITY_KEYS = ("level", "when")
SUMMARY_KEYS = ("fired", "clear", "not_evaluable")
EVIDENCE_KEYS = {
    "table": ("sql", "always"),
    "chart": ("type", "title", "x_label", "y_label", "x_time", "x_log", "y_log", "y_logit", "sql", "hlines_sql",
              "vlines_sql", "vspans_sql", "always"),
    "windows": ("sql", "always"),
    "examples": ("where", "order_by", "from", "limit", "always"),
}


@dataclass(frozen=True)
class SeverityUpgrade:
    level: str
    when: str


@dataclass(frozen=True)
class Decide:
    fired: str
    not_evaluable: str | None = None
    reason: str | None = None
    severity: tuple[SeverityUpgrade, ...] = ()


@dataclass(frozen=True)
class Summary:
    fired: str
    clear: str
    not_evaluable: str | None = None


@dataclass(frozen=True)
class EvidenceSpec:
    """One `[evidence.KIND]` table: its keys as given (SQL texts under *sql / where / order_by)."""

    kind: str
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def always(self) -> bool:
        return bool(self.spec.get("always", False))

    def sql_items(self) -> list[tuple[str, str]]:
        """(key, SQL) for every SQL this evidence runs, for checks and transpiling."""
        keys = ("where", "order_by") if self.kind == "examples" else ("sql", "hlines_sql", "vlines_sql", "vspans_sql")
        return [(k, self.spec[k]) for k in keys if k in self.spec]


@dataclass(frozen=True)
class Contract:
    """The declarative SQL rule: None on a Python rule or a SQL rule of the older state/summary-column form."""

    decide: Decide
    summary: Summary
    views: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, EvidenceSpec] = field(default_factory=dict)

    def sql_items(self) -> list[tuple[str, str]]:
        """(TOML key, SQL) for every SQL of the contract except the detector's."""
        items = [(f"views.{name}", sql) for name, sql in self.views.items()]
        items.append(("decide.fired", self.decide.fired))
        if self.decide.not_evaluable:
            items.append(("decide.not_evaluable", self.decide.not_evaluable))
        items += [(f"decide.severity[{i}].when", s.when) for i, s in enumerate(self.decide.severity)]
        for kind, spec in self.evidence.items():
            items += [(f"evidence.{kind}.{key}", sql) for key, sql in spec.sql_items()]
        return items


def _bad(path: Path, key: str, problem: str, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: {key} {problem}", f"Allowed: {allowed}")


def _table(data: dict, key: str, path: Path, allowed: tuple[str, ...]) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _bad(path, key, "must be a table", ", ".join(allowed))
    for sub in value:
        if sub not in allowed:
            raise _bad(path, f"{key}.{sub}", "is not a known key", ", ".join(allowed))
    return value


def _text(spec: dict, key: str, where: str, path: Path, what: str, required: bool = True) -> str | None:
    value = spec.get(key)
    if value is None and not required:
        return None
    if not (isinstance(value, str) and value.strip()):
        raise _bad(path, where, "must be a non-empty string", what)
    return value.strip()


def _parse_decide(data: dict, path: Path) -> Decide:
    spec = _table(data, "decide", path, DECIDE_KEYS)
    fired = _text(spec, "fired", "decide.fired", path, "a SQL predicate over the metrics row, e.g. share >= $max")
    not_evaluable = _text(spec, "not_evaluable", "decide.not_evaluable", path, "a SQL predicate", required=False)
    reason = _text(spec, "reason", "decide.reason", path, "a template saying what is missing", required=False)
    if not_evaluable and not reason:
        raise _bad(path, "decide.reason", "is missing (decide.not_evaluable needs it)",
                   "a template over the metrics, e.g. \"only {known} requests\"")
    if reason and not not_evaluable:
        raise _bad(path, "decide.reason", "is given without decide.not_evaluable", "both or neither")
    severities = []
    raw = spec.get("severity", [])
    if not isinstance(raw, list):
        raise _bad(path, "decide.severity", "must be an array of tables [[decide.severity]]", "level, when")
    for index, entry in enumerate(raw):
        where = f"decide.severity[{index}]"
        if not isinstance(entry, dict):
            raise _bad(path, where, "must be a table", "level, when")
        for key in entry:
            if key not in SEVERITY_KEYS:
                raise _bad(path, f"{where}.{key}", "is not a known key", ", ".join(SEVERITY_KEYS))
        if entry.get("level") not in SEVERITIES:
            raise _bad(path, f"{where}.level", f"{entry.get('level')!r} is not a severity", ", ".join(SEVERITIES))
        severities.append(SeverityUpgrade(entry["level"], _text(entry, "when", f"{where}.when", path, "a SQL predicate")))
    return Decide(fired, not_evaluable, reason, tuple(severities))


def _parse_evidence(data: dict, path: Path) -> dict[str, EvidenceSpec]:
    raw = _table(data, "evidence", path, tuple(EVIDENCE_KEYS))
    out = {}
    for kind, spec in raw.items():
        spec = _table(raw, kind, path, EVIDENCE_KEYS[kind])
        where = f"evidence.{kind}"
        if kind == "examples":
            _text(spec, "where", f"{where}.where", path, "a SQL predicate over scope_requests columns")
            for key in ("order_by", "from"):
                _text(spec, key, f"{where}.{key}", path, "SQL text", required=False)
            limit = spec.get("limit", 5)
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 50:
                raise _bad(path, f"{where}.limit", f"{limit!r} is not a count", "an integer from 1 to 50")
        else:
            _text(spec, "sql", f"{where}.sql", path, "a SELECT over rule_metrics and the scope views")
        if kind == "chart":
            if spec.get("type") not in CHART_TYPES:
                raise _bad(path, f"{where}.type", f"{spec.get('type')!r} is not a chart type", ", ".join(CHART_TYPES))
            for key in ("title", "x_label", "y_label"):
                _text(spec, key, f"{where}.{key}", path, "one line")
            for key in ("hlines_sql", "vlines_sql", "vspans_sql"):
                _text(spec, key, f"{where}.{key}", path, "a SELECT", required=False)
        for key in ("always", "x_time", "x_log", "y_log", "y_logit"):
            if key in spec and not isinstance(spec[key], bool):
                raise _bad(path, f"{where}.{key}", "must be true or false", "true, false")
        out[kind] = EvidenceSpec(kind, dict(spec))
    return out


def _parse_views(data: dict, path: Path) -> dict[str, str]:
    raw = data.get("views", {})
    if not isinstance(raw, dict):
        raise _bad(path, "views", "must be a table of NAME = SQL", "[views] with name = '''SELECT ...'''")
    views = {}
    for name, sql in raw.items():
        if not _VIEW_NAME_RE.match(name) or name in RESERVED_VIEWS or name.startswith("scope_"):
            raise _bad(path, f"views.{name}", "is not a name a rule's view may take",
                       "snake_case, not starting with scope_ and none of " + ", ".join(RESERVED_VIEWS))
        views[name] = _text(raw, name, f"views.{name}", path, "a SELECT")
    return views


def parse_contract(data: dict, path: Path, has_sql: bool) -> Contract | None:
    """The contract of a rule's parsed TOML; None for a Python rule or an older-form SQL rule (no [decide])."""
    parts = [key for key in ("decide", "summary", "evidence", "views") if key in data]
    if not has_sql:
        if parts:
            raise _bad(path, parts[0], "applies to SQL detectors only",
                       "remove it, or write the detector as [detector] sql")
        return None
    if "decide" not in data:
        if parts:
            raise _bad(path, "decide", "is missing (" + ", ".join(parts) + " need it)",
                       "[decide] with fired = a SQL predicate over the detector's row")
        return None
    decide = _parse_decide(data, path)
    summary_spec = _table(data, "summary", path, SUMMARY_KEYS)
    summary = Summary(
        _text(summary_spec, "fired", "summary.fired", path, "a sentence template over the metrics"),
        _text(summary_spec, "clear", "summary.clear", path, "a sentence template over the metrics"),
        _text(summary_spec, "not_evaluable", "summary.not_evaluable", path, "a sentence template",
              required=decide.not_evaluable is not None),
    )
    return Contract(decide, summary, _parse_views(data, path), _parse_evidence(data, path))


def check_params(path: Path, items: list[tuple[str, str]], declared: set[str]) -> None:
    """Every $name any SQL uses is a declared parameter."""
    for key, sql in items:
        undeclared = sorted(used_params(sql) - declared)
        if undeclared:
            raise _bad(path, key, "uses undeclared parameter(s) " + ", ".join("$" + u for u in undeclared),
                       "declare each as [params.NAME]")


class _SafeFormatter(string.Formatter):
    """str.format over evidence values where a missing or non-numeric value prints as 'n/a' instead of raising."""

    def get_value(self, key, args, kwargs):
        return kwargs.get(key) if isinstance(key, str) else None

    def format_field(self, value, format_spec):
        if value is None:
            return "n/a"
        try:
            return format(value, format_spec)
        except (TypeError, ValueError):
            return str(value)


def fill_template(template: str, values: dict[str, Any]) -> str:
    return _SafeFormatter().format(template, **values)
