"""A real LiteLLM proxy (``litellm[proxy]`` from PyPI, in its own virtualenv) on 127.0.0.1, started and stopped by PID.

The proxy runs from its own interpreter so its many pinned dependencies never touch the project's: point
``$SERVLENS_LITELLM`` (or ``--litellm``) at that venv's ``litellm`` executable::

    python -m venv /tmp/venv-litellm && /tmp/venv-litellm/bin/pip install 'litellm[proxy]'
    export SERVLENS_LITELLM=/tmp/venv-litellm/bin/litellm

:class:`Proxy` writes the config (JSON, which is YAML) and ``slp_logger.py`` (a copy of litellm_slp_logger.py, the
callback that writes each attempt's StandardLoggingPayload) into a private work folder, starts
``litellm --config … --host 127.0.0.1 --port N`` with a fresh random master key in its environment (the key is
never written to a file), waits for ``/health/liveliness``, and sends warm-up requests to a ``warmup`` model group
while the callback is paused: LiteLLM's first streamed and non-streamed calls pay one-off imports of seconds, which
would otherwise land on the first recorded requests.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
WARMUP_GROUP = "warmup"
# Response headers the client log keeps: the proxy's own (x-litellm-*: call id, model group, deployment id,
# attempted retries and fallbacks, durations), and retry-after on 429s.
GATEWAY_HEADERS = ("x-litellm-", "retry-after")


class GatewayError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A port that refuses connections: a dead endpoint. Checked by connecting to it."""
    for _ in range(20):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise GatewayError("no closed port found on 127.0.0.1")


def find_litellm(explicit: str | None = None) -> Path:
    candidate = explicit or os.environ.get("SERVLENS_LITELLM") or shutil.which("litellm")
    if not candidate or not Path(candidate).exists():
        raise GatewayError("the LiteLLM proxy was not found: install 'litellm[proxy]' in its own venv and set "
                           "SERVLENS_LITELLM to its bin/litellm (or pass --litellm)")
    return Path(candidate)


def litellm_version(litellm_bin: Path) -> str:
    python = litellm_bin.parent / "python"
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                         capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip() or "unknown"


_RUNNING: dict[int, Proxy] = {}


@atexit.register
def _stop_leftovers() -> None:
    for proxy in list(_RUNNING.values()):
        proxy.stop()


class Proxy:
    def __init__(self, litellm_bin: Path, config: dict, slp_out: Path, log_path: Path, port: int | None = None):
        self.litellm_bin, self.config, self.slp_out, self.log_path = litellm_bin, config, slp_out, log_path
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._key = "sk-" + secrets.token_hex(24)  # this proxy's master key: in its environment only
        self._proc: subprocess.Popen | None = None
        self._work = Path(tempfile.mkdtemp(prefix="servlens-litellm-"))

    @property
    def auth_headers(self) -> dict:
        return {"Authorization": f"Bearer {self._key}"}

    def start(self, ready_timeout: float = 180.0) -> Proxy:
        config_path = self._work / "litellm_config.yaml"
        config_path.write_text(json.dumps(self.config, indent=2), encoding="utf-8")
        shutil.copy(HERE / "litellm_slp_logger.py", self._work / "slp_logger.py")
        self.slp_out.parent.mkdir(parents=True, exist_ok=True)
        self.pause()
        env = {**os.environ, "LITELLM_MASTER_KEY": self._key, "SERVLENS_SLP_OUT": str(self.slp_out),
               "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the bundled cost map: no fetch at start
               "LITELLM_LOG": os.environ.get("LITELLM_LOG", "INFO")}
        env.pop("PYTHONPATH", None)
        cmd = [str(self.litellm_bin), "--config", str(config_path), "--host", "127.0.0.1", "--port",
               str(self.port), "--num_workers", "1"]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, cwd=str(self._work), env=env, stdout=log, stderr=subprocess.STDOUT)
        _RUNNING[self._proc.pid] = self
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise GatewayError(f"the LiteLLM proxy exited with code {self._proc.returncode} before it was "
                                   f"ready (log: {self.log_path})")
            try:
                if requests.get(self.base_url + "/health/liveliness", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise GatewayError(f"the LiteLLM proxy was not ready within {ready_timeout:.0f} s (log: {self.log_path})")

    def pause(self) -> None:
        Path(str(self.slp_out) + ".paused").write_text("", encoding="utf-8")

    def resume(self) -> None:
        Path(str(self.slp_out) + ".paused").unlink(missing_ok=True)

    def warm_up(self, n: int = 2) -> None:
        """Streamed and non-streamed calls to the warmup group, not recorded (the callback is paused)."""
        body = {"model": WARMUP_GROUP, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4}
        for _ in range(n):
            for extra in ({}, {"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}):
                r = requests.post(self.base_url + "/v1/chat/completions", json={**body, **extra},
                                  headers=self.auth_headers, timeout=120)
                _ = r.content  # read the whole stream
        time.sleep(1.0)  # let the success callbacks of the warm-up run while still paused

    def stop(self, timeout: float = 15.0) -> None:
        proc = self._proc
        if proc is None:
            return
        _RUNNING.pop(proc.pid, None)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self._proc = None
        self.resume()
        shutil.rmtree(self._work, ignore_errors=True)


def deployment(group: str, dep_id: str, api_base: str, **params) -> dict:
    """One model_list entry: an OpenAI-compatible deployment (llama.cpp's /v1) in model group ``group``."""
    return {"model_name": group,
            "litellm_params": {"model": "openai/tiny", "api_base": api_base, "api_key": "none", **params},
            "model_info": {"id": dep_id}}


def proxy_config(model_list: list[dict], warmup_base: str, router_settings: dict | None = None) -> dict:
    """The proxy config: the run's deployments plus a warmup deployment, the SLP callback, router settings."""
    return {
        "model_list": [*model_list, deployment(WARMUP_GROUP, "dep-warmup", warmup_base)],
        "litellm_settings": {"callbacks": "slp_logger.proxy_handler_instance"},
        "router_settings": router_settings or {},
    }
