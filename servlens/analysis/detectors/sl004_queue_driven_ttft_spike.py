"""SL004 queue-driven TTFT spikes.

A window's TTFT p99 "jumps" when it is at least `spike_ratio` times (and `min_excess_s` more than) what a typical
request of the scope takes without waiting (the run's p50 of TTFT minus wait). The same requests then say why: their
wait (queue_s, else TTFT - prefill_s) is the share of TTFT spent queueing. Among the window's slow requests (TTFT at
or above the window's `tail_quantile`), a wait share of at least `min_queue_share` makes the spike queue-driven;
otherwise it is prefill-driven (long prompts, cache misses, slower compute) and the rule says so and stays clear.

Because the judgement compares each request with itself minus its wait, a run that is one burst from start to end
still shows the spike; a spike in the first window is named as a cold start or initial burst.

Without a per-request wait, a waiting-requests gauge (vLLM num_requests_waiting, llama.cpp requests_deferred) > 0
during a window whose TTFT p99 jumped above the run's TTFT p50 is the (weaker) queue evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, ratio, rounded, secs, table
from servlens.analysis.runner import DetectorContext, sql_literal
from servlens.analysis.vocabulary import WAIT
from servlens.analysis.windows import iso, merge_runs

# What this detector reads of its rule file; the loader checks it against the TOML both ways.
USES = {
    "params": [
        "min_requests", "min_window_requests", "spike_ratio", "min_excess_s", "min_queue_share",
        "tail_quantile", "prompt_growth_limit", "critical_ratio", "critical_share",
        "warmup_max_requests"
    ],
    "requires": ["histograms", "prefill_time", "queue_time", "waiting_gauge"],
}

# The wait of one request (NULL when unknown: never read as no wait).
WAIT_EXPR = WAIT


def _role_metric(ctx: DetectorContext, role: str, kind: str | None = None) -> str | None:
    """The metric that plays `role` in this scope (servlens/store/metric_roles.toml, via scope_role_samples): the
    most preferred name with samples, so one engine's series is read, never two engines' summed."""
    kind_filter = "" if kind is None else "AND name IN (SELECT name FROM metric_roles WHERE role = ? AND kind = ?)"
    row = ctx.one(f"""SELECT name FROM scope_role_samples WHERE role = ? {kind_filter}
                      GROUP BY name ORDER BY min(preference), name LIMIT 1""", [role] + ([role, kind] if kind else []))
    return row.get("name")


def _gauge_by_window(ctx: DetectorContext, role: str) -> tuple[str | None, dict[int, float]]:
    """The gauge playing `role`: its max per window (sum over series, e.g. several engines of one kind)."""
    name = _role_metric(ctx, role)
    if name is None:
        return None, {}
    found = ctx.rows(
        f"""SELECT w, max(v) AS v FROM (
                SELECT {ctx.window.index_sql('ts')} AS w, ts, sum(value) AS v FROM scope_role_samples
                WHERE role = ? AND name = ? AND series = 'value' GROUP BY ts)
            GROUP BY w""",
        [role, name],
    )
    return name, {row["w"]: row["v"] for row in found}


def _gauge_max(ctx: DetectorContext, role: str, first: int, last: int,
               per_scrape: str = "sum") -> tuple[str | None, float | None]:
    """The max of the gauge playing `role`, around windows first..last; at one scrape time its series are summed
    (requests waiting or running in several engines or servers) or, for a share such as KV cache usage, the fullest
    is taken (`per_scrape` "max": two engines at 60% and 70% are not 130% full).

    Gauges are sampled every few seconds and vLLM observes queue time when a request finishes, so the range is
    padded by two windows (at least 5 s) on each side to catch the scrape that saw the queue.
    """
    assert per_scrape in ("sum", "max")
    spec = ctx.window
    name = _role_metric(ctx, role)
    if name is None:
        return None, None
    pad = max(2 * spec.width_s, 5.0)
    lo = first * spec.width_s - pad
    hi = (last + 1) * spec.width_s + pad
    row = ctx.one(f"""SELECT max(v) AS v FROM (
                          SELECT ts, {per_scrape}(value) AS v FROM scope_role_samples
                          WHERE role = ? AND name = ? AND series = 'value' AND {spec.offset_sql('ts')} BETWEEN {lo} AND {hi}
                          GROUP BY ts)""", [role, name])
    return name, row.get("v")


@dataclass
class Scan:
    """What every part of one per-request judgement shares: the rows judged and the run's yardsticks."""

    ctx: DetectorContext
    base_where: str                 # the requests judged: a TTFT, a time, and (per request) a wait
    per_request_wait: bool          # wait per request (queue_s / prefill_s) rather than a waiting gauge
    n: int
    run: dict                       # the run's no-wait and TTFT quantiles, prompt p50
    windows: list[dict]             # per window: n, TTFT p99/p50, prompt p50, wait quantiles, queue share
    gauge_name: str | None          # the waiting gauge read, if any
    waiting: dict[int, float]       # its max per window
    threshold: float = 0.0          # the spike line
    peak: dict | None = None        # the peak_s stretch with the worst TTFT

    @property
    def baseline(self) -> float:
        return self.run["nowait_p50"]


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    per_request_wait = ctx.path_available("queue_time") or ctx.path_available("prefill_time")
    per_request = per_request_wait or ctx.path_available("waiting_gauge")
    if not per_request and ctx.path_available("histograms"):
        return _from_histograms(ctx)
    if ctx.window is None:
        return not_evaluable("no request has an arrival, first-token or end time (t_arrival, t_first_token, t_end)",
                             "Queue-driven TTFT spikes cannot be placed in time.")
    if per_request_wait:
        # A wait known for only some requests (a gateway log beside an engine's, a source that splits only part of
        # its rows) must not stand for all of them: judging the rest as "no wait" hides their queue. Per request
        # only when most TTFTs come with their wait; else the waiting gauge decides, or the rule is not evaluable.
        known = ctx.one(f"""SELECT count(*) AS n, count({WAIT_EXPR}) AS with_wait FROM scope_requests
                            WHERE ttft_s IS NOT NULL AND t_at IS NOT NULL""")
        per_request_wait = known["with_wait"] >= 0.5 * known["n"]
    base_where = "ttft_s IS NOT NULL AND t_at IS NOT NULL" + (f" AND {WAIT_EXPR} IS NOT NULL" if per_request_wait else "")
    n = ctx.one(f"SELECT count(*) AS n FROM scope_requests WHERE {base_where}")["n"]
    if n < p["min_requests"]:
        what = "TTFT and a wait measure (queue_s or prefill_s)" if per_request_wait else "TTFT"
        return not_evaluable(f"only {n} requests with {what}; the rule needs at least {p['min_requests']} (min_requests)",
                             "Too few requests to judge TTFT spikes.")
    run, windows = _run_and_windows(ctx, base_where, per_request_wait)
    gauge_name, waiting = _gauge_by_window(ctx, "waiting")
    if not per_request_wait and gauge_name is None:
        return not_evaluable("no per-request wait (queue_s, prefill_s) for most requests with a TTFT, and no "
                             "waiting-requests gauge", "Cannot tell queueing from prefill.")
    scan = Scan(ctx, base_where, per_request_wait, n, run, windows, gauge_name, waiting)
    scan.threshold = max(p["spike_ratio"] * scan.baseline, scan.baseline + p["min_excess_s"])
    scan.peak = _peak_window(ctx, base_where, windows)
    queue_windows, prefill_windows = _spike_windows(scan)
    the_chart = _chart(scan, queue_windows, prefill_windows)
    metrics = _run_metrics(scan)
    thresholds = {k: p[k] for k in ("spike_ratio", "min_excess_s", "min_queue_share", "tail_quantile",
                                    "min_window_requests", "min_requests")}
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}
    if queue_windows:
        return _queue_driven(scan, queue_windows, prefill_windows, evidence)
    if prefill_windows:
        return _prefill_driven(scan, prefill_windows, evidence)
    return {"state": "clear",
            "summary": f"No TTFT spike: TTFT p99 stayed under {secs(scan.threshold)} in every window of "
                       f"{ctx.window.width_s:g} s (no-wait TTFT p50 {secs(scan.baseline)}).",
            "evidence": evidence}


