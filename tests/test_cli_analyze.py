"""`servlens analyze` and `servlens rules` from the command line: modes, formats, exit codes and user errors."""

from __future__ import annotations

import json

import pytest

from servlens.cli import cli
from servlens.store.schema import open_store
from tests.conftest import SHARED_DATA

LLAMACPP = SHARED_DATA / "real-engine" / "llamacpp"
USER_RULES = "tests/analysis/data/user_rules"
# The four rules of the analyze issue; later rules (SL005+) have their own tests.
FOUR = ["--select", "SL001,SL002,SL003,SL004"]


def _known() -> str:
    """The built-in rule ids as error messages list them (more rules arrive over time)."""
    from servlens.analysis.rules import load_rules

    return ", ".join(rule.id for rule in load_rules())


def invoke(cli_runner, args):
    return cli_runner.invoke(cli, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """The real llama.cpp recording (six runs, requests and scrapes) ingested once into a store."""
    from servlens.analysis.inputs import ingest_paths

    path = tmp_path_factory.mktemp("analyze") / "store.duckdb"
    con = open_store(path)
    ingest_paths(con, [str(LLAMACPP)])
    con.close()
    return str(path)


def _main(monkeypatch, capsys, args):
    from servlens.cli import main

    monkeypatch.setattr("sys.argv", ["servlens"] + args)
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_help_has_an_example(cli_runner):
    result = invoke(cli_runner, ["analyze", "--help"])
    assert result.exit_code == 0
    assert "  Example:\n      servlens analyze exports/*.jsonl --metrics scrapes/\n" in result.output
    for sub in ("list", "explain", "test"):
        assert "Example:" in invoke(cli_runner, ["rules", sub, "--help"]).output


def _fired_and_rule_lines(doc: dict) -> tuple[list[tuple[str, str]], list[str]]:
    """From the JSON document: (severity, rule) of each fired finding in report order, and each rule's counts."""
    order = {"critical": 0, "warning": 1, "info": 2}
    fired = sorted(((f["severity"], f["rule"], f["name"]) for f in doc["findings"] if f["state"] == "fired"),
                   key=lambda f: (order[f[0]], f[1]))
    rules = sorted({(f["rule"], f["name"]) for f in doc["findings"]})
    counts = [f"  {rule} {name}: " + ", ".join(
        f"{sum(1 for f in doc['findings'] if f['rule'] == rule and f['state'] == state)} {label}"
        for state, label in (("fired", "fired"), ("clear", "clear"), ("not_evaluable", "not evaluable")))
        for rule, name in rules]
    return [(f"  {sev.upper():<8} {rule} {name} [tiny]: ", rule) for sev, rule, name in fired], counts


def test_text_report_leads_with_fired_findings_by_severity(cli_runner, store_path):
    args = ["analyze", "--db", store_path, "--run", "burst50"] + FOUR
    result = invoke(cli_runner, args)
    assert result.exit_code == 0
    doc = json.loads(invoke(cli_runner, args + ["--format", "json"]).stdout)
    out = result.output
    lines = out.splitlines()
    assert lines[0].startswith("servlens analyze: 1 run(s) (burst50), 50 requests")
    # One line per fired finding, by severity: severity, rule, scope (one run: the model), headline.
    fired, counts = _fired_and_rule_lines(doc)
    start = lines.index(f"FIRED ({len(fired)}): severity, rule [model / deployment]: what happened")
    leads = [line for line in lines[start + 1:] if line.startswith("  ") and not line.startswith("   ")]
    assert [line[:len(lead)] for line, (lead, _) in zip(leads, fired)] == [lead for lead, _ in fired]
    # Then per rule how many checks fired, were clear, were not evaluable; the evidence waits for --verbose.
    checks = lines.index("CHECKS BY RULE (4: each rule on each run, model and deployment)")
    assert [line.split(" (")[0] for line in lines[checks + 1:checks + 5]] == counts
    assert "what to do:" not in out and "CLEAR (" not in out
    c = {s: sum(1 for f in doc["findings"] if f["state"] == s) for s in ("fired", "not_evaluable", "clear")}
    assert f"{c['not_evaluable']} not evaluable, {c['clear']} clear.\n--verbose adds each finding's evidence" in out


def test_verbose_text_has_the_evidence_and_every_check(cli_runner, store_path):
    from servlens.render.analyze_text import render_analyze_text

    args = ["analyze", "--db", store_path, "--run", "burst50"] + FOUR
    doc = json.loads(invoke(cli_runner, args + ["--format", "json"]).stdout)
    out = invoke(cli_runner, args + ["--verbose"]).output
    assert out == render_analyze_text(doc, verbose=True)
    flat = " ".join(out.split())
    for finding in doc["findings"]:
        if finding["state"] == "fired":
            assert " ".join(f"rollback: {finding['rollback']}".split()) in flat
            assert " ".join(f"what to do: {finding['remediation']}".split()) in flat
        else:
            reason = finding["reason"] or finding["summary"]
            assert " ".join(f"{finding['rule']} {finding['name']} [run=burst50, model=tiny]: {reason}".split()) in flat
    assert "\n    rate: bucket_s=" in out and "peak_1min=n/a" in out    # the full workload profile


@pytest.mark.slow
def test_the_demo_fits_on_a_screen_or_two(cli_runner):
    """`servlens analyze sample_logs/` (the README's demo): a line or two per fired finding, a line per rule and per
    run; the 1,350 lines of evidence are for --verbose, JSON, Markdown and HTML."""
    from servlens.render.analyze_text import render_analyze_text

    # One analysis (half a minute): the text the command prints is the rendering of its JSON document.
    doc = json.loads(invoke(cli_runner, ["analyze", "sample_logs/", "--format", "json"]).stdout)
    text = render_analyze_text(doc)
    fired = sum(1 for f in doc["findings"] if f["state"] == "fired")
    rules = len({f["rule"] for f in doc["findings"]})
    lines = text.splitlines()
    assert len(lines) <= 2 * fired + 2 * rules + len(doc["workload"]["runs"]) * 2 + 14, len(lines)
    assert sum(1 for line in lines if line[2:10].rstrip() in ("CRITICAL", "WARNING", "INFO")) == fired
    assert "evidence:" not in text and len(render_analyze_text(doc, verbose=True).splitlines()) > 3 * len(lines)


def test_fail_on_sets_exit_1_only_at_or_above_the_severity(monkeypatch, capsys, store_path):
    code, _, _ = _main(monkeypatch, capsys, ["analyze", "--db", store_path, "--run", "burst50", "--fail-on", "warning"] + FOUR)
    assert code == 1
    code, _, _ = _main(monkeypatch, capsys, ["analyze", "--db", store_path, "--run", "prefix_nocache", "--fail-on", "critical"] + FOUR)
    assert code == 0  # SL001 fired as a warning only
    code, _, err = _main(monkeypatch, capsys, ["analyze", "--db", store_path, "--run", "prefix_nocache", "--fail-on", "warning"] + FOUR)
    assert code == 1
    # Not-evaluable checks are said loudly on stderr, and do not change the exit code.
    assert err == ("Warning: 2 of 4 checks were not evaluable (SL002, SL003): the data they need is missing, so they "
                   "are not clear. The report says what each needs.\n")


def test_json_is_the_documented_document(cli_runner, store_path):
    result = invoke(cli_runner, ["analyze", "--db", store_path, "--run", "prefix_nocache", "--format", "json"])
    doc = json.loads(result.stdout)
    assert doc["kind"] == "analyze" and doc["schema_version"] == 2 and doc["run"] == "prefix_nocache"
    by_rule = {f["rule"]: f for f in doc["findings"]}
    assert {r: by_rule[r]["state"] for r in ("SL001", "SL002", "SL003", "SL004")} == {
        "SL001": "fired", "SL002": "not_evaluable", "SL003": "not_evaluable", "SL004": "clear"}
    fired = by_rule["SL001"]
    assert fired["examples"][0]["source"].endswith("llamacpp/requests.jsonl")
    assert fired["evidence"]["chart"]["series"] and fired["rollback"].startswith("After enabling it, watch the cache hit rate")
    assert doc["coverage"]["runs"] == ["prefix_nocache"] and "cached_tokens" in doc["coverage"]["columns_present"]
    assert "llamacpp:requests_deferred" in doc["coverage"]["metrics_present"]


def test_markdown_for_a_ticket(cli_runner, store_path, tmp_path):
    out = tmp_path / "summary.md"
    result = invoke(cli_runner, ["analyze", "--db", store_path, "--run", "prefix_nocache", "--out", str(out)] + FOUR)
    assert result.exit_code == 0
    text = out.read_text()
    assert text.startswith("## servlens analyze: 1 fired (1 warning), 2 not evaluable, 1 clear\n")
    assert "| 🟠 warning | SL001 prefix-cache-disabled | run=prefix\\_nocache, model=tiny |" in text
    assert "**Rollback criteria:** After enabling it" in text
    assert "<details><summary>⚠️ Not evaluable (2): no data to judge, not clear</summary>" in text


def test_set_changes_a_threshold_and_select_limits_the_rules(cli_runner, store_path):
    args = ["analyze", "--db", store_path, "--run", "burst50", "--select", "SL004", "--format", "json"]
    doc = json.loads(invoke(cli_runner, args).stdout)
    assert [(f["rule"], f["state"]) for f in doc["findings"]] == [("SL004", "fired")]
    doc = json.loads(invoke(cli_runner, args + ["--set", "SL004.min_queue_share=0.99"]).stdout)
    assert [(f["rule"], f["state"]) for f in doc["findings"]] == [("SL004", "clear")]
    assert doc["findings"][0]["evidence"]["thresholds"]["min_queue_share"] == 0.99


@pytest.mark.parametrize(("args", "message"), [
    (["--select", "SL099"], "Error: --select names an unknown rule 'SL099'. Known rules: {known}.\n"),
    (["--set", "SL004.min_queue_share=abc"], "Error: SL004.min_queue_share must be a number from 0 to 1, not 'abc'.\n"),
    (["--set", "XX007.x=1"], "Error: --set names an unknown rule 'XX007'. Known rules: {known}.\n"),
    (["--run", "nope"], "Error: No run named 'nope' in the store. Runs in the store: burst50, fresh_cache, "
                        "fresh_nocache, poisson, prefix_cache, prefix_nocache.\n"),
    (["--select", "SL001", "--ignore", "SL001"], "Error: --select and --ignore leave no rule to run. Known rules: "
                                                 "{known}.\n"),
])
def test_usage_errors_exit_2_with_one_sentence(monkeypatch, capsys, store_path, args, message):
    code, out, err = _main(monkeypatch, capsys, ["analyze", "--db", store_path] + args)
    assert code == 2 and out == "" and err == message.format(known=_known())


def test_files_and_db_together_is_a_usage_error(monkeypatch, capsys, store_path):
    code, _, err = _main(monkeypatch, capsys, ["analyze", str(LLAMACPP / "requests.jsonl"), "--db", store_path])
    assert code == 2
    assert err == ("Error: Give files to analyse or --db with a store, not both. Add the files to the store with "
                   "'servlens ingest' first, or drop --db.\n")


def test_files_are_ingested_on_the_fly_with_their_scrapes(cli_runner):
    result = invoke(cli_runner, ["analyze", str(LLAMACPP), "--select", "SL004", "--format", "json"])
    doc = json.loads(result.stdout)
    assert doc["run"] == ["burst50", "fresh_cache", "fresh_nocache", "poisson", "prefix_cache", "prefix_nocache"]
    burst = [f for f in doc["findings"] if f["scope"]["run"] == "burst50"][0]
    assert burst["state"] == "fired" and burst["evidence"]["metrics"]["waiting_max"] > 30
    assert any(s.startswith(str(LLAMACPP / "llama-server.log") + ": ") for s in doc["coverage"]["skipped"])


def test_html_goes_through_the_report_renderer(cli_runner, store_path):
    try:
        from servlens.render.html import render_html  # noqa: F401
    except ImportError:
        pytest.skip("HTML renderer not in this build")
    result = invoke(cli_runner, ["analyze", "--db", store_path, "--run", "burst50", "--format", "html"])
    assert result.exit_code == 0
    assert result.stdout.lstrip().lower().startswith("<!doctype html>")
    assert "queue-driven-ttft-spike" in result.stdout


def test_rules_list_explain_and_test(cli_runner):
    listing = invoke(cli_runner, ["rules", "list"]).output.splitlines()
    assert listing[0].split() == ["ID", "NAME", "SEVERITY", "STATUS", "ENGINES", "NEEDS", "(any", "one", "of)"]
    # Columns are as wide as the longest name, which grows as rules are added: compare the fields.
    assert listing[4].split()[:6] == ["SL004", "queue-driven-ttft-spike", "warning", "stable", "duckdb,chdb,spark",
                                      "per-request"]
    assert listing[3].split()[4] == "duckdb,chdb,spark"  # SL003, SQL-first
    explain = invoke(cli_runner, ["rules", "explain", "sl003"]).output
    assert explain.startswith("# reasoning-content-leakage (SL003)\n")
    assert "## What it detects" in explain and "- max_leak_share = 0.002 (a number from 0 to 1): 0.2% was" in explain
    result = invoke(cli_runner, ["rules", "test", USER_RULES, "-v"])
    assert result.output == ("ok   XY901::one_in_five_failing_fires\nok   XY901::all_ok_is_clear\n"
                             "ok   XY901::no_status_is_not_evaluable\n3 passed, 0 failed, 3 cases\n")
    listing = invoke(cli_runner, ["rules", "list", "--rules", USER_RULES]).output
    assert "XY901   high-error-rate" in listing


@pytest.mark.slow  # every built-in case also runs one test each, through the same run_case (tests/analysis/test_rule_cases.py)
def test_rules_test_runs_every_builtin_case(cli_runner):
    from servlens.analysis.cases import collect

    result = invoke(cli_runner, ["rules", "test"])
    assert result.exit_code == 0 and result.output.endswith(f" passed, 0 failed, {len(collect())} cases\n")


def test_rules_test_exits_1_when_a_case_fails(cli_runner, tmp_path):
    for name in ("XY901-high-error-rate.toml", "XY901-high-error-rate.cases.toml"):
        text = (SHARED_DATA.parent.parent / "analysis" / "data" / "user_rules" / name).read_text()
        (tmp_path / name).write_text(text.replace('name = "all_ok_is_clear"\nexpect = "clear"',
                                                  'name = "all_ok_is_clear"\nexpect = "fired"'))
    result = invoke(cli_runner, ["rules", "test", str(tmp_path)])
    assert result.exit_code == 1
    assert "FAIL XY901::all_ok_is_clear: scope r/m: expected fired, got clear: Error share 0.0% of 20 requests" in result.output
    assert result.output.endswith("2 passed, 1 failed, 3 cases\n")


def test_rules_explain_unknown_rule_exits_2(monkeypatch, capsys):
    code, _, err = _main(monkeypatch, capsys, ["rules", "explain", "SL404"])
    assert code == 2 and err == f"Error: No rule 'SL404'. Known rules: {_known()}.\n"


def test_nothing_to_analyse_is_a_usage_error(monkeypatch, capsys, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("# notes\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = _main(monkeypatch, capsys, ["analyze", "notes"])
    assert code == 2
    assert err == ("Error: Nothing servlens recognises in notes. Check the paths, or name the format with --from "
                   "('servlens formats' lists them).\n")
    code, _, err = _main(monkeypatch, capsys, ["analyze"])
    assert code == 2
    assert err == ("Error: Nothing to analyse: no files given and no store at .servlens/store.duckdb. Pass request "
                   "logs or folders, or --db with a store 'servlens ingest' wrote.\n")


def test_the_group_db_option_names_the_store(monkeypatch, capsys, store_path):
    code, out, _ = _main(monkeypatch, capsys, ["--db", store_path, "analyze", "--run", "burst50", "--select", "SL004",
                                               "--format", "json"])
    assert code == 0 and json.loads(out)["findings"][0]["state"] == "fired"


def test_colour_only_for_a_terminal(cli_runner, store_path):
    from servlens.render.analyze_text import render_analyze_text

    doc = json.loads(invoke(cli_runner, ["analyze", "--db", store_path, "--run", "burst50", "--format", "json"] + FOUR).stdout)
    plain = render_analyze_text(doc)
    coloured = render_analyze_text(doc, color=True)
    assert "\x1b[" not in plain and "\x1b[31m\x1b[1mCRITICAL\x1b[0m SL004" in coloured
    # CliRunner's stdout is not a TTY: the command writes the plain text, the same as rendering the JSON document.
    assert invoke(cli_runner, ["analyze", "--db", store_path, "--run", "burst50"] + FOUR).output == plain
