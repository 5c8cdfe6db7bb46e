"""Facts of a recorded run, computed from its raw files alone (not with servlens): facts.json and README.md.

    python -m tools.engine.recordings facts tests/data/recorded/*/

Reads the client log (``client/requests.jsonl`` or ``requests.jsonl``), the proxy's StandardLoggingPayloads
(``litellm_slp.jsonl``), every ``metrics_index.jsonl`` with its scrape files, and ``recording.json``. Everything is
counted as the raw data says: a field that is missing is counted as missing, never as zero. The facts are what a
truth table for the run can be written from; the README says how the run was made and lists them.

Fallback and retry facts come from two independent places: the proxy's response headers in the client log
(``x-litellm-attempted-fallbacks``, ``x-litellm-attempted-retries``, ``x-litellm-model-group``) and the attempts of
each ``trace_id`` in the payloads, ordered by ``endTime`` (LiteLLM writes a fallback's success payload with the
original request's ``startTime``; how often start-time order differs is itself a fact below).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

# The llama.cpp series the facts report (those a version does not expose are left out, not zero): gauges by their
# maximum over the scrapes, counters by their last value and how often they dropped (a restart).
ENGINE_GAUGES = ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio",
                 "llamacpp:kv_cache_tokens", "llamacpp:n_busy_slots_per_decode")
ENGINE_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                   "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total")
THINK_MARKERS = ("<think>", "</think>")


def _read_text(path: Path) -> str:
    if path.suffix == ".zst":
        import zstandard

        with open(path, "rb") as fh:
            return zstandard.ZstdDecompressor().stream_reader(fh).read().decode("utf-8")
    return path.read_text(encoding="utf-8")


def _lines(path: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    for line in _read_text(path).splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            bad += 1
    return rows, bad


def _q(values: list[float], q: float) -> float | None:
    """Quantile by linear interpolation between order statistics (numpy's default), None when there is none."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 4)


def _dist(values: list[float]) -> dict:
    xs = [v for v in values if v is not None]
    return {"n": len(xs), "min": round(min(xs), 4) if xs else None, "p50": _q(xs, 0.5), "p90": _q(xs, 0.9),
            "max": round(max(xs), 4) if xs else None}


def _counts(values) -> dict:
    return {str(k): v for k, v in sorted(Counter("null" if x is None else x for x in values).items(),
                                         key=lambda kv: (-kv[1], str(kv[0])))}


# ---- client log ------------------------------------------------------------------------------------------------------

def _answer(rec: dict) -> tuple[str | None, str | None, list[str]]:
    """(content, reasoning, names of the reasoning fields present) of a 200 answer, streamed or not."""
    if rec.get("body", {}).get("stream"):
        names = [k for k in ("stream_reasoning_content", "stream_reasoning") if rec.get(k)]
        return rec.get("stream_content"), next((rec[k] for k in names), None), names
    resp = rec.get("response") or {}
    choices = resp.get("choices") or [{}]
    msg = choices[0].get("message") or {}
    names = [k for k in ("reasoning_content", "reasoning") if msg.get(k)]
    reasoning = next((msg[k] for k in names), None)
    return msg.get("content"), reasoning, names


def _error_key(rec: dict) -> str | None:
    if rec.get("http_status") is None:
        return (rec.get("error") or "unknown").split(":")[0]
    if rec["http_status"] == 200:
        return "stream_error" if rec.get("stream_error") else None
    err = (rec.get("response") or {}).get("error")
    if isinstance(err, dict):
        message = str(err.get("message", ""))
        head = re.match(r"(litellm\.\w+|[A-Za-z]+Error)", message)
        return f"{rec['http_status']} type={err.get('type')} code={err.get('code')}" + (
            f" {head.group(1)}" if head else "")
    return f"{rec['http_status']}"


def client_facts(path: Path, t0: float | None, events: list[dict]) -> dict:
    rows, bad = _lines(path)
    ok = [r for r in rows if r.get("http_status") == 200 and not r.get("stream_error")]
    streamed_ok = [r for r in ok if r.get("body", {}).get("stream")]
    content_empty = reasoning_present = empty_with_reasoning = markers_in_content = markers_in_reasoning = 0
    reasoning_fields: Counter = Counter()
    finish_by_budget: dict = defaultdict(Counter)
    for r in ok:
        content, reasoning, names = _answer(r)
        reasoning_fields.update(names)
        empty = not content
        content_empty += empty
        reasoning_present += bool(reasoning)
        empty_with_reasoning += bool(empty and reasoning)
        markers_in_content += any(m in (content or "") for m in THINK_MARKERS)
        markers_in_reasoning += any(m in (reasoning or "") for m in THINK_MARKERS)
        finish_by_budget[str(r.get("body", {}).get("max_tokens"))][str(r.get("finish_reason"))] += 1
    out: dict = {
        "file": str(path.name if path.parent.name != "client" else "client/" + path.name),
        "requests": len(rows), "malformed_lines": bad,
        "streamed": sum(bool(r.get("body", {}).get("stream")) for r in rows),
        "http_status": _counts(r.get("http_status") for r in rows),
        "errors": _counts(k for k in (_error_key(r) for r in rows) if k),
        "finish_reason_of_200": _counts(r.get("finish_reason") for r in ok),
        "finish_reason_by_max_tokens": {k: dict(v) for k, v in sorted(finish_by_budget.items())},
        "answers_200": len(ok), "content_empty": content_empty, "reasoning_present": reasoning_present,
        "content_empty_and_reasoning_present": empty_with_reasoning,
        "think_markers_in_content": markers_in_content, "think_markers_in_reasoning": markers_in_reasoning,
        "reasoning_field_names": dict(reasoning_fields),
        "ttft_client_s_streamed_200": _dist([r.get("ttft_client_s") for r in streamed_ok]),
        "streamed_200_without_ttft": sum(r.get("ttft_client_s") is None for r in streamed_ok),
        "e2e_s_all": _dist([r.get("e2e_s") for r in rows]),
        "e2e_s_200": _dist([r.get("e2e_s") for r in ok]),
        "e2e_s_failed": _dist([r.get("e2e_s") for r in rows if r not in ok]),
    }
    timings = [((r.get("stream_final_chunk") or r.get("response") or {}).get("timings"), r) for r in ok]
    out["llamacpp_timings_present"] = sum(1 for t, _ in timings if t)
    if t0 is not None and out["llamacpp_timings_present"]:
        # cache_n 0: the whole prompt was prefilled (a cold prefix cache, or a slot's first request)
        out["cache_n_zero_sent_at_s"] = sorted(round(r["send_ts"] - t0, 3) for t, r in timings
                                               if t and t.get("cache_n") == 0)
    if t0 is not None:
        failed = sorted(r["send_ts"] - t0 for r in rows if r not in ok)
        out["failed_sent_at_s"] = {"first": round(failed[0], 3), "last": round(failed[-1], 3)} if failed else None
        out["failed_per_5s_window_of_send"] = _counts(int((r["send_ts"] - t0) // 5) * 5 for r in rows if r not in ok)
        recovery = [e for e in events if e["action"] == "restart"]
        if recovery:
            ready = recovery[-1]["done_ts"]
            after = sorted((r["send_ts"] - t0, r in ok) for r in rows if r["send_ts"] >= ready)
            out["after_restart_ready"] = {"ready_at_s": round(ready - t0, 3), "sent_after": len(after),
                                          "ok_after": sum(o for _, o in after)}
    headers = [r.get("response_headers") for r in rows if r.get("response_headers") is not None]
    if headers:
        out["gateway_headers"] = {
            "responses_with_headers": len(headers),
            "x-litellm-model-group": _counts(h.get("x-litellm-model-group") for h in headers),
            "x-litellm-model-id": _counts(h.get("x-litellm-model-id") for h in headers),
            "x-litellm-attempted-fallbacks": _counts(h.get("x-litellm-attempted-fallbacks") for h in headers),
            "x-litellm-attempted-retries": _counts(h.get("x-litellm-attempted-retries") for h in headers),
            "status_by_model_group": _counts(f"{r.get('http_status')} {r['response_headers'].get('x-litellm-model-group')}"
                                             for r in rows if r.get("response_headers") is not None),
            "attempted_retries_sum": sum(int(h["x-litellm-attempted-retries"]) for h in headers
                                         if h.get("x-litellm-attempted-retries") is not None),
            "attempted_fallbacks_sum": sum(int(h["x-litellm-attempted-fallbacks"]) for h in headers
                                           if h.get("x-litellm-attempted-fallbacks") is not None),
            "error_responses_with_attempted_headers": sum(
                1 for r in rows if r.get("http_status") not in (None, 200)
                and "x-litellm-attempted-retries" in (r.get("response_headers") or {})),
        }
        # The proxy's error text says how often it retried ("LiteLLM Retried: 3 times") ...
        out["errors_saying_retried_times"] = _counts(
            m.group(1) for r in rows if r.get("http_status") not in (None, 200)
            for m in [re.search(r"LiteLLM Retried: (\d+) times",
                                str(((r.get("response") or {}).get("error") or {}).get("message", "")))] if m)
        # ... and names a fallback that failed too ("Fallback to chat-backup also failed: ...").
        out["errors_saying_fallback_also_failed"] = sum(
            "also failed" in str(((r.get("response") or {}).get("error") or {}).get("message", ""))
            for r in rows if r.get("http_status") not in (None, 200))
    return out


# ---- LiteLLM StandardLoggingPayload ------------------------------------------------------------------------------

def _slp_finish(p: dict) -> str | None:
    resp = p.get("response")
    if isinstance(resp, dict) and resp.get("choices"):
        return resp["choices"][0].get("finish_reason")
    return None


def _slp_content(p: dict) -> str | None:
    resp = p.get("response")
    if isinstance(resp, dict) and resp.get("choices"):
        return (resp["choices"][0].get("message") or {}).get("content")
    return None


def gateway_facts(path: Path) -> dict:
    rows, bad = _lines(path)
    err = [p.get("error_information") or {} for p in rows]
    failures = [p for p in rows if p.get("status") == "failure"]
    successes = [p for p in rows if p.get("status") == "success"]
    timeouts = [p for p in failures if "timeout" in str((p.get("error_information") or {}).get("error_class", "")).lower()
                or str((p.get("error_information") or {}).get("error_code")) == "408"]
    out: dict = {
        "file": path.name, "attempts": len(rows), "malformed_lines": bad,
        "status": _counts(p.get("status") for p in rows),
        "status_by_model_group": _counts(f"{p.get('model_group')} {p.get('status')}" for p in rows),
        "status_by_model_id": _counts(f"{p.get('model_id')} {p.get('status')}" for p in rows),
        "error_class": _counts(e.get("error_class") for e, p in zip(err, rows) if p.get("status") == "failure"),
        "error_code": _counts(e.get("error_code") for e, p in zip(err, rows) if p.get("status") == "failure"),
        "finish_reason_of_success": _counts(_slp_finish(p) for p in successes),
        "finish_reason_by_model_group": _counts(f"{p.get('model_group')} {_slp_finish(p)}" for p in successes),
        "success_content_empty": sum(not _slp_content(p) for p in successes),
        "stream_field": _counts(p.get("stream") for p in rows),
        "timeouts": {"count": len(timeouts), "by_model_group": _counts(p.get("model_group") for p in timeouts),
                     "duration_s": _dist([p["endTime"] - p["startTime"] for p in timeouts])},
        "e2e_s_success": _dist([p["endTime"] - p["startTime"] for p in successes]),
        "e2e_s_failure": _dist([p["endTime"] - p["startTime"] for p in failures]),
        "ttft_s_streamed_success": _dist([p["completionStartTime"] - p["startTime"] for p in successes
                                          if p.get("stream") is True]),
    }
    traces: dict = defaultdict(list)
    for p in rows:
        traces[p.get("trace_id")].append(p)
    fallbacks: Counter = Counter()
    retries_per_trace: Counter = Counter()
    start_order_differs = success_starts_before_failure = 0
    final_status: Counter = Counter()
    for attempts in traces.values():
        first_failure = min((p["startTime"] for p in attempts if p.get("status") == "failure"), default=None)
        success_starts_before_failure += any(p.get("status") == "success" and first_failure is not None
                                             and p["startTime"] < first_failure for p in attempts)
        by_end = sorted(attempts, key=lambda p: p["endTime"])
        by_start = sorted(attempts, key=lambda p: p["startTime"])
        if [p.get("id") for p in by_end] != [p.get("id") for p in by_start]:
            start_order_differs += 1
        groups = [p.get("model_group") for p in by_end]
        final_status[by_end[-1].get("status")] += 1
        for a, b in itertools.pairwise(groups):
            if a != b:
                fallbacks[f"{a} -> {b} ({by_end[groups.index(b)].get('status')})"] += 1
        same_group_repeats = len(groups) - len(set(groups))
        retries_per_trace[same_group_repeats] += 1
    out["traces"] = {"count": len(traces), "attempts_per_trace": _counts(len(a) for a in traces.values()),
                     "final_attempt_status": dict(final_status),
                     "fallbacks_by_end_time": dict(fallbacks),
                     "repeated_attempts_in_same_group_per_trace": {str(k): v for k, v in sorted(retries_per_trace.items())},
                     "traces_where_start_time_order_differs_from_end_time_order": start_order_differs,
                     "traces_whose_success_starts_before_their_failure": success_starts_before_failure}
    return out


# ---- /metrics scrapes ----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def _parse_prom(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = _SAMPLE.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def metrics_facts(folder: Path, t0: float | None) -> dict:
    index, _ = _lines(folder / "metrics_index.jsonl")
    scrapes = []
    for entry in index:
        if entry.get("file"):
            scrapes.append((entry["scrape_ts"], _parse_prom((folder / entry["file"]).read_text(encoding="utf-8"))))
    names = sorted({k for _, s in scrapes for k in s})
    out: dict = {"index_rows": len(index), "scrapes_ok": len(scrapes),
                 "scrapes_failed": sum(1 for e in index if not e.get("file")),
                 "run_label_in_index": sorted({e.get("run") for e in index}), "series": names}
    if t0 is not None and any(not e.get("file") for e in index):
        failed = [e["scrape_ts"] - t0 for e in index if not e.get("file")]
        out["scrapes_failed_between_s"] = [round(min(failed), 3), round(max(failed), 3)]
    maxima = {}
    for name in ENGINE_GAUGES:
        vals = [(ts, s[name]) for ts, s in scrapes if name in s]
        if vals:
            ts, v = max(vals, key=lambda tv: tv[1])
            maxima[name] = {"max": v, "at_s": round(ts - t0, 3) if t0 else None, "scrapes_with_value": len(vals)}
    out["gauge_max"] = maxima
    out["gauges_not_exposed"] = [n for n in ENGINE_GAUGES if n not in maxima]
    counters = {}
    for name in ENGINE_COUNTERS:
        vals = [s[name] for _, s in scrapes if name in s]
        if vals:
            counters[name] = {"last": vals[-1], "max": max(vals),
                              "drops": sum(1 for a, b in itertools.pairwise(vals) if b < a)}
    out["counters"] = counters
    return out


# ---- the whole run -------------------------------------------------------------------------------------------------

def run_facts(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "recording.json").read_text(encoding="utf-8"))
    t0 = (meta.get("load") or {}).get("started_ts")
    events = meta.get("events", [])
    facts: dict = {"run": meta["run"], "t0_unix_s": t0,
                   "events": [{"action": e["action"], "backend": e["backend"], "at_s": e["t_rel_s"],
                               "took_s": e["took_s"]} for e in events]}
    client = next(p for p in (run_dir / "client" / "requests.jsonl", run_dir / "client" / "requests.jsonl.zst",
                              run_dir / "requests.jsonl", run_dir / "requests.jsonl.zst") if p.exists())
    facts["client"] = client_facts(client, t0, events)
    for name in ("litellm_slp.jsonl", "litellm_slp.jsonl.zst"):
        if (run_dir / name).exists():
            facts["gateway"] = gateway_facts(run_dir / name)
            # Client requests whose x-litellm-call-id is the litellm_call_id of some payload (the join key).
            slp_ids = {p.get("litellm_call_id") for p in _lines(run_dir / name)[0]}
            client_ids = [r.get("response_headers", {}).get("x-litellm-call-id") for r in _lines(client)[0]]
            facts["gateway"]["client_call_ids_found_in_payloads"] = sum(1 for c in client_ids if c in slp_ids)
    if (run_dir / "proxy.log").exists():
        # The router's INFO line per failed LLM call ("litellm.acompletion(model=…) Exception <class>…"): warm-up
        # calls all succeeded, so every such line is a recorded attempt. Timeouts print no such line.
        text = re.sub(r"\x1b\[[0-9;]*m", "", (run_dir / "proxy.log").read_text(encoding="utf-8", errors="replace"))
        facts["proxy_log"] = {"call_exception_lines": _counts(
            re.findall(r"litellm\.acompletion\(model=[^)]*\) Exception (litellm\.\w+)", text))}
    facts["engine_metrics"] = {}
    for index in sorted(run_dir.rglob("metrics_index.jsonl")):
        label = str(index.parent.relative_to(run_dir)) or "."
        facts["engine_metrics"][label] = metrics_facts(index.parent, t0)
    return facts


def _fmt(d) -> str:
    if isinstance(d, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in d.items()) or "none"
    if isinstance(d, list):
        return ", ".join(_fmt(v) for v in d) or "none"
    return "null" if d is None else str(d)


def _dist_text(d: dict) -> str:
    if not d or not d.get("n"):
        return "none"
    return f"p50 {d['p50']} s, p90 {d['p90']} s, max {d['max']} s (n={d['n']}, min {d['min']} s)"


def render_readme(run_dir: Path, meta: dict, facts: dict) -> str:
    v = meta["versions"]
    lines = [f"# {meta['run']}", "", meta["description"], "",
             ("Recorded on this project's shared 2-core machine with tools/engine/recordings.py; the facts below are "
             "computed from the raw files by tools/engine/recording_facts.py (not servlens) and are also in "
             "`facts.json`."), "",
             "## How it was made", "",
             (f"- Recorded {_iso(meta['recorded_at'])}; load average at start {meta['load_average_at_start']}; "
             f"{meta['machine']}."),
             f"- Versions: xllamacpp {v['xllamacpp']} (llama.cpp's server in-process), "
             + (f"litellm {v['litellm']} (`litellm[proxy]` from PyPI, its own venv), " if "litellm" in v else "")
             + f"Python {v['python']}, requests {v['requests']}.",
             ("- Model: the random-weight tiny llama GGUF of tools/engine/model.py (text is gibberish; timings, "
             "usage, queueing, finish reasons and metrics are the engine's).")]
    for b in meta["backends"]:
        f = b["flags"]
        lines.append(f"- Backend `{b['name']}` (files in `{b['folder']}`): template `{b['template']}`, "
                     f"--parallel {f['parallel']} --ctx-size {f['ctx_size']} --threads {f['threads']} "
                     f"--reasoning-format {f['reasoning_format']}"
                     + f", port {f['port']}.")
    if meta.get("litellm_config"):
        lines += [("- LiteLLM proxy on 127.0.0.1, one worker, a random master key in its environment only (never "
                  "written; the payloads carry `user_api_key_hash: litellm_proxy_master_key`). Callback "
                  "`tools/engine/litellm_slp_logger.py` writes `kwargs[\"standard_logging_object\"]` of every "
                  "success and failure event, unedited, one JSON line each. Before the load: "
                  f"{meta['proxy']['warm_up']} (so that backend's counters do not start at 0 in the first "
                  "scrape, which is taken after the warm-up). Its config (the `warmup` group is only for that):"), "",
                  "```json", json.dumps(meta["litellm_config"], indent=2), "```"]
        if meta.get("dead_endpoint"):
            lines.append(f"- Dead endpoint: `{meta['dead_endpoint']}` (a closed port, checked to refuse "
                         "connections).")
    load = meta.get("load", {})
    lines.append(f"- Load: {meta['requests_planned']} planned requests (seeded plan in recordings.py), sent on "
                 f"schedule by tools/engine/load.py, client timeout {meta['client_timeout_s']} s; wall "
                 f"{load.get('wall_s')} s.")
    for e in meta.get("events", []):
        lines.append(f"- Injected: `{e['action']}` backend `{e['backend']}` at t={e['t_rel_s']} s from the first "
                     f"request (took {e['took_s']} s"
                     + ("; SIGKILL" if e["action"] == "kill" else "; same port, ready when /health answered 200")
                     + ").")
    if not meta.get("events"):
        lines.append("- Injected: nothing.")
    lines += ["", "## Files", ""]
    for p in sorted(run_dir.rglob("*")):
        if p.is_file() and not p.name.endswith(".prom") and p.name != "README.md":
            lines.append(f"- `{p.relative_to(run_dir)}` ({p.stat().st_size:,} bytes)")
    for folder, m in facts["engine_metrics"].items():
        lines.append(f"- `{folder}/metrics_*.prom`: {m['scrapes_ok']} scrapes of /metrics (~1/s), indexed in "
                     f"`{folder}/metrics_index.jsonl` (run label {m['run_label_in_index']}; "
                     f"{m['scrapes_failed']} failed scrapes kept as index rows with `file: null`)")
    c = facts["client"]
    lines += ["", "## Facts (from the raw files)", "", "Client log:", "",
              f"- {c['requests']} requests ({c['streamed']} streamed), malformed lines {c['malformed_lines']}",
              f"- http_status: {_fmt(c['http_status'])}",
              f"- errors: {_fmt(c['errors'])}",
              (f"- finish_reason of 200s: {_fmt(c['finish_reason_of_200'])}; by max_tokens: "
              f"{_fmt(c['finish_reason_by_max_tokens'])}"),
              (f"- of {c['answers_200']} answers: content empty {c['content_empty']}, reasoning present "
              f"{c['reasoning_present']}, both (empty content with reasoning) "
              f"{c['content_empty_and_reasoning_present']}; `<think>` markers in content "
              f"{c['think_markers_in_content']}, in reasoning {c['think_markers_in_reasoning']}; reasoning fields "
              f"{_fmt(c['reasoning_field_names'])}"),
              (f"- TTFT (client, streamed 200s): {_dist_text(c['ttft_client_s_streamed_200'])}; streamed 200s "
              f"without any token: {c['streamed_200_without_ttft']}"),
              (f"- e2e all: {_dist_text(c['e2e_s_all'])}; 200s: {_dist_text(c['e2e_s_200'])}; failed: "
              f"{_dist_text(c['e2e_s_failed'])}")]
    if c.get("failed_sent_at_s"):
        lines.append(f"- failed requests were sent between t={c['failed_sent_at_s']['first']} s and "
                     f"t={c['failed_sent_at_s']['last']} s; per 5 s window of send time: "
                     f"{_fmt(c['failed_per_5s_window_of_send'])}")
    if c.get("cache_n_zero_sent_at_s") is not None:
        lines.append(f"- 200s with llama.cpp timings: {c['llamacpp_timings_present']}; with `timings.cache_n` 0 "
                     f"(whole prompt prefilled), sent at t= {_fmt(c['cache_n_zero_sent_at_s'])} s")
    if c.get("after_restart_ready"):
        a = c["after_restart_ready"]
        lines.append(f"- after the restarted server was ready (t={a['ready_at_s']} s): {a['sent_after']} sent, "
                     f"{a['ok_after']} ok")
    if c.get("gateway_headers"):
        h = c["gateway_headers"]
        lines += [(f"- proxy headers: model group {_fmt(h['x-litellm-model-group'])}; deployment "
                  f"{_fmt(h['x-litellm-model-id'])}; attempted fallbacks {_fmt(h['x-litellm-attempted-fallbacks'])} "
                  f"(sum {h['attempted_fallbacks_sum']}); attempted retries "
                  f"{_fmt(h['x-litellm-attempted-retries'])} (sum {h['attempted_retries_sum']}); error responses "
                  f"with x-litellm-attempted-retries: {h['error_responses_with_attempted_headers']}"),
                  (f"- error responses saying a fallback also failed: {c['errors_saying_fallback_also_failed']}; "
                  f"saying 'LiteLLM Retried: N times' (N: count): {_fmt(c['errors_saying_retried_times'])}"),
                  f"- status by final model group: {_fmt(h['status_by_model_group'])}"]
    g = facts.get("gateway")
    if g:
        t = g["traces"]
        lines += ["", "LiteLLM payloads (`litellm_slp.jsonl`, one per attempt):", "",
                  f"- {g['attempts']} attempts, malformed lines {g['malformed_lines']}; status {_fmt(g['status'])}",
                  f"- by model group: {_fmt(g['status_by_model_group'])}",
                  f"- by deployment: {_fmt(g['status_by_model_id'])}",
                  f"- failures: error_class {_fmt(g['error_class'])}; error_code {_fmt(g['error_code'])}",
                  (f"- timeouts: {g['timeouts']['count']} ({_fmt(g['timeouts']['by_model_group'])}), duration "
                  f"{_dist_text(g['timeouts']['duration_s'])}"),
                  (f"- finish_reason of successes: {_fmt(g['finish_reason_of_success'])}; by group: "
                  f"{_fmt(g['finish_reason_by_model_group'])}; successes with empty content "
                  f"{g['success_content_empty']}"),
                  f"- `stream` field: {_fmt(g['stream_field'])}",
                  (f"- e2e (endTime - startTime) success: {_dist_text(g['e2e_s_success'])}; failure: "
                  f"{_dist_text(g['e2e_s_failure'])}; TTFT (completionStartTime - startTime, stream true): "
                  f"{_dist_text(g['ttft_s_streamed_success'])}"),
                  (f"- {t['count']} trace_ids; attempts per trace {_fmt(t['attempts_per_trace'])}; final attempt "
                  f"status {_fmt(t['final_attempt_status'])}"),
                  (f"- fallbacks (group changes within a trace, attempts ordered by endTime; status of the attempt "
                  f"fallen back to): {_fmt(t['fallbacks_by_end_time'])}"),
                  (f"- repeated attempts in the same group per trace (retries): "
                  f"{_fmt(t['repeated_attempts_in_same_group_per_trace'])}"),
                  (f"- traces whose startTime order differs from endTime order: "
                  f"{t['traces_where_start_time_order_differs_from_end_time_order']}; traces whose success payload "
                  f"has a startTime before their failure's: {t['traces_whose_success_starts_before_their_failure']}"),
                  (f"- client requests whose `x-litellm-call-id` is a payload's `litellm_call_id`: "
                  f"{g['client_call_ids_found_in_payloads']} of {c['requests']}")]
    if facts.get("proxy_log"):
        lines += ["", (f"Proxy log (`proxy.log`): router lines 'litellm.acompletion(model=…) Exception <class>', one "
                      f"per failed call (timeouts print none): {_fmt(facts['proxy_log']['call_exception_lines'])}")]
    lines += ["", "Engine /metrics scrapes:", ""]
    for folder, m in facts["engine_metrics"].items():
        gauges = "; ".join(f"{k} max {g['max']} at t={g['at_s']} s" for k, g in m["gauge_max"].items())
        counters = "; ".join(f"{k} last {g['last']} (drops {g['drops']})" for k, g in m["counters"].items())
        lines.append(f"- `{folder}`: {m['scrapes_ok']} ok, {m['scrapes_failed']} failed; not exposed by this build: "
                     f"{_fmt(m['gauges_not_exposed'])}"
                     + (f" (between t={m['scrapes_failed_between_s'][0]} and {m['scrapes_failed_between_s'][1]} s)"
                        if m.get("scrapes_failed_between_s") else "")
                     + f"; {gauges}; {counters}")
    lines += ["", "## Re-record", "", "```",
              ("SERVLENS_LITELLM=/path/to/venv-litellm/bin/litellm " if "litellm" in v else "")
              + f"python -m tools.engine.recordings run {meta['run']} --out tests/data/recorded", "```", ""]
    return "\n".join(lines)


def _iso(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


COMPRESS_ABOVE_BYTES = 1_000_000


def compress_large_files(run_dir: Path) -> list[Path]:
    """Files over 1 MB become ``<name>.zst`` (zstd level 19; servlens reads .zst as it is), the original removed."""
    import zstandard

    done = []
    for path in sorted(Path(run_dir).rglob("*")):
        if path.is_file() and path.suffix != ".zst" and path.stat().st_size > COMPRESS_ABOVE_BYTES:
            target = path.with_name(path.name + ".zst")
            target.write_bytes(zstandard.ZstdCompressor(level=19).compress(path.read_bytes()))
            path.unlink()
            done.append(target)
    return done


def write_facts_and_readme(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    compress_large_files(run_dir)
    meta = json.loads((run_dir / "recording.json").read_text(encoding="utf-8"))
    facts = run_facts(run_dir)
    (run_dir / "facts.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    (run_dir / "README.md").write_text(render_readme(run_dir, meta, facts), encoding="utf-8")
    return facts


def _headline(f: dict) -> str:
    """One line of the facts that tell what happened in a run."""
    c, parts = f["client"], []
    parts.append("client " + ", ".join(f"{k}: {v}" for k, v in c["http_status"].items()))
    if c["errors"]:
        parts.append("errors " + "; ".join(f"{k} ×{v}" for k, v in c["errors"].items()))
    g = f.get("gateway")
    if g:
        parts.append(f"{g['attempts']} attempts (" + ", ".join(f"{k} {v}" for k, v in g["status"].items()) + ")")
        if g["timeouts"]["count"]:
            d = g["timeouts"]["duration_s"]
            parts.append(f"{g['timeouts']['count']} Timeout at {d['min']}–{d['max']} s")
        if g["traces"]["fallbacks_by_end_time"]:
            parts.append("fallbacks " + ", ".join(f"{k} ×{v}" for k, v in g["traces"]["fallbacks_by_end_time"].items()))
        h = c.get("gateway_headers", {})
        if h.get("attempted_retries_sum"):
            parts.append(f"{h['attempted_retries_sum']} retries (x-litellm-attempted-retries)")
        if c.get("errors_saying_fallback_also_failed"):
            parts.append(f"{c['errors_saying_fallback_also_failed']} 'fallback also failed'")
    parts.append("finish " + ", ".join(f"{k} {v}" for k, v in c["finish_reason_of_200"].items()))
    if c["reasoning_present"] or c["think_markers_in_content"] > 3:
        parts.append(f"content empty {c['content_empty']} / reasoning {c['reasoning_present']} / both "
                     f"{c['content_empty_and_reasoning_present']} / <think> in content {c['think_markers_in_content']}")
    for folder, m in f["engine_metrics"].items():
        deferred = m["gauge_max"].get("llamacpp:requests_deferred", {}).get("max")
        drops = max((x["drops"] for x in m["counters"].values()), default=0)
        extra = [f"deferred max {deferred:g}" if deferred else "", f"{m['scrapes_failed']} failed scrapes"
                 if m["scrapes_failed"] else "", "counter reset" if drops else ""]
        if any(extra):
            parts.append(f"`{folder}`: " + ", ".join(x for x in extra if x))
    return "; ".join(parts)


def write_index(folder: Path) -> Path:
    """tests/data/recorded/README.md: one row per run folder, from each folder's facts.json."""
    folder = Path(folder)
    rows = []
    for run_dir in sorted(p.parent for p in folder.glob("*/facts.json")):
        meta = json.loads((run_dir / "recording.json").read_text(encoding="utf-8"))
        facts = json.loads((run_dir / "facts.json").read_text(encoding="utf-8"))
        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
        rows.append((run_dir.name, meta, facts, size))
    lines = ["# Recorded real runs", "",
             ("Small runs recorded on this project's shared 2-core machine from real servers: llama.cpp (the "
             "`xllamacpp` wheel, tools/engine/server.py, the tiny random-weight model, --threads 1) alone or behind a "
             "real LiteLLM proxy (`litellm[proxy]` from PyPI in its own venv). Each folder has a README saying how it "
             "was made and what is in it, `recording.json` (versions, flags, proxy config, injected events with their "
             "times) and `facts.json`, computed from the raw files by tools/engine/recording_facts.py without "
             "servlens. Re-record with tools/engine/recordings.py (see tools/engine/README.md)."), "",
             ("Layout: gateway runs (`gw-*`) have `litellm_slp.jsonl[.zst]` (one StandardLoggingPayload per attempt, "
             "unedited), `client/requests.jsonl` (the client's log, with the proxy's `x-litellm-*` response "
             "headers), the first backend's `/metrics` scrapes with `metrics_index.jsonl`, `props.json` and "
             "`engine.log` at the top, other backends in `backend-<name>/`, and `proxy.log`. Engine runs "
             "(`llamacpp-*`) have `requests.jsonl` at the top."), "",
             "| run | requests | made by | headline facts (from facts.json) | size |", "|---|---|---|---|---|"]
    for name, meta, facts, size in rows:
        v = meta["versions"]
        made = f"xllamacpp {v['xllamacpp']}" + (f", litellm {v['litellm']}" if "litellm" in v else "")
        lines.append(f"| [{name}]({name}/README.md) | {facts['client']['requests']} | {made} | {_headline(facts)} | "
                     f"{size / 1e6:.2f} MB |")
    lines += ["", "## What each run is", ""]
    for name, meta, _, _ in rows:
        lines.append(f"- **{name}**: {meta['description']}")
    lines.append("")
    out = folder / "README.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
