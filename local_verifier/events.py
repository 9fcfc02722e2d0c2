"""What the engine publishes: each submitted request's events, and its own counters.

A request's callback gets, in order, ``TextDelta``s (tokens and their text), then
``GenerationStats`` (the answer is done) or ``Failed`` (it ended with an error), then
``END``; after a cancel, just ``END``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from local_verifier.output import TextDelta
from local_verifier.request import Request


@dataclass(frozen=True)
class GenerationStats:
    """Per-request counters; the last item ``Engine.generate`` yields."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    verify_steps: int
    drafted_tokens: int
    accepted_tokens: int
    accepted_by_position: list[int]
    accepted_by_source: dict[str, int]  # accepted draft tokens per source (Source names)
    drafted_by_source: dict[str, int]  # verified draft tokens per source
    accepted_prediction_tokens: int | None
    rejected_prediction_tokens: int | None
    prefill_s: float
    draft_s: float
    verify_s: float
    total_s: float
    queued_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    grammar_s: float = 0.0  # time spent in the grammar: draft pruning, masks, commits
    preemptions: int = 0  # times the answer was preempted and its K/V recomputed
    stop_string: str | None = None  # the stop string that ended the answer


@dataclass(frozen=True)
class Failed:
    """The request ended with ``error`` (a bad request found late, a failed step, a close)."""

    error: Exception


@dataclass(frozen=True)
class Ended:
    """Nothing follows for this request (``END`` is the one instance)."""


END = Ended()

Event = TextDelta | GenerationStats | Failed | Ended


@dataclass(frozen=True)
class TenantLoad:
    """One tenant's requests in the engine: in the running batch and waiting."""

    running: int
    waiting: int


@dataclass(frozen=True)
class ThreadChoice:
    """The CPU thread count the engine runs its steps on, chosen online among
    ``candidates`` by each count's ``score``: the running mean of log(step seconds /
    expected seconds), None before any step ran on it (lower is faster)."""

    chosen: int
    candidates: tuple[int, ...]
    score: dict[int, float | None]


@dataclass(frozen=True)
class EngineStats:
    """The engine's counters so far and its state now (``Engine.stats``)."""

    preemptions: int  # requests whose KV blocks were taken back, recomputed later
    prefix_hit_tokens: int  # prompt tokens found in the prefix cache
    prefix_miss_tokens: int  # prompt tokens computed
    memory: dict[str, int]  # bytes by part (``Engine.memory``)
    kv_blocks_used: int  # KV pool blocks referenced by requests
    kv_blocks_total: int  # KV pool blocks in all
    tenants: dict[str, TenantLoad]  # each tenant with requests running or waiting
    step_s_by_rows: dict[int, float]  # a step's seconds by its rows, as the steps run now
    step_s_at_start: dict[int, float]  # the same, measured at start-up
    threads: ThreadChoice | None  # None: not chosen online (one core, or a GPU)


def answer_stats(request: Request, predicted: bool) -> GenerationStats:
    """The closing stats of ``request``'s answer (``predicted``: it was given a prediction)."""
    stats = request.stats
    usage = getattr(request.drafter, "prediction_usage", None)
    accepted_pred, rejected_pred = usage() if usage is not None and predicted else (None, None)
    total = time.perf_counter() - request.submitted
    return GenerationStats(
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=len(request.output.token_ids),
        finish_reason=request.output.finish_reason or "length",
        verify_steps=stats.verify_steps,
        drafted_tokens=stats.drafted_tokens,
        accepted_tokens=stats.accepted_tokens,
        accepted_by_position=stats.accepted_by_position,
        accepted_by_source=stats.accepted_by_source,
        drafted_by_source=stats.drafted_by_source,
        accepted_prediction_tokens=accepted_pred,
        rejected_prediction_tokens=rejected_pred,
        prefill_s=stats.prefill_s,
        draft_s=stats.draft_s,
        verify_s=max(total - stats.queued_s - stats.prefill_s - stats.draft_s, 0.0),
        total_s=total,
        queued_s=stats.queued_s,
        cached_tokens=request.cached_tokens,
        grammar_s=0.0 if request.grammar is None else request.grammar.seconds,
        preemptions=stats.preemptions,
        stop_string=request.output.stop_string,
    )
