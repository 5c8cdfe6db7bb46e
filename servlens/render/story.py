"""The story the analyze report leads with (issue 20): the cause chains and the goodput section, as plain pieces
the text, Markdown and HTML renderers share. The words are made in servlens/analysis/chains.py and goodput.py
(each chain's `summary`, the goodput `summary`); this module only picks and lays them out."""

from __future__ import annotations

from typing import Any

from servlens.documents import AnalyzeDocument, Chain, Finding, Goodput


def chains(doc: AnalyzeDocument) -> list[Chain]:
    return doc["chains"]


def chain_keys(doc: AnalyzeDocument) -> dict[tuple, int]:
    """(rule, run, model, deployment) -> the number of the first chain it is a link of."""
    keys: dict[tuple, int] = {}
    for number, chain in enumerate(chains(doc), start=1):
        for link in chain["links"]:
            scope = link["scope"]
            keys.setdefault((link["rule"], scope["run"], scope["model"], scope["deployment"]), number)
    return keys


def chain_of(finding: Finding, keys: dict[tuple, int]) -> int | None:
    scope = finding["scope"]
    return keys.get((finding["rule"], scope["run"], scope["model"], scope["deployment"]))


def link_rows(chain: Chain) -> list[list[Any]]:
    """One row per link in causal order: step, rule, scope, requests, shared with the cause, why (the first link
    is the root: it has no cause)."""
    rows = []
    for step, link in enumerate(chain["links"], start=1):
        scope = link["scope"]
        where = " / ".join(str(v) for v in (scope["model"], scope["deployment"]) if v) or scope["run"]
        rows.append([step, link["rule"], where, link["requests"], link.get("shared_with_cause"),
                     link.get("because", "root")])
    return rows


LINK_COLUMNS = ["step", "rule", "scope", "requests", "shared with the cause", "because"]
CAPACITY_COLUMNS = ["in flight", "requests", "TTFT p99 (s)", "TPOT p99 (s)", "TTFT met", "TPOT met", "both met"]


def goodput(doc: AnalyzeDocument) -> Goodput | None:
    """The goodput section when it has something to say (runs with request logs)."""
    return doc["goodput"] if "summary" in doc["goodput"] else None


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
