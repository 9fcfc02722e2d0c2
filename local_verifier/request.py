"""A generation request as submitted (``GenerationRequest``), and its state between
scheduler steps (``Request``) with its counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from local_verifier.grammar import Constraint, JsonSchema
from local_verifier.kv_pool import BlockTable
from local_verifier.logits_processors import Penalties, PenaltyState
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.sampling import SamplingParams
from lookup.controller import ScoreCalibration
from lookup.draft import Source
from lookup.protocols import DraftPolicy, DraftSource

DocumentTokens = tuple[str, np.ndarray]  # (content sha256, uint32 token ids)


@dataclass
class GenerationRequest:
    """One generation: chat ``messages``, a raw ``prompt`` or ``prompt_ids`` (exactly one)."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None = up to the context
    stop: list[str] = field(default_factory=list)
    prediction: str | None = None
    prediction_ids: list[int] | None = None  # the prediction's tokens (None: from ``prediction``)
    documents: list[DocumentTokens] = field(default_factory=list)
    document_sources: list[Source] = field(default_factory=list)  # default: Source.DOCUMENT
    draft: bool = True
    max_draft: int | None = None  # cap on draft tokens per verify step (None = measured range)
    tenant: str = ""  # prefixes are reused only between requests of the same tenant
    owner: str = ""  # the tenant whose fair share of the engine (and queue places) it uses
    weight: float = 1.0  # the owner's weight in fair scheduling (> 0)
    penalties: Penalties = field(default_factory=Penalties)
    logprobs: int | None = None  # report logprobs with this many top alternatives (None: off)
    # structured output: an llguidance grammar (grammar.json_grammar) or a JSON schema
    grammar: str | JsonSchema | None = None


@dataclass
class Stats:
    """Counters of one request, filled in as it runs."""

    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # Source names, lower case
    drafted_by_source: dict[str, int] = field(default_factory=dict)  # verified draft nodes
    queued_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    preemptions: int = 0  # times its blocks were taken back and its K/V recomputed

    def count(self, drafted: int, accepted: int) -> None:
        self.verify_steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if accepted > len(self.accepted_by_position):
            self.accepted_by_position += [0] * (accepted - len(self.accepted_by_position))
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def count_sources(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Count verified and accepted draft tokens by the ``lookup.draft.Source`` they were
        copied from."""
        for counts, sources in (
            (self.drafted_by_source, drafted),
            (self.accepted_by_source, accepted),
        ):
            for source in sources:
                name = Source(source).name.lower()
                counts[name] = counts.get(name, 0) + 1


@dataclass(eq=False)
class Request:
    """One admitted or waiting generation and its state between steps."""

    prompt_ids: list[int]
    max_new: int
    params: SamplingParams
    generator: torch.Generator | None
    drafter: DraftSource | None
    controller: DraftPolicy | None
    max_draft: int
    output: OutputAssembler
    on_delta: Callable[[TextDelta], None]
    on_finish: Callable[[Request, Exception | None], None]  # error None: done or cancelled
    tenant: str = ""  # whose prefix cache the request reads and fills
    owner: str = ""  # the tenant whose share of the engine the request uses
    weight: float = 1.0  # the owner's weight in fair scheduling
    penalties: Penalties = field(default_factory=Penalties)
    adjuster: PenaltyState | None = None  # the penalties' tensors, built at the first verdict
    logprobs: int | None = None  # None: none reported; else how many top alternatives
    followers: list[Request] = field(default_factory=list)  # admitted once our prompt is in
    grammar: Constraint | None = None  # structured output: masks rows, prunes drafts
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    table: BlockTable | None = None
    computed: int = 0  # positions whose K/V is in the pool (committed)
    cached_tokens: int = 0  # prompt positions found in the prefix cache
    tokens: list[int] = field(default_factory=list)  # prompt and output so far
    keys: list[bytes] = field(default_factory=list)  # prefix keys of the table's full blocks
    pending: int | None = None  # the last emitted token, not yet in the pool
    produced: int = 0
    cancelled: bool = False
    stats: Stats = field(default_factory=Stats)
    turn: int = 0  # the step it last decoded in (``decode_turns``)
    calibration: ScoreCalibration = field(default_factory=ScoreCalibration)

    @property
    def to_fill(self) -> int:
        """Positions whose K/V must be in the pool before the request decodes: its prompt,
        or after a preemption every token but the pending one."""
        return len(self.tokens) - (self.pending is not None)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.to_fill

    def priority(self) -> tuple[float, float]:
        """Preempted first when largest: the lowest weight, then the latest submitted."""
        return (-self.weight, self.submitted)
