"""The Prometheus text 0.0.4 / OpenMetrics parser on hand-written expositions that carry each trap of the formats."""

from __future__ import annotations

import math

from servlens.ingest.prometheus import OPENMETRICS_FORMAT, TEXT_FORMAT, detect_format, parse_exposition


def rows_of(exposition):
    r = exposition.rows
    return [
        dict(name=n, name_raw=nr, type=t, series=s, le=le, labels=dict(zip(k, v)), value=val, ts=ts, line=line)
        for n, nr, t, s, le, k, v, val, ts, line in zip(
            r.name, r.name_raw, r.type, r.series, r.le, r.label_keys, r.label_values, r.value, r.timestamp, r.line
        )
    ]


def test_text_counter_total_stripped_and_created_family_dropped():
    # prometheus_client's 0.0.4 output: TYPE names the _total series, _created is a separate gauge family.
    text = (
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 6391.0\n'
        "# HELP vllm:prompt_tokens_created Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_created gauge\n"
        'vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.7959373814673598e+09\n'
    )
    expo = parse_exposition(text)
    assert expo.format == TEXT_FORMAT
    assert expo.errors == []
    assert expo.created_dropped == 1
    assert rows_of(expo) == [
        dict(name="vllm:prompt_tokens", name_raw="vllm:prompt_tokens_total", type="counter", series="value", le=None,
             labels={"engine": "0", "model_name": "tiny"}, value=6391.0, ts=None, line=3)
    ]


def test_histogram_named_total_keeps_total_and_buckets_keep_le():
    text = (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_sum{model_name="m"} 1103.0\n'
        'vllm:iteration_tokens_total_bucket{le="1.0",model_name="m"} 994.0\n'
        'vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 998.0\n'
        'vllm:iteration_tokens_total_count{model_name="m"} 998.0\n'
        "# TYPE vllm:iteration_tokens_total_created gauge\n"
        'vllm:iteration_tokens_total_created{model_name="m"} 1.7e9\n'
    )
    expo = parse_exposition(text)
    rows = rows_of(expo)
    assert [(r["name"], r["series"], r["le"], r["value"]) for r in rows] == [
        ("vllm:iteration_tokens_total", "sum", None, 1103.0),
        ("vllm:iteration_tokens_total", "bucket", 1.0, 994.0),
        ("vllm:iteration_tokens_total", "bucket", math.inf, 998.0),
        ("vllm:iteration_tokens_total", "count", None, 998.0),
    ]
    assert all(r["type"] == "histogram" and r["labels"] == {"model_name": "m"} for r in rows)
    assert expo.created_dropped == 1


def test_openmetrics_family_names_seconds_timestamps_exemplars_and_eof():
    text = (
        "# TYPE req counter\n"
        "# UNIT req_seconds seconds\n"
        'req_total{path="/a"} 5 1795937383.25\n'
        'req_created{path="/a"} 1795937000.0\n'
        "# TYPE lat_seconds histogram\n"
        'lat_seconds_bucket{le="0.5"} 3 # {trace_id="KOO5S4vxi0o"} 0.67 1795937383.0\n'
        'lat_seconds_bucket{le="+Inf"} 4\n'
        "lat_seconds_count 4\n"
        "lat_seconds_sum 2.5\n"
        "lat_seconds_created 1795937000.0\n"
        "# TYPE build info\n"
        'build_info{version="1.2"} 1\n'
        "# EOF\n"
    )
    assert detect_format(text) == OPENMETRICS_FORMAT
    expo = parse_exposition(text)
    assert expo.errors == []
    assert expo.created_dropped == 2
    rows = rows_of(expo)
    assert [(r["name"], r["name_raw"], r["type"], r["series"], r["le"], r["value"], r["ts"]) for r in rows] == [
        ("req", "req_total", "counter", "value", None, 5.0, 1795937383.25),
        ("lat_seconds", "lat_seconds_bucket", "histogram", "bucket", 0.5, 3.0, None),
        ("lat_seconds", "lat_seconds_bucket", "histogram", "bucket", math.inf, 4.0, None),
        ("lat_seconds", "lat_seconds_count", "histogram", "count", None, 4.0, None),
        ("lat_seconds", "lat_seconds_sum", "histogram", "sum", None, 2.5, None),
        ("build_info", "build_info", "gauge", "value", None, 1.0, None),
    ]


def test_text_timestamps_are_milliseconds_and_may_be_negative():
    expo = parse_exposition("a 1 1795937383186\nb 2 -1500\n")
    assert [r["ts"] for r in rows_of(expo)] == [1795937383.186, -1.5]
    # A fractional timestamp is not valid 0.0.4: the line is reported, the rest is kept.
    expo = parse_exposition("a 1 1795937383.5\nb 2\n")
    assert [(e.line, e.reason) for e in expo.errors] == [
        (1, "timestamp of a must be integer milliseconds in text format 0.0.4, got '1795937383.5'")
    ]
    assert [r["name"] for r in rows_of(expo)] == ["b"]


