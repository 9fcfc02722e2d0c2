"""``draftgate audit``: one endpoint's latency with and without drafts, through a gateway;
writes audit.json, report.md and plots, and stores the measured evidence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gateway.cli.gateway_client import (
    API_KEY,
    BASE_URL,
    CONFIG,
    auth_headers,
    fail,
    gateway_url,
    get_records,
    ms,
    settings_of,
)
from sdk.wire.audits import AuditSummary
from sdk.wire.endpoints import AuditRequest, AuditResult
from sdk.wire.evidence import Evidence

if TYPE_CHECKING:
    from gateway.audit.runner import AuditPlan, MemoryReader


def _parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise fail(f"--concurrency takes integers like 1,4,16, not {text!r}") from None
    return levels


def _parse_list(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _parse_sweep(text: str | None) -> dict[str, list[float]]:
    if not text:
        return {}
    name, _, values = text.partition("=")
    try:
        return {name.strip(): [float(v) for v in values.split(",") if v.strip()]}
    except ValueError:
        raise fail(f"--sweep takes NAME=V1,V2,... (e.g. temperature=0,0.7), not {text!r}") from None


def _endpoint_of(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for r in records:
        if r["name"] == name:
            return r
    raise fail(f"no endpoint named {name!r} (have: {', '.join(r['name'] for r in records)})")


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
            f"{ms(g.ttft_s.p50)}/{ms(g.ttft_s.p99)}",
            f"{ms(g.tpot_s.p50)}/{ms(g.tpot_s.p99)}",
            f"{ms(g.e2e_s.p50)}/{ms(g.e2e_s.p99)}",
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
            ms(g.ttft_s.p50),
            ms(g.tpot_s.p50),
            ms(g.itl_s.p50),
            ms(g.e2e_s.p50),
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
    categories: str | None = typer.Option(
        None, "--categories", help="Only the workload's items of these, e.g. repeat,json."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output directory (default: a new folder in the configured audit_dir, "
        "else audit-out).",
    ),
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

    Without ``--out`` the files go into a new folder of the configuration's ``audit_dir``
    (the dashboard lists every run there), else into ``audit-out``.

    The options have the bounds of ``POST /v1/audits`` and run the same audit. Progress
    goes to stderr: a live bar on a terminal, plain lines (one per tenth of the requests)
    otherwise; the summary goes to stdout."""
    from pydantic import ValidationError

    from gateway.audit.folders import new_name
    from gateway.audit.report import write_outputs
    from gateway.audit.runner import PlanError, plan_for
    from gateway.audit.workload import in_categories, load_workload

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
        raise fail(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    try:
        items = in_categories(load_workload(workload), _parse_list(categories))
    except (OSError, ValueError) as exc:
        raise fail(f"workload: {exc}") from None
    settings = None if base_url else settings_of(config)
    if out is None:
        audit_dir = (settings or settings_of(config)).audit_dir
        out = Path("audit-out") if audit_dir is None else audit_dir / new_name(endpoint)
    headers = auth_headers(settings, api_key)
    with gateway_url(settings, base_url) as url:
        record = _endpoint_of(get_records(url, headers, probe=False), endpoint)
        try:
            plan = plan_for(request, kind=record["kind"], model=record["models"][0], items=items)
        except PlanError as exc:
            raise fail(str(exc)) from None
        result = asyncio.run(_audit(plan, url, headers))
    written = write_outputs(result, out, plots=plots)
    _print_summary(result, written)
    typer.echo(asyncio.run(_store_evidence(settings, endpoint, result.summary.measured_evidence)))
