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

PATIENCE = 3.0
"""Expected tokens (summed acceptance probabilities) that verified drafts may bring in a
row without any accepted before their request rests."""
REST = (4, 64)
"""Steps a resting request drafts nothing: the first rest, and the cap of its doubling."""


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
    """A request's observed acceptance: how its draft scores (each the estimated probability
    that a node's path is accepted) compare with the nodes it accepts, and whether its
    drafts keep failing.

    ``ratio`` is accepted over expected nodes, both exponentially averaged over verified
    drafts; ``probs`` scales a draft's scores by it. Drafts that keep failing make the
    request rest: once ``patience`` expected tokens in a row (summed ``probs`` of verified
    drafts) brought nothing, it drafts nothing for ``rest[0]`` steps, then retries; a retry
    that fails again doubles the rest (up to ``rest[1]`` steps), an accepted token ends the
    series.
    """

    def __init__(
        self,
        decay: float = 0.8,
        bounds: tuple[float, float] = (0.25, 4.0),
        patience: float = PATIENCE,
        rest: tuple[int, int] = REST,
    ) -> None:
        if patience <= 0 or not 0 < rest[0] <= rest[1]:
            raise ValueError("patience must be > 0 and rest a range of steps >= 1")
        self.decay = decay
        self.bounds = bounds
        self.patience = patience
        self.rest = rest
        self._expected = 0.0
        self._accepted = 0.0
        self._missed = 0.0  # expected tokens of the verified drafts since one was accepted
        self._resting = 0  # steps left without drafts
        self._next_rest = rest[0]

    @property
    def ratio(self) -> float:
        """Accepted over expected nodes (1.0 until a verified draft was observed)."""
        if self._expected <= 0.0:
            return 1.0
        return float(np.clip(self._accepted / self._expected, *self.bounds))

    @property
    def resting(self) -> bool:
        """Whether the request drafts nothing this step (its drafts kept failing)."""
        return self._resting > 0

    def probs(self, draft: Draft) -> np.ndarray:
        """The probability that each node of ``draft`` is accepted with its whole path: its
        score scaled by ``ratio``, at most 1 (float64)."""
        return np.minimum(draft.scores.astype(np.float64) * self.ratio, 1.0)

    def observe(self, draft: Draft, accepted: int) -> None:
        """Record a step that verified ``draft`` (maybe empty), ``accepted`` nodes kept."""
        if self._resting:
            self._resting -= 1
        if not len(draft):
            return
        missed = 0.0 if accepted else self._missed + float(self.probs(draft).sum())
        self._expected = self.decay * self._expected + float(draft.scores.sum())
        self._accepted = self.decay * self._accepted + accepted
        if accepted:
            self._next_rest = self.rest[0]
        # rest when the misses add up and even the lowest ratio overrates the request
        elif missed >= self.patience and self._accepted < self.bounds[0] * self._expected:
            self._resting = self._next_rest
            self._next_rest = min(2 * self._next_rest, self.rest[1])
            missed = self.patience  # a retry that fails rests again at once
        self._missed = missed


def plan_batch(
    drafts: Sequence[Draft],
    base_rows: int,
    row_costs: Sequence[float],
    probs: Sequence[np.ndarray] | None = None,
    base_tokens: int = 0,
    row_extra: Sequence[float] | None = None,
) -> list[Draft]:
    """The draft nodes worth verifying in one step shared by ``len(drafts)`` decoding requests.

    ``base_rows`` rows run anyway (each request's pending token, prompt chunks);
    ``row_costs[r]`` is the measured time of a step with r rows. ``probs[i][n]`` is the
    probability that node n of draft i is accepted with its whole path (default: the
    draft's own scores; a request's :class:`ScoreCalibration` gives its observed ones).
    Nodes are taken most probable first over the whole batch (every prefix of that order
    is closed under parents) and the prefix that maximises expected tokens per second,
    ``(len(drafts) + base_tokens + sum of probs) / c(base_rows + nodes)``, is kept; nothing
    when no prefix beats the step without drafts, so a batch with drafts is never expected
    to be slower than without. As the batch grows, each extra row costs more of everyone's
    step and drafts shrink. ``base_tokens``: tokens the step emits besides the decoding
    requests' (the first token of a request whose prompt ends in it). ``row_extra[i]``:
    seconds each row of request i adds on the host besides the forward (its penalties), so
    a request whose rows cost more drafts less.
    """
    empty = [Draft.empty() for _ in drafts]
    room = len(row_costs) - 1 - base_rows
    if not drafts or room <= 0:
        return empty
    given = [d.scores for d in drafts] if probs is None else probs
    p = np.concatenate([np.asarray(x, dtype=np.float64) for x in given])
    if len(p) == 0:
        return empty
    owner = np.concatenate([np.full(len(d), i) for i, d in enumerate(drafts)])
    node = np.concatenate([np.arange(len(d)) for d in drafts])
    order = np.lexsort((node, owner, -p))[:room]
    costs = np.asarray(row_costs, dtype=np.float64)
    extra = np.zeros(len(drafts)) if row_extra is None else np.asarray(row_extra, np.float64)
    base_cost = costs[base_rows] + extra.sum()  # each request's pending row
    expected = base_tokens + len(drafts) + np.cumsum(p[order])
    step_cost = costs[base_rows + 1 : base_rows + 1 + len(order)] + extra.sum()
    rate = expected / (step_cost + np.cumsum(extra[owner[order]]))
    best = int(np.argmax(rate))
    if rate[best] <= (base_tokens + len(drafts)) / base_cost * (1.0 + 1e-9):
        return empty
    chosen = order[: best + 1]
    return [
        d.subset(sorted(node[chosen[owner[chosen] == i]].tolist())) if len(d) else d
        for i, d in enumerate(drafts)
    ]
