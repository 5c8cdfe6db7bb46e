"""The truth matrix: for every recorded real run, the state a correct analyser gives for every rule.

    python -m tools.truth.matrix            # check every cell, print the misses, write docs/truth-matrix.md
    python -m tools.truth.matrix --check    # check only (exit 1 on a wrong cell)

tests/truth/TRUTH.toml holds the cells, written from the raw files (tools/truth/raw_facts.py, each recording's
facts.json and README), never from servlens' output. Each [[run]] names the command line a user would type after
`servlens analyze`, the run label in the report, and one cell per rule:

    "fired" | "fired:warning" | "fired:critical" | "fired:info" | "clear" | "not_evaluable"
    "either"                        any state is defensible (the reason says why)
    "fired:warning|fired:critical"  alternatives
    { "chat" = "fired", "*" = "clear" }   per model scope ("*" for every other scope)

`why.SLxxx` says what in the raw data decides the cell; `numbers."SLxxx.metric" = value` pins key evidence numbers
(compared to 1%). tests/analysis/test_truth_matrix.py runs the same check in the default test run.
"""

from __future__ import annotations

import json
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRUTH = REPO / "tests" / "truth" / "TRUTH.toml"
DOC = REPO / "docs" / "truth-matrix.md"


@dataclass
class Cell:
    run: str
    rule: str
    scope: str  # a model, or "*"
    expected: str
    got: list[str] = field(default_factory=list)  # "fired:warning", "clear", ... one per matching scope

    @property
    def right(self) -> bool:
        return bool(self.got) and all(matches(self.expected, g) for g in self.got)


def matches(expected: str, got: str) -> bool:
    """Whether one result ("fired:critical", "clear", ...) satisfies a cell's expectation."""
    for option in expected.split("|"):
        option = option.strip()
        if option == "either" or option == got or (option == "fired" and got.startswith("fired:")):
            return True
    return False


def load_truth(path: Path = TRUTH) -> list[dict]:
    return tomllib.loads(path.read_text())["run"]


def analyze_document(args: list[str], workdir: Path) -> dict:
    """`servlens analyze ARGS --format json` in-process, as the README tells a user; returns the document."""
    from click.testing import CliRunner

    from servlens.cli import cli

    out = workdir / "analyze.json"
    # --preview: the matrix is what judges a preview rule, so it runs every rule
    result = CliRunner().invoke(cli, ["analyze", *args, "--preview", "--format", "json", "--out", str(out)],
                                catch_exceptions=False)
    if result.exit_code not in (0, 1):
        raise RuntimeError(f"servlens analyze {' '.join(args)} exited {result.exit_code}: {result.output}")
    return json.loads(out.read_text())


def _result(finding: dict) -> str:
    return f"fired:{finding['severity']}" if finding["state"] == "fired" else finding["state"]


def cells_for(entry: dict, document: dict) -> tuple[list[Cell], list[str]]:
    """The cells of one [[run]] against an analyze document, and the number checks that failed."""
    findings = [f for f in document["findings"] if f["scope"]["run"] == entry["run"]]
    cells: list[Cell] = []
    rules = sorted({f["rule"] for f in document["findings"]} | {k for k in entry if k.startswith("SL")})
    for rule in rules:
        expected = entry.get(rule)
        of_rule = [f for f in findings if f["rule"] == rule]
        if expected is None:
            cells.append(Cell(entry["name"], rule, "*", "(no cell written)", [_result(f) for f in of_rule]))
            continue
        per_scope = expected if isinstance(expected, dict) else {"*": expected}
        if "any" in per_scope:  # at least one scope of the run gives this result
            got = [_result(f) for f in of_rule]
            hit = [g for g in got if matches(per_scope["any"], g)]
            cells.append(Cell(entry["name"], rule, "any", per_scope["any"], hit[:1] or got))
            continue
        named = {k for k in per_scope if k != "*"}
        for scope, want in per_scope.items():
            got = [_result(f) for f in of_rule
                   if (f["scope"]["model"] == scope if scope != "*" else f["scope"]["model"] not in named)]
            if got or scope != "*" or not named:
                cells.append(Cell(entry["name"], rule, scope, want, got))
    misses = []
    for key, value in (entry.get("numbers") or {}).items():
        rule, metric = key.split(".", 1)
        seen = [f["evidence"].get("metrics", {}).get(metric) for f in findings if f["rule"] == rule]
        if not any(isinstance(v, (int, float)) and abs(v - value) <= 0.01 * max(abs(value), 1e-9) for v in seen):
            misses.append(f"{entry['name']} {key}: expected {value}, got {seen}")
    return cells, misses


