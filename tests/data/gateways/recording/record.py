"""Throwaway: drive real LiteLLM Router calls against local llama.cpp servers; write each attempt's
StandardLoggingPayload (and the SpendLogs row the proxy would write for it) as one JSON line."""
import asyncio, json, sys, datetime
import litellm
from litellm import Router
from litellm.integrations.custom_logger import CustomLogger
from litellm.caching.caching import Cache
from litellm.proxy.spend_tracking.spend_tracking_utils import get_logging_payload  # heavy import: do it before the event loop runs
from litellm.litellm_core_utils.litellm_logging import StandardLoggingPayloadSetup

OUT_SLP = open(sys.argv[1], "w")
OUT_SPEND = open(sys.argv[2], "w")

def _default(o):
    if isinstance(o, (datetime.datetime, datetime.date)):
        return o.isoformat()
    return str(o)

class Recorder(CustomLogger):
    def _write(self, kwargs, response_obj, start_time, end_time):
        if not self.on:
            return
        slp = kwargs.get("standard_logging_object")
        OUT_SLP.write(json.dumps(slp, default=_default) + "\n"); OUT_SLP.flush()
        # The SpendLogs row is built after the run: its first build blocks the event loop for seconds here
        # (it would delay the first chunk of a concurrent stream).
        self.pending.append((kwargs, response_obj, start_time, end_time))

    def flush_spend(self):
        for kwargs, response_obj, start_time, end_time in self.pending:
            row = get_logging_payload(kwargs, response_obj, start_time, end_time)
            OUT_SPEND.write(json.dumps(dict(row), default=_default) + "\n"); OUT_SPEND.flush()
        self.pending = []
    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, response_obj, start_time, end_time)
    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        # The proxy writes no SpendLogs row per failed attempt: only the final failure of a client request
        # (post_call_failure_hook, metadata.status = "failure"). Keep the attempt; main() writes it if final.
        if not self.on:
            return
        slp = kwargs.get("standard_logging_object")
        OUT_SLP.write(json.dumps(slp, default=_default) + "\n"); OUT_SLP.flush()
        self.last_failure = (kwargs, kwargs.get("exception"), start_time, end_time)

    def write_final_failure(self):
        from litellm.proxy.spend_tracking.spend_tracking_utils import get_logging_payload
        from litellm.litellm_core_utils.litellm_logging import StandardLoggingPayloadSetup
        kwargs, exc, start_time, end_time = self.last_failure
        md = kwargs["litellm_params"].setdefault("metadata", {}) or {}
        kwargs["litellm_params"]["metadata"] = md
        md["status"] = "failure"
        md["error_information"] = StandardLoggingPayloadSetup.get_error_information(original_exception=exc, traceback_str="")
        self.pending.append((kwargs, exc, start_time, end_time))

REC = Recorder()
REC.on = False
REC.pending = []
litellm.callbacks = [REC]
litellm.cache = Cache(type="local")

A = "http://127.0.0.1:18931/v1"; B = "http://127.0.0.1:18932/v1"; DEAD = "http://127.0.0.1:18939/v1"
router = Router(
    model_list=[
        {"model_name": "chat-primary", "litellm_params": {"model": "openai/tiny-dead", "api_base": DEAD, "api_key": "none", "timeout": 5}, "model_info": {"id": "dep-primary-dead"}},
        {"model_name": "chat-backup", "litellm_params": {"model": "openai/tiny-a", "api_base": A, "api_key": "none"}, "model_info": {"id": "dep-backup-a"}},
        {"model_name": "chat-keyed", "litellm_params": {"model": "openai/tiny-b", "api_base": B, "api_key": "sk-wrongkey1234567890abcd"}, "model_info": {"id": "dep-keyed-b"}},
    ],
    fallbacks=[{"chat-primary": ["chat-backup"]}],
    num_retries=1, retry_after=0,
)

MSG = [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Say hello to the world."}]

async def main():
    # warm-up (not recorded): LiteLLM's first streamed call pays one-off imports of ~10 s on this machine
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=4, stream=True)
    async for _ in s: pass
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=4, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    await router.acompletion(model="chat-backup", messages=MSG, max_tokens=4)
    await asyncio.sleep(1.0)
    REC.on = True
    # 1. non-streamed, served directly
    await router.acompletion(model="chat-backup", messages=MSG, max_tokens=12, temperature=0.0, user="end-user-42", metadata={"tags": ["team-search"]})
    # 2. streamed with usage
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=16, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    # 3. fallback chain, not streamed: primary (dead) fails + retry, then backup serves
    await router.acompletion(model="chat-primary", messages=MSG, max_tokens=10)
    # 4. fallback chain, streamed
    s = await router.acompletion(model="chat-primary", messages=MSG, max_tokens=10, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    # 5. error with no fallback (401)
    try:
        await router.acompletion(model="chat-keyed", messages=MSG, max_tokens=8)
    except Exception as exc:
        print("expected error:", type(exc).__name__, file=sys.stderr)
        await asyncio.sleep(0.2); REC.write_final_failure()
    # 6. context overflow on backup (n_ctx 4096 / 2 slots)
    try:
        await router.acompletion(model="chat-backup", messages=[{"role": "user", "content": "hello world " * 1500}], max_tokens=8)
    except Exception as exc:
        print("expected error:", type(exc).__name__, file=sys.stderr)
        await asyncio.sleep(0.2); REC.write_final_failure()
    # 7. cache miss then hit (same request twice, caching on)
    cm = [{"role": "user", "content": "Cache me: what is a token?"}]
    await router.acompletion(model="chat-backup", messages=cm, max_tokens=8, caching=True)
    await asyncio.sleep(0.5)
    await router.acompletion(model="chat-backup", messages=cm, max_tokens=8, caching=True)
    # 8. a longer stream
    s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=48, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    # 9. a length finish with longer output
    await router.acompletion(model="chat-backup", messages=MSG, max_tokens=64)
    await asyncio.sleep(2)

asyncio.run(main())
REC.pending.sort(key=lambda p: p[2])
REC.flush_spend()
