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

from servlens.analysis.detectors._common import chart, not_evaluable, pct, q, ratio, rounded, secs, table
from servlens.analysis.runner import DetectorContext
from servlens.analysis.vocabulary import WAIT
from servlens.analysis.windows import iso, merge_runs

# The wait of one request (NULL when unknown: never read as no wait).
WAIT_EXPR = WAIT
# Gauges that count requests waiting for a slot, by engine; and corroborating capacity signals.
WAITING_GAUGES = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs", "tgi_queue_size")
RUNNING_GAUGES = ("vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs")
KV_GAUGES = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
PREEMPTION_COUNTERS = ("vllm:num_preemptions",)


def _gauge_by_window(ctx: DetectorContext, names: tuple[str, ...]) -> tuple[str | None, dict[int, float]]:
    """The first of `names` that has samples: its max per window (sum over series, e.g. several engines)."""
    spec = ctx.window
    for name in names:
        if name not in ctx.metrics_present:
            continue
        found = ctx.rows(
            f"""SELECT w, max(v) AS v FROM (
                    SELECT {spec.index_sql('ts')} AS w, ts, sum(value) AS v FROM scope_metrics
                    WHERE name = ? AND series = 'value' GROUP BY ts)
                GROUP BY w""",
            [name],
        )
        return name, {row["w"]: row["v"] for row in found}
    return None, {}


def _metric_max(ctx: DetectorContext, names: tuple[str, ...], first: int, last: int) -> tuple[str | None, float | None]:
    """The max of the first gauge of `names` that has samples, around windows first..last.

    Gauges are sampled every few seconds and vLLM observes queue time when a request finishes, so the range is
    padded by two windows (at least 5 s) on each side to catch the scrape that saw the queue.
    """
    spec = ctx.window
    pad = max(2 * spec.width_s, 5.0)
    lo = first * spec.width_s - pad
    hi = (last + 1) * spec.width_s + pad
    for name in names:
        if name not in ctx.metrics_present:
            continue
        row = ctx.one(f"""SELECT max(v) AS v FROM (
                              SELECT ts, sum(value) AS v FROM scope_metrics
                              WHERE name = ? AND series = 'value' AND {spec.offset_sql('ts')} BETWEEN {lo} AND {hi}
                              GROUP BY ts)""", [name])
        return name, row.get("v")
    return None, None


