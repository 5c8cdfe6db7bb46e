"""The typed fast path (read_json with a schema from the profile's paths) against the line reader, row for row.

Every request log among the real samples (tests/data/formats, shared, recorded) is ingested both ways, with the
profile sniffing picks; the stored rows (every column, source_line included) and the bad lines must be the same, and
the typed path must have been taken wherever the profile allows it and the file has no line it would read otherwise.
Crafted LiteLLM files add what the samples lack: bad lines, blank lines, values of the wrong type, null beside
absent, nested arrays, shapes that vary within one file.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from servlens.ingest import api
from servlens.ingest.compiler import CompileOptions, compile_profile
from servlens.ingest.profiles import builtin_profiles, get_profile
from servlens.ingest.requests import ingest_request_file
from servlens.store.schema import open_store

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLE_DIRS = ("formats", "shared", "recorded")


def _request_logs() -> list[tuple[Path, api._Plan]]:
    profiles = builtin_profiles()
    found = []
    for folder in SAMPLE_DIRS:
        for path in sorted((DATA / folder).rglob("*")):
            if not path.is_file() or path.name.endswith((".md", ".toml", ".py", ".txt", ".prom", ".sh")):
                continue
            try:
                plan = api._plan(path, True, profiles, None, False)
            except Exception:  # noqa: BLE001, S112 - not a request log (the planner refuses it): nothing to compare
                continue
            if plan.kind == "requests" and plan.profile.reader in ("jsonl", "json"):
                found.append((path, plan))
    return found


LOGS = _request_logs()


_SEEN: dict[tuple, tuple] = {}


def _ingest(path: Path, profile, typed: bool, **options) -> tuple[list, list, str | None]:
    key = (path, profile.name, typed, tuple(sorted((k, str(v)) for k, v in options.items())))
    if key not in _SEEN:  # the sample files are ingested once per path and reused by the tests below
        _SEEN[key] = _ingest_now(path, profile, typed, **options)
    return _SEEN[key]


def _ingest_now(path: Path, profile, typed: bool, **options) -> tuple[list, list, str | None]:
    con = open_store(None)
    result = ingest_request_file(con, path, profile, typed=typed, **options)
    rows = con.execute("SELECT * EXCLUDE (source_id) FROM requests ORDER BY source_line, request_id").fetchall()
    errors = con.execute("SELECT line, byte_length, reason, keys_seen, excerpt FROM ingest_errors "
                         "ORDER BY line").fetchall()
    con.close()
    return rows, errors, result.extra.get("reader")


def test_the_samples_hold_request_logs_of_many_profiles():
    assert len(LOGS) >= 30
    assert len({plan.profile.name for _, plan in LOGS}) >= 10


@pytest.mark.parametrize("path,plan", LOGS, ids=[str(p.relative_to(DATA)) for p, _ in LOGS])
def test_typed_and_line_reader_store_the_same_rows(path, plan):
    options = {"json_multiline": bool(plan.sample and plan.sample.json_multiline), "wrapper": plan.wrapper}
    typed_rows, typed_errors, reader = _ingest(path, plan.profile, True, **options)
    line_rows, line_errors, line_reader = _ingest(path, plan.profile, False, **options)
    assert line_reader == "lines"
    assert typed_rows == line_rows
    assert typed_errors == line_errors
    if reader == "typed":
        assert not line_errors  # a file with a bad line is always read by the line reader


def test_the_typed_path_reads_the_recorded_gateway_and_client_logs():
    """Not a formality: the fast path must be taken on real logs (it falls back on any doubt). Every recorded
    LiteLLM payload file and client log (no bad line among them) is read by it."""
    recorded = [(p, plan) for p, plan in LOGS if plan.profile.name in ("litellm-slp", "servlens-loadgen")
                and plan.wrapper is None and DATA / "recorded" in p.parents]
    assert len(recorded) >= 10
    readers = {str(p.relative_to(DATA)): _ingest(p, plan.profile, True, json_multiline=False, wrapper=None)[2]
               for p, plan in recorded}
    assert set(readers.values()) == {"typed"}, readers


def _slp(**fields) -> dict:
    base = {"id": "a1", "trace_id": "t1", "call_type": "acompletion", "status": "success", "stream": True,
            "startTime": 1764806400.0, "completionStartTime": 1764806400.4, "endTime": 1764806401.5,
            "model": "hosted_vllm/m", "model_group": "m", "api_base": "http://engine:8000/v1",
            "metadata": {"usage_object": {"prompt_tokens": 10, "completion_tokens": 20,
                                          "prompt_tokens_details": {"cached_tokens": 4}}},
            "response": {"model": "m", "choices": [{"finish_reason": "stop", "message": {"content": "hi"}}]},
            "messages": [{"role": "user", "content": "hello"}],
            "error_information": {"error_code": "", "error_class": "", "error_message": ""}}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _ABSENT}


_ABSENT = object()

# Each case: the lines of a file, and whether the typed path may keep it (False: it must fall back).
CASES = {
    "plain": ([_slp(), _slp(id="a2", trace_id="t1", startTime=1764806402.0, endTime=1764806403.0)], True),
    "null beside absent": ([_slp(trace_id=None, stream=None, response=None, metadata=None, messages=None),
                            _slp(id="a2", trace_id=_ABSENT, stream=_ABSENT, response=_ABSENT, metadata=_ABSENT,
                                 messages=_ABSENT, request_tags=None)], True),
    "numbers as strings, booleans as strings": ([_slp(startTime="1764806400.25", endTime="1764806401",
                                                      stream="true", cache_hit="false",
                                                      metadata={"usage_object": {"prompt_tokens": "12",
                                                                                 "completion_tokens": 12.0}})], True),
    "text TRY_CAST makes NULL": ([_slp(stream={"x": 1}, cache_hit=[1], request_tags="not-a-list")], True),
    # a cast the profile does not guard fails the fast query: the line reader, then its safe mode, decide
    "wrong types a cast refuses": ([_slp(metadata={"usage_object": {"prompt_tokens": True,
                                                                    "completion_tokens": [1, 2]}})], False),
    "fractional token count": ([_slp(metadata={"usage_object": {"prompt_tokens": 12.5}})], True),
    "an object where a struct holds a string": ([_slp(), _slp(id="a2", response="oops")], False),
    "a list where an object is read": ([_slp(response={"choices": {"finish_reason": "stop"}})], False),
    "nested arrays and varied shapes": ([_slp(response={"choices": [{"finish_reason": "length",
                                                                     "message": {"content": [["a"], {"b": 1}]}}]}),
                                         _slp(id="a2", response={"choices": []}),
                                         _slp(id="a3", response={}, status="failure",
                                              error_information={"error_code": "429", "error_class": "RateLimit",
                                                                 "error_message": "slow down"}),
                                         _slp(id="a4", messages="a plain string prompt",
                                              request_tags=["x", ["y"], {"z": None}])], True),
    "a bad line": ([_slp(), "{not json", _slp(id="a3")], False),
    "a blank line": ([_slp(), "", _slp(id="a3")], False),
    "a line missing a required field": ([_slp(), _slp(id="a2", call_type=_ABSENT)], False),
    "an array line": ([_slp(), [1, 2]], False),
    "duplicate keys": ([_slp(), '{"id": "x", "id": "y", "startTime": 1, "endTime": 2, "call_type": "c"}'], False),
    "a secret in an error": ([_slp(status="failure", error_str="auth failed for key sk-abcdefghijklmnop1234",
                                   api_base="https://user:hunter2@engine/v1")], True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_litellm_files_give_the_line_readers_rows(tmp_path, name):
    lines, typed_ok = CASES[name]
    path = tmp_path / "slp.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    profile = get_profile("litellm-slp")
    typed_rows, typed_errors, reader = _ingest(path, profile, True)
    line_rows, line_errors, _ = _ingest(path, profile, False)
    assert (typed_rows, typed_errors) == (line_rows, line_errors)
    assert reader == ("typed" if typed_ok else "lines")


def test_line_numbers_from_insert_order_follow_the_file(tmp_path):
    """read_json hands rows over in file order (insertion order preserved), so rowid order is line order, over
    several of its buffers and both threads."""
    path = tmp_path / "many.jsonl"
    with path.open("w") as out:
        for i in range(60_000):
            out.write(json.dumps(_slp(id=f"r{i}", trace_id=f"t{i}", padding="x" * (i % 97))) + "\n")
    con = open_store(None)
    assert ingest_request_file(con, path, get_profile("litellm-slp")).extra["reader"] == "typed"
    wrong = con.execute("SELECT count(*) FROM requests WHERE request_id <> 'r' || (source_line - 1)").fetchone()[0]
    assert (con.execute("SELECT count(*) FROM requests").fetchone()[0], wrong) == (60_000, 0)


def test_profiles_reading_the_whole_document_are_not_typed(tmp_path):
    """A profile that reads `j` itself (its keys, a wildcard path) needs the line's text: the line reader. A call on
    the document with one literal path (json_type(j, '$.p'), as servlens-loadgen has) is read from the schema."""
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n")
    opts = CompileOptions(path=path, lines_by_insert_order=True, typed=True)
    slp = get_profile("litellm-slp")
    keys = replace(slp, attrs={**slp.attrs, "keys": "json_keys(j)"})
    wildcard = replace(slp, attrs={**slp.attrs, "roles": "j->>'$.messages[*].role'"})
    assert [compile_profile(p, opts).typed for p in (slp, get_profile("servlens-loadgen"), keys, wildcard)] == [
        True, True, False, False]


def test_read_json_gives_values_as_json_extract_string_does(tmp_path):
    """The typed read's VARCHAR leaves are the same text the line reader's json_extract_string gives."""
    values = ['1e3', '1.50', '-0', '123456789012345678901234567890', '0.1', 'true', 'null', '"a\\u00e9\\"\\n"',
              '{ "a" : [1, 2] , "b":"\\u00e9"}', '[ ]', '"12"', '1E400']
    path = tmp_path / "v.jsonl"
    path.write_text("".join('{"v": ' + v + '}\n' for v in values))
    con = duckdb.connect()
    typed = [r[0] for r in con.execute(f"SELECT v FROM read_json('{path}', format='newline_delimited', "
                                       "columns={'v': 'VARCHAR'})").fetchall()]
    text = [con.execute("SELECT json_extract_string(?, '$.v')", ['{"v": ' + v + '}']).fetchone()[0] for v in values]
    assert typed == text
