"""The dashboard's audits: those it started, run in the background through this gateway
in process (as ``POST /v1/audits`` runs them), one at a time; and those on disk in the
configured ``audit_dir`` (``draftgate audit``'s, and the dashboard's own, which write their
report folder there). Without an ``audit_dir`` the dashboard's runs live in this process's
memory until it restarts."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp

from gateway.audit import folders
from gateway.audit.app_transport import IN_PROCESS_URL, AppTransport
from gateway.audit.runner import MemoryReader
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.records.service import Records, model_names
from gateway.ui.audit_view import headline, svg_plots
from sdk.wire.endpoints import AuditRequest, AuditResult

log = logging.getLogger(__name__)

MAX_RUNS = 50  # the oldest finished run started here is forgotten past this


class _Counting(AppTransport):
    """The in-process transport, counting the chat requests answered (the progress)."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app)
        self.answered = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path.endswith("/chat/completions"):
            self.answered += 1
        return response


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


@dataclass
class AuditRun:
    """One audit: started from the dashboard (``transport`` set while it runs here) or
    read from the audit directory (``state`` done, ``result`` without its records)."""

    id: str
    endpoint: str
    started_at: float
    workload: str  # categories, concurrency, requests, in words
    origin: str = "audit_dir"  # dashboard: started here; audit_dir: read from its folder
    total: int = 0
    transport: _Counting | None = None
    state: str = "done"  # running | done | failed
    error: str | None = None
    result: AuditResult | None = None
    folder: Path | None = None  # where its report files are
    plots: dict[str, bytes] = field(default_factory=dict)  # SVG by name, once drawn

    @property
    def started(self) -> str:
        return _when(self.started_at)

    @property
    def answered(self) -> int:
        return 0 if self.transport is None else self.transport.answered

    def headline(self) -> dict[str, Any]:
        return headline(self.result)

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "answered": self.answered,
            "total": self.total,
            "error": self.error,
        }


def _workload(categories: list[str], concurrency: list[int], requests: int | None) -> str:
    words = f"{', '.join(categories) or 'all categories'}; concurrency {', '.join(map(str, concurrency))}"
    return words + (f"; {requests} requests per configuration" if requests else "")


def _stored(name: str, folder: Path, result: AuditResult) -> AuditRun:
    """A run read from the audit directory."""
    plan = result.summary.plan
    categories = sorted({g.category for g in result.summary.groups} - {"all"})
    return AuditRun(
        id=name,
        endpoint=result.endpoint,
        started_at=result.started_at,
        workload=_workload(categories, plan.concurrency, plan.requests_per_config),
        result=result,
        folder=folder,
    )


class Audits:
    """The audit runs one gateway's dashboard shows."""

    def __init__(self, records: Records, audit_dir: Path | None) -> None:
        self._records = records
        self.audit_dir = audit_dir
        self._started: dict[str, AuditRun] = {}
        self._task: asyncio.Task[None] | None = None

    def runs(self) -> list[AuditRun]:
        """Every run, newest first: those started here and those in the audit directory."""
        runs = list(self._started.values())
        if self.audit_dir is not None:
            for name in folders.names(self.audit_dir):
                if name not in self._started:
                    run = self._read(name)
                    if run is not None:
                        runs.append(run)
        return sorted(runs, key=lambda r: r.started_at, reverse=True)

    def _read(self, name: str) -> AuditRun | None:
        """The run in folder ``name`` of the audit directory (None: none readable there)."""
        path = None if self.audit_dir is None else folders.result_path(self.audit_dir, name)
        if path is None:
            return None
        try:
            return _stored(name, path.parent, folders.summary(path))
        except (OSError, ValueError) as exc:  # a broken file: left out of the page
            log.warning("audit folder %s unreadable: %s", name, type(exc).__name__)
            return None

    def get(self, run_id: str) -> AuditRun:
        run = self._started.get(run_id) or self._read(run_id)
        if run is None:
            raise NotFound(f"no audit {run_id!r} on this gateway", param="id")
        return run

    async def plots(self, run: AuditRun) -> dict[str, bytes]:
        """The run's plots as SVG (drawn from its records: in memory, else its audit.json)."""
        if run.plots or run.state != "done" or run.folder is None:
            return run.plots
        path = run.folder / folders.RESULT
        try:
            run.plots = await asyncio.to_thread(lambda: svg_plots(folders.load(path)))
        except (OSError, ValueError) as exc:
            log.warning("audit %s: plots unavailable: %s", run.id, type(exc).__name__)
        return run.plots

    def start(
        self,
        app: ASGIApp,
        body: AuditRequest,
        categories: list[str],
        headers: dict[str, str],
        memory: MemoryReader,
    ) -> AuditRun:
        """Start an audit of ``body.endpoint`` on the built-in workload's ``categories``."""
        from gateway.audit.runner import PlanError, plan_for
        from gateway.audit.workload import in_categories, load_workload

        if self._task is not None and not self._task.done():
            raise Conflict("an audit started from the dashboard is running; one runs at a time")
        endpoint = self._records.endpoints.get(body.endpoint)
        if endpoint is None:
            raise NotFound(f"no endpoint named {body.endpoint!r}", param="endpoint")
        try:
            items = in_categories(load_workload(), categories)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="categories") from None
        try:
            plan = plan_for(body, kind=endpoint.kind, model=model_names(endpoint)[0], items=items)
        except PlanError as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        plan.progress = False
        # every measured request, and the one warm-up request before them
        total = len(plan.concurrency) * len(plan.settings()) * plan.jobs_per_level()
        total += int(plan.warmup)
        name = folders.new_name(body.endpoint)
        run = AuditRun(
            id=name,
            endpoint=body.endpoint,
            started_at=time.time(),
            workload=_workload(sorted(categories), list(body.concurrency), body.requests),
            total=total,
            transport=_Counting(app),
            origin="dashboard",
            state="running",
            folder=None if self.audit_dir is None else self.audit_dir / name,
        )
        self._forget_old()
        self._started[run.id] = run
        self._task = asyncio.create_task(
            self._run(run, plan, headers, memory), name="draftgate-ui-audit"
        )
        return run

    def _forget_old(self) -> None:
        while len(self._started) >= MAX_RUNS:
            oldest = next((r for r in self._started.values() if r.state != "running"), None)
            if oldest is None:
                return
            del self._started[oldest.id]

    async def _run(
        self, run: AuditRun, plan: Any, headers: dict[str, str], memory: MemoryReader
    ) -> None:
        from gateway.audit.report import write_outputs
        from gateway.audit.runner import audit_client, run_audit

        assert run.transport is not None
        try:
            async with audit_client(
                f"{IN_PROCESS_URL}/v1", headers=headers, transport=run.transport
            ) as client:
                result = await run_audit(plan, client, memory=memory)
            await self._records.add_evidence(run.endpoint, result.summary.measured_evidence)
            if run.folder is not None:  # the same files as draftgate audit writes
                await asyncio.to_thread(write_outputs, result, run.folder)
            run.plots = await asyncio.to_thread(svg_plots, result)
            result.records = []
            run.result = result
            run.state = "done"
        except Exception as exc:  # the run's page says what failed; the log has the rest
            log.warning("dashboard audit %s failed: %s", run.id, type(exc).__name__)
            run.state, run.error = "failed", f"{type(exc).__name__}: {exc}"
