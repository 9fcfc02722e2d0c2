"""``draftgate endpoints``: the speculation records, read from the store or through a
gateway (``--probe`` runs the probes first)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import typer

from gateway.cli.gateway_client import (
    API_KEY,
    BASE_URL,
    CONFIG,
    auth_headers,
    gateway_url,
    get_records,
    ms,
    settings_of,
)


async def _stored_records(settings: Any) -> list[dict[str, Any]]:
    from gateway.records.service import Records
    from gateway.records.store import open_record_store

    store = open_record_store(settings.redis.url, prefix=settings.redis.prefix)
    try:
        records = await Records(settings.endpoints, store).records()
    finally:
        await store.aclose()
    return [r.model_dump(mode="json") for r in records]


def _print_records(records: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="speculation records (latency: last hour)")
    for col in (
        "endpoint",
        "kind",
        "documented",
        "enabled",
        "evidence",
        "prefix cache",
        "TTFT p50/p95 ms",
        "TPOT p50/p95 ms",
        "requests",
    ):
        table.add_column(col)
    now = time.time()
    for r in records:
        doc = r.get("documented") or {}
        documented = f"prediction: {doc.get('accepts_prediction', '?')}" + (
            f" ({doc.get('provider')})" if doc else ""
        )
        basis = r.get("enabled_evidence") or (r.get("evidence") or [None])[0]
        evidence = (
            f"{basis['kind']}: {basis['detail']} ({(now - basis['observed_at']) / 60:.0f} min ago)"
            if basis
            else "none yet"
        )
        prefix = r.get("prefix_cache_evidence")
        lat = r.get("latency") or {}
        table.add_row(
            r["name"],
            r["kind"],
            documented,
            r["enabled"],
            evidence,
            r.get("prefix_cache", "unknown") + (f" ({prefix['detail']})" if prefix else ""),
            f"{ms(lat.get('ttft_p50'))}/{ms(lat.get('ttft_p95'))}",
            f"{ms(lat.get('tpot_p50'))}/{ms(lat.get('tpot_p95'))}",
            str(lat.get("requests", 0)),
        )
    Console().print(table)


def endpoints_command(
    json_out: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    probe: bool = typer.Option(False, "--probe", help="Run the probes first (through a gateway)."),
    config: Path | None = CONFIG,
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Per endpoint: speculation documented, enabled (with evidence), p50/p95 TTFT and TPOT."""
    settings = None if base_url else settings_of(config)
    if base_url or probe:
        with gateway_url(settings, base_url) as url:
            records = get_records(url, auth_headers(settings, api_key), probe)
    else:
        records = asyncio.run(_stored_records(settings))
    if json_out:
        typer.echo(json.dumps(records, indent=2))
    else:
        _print_records(records)
