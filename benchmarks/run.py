"""The servlens benchmark: wall time and peak memory at production scale, as ratios against two anchors.

For each size it generates (once, into benchmarks/data/, git-ignored) a day of gateway logs and a before/after pair
with a known regression, then measures, each as its own child process, several repetitions interleaved:

- ``scan``: the practical limit — DuckDB ``read_json`` of the same file materialising the same source fields that
  ingest reads (typed columns for exactly those fields) into a table in a fresh on-disk database;
- ``ingest``: ``servlens ingest FILE`` into a fresh store (its JSON summary says which files the typed fast path
  read: reported as the fast path's share of files);
- ``analyze``: ``servlens analyze FILE`` end to end (ingest + every rule + the HTML report), fresh store;
- ``scan2`` and ``compare``: the same scan of both files of the pair, and ``servlens compare BEFORE AFTER``;
- ``pandas``: ``pandas.read_json(FILE, lines=True)``, the script a user would otherwise write (only while the file
  is small enough to fit in memory: it needs several times the file's size).

Wall time is the child's whole life (interpreter start included) — the median of the repetitions, with the range
as the noise; CPU time (user + system, from the same ``wait4``) is reported beside it, steadier on a shared machine;
peak RSS is the command's own maximum resident set (``wait4`` rusage in a small launcher process, which
covers the whole process and its threads). A command that does not exist yet is reported as "not available", not run.

Example:
    python benchmarks/run.py                       # 100k and 1M, 3 repetitions, writes benchmarks/RESULTS.md
    python benchmarks/run.py --sizes 10M --repeat 2
    python benchmarks/run.py --sizes 100k,1M --format litellm-lean,openai-lean   # rows without message text
    python benchmarks/run.py --smoke --data /tmp/bench --out /tmp/bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _load_generator():
    """benchmarks/ is not a package: load generate.py by path, under a name no other module will take."""
    spec = importlib.util.spec_from_file_location("servlens_bench_generate", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _load_generator()

# Incidents in every benchmark day, so analyze's rules have something to find (and the pair carries them on both
# sides, so compare sees only the known regression).
BENCH_INCIDENTS = ("queue_spike@14:00/45m", "prefix_cache_off@09:00/1h:qwen2.5-32b-instruct")
BENCH_REGRESSION = "ttft=1.25"
PANDAS_MEMORY_FACTOR = 8  # pandas read_json needs about this many times the file's size in RAM

# The source fields servlens' profile for each format reads (litellm-slp.toml and servlens-loadgen.toml: every path
# their columns, text and attrs use), as DuckDB read_json column types. The bare scan materialises exactly these
# (a count(*) would skip the parsing); keep in step with servlens/profiles/*.toml.
SCAN_COLUMNS = {
    "litellm": {
        "id": "VARCHAR", "litellm_call_id": "VARCHAR", "trace_id": "VARCHAR", "session_id": "VARCHAR",
        "call_type": "VARCHAR", "cache_hit": "BOOLEAN", "stream": "BOOLEAN", "status": "VARCHAR",
        "status_fields": "STRUCT(guardrail_status VARCHAR)", "custom_llm_provider": "VARCHAR",
        "saved_cache_cost": "DOUBLE", "startTime": "DOUBLE", "endTime": "DOUBLE", "completionStartTime": "DOUBLE",
        "model": "VARCHAR",
        "metadata": "STRUCT(user_api_key_alias VARCHAR, user_api_key_team_alias VARCHAR, team_alias VARCHAR, "
                    "usage_object STRUCT(prompt_tokens BIGINT, completion_tokens BIGINT, "
                    "prompt_tokens_details STRUCT(cached_tokens BIGINT), completion_tokens_details "
                    "STRUCT(reasoning_tokens BIGINT), cache_read_input_tokens BIGINT, "
                    "cache_creation_input_tokens BIGINT))",
        "cache_key": "VARCHAR", "response_cost": "DOUBLE", "prompt_tokens": "BIGINT", "completion_tokens": "BIGINT",
        "request_tags": "JSON", "end_user": "VARCHAR", "api_base": "VARCHAR", "model_group": "VARCHAR",
        "model_id": "VARCHAR", "messages": "JSON",
        "response": "STRUCT(model VARCHAR, choices STRUCT(finish_reason VARCHAR, message STRUCT(content VARCHAR, "
                    "reasoning_content VARCHAR, reasoning VARCHAR))[], usage STRUCT(prompt_tokens BIGINT, "
                    "completion_tokens BIGINT, prompt_tokens_details STRUCT(cached_tokens BIGINT), "
                    "completion_tokens_details STRUCT(reasoning_tokens BIGINT), cache_read_input_tokens BIGINT, "
                    "cache_creation_input_tokens BIGINT))",
        "model_parameters": "STRUCT(stream BOOLEAN, max_tokens BIGINT, max_completion_tokens BIGINT)",
        "hidden_params": "STRUCT(litellm_model_name VARCHAR, litellm_overhead_time_ms DOUBLE)",
        "error_str": "VARCHAR",
        "error_information": "STRUCT(error_code VARCHAR, error_class VARCHAR, error_message VARCHAR)",
    },
    "openai": {
        "req_idx": "BIGINT", "path": "VARCHAR", "run": "VARCHAR", "send_ts": "DOUBLE", "first_token_ts": "DOUBLE",
        "end_ts": "DOUBLE", "e2e_s": "DOUBLE", "ttft_client_s": "DOUBLE", "http_status": "INTEGER",
        "finish_reason": "VARCHAR", "content_chunk_offsets_s": "DOUBLE[]", "output_chars": "BIGINT",
        "body": "STRUCT(model VARCHAR, messages JSON, max_tokens BIGINT, stream BOOLEAN)",
        "response": "STRUCT(id VARCHAR, model VARCHAR, choices STRUCT(finish_reason VARCHAR, message STRUCT(content "
                    "VARCHAR, reasoning_content VARCHAR))[], usage STRUCT(prompt_tokens BIGINT, completion_tokens "
                    "BIGINT, prompt_tokens_details STRUCT(cached_tokens BIGINT), completion_tokens_details "
                    "STRUCT(reasoning_tokens BIGINT)), error STRUCT(code INTEGER, message VARCHAR, type VARCHAR))",
        "stream_final_chunk": "STRUCT(id VARCHAR, model VARCHAR, usage STRUCT(prompt_tokens BIGINT, "
                              "completion_tokens BIGINT, prompt_tokens_details STRUCT(cached_tokens BIGINT), "
                              "completion_tokens_details STRUCT(reasoning_tokens BIGINT)))",
    },
}

TARGETS = (
    # (name, description)
    ("ingest_vs_scan", "ingest <= 1.5x bare scan"),
    ("analyze_vs_scan", "analyze end to end <= 3x bare scan"),
    ("pandas_vs_analyze", "analyze >= 10x faster than pandas"),
    ("compare_vs_scan2", "compare 1M vs 1M <= 3x scanning both"),
    ("report_bytes", "report <= 2 MB"),
    ("peak_rss_10M", "peak RSS <= 1 GB at 10M"),
)


@dataclass
class Measure:
    name: str
    available: bool = True
    note: str = ""
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # user + system time of the command's process
    rss_mb: list[float] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        return statistics.median(self.wall_s) if self.wall_s else None

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_s) if self.cpu_s else None

    @property
    def peak_rss(self) -> float | None:
        return max(self.rss_mb) if self.rss_mb else None

    def noise(self) -> str:
        if len(self.wall_s) < 2:
            return "-"
        return f"{min(self.wall_s):.2f}-{max(self.wall_s):.2f}"


# Children are started by this small launcher, not by the harness itself: Linux carries the forking process's
# memory high-water mark into the child's ru_maxrss, so a child forked straight from the harness (numpy, pandas and
# duckdb loaded) would report at least the harness's size. The launcher is a bare interpreter of a few MB; it times the
# command and reports the command's own peak RSS from wait4.
LAUNCHER = r"""
import json, os, sys, time
out, niceness, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.nice(niceness)
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(out, "w") as fh:
    json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss,
               "code": os.waitstatus_to_exitcode(status)}, fh)
