"""A LiteLLM proxy callback that writes each LLM call attempt's StandardLoggingPayload as one JSON line, unedited.

Loaded by the proxy from its config (``litellm_settings: callbacks: slp_logger.proxy_handler_instance``; the
proxy imports ``slp_logger.py`` from the config file's folder, so gateway_scenarios.py copies this file there).
The output file is ``$SERVLENS_SLP_OUT``; while ``$SERVLENS_SLP_OUT.paused`` exists (the recorder's
warm-up) nothing is written. LiteLLM hands the payload to every callback as
``kwargs["standard_logging_object"]`` (litellm/litellm_core_utils/litellm_logging.py,
``get_standard_logging_object_payload``), once per attempt, in ``async_log_success_event`` and
``async_log_failure_event``; nothing here changes it. An event that comes without a payload is counted on stderr
(the proxy's log), never written as a made-up line.

This module runs inside the proxy's own interpreter (its own virtualenv): it imports only LiteLLM and the standard
library.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading

from litellm.integrations.custom_logger import CustomLogger


def _default(value):
    # The payload is a TypedDict of JSON values; a datetime or an enum can slip into nested metadata.
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


class StandardLoggingPayloadWriter(CustomLogger):
    def __init__(self, path: str | None = None):
        super().__init__()
        self.path = path or os.environ.get("SERVLENS_SLP_OUT", "litellm_slp.jsonl")
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the proxy's lifetime
        self.missing = 0

    def _write(self, kwargs: dict, event: str) -> None:
        if os.path.exists(self.path + ".paused"):  # the recorder's warm-up requests, before the run proper
            return
        payload = kwargs.get("standard_logging_object")
        if payload is None:
            self.missing += 1
            print(f"slp_logger: {event} event without standard_logging_object ({self.missing} so far)",
                  file=sys.stderr, flush=True)
            return
        line = json.dumps(payload, default=_default, ensure_ascii=False)
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, "success")

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, "failure")


proxy_handler_instance = StandardLoggingPayloadWriter()
