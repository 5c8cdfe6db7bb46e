"""The result documents servlens writes: their types, their JSON Schemas, and the check `servlens report` runs.

analyze, compare and ingest each hand one JSON document to the renderers (docs/CONTRIBUTING.md "Result
documents"). The TypedDicts below are that shape, in one home: the builders (servlens.analysis.runner,
servlens.compare.engine, servlens.ingest.api) are annotated with them, the renderers read them without probing, and
the JSON Schema of each kind is generated from them (`schema_from_types`) and shipped as package data
(servlens/schemas/KIND.schema.json, read with `load_schema`). tests/test_documents.py checks that the shipped files
are the generated ones and validates every document the test suite produces against them.

A TypedDict is closed (no keys beyond its own) unless its name is in OPEN: the parts whose inner shape belongs to
the module that builds them (a compare gate's diagnostics, the workload and goodput sections) keep their named keys
typed and may carry more.

Version 2 is the first typed version. Version 1 documents were untyped (the HTML renderer guessed their shape), so
this build refuses them with one sentence instead of rendering them half (see servlens.commands.report).
"""

from __future__ import annotations

import json
import types
import typing
from functools import cache
from importlib import resources
from typing import Any, Literal, NotRequired, TypedDict, Union

SCHEMA_VERSION = 2
KINDS = ("analyze", "compare", "ingest")

Severity = Literal["info", "warning", "critical"]
State = Literal["fired", "clear", "not_evaluable"]
Verdict = Literal["pass", "fail", "inconclusive"]


# ---------------------------------------------------------------------------------------------------- charts


class Series(TypedDict):
    name: str
    x: list[Any]
    y: NotRequired[list[Any]]          # a cdf series may give only x (raw values: the renderer takes their ECDF)


class HLine(TypedDict):
    y: float
    label: str
    style: NotRequired[Literal["threshold", "reference"]]


class VLine(TypedDict):
    x: Any
    label: str
    style: NotRequired[Literal["threshold", "reference"]]


class VSpan(TypedDict):
    x0: Any
    x1: Any
    label: str


class Chart(TypedDict):
    """Data for one chart, never pixels (the HTML renderer draws it as inline SVG)."""

    type: Literal["line", "step", "bar", "scatter", "cdf"]
    title: str
    x_label: str
    y_label: str
    x_time: bool                       # x values are ISO-8601 timestamps
    x_log: bool
    y_log: bool
    y_logit: NotRequired[bool]         # shares (0-1) on a logit axis: p50/p90/p99 evenly spaced
    series: list[Series]
    hlines: list[HLine]
    vlines: NotRequired[list[VLine]]
    vspans: list[VSpan]


class Table(TypedDict):
    columns: list[str]
    rows: list[list[Any]]


# -------------------------------------------------------------------------------------------------- analyze


class Window(TypedDict):
    start: str
    end: str


class Example(TypedDict):
    request_id: str | None
    source: str | None
    line: int | None


class Evidence(TypedDict):
    metrics: dict[str, Any]
    thresholds: dict[str, Any]
    windows: list[Window]
    table: Table | None
    chart: Chart | None


class Scope(TypedDict):
    run: str
    model: str | None
    deployment: str | None


class Finding(TypedDict):
    rule: str
    name: str
    title: str
    state: State
    severity: Severity
    scope: Scope
    summary: str
    reason: str | None                 # why not evaluable (None otherwise)
    evidence: Evidence
    examples: list[Example]
    remediation: str
    rollback: str
    references: list[str]


class Source(TypedDict):
    path: str
    format: str | None
    kind: str
    rows: int
    bad_lines: int


class TimeSpan(TypedDict):
    start: str | None
    end: str | None
    relative_clock: bool


class Coverage(TypedDict):
    sources: list[Source]
    runs: list[str]
    requests: int
    time_span: TimeSpan
    models: list[str]
    columns_present: list[str]
    metrics_present: list[str]
    skipped: NotRequired[list[str]]    # files a folder held that are not data, and why (analyze on paths)


class ChainLink(TypedDict):
    rule: str
    title: str
    scope: Scope
    requests: int
    severity: Severity
    windows: list[Window]
    relation: NotRequired[str]         # the links after the first: how this one follows from the one before
    because: NotRequired[str]
    shared_with_cause: NotRequired[int]
    fallbacks: NotRequired[int]        # requests the gateway sent on to a fallback between the two
    also: NotRequired[list[str]]       # rules that fired at the same step on the same scope