"""


def run_child(argv: list[str], cwd: Path, niceness: int = 10,
              timeout: float = 7200) -> tuple[float, float, float, int, str]:
    """Run ``argv`` at lowered priority (the machine is shared); return (wall seconds, CPU seconds (user + system),
    peak RSS in MB of the command's process, exit code, stderr tail)."""
    fd, result_path = tempfile.mkstemp(prefix="bench-result-")
    os.close(fd)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, result_path, str(niceness)] + argv, cwd=cwd,
                              stdout=subprocess.DEVNULL, stderr=err, timeout=timeout)
        err.seek(0)
        tail = err.read()[-600:].decode(errors="replace")
    try:
        result = json.loads(Path(result_path).read_text())
    except ValueError:
        result = {"wall": float("nan"), "cpu": float("nan"), "maxrss_kb": 0, "code": proc.returncode}
    Path(result_path).unlink()
    # ru_maxrss is KiB on Linux
    return result["wall"], result["cpu"], result["maxrss_kb"] / 1024.0, result["code"], tail


def servlens_argv() -> list[str]:
    """The servlens of this interpreter's environment (a `servlens` found first on PATH may be another checkout's)."""
    beside = Path(sys.executable).parent / "servlens"
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "servlens"]


def command_available(cmd: str) -> bool:
    """Whether ``servlens CMD`` exists in this checkout (the CLI registry imports commands lazily)."""
    probe = subprocess.run(servlens_argv() + [cmd, "--help"], capture_output=True, cwd=REPO)
    return probe.returncode == 0