def _run_and_windows(ctx: DetectorContext, base_where: str, per_request_wait: bool) -> tuple[dict, list[dict]]:
    """The run's no-wait and TTFT quantiles; per window its TTFT, prompt and wait figures."""
    p = ctx.params
    nowait = f"(ttft_s - {WAIT_EXPR})" if per_request_wait else "ttft_s"
    run = ctx.one(f"""SELECT {q(nowait, 0.5)} AS nowait_p50, {q(nowait, 0.99)} AS nowait_p99,
                             {q('ttft_s', 0.5)} AS ttft_p50, {q('ttft_s', 0.99)} AS ttft_p99,
                             {q('prompt_tokens', 0.5)} AS prompt_p50
                      FROM scope_requests WHERE {base_where}""")
    wait_cols = (f""", {q(WAIT_EXPR, 0.5)} AS wait_p50, {q(WAIT_EXPR, 0.99)} AS wait_p99, {q(nowait, 0.99)} AS nowait_p99,
                    sum(CASE WHEN ttft_s >= tail THEN {WAIT_EXPR} END) / nullif(sum(CASE WHEN ttft_s >= tail THEN ttft_s END), 0)
                      AS queue_share""" if per_request_wait else
                 ", NULL AS wait_p50, NULL AS wait_p99, NULL AS nowait_p99, NULL AS queue_share")
    windows = ctx.rows(f"""
        WITH r AS (SELECT *, {ctx.window.index_sql()} AS w FROM scope_requests WHERE {base_where}),
             tails AS (SELECT w, {q('ttft_s', p['tail_quantile'])} AS tail FROM r GROUP BY w)
        SELECT w, count(*) AS n, {q('ttft_s', 0.99)} AS ttft_p99, {q('ttft_s', 0.5)} AS ttft_p50,
               {q('prompt_tokens', 0.5)} AS prompt_p50 {wait_cols}
        FROM r JOIN tails USING (w) GROUP BY w ORDER BY w""")
    return run, windows


