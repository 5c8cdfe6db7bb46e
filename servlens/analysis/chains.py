"""Cause chains: which fired findings caused which, told as one story per chain (issue 20).

Rules stay independent (DESIGN.md, "Windows"): no detector reads another's result. The chain is the report's job,
built here from the document's fired findings — their scope, evidence.windows and evidence.metrics — and the
requests each one is about, read from the store. A link is established from the data, never assumed:

- its two findings are a documented pair (LINKS below, each with the words the report uses for it);
- they are related: the same scope (run, model, deployment), or, for a `fallback` link, the effect's scope answered
  fallbacks of the cause's failed requests (the same trace_id, a different scope, an attempt that ended later);
- their times overlap: the findings' windows, or where a finding has none, the span of its requests;
- they share requests: at least one request the cause is about is (same scope) or led to (fallback) a request the
  effect is about. The number of shared requests is the link's `requests`.

The requests a finding is about (MEMBERS) are what its rule counts: for window findings (TTFT spike, cold start,
readiness, KV pressure) the scope's requests that arrived in the windows; for the others the scope's requests the
rule's condition picks (timeouts at the limit, failed requests, fallbacks answered here, length finishes, context
errors). A chain is a maximal path of links; the requests "through every link" are followed along the path (kept
where a same-scope link intersects, carried to the fallback attempt of the same trace across a fallback link).

The change that breaks a chain first is the root finding's remediation: every later link feeds on the root, so
fixing it stops the rest; its rollback criterion is the root's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

import duckdb

from servlens.analysis.failures import ERROR_CLASS, FAILED
from servlens.analysis.runner import sql_literal


@dataclass(frozen=True)
class Link:
    cause: str        # rule id
    effect: str       # rule id
    relation: str     # "same_scope" or "fallback"
    words: str        # how the report says it: "{cause} caused {effect}"


# The documented causal links, in the order the issue lists the chains.
LINKS: tuple[Link, ...] = (
    Link("SL004", "SL011", "same_scope", "the queue-driven TTFT spike ran requests into the gateway's time limit"),
    Link("SL004", "SL013", "same_scope", "the queue-driven TTFT spike turned into failed requests"),
    Link("SL011", "SL005", "fallback", "the timeouts fell back to a deployment with a different contract"),
    Link("SL013", "SL005", "fallback", "the failed requests fell back to a deployment with a different contract"),
    # Without a fired SL005 the fallbacks themselves (same trace, later attempt elsewhere) carry the link.
    Link("SL011", "SL002", "fallback", "the timeouts fell back to a deployment that cut the answers by length"),
    Link("SL013", "SL002", "fallback", "the failed requests fell back to a deployment that cut the answers by length"),
    Link("SL011", "SL012", "fallback", "the timeouts fell back to a deployment whose context is too small"),
    Link("SL013", "SL012", "fallback", "the failed requests fell back to a deployment whose context is too small"),
    Link("SL005", "SL002", "same_scope", "the fallback's smaller cap cut the answers by length"),
    Link("SL005", "SL012", "same_scope", "the fallback's smaller context rejected the requests"),
    Link("SL009", "SL010", "same_scope", "KV-cache pressure and preemptions slowed every decode step"),
    Link("SL006", "SL013", "same_scope", "the engine was not ready after its restart, so requests failed"),
    Link("SL007", "SL004", "same_scope", "the cold start made the first requests wait for their first token"),
)

# Findings that describe the same step of a chain on the same scope: the first is the chain's link, the others are
# named beside it (`also`) instead of forming a second, duplicate chain.
SAME_STEP = (("SL011", "SL013"),)

_TIMEOUT = f"({FAILED} AND {ERROR_CLASS} = 'timeout')"
# SL005's condition: a failed attempt of the same trace elsewhere ended before this one. It depends only on these
# columns of the request, so it is decided once per distinct value of them among the attempts of failed traces
# (chain_fallbacks) and joined back to the store's rows: a correlated EXISTS over the whole store, once per SL005
# finding and twice in the query, was most of build_chains (8.4 s CPU at 1M rows with four SL005 findings).
_FALLBACK_KEY = ("run", "trace_id", "model", "deployment", "t_end", "attempt")
_FALLBACK_HERE = """(o.model IS DISTINCT FROM r.model OR o.deployment IS DISTINCT FROM r.deployment)
    AND (o.t_end <= r.t_end OR (o.t_end IS NULL OR r.t_end IS NULL) AND o.attempt < r.attempt)"""
_CONTEXT = f"({ERROR_CLASS} = 'context_validation' OR lower(coalesce(finish_reason_raw, '')) LIKE '%context%')"
# rule -> (the condition on a request row `r`, whether the finding's windows bound its requests)
MEMBERS: dict[str, tuple[str, bool]] = {
    "SL004": ("TRUE", True),
    "SL007": ("TRUE", True),
    "SL009": ("TRUE", True),
    "SL006": (FAILED, True),
    "SL010": ("tpot_s IS NOT NULL", False),
    "SL011": (_TIMEOUT, False),   # narrowed to the limit's band when the finding names it
    "SL013": (FAILED, False),
    "SL005": ("fallback_here", False),   # a column of _gather_members' rows (_FALLBACK_HERE)
    "SL002": ("finish_reason = 'length'", False),
    "SL012": (_CONTEXT, False),
}


def _scope_where(scope: dict, alias: str = "r") -> str:
    parts = []
    for key in ("run", "model", "deployment"):
        value = scope.get(key)
        parts.append(f"{alias}.{key} IS NULL" if value is None else f"{alias}.{key} = {sql_literal(value)}")
    return " AND ".join(parts)


def _member_sql(finding: dict) -> str:
    """The finding's condition on a request row `r` of its scope (the scope itself is the join in _gather_members)."""
    condition, windowed = MEMBERS[finding["rule"]]
    metrics = finding["evidence"].get("metrics") or {}
    if finding["rule"] == "SL011" and metrics.get("limit_s") is not None and metrics.get("band_start_s") is not None:
        # The band of durations the timeouts fell in: from the limit up to band_end_s where SL011 names one.
        high = metrics.get("band_end_s") if metrics.get("band_end_s") is not None else metrics["limit_s"]
        condition = f"({FAILED} AND e2e_s BETWEEN {float(metrics['band_start_s'])} AND {float(high)})"
    where = [condition]
    windows = finding["evidence"].get("windows") or []
    if windowed and windows:
        at = "coalesce(r.t_arrival, r.t_first_token, r.t_end)"
        where.append("(" + " OR ".join(
            f"{at} BETWEEN TIMESTAMP {sql_literal(_ts(w['start']))} AND TIMESTAMP {sql_literal(_ts(w['end']))}"
            for w in windows if w.get("start") and w.get("end")) + ")")
    return " AND ".join(where)


