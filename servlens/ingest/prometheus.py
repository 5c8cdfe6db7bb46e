"""Parsing Prometheus text 0.0.4 and OpenMetrics 1.0 expositions into normalised samples.

Scrapes are small (a vLLM /metrics page is ~650 lines), so they are parsed here in Python, line by line, keeping
each sample's line number; the rows are then inserted in bulk by servlens.ingest.metrics. What this module settles:

- Format: OpenMetrics when the text ends with `# EOF` (or declares `# UNIT`/OpenMetrics-only types); else text 0.0.4.
  Sample timestamps are int64 **milliseconds** in text 0.0.4 and float **seconds** in OpenMetrics.
- Families: a sample belongs to the family its TYPE line declares, by the suffixes that type allows (text 0.0.4 from
  prometheus_client declares `# TYPE foo_total counter`; OpenMetrics declares `# TYPE foo counter` with `foo_total`).
  A sample without a TYPE is its own `untyped` family.
- `_created` series (creation times, not values) are dropped, both OpenMetrics' in-family `foo_created` samples and
  prometheus_client's separate `# TYPE foo_created gauge` families.
- `name` is the normalised suffix-free base name: `_total` stripped from counters, `_bucket/_sum/_count` from
  histograms and summaries (a histogram whose own name ends in `_total`, like `vllm:iteration_tokens_total`, keeps it);
  gauges and untyped samples keep their name. Renamed vLLM/SGLang metrics are mapped to their current name
  (reference/engines.md §1c, §8); `name_raw` keeps the name as exposed. When one scrape exposes both the deprecated
  and the current name (vLLM's transition releases), the deprecated copy is dropped so sums do not double count.
- Histogram buckets keep `le` as a number (`+Inf` → infinity), summary quantiles keep theirs in the same column; the
  `le`/`quantile` label is removed from `labels`. Label values have their escapes (`\\\\`, `\\"`, `\\n`) decoded.
- A malformed line is reported with its line number and reason and does not stop the rest of the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

TEXT_FORMAT = "prometheus-text"
OPENMETRICS_FORMAT = "openmetrics"

# Old exposed base name -> current base name (after suffix stripping). reference/engines.md §1c and §8.
# `vllm:gpu_prefix_cache_*` counted blocks in v0.8-era V1 and tokens from ~0.9: name_raw keeps the old name so the
# unit change stays visible. `vllm:gpu_prefix_cache_hit_rate` (a V0 gauge) has no successor and is not renamed.
METRIC_RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds": "sglang:inter_token_latency_seconds",
}

# Types of well-known engine metrics whose exposed name has no telling suffix, for sources without TYPE lines
# (the Prometheus HTTP API). reference/engines.md §1a, §4a, §5a; process_* from client libraries.
KNOWN_TYPES: dict[str, str] = {
    **dict.fromkeys(
        [
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
            "vllm:num_requests_swapped", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
            "vllm:cpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate",
            "vllm:engine_sleep_state", "vllm:cache_config_info", "vllm:lora_requests_info",
            "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs", "sglang:num_used_tokens",
            "sglang:token_usage", "sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:num_retracted_reqs",
            "sglang:num_paused_reqs", "sglang:utilization",
            "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing",
            "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode", "llamacpp:kv_cache_usage_ratio",
            "llamacpp:kv_cache_tokens",
            "tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens",
            "process_start_time_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
            "process_open_fds", "process_max_fds",
        ],
        "gauge",
    ),
    # counters exposed without `_total`
    "llamacpp:n_tokens_max": "counter",
    "tgi_request_count": "counter", "tgi_request_success": "counter", "tgi_request_failure": "counter",
}

# Declared TYPE -> the type stored in metric_samples (servlens.store.schema.METRIC_TYPES).
_STORED_TYPE = {
    "counter": "counter",
    "gauge": "gauge",
    "histogram": "histogram",
    "summary": "summary",
    "untyped": "untyped",
    "unknown": "untyped",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "gauge",  # a gauge histogram is not cumulative over time, so never read as a counter
}

# Sample-name suffixes each declared type allows, besides the bare family name.
_ALLOWED_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}
_ALL_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gsum", "_gcount", "_info")
_SERIES_OF_SUFFIX = {"_bucket": "bucket", "_sum": "sum", "_gsum": "sum", "_count": "count", "_gcount": "count"}

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INT_MS = re.compile(r"[+-]?\d+")
_KNOWN_TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram")
_OPENMETRICS_ONLY_TYPES = ("unknown", "info", "stateset", "gaugehistogram")


@dataclass
class RawSample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None  # Unix seconds, already converted from ms for text 0.0.4
    line: int


@dataclass
class Family:
    name: str
    type: str | None = None  # as declared; None = no TYPE line (untyped)
    help: str | None = None
    unit: str | None = None
    samples: list[tuple[str, RawSample]] = field(default_factory=list)  # (suffix, sample)

    @property
    def declared_type(self) -> str:
        return self.type or "untyped"


@dataclass
class LineError:
    line: int | None  # 1-based; None where the input has no lines (Prometheus API JSON)
    byte_length: int | None
    reason: str
    text: str


@dataclass
class MetricRows:
    """Normalised samples in columns, ready for one bulk insert."""

    name: list[str] = field(default_factory=list)
    name_raw: list[str] = field(default_factory=list)
    type: list[str] = field(default_factory=list)
    series: list[str] = field(default_factory=list)
    le: list[float | None] = field(default_factory=list)
    label_keys: list[list[str]] = field(default_factory=list)
    label_values: list[list[str]] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    timestamp: list[float | None] = field(default_factory=list)
    line: list[int | None] = field(default_factory=list)

    def append(self, name, name_raw, mtype, series, le, labels, value, timestamp, line) -> None:
        keys = sorted(labels)  # sorted keys: the same label set gives the same MAP whatever order it was exposed in
        self.name.append(name)
        self.name_raw.append(name_raw)
        self.type.append(mtype)
        self.series.append(series)
        self.le.append(le)
        self.label_keys.append(keys)
        self.label_values.append([labels[k] for k in keys])
        self.value.append(value)
        self.timestamp.append(timestamp)
        self.line.append(line)

    def __len__(self) -> int:
        return len(self.name)


@dataclass
class Exposition:
    format: str
    families: dict[str, Family]
    errors: list[LineError]
    rows: MetricRows = field(default_factory=MetricRows)
    created_dropped: int = 0  # `_created` samples dropped
    deprecated_dropped: int = 0  # samples of a deprecated name dropped because the current name is also exposed


class _LineProblem(ValueError):
    pass


def detect_format(text: str) -> str:
    """OpenMetrics if the exposition ends with `# EOF` or uses OpenMetrics-only syntax, else Prometheus text 0.0.4."""
    tail = text.rstrip()
    if tail.endswith("\n# EOF") or tail == "# EOF":
        return OPENMETRICS_FORMAT
    for line in text.splitlines()[:2000]:
        if line.startswith("# UNIT "):
            return OPENMETRICS_FORMAT
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4 and parts[3] in _OPENMETRICS_ONLY_TYPES:
                return OPENMETRICS_FORMAT
    return TEXT_FORMAT


def parse_exposition(text: str, fmt: str | None = None) -> Exposition:
    """Parse one scrape; malformed lines become LineErrors, the rest becomes normalised rows (`Exposition.rows`)."""
    fmt = fmt or detect_format(text)
    families: dict[str, Family] = _Families()
    errors: list[LineError] = []
    seen_eof = False
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.rstrip("\r")
        stripped = line.strip()
        if seen_eof:
            if stripped:
                errors.append(_error(number, raw_line, "content after '# EOF'"))
            continue
        if not stripped:
            continue
        try:
            if stripped.startswith("#"):
                if stripped == "# EOF":
                    seen_eof = True
                else:
                    _parse_comment(stripped, families, fmt)
            else:
                sample = _parse_sample(stripped, number, fmt)
                family, suffix = _family_for(sample.name, families)
                family.samples.append((suffix, sample))
        except _LineProblem as problem:
            errors.append(_error(number, raw_line, str(problem)))
    if fmt == OPENMETRICS_FORMAT and not seen_eof:
        errors.append(LineError(len(lines) + 1, 0, "no '# EOF' at the end: the OpenMetrics scrape may be truncated", ""))
    exposition = Exposition(fmt, families, errors)
    _normalise(exposition, lines)
    return exposition


def normalise_name(base: str) -> str:
    """The current name of a suffix-free base name (renamed vLLM/SGLang metrics mapped, others unchanged)."""
    return METRIC_RENAMES.get(base, base)


def created_companions(sample_names: set[str], family_types: dict[str, str]) -> set[str]:
    """The `X_created` names that are creation-time companions: X is a counter/histogram/summary here."""
    companions = set()
    for name in sample_names | set(family_types):
        if not name.endswith("_created"):
            continue
        stem = name[: -len("_created")]
        if (
            family_types.get(stem) in ("counter", "histogram", "summary")
            or family_types.get(f"{stem}_total") == "counter"
            or f"{stem}_total" in sample_names
            or f"{stem}_count" in sample_names
            or f"{stem}_bucket" in sample_names
        ):
            companions.add(name)
    return companions


# ---------------------------------------------------------------------------------------------------------------
# line parsing


def _error(number: int, raw_line: str, reason: str) -> LineError:
    return LineError(number, len(raw_line.encode("utf-8", "replace")), reason, raw_line[:200])


def _parse_comment(line: str, families: dict[str, Family], fmt: str) -> None:
    parts = line[1:].lstrip().split(None, 2)
    if not parts or parts[0] not in ("HELP", "TYPE", "UNIT"):
        return  # any other comment is allowed and ignored
    keyword = parts[0]
    if len(parts) < 2 or not _METRIC_NAME.fullmatch(parts[1]):
        raise _LineProblem(f"# {keyword} line without a valid metric name")
    name = parts[1]
    rest = parts[2] if len(parts) > 2 else ""
    family = families.get(name)
    if keyword == "TYPE":
        mtype = rest.strip().lower()
        if mtype not in _KNOWN_TYPES:
            raise _LineProblem(f"unknown metric type '{rest.strip()}' for {name}")
        if family is not None and family.type is not None:
            raise _LineProblem(f"second # TYPE line for {name}")
        if family is not None and family.samples:
            raise _LineProblem(f"# TYPE for {name} comes after its samples")
        family = families.setdefault(name, Family(name))
        family.type = mtype
        if ":" in name and isinstance(families, _Families):
            families.aliases.setdefault(_NOT_LEGACY_LABEL_CHAR.sub("_", name), family)
    elif keyword == "HELP":
        family = families.setdefault(name, Family(name))
        if family.help is not None:
            raise _LineProblem(f"second # HELP line for {name}")
        family.help = _unescape(rest, quote=fmt == OPENMETRICS_FORMAT)
    else:
        families.setdefault(name, Family(name)).unit = rest.strip()


def _family_for(sample_name: str, families: dict[str, Family]) -> tuple[Family, str]:
    family = families.get(sample_name)
    if family is not None and family.declared_type not in ("histogram", "gaugehistogram", "info"):
        return family, ""
    for suffix in _ALL_SUFFIXES:
        if sample_name.endswith(suffix):
            stem = sample_name[: -len(suffix)]
            base = families.get(stem) or _escaped_family(stem, families)
            if base is not None and suffix in _ALLOWED_SUFFIXES.get(base.declared_type, ()):
                return base, suffix
    if family is not None:
        return family, ""
    family = _escaped_family(sample_name, families)
    if family is not None:
        return family, ""
    family = Family(sample_name)
    families[sample_name] = family
    return family, ""


_NOT_LEGACY_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def _escaped_family(sample_name: str, families: dict[str, Family]) -> Family | None:
    """The declared family whose name, escaped to underscores, is `sample_name`.

    prometheus_client's OpenMetrics output (0.22+, default 'underscores' escaping) keeps `vllm:prompt_tokens` in
    HELP/TYPE but writes the samples as `vllm_prompt_tokens_total`; the TYPE line tells us which family they are.
    """
    aliases = getattr(families, "aliases", None)
    return aliases.get(sample_name) if aliases else None


class _Families(dict):
    """Families by name, plus their underscore-escaped names for those whose names hold ':'."""

    def __init__(self) -> None:
        super().__init__()
        self.aliases: dict[str, Family] = {}


# Fast path for the common sample line (plain label values, no escapes, no quoted names); anything else, including
# every malformed line, goes through the careful parser below, which names the problem.
_FAST_SAMPLE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\]*"[ \t]*,)*'
    r'(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\]*"[ \t]*)?)\})?[ \t]+([^ \t#]+)(?:[ \t]+([^ \t#]+))?'
)
_FAST_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*)"')


def _parse_sample(line: str, number: int, fmt: str) -> RawSample:
    fast = _FAST_SAMPLE.fullmatch(line)
    if fast:
        name, label_text, value_token, ts_token = fast.groups()
        labels = dict(_FAST_LABEL.findall(label_text)) if label_text else {}
        if not label_text or len(labels) == label_text.count("="):
            value = _parse_float(value_token, f"value of {name}")
            timestamp = _parse_timestamp(ts_token, fmt, name) if ts_token is not None else None
            return RawSample(name, labels, value, timestamp, number)
    match = _METRIC_NAME.match(line)
    name = match.group() if match else None
    pos = match.end() if match else 0
    labels: dict[str, str] = {}
    brace = pos
    while brace < len(line) and line[brace] in " \t":
        brace += 1
    if brace < len(line) and line[brace] == "{":
        name, pos = _parse_labels(line, brace + 1, name, labels)
    elif match is None:
        raise _LineProblem("a sample line must start with a metric name")
    elif pos < len(line) and line[pos] not in " \t":
        raise _LineProblem(f"invalid character {line[pos]!r} in metric name")
    if not name:
        raise _LineProblem("sample without a metric name")
    rest = line[pos:]
    if fmt == OPENMETRICS_FORMAT and " # " in rest:
        rest = rest.split(" # ", 1)[0]  # exemplar: not a sample value
    tokens = rest.split()
    if not tokens:
        raise _LineProblem(f"sample {name} has no value")
    if len(tokens) > 2:
        raise _LineProblem(f"sample {name} has {len(tokens)} fields after the labels (value and optional timestamp expected)")
    value = _parse_float(tokens[0], f"value of {name}")
    timestamp = None
    if len(tokens) == 2:
        timestamp = _parse_timestamp(tokens[1], fmt, name)
    return RawSample(name, labels, value, timestamp, number)


def _parse_labels(line: str, pos: int, name: str | None, labels: dict[str, str]) -> tuple[str | None, int]:
    """Parse `label="value", ...}` from pos; a quoted string with no `=` is a UTF-8 metric name. Returns (name, end)."""
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n:
            raise _LineProblem("label set not closed with '}'")
        if line[pos] == "}":
            return name, pos + 1
        quoted = line[pos] == '"'
        if quoted:
            label, pos = _parse_quoted(line, pos + 1)
        else:
            match = _LABEL_NAME.match(line, pos)
            if not match:
                raise _LineProblem(f"invalid label name at column {pos + 1}")
            label, pos = match.group(), match.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if quoted and name is None and pos < n and line[pos] in ",}":
            name = label  # {"my.dotted.metric", ...}: a quoted metric name
        else:
            if pos >= n or line[pos] != "=":
                raise _LineProblem(f"label {label} has no '='")
            pos += 1
            while pos < n and line[pos] in " \t":
                pos += 1
            if pos >= n or line[pos] != '"':
                raise _LineProblem(f"value of label {label} is not quoted")
            value, pos = _parse_quoted(line, pos + 1)
            if label in labels:
                raise _LineProblem(f"label {label} appears twice")
            labels[label] = value
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos < n and line[pos] == "}":
            continue
        else:
            raise _LineProblem("expected ',' or '}' after a label")


def _parse_quoted(line: str, pos: int) -> tuple[str, int]:
    out = []
    n = len(line)
    while pos < n:
        ch = line[pos]
        if ch == "\\" and pos + 1 < n:
            nxt = line[pos + 1]
            out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))  # unknown escapes kept verbatim
            pos += 2
        elif ch == '"':
            return "".join(out), pos + 1
        else:
            out.append(ch)
            pos += 1
    raise _LineProblem("unterminated quoted string")


def _unescape(text: str, quote: bool) -> str:
    if "\\" not in text:
        return text
    mapping = {"n": "\n", "\\": "\\"}
    if quote:
        mapping['"'] = '"'
    return re.sub(r"\\(.)", lambda m: mapping.get(m.group(1), m.group(0)), text)


def _parse_float(token: str, what: str) -> float:
    # Go's ParseFloat as Prometheus uses it: NaN, +Inf, -Inf, decimal and exponent forms; no '_' digit separators.
    if "_" in token or "x" in token.lower():
        raise _LineProblem(f"{what} is not a number: {token!r}")
    try:
        return float(token)
    except ValueError:
        raise _LineProblem(f"{what} is not a number: {token!r}") from None


def _parse_timestamp(token: str, fmt: str, name: str) -> float:
    if fmt == OPENMETRICS_FORMAT:
        seconds = _parse_float(token, f"timestamp of {name}")
        if not math.isfinite(seconds):
            raise _LineProblem(f"timestamp of {name} is not finite: {token!r}")
        return seconds
    if not _INT_MS.fullmatch(token):
        raise _LineProblem(f"timestamp of {name} must be integer milliseconds in text format 0.0.4, got {token!r}")
    return int(token) / 1000.0


# ---------------------------------------------------------------------------------------------------------------
# normalisation


def _normalise(exposition: Exposition, lines: list[str]) -> None:
    families = exposition.families
    sample_names = {s.name for f in families.values() for _, s in f.samples}
    family_types = {f.name: f.declared_type for f in families.values()}
    created = created_companions(sample_names, family_types)
    # Current base names exposed natively, so a deprecated alias exposed beside its successor can be dropped.
    native_bases = set()
    planned = []
    for family in families.values():
        for suffix, sample in family.samples:
            if suffix == "_created" or sample.name in created:
                exposition.created_dropped += 1
                continue
            base = _base_name(family, suffix)
            planned.append((family, suffix, sample, base))
            if base not in METRIC_RENAMES:
                native_bases.add(base)
    rows = exposition.rows
    seen: dict[tuple, int] = {}
    for family, suffix, sample, base in planned:
        name = normalise_name(base)
        if name != base and name in native_bases:
            exposition.deprecated_dropped += 1
            continue
        mtype = _STORED_TYPE[family.declared_type]
        labels = dict(sample.labels)
        series = _SERIES_OF_SUFFIX.get(suffix, "value")
        le = None
        try:
            if series == "bucket":
                if "le" not in labels:
                    raise _LineProblem(f"histogram bucket {sample.name} has no 'le' label")
                le = _parse_float(labels.pop("le"), f"le of {sample.name}")
            elif family.declared_type == "summary" and suffix == "" and "quantile" in labels:
                series = "quantile"
                le = _parse_float(labels.pop("quantile"), f"quantile of {sample.name}")
        except _LineProblem as problem:
            exposition.errors.append(_error(sample.line, lines[sample.line - 1], str(problem)))
            continue
        identity = (sample.name, frozenset(sample.labels.items()), sample.timestamp)
        first_line = seen.setdefault(identity, sample.line)
        if first_line != sample.line:
            # Prometheus rejects a scrape with a repeated series; we keep the first and report the repeat
            exposition.errors.append(_error(sample.line, lines[sample.line - 1], f"repeats the sample at line {first_line}"))
            continue
        rows.append(name, sample.name, mtype, series, le, labels, sample.value, sample.timestamp, sample.line)
    exposition.errors.sort(key=lambda e: e.line)


def _base_name(family: Family, suffix: str) -> str:
    ftype = family.declared_type
    if ftype == "counter":
        name = family.name
        return name[: -len("_total")] if name.endswith("_total") else name
    if ftype in ("histogram", "summary", "gaugehistogram"):
        return family.name
    return family.name + suffix  # gauge, untyped, stateset: the family's name; info: `foo` + `_info`
