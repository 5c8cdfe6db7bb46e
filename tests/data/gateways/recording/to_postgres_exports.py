"""Turn recorded SpendLogsPayload dicts (what the LiteLLM proxy hands Prisma for LiteLLM_SpendLogs) into the two
exports an operator makes from Postgres:

  litellm_spendlogs.csv    \\copy "LiteLLM_SpendLogs" TO 'litellm_spendlogs.csv' WITH (FORMAT csv, HEADER)
  litellm_spendlogs.jsonl  \\copy (SELECT row_to_json(t) FROM "LiteLLM_SpendLogs" t) TO 'litellm_spendlogs.jsonl'

Postgres renders what Prisma stored: DateTime columns are timestamp(3) without time zone holding UTC (rounded to the
millisecond, trailing zeros dropped), Json columns are jsonb (keys ordered by length then bytes, ", " and ": "
separators), NULL is an empty unquoted CSV field and an empty string is "". Column order follows schema.prisma.
Usage: python to_postgres_exports.py spendlogs_payloads.jsonl OUT_DIR  (writes all three)
"""
import csv
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

COLUMNS = ["request_id", "call_type", "api_key", "spend", "total_tokens", "prompt_tokens", "completion_tokens",
           "startTime", "endTime", "request_duration_ms", "completionStartTime", "model", "model_id", "model_group",
           "custom_llm_provider", "api_base", "user", "metadata", "cache_hit", "cache_key", "request_tags", "team_id",
           "organization_id", "end_user", "requester_ip_address", "messages", "response", "session_id", "status",
           "mcp_namespaced_tool_name", "billing_agent_id", "agent_id", "proxy_server_request", "litellm_call_id",
           "created_at", "updated_at"]
JSON_COLUMNS = {"metadata", "request_tags", "messages", "response", "proxy_server_request"}
TIME_COLUMNS = {"startTime", "endTime", "completionStartTime", "created_at", "updated_at"}


def jsonb_order(value):
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [jsonb_order(v) for v in value]
    return value


def jsonb_text(value) -> str:
    return json.dumps(jsonb_order(value), ensure_ascii=False, separators=(", ", ": "))


def ts3(value: str) -> datetime:
    """timestamp(3): UTC, rounded to the millisecond."""
    t = datetime.fromisoformat(value).astimezone(timezone.utc).replace(tzinfo=None)
    ms = round(t.microsecond / 1000)
    return t.replace(microsecond=0) + timedelta(milliseconds=ms)


def pg_ts_text(t: datetime, sep: str) -> str:
    text = t.strftime(f"%Y-%m-%d{sep}%H:%M:%S")
    if t.microsecond:
        text += ("." + f"{t.microsecond:06d}").rstrip("0")
    return text


def pg_float(x: float) -> str:
    return "0" if x == 0 else repr(float(x))


def main(src: str, out_dir: str) -> None:
    rows = [json.loads(line) for line in open(src, encoding="utf-8")]
    out = Path(out_dir)
    with open(out / "litellm_spendlogs.csv", "w", newline="", encoding="utf-8") as f_csv, \
            open(out / "litellm_spendlogs.jsonl", "w", encoding="utf-8") as f_json:
        w = csv.writer(f_csv, lineterminator="\n")
        w.writerow(COLUMNS)
        for row in rows:
            # Prisma fills created_at/updated_at with now() when the batch is written (a few seconds later).
            row = dict(row)
            row["created_at"] = row["updated_at"] = (ts3(row["endTime"]) + timedelta(seconds=5)).isoformat()
            csv_fields, json_obj = [], {}
            for col in COLUMNS:
                value = row.get(col)
                if col in JSON_COLUMNS and value is not None:
                    parsed = json.loads(value) if isinstance(value, str) else value
                    csv_fields.append(jsonb_text(parsed))
                    json_obj[col] = jsonb_order(parsed)
                elif col in TIME_COLUMNS and value is not None:
                    t = ts3(value)
                    csv_fields.append(pg_ts_text(t, " "))
                    json_obj[col] = pg_ts_text(t, "T")
                elif col == "spend":
                    csv_fields.append(pg_float(value or 0.0))
                    json_obj[col] = value or 0.0
                else:
                    csv_fields.append(None if value is None else str(value))
                    json_obj[col] = value
            # csv.writer writes None as an empty field and "" as an empty field too: Postgres quotes "".
            line = []
            for value in csv_fields:
                if value is None:
                    line.append("")
                elif value == "":
                    line.append('""')
                elif any(c in value for c in ',"\n\r'):
                    line.append('"' + value.replace('"', '""') + '"')
                else:
                    line.append(value)
            f_csv.write(",".join(line) + "\n")
            # row_to_json: no spaces at the top level; jsonb values keep their own text form.
            parts = []
            for col in COLUMNS:
                v = json_obj[col]
                text = jsonb_text(v) if col in JSON_COLUMNS and v is not None else json.dumps(v, ensure_ascii=False)
                if col == "spend":
                    text = pg_float(v)
                parts.append(json.dumps(col) + ":" + text)
            f_json.write("{" + ",".join(parts) + "}\n")


def api_json(rows: list, out: Path) -> None:
    listed = []
    for row in sorted(rows, key=lambda r: ts3(r["startTime"]), reverse=True):
        item = {}
        for col in COLUMNS:
            value = row.get(col)
            if col in ("created_at", "updated_at"):
                value = (ts3(row["endTime"]) + timedelta(seconds=5)).isoformat()
            if col in JSON_COLUMNS and value is not None:
                value = jsonb_order(json.loads(value) if isinstance(value, str) else value)
            elif col in TIME_COLUMNS and value is not None:
                value = ts3(value).replace(tzinfo=timezone.utc).isoformat()
            elif col == "spend":
                value = float(value or 0.0)
            item[col] = value
        listed.append(item)
    (out / "litellm_spendlogs_api.json").write_text(json.dumps(listed, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    api_json([json.loads(line) for line in open(sys.argv[1], encoding="utf-8")], Path(sys.argv[2]))
