"""The release-gate policy: which metric × statistic is a gate, its tolerance, and the family confidence.

A policy is TOML (the built-in one is default_policy.toml beside this file). Unknown keys and bad values are
rejected with the file, the key and what is allowed, so a typo never silently weakens a gate.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from servlens.errors import ConfigError

# metric -> (canonical column or rate definition, kind, human name, unit)
LATENCY_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_s", "TTFT"),
    "tpot": ("tpot_s", "TPOT"),
    "e2e": ("e2e_s", "e2e latency"),
    "queue": ("queue_s", "queue time"),
    "prefill": ("prefill_s", "prefill time"),
    "decode": ("decode_s", "decode time"),
    "first_content": ("first_content_s", "time to first content token"),
}
RATE_METRICS: dict[str, str] = {
    "error_rate": "error rate",
    "length_rate": "length-finish rate",
    "timeout_rate": "timeout rate",
    "leakage_rate": "reasoning-leakage rate",
}
LATENCY_STATISTICS = ("p50", "p90", "p95", "p99")
DIRECTIONS = ("increase", "decrease", "either")  # the direction in which a change is bad
BAND_KEYS = ("model", "served_model", "deployment", "provider", "prompt_band", "output_band")

# Bands when neither the policy nor --by says otherwise (DESIGN.md Decisions): fixed log2 bands of prompt tokens,
# and of output tokens for latencies that grow with the output (e2e, decode); rates band by model and prompt only,
# since failed requests have no output.
DEFAULT_BY = ("model", "prompt_band")
OUTPUT_BANDED_METRICS = ("e2e", "decode")
# The covariates of the adjusted headline: log prompt tokens, and log output tokens for latencies that grow with it.
COVARIATES = {"e2e": ("prompt_tokens", "completion_tokens"), "decode": ("prompt_tokens", "completion_tokens")}
DEFAULT_COVARIATES = ("prompt_tokens",)

_COMPARE_KEYS = {
    "confidence": "a number between 0.5 and 0.999",
    "min_coverage": "a share between 0 and 1",
    "min_cohort_requests": "an integer ≥ 2",
    "min_change_ms": "a non-negative number of milliseconds",
    "mix_shift_min_tvd": "a share between 0 and 1",
    "by": f"a list of {', '.join(BAND_KEYS)}",
}
_GATE_KEYS = ("metric", "statistic", "direction", "tolerance_pct", "tolerance_pp", "critical", "advisory",
              "if_present", "min_change_ms", "min_requests", "per_cohort")


@dataclass(frozen=True)
class Gate:
    """One gate: a metric × statistic judged against a tolerance in its bad direction."""

    metric: str
    statistic: str
    tolerance: float          # latencies: relative change (0.10 = +10 %); rates: absolute share (0.005 = 0.5 pp)
    direction: str = "increase"
    critical: bool = False    # must be decided (shown within tolerance) for the release to pass
    min_requests: int = 0     # per side, in compared cohorts; 0 = whatever the statistic can be judged at
    per_cohort: bool = False
    advisory: bool = False    # reported, never fails the release
    if_present: bool = False  # skipped (with a note) unless both runs measure the metric
    min_change: float | None = None   # latencies: seconds the quantile must move to fail; None = the policy's

    @property
    def is_rate(self) -> bool:
        return self.metric in RATE_METRICS

    @property
    def name(self) -> str:
        if self.is_rate:
            return RATE_METRICS[self.metric]
        return f"{LATENCY_METRICS[self.metric][1]} {self.statistic}"

    @property
    def quantile(self) -> float | None:
        return None if self.is_rate else int(self.statistic[1:]) / 100

    def required_requests(self) -> int:
        """Requests per side below which the gate is not judged: the policy's min_requests, else 1.

        Thin tails are handled by judging a lower quantile (stats.supported_quantile), and rates by exact intervals,
        so no statistic has a floor of its own.
        """
        return max(1, self.min_requests)

    def tolerance_text(self) -> str:
        sign = {"increase": "+", "decrease": "−", "either": "±"}[self.direction]
        if self.is_rate:
            return f"{sign}{_num(self.tolerance * 100)} pp"
        return f"{sign}{_num(self.tolerance * 100)}%"


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Policy:
    gates: tuple[Gate, ...]
    confidence: float = 0.95
    min_coverage: float = 0.5
    min_cohort_requests: int = 30
    min_change_ms: float = 5.0
    mix_shift_min_tvd: float = 0.05
    by: tuple[str, ...] | None = None     # None: per-metric defaults (DEFAULT_BY, + output_band for e2e/decode)
    source: str = "built-in default policy"
    notes: tuple[str, ...] = field(default=())

    def bands_for(self, gate: Gate) -> tuple[str, ...]:
        """The cohort keys for a gate: --by/policy `by` if given, else the defaults; rates never by output band."""
        if self.by is not None:
            keys = self.by
        else:
            keys = DEFAULT_BY + (("output_band",) if gate.metric in OUTPUT_BANDED_METRICS else ())
        if gate.is_rate:
            keys = tuple(k for k in keys if k != "output_band")
        return keys

    def with_by(self, by: tuple[str, ...] | None) -> Policy:
        return self if by is None else replace(self, by=by)


def parse_by(text: str, where: str = "--by") -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    return _check_by(list(keys), where)


def _check_by(keys, where: str) -> tuple[str, ...]:
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(f"{where} must be a list of band names", f"Allowed: {', '.join(BAND_KEYS)}")
    for key in keys:
        if key not in BAND_KEYS:
            raise ConfigError(f"{where}: unknown band '{key}'", f"Allowed: {', '.join(BAND_KEYS)}")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{where} names a band twice", "Name each band once")
    return tuple(keys)


def default_policy_text() -> str:
    return resources.files("servlens.compare").joinpath("default_policy.toml").read_text(encoding="utf-8")


def load_policy(path: str | Path | None = None) -> Policy:
    """The built-in policy, or the TOML file at `path` (its [compare] keys default to the built-in ones)."""
    if path is None:
        return parse_policy(tomllib.loads(default_policy_text()), "built-in default policy")
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"No policy file at {path}", "Check the --policy path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", "Fix the syntax (see docs/compare.md)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read the policy file {path}: {exc}", "Check the file") from None
    return parse_policy(data, str(path))


def parse_policy(data: dict, where: str) -> Policy:
    unknown = sorted(set(data) - {"compare", "gate"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key '{unknown[0]}'", "Allowed: [compare] and [[gate]]")
    settings = data.get("compare", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: [compare] must be a table", "Write it as a [compare] section")
    for key in settings:
        if key not in _COMPARE_KEYS:
            raise ConfigError(f"{where}: unknown key 'compare.{key}'", f"Allowed: {', '.join(_COMPARE_KEYS)}")
    kwargs: dict = {}
    checks = {
        "confidence": lambda v: _is_number(v) and 0.5 <= v <= 0.999,
        "min_coverage": lambda v: _is_number(v) and 0 <= v <= 1,
        "min_cohort_requests": lambda v: _is_int(v) and v >= 2,
        "min_change_ms": lambda v: _is_number(v) and v >= 0,
        "mix_shift_min_tvd": lambda v: _is_number(v) and 0 <= v <= 1,
    }
    for key, ok in checks.items():
        if key in settings:
            if not ok(settings[key]):
                raise ConfigError(f"{where}: compare.{key} = {settings[key]!r} is not allowed",
                                  f"Use {_COMPARE_KEYS[key]}")
            kwargs[key] = settings[key]
    if "by" in settings:
        kwargs["by"] = _check_by(settings["by"], f"{where}: compare.by")

    raw_gates = data.get("gate")
    if raw_gates is None:
        raise ConfigError(f"{where} defines no gate", "Add at least one [[gate]] table (see docs/compare.md)")
    if not isinstance(raw_gates, list) or not raw_gates:
        raise ConfigError(f"{where}: 'gate' must be an array of tables", "Write each gate as [[gate]]")
    gates = tuple(_parse_gate(raw, i + 1, where) for i, raw in enumerate(raw_gates))
    seen = set()
    for gate in gates:
        if (gate.metric, gate.statistic) in seen:
            raise ConfigError(f"{where}: the gate {gate.metric} {gate.statistic} is defined twice",
                              "Keep one [[gate]] per metric and statistic")
        seen.add((gate.metric, gate.statistic))
    return Policy(gates=gates, source=where, **kwargs)


def _parse_gate(raw: dict, number: int, where: str) -> Gate:
    label = f"{where}: gate {number}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{label} is not a table", "Write each gate as [[gate]]")
    for key in raw:
        if key not in _GATE_KEYS:
            raise ConfigError(f"{label}: unknown key '{key}'", f"Allowed: {', '.join(_GATE_KEYS)}")
    metric = raw.get("metric")
    allowed_metrics = list(LATENCY_METRICS) + list(RATE_METRICS)
    if metric not in allowed_metrics:
        raise ConfigError(f"{label}: metric = {metric!r} is not known", f"Allowed: {', '.join(allowed_metrics)}")
    is_rate = metric in RATE_METRICS
    statistic = raw.get("statistic", "rate" if is_rate else None)
    allowed_stats = ("rate",) if is_rate else LATENCY_STATISTICS
    if statistic not in allowed_stats:
        raise ConfigError(f"{label}: statistic = {statistic!r} is not allowed for {metric}",
                          f"Allowed: {', '.join(allowed_stats)}")
    direction = raw.get("direction", "increase")
    if direction not in DIRECTIONS:
        raise ConfigError(f"{label}: direction = {direction!r} is not allowed", f"Allowed: {', '.join(DIRECTIONS)}")
    right, wrong = ("tolerance_pp", "tolerance_pct") if is_rate else ("tolerance_pct", "tolerance_pp")
    if wrong in raw:
        raise ConfigError(f"{label}: {metric} takes {right}, not {wrong}",
                          "Latency gates take tolerance_pct (percent change); rate gates tolerance_pp (points)")
    if right not in raw:
        raise ConfigError(f"{label}: {right} is missing", f"Give the largest acceptable change, e.g. {right} = 10")
    value = raw[right]
    if not _is_number(value) or value < 0 or (not is_rate and value >= 1000) or (is_rate and value > 100):
        raise ConfigError(f"{label}: {right} = {value!r} is not allowed",
                          "Use a non-negative number (percent for tolerance_pct, points for tolerance_pp)")
    critical = raw.get("critical", False)
    per_cohort = raw.get("per_cohort", False)
    advisory = raw.get("advisory", False)
    if_present = raw.get("if_present", False)
    for key, flag in (("critical", critical), ("per_cohort", per_cohort), ("advisory", advisory),
                      ("if_present", if_present)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{label}: {key} = {flag!r} is not allowed", "Use true or false")
    min_requests = raw.get("min_requests", 0)
    if not _is_int(min_requests) or min_requests < 0:
        raise ConfigError(f"{label}: min_requests = {min_requests!r} is not allowed", "Use a non-negative integer")
    if critical and advisory:
        raise ConfigError(f"{label}: a gate cannot be both critical and advisory",
                          "critical gates must be decided for a pass; advisory gates never fail")
    min_change = raw.get("min_change_ms")
    if min_change is not None:
        if is_rate:
            raise ConfigError(f"{label}: min_change_ms is for latency gates", "Remove it from the rate gate")
        if not _is_number(min_change) or min_change < 0:
            raise ConfigError(f"{label}: min_change_ms = {min_change!r} is not allowed",
                              "Use a non-negative number of milliseconds")
        min_change = float(min_change) / 1000
    return Gate(metric=metric, statistic=statistic, tolerance=float(value) / 100, direction=direction,
                critical=critical, min_requests=min_requests, per_cohort=per_cohort, advisory=advisory,
                if_present=if_present, min_change=min_change)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
