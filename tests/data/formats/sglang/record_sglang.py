"""Record SGLang's JSON request log and per-request metrics file with SGLang's own writers.

Not part of the test suite: how `sglang-request-log-json/` and `sglang-request-metrics/` were made (see
ATTRIBUTION.md). SGLang's server needs a GPU; its writers do not. Run it with SGLang installed in a scratch
virtualenv (`pip install --no-deps sglang==0.5.23`, plus what its modules import: torch, transformers, msgspec,
pyzmq, pybase64, aiohttp, ...), never in servlens's own environment:

    python record_sglang.py OUT_DIR

It writes, as `python -m sglang.launch_server --enable-metrics --log-requests --log-requests-format json
--log-requests-target OUT_DIR/request-log --export-metrics-to-file --export-metrics-to-file-dir OUT_DIR/metrics` would:

- OUT_DIR/request-log/{hostname}_0.log: sglang.srt.utils.request_logger.RequestLogger (log_received_request,
  log_finished_request) through sglang.srt.utils.log_utils (log_json, the file target's TimedRotatingFileHandler and
  its "[%(asctime)s] " formatter);
- OUT_DIR/metrics/sglang-request-metrics-YYYYMMDD_HH.log: sglang.srt.observability.request_metrics_exporter
  (create_request_metrics_exporters -> FileRequestMetricsExporter.write_record), with the skip names the tokenizer
  manager hands it (RequestLogger.metadata).

What SGLang's own code makes: the request objects (GenerateReqInput, normalised as TokenizerManager.generate_request
does), the finish reasons (schedule_batch.FINISH_* .to_json()), every time stamp and duration (APIServerReqTimeStats
and SchedulerReqTimeStats, their setters and convert_to_output_meta_info, the scheduler's stats pickled across as
between the processes), and the whole serialisation. What this script feeds: the prompts, token counts, output text,
the waits between the stages (real sleeps, so the stamps are this machine's clock) and the order in which the
meta_info dict is assembled, copied from TokenizerManager._handle_batch_output, _handle_abort_req and
_stream_one_response (sglang 0.5.23, python/sglang/srt/managers/tokenizer_manager.py).
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import time
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, FINISH_MATCHED_STR, FINISH_MATCHED_TOKEN
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats, SchedulerReqTimeStats
from sglang.srt.observability.request_metrics_exporter import create_request_metrics_exporters
from sglang.srt.utils.request_logger import RequestLogger

WEIGHT_VERSION = "default"  # ServerArgs.weight_version's default


class Request:
    """One request's life across the API server (tokenizer manager) and the scheduler, as SGLang times it."""

    def __init__(self, rid: str, text: str, sampling_params: dict, stream: bool):
        self.obj = GenerateReqInput(text=text, sampling_params=sampling_params, stream=stream, rid=rid)
        self.obj.normalize_batch_and_arguments()
        self.api = APIServerReqTimeStats()
        self.api.set_created_time()
        self.sched = SchedulerReqTimeStats(has_timing_data=True)  # has_timing_data: what --enable-metrics sets
        self.first_output_time = None

    def dispatch(self):
        self.api.set_tokenize_finish_time()
        self.api.set_api_server_dispatch_time()
        self.api.set_api_server_dispatch_finish_time()
        self.sched.set_scheduler_recv_time()

    def scheduler_stats(self) -> SchedulerReqTimeStats:
        """The scheduler's stats as the tokenizer manager receives them (pickled between the processes)."""
        return pickle.loads(pickle.dumps(self.sched))

    def first_output(self, stats: SchedulerReqTimeStats) -> None:
        """TokenizerManager._handle_batch_output: the first output batch sets first_token_time."""
        if self.api.first_token_time == 0.0:
            self.first_output_time = time.perf_counter()
            ts = None
            if not self.obj.stream:  # _get_scheduler_first_token_time
                p = stats.prefill_finished_time
                if self.api.created_time < p <= time.perf_counter():
                    ts = p
            self.api.set_first_token_time(ts=ts or self.first_output_time)
            self.api.set_last_time(ts=self.first_output_time)
        else:
            self.first_output_time = None


def batch_output_meta_info(req: Request, finish: dict, prompt_tokens: int, completion_tokens: int,
                           cached_tokens: int) -> dict:
    """meta_info of a finished request as TokenizerManager._handle_batch_output builds it with --enable-metrics."""
    stats = req.scheduler_stats()
    meta_info = {
        "id": req.obj.rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions": 0,
    }
    meta_info.update(stats.convert_to_output_meta_info())
    meta_info.update({"reasoning_tokens": 0, "completion_tokens": completion_tokens, "cached_tokens": cached_tokens})
    req.first_output(stats)
    req.api.set_finished_time(ts=req.first_output_time)
    meta_info["e2e_latency"] = req.api.get_e2e_latency()
    meta_info.update(req.api.convert_to_output_meta_info(stats, completion_tokens))
    return meta_info


def abort_meta_info(req: Request, finish: dict, completion_tokens: int) -> dict:
    """meta_info of a request the scheduler aborts by message (TokenizerManager._handle_abort_req)."""
    req.api.set_finished_time()
    return {
        "id": req.obj.rid,
        "finish_reason": finish,
        "weight_version": WEIGHT_VERSION,
        "e2e_latency": req.api.get_e2e_latency(),
        "completion_tokens": completion_tokens,
    }


def stream_chunk_sent(req: Request) -> None:
    """_stream_one_response: a streamed chunk before the last one stamps response_sent_to_client_time."""
    req.first_output(req.scheduler_stats())
    if not req.api.response_sent_to_client_time:
        req.api.set_response_sent_to_client_time()


