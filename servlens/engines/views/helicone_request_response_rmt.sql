-- servlens canonical `requests` over Helicone's ClickHouse `request_response_rmt` table (ClickHouse SQL).
--
-- Source schema: Helicone/helicone clickhouse/migrations/20200101000041_request_response_replacing_merge_tree.sql
-- @9b86b1057037dba4703657c74cf7eb168ab05947, plus schema_43_cache_tokens.sql @178fe9f4e850317e9f1ec712b0a7787e21a400e6
-- (prompt_cache_write_tokens / prompt_cache_read_tokens, `Int64 DEFAULT 0`) and
-- schema_47_cache_to_request_response_rmt.sql @dfec6fb56648011f91eb0266351d1e4a25003323 (cache_reference_id,
-- cache_enabled). A ReplacingMergeTree(updated_at): the latest version of a request wins (LIMIT 1 BY request_id).
-- Raw columns are read as h.<column>: ClickHouse lets an output alias (status, model) shadow a column of that name.
--
-- Create it next to the table:   CREATE VIEW servlens.requests AS <this file>
--
-- Mapping (unknown is not zero; field semantics from docs/reference gateways.md section 4):
--   run            = toString(organization_id) (edit to cut runs by a property, e.g. properties['Helicone-Session-Id'])
--   t_arrival      = request_created_at; t_end = response_created_at (NULL while pending)
--   e2e_s          = latency / 1000 (ms); ttft_s = time_to_first_token / 1000 (Nullable(Int64), ms)
--   http_status    = status when it is an HTTP code (Helicone writes negative codes for pending/cancelled: NULL here)
--   cached_tokens  = prompt_cache_read_tokens, NULL when 0: the column defaults to 0 for providers that report
--                    nothing, so a 0 is not a measured zero (the cache rule is then not evaluable, never clear)
--   cache_hit      = cache_reference_id is a real request id (Helicone's own cache served it)
--   finish_reason  = response_body's choices[1].finish_reason (bodies expire after 3 months or live in object
--                    storage: '' reads as NULL)
--   deployment     = target_url; model = model (the requested model)
SELECT
    toString(h.organization_id) AS run,
    CAST(NULL AS Nullable(Int32)) AS source_id,
    CAST(NULL AS Nullable(Int64)) AS source_line,
    toString(h.request_id) AS request_id,
    CAST(NULL AS Nullable(String)) AS trace_id,
    CAST(NULL AS Nullable(Int32)) AS attempt,
    CAST(NULL AS Nullable(String)) AS fallback_from,
    nullIf(h.model, '') AS model,
    CAST(NULL AS Nullable(String)) AS served_model,
    nullIf(h.provider, '') AS provider,
    h.target_url AS deployment,
    CAST(NULL AS Nullable(String)) AS endpoint,
    CAST(NULL AS Nullable(Bool)) AS stream,
    toDateTime64(h.request_created_at, 6, 'UTC') AS t_arrival,
    CAST(if(h.time_to_first_token IS NULL, NULL,
            h.request_created_at + toIntervalMillisecond(h.time_to_first_token)) AS Nullable(DateTime64(6, 'UTC'))) AS t_first_token,
    CAST(h.response_created_at AS Nullable(DateTime64(6, 'UTC'))) AS t_end,
    CAST(NULL AS Nullable(Float64)) AS queue_s,
    CAST(NULL AS Nullable(Float64)) AS prefill_s,
    h.time_to_first_token / 1000 AS ttft_s,
    CAST(NULL AS Nullable(Float64)) AS first_content_s,
    CAST(NULL AS Nullable(Float64)) AS tpot_s,
    CAST(NULL AS Nullable(Float64)) AS decode_s,
    h.latency / 1000 AS e2e_s,
    h.prompt_tokens AS prompt_tokens,
    nullIf(h.prompt_cache_read_tokens, 0) AS cached_tokens,
    h.completion_tokens AS completion_tokens,
    CAST(NULL AS Nullable(Int64)) AS reasoning_tokens,
    JSONExtract(h.request_body, 'max_tokens', 'Nullable(Int64)') AS max_tokens,
    CAST(NULL AS Nullable(Int64)) AS context_window,
    multiIf(h.status >= 400, 'error', nullIf(JSONExtractString(h.response_body, 'choices', 1, 'finish_reason'), '')) AS finish_reason,
    nullIf(JSONExtractString(h.response_body, 'choices', 1, 'finish_reason'), '') AS finish_reason_raw,
    multiIf(h.status >= 400, 'error', h.status >= 200, 'ok', NULL) AS status,
    if(h.status >= 100, toInt32(h.status), NULL) AS http_status,
    CAST(NULL AS Nullable(String)) AS error_type,
    if(h.status >= 400, nullIf(JSONExtractString(h.response_body, 'error', 'message'), ''), NULL) AS error_message,
    CAST(h.cache_reference_id != toUUID('00000000-0000-0000-0000-000000000000') AS Bool) AS cache_hit,
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
    SELECT * FROM request_response_rmt
    ORDER BY updated_at DESC
    LIMIT 1 BY request_id
) AS h