def test_label_escapes_special_values_and_utf8_names():
    text = (
        'm{path="C:\\\\dir\\\\x",msg="say \\"hi\\"\\nbye",odd="a\\tb",} NaN\n'
        "m2 +Inf\n"
        "m3 -Inf\n"
        '{"my.dotted.metric", "error.message"="Not Found"} 7\n'
    )
    expo = parse_exposition(text)
    assert expo.errors == []
    rows = rows_of(expo)
    assert rows[0]["labels"] == {"path": "C:\\dir\\x", "msg": 'say "hi"\nbye', "odd": "a\\tb"}
    assert math.isnan(rows[0]["value"])
    assert rows[1]["value"] == math.inf and rows[2]["value"] == -math.inf
    assert (rows[3]["name"], rows[3]["labels"], rows[3]["value"]) == ("my.dotted.metric", {"error.message": "Not Found"}, 7.0)
    assert all(r["type"] == "untyped" for r in rows)


def test_untyped_and_label_less_llamacpp_metrics_keep_their_names():
    text = (
        "# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)\n"
        "# TYPE llamacpp:n_tokens_max counter\n"
        "llamacpp:n_tokens_max 838\n"
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 6197\n"
        "some_untyped_total 3\n"
    )
    rows = rows_of(parse_exposition(text))
    assert [(r["name"], r["type"], r["labels"], r["value"]) for r in rows] == [
        ("llamacpp:n_tokens_max", "counter", {}, 838.0),
        ("llamacpp:prompt_tokens", "counter", {}, 6197.0),
        ("some_untyped_total", "untyped", {}, 3.0),  # no TYPE: we cannot know it is a counter
    ]


def test_summary_quantiles_sum_count():
    text = (
        "# TYPE rpc_seconds summary\n"
        'rpc_seconds{quantile="0.5"} 0.05\n'
        'rpc_seconds{quantile="0.99"} 0.3\n'
        "rpc_seconds_sum 17.5\n"
        "rpc_seconds_count 300\n"
    )
    rows = rows_of(parse_exposition(text))
    assert [(r["name"], r["type"], r["series"], r["le"], r["value"]) for r in rows] == [
        ("rpc_seconds", "summary", "quantile", 0.5, 0.05),
        ("rpc_seconds", "summary", "quantile", 0.99, 0.3),
        ("rpc_seconds", "summary", "sum", None, 17.5),
        ("rpc_seconds", "summary", "count", None, 300.0),
    ]


def test_renamed_vllm_metrics_normalised_and_deprecated_duplicates_dropped():
    old_only = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 40\n'
        "# TYPE vllm:gpu_prefix_cache_hits counter\n"
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 10\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_count{model_name="m"} 3\n'
        "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1\n'
        "# TYPE vllm:request_time_per_output_token_seconds histogram\n"
        'vllm:request_time_per_output_token_seconds_count{model_name="m"} 3\n'
        "# EOF\n"
    )
    rows = rows_of(parse_exposition(old_only))
    assert [(r["name"], r["name_raw"]) for r in rows] == [
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total"),
        ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"),
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds_count"),
        ("vllm:gpu_prefix_cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"),  # V0 gauge with no successor
        ("vllm:request_time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds_count"),
    ]
    both = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    )
    expo = parse_exposition(both)
    assert [(r["name"], r["name_raw"]) for r in rows_of(expo)] == [("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")]
    assert expo.deprecated_dropped == 1


def test_malformed_lines_are_reported_with_line_numbers_and_the_rest_is_kept():
    text = (
        "# TYPE good gauge\n"
        "good 1\n"
        "bad-name 2\n"
        'lbl{a="x} 3\n'
        "noval\n"
        "good2 1_000\n"
        'dup{a="1",a="2"} 1\n'
        "# TYPE hist histogram\n"
        'hist_bucket{le="abc"} 1\n'
        "three fields here 1\n"
        "good3 4\n"
        "good 5\n"
    )
    expo = parse_exposition(text)
    assert [(e.line, e.reason) for e in expo.errors] == [
        (3, "invalid character '-' in metric name"),
        (4, "unterminated quoted string"),
        (5, "sample noval has no value"),
        (6, "value of good2 is not a number: '1_000'"),
        (7, "label a appears twice"),
        (9, "le of hist_bucket is not a number: 'abc'"),
        (10, "sample three has 3 fields after the labels (value and optional timestamp expected)"),
        (12, "repeats the sample at line 2"),
    ]
    assert [(e.line, e.byte_length, e.text) for e in expo.errors if e.line in (9, 12)] == [
        (9, 23, 'hist_bucket{le="abc"} 1'), (12, 6, "good 5")
    ]
    assert [(r["name"], r["value"]) for r in rows_of(expo)] == [("good", 1.0), ("good3", 4.0)]


def test_openmetrics_without_eof_is_flagged_as_truncated():
    text = "# TYPE x unknown\nx 1\n"
    expo = parse_exposition(text)
    assert expo.format == OPENMETRICS_FORMAT
    assert [(e.line, e.reason) for e in expo.errors] == [(3, "no '# EOF' at the end: the OpenMetrics scrape may be truncated")]
    assert [(r["name"], r["type"]) for r in rows_of(expo)] == [("x", "untyped")]


def test_crlf_blank_lines_and_help_escapes():
    text = "# HELP a first\\nsecond \\\\ back\r\n\r\n# TYPE a gauge\r\na 2\r\n"
    expo = parse_exposition(text)
    assert expo.errors == []
    assert expo.families["a"].help == "first\nsecond \\ back"
    assert rows_of(expo)[0]["value"] == 2.0
