"""Pulling engine metrics straight from a Prometheus-compatible server (`--prometheus URL`, issue 18).

    pull = prometheus_pull(URL, required=["llamacpp:requests_deferred"], selector='{job="llm"}')
    session = open_session(pull)          # reaches the server first: down or 401 fails before any write
    summaries = session.pull_into(con, {"burst": (t0, t1)})   # one transaction for every run

What is asked for: the normalised names the selected rules' `[[requires]]` name, widened through the metric-roles
table (servlens/store/metric_roles.toml) to every engine family's series of the same role (a rule written against vLLM's waiting gauge also gets
llama.cpp's deferred gauge, SGLang's and TGI's queue sizes), plus the roles the workload summary reads. They
are fetched raw (no rate(), no sum: counters, gauges and histogram `_bucket/_sum/_count` as exposed) with one
selector per range, `{__name__=~"(?:a|b|...)(?:_total|_bucket|_sum|_count)?", <--prometheus-selector
matchers>}`, via `/api/v1/query_range` at the targets' scrape interval (read from `/api/v1/targets`, else
`/api/v1/status/config`, else 15 s with a note). The step grid sits half an interval after the target's scrape
phase (its last `up` sample in the window, else its `lastScrape`), so each step picks exactly one scrape
(jitter up to half an interval) and a sample is neither repeated nor skipped; a stored time is therefore the
evaluation step, at most half an interval after the scrape.

What lands in the store is what a saved query_range JSON file gives (servlens.ingest.metrics, format
'prometheus-api'): the same name normalisation, `name_raw` as exposed, counter resets left to the store's
views. The source row's path is the URL (credentials removed) plus the query, start, end and step; its sha256
is that of the merged answer, so pulling the same window again adds nothing and a window whose data changed
replaces its rows.

Robustness (Prometheus web/api/v1/api.go): `status: error` answers (errorType bad_data/execution/timeout/...)
are one sentence; `warnings` are kept in the summary; "NaN"/"+Inf" strings are values like any other; a range
over MAX_POINTS points per series is split (and split again when a server's own limit is lower); timeouts, 429
and 5xx are retried with backoff; bearer token or basic auth come from SERVLENS_PROMETHEUS_TOKEN or
SERVLENS_PROMETHEUS_USER / SERVLENS_PROMETHEUS_PASSWORD and are never echoed (nor is a user:password in the
URL).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb

from servlens.errors import InputError
from servlens.ingest import sources as src
from servlens.ingest.prometheus import METRIC_RENAMES, normalise_name
from servlens.store import metric_roles

TOKEN_ENV = "SERVLENS_PROMETHEUS_TOKEN"
USER_ENV = "SERVLENS_PROMETHEUS_USER"
PASSWORD_ENV = "SERVLENS_PROMETHEUS_PASSWORD"

# Prometheus refuses a range query over 11,000 points per series (web/api/v1/api.go: "exceeded maximum
# resolution of 11,000 points per timeseries").
MAX_POINTS = 11_000
DEFAULT_INTERVAL_S = 15.0  # Prometheus' own default scrape_interval, used only when the server does not say
# the request logs' span is widened by this on each side: gauges before the first request
DEFAULT_PAD_S = 120.0
SOURCE_FORMAT = "prometheus-api"

# What the workload summary reads whatever rules run (servlens.analysis.workload: running and waiting gauges):
# the pull group that holds them in servlens/store/metric_roles.toml.
WORKLOAD_GROUPS = ("queue",)
_EXPOSED_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_RETRY_STATUS = (429, 502, 503, 504)


class PrometheusError(InputError):
    """The server could not be read as asked (down, refused, a PromQL error): one sentence, exit 2."""


def wanted_metrics(required: Iterable[str]) -> frozenset[str]:
    """The normalised names to pull: `required`, every name sharing a pull group with one of them (each engine
    family's series of the same role, servlens/store/metric_roles.toml), the workload's groups."""
    required = {normalise_name(name) for name in required}
    wanted = set(required)
    for group, names in metric_roles.groups().items():
        if group in WORKLOAD_GROUPS or required & set(names):
            wanted.update(names)
    return frozenset(wanted)


def required_by(rules) -> list[str]:
    """The metric names the rules' `[[requires]]` paths name (servlens.analysis.rules.Rule objects); a
    `role:NAME` entry names every metric of that role."""
    named = {m for rule in rules for req in rule.requires for m in req.metrics}
    return sorted({n for m in named for n in (metric_roles.names(m[5:]) if m.startswith("role:") else (m,))})


# ------------------------------------------------------------------------------------------------------------
# what to pull


@dataclass(frozen=True)
class PrometheusPull:
    """A --prometheus request: where, what, and (optionally) when."""

    url: str  # base URL without credentials, e.g. http://127.0.0.1:9090
    metrics: frozenset[str]
    matchers: str = ""  # the inside of --prometheus-selector's braces: job="llm",namespace=~"a|b"
    start: float | None = None  # Unix seconds; None = from the request logs
    end: float | None = None
    auth: str | None = field(default=None, repr=False)  # the Authorization header value; never printed
    pad_s: float = DEFAULT_PAD_S
    timeout_s: float = 30.0
    retries: int = 3

    def query(self) -> str:
        bases = sorted(self.metrics | {old for old, new in METRIC_RENAMES.items() if new in self.metrics})
        names = "|".join(re.escape(b).replace("\\:", ":") for b in bases)
        suffixes = "|".join(_EXPOSED_SUFFIXES)
        selector = f'__name__=~"(?:{names})(?:{suffixes})?"'
        return "{" + selector + ("," + self.matchers if self.matchers else "") + "}"


def prometheus_pull(
    url: str,
    *,
    required: Iterable[str] = (),
    selector: str | None = None,
    start: str | float | None = None,
    end: str | float | None = None,
    env: Mapping[str, str] | None = None,
) -> PrometheusPull:
    """Check the --prometheus options and build the request (credentials from the environment)."""
    env = os.environ if env is None else env
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(
            f"--prometheus {_safe(url)!r} is not an http(s) URL",
            "Give the server's base URL, e.g. http://prometheus:9090",
        )
    user, password = parsed.username, parsed.password
    netloc = parsed.hostname + (f":{parsed.port}" if parsed.port else "")
    if ":" in parsed.hostname:  # IPv6 literal
        netloc = f"[{parsed.hostname}]" + (f":{parsed.port}" if parsed.port else "")
    base = urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path.rstrip("/"), "", ""))
    auth = None
    if env.get(TOKEN_ENV):
        auth = "Bearer " + env[TOKEN_ENV].strip()
    elif env.get(USER_ENV) or user:
        pair = (
            f"{env.get(USER_ENV) or urllib.parse.unquote(user or '')}:"
            f"{env.get(PASSWORD_ENV) or urllib.parse.unquote(password or '')}"
        )
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    first = _parse_time(start, "--prometheus-start") if start is not None else None
    last = _parse_time(end, "--prometheus-end") if end is not None else None
    if (first is None) != (last is None):
        raise InputError(
            "--prometheus-start and --prometheus-end go together",
            "Give both, or neither to take the window from the request logs",
        )
    if first is not None and last <= first:
        raise InputError(
            "--prometheus-end is not after --prometheus-start", "Give a window that moves forward"
        )
    return PrometheusPull(base, wanted_metrics(required), _matchers(selector), first, last, auth)


def _matchers(selector: str | None) -> str:
    if not selector or not selector.strip():
        return ""
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise InputError(
            f"--prometheus-selector {text!r} is not a label selector",
            'Give label matchers in braces, e.g. \'{job="llm",namespace="prod"}\'',
        )
    inner = text[1:-1].strip().rstrip(",")
    if "__name__" in inner:
        raise InputError(
            "--prometheus-selector may not match __name__",
            "servlens picks the metric names its rules need; narrow by job, instance or namespace",
        )
    return inner


def _parse_time(value: str | float, option: str) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{option} {text!r} is not a time",
            "Give an ISO-8601 time such as 2026-11-28T14:00:00Z, or Unix seconds",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _safe(url: str) -> str:
    """The URL without any user:password part, for messages and the source row."""
    return re.sub(r"//[^/@]*@", "//", url)


# ------------------------------------------------------------------------------------------------------------
# HTTP


class PrometheusClient:
    """GET/POST against the HTTP API with the envelope checked: returns `data`, collects `warnings`."""

    def __init__(self, pull: PrometheusPull, sleep: Callable[[float], None] = time.sleep):
        self.pull = pull
        self.sleep = sleep
        self.warnings: list[str] = []
        self.requests = 0
        self.bytes = 0

    def get(
        self,
        path: str,
        params: list[tuple[str, str]] | None = None,
        *,
        optional: bool = False,
        post: bool = False,
    ):
        """The answer's `data`; with `optional`, None when the server has no such endpoint (404/405/501 or an
        answer that is not the API's JSON), so a compatible store lacking it falls back instead of failing."""
        url = self.pull.url + path
        body = urllib.parse.urlencode(params or []).encode() if post else None
        if params and not post:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", "User-Agent": "servlens"}
        if post:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if self.pull.auth:
            headers["Authorization"] = self.pull.auth
        attempt = 0
        while True:
            attempt += 1
            status, raw, problem = self._once(url, body, headers)
            retry = problem is not None or status in _RETRY_STATUS
            if retry and attempt <= self.pull.retries:
                self.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
                continue
            break
        where = f"Prometheus at {self.pull.url}"
        if problem is not None:
            tries = f" after {attempt} tries" if attempt > 1 else ""
            raise PrometheusError(
                f"Cannot read {where}{tries}: {problem}",
                "Check the URL and that the server is up; nothing was written",
            )
        if status in (401, 403):
            creds = "the credentials given were refused" if self.pull.auth else "it asks for credentials"
            raise PrometheusError(
                f"{where} refused the request (HTTP {status}): {creds}",
                f"Set {TOKEN_ENV} (a bearer token) or {USER_ENV} and {PASSWORD_ENV}; nothing was written",
            )
        answer = _decode(raw)
        if answer is None:
            if optional and status in (404, 405, 501):
                return None
            if optional and 200 <= status < 300:
                return None
            raise PrometheusError(
                f"{where} did not answer {path} as a Prometheus API (HTTP {status}, "
                f"{len(raw)} bytes that are not its JSON)",
                "Check that the URL is the server's base URL (the one that serves /api/v1)",
            )
        self.warnings.extend(str(w) for w in answer.get("warnings") or [])
        if answer.get("status") == "error":
            if optional and status in (404, 405, 501):
                return None
            raise PrometheusError(
                f"{where} answered {path} with an error ({answer.get('errorType', 'error')}: "
                f"{str(answer.get('error', ''))[:300]})",
                "Check --prometheus-selector; nothing was written",
            )
        if status >= 400 or answer.get("status") != "success":
            if optional:
                return None
            raise PrometheusError(f"{where} answered {path} with HTTP {status}", "Nothing was written")
        return answer.get("data")

    def _once(self, url: str, body: bytes | None, headers: dict) -> tuple[int, bytes, str | None]:
        self.requests += 1
        request = urllib.request.Request(
            url, data=body, headers=headers, method="POST" if body is not None else "GET"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.pull.timeout_s) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        except TimeoutError:
            return 0, b"", f"no answer within {self.pull.timeout_s:g} s"
        except urllib.error.URLError as err:
            reason = err.reason
            if isinstance(reason, (socket.timeout, TimeoutError)):
                return 0, b"", f"no answer within {self.pull.timeout_s:g} s"
            text = getattr(reason, "strerror", None) or str(reason)
            return 0, b"", str(text).lower()
        except (ConnectionError, OSError) as err:
            return 0, b"", (err.strerror or str(err)).lower()
        self.bytes += len(raw)
        return status, raw, None


def _decode(raw: bytes) -> dict | None:
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return answer if isinstance(answer, dict) and "status" in answer else None


# ------------------------------------------------------------------------------------------------------------
# scrape interval


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float | None:
    """A Prometheus duration ('15s', '1m30s', '500ms') in seconds; None when it is not one."""
    text = str(text).strip().strip("\"'")
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _rfc3339(text: str | None) -> float | None:
    if not text or text.startswith("0001-"):
        return None
    # VictoriaMetrics 1.79 writes the fraction without its dot ('2026-12-01T23:07:00931Z'): read both forms.
    match = re.fullmatch(r"(.*?T\d\d:\d\d:\d\d)(?:\.?(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not match:
        return None
    head, fraction, zone = match.groups()
    try:
        moment = datetime.fromisoformat(head + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return moment.timestamp() + (float("0." + fraction) if fraction else 0.0)


_EQUALITY = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')


def _target_matches(labels: dict, matchers: str) -> bool:
    """Whether a target's labels satisfy the selector's matchers (regex matchers anchored, as in PromQL)."""
    for name, op, value in _EQUALITY.findall(matchers):
        have = str(labels.get(name, ""))
        value = value.encode().decode("unicode_escape") if "\\" in value else value
        if op == "=" and have != value or op == "!=" and have == value:
            return False
        if op in ("=~", "!~"):
            try:
                hit = re.fullmatch(value, have) is not None
            except re.error:
                continue
            if hit != (op == "=~"):
                return False
    return True


@dataclass
class Interval:
    seconds: float
    source: str  # 'targets' | 'config' | 'default'
    phase: float | None = None  # a recent scrape time of the target (Unix s), to align the step grid on
    note: str | None = None


def scrape_interval(client: PrometheusClient) -> Interval:
    """The scrape interval of the targets the selector picks: /api/v1/targets, else the config, else 15 s."""
    data = client.get("/api/v1/targets", [("state", "active")], optional=True)
    targets = (data or {}).get("activeTargets") or [] if isinstance(data, dict) else []
    picked = [
        t
        for t in targets
        if isinstance(t, dict) and _target_matches(t.get("labels") or {}, client.pull.matchers)
    ]
    timed = [(parse_duration(t.get("scrapeInterval", "")), t) for t in picked or targets]
    timed = [(s, t) for s, t in timed if s]
    if timed:
        seconds, target = min(timed, key=lambda pair: pair[0])
        return Interval(seconds, "targets", _rfc3339(target.get("lastScrape")))
    data = client.get("/api/v1/status/config", optional=True)
    found = (
        [parse_duration(v) for v in re.findall(r"scrape_interval:\s*(\S+)", (data or {}).get("yaml", ""))]
        if isinstance(data, dict)
        else []
    )
    found = [s for s in found if s]
    if found:
        return Interval(min(found), "config")
    return Interval(
        DEFAULT_INTERVAL_S,
        "default",
        note=(
            f"the server did not say its scrape interval (/api/v1/targets, /api/v1/status/config): "
            f"a {DEFAULT_INTERVAL_S:g} s step was assumed, so a faster scrape is read at 15 s resolution"
        ),
    )


# ------------------------------------------------------------------------------------------------------------
# range queries


def step_grid(start: float, end: float, step: float, phase: float | None) -> tuple[float, float] | None:
    """The first and last evaluation time in [start, end]: half a step after the scrape phase when known (so
    each step picks one scrape), else on multiples of the step. None when the window holds no step."""
    offset = ((phase + step / 2) % step) if phase is not None else 0.0
    first = math.ceil((start - offset) / step) * step + offset
    last = math.floor((end - offset) / step) * step + offset
    if last < first:
        return None
    return round(first, 3), round(last, 3)


def chunks(first: float, last: float, step: float, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """[first, last] cut into ranges of at most `max_points` steps each, none sharing a point."""
    total = round((last - first) / step) + 1
    out = []
    for begin in range(0, total, max_points):
        count = min(max_points, total - begin)
        out.append((round(first + begin * step, 3), round(first + (begin + count - 1) * step, 3)))
    return out


_RESOLUTION = re.compile(r"maximum resolution of ([\d,]+) points")


@dataclass
class Pulled:
    """One run's merged answer and what it took to get."""

    run: str
    path: str  # the URL plus the query: the source row's path
    document: dict
    series: int
    points: int
    step_s: float
    start: float
    end: float
    requests: int = 0
    bytes: int = 0
    seconds: float = 0.0


def query_range(
    client: PrometheusClient,
    query: str,
    first: float,
    last: float,
    step: float,
    on_chunk: Callable[[int, int], None] | None = None,
) -> dict[str, dict]:
    """Every series of `query` over the grid first..last, merged across the chunks: {labels JSON: series}.
    `on_chunk(done, total)` is told after each range query (a progress bar)."""
    merged: dict[str, dict] = {}
    pending = [(a, b, MAX_POINTS) for a, b in chunks(first, last, step)]
    done = 0
    while pending:
        if on_chunk is not None:
            on_chunk(done, done + len(pending))
        done += 1
        a, b, limit = pending.pop(0)
        try:
            data = client.get(
                "/api/v1/query_range",
                [("query", query), ("start", f"{a:.3f}"), ("end", f"{b:.3f}"), ("step", f"{step:g}")],
                post=True,
            )
        except PrometheusError as err:
            lower = _RESOLUTION.search(str(err))
            if lower is None:
                raise
            # A server whose own limit is below ours (a proxy, a Thanos/Mimir setting): split again under it.
            smaller = min(int(lower.group(1).replace(",", "")), limit // 2)
            if smaller < 1:
                raise
            pending[:0] = [(x, y, smaller) for x, y in chunks(a, b, step, smaller)]
            continue
        if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
            kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            raise PrometheusError(
                f"Prometheus at {client.pull.url} answered a range query with a '{kind}' result",
                "Nothing was written",
            )
        for series in data.get("result") or []:
            key = json.dumps(series.get("metric") or {}, sort_keys=True)
            into = merged.setdefault(key, {"metric": series.get("metric") or {}})
            if "values" in series or "value" in series:
                into.setdefault("values", []).extend(series.get("values") or [series["value"]])
            if "histograms" in series:  # native histograms: kept so the ingest names them as not read
                into.setdefault("histograms", []).extend(series["histograms"])
    return merged


# ------------------------------------------------------------------------------------------------------------
# a session: reach the server, then pull each run's window into the store


@dataclass
class PrometheusSession:
    pull: PrometheusPull
    client: PrometheusClient
    interval: Interval

    def window_for(self, span: tuple[datetime | None, datetime | None] | None) -> tuple[float, float] | None:
        """The window to pull: --prometheus-start/--end, else the span padded, else None (nothing to take it
        from)."""
        if self.pull.start is not None:
            return self.pull.start, self.pull.end
        if not span or span[0] is None:
            return None
        # Not clamped to now: the same logs ask for the same window (one source path), however late it is
        # pulled.
        t0, t1 = (moment.replace(tzinfo=UTC).timestamp() for moment in span)
        return round(t0 - self.pull.pad_s, 3), round(t1 + self.pull.pad_s, 3)

    def scrape_phase(self, moments: tuple[float, ...]) -> float | None:
        """When a target was scraped: the time of its last `up` sample at or before the first of `moments`
        that has one (the window's middle, then its last step). A stored sample in the past gives the same
        grid on every pull of the window; the live `lastScrape` of the targets, read last, moves with the
        scrapes' jitter."""
        matchers = "{" + self.pull.matchers + "}"
        for at in moments:
            at = min(at, time.time())
            try:
                data = self.client.get(
                    "/api/v1/query",
                    [("query", f"timestamp(up{matchers})"), ("time", f"{at:.3f}")],
                    optional=True,
                )
            except PrometheusError:
                return self.interval.phase
            found = (
                data.get("result") if isinstance(data, dict) and data.get("resultType") == "vector" else None
            )
            for series in sorted(found or [], key=lambda s: json.dumps(s.get("metric"), sort_keys=True)):
                try:
                    return float(series["value"][1])
                except (KeyError, IndexError, TypeError, ValueError):
                    continue
        return self.interval.phase

    def fetch(
        self, run: str, window: tuple[float, float], on_chunk: Callable[[int, int], None] | None = None
    ) -> Pulled:
        started = time.monotonic()
        requests, size = self.client.requests, self.client.bytes
        step = self.interval.seconds
        query = self.pull.query()
        # No step after now: Prometheus would fill future steps with the last sample for its 5-minute
        # lookback.
        last_step = min(window[1], time.time())
        grid = step_grid(
            window[0], last_step, step, self.scrape_phase(((window[0] + window[1]) / 2, last_step))
        )
        merged = query_range(self.client, query, *grid, step, on_chunk) if grid else {}
        document = {"status": "success", "data": {"resultType": "matrix", "result": list(merged.values())}}
        points = sum(len(s.get("values") or []) for s in merged.values())
        # The window asked for, not the step grid (its phase moves by the scrapes' jitter): one path per
        # window, so a second pull of it replaces or skips instead of adding a second copy.
        first, last = window
        path = (
            f"{self.pull.url}/api/v1/query_range?query={query}&start={_iso(first)}&end={_iso(last)}"
            f"&step={step:g}s"
        )
        return Pulled(
            run,
            path,
            document,
            len(merged),
            points,
            step,
            first,
            last,
            self.client.requests - requests,
            self.client.bytes - size,
            round(time.monotonic() - started, 3),
        )

    def store(self, con: duckdb.DuckDBPyConnection, pulled: Pulled) -> dict:
        """Write one run's answer as a 'prometheus-api' source, inside the caller's transaction."""
        from servlens.ingest.metrics import TIME_SOURCE_TEXT, _ingest_api, _insert_errors

        text = json.dumps(pulled.document, sort_keys=True, separators=(",", ":"))
        sha = hashlib.sha256(text.encode()).hexdigest()
        decision = _decide(con, pulled.run, pulled.path, sha, len(text.encode()))
        summary = {
            "path": pulled.path,
            "kind": "metrics",
            "format": SOURCE_FORMAT,
            "run": pulled.run,
            "source_id": decision.old_source_id,
            "action": decision.action,
            "rows": 0,
            "bad_lines": 0,
            "t_min": None,
            "t_max": None,
            "time_source": "query_result",
            "time_source_text": "scrape time from " + TIME_SOURCE_TEXT["query_result"],
            "metrics": [],
            "runs": [pulled.run],
            "skipped": decision.action == "skip",
            "replaced": decision.action == "replace",
            "prometheus": {
                "url": self.pull.url,
                "step_s": pulled.step_s,
                "interval_from": self.interval.source,
                "start": _iso(pulled.start),
                "end": _iso(pulled.end),
                "series": pulled.series,
                "points": pulled.points,
                "http_requests": pulled.requests,
                "bytes": pulled.bytes,
                "seconds": pulled.seconds,
                "warnings": list(dict.fromkeys(self.client.warnings)),
                "notes": [n for n in (self.interval.note,) if n],
            },
        }
        if decision.action == "skip":
            summary["note"] = "already ingested: the same answer in the same run; nothing added"
            return summary
        if decision.action == "replace" and decision.old_source_id is not None:
            src.delete_source(con, decision.old_source_id)
        src.ensure_run(con, pulled.run)
        source_id = src.insert_source(
            con,
            run=pulled.run,
            kind="metrics",
            path=pulled.path,
            decision=decision,
            fmt=SOURCE_FORMAT,
            time_source="query_result",
        )
        errors, skipped = _ingest_api(con, text, pulled.path, pulled.run, source_id)
        _insert_errors(con, source_id, pulled.path, errors, False)
        src.update_source_counts(con, source_id)
        rows, bad, t_min, t_max = con.execute(
            "SELECT rows, bad_lines, t_min, t_max FROM sources WHERE source_id = ?", [source_id]
        ).fetchone()
        names = con.execute(
            "SELECT DISTINCT name FROM metric_samples WHERE source_id = ? ORDER BY name", [source_id]
        ).fetchall()
        summary.update(
            source_id=source_id,
            rows=rows,
            bad_lines=bad,
            series_skipped=skipped,
            t_min=t_min.isoformat() + "Z" if t_min else None,
            t_max=t_max.isoformat() + "Z" if t_max else None,
            metrics=[n[0] for n in names],
        )
        if not pulled.series:
            summary["prometheus"]["notes"].append(
                "the server has none of the series servlens reads in this window (with this selector): the "
                "rules that need engine metrics are not evaluable"
            )
        return summary

    def pull_into(
        self,
        con: duckdb.DuckDBPyConnection,
        windows: Mapping[str, tuple[float, float]],
        progress: bool = False,
    ) -> list[dict]:
        """Fetch every run's window, then write them all in one transaction: a failure writes nothing. With
        `progress`, a bar on stderr while a window takes more than one range query."""
        bar = _ChunkProgress() if progress else None
        try:
            fetched = [
                self.fetch(run, window, bar.update if bar else None) for run, window in windows.items()
            ]
        finally:
            if bar:
                bar.close()
        with src.one_transaction(con):
            return [self.store(con, pulled) for pulled in fetched]


class _ChunkProgress:
    """A transient rich bar on stderr over the range queries of a window, shown from its second query on."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def update(self, done: int, total: int) -> None:
        if total < 2:
            return
        if self.progress is None:
            import sys

            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(TextColumn("[bold]prometheus[/] range queries"), BarColumn(),
                                     MofNCompleteColumn(), console=Console(file=sys.stderr), transient=True)
            self.task = self.progress.add_task("pull", total=total)
            self.progress.start()
        self.progress.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def open_session(pull: PrometheusPull, sleep: Callable[[float], None] = time.sleep) -> PrometheusSession:
    """Reach the server and read its scrape interval (a server that is down or refuses fails here, before any
    write)."""
    client = PrometheusClient(pull, sleep)
    return PrometheusSession(pull, client, scrape_interval(client))


def _decide(con, run: str, path: str, sha: str, size: int) -> src.SourceDecision:
    same = con.execute(
        "SELECT source_id FROM sources WHERE run = ? AND kind = 'metrics' AND sha256 = ?", [run, sha]
    ).fetchone()
    if same:
        return src.SourceDecision("skip", sha, size, same[0])
    same_path = con.execute(
        "SELECT source_id FROM sources WHERE run = ? AND kind = 'metrics' AND path = ?", [run, path]
    ).fetchone()
    if same_path:
        return src.SourceDecision("replace", sha, size, same_path[0])
    return src.SourceDecision("new", sha, size)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run_windows(
    con: duckdb.DuckDBPyConnection, session: PrometheusSession, runs: list[str], default_run: str | None
) -> dict[str, tuple[float, float]]:
    """The window to pull for each run: the run's request span padded (or --prometheus-start/--end for all of
    them); with no request log, --prometheus-start/--end into `default_run` (--run, else 'prometheus')."""
    windows: dict[str, tuple[float, float]] = {}
    for run in runs:
        found = con.execute(
            "SELECT min(coalesce(t_arrival, t_first_token, t_end)), max(coalesce(t_end, t_first_token, "
            "t_arrival)), "
            "(SELECT coalesce(bool_or(relative_clock), false) FROM runs WHERE run = $run) "
            "FROM requests WHERE run = $run",
            {"run": run},
        ).fetchone()
        if found[0] is None:
            continue
        if found[2] and session.pull.start is None:
            raise InputError(
                f"Run {run} has a relative clock, so its time in Prometheus is unknown",
                "Give --prometheus-start and --prometheus-end, or --start for the log's clock",
            )
        windows[run] = session.window_for((found[0], found[1]))
    if not windows:
        if session.pull.start is None:
            raise InputError(
                "--prometheus needs a time window and no request log gives one",
                "Name request logs, or give --prometheus-start and --prometheus-end",
            )
        windows[default_run or "prometheus"] = (session.pull.start, session.pull.end)
    return windows
