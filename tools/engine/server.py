"""Start and stop llama.cpp's server (the xllamacpp wheel) on 127.0.0.1, in its own process, stopped by its PID.

xllamacpp runs llama.cpp's ``llama-server`` code in-process, so the harness runs it in a child Python process
(``python -m tools.engine.server ...``): the load driver's timings are not disturbed by the engine's threads in the
same interpreter, and stopping the engine is killing one known PID. The child prints one JSON line with its listening
address once the model is loaded; :func:`start_server` then polls ``/health`` until the server answers 200.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ServerConfig:
    """The engine flags a scenario chooses (named after llama-server's command-line flags)."""

    parallel: int = 4  # --parallel: number of slots
    ctx_size: int = 8192  # --ctx-size: total context, split equally between the slots
    metrics: bool = True  # --metrics: expose /metrics
    reasoning_format: str = "none"  # --reasoning-format: none | deepseek | deepseek-legacy | auto
    # --threads (and --threads-batch). 1, not 2: on a shared 2-core machine two spinning llama.cpp threads that
    # lose their core to another process made decode 30x slower (measured: 8.8 vs 272 ms per token under load).
    threads: int = 1
    cache_ram_mib: int = 0  # --cache-ram: host-memory prompt cache; 0 keeps reuse to the slots' own KV cache
    slot_prompt_similarity: float | None = None  # --slot-prompt-similarity; None = llama.cpp's default
    alias: str = "tiny"  # --alias: the model name the server reports
    port: int = 0  # --port; 0 = any free port (a restart that must keep its address sets one)

    def argv(self) -> list[str]:
        args = [
            "--parallel", str(self.parallel), "--ctx-size", str(self.ctx_size),
            "--reasoning-format", self.reasoning_format, "--threads", str(self.threads),
            "--cache-ram", str(self.cache_ram_mib), "--alias", self.alias,
        ]
        if self.metrics:
            args.append("--metrics")
        if self.slot_prompt_similarity is not None:
            args += ["--slot-prompt-similarity", str(self.slot_prompt_similarity)]
        if self.port:
            args += ["--port", str(self.port)]
        return args


@dataclass
class RunningServer:
    pid: int
    base_url: str
    model_path: str
    config: ServerConfig
    log_path: Path | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def stop(self, timeout: float = 10.0) -> None:
        stop_server(self, timeout)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> dict:
        return {"pid": self.pid, "base_url": self.base_url, "model_path": self.model_path,
                "flags": asdict(self.config)}


class EngineStartError(RuntimeError):
    pass


def start_server(model_path: Path, config: ServerConfig | None = None, log_path: Path | None = None,
                 ready_timeout: float = 60.0) -> RunningServer:
    """Start the server in a child process and wait until ``/health`` answers 200."""
    config = config or ServerConfig()
    cmd = [sys.executable, "-m", "tools.engine.server", "--model", str(model_path), *config.argv()]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO), env=env)
    if log_path:
        log.close()
    address: dict = {}

    def read_address() -> None:  # the child's first stdout line is its address; the rest is drained
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not address and line.startswith("{"):
                try:
                    address.update(json.loads(line))
                except json.JSONDecodeError:
                    pass

    threading.Thread(target=read_address, daemon=True).start()
    server = RunningServer(pid=proc.pid, base_url="", model_path=str(model_path), config=config,
                           log_path=log_path, _proc=proc)
    _RUNNING[server.pid] = server
    deadline = time.monotonic() + ready_timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineStartError(f"the engine process exited with code {proc.returncode} before it was "
                                       f"ready (log: {log_path})")
            if address.get("base_url") and not server.base_url:
                server.base_url = address["base_url"]
            if server.base_url:
                try:
                    if requests.get(server.base_url + "/health", timeout=2).status_code == 200:
                        return server
                except requests.RequestException:
                    pass
            time.sleep(0.1)
        raise EngineStartError(f"the engine did not become ready within {ready_timeout:.0f} s (log: {log_path})")
    except BaseException:
        stop_server(server)
        raise


# Servers started by this process, so an interrupted harness still stops them (by PID) on exit.
_RUNNING: dict[int, RunningServer] = {}


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_RUNNING.values()):
        stop_server(server, timeout=5)


def stop_server(server: RunningServer, timeout: float = 10.0) -> None:
    """Stop the engine by its PID: SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    _RUNNING.pop(server.pid, None)
    proc = server._proc
    try:
        os.kill(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if proc is not None:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            proc.wait(5)
    else:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(server.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(server.pid, signal.SIGKILL)


def _child_main(argv: list[str] | None = None) -> int:
    """Entry point of the engine process: build xllamacpp's CommonParams from llama-server-style flags."""
    ap = argparse.ArgumentParser(prog="python -m tools.engine.server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("--metrics", action="store_true")
    ap.add_argument("--reasoning-format", default="none",
                    choices=["none", "deepseek", "deepseek-legacy", "auto"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-ram", type=int, default=0)
    ap.add_argument("--slot-prompt-similarity", type=float, default=None)
    ap.add_argument("--alias", default="tiny")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)

    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = args.model
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    params.endpoint_metrics = args.metrics
    params.endpoint_props = True
    params.endpoint_slots = True
    params.reasoning_format = {
        "none": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_NONE,
        "deepseek": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_DEEPSEEK,
        "deepseek-legacy": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY,
        "auto": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_AUTO,
    }[args.reasoning_format]
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_ram_mib = args.cache_ram
    if args.slot_prompt_similarity is not None:
        params.slot_prompt_similarity = args.slot_prompt_similarity
    params.model_alias = {args.alias}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.fit_params = False  # keep the context size we asked for
    params.warmup = True
    server = xlc.Server(params)
    address = server.listening_address
    if isinstance(address, bytes):
        address = address.decode()
    base_url = address if str(address).startswith("http") else f"http://{address}"
    print(json.dumps({"base_url": base_url.rstrip("/"), "pid": os.getpid()}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = os.getppid()
    while not stop.wait(0.5):
        if os.getppid() != parent:  # the harness died without stopping us: do not outlive it
            break
    # Exit without running the native destructors on a server that may still hold HTTP threads.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_child_main())