def _ts(value: str) -> str:
    return value.replace("T", " ").rstrip("Z")


def _parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(_ts(value)) if value else None


def _finding_key(f: dict) -> tuple:
    s = f["scope"]
    return (f["rule"], s.get("run"), s.get("model"), s.get("deployment"))


def build_chains(con: duckdb.DuckDBPyConnection, findings: list[dict]) -> list[dict]:
    """The document's `chains`: each with `summary`, `window`, `through` and `links` in causal order."""
    nodes = [f for f in findings if f["state"] == "fired" and f["rule"] in MEMBERS]
    if len(nodes) < 2:
        return []
    _gather_members(con, nodes)
    sizes = dict(con.execute("SELECT node, count(*) FROM chain_members GROUP BY node").fetchall())
    spans = {i: _span(f, con, i) for i, f in enumerate(nodes)}
    edges: dict[tuple[int, int], dict] = {}
    for link in LINKS:
        for i, a in enumerate(nodes):
            if a["rule"] != link.cause:
                continue
            for j, b in enumerate(nodes):
                if b["rule"] != link.effect or i == j or not _related(link, a, b):
                    continue
                if not _overlap(spans[i], spans[j]):
                    continue
                shared = _shared(con, link.relation, i, j)
                if shared:
                    edges[(i, j)] = {"link": link, "requests": shared}
                    if link.relation == "fallback":
                        edges[(i, j)]["fallbacks"] = _fallbacks(con, i, b["scope"])
    try:
        return _chains(con, nodes, edges, sizes, spans)
    finally:
        con.execute("DROP TABLE IF EXISTS chain_members")


