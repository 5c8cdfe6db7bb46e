"""The READMEs name only what exists: every `servlens ...` command line (its command, subcommand and options)
resolves through the click group, and every rule id and rule name they give is a rule the loader loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from servlens.analysis.rules import load_rules
from servlens.cli import cli

REPO = Path(__file__).resolve().parent.parent
READMES = [REPO / "README.md", REPO / "rules" / "README.md"]
# `servlens analyze logs/ --select SL001`, in a code block (one a line) or an inline code span
_INLINE = re.compile(r"`(servlens [^`]+)`")
_RULE_ID = re.compile(r"\bSL\d{3}\b")   # servlens's own prefix: MY001 and such are a user's example rules


def command_lines(text: str) -> list[str]:
    """The servlens command lines of a Markdown text: code-block lines starting with `servlens `, and code spans."""
    lines, in_block = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block and line.lstrip().startswith("servlens ") and not line.split()[1].endswith(":"):
            # (not `servlens compare: FAIL (exit 1)`, a command's output shown in a block)
            lines.append(line.strip().split("  #", 1)[0].split(" # ", 1)[0])
        elif not in_block:
            lines += _INLINE.findall(line)
    return lines


def resolve(line: str) -> tuple[click.Command, list[str], list[str]]:
    """The command a line runs, the words that named it, and the options it passes."""
    words = shlex.split(line.replace("…", "").replace("...", ""))[1:]
    command: click.Command = cli
    path = ["servlens"]
    ctx = click.Context(cli)
    options = []
    for word in words:
        if word.startswith("-"):
            options.append(word.split("=", 1)[0])
        elif isinstance(command, click.Group):
            found = command.get_command(ctx, word)
            if found is None:
                raise AssertionError(f"`{line}`: {' '.join(path)} has no command {word!r}")
            command, path = found, path + [word]
    return command, path, options


def _all_lines() -> list[tuple[str, str]]:
    return [(readme.name if readme.parent == REPO else f"rules/{readme.name}", line)
            for readme in READMES for line in command_lines(readme.read_text(encoding="utf-8"))]


def test_the_readmes_show_command_lines():
    named = {tuple(resolve(line)[1]) for _, line in _all_lines()}
    # the commands the READMEs teach (a regression in command_lines would make the next test vacuous)
    assert {("servlens", "analyze"), ("servlens", "compare"), ("servlens", "ingest"), ("servlens", "report"),
            ("servlens", "rules", "test")} <= named


@pytest.mark.parametrize(("readme", "line"), _all_lines(), ids=[f"{r}:{line[:60]}" for r, line in _all_lines()])
def test_every_command_line_in_the_readmes_exists(readme, line):
    command, path, options = resolve(line)
    assert not isinstance(command, click.Group) or path == ["servlens"], f"`{line}` names a group, not a command"
    known = {opt for param in command.params for opt in getattr(param, "opts", [])} | {"-h", "--help"}
    known |= {opt for param in cli.params for opt in getattr(param, "opts", [])}
    unknown = [o for o in options if o not in known]
    assert not unknown, f"{readme}: `{line}`: {' '.join(path)} has no option {', '.join(unknown)}"


def test_every_rule_id_and_name_in_the_readmes_is_a_rule():
    rules = load_rules()
    ids = {rule.id for rule in rules} | {alias for rule in rules for alias in getattr(rule, "aliases", ()) or ()}
    names = {rule.id: rule.name for rule in rules}
    for readme in READMES:
        text = readme.read_text(encoding="utf-8")
        named = set(_RULE_ID.findall(text))
        assert named, readme
        assert named <= ids, f"{readme.name} names rules that do not exist: {sorted(named - ids)}"
        # the rules/README table: | SL004 | queue-driven-ttft-spike | ...
        for rule_id, name in re.findall(r"^\| (\w+\d{3}) \| ([a-z0-9-]+) \|", text, re.M):
            assert names.get(rule_id) == name, f"{readme.name}: {rule_id} is {names.get(rule_id)!r}, not {name!r}"
    built_in = {rule.id for rule in rules if rule.id.startswith("SL")}
    table = set(re.findall(r"^\| (SL\d{3}) \|", (REPO / "rules" / "README.md").read_text(), re.M))
    assert table == built_in, "rules/README.md's table lists every built-in rule"


def test_a_drifted_line_is_caught():
    with pytest.raises(AssertionError, match="servlens rules has no command 'verify'"):
        resolve("servlens rules verify SL004")
    command, path, options = resolve("servlens analyze logs/ --select SL001 --sett SL004.x=1")
    assert path == ["servlens", "analyze"] and options == ["--select", "--sett"]
    assert "--sett" not in {opt for param in command.params for opt in getattr(param, "opts", [])}
