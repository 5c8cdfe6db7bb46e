"""The compare result document as a terminal table, benchstat-like: before, after, change with interval, verdict."""

from __future__ import annotations

from servlens.escape import bound_fields, strip_controls

EXIT_OF = {"pass": 0, "fail": 1, "inconclusive": 3}


def fmt_value(value, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "share":
        return f"{value * 100:.2f}%"
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 0.001:
        return f"{value * 1000:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def fmt_change(gate: dict) -> str:
    """'+13.8% [+9.4% … +19.7%]' for latencies (×20.1 [×6.6 … ×72] past 2×), '+0.33 pp [−0.18 … +0.84]' for rates,
    '~' when not estimated."""
    if gate.get("change") is None:
        if gate.get("ratio") is not None:
            return f"{(gate['ratio'] - 1) * 100:+.1f}% (no interval)".replace("-", "−")
        return "~"
    if gate["kind"] == "latency" and (gate["ratio"] >= 2 or gate["ratio"] <= 0.5):
        return f"×{gate['ratio']:.3g} [×{gate['ci_low']:.3g} … ×{gate['ci_high']:.3g}]"
    if gate["kind"] == "latency":
        text = (f"{gate['change'] * 100:+.1f}% [{gate['change_low'] * 100:+.1f}% … "
                f"{gate['change_high'] * 100:+.1f}%]")
    else:
        text = (f"{gate['change'] * 100:+.2f} pp [{gate['change_low'] * 100:+.2f} … "
                f"{gate['change_high'] * 100:+.2f}]")
    return text.replace("-", "−")


def fmt_delta(change: float, kind: str) -> str:
    text = f"{change * 100:+.1f}%" if kind == "latency" else f"{change * 100:+.2f} pp"
    return text.replace("-", "−")


def short_cohort(gate: dict) -> str:
    if gate.get("per_cohort"):
        return gate.get("cohort") or "each cohort"
    count = gate.get("cohort_count")
    if not count:
        return "–"
    headline = (gate.get("adjustment") or {}).get("headline", "mix-adjusted")
    return f"{'covariate-adj.' if headline == 'covariate-adjusted' else 'mix-adjusted'} ({count})"


def gate_label(gate: dict) -> str:
    """The gate's name, with the quantile actually judged when the tail was too thin ('TTFT p99 → p85')."""
    judged = gate.get("judged_at")
    return gate["name"] + (f" → {judged}" if judged and judged != gate.get("statistic") else "")


def context_lines(doc: dict) -> list[str]:
    """Headline beside mix-adjusted and naive, and the distribution screen, for latency gates (text and Markdown)."""
    out = []
    for g in doc.get("gates", []):
        if g["kind"] != "latency" or g.get("change") is None:
            continue
        parts = [f"headline ({(g.get('adjustment') or {}).get('headline', 'mix-adjusted')}) ×{g['ratio']:.3g}"]
        if g.get("mix_adjusted"):
            parts.append(f"mix-adjusted ×{g['mix_adjusted']['ratio']:.3g}")
        if g.get("naive"):
            parts.append(f"naive ×{g['naive']['ratio']:.3g}")
        screen = g.get("distribution_test")
        if screen:
            p = screen["p_value"]
            bound = "≤ " if screen.get("p_value_bounded") and p <= 0.001 else "≥ " if screen.get(
                "p_value_bounded") else ""
            said = "the distribution changed" if p <= 0.01 else "no distribution change seen"
            parts.append(f"Anderson–Darling p {bound}{p:.2g}: {said}")
        out.append(f"{gate_label(g)}: " + ", ".join(parts))
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return lines


def coverage_sentence(cov: dict) -> str:
    """The share of each run that was compared, in words (shared by the text and Markdown renderers)."""
    return (f"{cov['before']['share']:.0%} of before and {cov['after']['share']:.0%} of after in "
            f"{cov['cohorts_compared']} of {cov['cohorts_total']} cohorts ({' × '.join(cov['by']) or 'no bands'})")


def render_compare_text(doc: dict) -> str:
    doc = bound_fields(doc)  # a huge field (a run label, a model name) is cut (issue 15)
    verdict = doc["verdict"]
    before, after = doc["before"], doc["after"]
    out = [f"servlens compare: {verdict.upper()} (exit {EXIT_OF[verdict]})",
           f"before: {before['run']} ({before['requests']:,} requests)   "
           f"after: {after['run']} ({after['requests']:,} requests)"]
    cov = doc.get("coverage")
    if cov:
        out.append(f"coverage: {coverage_sentence(cov)}")
    gates = doc.get("gates", [])
    if gates:
        rows = []
        for g in gates:
            name = gate_label(g) + (" *" if g["critical"] else "")
            n = (f"n={g['n_before']:,}/{g['n_after']:,}" if g.get("n_before") is not None
                 and g.get("n_after") is not None else "")
            rows.append([name, short_cohort(g), fmt_value(g.get("before"), g["unit"]),
                         fmt_value(g.get("after"), g["unit"]), fmt_change(g), n,
                         f"{g['tolerance_text']}", g["verdict"].upper() if g["verdict"] == "fail" else g["verdict"]])
        out.append("")
        out.extend(_table(["gate", "cohorts", "before", "after", "change [interval]", "requests", "tolerance",
                           "verdict"], rows))
        judged = sum(1 for g in gates if g.get("change") is not None)
        conf = doc.get("policy", {}).get("confidence", 0.95)
        if judged:
            out.append(f"* critical gate. Intervals are Holm-adjusted over {judged} judged gate"
                       f"{'s' if judged != 1 else ''} at {conf:.0%} family confidence, with batch-means variances; "
                       f"latencies compare covariate-adjusted values re-weighted to the before run's cohort mix.")
            context = context_lines(doc)
            if context:
                out += ["", "Latency effects, headline beside the mix-adjusted and naive ratios:"]
                out += [f"  - {line}" for line in context]
        else:
            out.append("* critical gate. No gate had the data to be judged (reasons below).")
    mix = doc.get("mix_shift")
    if mix and mix.get("significant"):
        out += ["", "Mix shift: " + mix["summary"] + "."]
        rows = []
        for row in mix.get("naive_vs_adjusted", []):
            rows.append([row["gate"], fmt_delta(row["naive_change"], row["kind"]),
                         fmt_delta(row["adjusted_change"], row["kind"])])
        if rows:
            out.extend("  " + line for line in _table(["gate", "naive change", "mix-adjusted change"], rows))
    if doc.get("improvements"):
        out += ["", "Improvements:"] + [f"  - {i['summary']}" for i in doc["improvements"]]
    if gates:
        out += ["", "Gates as rollback criteria:"] + [f"  - {g['rollback_criterion']}" for g in gates]
    if doc.get("goodput_gate"):
        g = doc["goodput_gate"]
        out += ["", f"Goodput gate (advisory, does not decide the verdict): {g['verdict']}: {g['reason']}."]
    for note in doc.get("notes", []):
        out.append(f"Note: {note}.")
    for merged in doc.get("merged_bands", []):
        out.append(f"Bands merged: {merged}.")
    out += ["", f"Verdict: {verdict}. {doc['reason']}"]
    return strip_controls("\n".join(out) + "\n")  # log values (run labels, cohorts) hold no control characters
