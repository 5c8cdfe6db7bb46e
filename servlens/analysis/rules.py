"""Rule files: loading, strict validation, parameters and overrides.

A rule is one TOML file (rules/SL004-queue-driven-ttft-spike.toml). The loader accepts exactly the keys below and
rejects anything else with the file, the key and what is allowed, so a typo in a threshold's name never silently
falls back to a default.

    id = "SL004"                          # ^[A-Z]{2,4}[0-9]{3}$, stable, never reused
    name = "queue-driven-ttft-spike"      # kebab-case, names the problem
    title = "..."                         # one line
    severity = "warning"                  # info | warning | critical
    status = "stable"                     # preview | stable | deprecated
    since = "0.1.0"                       # optional
    tags = ["latency"]                    # optional
    remediation = "..."                   # what to change; {placeholders} take the finding's metrics/thresholds
    rollback = "..."                      # a condition to watch after the change, same placeholders
    documentation = '''## What it detects ... ## References'''   # fixed headings, in order (DOC_HEADINGS)

    aliases = ["SL104"]                   # optional: old ids that still select this rule and take its --set

    [detector]                            # exactly one of:
    python = "servlens.analysis.detectors.sl004_queue_driven_ttft_spike:detect"      # a statistical detector (module:function)
    sql = '''SELECT ... FROM scope_requests ...'''                # or SQL over the scope views, $param placeholders
    why_python = "..."                    # top level, required with detector.python: why SQL cannot carry it

    [views] / [decide] / [summary] / [evidence.*]   # a SQL rule's declarative part: servlens/analysis/rule_contract.py

    [[requires]]                          # evidence paths; the rule is evaluable when any one is present
    id = "queue_time"                     # snake_case, unique in the rule; Python detectors refer to this id
    name = "per-request queue time"       # for the not-evaluable reason
    columns = ["ttft_s", "queue_s"]       # canonical request columns that must be non-NULL somewhere in the scope
    metrics = []                          # normalised metric names that must have samples in the scope's run

    [params.min_queue_share]
    default = 0.5
    reason = "Queueing must explain at least half of the slow requests' TTFT to call the spike queue-driven."
    min = 0.0                             # optional bounds for numbers
    max = 1.0
    choices = []                          # optional allowed values for strings
"""

from __future__ import annotations

import importlib
import importlib.resources
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from servlens.analysis.rule_contract import Contract, check_params, parse_contract
from servlens.analysis.rule_params import Param
from servlens.errors import ConfigError
from servlens.sandbox import RULE_VIEWS, SqlSyntaxError, check_rule_expression, check_rule_sql, is_user_rule
from servlens.store import metric_roles
from servlens.store.schema import REQUEST_COLUMNS

SEVERITIES = ("info", "warning", "critical")
STATUSES = ("preview", "stable", "deprecated")
# The engines a rule's `engines` key may name: where its parity with DuckDB (the reference) is tested
# (tests/engines). chdb is ClickHouse's own server code in-process, so it stands for a ClickHouse server too.
ENGINES = ("duckdb", "chdb", "spark")
STATES = ("fired", "clear", "not_evaluable")
# The documentation's headings, in this order (checked by the loader, printed by `servlens rules explain`).
DOC_HEADINGS = (
    "What it detects",
    "Why it matters",
    "What it can see",
    "How to confirm",
    "What to do",
    "Rollback criteria",
    "References",
)

_ID_RE = re.compile(r"^[A-Z]{2,4}[0-9]{3}$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")
_PYTHON_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_PARAM_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")

