"""`servlens rules`: list the rules, print one rule's documentation, run rule test cases."""

from __future__ import annotations

from pathlib import Path

import click

from servlens.errors import ConfigError


@click.group("rules", context_settings={"max_content_width": 110})
def rules():
    """List the detection rules, explain one, check them, or run their test cases.

    \b
    Example:
        servlens rules list
        servlens rules explain SL003
        servlens rules check my-rules/
        servlens rules test
        servlens rules test my-rules/
    """


_rules_option = click.option("--rules", "rules_dirs", multiple=True, type=click.Path(file_okay=False),
                             help="A folder of your own rule files, added to the built-in ones; repeatable.")


@rules.command("list")
@_rules_option
def list_rules(rules_dirs):
    """List every rule: id, name, severity, status, the engines its parity with DuckDB is tested on, and the data
    it needs (any one evidence path).

    \b
    Example:
        servlens rules list
        servlens rules list --rules my-rules/
    """
    from servlens.analysis.rules import load_rules

    found = load_rules(list(rules_dirs))
    width = max(len(r.name) for r in found)
    engines_width = max(len("ENGINES"), *(len(",".join(r.engines)) for r in found))
    click.echo(f"{'ID':<7} {'NAME':<{width}} {'SEVERITY':<9} {'STATUS':<10} {'ENGINES':<{engines_width}} "
               "NEEDS (any one of)")
    for rule in found:
        needs = " | ".join(req.name for req in rule.requires)
        engines = ",".join(rule.engines)
        click.echo(f"{rule.id:<7} {rule.name:<{width}} {rule.severity:<9} {rule.status:<10} "
                   f"{engines:<{engines_width}} {needs}")


@rules.command("explain")
@click.argument("rule_id")
@_rules_option
def explain(rule_id, rules_dirs):
    """Print a rule's documentation, evidence paths and parameters (the same text the reports use).

    \b
    Example:
        servlens rules explain SL003
    """
    from servlens.analysis.rules import load_rules

    found = {r.id: r for r in load_rules(list(rules_dirs))}
    rule = found.get(rule_id.upper())
    if rule is None:
        raise ConfigError(f"No rule '{rule_id}'", "Known rules: " + ", ".join(sorted(found)))
    lines = [f"# {rule.name} ({rule.id})", "", rule.title, "",
             f"Severity: {rule.severity} · status: {rule.status} · detector: {rule.detector}"
             + (f" · since {rule.since}" if rule.since else ""), "", rule.documentation, "", "## Data it needs (any one of)"]
    for req in rule.requires:
        lines.append(f"- {req.describe()}")
    lines += ["", "## Parameters (override with --set " + rule.id + ".NAME=VALUE)"]
    for param in rule.params.values():
        lines.append(f"- {param.name} = {param.default!r} ({param.allowed()}): {param.reason}")
    lines += ["", "## Remediation text", rule.remediation, "", "## Rollback text", rule.rollback]
    click.echo("\n".join(lines))


@rules.command("check")
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@click.pass_context
def check(ctx, directory):
    """Check every rule without data: load it, expand its macros, bind each SQL (detector, views, decide,
    evidence) against empty scope views, and check the names its templates use.

    DIRECTORY holds your own rules [default: the built-in rules]. Every problem is listed with the file, the key
    and, for SQL, the line and column in the file. Exit code 0 when all are fine, 2 on any problem.

    \b
    Example:
        servlens rules check
        servlens rules check my-rules/
    """
    from servlens.analysis.rule_check import check_rules

    checked, problems = check_rules(Path(directory) if directory else None)
    for problem in problems:
        click.echo(str(problem))
    click.echo(f"{checked} rule files checked, {len(problems)} problem(s)")
    ctx.exit(2 if problems else 0)


@rules.command("test")
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@click.option("-v", "--verbose", is_flag=True, help="Print every case, not only failures.")
@click.pass_context
def test(ctx, directory, verbose):
    """Run the test cases beside each rule (RULE.cases.toml): must fire, must not fire, not evaluable.

    DIRECTORY holds your own rules [default: the built-in rules]. Each case runs exactly as analyze runs the rule.
    Exit code 1 when a case fails, 2 when a rule or case file is malformed or a rule's SQL fails (listed as ERROR;
    the other cases still run).

    \b
    Example:
        servlens rules test
        servlens rules test my-rules/ -v
    """
    from servlens.analysis.cases import collect, rules_without_cases, run_case

    rules_dir = Path(directory) if directory else None
    pairs = collect(rules_dir)
    failed = broken = 0
    for rule, case in pairs:
        try:
            result = run_case(rule, case)
        except ConfigError as exc:
            broken += 1
            click.echo(f"ERROR {case.id}: {exc}")
            continue
        if not result.passed:
            failed += 1
            click.echo(f"FAIL {case.id}: {result.message}")
        elif verbose:
            click.echo(f"ok   {case.id}")
    for rule in rules_without_cases(rules_dir):
        click.echo(f"note {rule.id} has no cases file ({rule.path.stem}.cases.toml)")
    passed = len(pairs) - failed - broken
    errors = f"{broken} errors, " if broken else ""
    click.echo(f"{passed} passed, {failed} failed, {errors}{len(pairs)} cases")
    ctx.exit(2 if broken else 1 if failed else 0)
