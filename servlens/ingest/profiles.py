"""Format profiles: TOML files that say how to recognise a source and how to map it onto the canonical row.

A profile is data, not code (docs/profiles.md is the reference for users writing their own). This module loads and
validates profiles; servlens/ingest/compiler.py turns one into a single SQL statement.

Built-in profiles are package data (servlens/profiles/*.toml), found with importlib.resources so a non-editable
install run from any directory finds them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from servlens.errors import ConfigError
from servlens.store.schema import REQUEST_COLUMNS

READERS = ("jsonl", "json", "csv", "parquet", "lines")
CLOCKS = ("absolute", "relative", "naive")
TEXT_FIELDS = ("prompt", "content", "reasoning")
# Columns the ingester fills itself; a profile may not map them.
INGESTER_COLUMNS = ("run", "source_id", "source_line", "attrs", "prompt_text", "content_text", "reasoning_text")
MAPPABLE_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in INGESTER_COLUMNS)
_TOP_KEYS = {
    "name", "title", "description", "reader", "priority", "clock", "run", "detect", "explode", "let", "macros",
    "columns", "text", "attrs", "units", "derived", "csv", "where", "unwrap", "extends", "lines", "metric_lines",
    "macros_from",
}
# How a record sits inside what the file holds (an [unwrap] step, or a log store's wrapper):
#   record      a JSON path to the one record inside each line/document ($._source)
#   record_text a JSON path to a field holding the record as JSON TEXT ($.line)
#   records     a JSON path to a list of records ($.hits.hits[*]._source, $.data[*])
#   records_text a JSON path to a list of fields holding records as JSON text ($.events[*].message)
UNWRAP_KINDS = ("record", "record_text", "records", "records_text")


@dataclass(frozen=True)
class Wrapper:
    """A log store's envelope around the records of any format: found by sniffing, undone before the profile
    reads them."""

    name: str
    title: str
    kind: str  # one of UNWRAP_KINDS
    path: str
    detect: tuple[str, ...]  # JSON paths every wrapped line has


# The envelopes of the log stores operators export from; every profile works inside each (docs/profiles.md).
WRAPPERS = (
    # elasticdump / OpenSearch dump NDJSON: {"_index", "_id", "_source": {...}} per line
    Wrapper("elasticsearch-source", "Elasticsearch/OpenSearch documents ({_index, _id, _source} per line)",
            "record", "$._source", ("$._index", "$._source")),
    # a saved _search answer: {"hits": {"hits": [{"_source": {...}}]}}
    Wrapper("elasticsearch-search", "Elasticsearch/OpenSearch _search answer (hits.hits[*]._source)",
            "records", "$.hits.hits[*]._source", ("$.hits.hits",)),
    # Grafana Loki `logcli query --output=jsonl`: {"timestamp", "labels", "line": "<the app's line as text>"}
    Wrapper("loki-logcli", "Grafana Loki logcli --output=jsonl ({timestamp, labels, line})",
            "record_text", "$.line", ("$.line", "$.timestamp", "$.labels")),
    # `aws logs filter-log-events` / get-log-events: {"events": [{"timestamp", "message": "<json text>"}]}
    Wrapper("cloudwatch-events", "CloudWatch Logs events answer (events[*].message as JSON text)",
            "records_text", "$.events[*].message", ("$.events[0].message", "$.events[0].timestamp")),
    # CloudWatch Logs Insights / Datadog exports: one event per line, the record as JSON text in `message`
    Wrapper("message-json",
            "log events with the record as JSON text in `message` (CloudWatch, Datadog exports)",
            "record_text", "$.message", ("$.message",)),
    # Datadog Logs API answer: {"data": [{"attributes": {"message": "<json text>"}}]}
    Wrapper("datadog-logs", "Datadog Logs API answer (data[*].attributes.message as JSON text)",
            "records_text", "$.data[*].attributes.message", ("$.data[0].attributes.message",)),
)
_METRIC_NAME_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")


@dataclass(frozen=True)
class MetricLines:
    """Reader "lines": log lines that carry an engine's gauges (vLLM's periodic stats line) become metric samples,
    next to the request rows the same file gives. Expressions read the captures as `m.<name>`, like [columns]."""

    patterns: tuple[str, ...]
    names: tuple[tuple[str, ...], ...]  # each pattern's capture names, in group order
    ts: str  # the sample time (a TIMESTAMP expression; the profile's clock applies)
    gauges: dict[str, str]  # stored metric name -> value expression (DOUBLE)
    labels: dict[str, str] = field(default_factory=dict)  # label -> text expression


_DETECT_KEYS = {"must", "may", "must_not", "columns", "may_columns", "filename", "line"}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_TEXT_ATTR_RE = re.compile(
    r"(?i)^(prompts?|messages?|content|response|completion|text|generated_texts?|input|output|reasoning"
    r"|reasoning_content|response_text|prompt_text|completion_text)$"
)
_MACRO_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(([^)]*)\)\s*$")


@dataclass
class Profile:
    """One format profile, validated. Expressions are DuckDB SQL strings (see docs/profiles.md)."""

    name: str
    title: str
    reader: str
    path: str  # where it was loaded from (for messages)
    description: str = ""
    priority: int = 0
    clock: str = "absolute"
    run: str | None = None
    where: str | None = None  # a row filter: records (or exploded elements) it is not true for give no row
    unwrap: dict[str, str] = field(default_factory=dict)  # {kind: path}: where the record sits in each line
    # reader "lines": regexes with named captures (a line matching one of them is part of a record), and the
    # captures whose values join the lines of one record (a task id); detect_line must match a sampled line
    line_patterns: list[str] = field(default_factory=list)
    line_names: list[list[str]] = field(default_factory=list)  # each pattern's capture names, in group order
    line_key: list[str] = field(default_factory=list)
    # a regex a record's line starts with: such a line that no pattern matches is a bad line, not another message
    line_record_start: str | None = None
    # every record line is a request (a request log written through a logger, not a console log): a folder reads it
    line_request_log: bool = False
    detect_line: str | None = None
    detect_must: list[str] = field(default_factory=list)
    detect_may: list[str] = field(default_factory=list)
    detect_must_not: list[str] = field(default_factory=list)
    detect_columns: list[str] = field(default_factory=list)
    detect_may_columns: list[str] = field(default_factory=list)
    detect_filename: str | None = None
    explode_path: str | None = None
    explode_zip: dict[str, str] = field(default_factory=dict)
    let: dict[str, str] = field(default_factory=dict)
    macros: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)
    csv_options: dict[str, object] = field(default_factory=dict)
    metric_lines: MetricLines | None = None
    builtin: bool = False


def _strings(value, where: str, path: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"Profile {path}: {where} must be a string or a list of strings", "See docs/profiles.md")


def _table(data: dict, key: str, path: str) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"Profile {path}: [{key}] must map names to SQL expression strings", "See docs/profiles.md")
    return dict(value)


def parse_profile(data: dict, path: str, builtin: bool = False) -> Profile:
    """Validate a parsed TOML document and build a Profile; every mistake is a one-sentence ConfigError."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(
            f"Profile {path} has unknown key(s): {', '.join(sorted(unknown))}",
            f"Known keys: {', '.join(sorted(_TOP_KEYS))}",
        )
    for key in ("name", "reader"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"Profile {path} needs a string '{key}'", "See docs/profiles.md")
    name = data["name"]
    if not _NAME_RE.match(name):
        raise ConfigError(f"Profile {path}: name '{name}' must be lower-case letters, digits, '.', '_' or '-'")
    reader = data["reader"]
    if reader not in READERS:
        raise ConfigError(f"Profile {name}: reader '{reader}' is not one of {', '.join(READERS)}")
    clock = data.get("clock", "absolute")
    if clock not in CLOCKS:
        raise ConfigError(f"Profile {name}: clock '{clock}' is not one of {', '.join(CLOCKS)}")
    detect = data.get("detect", {})
    if not isinstance(detect, dict) or set(detect) - _DETECT_KEYS:
        raise ConfigError(
            f"Profile {name}: [detect] may only have {', '.join(sorted(_DETECT_KEYS))}", "See docs/profiles.md"
        )
    columns = _table(data, "columns", name)
    bad = set(columns) - set(MAPPABLE_COLUMNS)
    if bad:
        raise ConfigError(
            f"Profile {name}: [columns] has names that are not canonical columns: {', '.join(sorted(bad))}",
            "Put other fields in [attrs]; canonical columns are listed in docs/profiles.md",
        )
    text = _table(data, "text", name)
    if set(text) - set(TEXT_FIELDS):
        raise ConfigError(f"Profile {name}: [text] may only have {', '.join(TEXT_FIELDS)}")
    derived = _table(data, "derived", name)
    if set(derived) - set(MAPPABLE_COLUMNS):
        raise ConfigError(f"Profile {name}: [derived] has names that are not canonical columns")
    attrs = _table(data, "attrs", name)
    for key in attrs:
        if _TEXT_ATTR_RE.match(key):
            raise ConfigError(
                f"Profile {name}: attrs.{key} looks like request or response text",
                "attrs never hold prompt, message or response text; use [text] (dropped unless --keep-text)",
            )
    explode = data.get("explode", {})
    if not isinstance(explode, dict) or set(explode) - {"path", "zip"}:
        raise ConfigError(f"Profile {name}: [explode] takes 'path' or a [explode.zip] table")
    explode_zip = explode.get("zip", {})
    if not isinstance(explode_zip, dict) or not all(isinstance(v, str) for v in explode_zip.values()):
        raise ConfigError(f"Profile {name}: [explode.zip] must map names to JSON paths or list expressions")
    if explode.get("path") and explode_zip:
        raise ConfigError(f"Profile {name}: [explode] takes either 'path' or 'zip', not both")
    if (explode.get("path") or explode_zip) and reader not in ("jsonl", "json"):
        raise ConfigError(f"Profile {name}: [explode] needs a JSON reader (jsonl or json)")
    macros: dict[str, tuple[list[str], str]] = {}
    for signature, body in _table(data, "macros", name).items():
        match = _MACRO_RE.match(signature)
        if not match:
            raise ConfigError(f"Profile {name}: macro key '{signature}' must look like 'name(arg1, arg2)'")
        params = [p.strip() for p in match.group(2).split(",") if p.strip()]
        macros[match.group(1)] = (params, body)
    csv_options = data.get("csv", {})
    if not isinstance(csv_options, dict):
        raise ConfigError(f"Profile {name}: [csv] must be a table of read_csv options")
    priority = data.get("priority", 0)
    if not isinstance(priority, int):
        raise ConfigError(f"Profile {name}: priority must be an integer")
    run = data.get("run")
    if run is not None and not isinstance(run, str):
        raise ConfigError(f"Profile {name}: run must be an SQL expression string")
    where = data.get("where")
    if where is not None and not isinstance(where, str):
        raise ConfigError(f"Profile {name}: where must be an SQL expression string")
    unwrap = data.get("unwrap", {})
    if not isinstance(unwrap, dict) or len(unwrap) > 1 or set(unwrap) - set(UNWRAP_KINDS) or not all(
            isinstance(v, str) and v.startswith("$") for v in unwrap.values()):
        raise ConfigError(f"Profile {name}: [unwrap] takes one of {', '.join(UNWRAP_KINDS)} = a JSON path",
                          "See docs/profiles.md")
    if unwrap and reader not in ("jsonl", "json"):
        raise ConfigError(f"Profile {name}: [unwrap] needs a JSON reader (jsonl or json)")
    lines = data.get("lines", {})
    if not isinstance(lines, dict) or set(lines) - {"patterns", "key", "record_start", "request_log"}:
        raise ConfigError(f"Profile {name}: [lines] takes 'patterns', 'key', 'record_start' and 'request_log'",
                          "See docs/profiles.md")
    if not isinstance(lines.get("request_log", False), bool):
        raise ConfigError(f"Profile {name}: lines.request_log must be true or false")
    if (reader == "lines") != bool(lines.get("patterns")):
        raise ConfigError(f"Profile {name}: reader 'lines' goes with [lines] patterns (regexes with named "
                          "captures)")
    patterns = _strings(lines.get("patterns"), "lines.patterns", name)
    line_names = []
    for pattern in patterns:
        try:
            groups = re.compile(pattern).groupindex
        except re.error as exc:
            raise ConfigError(f"Profile {name}: lines pattern {pattern!r} is not a valid regex ({exc})") \
                from exc
        if not groups:
            raise ConfigError(f"Profile {name}: lines pattern {pattern!r} has no named capture (?P<name>...)")
        line_names.append(sorted(groups, key=groups.get))
    line_key = _strings(lines.get("key"), "lines.key", name)
    known = {n for names in line_names for n in names}
    if set(line_key) - known:
        unknown_key = ", ".join(sorted(set(line_key) - known))
        raise ConfigError(f"Profile {name}: lines.key names captures no pattern has: {unknown_key}")
    record_start = lines.get("record_start")
    if record_start is not None:
        if not isinstance(record_start, str):
            raise ConfigError(f"Profile {name}: lines.record_start must be a regex (a string)")
        try:
            re.compile(record_start)
        except re.error as exc:
            raise ConfigError(f"Profile {name}: lines.record_start {record_start!r} is not a valid regex ({exc})") \
                from exc
        if line_key:
            raise ConfigError(f"Profile {name}: lines.record_start needs one line a record (no lines.key)")
    metric_lines = _metric_lines(data.get("metric_lines"), reader, name)
    detect_line = detect.get("line")
    if detect_line is not None:
        try:
            re.compile(detect_line)
        except re.error as exc:
            raise ConfigError(f"Profile {name}: detect.line is not a valid regex ({exc})") from exc
    filename = detect.get("filename")
    if filename is not None:
        try:
            re.compile(filename)
        except re.error as exc:
            raise ConfigError(f"Profile {name}: detect.filename is not a valid regex ({exc})") from exc
    return Profile(
        name=name,
        title=str(data.get("title", name)),
        description=str(data.get("description", "")),
        reader=reader,
        path=path,
        priority=priority,
        clock=clock,
        run=run,
        where=where,
        unwrap=dict(unwrap),
        line_patterns=patterns,
        line_names=line_names,
        line_key=line_key,
        line_record_start=record_start,
        line_request_log=lines.get("request_log", False),
        detect_line=detect_line,
        detect_must=_strings(detect.get("must"), "detect.must", name),
        detect_may=_strings(detect.get("may"), "detect.may", name),
        detect_must_not=_strings(detect.get("must_not"), "detect.must_not", name),
        detect_columns=_strings(detect.get("columns"), "detect.columns", name),
        detect_may_columns=_strings(detect.get("may_columns"), "detect.may_columns", name),
        detect_filename=filename,
        explode_path=explode.get("path"),
        explode_zip=dict(explode_zip),
        let=_table(data, "let", name),
        macros=macros,
        columns=columns,
        text=text,
        attrs=attrs,
        units={k: str(v) for k, v in data.get("units", {}).items()},
        derived=derived,
        csv_options=dict(csv_options),
        metric_lines=metric_lines,
        builtin=builtin,
    )