_TOP_KEYS = {
    "id": "a rule id such as SL004",
    "name": "a kebab-case name",
    "title": "one line",
    "severity": "|".join(SEVERITIES),
    "status": "|".join(STATUSES),
    "since": "a version string",
    "tags": "a list of strings",
    "remediation": "text",
    "rollback": "text",
    "documentation": "Markdown with the fixed headings",
    "detector": "a table with python or sql",
    "requires": "an array of tables [[requires]]",
    "params": "a table of [params.NAME] tables",
    "aliases": "a list of old rule ids",
    "why_python": "why this detector is Python (required with detector.python)",
    "engines": "the engines its parity with DuckDB is tested on: " + ", ".join(ENGINES),
    "views": "a table of NAME = SQL (SQL detectors)",
    "decide": "a table with fired, not_evaluable, reason, [[decide.severity]] (SQL detectors)",
    "summary": "a table with fired, clear, not_evaluable templates (SQL detectors)",
    "evidence": "tables [evidence.table|chart|windows|examples] (SQL detectors)",
}
_REQUIRED_TOP = ("id", "name", "title", "severity", "status", "remediation", "rollback", "documentation", "detector",
                 "requires")
_PARAM_KEYS = ("default", "reason", "min", "max", "choices")
_REQUIRES_KEYS = ("id", "name", "columns", "metrics")
_REQUIRES_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# `metrics = ["role:kv_usage"]`: any metric of that role (servlens/store/metric_roles.toml) has samples.
ROLE_PREFIX = "role:"


@dataclass(frozen=True)
class Requirement:
    """One evidence path: the columns and metrics it needs, all of them."""

    id: str
    name: str
    columns: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()

    def metric_present(self, metric: str, present: set[str]) -> bool:
        if metric.startswith(ROLE_PREFIX):
            return any(name in present for name in metric_roles.names(metric[len(ROLE_PREFIX):]))
        return metric in present

    def available(self, columns: set[str], metrics: set[str]) -> bool:
        return all(c in columns for c in self.columns) and all(self.metric_present(m, metrics) for m in self.metrics)

    def describe(self) -> str:
        parts = []
        if self.columns:
            parts.append("columns " + ", ".join(self.columns))
        if self.metrics:
            parts.append("metrics " + ", ".join(self.metrics))
        return f"{self.name} ({'; '.join(parts)})"


@dataclass
class Rule:
    id: str
    name: str
    title: str
    severity: str
    status: str
    remediation: str
    rollback: str
    documentation: str
    requires: tuple[Requirement, ...]
    params: dict[str, Param]
    python: str | None = None
    sql: str | None = None
    since: str | None = None
    tags: tuple[str, ...] = ()
    path: Path | None = None
    cases_path: Path | None = None
    contract: Contract | None = None
    aliases: tuple[str, ...] = ()
    why_python: str | None = None
    engines: tuple[str, ...] = ("duckdb",)   # where its parity with DuckDB is tested (`engines` key)
    uses: dict | None = None          # a Python detector's USES, once check_uses has read it

    @property
    def detector(self) -> str:
        return f"python {self.python}" if self.python else "sql"

    def requirement(self, requirement_id: str) -> Requirement:
        for req in self.requires:
            if req.id == requirement_id:
                return req
        raise ConfigError(f"{self.path}: {self.id} has no [[requires]] entry with id '{requirement_id}'"
                          f"{_suggest(requirement_id, [r.id for r in self.requires])}",
                          "Requirement ids: " + ", ".join(r.id for r in self.requires))

    def sql_items(self) -> list[tuple[str, str]]:
        """(TOML key, SQL) for every SQL the rule holds: detector, views, decide, evidence."""
        items = [("detector.sql", self.sql)] if self.sql else []
        return items + (self.contract.sql_items() if self.contract else [])

    def resolve_python(self) -> Callable:
        module_name, function_name = self.python.split(":")
        try:
            module = importlib.import_module(module_name)
            return getattr(module, function_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"{self.path}: detector.python '{self.python}' cannot be imported ({exc})",
                "Name an importable module:function",
            ) from exc

    def check_uses(self) -> None:
        """A Python detector's `USES = {"params": [...], "requires": [...]}` against the TOML, both ways: a
        parameter or requirement id the code uses and the file lacks (renamed, deleted), or a parameter the file
        declares and nothing reads, is an error naming the file and the key."""
        detect = self.resolve_python()
        module = importlib.import_module(detect.__module__)
        uses = getattr(module, "USES", None)
        if not (isinstance(uses, dict) and set(uses) == {"params", "requires"}
                and all(isinstance(uses[k], (list, tuple)) for k in uses)):
            raise ConfigError(f"{module.__file__}: the detector of {self.id} declares no USES",
                              'Add USES = {"params": [...], "requires": [...]} naming what it reads')
        for name in uses["params"]:
            if name not in self.params:
                raise ConfigError(f"{self.path}: params.{name} is missing, and {self.python} uses it (USES)"
                                  f"{_suggest(name, self.params)}",
                                  f"Declare [params.{name}], or stop using it in {module.__name__}")
        templates = self.remediation + self.rollback
        for name in self.params:
            if name not in uses["params"] and "{" + name not in templates:
                raise ConfigError(f"{self.path}: params.{name} is declared but {self.python} does not use it "
                                  "(USES) and no template reads it",
                                  f"Remove [params.{name}], or add it to USES in {module.__name__}")
        ids = [req.id for req in self.requires]
        for requirement_id in uses["requires"]:
            if requirement_id not in ids:
                raise ConfigError(f"{self.path}: no [[requires]] entry has id '{requirement_id}', and {self.python} "
                                  f"refers to it (USES){_suggest(requirement_id, ids)}",
                                  "Requirement ids: " + ", ".join(ids))
        self.uses = {"params": tuple(uses["params"]), "requires": tuple(uses["requires"])}

    def default_params(self) -> dict[str, Any]:
        return {name: param.default for name, param in self.params.items()}

    def references(self) -> list[str]:
        """The bullet items under the documentation's References heading."""
        section = doc_sections(self.documentation).get("References", "")
        return [line.strip()[2:].strip() for line in section.splitlines() if line.strip().startswith(("- ", "* "))]


