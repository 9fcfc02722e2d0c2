"""Wire types for speculation records (``GET /v1/endpoints``) and audits (``POST /v1/audits``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sdk.wire.audits import AuditSummary
from sdk.wire.evidence import Evidence, Verdict

MAX_AUDIT_WORKLOAD_ITEMS = 200
MAX_AUDIT_REQUESTS = 1000
MAX_AUDIT_LEVELS = 8
MAX_AUDIT_CONCURRENCY = 64
MAX_AUDIT_TOKENS = 4096
MAX_AUDIT_SWEEP_VALUES = 8
MIN_AUDIT_POISSON_RATE = 0.01
MAX_AUDIT_POISSON_RATE = 100.0


class DocumentedSpeculation(BaseModel):
    """What a provider or engine documents, as one row of the built-in table."""

    provider: str
    kinds: list[str] = Field(description="endpoint kinds this row applies to")
    model_families: list[str] = Field(
        default_factory=list, description="model-name prefixes; empty = every model"
    )
    accepts_prediction: Literal["yes", "no", "partial", "unknown"]
    prediction_notes: str = ""
    server_side_speculation: str = ""
    evidence_visible: str = ""
    source_url: str
    checked: str = Field(description="date the row was checked against its source (YYYY-MM-DD)")


class LatencySummary(BaseModel):
    """Passive latency over a recent window (seconds)."""

    window_s: float
    requests: int
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class RoutingState(BaseModel):
    """An endpoint as the answering gateway's balancer sees it (each gateway keeps its own)."""

    state: Literal["healthy", "half-open", "ejected"]
    ejected_for_s: float = Field(default=0.0, description="back-off left while ejected")
    in_flight: int = 0
    latency_ewma_s: float | None = Field(default=None, description="moving average latency")
    requests: int = Field(default=0, description="requests routed here since start")
    ejections: int = 0


class EndpointRecord(BaseModel):
    """The speculation record of one configured endpoint."""

    name: str
    kind: str
    models: list[str] = Field(default_factory=list)
    documented: DocumentedSpeculation | None = None
    enabled: Verdict = "unknown"
    enabled_evidence: Evidence | None = Field(
        default=None, description="the evidence the verdict rests on"
    )
    prefix_cache: Verdict = Field(
        default="unknown", description="whether the engine reuses computed prompt prefixes"
    )
    prefix_cache_evidence: Evidence | None = Field(
        default=None, description="the evidence the prefix_cache verdict rests on"
    )
    remote_verify: Literal["off", "unknown", "exact", "approximate", "failed", "in-engine"] = Field(
        default="off",
        description="sglang/vllm endpoints with `verify` set: what the latest self-test found "
        "(greedy tokens of the verify path vs the engine's own decoding); `in-engine`: the "
        "engine speculates by itself with the gateway's drafts",
    )
    remote_verify_agreement: float | None = Field(
        default=None, description="the latest self-test's agreeing tokens / compared"
    )
    evidence: list[Evidence] = Field(default_factory=list, description="newest first")
    latency: LatencySummary | None = None
    routing: RoutingState | None = None


class EndpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EndpointRecord]


class AuditRequest(BaseModel):
    """Body of ``POST /v1/audits`` (the same options as ``draftgate audit``)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(min_length=1, max_length=200)
    workload: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_AUDIT_WORKLOAD_ITEMS,
        description="workload items (the audit workload JSONL format); None = built-in",
    )
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_AUDIT_CONCURRENCY)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=MAX_AUDIT_LEVELS
    )
    requests: int | None = Field(
        default=None, ge=1, le=MAX_AUDIT_REQUESTS, description="requests per configuration"
    )
    poisson_rate: float | None = Field(
        default=None,
        ge=MIN_AUDIT_POISSON_RATE,
        le=MAX_AUDIT_POISSON_RATE,
        description="arrivals per second",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, le=MAX_AUDIT_TOKENS, description="override every item's"
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    sweep: dict[
        str, Annotated[list[float], Field(min_length=1, max_length=MAX_AUDIT_SWEEP_VALUES)]
    ] = Field(
        default_factory=dict,
        max_length=1,
        description="one setting to vary ('temperature' or 'max_draft_tokens') -> values",
    )
    include_records: bool = Field(default=False, description="return every request's record")


class AuditResult(BaseModel):
    """An audit's outcome: the summary, and every request's record when asked for."""

    model_config = ConfigDict(extra="allow")

    endpoint: str
    model: str
    started_at: float
    finished_at: float
    summary: AuditSummary
    records: list[dict[str, Any]] = Field(default_factory=list)
