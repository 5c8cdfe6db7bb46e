"""The DuckDB store: its tables, its schema version, and opening it.

Tables (DESIGN.md "Decisions" fixes the names; add columns, never rename):

- runs            one row per run label
- sources         one row per ingested file (path, sha256, size, detected format, rows, bad lines, ingested at)
- requests        the canonical request row, one per request attempt
- metric_samples  engine metrics, one row per sample (histogram buckets kept)
- ingest_errors   malformed input lines, with file and line, never silently dropped

A schema version sits in `servlens_meta`; `open_store` creates a new store or migrates an older one, and refuses a
store written by a newer servlens.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import duckdb

from servlens.errors import InputError

SCHEMA_VERSION = 1
DEFAULT_DB_PATH = Path(".servlens") / "store.duckdb"

# Canonical request columns in their fixed order, with their DuckDB types. Ingest projects every profile onto
# exactly these; rules, compare and reports read only these.
REQUEST_COLUMNS: dict[str, str] = {
    "run": "VARCHAR",
    "source_id": "INTEGER",
    "source_line": "BIGINT",
    "request_id": "VARCHAR",
    "trace_id": "VARCHAR",
    "attempt": "INTEGER",
    "fallback_from": "VARCHAR",
    "model": "VARCHAR",
    "served_model": "VARCHAR",
    "provider": "VARCHAR",
    "deployment": "VARCHAR",
    "endpoint": "VARCHAR",
    "stream": "BOOLEAN",
    "t_arrival": "TIMESTAMP",
    "t_first_token": "TIMESTAMP",
    "t_end": "TIMESTAMP",
    "queue_s": "DOUBLE",
    "prefill_s": "DOUBLE",
    "ttft_s": "DOUBLE",
    "first_content_s": "DOUBLE",
    "tpot_s": "DOUBLE",
    "decode_s": "DOUBLE",
    "e2e_s": "DOUBLE",
    "prompt_tokens": "BIGINT",
    "cached_tokens": "BIGINT",
    "completion_tokens": "BIGINT",
    "reasoning_tokens": "BIGINT",
    "max_tokens": "BIGINT",
    "context_window": "BIGINT",
    "finish_reason": "VARCHAR",
    "finish_reason_raw": "VARCHAR",
    "status": "VARCHAR",
    "http_status": "INTEGER",
    "error_type": "VARCHAR",
    "error_message": "VARCHAR",
    "cache_hit": "BOOLEAN",
    "prefix_key": "VARCHAR",
    "content_empty": "BOOLEAN",
    "content_has_reasoning_marker": "BOOLEAN",
    "reasoning_present": "BOOLEAN",
    "reasoning_has_marker": "BOOLEAN",
    "attrs": "JSON",
    # Only filled with --keep-text; NULL otherwise (privacy by default).
    "prompt_text": "VARCHAR",
    "content_text": "VARCHAR",
    "reasoning_text": "VARCHAR",
}

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "abort", "error", "timeout", "unknown")
METRIC_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
METRIC_SERIES = ("value", "bucket", "sum", "count", "quantile")

_DDL = f"""
CREATE TABLE IF NOT EXISTS servlens_meta (key VARCHAR PRIMARY KEY, value VARCHAR);

CREATE TABLE IF NOT EXISTS runs (
    run VARCHAR PRIMARY KEY,
    created_at TIMESTAMP DEFAULT current_timestamp,
    relative_clock BOOLEAN DEFAULT false,   -- no absolute clock: times are offsets from 1970-01-01 (or --start)
    tz VARCHAR                              -- --tz used for naive wall-clock times, NULL = UTC
);

CREATE SEQUENCE IF NOT EXISTS source_id_seq START 1;
CREATE TABLE IF NOT EXISTS sources (
    source_id INTEGER PRIMARY KEY DEFAULT nextval('source_id_seq'),
    run VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,                  -- 'requests' | 'metrics' | 'engine_info' (llama.cpp props/slots)
    path VARCHAR NOT NULL,                  -- absolute path as ingested
    sha256 VARCHAR NOT NULL,
    size_bytes BIGINT,
    format VARCHAR,                         -- the profile name (or prometheus-text, openmetrics, prometheus-api)
    rows BIGINT,
    bad_lines BIGINT,
    t_min TIMESTAMP,
    t_max TIMESTAMP,
    time_source VARCHAR,                    -- metrics: where the scrape time came from
    ingested_at TIMESTAMP DEFAULT current_timestamp
);

CREATE TABLE IF NOT EXISTS requests (
    {", ".join(f"{name} {sqltype}" for name, sqltype in REQUEST_COLUMNS.items())}
);

