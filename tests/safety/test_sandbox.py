"""Extensions run nobody's code (issue 15, class 7): a user profile's SQL may read only the fields of its own file;
[csv] option keys are checked; user templates render in jinja2's sandbox. Built-in behaviour is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servlens.errors import ConfigError
from servlens.ingest.api import ingest_inputs
from servlens.store.schema import open_store
from tests.safety.corpus import write_requests

PROFILE = """
name = "hostile"
reader = "jsonl"
[detect]
must = ["$.send_ts"]
[columns]
t_arrival = "sl_epoch_s(j->>'$.send_ts')"
model = {model}
{extra}
"""


def _profile(tmp_path, model: str = "j->>'$.body.model'", extra: str = "") -> str:
    path = tmp_path / "hostile.toml"
    path.write_text(PROFILE.format(model=json.dumps(model), extra=extra))
    return str(path)


@pytest.fixture
def con():
    con = open_store(":memory:")
    yield con
    con.close()


@pytest.mark.parametrize(("model", "refusal"), [
    ("(SELECT content FROM read_text('/etc/passwd'))", "calls the table function read_text() on '/etc/passwd'"),
    ("(SELECT string_agg(line, '') FROM read_csv('/etc/passwd', columns={'line': 'VARCHAR'}))",
     "calls the table function read_csv() on '/etc/passwd'"),
    ("getenv('HOME')", "calls getenv()"),
    ("(SELECT max(run) FROM requests)", "reads the table 'requests'"),
    ("current_setting('home_directory')", "calls current_setting()"),
    ("(SELECT name FROM glob('/etc/*'))", "calls the table function glob() on '/etc/*'"),
])
def test_a_profile_expression_that_reaches_outside_its_file_is_refused(tmp_path, con, model, refusal):
    log = write_requests(tmp_path / "log.jsonl", 3)
    with pytest.raises(ConfigError) as caught:
        ingest_inputs(con, [str(log)], profile_file=_profile(tmp_path, model))
    assert str(caught.value).startswith(f"Profile hostile {refusal}, which a profile may not do")
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 0


def test_a_macro_cannot_smuggle_a_statement(tmp_path, con):
    other = write_requests(tmp_path / "other.jsonl", 4)
    ingest_inputs(con, [str(other)])
    log = write_requests(tmp_path / "log.jsonl", 3)
    extra = '[macros]\n"m(x)" = "x); DELETE FROM requests; SELECT (1"'
    with pytest.raises(ConfigError) as caught:
        ingest_inputs(con, [str(log)], profile_file=_profile(tmp_path, "m(j->>'$.body.model')", extra))
    assert str(caught.value).startswith("Profile hostile: macro m is not one SQL expression servlens may run")
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 4  # the other run's rows are still there


def test_a_plain_user_profile_still_works(tmp_path, con):
    log = write_requests(tmp_path / "log.jsonl", 3)
    report = ingest_inputs(con, [str(log)], profile_file=_profile(tmp_path, "upper(j->>'$.body.model')"))
    assert report.rows == 3
    assert con.execute("SELECT DISTINCT model FROM requests").fetchall() == [("TINY",)]


def test_csv_option_keys_are_checked(tmp_path, con):
    path = tmp_path / "p.toml"
    path.write_text('name = "c"\nreader = "csv"\n[detect]\ncolumns = ["a"]\n[columns]\nprompt_tokens = "a::BIGINT"\n'
                    '[csv]\n"header=true, filename" = true\n')
    csv = tmp_path / "x.csv"
    csv.write_text("a\n1\n")
    with pytest.raises(ConfigError) as caught:
        ingest_inputs(con, [str(csv)], profile_file=str(path))
    assert "[csv] option 'header=true, filename' is not a read_csv option servlens allows" in str(caught.value)


def test_a_user_template_runs_in_the_sandbox(tmp_path):
    from servlens.render.html import render_html

    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "analyze.html").write_text(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    doc = json.loads(subprocess.run(
        [sys.executable, "-m", "servlens", "--db", str(tmp_path / "s.duckdb"), "analyze",
         str(write_requests(tmp_path / "log.jsonl", 20)), "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path).stdout)
    with pytest.raises(ConfigError) as caught:
        render_html(doc, templates)
    assert str(caught.value).startswith("The report template cannot be rendered")
    (templates / "analyze.html").write_text("{% include 'missing.html' %}")
    with pytest.raises(ConfigError) as caught:
        render_html(doc, templates)
    assert "missing.html" in str(caught.value)
