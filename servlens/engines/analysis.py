"""`servlens analyze --engine URL --table T`: the rules run where the data is.

- `--engine duckdb --table parquet:DIR` (or no --engine): DuckDB reads the export in place as a store (views over
  the Parquet files, the runs and sources from the export's manifest), and the whole analysis runs as on the store:
  every rule, the workload profile, chains and goodput. This is the reference the other engines are held to.
- any other engine: the scope views become CTEs of each query (or scratch tables of the engine's session), every
  rule's SQL goes through servlens' function map, and only aggregates come back. A Python detector runs here too:
  its queries go through the same connection adapter (EngineConnection), so they run on the engine like a SQL rule's.
  A rule whose SQL the engine refuses is *not evaluable* there, with the engine's words; it is never skipped
  silently. A rule's `engines` key says where its parity with DuckDB is tested (`servlens rules list`). The
  runner's own finishing (requirements, states, severities, thresholds) is the same code for every engine.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from servlens.analysis.goodput import MIN_LEVEL_REQUESTS, OBJECTIVE
from servlens.analysis.rules import Rule, validate_params
from servlens.analysis.runner import (
    EVIDENCE_COLUMNS,
    SCHEMA_VERSION,
    Scope,
    evaluate,
    missing_reason,
    sort_findings,
    sql_literal,
)
from servlens.engines.base import Engine, EngineError
from servlens.errors import ConfigError
from servlens.store.metric_roles import ROLE_JOIN_SQL
from servlens.store.runs import select_runs

_PARAM = re.compile(r"\$([a-z][a-z0-9_]*)")


def _literal_rows(columns: list[tuple[str, str]], rows: list[list]) -> str:
    """Rows as portable SQL (a UNION ALL of literal SELECTs; typed and empty when there are none)."""
    if not rows:
        return "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in columns) + " WHERE 1 = 0"
    return " UNION ALL ".join(
        "SELECT " + ", ".join(f"CAST({_value_literal(v)} AS {t}) AS {c}" for (c, t), v in zip(columns, row))
        for row in rows)


def _value_literal(value: Any) -> str:
    if isinstance(value, datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, float) and not math.isfinite(value):
        return "NULL"  # NaN / inf print as no value in a servlens document anyway
    return sql_literal(value)


def _typed_literal(value: Any, type_name: str | None, dialect: str) -> str:
    """A fetched value as a literal of the type the engine gave it: an untyped NULL is Spark's NullType, which
    FILTER (WHERE ...) and arithmetic refuse. ClickHouse has no NULL array (an array is [] or a value), so there a
    NULL list stays a bare NULL."""
    literal = _value_literal(value)
    if type_name is None or (literal == "NULL" and type_name.endswith("[]") and dialect == "clickhouse"):
        return literal
    return f"CAST({literal} AS {type_name})"


def _metric_roles_sql() -> str:
    from servlens.store.metric_roles import table_rows

    return _literal_rows([("role", "VARCHAR"), ("engine", "VARCHAR"), ("name", "VARCHAR"), ("kind", "VARCHAR"),
                          ("pull_group", "VARCHAR"), ("preference", "INTEGER"), ("label_key", "VARCHAR"),
                          ("label_value", "VARCHAR")], table_rows())


def _format_columns_sql() -> str:
    """The store's format_columns table (servlens/store/format_columns.py) as literal rows."""
    from servlens.store.format_columns import format_column_rows

    return _literal_rows([("format", "VARCHAR"), ("column_name", "VARCHAR")],
                         [list(row) for row in format_column_rows()])


_DIGITS = " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10))


def _windows_sql(spec) -> str:
    """scope_windows (runner.SCOPE_WINDOWS_SQL) without DuckDB's range(): window numbers from a digits cross join
    (up to 10,000 windows), bounds as seconds after the first request."""
    if spec is None:
        return ("SELECT CAST(NULL AS INTEGER) AS t_window, CAST(NULL AS TIMESTAMP) AS w_start, "
                "CAST(NULL AS TIMESTAMP) AS w_end, CAST(NULL AS DOUBLE) AS width_s, CAST(NULL AS BOOLEAN) AS is_first "
                "WHERE 1 = 0")
    t0 = spec.t0.isoformat(sep=" ")
    width_us = round(spec.width_s * 1e6)
    # the window number widened before it is multiplied: 36 one-minute windows are past 2^31 µs (a day's 1,440
    # made Spark refuse SL013 with an overflow)
    return (f"SELECT CAST(i AS INTEGER) AS t_window, "
            f"TIMESTAMP '{t0}' + to_microseconds(CAST(i AS BIGINT) * {width_us}) AS w_start, "
            f"TIMESTAMP '{t0}' + to_microseconds((CAST(i AS BIGINT) + 1) * {width_us}) AS w_end, "
            f"CAST({spec.width_s} AS DOUBLE) AS width_s, i = 0 AS is_first "
            f"FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS i FROM ({_DIGITS}) a CROSS JOIN ({_DIGITS}) b "
            f"CROSS JOIN ({_DIGITS}) c CROSS JOIN ({_DIGITS}) e) digits WHERE i < {spec.count}")


