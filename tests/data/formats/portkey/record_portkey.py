"""Record the open-source Portkey gateway's log stream in front of a real llama.cpp server (tools/engine).

    python tests/data/formats/portkey/record_portkey.py GATEWAY_DIR OUT.sse

GATEWAY_DIR is an `npm install @portkey-ai/gateway` folder; the gateway is started with a preload
(bind-local.js) that binds it to 127.0.0.1. Its log stream (GET /log/stream, server-sent events; only without
--headless and outside NODE_ENV=production) is written raw to OUT.sse while five bounded requests go through: two
non-streamed, one streamed, a fallback whose first target is down, and an oversized max_tokens (llama.cpp accepted it).
Everything started here is stopped by its PID at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from tools.engine.model import ensure_model  # noqa: E402
from tools.engine.server import ServerConfig, start_server, stop_server  # noqa: E402

PORT = 8787  # the gateway's log writes endpoint = url.split(":8787")[1]: another port loses the endpoint


def main(gateway_dir: str, out: str) -> None:
    model = ensure_model()
    engine = start_server(model, ServerConfig(parallel=2, ctx_size=2048))
    # not --headless: the log stream is off then
    gateway = subprocess.Popen(
        ["node", "-r", str(Path(__file__).with_name("bind-local.js")), "build/start-server.js",
         f"--port={PORT}"],
        cwd=gateway_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{PORT}"
        for _ in range(60):
            try:
                requests.get(base + "/", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.5)
        stream = requests.get(base + "/log/stream", stream=True, timeout=60)
        with open(out, "wb") as sink:
            def pump() -> None:
                try:
                    for chunk in stream.iter_content(chunk_size=None):
                        sink.write(chunk)
                        sink.flush()
                except (requests.RequestException, AttributeError):  # the stream closed under it at the end
                    pass
            threading.Thread(target=pump, daemon=True).start()
            time.sleep(1)
            llama = engine.base_url + "/v1"
            direct = {"x-portkey-provider": "openai", "x-portkey-custom-host": llama,
                      "Authorization": "Bearer none"}
            body = {"model": "tiny", "messages": [{"role": "user", "content": "tell me about the sea"}],
                    "max_tokens": 24, "temperature": 0.8}
            url = base + "/v1/chat/completions"
            for i in range(2):
                requests.post(url, headers=direct, json=body, timeout=60)
            requests.post(url, headers=direct, json={**body, "stream": True}, timeout=60).content
            fallback = {"strategy": {"mode": "fallback"}, "targets": [
                {"provider": "openai", "custom_host": "http://127.0.0.1:9/v1", "api_key": "none"},
                {"provider": "openai", "custom_host": llama, "api_key": "none"}]}
            requests.post(url, headers={"x-portkey-config": json.dumps(fallback)}, json=body, timeout=60)
            too_long = {**body, "max_tokens": 100000, "n_probs": "x"}
            requests.post(url, headers=direct, json=too_long, timeout=60)
            time.sleep(2)
        stream.close()
    finally:
        gateway.terminate()
        gateway.wait(10)
        stop_server(engine)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
