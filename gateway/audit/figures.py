"""An audit's latency figures (docs/metrics.md), each with the formula it is computed by
(``FORMULAS``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gateway.audit.client import RequestRecord
from gateway.stats import percentile
from sdk.wire.audits import (
    Acceptance,
    Distribution,
    GroupStats,
    PrefixCacheStats,
    SourceAcceptance,
)

FORMULAS: dict[str, str] = {
    "TTFB": "request sent -> response headers received",
    "TTFT": "request sent -> first chunk carrying content (role-only chunks excluded)",
    "TPOT": "(e2e - TTFT) / (output_tokens - 1), per request",
    "ITL": "gap between consecutive content chunks, pooled over requests",
    "tokens/chunk": "sum(output_tokens) / sum(content chunks)",
    "E2E": "request sent -> last content chunk",
    "queue wait": "request sent - request scheduled, on the client (not charged to the endpoint)",
    "output tok/s": "sum(output_tokens) / sum(E2E)",
    "output throughput": "sum(output_tokens) / wall time of the run",
    "request throughput": "finished requests / wall time of the run",
    "acceptance rate": "sum(accepted_prediction_tokens) / sum(accepted + rejected)",
    "accepted/step": "sum(accepted draft tokens) / sum(verify steps), endpoint-reported",
    "acceptance by source": "per draft source: sum(accepted) / sum(verified draft tokens), "
    "endpoint-reported",
    "speedup": "output tok/s with drafts / output tok/s without drafts (same items)",
    "time/token": "sum(E2E - TTFT) / sum(output_tokens - 1): drafting + verification + overhead "
    "per committed token",
    "break-even": "drafts pay iff time/token with drafts < time/token without drafts",
    "chars/token": "sum(output characters) / sum(output_tokens)",
    "prefix hit rate": "sum(cached_tokens) / sum(prompt_tokens), usage.prompt_tokens_details",
    "TTFT hit / miss": "TTFT of requests with cached_tokens > 0 / with none",
    "preemptions": "answers preempted at least once, and sum(preemptions), endpoint-reported",
    "percentiles": "nearest rank: the ceil(q/100 * n)-th smallest of n samples",
}


def distribution(values: Sequence[float]) -> Distribution:
    """p50/p90/p95/p99, mean and the sample count behind them."""
    return Distribution(
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p95=percentile(values, 95),
        p99=percentile(values, 99),
        mean=sum(values) / len(values) if values else None,
        n=len(values),
    )


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def time_per_token(records: Iterable[RequestRecord]) -> float | None:
    """sum(E2E - TTFT) / sum(output_tokens - 1) over finished requests with >= 2 tokens."""
    gen = toks = 0.0
    for r in records:
        if r.tpot_s() is None:
            continue
        assert r.e2e_s is not None and r.ttft_s is not None and r.output_tokens is not None
        gen += r.e2e_s - r.ttft_s
        toks += r.output_tokens - 1
    return _ratio(gen, toks)


def tokens_per_second(records: Iterable[RequestRecord]) -> float | None:
    """sum(output_tokens) / sum(E2E) over finished requests."""
    ok = [r for r in records if r.ok() and r.output_tokens]
    return _ratio(sum(r.output_tokens or 0 for r in ok), sum(r.e2e_s or 0.0 for r in ok))


def by_source(records: Iterable[RequestRecord]) -> dict[str, SourceAcceptance]:
    """Verified and accepted draft tokens per source, summed over ``records``."""
    drafted: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    for r in records:
        stats = r.draft_stats or {}
        drafted.update({k: int(v) for k, v in (stats.get("drafted_by_source") or {}).items()})
        accepted.update({k: int(v) for k, v in (stats.get("accepted_by_source") or {}).items()})
    return {
        name: SourceAcceptance(
            drafted=drafted[name],
            accepted=accepted[name],
            rate=_ratio(accepted[name], drafted[name]),
        )
        for name in sorted(drafted.keys() | accepted.keys())
    }


def group_stats(
    records: Sequence[RequestRecord], *, config: str, setting: str, concurrency: int, category: str
) -> GroupStats:
    """Every figure of ``FORMULAS`` for one group of requests."""
    ok = [r for r in records if r.ok()]
    errors = Counter(r.error for r in records if r.error is not None)
    accepted = sum(r.accepted_prediction_tokens or 0 for r in ok)
    rejected = sum(r.rejected_prediction_tokens or 0 for r in ok)
    reporting = [r for r in ok if r.accepted_prediction_tokens is not None]
    steps = sum(int((r.draft_stats or {}).get("verify_steps", 0)) for r in ok)
    step_accepted = sum(int((r.draft_stats or {}).get("accepted_tokens", 0)) for r in ok)
    by_position: list[int] = []
    for r in ok:
        for i, n in enumerate((r.draft_stats or {}).get("accepted_by_position") or []):
            by_position += [0] * (i + 1 - len(by_position))
            by_position[i] += int(n)
    chunks = sum(len(r.chunk_offsets_s) for r in ok)
    tokens = sum(r.output_tokens or 0 for r in ok)
    remote = [(r.draft_stats or {}).get("remote") for r in ok]
    remote_ok = [(r, m) for r, m in zip(ok, remote, strict=True) if isinstance(m, dict)]
    trips = sum(int(m.get("round_trips", 0)) for _, m in remote_ok)
    preempted = [int((r.draft_stats or {}).get("preemptions", 0)) for r in ok]
    return GroupStats(
        config=config,
        setting=setting,
        concurrency=concurrency,
        category=category,
        requests=len(records),
        finished=len(ok),
        errors=dict(errors),
        ttfb_s=distribution([r.ttfb_s for r in ok if r.ttfb_s is not None]),
        ttft_s=distribution([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=distribution([t for r in ok if (t := r.tpot_s()) is not None]),
        itl_s=distribution([g for r in ok for g in r.itl_s()]),
        e2e_s=distribution([r.e2e_s for r in ok if r.e2e_s is not None]),
        queue_wait_s=distribution([r.queued_s for r in records]),
        tokens_per_chunk=_ratio(tokens, chunks),
        output_tokens=tokens,
        tokens_estimated=sum(1 for r in ok if r.tokens_source != "usage"),
        output_tok_s=tokens_per_second(ok),
        time_per_token_s=time_per_token(ok),
        chars_per_token=_ratio(sum(len(r.text) for r in ok), tokens),
        acceptance=Acceptance(
            rate=_ratio(accepted, accepted + rejected),
            accepted_prediction_tokens=accepted,
            rejected_prediction_tokens=rejected,
            requests_reporting=len(reporting),
            accepted_per_step=_ratio(step_accepted, steps),
            accepted_by_position=by_position,
            by_source=by_source(ok),
        ),
        remote_round_trips_per_token=_ratio(trips, sum(r.output_tokens or 0 for r, _ in remote_ok))
        if remote_ok
        else None,
        preempted_requests=sum(1 for n in preempted if n),
        preemptions=sum(preempted),
    )


def prefix_cache_stats(
    records: Sequence[RequestRecord], *, config: str, concurrency: int
) -> PrefixCacheStats:
    """Token hit rate and TTFT with and without a prefix hit, over finished requests."""
    ok = [r for r in records if r.ok() and r.prompt_tokens is not None]
    hits = [r for r in ok if r.cached_tokens]
    misses = [r for r in ok if not r.cached_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return PrefixCacheStats(
        config=config,
        concurrency=concurrency,
        requests_reporting=len(ok),
        prompt_tokens=prompt,
        cached_tokens=cached,
        hit_rate=_ratio(cached, prompt),
        requests_with_hits=len(hits),
        ttft_hit_s=distribution([r.ttft_s for r in hits if r.ttft_s is not None]),
        ttft_miss_s=distribution([r.ttft_s for r in misses if r.ttft_s is not None]),
    )
