import asyncio, json, sys
import litellm
from litellm import Router
from litellm.integrations.custom_logger import CustomLogger
OUT = open(sys.argv[1], "w")
class Rec(CustomLogger):
    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        OUT.write(json.dumps(kwargs["standard_logging_object"], default=str) + "\n"); OUT.flush()
litellm.callbacks = [Rec()]
litellm.turn_off_message_logging = True
router = Router(model_list=[{"model_name": "chat-backup", "litellm_params": {"model": "openai/tiny-a", "api_base": "http://127.0.0.1:18931/v1", "api_key": "none"}, "model_info": {"id": "dep-backup-a"}}])
async def main():
    await router.acompletion(model="chat-backup", messages=[{"role": "user", "content": "first secret prompt"}], max_tokens=6)
    s = await router.acompletion(model="chat-backup", messages=[{"role": "user", "content": "second, different prompt"}], max_tokens=6, stream=True, stream_options={"include_usage": True})
    async for _ in s: pass
    await asyncio.sleep(1.5)
asyncio.run(main())
