"""The HTML report: structure, escaping, no network references, CSP, size bound, template overrides."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

import pytest

from servlens.errors import ConfigError, InputError
from servlens.render.html import MAX_REPORT_BYTES, render_html

from conftest import BREAKOUT, HOSTILE_ID, HOSTILE_MODEL, SCRIPT

# Elements whose src/href/data would make the browser fetch something. <a href> is a link, not a resource.
RESOURCE_ATTRS = {"src", "srcset", "data", "poster", "background", "action", "formaction", "manifest"}


class PageScan(HTMLParser):
    """Collects every start tag with its attributes, every <style> body and the text of the page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.styles: list[str] = []
        self.text: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {name: (value or "") for name, value in attrs}))
        self._in_style = tag == "style"

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, {name: (value or "") for name, value in attrs}))

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        (self.styles if self._in_style else self.text).append(data)


def scan(page: str) -> PageScan:
    parser = PageScan()
    parser.feed(page)
    parser.close()
    return parser


def network_references(page: str) -> list[str]:
    """Every reference that would load something from outside the file."""
    parsed = scan(page)
    found = []
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            if name in RESOURCE_ATTRS and value and not value.startswith("data:"):
                found.append(f"<{tag} {name}={value!r}>")
            if name in ("href", "xlink:href") and tag != "a" and value and not value.startswith("#"):
                found.append(f"<{tag} {name}={value!r}>")
            if name == "style":
                found.extend(_css_references(value))
        if tag in ("script", "iframe", "object", "embed", "frame", "base"):
            found.append(f"<{tag}>")
        if tag == "link":
            found.append(f"<link {attrs}>")
        if tag == "meta" and attrs.get("http-equiv", "").lower() == "refresh":
            found.append("<meta refresh>")
    for css in parsed.styles:
        found.extend(_css_references(css))
    return found


def _css_references(css: str) -> list[str]:
    found = [f"@import {m}" for m in re.findall(r"@import[^;]*", css, re.I)]
    for target in re.findall(r"url\(\s*['\"]?([^)'\"]*)", css, re.I):
        if not target.startswith(("#", "data:")):
            found.append(f"url({target})")
    return found


# ------------------------------------------------------------------ structure


def test_analyze_report_has_every_section_and_finding(analyze_doc):
    page = render_html(analyze_doc)
    parsed = scan(page)
    ids = [attrs.get("id") for _, attrs in parsed.tags if attrs.get("id")]
    for section in ("summary", "coverage", "findings", "not-evaluable", "clear"):
        assert section in ids
    # The verdict leads: the summary comes before the data covered and the findings.
    assert ids.index("summary") < ids.index("coverage") < ids.index("findings")
    verdict = [attrs for tag, attrs in parsed.tags if "data-verdict" in attrs]
    assert verdict[0]["data-verdict"] == "critical"
    # Every fired finding has its own article, most severe first.
    rules = [attrs["data-rule"] for tag, attrs in parsed.tags if tag == "article"]
    assert rules == ["SL004", "SL002"]
    text = " ".join(parsed.text)
    assert "2 findings · highest critical" in text
    assert "1 critical, 1 warning fired" in text
    # The coverage header names sources, requests, span, models, columns and metrics.
    assert "2026-11-28 10:00:00 UTC → 2026-11-28 11:00:00 UTC (1 h 00 min)" in text
    assert "4,812" in text and "exports/litellm-1128.jsonl" in text
    assert "num_requests_waiting, kv_cache_usage_perc" in text
    assert "3 bad lines kept aside in ingest_errors" in text
    # Evidence: measured values with units, threshold, window, example request with file and line, rollback box.
    assert "3.41 s" in text and "91.00%" in text
    assert "2026-11-28 10:20:00 → 10:34:00 UTC" in text
    assert "1,207" in text
    assert "Roll back if TTFT p99 stays above 1 s for 10 minutes after the change." in text
    assert page.count('class="rollback"') == 2
    # One chart per fired finding, drawn as inline SVG.
    assert page.count("<svg") == 2
    # The not-evaluable rule says what data it lacks; the clear rule is listed as clear.
    assert "no cached-token field and no prefix-cache metric in these sources" in text
    assert "Reasoning leaking into content" in text
    # Only http(s) references become links; javascript: stays text.
    links = [attrs["href"] for tag, attrs in parsed.tags if tag == "a" and not attrs["href"].startswith("#")]
    assert links == ["https://docs.vllm.ai/en/latest/configuration/optimization.html"]
    assert "javascript:alert(3)" in text


