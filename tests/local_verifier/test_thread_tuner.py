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


def test_a_struggling_count_calls_a_trial_at_once() -> None:
    """Another process takes the cores: the chosen count's steps run 50x over the table,
    and the other count is tried on the next step, not at its next turn."""
    tuner = ThreadTuner([1, 2], explore_every=64, explore_steps=2)
    ran = _serve(tuner, {1: 1.0, 2: 1.0}, 60)  # the first turn's trial comes and goes
    assert ran.count(2) == 2 and tuner.chosen == 1
    threads = tuner.apply()
    assert threads == 1 and not tuner.observe(50.0)  # a stall: not for the cost table
    ran = _serve(tuner, {1: 50.0, 2: 1.5}, 7)
    assert ran[:2] == [2, 2]  # the trial at once
    assert tuner.chosen == 2 and ran[2:] == [2] * 5


def test_a_struggling_trial_ends_at_its_first_step_and_backs_off() -> None:
    """One thread is chosen; each trial of two threads meets the contention: it ends at
    its first step, and each such trial doubles the wait before the next."""
    tuner = ThreadTuner([1, 2], explore_every=8, explore_steps=4, max_backoff=4)
    ran = _serve(tuner, {1: 1.0, 2: 100.0}, 8 + 16 + 32 + 32 + 32)
    trials = [i for i, threads in enumerate(ran) if threads == 2]
    assert [b - a for a, b in zip(trials, trials[1:], strict=False)] == [16, 32, 32, 32]
    assert tuner.chosen == 1 and tuner.backoff == 4
    # the contention ends: the next trial runs its 4 steps, wins and resets the wait
    ran = _serve(tuner, {1: 1.0, 2: 0.6}, 40)
    assert tuner.chosen == 2 and tuner.backoff == 1
    first = ran.index(2)  # the trial at the backed-off turn (4 x 8 steps), then chosen
    assert first <= 32 and ran[first : first + 8] == [2] * 8


def test_an_alarm_on_both_counts_does_not_trial_every_step() -> None:
    """Both counts over the alarm (a heavily loaded machine): once a trial has ended
    early, alarms call no trial and trials come as the backoff allows; the better count
    is kept."""
    tuner = ThreadTuner([1, 2], explore_every=8, explore_steps=2, max_backoff=8)
    ran = _serve(tuner, {1: 20.0, 2: 60.0}, 8 + 16 + 32 + 64 + 64)
    trials = [i for i, threads in enumerate(ran) if threads == 2]
    assert [b - a for a, b in zip(trials, trials[1:], strict=False)] == [16, 32, 64, 64]
    assert tuner.chosen == 1 and tuner.backoff == 8


def test_a_trial_runs_on_short_forwards_only() -> None:
    """A forward expected to cost more than ``trial_cost`` one-row forwards runs on the
    chosen count while a trial is due or under way, and is fed to the cost table; the
    trial's steps are the short forwards around it."""
    tuner = ThreadTuner([1, 2], explore_every=4, explore_steps=2, trial_cost=4.0)
    for _ in range(3):
        assert tuner.apply(1.0) == 1 and tuner.observe(1.0)
    assert tuner.apply(20.0) == 1  # the trial is due: a long forward stays on the chosen count
    assert tuner.observe(1.0)
    assert tuner.apply(1.0) == 2 and not tuner.observe(0.5)  # the trial's first step
    assert tuner.apply(20.0) == 1 and tuner.observe(1.0)  # a long one in between
    assert tuner.apply(4.0) == 2 and not tuner.observe(0.5)  # its second and last step
    assert tuner.chosen == 2
    assert tuner.apply(20.0) == 2  # now the chosen count, long forwards too