CREATE TABLE IF NOT EXISTS metric_samples (
    run VARCHAR,
    source_id INTEGER,
    ts TIMESTAMP,
    name VARCHAR,                           -- normalised, suffix-free base name (e.g. vllm:kv_cache_usage_perc)
    name_raw VARCHAR,                       -- the sample name as exposed (e.g. vllm:gpu_cache_usage_perc)
    type VARCHAR,                           -- counter | gauge | histogram | summary | untyped
    series VARCHAR,                         -- value | bucket | sum | count | quantile
    le DOUBLE,                              -- bucket bound or quantile, else NULL
    labels MAP(VARCHAR, VARCHAR),
    value DOUBLE
);

CREATE TABLE IF NOT EXISTS ingest_errors (
    source_id INTEGER,
    path VARCHAR,
    line BIGINT,                            -- 1-based line number in the (decompressed) file
    byte_length BIGINT,
    reason VARCHAR,
    keys_seen VARCHAR,                      -- top-level keys of the line when it parsed as JSON
    excerpt VARCHAR                         -- first 200 bytes, redacted; only with --keep-text
);

-- Cumulative series (counters; histogram/summary buckets, sums and counts) as per-interval increases between
-- consecutive samples of one series. A drop means the process restarted: the increase after it is the new value
-- (counted from zero since the restart). The first sample of a series has no interval: increase NULL, not 0.
CREATE OR REPLACE VIEW metric_counter_increases AS
SELECT run, source_id, name, name_raw, type, series, le, labels,
       prev_ts, ts, date_diff('microsecond', prev_ts, ts) / 1e6 AS interval_s,
       prev_value, value,
       CASE WHEN prev_value IS NULL THEN NULL WHEN value < prev_value THEN value ELSE value - prev_value END AS increase,
       coalesce(value < prev_value, false) AS is_reset
FROM (
    SELECT *, lag(value) OVER w AS prev_value, lag(ts) OVER w AS prev_ts
    FROM metric_samples
    WHERE type = 'counter' OR (type IN ('histogram', 'summary') AND series IN ('bucket', 'sum', 'count'))
    -- value breaks a tie of one series at one instant (two samples of a source at the same ts): taken in rising
    -- order, simultaneous samples never make a reset, and the result no longer depends on the rows' physical order.
    WINDOW w AS (PARTITION BY run, name, series, le, labels ORDER BY ts, source_id, value)
);

-- One row per counter reset (restart) per series: the last sample before it and the first after it.
CREATE OR REPLACE VIEW metric_counter_resets AS
SELECT run, name, series, le, labels, prev_ts AS last_ts_before, ts AS first_ts_after, prev_value AS value_before,
       value AS value_after, source_id
FROM metric_counter_increases
WHERE is_reset;

-- One row per process restart seen in the counters: the resets that follow the same last scrape (per scrape target,
-- `instance` label when Prometheus added one). The restart happened in (last_ts_before, first_ts_after]; a series
-- first seen again later (no traffic yet) does not make a second restart.
CREATE OR REPLACE VIEW metric_restarts AS
SELECT run, labels['instance'] AS instance, last_ts_before, min(first_ts_after) AS first_ts_after,
       count(*) AS series_reset
FROM metric_counter_resets
GROUP BY run, labels['instance'], last_ts_before;
"""


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table of the current schema version (idempotent)."""
    con.execute(_DDL)
    con.execute(
        "INSERT INTO servlens_meta VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING",
        [str(SCHEMA_VERSION)],
    )


def schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The store's schema version, or None for an empty database."""
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'servlens_meta'"
    ).fetchone()[0]
    if not has_meta:
        return None
    row = con.execute("SELECT value FROM servlens_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None


# version -> SQL that migrates a store from that version to the next. Empty while there is one version.
MIGRATIONS: dict[int, str] = {}


MEMORY_LIMIT_ENV = "SERVLENS_MEMORY_LIMIT"
TEMP_DIR_ENV = "SERVLENS_TEMP_DIR"
DEFAULT_MEMORY_SHARE = 0.6  # the most a default limit takes of the RAM (or container limit)
# What a servlens command needs from DuckDB: a base for the store's working blocks and, per thread, room for the
# line reader's buffers (2 x 8 MiB), a hash table or sort run; the rest spills to the temp folder. On 2 cores:
# 768 MiB, so that the whole process (Python and its libraries: ~0.15 GB) stays near 1 GB whatever the input size.
DEFAULT_MEMORY_BASE_MIB = 512
DEFAULT_MEMORY_PER_THREAD_MIB = 128


def physical_memory_bytes() -> int | None:
    """RAM this process may use: the machine's, or a smaller cgroup (container) limit."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for cgroup in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(cgroup).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def default_memory_limit_mib(threads: int | None = None) -> int:
    """The default memory limit: what the work needs (DEFAULT_MEMORY_BASE_MIB plus DEFAULT_MEMORY_PER_THREAD_MIB
    per DuckDB thread, one per core), never more than 60% of the RAM or container limit (nor less than 256 MiB).
    Not a share of the RAM: DuckDB keeps what it may in memory, so with 60% of 24 GB `analyze` of 10M requests
    peaked at 12.9 GB and ran 58 times as long as at 1M (benchmarks/RESULTS.md)."""
    threads = threads or os.cpu_count() or 1
    wanted = DEFAULT_MEMORY_BASE_MIB + DEFAULT_MEMORY_PER_THREAD_MIB * threads
    total = physical_memory_bytes()
    if total:
        wanted = min(wanted, int(total * DEFAULT_MEMORY_SHARE) // (1 << 20))
    return max(256, wanted)


def store_config(in_memory: bool) -> dict[str, str]:
    """DuckDB settings for a store: a memory limit (SERVLENS_MEMORY_LIMIT, a DuckDB size such as '4GB' or '50%';
    default default_memory_limit_mib(): what the work needs, 768 MiB on 2 cores) and where to spill past it (SERVLENS_TEMP_DIR; default: next to an on-disk
    store, DuckDB's '<store>.tmp'; for an in-memory store a fresh folder in the system temp dir instead of DuckDB's
    '.tmp' in the working directory). DuckDB creates the folder only when it spills and removes it on close."""
    # Ingest numbers a file's lines by the order its rows are inserted in (ingest/compiler.py): DuckDB's default,
    # set here so that no other setting can quietly turn it off.
    config: dict[str, str] = {"preserve_insertion_order": "true"}
    limit = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if limit:
        config["memory_limit"] = limit
    else:
        config["memory_limit"] = f"{default_memory_limit_mib()}MiB"
    temp_root = os.environ.get(TEMP_DIR_ENV, "").strip()
    if temp_root or in_memory:
        root = Path(temp_root) if temp_root else Path(tempfile.gettempdir())
        config["temp_directory"] = str(root / f"servlens-spill-{os.getpid()}-{next(_spill_ids)}")
    return config


_spill_ids = itertools.count(1)


def open_store(path: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating or migrating) the store at `path`; None or ':memory:' gives a temporary in-memory store.

    Either way DuckDB works within a memory limit and spills past it to a temp folder (store_config)."""
    in_memory = path is None or str(path) == ":memory:"
    try:
        config = store_config(in_memory)
    except OSError:
        config = {}
    if in_memory:
        con = _connect(":memory:", False, config)
    else:
        path = Path(path)
        if read_only and not path.exists():
            raise InputError(f"No store at {path}", "Ingest something first with 'servlens ingest', or pass --db")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = _connect(str(path), read_only, config)
        except duckdb.IOException as exc:
            raise InputError(f"Cannot open the store {path}: {exc}", "Check the path, or that no other servlens holds it") from exc
    version = schema_version(con)
    if version is None:
        if read_only:
            raise InputError(f"{path} is not a servlens store", "Pass the store that 'servlens ingest' wrote")
        create_schema(con)
    elif version > SCHEMA_VERSION:
        raise InputError(
            f"The store {path} has schema version {version}, newer than this servlens understands ({SCHEMA_VERSION})",
            "Upgrade servlens",
        )
    elif version < SCHEMA_VERSION:
        for step in range(version, SCHEMA_VERSION):
            con.execute(MIGRATIONS[step])
        con.execute("UPDATE servlens_meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
    if version is not None and not read_only:
        # The views carry no data: an older store gets this release's definitions (create_schema replaces them).
        con.execute(_DDL[_DDL.index("CREATE OR REPLACE VIEW metric_counter_increases"):])
    return con


def _connect(database: str, read_only: bool, config: dict[str, str]) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(database, read_only=read_only, config=config)
    except (duckdb.InvalidInputException, duckdb.ParserException) as exc:
        if os.environ.get(MEMORY_LIMIT_ENV, "").strip() and "memory" in str(exc).lower():
            raise InputError(f"{MEMORY_LIMIT_ENV}={os.environ[MEMORY_LIMIT_ENV]!r} is not a memory size DuckDB takes",
                             "Use a size such as 4GB or 512MiB, or a share such as 50%") from exc
        raise