def _eq(column: str, value: Any) -> str:
    return f"{column} IS NULL" if value is None else f"{column} = {sql_literal(value)}"


def _scope_where(scope: Scope) -> str:
    return " AND ".join([_eq("run", scope.run), _eq("model", scope.model), _eq("deployment", scope.deployment)])


# The store's `runs` and `sources` tables as the export's manifest holds them (servlens/store/schema.py): rules read
# them (a source's format, a run's clock) as they read them in the store.
_RUN_COLUMNS = [("run", "VARCHAR"), ("relative_clock", "BOOLEAN"), ("tz", "VARCHAR")]
_SOURCE_COLUMNS = [("source_id", "INTEGER"), ("run", "VARCHAR"), ("kind", "VARCHAR"), ("path", "VARCHAR"),
                   ("format", "VARCHAR"), ("rows", "BIGINT"), ("bad_lines", "BIGINT")]


def manifest_views(manifest: dict | None) -> dict[str, str]:
    """The store's `runs` and `sources` tables as portable SQL, from an export's manifest."""
    runs = (manifest or {}).get("runs", {})
    return {
        "runs": _literal_rows(_RUN_COLUMNS, [[run, bool(meta.get("relative_clock")), meta.get("tz")]
                                             for run, meta in runs.items()]),
        "sources": _literal_rows(_SOURCE_COLUMNS, [[src.get(c) if c != "run" else run for c, _ in _SOURCE_COLUMNS]
                                                   for run, meta in runs.items() for src in meta.get("sources", [])]),
    }


def scope_views(scope: Scope, spec=None, manifest: dict | None = None) -> dict[str, str]:
    """The runner's scope views (servlens/analysis/runner.py) as portable SQL, for one scope; `spec` is its window
    layout (None: no request has a time), `manifest` the export's runs and source files."""
    from servlens.analysis.runner import T_AT

    where = _scope_where(scope)
    t_window = spec.index_sql(T_AT) if spec else "CAST(NULL AS INTEGER)"
    model_match = "TRUE" if scope.model is None else (
        f"(labels['model_name'] IS NULL OR labels['model_name'] = {sql_literal(scope.model)})")
    metric_where = f"{_eq('run', scope.run)} AND {model_match}"
    return {
        "scope_requests": f"SELECT *, {T_AT} AS t_at, {t_window} AS t_window FROM requests WHERE {where}",
        "scope_windows": _windows_sql(spec),
        "scope_metrics": f"SELECT * FROM metric_samples WHERE {metric_where}",
        "metric_roles": _metric_roles_sql(),
        "format_columns": _format_columns_sql(),
        "scope_role_samples": "SELECT m.*, r.role, r.engine, r.preference FROM scope_metrics m "
                              f"JOIN metric_roles r ON {ROLE_JOIN_SQL}",
        **manifest_views(manifest),
        # The store's metric_counter_increases (a drop is a restart: the new value is the increase), per series;
        # the labels are the series key as text because Spark cannot partition by a MAP; the same total order.
        "scope_counter_increases": f"""
            SELECT run, name, series, labels, prev_ts, ts, date_diff('microsecond', prev_ts, ts) / 1e6 AS interval_s,
                   value, CASE WHEN value < prev_value THEN value ELSE value - prev_value END AS increase,
                   coalesce(value < prev_value, false) AS is_reset
            FROM (SELECT *, lag(value) OVER w AS prev_value, lag(ts) OVER w AS prev_ts
                  FROM (SELECT *, CAST(labels AS VARCHAR) AS series_key FROM metric_samples
                        WHERE {metric_where} AND ((type = 'counter' AND series = 'value')
                              OR (type IN ('histogram', 'summary') AND series IN ('sum', 'count'))))
                  WINDOW w AS (PARTITION BY run, name, series, le, series_key ORDER BY ts, source_id, value))
            WHERE prev_value IS NOT NULL""",
    }