def _capture_names(pattern: str, where: str, name: str) -> tuple[str, ...]:
    try:
        groups = re.compile(pattern).groupindex
    except re.error as exc:
        raise ConfigError(f"Profile {name}: {where} pattern {pattern!r} is not a valid regex ({exc})") from exc
    if not groups:
        raise ConfigError(f"Profile {name}: {where} pattern {pattern!r} has no named capture (?P<name>...)")
    return tuple(sorted(groups, key=groups.get))


def _metric_lines(spec, reader: str, name: str) -> MetricLines | None:
    if spec is None:
        return None
    keys = {"patterns", "ts", "gauges", "labels"}
    if not isinstance(spec, dict) or set(spec) - keys:
        raise ConfigError(f"Profile {name}: [metric_lines] takes {', '.join(sorted(keys))}", "See docs/profiles.md")
    if reader != "lines":
        raise ConfigError(f"Profile {name}: [metric_lines] needs reader 'lines'")
    patterns = _strings(spec.get("patterns"), "metric_lines.patterns", name)
    if not patterns:
        raise ConfigError(f"Profile {name}: [metric_lines] needs patterns (regexes with named captures)")
    if not isinstance(spec.get("ts"), str):
        raise ConfigError(f"Profile {name}: [metric_lines] needs ts, an SQL expression for the sample time")
    gauges = _table(spec, "gauges", name)
    if not gauges:
        raise ConfigError(f"Profile {name}: [metric_lines.gauges] must name at least one metric")
    bad = [g for g in gauges if not _METRIC_NAME_RE.match(g)]
    if bad:
        raise ConfigError(f"Profile {name}: [metric_lines.gauges] {', '.join(bad)} is not a Prometheus metric name")
    return MetricLines(tuple(patterns), tuple(_capture_names(p, "metric_lines", name) for p in patterns),
                       spec["ts"], gauges, _table(spec, "labels", name))


def _merge_extends(data: dict, path: str, raw_of: dict[str, dict], seen: tuple[str, ...] = ()) -> dict:
    """A profile with `extends = "NAME"` starts from that built-in profile: each of its tables is merged key
    by key with the child's ([detect] too), every other key the child gives replaces the parent's."""
    parent_name = data.get("extends")
    if parent_name is None:
        return data
    if not isinstance(parent_name, str) or parent_name not in raw_of:
        raise ConfigError(f"Profile {path}: extends '{parent_name}', which is not a built-in profile",
                          "See 'servlens formats' for the names")
    if parent_name in seen:
        raise ConfigError(f"Profile {path}: extends loops through '{parent_name}'")
    parent = _merge_extends(raw_of[parent_name], parent_name, raw_of, (*seen, parent_name))
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in parent.items()
              if k not in ("name", "extends")}
    for key, value in data.items():
        if key == "extends":
            continue
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _resolve(data: dict, path: str, raw_of: dict[str, dict]) -> dict:
    """`extends`, then `macros_from = ["NAME", ...]`: the [macros] of those built-in profiles, under the profile's
    own (one system's helpers — TGI's Duration strings, its error types — defined once for all its log formats)."""
    data = _merge_extends(data, path, raw_of)
    names = data.get("macros_from")
    if names is None:
        return data
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"Profile {path}: macros_from must be a list of built-in profile names")
    macros: dict = {}
    for name in names:
        if name not in raw_of:
            raise ConfigError(f"Profile {path}: macros_from names '{name}', which is not a built-in profile",
                              "See 'servlens formats' for the names")
        macros.update(raw_of[name].get("macros") or {})
    merged = {k: v for k, v in data.items() if k != "macros_from"}
    merged["macros"] = {**macros, **(data.get("macros") or {})}
    return merged


