"""``draftgate endpoints`` (speculation records) and ``draftgate audit`` (latency audits).

Both talk HTTP to a gateway: ``--base-url`` of a running one, or the gateway built from
the configuration and served on a free loopback port in a background thread (so TTFT is
measured over real streaming HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sdk.wire.audits import AuditSummary
from sdk.wire.endpoints import AuditRequest, AuditResult
from sdk.wire.evidence import Evidence

if TYPE_CHECKING:
    from gateway.audit.runner import AuditPlan, MemoryReader

CONFIG = typer.Option(
    None, "--config", help="draftgate.toml (default: ./draftgate.toml or built-in)."
)
BASE_URL = typer.Option(
    None, "--base-url", help="A running gateway (default: start one in-process)."
)
API_KEY = typer.Option(None, "--api-key", envvar="DRAFTGATE_API_KEY", help="Gateway API key.")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _settings(config: Path | None) -> Any:
    from gateway.config import ConfigError, load_settings

    try:
        return load_settings(config)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


def _headers(settings: Any, api_key: str | None) -> dict[str, str]:
    """The caller's key, else (in-process gateway) the first configured admin key (audits
    and probes need one), else the first key."""
    key = api_key
    if key is None and settings is not None and settings.keys:
        entry = next((k for k in settings.keys if k.admin), settings.keys[0])
        key = os.environ.get(entry.key_env)
    return {"authorization": f"Bearer {key}"} if key else {}


@contextlib.contextmanager
def _gateway(settings: Any, base_url: str | None) -> Iterator[str]:
    """The gateway's root URL: ``base_url``, or an in-process gateway served meanwhile."""
    if base_url:
        yield base_url.rstrip("/")
        return
    from gateway.app import create_app
    from gateway.audit.serve import serve_in_thread

    with serve_in_thread(create_app(settings)) as url:
        yield url


def _get_records(url: str, headers: dict[str, str], probe: bool) -> list[dict[str, Any]]:
    import httpx

    method, path = ("POST", "/v1/endpoints/probe") if probe else ("GET", "/v1/endpoints")
    try:
        body: dict[str, object] | None = (
            {} if probe else None
        )  # POSTs carry a JSON body (the gateway refuses others)
        resp = httpx.request(method, f"{url}{path}", headers=headers, json=body, timeout=300)
    except httpx.HTTPError as exc:
        raise _fail(f"gateway unreachable at {url}: {type(exc).__name__}", 1) from None
    if resp.status_code != 200:
        raise _fail(f"{method} {path} answered {resp.status_code}: {resp.text[:300]}", 1)
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


async def _stored_records(settings: Any) -> list[dict[str, Any]]:
    from gateway.records.service import Records
    from gateway.records.store import open_record_store

    store = open_record_store(settings.redis.url, prefix=settings.redis.prefix)
    try:
        records = await Records(settings.endpoints, store).records()
    finally:
        await store.aclose()
    return [r.model_dump(mode="json") for r in records]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


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
            f"{_ms(lat.get('ttft_p50'))}/{_ms(lat.get('ttft_p95'))}",
            f"{_ms(lat.get('tpot_p50'))}/{_ms(lat.get('tpot_p95'))}",
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
    settings = None if base_url else _settings(config)
    if base_url or probe:
        with _gateway(settings, base_url) as url:
            records = _get_records(url, _headers(settings, api_key), probe)
    else:
        records = asyncio.run(_stored_records(settings))
    if json_out:
        typer.echo(json.dumps(records, indent=2))
    else:
        _print_records(records)


def _parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise _fail(f"--concurrency takes integers like 1,4,16, not {text!r}") from None
    return levels


def _parse_sweep(text: str | None) -> dict[str, list[float]]:
    if not text:
        return {}
    name, _, values = text.partition("=")
    try:
        return {name.strip(): [float(v) for v in values.split(",") if v.strip()]}
    except ValueError:
        raise _fail(
            f"--sweep takes NAME=V1,V2,... (e.g. temperature=0,0.7), not {text!r}"
        ) from None