def _spike_windows(scan: Scan) -> tuple[list[dict], list[dict]]:
    """The windows over the spike line, split into queue-driven and prefill-driven."""
    p = scan.ctx.params
    queue_windows, prefill_windows = [], []
    for win in scan.windows:
        if win["n"] < p["min_window_requests"] or win["ttft_p99"] is None or win["ttft_p99"] < scan.threshold:
            continue
        if scan.per_request_wait:
            queue_driven = (win["queue_share"] or 0.0) >= p["min_queue_share"]
        else:
            queue_driven = (scan.waiting.get(win["w"]) or 0) > 0
        (queue_windows if queue_driven else prefill_windows).append(win)
    return queue_windows, prefill_windows


def _chart(scan: Scan, queue_windows: list[dict], prefill_windows: list[dict]) -> dict:
    """TTFT p99 per window with the spikes shaded; for a run of a few windows, each request's TTFT instead."""
    ctx, spec, p = scan.ctx, scan.ctx.window, scan.ctx.params
    shown = [w for w in scan.windows if w["n"] >= 1]
    hline = [{"y": rounded(scan.threshold), "label": f"spike line ({p['spike_ratio']:g}x no-wait TTFT p50)"}]
    if len(shown) >= 5 or not scan.per_request_wait:
        x = [iso(spec.start(w["w"])) for w in shown]
        series = [{"name": "TTFT p99 (s)", "x": x, "y": [rounded(w["ttft_p99"]) for w in shown]}]
        if scan.per_request_wait:
            series.append({"name": "TTFT p99 without waiting (s)", "x": x, "y": [rounded(w["nowait_p99"]) for w in shown]})
            series.append({"name": "wait p99 (s)", "x": x, "y": [rounded(w["wait_p99"]) for w in shown]})
        vspans = [{"x0": iso(spec.start(a)), "x1": iso(spec.start(b + 1)), "label": label}
                  for found, label in ((queue_windows, "queue-driven spike"), (prefill_windows, "prefill-driven spike"))
                  for a, b in merge_runs([w["w"] for w in found])]
        peak = scan.peak
        if peak:
            vspans.append({"x0": peak["start"], "x1": peak["end"], "label": f"peak {spec.peak_s:g} s window"})
        return chart("line", "TTFT p99 per window", "time", "TTFT (s)", series, x_time=True, hlines=hline,
                     vspans=vspans)
    # A run of a few windows (one burst): a line through 1-4 points says nothing, so show each request's TTFT
    # and the part of it that was not waiting, in arrival order (at most 300 requests, evenly spaced).
    found = ctx.rows(f"""
        WITH r AS (SELECT ttft_s, ttft_s - {WAIT_EXPR} AS nowait,
                          row_number() OVER (ORDER BY t_at, source_line, request_id) AS k,
                          count(*) OVER () AS total
                   FROM scope_requests WHERE {scan.base_where})
        SELECT k, ttft_s, nowait FROM r WHERE (k - 1) % CAST(ceil(total / 300.0) AS INTEGER) = 0 ORDER BY k""")
    x = [row["k"] for row in found]
    return chart("scatter", "TTFT per request in arrival order, and its part without waiting",
                 "request (arrival order)", "TTFT (s)",
                 [{"name": "TTFT (s)", "x": x, "y": [rounded(r["ttft_s"]) for r in found]},
                  {"name": "TTFT without waiting (s)", "x": x, "y": [rounded(r["nowait"]) for r in found]}],
                 hlines=hline)


def _run_metrics(scan: Scan) -> dict:
    spec, peak = scan.ctx.window, scan.peak
    return {
        "requests": scan.n, "window_s": spec.width_s, "windows": len(scan.windows),
        "baseline_nowait_ttft_p50_s": rounded(scan.baseline), "run_ttft_p99_s": rounded(scan.run["ttft_p99"]),
        "run_prompt_tokens_p50": rounded(scan.run["prompt_p50"]),
        "peak_window_ttft_p99_s": rounded(peak["ttft_p99"]) if peak else None,
        "peak_window_start": peak["start"] if peak else None, "peak_window_end": peak["end"] if peak else None,
        "spike_line_s": rounded(scan.threshold),
        "wait_source": _wait_source(scan.ctx) if scan.per_request_wait else scan.gauge_name,
    }


def _prefill_driven(scan: Scan, prefill_windows: list[dict], evidence: dict) -> dict:
    """Clear: the TTFT jumped, but the slow requests were not waiting."""
    p, spec = scan.ctx.params, scan.ctx.window
    worst = max(prefill_windows, key=lambda w: w["ttft_p99"])
    growth = ratio(worst["prompt_p50"], scan.run["prompt_p50"])
    cause = (f"prompts {growth:.1f}x longer than the run's median" if growth and growth >= p["prompt_growth_limit"]
             else "prompt lengths about as usual, so slower prefill (cache misses, compute contention; see SL001)")
    share = worst["queue_share"]
    summary = (f"TTFT p99 jumped to {secs(worst['ttft_p99'])} in {len(prefill_windows)} window(s), but it is "
               f"prefill-driven, not queue-driven: "
               + (f"waiting is {share:.0%} of the slow requests' TTFT; " if share is not None else "no requests were waiting; ")
               + cause + ".")
    evidence["metrics"] |= {"spike_kind": "prefill-driven", "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
                            "queue_share": rounded(share), "prompt_growth": rounded(growth)}
    evidence["windows"] = [spec.bounds(a, b) for a, b in merge_runs([w["w"] for w in prefill_windows])]
    return {"state": "clear", "summary": summary, "evidence": evidence}


def _corroboration(scan: Scan, first: int, last: int) -> tuple[dict, list[str]]:
    """The engine's own capacity signals around the spike: waiting, running and KV gauges, preemptions."""
    ctx = scan.ctx
    waiting_name, waiting_max = _gauge_max(ctx, "waiting", first, last)
    running_name, running_max = _gauge_max(ctx, "running", first, last)
    _, kv_max = _gauge_max(ctx, "kv_usage", first, last, per_scrape="max")
    # Preemptions as a counter's increase (SGLang's retractions are a per-interval gauge: not summable as one).
    preemption_counter = _role_metric(ctx, "preemptions", kind="counter")
    preemptions = ctx.counter_increase(preemption_counter) if preemption_counter else None
    words = []
    if waiting_max:
        words.append(f"{waiting_name} reached {waiting_max:g}")
    elif waiting_max is not None:
        words.append(f"the scraped {waiting_name} stayed 0 (scrapes can miss a short queue)")
    if running_max is not None:
        words.append(f"{running_name} up to {running_max:g}")
    if kv_max is not None:
        words.append(f"KV cache usage up to {kv_max:.0%}")
    if preemptions:
        words.append(f"{preemptions:g} preemptions")
    return ({"waiting_max": waiting_max, "running_max": running_max, "kv_cache_usage_max": kv_max,
             "preemptions": preemptions}, words)


