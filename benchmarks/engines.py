"""Engine benchmark (issue #17): the same servlens SQL on DuckDB, chDB and Spark local, on one Parquet export.

Steps, each timed once (the machine is shared; run big things once):

1. generate N requests with benchmarks/generate.py (OpenAI-style client log, a day, no message text: the canonical
   tables hold none), ingest them with
   `servlens ingest`, and `servlens export --parquet` them (skipped when the export exists);
2. on each engine: open it, bind the export, run the function-map query set (exact p50/p90/p99 per model, p99 per
   analysis window, a regression slope, ranks and batch means over time) and the engine analysis (every SQL rule
   on every scope, the workload's lengths and latencies), recording wall time, rows moved and each query's result;
3. check that every engine's results equal DuckDB's (exact quantiles to 1e-12);
4. with --compare-requests M: a generated before/after pair of M requests a side whose after run is ×1.25 slower to
   the first token (`generate.py --pair --regression ttft=1.25`), ingested into one store and exported; `compare`
   on the store (the reference), then on each engine over the export, timed, with its verdict and whether the
   whole document equals the store's.

Example:
    nice -n 10 python benchmarks/engines.py --requests 1M --workdir /tmp/servlens-engines --out benchmarks/engines-1M.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUERIES = {
    "quantiles per model": """
        SELECT model, count(*) AS n, quantile_cont(ttft_s, 0.5) AS ttft_p50, quantile_cont(ttft_s, 0.9) AS ttft_p90,
               quantile_cont(ttft_s, 0.99) AS ttft_p99, quantile_cont(e2e_s, 0.99) AS e2e_p99,
               quantile_cont(tpot_s, 0.5) AS tpot_p50
        FROM requests GROUP BY ALL ORDER BY model NULLS LAST""",
    "p99 per 60 s window": """
        SELECT CAST(floor(date_diff('microsecond', TIMESTAMP '2026-01-01 00:00:00', t_arrival) / 1e6 / 60) AS BIGINT) AS w,
               count(*) AS n, quantile_cont(ttft_s, 0.99) AS p99,
               count(*) FILTER (WHERE finish_reason = 'length') AS capped
        FROM requests GROUP BY ALL ORDER BY w""",
    "regression slope per model": """
        SELECT model, regr_slope(e2e_s, completion_tokens) AS s_per_token FROM requests GROUP BY ALL
        ORDER BY model NULLS LAST""",
    "ranks and batch means": """
        WITH b AS (SELECT ntile(30) OVER (ORDER BY t_arrival, request_id) AS batch, ttft_s FROM requests
                   WHERE ttft_s IS NOT NULL)
        SELECT batch, avg(ttft_s) AS mean_ttft, count(*) AS n FROM b GROUP BY ALL ORDER BY batch""",
}


def _cpu_s() -> float:
    """CPU seconds of this process (every thread: DuckDB's, chDB's) and of its live children (Spark's JVM), the
    measure that means something on a shared machine, where wall time depends on the neighbours."""
    total = time.process_time()
    try:
        import psutil
    except ImportError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def run(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def prepare(n: str, workdir: Path) -> dict:
    export = workdir / "export"
    timings = {}
    if not (export / "_servlens.json").exists():
        log = workdir / f"openai-{n}.jsonl"
        if not log.exists():
            timings["generate_s"] = run([sys.executable, str(REPO / "benchmarks" / "generate.py"), "--requests", n,
                                         "--format", "openai", "--redact", "--out", str(log)])
        store = workdir / "store.duckdb"
        store.unlink(missing_ok=True)
        timings["ingest_s"] = run([sys.executable, "-m", "servlens", "ingest", str(log), "--db", str(store),
                                   "--run", "day"])
        timings["export_s"] = run([sys.executable, "-m", "servlens", "export", "--db", str(store), "--parquet",
                                   str(export)])
    timings["export_bytes"] = sum(p.stat().st_size for p in export.rglob("*.parquet"))
    return timings


def prepare_pair(n: str, workdir: Path) -> dict:
    """A before/after pair of n requests a side in one store and its export (each step skipped when done)."""
    folder, store, export = workdir / f"pair-{n}", workdir / f"pair-{n}.duckdb", workdir / f"pair-{n}-export"
    timings = {}
    if not (export / "_servlens.json").exists():
        if not (folder / "manifest.json").exists():
            timings["generate_s"] = run([sys.executable, str(REPO / "benchmarks" / "generate.py"), "--requests", n,
                                         "--format", "openai", "--redact", "--pair", "--regression", "ttft=1.25",
                                         "--out", str(folder)])
        store.unlink(missing_ok=True)
        for side in ("before", "after"):
            timings[f"ingest_{side}_s"] = run([sys.executable, "-m", "servlens", "ingest", str(folder / f"{side}.jsonl"),
                                               "--db", str(store), "--run", side])
        timings["export_s"] = run([sys.executable, "-m", "servlens", "export", "--db", str(store), "--parquet",
                                   str(export)])
    return timings | {"store": str(store), "export": str(export)}


def compare_reference(store: str) -> dict:
    """compare before → after on the store, the reference every engine's document must equal."""
    from servlens.compare.engine import compare_runs
    from servlens.store.schema import open_store

    con = open_store(store, read_only=True)
    try:
        started, cpu = time.perf_counter(), _cpu_s()
        doc = compare_runs(con, "before", "after")
        return {"s": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu, "doc": doc}
    finally:
        con.close()


def bench_compare(url: str, export: str, reference: dict) -> dict:
    from servlens.compare.engine import compare_runs
    from servlens.engines import TableSource, open_engine
    from servlens.engines.analysis import engine_manifest
    from servlens.engines.compare import CompareConnection

    engine = open_engine(url)
    try:
        engine.bind(TableSource.parse(f"parquet:{export}"), ["before", "after"])
        before = engine.stats.rows_moved, engine.stats.queries
        started, cpu = time.perf_counter(), _cpu_s()
        doc = compare_runs(CompareConnection(engine, engine_manifest(engine), ("before", "after")), "before", "after")
        out = {"engine": url, "s": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu,
               "rows_moved": engine.stats.rows_moved - before[0], "queries": engine.stats.queries - before[1]}
    finally:
        engine.close()
    strip = lambda d: {k: v for k, v in json.loads(json.dumps(d, default=str)).items()  # noqa: E731
                       if k not in ("generated_at", "coverage")}
    differences = _differences(strip(doc), strip(reference["doc"]))
    return out | {"verdict": doc["verdict"], "same_as_store": not differences, "differences": differences[:10]}


def _differences(got, want, path: str = "") -> list[str]:
    """Where two documents differ; numbers equal to 1e-9 relative (a sum's last digits depend on its order)."""
    from servlens.engines.base import same_number

    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in sorted(set(got) | set(want)) for d in _differences(got.get(k), want.get(k), f"{path}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _differences(g, w, f"{path}[{i}]")]
    if isinstance(got, float) or isinstance(want, float):
        return [] if same_number(got, want, rel=1e-9) else [f"{path}: {got!r} vs {want!r}"]
    return [] if got == want else [f"{path}: {got!r:.120} vs {want!r:.120}"]


def bench_engine(url: str, export: Path, rules, analysis: bool = True) -> dict:
    from servlens.engines import TableSource, open_engine
    from servlens.engines.analysis import analyze_on_engine

    out: dict = {"engine": url}
    started = time.perf_counter()
    engine = open_engine(url)
    out["open_s"] = time.perf_counter() - started
    cpu_started = _cpu_s()
    try:
        started = time.perf_counter()
        engine.bind(TableSource.parse(f"parquet:{export}"))
        out["bind_s"] = time.perf_counter() - started
        out["queries"] = {}
        for name, sql in QUERIES.items():
            before = engine.stats.rows_moved
            started, cpu = time.perf_counter(), _cpu_s()
            rows = engine.query(sql)
            out["queries"][name] = {"s": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu,
                                    "rows_moved": engine.stats.rows_moved - before, "result": rows}
        out["version"] = engine.version()
        if not analysis:
            return out
        before = engine.stats.rows_moved, engine.stats.queries
        started, cpu = time.perf_counter(), _cpu_s()
        if engine.name == "duckdb":  # as `servlens analyze --engine duckdb` runs it: the store's own runner
            from servlens.analysis.runner import analyze

            doc = analyze(engine.con, rules)
        else:
            doc = analyze_on_engine(engine, rules)
        out["analyze"] = {"s": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu, "rows_moved": engine.stats.rows_moved - before[0],
                          "queries": engine.stats.queries - before[1], "requests": doc["coverage"]["requests"],
                          "findings": {f"{f['rule']} {f['scope']['model']} {f['scope']['deployment']}":
                                       [f["state"], f["evidence"]["metrics"]]
                                       for f in doc["findings"] if f["state"] != "not_evaluable"},
                          "workload": {r: {k: p.get(k) for k in ("lengths", "latency")}
                                       for r, p in doc["workload"]["runs"].items()}}
        out["cpu_s"] = _cpu_s() - cpu_started
    finally:
        engine.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", default="1M")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--engines", default="duckdb,chdb,spark:local[2]")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare-requests", help="also time compare on a generated pair of this many requests a side")
    ap.add_argument("--skip-analysis", action="store_true", help="only the compare stage")
    ap.add_argument("--queries-only", action="store_true", help="the function-map query set, not the analysis")
    ap.add_argument("--reference", type=Path, help="an earlier output of this script on the same export: its first "
                    "engine (DuckDB) is the reference, not run again (its queries are, when the file lacks results)")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    from servlens.analysis.rules import load_rules

    rules = [r for r in load_rules([REPO / "tests" / "analysis" / "data" / "user_rules"]) if r.sql]
    result = {"requests": args.requests, "engines": []}
    if args.compare_requests:
        pair = prepare_pair(args.compare_requests, args.workdir)
        reference = compare_reference(pair["store"])
        result["compare"] = {"requests_a_side": args.compare_requests, "prepare": pair,
                             "store": {"s": reference["s"], "cpu_s": reference["cpu_s"],
                                       "verdict": reference["doc"]["verdict"], "reason": reference["doc"]["reason"]},
                             "engines": []}
        for url in args.engines.split(","):
            result["compare"]["engines"].append(bench_compare(url, pair["export"], reference))
            print(json.dumps(result["compare"]["engines"][-1]), file=sys.stderr)
    if args.skip_analysis:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        return 0
    result["prepare"] = prepare(args.requests, args.workdir)
    if args.reference:
        reference = json.loads(args.reference.read_text())["engines"][0]
        if any("result" not in q for q in reference["queries"].values()):
            reference["queries"] = bench_engine("duckdb", args.workdir / "export", rules, analysis=False)["queries"]
        result["reference"] = str(args.reference)
        result["engines"].append(reference)
    for url in args.engines.split(","):
        result["engines"].append(bench_engine(url, args.workdir / "export", rules, analysis=not args.queries_only))
        print(json.dumps({k: v for k, v in result["engines"][-1].items() if k not in ("queries", "analyze")}),
              file=sys.stderr)
    result["engines"] = json.loads(json.dumps(result["engines"], default=str))  # a reference read back is JSON too
    reference = result["engines"][0]
    for other in result["engines"][1:]:
        # exact quantiles equal to 1e-12; a sum or mean over 10M rows to 1e-9 (its last digits follow the order)
        differences = [d for name, q in reference["queries"].items()
                       for d in _differences(other["queries"][name]["result"], q["result"], f"queries.{name}")]
        if "analyze" in reference and "analyze" in other:
            differences += _differences(other["analyze"]["findings"], reference["analyze"]["findings"], "findings")
            differences += _differences(other["analyze"]["workload"], reference["analyze"]["workload"], "workload")
        other["same_as_duckdb"] = not differences
        other["differences"] = differences[:20]
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