class _Cursor:
    def __init__(self, rows: list[dict], columns: list[str] | None = None):
        self._rows = rows
        self.description = [(name,) for name in (rows[0] if rows else (columns or []))]

    def fetchall(self) -> list[tuple]:
        return [tuple(r.values()) for r in self._rows]

    def fetchone(self) -> tuple | None:
        return tuple(self._rows[0].values()) if self._rows else None


_TEMP = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?TEMP(?:ORARY)?\s+(VIEW|TABLE)\s+(\w+)\s+AS\s+(.*)$",
                   re.IGNORECASE | re.DOTALL)
_DROP = re.compile(r"^\s*DROP\s+(?:VIEW|TABLE)\s+(?:IF\s+EXISTS\s+)?(\w+)\s*;?\s*$", re.IGNORECASE)


# The temp tables computed once and read back as literal rows: the detector's one metrics row (the decide
# predicates and the evidence read it, and it must not change between them).
MATERIALISED = {"rule_metrics"}
# The scope views computed once per scope into the engine's scratch tables, where it has them (Engine.materialise).
MATERIALISED_SCOPE_VIEWS = ("scope_requests", "scope_metrics", "scope_counter_increases")


def with_parameters(sql: str, params: dict | list | None) -> str:
    """`sql` with its $name (dict) or ? (list) parameters as SQL literals."""
    if isinstance(params, dict) and params:
        return _PARAM.sub(lambda m: sql_literal(params[m.group(1)]) if m.group(1) in params else m.group(0), sql)
    if params:
        values = iter(params)
        return re.sub(r"\?", lambda m: sql_literal(next(values)), sql)
    return sql


class EngineConnection:
    """What servlens' SQL paths need of a DuckDB connection, answered by an engine: `execute(sql, params)` with
    $name (dict) or ? (list) parameters substituted as SQL literals, the current views as CTEs, and
    `CREATE TEMP VIEW x AS ...` kept as one more such view (nothing is created on the engine)."""

    max_rows: int | None = None  # the engine's own cap (MAX_RESULT_ROWS) unless a connection needs another

    def __init__(self, engine: Engine):
        self.engine = engine
        self.views: dict[str, str] = {}

    def execute(self, sql: str, params: dict | list | None = None) -> _Cursor:
        sql = with_parameters(sql, params)
        dropped = _DROP.match(sql)
        if dropped:
            self.views.pop(dropped.group(1), None)
            return _Cursor([])
        created = _TEMP.match(sql)
        if created:
            kind, name, body = created.group(1).upper(), created.group(2), created.group(3).strip().rstrip(";")
            if kind == "VIEW" or name not in MATERIALISED:
                # A rule's [views] (temp tables on DuckDB): their rows are per request and stay on the engine, in
                # a scratch table of its session where it has one, else as a CTE of each query.
                self.views[name] = self.engine.materialise(name, body, self.views) or body
            else:  # the rule's metrics row: computed once, then a literal row the engine reads
                rows = self.engine.query(body, views=self.views)
                columns = list(rows[0]) if rows else []
                types = dict(self.engine.last_types)
                self.views[name] = (" UNION ALL ".join(
                    "SELECT " + ", ".join(f"{_typed_literal(row[c], types.get(c), self.engine.dialect)} AS \"{c}\""
                                          for c in columns) for row in rows)
                    if rows else "SELECT NULL AS none WHERE 1 = 0")
            return _Cursor([])
        rows = self.engine.query(sql, views=self.views, max_rows=self.max_rows)
        if len(rows) == 1 and list(rows[0]) == ["decided"] and rows[0]["decided"] in (0, 1):
            rows = [{"decided": bool(rows[0]["decided"])}]  # ClickHouse answers a predicate with 0/1
        return _Cursor(rows, self.engine.last_columns)


def _window_spec(engine: Engine, scope: Scope):
    """The scope's window layout (runner.set_scope_views cuts the same one), None when no request has a time."""
    from servlens.analysis.runner import T_AT
    from servlens.analysis.windows import spec_for

    row = engine.query(f"SELECT min({T_AT}) AS t0, max({T_AT}) AS t1 FROM requests WHERE {_scope_where(scope)}")[0]
    return spec_for(row["t0"], row["t1"]) if row["t0"] is not None else None


