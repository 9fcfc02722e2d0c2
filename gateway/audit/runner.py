"""Run an audit: the workload's requests, with and without drafts, at each concurrency level,
over streaming HTTP to the gateway."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm.auto import tqdm

from gateway.audit.client import RequestRecord, stream_chat
from gateway.audit.quality import Checks, check
from gateway.audit.summary import (
    MEASURED_MAX_P,
    MEASURED_YES_SPEEDUP,
    measured_speedup,
    sign_test_p,
    summarize,
)
from gateway.audit.workload import WorkloadItem
from gateway.records.evidence import make
from sdk.wire.endpoints import AuditResult, Evidence

SWEEPABLE = ("temperature", "max_draft_tokens")
LOSSLESS_KINDS = {"local"}


@dataclass
class AuditPlan:
    """What to run. ``base_url`` is the gateway's root (``http://127.0.0.1:8000``)."""

    base_url: str
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
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    progress: bool = True
    warmup: bool = True

    def settings(self) -> list[tuple[str, dict[str, float]]]:
        """(label, overrides) for each value of the swept setting; one default otherwise."""
        if self.sweep is None:
            return [("default", {})]
        name, values = self.sweep
        if name not in SWEEPABLE:
            raise ValueError(f"can sweep only one of {', '.join(SWEEPABLE)}, not {name!r}")
        return [(f"{name}={v:g}", {name: v}) for v in values]

    def sequence(self) -> list[tuple[int, WorkloadItem]]:
        """(round, item) for ``requests`` requests per configuration, cycling the workload."""
        n = self.requests or len(self.items)
        return [(i // len(self.items), self.items[i % len(self.items)]) for i in range(n)]


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


def build_body(plan: AuditPlan, job: _Job, documents: list[str]) -> dict[str, Any]:
    """The chat request of one job."""
    item = job.item
    body: dict[str, Any] = {
        "model": plan.model,
        "messages": item.messages,
        "max_tokens": plan.max_tokens or item.max_tokens,
        "temperature": job.setting.get("temperature", plan.temperature),
        "seed": 0,
    }
    if item.stop:
        body["stop"] = item.stop
    if job.config == "baseline":
        body["draftgate"] = {"draft": False}
        return body
    if job.config == "drafts" and item.prediction:
        body["prediction"] = {"type": "content", "content": item.prediction}
    options: dict[str, Any] = {}
    if documents:
        options["documents"] = documents
    if "max_draft_tokens" in job.setting:
        options["max_draft_tokens"] = int(job.setting["max_draft_tokens"])
    if options:
        body["draftgate"] = options
    return body


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
    def __init__(self, plan: AuditPlan, client: httpx.AsyncClient) -> None:
        self.plan = plan
        self.client = client
        self.url = f"{plan.base_url.rstrip('/')}/v1/chat/completions"
        self.origin = time.perf_counter()
        self.records: list[RequestRecord] = []
        self.setup_errors: dict[str, int] = {}
        self.bar: Any = None

    async def put_document(self, doc_id: str, text: str) -> bool:
        try:
            resp = await self.client.post(
                f"{self.plan.base_url.rstrip('/')}/v1/documents",
                json={"id": doc_id, "text": text},
                headers=self.plan.headers,
            )
            ok = resp.status_code < 300
            reason = f"documents_http_{resp.status_code}"
        except httpx.HTTPError as exc:
            ok, reason = False, f"documents_{type(exc).__name__}"
        if not ok:
            self.setup_errors[reason] = self.setup_errors.get(reason, 0) + 1
        return ok

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
            await stream_chat(
                self.client,
                self.url,
                build_body(self.plan, job, docs),
                self.plan.headers,
                rec,
                self.origin,
            )
            rec.queued_s = max(0.0, rec.t_sent - scheduled)
            if rec.error is None and rec.served_by not in (None, self.plan.endpoint):
                rec.error = "served_by_fallback"  # another endpoint answered: not this one's figure
                rec.error_message = f"answered by endpoint {rec.served_by!r}"
            self.records.append(rec)
            if self.bar is not None:
                self.bar.update(1)
            scheduled = time.perf_counter() - self.origin
            if job.item.series and job.config != "baseline" and rec.ok():
                doc_id = f"audit-{job.item.series}-{job.item.id}-{job.config}-{job.label}-c{job.concurrency}-r{job.round}"
                if await self.put_document(doc_id, rec.text):
                    prior.append(doc_id)

    async def run_level(
        self, concurrency: int, label: str, setting: dict[str, float]
    ) -> dict[str, Any]:
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
        return {
            "concurrency": concurrency,
            "setting": label,
            "poisson_rate": self.plan.poisson_rate,
            "requests": len(self.records) - before,
            "finished": len(done),
            "wall_s": wall,
            "output_throughput_tok_s": sum(r.output_tokens or 0 for r in done) / wall,
            "request_throughput_rps": len(done) / wall,
        }

    async def warm_up(self) -> None:
        item = self.plan.items[0]
        body = {
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
        await stream_chat(self.client, self.url, body, self.plan.headers, rec, self.origin)


async def fetch_memory(client: httpx.AsyncClient, plan: AuditPlan) -> dict[str, Any] | None:
    """A local endpoint's memory from ``GET /v1/endpoints/{name}/memory`` (None if absent)."""
    try:
        resp = await client.get(
            f"{plan.base_url.rstrip('/')}/v1/endpoints/{plan.endpoint}/memory", headers=plan.headers
        )
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


def measured_evidence(summary: dict[str, Any]) -> Evidence:
    """The audit's evidence for the endpoint's record. ``yes`` needs a clear and consistent
    difference: speedup >= 1.2 and the drafted request faster in enough pairs that chance
    is ruled out (one-sided sign test p <= 0.05, so at least 5 pairs). No difference proves
    nothing either way (``unknown``)."""
    m = measured_speedup(summary)
    if m is None:
        return make("measured", "audit", "unknown", "no finished with/without pairs to compare")
    p = sign_test_p(m["faster_pairs"], m["pairs"])
    values = {
        "speedup": m["speedup"],
        "pairs": m["pairs"],
        "faster_pairs": m["faster_pairs"],
        "sign_test_p": p,
    }
    detail = (
        f"audit speedup with vs without drafts {m['speedup']:.2f}x at concurrency "
        f"{m['concurrency']}; faster in {m['faster_pairs']}/{m['pairs']} pairs (sign test p={p:.3f})"
    )
    if m["speedup"] >= MEASURED_YES_SPEEDUP and p <= MEASURED_MAX_P:
        return make("measured", "audit", "yes", detail, values)
    return make("measured", "audit", "unknown", detail + ": no clear difference", values)


async def run_audit(plan: AuditPlan) -> AuditResult:
    """Run every level and setting, then summarise (an endpoint that fails mid-audit is
    counted per error type; the audit still finishes)."""
    started = time.time()
    settings = plan.settings()
    total = (
        len(plan.concurrency) * len(settings) * sum(len(configs_for(i)) for _, i in plan.sequence())
    )
    limits = httpx.Limits(max_connections=max(plan.concurrency) + 4)
    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as client:
        audit = _Audit(plan, client)
        if plan.warmup:
            await audit.warm_up()
        docs = {d["id"]: d["text"] for item in plan.items for d in item.documents}
        for doc_id, text in docs.items():
            await audit.put_document(doc_id, text)
        levels = []
        with tqdm(
            total=total, desc=f"audit {plan.endpoint}", unit="req", disable=not plan.progress
        ) as bar:
            audit.bar = bar
            for conc in plan.concurrency:
                for label, setting in settings:
                    levels.append(await audit.run_level(conc, label, setting))
        memory = await fetch_memory(client, plan)
    items = {i.id: i for i in plan.items}
    checks: dict[int, Checks] = {
        n: check(items[r.item], r.text) for n, r in enumerate(audit.records) if r.ok()
    }
    summary = summarize(
        audit.records,
        checks,
        levels,
        lossless_expected=plan.kind in LOSSLESS_KINDS
        and plan.temperature == 0
        and (plan.sweep is None or plan.sweep[0] != "temperature"),
    )
    summary["plan"] = {
        "endpoint": plan.endpoint,
        "kind": plan.kind,
        "model": plan.model,
        "workload_items": len(plan.items),
        "requests_per_config": len(plan.sequence()),
        "concurrency": list(plan.concurrency),
        "poisson_rate": plan.poisson_rate,
        "temperature": plan.temperature,
        "max_tokens": plan.max_tokens,
        "sweep": {plan.sweep[0]: list(plan.sweep[1])} if plan.sweep else None,
    }
    summary["setup_errors"] = audit.setup_errors
    summary["memory"] = memory
    summary["measured_evidence"] = measured_evidence(summary).model_dump()
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