def doc_sections(documentation: str) -> dict[str, str]:
    """The documentation split at its `## ` headings: heading -> body."""
    sections: dict[str, str] = {}
    current = None
    for line in documentation.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return {key: value.strip() for key, value in sections.items()}


def _bad(path: Path, key: str, problem: str, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: {key} {problem}", f"Allowed: {allowed}")


def _suggest(key: str, options) -> str:
    import difflib

    match = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


# User rules' SQL texts that passed the sandbox check: a text changed after loading is checked again.
_CHECKED_USER_SQL: set[tuple[str, tuple]] = set()


def check_user_rule_sql(path: Path, sql: str | None, contract: Contract | None) -> None:
    """A user rule's every SQL is one SELECT reading the scope views and the rule's own [views] (servlens/sandbox.py);
    the predicates and the examples' filter are expressions over them."""
    tables = RULE_VIEWS | frozenset(contract.views if contract else ())
    items = ([("detector.sql", sql)] if sql is not None else []) + (contract.sql_items() if contract else [])
    key_of_texts = (str(path), tuple(items))
    if key_of_texts in _CHECKED_USER_SQL:
        return  # the same texts were checked already (the runner asks again for every scope)
    for key, text in items:
        try:
            if key.endswith(".order_by"):
                check_rule_sql(f"SELECT 1 FROM rule_metrics ORDER BY {text}", f"{path}: {key}", tables)
            elif key.startswith("decide.") or key.endswith(".where"):
                check_rule_expression(text, f"{path}: {key}", tables)
            else:
                check_rule_sql(text, f"{path}: {key}", tables)
        except SqlSyntaxError:
            continue  # SQL that does not parse cannot run: `rules check` and the run report it with its position
    _CHECKED_USER_SQL.add(key_of_texts)


def parse_rule(data: dict, path: Path) -> Rule:
    """Validate one rule file's parsed TOML; every error names the file, the key and what is allowed."""
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"{path}: unknown key '{key}'{_suggest(key, _TOP_KEYS)}",
                "Allowed keys: " + ", ".join(_TOP_KEYS),
            )
    for key in _REQUIRED_TOP:
        if key not in data:
            raise ConfigError(f"{path}: missing key '{key}'", f"Add {key} = {_TOP_KEYS[key]}")
    for key in ("id", "name", "title", "severity", "status", "remediation", "rollback", "documentation", "since",
                "why_python"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            raise _bad(path, key, "must be a non-empty string", _TOP_KEYS[key])
    if not _ID_RE.match(data["id"]):
        raise _bad(path, "id", f"'{data['id']}' is not a rule id", "2-4 capital letters and 3 digits, e.g. SL004")
    if not _NAME_RE.match(data["name"]):
        raise _bad(path, "name", f"'{data['name']}' is not kebab-case", "lowercase words joined by '-', e.g. queue-driven-ttft-spike")
    if data["severity"] not in SEVERITIES:
        raise _bad(path, "severity", f"'{data['severity']}' is not a severity", ", ".join(SEVERITIES))
    if data["status"] not in STATUSES:
        raise _bad(path, "status", f"'{data['status']}' is not a status", ", ".join(STATUSES))
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise _bad(path, "tags", "must be a list of strings", "e.g. tags = [\"latency\"]")

    sections = doc_sections(data["documentation"])
    missing = [h for h in DOC_HEADINGS if h not in sections]
    if missing:
        raise _bad(path, "documentation", "lacks the heading(s) " + ", ".join(f"'## {h}'" for h in missing),
                   "these headings in this order: " + ", ".join(DOC_HEADINGS))
    order = [h for h in sections if h in DOC_HEADINGS]
    if order != list(DOC_HEADINGS):
        raise _bad(path, "documentation", "has its headings out of order (" + ", ".join(order) + ")",
                   ", ".join(DOC_HEADINGS))

    detector = data["detector"]
    if not isinstance(detector, dict):
        raise _bad(path, "detector", "must be a table", "[detector] with python = \"module:function\" or sql = '''...'''")
    for key in detector:
        if key not in ("python", "sql"):
            raise _bad(path, f"detector.{key}", "is not a known key", "python, sql")
    if ("python" in detector) == ("sql" in detector):
        raise _bad(path, "detector", "must have exactly one of python or sql", "python = \"module:function\" or sql = '''...'''")
    python = detector.get("python")
    if python is not None and not (isinstance(python, str) and _PYTHON_RE.match(python)):
        raise _bad(path, "detector.python", f"'{python}' is not module:function", "e.g. servlens.analysis.detectors.sl004_queue_driven_ttft_spike:detect")
    sql = detector.get("sql")
    if sql is not None and not (isinstance(sql, str) and sql.strip()):
        raise _bad(path, "detector.sql", "must be a non-empty string", "a SELECT over scope_requests / scope_metrics")
    why_python = data.get("why_python")
    if python is not None and why_python is None:
        raise _bad(path, "why_python", "is missing (detector.python needs it)",
                   "one or two sentences on why SQL cannot carry this detector")
    if python is None and why_python is not None:
        raise _bad(path, "why_python", "is given for a SQL detector", "remove it")
    contract = parse_contract(data, path, sql is not None)
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _ID_RE.match(a) for a in aliases):
        raise _bad(path, "aliases", "must be a list of rule ids", "e.g. aliases = [\"SL104\"]")
    if data["id"] in aliases:
        raise _bad(path, "aliases", f"names the rule's own id {data['id']}", "old ids only")
    engines = data.get("engines", ["duckdb"])
    if (not isinstance(engines, list) or "duckdb" not in engines
            or not all(isinstance(e, str) and e in ENGINES for e in engines)):
        raise _bad(path, "engines", "must be a list of engine names that includes duckdb",
                   "e.g. engines = [\"duckdb\", \"chdb\"] (" + ", ".join(ENGINES) + ")")

    params: dict[str, Param] = {}
    raw_params = data.get("params", {})
    if not isinstance(raw_params, dict):
        raise _bad(path, "params", "must be a table of tables", "[params.NAME] with default and reason")
    for pname, spec in raw_params.items():
        where = f"params.{pname}"
        if not _PARAM_NAME_RE.match(pname):
            raise _bad(path, where, "has a bad name", "lowercase snake_case")
        if not isinstance(spec, dict):
            raise _bad(path, where, "must be a table", "default, reason, min, max, choices")
        for key in spec:
            if key not in _PARAM_KEYS:
                raise _bad(path, f"{where}.{key}", f"is not a known key{_suggest(key, _PARAM_KEYS)}", ", ".join(_PARAM_KEYS))
        if "default" not in spec:
            raise _bad(path, where, "has no default", "default = a number, true/false, text or a list")
        if not (isinstance(spec.get("reason"), str) and spec["reason"].strip()):
            raise _bad(path, f"{where}.reason", "is missing", "one line saying why this default")
        for bound in ("min", "max"):
            if bound in spec and (isinstance(spec[bound], bool) or not isinstance(spec[bound], (int, float))):
                raise _bad(path, f"{where}.{bound}", "must be a number", "a number")
        choices = spec.get("choices", [])
        if not isinstance(choices, list):
            raise _bad(path, f"{where}.choices", "must be a list", "a list of allowed values")
        param = Param(pname, spec["default"], spec["reason"].strip(), spec.get("min"), spec.get("max"), tuple(choices))
        if isinstance(param.default, (dict,)):
            raise _bad(path, f"{where}.default", "cannot be a table", "a number, true/false, text or a list")
        try:
            param.coerce(param.default)
        except ValueError:
            raise _bad(path, f"{where}.default", f"{param.default!r} is outside its own bounds", param.allowed()) from None
        params[pname] = param

    check_params(path, ([("detector.sql", sql)] if sql else []) + (contract.sql_items() if contract else []),
                 set(params))
    if is_user_rule(path):
        check_user_rule_sql(path, sql, contract)  # issue 15: one SELECT over the scope views, nothing else

    requires_raw = data["requires"]
    if not isinstance(requires_raw, list) or not requires_raw:
        raise _bad(path, "requires", "must be a non-empty array of tables", "[[requires]] with id, name, columns, metrics")
    requires = []
    for index, spec in enumerate(requires_raw):
        where = f"requires[{index}]"
        if not isinstance(spec, dict):
            raise _bad(path, where, "must be a table", ", ".join(_REQUIRES_KEYS))
        for key in spec:
            if key not in _REQUIRES_KEYS:
                raise _bad(path, f"{where}.{key}", f"is not a known key{_suggest(key, _REQUIRES_KEYS)}", ", ".join(_REQUIRES_KEYS))
        if not (isinstance(spec.get("id"), str) and _REQUIRES_ID_RE.match(spec["id"])):
            raise _bad(path, f"{where}.id", "is missing" if "id" not in spec else f"{spec['id']!r} is not an id",
                       "a snake_case id the detector code refers to, e.g. id = \"queue_time\"")
        if any(req.id == spec["id"] for req in requires):
            raise _bad(path, f"{where}.id", f"'{spec['id']}' is used twice", "one id per [[requires]] entry")
        if not (isinstance(spec.get("name"), str) and spec["name"].strip()):
            raise _bad(path, f"{where}.name", "is missing", "a short name for this evidence path")
        columns = spec.get("columns", [])
        metrics = spec.get("metrics", [])
        if not isinstance(columns, list) or not isinstance(metrics, list) or not (columns or metrics):
            raise _bad(path, where, "needs columns or metrics (lists of names)", "columns = [...], metrics = [...]")
        for column in columns:
            if column not in REQUEST_COLUMNS:
                raise _bad(path, f"{where}.columns", f"names '{column}', which is not a canonical request column"
                           f"{_suggest(str(column), REQUEST_COLUMNS)}", "the columns in servlens/store/schema.py")
        for metric in metrics:
            if str(metric).startswith(ROLE_PREFIX) and str(metric)[len(ROLE_PREFIX):] not in metric_roles.roles():
                raise _bad(path, f"{where}.metrics", f"names '{metric}', which is not a metric role",
                           "role:NAME with a role of servlens/store/metric_roles.toml: " + ", ".join(metric_roles.roles()))
        requires.append(Requirement(spec["id"], spec["name"].strip(), tuple(columns), tuple(str(m) for m in metrics)))

    return Rule(
        id=data["id"],
        name=data["name"],
        title=data["title"].strip(),
        severity=data["severity"],
        status=data["status"],
        remediation=data["remediation"].strip(),
        rollback=data["rollback"].strip(),
        documentation=data["documentation"].strip(),
        requires=tuple(requires),
        params=params,
        python=python,
        sql=sql,
        since=data.get("since"),
        tags=tuple(tags),
        path=path,
        contract=contract,
        aliases=tuple(aliases),
        why_python=why_python.strip() if why_python else None,
        engines=tuple(e for e in ENGINES if e in engines),
    )


