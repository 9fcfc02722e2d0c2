"""The batch plan verifies the draft nodes that pay for the whole step, calibrated per request."""

from __future__ import annotations

import numpy as np
import pytest

from lookup.controller import REST, ScoreCalibration, plan_batch
from lookup.draft import Draft

COSTS = [1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]  # c(r) = 1 + 0.1 (r - 1)


def _chain(scores: list[float]) -> Draft:
    return Draft.chain(list(range(10, 10 + len(scores))), scores, [0] * len(scores))


def _rate(drafts: list[Draft], probs: list[np.ndarray], costs: list[float], base: int) -> float:
    """Expected tokens per second of a step verifying ``drafts`` (chosen subsets)."""
    rows = base + sum(len(d) for d in drafts)
    return (len(drafts) + sum(float(p.sum()) for p in probs)) / costs[rows]


def test_a_row_is_verified_only_when_it_pays_for_the_step() -> None:
    # one request: a node of score p pays when (1 + p) / 1.1 > 1 / 1.0, i.e. p > 0.1
    kept = plan_batch([_chain([0.9, 0.5, 0.05])], 1, COSTS)
    assert kept[0].tokens.tolist() == [10, 11]
    # four requests in the step (c = 1.3): a row must now bring > 4 * 1.4 / 1.3 - 4 = 0.31
    four = plan_batch([_chain([0.9, 0.3])] * 4, 4, COSTS)
    assert all(d.tokens.tolist() == [10] for d in four)


def test_the_rows_cost_is_the_whole_batch_step_not_one_request_alone() -> None:
    costs = [1.0, 1.0, 1.1, 1.6, 1.7, 1.8]
    drafts = [_chain([0.3]), _chain([0.3])]
    # alone, each request's node pays: (1 + 0.3) / c(2) = 1.18 > 1 / c(1)
    assert len(plan_batch(drafts[:1], 1, costs)[0]) == 1
    # together the step already has 2 rows: (2 + 0.3) / c(3) = 1.44 and (2 + 0.6) / c(4) =
    # 1.53 are both below 2 / c(2) = 1.82, so neither request drafts
    assert [len(d) for d in plan_batch(drafts, 2, costs)] == [0, 0]


def test_calibrated_probabilities_weigh_each_request_by_its_observed_acceptance() -> None:
    # two requests (c = 1.1): a row must bring > 2 * 1.2 / 1.1 - 2 = 0.18
    drafts = [_chain([0.1]), _chain([0.1])]
    assert [len(d) for d in plan_batch(drafts, 2, COSTS)] == [0, 0]
    accepting, fresh = ScoreCalibration(), ScoreCalibration()
    for _ in range(5):
        accepting.observe(_chain([0.25, 0.1]), 2)  # accepts 2 where 0.35 were expected
    probs = [fresh.probs(drafts[0]), accepting.probs(drafts[1])]
    assert probs[0].tolist() == pytest.approx([0.1]) and probs[1][0] > 0.18
    assert [len(d) for d in plan_batch(drafts, 2, COSTS, probs)] == [0, 1]


def test_a_request_whose_rows_cost_host_time_drafts_less() -> None:
    drafts = [_chain([0.3, 0.2])]
    assert len(plan_batch(drafts, 1, COSTS)[0]) == 2
    # each row adds 0.2 s of penalties: one node, 1.3 / (1.1 + 0.4) = 0.87, beats the plain
    # step's 1 / (1.0 + 0.2) = 0.83; the second, 1.5 / (1.2 + 0.6) = 0.83, no longer pays
    assert len(plan_batch(drafts, 1, COSTS, row_extra=[0.2])[0]) == 1
    # at 0.5 s a row nothing pays: 1.3 / (1.1 + 1.0) = 0.62 < 1 / 1.5 = 0.67
    assert len(plan_batch(drafts, 1, COSTS, row_extra=[0.5])[0]) == 0
    # the extra is per request: the cheap request still drafts beside the costly one
    two = plan_batch([_chain([0.9]), _chain([0.9])], 2, COSTS, row_extra=[0.0, 5.0])
    assert [len(d) for d in two] == [1, 0]


def test_a_first_token_in_the_step_makes_drafts_pay_more() -> None:
    drafts = [_chain([0.3, 0.2])]
    assert len(plan_batch(drafts, 1, COSTS)[0]) == 2
    # the step also ends a prompt (its first token): 2 tokens at base, rows must bring > 0.2
    assert len(plan_batch(drafts, 1, COSTS, base_tokens=1)[0]) == 1


