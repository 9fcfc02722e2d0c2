"""How much to draft: the cost model of docs/cost-model.md.

With ``c(k)`` the measured time of a verify forward carrying k draft tokens and ``a_i``
the probability that draft token i is accepted given the ones before it were, a step
commits on average ``E(k) = 1 + a_1 + a_1 a_2 + ...`` tokens. For a tree the same sum
runs over the verified nodes, each weighted by the probability of its whole path, which
is what a :class:`~lookup.draft.Draft` score holds. The controller verifies the nodes
that maximise ``E / c`` and nothing when that does not beat a plain step, ``1 / c(0)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lookup.draft import Draft


class DraftController:
    """Per-request draft sizing from measured step costs and recent acceptance."""

    def __init__(self, step_costs: Sequence[float], max_width: int = 3, decay: float = 0.7) -> None:
        costs = np.asarray(step_costs, dtype=np.float64)
        if costs.ndim != 1 or len(costs) == 0 or not np.all(costs > 0):
            raise ValueError("step_costs must be a non-empty sequence of positive seconds")
        self._relative = costs / costs[0]  # c(k) / c(0)
        self.max_width = max_width
        self.decay = decay
        self.acceptance = 0.5  # recent accepted / drafted, exponentially averaged

    @property
    def max_tokens(self) -> int:
        """The largest draft whose cost was measured."""
        return len(self._relative) - 1

    def budget(self) -> tuple[int, int]:
        """(max draft tokens, max width) to ask the drafter for.

        Sized from an optimistic geometric model of the recent acceptance, so that the
        drafter is always asked for something to verify (it is cheap) and ``choose``
        makes the decision; a request that keeps accepting long runs gets a chain.
        """
        if self.max_tokens == 0:
            return 0, 1
        a = min(self.acceptance + 0.25, 0.97)
        k = np.arange(1, self.max_tokens + 1)
        expected = (1.0 - a ** (k + 1)) / (1.0 - a)
        best = int(k[np.argmax(expected / self._relative[1:])])
        width = 1 if self.acceptance >= 0.8 else self.max_width
        return min(self.max_tokens, max(4, 2 * best)), width

    def choose(self, draft: Draft) -> Draft:
        """The subtree worth verifying (parents kept with their children), possibly empty."""
        if len(draft) == 0 or self.max_tokens == 0:
            return Draft.empty()
        # best nodes first; scores never grow along a path, so every prefix of this order
        # is closed under parents (ties go to the earlier node, parents precede children)
        order = np.lexsort((np.arange(len(draft)), -draft.scores.astype(np.float64)))
        order = order[: self.max_tokens]
        expected = 1.0 + np.cumsum(draft.scores[order], dtype=np.float64)
        gain = expected / self._relative[1 : len(order) + 1]
        best = int(np.argmax(gain))
        if gain[best] <= 1.0 + 1e-9:  # no better than a plain step, E(0) / c(0)
            return Draft.empty()
        return draft.subset(sorted(order[: best + 1].tolist()))

    def observe(self, drafted: int, accepted: int) -> None:
        """Record a verify step that carried ``drafted`` tokens, ``accepted`` of them kept."""
        if drafted > 0:
            rate = accepted / drafted
            self.acceptance = self.decay * self.acceptance + (1.0 - self.decay) * rate


class ScoreCalibration:
    """How a request's draft scores compare with what it accepts: verified nodes' scores
    (each the estimated probability that its path is accepted) against the nodes accepted,
    both exponentially averaged. ``plan_batch`` weighs a request's nodes by that ratio."""

    def __init__(self, decay: float = 0.8, bounds: tuple[float, float] = (0.25, 4.0)) -> None:
        self.decay = decay
        self.bounds = bounds
        self._expected = 0.0
        self._accepted = 0.0

    @property
    def ratio(self) -> float:
        """Accepted over expected nodes (1.0 until a verified draft was observed)."""
        if self._expected <= 0.0:
            return 1.0
        return float(np.clip(self._accepted / self._expected, *self.bounds))

    def observe(self, draft: Draft, accepted: int) -> None:
        """Record a verified ``draft`` of which ``accepted`` nodes were kept."""
        if len(draft):
            self._expected = self.decay * self._expected + float(draft.scores.sum())
            self._accepted = self.decay * self._accepted + accepted


def plan_batch(
    drafts: Sequence[Draft],
    base_rows: int,
    row_costs: Sequence[float],
    ratios: Sequence[float] | None = None,
    base_tokens: int = 0,
) -> list[Draft]:
    """The draft nodes worth verifying in one step shared by ``len(drafts)`` decoding requests.

    ``base_rows`` rows run anyway (each request's pending token, prompt chunks);
    ``row_costs[r]`` is the measured time of a step with r rows. Nodes are taken best score
    first over the whole batch (every prefix of that order is closed under parents) and the
    prefix that maximises expected tokens per second, ``(len(drafts) + sum of scores) /
    c(base_rows + nodes)``, is kept; nothing when no prefix beats the step without drafts,
    so a batch with drafts is never expected to be slower than without. As the batch
    grows, each extra row costs more of everyone's step and drafts shrink. ``ratios[i]``
    (default 1) scales request i's scores (its :class:`ScoreCalibration`), capped at 1.
    ``base_tokens``: tokens the step emits besides the decoding requests' (the first token
    of a request whose prompt ends in it).
    """
    empty = [Draft.empty() for _ in drafts]
    room = len(row_costs) - 1 - base_rows
    if not drafts or room <= 0:
        return empty
    weights = [1.0] * len(drafts) if ratios is None else ratios
    scores = np.concatenate(
        [
            np.minimum(d.scores.astype(np.float64) * w, 1.0)
            for d, w in zip(drafts, weights, strict=True)
        ]
    )
    if len(scores) == 0:
        return empty
    owner = np.concatenate([np.full(len(d), i) for i, d in enumerate(drafts)])
    node = np.concatenate([np.arange(len(d)) for d in drafts])
    order = np.lexsort((node, owner, -scores))[:room]
    costs = np.asarray(row_costs, dtype=np.float64)
    expected = base_tokens + len(drafts) + np.cumsum(scores[order])
    rate = expected / costs[base_rows + 1 : base_rows + 1 + len(order)]
    best = int(np.argmax(rate))
    if rate[best] <= (base_tokens + len(drafts)) / costs[base_rows] * (1.0 + 1e-9):
        return empty
    chosen = order[: best + 1]
    return [
        d.subset(sorted(node[chosen[owner[chosen] == i]].tolist())) if len(d) else d
        for i, d in enumerate(drafts)
    ]
