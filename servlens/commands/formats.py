"""`servlens formats`: the formats servlens reads and which canonical columns each fills."""

from __future__ import annotations

import json

import click

from servlens.commands._common import write_output

# Metrics formats are read by servlens.ingest.metrics (Prometheus exposition parser, not a profile).
METRICS_FORMATS = [
    ("prometheus-text", "Prometheus text exposition 0.0.4 scrape (one file per scrape; .prom/.txt, .gz/.zst)"),
    ("openmetrics", "OpenMetrics 1.0 scrape (one file per scrape)"),
    ("prometheus-api", "Prometheus HTTP API query / query_range JSON answer"),
    ("scrape-index", "an index (JSON lines of file, scrape_ts[, run]) naming scrape files: gives their times and runs"),
]


@click.command(short_help="List the formats servlens reads and the columns each fills.")
@click.option("--profile", "profile_file", default=None, type=click.Path(dir_okay=False),
              help="Also check and show this profile file of your own.")
@click.option("--verbose", "-v", is_flag=True, help="Show each profile's detection rules and units.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write to this file.")
def formats(profile_file, verbose, output_format, out):
    """List the request-log format profiles (name for --from), what each reads, and which canonical columns it
    fills (mapped, or derived at ingest), then the metrics formats.

    \b
    Example:
        servlens formats
        servlens formats --verbose --profile my-gateway.toml
    """
    from servlens.ingest.compiler import filled_columns
    from servlens.ingest.profiles import builtin_profiles, load_profile_file

    profiles = builtin_profiles()
    if profile_file:
        profiles.append(load_profile_file(profile_file))
    entries = []
    for profile in profiles:
        entries.append({
            "name": profile.name,
            "kind": "requests",
            "title": profile.title,
            "reader": profile.reader,
            "clock": profile.clock,
            "builtin": profile.builtin,
            "path": profile.path,
            "columns": filled_columns(profile),
            "detect": {"must": profile.detect_must, "may": profile.detect_may, "must_not": profile.detect_must_not,
                       "columns": profile.detect_columns, "filename": profile.detect_filename},
            "units": profile.units,
        })
    for name, title in METRICS_FORMATS:
        entries.append({"name": name, "kind": "metrics", "title": title})
    if output_format == "json":
        write_output(json.dumps({"formats": entries}, indent=2), out)
        return
    lines = ["Request-log formats (servlens ingest --from NAME):", ""]
    for entry in entries:
        if entry["kind"] != "requests":
            continue
        origin = "" if entry["builtin"] else f"  (from {entry['path']})"
        clock = "" if entry["clock"] == "absolute" else f", {entry['clock']} clock"
        lines.append(f"{entry['name']}  [{entry['reader']}{clock}]{origin}")
        lines.append(f"  {entry['title']}")
        lines.append(f"  fills: {', '.join(c for c in entry['columns'] if c not in ('run', 'source_id', 'source_line'))}")
        if verbose:
            detect = entry["detect"]
            if detect["must"]:
                lines.append(f"  detect: must {', '.join(detect['must'])}"
                             + (f"; must not {', '.join(detect['must_not'])}" if detect["must_not"] else ""))
            if detect["columns"]:
                lines.append(f"  detect: CSV columns {', '.join(detect['columns'])}")
            for column, unit in entry["units"].items():
                lines.append(f"    {column}: {unit}")
        lines.append("")
    from servlens.ingest.profiles import WRAPPERS

    lines.append("Log-store wrappers (found by sniffing; every request-log format is read inside each):")
    lines.append("")
    for wrapper in WRAPPERS:
        lines.append(f"{wrapper.name}  {wrapper.title}")
    lines.append("")
    lines.append("Metrics formats (routed automatically, or servlens ingest --metrics PATH):")
    lines.append("")
    for name, title in METRICS_FORMATS:
        lines.append(f"{name}  {title}")
    write_output("\n".join(lines), out)