def _builtin_raw() -> dict[str, dict]:
    raw = {}
    for entry in resources.files("servlens.profiles").iterdir():
        if entry.name.endswith(".toml"):
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
            name = str(data.get("name", entry.name))
            if name in raw:
                raise ConfigError(f"Two built-in profiles share the name(s) {name}")
            raw[name] = {**data, "_file": entry.name}
    return raw


def load_profile_file(path: str | Path) -> Profile:
    """Load a user's profile (--profile FILE)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"No profile file at {path}", "Check the path given to --profile")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Profile {path} is not valid TOML: {exc}", "Fix the file; docs/profiles.md has examples") from exc
    if "extends" in data or "macros_from" in data:
        raw = {k: {kk: vv for kk, vv in v.items() if kk != "_file"} for k, v in _builtin_raw().items()}
        data = _resolve(data, str(path), raw)
    return parse_profile(data, str(path))


_BUILTIN_CACHE: list[Profile] | None = None
# Old names of renamed built-in profiles, still accepted by --from so existing commands keep working.
RENAMED_PROFILES = {"openai-client-log": "servlens-loadgen"}


def builtin_profiles() -> list[Profile]:
    """Every built-in profile, sorted by name."""
    global _BUILTIN_CACHE
    if _BUILTIN_CACHE is None:
        found = []
        files = _builtin_raw()
        raw = {k: {kk: vv for kk, vv in v.items() if kk != "_file"} for k, v in files.items()}
        for name, data in raw.items():
            where = f"servlens/profiles/{files[name]['_file']}"
            found.append(parse_profile(_resolve(data, where, raw), where, builtin=True))
        names = [p.name for p in found]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ConfigError(f"Two built-in profiles share the name(s) {', '.join(sorted(duplicates))}")
        _BUILTIN_CACHE = sorted(found, key=lambda p: p.name)
    return list(_BUILTIN_CACHE)


def get_profile(name: str) -> Profile:
    """A built-in profile by name (--from NAME); unknown names get the list of known ones."""
    profiles = builtin_profiles()
    name = RENAMED_PROFILES.get(name, name)
    for profile in profiles:
        if profile.name == name:
            return profile
    import difflib

    names = [p.name for p in profiles]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"Did you mean '{close[0]}'? " if close else ""
    raise ConfigError(
        f"No format profile named '{name}'",
        f"{hint}Known formats: {', '.join(names)} (see 'servlens formats')",
    )