def _endpoint_of(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for r in records:
        if r["name"] == name:
            return r
    raise _fail(f"no endpoint named {name!r} (have: {', '.join(r['name'] for r in records)})")


async def _store_evidence(settings: Any, endpoint: str, evidence: Evidence) -> str:
    from gateway.records.store import open_record_store
    from lookup.corpus.errors import StoreUnavailable

    if settings is None or settings.redis.url is None:
        return "record not updated: no shared store (configure Redis, or use POST /v1/audits)"
    store = open_record_store(settings.redis.url, prefix=settings.redis.prefix)
    try:
        await store.add_evidence(endpoint, evidence)
    except StoreUnavailable as exc:
        return f"record not updated: {exc}"
    finally:
        await store.aclose()
    return "record updated in Redis"


def _levels_table(s: AuditSummary) -> Any:
    """Each concurrency level side by side: throughput, TTFT/TPOT/E2E p50 and p99 per config."""
    from rich.table import Table

    table = Table(title="by concurrency level (all categories; ms)")
    columns = ("config", "conc", "tok/s (run)", "TTFT p50/p99", "TPOT p50/p99", "E2E p50/p99")
    for col in (*columns, f"same as baseline at c={min(s.plan.concurrency)}"):
        table.add_column(col)
    walls = {(lv.concurrency, lv.setting): lv.wall_s for lv in s.levels}
    same = {(i.config, i.setting, i.concurrency): i for i in s.identical_to_first_level}
    for g in sorted(s.all_categories(), key=lambda g: (g.config, g.setting, g.concurrency)):
        wall = walls.get((g.concurrency, g.setting))
        identity = same.get((g.config, g.setting, g.concurrency))
        table.add_row(
            g.config if g.setting == "default" else f"{g.config} {g.setting}",
            str(g.concurrency),
            f"{g.output_tokens / wall:.1f}" if wall else "-",
            f"{_ms(g.ttft_s.p50)}/{_ms(g.ttft_s.p99)}",
            f"{_ms(g.tpot_s.p50)}/{_ms(g.tpot_s.p99)}",
            f"{_ms(g.e2e_s.p50)}/{_ms(g.e2e_s.p99)}",
            f"{identity.identical}/{identity.pairs}" if identity else "-",
        )
    return table


def _memory_table(memory: dict[str, Any]) -> Any:
    """Every part the engine's ``memory()`` reports."""
    from rich.table import Table

    table = Table(title="memory (local endpoint)")
    table.add_column("part")
    table.add_column("value", justify="right")
    for part, value in memory.items():
        table.add_row(part, f"{value:,}" if isinstance(value, int) else str(value))
    return table


def _print_summary(result: AuditResult, written: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result.summary
    console = Console()
    formulas = Table(title="metrics and formulas", show_header=False)
    for name, formula in s.formulas.items():
        formulas.add_row(name, formula)
    console.print(formulas)
    table = Table(title=f"audit of {result.endpoint} (all categories)")
    for col in (
        "config",
        "setting",
        "conc",
        "n",
        "err",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "ITL p50 ms",
        "E2E p50 ms",
        "tok/s",
    ):
        table.add_column(col)
    for g in s.all_categories():
        table.add_row(
            g.config,
            g.setting,
            str(g.concurrency),
            str(g.requests),
            str(sum(g.errors.values())),
            _ms(g.ttft_s.p50),
            _ms(g.tpot_s.p50),
            _ms(g.itl_s.p50),
            _ms(g.e2e_s.p50),
            "-" if g.output_tok_s is None else f"{g.output_tok_s:.1f}",
        )
    console.print(table)
    if len(s.plan.concurrency) > 1:
        console.print(_levels_table(s))
    speedups = {(x.category, x.config, x.concurrency, x.setting): x.speedup for x in s.speedup}
    for b in s.break_even:
        speed = speedups.get((b.category, b.config, b.concurrency, b.setting))
        shown = "-" if speed is None else f"{speed:.2f}x"
        console.print(
            f"{b.category:>12} {b.config:<13} c={b.concurrency:<3} {b.setting:<10} speedup {shown:>6}  {b.statement}"
        )
    if s.memory:
        console.print(_memory_table(s.memory))
    if s.errors:
        console.print(f"errors by type: {s.errors}")
    console.print(f"evidence: {s.measured_evidence.verdict}: {s.measured_evidence.detail}")
    console.print("wrote " + ", ".join(str(p) for p in written))


def _memory_reader(url: str, endpoint: str, headers: dict[str, str]) -> MemoryReader:
    """Reads ``GET /v1/endpoints/{endpoint}/memory`` (None where the endpoint has none)."""
    import httpx

    async def read() -> dict[str, Any] | None:
        async with httpx.AsyncClient(timeout=60) as client:
            try:
                resp = await client.get(f"{url}/v1/endpoints/{endpoint}/memory", headers=headers)
            except httpx.HTTPError:
                return None
        memory: dict[str, Any] | None = resp.json() if resp.status_code == 200 else None
        return memory

    return read


async def _audit(plan: AuditPlan, url: str, headers: dict[str, str]) -> AuditResult:
    from gateway.audit.runner import audit_client, run_audit

    async with audit_client(f"{url}/v1", headers=headers) as client:
        return await run_audit(plan, client, memory=_memory_reader(url, plan.endpoint, headers))


def audit_command(
    endpoint: str = typer.Argument(..., help="Endpoint name from the configuration."),
    workload: Path | None = typer.Option(
        None, "--workload", help="Workload JSONL (default: built-in)."
    ),
    concurrency: str = typer.Option("1", "--concurrency", help="Levels, e.g. 1,4,16."),
    requests: int | None = typer.Option(
        None,
        "--requests",
        help="Requests per configuration per level (default: the workload's size).",
    ),
    out: Path = typer.Option(Path("audit-out"), "--out", help="Output directory."),
    sweep: str | None = typer.Option(
        None, "--sweep", help="One setting: temperature=0,0.7 or max_draft_tokens=4,8,16."
    ),
    poisson: float | None = typer.Option(
        None, "--poisson", help="Poisson arrivals per second (default: closed loop)."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Override every item's max_tokens."
    ),
    temperature: float = typer.Option(0.0, "--temperature"),
    plots: bool = typer.Option(
        True, "--plots/--no-plots", help="Write PNG plots (needs matplotlib)."
    ),
    config: Path | None = CONFIG,
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Audit one endpoint's latency with and without drafts; writes audit.json, report.md, PNGs.

    The options have the bounds of ``POST /v1/audits`` and run the same audit."""
    from pydantic import ValidationError

    from gateway.audit.report import write_outputs
    from gateway.audit.runner import PlanError, plan_for
    from gateway.audit.workload import load_workload

    try:
        request = AuditRequest(
            endpoint=endpoint,
            concurrency=_parse_concurrency(concurrency),
            requests=requests,
            poisson_rate=poisson,
            max_tokens=max_tokens,
            temperature=temperature,
            sweep=_parse_sweep(sweep),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _fail(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    try:
        items = load_workload(workload)
    except (OSError, ValueError) as exc:
        raise _fail(f"workload: {exc}") from None
    settings = None if base_url else _settings(config)
    headers = _headers(settings, api_key)
    with _gateway(settings, base_url) as url:
        record = _endpoint_of(_get_records(url, headers, probe=False), endpoint)
        try:
            plan = plan_for(request, kind=record["kind"], model=record["models"][0], items=items)
        except PlanError as exc:
            raise _fail(str(exc)) from None
        result = asyncio.run(_audit(plan, url, headers))
    written = write_outputs(result, out, plots=plots)
    _print_summary(result, written)
    typer.echo(asyncio.run(_store_evidence(settings, endpoint, result.summary.measured_evidence)))
