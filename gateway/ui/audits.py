"""Audits started from the dashboard: run in the background through this gateway in
process (as ``POST /v1/audits`` runs them), one at a time, kept in this process's memory
with their result and plots (the ``report`` extra's matplotlib) until it restarts."""

from __future__ import annotations

import asyncio
import logging
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp

from gateway.audit.app_transport import IN_PROCESS_URL, AppTransport
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.records.service import Records, model_names
from sdk.wire.endpoints import AuditRequest, AuditResult

log = logging.getLogger(__name__)

MAX_RUNS = 50  # the oldest finished run is forgotten past this


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


@dataclass
class AuditRun:
    """One audit started from the dashboard."""

    id: str
    endpoint: str
    categories: list[str]
    concurrency: list[int]
    requests: int | None
    started_at: float
    total: int
    transport: _Counting
    state: str = "running"  # running | done | failed
    error: str | None = None
    result: AuditResult | None = None
    plots: dict[str, bytes] = field(default_factory=dict)

    @property
    def started(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at))

    @property
    def answered(self) -> int:
        return self.transport.answered

    def headline(self) -> dict[str, Any]:
        """Speedup per category (drafts on vs off, first level) and the identical count."""
        if self.result is None:
            return {"speedup": [], "identical": None, "pairs": None}
        summary = self.result.summary
        speedup = [
            {"category": s.category, "config": s.config, "speedup": s.speedup}
            for s in summary.speedup
        ]
        return {
            "speedup": speedup,
            "identical": sum(x.identical for x in summary.lossless),
            "pairs": sum(x.pairs for x in summary.lossless),
        }

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "answered": self.answered,
            "total": self.total,
            "error": self.error,
        }


class Audits:
    """The dashboard's audit runs of one gateway."""

    def __init__(self, records: Records) -> None:
        self._records = records
        self.runs: dict[str, AuditRun] = {}
        self._task: asyncio.Task[None] | None = None

    def get(self, run_id: str) -> AuditRun:
        run = self.runs.get(run_id)
        if run is None:
            raise NotFound(f"no audit {run_id!r} on this gateway", param="id")
        return run

    def start(
        self, app: ASGIApp, body: AuditRequest, categories: list[str], headers: dict[str, str]
    ) -> AuditRun:
        """Start an audit of ``body.endpoint`` on the built-in workload's ``categories``."""
        from gateway.audit.runner import PlanError, plan_for
        from gateway.audit.workload import load_workload

        if self._task is not None and not self._task.done():
            raise Conflict("an audit started from the dashboard is running; one runs at a time")
        endpoint = self._records.endpoints.get(body.endpoint)
        if endpoint is None:
            raise NotFound(f"no endpoint named {body.endpoint!r}", param="endpoint")
        items = [i for i in load_workload() if not categories or i.category in categories]
        if not items:
            raise InvalidRequest("no workload item is in those categories", param="categories")
        try:
            plan = plan_for(body, kind=endpoint.kind, model=model_names(endpoint)[0], items=items)
        except PlanError as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        plan.progress = False
        # every measured request, and the one warm-up request before them
        total = len(plan.concurrency) * len(plan.settings()) * plan.jobs_per_level()
        total += int(plan.warmup)
        run = AuditRun(
            id=secrets.token_hex(6),
            endpoint=body.endpoint,
            categories=categories,
            concurrency=list(body.concurrency),
            requests=body.requests,
            started_at=time.time(),
            total=total,
            transport=_Counting(app),
        )
        self._forget_old()
        self.runs[run.id] = run
        self._task = asyncio.create_task(self._run(run, plan, headers), name="draftgate-ui-audit")
        return run

    def _forget_old(self) -> None:
        while len(self.runs) >= MAX_RUNS:
            oldest = next((r for r in self.runs.values() if r.state != "running"), None)
            if oldest is None:
                return
            del self.runs[oldest.id]

    async def _run(self, run: AuditRun, plan: Any, headers: dict[str, str]) -> None:
        from gateway.audit.runner import audit_client, run_audit

        try:
            async with audit_client(
                f"{IN_PROCESS_URL}/v1", headers=headers, transport=run.transport
            ) as client:
                result = await run_audit(plan, client)
            await self._records.add_evidence(run.endpoint, result.summary.measured_evidence)
            run.plots = await asyncio.to_thread(_plots, result)
            result.records = []
            run.result = result
            run.state = "done"
        except Exception as exc:  # the run's page says what failed; the log has the rest
            log.warning("dashboard audit %s failed: %s", run.id, type(exc).__name__)
            run.state, run.error = "failed", f"{type(exc).__name__}: {exc}"


def _plots(result: AuditResult) -> dict[str, bytes]:
    """The audit's plots (PNG by name); none without matplotlib."""
    from gateway.audit.plots import write_plots

    with tempfile.TemporaryDirectory() as tmp:
        try:
            names = write_plots(result, Path(tmp))
        except RuntimeError:  # no matplotlib: the page shows the figures without plots
            return {}
        return {name: (Path(tmp) / name).read_bytes() for name in names}
