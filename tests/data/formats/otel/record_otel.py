"""Record OTLP/JSON spans from a real GenAI instrumentation calling a real engine on 127.0.0.1.

Not part of the test suite: how `otel-openllmetry-recorded.jsonl` and `otel-openlit-recorded.jsonl` were made (see
ATTRIBUTION.md). Run it with a virtualenv that has `openai`, `opentelemetry-sdk`,
`opentelemetry-exporter-otlp-proto-common` and the instrumentation (`opentelemetry-instrumentation-openai` for
OpenLLMetry, `openlit` 1.45 for OpenLIT, which needs opentelemetry-sdk < 1.40), against a llama-server started by tools/engine:

    python record_otel.py openllmetry http://127.0.0.1:18431/v1 out.jsonl

The spans are encoded by OpenTelemetry's own OTLP encoder (the ExportTraceServiceRequest the OTLP exporters send)
and written in the OTLP/JSON mapping the collector's file exporter uses: one request per line, trace and span ids as
hex, 64-bit integers as strings, enums as integers.
"""

from __future__ import annotations

import base64
import json
import sys

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def _hex_ids(node):
    """OTLP/JSON writes traceId/spanId/parentSpanId as hex, where protobuf's JSON mapping writes base64."""
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and v else _hex_ids(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


class OtlpJsonLinesExporter(SpanExporter):
    def __init__(self, path: str):
        self.out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the exporter's life, closed in shutdown()

    def export(self, spans):
        request = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        self.out.write(json.dumps(_hex_ids(request), separators=(",", ":")) + "\n")
        self.out.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.out.close()


def drive(base_url: str) -> None:
    """The calls: plain, streamed with usage, a repeated prompt (prefix-cache hit), cut by max_tokens, an error."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="not-needed", max_retries=0)
    system = {"role": "system", "content": "You answer briefly about the weather in the city the user names. " * 8}
    ask = [system, {"role": "user", "content": "What is the weather in Paris today?"}]
    client.chat.completions.create(model="tiny", messages=ask, max_tokens=24, temperature=0.8)
    stream = client.chat.completions.create(model="tiny", messages=ask, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    for _ in stream:
        pass
    client.chat.completions.create(model="tiny", messages=ask, max_tokens=4)
    try:  # more prompt than the slot's context: the engine answers 400
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather " * 3000}],
                                       max_tokens=8)
    except Exception as exc:  # noqa: BLE001 - the error is what the span must record
        print("expected error:", type(exc).__name__, file=sys.stderr)


def main() -> None:
    flavour, base_url, out_path = sys.argv[1:4]
    provider = TracerProvider(resource=Resource.create({"service.name": f"servlens-record-{flavour}"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonLinesExporter(out_path)))
    trace.set_tracer_provider(provider)
    if flavour == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif flavour == "openlit":
        import openlit

        # openlit reuses the SDK TracerProvider set above (openlit/otel/tracing.py, setup_tracing)
        openlit.init(application_name="servlens-record-openlit", disable_metrics=True, disable_batch=True,
                     capture_message_content=True)
    else:
        raise SystemExit(f"unknown flavour {flavour}")
    drive(base_url)
    provider.shutdown()


if __name__ == "__main__":
    main()
