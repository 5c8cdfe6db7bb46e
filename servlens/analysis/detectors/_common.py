"""Small helpers the built-in detectors share: SQL snippets, number formatting, chart and table shapes."""

from __future__ import annotations

from typing import Any


def q(expr: str, quantile: float) -> str:
    """The standard ordered-set percentile (DuckDB, Trino, Spark and ClickHouse all have a counterpart)."""
    return f"percentile_cont({quantile}) WITHIN GROUP (ORDER BY {expr})"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator in (None, 0):
        return None
    return float(numerator) / float(denominator)


def pct(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def secs(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def rounded(value: Any, digits: int = 4) -> Any:
    return round(float(value), digits) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def chart(kind: str, title: str, x_label: str, y_label: str, series: list[dict], *, x_time: bool = False,
          x_log: bool = False, y_log: bool = False, hlines: list[dict] | None = None,
          vspans: list[dict] | None = None) -> dict:
    """A CHART dict exactly as docs/CONTRIBUTING.md defines it."""
    return {
        "type": kind, "title": title, "x_label": x_label, "y_label": y_label, "x_time": x_time,
        "x_log": x_log, "y_log": y_log, "series": series, "hlines": hlines or [], "vspans": vspans or [],
    }


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": [[rounded(v) for v in row] for row in rows]}


def not_evaluable(reason: str, summary: str, evidence: dict | None = None) -> dict:
    return {"state": "not_evaluable", "reason": reason, "summary": summary, "evidence": evidence or {}}