def _gather_members(con: duckdb.DuckDBPyConnection, nodes: list[dict]) -> None:
    """chain_members: every fired finding's member requests, one row per (finding, request), in one scan.

    A request is read only when it meets the row condition of a fired rule (every finding's condition implies its
    rule's; SL011's band implies failed), then meets only the findings of its own scope (a join on run, model and
    deployment with a small table of the findings' scopes) and is tested against each one's condition alone.
    Testing every request against every finding's condition, scope included, cost 8.4 s CPU at 1M rows for 22
    findings (RESULTS.md stop 19)."""
    con.execute("CREATE OR REPLACE TEMP TABLE chain_members (node INTEGER, source_id INTEGER, source_line BIGINT, "
                "trace_key VARCHAR, t_at TIMESTAMP, t_end TIMESTAMP, attempt INTEGER)")
    rules = {f["rule"] for f in nodes}
    fallbacks = "SL005" in rules
    if fallbacks:
        key = ", ".join(_FALLBACK_KEY)
        con.execute(f"""CREATE OR REPLACE TEMP TABLE chain_fallbacks AS
            WITH failed AS (SELECT {key} FROM requests WHERE trace_id IS NOT NULL AND {FAILED}),
            attempts AS (SELECT DISTINCT {key} FROM requests WHERE trace_id IN (SELECT trace_id FROM failed))
            SELECT r.* FROM attempts r
            WHERE EXISTS (SELECT 1 FROM failed o WHERE o.run = r.run AND o.trace_id = r.trace_id
                          AND {_FALLBACK_HERE})""")
    implied = {"SL011": FAILED, "SL005": "f.run IS NOT NULL"}   # SL011's band and timeouts are failed requests
    prefilter = " OR ".join(f"({c})" for c in sorted({implied.get(rule, MEMBERS[rule][0]) for rule in rules}))
    scopes = ", ".join(f"({i}, " + ", ".join("CAST(NULL AS VARCHAR)" if f["scope"].get(k) is None
                                             else sql_literal(f["scope"][k]) for k in ("run", "model", "deployment"))
                       + ")" for i, f in enumerate(nodes))
    condition = " ".join(f"WHEN {i} THEN {_member_sql(f)}" for i, f in enumerate(nodes))
    joined = ""
    if fallbacks:
        joined = " LEFT JOIN chain_fallbacks f ON " + " AND ".join(f"f.{k} IS NOT DISTINCT FROM r.{k}"
                                                                 for k in _FALLBACK_KEY)
    try:
        con.execute(f"""INSERT INTO chain_members
            WITH scopes(node, scope_run, scope_model, scope_deployment) AS (VALUES {scopes}),
            r AS (SELECT r.*{", f.run IS NOT NULL AS fallback_here" if fallbacks else ""} FROM requests r{joined}
                  WHERE {prefilter})
            SELECT n.node, r.source_id, r.source_line, coalesce(r.trace_id, r.request_id) AS trace_key,
                   coalesce(r.t_arrival, r.t_first_token, r.t_end) AS t_at, r.t_end, r.attempt
            FROM r JOIN scopes n ON r.run IS NOT DISTINCT FROM n.scope_run
                 AND r.model IS NOT DISTINCT FROM n.scope_model AND r.deployment IS NOT DISTINCT FROM n.scope_deployment
            WHERE CASE n.node {condition} END""")
    finally:
        con.execute("DROP TABLE IF EXISTS chain_fallbacks")


def _related(link: Link, a: dict, b: dict) -> bool:
    same = _finding_key(a)[1:] == _finding_key(b)[1:]
    if link.relation == "same_scope":
        return same
    return not same and a["scope"].get("run") == b["scope"].get("run")


def _span(f: dict, con: duckdb.DuckDBPyConnection, node: int) -> tuple[datetime | None, datetime | None]:
    windows = [w for w in f["evidence"].get("windows") or [] if w.get("start") and w.get("end")]
    if windows:
        return min(_parse(w["start"]) for w in windows), max(_parse(w["end"]) for w in windows)
    lo, hi = con.execute(f"SELECT min(t_at), max(coalesce(t_end, t_at)) FROM chain_members WHERE node = {node}").fetchone()
    return lo, hi


def _overlap(a: tuple, b: tuple) -> bool:
    """Windows overlap; a finding without times cannot be placed, so it does not block a link its requests make."""
    if None in a or None in b:
        return True
    return a[0] <= b[1] and b[0] <= a[1]


def _shared(con: duckdb.DuckDBPyConnection, relation: str, i: int, j: int) -> int:
    if relation == "same_scope":
        sql = f"""SELECT count(*) FROM (SELECT source_id, source_line FROM chain_members WHERE node = {i}
                  INTERSECT SELECT source_id, source_line FROM chain_members WHERE node = {j})"""
    else:
        # The effect's requests that are later attempts of a trace whose cause request ended before them.
        sql = f"""SELECT count(DISTINCT (b.source_id, b.source_line)) FROM chain_members b JOIN chain_members a
                  ON a.node = {i} AND b.node = {j} AND a.trace_key = b.trace_key
                  AND (a.t_end <= b.t_end OR ((a.t_end IS NULL OR b.t_end IS NULL) AND a.attempt < b.attempt))"""
    return int(con.execute(sql).fetchone()[0])