def load_rule_file(path: Path) -> Rule:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", "Fix the syntax at the position shown") from exc
    except OSError as exc:
        raise ConfigError(f"Cannot read the rule file {path}: {exc.strerror}", "Check the path") from exc
    rule = parse_rule(data, path)
    if rule.python:
        rule.check_uses()
    stem_prefix = f"{rule.id}-"
    if not path.name.startswith(stem_prefix):
        raise ConfigError(f"{path}: the file name must start with the rule id '{rule.id}-'",
                          f"Rename it to {rule.id}-{rule.name}.toml")
    cases = path.with_name(path.stem + ".cases.toml")
    rule.cases_path = cases if cases.exists() else None
    return rule


def builtin_rules_dir() -> Path:
    """The folder of the rules shipped with servlens (the top-level rules/ folder, installed as servlens.builtin_rules)."""
    return Path(str(importlib.resources.files("servlens.builtin_rules")))


def rule_files(directory: Path) -> list[Path]:
    """Rule files in `directory` (and its subfolders): *.toml that are not test cases."""
    if not directory.is_dir():
        raise ConfigError(f"No rules folder at {directory}", "Pass a folder holding rule TOML files")
    return sorted(p for p in directory.rglob("*.toml") if not p.name.endswith(".cases.toml"))


