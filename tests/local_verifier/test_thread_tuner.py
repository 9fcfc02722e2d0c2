"""The online CPU thread choice: trials on the other count, kept when they run faster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from local_verifier.devices import ThreadTuner


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _serve(tuner: ThreadTuner, cost: dict[int, float], steps: int) -> list[int]:
    """The thread counts ``steps`` forwards ran on, each costing ``cost[threads]`` times
    what the table expects."""
    ran = []
    for _ in range(steps):
        threads = tuner.apply()
        assert torch.get_num_threads() == threads
        ran.append(threads)
        tuner.observe(cost[threads])
    return ran


def test_a_faster_count_found_by_a_trial_is_kept() -> None:
    tuner = ThreadTuner([1, 2], explore_every=8, explore_steps=2)
    assert tuner.chosen == 1  # the count configured at load
    ran = _serve(tuner, {1: 1.0, 2: 0.7}, 40)
    assert tuner.chosen == 2
    recent = ran[-16:]  # trials of 1 thread still come, 2 steps in every 8
    assert recent.count(2) >= 12 and 1 in recent


def test_a_slower_count_is_only_tried() -> None:
    tuner = ThreadTuner([1, 2], explore_every=8, explore_steps=2)
    ran = _serve(tuner, {1: 1.0, 2: 1.4}, 40)
    assert tuner.chosen == 1
    assert 0 < ran.count(2) <= 2 * (40 // 8 + 1)  # trials of 2 steps, every 8 at most


def test_trial_steps_are_not_fed_to_the_cost_table() -> None:
    tuner = ThreadTuner([1, 2], explore_every=4, explore_steps=2)
    chosen = []
    for _ in range(12):
        threads = tuner.apply()
        chosen.append((threads, tuner.observe(1.0)))
    assert {fed for threads, fed in chosen if threads == 2} == {False}
    assert {fed for threads, fed in chosen if threads == 1} == {True}


def test_a_within_margin_difference_keeps_the_count() -> None:
    tuner = ThreadTuner([1, 2], explore_every=8, explore_steps=2, margin=0.05)
    _serve(tuner, {1: 1.0, 2: 0.98}, 40)
    assert tuner.chosen == 1


def test_candidates_must_be_thread_counts() -> None:
    with pytest.raises(ValueError):
        ThreadTuner([])
    with pytest.raises(ValueError):
        ThreadTuner([0, 2])