def detect(ctx: DetectorContext) -> dict:
    p = ctx.params
    spec = ctx.window
    per_request_wait = ctx.path_available("queue_time") or ctx.path_available("prefill_time")
    per_request = per_request_wait or ctx.path_available("vllm_waiting_gauge") or ctx.path_available(
        "llamacpp_deferred_gauge")
    if not per_request and ctx.path_available("vllm_histograms"):
        return _from_histograms(ctx)
    if spec is None:
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

    nowait = f"(ttft_s - {WAIT_EXPR})" if per_request_wait else "ttft_s"
    run = ctx.one(f"""SELECT {q(nowait, 0.5)} AS nowait_p50, {q(nowait, 0.99)} AS nowait_p99,
                             {q('ttft_s', 0.5)} AS ttft_p50, {q('ttft_s', 0.99)} AS ttft_p99,
                             {q('prompt_tokens', 0.5)} AS prompt_p50
                      FROM scope_requests WHERE {base_where}""")
    baseline = run["nowait_p50"]
    wait_cols = (f""", {q(WAIT_EXPR, 0.5)} AS wait_p50, {q(WAIT_EXPR, 0.99)} AS wait_p99, {q(nowait, 0.99)} AS nowait_p99,
                    sum(CASE WHEN ttft_s >= tail THEN {WAIT_EXPR} END) / nullif(sum(CASE WHEN ttft_s >= tail THEN ttft_s END), 0)
                      AS queue_share""" if per_request_wait else
                 ", NULL AS wait_p50, NULL AS wait_p99, NULL AS nowait_p99, NULL AS queue_share")
    windows = ctx.rows(f"""
        WITH r AS (SELECT *, {spec.index_sql()} AS w FROM scope_requests WHERE {base_where}),
             tails AS (SELECT w, {q('ttft_s', p['tail_quantile'])} AS tail FROM r GROUP BY w)
        SELECT w, count(*) AS n, {q('ttft_s', 0.99)} AS ttft_p99, {q('ttft_s', 0.5)} AS ttft_p50,
               {q('prompt_tokens', 0.5)} AS prompt_p50 {wait_cols}
        FROM r JOIN tails USING (w) GROUP BY w ORDER BY w""")

    gauge_name, waiting = _gauge_by_window(ctx, WAITING_GAUGES)
    if not per_request_wait and gauge_name is None:
        return not_evaluable("no per-request wait (queue_s, prefill_s) for most requests with a TTFT, and no "
                             "waiting-requests gauge", "Cannot tell queueing from prefill.")

    threshold = max(p["spike_ratio"] * baseline, baseline + p["min_excess_s"])
    queue_windows, prefill_windows = [], []
    for win in windows:
        if win["n"] < p["min_window_requests"] or win["ttft_p99"] is None or win["ttft_p99"] < threshold:
            continue
        if per_request_wait:
            queue_driven = (win["queue_share"] or 0.0) >= p["min_queue_share"]
        else:
            queue_driven = (waiting.get(win["w"]) or 0) > 0
        (queue_windows if queue_driven else prefill_windows).append(win)

    shown = [w for w in windows if w["n"] >= 1]
    series = [{"name": "TTFT p99 (s)", "x": [iso(spec.start(w["w"])) for w in shown], "y": [rounded(w["ttft_p99"]) for w in shown]}]
    if per_request_wait:
        series.append({"name": "TTFT p99 without waiting (s)", "x": series[0]["x"], "y": [rounded(w["nowait_p99"]) for w in shown]})
        series.append({"name": "wait p99 (s)", "x": series[0]["x"], "y": [rounded(w["wait_p99"]) for w in shown]})
    peak = _peak_window(ctx, base_where, windows)
    vspans = [{"x0": iso(spec.start(a)), "x1": iso(spec.start(b + 1)), "label": "queue-driven spike"}
              for a, b in merge_runs([w["w"] for w in queue_windows])]
    vspans += [{"x0": iso(spec.start(a)), "x1": iso(spec.start(b + 1)), "label": "prefill-driven spike"}
               for a, b in merge_runs([w["w"] for w in prefill_windows])]
    if peak:
        vspans.append({"x0": peak["start"], "x1": peak["end"], "label": f"peak {spec.peak_s:g} s window"})
    hline = [{"y": rounded(threshold), "label": f"spike line ({p['spike_ratio']:g}x no-wait TTFT p50)"}]
    if len(shown) >= 5 or not per_request_wait:
        the_chart = chart("line", "TTFT p99 per window", "time", "TTFT (s)", series, x_time=True, hlines=hline,
                          vspans=vspans)
    else:
        # A run of a few windows (one burst): a line through 1-4 points says nothing, so show each request's TTFT
        # and the part of it that was not waiting, in arrival order (at most 300 requests, evenly spaced).
        found = ctx.rows(f"""
            WITH r AS (SELECT ttft_s, ttft_s - {WAIT_EXPR} AS nowait,
                              row_number() OVER (ORDER BY t_at, source_line, request_id) AS k,
                              count(*) OVER () AS total
                       FROM scope_requests WHERE {base_where})
            SELECT k, ttft_s, nowait FROM r WHERE (k - 1) % CAST(ceil(total / 300.0) AS INTEGER) = 0 ORDER BY k""")
        x = [row["k"] for row in found]
        the_chart = chart("scatter", "TTFT per request in arrival order, and its part without waiting",
                          "request (arrival order)", "TTFT (s)",
                          [{"name": "TTFT (s)", "x": x, "y": [rounded(r["ttft_s"]) for r in found]},
                           {"name": "TTFT without waiting (s)", "x": x, "y": [rounded(r["nowait"]) for r in found]}],
                          hlines=hline)

    metrics = {
        "requests": n, "window_s": spec.width_s, "windows": len(windows),
        "baseline_nowait_ttft_p50_s": rounded(baseline), "run_ttft_p99_s": rounded(run["ttft_p99"]),
        "run_prompt_tokens_p50": rounded(run["prompt_p50"]),
        "peak_window_ttft_p99_s": rounded(peak["ttft_p99"]) if peak else None,
        "peak_window_start": peak["start"] if peak else None, "peak_window_end": peak["end"] if peak else None,
        "spike_line_s": rounded(threshold), "wait_source": _wait_source(ctx) if per_request_wait else gauge_name,
    }
    thresholds = {k: p[k] for k in ("spike_ratio", "min_excess_s", "min_queue_share", "tail_quantile",
                                    "min_window_requests", "min_requests")}

    if not queue_windows:
        if prefill_windows:
            worst = max(prefill_windows, key=lambda w: w["ttft_p99"])
            growth = ratio(worst["prompt_p50"], run["prompt_p50"])
            cause = (f"prompts {growth:.1f}x longer than the run's median" if growth and growth >= p["prompt_growth_limit"]
                     else "prompt lengths about as usual, so slower prefill (cache misses, compute contention; see SL001)")
            share = worst["queue_share"]
            summary = (f"TTFT p99 jumped to {secs(worst['ttft_p99'])} in {len(prefill_windows)} window(s), but it is "
                       f"prefill-driven, not queue-driven: "
                       + (f"waiting is {share:.0%} of the slow requests' TTFT; " if share is not None else "no requests were waiting; ")
                       + cause + ".")
            metrics |= {"spike_kind": "prefill-driven", "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
                        "queue_share": rounded(share), "prompt_growth": rounded(growth)}
            return {"state": "clear", "summary": summary,
                    "evidence": {"metrics": metrics, "thresholds": thresholds, "chart": the_chart,
                                 "windows": [spec.bounds(a, b) for a, b in merge_runs([w["w"] for w in prefill_windows])]}}
        return {"state": "clear",
                "summary": f"No TTFT spike: TTFT p99 stayed under {secs(threshold)} in every window of {spec.width_s:g} s "
                           f"(no-wait TTFT p50 {secs(baseline)}).",
                "evidence": {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}}

    worst = max(queue_windows, key=lambda w: w["ttft_p99"])
    runs = merge_runs([w["w"] for w in queue_windows])
    first, last = runs[0][0], runs[-1][1]
    cold_start = runs[0][0] == 0
    growth = ratio(worst["prompt_p50"], run["prompt_p50"])
    spike_ratio = ratio(worst["ttft_p99"], baseline)
    n_spike = sum(w["n"] for w in queue_windows)
    share_all = None
    if per_request_wait:
        index = spec.index_sql()
        listed = ", ".join(str(w["w"]) for w in queue_windows)
        agg = ctx.one(f"""SELECT sum({WAIT_EXPR}) / nullif(sum(ttft_s), 0) AS share,
                                 {q(WAIT_EXPR, 0.5)} AS wait_p50, {q(WAIT_EXPR, 0.99)} AS wait_p99
                          FROM scope_requests WHERE {base_where} AND {index} IN ({listed})""")
        share_all = agg["share"]
        metrics |= {"wait_p50_s": rounded(agg["wait_p50"]), "wait_p99_s": rounded(agg["wait_p99"])}
    waiting_name, waiting_max = _metric_max(ctx, WAITING_GAUGES, first, last)
    running_name, running_max = _metric_max(ctx, RUNNING_GAUGES, first, last)
    kv_name, kv_max = _metric_max(ctx, KV_GAUGES, first, last)
    preemptions = None
    for name in PREEMPTION_COUNTERS:
        if name in ctx.metrics_present:
            preemptions = ctx.counter_increase(name)
    corroboration = []
    if waiting_max:
        corroboration.append(f"{waiting_name} reached {waiting_max:g}")
    elif waiting_max is not None:
        corroboration.append(f"the scraped {waiting_name} stayed 0 (scrapes can miss a short queue)")
    if running_max is not None:
        corroboration.append(f"{running_name} up to {running_max:g}")
    if kv_max is not None:
        corroboration.append(f"KV cache usage up to {kv_max:.0%}")
    if preemptions:
        corroboration.append(f"{preemptions:g} preemptions")

    # Warm-up, not capacity: the queue sits in the first windows of the data and only a handful of requests waited
    # (too few to be load), so what they waited behind was the first, cold prefills.
    span_windows = max(w["w"] for w in windows) + 1
    warmup = cold_start and last < max(2, 0.1 * span_windows) and n_spike <= p["warmup_max_requests"]
    if warmup:
        metrics |= {"spike_kind": "warm-up", "spike_requests": n_spike, "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
                    "cold_start": True, "queue_share": rounded(worst["queue_share"])}
        return {"state": "clear",
                "summary": f"TTFT p99 reached {secs(worst['ttft_p99'])} in the first window(s) of the data, but only "
                           f"{n_spike} requests waited: they queued behind the first, cold prefills. That is warm-up (see SL007 cold-start), not a queue caused by load.",
                "evidence": {"metrics": metrics, "thresholds": thresholds, "chart": the_chart,
                             "windows": [spec.bounds(a, b) for a, b in runs]}}

    target = worst["nowait_p99"] + (worst["ttft_p99"] - worst["nowait_p99"]) / 2 if per_request_wait else baseline * p["spike_ratio"]
    metrics |= {
        "spike_kind": "queue-driven", "spike_windows": len(queue_windows), "spike_requests": n_spike,
        "worst_window_start": iso(spec.start(worst["w"])), "worst_ttft_p99_s": rounded(worst["ttft_p99"]),
        "worst_nowait_ttft_p99_s": rounded(worst["nowait_p99"]), "observed_spike_ratio": rounded(spike_ratio),
        "queue_share": rounded(worst["queue_share"]), "queue_share_all_spike_requests": rounded(share_all),
        "spike_prompt_tokens_p50": rounded(worst["prompt_p50"]), "prompt_growth": rounded(growth),
        "cold_start": cold_start, "waiting_max": waiting_max, "running_max": running_max, "kv_cache_usage_max": kv_max,
        "preemptions": preemptions, "target_ttft_p99_s": rounded(target),
        "prefill_driven_windows": len(prefill_windows),
    }
    where_text = (f"starting in the first window of the data (cold start or initial burst)" if cold_start
                  else f"from {iso(spec.start(first))}")
    explain = (f"waiting is {worst['queue_share']:.0%} of the slow requests' TTFT" if worst["queue_share"] is not None
               else f"{waiting_name} > 0 during the spike")
    prompt_note = ("prompt lengths as usual" if growth is None or growth < p["prompt_growth_limit"]
                   else f"prompts also {growth:.1f}x longer than usual")
    summary = (f"TTFT p99 jumped to {secs(worst['ttft_p99'])} ({spike_ratio:.1f}x the {secs(baseline)} a request takes "
               f"without waiting) in {len(queue_windows)} window(s) {where_text}; {explain}, {prompt_note}"
               + (f"; {', '.join(corroboration)}" if corroboration else "") + ".")
    spike_rows = [[iso(spec.start(w["w"])), w["n"], w["ttft_p99"], w["nowait_p99"], w["wait_p50"], w["queue_share"],
                   w["prompt_p50"], waiting.get(w["w"])] for w in sorted(queue_windows, key=lambda w: w["w"])[:30]]
    index = spec.index_sql()
    listed = ", ".join(str(w["w"]) for w in queue_windows)
    order = f"{WAIT_EXPR} DESC" if per_request_wait else "ttft_s DESC"
    # Severity follows user impact: a few slow windows are a tail (warning); a queue that held back most of the
    # scope's requests at many times their no-wait TTFT is an outage of capacity.
    metrics["spike_request_share"] = rounded(n_spike / n)
    severity = ("critical" if spike_ratio and spike_ratio >= p["critical_ratio"] and n_spike >= p["critical_share"] * n
                else None)
    result = {
        "state": "fired",
        "summary": summary,
        "evidence": {
            "metrics": metrics, "thresholds": thresholds, "chart": the_chart,
            "windows": [spec.bounds(a, b) for a, b in runs],
            "table": table(["window start", "requests", "TTFT p99 (s)", "no-wait TTFT p99 (s)", "wait p50 (s)",
                            "wait share of slow requests", "prompt tokens p50", "waiting (gauge max)"], spike_rows),
        },
        "examples": ctx.examples(f"{base_where} AND {index} IN ({listed})", order),
    }
    if severity:
        result["severity"] = severity
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
    from datetime import timedelta

    start = spec.t0 + timedelta(seconds=lo)
    return {"start": iso(start), "end": iso(start + timedelta(seconds=spec.peak_s)), "ttft_p99": row["ttft_p99"],
            "n": row["n"]}


TTFT_HIST = "vllm:time_to_first_token_seconds"
QUEUE_HIST = "vllm:request_queue_time_seconds"
PREFILL_HIST = "vllm:request_prefill_time_seconds"


def _from_histograms(ctx: DetectorContext) -> dict:
    """Scrapes only: per scrape interval, mean TTFT (histogram sum/count increases) against the mean prefill time
    (TTFT without the queue); the queue share is the queue-time sum over the TTFT sum around the spike.

    Means, not p99 (the buckets are too coarse for a tail), and vLLM observes queue time when a request finishes
    but TTFT at its first token, so the queue sum runs two scrapes past the spike.
    """
    p = ctx.params
    found = ctx.rows(f"""
        SELECT ts, min(prev_ts) AS prev_ts,
               sum(increase) FILTER (WHERE name = '{TTFT_HIST}' AND series = 'sum') AS ttft_sum,
               sum(increase) FILTER (WHERE name = '{TTFT_HIST}' AND series = 'count') AS ttft_n,
               sum(increase) FILTER (WHERE name = '{QUEUE_HIST}' AND series = 'sum') AS queue_sum,
               sum(increase) FILTER (WHERE name = '{QUEUE_HIST}' AND series = 'count') AS queue_n,
               sum(increase) FILTER (WHERE name = '{PREFILL_HIST}' AND series = 'sum') AS prefill_sum,
               sum(increase) FILTER (WHERE name = '{PREFILL_HIST}' AND series = 'count') AS prefill_n
        FROM scope_counter_increases WHERE name IN ('{TTFT_HIST}', '{QUEUE_HIST}', '{PREFILL_HIST}')
        GROUP BY ts ORDER BY ts""")
    total_n = sum(r["ttft_n"] or 0 for r in found)
    if total_n < p["min_requests"]:
        return not_evaluable(f"the TTFT histogram counted only {total_n:g} requests between scrapes; the rule needs at "
                             f"least {p['min_requests']} (min_requests)", "Too few requests to judge TTFT spikes.")
    intervals = [r for r in found if r["ttft_n"]]
    for r in intervals:
        r["ttft_mean"] = r["ttft_sum"] / r["ttft_n"]
    prefill_n = sum(r["prefill_n"] or 0 for r in found)
    if prefill_n:
        baseline = sum(r["prefill_sum"] or 0 for r in found) / prefill_n
        baseline_text = "the mean prefill time (vllm:request_prefill_time_seconds)"
    else:
        means = sorted(r["ttft_mean"] for r in intervals)
        baseline = means[len(means) // 2]
        baseline_text = "the median interval's mean TTFT"
    threshold = max(p["spike_ratio"] * baseline, baseline + p["min_excess_s"])
    spikes = [i for i, r in enumerate(found) if r["ttft_n"] and r["ttft_mean"] >= threshold]
    metrics = {"requests": total_n, "scrape_intervals": len(found), "baseline_mean_s": rounded(baseline),
               "spike_line_s": rounded(threshold), "wait_source": "vLLM histograms (interval means)"}
    thresholds = {k: p[k] for k in ("spike_ratio", "min_excess_s", "min_queue_share", "min_requests")}
    the_chart = chart("line", "Mean TTFT and queue time per scrape interval", "time", "seconds", [
        {"name": "mean TTFT (s)", "x": [iso(r["ts"]) for r in intervals], "y": [rounded(r["ttft_mean"]) for r in intervals]},
        {"name": "mean queue time (s)", "x": [iso(r["ts"]) for r in found if r["queue_n"]],
         "y": [rounded(r["queue_sum"] / r["queue_n"]) for r in found if r["queue_n"]]},
    ], x_time=True, hlines=[{"y": rounded(threshold), "label": f"spike line ({p['spike_ratio']:g}x {baseline_text})"}])
    evidence = {"metrics": metrics, "thresholds": thresholds, "chart": the_chart}
    if not spikes:
        return {"state": "clear", "evidence": evidence,
                "summary": f"No TTFT spike in the scrapes: mean TTFT stayed under {secs(threshold)} in every interval "
                           f"({baseline_text}: {secs(baseline)})."}
    # Queue time is observed when a request finishes, after its first token: take the queue sum over the spike and
    # the two scrapes after it, against the TTFT sum over the spike itself.
    ttft_sum = sum(r["ttft_sum"] or 0 for r in found[spikes[0]:spikes[-1] + 1])
    queue_sum = sum(r["queue_sum"] or 0 for r in found[spikes[0]:spikes[-1] + 3])
    share = min(1.0, queue_sum / ttft_sum) if ttft_sum else None
    worst = max((found[i] for i in spikes), key=lambda r: r["ttft_mean"])
    first_with_traffic = next(i for i, r in enumerate(found) if r["ttft_n"])
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
                           f"queue time is {pct(share)} of TTFT around the spike (vLLM histograms)."}
    metrics["spike_kind"] = "queue-driven"
    where_text = "starting with the first traffic in the scrapes (cold start or initial burst)" if cold_start else \
        f"from {evidence['windows'][0]['start']}"
    result = {"state": "fired", "evidence": evidence,
              "summary": f"Mean TTFT jumped to {secs(worst['ttft_mean'])} ({metrics['observed_spike_ratio']:.1f}x "
                         f"{baseline_text}, {secs(baseline)}) in {len(spikes)} scrape interval(s) {where_text}; queue "
                         f"time is {pct(share)} of TTFT around the spike. From vLLM's histograms only: interval means, "
                         "no per-request p99 and no example requests."}
    result["rollback"] = (f"After the change, watch the mean TTFT per scrape interval (vllm:time_to_first_token_seconds "
                          f"sum/count): roll back if it does not stay below {secs(threshold)} through the next peak "
                          "within 30 minutes, or if the error rate, timeouts or preemptions rise above what they were before.")
    spiked = sum(found[i]["ttft_n"] or 0 for i in spikes)
    if (metrics["observed_spike_ratio"] and metrics["observed_spike_ratio"] >= p["critical_ratio"]
            and spiked >= p["critical_share"] * total_n):
        result["severity"] = "critical"
    return result
