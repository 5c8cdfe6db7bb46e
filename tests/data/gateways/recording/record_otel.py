"""Throwaway/recorded: LiteLLM's own OpenTelemetry integration over real llama.cpp servers; spans are captured in
memory and written as OTLP/JSON lines the way the OpenTelemetry Collector's file exporter writes them (one
ExportTraceServiceRequest per line: lowerCamelCase keys, hex trace/span ids, 64-bit integers as strings, enums as
integers, default values omitted)."""
import asyncio, base64, json, os, sys
import litellm
from litellm import Router
from litellm.integrations.opentelemetry import OpenTelemetry, OpenTelemetryConfig
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from google.protobuf.json_format import MessageToDict

OUT = open(sys.argv[1], "w")
exporter = InMemorySpanExporter()
otel = OpenTelemetry(config=OpenTelemetryConfig(exporter=exporter, skip_set_global=True, service_name="litellm-gw"))
litellm.callbacks = [otel]
from litellm.caching.caching import Cache
litellm.cache = Cache(type="local")

A = "http://127.0.0.1:18931/v1"; B = "http://127.0.0.1:18932/v1"; DEAD = "http://127.0.0.1:18939/v1"
router = Router(
    model_list=[
        {"model_name": "chat-primary", "litellm_params": {"model": "openai/tiny-dead", "api_base": DEAD, "api_key": "none", "timeout": 5}, "model_info": {"id": "dep-primary-dead"}},
        {"model_name": "chat-backup", "litellm_params": {"model": "openai/tiny-a", "api_base": A, "api_key": "none"}, "model_info": {"id": "dep-backup-a"}},
        {"model_name": "chat-keyed", "litellm_params": {"model": "openai/tiny-b", "api_base": B, "api_key": "sk-wrongkey1234567890abcd"}, "model_info": {"id": "dep-keyed-b"}},
    ],
    fallbacks=[{"chat-primary": ["chat-backup"]}], num_retries=1, retry_after=0,
)
MSG = [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Say hello to the world."}]

def hexify(node):
    if isinstance(node, dict):
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in node and isinstance(node[key], str):
                node[key] = base64.b64decode(node[key]).hex()
        for v in node.values():
            hexify(v)
    elif isinstance(node, list):
        for v in node:
            hexify(v)

async def flush():
    await asyncio.sleep(1.0)
    spans = exporter.get_finished_spans()
    exporter.clear()
    if spans:
        doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        hexify(doc)
        OUT.write(json.dumps(doc, separators=(",", ":")) + "\n"); OUT.flush()

async def main():
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=4, stream=True)
    async for _ in s: pass
    await asyncio.sleep(1.0); exporter.clear()
    await router.acompletion(model="chat-backup", messages=MSG, max_tokens=12)
    await flush()
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=16, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    await flush()
    s = await router.acompletion(model="chat-primary", messages=MSG, max_tokens=10, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    await flush()
    try:
        await router.acompletion(model="chat-keyed", messages=MSG, max_tokens=8)
    except Exception as exc:
        print("expected error:", type(exc).__name__, file=sys.stderr)
    await flush()
    cm = [{"role": "user", "content": "Cache me: what is a token?"}]
    await router.acompletion(model="chat-backup", messages=cm, max_tokens=8, caching=True)
    await asyncio.sleep(0.5)
    await router.acompletion(model="chat-backup", messages=cm, max_tokens=8, caching=True)
    await flush()

asyncio.run(main())
