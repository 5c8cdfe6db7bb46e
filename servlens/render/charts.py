"""CHART dicts (docs/CONTRIBUTING.md) → inline SVG, drawn with matplotlib's SVG backend.

A CHART is data, never pixels: {"type": line|step|bar|scatter|cdf, "title", "x_label", "y_label", "x_time",
"x_log", "y_log", "y_logit", "series": [{"name", "x", "y"}], "hlines": [{"y", "label", "style"}],
"vlines": [{"x", "label", "style"}], "vspans": [{"x0", "x1", "label"}]}. A line's style is "threshold" (the
default: a limit that matters, drawn red and dashed) or "reference" (a value to read against, drawn grey).

The SVG goes straight into a self-contained HTML page, so it must not reference anything outside itself: no XML
prolog or DOCTYPE (the DTD is a URL), no RDF metadata, text kept as text (svg.fonttype 'none', so no font files),
and element ids prefixed per chart so several charts in one page never collide. Points are capped per series, so a
chart's size does not grow with the input even when a producer forgot to aggregate.

matplotlib is imported inside the functions: importing it costs about half a second, and the CLI must start fast.
`servlens analyze` starts that import in a thread (CHART_MODULES, commands._common.import_in_background) while
DuckDB ingests and runs the rules. pyplot is never used (no global state, no GUI backend): a bare Figure with the
SVG canvas.
"""

from __future__ import annotations

import html
import io
import math
import re
from datetime import datetime, timezone
from typing import Any

# At most this many points per series reach the SVG; beyond it the series is thinned evenly (first and last kept).
MAX_POINTS_PER_SERIES = 400
# At most this many series per chart; the rest are named in a note under the chart.
MAX_SERIES = 12
# Page width the charts are drawn for, in inches at 72 pt/inch (the SVG scales to its container anyway).
CHART_WIDTH_IN = 9.0
CHART_HEIGHT_IN = 3.4

# A colour-blind-safe palette (Okabe–Ito), in a fixed order so the same series keeps its colour across a report.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
HLINE_COLOURS = ["#B00020", "#6A1B9A", "#37474F"]
# Reference lines (a before value, a quantile level) are grey and differ by dash pattern, so the red of a threshold
# stays the one line that reads as a limit.
REFERENCE_COLOUR = "#4B5563"
REFERENCE_DASHES = [":", "-."]
# A logit share axis (y_logit) is labelled at these shares, as percentages.
LOGIT_TICKS = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)

_RC = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.6,
    "axes.edgecolor": "#6b7280",
    "axes.labelcolor": "#1f2933",
    "xtick.color": "#374151",
    "ytick.color": "#374151",
    "legend.frameon": False,
    "legend.fontsize": 8.5,
    "lines.linewidth": 1.6,
    "axes.axisbelow": True,
}

