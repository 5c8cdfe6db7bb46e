"""Validation of result documents against the JSON Schemas servlens ships (servlens/schemas/), with jsonschema."""

from __future__ import annotations

import json
from functools import cache, wraps

import jsonschema

from servlens.documents import load_schema


@cache
def validator(kind: str, definition: str | None = None) -> jsonschema.Draft202012Validator:
    """A validator for document `kind`, or for one of its $defs (e.g. "Finding")."""
    schema = load_schema(kind)
    if definition is not None:
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    return jsonschema.Draft202012Validator(schema)


def assert_valid(value, kind: str, definition: str | None = None) -> None:
    """Raise AssertionError naming each place `value` (as JSON would carry it) departs from the schema."""
    as_json = json.loads(json.dumps(value, default=str))
    errors = sorted(validator(kind, definition).iter_errors(as_json), key=lambda e: list(e.absolute_path))
    if errors:
        where = definition or kind
        # inside an anyOf (a value or null) the useful message is the branch's own, not "not valid under any"
        errors = [jsonschema.exceptions.best_match([e]) for e in errors]
        lines = [f"{e.json_path}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError(f"{where} does not match its schema ({len(errors)} errors):\n" + "\n".join(lines))


def _checking(func, kind: str, definition: str | None = None, argument: int | None = None):
    """`func` wrapped to validate its result (or, with `argument`, that positional argument) on each call."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        if argument is not None and len(args) > argument and isinstance(args[argument], dict) \
                and args[argument].get("kind") == kind:
            assert_valid(args[argument], kind, definition)
        result = func(*args, **kwargs)
        if argument is None:
            assert_valid(result, kind, definition)
        return result

    wrapper.__wrapped_for_schema__ = True
    return wrapper


def wrap_builders(monkeypatch) -> None:
    from servlens.analysis import runner
    from servlens.commands import analyze as analyze_command
    from servlens.commands import compare as compare_command
    from servlens.compare import engine
    from servlens.ingest import api

    if getattr(runner.evaluate, "__wrapped_for_schema__", False):
        return
    monkeypatch.setattr(runner, "evaluate", _checking(runner.evaluate, "analyze", "Finding"))
    monkeypatch.setattr(runner, "analyze", _checking(runner.analyze, "analyze"))
    monkeypatch.setattr(engine, "compare_runs", _checking(engine.compare_runs, "compare"))
    monkeypatch.setattr(api.IngestReport, "to_dict", _checking(api.IngestReport.to_dict, "ingest"))
    # What the commands render: the builder's document plus what the command adds (skipped files, goodput gate).
    monkeypatch.setattr(analyze_command, "render", _checking(analyze_command.render, "analyze", argument=0))
    monkeypatch.setattr(compare_command, "render", _checking(compare_command.render, "compare", argument=0))