def _queue_driven(scan: Scan, queue_windows: list[dict], prefill_windows: list[dict], evidence: dict) -> dict:
    """Fired (or, for a handful of requests at the very start, warm-up and clear)."""
    ctx, p, spec = scan.ctx, scan.ctx.params, scan.ctx.window
    metrics = evidence["metrics"]
    worst = max(queue_windows, key=lambda w: w["ttft_p99"])
    runs = merge_runs([w["w"] for w in queue_windows])
    first, last = runs[0][0], runs[-1][1]
    cold_start = runs[0][0] == 0
    n_spike = sum(w["n"] for w in queue_windows)
    evidence["windows"] = [spec.bounds(a, b) for a, b in runs]
    in_spike = f"{scan.base_where} AND {spec.index_sql()} IN ({', '.join(str(w['w']) for w in queue_windows)})"
    share_all = None
    if scan.per_request_wait:
        agg = ctx.one(f"""SELECT sum({WAIT_EXPR}) / nullif(sum(ttft_s), 0) AS share,
                                 {q(WAIT_EXPR, 0.5)} AS wait_p50, {q(WAIT_EXPR, 0.99)} AS wait_p99
                          FROM scope_requests WHERE {in_spike}""")
        share_all = agg["share"]
        metrics |= {"wait_p50_s": rounded(agg["wait_p50"]), "wait_p99_s": rounded(agg["wait_p99"])}
    signals, corroboration = _corroboration(scan, first, last)

    # Warm-up, not capacity: the queue sits in the first windows of the data and only a handful of requests waited
    # (too few to be load), so what they waited behind was the first, cold prefills.
    span_windows = max(w["w"] for w in scan.windows) + 1
    if cold_start and last < max(2, 0.1 * span_windows) and n_spike <= p["warmup_max_requests"]:
        metrics |= {"spike_kind": "warm-up", "spike_requests": n_spike, "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
                    "cold_start": True, "queue_share": rounded(worst["queue_share"])}
        return {"state": "clear",
                "summary": f"TTFT p99 reached {secs(worst['ttft_p99'])} in the first window(s) of the data, but only "
                           f"{n_spike} requests waited: they queued behind the first, cold prefills. That is warm-up "
                           "(see SL007 cold-start), not a queue caused by load.",
                "evidence": evidence}

    growth = ratio(worst["prompt_p50"], scan.run["prompt_p50"])
    spike_ratio = ratio(worst["ttft_p99"], scan.baseline)
    target = (worst["nowait_p99"] + (worst["ttft_p99"] - worst["nowait_p99"]) / 2 if scan.per_request_wait
              else scan.baseline * p["spike_ratio"])
    metrics |= {
        "spike_kind": "queue-driven", "spike_windows": len(queue_windows), "spike_requests": n_spike,
        "worst_window_start": iso(spec.start(worst["w"])), "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
        "worst_nowait_ttft_p99_s": rounded(worst["nowait_p99"]), "observed_spike_ratio": rounded(spike_ratio),
        "queue_share": rounded(worst["queue_share"]), "queue_share_all_spike_requests": rounded(share_all),
        "spike_prompt_tokens_p50": rounded(worst["prompt_p50"]), "prompt_growth": rounded(growth),
        "cold_start": cold_start, **signals, "target_ttft_p99_s": rounded(target),
        "prefill_driven_windows": len(prefill_windows), "spike_request_share": rounded(n_spike / scan.n),
    }
    where_text = ("starting in the first window of the data (cold start or initial burst)" if cold_start
                  else f"from {iso(spec.start(first))}")
    explain = (f"waiting is {worst['queue_share']:.0%} of the slow requests' TTFT" if worst["queue_share"] is not None
               else f"{scan.gauge_name} > 0 during the spike")
    prompt_note = ("prompt lengths as usual" if growth is None or growth < p["prompt_growth_limit"]
                   else f"prompts also {growth:.1f}x longer than usual")
    summary = (f"TTFT p99 jumped to {secs(worst['ttft_p99'])} ({spike_ratio:.1f}x the {secs(scan.baseline)} a request "
               f"takes without waiting) in {len(queue_windows)} window(s) {where_text}; {explain}, {prompt_note}"
               + (f"; {', '.join(corroboration)}" if corroboration else "") + ".")
    spike_rows = [[iso(spec.start(w["w"])), w["n"], w["ttft_p99"], w["nowait_p99"], w["wait_p50"], w["queue_share"],
                   w["prompt_p50"], scan.waiting.get(w["w"])] for w in sorted(queue_windows, key=lambda w: w["w"])[:30]]
    evidence["table"] = table(["window start", "requests", "TTFT p99 (s)", "no-wait TTFT p99 (s)", "wait p50 (s)",
                               "wait share of slow requests", "prompt tokens p50", "waiting (gauge max)"], spike_rows)
    result = {"state": "fired", "summary": summary, "evidence": evidence,
              "examples": ctx.examples(in_spike, f"{WAIT_EXPR} DESC" if scan.per_request_wait else "ttft_s DESC")}
    # Severity follows user impact: a few slow windows are a tail (warning); a queue that held back most of the
    # scope's requests at many times their no-wait TTFT is an outage of capacity.
    if spike_ratio and spike_ratio >= p["critical_ratio"] and n_spike >= p["critical_share"] * scan.n:
        result["severity"] = "critical"
    return result


def _wait_source(ctx: DetectorContext) -> str:
    if ctx.has("queue_s") and ctx.has("prefill_s"):
        return "queue_s (else ttft_s - prefill_s)"
    return "queue_s" if ctx.has("queue_s") else "ttft_s - prefill_s"


def _peak_window(ctx: DetectorContext, base_where: str, windows: list[dict]) -> dict | None:
    """The peak_s-long stretch (starting at a window boundary) where TTFT was worst, with its exact TTFT p99.

    The stretch is chosen from the per-window p99s (the request-weighted mean over the windows it covers: a few
    dozen numbers, not rows), then one query computes its exact p99; an exact sliding p99 at every start would join
    each request to every stretch that covers it.
    """
    spec = ctx.window
    if not windows:
        return None
    span = max(1, round(spec.peak_s / spec.width_s))
    by_index = {w["w"]: w for w in windows}
    best, best_score = None, None
    for first in sorted(by_index):
        covered = [by_index[i] for i in range(first, first + span) if i in by_index]
        total = sum(w["n"] for w in covered)
        score = sum(w["n"] * w["ttft_p99"] for w in covered) / total
        if best_score is None or score > best_score:
            best, best_score = first, score
    lo, hi = best * spec.width_s, best * spec.width_s + spec.peak_s
    row = ctx.one(f"""SELECT count(*) AS n, {q('ttft_s', 0.99)} AS ttft_p99 FROM scope_requests
                      WHERE {base_where} AND {spec.offset_sql()} >= {lo} AND {spec.offset_sql()} < {hi}""")
    start = spec.t0 + timedelta(seconds=lo)
    return {"start": iso(start), "end": iso(start + timedelta(seconds=spec.peak_s)), "ttft_p99": row["ttft_p99"],
            "n": row["n"]}