def _fallbacks(con: duckdb.DuckDBPyConnection, i: int, scope: dict) -> int:
    """Every attempt in `scope` that is a later attempt of a trace of the cause's requests: the fallbacks the
    link went through, whatever became of them."""
    return int(con.execute(f"""
        SELECT count(DISTINCT (r.source_id, r.source_line)) FROM requests r JOIN chain_members a
        ON a.node = {i} AND coalesce(r.trace_id, r.request_id) = a.trace_key
        AND (a.t_end <= r.t_end OR ((a.t_end IS NULL OR r.t_end IS NULL) AND a.attempt < r.attempt))
        WHERE {_scope_where(scope)}""").fetchone()[0])


def _paths(edges: dict, count: int) -> list[list[int]]:
    out_edges: dict[int, list[int]] = {}
    has_in = set()
    for a, b in edges:
        out_edges.setdefault(a, []).append(b)
        has_in.add(b)
    paths = []

    def walk(path: list[int]) -> None:
        nexts = [n for n in out_edges.get(path[-1], []) if n not in path]
        if not nexts:
            paths.append(path)
        for n in nexts:
            walk(path + [n])

    for start in range(count):
        if start in out_edges and start not in has_in:
            walk([start])
    return paths


def _chains(con, nodes: list[dict], edges: dict, sizes: dict, spans: dict) -> list[dict]:
    paths = _paths(edges, len(nodes))
    # A path inside a longer one (the shortcut past a fired SL005) is not a chain of its own.
    paths = [p for p in paths if not any(set(p) < set(o) for o in paths)]
    # Two paths that differ only by findings of the same step on the same scope: keep the first-named rule.
    step_of = {r: group[0] for group in SAME_STEP for r in group}
    preference = {r: k for group in SAME_STEP for k, r in enumerate(group)}
    best: dict[tuple, list[int]] = {}
    for p in paths:
        key = tuple((step_of.get(nodes[n]["rule"], nodes[n]["rule"]),) + _finding_key(nodes[n])[1:] for n in p)
        rank = sum(preference.get(nodes[n]["rule"], 0) for n in p)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, p)
    chains = []
    for _, path in best.values():
        chains.append(_chain(con, nodes, path, edges, sizes, spans))
    chains.sort(key=lambda c: (-len(c["links"]), -(c["through"] or 0)))
    return chains


def _through(con, path: list[int], edges: dict) -> int:
    """The requests that went through every link: followed along the path in the store."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE chain_through AS SELECT * FROM chain_members WHERE node = {path[0]}")
    for a, b in pairwise(path):
        if edges[(a, b)]["link"].relation == "same_scope":
            con.execute(f"""CREATE OR REPLACE TEMP TABLE chain_through AS SELECT m.* FROM chain_members m
                            WHERE m.node = {b} AND (m.source_id, m.source_line) IN
                                  (SELECT (source_id, source_line) FROM chain_through)""")
        else:
            con.execute(f"""CREATE OR REPLACE TEMP TABLE chain_through AS SELECT DISTINCT m.* FROM chain_members m
                            JOIN chain_through c ON m.node = {b} AND m.trace_key = c.trace_key
                            AND (c.t_end <= m.t_end OR ((c.t_end IS NULL OR m.t_end IS NULL) AND c.attempt < m.attempt))""")
    n = int(con.execute("SELECT count(*) FROM chain_through").fetchone()[0])
    con.execute("DROP TABLE chain_through")
    return n


def _where(scope: dict) -> str:
    """The model; with its deployment when the link's `named` says two scopes of the chain share the model."""
    name = scope.get("model") or scope.get("deployment") or scope.get("run") or "the run"
    if scope.get("_shared_model") and scope.get("deployment"):
        name += f" ({scope['deployment']})"
    return name


def _chain(con, nodes: list[dict], path: list[int], edges: dict, sizes: dict, spans: dict) -> dict:
    links = []
    for k, n in enumerate(path):
        f = nodes[n]
        link: dict[str, Any] = {"rule": f["rule"], "title": f["title"], "scope": f["scope"],
                                "requests": sizes.get(n, 0), "severity": f["severity"],
                                "windows": f["evidence"].get("windows") or []}
        if k:
            edge = edges[(path[k - 1], n)]
            link |= {"relation": edge["link"].relation, "because": edge["link"].words,
                     "shared_with_cause": edge["requests"]}
            if "fallbacks" in edge:
                link["fallbacks"] = edge["fallbacks"]
        also = [o["rule"] for o in nodes if o is not f and o["state"] == "fired"
                and _finding_key(o)[1:] == _finding_key(f)[1:]
                and any(f["rule"] == g[0] and o["rule"] in g[1:] for g in SAME_STEP)]
        if also:
            link["also"] = also
        links.append(link)
    through = _through(con, path, edges)
    starts = [spans[n][0] for n in path if spans[n][0] is not None]
    ends = [spans[n][1] for n in path if spans[n][1] is not None]
    window = {"start": _iso(min(starts)), "end": _iso(max(ends))} if starts and ends else None
    root = nodes[path[0]]
    chain = {"links": links, "through": through, "window": window,
             "break_first": {"rule": root["rule"], "scope": root["scope"], "change": root.get("remediation") or "",
                             "rollback": root.get("rollback") or ""}}
    chain["summary"] = chain_summary(chain, {n_: nodes[n_] for n_ in path})
    return chain


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds") + "Z"


