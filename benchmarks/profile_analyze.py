"""Where `servlens analyze` spends its time: CPU seconds per stage, per rule (summed over the scopes) and per SQL
statement, in one process, on the store analyze itself uses (in memory, default memory limit).

The request log is ingested into an in-memory store through the normal ingest path (as `servlens analyze FILE`
does); with ``--store`` an on-disk store that `servlens ingest` wrote is copied into memory instead, which skips the
ingest's minute at 1M while the analysis sees the same rows. Then the analysis runs as `runner.analyze` runs it,
each stage wrapped: `prepare_scope` (the scope table and the presence scan), each rule's `evaluate`, the workload
profile, chains, goodput, and (with ``--html``) the report. CPU time is the process's user + system time (DuckDB's
threads included), the measure that stays honest on a shared machine; wall time is printed beside it.

``--statements N`` also prints the N most expensive SQL statements (CPU s, the first line of each), to find the
one query behind a slow stage; ``--findings FILE`` writes the findings (state, summary, metrics per rule and scope)
as JSON, to check that a change leaves every finding as it was (without ``--statements``: its timing proxy in
front of the connection sends polars frames through the engines' row path, which may type a value differently).

The built-in rules are read from the folder ``servlens.builtin_rules`` resolves to: with an editable install of
another checkout that is *its* rules/, whatever PYTHONPATH says (a symlink servlens/builtin_rules -> ../rules in
the checkout being measured fixes that).

Example:
    python benchmarks/profile_analyze.py benchmarks/data/litellm-redacted-1M-s7/before.jsonl --statements 15
    python benchmarks/profile_analyze.py --store /tmp/ll1M.duckdb --findings /tmp/after.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Clock:
    """CPU and wall seconds accumulated per label."""

    def __init__(self):
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextmanager
    def time(self, label: str):
        c0, w0 = cpu_s(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu[label] += cpu_s() - c0
            self.wall[label] += time.perf_counter() - w0
            self.calls[label] += 1

    def wrap(self, owner, name: str, label_of):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            with self.time(label_of(*args, **kwargs)):
                return original(*args, **kwargs)

        setattr(owner, name, timed)
        return original


class StatementClock:
    """Every SQL statement a DuckDB connection runs, timed (a proxy in front of the connection)."""

    def __init__(self, con, clock: Clock):
        self._con, self._clock = con, clock

    def execute(self, sql, *args, **kwargs):
        key = " ".join(str(sql).split())[:140]
        with self._clock.time(key):
            return self._con.execute(sql, *args, **kwargs)

    @property
    def __class__(self):
        # isinstance(con, duckdb.DuckDBPyConnection) holds, so code that tells DuckDB from an engine's connection
        # (Context.has_temp_table) takes the DuckDB path it takes without the proxy.
        return type(self._con)

    def __getattr__(self, name):
        return getattr(self._con, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n" + __doc__.split("Example:\n", 1)[1])
    ap.add_argument("paths", nargs="*", help="request logs to ingest (as servlens analyze PATHS)")
    ap.add_argument("--store", help="an on-disk store to copy into memory instead of ingesting PATHS")
    ap.add_argument("--html", action="store_true", help="also render the HTML report (timed)")
    ap.add_argument("--statements", type=int, default=0, help="print the N most expensive SQL statements")
    ap.add_argument("--findings", help="write the findings (state, summary, evidence metrics) to this JSON file")
    ap.add_argument("--select", help="comma-separated rule ids to run (default: every rule analyze runs)")
    args = ap.parse_args(argv)
    if bool(args.paths) == bool(args.store):
        ap.error("give request logs or --store, not both")

    import duckdb

    from servlens.analysis import chains, goodput, runner, workload
    from servlens.analysis.inputs import ingest_paths
    from servlens.analysis.rules import load_rules, runnable, select_rules
    from servlens.store.schema import open_store

    clock, statements = Clock(), Clock()
    t_start, c_start = time.perf_counter(), cpu_s()
    con = open_store(None)
    with clock.time("load: ingest" if args.paths else "load: copy the store into memory"):
        if args.paths:
            ingest_paths(con, args.paths)
        else:
            con.execute(f"ATTACH '{args.store}' AS src (READ_ONLY)")
            tables = [r[0] for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'src' AND schema_name = 'main'").fetchall()]
            for table in tables:
                con.execute(f"DELETE FROM main.{table}")
                con.execute(f"INSERT INTO main.{table} SELECT * FROM src.main.{table}")
            con.execute("DETACH src")
    if args.statements:
        con = StatementClock(con, statements)
    select = [s for s in (args.select or "").split(",") if s]
    rules = runnable(select_rules(load_rules([]), select, []), select, False)
    clock.wrap(runner, "prepare_scope", lambda *a, **k: "prepare_scope (scope table + presence)")
    clock.wrap(runner, "evaluate", lambda con, rule, *a, **k: f"rule {rule.id}")
    clock.wrap(runner, "coverage", lambda *a, **k: "coverage")
    # runner.analyze imports these inside the function, from their modules: wrap them there.
    clock.wrap(workload, "workload_profile", lambda *a, **k: "workload_profile")
    clock.wrap(chains, "build_chains", lambda *a, **k: "build_chains")
    clock.wrap(goodput, "goodput_section", lambda *a, **k: "goodput_section")
    with clock.time("analysis (all)"):
        doc = runner.analyze(con, rules)
    if args.html:
        from servlens.render.html import render_html

        with clock.time("render_html"):
            html = render_html(doc)
        print(f"report: {len(html.encode()) / 1e6:.2f} MB")
    rows = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{rows:,} requests; {len(doc['findings'])} findings; total {time.perf_counter() - t_start:.1f} s wall, "
          f"{cpu_s() - c_start:.1f} s CPU; peak RSS {peak_mb:.0f} MB; duckdb {duckdb.__version__}")
    print(f"{'stage':60s} {'calls':>5s} {'CPU s':>8s} {'wall s':>8s}")
    for label in sorted(clock.cpu, key=lambda k: -clock.cpu[k]):
        print(f"{label:60s} {clock.calls[label]:5d} {clock.cpu[label]:8.2f} {clock.wall[label]:8.2f}")
    if args.statements:
        print(f"\n{'statement (first 140 characters)':140s} {'calls':>5s} {'CPU s':>8s}")
        for label in sorted(statements.cpu, key=lambda k: -statements.cpu[k])[:args.statements]:
            print(f"{label:140s} {statements.calls[label]:5d} {statements.cpu[label]:8.2f}")
    if args.findings:
        found = [{"rule": f["rule"], "scope": f["scope"], "state": f["state"], "severity": f["severity"],
                  "summary": f["summary"], "reason": f["reason"], "metrics": f["evidence"].get("metrics"),
                  "windows": f["evidence"].get("windows"), "examples": f["examples"]} for f in doc["findings"]]
        Path(args.findings).write_text(json.dumps({"findings": found, "chains": doc["chains"],
                                                   "goodput": doc["goodput"], "workload": doc["workload"]},
                                                  indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