def scan_script(paths: list[Path], fmt: str, db: Path) -> list[str]:
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in SCAN_COLUMNS[fmt].items()) + "}"
    reads = " UNION ALL ".join(
        f"SELECT {i} AS file, * FROM read_json('{p}', format='newline_delimited', columns={columns}, "
        f"maximum_object_size=104857600)" for i, p in enumerate(paths))
    code = ("import duckdb, sys\n"
            f"con = duckdb.connect({str(db)!r})\n"
            f"con.execute({f'CREATE TABLE scanned AS {reads}'!r})\n"
            "print(con.execute('SELECT count(*) FROM scanned').fetchone()[0])\n")
    return [sys.executable, "-c", code]


def pandas_script(path: Path) -> list[str]:
    code = ("import pandas as pd\n"
            f"df = pd.read_json({str(path)!r}, lines=True)\n"
            "print(len(df))\n")
    return [sys.executable, "-c", code]


def available_memory_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# Lean variants: the same generator without message or answer text (LiteLLM turn_off_message_logging).
LEAN_SUFFIX = "-lean"
FORMAT_CHOICES = tuple(f for base in generate.FORMATS for f in (base, base + LEAN_SUFFIX))


def split_format(fmt: str, redact: bool = False) -> tuple[str, bool]:
    """'litellm-lean' -> ('litellm', True): the generator's format and whether its rows carry no text."""
    if fmt.endswith(LEAN_SUFFIX):
        return fmt[: -len(LEAN_SUFFIX)], True
    return fmt, redact


def ensure_data(size: int, fmt: str, data_dir: Path, seed: int, redact: bool = False) -> tuple[Path, Path, Path]:
    """The day file (= the pair's before) and the after file for ``size``; generated once, reused after."""
    pair_dir = data_dir / f"{fmt}{'-redacted' if redact else ''}-{label(size)}-s{seed}"
    before, after = pair_dir / "before.jsonl", pair_dir / "after.jsonl"
    manifest = pair_dir / "manifest.json"
    if not (before.exists() and after.exists() and manifest.exists()):
        sc = generate.Scenario(size, seed, incidents=[generate.Incident.parse(s) for s in BENCH_INCIDENTS],
                               redact=redact)
        t0 = time.perf_counter()
        generate.generate_pair(sc, fmt, pair_dir, generate.Regression.parse(BENCH_REGRESSION))
        print(f"  generated {pair_dir} in {time.perf_counter() - t0:.1f} s", flush=True)
    return before, after, manifest


