"""Anthropic Messages bodies: recorded from llama-server's /v1/messages and Helicone's fixtures (ATTRIBUTION.md)."""

from __future__ import annotations

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "anthropic" / "messages-bodies.jsonl"


def test_messages_bodies_prompt_is_input_plus_both_cache_fields():
    assert sniffed_name(SAMPLE) == "anthropic-messages-body"
    source, rows, con = ingest_rows(SAMPLE, order="source_line")
    # line 4, llama-server's 400 answer, has no usage: a counted bad line
    assert (source["rows"], source["bad_lines"]) == (5, 1)
    assert con.execute("SELECT line FROM ingest_errors").fetchall() == [(4,)]
    first, second, stopped, created, read = rows
    # llama-server: input_tokens 44 are the uncached part of a 127-token prompt (83 read from the slot's cache)
    assert (first["prompt_tokens"], first["cached_tokens"], first["attrs"]["input_uncached"]) == (127, 83, 44)
    assert (second["prompt_tokens"], second["cached_tokens"], second["completion_tokens"]) == (127, 116, 5)
    assert (first["model"], first["endpoint"], first["request_id"]) == (
        "tiny", "/v1/messages", "chatcmpl-7wvBk31zQLQJR6enTM2naSH81SZcDpkJ")
    # a matched stop sequence: llama-server says end_turn with stop_sequence set
    assert (stopped["finish_reason"], stopped["attrs"]["stop_sequence"]) == ("stop", "e")
    # Helicone's fixtures: cache creation counts in the prompt but is not a cache hit; a read is
    assert (created["prompt_tokens"], created["cached_tokens"], created["attrs"]["cache_creation_tokens"]) == (
        51717, 0, 51713)
    assert (read["prompt_tokens"], read["cached_tokens"], read["completion_tokens"]) == (51717, 51713, 100)
    assert all(r["t_arrival"] is None and r["e2e_s"] is None for r in rows)