def _present(conn: EngineConnection) -> tuple[set[str], set[str]]:
    counts = ", ".join(f"count({c}) AS {c}" for c in EVIDENCE_COLUMNS)
    row = conn.engine.query(f"SELECT {counts} FROM scope_requests", views=conn.views)[0]
    columns = {c for c in EVIDENCE_COLUMNS if row.get(c)}
    metrics = {r["name"] for r in conn.engine.query("SELECT DISTINCT name FROM scope_metrics WHERE name IS NOT NULL",
                                                    views=conn.views)}
    return columns, metrics


def _scopes(engine: Engine, runs: list[str]) -> list[Scope]:
    run_list = ", ".join(sql_literal(r) for r in runs)
    scopes = [Scope(r["run"], r["model"], r["deployment"]) for r in engine.query(
        f"SELECT DISTINCT run, model, deployment FROM requests WHERE run IN ({run_list}) "
        "ORDER BY run, model NULLS LAST, deployment NULLS LAST")]
    with_requests = {s.run for s in scopes}
    for run in runs:
        if run not in with_requests:  # a run with metrics only: one scope per model_name label (or one)
            models = [r["m"] for r in engine.query(
                f"SELECT DISTINCT labels['model_name'] AS m FROM metric_samples WHERE run = {sql_literal(run)} "
                "ORDER BY m NULLS LAST")]
            named = [m for m in models if m is not None]
            scopes += [Scope(run, m, None) for m in (named or [None])]
    return scopes


def engine_coverage(engine: Engine, runs: list[str]) -> dict:
    """The document's coverage, from aggregates on the engine (the sources from an export's manifest)."""
    run_list = ", ".join(sql_literal(r) for r in runs)
    span = engine.one(f"""SELECT count(*) AS n, min(coalesce(t_arrival, t_first_token, t_end)) AS t0,
                                 max(coalesce(t_end, t_first_token, t_arrival)) AS t1
                          FROM requests WHERE run IN ({run_list})""")
    if span["t0"] is None:
        span |= engine.one(f"SELECT min(ts) AS t0, max(ts) AS t1 FROM metric_samples WHERE run IN ({run_list})")
    counts = engine.one("SELECT " + ", ".join(f"count({c}) AS {c}" for c in EVIDENCE_COLUMNS)
                        + f" FROM requests WHERE run IN ({run_list})")
    models = [r["model"] for r in engine.query(
        f"SELECT DISTINCT model FROM requests WHERE run IN ({run_list}) AND model IS NOT NULL ORDER BY model")]
    metrics = [r["name"] for r in engine.query(
        f"SELECT DISTINCT name FROM metric_samples WHERE run IN ({run_list}) AND name IS NOT NULL ORDER BY name")]
    manifest = engine_manifest(engine)
    sources = [{"path": s["path"], "format": s["format"], "kind": s["kind"], "rows": s["rows"],
                "bad_lines": s["bad_lines"]}
               for run in runs for s in manifest.get("runs", {}).get(run, {}).get("sources", [])]
    relative = any(manifest.get("runs", {}).get(run, {}).get("relative_clock") for run in runs)
    from servlens.analysis.windows import iso

    return {"sources": sources, "runs": runs, "requests": int(span["n"]),
            "time_span": {"start": iso(span["t0"]), "end": iso(span["t1"]), "relative_clock": relative},
            "models": models, "columns_present": [c for c in EVIDENCE_COLUMNS if counts.get(c)],
            "metrics_present": metrics}


def engine_manifest(engine: Engine) -> dict:
    if engine.source is not None and engine.source.kind == "parquet":
        from servlens.store.export import read_manifest

        return read_manifest(engine.source.location)
    return {}


