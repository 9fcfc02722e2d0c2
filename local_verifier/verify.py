"""Lossless acceptance of a deterministic (lookup) draft against the target's outputs.

The verify forward runs over ``[root] + draft nodes`` where the root is the last committed
token (not yet in the KV cache). Row 0 of the target's output is the next-token
distribution after the root, row ``i + 1`` the one after draft node ``i``. A draft is
given as ``tokens`` and ``parents`` (``-1`` = child of the root, parents precede
children), so a chain is the case ``parents == [-1, 0, 1, ...]``.

Greedy: follow the children whose token equals the target's argmax. Sampling (docs/lossless.md):
at each node draw one token ``y`` from the target's distribution there; accept the child whose
token is ``y`` and go on from it, else emit ``y`` and stop (also after a leaf: the bonus).
For deterministic (point-mass) drafts this is exact: every emitted token is a draw from
the target. It uses exactly one draw per emitted token from the request's generator, so
with the same seed the output is the same with drafts, without drafts, alone or batched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from local_verifier.sampling import greedy_token


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
    logits: RowProbs, tokens: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray
) -> Verdict:
    """Accept while a child's token equals the target's argmax; ``logits`` is ``[k+1, V]``
    (or rows on demand: only the rows on the accepted path are read)."""
    kids = children_of(parents)
    accepted: list[int] = []
    node = -1
    while True:
        target = greedy_token(logits[node + 1])
        match = next((c for c in kids.get(node, ()) if int(tokens[c]) == target), None)
        if match is None:
            return Verdict(accepted, target)
        accepted.append(match)
        node = match


Sampler = Callable[[torch.Tensor, torch.Generator | None], int]


class RowProbs(Protocol):
    """Row ``i`` of the target's distributions (a ``[k+1, V]`` tensor, or rows on demand)."""

    def __getitem__(self, row: int) -> torch.Tensor: ...


def verify_sampled(
    probs: RowProbs,
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
        drawn = sample(probs[node + 1], generator)
        match = next((c for c in kids.get(node, ()) if int(tokens[c]) == drawn), None)
        if match is None:
            return Verdict(accepted, drawn)
        accepted.append(match)
        node = match
