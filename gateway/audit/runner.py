"""Run an audit: the workload's requests, with and without drafts, at each concurrency level,
streamed through the SDK's client to a gateway. The one orchestration behind both
``draftgate audit`` and ``POST /v1/audits``: they differ only in how the client reaches
the gateway (over HTTP, or in process)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from gateway.audit.client import RequestRecord, stream_chat
from gateway.audit.quality import Checks, check
from gateway.audit.summary import summarize
from gateway.audit.workload import WorkloadItem, load_workload, parse_item
from gateway.progress import Task, progress
from sdk import AsyncClient
from sdk.errors import APIStatusError, DraftgateError
from sdk.wire import ChatCompletionRequest
from sdk.wire.audits import AuditPlanInfo, Level
from sdk.wire.endpoints import MAX_AUDIT_TOKENS, AuditRequest, AuditResult

SWEEPABLE = ("temperature", "max_draft_tokens")
LOSSLESS_KINDS = {"local"}
MAX_AUDIT_TOTAL_REQUESTS = 10_000
"""Requests of a whole audit: per configuration x configurations x levels x settings."""
MAX_AUDIT_ARRIVALS_S = 3600.0
"""The longest a level's Poisson arrivals may take to schedule (requests / rate)."""

MemoryReader = Callable[[], Awaitable[dict[str, Any] | None]]