def test_compare_report_leads_with_the_verdict_and_lists_every_gate(compare_doc):
    page = render_html(compare_doc)
    parsed = scan(page)
    ids = [attrs.get("id") for _, attrs in parsed.tags if attrs.get("id")]
    assert ids.index("verdict") < ids.index("coverage") < ids.index("gates") < ids.index("rollback")
    assert [attrs["data-verdict"] for _, attrs in parsed.tags if "data-verdict" in attrs] == ["fail"]
    text = " ".join(parsed.text)
    assert "TTFT p99 rose 25% [95% CI 14%–37%], beyond the 10% tolerance on a critical gate" in text
    rows = re.findall(r'<tr class="(fail|pass|inconclusive)">', page)
    assert rows == ["fail", "inconclusive", "pass"]  # failing first, then inconclusive, then passing
    for expected in ("+25.0%", "[+14.0%, +37.0%]", "+10%", "900 ms", "1.12 s", "+0.20 pp", "[-0.10 pp, +0.50 pp]",
                     "+0.50 pp", "0.20%", "0.40%", "+0.6%", "+5%"):
        assert expected in text, expected
    assert "Roll back: TTFT p99 rose 25% [95% CI 14%–37%], above the 10% tolerance" in text
    assert page.count("<svg") == 1
    assert "TPOT p50 fell 12.0% (31 ms → 27.3 ms) [95% CI −15.1% to −8.8%]" in text
    # The per-cohort results behind the mix-adjusted TTFT gate, under its chart.
    details = page[page.index('id="gate-charts"'):]
    assert "qwen3-8b&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; / 1k–2k prompt tokens" in details
    for expected in ("950 ms", "1.2 s", "+26.3%", "no (too few requests)"):
        assert expected in details, expected


# ------------------------------------------------------------------ safety


@pytest.mark.parametrize("make", ["analyze_doc", "compare_doc"])
def test_hostile_log_values_come_out_inert(make, request):
    page = render_html(request.getfixturevalue(make))
    parsed = scan(page)
    assert not [tag for tag, _ in parsed.tags if tag in ("script", "img", "iframe")]
    handlers = [(tag, name) for tag, attrs in parsed.tags for name in attrs if name.lower().startswith("on")]
    assert handlers == []
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    text = " ".join(parsed.text)
    assert "alert('x')" in text  # shown as text, so the reader sees what the log said
    assert "upstream said <script>" in text if make == "analyze_doc" else "context length exceeded <script>" in text
    if make == "analyze_doc":
        assert "req-7" in text and "onerror=alert(1)" in text
        assert HOSTILE_ID.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;") in page


def test_hostile_values_in_chart_labels_are_escaped_inside_the_svg(analyze_doc):
    page = render_html(analyze_doc)
    svg = page[page.index("<svg"): page.index("</svg>")]
    assert "qwen3-8b&lt;script&gt;" in svg
    assert "<script" not in svg


@pytest.mark.parametrize("make", ["analyze_doc", "compare_doc"])
def test_no_network_references_and_a_strict_csp(make, request):
    page = render_html(request.getfixturevalue(make))
    assert network_references(page) == []
    parsed = scan(page)
    policies = [attrs["content"] for tag, attrs in parsed.tags
                if tag == "meta" and attrs.get("http-equiv", "").lower() == "content-security-policy"]
    assert len(policies) == 1
    assert "default-src 'none'" in policies[0] and "img-src data:" in policies[0]
    assert "script-src" not in policies[0] or "script-src 'none'" in policies[0]
    # The policy comes before anything it governs.
    head = page[: page.index("<style")]
    assert "Content-Security-Policy" in head
    assert "@media print" in page


def test_scanner_catches_network_references():
    """The check above is only worth something if it fails on a page that does load things."""
    page = ('<html><head><link rel="stylesheet" href="https://cdn.example/x.css"><style>@import "a.css"; '
            'body{background:url(http://x/y.png)}</style></head><body><img src="http://x/i.png">'
            '<script src="https://cdn.example/plotly.js"></script><svg><image xlink:href="http://x/z.svg"/></svg>'
            '<a href="https://docs.example/">docs</a></body></html>')
    found = " | ".join(network_references(page))
    for caught in ("cdn.example/x.css", "@import \"a.css\"", "url(http://x/y.png)", "http://x/i.png",
                   "cdn.example/plotly.js", "http://x/z.svg"):
        assert caught in found, caught
    assert "docs.example" not in found


