"""Lossless acceptance of a deterministic (lookup) draft against the target's outputs.

The verify forward runs over ``[root] + draft nodes`` where the root is the last committed
token (not yet in the KV cache). Row 0 of the target's output is the next-token
distribution after the root, row ``i + 1`` the one after draft node ``i``. A draft is
given as ``tokens`` and ``parents`` (``-1`` = child of the root, parents precede
children), so a chain is the case ``parents == [-1, 0, 1, ...]``.

Greedy: follow the children whose token equals the target's argmax (``verify_greedy_batch``:
the same for a whole step's requests on the logits' device, one copy to the host). Sampling
(docs/lossless.md):
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


def verify_greedy_batch(
    logits: Sequence[torch.Tensor],
    drafts: Sequence[tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
) -> list[Verdict]:
    """``verify_greedy`` of many requests at once: ``logits[i]`` is request i's ``[k+1, V]``
    rows (all on one device), ``drafts[i]`` its ``(tokens, parents)``.

    On the logits' device: one argmax over every row, then each node's comparison with the
    argmax of its parent's row. A node passes when they are equal and no earlier sibling
    has its token (``verify_greedy`` follows the first matching child), so at most one
    child of a node passes and the nodes whose whole path passes form ``verify_greedy``'s
    accepted path. Its deepest node and the argmax after it come back in one copy to the
    host (``_to_host``) for all the requests.
    """
    if not logits:
        return []
    rows, starts = _joined_rows(logits)
    argmax = rows.argmax(dim=-1)  # in the rows' dtype, the first of equal ones: greedy_token's
    plan = _GreedyPlan.build(starts, drafts)
    table = _to_device(plan.table, rows.device)
    check, tokens, up, owner, rank, start = table.split(plan.sizes)
    passed = torch.cat(
        [argmax[check] == tokens, torch.ones(1, dtype=torch.bool, device=rows.device)]
    )
    for _ in range(plan.jumps):  # pointer jumping: each pass doubles the span of path checked
        passed = passed & passed[up]
        up = up[up]
    deepest = torch.zeros(len(starts), dtype=torch.long, device=rows.device)  # node + 1, 0: none
    deepest.scatter_reduce_(0, owner, torch.where(passed[:-1], rank, 0), "amax")
    depth_and_next = _to_host(torch.stack([deepest, argmax[start + deepest]]))
    verdicts = []
    for (_, parents), last, token in zip(drafts, *depth_and_next, strict=True):
        path: list[int] = []
        node = last - 1
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        verdicts.append(Verdict(path[::-1], token))
    return verdicts


@dataclass(frozen=True)
class _GreedyPlan:
    """The host's part of ``verify_greedy_batch``, one int64 table (one copy to the device).

    Per draft node, over all the requests' nodes in order: the row whose argmax it must
    equal, its token (-1 where an earlier sibling has the same token: never followed), its
    parent node's index (for a root child, the node count: one more entry, which passes and
    is its own parent), its request and its index in its draft plus one; then each
    request's first row.
    """

    table: np.ndarray
    sizes: list[int]
    jumps: int  # pointer-jumping passes that cover the deepest path

    @staticmethod
    def build(
        starts: Sequence[int],
        drafts: Sequence[tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
    ) -> _GreedyPlan:
        sizes = np.array([len(tokens) for tokens, _ in drafts], dtype=np.int64)
        total = int(sizes.sum())
        first = np.cumsum(sizes) - sizes  # each draft's first node in the table
        owner = np.repeat(np.arange(len(drafts)), sizes)
        parents = np.concatenate([np.asarray(p, np.int64) for _, p in drafts])
        tokens = np.concatenate([np.asarray(t, np.int64) for t, _ in drafts])
        for r, (draft_tokens, draft_parents) in enumerate(drafts):
            repeated = ~_first_of_siblings(draft_tokens, draft_parents)
            tokens[first[r] : first[r] + sizes[r]][repeated] = -1
        check = np.asarray(starts, np.int64)[owner] + parents + 1
        up = np.where(parents < 0, total, first[owner] + parents)
        rank = np.arange(total) - first[owner] + 1
        parts = [check, tokens, up, [total], owner, rank, starts]
        return _GreedyPlan(
            np.concatenate(parts).astype(np.int64),
            [total, total, total + 1, total, total, len(starts)],
            max(int(sizes.max(initial=0)) - 1, 0).bit_length(),
        )


def _first_of_siblings(
    tokens: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Bool per node: no earlier node has its parent and its token."""
    parents = np.asarray(parents)
    first = np.ones(len(parents), dtype=bool)
    if len(np.unique(parents)) == len(parents):  # no siblings (a chain)
        return first
    seen: set[tuple[int, int]] = set()
    for node, pair in enumerate(zip(parents.tolist(), np.asarray(tokens).tolist(), strict=True)):
        first[node] = pair not in seen
        seen.add(pair)
    return first


def _joined_rows(parts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """One ``[R, V]`` tensor holding every part's rows, and each part's first row in it: a
    view when the parts are row ranges of one row-major tensor (a step's logits are), else
    their concatenation."""
    head = parts[0]
    width = head.shape[-1]
    storage = head.untyped_storage().data_ptr()
    offsets = [p.storage_offset() for p in parts]
    base = min(offsets)
    if all(
        p.dim() == 2
        and p.shape[1] == width
        and p.device == head.device
        and p.dtype == head.dtype
        and p.untyped_storage().data_ptr() == storage
        and p.stride(-1) == 1
        and (p.shape[0] <= 1 or p.stride(0) == width)
        and (offset - base) % width == 0
        for p, offset in zip(parts, offsets, strict=True)
    ):
        starts = [(offset - base) // width for offset in offsets]
        count = max(s + p.shape[0] for s, p in zip(starts, parts, strict=True))
        return head.as_strided((count, width), (width, 1), base), starts
    starts = np.cumsum([0, *(p.shape[0] for p in parts[:-1])]).tolist()
    return torch.cat(list(parts)), starts


def _to_device(table: np.ndarray, device: torch.device) -> torch.Tensor:
    """``table`` on ``device``; to a GPU from pinned memory, without waiting for it."""
    host = torch.from_numpy(table)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def _to_host(values: torch.Tensor) -> list[list[int]]:
    """The one copy from the device of ``verify_greedy_batch``'s verdicts."""
    return values.cpu().tolist()


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
