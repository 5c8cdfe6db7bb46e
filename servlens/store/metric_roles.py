"""The metric-roles table: which engine metric plays which role, read from metric_roles.toml (its format is at its
top). Rules read it as the `metric_roles` table (and `scope_role_samples`, the scope's samples with their role);
workload and the Prometheus pull read it through `names()` and `groups()`.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from dataclasses import dataclass
from functools import lru_cache

import duckdb

from servlens.errors import ConfigError

KINDS = ("gauge", "counter", "histogram", "info")
_KEYS = ("role", "engine", "name", "kind", "source", "group", "labels")
_REQUIRED = ("role", "engine", "name", "kind", "source")


@dataclass(frozen=True)
class MetricRole:
    role: str
    engine: str
    name: str
    kind: str
    source: str
    group: str
    # a label the series must carry to play the role (Triton's nv_trt_llm_request_metrics{request_type="waiting"}):
    # (key, value), or None for every series of the name
    label: tuple[str, str] | None = None


def parse_roles(data: dict, where: str) -> tuple[MetricRole, ...]:
    """Validated rows of a parsed metric_roles.toml; every error names the row and the key."""
    rows, seen = [], set()
    for index, spec in enumerate(data.get("role", [])):
        at = f"{where}: role[{index}]"
        for key in spec:
            if key not in _KEYS:
                raise ConfigError(f"{at}: unknown key '{key}'", "Allowed: " + ", ".join(_KEYS))
        for key in _REQUIRED:
            if not (isinstance(spec.get(key), str) and spec[key].strip()):
                raise ConfigError(f"{at}: {key} is missing", "Give " + ", ".join(_REQUIRED))
        if spec["kind"] not in KINDS:
            raise ConfigError(f"{at}: kind '{spec['kind']}' is not a kind", "Allowed: " + ", ".join(KINDS))
        labels = spec.get("labels")
        if labels is not None and not (isinstance(labels, dict) and len(labels) == 1
                                       and all(isinstance(v, str) for v in labels.values())):
            raise ConfigError(f"{at}: labels must be one label = value", 'e.g. labels = {request_type = "waiting"}')
        label = next(iter(labels.items())) if labels else None
        if (spec["role"], spec["name"], label) in seen:
            raise ConfigError(f"{at}: {spec['name']} is listed twice for role {spec['role']}", "Keep one row")
        seen.add((spec["role"], spec["name"], label))
        rows.append(MetricRole(spec["role"], spec["engine"], spec["name"], spec["kind"], spec["source"],
                               spec.get("group", spec["role"]), label))
    return tuple(rows)


@lru_cache(maxsize=1)
def load_roles() -> tuple[MetricRole, ...]:
    resource = importlib.resources.files("servlens.store") / "metric_roles.toml"
    return parse_roles(tomllib.loads(resource.read_text(encoding="utf-8")), "servlens/store/metric_roles.toml")


def names(role: str) -> tuple[str, ...]:
    """The metric names of a role, in the file's order (the first present is the one to read)."""
    found = tuple(r.name for r in load_roles() if r.role == role)
    if not found:
        raise ConfigError(f"No metric role '{role}' in servlens/store/metric_roles.toml",
                          "Roles: " + ", ".join(sorted({r.role for r in load_roles()})))
    return found


def roles() -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.role for r in load_roles()))


def groups() -> dict[str, tuple[str, ...]]:
    """Pull group -> every metric name in it."""
    out: dict[str, list[str]] = {}
    for row in load_roles():
        out.setdefault(row.group, []).append(row.name)
    return {group: tuple(found) for group, found in out.items()}


def install(con: duckdb.DuckDBPyConnection) -> None:
    """The `metric_roles` temp table on `con` (a temp table, so a read-only store gets it too); idempotent."""
    try:  # a probe, not a catalog listing: this runs once per scope
        con.execute("SELECT 1 FROM temp.metric_roles LIMIT 0")
        return
    except duckdb.CatalogException:
        pass
    con.execute("CREATE TEMP TABLE metric_roles (role VARCHAR, engine VARCHAR, name VARCHAR, kind VARCHAR, "
                "pull_group VARCHAR, preference INTEGER, label_key VARCHAR, label_value VARCHAR)")
    con.executemany("INSERT INTO metric_roles VALUES (?, ?, ?, ?, ?, ?, ?, ?)", table_rows())


def table_rows() -> list[list]:
    """The rows of the `metric_roles` table: role, engine, name, kind, pull_group, preference (1 = the first name of
    its role in the file), label_key, label_value (NULL: any series of the name)."""
    rows, order = [], {}
    for row in load_roles():
        order[row.role] = order.get(row.role, 0) + 1
        key, value = row.label or (None, None)
        rows.append([row.role, row.engine, row.name, row.kind, row.group, order[row.role], key, value])
    return rows


# How a sample `m` plays a role `r`: its name, and the role's label when it names one.
ROLE_JOIN_SQL = "r.name = m.name AND (r.label_key IS NULL OR m.labels[r.label_key] = r.label_value)"
