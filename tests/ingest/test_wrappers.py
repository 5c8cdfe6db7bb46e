"""Records inside log stores' envelopes: every profile is read inside every wrapper, found by sniffing."""

from __future__ import annotations

import json

import pytest

from servlens.ingest.profiles import builtin_profiles
from servlens.ingest.sniff import sniff
from tests.ingest.format_rows import FORMATS, ingest_rows

WRAPPED = FORMATS / "wrappers"
PLAIN = FORMATS.parent / "gateways" / "litellm_slp_recorded.jsonl"


def _plain_rows():
    lines = "\n".join(PLAIN.read_text().splitlines()[:3]) + "\n"
    return lines


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "slp.jsonl"
    path.write_text(_plain_rows())
    _, rows, _ = ingest_rows(path)
    return rows


@pytest.mark.parametrize("name, wrapper, bad", [
    ("elasticdump-litellm-slp.ndjson", "elasticsearch-source", 0),
    ("es-search-litellm-slp.json", "elasticsearch-search", 0),
    ("logcli-litellm-slp.jsonl", "loki-logcli", 1),
])
def test_wrapped_records_read_as_the_inner_format(plain, name, wrapper, bad):
    path = WRAPPED / name
    found = sniff(path, builtin_profiles())
    assert (found.profile.name, found.wrapper.name) == ("litellm-slp", wrapper)
    source, rows, con = ingest_rows(path)
    assert (source["format"], source["wrapper"], source["rows"], source["bad_lines"]) == ("litellm-slp", wrapper, 3, bad)
    keep = ("request_id", "model", "t_arrival", "t_end", "ttft_s", "e2e_s", "prompt_tokens", "cached_tokens",
            "completion_tokens", "finish_reason", "status", "prefix_key")
    assert [{k: r[k] for k in keep} for r in rows] == [{k: r[k] for k in keep} for r in plain]
    if bad:
        # the application's plain-text line inside logcli's envelope is a counted bad line, not dropped
        assert con.execute("SELECT line, reason FROM ingest_errors").fetchall() == [(4, "invalid JSON")]


def test_forced_format_is_read_inside_a_wrapper():
    source, rows, _ = ingest_rows(WRAPPED / "elasticdump-litellm-slp.ndjson", from_format="litellm-slp")
    assert (source["rows"], source["wrapper"]) == (3, "elasticsearch-source")
    assert json.loads(json.dumps(rows[0]["attrs"], default=str))  # attrs still parse