_PROLOG = re.compile(r"^\s*<\?xml[^>]*\?>\s*(<!DOCTYPE[^>]*>\s*)?", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_SIZE_ATTRS = re.compile(r'<svg([^>]*?)\swidth="[^"]*"\s+height="[^"]*"')


# What chart_svg imports: a command that will draw charts imports these in the background while DuckDB works.
CHART_MODULES = ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_svg")


def is_chart(value: Any) -> bool:
    """True when `value` has the CHART shape (a type and a list of series)."""
    return isinstance(value, dict) and isinstance(value.get("type"), str) and isinstance(value.get("series"), list)


def chart_svg(chart: dict, chart_id: str = "c0", relative_clock: bool = False) -> tuple[str, list[str]]:
    """Draw one CHART as an SVG fragment ready to inline in HTML (ids prefixed with `chart_id`), and notes for
    the reader (series not drawn, no data).

    `relative_clock` marks runs whose timestamps are offsets from 1970-01-01 (DESIGN.md "Times"): their time axis
    reads +hh:mm:ss instead of a date.
    """
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    rc = dict(_RC, **{"svg.hashsalt": f"servlens-{chart_id}"})
    legend_rows = _legend_rows(chart)
    height = CHART_HEIGHT_IN + LEGEND_ROW_IN * legend_rows
    with matplotlib.rc_context(rc):
        # Fixed margins instead of constrained layout: measuring every label's extent doubles the drawing time.
        # A long legend goes under the plot (rows of four) instead of over the data.
        figure = Figure(figsize=(CHART_WIDTH_IN, height))
        bottom_in = 0.15 * CHART_HEIGHT_IN + LEGEND_ROW_IN * legend_rows
        figure.subplots_adjust(left=0.085, right=0.985, bottom=bottom_in / height,
                               top=1 - 0.1 * CHART_HEIGHT_IN / height)
        axes = figure.add_subplot()
        notes = _draw(axes, chart, relative_clock, legend_below=legend_rows > 0)
        buffer = io.StringIO()
        FigureCanvasSVG(figure).print_svg(buffer, metadata={"Date": None, "Creator": None})
    return _clean(buffer.getvalue(), chart_id, str(chart.get("title") or "chart")), notes


LEGEND_ROW_IN = 0.22
LEGEND_INSIDE_MAX = 3


def _legend_labels(chart: dict) -> list[str]:
    """The legend entries a chart will have: series, then distinct threshold and span labels."""
    labels = [str(s.get("name") or "") for s in (chart.get("series") or [])[:MAX_SERIES] if isinstance(s, dict)]
    for key in ("hlines", "vlines", "vspans"):
        labels += list(dict.fromkeys(str(item.get("label") or "") for item in chart.get(key) or []
                                     if isinstance(item, dict) and item.get("label")))
    return labels


def _legend_rows(chart: dict) -> int:
    """0 when the legend fits inside the plot, else the number of rows of four under it."""
    count = len(_legend_labels(chart))
    return 0 if count <= LEGEND_INSIDE_MAX else -(-count // 4)


def _text(value: Any) -> str:
    """A label as matplotlib must get it: str, and `$` escaped so log text never switches on mathtext."""
    if value is None:
        return ""
    return str(value).replace("\\", "\\\\").replace("$", r"\$")[:160]


def _is_time_x(chart: dict) -> bool:
    return bool(chart.get("x_time"))


def _parse_time(value: Any) -> float | None:
    """ISO-8601 (or epoch seconds) → matplotlib date number; None for anything unreadable."""
    from matplotlib.dates import date2num

    if value is None:
        return None
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return None
        moment = datetime.fromtimestamp(float(value), tz=timezone.utc)
    else:
        text = str(value).strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
    return float(date2num(moment))


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def _thin(x: list, y: list, limit: int = MAX_POINTS_PER_SERIES) -> tuple[list, list]:
    """Keep at most `limit` points, evenly spaced by position, always keeping the first and the last."""
    n = len(x)
    if n <= limit:
        return x, y
    step = (n - 1) / (limit - 1)
    keep = sorted({round(i * step) for i in range(limit)})
    return [x[i] for i in keep], [y[i] for i in keep]


def _series_points(chart: dict, series: dict, x_time: bool) -> tuple[list, list]:
    """Paired, cleaned (x, y) of one series; for a cdf without y, the empirical CDF of x on a quantile grid."""
    raw_x = list(series.get("x") or [])
    raw_y = series.get("y")
    convert_x = _parse_time if x_time else _number
    if chart.get("type") == "cdf" and not raw_y:
        values = sorted(v for v in (convert_x(item) for item in raw_x) if v is not None)
        n = len(values)
        if n == 0:
            return [], []
        if n > MAX_POINTS_PER_SERIES:
            picks = [round(i * (n - 1) / (MAX_POINTS_PER_SERIES - 1)) for i in range(MAX_POINTS_PER_SERIES)]
            return [values[i] for i in picks], [(i + 1) / n for i in picks]
        return values, [(i + 1) / n for i in range(n)]
    raw_y = list(raw_y or [])
    if chart.get("type") != "bar":
        # Thin before parsing: a producer that forgot to aggregate must not cost a timestamp parse per point.
        raw_x, raw_y = _thin(raw_x[: len(raw_y)], raw_y[: len(raw_x)], 4 * MAX_POINTS_PER_SERIES)
    xs, ys = [], []
    # Bar x values given as strings are category labels ("256", "qwen3-8b"); numbers are positions (bin starts).
    categorical = chart.get("type") == "bar" and not x_time and any(isinstance(v, str) for v in raw_x)
    for index, (x_value, y_value) in enumerate(zip(raw_x, raw_y)):
        x_number = str(x_value) if categorical else convert_x(x_value)
        y_number = _number(y_value)
        if x_number is None or y_number is None:
            continue
        xs.append(x_number)
        ys.append(y_number)
    if categorical:
        return xs[:60], ys[:60]
    return _thin(xs, ys)


SPAN_COLOURS = ["#E69F00", "#56B4E9", "#CC79A7", "#009E73"]


def _draw(axes, chart: dict, relative_clock: bool, legend_below: bool = False) -> list[str]:
    """Draw the chart on `axes`; returns notes for the reader (dropped series, empty chart)."""
    notes: list[str] = []
    kind = chart.get("type", "line")
    x_time = _is_time_x(chart)
    series_list = [s for s in chart.get("series") or [] if isinstance(s, dict)]
    if len(series_list) > MAX_SERIES:
        notes.append(f"{len(series_list) - MAX_SERIES} more series not drawn")
        series_list = series_list[:MAX_SERIES]

    drawn = 0
    all_y_min = [math.inf]
    bar_count = sum(1 for s in series_list) if kind == "bar" else 0
    all_x: list[float] = []
    series_lines: list = []
    for index, series in enumerate(series_list):
        xs, ys = _series_points(chart, series, x_time)
        if not xs:
            continue
        colour = PALETTE[index % len(PALETTE)]
        label = _text(series.get("name")) or f"series {index + 1}"
        if kind == "bar":
            if isinstance(xs[0], str):
                positions = list(range(len(xs)))
                width = 0.8 / max(bar_count, 1)
                offsets = [p - 0.4 + width * (index + 0.5) for p in positions]
                axes.bar(offsets, ys, width=width, color=colour, label=label)
                # Category labels share the width: wrap each to its slot (two lines at most) at _ - / and spaces.
                width = max(6, int(100 / max(len(xs), 1)))
                labels = [_wrap_label(_text(v), width) for v in xs]
                axes.set_xticks(positions, labels)
                # A few categories keep bar-like widths instead of one bar filling the plot.
                pad = max(0.6, (4 - len(xs)) / 2 + 0.6)
                axes.set_xlim(-pad, len(xs) - 1 + pad)
                if any("\n" in label for label in labels):
                    params = axes.figure.subplotpars
                    axes.figure.subplots_adjust(bottom=params.bottom + 0.05)
            else:
                width = _bar_width(xs) / max(bar_count, 1)
                lefts = [x + width * index for x in xs] if bar_count > 1 else [x - width / 2 for x in xs]
                if chart.get("y_log"):
                    axes.bar(lefts, ys, width=width, color=colour, label=label, align="edge")
                else:
                    _bars_as_one_path(axes, lefts, ys, width, colour, label)
        elif kind == "scatter":
            axes.scatter(xs, ys, s=9, color=colour, label=label, alpha=0.75, linewidths=0)
        elif kind in ("step", "cdf"):
            series_lines += axes.step(xs, ys, where="post", color=colour, label=label)
        else:
            series_lines += axes.plot(xs, ys, color=colour, label=label, marker="o" if len(xs) <= 24 else None,
                                      markersize=3)
        if not isinstance(xs[0], str):
            all_x.extend((xs[0], xs[-1]))
        all_y_min[0] = min(all_y_min[0], min(ys))
        drawn += 1

    span_colour: dict[str, str] = {}
    for index, span in enumerate(chart.get("vspans") or []):
        if not isinstance(span, dict):
            continue
        convert = _parse_time if x_time else _number
        x0, x1 = convert(span.get("x0")), convert(span.get("x1"))
        if x0 is None or x1 is None:
            continue
        text = _text(span.get("label"))
        # One colour and one legend entry per distinct label, however many windows carry it.
        first = text not in span_colour
        colour = span_colour.setdefault(text, SPAN_COLOURS[len(span_colour) % len(SPAN_COLOURS)])
        label = text if (first and text) else None
        if x1 == x0:
            axes.axvline(x0, color=colour, linewidth=1.2, linestyle=":", label=label)
        else:
            axes.axvspan(x0, x1, color=colour, alpha=0.2, linewidth=0, label=label)
        all_x.extend((x0, x1))

    logit = bool(chart.get("y_logit")) and bool(series_lines)
    threshold_index = 0
    reference_index = 0
    for key, draw_line, convert in (("hlines", axes.axhline, _number),
                                    ("vlines", axes.axvline, _parse_time if x_time else _number)):
        for line in chart.get(key) or []:
            value = convert(line.get("y" if key == "hlines" else "x")) if isinstance(line, dict) else None
            if value is None or (logit and key == "hlines" and not 0 < value < 1):
                continue
            if line.get("style") == "reference":
                colour, dashes = REFERENCE_COLOUR, REFERENCE_DASHES[reference_index % len(REFERENCE_DASHES)]
                reference_index += 1
            else:
                colour, dashes = HLINE_COLOURS[threshold_index % len(HLINE_COLOURS)], "--"
                threshold_index += 1
            draw_line(value, color=colour, linestyle=dashes, linewidth=1.1, label=_text(line.get("label")) or None)
            if key == "vlines":
                all_x.append(value)

    if drawn == 0:
        notes.append("no data points to draw")
        axes.text(0.5, 0.5, "no data", transform=axes.transAxes, ha="center", va="center", color="#6b7280")

    if logit:
        _logit_share_axis(axes, chart, series_lines)
    elif kind == "cdf":
        axes.set_ylim(0, 1.02)
    elif not chart.get("y_log") and drawn and axes.get_ylim()[0] > 0 and all_y_min[0] >= 0:
        # Counts, rates and latencies read against zero; an axis starting at 3.4 exaggerates a wobble.
        axes.set_ylim(bottom=0)
    if chart.get("x_log") and kind != "bar" and _positive(axes, "x"):
        axes.set_xscale("log")
        _plain_log_ticks(axes.xaxis, axes.get_xlim())
    if chart.get("y_log") and _positive(axes, "y"):
        axes.set_yscale("log")
        _plain_log_ticks(axes.yaxis, axes.get_ylim())
    if x_time:
        _time_axis(axes, all_x, relative_clock)

    title = _text(chart.get("title"))
    if len(title) > 95:
        # Two lines at most; the full title is in the SVG's <title> and the page text around the chart.
        import textwrap

        lines = textwrap.wrap(title, 95)
        title = "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")
        axes.figure.subplots_adjust(top=0.84)
    # An explicit y skips matplotlib measuring every tick label to place the title (a fifth of the drawing time);
    # nothing is drawn above the axes, so the title lands where the automatic placement puts it.
    axes.set_title(title, loc="left", y=1.0)
    axes.set_xlabel(_text(chart.get("x_label")))
    axes.set_ylabel(_text(chart.get("y_label")))
    handles, labels = axes.get_legend_handles_labels()
    if handles and legend_below:
        axes.figure.legend(handles, labels, loc="lower left", ncols=4, bbox_to_anchor=(0.075, 0.01),
                           borderaxespad=0.2, handlelength=1.8, columnspacing=1.6)
    elif handles:
        # "best" tests every drawn point against every corner: fine for aggregates, slow for thousands of points.
        points = sum(min(len(s.get("x") or []), MAX_POINTS_PER_SERIES) for s in series_list)
        axes.legend(loc="best" if points <= 1000 else "upper left")
    return notes


def _logit_share_axis(axes, chart: dict, series_lines: list) -> None:
    """Shares on a logit axis: p50, p90, p99 and p99.9 evenly spaced, so a tail quantile is not squeezed into the
    top pixel of a linear 0–1 axis. The axis runs from 1% to 99% (99.9% when the data reach it, and wider for a
    line drawn outside that), and points at exactly 0 or 1 (the first and last step of an empirical CDF) are
    drawn on the edge instead of at infinity."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    inner = [y for line in series_lines for y in line.get_ydata() if 0 < y < 1]
    lines = [_number(item.get("y")) for item in chart.get("hlines") or [] if isinstance(item, dict)]
    lines = [y for y in lines if y is not None and 0 < y < 1]
    bottom = min([0.01, *lines])
    top = max([0.99, *lines, *(y for y in inner if y <= 0.9999)])
    top = 0.999 if 0.99 < top <= 0.999 else min(top, 0.9999)

    def logit(p):
        return math.log(p / (1 - p))

    def expit(v):
        return 1 / (1 + math.exp(-v))

    pad = 0.05 * (logit(top) - logit(bottom))
    low, high = expit(logit(bottom) - pad), expit(logit(top) + pad)
    for line in series_lines:
        line.set_ydata([min(max(float(y), low), high) for y in line.get_ydata()])
    axes.set_yscale("logit")
    axes.set_ylim(low, high)
    axes.yaxis.set_major_locator(FixedLocator([t for t in LOGIT_TICKS if low <= t <= high]))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{100 * value:g}%"))
    axes.yaxis.set_minor_locator(NullLocator())


def _positive(axes, which: str) -> bool:
    """A log axis needs positive data; with none, stay linear rather than draw an empty chart."""
    low, high = axes.get_xlim() if which == "x" else axes.get_ylim()
    return high > 0


def _wrap_label(label: str, width: int) -> str:
    """Up to two lines of at most `width` characters, broken after _ - / or at spaces; the rest cut with …."""
    tokens = re.findall(r"[^_\-/ ]+[_\-/ ]?|[_\-/ ]", label)
    lines = [""]
    for token in tokens:
        if lines[-1] and len(lines[-1]) + len(token.rstrip()) > width:
            lines.append("")
        lines[-1] += token
    lines = [line.strip() for line in lines if line.strip()]
    text = "\n".join(line[:width] for line in lines[:2])
    return text + ("…" if len(lines) > 2 or any(len(line) > width for line in lines[:2]) else "")


def _plain_log_ticks(axis, limits: tuple[float, float]) -> None:
    """Log ticks as plain numbers (0.01, 0.1, 1, 10): matplotlib's default 10^x labels go through mathtext,
    which is slow and reads worse for seconds. On a short axis (under two decades) the 2× and 5× ticks are
    labelled too, or it would carry one or two labels only."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    axis.set_major_formatter(plain)
    low, high = limits
    if low > 0 and high / low < 100:
        # Minor ticks at 2× and 5× only, labelled: enough to read a short log axis.
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        axis.set_minor_formatter(plain)
    else:
        # Decades are enough on a long axis; every tick object costs drawing time.
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())


