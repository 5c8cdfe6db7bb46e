"""Regenerate the example reports in reports/examples/ from sample_logs/, or check that they are current.

    python reports/make_examples.py                       # pick scenarios from sample_logs/, write the examples
    python reports/make_examples.py --analyze sample_logs/X --compare sample_logs/A sample_logs/B
    python reports/make_examples.py --check               # exit 1 if a committed example is stale

Each example is made the way a user would make it: `servlens analyze|compare ... --format json`, then the HTML
re-rendered from that JSON (what `servlens report` does). The output is made deterministic so it can be committed
and checked: generated_at is fixed, paths are relative to the repository, compare's bootstrap has a fixed seed.
The inputs used are recorded in reports/examples/MANIFEST.json, so --check regenerates exactly those.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "reports" / "examples"
MANIFEST = EXAMPLES / "MANIFEST.json"
SAMPLE_LOGS = REPO / "sample_logs"
# Fixed so the committed files only change when the results or the templates do.
GENERATED_AT = "2026-11-28T12:00:00+00:00"
COMPARE_SEED = 0

# Preferred scenarios, first found wins (sample_logs/ README files say what each holds).
ANALYZE_PREFERENCE = ["prefix-cache-off", "queue-spike", "incident", "gateway-day"]
# A release that turned the prefix cache off is the gate example: a real regression, judged with real statistics.
COMPARE_PREFERENCE = [("prefix-cache-on", "prefix-cache-off"), ("steady-a", "steady-b"), ("before", "after")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analyze", help="sample_logs scenario folder for the incident report")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="scenario folders for the gate")
    parser.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare")
    args = parser.parse_args(argv)

    if args.check:
        if not MANIFEST.is_file():
            print(f"{MANIFEST.relative_to(REPO)} is missing: run python reports/make_examples.py", file=sys.stderr)
            return 1
        manifest = json.loads(MANIFEST.read_text())
        # Charts are drawn by matplotlib: another matplotlib version draws the same data with other path bytes.
        # Then the check compares everything but the SVG bodies (and says so) instead of failing on a redraw.
        same_drawing = manifest.get("matplotlib") == _matplotlib_version()
        if not same_drawing:
            print(f"note: examples were drawn with matplotlib {manifest.get('matplotlib')}, this is "
                  f"{_matplotlib_version()}: comparing everything but the SVG drawings", file=sys.stderr)
        with tempfile.TemporaryDirectory() as scratch:
            written = generate(manifest, Path(scratch))
            stale = []
            for name, text in written.items():
                committed = (EXAMPLES / name).read_text(encoding="utf-8") if (EXAMPLES / name).is_file() else None
                if committed is None or (text != committed if same_drawing
                                         else _without_svg(text) != _without_svg(committed)):
                    stale.append(name)
        if stale:
            print("Stale example reports (run python reports/make_examples.py and commit): " + ", ".join(stale),
                  file=sys.stderr)
            first_json = next((name for name in stale if name.endswith(".json")), None)
            if first_json and (EXAMPLES / first_json).is_file():
                import difflib

                diff = difflib.unified_diff((EXAMPLES / first_json).read_text().splitlines(),
                                            written[first_json].splitlines(), "committed", "now", lineterm="", n=1)
                print("\n".join(list(diff)[:24]), file=sys.stderr)
            return 1
        print(f"{len(written)} example files are current")
        return 0

    manifest = {
        "analyze": args.analyze or _pick_analyze(),
        "compare": list(args.compare) if args.compare else _pick_compare(),
        "generated_at": GENERATED_AT,
        "seed": COMPARE_SEED,
        "matplotlib": _matplotlib_version(),
    }
    manifest = {k: (_relative(v) if isinstance(v, str) and k == "analyze" else v) for k, v in manifest.items()}
    if manifest["compare"]:
        manifest["compare"] = [_relative(p) for p in manifest["compare"]]
    if not manifest["analyze"] and not manifest["compare"]:
        print("sample_logs/ has no scenario folder to make examples from", file=sys.stderr)
        return 1
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for old in EXAMPLES.glob("*"):
        if old.suffix in (".html", ".json"):
            old.unlink()
    written = generate(manifest, EXAMPLES)
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    for name in sorted(written):
        print(f"wrote reports/examples/{name}")
    return 0


def generate(manifest: dict, out_dir: Path) -> dict[str, str]:
    """Run analyze and compare as the manifest says; write JSON and HTML into out_dir; return name → text."""
    from servlens.render.html import render_html

    written: dict[str, str] = {}
    jobs = []
    if manifest.get("analyze"):
        scenario = manifest["analyze"]
        jobs.append((f"incident-{Path(scenario).name}", ["analyze", scenario], (0, 1)))
    if manifest.get("compare"):
        before, after = manifest["compare"]
        jobs.append((f"gate-{Path(before).name}-vs-{Path(after).name}",
                     ["compare", before, after, "--seed", str(manifest.get("seed", COMPARE_SEED))], (0, 1, 3)))
    for stem, command, ok_codes in jobs:
        with tempfile.TemporaryDirectory() as scratch:
            result = Path(scratch) / "result.json"
            done = subprocess.run([sys.executable, "-m", "servlens", *command, "--format", "json", "--out",
                                   str(result)], cwd=REPO, capture_output=True, text=True, timeout=600)
            if done.returncode not in ok_codes or not result.is_file():
                raise SystemExit(f"servlens {' '.join(command)} failed (exit {done.returncode}): {done.stderr.strip()}")
            doc = json.loads(result.read_text(encoding="utf-8"))
        doc = _deterministic(doc, manifest.get("generated_at", GENERATED_AT))
        texts = {f"{stem}.json": json.dumps(doc, indent=2, ensure_ascii=False) + "\n", f"{stem}.html": render_html(doc)}
        for name, text in texts.items():
            (out_dir / name).write_text(text, encoding="utf-8")
        written.update(texts)
    return written


def _deterministic(doc: dict, generated_at: str) -> dict:
    """Fixed generated_at, and the repository's absolute path taken out of every string."""
    prefix = str(REPO) + "/"

    def clean(value):
        if isinstance(value, str):
            return value.replace(prefix, "")
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        return value

    doc = clean(doc)
    doc["generated_at"] = generated_at
    return doc


def _matplotlib_version() -> str:
    import matplotlib

    return matplotlib.__version__


def _without_svg(page: str) -> str:
    import re

    return re.sub(r"<svg\b.*?</svg>", "<svg/>", page, flags=re.S)


def _relative(path: str) -> str:
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(REPO))
    except ValueError:
        return path


def _pick_analyze() -> str | None:
    for name in ANALYZE_PREFERENCE:
        if (SAMPLE_LOGS / name).is_dir():
            return f"sample_logs/{name}"
    return None


def _pick_compare() -> list[str] | None:
    for before, after in COMPARE_PREFERENCE:
        if (SAMPLE_LOGS / before).is_dir() and (SAMPLE_LOGS / after).is_dir():
            return [f"sample_logs/{before}", f"sample_logs/{after}"]
    return None


if __name__ == "__main__":
    sys.exit(main())