# ------------------------------------------------------------------ size bound


def test_size_stays_bounded_on_a_huge_analyze_result(analyze_doc):
    doc = copy.deepcopy(analyze_doc)
    template = doc["findings"][0]
    # Past every limit the page has (Limits: 60 detailed findings, 50 table rows, 400 points a series, 20 examples)
    # by far; bigger inputs only cost the test time (bounding the fields is linear in the document).
    big_rows = [[f"2026-11-28T10:{i % 60:02d}:00Z", i, 0.5 + i % 7, 0.4, f"model-{i}" * 5] for i in range(2_000)]
    points = [f"2026-11-28T10:{i // 60 % 60:02d}:{i % 60:02d}Z" for i in range(5_000)]
    findings = []
    for index in range(120):
        finding = copy.deepcopy(template)
        finding["rule"] = f"SL{index:03d}"
        finding["evidence"]["table"]["rows"] = big_rows
        finding["evidence"]["chart"]["series"] = [{"name": f"s{j}", "x": points, "y": list(range(5_000))}
                                                  for j in range(3)]
        finding["examples"] = [{"request_id": f"r{i}", "source": "a.jsonl", "line": i} for i in range(500)]
        finding["summary"] = "x" * 20_000
        findings.append(finding)
    doc["findings"] = findings + [dict(template, state="not_evaluable", rule=f"NE{i}") for i in range(3000)]
    doc["coverage"]["sources"] = [{"path": f"f{i}.jsonl", "format": "openai", "kind": "requests", "rows": i,
                                   "bad_lines": 0} for i in range(10_000)]
    page = render_html(doc)
    size = len(page.encode())
    assert size <= MAX_REPORT_BYTES, size
    assert "further findings are listed without their evidence" in page
    assert "Showing" in page and "the JSON result has them all" in page
    assert network_references(page) == []


def test_size_stays_bounded_on_a_huge_compare_result(compare_doc):
    doc = copy.deepcopy(compare_doc)
    gate = doc["gates"][0]
    doc["gates"] = [dict(copy.deepcopy(gate), cohort=f"model-{i} / 1k–2k", verdict="inconclusive")
                    for i in range(5_000)]
    doc["cohorts"] = [{"model": f"m{i}", "prompt_band": "1k", "n_before": i, "n_after": i} for i in range(50_000)]
    page = render_html(doc)
    assert len(page.encode()) <= MAX_REPORT_BYTES
    assert "of 5000 gates" in page


# ------------------------------------------------------------------ workload, templates, errors


def test_workload_section_renders_charts_tables_and_values(analyze_doc):
    analyze_doc["workload"] = {
        "peak_window": {"start": "2026-11-28T10:20:00Z", "end": "2026-11-28T10:50:00Z", "requests": 2950},
        "request_rate": {"type": "line", "title": "Requests per second", "x_label": "time (UTC)",
                         "y_label": "requests/s", "x_time": True, "x_log": False, "y_log": False,
                         "series": [{"name": "all", "x": ["2026-11-28T10:00:00Z", "2026-11-28T10:30:00Z"],
                                     "y": [1.5, 3.2]}], "hlines": [],
                         "vspans": [{"x0": "2026-11-28T10:20:00Z", "x1": "2026-11-28T10:50:00Z", "label": "peak"}]},
        "per_model": [{"model": HOSTILE_MODEL, "requests": 3000, "ttft_p99_s": 1.9, "prompt_tokens_p50": 812}],
        "latency_by_window": {"columns": ["window", "ttft_p50_s", "ttft_p99_s"],
                              "rows": [["2026-11-28T10:00:00Z", 0.21, 0.9]]},
        "prefix_sharing": {"share_of_requests_with_shared_prefix": 0.62, "top_prefixes": 3},
        "lengths": [{"type": "bar", "title": "Prompt tokens", "x_label": "prompt tokens", "y_label": "requests",
                     "series": [{"name": "all", "x": [128, 256, 512], "y": [10, 30, 5]}]},
                    {"type": "bar", "title": "Output tokens", "x_label": "output tokens", "y_label": "requests",
                     "series": [{"name": "all", "x": [16, 32, 64], "y": [4, 9, 2]}]}],
    }
    page = render_html(analyze_doc)
    workload = page[page.index('id="workload"'):]
    assert workload.count("<svg") == 3
    assert "Requests per second" in workload and ">Prompt tokens<" in workload and ">Output tokens<" in workload
    assert "qwen3-8b&lt;script&gt;" in workload and "1.9 s" in workload and "210 ms" in workload
    assert "62.00%" in workload and "2,950" in workload
    assert "<script>" not in page


