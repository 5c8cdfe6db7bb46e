"""Result documents for the renderer tests, shaped exactly as docs/CONTRIBUTING.md "Result documents" says, and a
helper that opens a page in headless Chromium.

The hand-made documents carry hostile strings (a <script> tag, an "onerror= attribute breakout) in every field that
comes from logs, so each structure test is also an escaping test.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = "<script>alert('x')</script>"
BREAKOUT = '"onerror=alert(1) x="'
HOSTILE_MODEL = f"qwen3-8b{SCRIPT}"
HOSTILE_ID = f"req-7{BREAKOUT}<img src=x onerror=alert(2)>"


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def _no_evidence() -> dict:
    return {"metrics": {}, "thresholds": {}, "windows": [], "table": None, "chart": None}


def make_analyze_doc() -> dict:
    minutes = [f"2026-11-28T10:{m:02d}:00Z" for m in range(0, 60, 2)]
    ttft_p99 = [0.42 + (2.9 if 20 <= m < 34 else 0.0) + (m % 6) * 0.03 for m in range(0, 60, 2)]
    return {
        "kind": "analyze",
        "schema_version": 2,
        "generated_at": "2026-11-28T12:00:00Z",
        "servlens_version": "0.1.0",
        "run": "incident-1128",
        "coverage": {
            "sources": [
                {"path": "exports/litellm-1128.jsonl", "format": "litellm", "kind": "requests", "rows": 4812,
                 "bad_lines": 3},
                {"path": f"scrapes/vllm-{SCRIPT}.prom", "format": "prometheus-text", "kind": "metrics", "rows": 2204,
                 "bad_lines": 0},
            ],
            "runs": ["incident-1128"],
            "requests": 4812,
            "time_span": {"start": "2026-11-28T10:00:00Z", "end": "2026-11-28T11:00:00Z", "relative_clock": False},
            "models": [HOSTILE_MODEL, "llama-3.1-8b"],
            "columns_present": ["request_id", "model", "t_arrival", "ttft_s", "queue_s", "prompt_tokens",
                                "completion_tokens", "finish_reason", "status", "error_message"],
            "metrics_present": ["num_requests_waiting", "kv_cache_usage_perc"],
        },
        "findings": [
            {
                "rule": "SL004", "name": "queue-driven-ttft-spike", "title": "TTFT spike driven by queueing",
                "state": "fired", "severity": "critical",
                "scope": {"run": "incident-1128", "model": HOSTILE_MODEL, "deployment": "http://10.0.0.5:8000"},
                "summary": f"TTFT p99 rose to 3.41 s while TPOT stayed flat; queue time explains 91% of it {SCRIPT}",
                "reason": None,
                "evidence": {
                    "metrics": {"ttft_p99_s": 3.41, "queue_share": 0.91, "tpot_p50_s": 0.031},
                    "thresholds": {"ttft_ratio": 2.0, "queue_share": 0.5},
                    "windows": [{"start": "2026-11-28T10:20:00Z", "end": "2026-11-28T10:34:00Z"}],
                    "table": {"columns": ["window", "requests", "ttft_p99_s", "queue_p99_s", "model"],
                              "rows": [[minutes[i], 160 + i, ttft_p99[i], ttft_p99[i] * 0.9, HOSTILE_MODEL]
                                       for i in range(len(minutes))]},
                    "chart": {"type": "line", "title": "TTFT p99 per window", "x_label": "time (UTC)",
                              "y_label": "TTFT p99 (s)", "x_time": True, "x_log": False, "y_log": False,
                              "series": [{"name": HOSTILE_MODEL, "x": minutes, "y": ttft_p99}],
                              "hlines": [{"y": 1.0, "label": "SLO 1 s"}],
                              "vspans": [{"x0": "2026-11-28T10:20:00Z", "x1": "2026-11-28T10:34:00Z",
                                          "label": "incident window"}]},
                },
                "examples": [{"request_id": HOSTILE_ID, "source": "exports/litellm-1128.jsonl", "line": 1207},
                             {"request_id": "req-8812", "source": "exports/litellm-1128.jsonl", "line": 1311}],
                "remediation": f"Raise --max-num-seqs or add a replica; check KV cache usage. {BREAKOUT}",
                "rollback": "Roll back if TTFT p99 stays above 1 s for 10 minutes after the change.",
                "references": ["https://docs.vllm.ai/en/latest/configuration/optimization.html",
                               "javascript:alert(3)"],
            },
            {
                "rule": "SL002", "name": "truncated-by-output-limit", "title": "Answers cut off by max_tokens",
                "state": "fired", "severity": "warning", "scope": {"run": "incident-1128", "model": "llama-3.1-8b", "deployment": None},
                "summary": "4.2% of requests ended with finish_reason=length at max_tokens=256.",
                "reason": None,
                "evidence": {"metrics": {"length_share": 0.042, "requests": 1200},
                             "thresholds": {"length_share": 0.01}, "windows": [],
                             "table": {"columns": ["max_tokens", "requests", "length_finishes", "error_message"],
                                       "rows": [[256, 1000, 50, f"upstream said {SCRIPT}{BREAKOUT}"],
                                                [1024, 200, 0, None]]},
                             "chart": {"type": "bar", "title": "Length finishes by max_tokens",
                                       "x_label": "max_tokens", "y_label": "requests", "x_time": False,
                                       "x_log": False, "y_log": False,
                                       "series": [{"name": "length", "x": ["256", "1024"], "y": [50, 0]}],
                                       "hlines": [], "vspans": []}},
                "examples": [{"request_id": "req-1", "source": "exports/litellm-1128.jsonl", "line": 17}],
                "remediation": "Raise max_tokens for this route.",
                "rollback": "Roll back if the length-finish share does not fall below 1% within an hour.",
                "references": [],
            },
            {
                "rule": "SL001", "name": "prefix-cache-off", "title": "Shared prefixes without a prefix cache",
                "state": "not_evaluable", "severity": "warning",
                "scope": {"run": "incident-1128", "model": "llama-3.1-8b", "deployment": None},
                "summary": "", "reason": f"no cached-token field and no prefix-cache metric in these sources {SCRIPT}",
                "evidence": _no_evidence(), "examples": [], "remediation": "", "rollback": "", "references": [],
            },
            {
                "rule": "SL003", "name": "reasoning-leak", "title": "Reasoning leaking into content",
                "state": "clear", "severity": "warning",
                "scope": {"run": "incident-1128", "model": HOSTILE_MODEL, "deployment": None},
                "summary": "No reasoning markers in content.", "reason": None,
                "evidence": _no_evidence(), "examples": [], "remediation": "", "rollback": "", "references": [],
            },
        ],
        "workload": {"summary": ["incident-1128: 4,812 requests over 1.0 h."],
                     "runs": {"incident-1128": {"run": "incident-1128", "requests": 4812, "relative_clock": False,
                                                "span_s": 3600.0}}},
        "chains": [],
        # the story (chains, goodput) is left out of this page: tests/render/test_story.py renders real ones
        "goodput": {"targets": None, "objective": {"ttft": 0.9, "tpot": 0.9, "both": 0.9}, "min_level_requests": 20,
                    "requests": 0, "note": "no request logs: goodput is not evaluable"},
    }


def make_compare_doc() -> dict:
    import random

    rng = random.Random(7)
    before = [rng.lognormvariate(-1.0, 0.6) for _ in range(300)]
    after = [value * 1.25 for value in before]
    bx, by = _cdf(before)
    ax, ay = _cdf(after)
    return {
        "kind": "compare",
        "schema_version": 2,
        "generated_at": "2026-11-28T12:00:00Z",
        "servlens_version": "0.1.0",
        "verdict": "fail",
        "reason": f"TTFT p99 rose 25% [95% CI 14%–37%], beyond the 10% tolerance on a critical gate {SCRIPT}",
        "before": {"run": "release-0.9", "requests": 5000, "models": [HOSTILE_MODEL],
                   "sources": [{"path": "exports/before.jsonl", "format": "litellm", "rows": 5000, "bad_lines": 0}]},
        "after": {"run": "release-0.11", "requests": 5100, "models": [HOSTILE_MODEL],
                  "sources": [{"path": "exports/after.jsonl", "format": "litellm", "rows": 5100, "bad_lines": 0}]},
        "policy": {"source": "built-in default policy", "confidence": 0.95, "min_coverage": 0.5,
                   "min_cohort_requests": 30, "min_change_ms": 5, "seed": 0, "by": None},
        "method": {"latency": "quantiles of the covariate-adjusted latency, re-weighted to the before mix"},
        "coverage": {"before_share": 0.97, "after_share": 0.95, "cohorts_compared": 6, "cohorts_total": 8},
        "mix_shift": {"significant": False, "max_share_change": 0.03},
        "gates": [
            {"id": "ttft_p99", "name": "TTFT p99", "metric": "ttft", "statistic": "p99", "unit": "s",
             "rule": "Roll back if TTFT p99 is significantly higher than before by more than 10%", "cohort": None, "before": 0.9, "after": 1.125, "ratio": 1.25,
             "ci_low": 1.14, "ci_high": 1.37, "tolerance": 0.10, "critical": True, "verdict": "fail",
             "rollback_criterion": f"Roll back: TTFT p99 rose 25% [95% CI 14%–37%], above the 10% tolerance {BREAKOUT}",
             "kind": "latency",
             "cohorts": [{"cohort": f"{HOSTILE_MODEL} / 1k–2k prompt tokens", "n_before": 800, "n_after": 820,
                          "compared": True, "before": 0.95, "after": 1.2, "ratio": 1.263},
                         {"cohort": "llama / 8k–16k prompt tokens", "n_before": 12, "n_after": 9, "compared": False,
                          "before": None, "after": None, "ratio": None}],
             "chart": {"type": "cdf", "title": "TTFT, all cohorts", "x_label": "TTFT (s)",
                       "y_label": "share of requests", "x_time": False, "x_log": True, "y_log": False,
                       "series": [{"name": "before release-0.9", "x": bx, "y": by},
                                  {"name": "after release-0.11", "x": ax, "y": ay}],
                       "hlines": [{"y": 0.99, "label": "p99"}], "vspans": []}},
            {"id": "tpot_p50", "name": "TPOT p50", "metric": "tpot", "statistic": "p50", "kind": "latency",
             "unit": "s", "rule": "Roll back if TPOT p50 is significantly higher than before by more than 5%",
             "cohort": None, "before": 0.031, "after": 0.0312,
             "ratio": 1.006, "ci_low": 0.99, "ci_high": 1.02, "tolerance": 0.05, "critical": False,
             "verdict": "pass", "rollback_criterion": "TPOT p50 within +5%.", "chart": None},
            {"id": "error_rate_rate", "name": "error rate", "metric": "error_rate", "statistic": "rate",
             "kind": "rate", "unit": "share",
             "rule": "Roll back if the error rate is significantly higher than before by more than 0.5 pp",
             "cohort": HOSTILE_MODEL, "before": 0.002, "after": 0.004,
             "diff": 0.002, "ci_low": -0.001, "ci_high": 0.005, "tolerance": 0.005, "critical": True,
             "verdict": "inconclusive", "rollback_criterion": "Error rate: not enough evidence yet.", "chart": None,
             "reason": f"errors like 'context length exceeded {SCRIPT}{BREAKOUT}' are too few to judge"},
        ],
        "improvements": [{"gate": "TPOT p50", "cohort": None, "change": -0.12,
                          "summary": "TPOT p50 fell 12.0% (31 ms → 27.3 ms) [95% CI −15.1% to −8.8%]"}],
        "cohorts": [{"model": HOSTILE_MODEL, "prompt_band": "1k-2k", "n_before": 800, "n_after": 820}],
        "merged_bands": [],
        "notes": [],
    }


@pytest.fixture
def analyze_doc() -> dict:
    return make_analyze_doc()


@pytest.fixture
def compare_doc() -> dict:
    return make_compare_doc()


# ------------------------------------------------------------------ the browser


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture
def chromium():
    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return path


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
    "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
    # console messages (CSP violations, script errors) are written to stderr as `...:CONSOLE:N] "..."` lines
    "--enable-logging=stderr", "--v=0",
]
# What a clean page must never produce: console messages (the report has no scripts, so any message is a CSP
# violation or an error). Network activity is checked per page over the DevTools protocol (devtools_load), not
# from this log, where the browser's own background traffic could show up.
_PROBLEM = re.compile(r":CONSOLE[:(]|Content Security Policy|Refused to", re.I)


def open_in_chromium(browser: str, page: Path, profile: Path, screenshot: Path | None = None,
                     window: str = "1200,1800") -> tuple[str, list[str]]:
    """Load `page` in headless Chromium; returns the DOM after load and the problem lines from its log."""
    flags = CHROMIUM_FLAGS + [f"--user-data-dir={profile}", f"--window-size={window}"]
    flags += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    environment = dict(os.environ, HOME=str(profile))
    done = subprocess.run([browser, *flags, page.resolve().as_uri()], capture_output=True, text=True, timeout=120,
                          env=environment)
    problems = [line for line in done.stderr.splitlines() if _PROBLEM.search(line)]
    return done.stdout, problems


def devtools_load(browser: str, page: Path, profile: Path, timeout: float = 60.0) -> dict:
    """Load `page` in headless Chromium driven over the DevTools protocol (--remote-debugging-pipe, no extra
    packages) and report what a user's browser would do with it:

    - requests: every URL the page asked for, other than the page itself and data: URLs;
    - failed: requests that failed or were blocked (Network.loadingFailed, with the reason);
    - log: browser log entries (CSP violations, errors) and console messages;
    - exceptions: uncaught script exceptions;
    - dom: the verdict and the number of SVG elements and drawn paths in the live DOM after load.
    """
    import json as json_module
    import select
    import time

    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    flags = [f for f in CHROMIUM_FLAGS if not f.startswith(("--enable-logging", "--v="))]
    command = " ".join([browser, *flags, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"])
    # The pipe protocol reads commands on fd 3 and writes replies on fd 4; the shell maps our pipe ends there.
    # bash, not sh: dash cannot name descriptors above 9 in a redirection.
    process = subprocess.Popen(["bash", "-c", f"exec {command} 3<&{to_browser_r} 4>&{from_browser_w}"],
                               pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=dict(os.environ, HOME=str(profile)))
    os.close(to_browser_r)
    os.close(from_browser_w)
    buffer = b""
    events: list[dict] = []
    counter = [0]
    deadline = time.monotonic() + timeout

    def read_message() -> dict | None:
        nonlocal buffer
        while b"\0" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("Chromium did not answer over the DevTools pipe")
            ready, _, _ = select.select([from_browser_r], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(from_browser_r, 65536)
            if not chunk:
                return None
            buffer += chunk
        message, buffer = buffer.split(b"\0", 1)
        return json_module.loads(message)

    def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
        counter[0] += 1
        request = {"id": counter[0], "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(to_browser_w, json_module.dumps(request).encode() + b"\0")
        while True:
            message = read_message()
            if message is None:
                raise RuntimeError("Chromium closed the DevTools pipe")
            if message.get("id") == counter[0]:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            events.append(message)

    try:
        target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Log", "Runtime", "Page"):
            call(f"{domain}.enable", session=session)
        call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        while not any(e.get("method") == "Page.loadEventFired" for e in events):
            message = read_message()
            if message is None:
                break
            events.append(message)
        settle = time.monotonic() + 0.5  # late CSP reports and console messages
        while time.monotonic() < settle:
            ready, _, _ = select.select([from_browser_r], [], [], max(0.0, settle - time.monotonic()))
            if ready:
                message = read_message()
                if message is None:
                    break
                events.append(message)
        probe = ("JSON.stringify({verdict: (document.querySelector('[data-verdict]') || {dataset: {}}).dataset.verdict,"
                 " svg: document.querySelectorAll('svg').length, paths: document.querySelectorAll('svg path').length,"
                 " title: document.title})")
        dom = json_module.loads(call("Runtime.evaluate", {"expression": probe, "returnByValue": True},
                                     session=session)["result"]["value"])
        try:
            call("Browser.close")
        except RuntimeError:
            pass
    finally:
        os.close(to_browser_w)
        os.close(from_browser_r)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    own = page.resolve().as_uri()
    report: dict = {"requests": [], "failed": [], "log": [], "exceptions": [], "dom": dom}
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if url != own and not url.startswith("data:"):
                report["requests"].append(url)
        elif method == "Network.loadingFailed":
            report["failed"].append(f"{params.get('errorText')} {params.get('blockedReason') or ''}".strip())
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            report["log"].append(f"{entry.get('level')} {entry.get('source')}: {entry.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            report["log"].append(f"console.{params.get('type')}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            report["exceptions"].append(str(params.get("exceptionDetails", {}).get("text")))
    return report