def load_rules(extra_dirs: list[str | Path] = (), include_builtin: bool = True) -> list[Rule]:
    """The built-in rules plus those in `extra_dirs`, sorted by id; a duplicate id is an error naming both files."""
    dirs = ([builtin_rules_dir()] if include_builtin else []) + [Path(d) for d in extra_dirs]
    by_id: dict[str, Rule] = {}
    by_name: dict[str, Rule] = {}
    for directory in dirs:
        files = rule_files(directory)
        if not files and directory != builtin_rules_dir():
            raise ConfigError(f"No rule files in {directory}", "A rule is a TOML file named like SL900-my-problem.toml")
        for path in files:
            rule = load_rule_file(path)
            if rule.id in by_id:
                raise ConfigError(f"Rule id {rule.id} is defined twice: {by_id[rule.id].path} and {path}",
                                  "Give your rule its own id (e.g. a prefix other than SL)")
            if rule.name in by_name:
                raise ConfigError(f"Rule name {rule.name} is used twice: {by_name[rule.name].path} and {path}",
                                  "Rename one of them")
            by_id[rule.id] = rule
            by_name[rule.name] = rule
    taken = {rule_id: rule.path for rule_id, rule in by_id.items()}
    for rule in by_id.values():
        for alias in rule.aliases:
            if alias in taken:
                raise ConfigError(f"{rule.path}: alias {alias} is already the id or an alias of {taken[alias]}",
                                  "An alias names one rule only")
            taken[alias] = rule.path
    return [by_id[key] for key in sorted(by_id)]