def test_user_templates_override_partials_and_extend_the_defaults(tmp_path, analyze_doc):
    (tmp_path / "_clear.html").write_text('<section id="clear"><p>TEAM CLEAR LIST</p></section>')
    (tmp_path / "analyze.html").write_text(
        '{% extends "default:analyze.html" %}{% block workload %}<p>TEAM FOOTNOTE {{ title }}</p>{% endblock %}')
    page = render_html(analyze_doc, templates_dir=tmp_path)
    assert "TEAM CLEAR LIST" in page and "Reasoning leaking into content" not in page
    assert "TEAM FOOTNOTE Incident report: incident-1128" in page
    assert 'data-rule="SL004"' in page  # the built-in partials still render the rest
    with pytest.raises(ConfigError, match="Template folder"):
        render_html(analyze_doc, templates_dir=tmp_path / "missing")


def test_unknown_kind_is_an_input_error():
    with pytest.raises(InputError, match="Cannot render a document of kind 'ingest' as an HTML report"):
        render_html({"kind": "ingest", "schema_version": 1})


def test_empty_analyze_result_says_so(analyze_doc):
    analyze_doc["findings"] = []
    page = render_html(analyze_doc)
    assert 'data-verdict="clean"' in page and "No findings" in page and "Every rule had the data it needs." in page


def test_large_latency_ratios_read_as_multiples(compare_doc):
    compare_doc["gates"][0].update(ratio=39.09, ci_low=22.1, ci_high=56.8)
    text = " ".join(scan(render_html(compare_doc)).text)
    assert "×39.1" in text and "[×22.1, ×56.8]" in text
    assert "+3809" not in text


def test_size_stays_bounded_on_a_huge_workload(analyze_doc):
    run = {"requests": 40, "rate": {"chart": {"type": "line", "title": "Request rate", "x_time": True,
                                              "series": [{"name": "rps", "x": ["2026-11-28T10:00:00Z"] * 3,
                                                          "y": [1, 2, 3]}]}},
           "lengths": {"per_model": {"columns": ["model", "requests"], "rows": [[f"m{i}", i] for i in range(500)]}}}
    analyze_doc["workload"] = {"runs": {f"run-{i}": run for i in range(300)}}  # 5x the list limit, 10x the rows
    page = render_html(analyze_doc)
    assert len(page.encode()) <= MAX_REPORT_BYTES
    assert "more</li>" in page and page.count("<svg") <= 18


def test_nothing_fired_but_not_evaluable_is_not_clean(analyze_doc):
    analyze_doc["findings"] = [f for f in analyze_doc["findings"] if f["state"] != "fired"]
    page = render_html(analyze_doc)
    assert 'data-verdict="not_evaluable"' in page and "No findings · 1 not evaluable" in page
    analyze_doc["findings"] = [f for f in analyze_doc["findings"] if f["state"] == "not_evaluable"]
    page = render_html(analyze_doc)
    assert 'data-verdict="not_evaluable"' in page and "Nothing could be evaluated" in page


def test_size_stays_bounded_on_huge_free_text_and_name_lists(analyze_doc, compare_doc):
    finding = analyze_doc["findings"][0]
    finding["summary"] = finding["remediation"] = finding["rollback"] = "x" * 3_000_000
    analyze_doc["coverage"]["models"] = [f"model-{i}" for i in range(200_000)]
    analyze_doc["coverage"]["metrics_present"] = [f"vllm:metric_{i}" for i in range(50_000)]
    page = render_html(analyze_doc)
    assert len(page.encode()) <= MAX_REPORT_BYTES
    assert "… and 199,940 more" in page
    compare_doc["reason"] = "y" * 3_000_000
    compare_doc["gates"][0]["rollback_criterion"] = "z" * 3_000_000
    assert len(render_html(compare_doc).encode()) <= MAX_REPORT_BYTES