def documents(entries: list[dict], workdir: Path) -> dict[tuple, dict]:
    """One analyze per distinct command line (a folder holding several runs is analysed once), keyed by it."""
    done: dict[tuple, dict] = {}
    for entry in entries:
        key = tuple(entry["analyze"])
        if key not in done:
            args = [a if a.startswith("-") else str(REPO / a) for a in entry["analyze"]]
            done[key] = analyze_document(args, workdir)
    return done


def check_all(entries: list[dict] | None = None) -> tuple[list[Cell], list[str]]:
    entries = entries if entries is not None else load_truth()
    cells, misses = [], []
    with tempfile.TemporaryDirectory() as tmp:
        docs = documents(entries, Path(tmp))
    for entry in entries:
        got, missed = cells_for(entry, docs[tuple(entry["analyze"])])
        cells += got
        misses += missed
    return cells, misses


def render_doc(entries: list[dict], cells: list[Cell], misses: list[str]) -> str:
    rules = sorted({c.rule for c in cells})
    right = sum(c.right for c in cells)
    lines = ["# Truth matrix", "",
             "Every recorded real run the project holds, every rule: the state a correct analyser gives (written from the "
             "raw files in `tests/truth/TRUTH.toml`) against what `servlens analyze` gives. Regenerate with "
             "`python -m tools.truth.matrix`; `tests/analysis/test_truth_matrix.py` checks every cell in the default "
             "test run.", "",
             f"**{right} of {len(cells)} cells right** over {len(entries)} runs × {len(rules)} rules"
             + (f"; {len(misses)} pinned numbers off" if misses else "; every pinned number matches") + ".", "",
             "Cells: `F` fired (severity `i`/`w`/`c`), `C` clear, `N` not evaluable, `*` either is defensible; "
             "a wrong cell shows `expected → got`.", "",
             "| run | " + " | ".join(rules) + " |", "|---|" + "---|" * len(rules)]
    short = {"fired:info": "Fi", "fired:warning": "Fw", "fired:critical": "Fc", "clear": "C", "not_evaluable": "N",
             "either": "*", "fired": "F"}

    def word(value: str) -> str:
        return "/".join(short.get(v.strip(), v.strip()) for v in value.split("|"))

    for entry in entries:
        row = []
        for rule in rules:
            mine = [c for c in cells if c.run == entry["name"] and c.rule == rule]
            if not mine:
                row.append("")
                continue
            parts = []
            for c in mine:
                label = "" if c.scope == "*" else f"{c.scope}: "
                parts.append(label + (word(c.expected) if c.right else
                                      f"**{word(c.expected)} → {word(','.join(sorted(set(c.got))) or 'none')}**"))
            row.append("<br>".join(parts))
        lines.append(f"| {entry['name']} | " + " | ".join(row) + " |")
    if misses:
        lines += ["", "Pinned numbers that are off:", ""] + [f"- {m}" for m in misses]
    lines += ["", "## Why each run's cells are what they are", ""]
    for entry in entries:
        lines.append(f"- **{entry['name']}** (`servlens analyze {' '.join(entry['analyze'])}`, run `{entry['run']}`): "
                     f"{entry.get('raw', '').strip()}")
        for rule, why in sorted((entry.get("why") or {}).items()):
            lines.append(f"  - {rule}: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    entries = load_truth()
    cells, misses = check_all(entries)
    wrong = [c for c in cells if not c.right]
    for c in wrong:
        print(f"{c.run} {c.rule} [{c.scope}]: expected {c.expected}, got {c.got or 'no result'}")
    for m in misses:
        print(m)
    print(f"{sum(c.right for c in cells)} of {len(cells)} cells right, {len(misses)} numbers off")
    if "--check" not in argv:
        DOC.write_text(render_doc(entries, cells, misses))
        print(f"wrote {DOC.relative_to(REPO)}")
    return 1 if wrong or misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
