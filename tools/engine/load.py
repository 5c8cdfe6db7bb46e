"""A bounded load driver and a /metrics scraper that write what a gateway in front of the engine would log.

One JSON line per request in ``requests.jsonl`` (the record format of tests/data/shared/real-engine/*/requests.jsonl):
``run, req_idx, path, body`` (the request as sent), client times as Unix seconds — ``send_ts, headers_ts,
first_byte_ts, first_data_chunk_ts, first_token_ts`` (streams: first chunk with any generated text, reasoning
included), ``end_ts`` — and ``e2e_s, ttft_client_s, content_chunk_offsets_s`` (per *content* chunk, seconds from
send), ``http_status, finish_reason`` and ``response`` (the whole body, non-streamed) or ``stream_final_chunk`` (the
last SSE chunk: ``usage`` and llama.cpp ``timings``). Also as in that recording: ``prompt_words``,
``queued_at_client_s`` (when the client sent it, seconds from the start of the run — not a wait), ``n_chunks``,
``output_chars``, ``cache_prompt``. Added here: ``send_late_s`` (how far behind its planned time the client sent it)
and, for streams, the reassembled ``stream_content`` and ``stream_reasoning_content`` (what a gateway that
reassembles streams would log).

The scraper writes ``metrics_<run>_<NNN>.prom`` about once a second and ``metrics_index.jsonl`` lines
``{file, run, scrape_ts, t_rel_s, status}``.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests


@dataclass(frozen=True)
class PlannedRequest:
    req_idx: int
    offset_s: float  # when to send it, seconds after the run starts
    path: str  # /v1/chat/completions or /v1/completions
    body: dict
    prompt_words: int = 0


class RequestLog:
    """Appends one JSON line per finished request (in completion order, as a gateway would)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False)
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _send(session: requests.Session, base_url: str, run: str, planned: PlannedRequest, run_start: float,
          timeout: float, record_headers: tuple[str, ...] = ()) -> dict:
    body = planned.body
    stream = bool(body.get("stream"))
    rec: dict = {"run": run, "req_idx": planned.req_idx, "path": planned.path, "body": body,
                 "prompt_words": planned.prompt_words}
    if "cache_prompt" in body:
        rec["cache_prompt"] = body["cache_prompt"]
    send_ts = time.time()
    # As in the shared recording: when the client sent it, in seconds from the start of the run (not a wait).
    rec["queued_at_client_s"] = round(send_ts - run_start, 6)
    rec["send_late_s"] = round(max(0.0, send_ts - run_start - planned.offset_s), 6)  # behind its schedule
    rec["send_ts"] = send_ts
    try:
        resp = session.post(base_url + planned.path, json=body, stream=True, timeout=timeout)
        rec["http_status"] = resp.status_code
        rec["headers_ts"] = time.time()
        if record_headers:  # response headers whose lower-cased name starts with one of these (a gateway's own)
            rec["response_headers"] = {k.lower(): v for k, v in resp.headers.items()
                                       if k.lower().startswith(record_headers)}
        if stream and resp.status_code == 200:
            _read_stream(resp, rec, send_ts)
        else:
            chunks = []
            for chunk in resp.iter_content(chunk_size=None):
                if not chunks:
                    rec["first_byte_ts"] = time.time()
                chunks.append(chunk)
            raw = b"".join(chunks)
            try:
                rec["response"] = json.loads(raw)
            except ValueError:
                rec["response"] = {"error": {"message": raw[:500].decode(errors="replace"), "type": "unparsable"}}
            choices = rec["response"].get("choices") if isinstance(rec["response"], dict) else None
            rec["finish_reason"] = choices[0].get("finish_reason") if choices else None
        resp.close()
    except requests.RequestException as exc:  # a client-side failure is logged, like a gateway would
        rec["http_status"] = None
        rec["finish_reason"] = None
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    end_ts = time.time()
    rec["end_ts"] = end_ts
    rec["e2e_s"] = round(end_ts - send_ts, 6)
    return rec