def _histogram_intervals(ctx: DetectorContext) -> tuple[dict[str, str | None], list[dict]]:
    """Per scrape interval, the increases of the TTFT, queue-time and prefill-time histograms' sum and count (the
    metric of each role the scope has, metric_roles.toml)."""
    names = {part: _role_metric(ctx, f"{part}_histogram") for part in ("ttft", "queue_time", "prefill_time")}
    cols = ", ".join(
        f"sum(increase) FILTER (WHERE name = {sql_literal(name)} AND series = '{series}') AS {part}_{series}"
        for part, name in names.items() if name for series in ("sum", "count"))
    found = ctx.rows(f"""
        SELECT ts, min(prev_ts) AS prev_ts, {cols}
        FROM scope_counter_increases WHERE name IN ({', '.join(sql_literal(n) for n in names.values() if n)})
        GROUP BY ts ORDER BY ts""")
    for r in found:
        for part in names:
            r.setdefault(f"{part}_sum", None)
            r.setdefault(f"{part}_count", None)
        r["ttft_mean"] = r["ttft_sum"] / r["ttft_count"] if r["ttft_count"] else None
    return names, found


def _from_histograms(ctx: DetectorContext) -> dict:
    """Scrapes only: per scrape interval, mean TTFT (histogram sum/count increases) against the mean prefill time
    (TTFT without the queue); the queue share is the queue-time sum over the TTFT sum around the spike.

    Means, not p99 (the buckets are too coarse for a tail), and vLLM observes queue time when a request finishes
    but TTFT at its first token, so the queue sum runs two scrapes past the spike.
    """
    p = ctx.params
    names, found = _histogram_intervals(ctx)
    total_n = sum(r["ttft_count"] or 0 for r in found)
    if total_n < p["min_requests"]:
        return not_evaluable(f"the TTFT histogram counted only {total_n:g} requests between scrapes; the rule needs at "
                             f"least {p['min_requests']} (min_requests)", "Too few requests to judge TTFT spikes.")
    intervals = [r for r in found if r["ttft_count"]]
    prefill_n = sum(r["prefill_time_count"] or 0 for r in found)
    if prefill_n:
        baseline = sum(r["prefill_time_sum"] or 0 for r in found) / prefill_n
        baseline_text = f"the mean prefill time ({names['prefill_time']})"
    else:
        means = sorted(r["ttft_mean"] for r in intervals)
        baseline = means[len(means) // 2]
        baseline_text = "the median interval's mean TTFT"
    threshold = max(p["spike_ratio"] * baseline, baseline + p["min_excess_s"])
    spikes = [i for i, r in enumerate(found) if r["ttft_count"] and r["ttft_mean"] >= threshold]
    metrics = {"requests": total_n, "scrape_intervals": len(found), "baseline_mean_s": rounded(baseline),
               "spike_line_s": rounded(threshold), "wait_source": "engine histograms (interval means)"}
    thresholds = {k: p[k] for k in ("spike_ratio", "min_excess_s", "min_queue_share", "min_requests")}
    the_chart = chart("line", "Mean TTFT and queue time per scrape interval", "time", "seconds", [
        {"name": "mean TTFT (s)", "x": [iso(r["ts"]) for r in intervals], "y": [rounded(r["ttft_mean"]) for r in intervals]},
        {"name": "mean queue time (s)", "x": [iso(r["ts"]) for r in found if r["queue_time_count"]],
         "y": [rounded(r["queue_time_sum"] / r["queue_time_count"]) for r in found if r["queue_time_count"]]},
    ], x_time=True, hlines=[{"y": rounded(threshold), "label": f"spike line ({p['spike_ratio']:g}x {baseline_text})"}])
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}
    if not spikes:
        return {"state": "clear", "evidence": evidence,
                "summary": f"No TTFT spike in the scrapes: mean TTFT stayed under {secs(threshold)} in every interval "
                           f"({baseline_text}: {secs(baseline)})."}
    return _histogram_spike(ctx, names, found, spikes, (baseline, baseline_text, threshold), evidence)


