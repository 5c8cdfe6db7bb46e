"""Rates as defined (denominators without unknowns), and the text / Markdown renderers on real documents."""

from __future__ import annotations

import numpy as np
import pytest

from servlens.compare.engine import compare_runs
from servlens.compare.policy import Gate, Policy
from tools.compare_simulation import insert_requests
from servlens.render.compare_markdown import render_compare_markdown
from servlens.render.compare_text import render_compare_text
from servlens.store.schema import open_store


def _rates_run(con, run, n, errors, lengths, model="m<script>|x"):
    # failures spread evenly over the run (clustered ones would rightly widen the batch-means interval)
    status = np.array(["ok"] * n, dtype=object)
    failed = np.linspace(0, n - 6, errors).astype(int)
    status[failed] = "error"
    finish = np.array(["stop"] * n, dtype=object)
    finish[failed] = "error"
    spare = np.setdiff1d(np.arange(n - 5), failed)
    finish[spare[np.linspace(0, len(spare) - 1, lengths).astype(int)]] = "length"
    finish[-5:] = None                                  # unknown finish reason: not in the length denominator
    insert_requests(con, run, {"model": np.full(n, model, dtype=object), "status": status, "finish_reason": finish,
                               "prompt_tokens": np.full(n, 500), "ttft_s": np.full(n, 0.2)})


@pytest.fixture
def doc():
    con = open_store(None)
    _rates_run(con, "before", 1000, 10, 50)
    _rates_run(con, "after", 1000, 30, 50)
    policy = Policy(gates=(Gate("error_rate", "rate", 0.005, critical=True), Gate("length_rate", "rate", 0.01)))
    yield compare_runs(con, "before", "after", policy, seed=1)
    con.close()


def test_rate_definitions(doc):
    err, length = doc["gates"]
    assert (err["before"], err["after"], err["n_before"], err["n_after"]) == (0.01, 0.03, 1000, 1000)
    assert (err["events_before"], err["events_after"]) == (10, 30)
    # length finishes among successful requests with a known finish reason
    assert length["n_before"] == 1000 - 10 - 5 and length["n_after"] == 1000 - 30 - 5
    assert length["before"] == pytest.approx(50 / 985, rel=1e-5)
    assert length["after"] == pytest.approx(50 / 965, rel=1e-5)
    assert err["verdict"] == "fail"


def test_text_table(doc):
    text = render_compare_text(doc)
    assert text.startswith("servlens compare: FAIL (exit 1)\nbefore: before (1,000 requests)   after: after "
                           "(1,000 requests)\n")
    assert "gate                cohorts           before  after  change [interval]" in text
    assert "error rate *        mix-adjusted (1)  1.00%   3.00%  +2.00 pp [" in text
    assert "\n  - roll back: error rate (mix-adjusted over 1 cohort) rose 2.00 pp (1.00% → 3.00%) [95% CI " in text


def test_markdown_escapes_log_derived_labels(doc):
    doc["gates"][0].update(per_cohort=True, cohort="m<script>|x / 256–511 prompt tokens")
    md = render_compare_markdown(doc)
    assert md.startswith("### servlens compare: ❌ fail (exit 1)\n")
    assert "<script>" not in md
    assert "| error rate (critical) | m\\<script\\>\\|x / 256–511 prompt tokens | 1.00% |" in md
    doc["gates"][0].update(per_cohort=False)
    md = render_compare_markdown(doc)
    assert "| error rate (critical) | mix-adjusted (1) | 1.00% | 3.00% | +2.00 pp [" in md


def test_unknown_token_counts_are_noted():
    con = open_store(None)
    for run in ("before", "after"):
        insert_requests(con, run, {"model": np.full(200, "m", dtype=object), "ttft_s": np.full(200, 0.1),
                                   "status": np.full(200, "ok", dtype=object)})
    doc = compare_runs(con, "before", "after", Policy(gates=(Gate("ttft", "p50", 0.1, critical=True),)), seed=1)
    con.close()
    assert doc["notes"][0] == ("prompt_tokens is unknown for 100% of the successful requests of run 'after': those "
                               "requests form an 'unknown length' band, so the mix adjustment cannot account for "
                               "their lengths")
    assert doc["gates"][0]["cohort"] == "all compared cohorts, mix-adjusted (1 cohort by model × prompt_band)"
