"""Documented SQL views that put stores servlens did not write into the canonical `requests` columns, so the rules
run on them in place (each file cites the vendor migration it was written from):

- langfuse_observations: Langfuse's ClickHouse `observations` table (GENERATION observations);
- helicone_request_response_rmt: Helicone's ClickHouse `request_response_rmt` table.

Create one next to the vendor table (`CREATE VIEW servlens.requests AS <view_sql(name)>`) and point servlens at it:
`--engine clickhouse://HOST:8123/servlens --table servlens.requests`. A Parquet export needs no view: it is canonical.
"""

from __future__ import annotations

import importlib.resources

from servlens.errors import ConfigError

VIEWS = {
    "langfuse_observations": "Langfuse observations (ClickHouse), GENERATION rows",
    "helicone_request_response_rmt": "Helicone request_response_rmt (ClickHouse)",
}


def view_sql(name: str) -> str:
    """The view's SELECT (ClickHouse SQL), with its header comment."""
    if name not in VIEWS:
        raise ConfigError(f"No view named {name!r}", "Views: " + ", ".join(VIEWS))
    return importlib.resources.files("servlens.engines").joinpath("views", f"{name}.sql").read_text()
