"""The reports opened in a real browser (headless Chromium): the verdict and the charts render, nothing is
blocked, nothing is logged to the console. Skips only when Chromium is not installed."""

from __future__ import annotations

import re
from pathlib import Path

from servlens.render.html import render_html

from conftest import open_in_chromium


def _write(tmp_path: Path, name: str, page: str) -> Path:
    path = tmp_path / name
    path.write_text(page, encoding="utf-8")
    return path


def test_analyze_report_renders_cleanly_in_chromium(chromium, tmp_path, analyze_doc):
    page = _write(tmp_path, "incident.html", render_html(analyze_doc))
    dom, problems = open_in_chromium(chromium, page, tmp_path / "profile")
    assert problems == []
    assert 'data-verdict="critical"' in dom and "2 findings · highest critical" in dom
    # The inline SVG charts are in the DOM after load, with their drawn paths.
    assert len(re.findall(r"<svg\b", dom)) == 2
    assert dom.count("<path") > 20
    # Hostile log text stayed text: no element the payloads tried to create exists in the live DOM.
    assert "<script" not in dom and "<img" not in dom
    assert re.findall(r"<[a-z][^<>]*\son[a-z]+\s*=", dom) == []  # no element carries an event handler
    assert "onerror=alert(1)" in dom  # ... while the text is there to read


def test_compare_report_renders_cleanly_in_chromium(chromium, tmp_path, compare_doc):
    page = _write(tmp_path, "gate.html", render_html(compare_doc))
    dom, problems = open_in_chromium(chromium, page, tmp_path / "profile")
    assert problems == []
    assert 'data-verdict="fail"' in dom
    assert len(re.findall(r"<svg\b", dom)) == 1
    assert "<script" not in dom


def test_browser_check_catches_blocked_requests_and_console_errors(chromium, tmp_path, analyze_doc):
    """A control: the same page with a CDN stylesheet, a remote image and an inline script must be flagged."""
    page = render_html(analyze_doc).replace(
        "</main>",
        '<img src="http://127.0.0.1:9/pixel.png"><link rel="stylesheet" href="https://cdn.invalid/a.css">'
        "<script>console.error('boom')</script></main>",
    )
    dom, problems = open_in_chromium(chromium, _write(tmp_path, "bad.html", page), tmp_path / "profile")
    joined = "\n".join(problems)
    assert "http://127.0.0.1:9/pixel.png" in joined
    assert "https://cdn.invalid/a.css" in joined
    assert "inline script" in joined


def test_screenshot_is_a_real_page(chromium, tmp_path, compare_doc):
    page = _write(tmp_path, "gate.html", render_html(compare_doc))
    shot = tmp_path / "gate.png"
    _, problems = open_in_chromium(chromium, page, tmp_path / "profile", screenshot=shot, window="1200,1600")
    assert problems == []
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1200, 1600)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    # A blank or failed page has a handful of colours; text, badges and charts give hundreds.
    assert colours is not None and len(colours) > 200


def test_report_prints_to_pdf(chromium, tmp_path, analyze_doc):
    """The print stylesheet gives a paged document (what people attach to a ticket)."""
    import subprocess

    from conftest import CHROMIUM_FLAGS

    page = _write(tmp_path, "incident.html", render_html(analyze_doc))
    pdf = tmp_path / "incident.pdf"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--no-pdf-header-footer",
                    f"--print-to-pdf={pdf}", page.as_uri()], capture_output=True, timeout=120, check=False)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page\b", data))
    assert 2 <= pages <= 8, pages


def test_devtools_sees_no_request_no_log_entry_and_the_rendered_charts(chromium, tmp_path, analyze_doc, compare_doc):
    """Over the DevTools protocol: every request the page makes, every log entry (CSP violations included) and
    the live DOM after load."""
    from conftest import devtools_load

    for name, doc, verdict, charts in (("incident", analyze_doc, "critical", 2), ("gate", compare_doc, "fail", 1)):
        page = _write(tmp_path, f"{name}.html", render_html(doc))
        seen = devtools_load(chromium, page, tmp_path / f"profile-{name}")
        assert seen["requests"] == [] and seen["failed"] == [], name
        assert seen["log"] == [] and seen["exceptions"] == [], name
        assert seen["dom"]["verdict"] == verdict
        assert seen["dom"]["svg"] == charts and seen["dom"]["paths"] > 10 * charts


def test_devtools_check_sees_blocked_requests(chromium, tmp_path, analyze_doc):
    from conftest import devtools_load

    page = render_html(analyze_doc).replace(
        "</main>", '<img src="http://127.0.0.1:9/pixel.png"><link rel="stylesheet" href="https://cdn.invalid/a.css">'
                   "<script>console.error('boom')</script></main>")
    seen = devtools_load(chromium, _write(tmp_path, "bad.html", page), tmp_path / "profile")
    assert sorted(seen["requests"]) == ["http://127.0.0.1:9/pixel.png", "https://cdn.invalid/a.css"]
    assert seen["failed"] == ["csp", "csp"]
    assert len([entry for entry in seen["log"] if "Content Security Policy" in entry]) == 3
