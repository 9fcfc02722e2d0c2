"""Wire types of an audit's summary (``AuditResult.summary``): one model per section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sdk.wire.evidence import Evidence


class Distribution(BaseModel):
    """Nearest-rank percentiles, the mean and the number of samples (seconds)."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    n: int = 0


class SourceAcceptance(BaseModel):
    """Draft tokens copied from one source (prediction, prompt, output, document, retrieved,
    answer): verified, accepted, and accepted / drafted."""

    drafted: int = 0
    accepted: int = 0
    rate: float | None = None


class Acceptance(BaseModel):
    """Prediction and draft acceptance of a group of requests."""

    rate: float | None = None
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    requests_reporting: int = 0
    accepted_per_step: float | None = None
    accepted_by_position: list[int] = Field(default_factory=list)
    by_source: dict[str, SourceAcceptance] = Field(default_factory=dict)


class GroupStats(BaseModel):
    """Every figure of one group: a config, setting, concurrency level and category
    (``all`` = every category)."""

    config: str
    setting: str
    concurrency: int
    category: str
    requests: int
    finished: int
    errors: dict[str, int] = Field(default_factory=dict)
    ttfb_s: Distribution
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    queue_wait_s: Distribution
    tokens_per_chunk: float | None = None
    output_tokens: int = 0
    tokens_estimated: int = 0
    output_tok_s: float | None = None
    time_per_token_s: float | None = None
    chars_per_token: float | None = None
    acceptance: Acceptance
    remote_round_trips_per_token: float | None = Field(
        default=None,
        description="remotely verified answers: engine requests per output token",
    )
    preempted_requests: int = Field(
        default=0, description="answers a local engine preempted at least once (endpoint-reported)"
    )
    preemptions: int = Field(
        default=0, description="preemptions of those answers (KV taken back, recomputed)"
    )


class Level(BaseModel):
    """One run: a concurrency level and setting, over its wall time."""

    concurrency: int
    setting: str
    poisson_rate: float | None = None
    requests: int
    finished: int
    wall_s: float
    output_throughput_tok_s: float
    request_throughput_rps: float


class Comparison(BaseModel):
    """The cell a speedup or break-even row compares: with vs without drafts."""

    category: str
    concurrency: int
    setting: str
    config: str
    pairs: int


class Speedup(Comparison):
    tok_s_with: float | None = None
    tok_s_without: float | None = None
    speedup: float | None = None
    faster_pairs: int = 0


class BreakEven(Comparison):
    t_with_s: float | None = None
    t_without_s: float | None = None
    pays: bool | None = None
    statement: str


class CheckCount(BaseModel):
    passed: int = 0
    failed: int = 0


class Quality(BaseModel):
    """Pass/fail counts of each output check for one category and config."""

    category: str
    config: str
    checks: dict[str, CheckCount] = Field(default_factory=dict)
    truncated_at_max_tokens: int = 0


class Lossless(BaseModel):
    """How many answers with drafts equal the answer without, for one cell."""

    category: str
    config: str
    setting: str
    pairs: int
    identical: int
    expected_identical: bool
    mismatch: bool


class LevelIdentity(BaseModel):
    """How many answers of a config at a level equal the ``baseline`` answer at the lowest
    concurrency level (same item, round and setting)."""

    config: str
    setting: str
    concurrency: int
    pairs: int
    identical: int


class LanguageStats(BaseModel):
    language: str
    config: str
    requests: int
    acceptance_rate: float | None = None
    output_tok_s: float | None = None
    chars_per_token: float | None = None


class PrefixCacheStats(BaseModel):
    """Prefix reuse seen by one config at one concurrency level: the token hit rate and
    TTFT of requests with a hit (``cached_tokens > 0``) and without."""

    config: str
    concurrency: int
    requests_reporting: int = Field(description="finished requests whose usage had prompt_tokens")
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hit_rate: float | None = Field(default=None, description="cached_tokens / prompt_tokens")
    requests_with_hits: int = 0
    ttft_hit_s: Distribution
    ttft_miss_s: Distribution


class AuditPlanInfo(BaseModel):
    """What was run."""

    endpoint: str
    kind: str
    model: str
    workload_items: int
    requests_per_config: int
    concurrency: list[int]
    poisson_rate: float | None = None
    temperature: float
    max_tokens: int | None = None
    sweep: dict[str, list[float]] | None = None


class MeasuredSpeedup(BaseModel):
    """The ``drafts`` config over all categories at the lowest concurrency."""

    speedup: float
    pairs: int
    faster_pairs: int
    concurrency: int
    setting: str


class AuditSummary(BaseModel):
    """The whole summary of an audit (``audit.json``'s ``summary``, ``report.md``'s source)."""

    plan: AuditPlanInfo
    formulas: dict[str, str]
    levels: list[Level]
    groups: list[GroupStats]
    speedup: list[Speedup]
    break_even: list[BreakEven]
    quality: list[Quality]
    lossless: list[Lossless]
    identical_to_first_level: list[LevelIdentity] = Field(default_factory=list)
    languages: list[LanguageStats]
    prefix_cache: list[PrefixCacheStats] = Field(default_factory=list)
    errors: dict[str, int] = Field(default_factory=dict)
    setup_errors: dict[str, int] = Field(default_factory=dict)
    requests: int
    memory: dict[str, Any] | None = Field(
        default=None, description="a local endpoint's engine memory, as its engine reports it"
    )
    measured_evidence: Evidence
    record_update: str | None = None
    plots: str | None = None

    def all_categories(self) -> list[GroupStats]:
        """The groups over every category, in run order."""
        return [g for g in self.groups if g.category == "all"]