class PlanError(ValueError):
    """An audit request that cannot run; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class AuditPlan:
    """What to run against one endpoint."""

    endpoint: str
    model: str
    items: Sequence[WorkloadItem]
    kind: str = "unknown"
    concurrency: Sequence[int] = (1,)
    requests: int | None = None
    poisson_rate: float | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    sweep: tuple[str, Sequence[float]] | None = None
    progress: bool = True
    warmup: bool = True

    def settings(self) -> list[tuple[str, dict[str, float]]]:
        """(label, overrides) for each value of the swept setting; one default otherwise."""
        if self.sweep is None:
            return [("default", {})]
        name, values = self.sweep
        return [(f"{name}={v:g}", {name: v}) for v in values]

    def sequence(self) -> list[tuple[int, WorkloadItem]]:
        """(round, item) for ``requests`` requests per configuration, cycling the workload."""
        n = self.requests or len(self.items)
        return [(i // len(self.items), self.items[i % len(self.items)]) for i in range(n)]

    def jobs_per_level(self) -> int:
        """Requests of one concurrency level and setting (every configuration)."""
        return sum(len(configs_for(item)) for _, item in self.sequence())

    def info(self) -> AuditPlanInfo:
        return AuditPlanInfo(
            endpoint=self.endpoint,
            kind=self.kind,
            model=self.model,
            workload_items=len(self.items),
            requests_per_config=len(self.sequence()),
            concurrency=list(self.concurrency),
            poisson_rate=self.poisson_rate,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            sweep={self.sweep[0]: list(self.sweep[1])} if self.sweep else None,
        )


def plan_for(
    request: AuditRequest, *, kind: str, model: str, items: Sequence[WorkloadItem] | None = None
) -> AuditPlan:
    """The plan of an audit request (``items``: the workload already read, else the
    request's own or the built-in one); :class:`PlanError` names a field out of bounds."""
    if items is None:
        try:
            items = (
                [parse_item(raw) for raw in request.workload]
                if request.workload
                else load_workload()
            )
        except ValueError as exc:
            raise PlanError(f"workload: {exc}", "workload") from None
    for n, item in enumerate(items):
        if item.max_tokens > MAX_AUDIT_TOKENS:
            raise PlanError(
                f"workload.{n}.max_tokens: at most {MAX_AUDIT_TOKENS}", f"workload.{n}.max_tokens"
            )
        try:
            ChatCompletionRequest.model_validate(
                {"model": model, "messages": item.messages, "stop": item.stop}
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(["workload", str(n), *(str(p) for p in first["loc"])])
            raise PlanError(f"{loc}: {first['msg']}", loc) from None
    sweep = next(iter(request.sweep.items())) if request.sweep else None
    if sweep is not None and sweep[0] not in SWEEPABLE:
        raise PlanError(f"can sweep only one of {', '.join(SWEEPABLE)}, not {sweep[0]!r}", "sweep")
    plan = AuditPlan(
        endpoint=request.endpoint,
        model=model,
        items=items,
        kind=kind,
        concurrency=request.concurrency,
        requests=request.requests,
        poisson_rate=request.poisson_rate,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        sweep=sweep,
    )
    per_level = plan.jobs_per_level()
    total = per_level * len(plan.concurrency) * len(plan.settings())
    if total > MAX_AUDIT_TOTAL_REQUESTS:
        raise PlanError(
            f"requests: the audit would send {total} requests; at most {MAX_AUDIT_TOTAL_REQUESTS}",
            "requests",
        )
    if plan.poisson_rate is not None and per_level / plan.poisson_rate > MAX_AUDIT_ARRIVALS_S:
        raise PlanError(
            f"poisson_rate: {per_level} arrivals at {plan.poisson_rate:g}/s take longer than "
            f"{MAX_AUDIT_ARRIVALS_S:.0f} s",
            "poisson_rate",
        )
    return plan


def audit_client(
    base_url: str,
    *,
    headers: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout_s: float = 600.0,
) -> AsyncClient:
    """The SDK client an audit sends through: ``base_url`` is the API root (``.../v1``);
    no retries (an audit counts failures, it does not hide them)."""
    return AsyncClient(
        base_url, timeout=timeout_s, max_retries=0, headers=headers, transport=transport
    )


@dataclass
class _Job:
    item: WorkloadItem
    config: str
    label: str
    setting: dict[str, float]
    concurrency: int
    round: int


def configs_for(item: WorkloadItem) -> list[str]:
    """``drafts`` (prediction + documents), ``no_prediction`` (code_edit: lookup only) and
    ``baseline`` (no prediction, ``draftgate.draft = false``), interleaved."""
    return ["drafts", "no_prediction", "baseline"] if item.prediction else ["drafts", "baseline"]


def chat_request(plan: AuditPlan, job: _Job, documents: list[str]) -> dict[str, Any]:
    """The keyword arguments of ``AsyncClient.chat`` for one job."""
    item = job.item
    request: dict[str, Any] = {
        "model": plan.model,
        "messages": item.messages,
        "max_tokens": plan.max_tokens or item.max_tokens,
        "temperature": job.setting.get("temperature", plan.temperature),
        "seed": 0,
    }
    if item.stop:
        request["stop"] = item.stop
    if job.config == "baseline":
        request["draftgate"] = {"draft": False}
        return request
    if job.config == "drafts" and item.prediction:
        request["prediction"] = item.prediction
    if documents:
        request["documents"] = documents
    if "max_draft_tokens" in job.setting:
        request["draftgate"] = {"max_draft_tokens": int(job.setting["max_draft_tokens"])}
    return request


def _chains(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs grouped so a series runs in file order; every other job stands alone."""
    chains: list[list[_Job]] = []
    series: dict[tuple[str, str, str, int], list[_Job]] = {}
    for job in jobs:
        if job.item.series is None:
            chains.append([job])
            continue
        key = (job.item.series, job.config, job.label, job.round)
        if key not in series:
            series[key] = []
            chains.append(series[key])
        series[key].append(job)
    return chains


class _Audit:
    def __init__(self, plan: AuditPlan, client: AsyncClient) -> None:
        self.plan = plan
        self.client = client
        self.origin = time.perf_counter()
        self.records: list[RequestRecord] = []
        self.setup_errors: dict[str, int] = {}
        self.task = Task()

    async def put_document(self, doc_id: str, text: str) -> bool:
        try:
            await self.client.documents.put(doc_id, text)
            return True
        except APIStatusError as exc:
            reason = f"documents_http_{exc.status_code}"
        except DraftgateError as exc:
            cause = exc.__cause__
            reason = f"documents_{type(cause or exc).__name__}"
        self.setup_errors[reason] = self.setup_errors.get(reason, 0) + 1
        return False

    async def run_chain(self, chain: list[_Job], scheduled: float) -> None:
        prior: list[str] = []
        for job in chain:
            docs = [d["id"] for d in job.item.documents] + prior
            rec = RequestRecord(
                item=job.item.id,
                category=job.item.category,
                config=job.config,
                setting=job.label,
                concurrency=job.concurrency,
                round=job.round,
                language=job.item.language,
                t_scheduled=scheduled,
            )
            await stream_chat(self.client, chat_request(self.plan, job, docs), rec, self.origin)
            rec.queued_s = max(0.0, rec.t_sent - scheduled)
            if rec.error is None and rec.served_by not in (None, self.plan.endpoint):
                rec.error = "served_by_fallback"  # another endpoint answered: not this one's figure
                rec.error_message = f"answered by endpoint {rec.served_by!r}"
            self.records.append(rec)
            self.task.advance()
            scheduled = time.perf_counter() - self.origin
            if job.item.series and job.config != "baseline" and rec.ok():
                doc_id = f"audit-{job.item.series}-{job.item.id}-{job.config}-{job.label}-c{job.concurrency}-r{job.round}"
                if await self.put_document(doc_id, rec.text):
                    prior.append(doc_id)

    async def run_level(self, concurrency: int, label: str, setting: dict[str, float]) -> Level:
        jobs = [
            _Job(item, config, label, setting, concurrency, rnd)
            for rnd, item in self.plan.sequence()
            for config in configs_for(item)
        ]
        queue: asyncio.Queue[tuple[float, list[_Job]] | None] = asyncio.Queue()
        start = time.perf_counter()
        before = len(self.records)

        async def worker() -> None:
            while (entry := await queue.get()) is not None:
                scheduled, chain = entry
                if self.plan.poisson_rate is None:
                    scheduled = time.perf_counter() - self.origin
                await self.run_chain(chain, scheduled)

        async def dispatch() -> None:
            rng = random.Random(0)
            at = time.perf_counter() - self.origin
            for chain in _chains(jobs):
                if self.plan.poisson_rate is not None:
                    at += rng.expovariate(self.plan.poisson_rate)
                    delay = at - (time.perf_counter() - self.origin)
                    if delay > 0:
                        await asyncio.sleep(delay)
                queue.put_nowait((at, chain))
            for _ in range(concurrency):
                queue.put_nowait(None)

        await asyncio.gather(dispatch(), *(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        done = [r for r in self.records[before:] if r.ok()]
        return Level(
            concurrency=concurrency,
            setting=label,
            poisson_rate=self.plan.poisson_rate,
            requests=len(self.records) - before,
            finished=len(done),
            wall_s=wall,
            output_throughput_tok_s=sum(r.output_tokens or 0 for r in done) / wall,
            request_throughput_rps=len(done) / wall,
        )

    async def warm_up(self) -> None:
        item = self.plan.items[0]
        request = {
            "model": self.plan.model,
            "messages": item.messages,
            "max_tokens": 4,
            "temperature": 0,
        }
        rec = RequestRecord(
            item=item.id,
            category=item.category,
            config="warmup",
            setting="",
            concurrency=1,
            round=-1,
        )
        await stream_chat(self.client, request, rec, self.origin)


async def run_audit(
    plan: AuditPlan, client: AsyncClient, *, memory: MemoryReader | None = None
) -> AuditResult:
    """Run every level and setting through ``client``, then summarise (an endpoint that
    fails mid-audit is counted per error type; the audit still finishes). ``memory``
    reads the endpoint's memory at the end (a local endpoint's engine)."""
    started = time.time()
    settings = plan.settings()
    total = len(plan.concurrency) * len(settings) * plan.jobs_per_level()
    audit = _Audit(plan, client)
    docs = {d["id"]: d["text"] for item in plan.items for d in item.documents}
    setup = int(plan.warmup) + len(docs)  # a local endpoint's warm-up waits for its model
    with progress(
        f"audit {plan.endpoint}: warm-up and documents", setup, enabled=plan.progress and setup > 0
    ) as task:
        if plan.warmup:
            await audit.warm_up()
            task.advance()
        for doc_id, text in docs.items():
            await audit.put_document(doc_id, text)
            task.advance()
    levels = []
    with progress(f"audit {plan.endpoint}", total, enabled=plan.progress) as task:
        audit.task = task
        for conc in plan.concurrency:
            for label, setting in settings:
                levels.append(await audit.run_level(conc, label, setting))
    items = {i.id: i for i in plan.items}
    checks: dict[int, Checks] = {
        n: check(items[r.item], r.text) for n, r in enumerate(audit.records) if r.ok()
    }
    summary = summarize(
        audit.records,
        checks,
        plan=plan.info(),
        levels=levels,
        setup_errors=audit.setup_errors,
        memory=await memory() if memory is not None else None,
        lossless_expected=plan.kind in LOSSLESS_KINDS
        and plan.temperature == 0
        and (plan.sweep is None or plan.sweep[0] != "temperature"),
    )
    records = []
    for n, r in enumerate(audit.records):
        row = r.to_dict()
        row["quality"] = checks.get(n, {})
        records.append(row)
    return AuditResult(
        endpoint=plan.endpoint,
        model=plan.model,
        started_at=started,
        finished_at=time.time(),
        summary=summary,
        records=records,
    )
