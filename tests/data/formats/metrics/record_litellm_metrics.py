"""Record a real LiteLLM proxy's /metrics (its `prometheus` callback) after a few requests, on 127.0.0.1.

Not part of the test suite: how `litellm-proxy-metrics.prom` was made (see ATTRIBUTION.md). From the repository root,
with `litellm[proxy]` and `prometheus_client` in its own virtualenv (tools/engine/gateway.py; the proxy extra does
not pull prometheus_client, and the proxy does not start with the `prometheus` callback without it):

    SERVLENS_LITELLM=/tmp/venv-litellm/bin/litellm python -m tests.data.formats.metrics.record_litellm_metrics OUT.prom

One llama.cpp server (tools/engine, the tiny random-weight model, --parallel 2) and one closed port (a dead endpoint)
behind the proxy, num_retries 0:
  group `live`          one live deployment                                   -> successes, latency, TTFT
  group `chat`          one dead deployment; falls back to `chat-backup`      -> fallbacks, both kinds
  group `chat-backup`   a dead and a live deployment (which one a fallback gets is the router's random pick)
  group `lonely`        one dead deployment; falls back to `lonely-backup`    -> failed fallbacks, client errors
  group `lonely-backup` one dead deployment
  group `pool`          a deployment whose path the server does not have (HTTP 404, which LiteLLM cools down; a
                        refused connection it does not) and a live one -> cooldowns, a complete outage
The scrape is written unchanged (the proxy's master key is checked not to be in it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import requests

from tools.engine.gateway import Proxy, closed_port, deployment, find_litellm, litellm_version
from tools.engine.model import ModelSpec, ensure_model
from tools.engine.server import ServerConfig, start_server

PLAN = (  # (group, stream, max_tokens), sent one at a time
    [("live", i % 2 == 1, 16) for i in range(6)]
    + [("chat", i % 2 == 1, 16) for i in range(6)]
    + [("lonely", False, 16) for _ in range(3)]
    + [("pool", i % 2 == 1, 16) for i in range(6)]
)


def main(out: str) -> int:
    litellm_bin = find_litellm()
    server = start_server(ensure_model(ModelSpec(seed=1234)), ServerConfig(parallel=2, ctx_size=2048))
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    live = server.base_url + "/v1"
    config = {
        "model_list": [deployment("live", "dep-live", live),
                       deployment("chat", "dep-chat-dead", dead),
                       deployment("chat-backup", "dep-backup-dead", dead),
                       deployment("chat-backup", "dep-backup-live", live),
                       deployment("lonely", "dep-lonely-dead", dead),
                       deployment("lonely-backup", "dep-lonely-backup-dead", dead),
                       deployment("pool", "dep-pool-404", server.base_url + "/no-such-path/v1"),
                       deployment("pool", "dep-pool-live", live)],
        "litellm_settings": {"callbacks": ["prometheus"]},
        "router_settings": {"num_retries": 0,
                            "fallbacks": [{"chat": ["chat-backup"]}, {"lonely": ["lonely-backup"]}]},
    }
    work = Path(out).resolve().parent
    proxy = Proxy(litellm_bin, config, work / "unused_slp.jsonl", work / "litellm-proxy.log")
    try:
        proxy.start()
        statuses = []
        for group, stream, max_tokens in PLAN:
            body = {"model": group, "messages": [{"role": "user", "content": "hello world, tell me a story"}],
                    "max_tokens": max_tokens, "stream": stream}
            r = requests.post(proxy.base_url + "/v1/chat/completions", json=body, headers=proxy.auth_headers,
                              timeout=120)
            _ = r.content
            statuses.append((group, stream, r.status_code))
        time.sleep(3.0)  # the callbacks run after the response
        scrape = requests.get(proxy.base_url + "/metrics", headers=proxy.auth_headers, timeout=30)
        scrape.raise_for_status()
        text = scrape.text
        key = proxy.auth_headers["Authorization"].split()[-1]
        if key in text:
            raise SystemExit("the proxy's key is in the scrape; not written")
        Path(out).write_text(text, encoding="utf-8")
        print(f"litellm {litellm_version(litellm_bin)}; statuses {statuses}; dead endpoint {dead}; live {live}")
    finally:
        proxy.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
