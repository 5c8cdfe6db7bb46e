"""`servlens compare` from the command line: modes, formats, exit codes and user errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servlens.cli import cli
from tools.compare_simulation import chat_tokens, insert_requests, latency_model
from servlens.store.schema import open_store

REAL_LLAMACPP = "tests/data/shared/real-engine/llamacpp/requests.jsonl"


def _run(con, run, n, seed, ttft_scale=1.0):
    rng = np.random.default_rng(seed)
    prompt, output = chat_tokens(rng, n)
    cols = {"model": np.full(n, "qwen3-8b", dtype=object), "prompt_tokens": prompt, "completion_tokens": output,
            "status": np.full(n, "ok", dtype=object), "finish_reason": np.full(n, "stop", dtype=object)}
    cols.update(latency_model(rng, prompt, output, ttft_scale))
    insert_requests(con, run, cols)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "store.duckdb"
    con = open_store(path)
    _run(con, "prod", 20000, 1)
    _run(con, "canary-same", 20000, 2)
    _run(con, "canary-slow", 5000, 3, ttft_scale=1.3)
    _run(con, "tiny", 30, 4)
    con.close()
    return str(path)


def invoke(cli_runner, args):
    return cli_runner.invoke(cli, args, catch_exceptions=False)


def test_help_has_an_example(cli_runner):
    result = invoke(cli_runner, ["compare", "--help"])
    assert result.exit_code == 0
    assert "  Example:\n      servlens compare before/ after/\n" in result.output


def test_exit_codes_pass_fail_inconclusive(cli_runner, store_path):
    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "canary-same"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("servlens compare: PASS (exit 0)\nbefore: prod (20,000 requests)")
    assert "Verdict: pass. All 2 critical gates pass." in result.output

    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "canary-slow"])
    assert result.exit_code == 1
    assert "roll back: TTFT p99 (covariate-adjusted over" in result.output

    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "tiny"])
    assert result.exit_code == 3
    assert "Verdict: inconclusive." in result.output


def test_run_labels_as_arguments_with_db(cli_runner, store_path):
    result = invoke(cli_runner, ["--db", store_path, "compare", "prod", "canary-slow", "--format", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["kind"] == "compare" and doc["schema_version"] == 2 and doc["verdict"] == "fail"
    assert doc["before"]["run"] == "prod" and doc["after"]["run"] == "canary-slow"


def test_json_is_seeded_and_md_is_a_pr_comment(cli_runner, store_path, tmp_path):
    out = tmp_path / "r.json"
    args = ["compare", "--db", store_path, "--before", "prod", "--after", "canary-same", "--seed", "5"]
    assert invoke(cli_runner, args + ["--out", str(out)]).exit_code == 0
    first = json.loads(out.read_text())
    assert invoke(cli_runner, args + ["--out", str(out)]).exit_code == 0
    second = json.loads(out.read_text())
    first.pop("generated_at"), second.pop("generated_at")
    assert first == second and first["policy"]["seed"] == 5
    result = invoke(cli_runner, args + ["--format", "md"])
    assert result.output.startswith("### servlens compare: ✅ pass (exit 0)\n")
    assert "| gate | cohorts | before | after | change [interval] | tolerance | verdict |" in result.output


def test_policy_and_by(cli_runner, store_path, tmp_path):
    policy = tmp_path / "gates.toml"
    policy.write_text('[[gate]]\nmetric = "ttft"\nstatistic = "p90"\ntolerance_pct = 50\ncritical = true\n')
    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "canary-slow",
                                 "--policy", str(policy), "--by", "model", "--format", "json"])
    doc = json.loads(result.output)
    assert [g["id"] for g in doc["gates"]] == ["ttft_p90"]
    assert doc["gates"][0]["by"] == ["model"] and doc["gates"][0]["verdict"] == "pass"
    assert result.exit_code == 0


@pytest.mark.parametrize("args, message", [
    (["compare", "only-one"], "Error: compare needs a BEFORE and an AFTER. Example: servlens compare before/ after/  "
                              "(or --db store.duckdb --before A --after B).\n"),
    (["compare", "--before", "prod"], "Error: --before and --after go together. Name both runs.\n"),
    (["compare", "--before", "prod", "--after", "nope"],
     "Error: The store has no requests for run 'nope' (runs with requests: canary-same, canary-slow, prod, tiny). "
     "Check the run label with 'servlens runs', or ingest the run first.\n"),
    (["compare", "--before", "prod", "--after", "prod"],
     "Error: Before and after are the same run ('prod'). Name two different runs.\n"),
    (["compare", "--before", "prod", "--after", "tiny", "--by", "model,size"],
     "Error: --by: unknown band 'size'. Allowed: model, served_model, deployment, provider, prompt_band, "
     "output_band.\n"),
])
def test_usage_errors_exit_2_with_one_sentence(store_path, args, message, monkeypatch, capsys):
    from servlens.cli import main

    monkeypatch.setattr("sys.argv", ["servlens", "--db", store_path] + args)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == message


def test_exit_codes_reach_the_shell(store_path, monkeypatch, capsys):
    from servlens.cli import main

    monkeypatch.setattr("sys.argv", ["servlens", "compare", "--db", store_path, "--before", "prod", "--after",
                                     "tiny", "--format", "json"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 3
    assert json.loads(capsys.readouterr().out)["verdict"] == "inconclusive"


def test_files_are_ingested_on_the_fly(cli_runner):
    """The real llama.cpp log against itself: an A/A with 174 requests is inconclusive, never a pass."""
    result = invoke(cli_runner, ["compare", REAL_LLAMACPP, REAL_LLAMACPP, "--format", "json"])
    assert result.exit_code == 3, result.output
    doc = json.loads(result.output)
    assert doc["before"]["requests"] == doc["after"]["requests"] == 174
    assert doc["before"]["sources"][0]["path"].endswith("llamacpp/requests.jsonl")
    p99 = next(g for g in doc["gates"] if g["id"] == "ttft_p99")
    # the same requests on both sides: judged at the highest supported quantile, no change, not yet shown within
    assert p99["judged_at"] == "p90" and p99["change"] == 0.0
    assert p99["verdict"] == "inconclusive" and p99["reason"] == "the one-sided bound reaches beyond the +10% tolerance"
    assert not [g for g in doc["gates"] if g["verdict"] == "fail"]


def test_a_missing_path_is_an_input_error(cli_runner):
    from servlens.errors import InputError

    with pytest.raises(InputError, match="No such file or folder: nowhere/"):
        invoke(cli_runner, ["compare", REAL_LLAMACPP, "nowhere/"])


def test_html_uses_the_report_renderer(cli_runner, store_path, tmp_path):
    pytest.importorskip("servlens.render.html")
    out = tmp_path / "r.html"
    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "canary-slow",
                                 "--out", str(out)])
    assert result.exit_code == 1
    html = out.read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "roll back: TTFT p99" in html


def test_html_templates_folder_replaces_partials(cli_runner, store_path, tmp_path):
    pytest.importorskip("servlens.render.html")
    team = tmp_path / "team"
    team.mkdir()
    (team / "_header.html").write_text("<header><h1>ACME release board: {{ title }}</h1></header>")
    out = tmp_path / "gate.html"
    result = invoke(cli_runner, ["compare", "--db", store_path, "--before", "prod", "--after", "canary-slow",
                                 "--out", str(out), "--templates", str(team)])
    assert result.exit_code == 1, result.output
    page = out.read_text()
    assert "<h1>ACME release board: Release gate: prod → canary-slow</h1>" in page
    # the partials not in the folder still come from the built-in templates
    assert 'data-verdict="fail"' in page and "roll back: TTFT p99" in page


def test_a_missing_templates_folder_fails_before_the_comparison(store_path, tmp_path, monkeypatch, capsys):
    from servlens.cli import main

    missing = tmp_path / "no-such-folder"
    monkeypatch.setattr("sys.argv", ["servlens", "compare", "--db", store_path, "--before", "prod", "--after",
                                     "canary-slow", "--out", str(tmp_path / "gate.html"), "--templates", str(missing)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"Error: Template folder '{missing}' does not exist. "
                                       f"Pass --templates a folder of .html files.\n")
    assert not (tmp_path / "gate.html").exists()
