"""The batch plan verifies the draft nodes that pay for the whole step, calibrated per request."""

from __future__ import annotations

import numpy as np

from lookup.controller import ScoreCalibration, plan_batch
from lookup.draft import Draft

COSTS = [1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]  # c(r) = 1 + 0.1 (r - 1)


def _chain(scores: list[float]) -> Draft:
    return Draft.chain(list(range(10, 10 + len(scores))), scores, [0] * len(scores))


def test_a_row_is_verified_only_when_it_pays_for_the_step() -> None:
    # one request: a node of score p pays when (1 + p) / 1.1 > 1 / 1.0, i.e. p > 0.1
    kept = plan_batch([_chain([0.9, 0.5, 0.05])], 1, COSTS)
    assert kept[0].tokens.tolist() == [10, 11]
    # four requests in the step (c = 1.3): a row must now bring > 4 * 1.4 / 1.3 - 4 = 0.31
    four = plan_batch([_chain([0.9, 0.3])] * 4, 4, COSTS)
    assert all(d.tokens.tolist() == [10] for d in four)


def test_ratios_weigh_each_request_by_its_observed_acceptance() -> None:
    # two requests (c = 1.1): a row must bring > 2 * 1.2 / 1.1 - 2 = 0.18
    drafts = [_chain([0.1]), _chain([0.1])]
    assert [len(d) for d in plan_batch(drafts, 2, COSTS)] == [0, 0]
    assert [len(d) for d in plan_batch(drafts, 2, COSTS, [1.0, 3.0])] == [0, 1]


def test_a_first_token_in_the_step_makes_drafts_pay_more() -> None:
    drafts = [_chain([0.3, 0.2])]
    assert len(plan_batch(drafts, 1, COSTS)[0]) == 2
    # the step also ends a prompt (its first token): 2 tokens at base, rows must bring > 0.2
    assert len(plan_batch(drafts, 1, COSTS, base_tokens=1)[0]) == 1


def test_calibration_follows_accepted_over_expected() -> None:
    cal = ScoreCalibration(decay=0.5)
    assert cal.ratio == 1.0
    draft = _chain([0.5, 0.25])
    for _ in range(10):
        cal.observe(draft, 2)  # expected 0.75 per step, accepted 2
    assert np.isclose(cal.ratio, 2 / 0.75)
    for _ in range(40):
        cal.observe(draft, 0)
    assert cal.ratio == 0.25  # bounded below
    cal.observe(Draft.empty(), 5)  # nothing verified: nothing learnt
    assert cal.ratio == 0.25
