-- servlens canonical `requests` over Langfuse's ClickHouse `observations` table (ClickHouse SQL).
--
-- Source schema: langfuse/langfuse packages/shared/clickhouse/migrations/unclustered/0002_observations.up.sql
-- @daddc935535ebdb6b8f167da85540c2fa982bcce, plus 0008_add_environments_column.up.sql @84e2afe7ff37655b1e394ff68488630d2cb98427
-- (`environment`). Read path: packages/shared/src/server/repositories/observations.ts @000d3de8 reads the latest
-- version of a row with `ORDER BY event_ts DESC LIMIT 1 BY id, project_id` (a ReplacingMergeTree keeps several
-- until it merges); this view does the same, then drops deleted rows.
--
-- Create it next to the table:   CREATE VIEW servlens.requests AS <this file>
-- then:   servlens analyze --engine clickhouse://HOST:8123/servlens --table servlens.requests --run production
--
-- Mapping (DESIGN: unknown is not zero; Langfuse traps from docs/reference gateways.md 3.3):
--   run            = environment (edit to cut runs by release, project or day)
--   one request    = a GENERATION observation
--   prompt_tokens  = usage_details['input'] + every other input_* key (Langfuse subtracts cached and other details
--                    from `input`), NULL when `input` is absent, and NULL on a failed (ERROR) generation whose
--                    usage is 0, not measured
--   completion_tokens likewise from `output` and output_*; cached_tokens = input_cached_tokens (SDK) or
--                    input_cache_read (OTel); reasoning_tokens = output_reasoning_tokens or output_reasoning
--   failed         = level 'ERROR' (status 'error', error_message = status_message); Langfuse has no finish_reason
--   ttft_s / e2e_s = completion_start_time / end_time minus start_time (DateTime64(3): millisecond resolution)
--   max_tokens     = model_parameters' max_tokens (a number or a string there)
SELECT
    environment AS run,
    CAST(NULL AS Nullable(Int32)) AS source_id,
    CAST(NULL AS Nullable(Int64)) AS source_line,
    id AS request_id,
    trace_id AS trace_id,
    CAST(NULL AS Nullable(Int32)) AS attempt,
    CAST(NULL AS Nullable(String)) AS fallback_from,
    provided_model_name AS model,
    CAST(NULL AS Nullable(String)) AS served_model,
    CAST(NULL AS Nullable(String)) AS provider,
    CAST(NULL AS Nullable(String)) AS deployment,
    CAST(NULL AS Nullable(String)) AS endpoint,
    CAST(NULL AS Nullable(Bool)) AS stream,
    toDateTime64(start_time, 6, 'UTC') AS t_arrival,
    CAST(completion_start_time AS Nullable(DateTime64(6, 'UTC'))) AS t_first_token,
    CAST(end_time AS Nullable(DateTime64(6, 'UTC'))) AS t_end,
    CAST(NULL AS Nullable(Float64)) AS queue_s,
    CAST(NULL AS Nullable(Float64)) AS prefill_s,
    dateDiff('millisecond', start_time, completion_start_time) / 1000 AS ttft_s,
    CAST(NULL AS Nullable(Float64)) AS first_content_s,
    CAST(NULL AS Nullable(Float64)) AS tpot_s,
    dateDiff('millisecond', completion_start_time, end_time) / 1000 AS decode_s,
    dateDiff('millisecond', start_time, end_time) / 1000 AS e2e_s,
    if(mapContains(usage_details, 'input') AND NOT (level = 'ERROR' AND usage_details['input'] = 0),
       toInt64(arraySum(mapValues(mapFilter((k, v) -> startsWith(k, 'input'), usage_details)))), NULL) AS prompt_tokens,
    multiIf(mapContains(usage_details, 'input_cached_tokens'), toInt64(usage_details['input_cached_tokens']),
            mapContains(usage_details, 'input_cache_read'), toInt64(usage_details['input_cache_read']), NULL) AS cached_tokens,
    if(mapContains(usage_details, 'output') AND NOT (level = 'ERROR' AND usage_details['output'] = 0),
       toInt64(arraySum(mapValues(mapFilter((k, v) -> startsWith(k, 'output'), usage_details)))), NULL) AS completion_tokens,
    multiIf(mapContains(usage_details, 'output_reasoning_tokens'), toInt64(usage_details['output_reasoning_tokens']),
            mapContains(usage_details, 'output_reasoning'), toInt64(usage_details['output_reasoning']), NULL) AS reasoning_tokens,
    coalesce(JSONExtract(coalesce(model_parameters, ''), 'max_tokens', 'Nullable(Int64)'),
             toInt64OrNull(JSONExtractString(coalesce(model_parameters, ''), 'max_tokens'))) AS max_tokens,
    CAST(NULL AS Nullable(Int64)) AS context_window,
    if(level = 'ERROR', 'error', NULL) AS finish_reason,
    CAST(NULL AS Nullable(String)) AS finish_reason_raw,
    if(level = 'ERROR', 'error', if(end_time IS NULL, NULL, 'ok')) AS status,
    CAST(NULL AS Nullable(Int32)) AS http_status,
    CAST(NULL AS Nullable(String)) AS error_type,
    if(level = 'ERROR', status_message, NULL) AS error_message,
    CAST(NULL AS Nullable(Bool)) AS cache_hit,
    CAST(NULL AS Nullable(String)) AS prefix_key,
    CAST(NULL AS Nullable(Bool)) AS content_empty,
    CAST(NULL AS Nullable(Bool)) AS content_has_reasoning_marker,
    CAST(NULL AS Nullable(Bool)) AS reasoning_present,
    CAST(NULL AS Nullable(Bool)) AS reasoning_has_marker,
    CAST(NULL AS Nullable(String)) AS attrs,
    CAST(NULL AS Nullable(String)) AS prompt_text,
    CAST(NULL AS Nullable(String)) AS content_text,
    CAST(NULL AS Nullable(String)) AS reasoning_text
FROM (
    SELECT * FROM observations
    WHERE type = 'GENERATION'
    ORDER BY event_ts DESC
    LIMIT 1 BY id, project_id
)
WHERE is_deleted = 0