def _histogram_spike(ctx: DetectorContext, names: dict, found: list[dict], spikes: list[int],
                     line: tuple[float, str, float], evidence: dict) -> dict:
    """Intervals over the spike line: queue-driven (fired) when queue time is most of their TTFT."""
    p, metrics = ctx.params, evidence["metrics"]
    baseline, baseline_text, threshold = line
    # Queue time is observed when a request finishes, after its first token: take the queue sum over the spike and
    # the two scrapes after it, against the TTFT sum over the spike itself.
    ttft_sum = sum(r["ttft_sum"] or 0 for r in found[spikes[0]:spikes[-1] + 1])
    queue_sum = sum(r["queue_time_sum"] or 0 for r in found[spikes[0]:spikes[-1] + 3])
    share = min(1.0, queue_sum / ttft_sum) if ttft_sum else None
    worst = max((found[i] for i in spikes), key=lambda r: r["ttft_mean"])
    first_with_traffic = next(i for i, r in enumerate(found) if r["ttft_count"])
    # Scrapes lag the traffic (TTFT is observed at the first token), so a spike within two intervals of the first
    # traffic is still the start of the data.
    cold_start = spikes[0] <= first_with_traffic + 2
    metrics |= {"worst_mean_ttft_s": rounded(worst["ttft_mean"]), "queue_share": rounded(share),
                "spike_intervals": len(spikes), "cold_start": cold_start,
                "observed_spike_ratio": rounded(ratio(worst["ttft_mean"], baseline)),
                "target_ttft_p99_s": rounded(threshold)}
    evidence["windows"] = [{"start": iso(found[spikes[0]]["prev_ts"]), "end": iso(found[spikes[-1]]["ts"])}]
    if share is None or share < p["min_queue_share"]:
        metrics["spike_kind"] = "prefill-driven"
        return {"state": "clear", "evidence": evidence,
                "summary": f"Mean TTFT jumped to {secs(worst['ttft_mean'])} but it is prefill-driven, not queue-driven: "
                           f"queue time is {pct(share)} of TTFT around the spike ({names['ttft']}, {names['queue_time']})."}
    metrics["spike_kind"] = "queue-driven"
    where_text = "starting with the first traffic in the scrapes (cold start or initial burst)" if cold_start else \
        f"from {evidence['windows'][0]['start']}"
    result = {"state": "fired", "evidence": evidence,
              "summary": f"Mean TTFT jumped to {secs(worst['ttft_mean'])} ({metrics['observed_spike_ratio']:.1f}x "
                         f"{baseline_text}, {secs(baseline)}) in {len(spikes)} scrape interval(s) {where_text}; queue "
                         f"time is {pct(share)} of TTFT around the spike. From the engine's histograms only: interval means, "
                         "no per-request p99 and no example requests."}
    result["rollback"] = (f"After the change, watch the mean TTFT per scrape interval ({names['ttft']} "
                          f"sum/count): roll back if it does not stay below {secs(threshold)} through the next peak "
                          "within 30 minutes, or if the error rate, timeouts or preemptions rise above what they were before.")
    spiked = sum(found[i]["ttft_count"] or 0 for i in spikes)
    if (metrics["observed_spike_ratio"] and metrics["observed_spike_ratio"] >= p["critical_ratio"]
            and spiked >= p["critical_share"] * sum(r["ttft_count"] or 0 for r in found)):
        result["severity"] = "critical"
    return result
