"""The workload profile: what the traffic looked like, beside the findings (issue 8).

For each run of an analysis: request rate over time, its peak window and its busiest clock second and minute;
prompt and output lengths per model (percentiles and log2 histograms); how often requests share a prefix and how
much of their prompts an unbounded cache could reuse (prefix_key groups, or block hashes in attrs.prefix_blocks);
concurrency over time (overlap of arrival..end intervals, or engine gauges); TTFT/TPOT/e2e percentiles per model
and per window when latencies exist; the context per sequence the engine settings imply, when known.

Traces with no latencies (Mooncake, Azure, BurstGPT) still get rate, lengths and sharing; the parts that need
latencies or end times say so in a `note` instead of showing zeros (unknown is not zero).

DuckDB does every aggregation; its results come into Python as polars frames (servlens.store.frames), which fill
the empty buckets and bands and lay out the tables and chart series. Charts are bounded: at most MAX_BUCKETS time
buckets per series and a fixed set of length bands, so the report does not grow with the input.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import duckdb
import polars as pl

from servlens.analysis.detectors._common import chart, rounded, table
from servlens.analysis.failures import failed
from servlens.analysis.vocabulary import band_range, length_band, status_known
from servlens.analysis.windows import PEAK_WINDOW_S, iso, window_width
from servlens.store import metric_roles
from servlens.store.frames import first_row, frame

# Every percentile here is one of these: one quantile state per column for all three (DuckDB merges identical
# aggregates), a third of the memory of three percentile_cont states. Quantile states hold every value and do not
# spill, so at 10M requests under a 1 GB memory limit three per column ran out of memory (benchmarks/RESULTS.md).
_QUANTILES = (0.5, 0.9, 0.99)


def shared_quantile(expr: str, quantile: float) -> str:
    """The `quantile` (one of _QUANTILES) of `expr`, interpolated as percentile_cont, read from the one quantile
    state of `expr` that every _QUANTILES percentile shares (the detectors' _common.q is one state per quantile)."""
    return f"quantile_cont({expr}, [{', '.join(map(str, _QUANTILES))}])[{_QUANTILES.index(quantile) + 1}]"

MAX_BUCKETS = 240
# The busiest clock-aligned second and minute beside the peak window: a 30-minute mean hides a 1-second burst
# (a public trace read 3.7 req/s where 67 requests came in one second). (JSON key, date_trunc unit, seconds)
PEAK_RESOLUTIONS = (("peak_1s", "second", 1), ("peak_1min", "minute", 60))
# Readable bucket widths beyond the analysis windows' 1 min: long traces (a day) still get at most MAX_BUCKETS points.
WIDE_STEPS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
MAX_MODELS = 8
MAX_HISTOGRAM_MODELS = 4
MAX_PREFIX_GROUPS = 10
BLOCKS_EXPR = "CAST(json_extract(attrs, '$.prefix_blocks') AS BIGINT[])"
# Rows whose attrs hold block hashes. The JSON is parsed only where the key occurs (ingest writes keys literally):
# parsing every row's attrs (here and for the context budget) was half the workload profile's time on 1M
# LiteLLM rows, which carry neither.
HAS_BLOCKS_SQL = "contains(attrs, '\"prefix_blocks\"') AND json_extract(attrs, '$.prefix_blocks') IS NOT NULL"
RUNNING_GAUGES = metric_roles.names("running")
WAITING_GAUGES = metric_roles.names("waiting")


def bucket_width(span_s: float) -> float:
    """The analysis window width (1 s .. 1 min), widened to a readable step when that gives over MAX_BUCKETS."""
    width = window_width(span_s)
    if span_s / width <= MAX_BUCKETS:
        return width
    for step in WIDE_STEPS_S:
        if span_s / step <= MAX_BUCKETS:
            return float(step)
    return float(math.ceil(span_s / MAX_BUCKETS))


def workload_profile(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict:
    """The document's `workload` key: a one-line summary per run and the profile of each run."""
    profiles = {run: run_profile(con, run) for run in runs}
    # The one-line summaries lead; each run's profile below does not repeat its own.
    return {"summary": [p.pop("summary") for p in profiles.values()], "runs": profiles}


def workload_requests_sql(run: str) -> str:
    """The one run's requests every workload query reads, with their arrival (t_at) and end (t_done)."""
    return ("SELECT *, coalesce(t_arrival, t_first_token, t_end) AS t_at, "
            "coalesce(t_end, t_arrival + to_microseconds(CAST(e2e_s * 1e6 AS BIGINT))) AS t_done "
            f"FROM requests WHERE run = {_literal(run)}")


# The run's counts the profile starts from (also on the engines: servlens/engines/analysis.py).
BASE_SQL = """SELECT count(*) AS n, min(t_at) AS t0, max(t_at) AS t1, count(t_at) AS timed,
                               count(DISTINCT model) AS models, count(prompt_tokens) AS with_prompt,
                               count(completion_tokens) AS with_output, count(ttft_s) AS with_ttft,
                               count(tpot_s) AS with_tpot, count(e2e_s) AS with_e2e, count(t_done) AS with_end,
                               count(prefix_key) AS with_prefix_key,
                               count(*) FILTER (WHERE {failed}) AS errors,
                               count(*) FILTER (WHERE {known}) AS with_status,
                               count(http_status) + count(error_type) + count(finish_reason) + count(error_message)
                                 AS error_fields
                        FROM workload_requests""".format(failed=failed(), known=status_known())


def span_s(base: dict) -> float:
    return (base["t1"] - base["t0"]).total_seconds() if base["t0"] is not None else 0.0


def base_facts(base: dict) -> dict:
    """Start, end, span, mean rate and error share from BASE_SQL's row."""
    span = span_s(base)
    return {
        "start": iso(base["t0"]), "end": iso(base["t1"]), "span_s": rounded(span, 3),
        "mean_rate_rps": rounded(base["n"] / span, 4) if span > 0 else None,
        # a status with no error field anywhere in the run (traces) says nothing about failures
        "error_share": rounded(base["errors"] / base["with_status"], 4) if base["with_status"] and base["error_fields"]
        else None,
    }


def run_profile(con: duckdb.DuckDBPyConnection, run: str) -> dict:
    con.execute("CREATE OR REPLACE TEMP VIEW workload_requests AS " + workload_requests_sql(run))
    relative = bool(first_row(con, "SELECT coalesce(bool_or(relative_clock), false) AS r FROM runs WHERE run = ?",
                         [run]).get("r"))
    base = first_row(con, BASE_SQL)
    profile: dict[str, Any] = {"run": run, "requests": base["n"], "relative_clock": relative}
    if not base["n"]:
        profile["note"] = "no request logs in this run (metrics only): the workload is described by the engine gauges"
        gauges = _gauge_concurrency(con, run, None)
        series = gauges.pop("series", [])
        profile["concurrency"] = gauges | ({"chart": chart("step", "Running and waiting requests (engine gauges)",
                                                           "time", "requests", series, x_time=True)} if series else {})
        profile["summary"] = f"{run}: no request logs (metrics only)."
        return profile
    span = span_s(base)
    profile |= base_facts(base)
    width = bucket_width(span)
    rate = _rate(con, base["t0"], span, width) if base["timed"] else None
    if rate:
        profile["rate"] = rate
    profile["lengths"] = _lengths(con, base)
    profile["prefix_sharing"] = _sharing(con, base)
    profile["concurrency"] = _concurrency(con, run, base, span, width)
    profile["latency"] = _latency(con, base, width)
    profile["context_budget"] = _context_budget(con, run)
    profile["summary"] = _summary(run, profile)
    return profile


def _literal(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _offset(t0: datetime, column: str) -> str:
    return f"(date_diff('microsecond', TIMESTAMP '{t0.isoformat(sep=' ')}', {column}) / 1e6)"


def _rate(con: duckdb.DuckDBPyConnection, t0: datetime, span: float, width: float) -> dict:
    """Requests per second per bucket, and the busiest peak-length stretch (30 min, or a quarter of a shorter run)."""
    buckets = frame(con, f"""
        SELECT CAST(floor({_offset(t0, 't_at')} / {width}) AS INTEGER) AS b, count(*) AS n
        FROM workload_requests WHERE t_at IS NOT NULL GROUP BY 1 ORDER BY 1""")
    count = max(1, math.floor(span / width) + 1)
    x = [iso(t0 + timedelta(seconds=i * width)) for i in range(count)]
    # The last bucket is cut by the end of the data: its rate is over the time it covers (at least 1 s).
    covered = [width] * (count - 1) + [max(1.0, min(width, span - (count - 1) * width))]
    # Every bucket of the span, the empty ones as 0 requests.
    per_bucket = (pl.DataFrame({"b": range(count), "covered": covered}, schema={"b": pl.Int32, "covered": pl.Float64})
                  .join(buckets, on="b", how="left", maintain_order="left").with_columns(pl.col("n").fill_null(0)))
    y = [rounded(v, 4) for v in (per_bucket["n"] / per_bucket["covered"]).to_list()]
    peak_s = max(width, min(PEAK_WINDOW_S, span / 4))
    k = max(1, round(peak_s / width))
    # The peak stretch: the k consecutive buckets with the most requests, the earliest on a tie (a sliding sum over
    # at most MAX_BUCKETS counts, here rather than in SQL: every engine gives the same counts, not the same series
    # generator).
    counts = per_bucket["n"].to_list()
    sums = [sum(counts[b:b + k]) for b in range(max(count - k, 0) + 1)]
    best = max(range(len(sums)), key=lambda b: (sums[b], -b))
    peak = {"b": best, "n": sums[best]}
    start = t0 + timedelta(seconds=peak["b"] * width)
    peak_len = min(k * width, max(span, width))
    mean = buckets["n"].sum() / max(span, width)
    peak_rate = peak["n"] / peak_len
    lo, hi = peak["b"] * width, peak["b"] * width + peak_len
    in_peak = first_row(con, f"""SELECT {shared_quantile('ttft_s', 0.99)} AS ttft_p99, {shared_quantile('tpot_s', 0.99)} AS tpot_p99,
                                   {shared_quantile('e2e_s', 0.99)} AS e2e_p99
                            FROM workload_requests WHERE {_offset(t0, 't_at')} >= {lo} AND {_offset(t0, 't_at')} < {hi}""")
    peak_window = {"start": iso(start), "end": iso(start + timedelta(seconds=peak_len)), "length_s": peak_len,
                   "requests": peak["n"], "rate_rps": rounded(peak_rate, 4),
                   "vs_mean_rate": rounded(peak_rate / mean, 3) if mean else None,
                   "ttft_p99_s": rounded(in_peak["ttft_p99"]), "tpot_p99_s": rounded(in_peak["tpot_p99"], 6),
                   "e2e_p99_s": rounded(in_peak["e2e_p99"])}
    busiest = max(y) if y else 0
    peaks = {key: _peak_at(con, unit, seconds, span) for key, unit, seconds in PEAK_RESOLUTIONS}
    return {
        "bucket_s": width, **peaks, "peak_window": peak_window, "busiest_bucket_rps": busiest,
        "chart": chart("line", "Request rate", "time", "requests per second", [{"name": "requests/s", "x": x, "y": y}],
                       x_time=True, vspans=[{"x0": peak_window["start"], "x1": peak_window["end"],
                                             "label": f"peak {peak_len:g} s window"}]),
    }


def _peak_at(con: duckdb.DuckDBPyConnection, unit: str, seconds: int, span: float) -> dict | None:
    """The clock-aligned `unit` (second, minute) with the most arrivals, the earliest on a tie.

    None when the run is shorter than one `unit`: every bucket would be cut by the data's edges, so its rate
    would read lower than the run's mean (unknown, not a low peak).
    """
    if span < seconds:
        return None
    row = first_row(con, f"""SELECT date_trunc('{unit}', t_at) AS t, count(*) AS n FROM workload_requests
                        WHERE t_at IS NOT NULL GROUP BY 1 ORDER BY n DESC, t LIMIT 1""")
    return {"start": iso(row["t"]), "end": iso(row["t"] + timedelta(seconds=seconds)), "requests": row["n"],
            "rate_rps": rounded(row["n"] / seconds, 4)}


def _top_models(con: duckdb.DuckDBPyConnection) -> list[str | None]:
    return frame(con, f"""
        SELECT model, count(*) AS n FROM workload_requests GROUP BY model ORDER BY n DESC, model NULLS LAST
        LIMIT {MAX_MODELS}""")["model"].to_list()


def _model_filter(models: list[str | None]) -> str:
    named = [m for m in models if m is not None]
    parts = []
    if named:
        parts.append("model IN (" + ", ".join(_literal(m) for m in named) + ")")
    if None in models:
        parts.append("model IS NULL")
    return "(" + " OR ".join(parts or ["FALSE"]) + ")"


def _lengths(con: duckdb.DuckDBPyConnection, base: dict) -> dict:
    if not base["with_prompt"] and not base["with_output"]:
        return {"note": "no prompt or output token counts in these sources"}
    models = _top_models(con)
    where = _model_filter(models)
    stats = frame(con, f"""
        SELECT coalesce(model, '(no model)') AS model, count(*) AS requests,
               count(prompt_tokens) AS with_prompt_tokens,
               {shared_quantile('prompt_tokens', 0.5)} AS prompt_p50, {shared_quantile('prompt_tokens', 0.9)} AS prompt_p90,
               {shared_quantile('prompt_tokens', 0.99)} AS prompt_p99, max(prompt_tokens) AS prompt_max,
               count(completion_tokens) AS with_output_tokens,
               {shared_quantile('completion_tokens', 0.5)} AS output_p50, {shared_quantile('completion_tokens', 0.9)} AS output_p90,
               {shared_quantile('completion_tokens', 0.99)} AS output_p99, max(completion_tokens) AS output_max
        FROM workload_requests WHERE {where} GROUP BY model ORDER BY requests DESC, model""")
    columns = ["model", "requests", "with prompt tokens", "prompt p50", "prompt p90", "prompt p99", "prompt max",
               "with output tokens", "output p50", "output p90", "output p99", "output max"]
    out: dict[str, Any] = {"per_model": table(columns, stats.rows())}
    # One chart for both (the same log2 bands), the busiest MAX_HISTOGRAM_MODELS models: the page has a chart budget.
    shown = _model_filter(models[:MAX_HISTOGRAM_MODELS])
    hist = frame(con, f"""
        SELECT kind, coalesce(model, '(no model)') AS model, band, count(*) AS n FROM (
            SELECT 'prompt' AS kind, model, {length_band('prompt_tokens')} AS band FROM workload_requests
            WHERE prompt_tokens IS NOT NULL AND {shown}
            UNION ALL
            SELECT 'output', model, {length_band('completion_tokens')} FROM workload_requests
            WHERE completion_tokens IS NOT NULL AND {shown})
        GROUP BY 1, 2, 3 ORDER BY 1 DESC, 2, 3""")
    if hist.height:
        # Every band between the shortest and the longest, empty ones too, so the x axis is not distorted.
        bands = list(range(hist["band"].min(), hist["band"].max() + 1))
        grid = (hist.select("kind", "model").unique(maintain_order=True)
                .join(pl.DataFrame({"band": bands}, schema={"band": hist.schema["band"]}), how="cross",
                      maintain_order="left_right")
                .join(hist, on=["kind", "model", "band"], how="left", maintain_order="left")
                .with_columns(pl.col("n").fill_null(0)))
        one_model = hist["model"].n_unique() == 1
        series = [{"name": kind if model == "(no model)" and one_model else f"{kind} ({model})",
                   "x": [band_range(b) for b in bands], "y": counts}
                  for kind, model, counts in grid.group_by("kind", "model", maintain_order=True)
                  .agg(pl.col("n")).iter_rows()]
        out["histogram"] = chart("bar", "Prompt and output length", "tokens (log2 band)", "requests",
                                 series)
    return out


def _sharing(con: duckdb.DuckDBPyConnection, base: dict) -> dict:
    """Prefix-key groups (repeat share, top groups) and block-hash reuse with an unbounded cache."""
    out: dict[str, Any] = {}
    if base["with_prefix_key"]:
        s = first_row(con, """
            WITH g AS (SELECT prefix_key, count(*) AS n FROM workload_requests WHERE prefix_key IS NOT NULL GROUP BY 1)
            SELECT sum(n) AS keyed, count(*) AS keys, sum(CASE WHEN n >= 2 THEN n ELSE 0 END) AS in_shared_groups,
                   sum(n - 1) AS repeats, count(CASE WHEN n >= 2 THEN 1 END) AS shared_groups FROM g""")
        out |= {"requests_with_prefix_key": s["keyed"], "distinct_prefixes": s["keys"],
                "repeated_prefix_groups": s["shared_groups"],
                "share_in_shared_groups": rounded(s["in_shared_groups"] / s["keyed"], 4),
                "repeat_share": rounded(s["repeats"] / s["keyed"], 4)}
        groups = frame(con, f"""
            SELECT left(prefix_key, 12) AS prefix, count(*) AS requests, {shared_quantile('prompt_tokens', 0.5)} AS prompt_p50,
                   min(t_at) AS first_seen, max(t_at) AS last_seen
            FROM workload_requests WHERE prefix_key IS NOT NULL GROUP BY prefix_key HAVING count(*) >= 2
            ORDER BY requests DESC, prefix LIMIT {MAX_PREFIX_GROUPS}""")
        if groups.height:
            out["largest_groups"] = table(["prefix key (first 12)", "requests", "prompt tokens p50", "first seen",
                                           "last seen"],
                                          [[prefix, n, p50, iso(first), iso(last)]
                                           for prefix, n, p50, first, last in groups.iter_rows()])
    has_blocks = first_row(con, f"SELECT count(*) AS n FROM workload_requests WHERE {HAS_BLOCKS_SQL}").get("n")
    if has_blocks:
        b = first_row(con, f"""
            WITH r AS (SELECT row_number() OVER (ORDER BY t_at, source_line, request_id) AS seq, {BLOCKS_EXPR} AS blocks
                       FROM workload_requests WHERE {HAS_BLOCKS_SQL}),
                 b AS (SELECT seq, unnest(blocks) AS block FROM r),
                 firsts AS (SELECT block, min(seq) AS first_seq FROM b GROUP BY block),
                 marked AS (SELECT b.seq, b.seq > f.first_seq AS reused FROM b JOIN firsts f USING (block))
            SELECT count(*) AS blocks, count(CASE WHEN reused THEN 1 END) AS reused,
                   count(DISTINCT seq) AS requests, count(DISTINCT CASE WHEN reused THEN seq END) AS reusing
            FROM marked""")
        out |= {"requests_with_block_hashes": b["requests"], "prompt_blocks": b["blocks"],
                "reusable_block_share": rounded(b["reused"] / b["blocks"], 4) if b["blocks"] else None,
                "requests_reusing_a_block": b["reusing"],
                "block_note": "share of prompt blocks an earlier request already had: what an unbounded prefix "
                              "cache could serve"}
    if not out:
        out["note"] = "no prefix keys and no block hashes in these sources: prefix sharing is unknown"
    return out


def _concurrency(con: duckdb.DuckDBPyConnection, run: str, base: dict, span: float, width: float) -> dict:
    """In-flight requests from arrival..end overlap (an event sweep in SQL), and the engine's gauges when scraped."""
    out: dict[str, Any] = {}
    series = []
    if base["with_end"] and base["timed"]:
        t0 = first_row(con, "SELECT min(t_at) AS t0 FROM workload_requests")["t0"]
        # +1 at arrival, -1 at end: the running sum after each event is the number in flight. At equal times ends
        # come first, so back-to-back requests do not count as overlapping.
        con.execute("""
            CREATE OR REPLACE TEMP TABLE workload_inflight AS
            WITH ev AS (
                SELECT t_at AS t, 1 AS d FROM workload_requests WHERE t_at IS NOT NULL AND t_done IS NOT NULL
                UNION ALL
                SELECT greatest(t_done, t_at), -1 FROM workload_requests WHERE t_at IS NOT NULL AND t_done IS NOT NULL)
            SELECT t, d, sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS inflight FROM ev""")
        stats = frame(con, f"""SELECT CAST(floor({_offset(t0, 't')} / {width}) AS INTEGER) AS b, max(inflight) AS peak
                                FROM workload_inflight GROUP BY 1 ORDER BY 1""")
        overall = first_row(con, f"""SELECT max(inflight) AS peak, {shared_quantile('inflight', 0.5)} AS p50, {shared_quantile('inflight', 0.99)} AS p99
                                 FROM workload_inflight WHERE d = 1""")
        con.execute("DROP TABLE workload_inflight")
        out |= {"source": "request arrival..end overlap", "in_flight_max": overall["peak"],
                "in_flight_at_arrival_p50": rounded(overall["p50"]), "in_flight_at_arrival_p99": rounded(overall["p99"])}
        series.append({"name": "in flight, from the logs (max)",
                       "x": [iso(t0 + timedelta(seconds=b * width)) for b in stats["b"]], "y": stats["peak"].to_list()})
    else:
        out["note"] = "no end times or e2e latencies: concurrency from the requests is unknown"
    gauges = _gauge_concurrency(con, run, width)
    series += gauges.pop("series", [])
    out |= gauges
    if series:
        out["chart"] = chart("step", "Requests in flight" + (" and engine gauges" if gauges else ""), "time", "requests",
                             series, x_time=True)
    return out


def _gauge_concurrency(con: duckdb.DuckDBPyConnection, run: str, width: float | None) -> dict:
    """Running and waiting requests from the engine's gauges (sum over series per scrape, max per bucket)."""
    found = {}
    names = RUNNING_GAUGES + WAITING_GAUGES
    listed = ", ".join(_literal(n) for n in names)
    present = frame(con, f"""SELECT DISTINCT name FROM metric_samples
                             WHERE run = {_literal(run)} AND name IN ({listed}) AND series = 'value'""")["name"].to_list()
    running = next((n for n in RUNNING_GAUGES if n in present), None)
    waiting = next((n for n in WAITING_GAUGES if n in present), None)
    if running is None and waiting is None:
        return {}
    span = first_row(con, f"SELECT min(ts) AS t0, max(ts) AS t1 FROM metric_samples WHERE run = {_literal(run)}")
    t0 = span["t0"]
    width = width or bucket_width((span["t1"] - t0).total_seconds())
    series = []
    for label, name in (("running", running), ("waiting", waiting)):
        if name is None:
            continue
        rows = frame(con, f"""
            SELECT CAST(floor({_offset(t0, 'ts')} / {width}) AS INTEGER) AS b, max(v) AS v FROM (
                SELECT ts, sum(value) AS v FROM metric_samples
                WHERE run = {_literal(run)} AND name = {_literal(name)} AND series = 'value' GROUP BY ts)
            GROUP BY 1 ORDER BY 1""")
        found[f"engine_{label}_gauge"] = name
        found[f"engine_{label}_max"] = rows["v"].max()
        series.append({"name": f"{name} (max)", "x": [iso(t0 + timedelta(seconds=b * width)) for b in rows["b"]],
                       "y": [rounded(v) for v in rows["v"]]})
    found["series"] = series
    return found


def _latency(con: duckdb.DuckDBPyConnection, base: dict, width: float) -> dict:
    if not (base["with_ttft"] or base["with_tpot"] or base["with_e2e"]):
        return {"note": "no latencies in these sources (TTFT, TPOT, e2e unknown): latency rules are not evaluable, "
                        "the workload is described by arrivals and lengths"}
    models = _top_models(con)
    where = _model_filter(models)
    per_model = frame(con, f"""
        SELECT coalesce(model, '(no model)') AS model, count(ttft_s) AS with_ttft,
               {shared_quantile('ttft_s', 0.5)} AS ttft_p50, {shared_quantile('ttft_s', 0.9)} AS ttft_p90, {shared_quantile('ttft_s', 0.99)} AS ttft_p99,
               count(tpot_s) AS with_tpot, {shared_quantile('tpot_s', 0.5)} AS tpot_p50, {shared_quantile('tpot_s', 0.99)} AS tpot_p99,
               count(e2e_s) AS with_e2e, {shared_quantile('e2e_s', 0.5)} AS e2e_p50, {shared_quantile('e2e_s', 0.99)} AS e2e_p99
        FROM workload_requests WHERE {where} GROUP BY model ORDER BY count(*) DESC, model""")
    out: dict[str, Any] = {"per_model": table(
        ["model", "with TTFT", "TTFT p50 (s)", "TTFT p90 (s)", "TTFT p99 (s)", "with TPOT", "TPOT p50 (s)",
         "TPOT p99 (s)", "with e2e", "e2e p50 (s)", "e2e p99 (s)"], per_model.rows())}
    if not base["timed"]:
        out["note"] = "no arrival, first-token or end times: latency per window is unknown"
        return out
    column = "ttft_s" if base["with_ttft"] else "e2e_s" if base["with_e2e"] else "tpot_s"
    name = {"ttft_s": "TTFT", "e2e_s": "e2e", "tpot_s": "TPOT"}[column]
    t0 = first_row(con, "SELECT min(t_at) AS t0 FROM workload_requests")["t0"]
    windows = frame(con, f"""
        SELECT CAST(floor({_offset(t0, 't_at')} / {width}) AS INTEGER) AS b, count({column}) AS n,
               {shared_quantile(column, 0.5)} AS p50, {shared_quantile(column, 0.99)} AS p99, {shared_quantile('tpot_s', 0.5)} AS tpot_p50,
               {shared_quantile('tpot_s', 0.99)} AS tpot_p99
        FROM workload_requests WHERE {column} IS NOT NULL AND t_at IS NOT NULL GROUP BY 1 ORDER BY 1""")
    x = [iso(t0 + timedelta(seconds=b * width)) for b in windows["b"]]
    series = [{"name": f"{name} p50 (s)", "x": x, "y": [rounded(v) for v in windows["p50"]]},
              {"name": f"{name} p99 (s)", "x": x, "y": [rounded(v) for v in windows["p99"]]}]
    with_tpot = column != "tpot_s" and bool(base["with_tpot"])
    if with_tpot:
        # TPOT is milliseconds where TTFT is tenths of seconds: one chart on a log scale keeps both readable.
        series += [{"name": "TPOT p50 (s)", "x": x, "y": [rounded(v, 6) for v in windows["tpot_p50"]]},
                   {"name": "TPOT p99 (s)", "x": x, "y": [rounded(v, 6) for v in windows["tpot_p99"]]}]
    title = f"{name}" + (" and TPOT" if with_tpot else "") + f" per window ({width:g} s)"
    out["per_window"] = chart("line", title, "time", "seconds", series, x_time=True, y_log=with_tpot)
    if not base["with_ttft"]:
        out["note"] = "no TTFT in these sources (non-streamed or not logged): the window chart shows e2e"
    return out


def _context_budget(con: duckdb.DuckDBPyConnection, run: str) -> dict:
    """The context per sequence the engine settings imply, where the data tells it.

    llama.cpp splits --ctx-size between its --parallel slots; its context errors name the per-slot size
    (context_window), and attrs may carry n_ctx / parallel. vLLM's cache_config_info gives the KV cache size in
    tokens and the concurrency it supports at the longest context.
    """
    out: dict[str, Any] = {}
    # Each attrs path parsed only in rows whose text names its key (ingest writes keys literally); three plain paths,
    # not one list of paths, which only DuckDB reads.
    seen = first_row(con, """SELECT max(context_window) AS ctx, count(context_window) AS n,
                               max(TRY_CAST(CASE WHEN contains(attrs, '"n_ctx"')
                                                 THEN json_extract_string(attrs, '$.n_ctx') END AS BIGINT)) AS n_ctx,
                               max(TRY_CAST(CASE WHEN contains(attrs, '"n_ctx_per_slot"')
                                                 THEN json_extract_string(attrs, '$.n_ctx_per_slot') END AS BIGINT))
                                 AS per_slot,
                               max(TRY_CAST(CASE WHEN contains(attrs, '"parallel"')
                                                 THEN json_extract_string(attrs, '$.parallel') END AS BIGINT))
                                 AS parallel
                        FROM workload_requests""")
    per_seq = None
    if seen["per_slot"]:
        # llama.cpp's /props beside the log (servlens.ingest.engine_info): the context of one slot, and the slots.
        per_seq = seen["per_slot"]
        out |= {"parallel": seen["parallel"], "context_per_sequence": per_seq,
                "source": "llama.cpp /props: n_ctx of one slot (--ctx-size split between --parallel slots)"}
    elif seen["n_ctx"] and seen["parallel"]:
        per_seq = seen["n_ctx"] // seen["parallel"]
        out |= {"n_ctx": seen["n_ctx"], "parallel": seen["parallel"], "context_per_sequence": per_seq,
                "source": "n_ctx / parallel from the request attributes"}
    elif seen["ctx"]:
        per_seq = seen["ctx"]
        out |= {"context_per_sequence": per_seq, "source": f"context_window on {seen['n']} request(s) (the engine's "
                "context errors name the per-slot size: llama.cpp --ctx-size / --parallel)"}
    cfg = first_row(con, f"""SELECT labels['kv_cache_size_tokens'] AS kv_tokens,
                               labels['kv_cache_max_concurrency'] AS max_concurrency, labels['block_size'] AS block_size
                        FROM metric_samples WHERE run = {_literal(run)} AND name = 'vllm:cache_config_info'
                        ORDER BY ts DESC LIMIT 1""")
    if cfg and cfg.get("kv_tokens") not in (None, "None"):
        kv_tokens, max_conc = _number(cfg["kv_tokens"]), _number(cfg["max_concurrency"])
        out |= {"kv_cache_size_tokens": kv_tokens, "kv_cache_max_concurrency": max_conc,
                "kv_block_size": _number(cfg["block_size"])}
        if per_seq is None and kv_tokens and max_conc:
            # vLLM reports the concurrency its KV cache holds at full length: kv tokens / max_model_len.
            per_seq = round(kv_tokens / max_conc)
            out |= {"context_per_sequence": per_seq,
                    "source": "vLLM cache_config_info: kv_cache_size_tokens / kv_cache_max_concurrency (max_model_len)"}
    if per_seq:
        fit = first_row(con, f"""SELECT count(*) AS n,
                                   count(CASE WHEN prompt_tokens > {per_seq} THEN 1 END) AS prompt_over,
                                   count(CASE WHEN prompt_tokens + max_tokens > {per_seq} THEN 1 END) AS with_cap_over,
                                   count(max_tokens) AS with_cap
                            FROM workload_requests WHERE prompt_tokens IS NOT NULL""")
        out |= {"requests_with_prompt_over_budget": fit["prompt_over"],
                "requests_whose_prompt_plus_max_tokens_exceed_budget": fit["with_cap_over"] if fit["with_cap"] else None}
    if not out:
        out["note"] = "no engine context settings in these sources (context_window, n_ctx/parallel, vLLM cache config)"
    return out


def _number(value: Any) -> float | int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else number


def _summary(run: str, p: dict) -> str:
    parts = [f"{run}: {p['requests']:,} requests"]
    if p.get("span_s"):
        parts.append(f"over {duration(p['span_s'])}")
    peaks = peak_rates(p, named=True)
    if peaks:
        parts.append("peak " + ", ".join(peaks.values()))
    lengths = (p.get("lengths") or {}).get("per_model")
    if lengths and lengths["rows"]:
        top = lengths["rows"][0]
        if top[3] is not None:
            named = f" ({top[0]})" if top[0] != "(no model)" and len(lengths["rows"]) > 1 else ""
            parts.append(f"prompt p50/p99 {top[3]:.0f}/{top[5]:.0f} tokens{named}")
    sharing = p.get("prefix_sharing") or {}
    if sharing.get("reusable_block_share") is not None:
        parts.append(f"{sharing['reusable_block_share']:.0%} of prompt blocks reusable")
    elif sharing.get("repeat_share") is not None:
        parts.append(f"{sharing['repeat_share']:.0%} of requests repeat an earlier prefix")
    conc = p.get("concurrency") or {}
    if conc.get("in_flight_max") is not None:
        parts.append(f"up to {conc['in_flight_max']} in flight")
    latency = p.get("latency") or {}
    if "per_model" not in latency:
        parts.append("no latencies")
    budget = (p.get("context_budget") or {}).get("context_per_sequence")
    if budget:
        parts.append(f"{budget:,} tokens of context per sequence")
    return "; ".join(parts[:1] + [", ".join(parts[1:])]) + "." if len(parts) > 1 else parts[0] + "."


def peak_rates(p: dict, named: bool = False) -> dict[str, str]:
    """The run's peak request rates as short phrases, by resolution: '1 s' and '1 min' (the busiest clock
    second and minute: '13/s at T', or '13/s in 1 s at T' when `named`), 'window' (the busiest peak-length
    stretch); a resolution the run has no peak at is left out."""
    rate = p.get("rate") or {}
    out = {}
    for key, label in (("peak_1s", "1 s"), ("peak_1min", "1 min")):
        if rate.get(key):
            resolution = f" in {label}" if named else ""
            out[label] = f"{rate[key]['rate_rps']:.3g}/s{resolution} at {moment(rate[key]['start'], p)}"
    peak = rate.get("peak_window")
    if peak:
        over = f"{peak['rate_rps']:.3g}/s over {duration(peak['length_s'])} from {moment(peak['start'], p)}"
        out["window"] = f"{over} ({peak['vs_mean_rate']:.2g}x the mean)" if peak.get("vs_mean_rate") else over
    return out


def moment(time: str, p: dict) -> str:
    """A time of the profile as the reader should see it: ISO, or +hh:mm:ss on a relative clock."""
    return _relative(time, p) if p.get("relative_clock") else time


def _relative(moment: str, p: dict) -> str:
    """A relative-clock time as +hh:mm:ss from the epoch the trace's offsets start at."""
    seconds = (datetime.fromisoformat(moment.rstrip("Z")) - datetime(1970, 1, 1)).total_seconds()
    whole = int(seconds)
    return f"+{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"     # a burst of 50 requests in 11 ms is not "0.0 s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
