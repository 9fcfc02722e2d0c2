"""The speculative decoding loop: draft, verify in one forward, commit, repeat."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from local_verifier.kv_cache import KVCache
from local_verifier.model import Transformer
from local_verifier.sampling import SamplingParams, sample, target_probs
from local_verifier.tree import path_slots, tree_mask, tree_positions
from local_verifier.verify import Verdict, verify_greedy, verify_sampled
from lookup.draft import Draft, Source


class DraftSource(Protocol):
    """What the loop needs from a drafter (``lookup.drafter.Drafter`` or a test's own)."""

    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft: ...


class DraftPolicy(Protocol):
    """What the loop needs from a controller (``lookup.controller.DraftController``)."""

    def budget(self) -> tuple[int, int]: ...

    def choose(self, draft: Draft) -> Draft: ...

    def observe(self, drafted: int, accepted: int) -> None: ...


@dataclass
class LoopStats:
    """Counters of one request's verify steps."""

    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # Source names, lower case
    draft_s: float = 0.0
    verify_s: float = 0.0

    def count(self, drafted: int, accepted: int) -> None:
        self.verify_steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if accepted > len(self.accepted_by_position):
            self.accepted_by_position.extend([0] * (accepted - len(self.accepted_by_position)))
        for depth in range(accepted):
            self.accepted_by_position[depth] += 1

    def count_sources(self, sources: Sequence[int]) -> None:
        """Count accepted draft tokens by the ``lookup.draft.Source`` they were copied from."""
        for source in sources:
            name = Source(source).name.lower()
            self.accepted_by_source[name] = self.accepted_by_source.get(name, 0) + 1


def fit_draft(draft: Draft, max_tokens: int) -> Draft:
    """The first ``max_tokens`` nodes (closed under parents, since parents come first)."""
    return draft if len(draft) <= max_tokens else draft.subset(list(range(max(max_tokens, 0))))


def speculative_decode(
    model: Transformer,
    cache: KVCache,
    first_token: int,
    max_new: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    drafter: DraftSource | None,
    controller: DraftPolicy | None,
    stats: LoopStats,
) -> Generator[list[int], None, None]:
    """Yield the tokens each step commits, starting with ``[first_token]``.

    ``first_token`` comes from the prefill and is not yet in ``cache``. At most
    ``max_new`` tokens are yielded in all; the caller stops iterating at EOS or a stop
    string. A draft never exceeds the tokens still allowed, so the cache (sized for the
    prompt plus ``max_new``) never overflows.
    """
    pending = first_token
    produced = 1
    yield [pending]
    if drafter is not None:
        drafter.extend([pending])
    device = model.device
    while produced < max_new:
        begin = time.perf_counter()
        draft = Draft.empty()
        if drafter is not None and controller is not None:
            limit, width = controller.budget()
            limit = min(limit, max_new - produced - 1)
            if limit > 0:
                draft = fit_draft(controller.choose(drafter.propose(limit, width)), limit)
        drafted = time.perf_counter()
        start = cache.length
        tokens = torch.tensor([pending, *draft.tokens.tolist()], dtype=torch.long, device=device)
        if draft.is_chain:
            logits = model(tokens, cache)
        else:
            logits = model(
                tokens,
                cache,
                positions=tree_positions(draft.parents, start, device),
                tree_mask=tree_mask(draft.parents, device),
            )
        verdict = _verify(logits, draft, params, generator)
        accepted = len(verdict.accepted)
        if not draft.is_chain:
            cache.compact(path_slots(verdict.accepted, start)[1:], start + 1)
        cache.truncate(start + 1 + accepted)
        new = [int(draft.tokens[n]) for n in verdict.accepted] + [verdict.next_token]
        stats.count(len(draft), accepted)
        stats.count_sources(draft.source[verdict.accepted].tolist())
        verified = time.perf_counter()
        stats.draft_s += drafted - begin
        stats.verify_s += verified - drafted
        pending = new[-1]
        produced += len(new)
        yield new
        begin = time.perf_counter()
        if drafter is not None:
            drafter.extend(new)
        if controller is not None:
            controller.observe(len(draft), accepted)
        stats.draft_s += time.perf_counter() - begin


def _verify(
    logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator | None
) -> Verdict:
    if params.greedy:
        return verify_greedy(logits, draft.tokens, draft.parents)
    probs = target_probs(logits, params)
    return verify_sampled(probs, draft.tokens, draft.parents, generator, sample)  # type: ignore[arg-type]
