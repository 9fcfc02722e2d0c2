"""The start-up step cost table: every row count timed, long steps fewer times."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from local_verifier import step_costs
from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep

SECONDS_PER_ROW = 0.01  # on the fake clock: a 16-row step takes 0.16 s, a 32-row one 0.32 s


def test_long_steps_are_timed_until_their_time_adds_up(
    smollm2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    steps: Counter[int] = Counter()

    def step(seqs: Sequence[SeqStep], kv: object, max_rows: int) -> list[object]:
        rows = sum(s.tokens.shape[0] for s in seqs)
        steps[rows] += 1
        now[0] += SECONDS_PER_ROW * rows
        return []

    monkeypatch.setattr(smollm2.model, "step_chunked", step)
    # not measure_row_costs: nothing cached
    costs = step_costs._measure(smollm2, 64, clock=lambda: now[0])

    # each count timed until its steps add up to MIN_SECONDS (0.25 s), at most 3 times;
    # the 64-row step also runs once first, untimed
    assert step_costs.MIN_SECONDS == 0.25
    assert steps == {1: 3, 2: 3, 4: 3, 8: 3, 12: 3, 16: 2, 24: 2, 32: 1, 48: 1, 64: 2}
    assert costs == pytest.approx([SECONDS_PER_ROW * max(r, 1) for r in range(65)])


@pytest.mark.parametrize("slots", [256, 128], ids=["enough", "too-few"])
def test_the_steps_write_into_the_storage_given_where_it_has_room(
    smollm2: Any, monkeypatch: pytest.MonkeyPatch, slots: int
) -> None:
    """An engine's pool before it serves takes the start-up steps' K/V (no storage of their
    own beside it); one with too few slots for the widest step is left alone."""
    written: list[KVStorage] = []

    def step(seqs: Sequence[SeqStep], kv: KVStorage, max_rows: int) -> list[object]:
        written.append(kv)
        return []

    monkeypatch.setattr(smollm2.model, "step_chunked", step)
    model = smollm2.model
    given = KVStorage(smollm2.config, slots, device=model.device, dtype=model.kv_dtype)
    step_costs._measure(smollm2, 64, given)  # 128 context slots and 64 rows: 192 slots
    assert written and all((kv is given) == (slots == 256) for kv in written)