def label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def store_rows(db: Path) -> int | None:
    try:
        import duckdb

        with duckdb.connect(str(db), read_only=True) as con:
            return int(con.execute("SELECT count(*) FROM requests").fetchone()[0])
    except Exception:  # noqa: BLE001 — a store that is missing or unreadable just has no row count
        return None


def bench_size(size: int, fmt: str, data_dir: Path, work: Path, repeat: int, pandas_max: int,
               available: dict[str, bool], seed: int = 7, niceness: int = 10, redact: bool = False) -> dict:
    shown = fmt if fmt.endswith(LEAN_SUFFIX) or not redact else fmt + LEAN_SUFFIX
    fmt, redact = split_format(fmt, redact)
    before, after, manifest = ensure_data(size, fmt, data_dir, seed, redact)
    file_bytes = before.stat().st_size
    print(f"== {label(size)} requests, {fmt}, {file_bytes / 1e6:.0f} MB", flush=True)
    for p in (before, after):  # warm the page cache so the first repetition is not the only one reading from disk
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass
    sl = servlens_argv()
    m = {name: Measure(name) for name in ("scan", "ingest", "analyze", "scan2", "compare", "pandas")}
    for cmd in ("ingest", "analyze", "compare"):
        if not available[cmd]:
            m[cmd].available = False
            m[cmd].note = "not available (command not in this checkout)"
    fits = file_bytes * PANDAS_MEMORY_FACTOR < min(available_memory_bytes() * 0.7, 64 << 30)
    if size > pandas_max or not fits:
        m["pandas"].available = False
        m["pandas"].note = (f"skipped: needs ~{file_bytes * PANDAS_MEMORY_FACTOR / 1e9:.0f} GB"
                            if not fits else f"skipped above {label(pandas_max)} (--pandas-max)")

    def fresh(name: str) -> Path:
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    plan: list[tuple[str, callable]] = [
        ("scan", lambda d: scan_script([before], fmt, d / "scan.duckdb")),
        ("ingest", lambda d: sl + ["--db", str(d / "store.duckdb"), "ingest", str(before), "--run", "bench",
                                   "--format", "json", "--out", str(d / "ingest.json")]),
        ("analyze", lambda d: sl + ["--db", str(d / "store.duckdb"), "analyze", str(before),
                                    "--out", str(d / "report.html")]),
        ("scan2", lambda d: scan_script([before, after], fmt, d / "scan.duckdb")),
        ("compare", lambda d: sl + ["--db", str(d / "store.duckdb"), "compare", str(before), str(after),
                                    "--out", str(d / "compare.html")]),
        ("pandas", lambda d: pandas_script(before)),
    ]
    for rep in range(repeat):
        for name, make in plan:
            meas = m[name]
            if not meas.available:
                continue
            d = fresh(name)
            wall, cpu, rss, code, tail = run_child(make(d), cwd=d, niceness=niceness)
            meas.wall_s.append(wall)
            meas.cpu_s.append(cpu)
            meas.rss_mb.append(rss)
            meas.exit_codes.append(code)
            ok_codes = {0, 1, 3} if name in ("analyze", "compare") else {0}
            if code not in ok_codes:
                meas.note = f"exit {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
            if name == "ingest":
                meas.extra["rows"] = store_rows(d / "store.duckdb")
                meas.extra["readers"] = readers_of(d / "ingest.json")
            if name in ("analyze", "compare"):
                report = d / ("report.html" if name == "analyze" else "compare.html")
                meas.extra["report_bytes"] = report.stat().st_size if report.exists() else None
                if not report.exists():  # exit 1 is a verdict only when the command wrote its report
                    meas.note = f"failed, exit {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
            print(f"  [{rep + 1}/{repeat}] {name:8s} {wall:8.2f} s  {cpu:8.2f} s CPU  {rss:8.0f} MB  exit {code}",
                  flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return {"size": size, "format": shown, "file_bytes": file_bytes, "after_bytes": after.stat().st_size,
            "manifest": json.loads(manifest.read_text()), "measures": m}


def readers_of(summary: Path) -> list[str]:
    """Which reader read each request log, from `servlens ingest --format json`: 'typed' (the fast path) or
    'lines' (the line reader); empty when the summary is missing."""
    try:
        doc = json.loads(summary.read_text())
    except (OSError, ValueError):
        return []
    return [s.get("reader", "lines") for s in doc.get("sources", []) if s.get("kind", "requests") == "requests"]


def ratio(a: Measure, b: Measure, cpu: bool = False) -> float | None:
    """a / b of the medians: wall time, or CPU time with `cpu`."""
    x, y = (a.cpu_median, b.cpu_median) if cpu else (a.median, b.median)
    if x is None or y is None or y == 0:
        return None
    return x / y


def paired(a: Measure, b: Measure) -> str:
    """The ratio per repetition round (both steps ran back to back, so they shared the machine's load): median and
    range. On a shared machine this is steadier than the ratio of two medians."""
    if not a.wall_s or len(a.wall_s) != len(b.wall_s):
        return fmt_num(ratio(a, b))
    rounds = [x / y for x, y in zip(a.wall_s, b.wall_s) if y]
    if len(rounds) == 1:
        return f"{rounds[0]:.2f}"
    return f"{statistics.median(rounds):.2f} ({min(rounds):.2f}-{max(rounds):.2f})"


def fmt_num(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def tables(results: list[dict], repeat: int) -> str:
    lines = [f"| size | file | step | wall s (median of {repeat}) | range s | CPU s (median) | peak RSS MB | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        size = f"{label(r['size'])} {r['format']}"
        for name, meas in r["measures"].items():
            file_mb = r["file_bytes"] / 1e6 if name not in ("scan2", "compare") else (r["file_bytes"] + r["after_bytes"]) / 1e6
            if not meas.available or not meas.wall_s:
                lines.append(f"| {size} | {file_mb:.0f} MB | {name} | - | - | - | - | {meas.note} |")
                continue
            note = meas.note
            if name == "ingest" and meas.extra.get("rows") is not None:
                rows = meas.extra["rows"]
                lost = f" — {r['size'] - rows:,} REQUESTS LOST" if rows != r["size"] else ""
                note = (note + "; " if note else "") + f"{rows:,} rows in store{lost}"
                readers = meas.extra.get("readers") or []
                if readers:
                    note += f"; fast path read {readers.count('typed')}/{len(readers)} files"
            if meas.extra.get("report_bytes"):
                note = (note + "; " if note else "") + f"report {meas.extra['report_bytes'] / 1e6:.2f} MB"
            lines.append(f"| {size} | {file_mb:.0f} MB | {name} | {meas.median:.2f} | {meas.noise()} | "
                         f"{fmt_num(meas.cpu_median)} | {meas.peak_rss:.0f} | {note} |")
    lines += ["", "Ratios per repetition round, median (range); the targets from issue #7 in brackets:", "",
              "| size | ingest / scan [≤ 1.5] | analyze / scan [≤ 3] | pandas / analyze [≥ 10] | "
              "compare / scan both [≤ 3] | pandas / scan | s per 1M rows (scan, ingest, analyze) |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        ms = r["measures"]
        per_m = lambda meas: fmt_num(None if meas.median is None else meas.median / (r["size"] / 1e6))  # noqa: E731
        lines.append(f"| {label(r['size'])} {r['format']} | {paired(ms['ingest'], ms['scan'])} | "
                     f"{paired(ms['analyze'], ms['scan'])} | {paired(ms['pandas'], ms['analyze'])} | "
                     f"{paired(ms['compare'], ms['scan2'])} | {paired(ms['pandas'], ms['scan'])} | "
                     f"{per_m(ms['scan'])}, {per_m(ms['ingest'])}, {per_m(ms['analyze'])} |")
    lines += ["", "The same ratios in CPU time (user + system, medians): steadier than wall time when neighbours share "
              "the cores, though it does not count waiting.", "",
              "| size | ingest / scan | analyze / scan | pandas / analyze | compare / scan both |", "|---|---|---|---|---|"]
    for r in results:
        ms = r["measures"]
        cells = [fmt_num(ratio(ms[a], ms[b], cpu=True))
                 for a, b in (("ingest", "scan"), ("analyze", "scan"), ("pandas", "analyze"), ("compare", "scan2"))]
        lines.append(f"| {label(r['size'])} {r['format']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        ram = "RAM unknown"
    import duckdb

    versions = [f"Python {platform.python_version()}", f"duckdb {duckdb.__version__}"]
    try:
        import pandas

        versions.append(f"pandas {pandas.__version__}")
    except ImportError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    return (f"{cpu}, {os.cpu_count()} cores, {ram}; {platform.system()} {platform.release()}; "
            f"{', '.join(versions)}; servlens at {commit or 'unknown commit'}")


def write_results(path: Path, results: list[dict], argv: list[str], repeat: int, table: str, niceness: int) -> None:
    first = results[0]["manifest"] if results else {}
    text = f"""# servlens benchmark results

Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {machine()}.
The machine is shared (2 cores): every measured command ran at niceness {niceness}; the range column is the noise.

Command: `python benchmarks/run.py {' '.join(argv)}`

Data: `benchmarks/generate.py`, formats {', '.join(sorted({f"`{r['format']}`" for r in results})) or '-'}, one day of gateway traffic with
incidents {', '.join(f'`{s}`' for s in BENCH_INCIDENTS)}; the pair's after run (another seed) carries the known
regression `{BENCH_REGRESSION}`. Bytes per request: {', '.join(f"{label(r['size'])}: {r['file_bytes'] / r['size']:.0f}" for r in results)}.

Steps: `scan` = DuckDB `read_json` of the file materialising the fields ingest reads into an on-disk table (the
practical limit); `ingest` = `servlens ingest`; `analyze` = `servlens analyze` end to end (ingest + every rule + HTML);
`scan2` = the scan of both files of the pair; `compare` = `servlens compare before after`; `pandas` =
`pandas.read_json(lines=True)`. Each is a fresh child process (interpreter start included) with a fresh store;
CPU s is the command's user + system time and peak RSS its own maximum resident set (`wait4` in a small launcher
process).

{table}
"""
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n" + __doc__.split("Example:\n", 1)[1])
    ap.add_argument("--sizes", default="100k,1M", help="comma-separated request counts (100k, 1M, 10M)")
    ap.add_argument("--format", default="litellm,litellm-lean",
                    help=f"comma-separated formats, each one of {', '.join(FORMAT_CHOICES)} (-lean: no message text)")
    ap.add_argument("--redact", action="store_true",
                    help="no message or answer text in the logs (LiteLLM turn_off_message_logging): lean rows")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pandas-max", default="1M", help="largest size to run pandas on (it also must fit in RAM)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", default=str(HERE / "data"), help="where generated logs are kept (reused across runs)")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the results file to write ('-' for none)")
    ap.add_argument("--smoke", action="store_true", help="tiny size, one repetition: checks that the harness works")
    ap.add_argument("--nice", type=int, default=10, help="niceness of the measured commands (shared machine)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeat = "2000", 1
    sizes = [generate.parse_count(s) for s in args.sizes.split(",")]
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMAT_CHOICES]
    if bad:
        ap.error(f"--format {', '.join(bad)}: each must be one of {', '.join(FORMAT_CHOICES)}")
    available = {cmd: command_available(cmd) for cmd in ("ingest", "analyze", "compare")}
    print("servlens commands available: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in available.items()))
    data_dir = Path(args.data)
    results = []
    with tempfile.TemporaryDirectory(prefix="servlens-bench-", dir=data_dir if data_dir.exists() else None) as tmp:
        for fmt in formats:
            for size in sizes:
                results.append(bench_size(size, fmt, data_dir, Path(tmp) / f"{fmt}-{label(size)}", args.repeat,
                                          generate.parse_count(args.pandas_max), available, args.seed, args.nice,
                                          args.redact))
    table = tables(results, args.repeat)
    print()
    print(table)
    if args.out != "-":
        write_results(Path(args.out), results, argv, args.repeat, table, args.nice)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