async def finish(req: Request, text: str, output_ids: list[int], meta_info: dict, logger: RequestLogger,
                 exporter_manager) -> None:
    """_stream_one_response on the finished output: stamp the response, log it, export it."""
    out = {"text": text, "output_ids": output_ids, "meta_info": meta_info}
    if not req.api.response_sent_to_client_time:
        req.api.set_response_sent_to_client_time()
        out["meta_info"]["response_sent_to_client_ts"] = req.api.get_response_sent_to_client_realtime()
    logger.log_finished_request(req.obj, out)
    for exporter in exporter_manager:
        await exporter.write_record(req.obj, out)


def prefill(req: Request, queue_s: float, prefill_s: float) -> None:
    req.sched.set_wait_queue_entry_time()
    time.sleep(queue_s)
    req.sched.set_forward_entry_time()
    time.sleep(prefill_s)
    req.sched.set_prefill_finished_time()


async def main(out_dir: Path) -> None:
    logger = RequestLogger(log_requests=True, log_requests_level=2, log_requests_format="json",
                           log_requests_target=[str(out_dir / "request-log")])
    _, obj_skip_names, out_skip_names = logger.metadata  # TokenizerManager.init_request_logging_and_dumping
    # the two ServerArgs fields the exporter reads (a whole ServerArgs wants a model to validate); they name the
    # directory only, nothing in the records
    server_args = SimpleNamespace(export_metrics_to_file=True, export_metrics_to_file_dir=str(out_dir / "metrics"))
    exporters = create_request_metrics_exporters(server_args, obj_skip_names, out_skip_names)

    prompt = "The capital of France is"

    # 1. not streamed, stopped on the EOS token
    r = Request("a1f0c2d4e6b84f1a9c3e5d7b9f1a2c4e", prompt, {"max_new_tokens": 32, "temperature": 0}, stream=False)
    r.dispatch()
    logger.log_received_request(r.obj)
    prefill(r, 0.004, 0.021)
    time.sleep(0.060)  # decode
    r.sched.set_completion_time()
    meta = batch_output_meta_info(r, FINISH_MATCHED_TOKEN(matched=128009).to_json(), 6, 8, 0)
    await finish(r, " Paris. It is known for", [12366, 13, 1102, 374, 3967, 369, 1202, 128009], meta, logger, exporters)

    # 2. streamed, cut at max_new_tokens, the same prompt again (radix-cache hit)
    r = Request("b2e1d3c5a7f94e2b8d4f6a8c0e2b4d6f", prompt, {"max_new_tokens": 16, "temperature": 0.7}, stream=True)
    r.dispatch()
    logger.log_received_request(r.obj)
    prefill(r, 0.002, 0.009)
    stream_chunk_sent(r)
    time.sleep(0.120)
    r.sched.set_completion_time()
    meta = batch_output_meta_info(r, FINISH_LENGTH(length=16).to_json(), 6, 16, 5)
    await finish(r, " Paris, the city of light, which has been the capital since",
                 list(range(1000, 1016)), meta, logger, exporters)

    # 3. not streamed, stopped on a stop string, queued behind other requests
    r = Request("c3f2e4d6b8a04f3c9e5a7b9d1f3c5e7a", "List three colours:",
                {"max_new_tokens": 64, "stop": ["\n\n"]}, stream=False)
    r.dispatch()
    logger.log_received_request(r.obj)
    prefill(r, 0.150, 0.018)
    time.sleep(0.045)
    r.sched.set_completion_time()
    meta = batch_output_meta_info(r, FINISH_MATCHED_STR(matched="\n\n").to_json(), 5, 7, 0)
    await finish(r, " red, green, blue", [2579, 11, 6307, 11, 6437, 271, 198], meta, logger, exporters)

    # 4. not streamed, rejected by the scheduler before any prefill (Req.set_finish_with_abort's default 400)
    r = Request("d4a3f5e7c9b14a4d8f6b8c0e2a4d6f8b", "word " * 3000, {"max_new_tokens": 8}, stream=False)
    r.dispatch()
    logger.log_received_request(r.obj)
    time.sleep(0.003)
    r.sched.set_completion_time()
    finish_reason = FINISH_ABORT("Request prompt exceeds the KV memory budget: input_len=3001.",
                                 HTTPStatus.BAD_REQUEST, "BadRequestError").to_json()
    meta = batch_output_meta_info(r, finish_reason, 3001, 0, 0)
    await finish(r, "", [], meta, logger, exporters)

    # 5. streamed, aborted by the scheduler's running timeout after some tokens (Scheduler's AbortReq with its
    #    finished_reason dict, handled by TokenizerManager._handle_abort_req)
    r = Request("e5b4a6f8d0c24b5e9a7c9d1f3b5e7a9c", "Write a long story about a lighthouse.",
                {"max_new_tokens": 2048}, stream=True)
    r.dispatch()
    logger.log_received_request(r.obj)
    prefill(r, 0.003, 0.015)
    stream_chunk_sent(r)
    time.sleep(0.200)
    finish_reason = {"type": "abort", "status_code": HTTPStatus.SERVICE_UNAVAILABLE,
                     "message": "Request running timeout reached."}
    meta = abort_meta_info(r, finish_reason, 24)
    await finish(r, " The lighthouse stood at the edge of the world, its lamp", list(range(2000, 2024)), meta,
                 logger, exporters)

    for exporter in exporters:
        exporter.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
