"""The gate policy: built-in defaults, and every bad key or value rejected with file, key and what is allowed."""

from __future__ import annotations

import pytest

from servlens.compare.policy import Gate, load_policy, parse_by
from servlens.errors import ConfigError


def test_default_policy_is_the_design_gates():
    policy = load_policy()
    assert [(g.metric, g.statistic, g.tolerance, g.critical) for g in policy.gates] == [
        ("ttft", "p50", 0.10, False),
        ("ttft", "p99", 0.10, True),
        ("tpot", "p50", 0.05, False),
        ("e2e", "p99", 0.10, False),
        ("error_rate", "rate", 0.005, True),
        ("length_rate", "rate", 0.01, False),
        ("first_content", "p50", 0.10, False),
    ]
    assert [g.metric for g in policy.gates if g.if_present] == ["first_content"]
    assert not any(g.advisory for g in policy.gates)
    assert policy.min_change_ms == 5
    assert policy.confidence == 0.95
    assert policy.source == "built-in default policy"


def test_bands_follow_the_decisions():
    policy = load_policy()
    by_metric = {g.metric: policy.bands_for(g) for g in policy.gates}
    assert by_metric["ttft"] == ("model", "prompt_band")
    assert by_metric["e2e"] == ("model", "prompt_band", "output_band")
    assert by_metric["error_rate"] == ("model", "prompt_band")
    custom = policy.with_by(("model", "prompt_band", "output_band"))
    assert custom.bands_for(Gate("error_rate", "rate", 0.005)) == ("model", "prompt_band")   # rates: no output band
    assert custom.bands_for(Gate("ttft", "p99", 0.1)) == ("model", "prompt_band", "output_band")


def test_no_statistic_has_a_request_floor_of_its_own():
    """Thin tails are judged at a lower quantile and rates by exact intervals; only the policy can set a floor."""
    assert Gate("ttft", "p99", 0.1).required_requests() == 1
    assert Gate("error_rate", "rate", 0.005).required_requests() == 1
    assert Gate("ttft", "p50", 0.1, min_requests=500).required_requests() == 500


def test_advisory_and_min_change(tmp_path):
    path = _write(tmp_path, """
[compare]
min_change_ms = 2.5
[[gate]]
metric = "queue"
statistic = "p90"
tolerance_pct = 20
advisory = true
min_change_ms = 50
""")
    policy = load_policy(path)
    assert policy.min_change_ms == 2.5
    (gate,) = policy.gates
    assert gate.advisory and not gate.critical and gate.min_change == 0.05


def _write(tmp_path, text):
    path = tmp_path / "gates.toml"
    path.write_text(text)
    return path


def test_a_policy_file_overrides_tolerances(tmp_path):
    path = _write(tmp_path, """
[compare]
confidence = 0.98
[[gate]]
metric = "ttft"
statistic = "p90"
tolerance_pct = 20
critical = true
per_cohort = true
[[gate]]
metric = "timeout_rate"
tolerance_pp = 0.25
direction = "either"
""")
    policy = load_policy(path)
    assert policy.confidence == 0.98
    assert policy.gates[0] == Gate("ttft", "p90", 0.20, critical=True, per_cohort=True)
    assert policy.gates[1] == Gate("timeout_rate", "rate", 0.0025, direction="either")
    assert policy.gates[1].tolerance_text() == "±0.25 pp"
    assert policy.gates[0].tolerance_text() == "+20%"


@pytest.mark.parametrize("text, message", [
    ("[compare]\nconfidense = 0.9\n[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\n",
     "gates.toml: unknown key 'compare.confidense'. Allowed: confidence, min_coverage, min_cohort_requests, "
     "min_change_ms, mix_shift_min_tvd, by."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\ncritical=true\nadvisory=true\n",
     "gates.toml: gate 1: a gate cannot be both critical and advisory. critical gates must be decided for a pass; "
     "advisory gates never fail."),
    ("[[gate]]\nmetric='error_rate'\ntolerance_pp=1\nmin_change_ms=5\n",
     "gates.toml: gate 1: min_change_ms is for latency gates. Remove it from the rate gate."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance=10\n",
     "gates.toml: gate 1: unknown key 'tolerance'. Allowed: metric, statistic, direction, tolerance_pct, "
     "tolerance_pp, critical, advisory, if_present, min_change_ms, min_requests, per_cohort."),
    ("[[gate]]\nmetric='ttfb'\nstatistic='p99'\ntolerance_pct=10\n",
     "gates.toml: gate 1: metric = 'ttfb' is not known. Allowed: ttft, tpot, e2e, queue, prefill, decode, "
     "first_content, error_rate, length_rate, timeout_rate, leakage_rate."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p999'\ntolerance_pct=10\n",
     "gates.toml: gate 1: statistic = 'p999' is not allowed for ttft. Allowed: p50, p90, p95, p99."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pp=10\n",
     "gates.toml: gate 1: ttft takes tolerance_pct, not tolerance_pp. Latency gates take tolerance_pct (percent "
     "change); rate gates tolerance_pp (points)."),
    ("[[gate]]\nmetric='error_rate'\n",
     "gates.toml: gate 1: tolerance_pp is missing. Give the largest acceptable change, e.g. tolerance_pp = 10."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\ndirection='up'\n",
     "gates.toml: gate 1: direction = 'up' is not allowed. Allowed: increase, decrease, either."),
    ("[compare]\nconfidence = 1.5\n[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\n",
     "gates.toml: compare.confidence = 1.5 is not allowed. Use a number between 0.5 and 0.999."),
    ("[compare]\nconfidence = 0.9\n", "gates.toml defines no gate. Add at least one [[gate]] table (see docs/compare.md)."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\n[[gate]]\nmetric='ttft'\nstatistic='p99'\n"
     "tolerance_pct=5\n",
     "gates.toml: the gate ttft p99 is defined twice. Keep one [[gate]] per metric and statistic."),
    ("[[gate]]\nmetric='ttft'\nstatistic='p99'\ntolerance_pct=10\ncritical='yes'\n",
     "gates.toml: gate 1: critical = 'yes' is not allowed. Use true or false."),
    ("[gates]\nx=1\n", "gates.toml: unknown top-level key 'gates'. Allowed: [compare] and [[gate]]."),
])
def test_bad_policies_are_rejected_with_key_and_allowed_values(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(err.value) == f"{path.parent}/{message}"
    assert err.value.exit_code == 2


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="No policy file at"):
        load_policy(tmp_path / "nope.toml")
    path = _write(tmp_path, "[[gate]\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_policy(path)


def test_by_option_is_checked():
    assert parse_by("model, prompt_band") == ("model", "prompt_band")
    with pytest.raises(ConfigError) as err:
        parse_by("model,prompt")
    assert str(err.value) == ("--by: unknown band 'prompt'. Allowed: model, served_model, deployment, provider, "
                              "prompt_band, output_band.")