class BreakFirst(TypedDict):
    rule: str
    scope: Scope
    change: str
    rollback: str


class Chain(TypedDict):
    summary: str
    links: list[ChainLink]
    through: int                       # requests that went through every link
    window: Window | None
    break_first: BreakFirst


class GoodputScope(TypedDict):
    run: str
    model: str | None
    deployment: str | None
    levels: NotRequired[list[dict[str, Any]]]
    chart: NotRequired[Chart | None]


class Capacity(TypedDict):
    scopes: NotRequired[list[GoodputScope]]
    note: NotRequired[str]


class Goodput(TypedDict):
    targets: dict[str, Any] | None     # the --slo targets; None: attainment curves instead of attainment
    objective: dict[str, float]
    min_level_requests: int
    requests: int
    summary: NotRequired[str]          # absent when the runs hold no request logs (then `note` says so)
    note: NotRequired[str]
    capacity: NotRequired[Capacity]
    per_window: NotRequired[dict[str, Any]]
    curves: NotRequired[dict[str, Any] | None]


class RunProfile(TypedDict):
    run: str
    requests: int
    relative_clock: bool
    note: NotRequired[str]


class Workload(TypedDict):
    summary: list[str]                 # one line per run
    runs: dict[str, RunProfile]


class AnalyzeDocument(TypedDict):
    kind: Literal["analyze"]
    schema_version: Literal[2]
    generated_at: str
    servlens_version: str
    run: str | list[str]
    coverage: Coverage
    findings: list[Finding]
    workload: Workload
    chains: list[Chain]
    goodput: Goodput


# -------------------------------------------------------------------------------------------------- compare


class SideSource(TypedDict):
    path: str
    format: str | None
    rows: int
    bad_lines: int


class Side(TypedDict):
    run: str
    requests: int
    models: list[str]
    sources: list[SideSource]


class Gate(TypedDict):
    id: str
    name: str
    metric: str
    statistic: str
    kind: Literal["latency", "rate"]   # latency: a ratio after/before; rate: a difference in shares
    unit: str
    cohort: str | None
    verdict: Verdict
    critical: bool
    before: float | None
    after: float | None
    ratio: NotRequired[float | None]
    diff: NotRequired[float | None]
    ci_low: NotRequired[float | None]
    ci_high: NotRequired[float | None]
    tolerance: float | None
    tolerance_text: NotRequired[str]
    n_before: NotRequired[int | None]
    n_after: NotRequired[int | None]
    reason: NotRequired[str | None]
    thin_tail: NotRequired[str | None]
    requests_needed: NotRequired[int | None]
    rollback_criterion: str
    rule: str
    chart: NotRequired[Chart | None]
    residual_chart: NotRequired[Chart | None]
    cohorts: NotRequired[list[dict[str, Any]]]


class Improvement(TypedDict):
    gate: str
    cohort: str | None
    change: float | None
    summary: str


class CompareDocument(TypedDict):
    kind: Literal["compare"]
    schema_version: Literal[2]
    generated_at: str
    servlens_version: str
    verdict: Verdict
    reason: str
    before: Side
    after: Side
    policy: dict[str, Any]
    method: dict[str, str]
    coverage: dict[str, Any]
    mix_shift: dict[str, Any]
    gates: list[Gate]
    improvements: list[Improvement]
    cohorts: list[dict[str, Any]]
    merged_bands: list[str]
    notes: list[str]
    goodput_gate: NotRequired[dict[str, Any]]   # with --slo


# --------------------------------------------------------------------------------------------------- ingest


class IngestSource(TypedDict):
    path: str
    kind: str
    format: str | None
    run: str | list[str] | None        # a file split into several runs (a run column) names them all
    runs: NotRequired[list[str]]
    rows: int
    bad_lines: int
    skipped: bool


class Skipped(TypedDict):
    path: str
    reason: str


class IngestDocument(TypedDict):
    kind: Literal["ingest"]
    schema_version: Literal[2]
    sources: list[IngestSource]
    skipped: list[Skipped]
    runs: list[str]


DOCUMENTS: dict[str, type] = {"analyze": AnalyzeDocument, "compare": CompareDocument, "ingest": IngestDocument}
# Parts whose inner shape belongs to the module that builds them: their named keys are typed, more may follow.
OPEN = frozenset({"Gate", "Goodput", "GoodputScope", "Capacity", "RunProfile", "Side", "IngestSource"})


