"""Property test: generated metric families rendered as text 0.0.4 and as OpenMetrics parse back to what was generated.

The generator covers what real scrapes contain: counters (prometheus_client style `# TYPE foo_total counter` in text,
`# TYPE foo counter` + `foo_total` in OpenMetrics), `_created` companions (a separate gauge family in text, in-family in
OpenMetrics), histograms with increasing `le` ending in +Inf, summaries with quantiles, gauges, untyped samples,
label values that need escaping (backslash, quote, newline, unicode), NaN/±Inf values, and sample timestamps
(ms in text, seconds in OpenMetrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from servlens.ingest.prometheus import OPENMETRICS_FORMAT, TEXT_FORMAT, parse_exposition

RESERVED_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount")

name_tail = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: not n.endswith(RESERVED_SUFFIXES))
label_name = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: n not in ("le", "quantile"))
label_value = st.text(
    alphabet=st.one_of(st.sampled_from(['\\', '"', "\n", " ", ",", "}", "{", "=", "#", "é", "😀"]), st.characters()),
    max_size=12,
)
sample_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12).map(float),
)
timestamp_ms = st.one_of(st.none(), st.integers(min_value=-(10**12), max_value=4 * 10**12))


@dataclass
class Series:
    labels: dict[str, str]
    values: list[float]  # gauge/counter/untyped: [v]; histogram: bucket counts then sum, count; summary: quantiles then sum, count
    ts: int | None


@dataclass
class FamilySpec:
    base: str
    type: str
    series: list[Series]
    bounds: list[float]  # histogram le (ending in inf) or summary quantiles
    created: bool


@st.composite
def families(draw):
    count = draw(st.integers(min_value=1, max_value=5))
    out = []
    for i in range(count):
        prefix = draw(st.sampled_from(["", "vllm:", "ns:sub_"]))
        base = f"{prefix}f{i}_{draw(name_tail)}"
        mtype = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"]))
        if mtype == "histogram":
            finite = sorted(set(draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=4))))
            bounds = finite + [math.inf]
        elif mtype == "summary":
            bounds = sorted(set(draw(st.lists(st.floats(0, 1), max_size=3))))
        else:
            bounds = []
        label_sets = draw(
            st.lists(st.dictionaries(label_name, label_value, max_size=3), min_size=1, max_size=3,
                     unique_by=lambda d: tuple(sorted(d.items())))
        )
        n_values = len(bounds) + 2 if mtype in ("histogram", "summary") else 1
        series = [
            Series(labels, draw(st.lists(sample_value, min_size=n_values, max_size=n_values)), draw(timestamp_ms))
            for labels in label_sets
        ]
        out.append(FamilySpec(base, mtype, series, bounds, draw(st.booleans()) and mtype != "gauge" and mtype != "untyped"))
    return out


def fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(labels: dict[str, str], extra: tuple[str, str] | None = None) -> str:
    items = list(labels.items()) + ([extra] if extra else [])
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in items) + "}"


def sample_lines(family: FamilySpec, om: bool) -> list[tuple[str, str, str]]:
    """(sample name, label text, value text) of each sample, without timestamps."""
    lines = []
    for s in family.series:
        if family.type == "histogram":
            for le, v in zip(family.bounds, s.values):
                lines.append((family.base + "_bucket", label_text(s.labels, ("le", fmt_value(le))), fmt_value(v)))
            lines.append((family.base + "_sum", label_text(s.labels), fmt_value(s.values[-2])))
            lines.append((family.base + "_count", label_text(s.labels), fmt_value(s.values[-1])))
        elif family.type == "summary":
            for q, v in zip(family.bounds, s.values):
                lines.append((family.base, label_text(s.labels, ("quantile", fmt_value(q))), fmt_value(v)))
            lines.append((family.base + "_sum", label_text(s.labels), fmt_value(s.values[-2])))
            lines.append((family.base + "_count", label_text(s.labels), fmt_value(s.values[-1])))
        elif family.type == "counter":
            lines.append((family.base + "_total", label_text(s.labels), fmt_value(s.values[0])))
        else:
            lines.append((family.base, label_text(s.labels), fmt_value(s.values[0])))
    return lines


def render(specs: list[FamilySpec], om: bool) -> str:
    out = []
    for family in specs:
        ts_of = {}
        for s in family.series:
            ts_of[label_text(s.labels)] = s.ts
        declared = family.base + "_total" if family.type == "counter" and not om else family.base
        out.append(f"# HELP {declared} help with \\\\ backslash and \\n newline")
        if family.type != "untyped":
            out.append(f"# TYPE {declared} {family.type}")
        elif om:
            out.append(f"# TYPE {declared} unknown")
        for s in family.series:
            for name, labels, value in sample_lines(FamilySpec(family.base, family.type, [s], family.bounds, False), om):
                ts = "" if s.ts is None else " " + (repr(s.ts / 1000) if om else str(s.ts))
                out.append(f"{name}{labels} {value}{ts}")
            if family.created and om:
                out.append(f"{family.base}_created{label_text(s.labels)} 1795937381.5")
        if family.created and not om:  # prometheus_client 0.0.4: a separate gauge family after the main one
            out.append(f"# TYPE {family.base}_created gauge")
            for s in family.series:
                out.append(f"{family.base}_created{label_text(s.labels)} 1.7959373814e+09")
        if not om:
            out.append("")  # blank lines are allowed in 0.0.4
            out.append("# a free comment")
    if om:
        out.append("# EOF")
    return "\n".join(out) + "\n"


def key(v):
    return "nan" if isinstance(v, float) and math.isnan(v) else v


def expected_rows(specs: list[FamilySpec]) -> list[tuple]:
    rows = []
    for family in specs:
        for s in family.series:
            labels = tuple(sorted(s.labels.items()))
            ts = None if s.ts is None else s.ts / 1000
            if family.type == "histogram":
                for le, v in zip(family.bounds, s.values):
                    rows.append((family.base, family.base + "_bucket", "histogram", "bucket", le, labels, key(v), ts))
                rows.append((family.base, family.base + "_sum", "histogram", "sum", None, labels, key(s.values[-2]), ts))
                rows.append((family.base, family.base + "_count", "histogram", "count", None, labels, key(s.values[-1]), ts))
            elif family.type == "summary":
                for q, v in zip(family.bounds, s.values):
                    rows.append((family.base, family.base, "summary", "quantile", q, labels, key(v), ts))
                rows.append((family.base, family.base + "_sum", "summary", "sum", None, labels, key(s.values[-2]), ts))
                rows.append((family.base, family.base + "_count", "summary", "count", None, labels, key(s.values[-1]), ts))
            elif family.type == "counter":
                rows.append((family.base, family.base + "_total", "counter", "value", None, labels, key(s.values[0]), ts))
            else:
                rows.append((family.base, family.base, family.type, "value", None, labels, key(s.values[0]), ts))
    return rows


def parsed_rows(expo) -> list[tuple]:
    r = expo.rows
    return [
        (n, nr, t, s, le, tuple(zip(k, v)), key(val), ts)
        for n, nr, t, s, le, k, v, val, ts in zip(
            r.name, r.name_raw, r.type, r.series, r.le, r.label_keys, r.label_values, r.value, r.timestamp
        )
    ]


@settings(max_examples=200, deadline=None)
@given(families())
def test_text_format_round_trip(specs):
    text = render(specs, om=False)
    expo = parse_exposition(text)
    assert expo.format == TEXT_FORMAT
    assert expo.errors == []
    assert parsed_rows(expo) == expected_rows(specs)
    assert expo.created_dropped == sum(len(f.series) for f in specs if f.created)


@settings(max_examples=200, deadline=None)
@given(families())
def test_openmetrics_round_trip(specs):
    text = render(specs, om=True)
    expo = parse_exposition(text)
    assert expo.format == OPENMETRICS_FORMAT
    assert expo.errors == []
    assert parsed_rows(expo) == expected_rows(specs)
    assert expo.created_dropped == sum(len(f.series) for f in specs if f.created)


@settings(max_examples=100, deadline=None)
@given(families(), st.data())
def test_a_corrupted_line_is_reported_at_its_number_and_only_it_is_lost(specs, data):
    lines = render(specs, om=False).split("\n")
    sample_numbers = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    target = data.draw(st.sampled_from(sample_numbers))
    lines[target] = lines[target] + " extra tokens"
    expo = parse_exposition("\n".join(lines))
    assert [e.line for e in expo.errors] == [target + 1]
    was_created_companion = lines[target].split("{")[0].split(" ")[0].endswith("_created")
    assert len(expo.rows) == len(expected_rows(specs)) - (0 if was_created_companion else 1)
