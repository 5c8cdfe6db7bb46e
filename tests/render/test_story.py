"""The report leads with the story (issue 20): the cause chain as its first paragraph in text, Markdown and HTML,
then goodput and the breaking concurrency with a chart. A report that lists the links as separate findings without
telling the chain fails these tests (test_a_report_without_the_chain_fails)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servlens.cli import cli
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "tests" / "data" / "recorded" / "gw-timeout-fallback"
# The links of the gateway chain in causal order, with their numbers (facts.json: 37 Timeouts, 36 fallbacks to the
# 16-token deployment, 34 cut by length).
CHAIN = ["a queue-driven TTFT spike on chat (45 requests arrived in it)",
         "37 timeouts on chat at the gateway's 3.49 s limit",
         "36 fallbacks answered by chat-small",
         "34 answers cut by length on chat-small at a 16-token cap"]


@pytest.fixture(scope="module")
def story_doc(tmp_path_factory):
    """The real run's document, its chains rebuilt from its findings plus the SL004/SL011/SL005 findings that the
    detector fixes in progress will give (tests/analysis/test_chains.py builds the same)."""
    from servlens.analysis.chains import build_chains
    from servlens.analysis.goodput import parse_slo
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules
    from servlens.analysis.runner import analyze
    from tests.analysis.test_chains import _gateway_story

    con = open_store(tmp_path_factory.mktemp("story") / "store.duckdb")
    try:
        ingest_paths(con, [str(GATEWAY / "litellm_slp.jsonl.zst")], [str(GATEWAY / "metrics_*")])
        doc = analyze(con, load_rules(), slo=parse_slo(["ttft=2s,tpot=100ms"]))
        findings = _gateway_story(doc)
        doc["findings"] = findings
        doc["chains"] = build_chains(con, findings)
    finally:
        con.close()
    return json.loads(json.dumps(doc))


def tells_the_chain(paragraph: str) -> None:
    """The paragraph tells every link in causal order, joined as one chain, with what went through it all."""
    positions = [paragraph.find(link) for link in CHAIN]
    assert -1 not in positions, f"links missing from the first paragraph: {paragraph!r}"
    assert positions == sorted(positions), "links out of causal order"
    between = [paragraph[positions[k]:positions[k + 1]] for k in range(len(CHAIN) - 1)]
    assert all(" → " in part for part in between), "the links are listed, not chained"
    assert "34 requests went through every link" in paragraph
    assert "Break it first at SL004" in paragraph and "Rollback criterion:" in paragraph


def _first_paragraph_text(text: str) -> str:
    body = text.split("\n\n", 1)[1]             # after the header line(s)
    block = body.split("\n\n", 1)[0]
    assert block.startswith("CAUSE CHAINS (1)"), block[:80]
    return " ".join(line.strip() for line in block.splitlines()[1:])


def test_text_leads_with_the_chain(story_doc):
    from servlens.render.analyze_text import render_analyze_text

    text = render_analyze_text(story_doc)
    tells_the_chain(_first_paragraph_text(text))
    # The findings follow, each link marked with its chain; goodput comes between.
    assert text.index("CAUSE CHAINS") < text.index("GOODPUT AND CAPACITY") < text.index("FIRED (")
    assert re.search(r"SL011 \S+ \[chat / 127\.0\.0\.1:58517/v1\] \(chain 1\)", text)


def test_a_report_without_the_chain_fails(story_doc):
    from servlens.render.analyze_text import render_analyze_text

    listed = dict(story_doc, chains=[])
    text = render_analyze_text(listed)
    assert all(f"{rule} " in text for rule in ("SL004", "SL011", "SL005", "SL002"))   # the links are all there...
    with pytest.raises(AssertionError):
        _first_paragraph_text(text)                                                     # ...but no chain
    # A chain paragraph that only lists the findings one by one does not pass either.
    broken = json.loads(json.dumps(story_doc))
    broken["chains"][0]["summary"] = ". ".join(CHAIN) + ". 34 requests went through every link."
    with pytest.raises(AssertionError):
        tells_the_chain(_first_paragraph_text(render_analyze_text(broken)))


def test_markdown_leads_with_the_chain_and_its_links(story_doc):
    from servlens.render.analyze_markdown import render_analyze_markdown

    md = render_analyze_markdown(story_doc)
    after = md.split("### Cause chains\n\n", 1)[1]
    assert md.index("### Cause chains") < md.index("| Severity | Rule |")
    paragraph = after.split("\n\n", 1)[0]
    assert paragraph.startswith("1. ")
    tells_the_chain(paragraph.replace("\\", ""))
    assert "   | 2 | SL011 | chat / http://127.0.0.1:58517/v1 | 37 | 37 | the queue-driven TTFT spike" in md
    assert "### Goodput and capacity" in md and "| in flight | requests | TTFT p99 (s)" in md


def test_html_leads_with_the_chain_and_charts_the_capacity(story_doc):
    pytest.importorskip("matplotlib")
    from servlens.render.html import render_html

    page = render_html(story_doc)
    assert page.index('<section id="story">') < page.index('<section id="findings"')
    story = page[page.index('<section id="story">'):page.index('<section id="coverage"')]
    first = re.search(r'<li class="chain"><p>(.*?)</p>', story, re.DOTALL).group(1)
    tells_the_chain(first.replace("&#39;", "'").replace("&amp;", "&"))
    assert "Goodput and capacity" in story
    goodput = story[story.index('id="goodput"'):]
    assert goodput.count("<svg") == 3      # attainment per window, and requests in flight for chat and chat-small
    assert "Requests in flight at arrival: chat / http://127.0.0.1:58517/v1" in goodput


def test_reports_without_chains_or_goodput_have_no_story(story_doc):
    from servlens.render.analyze_markdown import render_analyze_markdown
    from servlens.render.analyze_text import render_analyze_text

    # no chain, and the goodput of runs without request logs (it has a note, no summary)
    quiet = story_doc | {"chains": [], "goodput": {"targets": None, "objective": {"ttft": 0.9}, "requests": 0,
                                                    "min_level_requests": 20,
                                                    "note": "no request logs: goodput is not evaluable"}}
    assert "CAUSE CHAINS" not in render_analyze_text(quiet) and "GOODPUT" not in render_analyze_text(quiet)
    assert "### Cause chains" not in render_analyze_markdown(quiet)


def test_cli_slo_prints_goodput_and_the_breaking_concurrency(cli_runner):
    args = ["analyze", str(GATEWAY / "litellm_slp.jsonl.zst"), "--metrics", str(GATEWAY / "metrics_*"),
            "--slo", "ttft=2s,tpot=100ms"]
    text = cli_runner.invoke(cli, args, catch_exceptions=False)
    assert text.exit_code == 0
    block = text.output[text.output.index("GOODPUT AND CAPACITY"):].split("\n\n", 1)[0]
    assert "met TTFT ≤ 2 s, TPOT ≤ 100 ms; goodput" in block and "37 failed" in block
    assert re.search(r"chat: .*in flight \((high|medium|low) confidence\)", " ".join(block.split()))
    doc = json.loads(cli_runner.invoke(cli, args + ["--format", "json"], catch_exceptions=False).stdout)
    assert [(b["model"], b["deployment"]) for b in doc["goodput"]["breaking_concurrency"]] == [
        ("chat", "http://127.0.0.1:58517/v1"), ("chat-small", "http://127.0.0.1:38245/v1")]
    assert doc["chains"] and all({"summary", "links"} <= set(c) for c in doc["chains"])
    assert all({"rule", "scope", "requests"} <= set(link) for c in doc["chains"] for link in c["links"])


def test_cli_bad_slo_is_one_sentence_and_exit_2(monkeypatch, capsys):
    from servlens.cli import main

    monkeypatch.setattr("sys.argv", ["servlens", "analyze", str(GATEWAY / "litellm_slp.jsonl.zst"),
                                     "--slo", "ttft=soon"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert captured.err == "Error: --slo 'ttft=soon': 'soon' is not a duration. Durations: 250ms, 2s, 1.5s, 1m.\n"