# ---------------------------------------------------------------------------------- JSON Schema from the types


def schema_from_types(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of document `kind`, generated from its TypedDict."""
    defs: dict[str, dict] = {}
    root = _typed_dict_schema(DOCUMENTS[kind], defs)
    name = DOCUMENTS[kind].__name__
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://servlens.dev/schemas/{kind}-{SCHEMA_VERSION}.schema.json",
        "title": f"servlens {kind} result document, schema version {SCHEMA_VERSION}",
        "description": f"Generated from servlens.documents.{name}; do not edit (tools/make_schemas.py).",
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def _typed_dict_schema(cls: type, defs: dict[str, dict]) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    properties, required = {}, []
    for key, hint in hints.items():
        optional = typing.get_origin(hint) is NotRequired
        if optional:
            hint = typing.get_args(hint)[0]
        else:
            required.append(key)
        properties[key] = _schema(hint, defs)
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": cls.__name__ in OPEN}


def _schema(hint: Any, defs: dict[str, dict]) -> dict:
    if hint is Any:
        return {}
    if typing.is_typeddict(hint):
        name = hint.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder first: a type may refer to itself
            defs[name] = _typed_dict_schema(hint, defs)
        return {"$ref": f"#/$defs/{name}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(args)} if len(args) > 1 else {"const": args[0]}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in args]}
    if origin is list:
        return {"type": "array", "items": _schema(args[0], defs)} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
    if hint in simple:
        return {"type": simple[hint]}
    raise TypeError(f"no JSON Schema for {hint!r}")


@cache
def _schema_text(kind: str) -> str:
    return resources.files("servlens.schemas").joinpath(f"{kind}.schema.json").read_text(encoding="utf-8")


def load_schema(kind: str) -> dict:
    """The shipped JSON Schema of document `kind` (package data servlens/schemas/KIND.schema.json)."""
    return json.loads(_schema_text(kind))


# ------------------------------------------------------------------------------ the check `servlens report` runs


def problems(doc: Any, kind: str, limit: int = 5) -> list[str]:
    """Where `doc` departs from the shipped schema of `kind`: up to `limit` sentences naming the JSON path.

    A small checker of the schema subset schema_from_types writes (type, enum, const, properties, required,
    additionalProperties, items, anyOf, $ref), so reading a saved document needs no JSON Schema library; the tests
    check the documents with the jsonschema package itself.
    """
    schema = load_schema(kind)
    found: list[str] = []
    _check(doc, schema, schema["$defs"], "$", found, limit)
    return found[:limit]


_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _check(value: Any, schema: dict, defs: dict, path: str, found: list[str], limit: int) -> None:
    if len(found) >= limit:
        return
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        if not any(_fits(value, option, defs) for option in schema["anyOf"]):
            objects = [o for o in schema["anyOf"] if _resolve(o, defs).get("type") == "object"]
            if isinstance(value, dict) and len(objects) == 1:
                _check(value, objects[0], defs, path, found, limit)  # name the key that is wrong, not just "no"
            else:
                found.append(f"{path} is {_describe(value)}, not one of the types allowed there")
        return
    if "const" in schema and value != schema["const"]:
        found.append(f"{path} is {json.dumps(value)[:40]}, not {json.dumps(schema['const'])}")
        return
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path} is {json.dumps(value)[:40]}, not one of {', '.join(map(json.dumps, schema['enum']))}")
        return
    kind = schema.get("type")
    if kind and not _JSON_TYPES[kind](value):
        found.append(f"{path} is {_describe(value)}, not {'an' if kind[0] in 'aeiou' else 'a'} {kind}")
        return
    if kind == "array" and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], defs, f"{path}[{index}]", found, limit)
    if kind == "object":
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                found.append(f"{path} lacks the key {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                _check(item, properties[key], defs, f"{path}.{key}", found, limit)
            elif extra is False:
                found.append(f"{path} has a key {key!r} this schema does not know")
            elif isinstance(extra, dict):
                _check(item, extra, defs, f"{path}.{key}", found, limit)


def _resolve(schema: dict, defs: dict) -> dict:
    return defs[schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema


def _fits(value: Any, schema: dict, defs: dict) -> bool:
    probe: list[str] = []
    _check(value, schema, defs, "$", probe, 1)
    return not probe


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", str: "a string", int: "an integer", float: "a number", dict: "an object",
             list: "an array"}
    return names.get(type(value), type(value).__name__)