def resolve_id(rules: list[Rule], token: str) -> str:
    """A rule id, or the id of the rule that lists `token` among its aliases (else `token` unchanged)."""
    for rule in rules:
        if token in rule.aliases:
            return rule.id
    return token


def select_rules(rules: list[Rule], select: list[str] | None, ignore: list[str] | None) -> list[Rule]:
    """Rules named by --select (ids, aliases or id prefixes such as SL00), minus --ignore; unknown ids are errors."""
    known = {rule.id for rule in rules}
    select = [resolve_id(rules, t) for t in select or []]
    ignore = [resolve_id(rules, t) for t in ignore or []]

    def matches(rule_id: str, token: str) -> bool:
        return rule_id == token or rule_id.startswith(token)

    for option, tokens in (("--select", select), ("--ignore", ignore)):
        for token in tokens or []:
            if not any(matches(rule_id, token) for rule_id in known):
                raise ConfigError(f"{option} names an unknown rule '{token}'",
                                  "Known rules: " + ", ".join(sorted(known)))
    chosen = [r for r in rules if not select or any(matches(r.id, t) for t in select)]
    return [r for r in chosen if not any(matches(r.id, t) for t in ignore or [])]


def runnable(rules: list[Rule], select: list[str] | None, preview: bool) -> list[Rule]:
    """The selected rules that run: preview rules only with --preview (or SERVLENS_PREVIEW=1); naming one by its
    id in --select without it is an error, so it is never silently skipped."""
    if preview:
        return list(rules)
    named = {resolve_id(rules, token) for token in select or []}
    for rule in rules:
        if rule.status == "preview" and rule.id in named:
            raise ConfigError(f"{rule.id} is a preview rule and runs only with --preview",
                              "Add --preview (or set SERVLENS_PREVIEW=1)")
    return [rule for rule in rules if rule.status != "preview"]