def _read_stream(resp: requests.Response, rec: dict, send_ts: float) -> None:
    rec.update(first_byte_ts=None, first_data_chunk_ts=None, first_token_ts=None, finish_reason=None)
    offsets: list[float] = []
    content: list[str] = []
    reasoning: dict[str, list[str]] = {}  # by the delta's own field name (reasoning_content, reasoning)
    n_chunks = 0
    last = None
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        now = time.time()
        if rec["first_byte_ts"] is None:
            rec["first_byte_ts"] = now
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            if rec["first_data_chunk_ts"] is None:
                rec["first_data_chunk_ts"] = now
            n_chunks += 1
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            last = obj
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                thoughts = {k: delta[k] for k in ("reasoning_content", "reasoning") if delta.get(k)}
                if (text or thoughts) and rec["first_token_ts"] is None:
                    rec["first_token_ts"] = now
                if text:
                    offsets.append(round(now - send_ts, 6))
                    content.append(text)
                for key, thought in thoughts.items():
                    reasoning.setdefault(key, []).append(thought)
                if choice.get("finish_reason"):
                    rec["finish_reason"] = choice["finish_reason"]
            if "error" in obj and rec["finish_reason"] is None:
                rec["stream_error"] = obj["error"]
    rec["content_chunk_offsets_s"] = offsets
    rec["n_chunks"] = n_chunks
    rec["stream_final_chunk"] = last
    rec["output_chars"] = sum(len(t) for t in content)
    rec["stream_content"] = "".join(content)
    # The reassembled reasoning keeps the engine's name: stream_reasoning_content (llama.cpp, older vLLM) or
    # stream_reasoning (newer vLLM); an empty stream_reasoning_content when the stream had none, as before.
    for key, parts in (reasoning or {"reasoning_content": []}).items():
        rec[f"stream_{key}"] = "".join(parts)
    if rec["first_token_ts"] is not None:
        rec["ttft_client_s"] = round(rec["first_token_ts"] - send_ts, 6)


def drive(base_url: str, run: str, plan: list[PlannedRequest], log: RequestLog, max_in_flight: int = 64,
          timeout: float = 120.0, headers: dict | None = None, record_headers: tuple[str, ...] = ()) -> dict:
    """Send ``plan`` on its schedule (each request at its offset, bursts all at once), at most ``max_in_flight``
    open at a time, logging each as it finishes. ``headers`` go with every request (a gateway's key);
    ``record_headers`` are the prefixes of response headers to log. Returns a small summary."""
    plan = sorted(plan, key=lambda p: (p.offset_s, p.req_idx))
    session = requests.Session()
    session.headers.update(headers or {})
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=max_in_flight)
    session.mount("http://", adapter)
    t0_wall, t0 = time.time(), time.monotonic()
    statuses: dict = {}
    lock = threading.Lock()

    def task(p: PlannedRequest) -> None:
        rec = _send(session, base_url, run, p, t0_wall, timeout, record_headers)
        log.write(rec)
        with lock:
            statuses[rec["http_status"]] = statuses.get(rec["http_status"], 0) + 1

    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="load") as pool:
        for p in plan:
            delay = p.offset_s - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            pool.submit(task, p)
    session.close()
    return {"run": run, "requests": len(plan), "wall_s": round(time.monotonic() - t0, 3),
            "http_status": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))}}


class MetricsScraper:
    """Scrapes ``/metrics`` every ``interval`` seconds into numbered files plus an index with the scrape time."""

    def __init__(self, base_url: str, run: str, out_dir: Path, interval: float = 1.0):
        self.base_url, self.run, self.out_dir, self.interval = base_url, run, out_dir, interval
        self.n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"scrape-{run}", daemon=True)
        self._t0 = None

    def scrape_once(self) -> None:
        ts = time.time()
        if self._t0 is None:
            self._t0 = ts
        name = f"metrics_{self.run}_{self.n:03d}.prom"
        try:
            resp = requests.get(self.base_url + "/metrics", timeout=5)
            status, text = resp.status_code, resp.text
        except requests.RequestException:
            status, text = None, None
        entry = {"file": name if text is not None else None, "run": self.run, "scrape_ts": ts,
                 "t_rel_s": round(ts - self._t0, 3), "status": status}
        if text is not None:
            (self.out_dir / name).write_text(text, encoding="utf-8")
            self.n += 1
        with open(self.out_dir / "metrics_index.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> "MetricsScraper":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and take one last scrape, so the counters' final values are in the files."""
        self._stop.set()
        self._thread.join(10)
        self.scrape_once()