def _phrase(link: dict, metrics: dict, shared_model: bool = False) -> str:
    """A link in plain words with its numbers."""
    n, where, rule = link["requests"], _where(link["scope"] | {"_shared_model": shared_model}), link["rule"]
    if rule == "SL004":
        return f"a queue-driven TTFT spike on {where} ({n} requests arrived in it)"
    if rule == "SL007":
        return f"a cold start of {where} ({n} requests in its cold period)"
    if rule == "SL006":
        return f"{where} not ready after a restart ({n} requests failed in that period)"
    if rule == "SL009":
        pre = metrics.get("preemptions")
        return f"KV-cache pressure on {where}" + (f" with {pre:g} preemptions" if pre else "") + f" ({n} requests)"
    if rule == "SL010":
        return f"TPOT saturation on {where} ({n} requests decoded slower as concurrency grew)"
    if rule == "SL011":
        limit = metrics.get("limit_s")
        return f"{n} timeouts on {where}" + (f" at the gateway's {limit:.2f} s limit" if limit else " at the gateway limit")
    if rule == "SL013":
        top = metrics.get("top_class")
        return f"{n} failed requests on {where}" + (f" (mostly {top.replace('_', ' ')})" if top else "")
    if rule == "SL005":
        problem = metrics.get("problem")
        return f"{n} fallbacks answered by {where}" + (f" ({problem})" if problem else "")
    if rule == "SL002":
        cap = metrics.get("enforced_cap")
        return f"{n} answers cut by length on {where}" + (f" at a {cap:g}-token cap" if cap else "")
    if rule == "SL012":
        return f"{n} context errors on {where}"
    return f"{link['title']} on {where} ({n} requests)"


def chain_summary(chain: dict, nodes_by_path: dict[int, dict] | None = None) -> str:
    """One paragraph: the links with their numbers and reasons, the window, the requests through every link, and
    the change that breaks the chain first with its rollback criterion."""
    metrics = [((f["evidence"].get("metrics") or {}) if f else {}) for f in (nodes_by_path or {}).values()]
    metrics += [{}] * (len(chain["links"]) - len(metrics))
    scopes = {(link["scope"].get("model"), link["scope"].get("deployment")) for link in chain["links"]}
    models = [model for model, _ in scopes]
    parts = []
    for k, (link, m) in enumerate(zip(chain["links"], metrics)):
        shared_model = models.count(link["scope"].get("model")) > 1
        phrase = _phrase(link, m, shared_model)
        if link.get("also"):
            phrase += f" (also {', '.join(link['also'])})"
        if link.get("fallbacks") is not None and link["rule"] != "SL005":
            # No fallback finding between them: the fallbacks are a step of their own, counted from the traces.
            parts.append(f"{link['fallbacks']} fell back to {_where(link['scope'] | {'_shared_model': shared_model})}")
        parts.append(phrase if not k else f"{phrase}, because {link['because']} ({link['shared_with_cause']} shared)")
    text = " → ".join(parts) + "."
    if chain.get("window"):
        text += f" From {chain['window']['start']} to {chain['window']['end']}"
        text += f"; {chain['through']} requests went through every link."
    else:
        text += f" {chain['through']} requests went through every link."
    brk = chain["break_first"]
    if brk.get("change"):
        text += f" Break it first at {brk['rule']}: {brk['change'].rstrip('.')}."
    if brk.get("rollback"):
        text += f" Rollback criterion: {brk['rollback'].rstrip('.')}."
    return text


def chained_findings(chains: list[dict]) -> set[tuple]:
    """(rule, run, model, deployment) of every finding that is a link of a chain: the report lists the others after."""
    return {(link["rule"], link["scope"].get("run"), link["scope"].get("model"), link["scope"].get("deployment"))
            for chain in chains for link in chain["links"]}
