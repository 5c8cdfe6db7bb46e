"""The parser on what the real exporter writes: prometheus_client (vLLM, SGLang and LiteLLM expose through it).

One registry shaped like vLLM's (colon names, model_name/engine labels, a histogram, a NaN gauge, a summary, an info
and an enum metric, a label value that needs escaping) is rendered by the library in text 0.0.4 and in OpenMetrics;
both must parse to the same normalised samples, with every `_created` series dropped.
"""

from __future__ import annotations

import math

import pytest

from servlens.ingest.prometheus import OPENMETRICS_FORMAT, TEXT_FORMAT, parse_exposition

prometheus_client = pytest.importorskip("prometheus_client")


def registry():
    from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary

    reg = CollectorRegistry()
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ["model_name", "engine"], registry=reg)
    prompt.labels("tiny", "0").inc(6391)
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      ["model_name", "engine", "finished_reason"], registry=reg)
    success.labels("tiny", "0", "length").inc(18)
    success.labels("tiny", "0", "stop").inc(4)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", ["model_name"], buckets=[0.1, 1.0, 5.0], registry=reg)
    for seconds in (0.05, 0.5, 2.0, 7.0):
        ttft.labels('odd "model"\\path\nline').observe(seconds)
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", ["model_name"], registry=reg).labels("tiny").set(float("nan"))
    Summary("http_request_size_bytes", "Content length.", ["handler"], registry=reg).labels("/v1/completions").observe(1500)
    Info("vllm:build", "Build.", registry=reg).info({"version": "0.32.0"})
    Enum("vllm:engine_state", "State.", states=["awake", "asleep"], registry=reg)
    return reg


def normalised(expo):
    r = expo.rows
    out = []
    for name, mtype, series, le, keys, values, value in zip(r.name, r.type, r.series, r.le, r.label_keys, r.label_values, r.value):
        out.append((name, mtype, series, le, tuple(zip(keys, values)), "nan" if math.isnan(value) else value))
    return sorted(out, key=repr)


def test_text_and_openmetrics_from_prometheus_client_parse_the_same():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    reg = registry()
    text = parse_exposition(generate_latest(reg).decode())
    om = parse_exposition(generate_openmetrics(reg).decode())
    assert (text.format, om.format) == (TEXT_FORMAT, OPENMETRICS_FORMAT)
    assert text.errors == [] and om.errors == []
    assert text.created_dropped == om.created_dropped == 5  # 3 counter series, 1 histogram, 1 summary
    assert normalised(text) == normalised(om)

    rows = normalised(text)
    model = ("model_name", 'odd "model"\\path\nline')
    assert ("vllm:prompt_tokens", "counter", "value", None, (("engine", "0"), ("model_name", "tiny")), 6391.0) in rows
    assert [row for row in rows if row[0] == "vllm:time_to_first_token_seconds"] == sorted([
        ("vllm:time_to_first_token_seconds", "histogram", "bucket", 0.1, (model,), 1.0),
        ("vllm:time_to_first_token_seconds", "histogram", "bucket", 1.0, (model,), 2.0),
        ("vllm:time_to_first_token_seconds", "histogram", "bucket", 5.0, (model,), 3.0),
        ("vllm:time_to_first_token_seconds", "histogram", "bucket", math.inf, (model,), 4.0),
        ("vllm:time_to_first_token_seconds", "histogram", "count", None, (model,), 4.0),
        ("vllm:time_to_first_token_seconds", "histogram", "sum", None, (model,), 9.55),
    ], key=repr)
    assert ("vllm:kv_cache_usage_perc", "gauge", "value", None, (("model_name", "tiny"),), "nan") in rows
    assert ("vllm:build_info", "gauge", "value", None, (("version", "0.32.0"),), 1.0) in rows
    assert ("vllm:engine_state", "gauge", "value", None, (("vllm_engine_state", "awake"),), 1.0) in rows
    assert ("http_request_size_bytes", "summary", "count", None, (("handler", "/v1/completions"),), 1.0) in rows


def test_openmetrics_escaped_sample_names_keep_the_declared_name_raw_as_exposed():
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    text = generate_openmetrics(registry()).decode()
    om = parse_exposition(text)
    by_name = {}
    for name, raw in zip(om.rows.name, om.rows.name_raw):
        by_name.setdefault(name, set()).add(raw)
    # whatever the library did to the sample names, the normalised name is the declared family's
    declared_samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm")}
    assert by_name["vllm:prompt_tokens"] == {n for n in declared_samples if "prompt_tokens" in n and not n.endswith("_created")}