def _bars_as_one_path(axes, lefts: list[float], heights: list[float], width: float, colour: str, label: str) -> None:
    """Bars from 0 drawn as one filled path: one SVG element per series instead of one patch per bar (axes.bar
    makes an artist, a transform and a styled <path> for each of up to MAX_POINTS_PER_SERIES bins, which made the
    latency and length histograms the slowest charts to draw and write)."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    vertices: list[tuple[float, float]] = []
    for left, height in zip(lefts, heights):
        vertices += [(left, 0.0), (left, height), (left + width, height), (left + width, 0.0), (left, 0.0)]
    codes = [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY] * len(lefts)
    patch = PathPatch(Path(vertices, codes), facecolor=colour, edgecolor="none", linewidth=0, label=label)
    patch.sticky_edges.y.append(0.0)  # as axes.bar: the value axis starts at 0, with no margin below it
    axes.add_patch(patch)
    axes.autoscale_view()


def _bar_width(xs: list[float]) -> float:
    gaps = [b - a for a, b in zip(xs, xs[1:]) if b > a]
    return 0.8 * min(gaps) if gaps else 0.8


def _time_axis(axes, xs: list[float], relative_clock: bool) -> None:
    """Readable time ticks: +hh:mm:ss on a relative clock, else UTC clock time (with the date when it changes)."""
    from matplotlib.dates import AutoDateLocator, num2date
    from matplotlib.ticker import FuncFormatter

    locator = AutoDateLocator(minticks=4, maxticks=9)
    axes.xaxis.set_major_locator(locator)
    span_days = (max(xs) - min(xs)) if xs else 0.0
    if relative_clock:
        def relative(value, _pos):
            seconds = int(round(value * 86400))
            sign = "-" if seconds < 0 else "+"
            seconds = abs(seconds)
            return f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

        axes.xaxis.set_major_formatter(FuncFormatter(relative))
    else:
        pattern = "%m-%d %H:%M" if span_days > 1 else ("%H:%M:%S" if span_days < 0.01 else "%H:%M")

        def absolute(value, _pos):
            return num2date(value).strftime(pattern)

        axes.xaxis.set_major_formatter(FuncFormatter(absolute))
    for label in axes.get_xticklabels():
        label.set_rotation(0)


def _clean(svg: str, chart_id: str, title: str) -> str:
    """Make matplotlib's SVG safe to inline: no prolog/DTD/metadata, scalable, ids unique within the page."""
    svg = _PROLOG.sub("", svg)
    svg = _METADATA.sub("", svg)
    svg = _SIZE_ATTRS.sub(r'<svg\1 class="chart" role="img"', svg, count=1)
    svg = re.sub(r"(<svg[^>]*>)", lambda m: m.group(1) + f"<title>{html.escape(title[:200])}</title>", svg, count=1)
    prefix = f"{chart_id}-"
    svg = re.sub(r'\sid="', f' id="{prefix}', svg)
    svg = svg.replace("url(#", f"url(#{prefix}").replace('xlink:href="#', f'xlink:href="#{prefix}')
    # Whitespace-only lines between tags cost bytes and nothing else.
    svg = re.sub(r">\s*\n\s*<", "><", svg).strip()
    return svg