def test_hostile_rule_ids_and_gate_names_stay_inside_their_attributes(analyze_doc, compare_doc):
    analyze_doc["findings"][0]["rule"] = BREAKOUT
    analyze_doc["findings"][0]["evidence"]["table"]["columns"][0] = SCRIPT
    compare_doc["gates"][1]["name"] = BREAKOUT
    compare_doc["gates"][1]["id"] = SCRIPT
    for page in (render_html(analyze_doc), render_html(compare_doc)):
        parsed = scan(page)
        assert [(tag, name) for tag, attrs in parsed.tags for name in attrs if name.startswith("on")] == []
        assert "<script" not in page


def test_states_severities_and_verdicts_outside_their_enums_never_reach_the_page(analyze_doc, compare_doc):
    # They are typed (servlens.documents): `servlens report` refuses such a document before rendering it.
    from servlens.documents import problems

    analyze_doc["findings"][0]["severity"] = BREAKOUT
    compare_doc["gates"][1]["verdict"] = BREAKOUT
    assert problems(analyze_doc, "analyze") == [
        '$.findings[0].severity is "\\"onerror=alert(1) x=\\"", not one of "info", "warning", "critical"']
    assert problems(compare_doc, "compare")[0].startswith("$.gates[1].verdict is ")


def test_compare_notes_and_method_have_their_own_sections(compare_doc):
    compare_doc["notes"] = [f"prompt_tokens is unknown for 40% of the successful requests of run 'after' {SCRIPT}",
                            "error rate: 3 of the counted events have no prompt token count"]
    compare_doc["method"] = {"latency": "ratio after/before of a quantile", "binning_error": f"bins 0.5% wide {BREAKOUT}"}
    compare_doc["policy"] = {"source": "built-in default policy", "confidence": 0.95}
    compare_doc["goodput_gate"] = {"answer": 42}   # the part the page has no section of its own for
    page = render_html(compare_doc)
    parsed = scan(page)
    ids = [attrs.get("id") for _, attrs in parsed.tags if attrs.get("id")]
    assert ids.index("verdict") < ids.index("coverage") < ids.index("notes") < ids.index("gates")
    assert ids.index("gates") < ids.index("cohorts") < ids.index("method") < ids.index("other")
    notes = page[page.index('<section id="notes">'):page.index('<section id="gates">')]
    assert "<h2>Notes on the data</h2>" in notes
    assert ("<li>prompt_tokens is unknown for 40% of the successful requests of run &#39;after&#39; "
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;</li>") in notes
    assert "<li>error rate: 3 of the counted events have no prompt token count</li>" in notes
    # the verdict points to them instead of repeating them
    verdict = page[page.index('<section id="verdict">'):page.index('<section id="coverage">')]
    assert '<a href="#notes">2 notes on the data</a>' in verdict and "prompt_tokens" not in verdict
    method = page[page.index('<section id="method">'):page.index('<section id="other">')]
    assert "<dt>Latency</dt><dd>ratio after/before of a quantile</dd>" in method
    assert "<dt>Binning error</dt><dd>bins 0.5% wide &#34;onerror=alert(1) x=&#34;</dd>" in method
    assert "built-in default policy" in method
    # only what the report has no place for is left to the generic section
    other = page[page.index('<section id="other">'):]
    assert "Answer" in other and "Latency" not in other and "prompt_tokens" not in other


def test_compare_without_notes_has_no_empty_sections(compare_doc):
    compare_doc["method"] = {}
    page = render_html(compare_doc)
    assert 'id="notes"' not in page and 'id="other"' not in page and 'href="#notes"' not in page
    # every compare document has its policy: the method section shows it even when no method sentence is given
    method = page[page.index('<section id="method">'):]
    assert "built-in default policy" in method and "<h3>Method</h3>" not in method


def test_compare_cohort_table_names_each_cohort_once(compare_doc):
    compare_doc["cohorts"] = [
        {"cohort": "qwen3-8b / 256–511 prompt tokens", "bands": {"model": "qwen3-8b", "prompt_band": 8},
         "n_before": 2251, "n_after": 2308, "share_before": 0.4502, "share_after": 0.4616, "compared": True,
         "latency": {"ttft": {"before": {"n": 2251, "p50": 0.199, "p99": 0.813},
                              "after": {"n": 2308, "p50": 0.261, "p99": 1.075}}}}]
    page = render_html(compare_doc)
    cohorts = page[page.index('<section id="cohorts">'):]
    cohorts = cohorts[:cohorts.index("</section>")]
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", cohorts)
    assert headers[:3] == ["Cohort", "N before", "N after"] and not any(h.startswith("Bands") for h in headers)
    assert "TTFT p99 before → after" in headers and "813 ms → 1.07 s" in cohorts