def analyze_on_engine(engine: Engine, rules: list[Rule], runs: list[str] | None = None,
                      overrides: dict[str, dict[str, Any]] | None = None, slo: dict | None = None) -> dict:
    """The analyze document, every query on `engine` (not DuckDB: see duckdb_store_analysis for that)."""
    from servlens import __version__

    runs = select_runs(engine.runs(), runs, f"{engine.name}'s tables",
                       (f"{engine.name}'s tables hold no requests and no metrics to analyse",
                        "Check --table, or export a store with 'servlens export'"))
    params = {rule.id: validate_params(rule, (overrides or {}).get(rule.id, {}), "--set") for rule in rules}
    cover = engine_coverage(engine, runs)
    formats = {s["format"] for s in cover["sources"] if s["format"]}
    conn = EngineConnection(engine)
    findings = []
    manifest = engine_manifest(engine)
    for scope in _scopes(engine, runs):
        conn.views = scope_views(scope, _window_spec(engine, scope), manifest)
        for name in MATERIALISED_SCOPE_VIEWS:  # read by nearly every rule query
            conn.views[name] = engine.materialise(name, conn.views[name], conn.views) or conn.views[name]
        base_views = dict(conn.views)
        presence = _present(conn)
        for rule in rules:
            try:
                findings.append(evaluate(conn, rule, scope, params[rule.id],
                                         cover["time_span"]["relative_clock"], formats, presence))
                continue
            except EngineError as exc:  # one rule the engine refuses: not evaluable there, the rest goes on
                conn.views = dict(base_views)
                reason = f"not evaluable on {engine.name}: the engine refused {rule.id}'s SQL: {exc.engine_message}"
            columns, metrics = presence
            available = [req for req in rule.requires
                         if all(c in columns for c in req.columns) and all(m in metrics for m in req.metrics)]
            findings.append({
                "rule": rule.id, "name": rule.name, "title": rule.title, "severity": rule.severity,
                "scope": scope.as_dict(), "state": "not_evaluable",
                "summary": f"{rule.title}: cannot be judged on {engine.name}.",
                "reason": reason if available else f"{missing_reason(rule, columns, metrics)}; and {reason}",
                "remediation": "", "rollback": "",
                "evidence": {"metrics": {}, "thresholds": {}, "windows": [], "table": None, "chart": None},
                "examples": [], "references": rule.references(),
            })
    doc = {
        "kind": "analyze", "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "servlens_version": __version__, "run": runs[0] if len(runs) == 1 else runs,
        "coverage": cover, "findings": sort_findings(findings),
        "workload": engine_workload(engine, runs),
        # The story's chains and goodput join the findings' requests in temp tables: DuckDB only, said as such.
        "chains": [],
        "goodput": {"targets": slo, "objective": dict(OBJECTIVE), "min_level_requests": MIN_LEVEL_REQUESTS,
                    "requests": cover["requests"],
                    "note": f"goodput, capacity and the cause chains are computed on DuckDB only, not on {engine.name}: "
                            "run the same export with --engine duckdb --table parquet:DIR for them"},
    }
    cover["engine"] = engine.describe()
    return doc


def analyze_where_the_data_is(engine_url: str | None, table: str | None, store, rules: list[Rule],
                              runs: list[str] | None, overrides: dict | None, slo: dict | None) -> dict:
    """`servlens analyze --engine URL --table T`: the document, the engine named in coverage.engine."""
    from servlens.engines import TableSource, engine_kind, open_engine

    source = TableSource.parse(table)
    kind = engine_kind(engine_url or "duckdb")
    if kind == "duckdb" and source.kind != "parquet":
        if source.location != "requests":
            raise ConfigError("With the DuckDB store, --table is the store's own requests table",
                              "Drop --table, or pass --table parquet:DIR for an export")
        engine = open_engine("duckdb", store=store)
    else:
        engine = open_engine(engine_url or "duckdb")
    try:
        engine.bind(source, runs or None)
        if engine.name == "duckdb":
            from servlens.analysis.runner import analyze

            doc = analyze(engine.con, rules, runs or None, overrides, slo)
        else:
            doc = analyze_on_engine(engine, rules, runs or None, overrides, slo)
        doc["coverage"]["engine"] = engine.describe()
        return doc
    finally:
        engine.close()


def engine_workload(engine: Engine, runs: list[str]) -> dict:
    """The document's `workload` on a non-DuckDB engine: the workload module's own profile (servlens/analysis/
    workload.py is its one home), every query on the engine through the connection adapter; the store's `runs`
    table comes from the export's manifest."""
    from servlens.analysis import workload

    conn = EngineConnection(engine)
    manifest = engine_manifest(engine)
    profiles = {}
    for run in runs:
        conn.views = manifest_views(manifest)
        profiles[run] = workload.run_profile(conn, run)
    return {"summary": [p.pop("summary") for p in profiles.values()], "runs": profiles}
