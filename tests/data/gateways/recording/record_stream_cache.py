"""Recorded: a streamed request answered from LiteLLM's in-memory response cache (miss, then hit)."""
import asyncio, json, sys
import litellm
from litellm import Router
from litellm.caching.caching import Cache
from litellm.integrations.custom_logger import CustomLogger
OUT = open(sys.argv[1], "w")
class Rec(CustomLogger):
    on = False
    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        if self.on:
            OUT.write(json.dumps(kwargs["standard_logging_object"], default=str) + "\n"); OUT.flush()
rec = Rec()
litellm.callbacks = [rec]
litellm.cache = Cache(type="local")
router = Router(model_list=[{"model_name": "chat-backup", "litellm_params": {"model": "openai/tiny-a", "api_base": "http://127.0.0.1:18931/v1", "api_key": "none"}, "model_info": {"id": "dep-backup-a"}}])
MSG = [{"role": "user", "content": "Stream me from the cache."}]
async def main():
    s = await router.acompletion(model="chat-backup", messages=[{"role": "user", "content": "warm up"}], max_tokens=4, stream=True)
    async for _ in s: pass
    await asyncio.sleep(1.0)
    rec.on = True
    for _ in range(2):
        s = await router.acompletion(model="chat-backup", messages=MSG, max_tokens=12, stream=True, stream_options={"include_usage": True}, caching=True)
        async for _ in s: pass
        await asyncio.sleep(1.0)
asyncio.run(main())
