"""The story the analyze report leads with (issue 20): the cause chains and the goodput section, as plain pieces
the text, Markdown and HTML renderers share. The words are made in servlens/analysis/chains.py and goodput.py
(each chain's `summary`, the goodput `summary`); this module only picks and lays them out."""

from __future__ import annotations

from typing import Any


def chains(doc: dict) -> list[dict]:
    return [c for c in doc.get("chains") or [] if isinstance(c, dict) and c.get("summary")]


def chain_keys(doc: dict) -> dict[tuple, int]:
    """(rule, run, model, deployment) -> the number of the first chain it is a link of."""
    keys: dict[tuple, int] = {}
    for number, chain in enumerate(chains(doc), start=1):
        for link in chain.get("links") or []:
            scope = link.get("scope") or {}
            keys.setdefault((link.get("rule"), scope.get("run"), scope.get("model"), scope.get("deployment")), number)
    return keys


def chain_of(finding: dict, keys: dict[tuple, int]) -> int | None:
    scope = finding.get("scope") or {}
    return keys.get((finding.get("rule"), scope.get("run"), scope.get("model"), scope.get("deployment")))


def link_rows(chain: dict) -> list[list[Any]]:
    """One row per link in causal order: step, rule, scope, requests, shared with the cause, why."""
    rows = []
    for step, link in enumerate(chain.get("links") or [], start=1):
        scope = link.get("scope") or {}
        where = " / ".join(str(v) for v in (scope.get("model"), scope.get("deployment")) if v) or str(scope.get("run"))
        rows.append([step, link.get("rule"), where, link.get("requests"), link.get("shared_with_cause"),
                     link.get("because") or "root"])
    return rows


LINK_COLUMNS = ["step", "rule", "scope", "requests", "shared with the cause", "because"]
CAPACITY_COLUMNS = ["in flight", "requests", "TTFT p99 (s)", "TPOT p99 (s)", "TTFT met", "TPOT met", "both met"]


def goodput(doc: dict) -> dict | None:
    g = doc.get("goodput")
    return g if isinstance(g, dict) and g.get("summary") else None


def capacity_rows(scope: dict) -> list[list[Any]]:
    rows = []
    for lv in scope.get("levels") or []:
        span = (f"{lv['in_flight_from']}" if lv.get("in_flight_from") == lv.get("in_flight")
                else f"{lv.get('in_flight_from')}-{lv.get('in_flight')}")
        rows.append([span, lv.get("requests"), lv.get("ttft_p99_s"), lv.get("tpot_p99_s"),
                     _share(lv, "ttft"), _share(lv, "tpot"), _share(lv, "both")])
    return rows


def _share(level: dict, target: str) -> str:
    share, judged = level.get(f"{target}_share"), level.get(f"{target}_judged")
    return "—" if share is None else f"{100 * share:.0f}% of {judged}"


def scope_name(scope: dict) -> str:
    return " / ".join(str(v) for v in (scope.get("model"), scope.get("deployment")) if v) or str(scope.get("run"))
