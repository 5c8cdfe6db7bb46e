"""Which canonical columns each built-in profile fills, computed by ingesting its test samples (not by hand).

    python -m tests.ingest.profile_columns            # print the table
    python -m tests.ingest.profile_columns --write    # rewrite the table in docs/profiles.md
    python -m tests.ingest.profile_columns --check    # exit 1 if docs/profiles.md's table is stale

A cell is "●" when the profile reads the column from the sample, "○" when servlens derives it (stage 2, e.g.
TPOT from e2e - TTFT), empty when it stays NULL on every row of the samples. test_profile_columns_table.py keeps
the table in docs/profiles.md current and every built-in profile listed here.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from servlens.ingest.api import ingest_inputs
from servlens.ingest.profiles import builtin_profiles
from servlens.store.schema import REQUEST_COLUMNS, open_store

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "profiles.md"
START, END = "<!-- columns-table:start -->", "<!-- columns-table:end -->"

# Each built-in profile's real samples (the ones its tests use), relative to the repository.
SAMPLES: dict[str, list[str]] = {
    "aiperf-records": ["tests/data/formats/aiperf/profile_export.jsonl"],
    "anthropic-messages-body": ["tests/data/formats/anthropic/messages-bodies.jsonl"],
    "azure-llm-trace": ["tests/data/shared/traces/azure_llm_2023_conv_first5000.csv"],
    "bedrock-invocation-log": ["tests/data/formats/bedrock/bedrock-invocation-logs.jsonl"],
    "burstgpt-trace": ["tests/data/shared/traces/burstgpt_v1_first400rows.csv"],
    "envoy-ai-gateway-access-log": ["tests/data/formats/envoy-ai-gateway/access-log.jsonl"],
    "genai-perf-profile-export": ["tests/data/formats/genai-perf/openai_profile_export.json",
                                  "tests/data/formats/genai-perf/triton_profile_export.json"],
    "guidellm-benchmarks": ["tests/data/shared/formats/guidellm_v0.3_benchmarks_stripped.json"],
    "helicone-export": ["tests/data/formats/helicone/helicone-export.jsonl",
                        "tests/data/formats/helicone/helicone-test-fixture.jsonl"],
    "helicone-export-csv": ["tests/data/formats/helicone/helicone-export.csv"],
    "kong-ai-log": ["tests/data/formats/kong/kong-file-log.jsonl"],
    "langfuse-observations": ["tests/data/formats/langfuse/observations-export.jsonl"],
    "langfuse-observations-api": ["tests/data/formats/langfuse/observations-api-page.json"],
    "langfuse-observations-csv": ["tests/data/formats/langfuse/observations-export.csv"],
    "langfuse-trace-download": ["tests/data/formats/langfuse/trace-openai-agents-2025-09-30.json",
                                "tests/data/formats/langfuse/trace-vercel-aisdk-2025-11-17.json"],
    "litellm-slp": ["tests/data/gateways/litellm_slp_reference.jsonl",
                    "tests/data/gateways/litellm_slp_recorded.jsonl"],
    "litellm-spendlogs-api": ["tests/data/gateways/litellm_spendlogs_api.json"],
    "litellm-spendlogs-csv": ["tests/data/gateways/litellm_spendlogs.csv"],
    "litellm-spendlogs-json": ["tests/data/gateways/litellm_spendlogs.jsonl"],
    "llama-server-log": ["tests/data/shared/real-engine/llamacpp/llama-server.log"],
    "llamacpp-completion-body": ["tests/data/formats/llamacpp-completion/completion-bodies.jsonl"],
    "llmperf-responses": ["tests/data/formats/llmperf/550_150_individual_responses.json"],
    "mooncake-trace": ["tests/data/shared/traces/mooncake_fast25_synthetic_trace.jsonl"],
    "ollama-responses": ["tests/data/formats/ollama/ollama-chat.jsonl"],
    "openai-response-body": ["tests/data/formats/openai-bodies/response-bodies.jsonl"],
    "openrouter-generation": ["tests/data/formats/openrouter/generation-stats.jsonl"],
    "otel-genai-spans": ["tests/data/formats/otel/otel-flavours.jsonl",
                         "tests/data/formats/otel/otel-openlit-recorded.jsonl",
                         "tests/data/formats/otel/otel-openllmetry-recorded.jsonl",
                         "tests/data/gateways/otel_litellm_recorded.jsonl"],
    "portkey-gateway-log-stream": ["tests/data/formats/portkey/portkey-gateway-log-stream.sse"],
    "servlens-loadgen": ["tests/data/shared/real-engine/vllm-cpu/requests.jsonl"],
    "sglang-request-log": ["tests/data/formats/sglang/recorded-0.5.23/vm_0.log"],
    "sglang-request-log-text": ["tests/data/formats/sglang/sglang-issue-25887-server.log"],
    "sglang-request-metrics": ["tests/data/formats/sglang/recorded-0.5.23/sglang-request-metrics-20261207_19.log"],
    "tgi-router-json": ["tests/data/formats/tgi/tgi-router.jsonl"],
    "tgi-router-text": ["tests/data/formats/tgi/tgi-router-text.log"],
    "vllm-bench": ["tests/data/shared/real-engine/vllm-bench/random/random-3.0qps-tiny-20261129-081458.json"],
    "vllm-request-log": ["tests/data/formats/vllm-log/vllm-server.log"],
}

# Bookkeeping and --keep-text columns: every profile has the first, none fills the second by default.
NOT_SHOWN = {"run", "source_id", "source_line", "attrs", "prompt_text", "content_text", "reasoning_text"}
SHOWN = [c for c in REQUEST_COLUMNS if c not in NOT_SHOWN]


def filled_columns(name: str) -> tuple[int, set[str]]:
    """(rows read, canonical columns non-NULL on some row) for a profile's samples ingested sniffed."""
    con = open_store(None)
    report = ingest_inputs(con, [str(REPO / p) for p in SAMPLES[name]], run="t")
    # request sources only: a console log's gauge lines are a metrics source of the same file
    formats = {s["format"] for s in report.to_dict()["sources"] if s.get("kind", "requests") == "requests"}
    if formats != {name}:
        raise AssertionError(f"{name}'s samples sniff as {sorted(formats)}")
    non_null = ", ".join(f"count({c})" for c in SHOWN)
    counts = con.execute(f"SELECT count(*), {non_null} FROM requests").fetchone()
    con.close()
    return counts[0], {c for c, n in zip(SHOWN, counts[1:]) if n}


def columns_table() -> str:
    profiles = {p.name: p for p in builtin_profiles()}
    header = ["profile", "rows", *SHOWN]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in sorted(profiles):
        if name not in SAMPLES:
            lines.append("| " + " | ".join([f"`{name}`", "no sample", *[""] * len(SHOWN)]) + " |")
            continue
        rows, filled = filled_columns(name)
        declared = set(profiles[name].columns)
        cells = ["●" if c in filled and c in declared else "○" if c in filled else "" for c in SHOWN]
        lines.append("| " + " | ".join([f"`{name}`", str(rows), *cells]) + " |")
    return "\n".join(lines) + "\n"


def with_table(doc: str, table: str) -> str:
    pattern = re.compile(re.escape(START) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{DOC} has no {START} ... {END} block")
    return pattern.sub(lambda _: f"{START}\n{table}{END}", doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/profiles.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/profiles.md's table is stale")
    args = parser.parse_args(argv)
    table = columns_table()
    doc = DOC.read_text()
    if args.write:
        DOC.write_text(with_table(doc, table))
    elif args.check:
        if with_table(doc, table) != doc:
            print(f"{DOC.relative_to(REPO)}: the formats x columns table is stale; "
                  "run python -m tests.ingest.profile_columns --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
