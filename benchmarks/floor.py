"""How much of ingest's time budget the reading and parsing alone take: the floor under `servlens ingest`.

The target in issue #7 is ingest at most 1.5x the bare scan (run.py's ``scan``: DuckDB ``read_json`` with typed
columns for the fields the profile reads). This measures, in one DuckDB process on the same file, each into a fresh
in-memory temporary table, the stages every design that keeps servlens' guarantees has to pay:

- ``scan``: the bare scan itself (the anchor, as in run.py);
- ``lines``: the line reader ingest uses (so a bad line keeps its file and line number; read_json cannot say which
  line it rejected);
- ``lines + present paths``: plus one multi-path ``json_extract_string`` of only the profile's paths that occur in
  the file (read from a sample), the least a text-valued profile can look up;
- ``lines + all paths``: plus the extraction of every path the profile reads (what ingest does);
- ``read_json as text``: ``read_json`` with the profile's paths as VARCHAR leaves, the read_json route to the same
  text values, without line numbers;
- ``typed read``: the typed fast path's read alone: ``read_json`` with the schema compiled from the profile's paths
  (VARCHAR leaves, the values the line reader's text lookups give) and its columns;
- ``ingest query``: the whole compiled profile query through the line reader (every column, error-text redaction,
  flags), still into memory, without the store, its transaction, the hash and line count, or the interpreter start;
- ``fast path``: the same query compiled for the typed fast path (what ``servlens ingest`` runs first).

Each stage's median over the repetitions is printed with its ratio to the scan.

Example:
    python benchmarks/floor.py benchmarks/data/openai-redacted-1M-s7/before.jsonl --repeat 3
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _scan_columns() -> dict:
    """run.py's SCAN_COLUMNS (benchmarks/ is not a package: loaded by path, once)."""
    module = sys.modules.get("servlens_bench_run")
    if module is None:
        spec = importlib.util.spec_from_file_location("servlens_bench_run", HERE / "run.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module.SCAN_COLUMNS


def _varchar_schema(paths: list[str]) -> str:
    """read_json columns for `paths` ('$.a.b', '$.c[0].d') as nested STRUCTs with VARCHAR leaves ([0]: a list)."""
    tree: dict = {}
    for path in paths:
        node = tree
        segments = path[2:].split(".")
        if not all(re.match(r"\w+(\[\d+\])?$", segment) for segment in segments):
            continue  # quoted keys, wildcards: not expressible as plain columns (few; the stage is a lower bound)
        for i, segment in enumerate(segments):
            name, indexed = re.match(r"(\w+)(\[\d+\])?$", segment).groups()
            last = i == len(segments) - 1
            if last and not indexed:
                node.setdefault(name, "VARCHAR")
                break
            child = node.setdefault(name, {"[]": {} if not last else "VARCHAR"} if indexed else {})
            if not isinstance(child, dict):
                break  # a leaf read as text already covers what is under it
            node = child["[]"] if indexed else child
            if not isinstance(node, dict):
                break

    def ddl(value) -> str:
        if value == "VARCHAR":
            return "VARCHAR"
        if set(value) == {"[]"}:
            return ddl(value["[]"]) + "[]"
        return "STRUCT(" + ", ".join(f'"{k}" {ddl(v)}' for k, v in value.items()) + ")"

    return "{" + ", ".join(f"'{k}': '{ddl(v)}'" for k, v in tree.items()) + "}"


def main(argv: list[str] | None = None) -> int:
    measure(argv)
    return 0


def measure(argv: list[str] | None = None) -> dict[str, tuple[float, int]]:
    """Print the table; return each stage's median seconds and row count."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--format", choices=["openai", "litellm"], default="openai",
                        help="the file's format: openai (servlens-loadgen profile) or litellm (litellm-slp)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    import duckdb

    from servlens.ingest.compiler import (
        MAX_LINE_BYTES,
        CompileOptions,
        compile_profile,
        line_reader_sql,
        sql_str,
    )
    from servlens.ingest.profiles import get_profile
    from servlens.ingest.sources import compression_of

    path = args.file.resolve()
    if not path.is_file():
        parser.error(f"{args.file} is not a file: pass a JSON-lines request log, e.g. one benchmarks/run.py generated")
    profile = get_profile({"openai": "servlens-loadgen", "litellm": "litellm-slp"}[args.format])
    opts = CompileOptions(path=path, compression=compression_of(path), default_run=path.stem, lines_by_insert_order=True)
    compiled = compile_profile(profile, opts)
    fast = compile_profile(profile, replace(opts, typed=True))
    paths = compiled.json_paths

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    for statement in compiled.macro_sql():
        con.execute(statement)
    lines = line_reader_sql(path, compression_of(path), MAX_LINE_BYTES, store_rejects=False)
    sample = con.execute(f"SELECT {', '.join(f'count(json_extract_string(line, {sql_str(p)}))' for p in paths)} "
                         f"FROM (SELECT line FROM {lines} LIMIT 20000)").fetchone()
    present = [p for p, n in zip(paths, sample) if n]
    scan_columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _scan_columns()[args.format].items()) + "}"
    stages = {
        "scan": f"SELECT * FROM read_json({sql_str(str(path))}, format='newline_delimited', columns={scan_columns}, "
                "maximum_object_size=104857600)",
        "lines": f"SELECT line FROM {lines}",
        f"lines + present paths ({len(present)})": f"SELECT json_extract_string(line, [{', '.join(map(sql_str, present))}]) AS v FROM {lines}",
        f"lines + all paths ({len(paths)})": f"SELECT json_extract_string(line, [{', '.join(map(sql_str, paths))}]) AS v FROM {lines}",
        "read_json as text": f"SELECT * FROM read_json({sql_str(str(path))}, format='newline_delimited', "
                             f"columns={_varchar_schema(paths)}, maximum_object_size=104857600)",
        "ingest query": compiled.select(source_id_sql="1"),
    }
    if fast.typed:  # the read alone, then the whole query
        stages["typed read"] = "WITH " + ",\n".join(f"{n} AS ({b})" for n, b in fast.ctes[:2]) + " SELECT * FROM _paths"
        stages["fast path"] = fast.select(source_id_sql="1")
    for statement in fast.macro_sql():
        con.execute(statement)
    times: dict[str, list[float]] = {name: [] for name in stages}
    cpu: dict[str, list[float]] = {name: [] for name in stages}  # the process's CPU time (DuckDB's threads included)
    rows: dict[str, int] = {}
    for _ in range(args.repeat):
        for name, query in stages.items():  # interleaved, so a slow minute touches every stage alike
            con.execute("DROP TABLE IF EXISTS floor_t")
            started, cpu_started = time.perf_counter(), time.process_time()
            con.execute(f"CREATE TEMP TABLE floor_t AS {query}")
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
            rows[name] = con.execute("SELECT count(*) FROM floor_t").fetchone()[0]
    scan, scan_cpu = statistics.median(times["scan"]), statistics.median(cpu["scan"])
    print(f"{path.name}: {args.repeat} repetitions, DuckDB {duckdb.__version__}, in one process, into memory")
    print(f"{'stage':34s} {'median s':>9s} {'range s':>13s} {'x scan':>7s} {'CPU s':>7s} {'x scan':>7s}")
    for name, values in times.items():
        median, cpu_median = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:34s} {median:9.2f} {min(values):6.2f}-{max(values):<6.2f} {median / scan:7.2f} "
              f"{cpu_median:7.2f} {cpu_median / scan_cpu:7.2f}")
    return {name: (statistics.median(values), rows[name]) for name, values in times.items()}


if __name__ == "__main__":
    sys.exit(main())
