"""A file that sniffs as a built-in format and gives no row is an error for a named file (exit 2, saying why: the
row filter's fields it lacks, a header without rows, no line the patterns match) and a listed skip in a folder, which
then exits 2 with "Nothing was ingested". Checked for every built-in profile for which an empty file of its own shape
can be made from its real sample (profile_columns.SAMPLES): a CSV's header alone, a console log's recognised line
cut after what detect.line matches, and JSON records kept down to their detect.must fields where a row filter
(where) then refuses them. A JSON record with only its detect fields is still a request row (unknown fields stay
NULL) in the other JSON profiles, so they have no empty file of this kind and are listed, not skipped silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servlens.errors import InputError
from servlens.ingest.api import check_something_ingested, ingest_inputs
from servlens.ingest.profiles import builtin_profiles
from servlens.ingest.sniff import parse_path, path_values
from servlens.store.schema import open_store
from tests.ingest.format_rows import sniffed_name
from tests.ingest.profile_columns import REPO, SAMPLES

PROFILES = {p.name: p for p in builtin_profiles()}

# The profiles an empty file is made for, and the start of the reason a named one is refused with.
EXPECTED = {
    "azure-llm-trace": "the file holds no record",
    "burstgpt-trace": "the file holds no record",
    "helicone-export-csv": "the file holds no record",
    "langfuse-observations-csv": "the file holds no record",
    "litellm-spendlogs-csv": "the file holds no record",
    "envoy-ai-gateway-access-log": "no record passed the profile's row filter (where): none of the first",
    "tgi-router-json": "no record passed the profile's row filter (where): none of the first",
    # a line reader's empty file is a sampled line cut after its detect match: no [lines] pattern matches it, which is
    # said before any row filter (there is nothing for `where` to filter)
    "llama-server-log": "no line of the file matches the profile's [lines] patterns",
    "vllm-request-log": "no line of the file matches the profile's [lines] patterns",
    "tgi-router-text": "no line of the file matches the profile's [lines] patterns",
    "sglang-request-log-text": "no line of the file matches the profile's [lines] patterns",
    "sglang-request-log": "no line of the file matches the profile's [lines] patterns",
    "portkey-gateway-log-stream": "no line of the file matches the profile's [lines] patterns",
}


def _only(record: dict, paths: list[str]) -> dict:
    """The record with only these (object-key) paths, values kept."""
    out: dict = {}
    for path in paths:
        tokens = parse_path(path)
        values = path_values(record, tokens)
        if not values or not all(isinstance(t, str) for t in tokens):
            continue
        node = out
        for key in tokens[:-1]:
            node = node.setdefault(key, {})
        node[tokens[-1]] = values[0]
    return out


def _empty_file(name: str, folder: Path) -> Path | None:
    profile = PROFILES[name]
    sample = REPO / SAMPLES[name][0]
    text = sample.read_text(errors="replace")
    path = folder / f"empty-{name}{sample.suffix}"
    if profile.reader == "csv":
        path.write_text(text.splitlines()[0] + "\n")
    elif profile.reader == "lines":
        line = next(l for l in text.splitlines() if re.search(profile.detect_line, l))
        path.write_text(line[:re.search(profile.detect_line, line).end()] + "\n")
    elif profile.reader in ("jsonl", "json") and profile.where and profile.detect_must:
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        path.write_text("".join(json.dumps(_only(r, profile.detect_must)) + "\n" for r in records
                                if isinstance(r, dict)))
    else:
        return None
    return path


def test_the_empty_files_cover_the_expected_profiles(tmp_path):
    refused = set()
    for name in PROFILES:
        path = _empty_file(name, tmp_path)
        if path is None or sniffed_name(path) != name:
            continue
        try:
            ingest_inputs(open_store(None), [str(path)], run="t")
        except InputError:
            refused.add(name)
    assert refused == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_named_file_that_gives_no_row_is_refused_and_a_folder_of_it_too(tmp_path, name):
    path = _empty_file(name, tmp_path)
    assert sniffed_name(path) == name
    with pytest.raises(InputError) as named:
        ingest_inputs(open_store(None), [str(path)], run="t")
    assert str(named.value).startswith(f"{path} looks like {name} but gave no rows: {EXPECTED[name]}")
    # the same file in a folder: a listed skip, and nothing ingested is an error
    report = ingest_inputs(open_store(None), [str(tmp_path)], run="t")
    assert report.sources == [] and len(report.skipped) == 1
    reason = report.skipped[0]["reason"]
    if PROFILES[name].reader == "lines" and not PROFILES[name].line_request_log:
        assert reason.endswith(f"name the file to read it ({name})")  # a console log is read only when named
    else:
        assert reason.startswith(f"{name}, but no rows: {EXPECTED[name]}")
    with pytest.raises(InputError, match=rf"^Nothing was ingested from {re.escape(str(tmp_path))}: 1 file\(s\) skipped"):
        check_something_ingested(report, [str(tmp_path)])


def test_lines_that_match_but_never_finish_a_record_name_the_missing_capture(tmp_path):
    """A real llama.cpp log cut before any task finished (its launch_slot_ and print_timing lines up to the first
    `total time`): the patterns match, the row filter needs `total_ms`, and the refusal says so."""
    source = REPO / "tests/data/shared/real-engine/llamacpp/llama-server-prefix-fresh.log"
    lines = source.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "total time =" in line)
    path = tmp_path / "unfinished.log"
    path.write_text("\n".join(lines[:cut]) + "\n")
    assert "launch_slot_" in path.read_text()
    with pytest.raises(InputError) as named:
        ingest_inputs(open_store(None), [str(path)], run="t", from_format="llama-server-log")
    assert ("gave no rows: no record passed the profile's row filter (where): no line gave the capture(s) "
            "total_ms") in str(named.value)