def _random_draft(rng: np.random.Generator, n: int) -> Draft:
    """A chain or a tree of n nodes whose scores never grow along a path."""
    if n == 0:
        return Draft.empty()
    parents = [-1] + [
        int(rng.integers(-1, i)) if rng.random() < 0.4 else i - 1 for i in range(1, n)
    ]
    scores: list[float] = []
    for p in parents:
        scores.append((1.0 if p < 0 else scores[p]) * float(rng.uniform(0.2, 1.0)))
    return Draft(
        rng.permutation(1000)[:n].astype(np.int64),  # distinct: a kept token names its node
        np.asarray(parents, np.int32),
        np.asarray(scores, np.float32),
        np.zeros(n, np.int8),
    )


@pytest.mark.parametrize("seed", range(40))
def test_drafts_never_make_the_steps_expected_rate_worse(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # an injected step-cost table: a fixed part, then rows at a slope that may bend upwards
    rows = 96
    slope = rng.uniform(0.001, 0.05) * (1 + rng.uniform(0, 2) * np.linspace(0, 1, rows + 1))
    costs = (rng.uniform(0.02, 0.5) + np.cumsum(slope)).tolist()
    costs[0] = costs[1]
    n = int(rng.integers(1, 9))
    drafts = [_random_draft(rng, int(rng.integers(0, 12))) for _ in range(n)]
    calibrations = [ScoreCalibration() for _ in drafts]
    for cal, d in zip(calibrations, drafts, strict=True):
        if len(d):
            cal.observe(d, int(rng.integers(0, len(d) + 1)))
    probs = [c.probs(d) for c, d in zip(calibrations, drafts, strict=True)]
    prefill = int(rng.integers(0, 40))
    base = n + prefill
    kept = plan_batch(drafts, base, costs, probs)
    kept_probs = []
    for d, k, p in zip(drafts, kept, probs, strict=True):
        # a subset of the proposal, closed under parents, each node keeping its probability
        node = {int(t): i for i, t in enumerate(d.tokens.tolist())}
        picked = [node[int(t)] for t in k.tokens.tolist()]
        for parent, i in zip(k.parents.tolist(), picked, strict=True):
            assert (-1 if parent < 0 else picked[parent]) == int(d.parents[i])
        kept_probs.append(p[picked])
    none = _rate([Draft.empty()] * n, [np.zeros(0)] * n, costs, base)
    rate = _rate(kept, kept_probs, costs, base)
    assert rate >= none
    if any(len(k) for k in kept):
        assert rate > none


def test_calibration_follows_accepted_over_expected() -> None:
    cal = ScoreCalibration(decay=0.5)
    assert cal.ratio == 1.0
    draft = _chain([0.5, 0.25])
    for _ in range(10):
        cal.observe(draft, 2)  # expected 0.75 per step, accepted 2
    assert np.isclose(cal.ratio, 2 / 0.75)
    assert cal.probs(draft).tolist() == [1.0, pytest.approx(0.25 * 2 / 0.75)]  # at most 1
    for _ in range(40):
        cal.observe(draft, 0)
    assert cal.ratio == 0.25  # bounded below
    cal.observe(Draft.empty(), 5)  # nothing verified: nothing learnt
    assert cal.ratio == 0.25


def _rest_length(cal: ScoreCalibration) -> int:
    """Steps the calibration rests (observing steps without drafts) until it drafts again."""
    steps = 0
    while cal.resting:
        cal.observe(Draft.empty(), 0)
        steps += 1
    return steps


def test_a_request_whose_drafts_never_pass_rests_then_retries_less_often() -> None:
    cal = ScoreCalibration(patience=3.0, rest=(4, 16))
    draft = _chain([0.9, 0.8])  # scores 1.7 tokens a step; none is ever accepted
    failed = 0
    while not cal.resting:
        cal.observe(draft, 0)
        failed += 1
    # 1.7 expected at first, then 0.25 * 1.7 a step (the lowest ratio): 3 after 5 steps
    assert failed == 5
    assert _rest_length(cal) == 4  # no draft rows for 4 steps
    rests = []
    for _ in range(4):  # each retry fails at once: rests of 8, 16, 16, 16 steps
        cal.observe(draft, 0)
        rests.append(_rest_length(cal))
    assert rests == [8, 16, 16, 16]
    cal.observe(draft, 1)  # a retry that passes ends the series
    assert not cal.resting
    for _ in range(40):
        cal.observe(draft, 0)
        if cal.resting:
            break
    assert _rest_length(cal) == 4


def test_a_request_that_accepts_enough_never_rests_through_a_bad_patch() -> None:
    cal = ScoreCalibration()
    draft = _chain([0.5, 0.25])
    for _ in range(20):
        cal.observe(draft, 2)
    for _ in range(8):  # an edit: the copy misses for a while
        cal.observe(draft, 0)
        assert not cal.resting


def test_rest_settings_are_checked() -> None:
    assert REST[0] >= 1
    with pytest.raises(ValueError):
        ScoreCalibration(patience=0.0)
    with pytest.raises(ValueError):
        ScoreCalibration(rest=(8, 4))