def parse_overrides(settings: list[str], rules: list[Rule]) -> dict[str, dict[str, Any]]:
    """--set RULE.param=value strings as {rule_id: {param: typed value}}; anything wrong is one ConfigError sentence."""
    by_id = {rule.id: rule for rule in rules}
    overrides: dict[str, dict[str, Any]] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        rule_id, dot, pname = key.strip().partition(".")
        rule_id = resolve_id(rules, rule_id)
        if not sep or not dot or not pname:
            raise ConfigError(f"--set '{setting}' is not RULE.param=value", "For example --set SL004.min_queue_share=0.6")
        rule = by_id.get(rule_id)
        if rule is None:
            raise ConfigError(f"--set names an unknown rule '{rule_id}'", "Known rules: " + ", ".join(sorted(by_id)))
        param = rule.params.get(pname)
        if param is None:
            raise ConfigError(
                f"{rule_id} has no parameter '{pname}'{_suggest(pname, rule.params)}",
                f"{rule_id} parameters: " + (", ".join(rule.params) or "none"),
            )
        try:
            typed = param.coerce(value)
        except ValueError:
            raise ConfigError(f"{rule_id}.{pname} must be {param.allowed()}, not '{value}'") from None
        overrides.setdefault(rule_id, {})[pname] = typed
    return overrides


def validate_params(rule: Rule, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Rule defaults overlaid with `values` (from a test case or an API caller), typed and checked."""
    merged = rule.default_params()
    for pname, value in values.items():
        param = rule.params.get(pname)
        if param is None:
            raise ConfigError(f"{where}: {rule.id} has no parameter '{pname}'{_suggest(pname, rule.params)}",
                              f"{rule.id} parameters: " + (", ".join(rule.params) or "none"))
        try:
            merged[pname] = param.coerce(value)
        except ValueError:
            raise ConfigError(f"{where}: {rule.id}.{pname} must be {param.allowed()}, not {value!r}") from None
    return merged


__all__ = [
    "DOC_HEADINGS", "SEVERITIES", "STATES", "STATUSES", "Param", "Requirement", "Rule", "builtin_rules_dir",
    "doc_sections", "load_rule_file", "load_rules", "parse_overrides", "parse_rule", "resolve_id", "runnable",
    "select_rules",
    "validate_params",
]

