"""The compare result document as Markdown for a pull-request comment or a CI step summary."""

from __future__ import annotations

from servlens.render.compare_text import (EXIT_OF, context_lines, coverage_sentence, fmt_change, fmt_delta,
                                         fmt_value, gate_label, short_cohort)
from servlens.escape import md_code, md_escape, strip_controls

BADGE = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive"}


# Log-derived labels are untrusted: every field is escaped (servlens.escape), run labels as code spans.
_cell = md_escape


def render_compare_markdown(doc: dict) -> str:
    verdict = doc["verdict"]
    before, after = doc["before"], doc["after"]
    lines = [f"### servlens compare: {BADGE[verdict]} (exit {EXIT_OF[verdict]})", "",
             _cell(doc["reason"]), "",
             f"**before** {md_code(before['run'])} · {before['requests']:,} requests — "
             f"**after** {md_code(after['run'])} · {after['requests']:,} requests"]
    cov = doc.get("coverage")
    if cov:
        lines.append(f"Coverage: {_cell(coverage_sentence(cov))}.")
    gates = doc.get("gates", [])
    if gates:
        lines += ["", "| gate | cohorts | before | after | change [interval] | tolerance | verdict |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for g in gates:
            name = _cell(gate_label(g)) + (" (critical)" if g["critical"] else "")
            mark = {"fail": "❌ fail", "pass": "✅ pass", "inconclusive": "⚠️ inconclusive"}[g["verdict"]]
            lines.append(f"| {name} | {_cell(short_cohort(g))} | {fmt_value(g.get('before'), g['unit'])} | "
                         f"{fmt_value(g.get('after'), g['unit'])} | {fmt_change(g)} | {_cell(g['tolerance_text'])} | "
                         f"{mark} |")
        conf = doc.get("policy", {}).get("confidence", 0.95)
        lines += ["", f"Intervals are Holm-adjusted at {conf:.0%} family confidence (batch-means variances); latency "
                      "effects compare covariate-adjusted values re-weighted to the before run's cohort mix."]
        context = context_lines(doc)
        if context:
            lines += [""] + [f"- {_cell(line)}" for line in context]
    mix = doc.get("mix_shift")
    if mix and mix.get("significant"):
        lines += ["", f"**Mix shift.** {_cell(mix['summary'])}.", "",
                  "| gate | naive change | mix-adjusted change |", "|---|---:|---:|"]
        for row in mix.get("naive_vs_adjusted", []):
            lines.append(f"| {_cell(row['gate'])} | {fmt_delta(row['naive_change'], row['kind'])} | "
                         f"{fmt_delta(row['adjusted_change'], row['kind'])} |")
    if doc.get("improvements"):
        lines += ["", "**Improvements**", ""] + [f"- {_cell(i['summary'])}" for i in doc["improvements"]]
    if gates:
        lines += ["", "<details><summary>Gates as rollback criteria</summary>", ""]
        lines += [f"- {_cell(g['rollback_criterion'])}" for g in gates]
        lines += ["", "</details>"]
    if doc.get("goodput_gate"):
        g = doc["goodput_gate"]
        lines += ["", f"**Goodput gate** (advisory, does not decide the verdict): {BADGE[g['verdict']]}: "
                      f"{_cell(g['reason'])}."]
    for note in doc.get("notes", []):
        lines += ["", f"_Note: {_cell(note)}._"]
    for merged in doc.get("merged_bands", []):
        lines += ["", f"_Bands merged: {_cell(merged)}._"]
    return strip_controls("\n".join(lines) + "\n")
