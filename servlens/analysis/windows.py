"""Time windows for per-window percentiles (DESIGN.md Decisions, "Windows").

A spike must not be averaged away, so latency percentiles are computed per window, not over the whole run:

- the width adapts to the data: about 30-60 windows per run (at most 75), never under 1 s, at most 1 min, on a step people read
  easily (1, 2, 5, 10, 15, 20, 30, 60 s);
- the peak window is 30 min, or a quarter of the span when the run is shorter (never shorter than one window).

Windows are cut from the scope's first request (`t_at`, see runner.SCOPE_REQUESTS_SQL) so that window 0 is the start
of the data: a burst there is a cold start and is named as such. The SQL here is plain (date_diff, floor,
percentile_cont ... WITHIN GROUP), so a transpiler can carry it to Trino, Spark or ClickHouse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH_STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60)
MIN_WINDOWS = 30
PEAK_WINDOW_S = 30 * 60


@dataclass(frozen=True)
class WindowSpec:
    t0: datetime          # the scope's first request
    t1: datetime          # its last request
    width_s: float        # one window
    peak_s: float         # the peak window's length

    @property
    def span_s(self) -> float:
        return (self.t1 - self.t0).total_seconds()

    @property
    def count(self) -> int:
        return max(1, math.floor(self.span_s / self.width_s) + 1)

    def offset_sql(self, column: str = "t_at") -> str:
        """Seconds from the scope's first request to `column`, as portable SQL."""
        return f"(date_diff('microsecond', TIMESTAMP '{self.t0.isoformat(sep=' ')}', {column}) / 1e6)"

    def index_sql(self, column: str = "t_at") -> str:
        """The window number of `column` (0 = the first window)."""
        return f"CAST(floor({self.offset_sql(column)} / {self.width_s}) AS INTEGER)"

    def start(self, index: int) -> datetime:
        return self.t0 + timedelta(seconds=index * self.width_s)

    def bounds(self, first: int, last: int | None = None) -> dict:
        """{"start", "end"} ISO-8601 strings covering windows first..last."""
        last = first if last is None else last
        return {"start": iso(self.start(first)), "end": iso(self.start(last + 1))}


def window_width(span_s: float) -> float:
    """The widest readable step (1 s .. 60 s) that still cuts the span into at least MIN_WINDOWS windows.

    That gives 30-75 windows for spans of 30 s to an hour (steps grow by at most 2.5x), 1 s windows for shorter
    runs, and 1 min windows (more than 60 of them) for longer ones.
    """
    fitting = [step for step in WIDTH_STEPS_S if span_s / step >= MIN_WINDOWS]
    return float(fitting[-1] if fitting else WIDTH_STEPS_S[0])


def peak_length(span_s: float, width_s: float) -> float:
    """30 minutes, or a quarter of the span when the run is shorter, but never less than one window."""
    return max(width_s, min(PEAK_WINDOW_S, span_s / 4))


def spec_for(t0: datetime, t1: datetime) -> WindowSpec:
    span = max(0.0, (t1 - t0).total_seconds())
    width = window_width(span)
    return WindowSpec(t0, t1, width, peak_length(span, width))


def iso(moment: datetime | None) -> str | None:
    """UTC ISO-8601 with a Z, the form every result document uses."""
    if moment is None:
        return None
    text = moment.isoformat(timespec="milliseconds")
    return text + "Z" if moment.tzinfo is None else text


def merge_runs(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive window numbers as (first, last) runs: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    runs: list[tuple[int, int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs
