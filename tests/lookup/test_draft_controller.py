"""The controller drafts what pays under the measured costs, and nothing when it does not."""

from __future__ import annotations

import numpy as np
import pytest

from lookup.controller import DraftController
from lookup.draft import Draft
from lookup.drafter import Drafter

CPU = [0.020] + [0.026 + 0.0008 * k for k in range(1, 33)]  # jumps at k = 1, then grows
GPU = [0.010] + [0.0101 + 0.00001 * k for k in range(1, 33)]  # nearly flat


def _chain(rate: float, n: int) -> Draft:
    return Draft.chain(list(range(n)), [rate ** (i + 1) for i in range(n)], [0] * n)


def test_poor_acceptance_drafts_nothing() -> None:
    assert len(DraftController(CPU).choose(_chain(0.2, 16))) == 0
    assert len(DraftController(CPU).choose(Draft.empty())) == 0


def test_good_acceptance_drafts_long() -> None:
    assert len(DraftController(CPU).choose(_chain(0.97, 32))) >= 24
    assert len(DraftController(GPU).choose(_chain(0.9, 32))) >= 24


def test_choice_maximises_expected_tokens_per_second() -> None:
    costs = [1.0, 1.5, 1.6, 3.0]
    draft = Draft.chain([1, 2, 3], [0.9, 0.5, 0.45], [0, 0, 0])
    # E/c: k=1: 1.9/1.5=1.27, k=2: 2.4/1.6=1.5, k=3: 2.85/3.0=0.95
    chosen = DraftController(costs).choose(draft)
    assert chosen.tokens.tolist() == [1, 2]
    # same draft, but verifying anything costs more than it gains
    assert len(DraftController([1.0, 2.0, 2.5, 3.0]).choose(draft)) == 0


def test_choice_keeps_a_tree_closed_under_parents() -> None:
    draft = Draft(
        tokens=np.array([10, 20, 11, 21, 12], np.int64),
        parents=np.array([-1, -1, 0, 1, 2], np.int32),
        scores=np.array([0.6, 0.3, 0.5, 0.05, 0.4], np.float32),
        source=np.zeros(5, np.int8),
    )
    chosen = DraftController([1.0, 1.01, 1.02, 1.03, 1.04, 1.2]).choose(draft)
    assert chosen.tokens.tolist() == [10, 20, 11, 12]  # the 0.05 leaf is not worth it
    assert chosen.parents.tolist() == [-1, -1, 0, 2]
    assert len(DraftController([1.0, 1.01, 2.0]).choose(draft)) == 1


def test_budget_follows_recent_acceptance() -> None:
    controller = DraftController(GPU)
    for _ in range(10):
        controller.observe(8, 8)
    long_tokens, long_width = controller.budget()
    for _ in range(10):
        controller.observe(8, 0)
    short_tokens, short_width = controller.budget()
    assert long_tokens > short_tokens >= 1
    assert long_width == 1 and short_width > 1
    assert DraftController([0.01]).budget() == (0, 1)


def test_rejects_bad_costs() -> None:
    with pytest.raises(ValueError):
        DraftController([])
    with pytest.raises(ValueError):
        DraftController([0.01, 0.0])


def _simulate(answer: list[int], drafter: Drafter, costs: list[float]) -> tuple[int, int, int]:
    """Greedy verification against a known answer: (steps, drafted, accepted)."""
    controller = DraftController(costs)
    steps = drafted = accepted = 0
    done = 0
    while done < len(answer):
        k, width = controller.budget()
        draft = controller.choose(drafter.propose(k, width))
        node, committed, hits = -1, [], 0
        while done + len(committed) < len(answer):
            token = answer[done + len(committed)]
            committed.append(token)
            nxt = [i for i in np.flatnonzero(draft.parents == node) if draft.tokens[i] == token]
            if not nxt:
                break
            node, hits = int(nxt[0]), hits + 1
        controller.observe(len(draft), hits)
        drafter.extend(committed)
        steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + hits
        done += len(committed)
    return steps, drafted, accepted


def test_open_ended_text_switches_drafting_off() -> None:
    rng = np.random.default_rng(0)
    vocab = rng.integers(0, 40, 600).tolist()  # small vocabulary: many short spurious matches
    steps, drafted, _ = _simulate(vocab[300:], Drafter(vocab[:300]), CPU)
    assert steps >= 290  # essentially one token per step
    assert drafted <= 15


def test_code_edit_with_prediction_drafts_long() -> None:
    rng = np.random.default_rng(0)
    prediction = rng.integers(0, 30_000, 600).tolist()
    answer = prediction[:200] + [1, 2, 3, 4] + prediction[208:450] + [5] + prediction[451:]
    steps, drafted, accepted = _simulate(answer, Drafter([9, 9], prediction=prediction), CPU)
    assert len(answer) / steps >= 10
    assert accepted >= 0.9 * drafted
