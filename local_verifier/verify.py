"""Lossless acceptance of a deterministic (lookup) draft against the target's outputs.

The verify forward runs over ``[root] + draft nodes`` where the root is the last committed
token (not yet in the KV cache). Row 0 of the target's output is the next-token
distribution after the root, row ``i + 1`` the one after draft node ``i``. A draft is
given as ``tokens`` and ``parents`` (``-1`` = child of the root, parents precede
children), so a chain is the case ``parents == [-1, 0, 1, ...]``.

Greedy: follow the children whose token equals the target's argmax. Sampling
(docs/lossless.md): at each node, try its children in order, accepting child ``c``
with probability ``p'(c)``; on rejection set ``p'(c) = 0`` and renormalise; when no child
is accepted, emit a sample from what is left of ``p'``. The token after a fully accepted
path is a bonus sample from the target. Either way the output distribution is the
target's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Verdict:
    """The result of one verify step."""

    accepted: list[int]  # draft node indexes on the accepted path, root to leaf
    next_token: int  # the target's own token after the accepted path (correction or bonus)


def children_of(parents: Sequence[int] | np.ndarray) -> dict[int, list[int]]:
    """Map node index (-1 = root) to its children, in draft order."""
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        kids.setdefault(int(parent), []).append(node)
    return kids


def verify_greedy(
    logits: torch.Tensor, tokens: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray
) -> Verdict:
    """Accept while a child's token equals the target's argmax; ``logits`` is ``[k+1, V]``."""
    best = logits.argmax(dim=-1).tolist()
    kids = children_of(parents)
    accepted: list[int] = []
    node = -1
    while True:
        target = int(best[node + 1])
        match = next((c for c in kids.get(node, ()) if int(tokens[c]) == target), None)
        if match is None:
            return Verdict(accepted, target)
        accepted.append(match)
        node = match


Sampler = Callable[[torch.Tensor, torch.Generator | None], int]


def verify_sampled(
    probs: torch.Tensor,
    tokens: Sequence[int] | np.ndarray,
    parents: Sequence[int] | np.ndarray,
    generator: torch.Generator | None,
    sample: Sampler,
) -> Verdict:
    """Speculative sampling for a deterministic draft; ``probs`` is ``[k+1, V]``.

    ``probs`` must be the target's distributions after temperature/top-k/top-p, exactly as
    plain sampling uses them; ``sample(probs_row, generator)`` draws one token from a row.
    """
    kids = children_of(parents)
    accepted: list[int] = []
    node = -1
    while True:
        row = probs[node + 1]
        candidates = kids.get(node, [])
        if not candidates:
            return Verdict(accepted, sample(row, generator))
        residual = row.double()
        chosen = None
        for child in candidates:
            token = int(tokens[child])
            total = float(residual.sum())
            p_token = float(residual[token]) / total if total > 0 else 0.0
            if _uniform(generator, row.device) < p_token:
                chosen = child
                break
            residual = residual.clone()
            residual[token] = 0.0
        if chosen is None:
            return Verdict(accepted, sample((residual / residual.sum()).to(row.dtype), generator))
        accepted.append(chosen)
        node = chosen


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    """One draw from U[0, 1) on the generator's stream."""
    gen_device = generator.device if generator is not None else device
    return float(torch.rand((), generator=generator, device=gen_device))
